// data.h — token sources (embedded synthetic corpus, any text file as bytes, llm.c .bin shards),
// the train/val split, and deterministic batches. Must not hold: anything about the model.
//
// Split: the token stream is cut into windows of T+1 tokens (stride T). Every 10th window
// (index % 10 == 9) is validation, the rest training. Training windows are visited in a
// seeded random permutation per epoch (epoch e: Fisher-Yates over train_idx with an Rng seeded by
// seed ^ (e * 0x9E3779B97F4A7C15)); the global sequence counter s picks window
// train_idx[perm_{s / n_train}[s % n_train]], so the data position is one integer and a resumed
// run, or any split of the global batch across ranks, reads the same tokens (batches depend only
// on (seed, T, s), never on call history). The batch functions are thread-safe.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define DATA_MAX_KINDS 8

typedef struct {
    // the whole token stream
    int32_t *tokens;
    uint8_t *kinds;          // per-token kind label (synthetic corpus only), else NULL
    size_t n_tokens;
    int vocab_size;          // 256 for bytes; shards: max token id + 1 rounded up to a multiple of 64
                             // (50304 for GPT-2 shards, which contain <|endoftext|> = 50256)
    int max_token;           // largest token id in the stream (a model fits the data iff vocab > max_token)
    int n_kinds;             // 0 unless synthetic
    const char *kind_names[DATA_MAX_KINDS];
    char source[256];        // "synthetic(seed=1)", "text:path", "shards:pattern (n files)"
    // split
    int T;
    uint64_t seed;
    size_t n_windows, n_train, n_val;
    size_t *train_idx;       // window indices that are training windows (ascending)
    size_t *val_idx;         // window indices that are validation windows
    struct DataPermCache *perm_cache;  // private to data.c: cached per-epoch permutations (+ lock)
} Dataset;

// path == NULL: the embedded synthetic corpus generated from seed.
// path ending in ".bin" or containing a glob char ('*','?','['): llm.c token shards, each either
// uint16 (header magic 20240520, version 1) or uint32 (magic 20240801, version 7): 256 int32 header
// words (magic, version, token count, rest unused), then the tokens, little-endian.
// Otherwise: any file, bytes as tokens (vocab 256).
// Dies with a clear message on a missing/empty/unreadable/malformed file or too little data for T.
void data_open(Dataset *ds, const char *path, uint64_t seed, int T);
void data_close(Dataset *ds);

// Training sequences s0 .. s0+n-1 of the global sequence counter: inputs/targets (n, T).
void data_train_batch(const Dataset *ds, uint64_t s0, int n, int32_t *inputs, int32_t *targets);
// The window index (into the token stream, tokens [w*T, w*T+T]) that training sequence s reads.
size_t data_train_window(const Dataset *ds, uint64_t s);
// Validation sequences i0 .. i0+n-1 (wrapping around the val set). kinds (n, T) of the
// target tokens may be NULL (filled with 0 when the dataset has no kind labels).
void data_val_batch(const Dataset *ds, uint64_t i0, int n, int32_t *inputs, int32_t *targets, uint8_t *kinds);

// The synthetic corpus on its own (for tests / moe eval): n_bytes of text from seed,
// kinds[i] labels each byte with its line kind. Returns the kind names via names (n_kinds).
// Writes whole newline-terminated lines (each < 40 bytes) only, so it returns the byte count
// written: <= n_bytes and > n_bytes - 40; the output is a prefix-stable function of seed.
// kinds may be NULL.
size_t synth_generate(uint64_t seed, size_t n_bytes, char *text, uint8_t *kinds);
int synth_kind_names(const char **names);   // names: room for DATA_MAX_KINDS; returns count
