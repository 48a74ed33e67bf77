// cpu_fp8_ops.c — the cpu backend's FP8 tables (backend_cpu_fp8; ops.h Backend.fp8): the grouped GEMMs as
// the fine-grained recipe over the host reference (cpu_fp8.c's quantisers and GEMM), the fused expert ops
// composed of them as ops/plain.h composes them (with each operand's role, for the non-finite report),
// and the count of non-finite scale groups that the step reads; backend_cpu_fp8_dense (--fp8-dense) the
// attention projections' products too, each as one group. Every other op is backend_cpu()'s.
// Must not hold: the quantisers or the GEMM themselves (cpu_fp8.c), or anything that knows the model.
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "ops/cpu/cpu_fp8.h"
#include "ops/cpu/cpu_ops.h"

// The non-finite scale groups since the last fp8_nonfinite, the first one's layer and tensor, the layer
// fp8_site named, and each (layer, tensor)'s largest scale exponent since the last fp8_amax (g_kmax, rows
// of FP8T_N from layer -1; the ops run one at a time on the host: plain variables).
static int64_t g_bad;
static int g_site = -1, g_bad_layer = -1, g_bad_tensor = -1, g_rows, *g_kmax;

// An operand quantised: bad its non-finite groups, s its ns scales (powers of two; NaN for those groups)
static void note_bad(int64_t bad, int tensor, const float *s, size_t ns) {
    if (bad && !g_bad) {
        g_bad_layer = g_site;
        g_bad_tensor = tensor;
    }
    g_bad += bad;
    if (g_site + 2 > g_rows) {
        int n = g_site + 2;
        g_kmax = xrealloc(g_kmax, sizeof(int) * (size_t)n * FP8T_N);
        for (size_t i = (size_t)g_rows * FP8T_N; i < (size_t)n * FP8T_N; i++) g_kmax[i] = FP8_AMAX_NONE;
        g_rows = n;
    }
    int *k = g_kmax + (size_t)(g_site + 1) * FP8T_N + tensor;
    for (size_t i = 0; i < ns; i++) {
        int e = fp8_scale_log2(s[i]); // (NaN for a non-finite group: passed over)
        if ((f32_bits(s[i]) & 0x7fffffffu) < 0x7f800000u && e > *k) *k = e;
    }
}

static void fp8_site(int layer) { g_site = layer; }

static void fp8_amax(int *k, int rows) {
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < FP8T_N; t++)
            k[(size_t)r * FP8T_N + t] = r < g_rows ? g_kmax[(size_t)r * FP8T_N + t] : FP8_AMAX_NONE;
    for (size_t i = 0; i < (size_t)g_rows * FP8T_N; i++) g_kmax[i] = FP8_AMAX_NONE;
}

static int64_t fp8_nonfinite(int *layer, int *tensor) {
    int64_t n = g_bad;
    *layer = g_bad_layer;
    *tensor = g_bad_tensor;
    g_bad = 0;
    g_bad_layer = g_bad_tensor = -1;
    return n;
}

// Host scratch for one group's operands: codes and scales of A (na codes, nsa scales) and of B (nb, nsb),
// tiled (b_blocks 0) or blocked (1), a float32 result of nc elements, and the GEMM's own: B decoded (nb
// floats) and a row of N floats per thread.
typedef struct {
    uint8_t *qa, *qb;
    float *sa, *sb, *c, *bt, *p;
} Fp8Scratch;
static Fp8Scratch fp8_scratch(size_t na, size_t nsa, size_t nb, size_t nsb, size_t nc, size_t N) {
    size_t np = (size_t)omp_get_max_threads() * N, fl = nsa + nsb + nc + nb + np,
           bytes = sizeof(float) * fl + na + nb;
    Fp8Scratch s;
    s.sa = (float *)cpu_scratch(bytes);
    s.sb = s.sa + nsa;
    s.c = s.sb + nsb;
    s.bt = s.c + nc;
    s.p = s.bt + nb;
    s.qa = (uint8_t *)(s.p + np);
    s.qb = s.qa + na;
    return s;
}

// cpu_fp8_gemm's result bit for bit, faster (the backend's GEMMs; tests/test_fp8_ops.c holds it to the
// reference): the codes decoded once (exact), B as float32 (K, N) in bt (K N floats of scratch), p (N floats
// per thread) so that the inner loop runs over n, each output's sum in the reference's order: per K-tile t,
// p = the products in increasing k from 0, then c += p * (sa * sb), c from 0.
static void gemm(float *c, const uint8_t *a, const float *sa, const uint8_t *b, const float *sb, int M, int N,
                 int K, int b_blocks, float *bt, float *pbuf) {
    float val[256];
    for (int i = 0; i < 256; i++) val[i] = e4m3_to_f32((uint8_t)i);
    int T = fp8_ntiles(K);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) bt[(size_t)k * N + n] = val[b[(size_t)n * K + k]];
#pragma omp parallel
    {
        float *p = pbuf + (size_t)omp_get_thread_num() * N;
#pragma omp for schedule(static)
        for (int m = 0; m < M; m++) {
            float *cr = c + (size_t)m * N;
            for (int n = 0; n < N; n++) cr[n] = 0.0f;
            for (int t = 0; t < T; t++) {
                for (int n = 0; n < N; n++) p[n] = 0.0f;
                int k1 = (t + 1) * FP8_TILE < K ? (t + 1) * FP8_TILE : K;
                for (int k = t * FP8_TILE; k < k1; k++) {
                    float av = val[a[(size_t)m * K + k]];
                    const float *br = bt + (size_t)k * N;
#pragma omp simd
                    for (int n = 0; n < N; n++) p[n] += av * br[n]; // (lanes: outputs, each in order)
                }
                float s = sa[(size_t)m * T + t];
                for (int n = 0; n < N; n++)
                    cr[n] += p[n] * (s * sb[(size_t)(b_blocks ? n / FP8_TILE : n) * T + t]);
            }
        }
    }
}

// The scratch of each product over a group of n rows (of K and O values); fp8_reserve: of the largest group a
// call over n rows in all can hold (sizes grow with n), taken first, so that a step whose groups split the
// rows differently from earlier steps' allocates nothing (tests/test_alloc.c).
static Fp8Scratch fwd_scratch(int64_t n, int K, int O) {
    return fp8_scratch((size_t)n * K, (size_t)n * fp8_ntiles(K), (size_t)O * K,
                       (size_t)fp8_ntiles(O) * fp8_ntiles(K), 0, O);
}
static Fp8Scratch dinp_scratch(int64_t n, int K, int O) {
    size_t TO = fp8_ntiles(O), wn = (size_t)O * K;
    return fp8_scratch((size_t)n * O, (size_t)n * TO, 2 * wn, 2 * (size_t)fp8_ntiles(K) * TO, (size_t)n * K,
                       K);
}
static Fp8Scratch dw_scratch(int64_t n, int K, int O) {
    size_t TN = fp8_ntiles((int)n);
    return fp8_scratch((size_t)O * n, (size_t)O * TN, (size_t)K * n, (size_t)K * TN, (size_t)O * K, K);
}
static void fp8_reserve(int64_t n, int K, int O, int bwd) {
    if (n <= 0 || K <= 0 || O <= 0) return;
    if (!bwd) fwd_scratch(n, K, O);
    else dinp_scratch(n, K, O), dw_scratch(n, K, O);
}

// dst (+)= src over n floats: added (one float32 addition each) or copied
static void put(float *dst, const float *src, size_t n, int add) {
    if (!add) {
        memcpy(dst, src, sizeof(float) * n);
        return;
    }
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

// out_g = gemm(tiles(inp_g), blocks(W_g)) for every group (tin, tw: the operands' roles)
static void fp8_fwd(float *out, const float *inp, const float *w, const int64_t *off, int G, int K, int O,
                    int tin, int tw) {
    int T = fp8_ntiles(K), BO = fp8_ntiles(O);
    if (G > 0) fp8_reserve(off[G] - off[0], K, O, 0);
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g], n = off[g + 1] - off[g];
        if (n <= 0 || O <= 0) continue;
        if (K <= 0) {
            memset(out + r0 * O, 0, sizeof(float) * (size_t)n * O);
            continue;
        }
        Fp8Scratch s = fwd_scratch(n, K, O);
        note_bad(cpu_fp8_quant_tiles(s.qa, s.sa, inp + r0 * K, (int)n, K), tin, s.sa, (size_t)n * T);
        note_bad(cpu_fp8_quant_blocks(s.qb, s.sb, w + (size_t)g * O * K, O, K), tw, s.sb, (size_t)BO * T);
        gemm(out + r0 * O, s.qa, s.sa, s.qb, s.sb, (int)n, O, K, 1, s.bt, s.p);
    }
}

// dinp_g (+)= gemm(tiles(dout_g), blocks(W_g)^T): W (O,K) quantised by blocks, its codes and block scales
// transposed to the (K,O) operand
static void fp8_dinp(float *dinp, const float *dout, const float *w, int64_t n, int K, int O, int add,
                     int tdout, int tw) {
    int TO = fp8_ntiles(O), BK = fp8_ntiles(K);
    size_t wn = (size_t)O * K;
    Fp8Scratch s = dinp_scratch(n, K, O);
    uint8_t *qw = s.qb + wn;
    float *sw = s.sb + (size_t)BK * TO;
    note_bad(cpu_fp8_quant_tiles(s.qa, s.sa, dout, (int)n, O), tdout, s.sa, (size_t)n * TO);
    note_bad(cpu_fp8_quant_blocks(qw, sw, w, O, K), tw, sw, (size_t)BK * TO);
    for (int o = 0; o < O; o++)
        for (int k = 0; k < K; k++) s.qb[(size_t)k * O + o] = qw[(size_t)o * K + k];
    for (int i = 0; i < TO; i++)
        for (int j = 0; j < BK; j++) s.sb[(size_t)j * TO + i] = sw[(size_t)i * BK + j];
    gemm(s.c, s.qa, s.sa, s.qb, s.sb, (int)n, K, O, 1, s.bt, s.p);
    put(dinp, s.c, (size_t)n * K, add);
}

// dw_g (+)= gemm(tiles_t(dout_g), tiles_t(inp_g)): (O,K), the reduction over the group's n rows; packed
// (GM_DW_BF16, written): each value rounded to nearest even into the bf16 block at pk instead
static void fp8_dw(float *dw, uint16_t *pk, const float *dout, const float *inp, int64_t n, int K, int O,
                   int add, int tdout, int tin) {
    int TN = fp8_ntiles((int)n);
    Fp8Scratch s = dw_scratch(n, K, O);
    note_bad(cpu_fp8_quant_tiles_t(s.qa, s.sa, dout, (int)n, O), tdout, s.sa, (size_t)O * TN);
    note_bad(cpu_fp8_quant_tiles_t(s.qb, s.sb, inp, (int)n, K), tin, s.sb, (size_t)K * TN);
    gemm(s.c, s.qa, s.sa, s.qb, s.sb, O, K, (int)n, 0, s.bt, s.p);
    if (!pk) put(dw, s.c, (size_t)O * K, add);
    else
        for (size_t j = 0; j < (size_t)O * K; j++) pk[j] = bf16_rn_bits(s.c[j]);
}

// grouped_matmul_bwd's contract (ops.h) with the FP8 products; the roles of dout, inp and W
static void fp8_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                    const int64_t *off, int G, int K, int O, int flags, int tdout, int tin, int tw) {
    const char *fe = gm_dw_flags_error(flags);
    CHECK(!fe, "grouped_matmul_bwd: %s", fe);
    int acc_dinp = flags & GM_ACC_DINP, write_dw = flags & GM_DW_WRITE, packed = (flags & GM_DW_BF16) != 0;
    size_t blk = (size_t)(O > 0 ? O : 0) * (K > 0 ? K : 0);
    if (G > 0) fp8_reserve(off[G] - off[0], K, O, 1);
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g], n = off[g + 1] - off[g];
        float *dwg = dw && !packed ? dw + g * blk : NULL;
        uint16_t *pkg = dw && packed ? (uint16_t *)dw + g * blk : NULL; // (ops.h GM_DW_BF16's places)
        if (n <= 0 || K <= 0 || O <= 0) { // empty sums: zeros where written (a bf16 zero is all zero bits)
            if (dw && write_dw && blk) memset(packed ? (void *)pkg : (void *)dwg, 0, (packed ? 2 : 4) * blk);
            if (dinp && n > 0 && K > 0 && !acc_dinp) memset(dinp + r0 * K, 0, sizeof(float) * (size_t)n * K);
            continue;
        }
        if (dinp) fp8_dinp(dinp + r0 * K, dout + r0 * O, w + g * blk, n, K, O, acc_dinp, tdout, tw);
        if (dw) fp8_dw(dwg, pkg, dout + r0 * O, inp + r0 * K, n, K, O, !write_dw, tdout, tin);
    }
    if (dw && (flags & GM_DW_SUMSQ) && G > 0 && blk) // the gradient ledger (ops.h)
        cpu_dw_ledger_add(dw, G, blk, packed);
}

static void fp8_grouped_matmul_fwd(float *out, const float *inp, const float *w, const int64_t *off, int G,
                                   int K, int O) {
    fp8_fwd(out, inp, w, off, G, K, O, FP8T_INP, FP8T_W);
}

static void fp8_grouped_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp,
                                   const float *w, const int64_t *off, int G, int K, int O, int flags) {
    fp8_bwd(dinp, dw, dout, inp, w, off, G, K, O, flags, FP8T_DOUT, FP8T_INP, FP8T_W);
}

// The fused ops: ops/plain.h's compositions, each GEMM with its operands' roles
static void fp8_grouped_swiglu_fwd(void *h1, void *h3, void *act, const void *inp, const float *w1,
                                   const float *w3, const int64_t *off, int G, int K, int O) {
    if (G <= 0) return;
    fp8_fwd((float *)h1, (const float *)inp, w1, off, G, K, O, FP8T_X, FP8T_W1);
    fp8_fwd((float *)h3, (const float *)inp, w3, off, G, K, O, FP8T_X, FP8T_W3);
    size_t b = (size_t)off[0] * O;
    cpu_swiglu_fwd((float *)act + b, (float *)h1 + b, (float *)h3 + b, (size_t)(off[G] - off[0]) * O);
}

static void fp8_grouped_down_fwd(float *out, const void *act, const float *w, const int64_t *off, int G,
                                 int K, int O) {
    fp8_fwd(out, (const float *)act, w, off, G, K, O, FP8T_ACT, FP8T_W2);
}

// dact goes through dh1 (swiglu_bwd reads each element's dout before it writes that dh1), as plain.h's; act
// NULL (--fp8-save, ops.h Backend.fp8_save): computed from h1, h3 into a buffer kept for the process (a step
// after the first allocates nothing)
static void fp8_grouped_swiglu_bwd(void *dh1v, void *dh3v, float *dw, const void *dout, const void *act,
                                   const void *h1, const void *h3, const float *w, const int64_t *off, int G,
                                   int K, int O, int flags) {
    static float *own;
    static size_t cap;
    if (G <= 0) return;
    float *dh1 = (float *)dh1v, *dh3 = (float *)dh3v;
    if (!act) {
        size_t b = (size_t)off[0] * K, n = (size_t)off[G] * K;
        if (n > cap) {
            free(own);
            own = xmalloc(sizeof(float) * n);
            cap = n;
        }
        cpu_swiglu_fwd(own + b, (const float *)h1 + b, (const float *)h3 + b, n - b);
        act = own;
    }
    fp8_bwd(dh1, dw, (const float *)dout, (const float *)act, w, off, G, K, O, flags & GM_DW_FLAGS, FP8T_DY,
            FP8T_ACT, FP8T_W2);
    size_t b = (size_t)off[0] * K;
    cpu_swiglu_bwd(dh1 + b, dh3 + b, dh1 + b, (const float *)h1 + b, (const float *)h3 + b,
                   (size_t)(off[G] - off[0]) * K, 0);
}

static void fp8_grouped_matmul_bwd2(float *dinp, float *dwa, float *dwb, const void *douta, const void *doutb,
                                    const void *inp, const float *wa, const float *wb, const int64_t *off,
                                    int G, int K, int O, int flags) {
    fp8_bwd(dinp, dwa, (const float *)douta, (const float *)inp, wa, off, G, K, O, flags, FP8T_DH1, FP8T_X,
            FP8T_W1);
    fp8_bwd(dinp, dwb, (const float *)doutb, (const float *)inp, wb, off, G, K, O,
            GM_ACC_DINP | (flags & GM_DW_FLAGS), FP8T_DH3, FP8T_X, FP8T_W3);
}

// --fp8-dense: the attention projections' products, each one group of the N rows (ops.h Backend.fp8_dense)
static void fp8_matmul_fwd_multi(int n, float *const *out, const void *inp, const float *const *w, int N,
                                 int K, const int *O, int flags) {
    const int64_t off[2] = {0, N};
    CHECK(!flags, "matmul_fwd_multi (--fp8-dense): flags %d (GM_OUT_HID is not this table's)", flags);
    for (int i = 0; i < n; i++) fp8_fwd(out[i], (const float *)inp, w[i], off, 1, K, O[i], FP8T_AX, FP8T_AW);
}

static void fp8_matmul_bwd_multi(int n, float *dinp, float *const *dw, const float *const *dout,
                                 const void *inp, const float *const *w, int N, int K, const int *O,
                                 int flags) {
    const int64_t off[2] = {0, N};
    for (int i = 0; i < n; i++)
        fp8_bwd(dinp, dw[i], dout[i], (const float *)inp, w[i], off, 1, K, O[i],
                i ? GM_ACC_DINP | (flags & GM_DW_WRITE) : flags, FP8T_AD, FP8T_AX, FP8T_AW);
}

// --fp8-dispatch's rows (ops.h Backend.fp8_rows_*): the hidden format is float32 here
static void fp8_rows_round(void *rows, int n, int d) { cpu_fp8_round_rows((float *)rows, n, d); }
static void fp8_rows_pack(void *packed, const void *rows, int n, int d) {
    cpu_fp8_pack_rows((uint8_t *)packed, (const float *)rows, n, d);
}
static void fp8_rows_unpack(void *rows, const void *packed, int n, int d) {
    cpu_fp8_unpack_rows((float *)rows, (const uint8_t *)packed, n, d);
}

static Backend fp8_table(const char *name) {
    Backend be = *backend_cpu();
    be.name = name;
    be.fp8 = 1;
    be.fp8_site = fp8_site;
    be.fp8_nonfinite = fp8_nonfinite;
    be.fp8_amax = fp8_amax;
    be.fp8_rows_round = fp8_rows_round;
    be.fp8_rows_pack = fp8_rows_pack;
    be.fp8_rows_unpack = fp8_rows_unpack;
    be.fp8_save = 1;
    be.grouped_matmul_fwd = fp8_grouped_matmul_fwd;
    be.grouped_matmul_bwd = fp8_grouped_matmul_bwd;
    be.grouped_swiglu_fwd = fp8_grouped_swiglu_fwd;
    be.grouped_down_fwd = fp8_grouped_down_fwd;
    be.grouped_swiglu_bwd = fp8_grouped_swiglu_bwd;
    be.grouped_matmul_bwd2 = fp8_grouped_matmul_bwd2;
    return be;
}

const Backend *backend_cpu_fp8(void) {
    static Backend be;
    if (!be.name) be = fp8_table("cpu-fp8");
    return &be;
}

const Backend *backend_cpu_fp8_dense(void) {
    static Backend be;
    if (!be.name) {
        be = fp8_table("cpu-fp8-dense");
        be.fp8_dense = 1;
        be.matmul_fwd_multi = fp8_matmul_fwd_multi;
        be.matmul_bwd_multi = fp8_matmul_bwd_multi;
    }
    return &be;
}
