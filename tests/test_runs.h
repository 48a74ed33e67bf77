// test_runs.h — for the optimizer tests (test_ops.c, test_cuda_ops.c): a random multi-tensor run
// list (ops.h OptRun) as the optimizer builds one. Must not hold: the tests themselves.
#pragma once
#include "core/common.h"
#include "core/rng.h"
#include "ops/ops.h"

// [0, N) cut into pieces of 0..maxlen elements (one of 0 and one of 1 among them), every third piece
// left out (elements no run touches), the rest shuffled; decay and class at random. Moments:
// mirror = 0, end to end in list order (so their order differs from the parameters', and offsets
// agree mod 4 for ~1/4 of the runs: the others take adamw_runs' scalar path on cuda); mirror = 1, at
// the parameters' offsets (ZeRO 0's layout: every run takes the float4 path). Returns the number of
// runs; *mtotal is the moment buffer's length.
static inline int test_gen_runs(Rng *R, OptRun *r, int cap, size_t N, size_t maxlen, int ncls, int mirror,
                                size_t *mtotal) {
    int n = 0, k = 0;
    for (size_t o = 0; o < N; k++) {
        size_t len = k == 1 ? 0 : k == 2 ? 1 : (size_t)(rng_uniform(R) * (double)(maxlen + 1));
        if (len > N - o) len = N - o;
        if (k % 3 != 0) {
            CHECK(n < cap, "test_gen_runs: more than %d runs", cap);
            r[n++] = (OptRun){(int64_t)o, 0, (int64_t)len, (int32_t)rng_below(R, 2), (int32_t)rng_below(R, (uint32_t)ncls),
                              (int64_t)o, 0, 0, 0};
        }
        o += len;
    }
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rng_below(R, (uint32_t)i + 1);
        OptRun t = r[i]; r[i] = r[j]; r[j] = t;
    }
    size_t m = 0;
    for (int i = 0; i < n; i++) { r[i].moff = mirror ? r[i].off : (int64_t)m; m += (size_t)r[i].n; }
    *mtotal = mirror ? N : m;
    return n;
}

// The bf16 policy's global indices (OptRun gidx, gcols, lcols, col0) at random, as a mesh's slices give
// them: half the runs contiguous at a random global offset, half a piece of a column block (local rows
// of lcols elements inside global rows of gcols, starting at column col0). Leaves the rest as it is.
static inline void test_gen_global(Rng *R, OptRun *r, int n) {
    for (int i = 0; i < n; i++) {
        r[i].gidx = (int64_t)rng_below(R, 1u << 30);
        if (rng_below(R, 2)) { r[i].lcols = 0; r[i].gcols = 0; r[i].col0 = 0; continue; }
        r[i].lcols = 1 + (int32_t)rng_below(R, 64);
        r[i].gcols = r[i].lcols * (1 + (int64_t)rng_below(R, 4)) + (int64_t)rng_below(R, 3);
        r[i].col0 = (int32_t)rng_below(R, (uint32_t)r[i].lcols);
    }
}
