// test_runs.h — for the optimizer tests (test_ops.c, test_cuda_ops.c): a random multi-tensor run
// list (ops.h OptRun) as the optimizer builds one. Must not hold: the tests themselves.
#pragma once
#include <math.h>
#include <string.h>
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
            r[n++] = (OptRun){(int64_t)o,
                              0,
                              (int64_t)len,
                              (int32_t)rng_below(R, 2),
                              (int32_t)rng_below(R, (uint32_t)ncls),
                              (int64_t)o,
                              0,
                              0,
                              0,
                              OPTG_F32,
                              0};
        }
        o += len;
    }
    for (int i = n - 1; i > 0; i--) {
        int j = (int)rng_below(R, (uint32_t)i + 1);
        OptRun t = r[i];
        r[i] = r[j];
        r[j] = t;
    }
    size_t m = 0;
    for (int i = 0; i < n; i++) {
        r[i].moff = mirror ? r[i].off : (int64_t)m;
        m += (size_t)r[i].n;
    }
    *mtotal = mirror ? N : m;
    return n;
}

// The bf16 policy's global indices (OptRun gidx, gcols, lcols, col0) at random, as a mesh's slices give
// them: half the runs contiguous at a random global offset, half a piece of a column block (local rows
// of lcols elements inside global rows of gcols, starting at column col0). Leaves the rest as it is.
static inline void test_gen_global(Rng *R, OptRun *r, int n) {
    for (int i = 0; i < n; i++) {
        r[i].gidx = (int64_t)rng_below(R, 1u << 30);
        if (rng_below(R, 2)) {
            r[i].lcols = 0;
            r[i].gcols = 0;
            r[i].col0 = 0;
            continue;
        }
        r[i].lcols = 1 + (int32_t)rng_below(R, 64);
        r[i].gcols = r[i].lcols * (1 + (int64_t)rng_below(R, 4)) + (int64_t)rng_below(R, 3);
        r[i].col0 = (int32_t)rng_below(R, (uint32_t)r[i].lcols);
    }
}

// The gradient formats of the bf16 policy (OptRun gbf, gb) at random over the runs r[0..n) of [0, N): in
// offset order each run float32, bf16 (read rounded) or packed, consecutive packed runs sharing a block
// (gb its first element; nothing but packed runs inside a block's range, as the model's per-layer blocks).
// From the float32 gradients gf: gx, what the ops read (gf, with each packed block's range poisoned (NaN)
// and then its bf16 values packed from gb: the float32 reading of a packed element gives NaN or a wrong
// value), and gr, what they must see (gf with every bf16 and packed run's elements rounded to bf16,
// nearest even). Returns the number of elements whose rounding changed them.
static inline size_t test_gen_formats(Rng *R, OptRun *r, int n, const float *gf, float *gx, float *gr,
                                      size_t N) {
    int *ord = xmalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    for (int i = 0; i < n; i++) ord[i] = i;
    for (int i = 1; i < n; i++) // insertion sort by offset (runs are disjoint)
        for (int j = i; j > 0 && r[ord[j]].off < r[ord[j - 1]].off; j--) {
            int t = ord[j];
            ord[j] = ord[j - 1];
            ord[j - 1] = t;
        }
    memcpy(gx, gf, sizeof(float) * N);
    memcpy(gr, gf, sizeof(float) * N);
    int64_t gb = -1;
    size_t changed = 0;
    for (int k = 0; k < n; k++) {
        OptRun *u = &r[ord[k]];
        u->gbf = (int32_t)rng_below(R, 3);
        u->gb = 0;
        if (!u->n) {
            u->gbf = OPTG_F32;
            continue;
        } // (an empty run reads nothing; it may share an offset)
        if (u->gbf == OPTG_PACKED) {
            if (gb < 0 || rng_below(R, 2)) gb = u->off; // a new block, or the open one goes on
            u->gb = gb;
        } else {
            gb = -1;
        }
        for (int64_t i = 0; i < u->n; i++) {
            float b = u->gbf == OPTG_F32 ? gf[u->off + i] : bf16_to_f32(bf16_rn_bits(gf[u->off + i]));
            changed += f32_bits(b) != f32_bits(gf[u->off + i]);
            gr[u->off + i] = b;
        }
    }
    // each block: [gb, end of its last run) poisoned, then packed (from gf: the packed half overlaps it)
    for (int k = 0; k < n;) {
        const OptRun *u = &r[ord[k]];
        if (u->gbf != OPTG_PACKED) {
            k++;
            continue;
        }
        int64_t b0 = u->gb, e = u->off + u->n;
        while (++k < n && r[ord[k]].gbf == OPTG_PACKED && r[ord[k]].gb == b0) e = r[ord[k]].off + r[ord[k]].n;
        for (int64_t i = b0; i < e; i++) gx[i] = NAN;
        for (int64_t i = b0; i < e; i++) {
            uint16_t h = bf16_rn_bits(gf[i]);
            memcpy((char *)(gx + b0) + 2 * (i - b0), &h, 2);
        }
    }
    free(ord);
    return changed;
}
