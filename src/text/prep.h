// prep.h (text) — `moe prep`'s work: documents from plain text, JSON lines and gzip'd files, tokenised
// with a Hugging Face tokenizer, each followed by the tokenizer's EOS, written as llm.c token shards with
// the first documents held out. Must not hold: the tokenizer (tokenizer.h), the shard format (data.h).
#pragma once

typedef struct {
    const char *tokenizer; // a tokenizer.json or the directory holding it
    const char *inputs; // '\n'-separated paths
    const char *out; // the directory to create
    const char *field; // JSON lines: the text field
    const char *eos; // the EOS token's text; "" finds it beside the tokenizer
    int lines; // plain text: one document per non-empty line
    int add_special; // each document with the post-processor's tokens (e.g. BOS), before the EOS
    long val_docs; // the first val_docs documents go to val_*.bin
    long shard_tokens; // tokens per shard file at most
} PrepOptions;

// Dies with one message naming the problem (an unreadable or truncated input, a JSON line without the
// field, no EOS, --out already there); then no --out directory is left behind.
void prep_run(const PrepOptions *o);
