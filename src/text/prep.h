// prep.h (text) — `moe prep`'s work: documents from plain text, JSON lines and gzip'd files, tokenised
// with a Hugging Face tokenizer, each followed by the tokenizer's EOS, written as llm.c token shards with
// the first documents held out; a Megatron dataset's documents (already ids) copied in among them.
// Must not hold: the tokenizer (tokenizer.h), the shard format (data.h).
#pragma once
#include "text/tokenizer.h"

typedef struct {
    const char *tokenizer; // a tokenizer.json or the directory holding it ("": Megatron inputs only)
    const char *inputs; // '\n'-separated paths (a Megatron dataset: PREFIX or PREFIX.idx)
    const char *out; // the directory to create (prep_write: the name its summary shows)
    const char *field; // JSON lines: the text field
    const char *eos; // the EOS token's text; "" finds it beside the tokenizer
    int lines; // plain text: one document per non-empty line
    int add_special; // each document with the post-processor's tokens (e.g. BOS), before the EOS
    long val_docs; // the first val_docs documents go to val_*.bin
    long shard_tokens; // tokens per shard file at most
} PrepOptions;

// Dies with one message naming the problem (an unreadable or truncated input, a JSON line without the
// field, no EOS, --out already there, a bad Megatron index, an id beyond the vocabulary); then no --out
// directory is left behind.
void prep_run(const PrepOptions *o);

// The EOS token's id beside the tokenizer at path (a directory or a file in one), found as transformers
// finds it: tokenizer_config.json's "eos_token", special_tokens_map.json's, or config.json's
// "eos_token_id"; *from names the file (static text). -1 when none of them names one.
int prep_find_eos(const Tokenizer *t, const char *path, const char **from);
// The work of prep_run without its directory: o's inputs tokenised with t into shards in dir (which
// exists), each document followed by eos (eos < 0: none), then the summary line. Messages begin with
// who ("prep", "--data", ...). o->tokenizer and o->eos are not read. t NULL: Megatron inputs only, the
// vocabulary their largest id + 1.
void prep_write(const PrepOptions *o, const Tokenizer *t, int eos, const char *from, const char *dir,
                const char *who);
// The documents of o->inputs (o->field, o->lines as prep reads them), each handed to doc in input order
// (text valid during the call only). Dies naming the file and the problem, after who (a Megatron dataset
// is refused: it holds no text).
void prep_read(const PrepOptions *o, void (*doc)(void *arg, const char *text, size_t len), void *arg,
               const char *who);
// 1 when prep reads path as JSON lines (.jsonl, .json, .ndjson, each maybe .gz), else as plain text.
int prep_is_jsonl(const char *path);
