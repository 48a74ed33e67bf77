// megatron.h (data) — Megatron-LM's indexed dataset as a token source: PREFIX.idx (the index: header
// "MMIDIDX\0\0", version 1, the token dtype's code, the sequence and document counts, then each sequence's
// length (int32) and byte offset in PREFIX.bin (int64), and the document boundaries (int64 sequence
// indices, 0 first, the sequence count last)) and PREFIX.bin (the tokens). Must not hold: llm.c shards or
// the train/val split (data.c), text (text/).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct MegatronSet MegatronSet;

// 1 when path names a Megatron dataset: "PREFIX.idx", or a PREFIX that is no file while PREFIX.idx is
// one; its prefix (without ".idx") into prefix.
int megatron_path(const char *path, char *prefix, size_t n);
// Opens PREFIX.idx and PREFIX.bin and checks the whole index (its size, header, dtype, every sequence
// inside PREFIX.bin, the document boundaries); dies with one message naming the file and the problem,
// after who ("--data", "prep", ...).
MegatronSet *megatron_open(const char *prefix, const char *who);
size_t megatron_docs(const MegatronSet *m); // documents
uint64_t megatron_doc_tokens(const MegatronSet *m, size_t d); // tokens of document d
uint64_t megatron_tokens(const MegatronSet *m); // tokens of all documents
// Document d's tokens (its sequences in order) into dst (room for megatron_doc_tokens); dies on a read
// error or an id that is negative or beyond what the loader keeps (INT32_MAX - 64).
void megatron_read_doc(MegatronSet *m, size_t d, int32_t *dst);
void megatron_close(MegatronSet *m);
