// test_fp8_ops.c — the fp8 backend's grouped expert ops (ops.h Backend.fp8; src/ops/cpu/cpu_fp8_ops.c)
// against the recipe composed here, group by group, from the host reference (cpu_fp8_quant_tiles /
// _blocks, cpu_fp8_gemm) and the float32 SwiGLU (backend_cpu()'s swiglu_fwd / swiglu_bwd), bit for bit.
// The composition takes the other routes where the definition allows one: the activation gradient's
// weight operand is the block quantisation of W^T formed in memory (the op transposes W's codes and block
// scales: equal because a block's scale depends only on its set of values), and the weight gradient's
// operands are the row tiles of dY^T and X^T formed in memory (the op reads them with
// cpu_fp8_quant_tiles_t). Groups of 0, 1, 127 and 129 rows (the last two straddle a 128-row tile), K and N
// not multiples of 128 (200 and 136), rows scaled by powers of two from 2^-20 to 2^20 (other tile scales)
// and an all-zero tile. Also: the fp8 results are not the float32 backend's (the quantisation is on), the
// GM_DW_WRITE / accumulate and GM_ACC_DINP forms, GM_DW_BF16 (each weight gradient the reference's float32
// value rounded to nearest even, packed, nothing else of the buffer written, the ledger's sum that of the
// packed values), the non-finite count with its layer and tensor, and the weight-gradient flags it refuses
// (ops.h gm_dw_flags_error: GM_DW_SUMSQ on an accumulation).
// The amax record (amax_checks). And --fp8-dense's table (dense_checks): the attention projections' products
// by the same recipe.
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "ops/cpu/cpu_fp8.h"
#include "ops/ops.h"
#include "test_util.h"
#include "test_death.h"

#define G 4
static const int64_t OFF[G + 1] = {0, 0, 1, 128, 257}; // groups of 0, 1, 127, 129 rows
#define R 257
#define D 200 // the model width: K of the up projections, N of the down projection
#define FF 136 // the expert width

static void fill(float *x, size_t n, Rng *r, int rows, int cols, int scale_rows) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(rng_uniform(r) * 2.0 - 1.0);
    if (!scale_rows) return;
    for (int i = 0; i < rows; i++) {
        float s = ldexpf(1.0f, (int)rng_below(r, 41) - 20);
        for (int j = 0; j < cols; j++) x[(size_t)i * cols + j] *= s;
    }
}

// Each 128x128 block of the G weights (O,K) scaled by its own power of two: the blocks' scales differ
static void block_scales(float *w, int O, int K) {
    for (int g = 0; g < G; g++)
        for (int i = 0; i < O; i++)
            for (int j = 0; j < K; j++)
                w[((size_t)g * O + i) * K + j] *= ldexpf(1.0f, 3 * (i / 128) - 5 * (j / 128) + g);
}

static void transpose(float *t, const float *x, int rows, int cols) {
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < cols; j++) t[(size_t)j * rows + i] = x[(size_t)i * cols + j];
}

// c (M,N) = the recipe's product of a (M,K) tiled along K and b (N,K), tiled (blocks 0) or blocked (1)
static void ref_gemm(float *c, const float *a, const float *b, int M, int N, int K, int blocks) {
    int T = fp8_ntiles(K);
    uint8_t *qa = xmalloc((size_t)M * K + 1), *qb = xmalloc((size_t)N * K + 1);
    float *sa = xmalloc(sizeof(float) * ((size_t)M * T + 1)),
          *sb = xmalloc(sizeof(float) * ((size_t)N * T + 1));
    cpu_fp8_quant_tiles(qa, sa, a, M, K);
    if (blocks) cpu_fp8_quant_blocks(qb, sb, b, N, K);
    else cpu_fp8_quant_tiles(qb, sb, b, N, K);
    cpu_fp8_gemm(c, qa, sa, qb, sb, M, N, K, blocks);
    free(qa);
    free(qb);
    free(sa);
    free(sb);
}

// The forward of one projection over the groups: out_g = X_g W_g^T
static void ref_fwd(float *out, const float *x, const float *w, int K, int O) {
    for (int g = 0; g < G; g++) {
        int64_t r0 = OFF[g], n = OFF[g + 1] - r0;
        if (n) ref_gemm(out + r0 * O, x + r0 * K, w + (size_t)g * O * K, (int)n, O, K, 1);
    }
}

// dinp_g = dout_g W_g (W^T formed, then blocked); dw_g = dout_g^T inp_g (both transposed, then tiled);
// dinp added into (acc) or written; dw written (write) or added into; over the ng groups of off
static void ref_bwd_groups(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int K,
                           int O, int acc, int write, const int64_t *off, int ng) {
    size_t rows = (size_t)off[ng];
    float *wt = xmalloc(sizeof(float) * O * K), *c = xmalloc(sizeof(float) * rows * (K > O ? K : O) + 4);
    float *ct = xmalloc(sizeof(float) * O * K), *at = xmalloc(sizeof(float) * rows * O),
          *bt = xmalloc(sizeof(float) * rows * K);
    for (int g = 0; g < ng; g++) {
        int64_t r0 = off[g], n = off[g + 1] - r0;
        float *dwg = dw + (size_t)g * O * K;
        if (!n) {
            if (write) memset(dwg, 0, sizeof(float) * O * K);
            continue;
        }
        transpose(wt, w + (size_t)g * O * K, O, K);
        ref_gemm(c, dout + r0 * O, wt, (int)n, K, O, 1);
        for (size_t i = 0; i < (size_t)n * K; i++) dinp[r0 * K + i] = acc ? dinp[r0 * K + i] + c[i] : c[i];
        transpose(at, dout + r0 * O, (int)n, O);
        transpose(bt, inp + r0 * K, (int)n, K);
        ref_gemm(ct, at, bt, O, K, (int)n, 0);
        for (size_t i = 0; i < (size_t)O * K; i++) dwg[i] = write ? ct[i] : dwg[i] + ct[i];
    }
    free(wt);
    free(c);
    free(ct);
    free(at);
    free(bt);
}
static void ref_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int K, int O,
                    int acc, int write) {
    ref_bwd_groups(dinp, dw, dout, inp, w, K, O, acc, write, OFF, G);
}

static void expect_same(const float *a, const float *b, size_t n, const char *what) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, 4) && !bad++) first = i;
    EXPECT(!bad, "%s: %zu of %zu differ from the composed recipe (first at %zu: %.9g vs %.9g)", what, bad, n,
           first, bad ? a[first] : 0.0, bad ? b[first] : 0.0);
}

static double max_rel(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > num) num = d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return den > 0 ? num / den : num;
}

// ops.h gm_dw_flags_error under the FP8 table: no ledger sums of an accumulation (one message, non-zero exit)
static const Backend *g_fp8;
static void die_flags(void *arg) {
    float x[8] = {0}, w[8] = {0}, d[8] = {0}, dw[8] = {0};
    const int64_t off[2] = {0, 2};
    g_fp8->grouped_matmul_bwd(NULL, dw, d, x, w, off, 1, 2, 2, *(const int *)arg);
}

// --fp8-dense (backend_fp8_dense): the attention projections' products (matmul_fwd_multi / matmul_bwd_multi),
// each the recipe's product over one group of all R rows: three products of one input (O 136, 64, 200, K
// 200: q, k, v's shapes), forward and both flag forms of the backward, against the composition; the grouped
// ops the fp8 table's; a non-finite input tile counted once a product, named with the layer and tensor.
static void dense_checks(const Backend *cpu, Rng *r) {
    const Backend *fp8 = backend_fp8(cpu), *dn = backend_fp8_dense(cpu);
    EXPECT(dn->fp8 == 1 && dn->fp8_dense == 1 && fp8->fp8_dense == 0 && backend_fp8_dense(fp8) == dn &&
               backend_fp8_dense(dn) == dn && backend_fp8(dn) == dn,
           "backend_fp8_dense: one table with fp8 and fp8_dense set, from the cpu's or its fp8 table");
    EXPECT(
        dn->grouped_swiglu_fwd == fp8->grouped_swiglu_fwd &&
            dn->grouped_matmul_bwd2 == fp8->grouped_matmul_bwd2 && dn->matmul_fwd == cpu->matmul_fwd &&
            dn->matmul_bwd == cpu->matmul_bwd && fp8->matmul_fwd_multi == cpu->matmul_fwd_multi &&
            dn->matmul_fwd_multi != cpu->matmul_fwd_multi,
        "--fp8-dense changes the projections' products alone (the experts' ops fp8's, matmul_fwd the cpu's)");
    const int O[3] = {FF, 64, D};
    const int64_t one[2] = {0, R};
    float *x = xmalloc(sizeof(float) * R * D), *w[3], *out[3], *e[3], *dout[3], *dw[3], *edw[3];
    fill(x, (size_t)R * D, r, R, D, 1);
    for (int i = 0; i < 3; i++) {
        size_t nw = (size_t)O[i] * D;
        w[i] = xmalloc(sizeof(float) * nw), dw[i] = xmalloc(sizeof(float) * nw);
        edw[i] = xmalloc(sizeof(float) * nw);
        out[i] = xmalloc(sizeof(float) * R * O[i]), e[i] = xmalloc(sizeof(float) * R * O[i]);
        dout[i] = xmalloc(sizeof(float) * R * O[i]);
        fill(w[i], nw, r, 0, 0, 0);
        for (int o = 0; o < O[i]; o++) // (each 128x128 block its own power of two)
            for (int k = 0; k < D; k++)
                w[i][(size_t)o * D + k] *= ldexpf(1.0f, 3 * (o / 128) - 5 * (k / 128));
        fill(dout[i], (size_t)R * O[i], r, R, O[i], 1);
    }
    dn->fp8_site(2);
    dn->matmul_fwd_multi(3, out, x, (const float *const *)w, R, D, O, 0);
    for (int i = 0; i < 3; i++) {
        ref_gemm(e[i], x, w[i], R, O[i], D, 1);
        char what[64];
        snprintf(what, sizeof what, "--fp8-dense matmul_fwd_multi product %d", i);
        expect_same(out[i], e[i], (size_t)R * O[i], what);
    }
    cpu->matmul_fwd_multi(3, e, x, (const float *const *)w, R, D, O, 0);
    double rel = max_rel(out[0], e[0], (size_t)R * O[0]);
    EXPECT(memcmp(out[0], e[0], sizeof(float) * R * O[0]) && rel < 0.1,
           "--fp8-dense: q differs from float32's by a quantisation's worth: max rel %.3g", rel);
    float *dx = xmalloc(sizeof(float) * R * D), *edx = xmalloc(sizeof(float) * R * D);
    for (int form = 0; form < 2; form++) { // 0: dinp and dw written; 1: both added into
        fill(dx, (size_t)R * D, r, 0, 0, 0);
        memcpy(edx, dx, sizeof(float) * R * D);
        for (int i = 0; i < 3; i++) {
            fill(dw[i], (size_t)O[i] * D, r, 0, 0, 0);
            memcpy(edw[i], dw[i], sizeof(float) * O[i] * D);
        }
        dn->matmul_bwd_multi(3, dx, dw, (const float *const *)dout, x, (const float *const *)w, R, D, O,
                             form ? GM_ACC_DINP : GM_DW_WRITE);
        for (int i = 0; i < 3; i++)
            ref_bwd_groups(edx, edw[i], dout[i], x, w[i], D, O[i], form || i > 0, !form, one, 1);
        const char *fn[2] = {"written", "added"};
        char what[80];
        snprintf(what, sizeof what, "--fp8-dense matmul_bwd_multi dinp (%s)", fn[form]);
        expect_same(dx, edx, (size_t)R * D, what);
        for (int i = 0; i < 3; i++) {
            snprintf(what, sizeof what, "--fp8-dense matmul_bwd_multi dw %d (%s)", i, fn[form]);
            expect_same(dw[i], edw[i], (size_t)O[i] * D, what);
        }
    }
    int layer = -2, tensor = -2;
    EXPECT(dn->fp8_nonfinite(&layer, &tensor) == 0, "--fp8-dense, finite operands: nothing counted");
    x[200 * D + 7] = NAN;
    dn->fp8_site(4);
    dn->matmul_fwd_multi(3, out, x, (const float *const *)w, R, D, O, 0);
    int64_t n = dn->fp8_nonfinite(&layer, &tensor);
    EXPECT(n == 3 && layer == 4 && tensor == FP8T_AX,
           "--fp8-dense, a NaN in the input: %lld tiles (want 3: one a product), layer %d, tensor %d (%s)",
           (long long)n, layer, tensor, fp8_tensor_name(tensor));
    for (int i = 0; i < 3; i++) {
        free(w[i]);
        free(dw[i]);
        free(edw[i]);
        free(out[i]);
        free(e[i]);
        free(dout[i]);
    }
    free(x);
    free(dx);
    free(edx);
}

// fp8_amax (ops.h): each (layer, tensor)'s largest scale exponent since the last read, derived by hand
// from the scale rule (numerics.h: the smallest k with amax / 2^k <= 448). The input's values |x| <= 3
// (k -7: 3 / 2^-7 = 384) but row 5's second tile holds 448 * 2^3 (k 3), and row 9's first tile a NaN beside
// 2^40 (no scale: it takes no part, else k 32); the weight's |w| <= 0.25 but one -0.5 (0.5 / 2^-9 = 256 <=
// 448 < 0.5 / 2^-10: k -9). The tensors the op did not quantise and the layers not named read
// FP8_AMAX_NONE, a second read finds nothing, the ops before any fp8_site land in row 0, and an all-zero
// input reads FP8_SCALE_EXP_MIN (quantised, scale 2^-100), not FP8_AMAX_NONE.
static void amax_checks(const Backend *be) {
    enum { N = 130, K = 136, O = 8, ROWS = 3 };
    const int64_t off[2] = {0, N};
    float *x = xmalloc(sizeof(float) * N * K), *w = xmalloc(sizeof(float) * O * K),
          *y = xmalloc(sizeof(float) * N * O);
    for (size_t i = 0; i < (size_t)N * K; i++) x[i] = (float)((int)(i % 7) - 3);
    x[(size_t)5 * K + 130] = 448.0f * 8.0f;
    x[(size_t)9 * K + 2] = NAN;
    x[(size_t)9 * K + 3] = ldexpf(1.0f, 40);
    for (size_t i = 0; i < (size_t)O * K; i++) w[i] = 0.25f * (float)((int)(i % 3) - 1);
    w[(size_t)O * K - 1] = -0.5f;
    int k[ROWS * FP8T_N], layer, tensor;
    be->fp8_nonfinite(&layer, &tensor); // (the earlier checks' counts and record drained)
    be->fp8_amax(k, ROWS);
    be->fp8_site(1);
    be->grouped_matmul_fwd(y, x, w, off, 1, K, O);
    be->fp8_amax(k, ROWS);
    int others = 0;
    for (int i = 0; i < ROWS * FP8T_N; i++)
        others += i != 2 * FP8T_N + FP8T_INP && i != 2 * FP8T_N + FP8T_W && k[i] != FP8_AMAX_NONE;
    EXPECT(k[2 * FP8T_N + FP8T_INP] == 3 && k[2 * FP8T_N + FP8T_W] == -9 && !others,
           "fp8_amax after layer 1's forward: input %d (want 3), weight %d (want -9), %d others set (want 0)",
           k[2 * FP8T_N + FP8T_INP], k[2 * FP8T_N + FP8T_W], others);
    EXPECT(be->fp8_nonfinite(&layer, &tensor) == 1 && layer == 1 && tensor == FP8T_INP,
           "the NaN tile is counted as non-finite (layer %d tensor %d)", layer, tensor);
    be->fp8_amax(k, ROWS);
    others = 0;
    for (int i = 0; i < ROWS * FP8T_N; i++) others += k[i] != FP8_AMAX_NONE;
    EXPECT(!others, "fp8_amax starts again after a read: %d set (want 0)", others);
    x[(size_t)9 * K + 2] = 0.0f;
    be->fp8_site(-1);
    be->grouped_matmul_fwd(y, x, w, off, 1, K, O);
    be->fp8_amax(k, 1);
    EXPECT(k[FP8T_INP] == 32 && k[FP8T_W] == -9,
           "row 0 (no layer named): input %d (want 32: 2^40's tile, finite now), weight %d (want -9)",
           k[FP8T_INP], k[FP8T_W]);
    memset(x, 0, sizeof(float) * N * K);
    be->grouped_matmul_fwd(y, x, w, off, 1, K, O);
    be->fp8_amax(k, 1);
    EXPECT(k[FP8T_INP] == FP8_SCALE_EXP_MIN, "an all-zero input: %d (want %d, the scale floor)", k[FP8T_INP],
           FP8_SCALE_EXP_MIN);
    free(x);
    free(w);
    free(y);
}

// --fp8-dense on a backend without such a table (any but the cpu's, cuda's and cuda-fp32's: the profiled cpu)
static void die_dense(void *arg) { backend_fp8_dense(backend_profiled(backend_cpu())); }

int main(void) {
    const Backend *cpu = backend_cpu(), *be = backend_fp8(cpu);
    expect_death_msg("--fp8-dense on a backend without its table", die_dense, NULL,
                     "--fp8-dense: the backend cpu has no FP8 table with the attention projections",
                     "cuda-fp32 have", 1);
    g_fp8 = be;
    int sq = GM_DW_SUMSQ;
    expect_death_msg("fp8 ledger of an accumulation", die_flags, &sq, "GM_DW_SUMSQ without GM_DW_WRITE",
                     "not accumulations", 1);
    EXPECT(be->fp8 == 1 && cpu->fp8 == 0 && be->fp8_site && be->fp8_nonfinite && !cpu->fp8_nonfinite,
           "the fp8 table sets fp8 and its counters; the cpu's does not");
    Rng r;
    rng_seed(&r, 38);
    size_t nw = (size_t)G * FF * D;
    float *x = xmalloc(sizeof(float) * R * D), *w1 = xmalloc(sizeof(float) * nw),
          *w3 = xmalloc(sizeof(float) * nw), *w2 = xmalloc(sizeof(float) * nw),
          *dy = xmalloc(sizeof(float) * R * D);
    fill(x, (size_t)R * D, &r, R, D, 1);
    memset(x + 5 * D + 128, 0, sizeof(float) * (D - 128)); // row 5's second tile: all zeros
    fill(w1, nw, &r, 0, 0, 0);
    fill(w3, nw, &r, 0, 0, 0);
    fill(w2, nw, &r, 0, 0, 0);
    block_scales(w1, FF, D);
    block_scales(w3, FF, D);
    block_scales(w2, D, FF);
    fill(dy, (size_t)R * D, &r, R, D, 1);
    float *h1 = xmalloc(sizeof(float) * R * FF), *h3 = xmalloc(sizeof(float) * R * FF),
          *act = xmalloc(sizeof(float) * R * FF), *y = xmalloc(sizeof(float) * R * D);
    float *e1 = xmalloc(sizeof(float) * R * FF), *e3 = xmalloc(sizeof(float) * R * FF),
          *ea = xmalloc(sizeof(float) * R * FF), *ey = xmalloc(sizeof(float) * R * D);

    // ---- forward: the up projections with the SwiGLU, and the down projection
    be->fp8_site(7);
    be->grouped_swiglu_fwd(h1, h3, act, x, w1, w3, OFF, G, D, FF);
    be->grouped_down_fwd(y, act, w2, OFF, G, FF, D);
    ref_fwd(e1, x, w1, D, FF);
    ref_fwd(e3, x, w3, D, FF);
    cpu->swiglu_fwd(ea, e1, e3, (size_t)R * FF);
    ref_fwd(ey, ea, w2, FF, D);
    expect_same(h1, e1, (size_t)R * FF, "grouped_swiglu_fwd h1");
    expect_same(h3, e3, (size_t)R * FF, "grouped_swiglu_fwd h3");
    expect_same(act, ea, (size_t)R * FF, "grouped_swiglu_fwd act");
    expect_same(y, ey, (size_t)R * D, "grouped_down_fwd");
    float *f1 = xmalloc(sizeof(float) * R * FF);
    cpu->grouped_matmul_fwd(f1, x, w1, OFF, G, D, FF);
    double rel = max_rel(h1, f1, (size_t)R * FF);
    EXPECT(memcmp(h1, f1, sizeof(float) * R * FF) && rel < 0.1,
           "h1 differs from float32's by a quantisation's worth: max rel %.3g", rel);
    int layer = -2, tensor = -2;
    EXPECT(be->fp8_nonfinite(&layer, &tensor) == 0 && layer == -1 && tensor == -1,
           "finite operands: nothing counted (layer %d tensor %d)", layer, tensor);

    // ---- backward, with each flag form: the down projection into the SwiGLU, then bwd2 into the input
    float *gw2 = xmalloc(sizeof(float) * nw), *egw2 = xmalloc(sizeof(float) * nw),
          *gw1 = xmalloc(sizeof(float) * nw), *egw1 = xmalloc(sizeof(float) * nw),
          *gw3 = xmalloc(sizeof(float) * nw), *egw3 = xmalloc(sizeof(float) * nw);
    float *dh1 = xmalloc(sizeof(float) * R * FF), *dh3 = xmalloc(sizeof(float) * R * FF),
          *edh1 = xmalloc(sizeof(float) * R * FF), *edh3 = xmalloc(sizeof(float) * R * FF),
          *dact = xmalloc(sizeof(float) * R * FF), *dx = xmalloc(sizeof(float) * R * D),
          *edx = xmalloc(sizeof(float) * R * D);
    for (int form = 0; form < 3; form++) { // 0: dw written, dinp written; 1: dw added, dinp added; 2: as 0,
                                           // dw packed bf16 (and the ledger's sum)
        int dwf = form == 1 ? 0 : form == 2 ? GM_DW_WRITE | GM_DW_BF16 | GM_DW_SUMSQ : GM_DW_WRITE;
        fill(gw2, nw, &r, 0, 0, 0);
        fill(gw1, nw, &r, 0, 0, 0);
        fill(gw3, nw, &r, 0, 0, 0);
        fill(dx, (size_t)R * D, &r, 0, 0, 0);
        memcpy(egw2, gw2, sizeof(float) * nw);
        memcpy(egw1, gw1, sizeof(float) * nw);
        memcpy(egw3, gw3, sizeof(float) * nw);
        memcpy(edx, dx, sizeof(float) * R * D);
        double ledger = 0, want = 0;
        char *keep = xmalloc(6 * nw); // (form 2: the float32 buffers' second halves, which it must not write)
        float *gws[3] = {gw2, gw1, gw3};
        for (int t = 0; t < 3; t++) memcpy(keep + 2 * nw * t, (char *)gws[t] + 2 * nw, 2 * nw);
        if (form == 2) be->dw_sumsq_take(&ledger); // (empties it)
        be->grouped_swiglu_bwd(dh1, dh3, gw2, dy, act, h1, h3, w2, OFF, G, FF, D, dwf);
        be->grouped_matmul_bwd2(dx, gw1, gw3, dh1, dh3, x, w1, w3, OFF, G, D, FF,
                                dwf | (form == 1 ? GM_ACC_DINP : 0));
        int add = form == 1;
        ref_bwd(dact, egw2, dy, ea, w2, FF, D, 0, !add);
        cpu->swiglu_bwd(edh1, edh3, dact, e1, e3, (size_t)R * FF, 0);
        ref_bwd(edx, egw1, edh1, x, w1, D, FF, add, !add);
        ref_bwd(edx, egw3, edh3, x, w3, D, FF, 1, !add);
        if (form ==
            2) { // the packed bits are the reference's rounded; the float32 bytes after them untouched
            float *ref[3] = {egw2, egw1, egw3};
            const char *nm[3] = {"dw2", "dw1", "dw3"};
            for (int t = 0; t < 3; t++) {
                const uint16_t *pk = (const uint16_t *)gws[t];
                size_t bad = 0, first = 0;
                for (size_t i = 0; i < nw; i++) {
                    uint16_t e = bf16_rn_bits(ref[t][i]);
                    if (pk[i] != e && !bad++) first = i;
                    float v = bf16_to_f32(pk[i]);
                    want += (double)v * v;
                }
                EXPECT(!bad,
                       "GM_DW_BF16 %s: %zu of %zu packed values are not the float32 result rounded "
                       "(first at %zu)",
                       nm[t], bad, nw, first);
                EXPECT(!memcmp(keep + 2 * nw * t, (char *)gws[t] + 2 * nw, 2 * nw),
                       "GM_DW_BF16 %s: the bytes after the packed values were written", nm[t]);
            }
            double n2 = 0;
            int blocks = be->dw_sumsq_take(&n2);
            EXPECT(blocks == 3 * G && fabs(n2 - want) <= 1e-12 * want,
                   "GM_DW_BF16 | GM_DW_SUMSQ: the ledger holds %d blocks summing %.17g (want %d blocks, the "
                   "packed values' %.17g)",
                   blocks, n2, 3 * G, want);
        }
        free(keep);
        if (form == 2) continue;
        char what[64];
        const char *fn[2] = {"written", "added"};
        snprintf(what, sizeof what, "grouped_swiglu_bwd dw2 (%s)", fn[form]);
        expect_same(gw2, egw2, nw, what);
        expect_same(dh1, edh1, (size_t)R * FF, "grouped_swiglu_bwd dh1");
        expect_same(dh3, edh3, (size_t)R * FF, "grouped_swiglu_bwd dh3");
        snprintf(what, sizeof what, "grouped_matmul_bwd2 dinp (%s)", fn[form]);
        expect_same(dx, edx, (size_t)R * D, what);
        snprintf(what, sizeof what, "grouped_matmul_bwd2 dw1 (%s)", fn[form]);
        expect_same(gw1, egw1, nw, what);
        snprintf(what, sizeof what, "grouped_matmul_bwd2 dw3 (%s)", fn[form]);
        expect_same(gw3, egw3, nw, what);
        if (!form) {
            int zero = 1;
            for (size_t i = 0; i < (size_t)FF * D; i++) zero &= gw1[i] == 0 && gw2[i] == 0;
            EXPECT(zero, "GM_DW_WRITE: the group without rows has zero weight gradients");
        }
    }
    EXPECT(be->fp8_nonfinite(&layer, &tensor) == 0, "finite operands in backward: nothing counted");

    // ---- non-finite tiles and blocks: counted, the first one's layer and tensor named, the count reset
    float keep = x[130 * D + 3];
    x[130 * D + 3] = INFINITY; // one tile of the 129-row group
    be->fp8_site(3);
    be->grouped_swiglu_fwd(h1, h3, act, x, w1, w3, OFF, G, D, FF);
    int64_t n = be->fp8_nonfinite(&layer, &tensor);
    EXPECT(n == 2 && layer == 3 && tensor == FP8T_X,
           "an inf in x: %lld tiles (want 2: h1's and h3's), layer %d "
           "tensor %d",
           (long long)n, layer, tensor);
    x[130 * D + 3] = keep;
    be->grouped_swiglu_fwd(h1, h3, act, x, w1, w3, OFF, G, D, FF); // (act finite again)
    EXPECT(be->fp8_nonfinite(&layer, &tensor) == 0, "the count is reset by its read");
    w2[(size_t)FF * D * 3 + 5] = NAN; // a block of the last group's down weight
    be->fp8_site(0);
    be->grouped_down_fwd(y, act, w2, OFF, G, FF, D);
    n = be->fp8_nonfinite(&layer, &tensor);
    EXPECT(n == 1 && layer == 0 && tensor == FP8T_W2, "a NaN in w2: %lld blocks, layer %d tensor %d (%s)",
           (long long)n, layer, tensor, fp8_tensor_name(tensor));

    free(x);
    free(w1);
    free(w3);
    free(w2);
    free(dy);
    free(h1);
    free(h3);
    free(act);
    free(y);
    free(e1);
    free(e3);
    free(ea);
    free(ey);
    free(f1);
    free(gw2);
    free(egw2);
    free(gw1);
    free(egw1);
    free(gw3);
    free(egw3);
    free(dh1);
    free(dh3);
    free(edh1);
    free(edh3);
    free(dact);
    free(dx);
    free(edx);
    amax_checks(be);
    dense_checks(cpu, &r);
    return test_done("test_fp8_ops");
}
