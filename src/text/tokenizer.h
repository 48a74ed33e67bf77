// tokenizer.h (text) — Hugging Face tokenizers (tokenizer.json) in C: load one, encode text to token ids,
// decode ids to text (whole, or streamed one token at a time). Covers byte-level BPE (GPT-2, GPT-NeoX,
// Llama-3, Qwen2 style) and SentencePiece-style BPE with byte fallback (Llama-2, Mixtral); refuses any
// other component by name. Must not hold: corpus files or token shards (text/prep.c), the command line.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct Tokenizer Tokenizer;

// path: a tokenizer.json, or a directory holding one. Dies with one message naming the file and the
// problem (unreadable, not JSON, an unsupported model/normalizer/pre-tokenizer/decoder, merges naming
// tokens absent from the vocabulary, ...).
Tokenizer *tok_load(const char *path);
// The same from a tokenizer.json already parsed (cJSON); name stands for the file in messages.
struct cJSON;
Tokenizer *tok_from_json(const struct cJSON *j, const char *name);
void tok_free(Tokenizer *t);
const char *tok_file(const Tokenizer *t); // the tokenizer.json it was loaded from
int tok_vocab_size(const Tokenizer *t); // the largest id (model or added token) + 1
int tok_token_id(const Tokenizer *t, const char *content); // an added token's or the vocabulary's id, or -1

// The token ids of len bytes of text into (*ids)[0..] (capacity *cap, grown with xrealloc); returns their
// count. Bytes that are not UTF-8 are read as U+FFFD, one per maximal invalid subpart (as
// Python's bytes.decode(errors="replace")). add_special: the post-processor's tokens around them too
// (TemplateProcessing's single template, Roberta/BertProcessing's cls and sep; the tokenizers library's
// add_special_tokens=True); dies naming a post-processor that is not supported.
size_t tok_encode(const Tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                  size_t *cap);

// The text of n ids (malloc'd, NUL-terminated; *len its byte count); skip_special drops the added tokens
// flagged special. Dies naming an id outside the vocabulary.
char *tok_decode(const Tokenizer *t, const int32_t *ids, size_t n, int skip_special, size_t *len);

// Pre-tokenisation alone (the BPE trainer): the text as tok_encode reads it (U+FFFD for bytes that are
// not UTF-8, the added tokens taken out, the normalizer) split by the pre-tokenizer; each piece's bytes
// handed to fn (before the byte-level mapping; valid during the call).
void tok_pretokenize(const Tokenizer *t, const char *text, size_t len,
                     void (*fn)(void *arg, const char *piece, size_t n), void *arg);

// Streaming decode (sampling): tok_stream_step takes one id and returns the text it completes, *len bytes
// (a pointer into the stream, valid until the next call; "" while an incomplete UTF-8 sequence is held
// back).
typedef struct TokStream TokStream;
TokStream *tok_stream_new(const Tokenizer *t, int skip_special);
const char *tok_stream_step(TokStream *s, int32_t id, size_t *len);
void tok_stream_free(TokStream *s);
const Tokenizer *tok_stream_tokenizer(const TokStream *s);
