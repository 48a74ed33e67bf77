// test_cuda_fp8_fused.c — the FP8 tables' byte savers against the unfused compositions they replace, bit for
// bit, on a GPU (exit 77 without one; argument "small": one case of each, for compute-sanitizer):
//   kernels (src/ops/cuda/cuda_fp8_fused.cu): both tilings in one read against cuda_fp8_quant_tiles +
//     cuda_fp8_quant_tiles_t (themselves held to the host reference by test_cuda_fp8_quant); the SwiGLU
//     backward with both tilings of dh1, dh3 against the cuda backend's swiglu_bwd (its gradients, rounded to
//     bf16 on the host for bf16 rows as the plain kernel rounds them) then those quantisers; the SwiGLU
//     forward with act's tiles against swiglu_fwd then cuda_fp8_quant_tiles. Codes, scales (NaN ones by their
//     bits), the padding columns (the outputs start as different garbage, so an unwritten byte shows) and the
//     non-finite counts; groups of 0, 1, 127, 128, 129, 300 rows, K 1, 100, 128, 129, 300, with NaN, infinity
//     and values beyond e4m3's range in the data. Values compare by their bits, a NaN matching any NaN.
//   the up projections' pair (Hopper only): cuda_fp8_quant_blocks_pair against the host's interleaving of
//     cpu_fp8_quant_blocks and against cuda_fp8_quant_blocks' transposed layout; cuda_fp8_grouped_gemm_swiglu
//     (the SwiGLU in the epilogue) against two cuda_fp8_grouped_gemm and swiglu_fwd.
//   the tables (src/ops/cuda/cuda_fp8_ops.cu, cuda_fp8_wcache.cu): weights kept as FP8 codes between ops give
//     the bits of the same weights quantised on each use (unregistered copies of their values), also after
//     the weights change by to_device + bf16_shadow, by AdamW (adamw_runs writes the bf16 copy) and by
//     to_device alone (each change must show); the non-finite count of a kept weight is the count of
//     quantising it on each use; the fused expert ops in a row give the same bits and counts with the weights
//     kept or not and the stashed operands taken or dropped, and a stash is not taken once act was
//     overwritten.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "ops/numerics.h"
#include "ops/ops.h"
#include "ops/cpu/cpu_fp8.h"
#ifdef MOE_HAVE_CUDA
#include <cuda_runtime.h>
#include "ops/cuda/cuda_fp8.h"
#include "ops/cuda/cuda_fp8_fused.h"
#include "ops/cuda/cuda_grouped_fp8.h"
#include "gpu_util.h"

static int fails, checks;

static uint64_t rs = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)(rs >> 16);
}
// a tensor's value: magnitudes over 2^-8 .. 2^8, with one in `edge` elements an edge kind (0: none)
static float value(int edge) {
    float v = ((float)(rnd() % 2000001) - 1e6f) * 1e-6f * ldexpf(1.0f, (int)(rnd() % 17) - 8);
    if (!edge || rnd() % edge) return v;
    switch (rnd() % 5) {
        case 0: return NAN;
        case 1: return -INFINITY;
        case 2: return 3e38f;
        case 3: return ldexpf(1.0f, -140);
        default: return 0.0f;
    }
}
static float bfr(float x) { return bf16_to_f32(bf16_rn_bits(x)); }

// n values as the device reads them: float32, or bf16 (x rounded in place to the values read)
static void *up_vals(float *x, size_t n, int bf) {
    if (!bf) return cu_put(x, n * 4);
    uint16_t *b = xmalloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) b[i] = bf16_rn_bits(x[i]), x[i] = bf16_to_f32(b[i]);
    void *d = cu_put(b, n * 2);
    free(b);
    return d;
}
// device buffers a and b hold the same bytes
static void same_dev(const char *what, const char *tag, const void *a, const void *b, size_t bytes) {
    checks++;
    uint8_t *x = cu_get(a, bytes), *y = cu_get(b, bytes);
    if (memcmp(x, y, bytes)) {
        size_t i = 0;
        while (x[i] == y[i]) i++;
        fails++;
        printf("FAIL %-26s %s: first differing byte %zu of %zu (0x%02x vs 0x%02x)\n", what, tag, i, bytes,
               x[i], y[i]);
    }
    free(x), free(y);
}
// n values (float32, or bf16 where bf) the same, a NaN matching any NaN (the device writes bf16's canonical
// NaN 0x7fff, the host's rounding keeps the payload's top bits)
static void same_vals(const char *what, const char *tag, const void *a, const void *b, size_t n, int bf) {
    checks++;
    size_t es = bf ? 2 : 4;
    uint8_t *x = cu_get(a, es * n), *y = cu_get(b, es * n);
    for (size_t i = 0; i < n; i++) {
        float u, v;
        if (bf) u = bf16_to_f32(((uint16_t *)x)[i]), v = bf16_to_f32(((uint16_t *)y)[i]);
        else memcpy(&u, x + 4 * i, 4), memcpy(&v, y + 4 * i, 4);
        if ((isnan(u) && isnan(v)) || !memcmp(x + es * i, y + es * i, es)) continue;
        fails++;
        printf("FAIL %-26s %s: element %zu of %zu: %.9g vs %.9g\n", what, tag, i, n, u, v);
        break;
    }
    free(x), free(y);
}
static void same_count(const char *what, const char *tag, long long a, long long b) {
    checks++;
    if (a != b) fails++, printf("FAIL %-26s %s: %lld vs %lld non-finite groups\n", what, tag, a, b);
}
// two counters (gpu_util.h cu_counter, freed): their counts, and their largest finite amax the same bits
static void same_counters(const char *what, const char *tag, unsigned long long *a, unsigned long long *b) {
    unsigned long long x, y;
    long long ca = cu_count_amax(a, &x), cb = cu_count_amax(b, &y);
    same_count(what, tag, ca, cb);
    checks++;
    if (x != y) fails++, printf("FAIL %-26s %s: amax words %#llx vs %#llx\n", what, tag, x, y);
}

typedef struct {
    int G;
    int rows[8];
} Groups;

// both tilings (fill: the garbage the outputs start as)
static Fp8Both both_alloc(int64_t rows, int K, int64_t P, int fill) {
    Fp8Both b = {cu_alloc((size_t)rows * K, fill), cu_alloc((size_t)K * P, fill),
                 cu_alloc(4 * (size_t)rows * fp8_ntiles(K), fill), cu_alloc(4 * (size_t)K * (P / 128), fill)};
    return b;
}
static void both_free(Fp8Both b) {
    void *p[] = {b.q, b.qt, b.s, b.st};
    for (int i = 0; i < 4; i++) CU_CK(cudaFree(p[i]));
}
static void both_same(const char *what, const char *tag, Fp8Both a, Fp8Both b, int64_t rows, int K,
                      int64_t P) {
    char w[80];
    snprintf(w, sizeof w, "%s codes", what), same_dev(w, tag, a.q, b.q, (size_t)rows * K);
    snprintf(w, sizeof w, "%s scales", what), same_dev(w, tag, a.s, b.s, 4 * (size_t)rows * fp8_ntiles(K));
    snprintf(w, sizeof w, "%s codes_t+pad", what), same_dev(w, tag, a.qt, b.qt, (size_t)K * P);
    snprintf(w, sizeof w, "%s scales_t", what), same_dev(w, tag, a.st, b.st, 4 * (size_t)K * (P / 128));
}
// the unfused reference of both tilings of x (device, rows from off[0]) into b
static void both_ref(Fp8Both b, const void *x, int bf, const int64_t *off, int G, int K,
                     unsigned long long *bad) {
    cuda_fp8_quant_tiles(b.q, b.s, (const char *)x + (size_t)off[0] * K * (bf ? 2 : 4), bf,
                         (int)(off[G] - off[0]), K, bad);
    cuda_fp8_quant_tiles_t(b.qt, b.st, x, bf, off, G, K, bad);
}

static void check_both(const Groups *gr, int K, int bf, int row0) {
    int64_t off[9];
    off[0] = row0; // (the groups need not start at row 0)
    for (int g = 0; g < gr->G; g++) off[g + 1] = off[g] + gr->rows[g];
    int64_t rows = off[gr->G] - off[0], P = cuda_fp8_pad_cols(off, gr->G);
    size_t n = (size_t)off[gr->G] * K;
    float *x = xmalloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) x[i] = value(400);
    void *dx = up_vals(x, n, bf);
    Fp8Both a = both_alloc(rows, K, P, 0xAB), r = both_alloc(rows, K, P, 0xCD);
    unsigned long long *ca = cu_counter(), *cr = cu_counter();
    cuda_fp8_quant_both(a, dx, bf, off, gr->G, K, ca);
    both_ref(r, dx, bf, off, gr->G, K, cr);
    char tag[64];
    snprintf(tag, sizeof tag, "G %d K %d bf16 %d rows %lld", gr->G, K, bf, (long long)rows);
    both_same("both", tag, a, r, rows, K, P);
    same_counters("both count", tag, ca, cr);
    both_free(a), both_free(r);
    CU_CK(cudaFree(dx));
    free(x);
}

// the cuda backend's float32 SwiGLU backward of host values: g1, g3 (host, n each)
static void swiglu_bwd_ref(float *g1, float *g3, const float *dact, const float *h1, const float *h3,
                           size_t n) {
    const Backend *be = backend_cuda();
    float *d = be->alloc(4 * n + 4), *a = be->alloc(4 * n + 4), *b = be->alloc(4 * n + 4),
          *o1 = be->alloc(4 * n + 4), *o3 = be->alloc(4 * n + 4);
    be->to_device(d, dact, 4 * n), be->to_device(a, h1, 4 * n), be->to_device(b, h3, 4 * n);
    be->swiglu_bwd(o1, o3, d, a, b, n, 0);
    be->to_host(g1, o1, 4 * n), be->to_host(g3, o3, 4 * n);
    be->free(d), be->free(a), be->free(b), be->free(o1), be->free(o3);
}

static void check_swiglu_bwd(const Groups *gr, int K, int bf) {
    int64_t off[9] = {0};
    for (int g = 0; g < gr->G; g++) off[g + 1] = off[g] + gr->rows[g];
    int64_t rows = off[gr->G], P = cuda_fp8_pad_cols(off, gr->G);
    size_t n = (size_t)rows * K, es = bf ? 2 : 4;
    float *da = xmalloc(4 * n + 4), *h1 = xmalloc(4 * n + 4), *h3 = xmalloc(4 * n + 4),
          *g1 = xmalloc(4 * n + 4), *g3 = xmalloc(4 * n + 4);
    for (size_t i = 0; i < n; i++) da[i] = value(500), h1[i] = value(0), h3[i] = value(0);
    void *dh1v = up_vals(h1, n, bf), *dh3v = up_vals(h3, n, bf); // (h1, h3 now the values read)
    float *dd = cu_put(da, 4 * n);
    void *o1 = cu_alloc(es * n, 0x11), *o3 = cu_alloc(es * n, 0x22);
    Fp8Both a1 = both_alloc(rows, K, P, 0xAB), a3 = both_alloc(rows, K, P, 0xAB);
    unsigned long long *c1 = cu_counter(), *c3 = cu_counter();
    cuda_fp8_swiglu_bwd_both(o1, o3, bf, dd, dh1v, dh3v, off, gr->G, K, a1, a3, c1, c3);
    // the reference: float32 gradients, rounded to the rows' format (as the bf16 kernel stores them)
    swiglu_bwd_ref(g1, g3, da, h1, h3, n);
    void *r1 = up_vals(g1, n, bf), *r3 = up_vals(g3, n, bf);
    Fp8Both b1 = both_alloc(rows, K, P, 0xCD), b3 = both_alloc(rows, K, P, 0xCD);
    unsigned long long *e1 = cu_counter(), *e3 = cu_counter();
    both_ref(b1, r1, bf, off, gr->G, K, e1), both_ref(b3, r3, bf, off, gr->G, K, e3);
    char tag[64];
    snprintf(tag, sizeof tag, "G %d K %d bf16 %d", gr->G, K, bf);
    same_vals("swiglu_bwd dh1", tag, o1, r1, n, bf), same_vals("swiglu_bwd dh3", tag, o3, r3, n, bf);
    both_same("swiglu_bwd dh1", tag, a1, b1, rows, K, P),
        both_same("swiglu_bwd dh3", tag, a3, b3, rows, K, P);
    same_counters("swiglu_bwd dh1 count", tag, c1, e1);
    same_counters("swiglu_bwd dh3 count", tag, c3, e3);
    both_free(a1), both_free(a3), both_free(b1), both_free(b3);
    void *fr[] = {dh1v, dh3v, dd, o1, o3, r1, r3};
    for (size_t i = 0; i < sizeof fr / sizeof *fr; i++) CU_CK(cudaFree(fr[i]));
    free(da), free(h1), free(h3), free(g1), free(g3);
}

static void check_swiglu_fwd(int M, int O, int bf) {
    size_t n = (size_t)M * O, es = bf ? 2 : 4, T = fp8_ntiles(O);
    float *h1 = xmalloc(4 * n + 4), *h3 = xmalloc(4 * n + 4), *act = xmalloc(4 * n + 4);
    for (size_t i = 0; i < n; i++) h1[i] = value(600), h3[i] = value(0);
    float *d1 = cu_put(h1, 4 * n), *d3 = cu_put(h3, 4 * n);
    void *oa = cu_alloc(es * n, 0x11), *o1 = bf ? cu_alloc(es * n, 0x22) : NULL,
         *o3 = bf ? cu_alloc(es * n, 0x33) : NULL;
    uint8_t *q = cu_alloc(n, 0xAB), *rq = cu_alloc(n, 0xCD);
    float *s = cu_alloc(4 * M * T, 0xAB), *rs_ = cu_alloc(4 * M * T, 0xCD);
    unsigned long long *c = cu_counter(), *rc = cu_counter();
    cuda_fp8_swiglu_fwd_tiles(oa, o1, o3, bf, d1, d3, M, O, q, s, c);
    const Backend *be = backend_cuda();
    float *ra = be->alloc(4 * n + 4);
    be->swiglu_fwd(ra, d1, d3, n);
    be->to_host(act, ra, 4 * n);
    be->free(ra);
    void *ract = up_vals(act, n, bf);
    cuda_fp8_quant_tiles(rq, rs_, ract, bf, M, O, rc);
    char tag[64];
    snprintf(tag, sizeof tag, "M %d O %d bf16 %d", M, O, bf);
    same_vals("swiglu_fwd act", tag, oa, ract, n, bf);
    if (bf) {
        void *r1 = up_vals(h1, n, 1), *r3 = up_vals(h3, n, 1);
        same_vals("swiglu_fwd h1", tag, o1, r1, n, 1), same_vals("swiglu_fwd h3", tag, o3, r3, n, 1);
        void *p[] = {r1, r3, o1, o3};
        for (int i = 0; i < 4; i++) CU_CK(cudaFree(p[i]));
    }
    same_dev("swiglu_fwd act codes", tag, q, rq, n),
        same_dev("swiglu_fwd act scales", tag, s, rs_, 4 * M * T);
    same_counters("swiglu_fwd count", tag, c, rc);
    void *fr[] = {d1, d3, oa, q, rq, s, rs_, ract};
    for (size_t i = 0; i < sizeof fr / sizeof *fr; i++) CU_CK(cudaFree(fr[i]));
    free(h1), free(h3), free(act);
}

// The up projections with the SwiGLU in the GEMM's epilogue (cuda_fp8_grouped_gemm_swiglu, W1 and W3
// interleaved by 64 rows with a scale per row) against two cuda_fp8_grouped_gemm (float32 results, 128x128
// block scales) and the cuda backend's swiglu_fwd, rounded to bf16 on the host: the same products of the same
// codes, so the same bits; the operands quantised on the host (cpu_fp8.h).
static void check_gemm_swiglu(int G, const int *rows, int K, int O) {
    int64_t off[9] = {0};
    for (int g = 0; g < G; g++) off[g + 1] = off[g] + rows[g];
    size_t R = (size_t)off[G], nw = (size_t)G * O * K, T = fp8_ntiles(K), BO = fp8_ntiles(O), ny = R * O;
    float *x = xmalloc(4 * R * K + 4), *w1 = xmalloc(4 * nw), *w3 = xmalloc(4 * nw);
    for (size_t i = 0; i < R * K; i++) x[i] = value(0);
    for (size_t i = 0; i < nw; i++) w1[i] = value(0), w3[i] = value(0) * 4.0f;
    w3[rnd() % nw] = INFINITY; // (a non-finite block: counted once per weight, its codes NaN in both layouts)
    uint8_t *qa = xmalloc(R * K + 1), *q1 = xmalloc(nw), *q3 = xmalloc(nw), *q13 = xmalloc(2 * nw);
    float *sa = xmalloc(4 * R * T + 4), *s1 = xmalloc(4 * G * BO * T), *s3 = xmalloc(4 * G * BO * T),
          *s13 = xmalloc(4 * 2 * (size_t)G * O * T);
    cpu_fp8_quant_tiles(qa, sa, x, (int)R, K);
    for (int g = 0; g < G; g++) {
        size_t o = (size_t)g * O * K, so = (size_t)g * BO * T;
        cpu_fp8_quant_blocks(q1 + o, s1 + so, w1 + o, O, K),
            cpu_fp8_quant_blocks(q3 + o, s3 + so, w3 + o, O, K);
        for (int n2 = 0; n2 < 2 * O; n2++) { // row n2: W1's (first 64 of each 128) or W3's row
            int w = n2 % 128, src = n2 / 128 * 64 + (w & 63);
            memcpy(q13 + ((size_t)g * 2 * O + n2) * K, (w >= 64 ? q3 : q1) + o + (size_t)src * K, K);
            for (size_t t = 0; t < T; t++)
                s13[((size_t)g * 2 * O + n2) * T + t] = (w >= 64 ? s3 : s1)[so + (size_t)(src / 128) * T + t];
        }
    }
    void *dqa = cu_put(qa, R * K), *dsa = cu_put(sa, 4 * R * T), *dq1 = cu_put(q1, nw), *dq3 = cu_put(q3, nw),
         *dq13 = cu_put(q13, 2 * nw), *ds1 = cu_put(s1, 4 * G * BO * T), *ds3 = cu_put(s3, 4 * G * BO * T),
         *ds13 = cu_put(s13, 8 * (size_t)G * O * T);
    void *h1 = cu_alloc(2 * ny, 0x11), *h3 = cu_alloc(2 * ny, 0x22), *act = cu_alloc(2 * ny, 0x33);
    float *f1 = cu_alloc(4 * ny, 0), *f3 = cu_alloc(4 * ny, 0), *fa = cu_alloc(4 * ny, 0);
    char tag[64];
    snprintf(tag, sizeof tag, "G %d K %d O %d", G, K, O);
    // the pair's layout quantised on the device (cuda_fp8_quant_blocks_pair, with each weight's transposed
    // layout) against the host's interleaving above and cuda_fp8_quant_blocks' transposed layout
    void *dw1 = cu_put(w1, 4 * nw), *dw3 = cu_put(w3, 4 * nw), *p2 = cu_alloc(2 * nw, 0xAB),
         *ps2 = cu_alloc(8 * (size_t)G * O * T, 0xAB);
    void *qt[2] = {cu_alloc(nw, 0xAB), cu_alloc(nw, 0xAB)},
         *st[2] = {cu_alloc(4 * G * BO * T, 0xAB), cu_alloc(4 * G * BO * T, 0xAB)};
    void *rqt = cu_alloc(nw, 0xCD), *rst = cu_alloc(4 * G * BO * T, 0xCD);
    unsigned long long *cp = cu_counter(), *cr = cu_counter();
    for (int h = 0; h < 2; h++) {
        cuda_fp8_quant_blocks_pair(p2, ps2, h, qt[h], st[h], h ? dw3 : dw1, 0, G, O, K, cp);
        cuda_fp8_quant_blocks(NULL, NULL, rqt, rst, h ? dw3 : dw1, 0, G, O, K, cr);
        same_dev(h ? "blocks_pair w3 codes_t" : "blocks_pair w1 codes_t", tag, qt[h], rqt, nw);
        same_dev(h ? "blocks_pair w3 scales_t" : "blocks_pair w1 scales_t", tag, st[h], rst, 4 * G * BO * T);
    }
    same_dev("blocks_pair codes", tag, p2, dq13, 2 * nw);
    same_dev("blocks_pair row scales", tag, ps2, ds13, 8 * (size_t)G * O * T);
    same_counters("blocks_pair count", tag, cp, cr);
    void *pf[] = {dw1, dw3, p2, ps2, qt[0], qt[1], st[0], st[1], rqt, rst};
    for (size_t i = 0; i < sizeof pf / sizeof *pf; i++) CU_CK(cudaFree(pf[i]));
    checks++;
    if (!cuda_fp8_grouped_gemm_swiglu(h1, h3, act, dqa, dsa, dq13, ds13, off, G, K, O) ||
        !cuda_fp8_grouped_gemm(f1, 0, 0.0f, dqa, dsa, dq1, ds1, 1, off, G, K, O) ||
        !cuda_fp8_grouped_gemm(f3, 0, 0.0f, dqa, dsa, dq3, ds3, 1, off, G, K, O)) {
        fails++;
        printf("FAIL gemm_swiglu %s: a kernel refused its shapes\n", tag);
    } else {
        backend_cuda()->swiglu_fwd(fa, f1, f3, ny);
        float *hf[3] = {cu_get(f1, 4 * ny), cu_get(f3, 4 * ny), cu_get(fa, 4 * ny)};
        void *got[3] = {h1, h3, act}, *ref[3];
        const char *nm[3] = {"gemm_swiglu h1", "gemm_swiglu h3", "gemm_swiglu act"};
        for (int i = 0; i < 3; i++) {
            ref[i] = up_vals(hf[i], ny, 1);
            same_vals(nm[i], tag, got[i], ref[i], ny, 1);
            CU_CK(cudaFree(ref[i]));
            free(hf[i]);
        }
    }
    void *fr[] = {dqa, dsa, dq1, dq3, dq13, ds1, ds3, ds13, h1, h3, act, f1, f3, fa};
    for (size_t i = 0; i < sizeof fr / sizeof *fr; i++) CU_CK(cudaFree(fr[i]));
    void *hfr[] = {x, w1, w3, qa, q1, q3, q13, sa, s1, s3, s13};
    for (size_t i = 0; i < sizeof hfr / sizeof *hfr; i++) free(hfr[i]);
}

// ---------------------------------------------------------------- the tables
typedef struct {
    int G, K, O;
    int64_t off[8];
} Shape;

// n random values a weight holds (bf16-representable: its bf16 copy and its float32 values quantise alike),
// one in `edge` an infinity (0: none)
static float *weights(size_t n, int edge) {
    float *w = xmalloc(4 * n + 4);
    for (size_t i = 0; i < n; i++) w[i] = bfr(value(0));
    if (edge) w[rnd() % n] = INFINITY;
    return w;
}
// a device buffer of be with n host values, in the hidden format (hid) or float32
static void *be_up(const Backend *be, float *h, size_t n, int hid) {
    int bf = hid && be->hid == FMT_BF16;
    void *d = be->alloc(n * (bf ? 2 : 4) + 4);
    if (!bf) {
        be->to_device(d, h, 4 * n);
        return d;
    }
    uint16_t *b = xmalloc(2 * n + 2);
    for (size_t i = 0; i < n; i++) b[i] = bf16_rn_bits(h[i]);
    be->to_device(d, b, 2 * n);
    free(b);
    return d;
}
// two device buffers of be (bytes each) hold the same bytes; differ 1: they must not (the change shows)
static void be_same(const Backend *be, const char *what, const void *a, const void *b, size_t bytes,
                    int differ) {
    checks++;
    uint8_t *x = xmalloc(bytes + 1), *y = xmalloc(bytes + 1);
    be->to_host(x, a, bytes), be->to_host(y, b, bytes);
    int d = memcmp(x, y, bytes) != 0;
    if (d != differ) fails++, printf("FAIL %-40s %s: %s\n", what, be->name, differ ? "unchanged" : "differs");
    free(x), free(y);
}

// The weights kept as codes between ops (w1 at element 16 of a registered parameter buffer, w3 after it)
// against the same values in unregistered buffers (quantised on every use): the plain forward (w1), its input
// gradient (w1's transposed codes) and the SwiGLU forward (the pair of w1 and w3: under "cuda" with K % 16 ==
// 0 and O % 64 == 0 the fused up projection), through changes of the weights; each change must show.
typedef struct {
    float *o, *d;
    void *h1, *h3, *act;
} KeptOut;
static void kept_ops(const Backend *be, const Shape *s, KeptOut *r, float *w1, float *w3, const float *x,
                     const void *xh, const float *dy) {
    be->grouped_matmul_fwd(r->o, x, w1, s->off, s->G, s->K, s->O);
    be->grouped_matmul_bwd(r->d, NULL, dy, x, w1, s->off, s->G, s->K, s->O, 0);
    be->grouped_swiglu_fwd(r->h1, r->h3, r->act, xh, w1, w3, s->off, s->G, s->K, s->O);
}
static void check_kept_weight(const Backend *be, const Shape *s) {
    int G = s->G, K = s->K, O = s->O;
    size_t R = (size_t)s->off[G], nw = (size_t)G * O * K, np = 2 * nw + 64, hs = be->hid == FMT_BF16 ? 2 : 4;
    float *par = be->alloc(4 * np), *u[2] = {be->alloc(4 * nw), be->alloc(4 * nw)},
          *pw[2] = {par + 16, par + 16 + nw};
    float *hx = weights(R * K, 0), *hdy = weights(R * O, 0);
    float *x = be_up(be, hx, R * K, 0), *dy = be_up(be, hdy, R * O, 0);
    void *xh = be_up(be, hx, R * K, 1);
    KeptOut r[3]; // kept, unregistered, the kept ones of the round before
    for (int k = 0; k < 3; k++) {
        r[k].o = be->alloc(4 * R * O + 4), r[k].d = be->alloc(4 * R * K + 4);
        r[k].h1 = be->alloc(hs * R * O + 4), r[k].h3 = be->alloc(hs * R * O + 4),
        r[k].act = be->alloc(hs * R * O + 4);
    }
    float *w = xmalloc(4 * nw);
    char what[96];
    // round: the kept and unregistered ops the same; the kept ones changed from the round before (differ) or
    // not
    for (int round = 0; round < 5; round++) {
        static const char *tag[5] = {"first use", "second use", "after to_device + bf16_shadow",
                                     "after adamw_runs", "after to_device alone"};
        if (round == 2 ||
            round == 4) // new values (bf16-representable), the copy refreshed (2) or dropped (4)
            for (int h = 0; h < 2; h++) {
                float *nwv = weights(nw, 0);
                be->to_device(pw[h], nwv, 4 * nw), be->to_device(u[h], nwv, 4 * nw);
                free(nwv);
            }
        if (round == 0 || round == 2) be->bf16_shadow(par, np);
        if (round ==
            3) { // AdamW on the buffer (it writes the bf16 copy); the unregistered ones its bf16 values
            float *g = be->alloc(4 * np), *m = be->alloc(4 * np), *v = be->alloc(4 * np),
                  *hg = weights(np, 0);
            be->to_device(g, hg, 4 * np);
            OptRun run = {16, 16, (int64_t)(2 * nw), 0, 0, 16, 0, 0, 0, OPTG_F32, 0};
            OptRuns *rr = be->runs_create(&run, 1);
            be->adamw_runs(par, g, m, v, rr, 1.0f, 0.25f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, OPT_MIXED, 1);
            for (int h = 0; h < 2; h++) {
                be->to_host(w, pw[h], 4 * nw);
                for (size_t i = 0; i < nw; i++) w[i] = bfr(w[i]);
                be->to_device(u[h], w, 4 * nw);
            }
            be->runs_free(rr);
            be->free(g), be->free(m), be->free(v), free(hg);
        }
        kept_ops(be, s, &r[0], pw[0], pw[1], x, xh, dy);
        kept_ops(be, s, &r[1], u[0], u[1], x, xh, dy);
        const char *nm[5] = {"fwd", "dinp", "swiglu h1", "swiglu h3", "swiglu act"};
        void *a[5] = {r[0].o, r[0].d, r[0].h1, r[0].h3, r[0].act},
             *b[5] = {r[1].o, r[1].d, r[1].h1, r[1].h3, r[1].act},
             *c[5] = {r[2].o, r[2].d, r[2].h1, r[2].h3, r[2].act};
        size_t len[5] = {4 * R * O, 4 * R * K, hs * R * O, hs * R * O, hs * R * O};
        for (int i = 0; i < 5; i++) {
            snprintf(what, sizeof what, "kept %s G %d K %d O %d, %s", nm[i], G, K, O, tag[round]);
            be_same(be, what, a[i], b[i], len[i], 0);
            if (round == 0) continue;
            snprintf(what, sizeof what, "kept %s G %d K %d O %d changed, %s", nm[i], G, K, O, tag[round]);
            be_same(be, what, a[i], c[i], len[i], round != 1);
        }
        for (int i = 0; i < 5; i++) be->copy(c[i], a[i], len[i]);
    }
    be->bf16_shadow(NULL, 0);
    for (int k = 0; k < 3; k++)
        be->free(r[k].o), be->free(r[k].d), be->free(r[k].h1), be->free(r[k].h3), be->free(r[k].act);
    void *fr[] = {par, u[0], u[1], x, dy, xh};
    for (size_t i = 0; i < sizeof fr / sizeof *fr; i++) be->free(fr[i]);
    free(hx), free(hdy), free(w);
}

// the non-finite count of a kept weight holding an infinity: the count of quantising it on each use
static void check_kept_count(const Backend *be) {
    Shape s = {2, 128, 256, {0, 130, 260}};
    size_t nw = (size_t)2 * 256 * 128, R = 260;
    float *par = be->alloc(4 * nw), *u = be->alloc(4 * nw), *x = be->alloc(4 * R * 128),
          *o = be->alloc(4 * R * 256), *d = be->alloc(4 * R * 128), *dy = be->alloc(4 * R * 256);
    float *w = weights(nw, 1), *hx = weights(R * 256, 0);
    be->to_device(par, w, 4 * nw), be->to_device(u, w, 4 * nw), be->to_device(x, hx, 4 * R * 128);
    be->to_device(dy, hx, 4 * R * 256); // (finite: only the weight's blocks count)
    be->bf16_shadow(par, nw);
    long long c[2];
    int layer[2], tensor[2];
    for (int k = 0; k < 2; k++) {
        float *wk = k ? u : par;
        be->fp8_nonfinite(&layer[k], &tensor[k]); // (drains earlier counts)
        be->fp8_site(5);
        be->grouped_matmul_fwd(o, x, wk, s.off, 2, 128, 256);
        be->grouped_matmul_fwd(o, x, wk, s.off, 2, 128, 256);
        be->grouped_matmul_bwd(d, NULL, dy, x, wk, s.off, 2, 128, 256, 0);
        c[k] = be->fp8_nonfinite(&layer[k], &tensor[k]);
    }
    checks++;
    if (c[0] != c[1] || c[0] != 3 || layer[0] != 5 || tensor[0] != tensor[1])
        fails++,
            printf("FAIL kept weight non-finite count %s: %lld (layer %d, tensor %d) vs %lld (%d, %d)\n",
                   be->name, c[0], layer[0], tensor[0], c[1], layer[1], tensor[1]);
    be->bf16_shadow(NULL, 0);
    be->free(par), be->free(u), be->free(x), be->free(o), be->free(d), be->free(dy);
    free(w), free(hx);
}

// The fused expert ops in a row, four ways: the weights in an unregistered buffer or kept (registered with
// bf16_shadow: the "cuda" table then takes its weights' codes from the kept copy, and the up projections run
// as one GEMM with the SwiGLU in its epilogue where K % 16 == 0 and O % 64 == 0), each with the stashed
// operands taken or dropped between the ops (be->zero of another buffer). Every way gives the first's bits
// and non-finite counts; and a stash is not taken once act was overwritten.
static void check_stash(const Backend *be, const Shape *s) {
    int G = s->G, K = s->K, O = s->O, hb = be->hid == FMT_BF16;
    size_t R = (size_t)s->off[G], nx = R * K, ny = R * O, nw = (size_t)G * O * K, hs = hb ? 2 : 4;
    float *hx = weights(nx, 0), *ha = weights(ny, 0), *hdy = weights(nx, 0);
    hdy[rnd() % nx] = NAN; // (a non-finite output gradient: the counts of every way must agree)
    float *hw[3] = {weights(nw, 0), weights(nw, 0), weights(nw, 0)}; // w1, w3, w2
    void *x = be_up(be, hx, nx, 1), *act2 = be_up(be, ha, ny, 1), *dy = be_up(be, hdy, nx, 1);
    float *wu[3], *par = be->alloc(4 * 3 * nw);
    for (int i = 0; i < 3; i++) wu[i] = be_up(be, hw[i], nw, 0), be->to_device(par + i * nw, hw[i], 4 * nw);
    void *h1 = be->alloc(hs * ny + 4), *h3 = be->alloc(hs * ny + 4), *act = be->alloc(hs * ny + 4),
         *dh1 = be->alloc(4 * ny + 4), *dh3 = be->alloc(4 * ny + 4), *junk = be->alloc(16);
    enum { Y, DW2, DX, DW1, DW3, H1, ACT, NR };
    size_t len[NR] = {4 * nx, 4 * nw, 4 * nx, 4 * nw, 4 * nw, hs * ny, hs * ny};
    const char *nm[NR] = {"down_fwd", "swiglu_bwd dw2", "bwd2 dinp",     "bwd2 dw1",
                          "bwd2 dw3", "swiglu_fwd h1",  "swiglu_fwd act"};
    void *res[4][NR];
    long long c[4];
    int layer, tensor[4];
    for (int k = 0; k < 4; k++) { // k & 1: the stash dropped between the ops; k & 2: the weights kept
        float **w = wu;
        float *wk[3] = {par, par + nw, par + 2 * nw};
        if (k == 2) be->bf16_shadow(par, 3 * nw);
        if (k & 2) w = wk;
        for (int i = 0; i < NR; i++) res[k][i] = be->alloc(len[i] + 4);
        be->fp8_nonfinite(&layer, &tensor[k]);
        be->fp8_site(1);
        be->grouped_swiglu_fwd(h1, h3, act, x, w[0], w[1], s->off, G, K, O);
        if (k & 1) be->zero(junk, 16);
        be->grouped_down_fwd(res[k][Y], act, w[2], s->off, G, O, K);
        be->copy(res[k][H1], h1, len[H1]), be->copy(res[k][ACT], act, len[ACT]);
        be->grouped_swiglu_bwd(dh1, dh3, res[k][DW2], dy, act, h1, h3, w[2], s->off, G, O, K, GM_DW_WRITE);
        if (k & 1) be->zero(junk, 16);
        be->grouped_matmul_bwd2(res[k][DX], res[k][DW1], res[k][DW3], dh1, dh3, x, w[0], w[1], s->off, G, K,
                                O, GM_DW_WRITE);
        c[k] = be->fp8_nonfinite(&layer, &tensor[k]);
    }
    char tag[64], what[112];
    snprintf(tag, sizeof tag, "G %d K %d O %d: ", G, K, O);
    for (int k = 1; k < 4; k++) {
        for (int i = 0; i < NR; i++) {
            snprintf(what, sizeof what, "%s%s, %s, stash %s", tag, nm[i], k & 2 ? "kept" : "not kept",
                     k & 1 ? "dropped" : "taken");
            be_same(be, what, res[k][i], res[0][i], len[i], 0);
        }
        checks++;
        if (c[k] != c[0] || c[0] == 0 || tensor[k] != tensor[0])
            fails++,
                printf("FAIL %snon-finite counts %s, way %d: %lld (tensor %d) vs %lld (%d)\n", tag, be->name,
                       k, c[k], tensor[k], c[0], tensor[0]);
    }
    // act overwritten after the SwiGLU (copy): the down projection reads the new act
    float *y0 = res[0][Y], *y1 = res[1][Y];
    be->grouped_swiglu_fwd(h1, h3, act, x, par, par + nw, s->off, G, K, O);
    be->copy(act, act2, hs * ny);
    be->grouped_down_fwd(y0, act, par + 2 * nw, s->off, G, O, K);
    be->grouped_down_fwd(y1, act2, par + 2 * nw, s->off, G, O, K);
    snprintf(what, sizeof what, "%sact overwritten", tag);
    be_same(be, what, y0, y1, 4 * nx, 0);
    be->bf16_shadow(NULL, 0);
    be->fp8_nonfinite(&layer, &tensor[0]);
    for (int k = 0; k < 4; k++)
        for (int i = 0; i < NR; i++) be->free(res[k][i]);
    void *fr[] = {x, act2, dy, wu[0], wu[1], wu[2], par, h1, h3, act, dh1, dh3, junk};
    for (size_t i = 0; i < sizeof fr / sizeof *fr; i++) be->free(fr[i]);
    free(hx), free(ha), free(hdy), free(hw[0]), free(hw[1]), free(hw[2]);
}

static void tables(int small) {
    Shape sh[] = {{4, 208, 192, {0, 0, 127, 256, 257}}, // (the fused up projection's shapes)
                  {5, 256, 144, {0, 0, 1, 128, 257, 557}},
                  {3, 100, 72, {0, 129, 129, 429}}};
    for (int t = 0; t < 2; t++) {
        const Backend *be = backend_cuda_fp8(t, 0);
        for (int i = 0; i < (small ? 1 : 3); i++) {
            if (!t) check_kept_weight(be, &sh[i]); // ("cuda-fp32" keeps no bf16 copy: nothing is kept)
            check_stash(be, &sh[i]);
        }
        if (!t) check_kept_count(be);
    }
}

// argument "small": one case of each kind (compute-sanitizer's run: scripts/device/fp8_fuse_check.sh)
int main(int argc, char **argv) {
    if (!backend_cuda_available()) {
        printf("skip: no GPU\n");
        return 77;
    }
    int small = argc > 1 && !strcmp(argv[1], "small");
    Groups grs[] = {
        {4, {0, 127, 129, 1}}, {1, {1}}, {1, {128}}, {3, {300, 0, 0}}, {5, {0, 1, 128, 129, 300}}};
    int Ks[] = {129, 1, 100, 128, 300};
    for (size_t g = 0; g < (small ? 1 : sizeof grs / sizeof *grs); g++)
        for (size_t k = 0; k < (small ? 1 : sizeof Ks / sizeof *Ks); k++)
            for (int bf = 0; bf < 2; bf++) {
                check_both(&grs[g], Ks[k], bf, g == 0 ? 37 : 0);
                check_swiglu_bwd(&grs[g], Ks[k], bf);
            }
    int Ms[] = {130, 1, 3}, Os[] = {129, 1, 100, 128, 300};
    for (int m = 0; m < (small ? 1 : 3); m++)
        for (int o = 0; o < (small ? 1 : 5); o++)
            for (int bf = 0; bf < 2; bf++) check_swiglu_fwd(Ms[m], Os[o], bf);
    if (cuda_fp8_grouped_kernel()) {
        int rows[4] = {0, 127, 129, 1};
        int KO[4][2] = {{208, 192}, {256, 64}, {256, 192}, {208, 128}};
        for (int i = 0; i < (small ? 1 : 4); i++) check_gemm_swiglu(4, rows, KO[i][0], KO[i][1]);
    } else printf("(no Hopper kernel here: the fused GEMM is not checked)\n");
    printf("kernels: %d checks, %d failed\n", checks, fails);
    tables(small);
    printf("%d checks, %d failed\n", checks, fails);
    return fails ? 1 : 0;
}
#else
int main(void) {
    printf("skip: built without CUDA\n");
    return 77;
}
#endif
