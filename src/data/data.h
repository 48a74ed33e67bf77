// data.h — token sources (embedded synthetic corpus, any text file as bytes, llm.c .bin shards),
// the train/val split, and deterministic batches. Must not hold: anything about the model.
//
// Split (data_open_split), fixed by the data, not by T, except for the embedded corpus:
//   text files and shards ("tail"): the last ceil(n_tokens * val_frac) tokens are held out; training
//     windows of T+1 tokens at stride T tile the tokens before them from 0, validation windows tile
//     the held-out tail from its first token (a window never crosses the boundary).
//   --val-data FILE ("file"): all of --data trains, FILE's windows (from 0, stride T) validate.
//   the embedded synthetic corpus ("every10"): windows of T+1 at stride T; every 10th window
//     (index % 10 == 9) is validation. Its lines are independent draws, so an interleaved split
//     holds nothing out that the training windows contain beyond chance repeats; it stays as it was
//     so that runs on it keep their training windows and per-kind tables.
// Training windows are visited in a
// seeded random permutation per epoch (epoch e: Fisher-Yates over train_idx with an Rng seeded by
// seed ^ (e * 0x9E3779B97F4A7C15)); the global sequence counter s picks window
// train_idx[perm_{s / n_train}[s % n_train]], so the data position is one integer and a resumed
// run, or any split of the global batch across ranks, reads the same tokens (batches depend only
// on (seed, T, s), never on call history). The batch functions are thread-safe.
#pragma once
#include <stddef.h>
#include <stdint.h>

#define DATA_MAX_KINDS 8
#define DATA_VAL_FRAC 0.1 // default held-out fraction of a --data source (--val-frac)
#define DATA_VAL_FRAC_MIN 1e-6 // the smallest held-out fraction: --val-frac is read to 6 decimals

typedef enum { DATA_SPLIT_EVERY10, DATA_SPLIT_TAIL, DATA_SPLIT_FILE } DataSplit;

typedef struct {
    // the whole token stream
    int32_t *tokens;
    uint8_t *kinds; // per-token kind label (synthetic corpus only), else NULL
    size_t n_tokens;
    int vocab_size; // 256 for bytes; shards: max token id + 1 rounded up to a multiple of 64
                    // (50304 for GPT-2 shards, which contain <|endoftext|> = 50256)
    int max_token; // largest token id in the stream (a model fits the data iff vocab > max_token)
    int n_kinds; // 0 unless synthetic
    const char *kind_names[DATA_MAX_KINDS];
    char source[256]; // "synthetic(seed=1)", "text:path", "shards:pattern (n files)"
    // split
    int T;
    uint64_t seed;
    DataSplit split;
    double val_frac; // tail: the held-out fraction
    size_t val_start; // tail: the first held-out token (tokens before it train)
    char val_source[256]; // file: the validation source ("text:path", ...); else ""
    size_t n_windows, n_train, n_val; // n_windows = n_train + n_val
    size_t *train_idx; // training windows (ascending): window w reads tokens [w*T, w*T+T]
    const int32_t *val_tokens; // the stream validation windows read (tokens, or --val-data's)
    const uint8_t *val_kinds; // its kind labels, or NULL
    size_t *val_off; // token offset in val_tokens of each validation window (ascending)
    int32_t *own_val; // private: --val-data's tokens (freed by data_close)
    size_t n_own_val; // their count (the whole --val-data source)
    struct DataPermCache *perm_cache; // private to data.c: cached per-epoch permutations (+ lock)
} Dataset;

// path == NULL: the embedded synthetic corpus generated from seed.
// path ending in ".bin" or containing a glob char ('*','?','['): llm.c token shards, each either
// uint16 (header magic 20240520, version 1) or uint32 (magic 20240801, version 7): 256 int32 header
// words (magic, version, token count, rest unused), then the tokens, little-endian.
// "PREFIX.idx", or a PREFIX that is no file beside a PREFIX.idx: a Megatron-LM indexed dataset
// (data/megatron.h), its documents in order as one stream.
// Otherwise: any file, bytes as tokens (vocab 256).
// Dies with a clear message on a missing/empty/unreadable/malformed file or too little data for T.
void data_open(Dataset *ds, const char *path, uint64_t seed, int T); // the default split (val_frac 0.1)
// 1 when data_open reads path as tokens (llm.c shards: a ".bin" name or a glob pattern; a Megatron
// dataset), 0: a file read as bytes.
int data_is_shards(const char *path);
// The same with the split chosen: val_path (NULL: none) is a separate validation source, loaded as
// path is (text or shards); otherwise val_frac in (0, 0.5] of a --data source is held out as its
// tail. The embedded corpus (path NULL) takes neither (its split is every10; val_frac must be the
// default). Dies naming the option when a region is too short for one window of T+1 tokens.
// 1 when the held-out fraction f, read to 6 decimals, is not 0 (a smaller one holds out no token).
int data_val_frac_holds(double f);
void data_open_split(Dataset *ds, const char *path, const char *val_path, double val_frac, uint64_t seed,
                     int T);
// Write n tokens (each in [0, vocab_size)) as an llm.c shard at path, in the form data_open reads: uint16
// tokens (magic 20240520, version 1) when vocab_size <= 65536, else uint32 (magic 20240801, version 7).
// Dies naming the path on a write error or a token outside the vocabulary.
void data_write_shard(const char *path, const int32_t *tokens, size_t n, int vocab_size);
// One line describing the split ("held out: the last 10% (111540 tokens)", ...) into buf.
void data_split_desc(const Dataset *ds, char *buf, size_t n);
void data_close(Dataset *ds);

// What identifies a token stream's contents: its token count and a hash of its tokens (the run record
// keeps them so that a resume notices changed data; the ranks of a job compare them).
typedef struct {
    size_t tokens;
    uint64_t hash;
} DataPrint;
// The training stream's fingerprint (val 0), or --val-data's (val 1: {0, 0} when there is none).
DataPrint data_print(const Dataset *ds, int val);

// Training sequences s0 .. s0+n-1 of the global sequence counter: inputs/targets (n, T).
void data_train_batch(const Dataset *ds, uint64_t s0, int n, int32_t *inputs, int32_t *targets);
// The window index (into the token stream, tokens [w*T, w*T+T]) that training sequence s reads.
size_t data_train_window(const Dataset *ds, uint64_t s);
// Validation sequences i0 .. i0+n-1, within the val set (i0 + n <= n_val: it never wraps; dies
// otherwise). kinds (n, T) of the target tokens may be NULL (filled with 0 when the dataset has
// no kind labels).
void data_val_batch(const Dataset *ds, uint64_t i0, int n, int32_t *inputs, int32_t *targets, uint8_t *kinds);

// The synthetic corpus on its own (for tests / moe eval): n_bytes of text from seed,
// kinds[i] labels each byte with its line kind. Returns the kind names via names (n_kinds).
// Writes whole newline-terminated lines (each < 40 bytes) only, so it returns the byte count
// written: <= n_bytes and > n_bytes - 40; the output is a prefix-stable function of seed.
// kinds may be NULL.
size_t synth_generate(uint64_t seed, size_t n_bytes, char *text, uint8_t *kinds);
int synth_kind_names(const char **names); // names: room for DATA_MAX_KINDS; returns count
