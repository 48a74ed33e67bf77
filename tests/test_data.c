// test_data.c — tests for the data module: the synthetic corpus (determinism, line formats, kind
// labels), the train/val split, per-epoch shuffles and random-access batches, text files, llm.c
// shards (round trip, glob concatenation, vocab rounding) and the error exits (run in a fork).
#define _POSIX_C_SOURCE 200809L
#include "core/common.h"
#include "core/rng.h"
#include "data/data.h"
#include "test_util.h"
#include "test_death.h"
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <setjmp.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmp_dir[64];
static char made_files[64][160];
static int n_made = 0;

static const char *tmp_path(const char *name) {
    CHECK(n_made < 64, "test: too many temp files");
    snprintf(made_files[n_made], sizeof made_files[n_made], "%s/%s", tmp_dir, name);
    return made_files[n_made++];
}

static const char *write_bytes(const char *name, const void *p, size_t n) {
    const char *path = tmp_path(name);
    FILE *f = xfopen(path, "wb");
    xfwrite(p, 1, n, f, path);
    xfclose(f, path);
    return path;
}

// A shard with the given header fields; n_write tokens are written (+ extra zero bytes).
static const char *write_shard(const char *name, int magic, int version, int header_count,
                               const uint16_t *toks, size_t n_write, size_t extra) {
    const char *path = tmp_path(name);
    int32_t hdr[256] = {0};
    hdr[0] = magic;
    hdr[1] = version;
    hdr[2] = header_count;
    FILE *f = xfopen(path, "wb");
    xfwrite(hdr, sizeof hdr[0], 256, f, path);
    xfwrite(toks, sizeof toks[0], n_write, f, path);
    for (size_t i = 0; i < extra; i++) xfwrite("", 1, 1, f, path);
    xfclose(f, path);
    return path;
}

// Runs data_open in a child with stderr captured; expects a non-zero exit and `phrase` in the message.
typedef struct {
    const char *path;
    int T;
} OpenArgs;
static void do_open(void *p) {
    OpenArgs *a = p;
    Dataset ds;
    data_open(&ds, a->path, 1, a->T);
}
static void expect_death(const char *what, const char *path, int T, const char *phrase) {
    OpenArgs a = {path, T};
    expect_death_msg(what, do_open, &a, phrase, NULL, 0);
}

// ---------------------------------------------------------------------------------------------

static int check_line(const char *l, int len, int kind) {
    char buf[64], a[64], b[64];
    if (len < 2 || len >= 40 || l[len - 1] != '\n') return 0;
    memcpy(buf, l, (size_t)len - 1);
    buf[len - 1] = 0;
    char *eq = strchr(buf, '=');
    if (!eq) return 0;
    *eq = 0;
    const char *rhs = eq + 1;
    switch (kind) {
        case 0: { // add
            int x, y, z, n = 0;
            *eq = '=';
            if (sscanf(buf, "%d+%d=%d%n", &x, &y, &z, &n) != 3 || n != len - 1) return 0;
            return x + y == z && x >= 0 && x < 1000 && y >= 0 && y < 1000;
        }
        case 1:
        case 3:
        case 5: { // reverse, copy, upper
            const char *pre = kind == 1 ? "rev:" : kind == 3 ? "copy:" : "upper:";
            size_t pl = strlen(pre);
            if (strncmp(buf, pre, pl) != 0) return 0;
            const char *s = buf + pl;
            size_t n = strlen(s);
            if (n < 2 || n > 12 || strlen(rhs) != n) return 0;
            for (size_t i = 0; i < n; i++) {
                if (!islower((unsigned char)s[i])) return 0;
                char want = kind == 1 ? s[n - 1 - i] : kind == 3 ? s[i] : (char)toupper((unsigned char)s[i]);
                if (rhs[i] != want) return 0;
            }
            return 1;
        }
        case 2: { // sort
            if (strncmp(buf, "sort:", 5) != 0) return 0;
            snprintf(a, sizeof a, "%s", buf + 5);
            size_t n = strlen(a);
            if (n < 2 || n > 10 || strlen(rhs) != n) return 0;
            for (size_t i = 0; i < n; i++)
                if (!isdigit((unsigned char)a[i])) return 0;
            for (size_t i = 1; i < n; i++) // insertion sort
                for (size_t j = i; j > 0 && a[j - 1] > a[j]; j--) {
                    char t = a[j];
                    a[j] = a[j - 1];
                    a[j - 1] = t;
                }
            return strcmp(a, rhs) == 0;
        }
        case 4: { // count
            if (strncmp(buf, "count:", 6) != 0) return 0;
            char *slash = strchr(buf, '/');
            if (!slash || strlen(slash) != 2) return 0;
            *slash = 0;
            snprintf(b, sizeof b, "%s", buf + 6);
            char c = slash[1];
            int cnt = 0;
            for (char *p = b; *p; p++) {
                if (*p < 'a' || *p > 'e') return 0;
                cnt += *p == c;
            }
            char want[16];
            snprintf(want, sizeof want, "%d", cnt);
            return strcmp(want, rhs) == 0;
        }
    }
    return 0;
}

static void test_synth(void) {
    const char *names[DATA_MAX_KINDS];
    int nk = synth_kind_names(names);
    EXPECT(nk >= 4 && nk <= DATA_MAX_KINDS, "n_kinds %d", nk);
    size_t N = 200000;
    char *t1 = xmalloc(N), *t2 = xmalloc(N), *t3 = xmalloc(N);
    uint8_t *k1 = xmalloc(N), *k2 = xmalloc(N);
    size_t n1 = synth_generate(7, N, t1, k1), n2 = synth_generate(7, N, t2, k2);
    EXPECT(n1 == n2 && memcmp(t1, t2, n1) == 0 && memcmp(k1, k2, n1) == 0, "synth not deterministic");
    EXPECT(n1 <= N && n1 > N - 40, "synth wrote %zu of %zu bytes", n1, N);
    size_t n3 = synth_generate(7, 5000, t3, NULL);
    EXPECT(n3 > 5000 - 40 && memcmp(t1, t3, n3) == 0, "synth output is not prefix-stable");
    size_t n4 = synth_generate(8, N, t3, NULL);
    EXPECT(n4 > 1000 && memcmp(t1, t3, 1000) != 0, "seeds 7 and 8 give the same text");

    size_t lines = 0, bad = 0, per_kind[DATA_MAX_KINDS] = {0};
    for (size_t i = 0; i < n1;) {
        size_t j = i;
        while (j < n1 && t1[j] != '\n') j++;
        int len = (int)(j - i + 1), k = k1[i], same = 1;
        for (size_t p = i; p <= j && p < n1; p++) same &= k1[p] == k;
        if (j >= n1 || !same || k >= nk || !check_line(t1 + i, len, k)) {
            if (bad++ < 5) fprintf(stderr, "bad line (kind %d): %.*s\n", k, len, t1 + i);
        } else per_kind[k]++;
        lines++;
        i = j + 1;
    }
    EXPECT(bad == 0, "%zu of %zu synthetic lines are malformed", bad, lines);
    for (int k = 0; k < nk; k++)
        EXPECT(per_kind[k] > lines / (size_t)nk / 2, "kind %s has only %zu of %zu lines", names[k],
               per_kind[k], lines);
    printf("synth: %zu lines, %d kinds:", lines, nk);
    for (int k = 0; k < nk; k++) printf(" %s=%zu", names[k], per_kind[k]);
    printf("\n");
    for (size_t i = 0, nl = 0; i < n1 && nl < 6; i++) { // a few sample lines
        if (i == 0 || t1[i - 1] == '\n') printf("  %s: ", names[k1[i]]);
        putchar(t1[i]);
        nl += t1[i] == '\n';
    }
    free(t1);
    free(t2);
    free(t3);
    free(k1);
    free(k2);
}

// Is window w a training window of the split? (every10: all but w % 10 == 9; tail: the first n_train)
static int is_train_window(const Dataset *ds, size_t w) {
    return ds->split == DATA_SPLIT_EVERY10 ? w % 10 != 9 : w < ds->n_train;
}

// The held-out tail: training windows tile [0, val_start) from 0 as far as they fit, validation windows
// tile [val_start, n_tokens) as far as they fit, val_start = n_tokens - ceil(n_tokens * val_frac).
static void check_tail(const Dataset *ds) {
    size_t T = (size_t)ds->T, held = ds->n_tokens - ds->val_start;
    EXPECT(ds->split == DATA_SPLIT_TAIL && ds->val_tokens == ds->tokens, "not a tail split");
    EXPECT((double)held >= ds->n_tokens * ds->val_frac - 1e-6 &&
               (double)held < ds->n_tokens * ds->val_frac + 1,
           "held out %zu of %zu tokens at val_frac %g", held, ds->n_tokens, ds->val_frac);
    EXPECT(ds->n_train >= 1 && ds->n_train * T + 1 <= ds->val_start &&
               (ds->n_train + 1) * T + 1 > ds->val_start,
           "training windows %zu do not tile [0, %zu) at T=%zu", ds->n_train, ds->val_start, T);
    EXPECT(ds->n_val >= 1 && ds->n_val * T + 1 <= held && (ds->n_val + 1) * T + 1 > held,
           "validation windows %zu do not tile the %zu held-out tokens at T=%zu", ds->n_val, held, T);
    size_t bad = 0;
    for (size_t i = 0; i < ds->n_train; i++) bad += ds->train_idx[i] != i;
    for (size_t i = 0; i < ds->n_val; i++) bad += ds->val_off[i] != ds->val_start + i * T;
    EXPECT(bad == 0, "tail split: %zu windows out of place", bad);
}

// Split invariants and epoch coverage for any open dataset.
static void check_split(const Dataset *ds, int n_epochs) {
    if (ds->split == DATA_SPLIT_EVERY10)
        EXPECT(ds->n_windows == (ds->n_tokens - 1) / (size_t)ds->T, "n_windows %zu", ds->n_windows);
    else check_tail(ds);
    EXPECT(ds->n_train + ds->n_val == ds->n_windows && ds->n_val >= 1, "train %zu val %zu windows %zu",
           ds->n_train, ds->n_val, ds->n_windows);
    if (ds->split != DATA_SPLIT_EVERY10) { // (every10's own checks below are the window-index ones)
        EXPECT(ds->val_start + (ds->n_val - 1) * (size_t)ds->T + (size_t)ds->T < ds->n_tokens,
               "last val window overruns");
        goto epochs;
    }
    uint8_t *mark = xcalloc(ds->n_windows, 1);
    size_t bad = 0;
    for (size_t i = 0; i < ds->n_train; i++) {
        size_t w = ds->train_idx[i];
        bad += w >= ds->n_windows || w % 10 == 9 || (i && w <= ds->train_idx[i - 1]);
        if (w < ds->n_windows) mark[w] |= 1;
    }
    for (size_t i = 0; i < ds->n_val; i++) {
        size_t w = ds->val_off[i] / (size_t)ds->T;
        bad += ds->val_off[i] % (size_t)ds->T != 0;
        bad += w >= ds->n_windows || w % 10 != 9 || (w < ds->n_windows && (mark[w] & 1));
        if (w < ds->n_windows) mark[w] |= 2;
    }
    size_t uncovered = 0;
    for (size_t w = 0; w < ds->n_windows; w++) uncovered += mark[w] != 1 && mark[w] != 2;
    EXPECT(bad == 0 && uncovered == 0, "split: %zu bad indices, %zu windows not in exactly one set", bad,
           uncovered);
    // last window must fit: tokens [w*T, w*T+T]
    EXPECT((ds->n_windows - 1) * (size_t)ds->T + (size_t)ds->T < ds->n_tokens, "last window overruns");
    free(mark);
epochs:;

    uint32_t *seen = xcalloc(ds->n_windows, sizeof(uint32_t));
    size_t *first = xmalloc(ds->n_train * sizeof(size_t));
    for (int e = 0; e < n_epochs; e++) {
        memset(seen, 0, ds->n_windows * sizeof(uint32_t));
        size_t same_as_e0 = 0, ascending = 0;
        for (size_t i = 0; i < ds->n_train; i++) {
            size_t w = data_train_window(ds, (uint64_t)e * ds->n_train + i);
            if (w < ds->n_windows) seen[w]++;
            if (e == 0) first[i] = w;
            else same_as_e0 += first[i] == w;
            ascending += w == ds->train_idx[i];
        }
        size_t wrong = 0;
        for (size_t w = 0; w < ds->n_windows; w++) wrong += seen[w] != (is_train_window(ds, w) ? 1u : 0u);
        EXPECT(wrong == 0, "epoch %d: %zu windows not visited exactly once", e, wrong);
        if (ds->n_train >= 100) {
            EXPECT(ascending < ds->n_train / 10, "epoch %d looks unshuffled (%zu in place)", e, ascending);
            if (e)
                EXPECT(same_as_e0 < ds->n_train / 10, "epoch %d repeats epoch 0's order (%zu same)", e,
                       same_as_e0);
        }
    }
    free(seen);
    free(first);
}

typedef struct {
    const Dataset *ds;
    uint64_t i0;
    int n;
} ValArgs;
static void do_val_past(void *p) {
    ValArgs *a = p;
    int32_t *x = xmalloc((size_t)a->n * a->ds->T * 4), *y = xmalloc((size_t)a->n * a->ds->T * 4);
    data_val_batch(a->ds, a->i0, a->n, x, y, NULL);
}

// Batch rows equal the tokens of the window data_train_window names; random access by s0.
static void check_batches(const Dataset *ds) {
    int T = ds->T;
    size_t sz = (size_t)16 * T;
    int32_t *in8 = xmalloc(sz * 4), *tg8 = xmalloc(sz * 4), *in = xmalloc(sz * 4), *tg = xmalloc(sz * 4);
    uint64_t starts[3] = {0, 1000, ds->n_train - 4}; // the last one straddles epochs 0 and 1
    for (int k = 0; k < 3; k++) {
        uint64_t s0 = starts[k];
        data_train_batch(ds, s0, 8, in8, tg8);
        int ok = 1;
        for (int r = 0; r < 8; r++) {
            size_t w = data_train_window(ds, s0 + r);
            ok &= memcmp(in8 + (size_t)r * T, ds->tokens + w * T, (size_t)T * 4) == 0;
            ok &= memcmp(tg8 + (size_t)r * T, ds->tokens + w * T + 1, (size_t)T * 4) == 0;
        }
        EXPECT(ok, "batch at s0=%llu does not match its windows' tokens", (unsigned long long)s0);
        data_train_batch(ds, s0 + 5, 3, in, tg);
        EXPECT(memcmp(in, in8 + 5 * (size_t)T, 3 * (size_t)T * 4) == 0 &&
                   memcmp(tg, tg8 + 5 * (size_t)T, 3 * (size_t)T * 4) == 0,
               "batch(s0+5, 3) != rows 5..7 of batch(s0, 8) at s0=%llu", (unsigned long long)s0);
        // row by row, in reverse order, with an unrelated far-away call in between
        ok = 1;
        for (int r = 7; r >= 0; r--) {
            data_train_batch(ds, 17 * (uint64_t)ds->n_train + 3, 1, in, tg);
            data_train_batch(ds, s0 + r, 1, in, tg);
            ok &= memcmp(in, in8 + (size_t)r * T, (size_t)T * 4) == 0 &&
                memcmp(tg, tg8 + (size_t)r * T, (size_t)T * 4) == 0;
        }
        EXPECT(ok, "single-row batches depend on call history at s0=%llu", (unsigned long long)s0);
    }
    // validation: the last windows of the set, kinds are the targets' labels; a read past the end dies
    // (it never wraps around to the first windows)
    int nv = ds->n_val < 4 ? (int)ds->n_val : 4;
    uint8_t *kinds = xmalloc(sz);
    data_val_batch(ds, ds->n_val - (uint64_t)nv, nv, in, tg, kinds);
    int ok = 1;
    for (int r = 0; r < nv; r++) {
        size_t off = ds->val_off[ds->n_val - (size_t)nv + (size_t)r];
        ok &= memcmp(in + (size_t)r * T, ds->val_tokens + off, (size_t)T * 4) == 0;
        ok &= memcmp(tg + (size_t)r * T, ds->val_tokens + off + 1, (size_t)T * 4) == 0;
        for (int t = 0; t < T; t++)
            ok &= kinds[(size_t)r * T + t] == (ds->kinds ? ds->kinds[off + 1 + t] : 0);
    }
    EXPECT(ok, "val batch does not match the val windows");
    ValArgs va = {ds, ds->n_val - (uint64_t)nv / 2, nv};
    if (nv >= 2)
        expect_death_msg("val batch past the end", do_val_past, &va, "the validation set has", NULL, 0);
    free(in8);
    free(tg8);
    free(in);
    free(tg);
    free(kinds);
}

static void test_synthetic_dataset(void) {
    int T = 64;
    Dataset a, b, c;
    data_open(&a, NULL, 1, T);
    data_open(&b, NULL, 1, T);
    data_open(&c, NULL, 2, T);
    printf("synthetic: %s, %zu tokens, %zu windows (%zu train, %zu val), vocab %d\n", a.source, a.n_tokens,
           a.n_windows, a.n_train, a.n_val, a.vocab_size);
    EXPECT(strcmp(a.source, "synthetic(seed=1)") == 0, "source '%s'", a.source);
    EXPECT(a.n_tokens >= ((size_t)2 << 20) - 40 && a.n_tokens <= ((size_t)2 << 20), "n_tokens %zu",
           a.n_tokens);
    EXPECT(a.vocab_size == 256 && a.kinds && a.n_kinds >= 4, "vocab %d n_kinds %d", a.vocab_size, a.n_kinds);
    EXPECT(a.n_tokens == b.n_tokens && memcmp(a.tokens, b.tokens, a.n_tokens * 4) == 0 &&
               memcmp(a.kinds, b.kinds, a.n_tokens) == 0,
           "same seed, different corpus");
    EXPECT(memcmp(a.tokens, c.tokens, 4096 * 4) != 0, "seeds 1 and 2 give the same corpus");

    size_t cnt[DATA_MAX_KINDS] = {0}, bad_tok = 0, bad_kind = 0;
    for (size_t i = 0; i < a.n_tokens; i++) {
        bad_tok += a.tokens[i] < 0 || a.tokens[i] >= a.vocab_size;
        if (a.kinds[i] < a.n_kinds) cnt[a.kinds[i]]++;
        else bad_kind++;
    }
    EXPECT(bad_tok == 0 && bad_kind == 0, "%zu tokens out of range, %zu bad kind labels", bad_tok, bad_kind);
    for (int k = 0; k < a.n_kinds; k++)
        EXPECT(cnt[k] > a.n_tokens / 20 && a.kind_names[k] && a.kind_names[k][0],
               "kind %d (%s) covers %zu tokens", k, a.kind_names[k] ? a.kind_names[k] : "?", cnt[k]);

    // same seed -> same batches (b is fresh: its first call is far away, a different history)
    size_t sz = (size_t)8 * T;
    int32_t *ia = xmalloc(sz * 4), *ta = xmalloc(sz * 4), *ib = xmalloc(sz * 4), *tb = xmalloc(sz * 4);
    data_train_batch(&b, 5 * (uint64_t)b.n_train + 11, 8, ib, tb);
    data_train_batch(&a, 123, 8, ia, ta);
    data_train_batch(&b, 123, 8, ib, tb);
    EXPECT(memcmp(ia, ib, sz * 4) == 0 && memcmp(ta, tb, sz * 4) == 0, "same seed, different batches");
    size_t same = 0;
    for (size_t s = 0; s < 1000; s++) same += data_train_window(&a, s) == data_train_window(&c, s);
    EXPECT(same < 100, "seeds 1 and 2 visit the same windows (%zu of 1000)", same);

    check_split(&a, 3);
    check_batches(&a);
    free(ia);
    free(ta);
    free(ib);
    free(tb);
    data_close(&a);
    data_close(&b);
    data_close(&c);
    EXPECT(a.tokens == NULL && a.perm_cache == NULL, "data_close leaves pointers");
}

static void test_text(void) {
    const char *gpl = "/usr/share/common-licenses/GPL-3";
    size_t len = 0;
    char *raw = read_file(gpl, &len);
    if (!raw) {
        printf("text: SKIP (%s not present)\n", gpl);
    } else {
        Dataset ds;
        data_open(&ds, gpl, 3, 64);
        printf("text: %s, %zu tokens, %zu windows (%zu train, %zu val)\n", ds.source, ds.n_tokens,
               ds.n_windows, ds.n_train, ds.n_val);
        int ok = ds.n_tokens == len;
        for (size_t i = 0; ok && i < len; i++) ok = ds.tokens[i] == (unsigned char)raw[i];
        EXPECT(ok, "text tokens differ from the file bytes");
        EXPECT(ds.vocab_size == 256 && ds.kinds == NULL && ds.n_kinds == 0, "text vocab/kinds");
        char want[300];
        snprintf(want, sizeof want, "text:%s", gpl);
        EXPECT(strcmp(ds.source, want) == 0, "source '%s'", ds.source);
        check_split(&ds, 2);
        check_batches(&ds);
        data_close(&ds);
        free(raw);
    }
    // UTF-8 text passes the binary check; 10*T+1 tokens is enough for the default tail (0.1: ceil(8.1) = 9
    // held-out tokens, one window of T+1; 72 before it: 8 training windows)
    const char *u = "h\xc3\xa9llo w\xc3\xb6rld \xe2\x9c\x93 \xf0\x9f\x98\x80\n";
    size_t ul = strlen(u), T = 8, n = 10 * T + 1;
    char *buf = xmalloc(n);
    for (size_t i = 0; i < n; i++) buf[i] = u[i % ul];
    const char *p = write_bytes("utf8.txt", buf, n);
    Dataset ds;
    data_open(&ds, p, 1, (int)T);
    EXPECT(ds.n_windows == 9 && ds.n_train == 8 && ds.n_val == 1 && ds.val_start == 72 && ds.val_off[0] == 72,
           "81-token split: %zu/%zu/%zu from %zu", ds.n_windows, ds.n_train, ds.n_val, ds.val_start);
    check_split(&ds, 2);
    data_close(&ds);
    free(buf);
}

static void test_shards(void) {
    size_t n = 5000;
    uint16_t *toks = xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) toks[i] = (uint16_t)((i * 7919u) % 50257u);
    toks[n / 2] = 50256;
    const char *p = write_shard("one.bin", 20240520, 1, (int)n, toks, n, 0);
    Dataset ds;
    data_open(&ds, p, 1, 32);
    int ok = ds.n_tokens == n;
    for (size_t i = 0; ok && i < n; i++) ok = ds.tokens[i] == toks[i];
    EXPECT(ok, "shard round trip: tokens differ (%zu vs %zu)", ds.n_tokens, n);
    EXPECT(ds.vocab_size == 50304, "GPT-2 shard vocab %d, want 50304", ds.vocab_size);
    EXPECT(strstr(ds.source, "shards:") == ds.source && strstr(ds.source, "(1 file)"), "source '%s'",
           ds.source);
    printf("shard: %s, %zu tokens, vocab %d\n", ds.source, ds.n_tokens, ds.vocab_size);
    check_split(&ds, 2);
    check_batches(&ds);
    data_close(&ds);

    // two shards through a glob, concatenated in sorted name order; vocab 1000 -> 1024
    for (size_t i = 0; i < n; i++) toks[i] = (uint16_t)((i * 31u) % 1000u);
    write_shard("shard_001.bin", 20240520, 1, 2000, toks + 3000, 2000, 0); // written first on purpose
    write_shard("shard_000.bin", 20240520, 1, 3000, toks, 3000, 0);
    char pat[128];
    snprintf(pat, sizeof pat, "%s/shard_*.bin", tmp_dir);
    data_open(&ds, pat, 1, 32);
    ok = ds.n_tokens == n;
    for (size_t i = 0; ok && i < n; i++) ok = ds.tokens[i] == toks[i];
    EXPECT(ok, "glob of two shards: not the concatenation (%zu tokens)", ds.n_tokens);
    EXPECT(ds.vocab_size == 1024, "vocab %d, want 1024 (max id 999 + 1 rounded up to 64)", ds.vocab_size);
    EXPECT(strstr(ds.source, "(2 files)") != NULL, "source '%s'", ds.source);
    printf("glob: %s, %zu tokens, vocab %d\n", ds.source, ds.n_tokens, ds.vocab_size);
    check_split(&ds, 2);
    data_close(&ds);

    // bad shards
    char buf[160];
    p = write_shard("magic.bin", 12345, 1, 100, toks, 100, 0);
    expect_death("wrong magic", p, 4, "magic 12345");
    expect_death("wrong magic (expected)", p, 4, "expected 20240520");
    p = write_shard("version.bin", 20240520, 2, 100, toks, 100, 0);
    expect_death("wrong version", p, 4, "version 2");
    p = write_shard("trunc.bin", 20240520, 1, 1000, toks, 500, 0);
    expect_death("truncated shard", p, 4, "truncated");
    p = write_shard("extra.bin", 20240520, 1, 100, toks, 100, 2);
    expect_death("oversized shard", p, 4, "size mismatch");
    p = write_bytes("hdr.bin", toks, 100);
    expect_death("shard shorter than its header", p, 4, "truncated");
    p = write_bytes("empty.bin", "", 0);
    expect_death("empty shard", p, 4, "empty");
    p = write_shard("short.bin", 20240520, 1, 100, toks, 100, 0);
    expect_death("shard too short for T", p, 32, "too few");
    snprintf(buf, sizeof buf, "%s/nothing_*.bin", tmp_dir);
    expect_death("glob matches nothing", buf, 4, "no file matches");
    snprintf(buf, sizeof buf, "%s/absent.bin", tmp_dir);
    expect_death("missing shard", buf, 4, "cannot open shard file");
    free(toks);
}

static void test_bad_text(void) {
    char buf[160];
    snprintf(buf, sizeof buf, "%s/absent.txt", tmp_dir);
    expect_death("missing file", buf, 8, "cannot open");
    expect_death("missing file (errno)", buf, 8, "No such file");
    expect_death("directory", tmp_dir, 8, "directory");
    const char *p = write_bytes("empty.txt", "", 0);
    expect_death("empty file", p, 8, "empty");

    Rng r;
    rng_seed(&r, 99);
    unsigned char garbage[4096];
    for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (unsigned char)rng_below(&r, 256);
    p = write_bytes("garbage.dat", garbage, sizeof garbage);
    expect_death("random bytes", p, 8, "binary");
    // no NUL, but 50% control bytes -> over the 30% rule
    for (size_t i = 0; i < sizeof garbage; i++)
        garbage[i] = (unsigned char)(i % 2 ? 'a' + i % 26 : 1 + i % 7);
    p = write_bytes("controls.dat", garbage, sizeof garbage);
    expect_death("control bytes", p, 8, "not text");
    // 20% control bytes -> still text
    for (size_t i = 0; i < sizeof garbage; i++) garbage[i] = (unsigned char)(i % 5 ? 'a' + i % 26 : 2);
    p = write_bytes("mostly.txt", garbage, sizeof garbage);
    Dataset ds;
    data_open(&ds, p, 1, 8);
    EXPECT(ds.n_tokens == sizeof garbage, "mostly-text file: %zu tokens", ds.n_tokens);
    data_close(&ds);

    p = write_bytes("short.txt",
                    "0123456789012345678901234567890123456789012345678901234567890123456789012345678\n", 80);
    expect_death("too short for T", p, 8, "80 tokens");
    expect_death("too short for T (need)", p, 8, "need at least 81");
    expect_death("T = 0", NULL, 0, "T must be");
}

// The split is the data's, not T's: the held-out tokens are the same at T = 8, 16, 64; --val-frac moves
// the boundary; --val-data validates on its own file and trains on all of --data; the embedded corpus
// refuses both (its split is every10).
typedef struct {
    const char *path, *val;
    double frac;
} SplitArgs;
static void do_open_split(void *p) {
    SplitArgs *a = p;
    Dataset ds;
    data_open_split(&ds, a->path, a->val, a->frac, 1, 8);
}
static void test_split_options(void) {
    size_t n = 5000;
    char *buf = xmalloc(n);
    for (size_t i = 0; i < n; i++) buf[i] = (char)('a' + (i * 7) % 26);
    const char *p = write_bytes("split.txt", buf, n);
    const char *v = write_bytes("val.txt", buf, 700);
    int Ts[3] = {8, 16, 64};
    for (int k = 0; k < 3; k++) {
        Dataset ds;
        data_open(&ds, p, 1, Ts[k]);
        EXPECT(ds.val_start == 4500, "T=%d: held-out tail starts at %zu, not 4500", Ts[k], ds.val_start);
        check_split(&ds, 1);
        check_batches(&ds);
        data_close(&ds);
    }
    Dataset ds;
    data_open_split(&ds, p, NULL, 0.25, 1, 16);
    EXPECT(ds.val_start == 3750, "--val-frac 0.25: tail from %zu, not 3750", ds.val_start);
    check_split(&ds, 1);
    data_close(&ds);
    data_open_split(&ds, p, v, DATA_VAL_FRAC, 1, 16);
    EXPECT(ds.split == DATA_SPLIT_FILE && ds.n_train == (n - 1) / 16 && ds.n_val == 699 / 16,
           "--val-data: %zu train (want %zu), %zu val (want %d)", ds.n_train, (n - 1) / 16, ds.n_val,
           699 / 16);
    int32_t x[16], y[16];
    data_val_batch(&ds, 2, 1, x, y, NULL);
    int ok = 1;
    for (int t = 0; t < 16; t++)
        ok &= x[t] == (unsigned char)buf[32 + t] && y[t] == (unsigned char)buf[33 + t];
    EXPECT(ok, "--val-data: window 2 does not read the validation file's tokens 32..48");
    char desc[512];
    data_split_desc(&ds, desc, sizeof desc);
    EXPECT(strstr(desc, "val.txt") != NULL, "split description '%s' does not name the file", desc);
    data_close(&ds);
    SplitArgs a = {NULL, NULL, 0.2};
    expect_death_msg("--val-frac on the embedded corpus", do_open_split, &a, "every 10th window", NULL, 0);
    SplitArgs b = {NULL, v, DATA_VAL_FRAC};
    expect_death_msg("--val-data without --data", do_open_split, &b, "--val-data needs --data", NULL, 0);
    SplitArgs c = {p, NULL, 0.7};
    expect_death_msg("--val-frac 0.7", do_open_split, &c, "--val-frac must be in (0, 0.5]", NULL, 0);
    SplitArgs d = {p, NULL, 0.001};
    expect_death_msg("a tail shorter than a window", do_open_split, &d, "--val-frac 0.001", NULL, 0);
    free(buf);
}

// A refused shard leaves nothing allocated when DIE returns instead of exiting (the fuzz target: there each
// refusal left the loader's 256 KiB staging buffer and its FILE, and fuzz_shard ran out of memory at 4 GiB in
// a minute). 200 refusals of a uint32 shard whose third token is too large (refused inside the token loop,
// after every allocation the loader makes) may grow the bytes malloc holds by 64 KiB at most (glob's few
// dozen bytes a call stay behind). Skipped where mallinfo2 does not see malloc (sanitizer builds).
static jmp_buf die_jb;
static void die_back(void) { longjmp(die_jb, 1); }
static size_t malloc_in_use(void) {
    struct mallinfo2 m = mallinfo2();
    return m.uordblks + m.hblkhd;
}
static void test_refused_shard_frees(void) {
    size_t a = malloc_in_use();
    char *probe = xmalloc(1 << 20);
    memset(probe, 1, 1 << 20);
    size_t b = malloc_in_use();
    free(probe);
    if (b < a + (1 << 20)) {
        printf("refused shards: SKIP (mallinfo2 does not count this build's malloc)\n");
        return;
    }
    int32_t hdr[256] = {20240801, 7, 4};
    uint32_t toks[4] = {1, 2, 0xffffffffu, 3};
    char bytes[sizeof hdr + sizeof toks];
    memcpy(bytes, hdr, sizeof hdr);
    memcpy(bytes + sizeof hdr, toks, sizeof toks);
    const char *p = write_bytes("big_token.bin", bytes, sizeof bytes);
    fflush(stderr);
    int err = dup(2), null = open("/dev/null", O_WRONLY);
    CHECK(err >= 0 && null >= 0 && dup2(null, 2) >= 0, "test: cannot silence stderr");
    moe_set_die_hook(die_back, -1);
    static Dataset ds; // (static: kept across the longjmp)
    static int refused;
    refused = 0;
    size_t before = malloc_in_use();
    for (int i = 0; i < 200; i++) {
        if (setjmp(die_jb) == 0) data_open(&ds, p, 1, 4);
        else refused++;
        data_close(&ds);
    }
    size_t after = malloc_in_use();
    moe_set_die_hook(NULL, -1);
    dup2(err, 2);
    close(err);
    close(null);
    EXPECT(refused == 200, "refused shards: %d of 200 refused", refused);
    EXPECT(after < before + (64 << 10), "refused shards: malloc holds %zu bytes more after 200 refusals",
           after - before);
    printf("refused shards: 200 refusals, %zu bytes more held by malloc\n",
           after > before ? after - before : 0);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/moe_test_data_XXXXXX");
    CHECK(mkdtemp(tmp_dir), "mkdtemp: %s", strerror(errno));
    test_synth();
    test_synthetic_dataset();
    test_text();
    test_shards();
    test_bad_text();
    test_split_options();
    test_refused_shard_frees();
    for (int i = n_made - 1; i >= 0; i--)
        if (file_exists(made_files[i]) && unlink(made_files[i]) != 0)
            fprintf(stderr, "cannot remove %s\n", made_files[i]);
    if (rmdir(tmp_dir) != 0) fprintf(stderr, "cannot remove %s (%s)\n", tmp_dir, strerror(errno));
    return test_done("test_data");
}
