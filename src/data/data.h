// data.h — token sources (embedded synthetic corpus, any text file as bytes, llm.c .bin shards),
// the train/val split, and deterministic batches. Must not hold: anything about the model.
//
// Split: the token stream is cut into windows of T+1 tokens (stride T). Every 10th window
// (index % 10 == 9) is validation, the rest training. Training windows are visited in a
// seeded random permutation per epoch (epoch e uses seed ^ e); the global sequence counter s
// picks window perm_{s / n_train}[s % n_train], so the data position is one integer and a
// resumed run, or any split of the global batch across ranks, reads the same tokens.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define DATA_MAX_KINDS 8

typedef struct {
    // the whole token stream
    int32_t *tokens;
    uint8_t *kinds;          // per-token kind label (synthetic corpus only), else NULL
    size_t n_tokens;
    int vocab_size;          // 256 for bytes; from the shards otherwise (max token + 1, at least 50257 for GPT-2 shards)
    int n_kinds;             // 0 unless synthetic
    const char *kind_names[DATA_MAX_KINDS];
    char source[256];        // "synthetic(seed=1)", "text:path", "shards:pattern (n files)"
    // split
    int T;
    uint64_t seed;
    size_t n_windows, n_train, n_val;
    size_t *train_idx;       // window indices that are training windows (ascending)
    size_t *val_idx;         // window indices that are validation windows
} Dataset;

// path == NULL: the embedded synthetic corpus generated from seed.
// path ending in ".bin" or containing a glob char ('*','?','['): llm.c token shards.
// Otherwise: any file, bytes as tokens (vocab 256).
// Dies with a clear message on a missing/empty/unreadable/malformed file or too little data for T.
void data_open(Dataset *ds, const char *path, uint64_t seed, int T);
void data_close(Dataset *ds);

// Training sequences s0 .. s0+n-1 of the global sequence counter: inputs/targets (n, T).
void data_train_batch(const Dataset *ds, uint64_t s0, int n, int32_t *inputs, int32_t *targets);
// Validation sequences i0 .. i0+n-1 (wrapping around the val set). kinds (n, T) of the
// target tokens may be NULL.
void data_val_batch(const Dataset *ds, uint64_t i0, int n, int32_t *inputs, int32_t *targets, uint8_t *kinds);

// The synthetic corpus on its own (for tests / moe eval): n_bytes of text from seed,
// kinds[i] labels each byte with its line kind. Returns the kind names via names (n_kinds).
size_t synth_generate(uint64_t seed, size_t n_bytes, char *text, uint8_t *kinds);
int synth_kind_names(const char **names);   // returns count
