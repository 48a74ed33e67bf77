// cuda_fp8_ops.cu — the CUDA backends' FP8 tables (--precision fp8; ops.h Backend.fp8): the grouped GEMMs by
// DeepSeek-V3's fine-grained recipe exactly as ops.h defines it for the cpu (cpu_fp8_ops.c): the operands
// quantised on the GPU (cuda_fp8.cu, equal to the host quantisers bit for bit), the products by
// cuda_fp8_gemm below, the fused expert ops composed of them as the cpu composes them, the SwiGLU in the
// base backend's hidden format. Two tables: over "cuda" (bf16 hidden rows) and over "cuda-fp32" (float32
// rows: with the reference GEMM its grouped GEMMs equal the cpu's fp8 ones bit for bit).
// The bytes an operand costs are cut without changing a bit: the weights' codes are kept between ops
// (cuda_fp8_wcache.cu), an operand the activation and weight gradients both take is read once for both
// tilings, the SwiGLU forward writes act's tiles for the down projection and the SwiGLU backward both tilings
// of dh1 and dh3 for the up projections' backward (cuda_fp8_fused.cu), handed to the next op as a "stash"
// (ops.h grouped_down_fwd, grouped_matmul_bwd2: taken only by the op that matches it, dropped by any other).
// The non-finite scale groups are counted on the device per (layer, tensor), beside the largest amax of the
// finite ones (cuda_fp8.h FP8_CNT); fp8_nonfinite reads the counts once (one synchronisation a step) and
// names the first by layer, then tensor; fp8_amax reads the maxima as scale exponents.
// Must not hold: the quantiser kernels (cuda_fp8.cu, cuda_fp8_fused.cu) or any knowledge of the model.
#include <cuda_bf16.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_fp8.h"
#include "ops/cuda/cuda_fp8_fused.h"
#include "ops/cuda/cuda_fp8_trace.h"
#include "ops/cuda/cuda_fp8_wcache.h"
#include "ops/cuda/cuda_grouped_fp8.h"
#include "ops/numerics.h"

extern "C" {
#include "ops/cpu/cpu_fp8.h"
}

// ---------------------------------------------------------------- the reference GEMM
// C (M, N) (+)= A (M, K) . B (N, K)^T, A's codes row stride lda with 1x128 tile scales (row stride lsa), B's
// codes row stride ldb with 128x128 block scales (b_blocks 1: row n / 128 of sb, stride lsb) or 1x128 tile
// scales (0: row n). One thread an output, its sum in cpu_fp8_gemm's order: per K-tile the products in
// increasing k (each exact in float32) into p from +0, then c += p * (sa * sb); no contraction (the
// explicit roundings), so the result is the host reference's bit for bit.
__global__ void fp8_gemm_ref_k(float *c, long long ldc, const uint8_t *a, long long lda, const float *sa,
                               long long lsa, const uint8_t *b, long long ldb, const float *sb, long long lsb,
                               int M, int N, int K, int b_blocks, int add) {
    int n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const uint8_t *br = b + (long long)n * ldb;
    const float *sbr = sb + (long long)(b_blocks ? n / FP8_TILE : n) * lsb;
    int T = (K + FP8_TILE - 1) / FP8_TILE;
    for (int m = blockIdx.y; m < M; m += gridDim.y) {
        const uint8_t *ar = a + (long long)m * lda;
        float acc = 0.0f;
        for (int t = 0; t < T; t++) {
            float p = 0.0f;
            int k1 = min(K, (t + 1) * FP8_TILE);
            for (int k = t * FP8_TILE; k < k1; k++)
                p = __fadd_rn(p, __fmul_rn(e4m3_to_f32(ar[k]), e4m3_to_f32(br[k])));
            acc = __fadd_rn(acc, __fmul_rn(p, __fmul_rn(sa[(long long)m * lsa + t], sbr[t])));
        }
        float *o = c + (long long)m * ldc + n;
        *o = add ? __fadd_rn(*o, acc) : acc;
    }
}

static void cuda_fp8_gemm(float *c, long long ldc, const uint8_t *a, long long lda, const float *sa,
                          long long lsa, const uint8_t *b, long long ldb, const float *sb, long long lsb,
                          int M, int N, int K, int b_blocks, int add) {
    if (M <= 0 || N <= 0) return;
    dim3 grid((unsigned)((N + 127) / 128), (unsigned)(M < 65535 ? M : 65535));
    fp8_gemm_ref_k<<<grid, 128>>>(c, ldc, a, lda, sa, lsa, b, ldb, sb, lsb, M, N, K, b_blocks, add);
    KCHECK("fp8_gemm_ref");
}

// 1: every product by the reference kernel (MOE_FP8_GEMM=ref; tests hold the tables to the cpu's bit for
// bit so), else our Hopper kernel (cuda_grouped_fp8.cu) wherever it runs
static int fp8_ref(void) {
    static int v = -1;
    if (v < 0)
        v = !cuda_env_switch("MOE_FP8_GEMM", "kernel", "ref", "our Hopper kernel wherever it runs",
                             "the reference kernel, in the cpu's order");
    return v;
}

// 0: the up projections as two FP8 GEMMs (float32 h1, h3) and the SwiGLU in a pass of its own, even where the
// fused GEMM (SwiGLU in the epilogue) runs; the same bits either way (MOE_FP8_FUSE=0: the A/B of the fusion)
static int fp8_fuse(void) {
    static int v = -1;
    if (v < 0)
        v = cuda_env_switch("MOE_FP8_FUSE", "1", "0", "the SwiGLU in the up projections' GEMM",
                            "two GEMMs, then the SwiGLU");
    return v;
}

// ---------------------------------------------------------------- the trace (cuda_fp8_trace.h)
// The end of one traced launch: "what tensor" with the bytes it moved and the FLOPs it did.
static void tr(const char *what, int tensor, double bytes, double flops = 0) {
    if (!cuda_fp8_trace_on()) return;
    static const char *tn[FP8T_N] = {"x",   "w1",  "w3", "act",  "w2", "dy", "dh1",
                                     "dh3", "inp", "w",  "dout", "ax", "aw", "ad"};
    char n[48];
    snprintf(n, sizeof n, "%s %s", what, tensor >= 0 && tensor < FP8T_N ? tn[tensor] : "");
    cuda_fp8_trace_end(n, bytes, flops);
}

// ---------------------------------------------------------------- scratch and the non-finite counts
// Three grown buffers: the operands' codes and scales (one op's), float32 rows that outlive the GEMMs
// inside one fused op (h1, h3 before the SwiGLU; dact before its backward), and the stash (below) that one
// fused op leaves for the next. Ops run in stream order.
struct Scratch {
    void *p;
    size_t bytes;
};
static Scratch g_q, g_rows, g_st;
static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }
static void scratch_v(Scratch *s, int cnt, const size_t *sz, void **p) {
    size_t need = 0;
    for (int i = 0; i < cnt; i++) need += al256(sz[i]);
    if (need > s->bytes) {
        if (s->p) CUDA_CHECK(cudaFree(s->p)); // synchronises: no kernel still reads the old one
        size_t grow = s->bytes + s->bytes / 4;
        s->bytes = need > grow ? need : grow;
        CUDA_CHECK(cudaMalloc(&s->p, s->bytes));
    }
    char *q = (char *)s->p;
    for (int i = 0; i < cnt; i++) {
        p[i] = q;
        q += al256(sz[i]);
    }
}

static unsigned long long *g_cnt; // (layers + 1) x FP8T_N counters (FP8_CNT words); row 0: ops called before
                                  // any fp8_site
static int g_rows_cnt, g_site = -1;

static void fp8_site(int layer) {
    if (layer + 2 > g_rows_cnt) {
        int n = layer + 2 > 2 * g_rows_cnt ? layer + 2 : 2 * g_rows_cnt;
        unsigned long long *p;
        CUDA_CHECK(cudaMalloc((void **)&p, sizeof *p * n * FP8T_N * FP8_CNT));
        CUDA_CHECK(cudaMemset(p, 0, sizeof *p * n * FP8T_N * FP8_CNT));
        if (g_cnt) {
            cuda_fp8_weight_counts(); // (the kept weights' pending counts point into the old counters)
            CUDA_CHECK(
                cudaMemcpy(p, g_cnt, sizeof *p * g_rows_cnt * FP8T_N * FP8_CNT, cudaMemcpyDeviceToDevice));
            CUDA_CHECK(cudaFree(g_cnt));
        }
        g_cnt = p;
        g_rows_cnt = n;
    }
    g_site = layer;
}

static unsigned long long *cnt(int tensor) {
    if (!g_cnt) fp8_site(-1), g_site = -1;
    return g_cnt + ((size_t)(g_site + 1) * FP8T_N + tensor) * FP8_CNT;
}

// The counters on the host (the kept weights' pending uses added first): malloc'd, n counters
static unsigned long long *counters_host(size_t *n) {
    cuda_fp8_weight_counts();
    *n = (size_t)g_rows_cnt * FP8T_N;
    unsigned long long *h = (unsigned long long *)xmalloc(sizeof *h * *n * FP8_CNT);
    CUDA_CHECK(cudaMemcpy(h, g_cnt, sizeof *h * *n * FP8_CNT, cudaMemcpyDeviceToHost));
    return h;
}

// Word w of every counter cleared (the stream is idle: counters_host synchronised)
static void counters_clear(unsigned long long *h, size_t n, int w) {
    for (size_t i = 0; i < n; i++) h[i * FP8_CNT + w] = 0;
    CUDA_CHECK(cudaMemcpy(g_cnt, h, sizeof *h * n * FP8_CNT, cudaMemcpyHostToDevice));
}

static int64_t fp8_nonfinite(int *layer, int *tensor) {
    *layer = *tensor = -1;
    if (!g_cnt) return 0;
    size_t n;
    unsigned long long *h = counters_host(&n);
    int64_t total = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned long long c = h[i * FP8_CNT];
        if (c && *layer < 0 && *tensor < 0) *layer = (int)(i / FP8T_N) - 1, *tensor = (int)(i % FP8T_N);
        total += (int64_t)c;
    }
    if (total) counters_clear(h, n, 0);
    free(h);
    return total;
}

static void fp8_amax(int *k, int rows) {
    for (size_t i = 0; i < (size_t)rows * FP8T_N; i++) k[i] = FP8_AMAX_NONE;
    if (!g_cnt) return;
    size_t n;
    unsigned long long *h = counters_host(&n);
    for (size_t i = 0; i < n && i < (size_t)rows * FP8T_N; i++) {
        unsigned long long m = h[i * FP8_CNT + 1]; // (1 + the amax bits; 0: no finite group)
        if (m) k[i] = fp8_scale_exp((uint32_t)(m - 1));
    }
    counters_clear(h, n, 1);
    free(h);
}

// ---------------------------------------------------------------- the stash
// An operand a fused op computed for the op the MoE layer calls next: act's tiles (grouped_swiglu_fwd, for
// grouped_down_fwd) or both tilings of dh1 and dh3 (grouped_swiglu_bwd, for grouped_matmul_bwd2), keyed by
// the buffers and groups it is of. Taken by the one op that matches the key, dropped by every other op of the
// table and by its writes (to_device, copy, zero, free: ops.h's contract). Its non-finite counts wait in its
// own counters and are added to the consumer's (layer, tensor) when taken, so the counts are those of
// quantising in the consumer.
enum { ST_NONE, ST_ACT, ST_DH };
static struct {
    int kind, G, K;
    const void *a, *b;
    int64_t *off; // (G + 1, host)
    int cap;
    Fp8Both b1, b3;
    unsigned long long *bad; // 2 device counters (FP8_CNT words each, in g_st)
} g_sk;

static void stash_drop(void) { g_sk.kind = ST_NONE; }

// a stash of `kind` for a, b over the groups: its codes (both tilings of one or two operands of rows x K,
// or only the row tiles: ST_ACT) and counters in g_st, zeroed
static void stash_make(int kind, const void *a, const void *b, const int64_t *off, int G, int K) {
    int64_t rows = off[G] - off[0], P = kind == ST_DH ? cuda_fp8_pad_cols(off, G) : 0;
    int two = kind == ST_DH, T = fp8_ntiles(K);
    size_t sz[9] = {(size_t)rows * K,
                    sizeof(float) * rows * T,
                    (size_t)K * P,
                    sizeof(float) * K * (P / 128),
                    two ? (size_t)rows * K : 0,
                    two ? sizeof(float) * rows * T : 0,
                    two ? (size_t)K * P : 0,
                    two ? sizeof(float) * K * (P / 128) : 0,
                    2 * FP8_CNT * sizeof(unsigned long long)};
    void *p[9];
    scratch_v(&g_st, 9, sz, p);
    g_sk.b1 = Fp8Both{(uint8_t *)p[0], (uint8_t *)p[2], (float *)p[1], (float *)p[3]};
    g_sk.b3 = Fp8Both{(uint8_t *)p[4], (uint8_t *)p[6], (float *)p[5], (float *)p[7]};
    g_sk.bad = (unsigned long long *)p[8];
    CUDA_CHECK(cudaMemsetAsync(g_sk.bad, 0, 2 * FP8_CNT * sizeof(unsigned long long)));
    if (G + 1 > g_sk.cap) {
        g_sk.cap = G + 1;
        g_sk.off = (int64_t *)xrealloc(g_sk.off, sizeof(int64_t) * g_sk.cap);
    }
    memcpy(g_sk.off, off, sizeof(int64_t) * (G + 1));
    g_sk.kind = kind, g_sk.a = a, g_sk.b = b, g_sk.G = G, g_sk.K = K;
}

// src's two counters into d0's and d1's: the counts added, the maxima raised
__global__ void add_counts_k(unsigned long long *d0, unsigned long long *d1, const unsigned long long *src) {
    for (int i = 0; i < 2; i++) {
        unsigned long long *d = i ? d1 : d0;
        const unsigned long long *c = src + i * FP8_CNT;
        if (!d) continue;
        d[0] += c[0];
        if (c[1] > d[1]) d[1] = c[1];
    }
}

// 1 (the stash taken: its counts added into t0's and t1's counters) when it is of `kind` for a, b and the
// groups; else 0. Either way nothing is stashed after.
static int stash_take(int kind, const void *a, const void *b, const int64_t *off, int G, int K, int t0,
                      int t1) {
    int hit = g_sk.kind == kind && g_sk.a == a && g_sk.b == b && g_sk.G == G && g_sk.K == K &&
        !memcmp(g_sk.off, off, sizeof(int64_t) * (G + 1));
    g_sk.kind = ST_NONE;
    if (hit) {
        add_counts_k<<<1, 1>>>(cnt(t0), t1 >= 0 ? cnt(t1) : NULL, g_sk.bad);
        KCHECK("fp8 stash counts");
    }
    return hit;
}

// ---------------------------------------------------------------- the recipe's three products
// The values a weight's quantiser reads: its bf16 copy where the weights have one (the bf16 GEMMs read the
// same), else the float32 weight.
static const void *weight_src(const float *w, size_t n, int *bf) {
    const void *s = cuda_bf16_shadow_of(w, n);
    *bf = s != NULL;
    return s ? s : (const void *)w;
}
static size_t esz(int bf) { return bf ? 2 : 4; }
// element i of hidden rows (bf16 where hb, else float32)
static void *hid_at_b(void *p, size_t i, int hb) { return (char *)p + i * esz(hb); }

// out_g = gemm(tiles(inp_g), blocks(W_g)); inp's element size by `bf`. With out2 and w2 (the SwiGLU's up
// projections) also out2_g = gemm(tiles(inp_g), blocks(W2_g)) from the same tiles of inp (quantised once).
// pre: inp's tiles already made (the stash's act tiles; their counts taken with it). The weights' codes from
// the kept copy (cuda_fp8_wcache.h) where it has them, else quantised here.
static void fp8_fwd(float *out, const void *inp, int bf, const float *w, const int64_t *off, int G, int K,
                    int O, int tin, int tw, float *out2 = NULL, const float *w2 = NULL, int tw2 = 0,
                    const Fp8Both *pre = NULL) {
    int64_t r0 = off[0], rows = off[G] - off[0];
    if (G <= 0 || rows <= 0 || O <= 0) return;
    if (K <= 0) {
        CUDA_CHECK(cudaMemsetAsync(out + r0 * O, 0, sizeof(float) * rows * O));
        if (out2) CUDA_CHECK(cudaMemsetAsync(out2 + r0 * O, 0, sizeof(float) * rows * O));
        return;
    }
    int T = fp8_ntiles(K), BO = fp8_ntiles(O), wbf;
    size_t nw = (size_t)G * O * K,
           sz[4] = {(size_t)rows * K, sizeof(float) * rows * T, nw, sizeof(float) * G * BO * T};
    void *p[4];
    scratch_v(&g_q, 4, sz, p);
    const uint8_t *qa = pre ? pre->q : (uint8_t *)p[0];
    const float *sa = pre ? pre->s : (float *)p[1];
    if (!pre) {
        cuda_fp8_trace_begin();
        cuda_fp8_quant_tiles((uint8_t *)p[0], (float *)p[1], (const char *)inp + esz(bf) * r0 * K, bf,
                             (int)rows, K, cnt(tin));
        tr("quant tiles", tin, (double)rows * K * (esz(bf) + 1) + 4.0 * rows * T);
    }
    double gb = (double)rows * K + (double)G * O * K + 4.0 * rows * O, gf = 2.0 * rows * K * O;
    // (a second weight quantised here overwrites the first's codes after the first GEMM, in stream order)
    for (int i = 0; i < (out2 ? 2 : 1); i++) {
        float *o = i ? out2 : out;
        Fp8Weight fw;
        if (!cuda_fp8_weight(&fw, i ? w2 : w, G, O, K, FP8W_FWD, cnt(i ? tw2 : tw))) {
            const void *ws = weight_src(i ? w2 : w, nw, &wbf);
            cuda_fp8_trace_begin();
            cuda_fp8_quant_blocks((uint8_t *)p[2], (float *)p[3], NULL, NULL, ws, wbf, G, O, K,
                                  cnt(i ? tw2 : tw));
            tr("quant blocks", i ? tw2 : tw, (double)nw * (esz(wbf) + 1));
            fw.q = (uint8_t *)p[2], fw.s = (float *)p[3];
        }
        cuda_fp8_trace_begin();
        if (!fp8_ref() && cuda_fp8_grouped_gemm(o + r0 * O, 0, 0.0f, qa, sa, fw.q, fw.s, 1, off, G, K, O)) {
            tr("gemm fwd", i ? tw2 : tw, gb, gf);
            continue;
        }
        for (int g = 0; g < G; g++) {
            int64_t a = off[g] - r0, n = off[g + 1] - off[g];
            cuda_fp8_gemm(o + off[g] * O, O, qa + a * K, K, sa + a * T, T, fw.q + (size_t)g * O * K, K,
                          fw.s + (size_t)g * BO * T, T, (int)n, O, K, 1, 0);
        }
        tr("gemm fwd (ref)", i ? tw2 : tw, gb, gf);
    }
}

// grouped_matmul_bwd's contract (ops.h) with the recipe's products: dinp_g (+)= gemm(tiles(dout_g),
// blocks(W_g)^T), dw_g (+)= gemm(tiles_t(dout_g), tiles_t(inp_g)); dout's element size by `dbf`, inp's by
// `bf`. dout's two tilings from one read where both products run; pre: both made already (the stash's; counts
// taken with it). in_ready: inp's transposed tiles are in the scratch already, from a call with the same
// shapes and the same operands present (grouped_matmul_bwd2's second product: the same inp)
static void fp8_bwd(float *dinp, float *dw, const void *dout, int dbf, const void *inp, int bf,
                    const float *w, const int64_t *off, int G, int K, int O, int flags, int tdout, int tin,
                    int tw, int in_ready = 0, const Fp8Both *pre = NULL) {
    const char *fe = gm_dw_flags_error(flags);
    CHECK(!fe, "grouped_matmul_bwd: %s", fe);
    int acc = flags & GM_ACC_DINP, write = flags & GM_DW_WRITE, dx = dinp != NULL;
    int sq = dw && (flags & GM_DW_SUMSQ); // (the ledger: ops.h GM_DW_SUMSQ)
    int packed = dw && (flags & GM_DW_BF16); // (bf16 blocks at dw's element g O K: ops.h GM_DW_BF16)
    size_t es = packed ? 2 : sizeof(float);
    int64_t r0 = off[0], rows = off[G] - off[0];
    if (G <= 0 || K <= 0) return;
    if (O <= 0 || rows <= 0) { // empty sums: zeros where written (and counted in the ledger, their sum 0)
        if (dw && write) CUDA_CHECK(cudaMemsetAsync(dw, 0, es * G * (size_t)(O > 0 ? O : 0) * K));
        if (sq && O > 0) cuda_dw_ledger_slots(0, G);
        if (dinp && !acc && rows > 0) CUDA_CHECK(cudaMemsetAsync(dinp + r0 * K, 0, sizeof(float) * rows * K));
        return;
    }
    int TO = fp8_ntiles(O), BK = fp8_ntiles(K), wbf;
    int64_t P = cuda_fp8_pad_cols(off, G);
    size_t nw = (size_t)G * O * K;
    // (the layout does not depend on pre or on the kept weights: in_ready finds inp's tiles where they were)
    size_t sz[9] = {dx ? (size_t)rows * O : 0,
                    dx ? sizeof(float) * rows * TO : 0,
                    dx ? nw : 0,
                    dx ? sizeof(float) * G * BK * TO : 0,
                    dw ? (size_t)O * P : 0,
                    dw ? sizeof(float) * O * (P / 128) : 0,
                    dw ? (size_t)K * P : 0,
                    dw ? sizeof(float) * K * (P / 128) : 0,
                    packed ? sizeof(float) * O * K
                           : 0}; // (a group's float32 block where the reference packs it)
    void *p[9];
    scratch_v(&g_q, 9, sz, p);
    Fp8Both d = pre ? *pre : Fp8Both{(uint8_t *)p[0], (uint8_t *)p[4], (float *)p[1], (float *)p[5]};
    double sc = 4.0 / 128; // (scale bytes a code)
    if (!pre && dx && dw) {
        cuda_fp8_trace_begin();
        cuda_fp8_quant_both(d, dout, dbf, off, G, O, cnt(tdout));
        tr("quant both", tdout, (double)rows * O * (esz(dbf) + 1 + sc) + (double)O * P * (1 + sc));
    }
    if (dx) {
        if (!pre && !dw) {
            cuda_fp8_trace_begin();
            cuda_fp8_quant_tiles(d.q, d.s, (const char *)dout + esz(dbf) * r0 * O, dbf, (int)rows, O,
                                 cnt(tdout));
            tr("quant tiles", tdout, (double)rows * O * (esz(dbf) + 1 + sc));
        }
        // W (O, K) by blocks; the GEMM's B is W^T (K, O): the codes and block scales transposed only
        Fp8Weight fw;
        if (!cuda_fp8_weight(&fw, w, G, O, K, FP8W_T, cnt(tw))) {
            const void *ws = weight_src(w, nw, &wbf);
            cuda_fp8_trace_begin();
            cuda_fp8_quant_blocks(NULL, NULL, (uint8_t *)p[2], (float *)p[3], ws, wbf, G, O, K, cnt(tw));
            tr("quant blocks_t", tw, (double)nw * (esz(wbf) + 1));
            fw.qt = (uint8_t *)p[2], fw.st = (float *)p[3];
        }
        cuda_fp8_trace_begin();
        int kern = !fp8_ref() &&
            cuda_fp8_grouped_gemm(dinp + r0 * K, 0, acc ? 1.0f : 0.0f, d.q, d.s, fw.qt, fw.st, 1, off, G, O,
                                  K);
        if (!kern)
            for (int g = 0; g < G; g++) {
                int64_t a = off[g] - r0, n = off[g + 1] - off[g];
                cuda_fp8_gemm(dinp + off[g] * K, K, d.q + a * O, O, d.s + a * TO, TO,
                              fw.qt + (size_t)g * O * K, O, fw.st + (size_t)g * BK * TO, TO, (int)n, K, O, 1,
                              acc);
            }
        tr(kern ? "gemm dgrad" : "gemm dgrad (ref)", tdout,
           (double)rows * O + (double)nw + (acc ? 8.0 : 4.0) * rows * K, 2.0 * rows * O * K);
    }
    if (dw) {
        // dout^T and inp^T per group, each group's rows as columns padded to 128 (cuda_fp8.h)
        if (!pre && !dx) {
            cuda_fp8_trace_begin();
            cuda_fp8_quant_tiles_t(d.qt, d.st, dout, dbf, off, G, O, cnt(tdout));
            tr("quant tiles_t", tdout, (double)rows * O * esz(dbf) + (double)O * P * (1 + sc));
        }
        if (!in_ready) {
            cuda_fp8_trace_begin();
            cuda_fp8_quant_tiles_t((uint8_t *)p[6], (float *)p[7], inp, bf, off, G, K, cnt(tin));
            tr("quant tiles_t", tin, (double)rows * K * esz(bf) + (double)K * P * (1 + sc));
        }
        double gb = (double)(O + K) * P + (write ? 4.0 : 8.0) * nw, gf = 2.0 * rows * O * K;
        if (!fp8_ref() && G <= 256) {
            int64_t pc[257];
            for (int g = 0; g <= G; g++) pc[g] = cuda_fp8_pad_cols(off, g);
            cuda_fp8_trace_begin();
            if (cuda_fp8_grouped_gemm_dw(dw, write ? 0.0f : 1.0f, packed, sq, d.qt, d.st, (uint8_t *)p[6],
                                         (float *)p[7], pc, G, O, K)) {
                tr("gemm wgrad", tw, gb, gf);
                return;
            }
        }
        cuda_fp8_trace_begin();
        for (int g = 0; g < G; g++) {
            int64_t n = off[g + 1] - off[g], c0 = cuda_fp8_pad_cols(off, g);
            float *dwg = packed ? (float *)p[8] : dw + (size_t)g * O * K;
            if (n == 0) {
                if (write) CUDA_CHECK(cudaMemsetAsync((char *)dw + es * g * O * K, 0, es * O * K));
                continue;
            }
            cuda_fp8_gemm(dwg, K, d.qt + c0, P, d.st + c0 / 128, P / 128, (uint8_t *)p[6] + c0, P,
                          (float *)p[7] + c0 / 128, P / 128, O, K, (int)n, 0, !write);
            if (packed) cuda_f32_to_bf16((uint16_t *)dw + (size_t)g * O * K, dwg, (size_t)O * K);
        }
        if (sq) cuda_dw_ledger_sum(dw, nw, packed, G);
        tr("gemm wgrad (ref)", tw, gb, gf);
    }
}

// ---------------------------------------------------------------- the tables' ops (HB: hidden rows bf16)
static void fp8_grouped_matmul_fwd(float *out, const float *inp, const float *w, const int64_t *off, int G,
                                   int K, int O) {
    stash_drop();
    fp8_fwd(out, inp, 0, w, off, G, K, O, FP8T_INP, FP8T_W);
}
static void fp8_grouped_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp,
                                   const float *w, const int64_t *off, int G, int K, int O, int flags) {
    stash_drop();
    fp8_bwd(dinp, dw, dout, 0, inp, 0, w, off, G, K, O, flags, FP8T_DOUT, FP8T_INP, FP8T_W);
}

// --fp8-dense (ops.h Backend.fp8_dense): the attention projections' products, each one group of the N rows;
// inp in the hidden format (bf16 rows where HB), dout float32
template <int HB>
static void fp8_mm_fwd_multi(int n, float *const *out, const void *inp, const float *const *w, int N, int K,
                             const int *O, int flags) {
    CHECK(!flags, "matmul_fwd_multi (--fp8-dense): flags %d (GM_OUT_HID is not this table's)", flags);
    stash_drop();
    const int64_t off[2] = {0, N};
    for (int i = 0; i < n; i++) fp8_fwd(out[i], inp, HB, w[i], off, 1, K, O[i], FP8T_AX, FP8T_AW);
}
template <int HB>
static void fp8_mm_bwd_multi(int n, float *dinp, float *const *dw, const float *const *dout, const void *inp,
                             const float *const *w, int N, int K, const int *O, int flags) {
    stash_drop();
    const int64_t off[2] = {0, N};
    for (int i = 0; i < n; i++)
        fp8_bwd(dinp, dw[i], dout[i], 0, inp, HB, w[i], off, 1, K, O[i],
                i ? GM_ACC_DINP | (flags & GM_DW_WRITE) : flags, FP8T_AD, FP8T_AX, FP8T_AW);
}

// bf16 rows, our kernel, the weights kept: both up projections in one GEMM with the SwiGLU in its epilogue
// (cuda_fp8_grouped_gemm_swiglu: no float32 h1, h3), then act's tiles for the down projection (stashed);
// 0 where it does not apply (nothing done)
static int swiglu_fwd_fused(void *h1, void *h3, void *act, const void *inp, const float *w1, const float *w3,
                            const int64_t *off, int G, int K, int O) {
    int64_t r0 = off[0], rows = off[G] - off[0];
    size_t b = (size_t)r0 * O;
    if (fp8_ref() || !fp8_fuse() || K <= 0 || K % 16 || O % 64 || G > 256 || !cuda_fp8_grouped_kernel() ||
        (((uintptr_t)hid_at_b(h1, b, 1) | (uintptr_t)hid_at_b(h3, b, 1) | (uintptr_t)hid_at_b(act, b, 1)) &
         3))
        return 0;
    const uint8_t *q13;
    const float *s13;
    if (!cuda_fp8_weight_pair(&q13, &s13, w1, w3, G, O, K, cnt(FP8T_W1), cnt(FP8T_W3))) return 0;
    int T = fp8_ntiles(K);
    size_t sz[2] = {(size_t)rows * K, sizeof(float) * rows * T};
    void *p[2];
    scratch_v(&g_q, 2, sz, p);
    cuda_fp8_trace_begin();
    cuda_fp8_quant_tiles((uint8_t *)p[0], (float *)p[1], (const char *)inp + 2 * r0 * K, 1, (int)rows, K,
                         cnt(FP8T_X));
    tr("quant tiles", FP8T_X, (double)rows * K * 3 + 4.0 * rows * T);
    cuda_fp8_trace_begin();
    if (!cuda_fp8_grouped_gemm_swiglu(hid_at_b(h1, b, 1), hid_at_b(h3, b, 1), hid_at_b(act, b, 1),
                                      (uint8_t *)p[0], (float *)p[1], q13, s13, off, G, K, O))
        DIE("fp8 grouped_swiglu_fwd: the fused GEMM refused shapes it takes (G %d, K %d, O %d)", G, K, O);
    tr("gemm up+swiglu (fused)", FP8T_W1, (double)rows * K + 2.0 * G * O * K + 6.0 * rows * O,
       4.0 * rows * K * O);
    stash_make(ST_ACT, act, NULL, off, G, O);
    cuda_fp8_trace_begin();
    cuda_fp8_quant_tiles(g_sk.b1.q, g_sk.b1.s, hid_at_b(act, b, 1), 1, (int)rows, O, g_sk.bad);
    tr("quant tiles", FP8T_ACT, (double)rows * O * 3 + 4.0 * rows * fp8_ntiles(O));
    return 1;
}

// h1, h3 by the GEMMs (float32: into the rows' scratch where the hidden rows are bf16), then act =
// silu(h1) h3 and, bf16 rows, h1 and h3 in the hidden format, with act's tiles for the down projection
// (stashed) in the same pass
// (the fused GEMM above where it applies)
template <int HB>
static void fp8_swiglu_fwd(void *h1, void *h3, void *act, const void *inp, const float *w1, const float *w3,
                           const int64_t *off, int G, int K, int O) {
    stash_drop();
    int64_t rows = G > 0 ? off[G] - off[0] : 0;
    if (rows <= 0 || O <= 0) return;
    if (HB && swiglu_fwd_fused(h1, h3, act, inp, w1, w3, off, G, K, O)) return;
    size_t b = (size_t)off[0] * O, n = (size_t)rows * O;
    float *f1 = (float *)h1, *f3 = (float *)h3;
    if (HB) {
        size_t sz[2] = {sizeof(float) * n, sizeof(float) * n};
        void *p[2];
        scratch_v(&g_rows, 2, sz, p);
        f1 = (float *)p[0] - b, f3 = (float *)p[1] - b; // indexed by the rows' numbers, as h1
    }
    fp8_fwd(f1, inp, HB, w1, off, G, K, O, FP8T_X, FP8T_W1, f3, w3, FP8T_W3);
    stash_make(ST_ACT, act, NULL, off, G, O);
    cuda_fp8_trace_begin();
    cuda_fp8_swiglu_fwd_tiles(hid_at_b(act, b, HB), HB ? hid_at_b(h1, b, HB) : NULL,
                              HB ? hid_at_b(h3, b, HB) : NULL, HB, f1 + b, f3 + b, (int)rows, O, g_sk.b1.q,
                              g_sk.b1.s, g_sk.bad);
    tr("swiglu fwd + act tiles", FP8T_ACT, (double)n * (8 + esz(HB) * (HB ? 3 : 1) + 1 + 4.0 / 128));
}

template <int HB>
static void fp8_down_fwd(float *out, const void *act, const float *w, const int64_t *off, int G, int K,
                         int O) {
    Fp8Both pre = g_sk.b1;
    int take = stash_take(ST_ACT, act, NULL, off, G, K, FP8T_ACT, -1);
    fp8_fwd(out, act, HB, w, off, G, K, O, FP8T_ACT, FP8T_W2, NULL, NULL, 0, take ? &pre : NULL);
}

// dact (float32) = dout W2 (into dh1 where the rows are float32, else the rows' scratch), dw2 from dout and
// act, then the SwiGLU's backward: dh1, dh3 written (plain.h's order: swiglu_bwd reads each dact before it
// writes that dh1), with both tilings of each for the up projections' backward (stashed). act NULL
// (--fp8-save: ops.h Backend.fp8_save): silu(h1) h3 of the h1, h3 given, into the rows' scratch first.
template <int HB>
static void fp8_swiglu_bwd(void *dh1, void *dh3, float *dw, const void *dout, const void *act, const void *h1,
                           const void *h3, const float *w, const int64_t *off, int G, int K, int O,
                           int flags) {
    stash_drop();
    if (G <= 0) return;
    int64_t rows = off[G] - off[0];
    size_t b = (size_t)off[0] * K, n = (size_t)(rows > 0 ? rows : 0) * K;
    float *dact = (float *)dh1;
    if (HB || !act) {
        size_t sz[2] = {sizeof(float) * (n ? n : 1), esz(HB) * (n ? n : 1)};
        void *p[2];
        scratch_v(&g_rows, 2, sz, p);
        if (HB) dact = (float *)p[0] - b;
        if (!act) {
            if (HB) cuda_swiglu_act_hid(p[1], hid_at_b((void *)h1, b, 1), hid_at_b((void *)h3, b, 1), n);
            else cuda_swiglu_fwd((float *)p[1], (const float *)h1 + b, (const float *)h3 + b, n);
            act = (char *)p[1] - b * esz(HB); // (indexed by the rows' numbers, as h1)
        }
    }
    fp8_bwd(dact, dw, dout, HB, act, HB, w, off, G, K, O, flags & GM_DW_FLAGS, FP8T_DY, FP8T_ACT, FP8T_W2);
    if (!n) return;
    stash_make(ST_DH, dh1, dh3, off, G, K);
    cuda_fp8_trace_begin();
    cuda_fp8_swiglu_bwd_both(dh1, dh3, HB, dact, h1, h3, off, G, K, g_sk.b1, g_sk.b3, g_sk.bad,
                             g_sk.bad + FP8_CNT);
    tr("swiglu bwd + dh both", FP8T_DH1,
       (double)n * (4 + 4 * esz(HB)) + 2.0 * (n + (double)K * cuda_fp8_pad_cols(off, G)) * (1 + 4.0 / 128));
}

// the two products, dh1's and dh3's operands from the stash where grouped_swiglu_bwd left them and every
// product runs (the counts as if quantised here: each tiling of each)
template <int HB>
static void fp8_matmul_bwd2(float *dinp, float *dwa, float *dwb, const void *douta, const void *doutb,
                            const void *inp, const float *wa, const float *wb, const int64_t *off, int G,
                            int K, int O, int flags) {
    Fp8Both pa = g_sk.b1, pb = g_sk.b3;
    int take = dinp && dwa && dwb && stash_take(ST_DH, douta, doutb, off, G, O, FP8T_DH1, FP8T_DH3);
    stash_drop();
    fp8_bwd(dinp, dwa, douta, HB, inp, HB, wa, off, G, K, O, flags, FP8T_DH1, FP8T_X, FP8T_W1, 0,
            take ? &pa : NULL);
    fp8_bwd(dinp, dwb, doutb, HB, inp, HB, wb, off, G, K, O, GM_ACC_DINP | (flags & GM_DW_FLAGS), FP8T_DH3,
            FP8T_X, FP8T_W3, dwa && dwb,
            take ? &pb : NULL); // (inp's transposed tiles: the first's)
}

// The table's writes drop the stash (ops.h: what the caller writes between the two ops is not in it).
template <int HB> static const Backend *base_of(void) { return HB ? backend_cuda() : backend_cuda_fp32(); }
template <int HB> static void fp8_free(void *p) {
    stash_drop();
    base_of<HB>()->free(p);
}
template <int HB> static void fp8_to_device(void *dst, const void *src, size_t bytes) {
    stash_drop();
    base_of<HB>()->to_device(dst, src, bytes);
}
template <int HB> static void fp8_copy(void *dst, const void *src, size_t bytes) {
    stash_drop();
    base_of<HB>()->copy(dst, src, bytes);
}
template <int HB> static void fp8_zero(void *p, size_t bytes) {
    stash_drop();
    base_of<HB>()->zero(p, bytes);
}

// --fp8-dispatch's rows (cuda_fp8.h), in the hidden format (HB 1: bf16); they change a buffer, as copy does
template <int HB> static void fp8_rows_round(void *r, int n, int d) {
    stash_drop();
    cuda_fp8_round_rows(r, HB, n, d);
}
template <int HB> static void fp8_rows_pack(void *p, const void *r, int n, int d) {
    cuda_fp8_pack_rows((uint8_t *)p, r, HB, n, d);
}
template <int HB> static void fp8_rows_unpack(void *r, const void *p, int n, int d) {
    stash_drop();
    cuda_fp8_unpack_rows(r, HB, (const uint8_t *)p, n, d);
}

template <int HB> static void fp8_table(Backend *be, const Backend *base, const char *name) {
    *be = *base;
    be->name = name;
    be->fp8 = 1;
    be->fp8_site = fp8_site;
    be->fp8_nonfinite = fp8_nonfinite;
    be->fp8_amax = fp8_amax;
    be->free = fp8_free<HB>;
    be->to_device = fp8_to_device<HB>;
    be->copy = fp8_copy<HB>;
    be->zero = fp8_zero<HB>;
    be->grouped_matmul_fwd = fp8_grouped_matmul_fwd;
    be->grouped_matmul_bwd = fp8_grouped_matmul_bwd;
    be->grouped_swiglu_fwd = fp8_swiglu_fwd<HB>;
    be->grouped_down_fwd = fp8_down_fwd<HB>;
    be->grouped_swiglu_bwd = fp8_swiglu_bwd<HB>;
    be->grouped_matmul_bwd2 = fp8_matmul_bwd2<HB>;
    be->fp8_rows_round = fp8_rows_round<HB>;
    be->fp8_rows_pack = fp8_rows_pack<HB>;
    be->fp8_rows_unpack = fp8_rows_unpack<HB>;
    be->fp8_save = 1; // (grouped_swiglu_bwd takes act NULL)
    be->fp8_keep_weights = cuda_fp8_weight_keep;
}

// The FP8 table over "cuda" (fp32 0: bf16 hidden rows) or "cuda-fp32" (1); dense: with the attention
// projections' products too (--fp8-dense).
extern "C" const Backend *backend_cuda_fp8(int fp32, int dense) {
    static Backend t[2][2];
    Backend *be = &t[fp32 != 0][dense != 0];
    if (!be->name) {
        if (fp32) fp8_table<0>(be, backend_cuda_fp32(), dense ? "cuda-fp32-fp8-dense" : "cuda-fp32-fp8");
        else fp8_table<1>(be, backend_cuda(), dense ? "cuda-fp8-dense" : "cuda-fp8");
        if (dense) {
            be->fp8_dense = 1;
            be->matmul_fwd_multi = fp32 ? fp8_mm_fwd_multi<0> : fp8_mm_fwd_multi<1>;
            be->matmul_bwd_multi = fp32 ? fp8_mm_bwd_multi<0> : fp8_mm_bwd_multi<1>;
        }
    }
    return be;
}
