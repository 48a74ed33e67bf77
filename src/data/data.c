// data.c — loading token streams (synthetic corpus, text files as bytes, llm.c .bin shards),
// the train/val split (held-out tail, a --val-data file, or every 10th window of the embedded corpus),
// per-epoch shuffles, and the deterministic batch readers.
#define _POSIX_C_SOURCE 200809L
#include "data/data.h"
#include "core/common.h"
#include "core/rng.h"
#include "data/megatron.h"
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <glob.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define SYNTH_BYTES ((size_t)2 << 20) // 2 MiB of synthetic text by default
#define MIN_WINDOWS 10 // window 9 is the first validation window
#define EPOCH_MIX 0x9E3779B97F4A7C15ull // epoch e shuffles with seed ^ (e * EPOCH_MIX)
#define SHARD_MAGIC 20240520 // uint16 tokens
#define SHARD_VERSION 1
#define SHARD32_MAGIC 20240801 // uint32 tokens (llm.c, vocabularies beyond 65536)
#define SHARD32_VERSION 7
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)
#define TEXT_SNIFF_BYTES ((size_t)64 << 10)
#define VOCAB_ROUND 64

// ---------------------------------------------------------------------------------------------
// Per-epoch permutation cache. The batch readers take const Dataset*; the cache lives behind
// ds->perm_cache (a pointer to non-const), guarded by a mutex so concurrent readers are safe.
// Two slots, so a batch straddling an epoch boundary does not thrash. The cache only avoids
// recomputation: a permutation is a pure function of (seed, epoch, n_train).

struct DataPermCache {
    pthread_mutex_t lock;
    uint32_t *perm[2]; // perm[i] holds the order of epoch epoch[i] (indices into train_idx)
    uint64_t epoch[2];
    int valid[2];
    int last; // slot used most recently
};

static void make_perm(uint32_t *perm, size_t n, uint64_t seed, uint64_t epoch) {
    Rng r;
    rng_seed(&r, seed ^ (epoch * EPOCH_MIX));
    for (size_t i = 0; i < n; i++) perm[i] = (uint32_t)i;
    for (size_t i = n - 1; i > 0; i--) { // Fisher-Yates, n >= 1
        size_t j = rng_below(&r, (uint32_t)(i + 1));
        uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

// Caller holds the lock; the returned array stays valid until the lock is released.
static const uint32_t *perm_for_epoch(const Dataset *ds, uint64_t epoch) {
    struct DataPermCache *c = ds->perm_cache;
    for (int i = 0; i < 2; i++)
        if (c->valid[i] && c->epoch[i] == epoch) {
            c->last = i;
            return c->perm[i];
        }
    int slot = 1 - c->last;
    if (!c->perm[slot]) c->perm[slot] = xmalloc(ds->n_train * sizeof(uint32_t));
    make_perm(c->perm[slot], ds->n_train, ds->seed, epoch);
    c->epoch[slot] = epoch;
    c->valid[slot] = 1;
    c->last = slot;
    return c->perm[slot];
}

static void lock_cache(const Dataset *ds) {
    CHECK(ds->perm_cache, "data: dataset is not open");
    int rc = pthread_mutex_lock(&ds->perm_cache->lock);
    CHECK(rc == 0, "data: cannot lock the permutation cache (%s)", strerror(rc));
}
static void unlock_cache(const Dataset *ds) { pthread_mutex_unlock(&ds->perm_cache->lock); }

// Caller holds the lock.
static size_t train_window_locked(const Dataset *ds, uint64_t s) {
    const uint32_t *perm = perm_for_epoch(ds, s / ds->n_train);
    return ds->train_idx[perm[s % ds->n_train]];
}

// ---------------------------------------------------------------------------------------------
// Text files.

// Binary rule: a file is refused as binary if its first 64 KiB contain a NUL byte, or if more
// than 30% of those bytes are non-text. Text bytes are printable ASCII, \t \n \v \f \r \b ESC,
// and bytes of well-formed UTF-8 multi-byte sequences; everything else (other control bytes,
// DEL, stray or malformed bytes >= 0x80) is non-text.
static void check_text(const char *path, const unsigned char *b, size_t len) {
    size_t n = len < TEXT_SNIFF_BYTES ? len : TEXT_SNIFF_BYTES, bad = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = b[i];
        if (c == 0)
            DIE("'%s' looks binary (NUL byte at offset %zu); expected a text file, or an llm.c .bin shard",
                path, i);
        if (c < 0x80) {
            int ok = (c >= 0x20 && c != 0x7F) || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
                c == '\r' || c == '\b' || c == 0x1B;
            bad += !ok;
            i++;
            continue;
        }
        int need = c >= 0xC2 && c <= 0xDF ? 1 : c >= 0xE0 && c <= 0xEF ? 2 : c >= 0xF0 && c <= 0xF4 ? 3 : -1;
        int ok = need > 0;
        for (int k = 1; ok && k <= need && i + k < n; k++) ok = (b[i + k] & 0xC0) == 0x80;
        if (ok) i += (size_t)need + 1;
        else {
            bad++;
            i++;
        }
    }
    if (bad * 10 > n * 3)
        DIE("'%s' looks binary (%zu of its first %zu bytes are not text, over 30%%); expected a text file",
            path, bad, n);
}

static void load_text(Dataset *ds, const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) DIE("cannot open text file '%s' (%s)", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) DIE("'%s' is a directory, not a text file", path);
    if (!S_ISREG(st.st_mode))
        DIE("'%s' is not a regular file (a FIFO or device would be read forever)", path);
    size_t len = 0;
    char *buf = read_file(path, &len);
    if (!buf) DIE("cannot read text file '%s' (%s)", path, strerror(errno));
    if (len == 0) DIE("text file '%s' is empty (0 bytes)", path);
    check_text(path, (const unsigned char *)buf, len);
    ds->tokens = xmalloc(len * sizeof(int32_t));
    for (size_t i = 0; i < len; i++) ds->tokens[i] = (unsigned char)buf[i];
    free(buf);
    ds->n_tokens = len;
    ds->vocab_size = 256;
    snprintf(ds->source, sizeof ds->source, "text:%s", path);
}

// ---------------------------------------------------------------------------------------------
// llm.c shards: 256 int32 header (magic, version, token count), then the tokens, little-endian
// (the host must be little-endian too). Two forms: magic 20240520 version 1 with uint16 tokens,
// and magic 20240801 version 7 with uint32 tokens. The form is decided per file.

// Reads through a descriptor, straight into *tokens (the caller's: ds->tokens, which data_close frees), with
// no buffer or FILE of its own: a refused shard leaves nothing behind when DIE returns (the fuzz target;
// stdio's FILE and a 256 KB staging buffer leaked 10 KB a refused input there, 4 GB in a minute of fuzzing).
static size_t load_shard(const char *path, int32_t **tokens, size_t n_have) {
    struct stat st; // before opening: opening a FIFO would wait for a writer
    if (stat(path, &st) != 0) DIE("cannot stat shard '%s' (%s)", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) DIE("shard '%s' is not a regular file", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) DIE("cannot open '%s' (%s)", path, strerror(errno));
    if (fstat(fd, &st) != 0) DIE("cannot stat shard '%s' (%s)", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) DIE("shard '%s' is not a regular file", path);
    long long size = (long long)st.st_size;
    if (size == 0) DIE("shard '%s' is empty (0 bytes)", path);
    if (size < SHARD_HEADER_BYTES)
        DIE("shard '%s' is truncated: %lld bytes, too small for the %d-byte header", path, size,
            SHARD_HEADER_BYTES);
    int32_t hdr[SHARD_HEADER_INTS];
    xpread(fd, hdr, sizeof hdr, 0, path);
    int tb; // bytes per token
    if (hdr[0] == SHARD_MAGIC) {
        if (hdr[1] != SHARD_VERSION)
            DIE("shard '%s' has unsupported version %d (magic %d expects version %d: uint16 tokens)", path,
                hdr[1], SHARD_MAGIC, SHARD_VERSION);
        tb = 2;
    } else if (hdr[0] == SHARD32_MAGIC) {
        if (hdr[1] != SHARD32_VERSION)
            DIE("shard '%s' has unsupported version %d (magic %d expects version %d: uint32 tokens)", path,
                hdr[1], SHARD32_MAGIC, SHARD32_VERSION);
        tb = 4;
    } else {
        char idx[1100] = ""; // PREFIX.idx beside PREFIX.bin
        size_t len = strlen(path);
        if (len > 4 && !strcmp(path + len - 4, ".bin"))
            snprintf(idx, sizeof idx, "%.*s.idx", (int)len - 4, path);
        DIE("shard '%s' has wrong magic %d (expected %d for uint16 or %d for uint32 tokens): not an llm.c "
            "token shard%s",
            path, hdr[0], SHARD_MAGIC, SHARD32_MAGIC,
            idx[0] && file_exists(idx)
                ? " (beside it is a .idx: a Megatron dataset is named by its prefix, without .bin)"
                : "");
    }
    if (hdr[2] < 0) DIE("shard '%s' header has a negative token count %d", path, hdr[2]);
    long long n = hdr[2], expected = SHARD_HEADER_BYTES + tb * n;
    if (size < expected)
        DIE("shard '%s' is truncated: header says %lld tokens but the file holds only %lld (%lld bytes)",
            path, n, (size - SHARD_HEADER_BYTES) / tb, size);
    if (size > expected)
        DIE("shard '%s' size mismatch: %lld bytes, expected %lld (%d-byte header + %d bytes x %lld tokens)",
            path, size, expected, SHARD_HEADER_BYTES, tb, n);
    *tokens = xrealloc(*tokens, (n_have + (size_t)n) * sizeof(int32_t));
    int32_t *dst = *tokens + n_have;
    if (tb == 2) { // the n uint16 into the upper half of dst's 4n bytes, then widened in place from the front
                   // (dst[i]'s bytes end below element i + 1's source; read by memcpy: no aliasing)
        unsigned char *b16 = (unsigned char *)dst + 2 * (size_t)n;
        xpread(fd, b16, 2 * (size_t)n, SHARD_HEADER_BYTES, path);
        for (size_t i = 0; i < (size_t)n; i++) {
            uint16_t v;
            memcpy(&v, b16 + 2 * i, 2);
            dst[i] = v;
        }
    } else {
        uint32_t *b32 = (uint32_t *)dst;
        xpread(fd, b32, 4 * (size_t)n, SHARD_HEADER_BYTES, path);
        for (size_t i = 0; i < (size_t)n;
             i++) // the loader keeps int32 ids; the vocabulary is rounded up to 64
            if (b32[i] > (uint32_t)(INT32_MAX - VOCAB_ROUND))
                DIE("shard '%s': token %u at position %zu is too large (ids must be below %d)", path,
                    (unsigned)b32[i], i, INT32_MAX - VOCAB_ROUND + 1);
    }
    if (close(fd) != 0) DIE("cannot close shard '%s' (%s)", path, strerror(errno));
    return (size_t)n;
}

void data_write_shard(const char *path, const int32_t *tokens, size_t n, int vocab_size) {
    const uint16_t one = 1;
    CHECK(*(const uint8_t *)&one == 1, "llm.c shards are little-endian; this host is not");
    CHECK(n <= (size_t)INT32_MAX, "shard '%s': %zu tokens do not fit the header's int32 count", path, n);
    int wide = vocab_size > 65536;
    int32_t hdr[SHARD_HEADER_INTS] = {wide ? SHARD32_MAGIC : SHARD_MAGIC,
                                      wide ? SHARD32_VERSION : SHARD_VERSION, (int32_t)n};
    FILE *f = xfopen(path, "wb");
    xfwrite(hdr, sizeof hdr, 1, f, path);
    enum { CHUNK = 1 << 16 };
    static _Thread_local uint32_t buf[CHUNK];
    for (size_t i = 0; i < n; i += CHUNK) {
        size_t m = n - i < CHUNK ? n - i : CHUNK;
        for (size_t k = 0; k < m; k++) {
            int32_t v = tokens[i + k];
            CHECK(v >= 0 && v < vocab_size, "shard '%s': token %d is outside the vocabulary (%d)", path, v,
                  vocab_size);
            if (wide) buf[k] = (uint32_t)v;
            else ((uint16_t *)buf)[k] = (uint16_t)v;
        }
        xfwrite(buf, wide ? 4 : 2, m, f, path);
    }
    xfclose(f, path);
}

static void load_shards(Dataset *ds, const char *pattern) {
    const uint16_t one = 1;
    CHECK(*(const uint8_t *)&one == 1, "llm.c shards are little-endian; this host is not");
    int has_glob = strpbrk(pattern, "*?[") != NULL;
    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        if (has_glob) DIE("no file matches the shard pattern '%s'", pattern);
        DIE("cannot open shard file '%s' (no file by that name)", pattern);
    }
    if (rc == GLOB_NOSPACE) DIE("out of memory expanding the shard pattern '%s'", pattern);
    if (rc != 0) DIE("cannot expand the shard pattern '%s' (a directory could not be read)", pattern);
    size_t n = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) n += load_shard(g.gl_pathv[i], &ds->tokens, n);
    int max_id = 0;
    for (size_t i = 0; i < n; i++)
        if (ds->tokens[i] > max_id) max_id = ds->tokens[i];
    if (!ds->tokens) ds->tokens = xmalloc(sizeof(int32_t));
    ds->n_tokens = n;
    // in 64 bits: the largest id the loader keeps (INT32_MAX - 64) rounds up to a vocabulary that fits an
    // int, but max_id + 64 does not (found by tests/fuzz/fuzz_shard.c)
    ds->vocab_size = (int)(((int64_t)max_id + VOCAB_ROUND) / VOCAB_ROUND * VOCAB_ROUND);
    snprintf(ds->source, sizeof ds->source, "shards:%s (%zu file%s)", pattern, g.gl_pathc,
             g.gl_pathc == 1 ? "" : "s");
    globfree(&g);
}

// ---------------------------------------------------------------------------------------------

static void load_synthetic(Dataset *ds, uint64_t seed, int T) {
    size_t want = SYNTH_BYTES;
    size_t need = (size_t)MIN_WINDOWS * (size_t)T + 64; // synth_generate may stop 39 bytes short
    if (want < need) want = need;
    char *text = xmalloc(want);
    ds->kinds = xmalloc(want);
    size_t n = synth_generate(seed, want, text, ds->kinds);
    ds->tokens = xmalloc(n * sizeof(int32_t));
    for (size_t i = 0; i < n; i++) ds->tokens[i] = (unsigned char)text[i];
    free(text);
    ds->n_tokens = n;
    ds->vocab_size = 256;
    ds->n_kinds = synth_kind_names(ds->kind_names);
    snprintf(ds->source, sizeof ds->source, "synthetic(seed=%llu)", (unsigned long long)seed);
}

int data_is_shards(const char *path) {
    size_t plen = strlen(path);
    char prefix[1100];
    return (plen >= 4 && strcmp(path + plen - 4, ".bin") == 0) || strpbrk(path, "*?[") ||
        megatron_path(path, prefix, sizeof prefix);
}

// A Megatron indexed dataset: its documents in order, as one stream (their EOD tokens are in the data).
static void load_megatron(Dataset *ds, const char *path, const char *prefix) {
    const uint16_t one = 1;
    CHECK(*(const uint8_t *)&one == 1, "Megatron datasets are little-endian; this host is not");
    MegatronSet *m = megatron_open(prefix, "--data");
    uint64_t n = megatron_tokens(m);
    if (n == 0) DIE("Megatron dataset '%s' holds no token", path);
    ds->tokens = xmalloc((size_t)n * sizeof(int32_t));
    size_t at = 0;
    for (size_t d = 0; d < megatron_docs(m); d++) {
        megatron_read_doc(m, d, ds->tokens + at);
        at += (size_t)megatron_doc_tokens(m, d);
    }
    int max_id = 0;
    for (size_t i = 0; i < at; i++)
        if (ds->tokens[i] > max_id) max_id = ds->tokens[i];
    ds->n_tokens = at;
    ds->vocab_size = (int)(((int64_t)max_id + VOCAB_ROUND) / VOCAB_ROUND * VOCAB_ROUND);
    snprintf(ds->source, sizeof ds->source, "megatron:%s (%zu documents)", prefix, megatron_docs(m));
    megatron_close(m);
}

// Loads the tokens of path (NULL: the synthetic corpus) into ds, with max_token.
static void load_source(Dataset *ds, const char *path, uint64_t seed, int T) {
    char prefix[1100];
    if (!path) load_synthetic(ds, seed, T);
    else if (megatron_path(path, prefix, sizeof prefix)) load_megatron(ds, path, prefix);
    else if (data_is_shards(path)) load_shards(ds, path);
    else load_text(ds, path);
    ds->max_token = -1;
    for (size_t i = 0; i < ds->n_tokens; i++)
        if (ds->tokens[i] > ds->max_token) ds->max_token = ds->tokens[i];
}

int data_val_frac_holds(double f) { return round(f * 1e6) >= 1; }

// The held-out tail of n tokens: ceil(n * f) (f is a decimal the user typed, read as a float: rounded
// back to 6 digits so that 0.1 holds out 8 of 80 tokens, not 9).
static size_t tail_tokens(size_t n, double f) {
    double fd = round(f * 1e6) / 1e6;
    return (size_t)ceil((double)n * fd - 1e-9);
}
static size_t windows_in(size_t n, int T) { return n >= (size_t)T + 1 ? (n - 1) / (size_t)T : 0; }
static int tail_fits(size_t n, double f, int T) {
    size_t held = tail_tokens(n, f);
    return held <= n && windows_in(held, T) >= 1 && windows_in(n - held, T) >= 1;
}
// The fewest tokens whose tail split fits (f rounds to >= 1e-6). tail_fits holds from some n on (one
// more token adds at most one to the tail and never shrinks the rest), so: double, then bisect; counting
// up a token at a time took about T / f steps (hours at a small f and a long T).
static size_t tail_need(double f, int T) {
    size_t lo = (size_t)T + 1, hi = lo; // tail_fits(lo - 1) is false: one window needs T + 1 tokens
    while (!tail_fits(hi, f, T)) lo = hi + 1, hi *= 2;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (tail_fits(mid, f, T)) hi = mid;
        else lo = mid + 1;
    }
    return hi;
}

void data_open_split(Dataset *ds, const char *path, const char *val_path, double val_frac, uint64_t seed,
                     int T) {
    memset(ds, 0, sizeof *ds);
    CHECK(T >= 1, "data: sequence length T must be >= 1 (got %d)", T);
    if (!path && val_path) DIE("--val-data needs --data: the embedded corpus holds out its own windows");
    if (!(val_frac > 0 && val_frac <= 0.5)) DIE("--val-frac must be in (0, 0.5] (got %g)", val_frac);
    if (!data_val_frac_holds(val_frac))
        DIE("--val-frac %g holds out no token (it is read to 6 decimals): the smallest that works is %g",
            val_frac, DATA_VAL_FRAC_MIN);
    if (!path && fabs(val_frac - DATA_VAL_FRAC) > 1e-6)
        DIE("--val-frac %g: the embedded corpus holds out every 10th window (its split is fixed); --val-frac "
            "applies to --data files",
            val_frac);
    load_source(ds, path, seed, T);
    ds->T = T;
    ds->seed = seed;
    ds->val_frac = val_frac;
    size_t first_val = 0, val_avail = 0; // tail / file: where the validation windows start, tokens they tile
    if (!path) {
        ds->split = DATA_SPLIT_EVERY10;
        size_t need = (size_t)MIN_WINDOWS * (size_t)T + 1;
        if (ds->n_tokens < need)
            DIE("the synthetic corpus has %zu tokens, too few for T=%d: need at least %zu (%d windows of T+1 "
                "tokens "
                "at stride T, so that one is a validation window)",
                ds->n_tokens, T, need, MIN_WINDOWS);
        ds->n_windows = (ds->n_tokens - 1) / (size_t)T;
        ds->n_val = ds->n_windows / 10;
        ds->n_train = ds->n_windows - ds->n_val;
        ds->val_tokens = ds->tokens;
        ds->val_kinds = ds->kinds;
    } else if (val_path) {
        ds->split = DATA_SPLIT_FILE;
        Dataset v;
        memset(&v, 0, sizeof v);
        load_source(&v, val_path, seed, T);
        snprintf(ds->val_source, sizeof ds->val_source, "%s", v.source);
        if (v.max_token > ds->max_token) ds->max_token = v.max_token;
        if (v.vocab_size > ds->vocab_size) ds->vocab_size = v.vocab_size;
        ds->own_val = v.tokens;
        ds->n_own_val = v.n_tokens;
        ds->val_tokens = v.tokens;
        val_avail = v.n_tokens;
        if (windows_in(ds->n_tokens, T) < 1)
            DIE("%s has %zu tokens, too few for T=%d: need at least %d (one window of T+1 tokens)", path,
                ds->n_tokens, T, T + 1);
        if (windows_in(val_avail, T) < 1)
            DIE("--val-data %s has %zu tokens, too few for T=%d: need at least %d (one window of T+1 tokens)",
                val_path, val_avail, T, T + 1);
        ds->n_train = windows_in(ds->n_tokens, T);
    } else {
        ds->split = DATA_SPLIT_TAIL;
        if (!tail_fits(ds->n_tokens, val_frac, T)) {
            size_t need = tail_need(val_frac, T);
            DIE("%s has %zu tokens, too few for T=%d: need at least %zu (a window of T+1 tokens before the "
                "held-out "
                "tail, and one in it: --val-frac %g)",
                path, ds->n_tokens, T, need, val_frac);
        }
        size_t held = tail_tokens(ds->n_tokens, val_frac);
        ds->val_start = first_val = ds->n_tokens - held;
        ds->val_tokens = ds->tokens;
        val_avail = held;
        ds->n_train = windows_in(ds->val_start, T);
    }
    if (ds->split != DATA_SPLIT_EVERY10) {
        ds->n_val = windows_in(val_avail, T);
        ds->n_windows = ds->n_train + ds->n_val;
    }
    CHECK(ds->n_train <= UINT32_MAX,
          "data: %zu training windows is more than this loader supports (2^32 - 1)", ds->n_train);
    ds->train_idx = xmalloc(ds->n_train * sizeof(size_t));
    ds->val_off = xmalloc(ds->n_val * sizeof(size_t));
    size_t nt = 0, nv = 0;
    if (ds->split == DATA_SPLIT_EVERY10) {
        for (size_t w = 0; w < ds->n_windows; w++) {
            if (w % 10 == 9) ds->val_off[nv++] = w * (size_t)T;
            else ds->train_idx[nt++] = w;
        }
    } else {
        for (size_t w = 0; w < ds->n_train; w++) ds->train_idx[w] = w;
        for (size_t i = 0; i < ds->n_val; i++) ds->val_off[i] = first_val + i * (size_t)T;
    }
    ds->perm_cache = xcalloc(1, sizeof *ds->perm_cache);
    int rc = pthread_mutex_init(&ds->perm_cache->lock, NULL);
    CHECK(rc == 0, "data: cannot create a mutex (%s)", strerror(rc));
}

void data_open(Dataset *ds, const char *path, uint64_t seed, int T) {
    data_open_split(ds, path, NULL, DATA_VAL_FRAC, seed, T);
}

void data_split_desc(const Dataset *ds, char *buf, size_t n) {
    if (ds->split == DATA_SPLIT_EVERY10)
        snprintf(buf, n, "validation: every 10th window of %d+1 tokens (the embedded corpus)", ds->T);
    else if (ds->split == DATA_SPLIT_FILE)
        snprintf(buf, n, "validation: --val-data %s, %zu windows; all of --data trains", ds->val_source,
                 ds->n_val);
    else
        snprintf(buf, n, "validation: the held-out tail, the last %g%% of the tokens (%zu from token %zu)",
                 100 * round(ds->val_frac * 1e6) / 1e6, ds->n_tokens - ds->val_start, ds->val_start);
}

DataPrint data_print(const Dataset *ds, int val) {
    DataPrint p = {0, 0};
    const int32_t *t = val ? ds->own_val : ds->tokens;
    if (!t) return p;
    p.tokens = val ? ds->n_own_val : ds->n_tokens;
    p.hash = hash_bytes(t, p.tokens * sizeof(int32_t), p.tokens);
    return p;
}

void data_close(Dataset *ds) {
    free(ds->tokens);
    free(ds->kinds);
    free(ds->train_idx);
    free(ds->val_off);
    free(ds->own_val);
    if (ds->perm_cache) {
        pthread_mutex_destroy(&ds->perm_cache->lock);
        free(ds->perm_cache->perm[0]);
        free(ds->perm_cache->perm[1]);
        free(ds->perm_cache);
    }
    memset(ds, 0, sizeof *ds);
}

static void copy_window(const Dataset *ds, size_t w, int32_t *inputs, int32_t *targets) {
    const int32_t *src = ds->tokens + w * (size_t)ds->T;
    memcpy(inputs, src, (size_t)ds->T * sizeof(int32_t));
    memcpy(targets, src + 1, (size_t)ds->T * sizeof(int32_t));
}

size_t data_train_window(const Dataset *ds, uint64_t s) {
    lock_cache(ds);
    size_t w = train_window_locked(ds, s);
    unlock_cache(ds);
    return w;
}

void data_train_batch(const Dataset *ds, uint64_t s0, int n, int32_t *inputs, int32_t *targets) {
    CHECK(n >= 0, "data_train_batch: negative batch size %d", n);
    size_t T = (size_t)ds->T;
    lock_cache(ds);
    for (int r = 0; r < n; r++)
        copy_window(ds, train_window_locked(ds, s0 + (uint64_t)r), inputs + (size_t)r * T,
                    targets + (size_t)r * T);
    unlock_cache(ds);
}

void data_val_batch(const Dataset *ds, uint64_t i0, int n, int32_t *inputs, int32_t *targets,
                    uint8_t *kinds) {
    CHECK(n >= 0, "data_val_batch: negative batch size %d", n);
    CHECK(i0 <= ds->n_val && (uint64_t)n <= ds->n_val - i0,
          "data: validation sequences %llu..%llu requested, the validation set has %zu",
          (unsigned long long)i0, (unsigned long long)(i0 + (uint64_t)n), ds->n_val);
    size_t T = (size_t)ds->T;
    for (int r = 0; r < n; r++) {
        size_t off = ds->val_off[i0 + (uint64_t)r];
        const int32_t *src = ds->val_tokens + off;
        memcpy(inputs + (size_t)r * T, src, T * sizeof(int32_t));
        memcpy(targets + (size_t)r * T, src + 1, T * sizeof(int32_t));
        if (!kinds) continue;
        if (ds->val_kinds) memcpy(kinds + (size_t)r * T, ds->val_kinds + off + 1, T);
        else memset(kinds + (size_t)r * T, 0, T);
    }
}
