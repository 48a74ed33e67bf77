// test_cuda_fp8_ops.c — the CUDA backends' FP8 tables (src/ops/cuda/cuda_fp8_ops.cu) against the cpu's
// (cpu_fp8_ops.c, held to the recipe composed from the host reference by test_fp8_ops.c), on the same
// inputs: groups of 0, 1, 127, 129 and 300 rows, rows scaled by powers of two (other tile scales), per-block
// weight scales; K, N multiples of 16 (our Hopper kernel runs) and not (the reference kernel runs).
//   MOE_FP8_GEMM=ref (the program runs itself so): "cuda-fp32-fp8"'s grouped GEMMs (forward; backward with
//     GM_DW_WRITE and with accumulation, GM_ACC_DINP), the down projection and grouped_matmul_bwd2 equal the
//     cpu's bit for bit (the same quantisers bit for bit, the same sums in the same order); the two ops with
//     the SwiGLU inside within 1e-6 per element (expf's last bits, test_cuda_ops's BAND_ELEM).
//   our kernel: the same ops norm-wise within 4e-3 of the cpu's, per element within 2^-5 of the output's
//     largest magnitude. Why: the kernel sums each 128-deep K-tile in the tensor cores' own order and
//     accumulator (about 13-14 significant bits, DeepSeek-V3 section 3.3: the products are exact, the
//     partial sums round at ~2^-13 relative), so a tile's sum moves by ~2^-13 of its terms' magnitude: over
//     the outputs ~1e-4 norm-wise; a wrong scale, index or tile is O(1) and a truncating conversion ~1e-2.
//   "cuda-fp8" (bf16 hidden rows) within the same bands: every op gets bf16-representable inputs (both
//     tables read the same numbers) and its bf16 outputs (h1, act, dh1) carry one rounding (2^-9 relative).
//   Each op is judged alone on the same host inputs (chained, a bf16 rounding upstream moves ~3% of the next
//   quantisation's codes by one e4m3 step (2^-9 against a code spacing of 2^-3): ~1-2% norm-wise, measured on
//   the H200: an effect of the bf16 rows, not of the kernels).
// Also: --fp8-dense's tables (the attention projections' products, run_dense) against the cpu's the same way;
// the non-finite count names the layer and tensor; --fp8-dispatch's rows (rows_check) bit for bit the cpu's;
// --fp8-save's grouped_swiglu_bwd with act NULL (computed from h1, h3) against the cpu's within the kernel's
// bands (a bf16 table's dw2 against the cpu's on its act rounded to bf16, as that table rounds it); the
// weight gradients packed as bf16 (GM_DW_BF16: swiglu_bwd's dw2, bwd2's dw1) as the float32 ones. Skips
// (exit 77) without a GPU.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "ops/cpu/cpu_fp8.h"
#include "ops/numerics.h"
#include "ops/ops.h"

static int fails, checks;

typedef struct {
    int G, K, O;
    int64_t off[8];
} Shape;

static void fill(float *x, size_t n, Rng *r, int rows, int cols) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(rng_uniform(r) * 2.0 - 1.0);
    for (int i = 0; i < rows; i++) {
        float s = ldexpf(1.0f, (int)rng_below(r, 21) - 10);
        for (int j = 0; j < cols; j++) x[(size_t)i * cols + j] *= s;
    }
}
static void block_scale(float *w, int G, int O, int K) {
    for (int g = 0; g < G; g++)
        for (int i = 0; i < O; i++)
            for (int j = 0; j < K; j++)
                w[((size_t)g * O + i) * K + j] *= ldexpf(1.0f, 2 * (i / 128) - 3 * (j / 128) + g % 3);
}

// device buffer of `be` holding n floats of h, in float32 or (hid 1 and be's rows bf16) bf16
static void *up(const Backend *be, const float *h, size_t n, int hid) {
    int bf = hid && be->hid == FMT_BF16;
    void *d = be->alloc(n * (bf ? 2 : 4) + 4);
    if (bf) {
        uint16_t *b = xmalloc(n * 2 + 2);
        for (size_t i = 0; i < n; i++) b[i] = bf16_rn_bits(h[i]);
        be->to_device(d, b, n * 2);
        free(b);
    } else be->to_device(d, h, n * 4);
    return d;
}
static float *down(const Backend *be, const void *d, size_t n, int hid) {
    int bf = hid && be->hid == FMT_BF16;
    float *h = xmalloc(n * 4 + 4);
    if (bf) {
        uint16_t *b = xmalloc(n * 2 + 2);
        be->to_host(b, d, n * 2);
        for (size_t i = 0; i < n; i++) h[i] = bf16_to_f32(b[i]);
        free(b);
    } else be->to_host(h, d, n * 4);
    return h;
}
// A packed weight gradient (ops.h GM_DW_BF16: n bf16 values from d's first byte), widened
static float *down_packed(const Backend *be, const void *d, size_t n) {
    uint16_t *b = xmalloc(n * 2 + 2);
    float *h = xmalloc(n * 4 + 4);
    be->to_host(b, d, n * 2);
    for (size_t i = 0; i < n; i++) h[i] = bf16_to_f32(b[i]);
    free(b);
    return h;
}

// mode 0: bitwise; 1: within `elem` of each element (relative to |ref| + rms(ref)); 2: norm-wise within
// `norm` and per element within `elem` of the largest |ref|
static void cmp(const char *what, const char *be, const float *got, const float *ref, size_t n, int mode,
                double norm, double elem) {
    checks++;
    double num = 0, den = 0, worst = 0, mx = 0;
    size_t wi = 0;
    double rms = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i])), rms += (double)ref[i] * ref[i];
    rms = n ? sqrt(rms / n) : 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (isnan(got[i]) != isnan(ref[i])) d = INFINITY;
        num += d * d, den += (double)ref[i] * ref[i];
        // (mode 1: test_cuda_ops's measure, relative to |ref| + the tensor's rms: an element that underflows
        // to 0 on one side, ~1e-33 on the other, is no difference at the tensor's scale)
        double e = mode == 0 ? (memcmp(&got[i], &ref[i], 4) ? 1 : 0)
            : mode == 1      ? (d > 0 ? d / (fabs(ref[i]) + rms) : 0)
                             : (d > 0 ? d / mx : 0);
        if (e > worst) worst = e, wi = i;
    }
    double nw = den > 0 ? sqrt(num / den) : sqrt(num);
    int bad = mode == 0 ? worst > 0 : (worst > elem || (mode == 2 && nw > norm));
    printf("%s %-28s %-14s norm-wise %.2e, worst %.2e (element %zu: %.9g vs %.9g)\n", bad ? "FAIL" : "ok  ",
           what, be, nw, worst, wi, n ? got[wi] : 0.0, n ? ref[wi] : 0.0);
    fails += bad;
}

// Every op gets the same host inputs on both backends (bf16-representable values where a table reads its
// rows in bf16, so both read the same numbers), none another op's output: each op is judged alone.
static void run_shape(const Shape *s, const Backend *gb, int mode, double norm, double elem, Rng *r) {
    const Backend *cb = backend_fp8(backend_cpu());
    int G = s->G, K = s->K, O = s->O;
    size_t R = (size_t)s->off[G], nx = R * K, ny = R * O, nw = (size_t)G * O * K;
    enum { X, DY, ACT, H1, H3, DXO, DH1, DH3, W1, W3, W2, SEED, NIN };
    size_t len_in[NIN] = {nx, ny, ny, ny, ny, nx, ny, ny, nw, nw, nw, nw > nx ? nw : nx};
    float *in[NIN];
    for (int i = 0; i < NIN; i++) {
        in[i] = xmalloc(len_in[i] * 4 + 4);
        int rows = i == X || i == DXO ? (int)R : i < W1 ? (int)R : 0, cols = i == X || i == DXO ? K : O;
        fill(in[i], len_in[i], r, i < W1 ? rows : 0, cols);
        if (i < W1) // the rows: bf16-representable (the bf16 table's hidden rows are read as they are)
            for (size_t j = 0; j < len_in[i]; j++) in[i][j] = bf16_to_f32(bf16_rn_bits(in[i][j]));
    }
    block_scale(in[W1], G, O, K), block_scale(in[W3], G, O, K), block_scale(in[W2], G, K, O);
    const Backend *be[2] = {cb, gb};
    float *res[2][17];
    int nres = 0, kmax[2][FP8T_N];
    for (int b = 0; b < 2; b++) {
        const Backend *e = be[b];
        e->fp8_site(-1);
        e->fp8_amax(kmax[b], 1); // (drains what earlier calls left)
        int hx = b == 1; // the fused ops' rows in the table's hidden format
        void *d[NIN];
        for (int i = 0; i < NIN; i++)
            d[i] = up(e, in[i], len_in[i], hx && i != DY && i < W1 && i != X ? 1 : 0);
        void *xh = up(e, in[X], nx, hx);
        float *out = e->alloc(ny * 4 + 4), *dinp = e->alloc(nx * 4 + 4), *gw = e->alloc(nw * 4 + 4),
              *o2 = e->alloc(nx * 4 + 4);
        void *h1 = e->alloc(ny * 4 + 4), *h3 = e->alloc(ny * 4 + 4), *act = e->alloc(ny * 4 + 4),
             *dh1 = e->alloc(ny * 4 + 4), *dh3 = e->alloc(ny * 4 + 4);
        int k = 0;
        // the plain grouped GEMMs (float32 rows): forward; backward written, then accumulated onto seeds
        e->grouped_matmul_fwd(out, d[X], d[W1], s->off, G, K, O);
        res[b][k++] = down(e, out, ny, 0);
        e->grouped_matmul_bwd(dinp, gw, d[DY], d[X], d[W1], s->off, G, K, O, GM_DW_WRITE);
        res[b][k++] = down(e, dinp, nx, 0);
        res[b][k++] = down(e, gw, nw, 0);
        e->to_device(dinp, in[SEED], nx * 4), e->to_device(gw, in[SEED], nw * 4);
        e->grouped_matmul_bwd(dinp, gw, d[DY], d[X], d[W1], s->off, G, K, O, GM_ACC_DINP);
        res[b][k++] = down(e, dinp, nx, 0);
        res[b][k++] = down(e, gw, nw, 0);
        // the fused ops, each on the host inputs: up projection with SwiGLU (h1 and act), down projection,
        // its backward into the SwiGLU (dw2, dh1), the up projections' backward (dinp, dw1)
        e->grouped_swiglu_fwd(h1, h3, act, xh, d[W1], d[W3], s->off, G, K, O);
        res[b][k++] = down(e, h1, ny, hx);
        res[b][k++] = down(e, act, ny, hx);
        e->grouped_down_fwd(o2, d[ACT], d[W2], s->off, G, O, K);
        res[b][k++] = down(e, o2, nx, 0);
        e->grouped_swiglu_bwd(dh1, dh3, gw, d[DXO], d[ACT], d[H1], d[H3], d[W2], s->off, G, O, K,
                              GM_DW_WRITE);
        res[b][k++] = down(e, gw, nw, 0);
        res[b][k++] = down(e, dh1, ny, hx);
        e->grouped_matmul_bwd2(dinp, gw, NULL, d[DH1], d[DH3], xh, d[W1], d[W3], s->off, G, K, O,
                               GM_DW_WRITE);
        res[b][k++] = down(e, dinp, nx, 0);
        res[b][k++] = down(e, gw, nw, 0);
        // --fp8-save's call (ops.h Backend.fp8_save): act NULL, computed by each table from the h1, h3 given
        e->grouped_swiglu_bwd(dh1, dh3, gw, d[DXO], NULL, d[H1], d[H3], d[W2], s->off, G, O, K, GM_DW_WRITE);
        res[b][k++] = down(e, gw, nw, 0);
        res[b][k++] = down(e, dh1, ny, hx);
        // GM_DW_BF16 (--bf16-grads under fp8-bf16: the weight gradients packed as bf16 values)
        e->grouped_swiglu_bwd(dh1, dh3, gw, d[DXO], d[ACT], d[H1], d[H3], d[W2], s->off, G, O, K,
                              GM_DW_WRITE | GM_DW_BF16);
        res[b][k++] = down_packed(e, gw, nw);
        e->grouped_matmul_bwd2(dinp, gw, NULL, d[DH1], d[DH3], xh, d[W1], d[W3], s->off, G, K, O,
                               GM_DW_WRITE | GM_DW_BF16);
        res[b][k++] = down_packed(e, gw, nw);
        nres = k;
        if (b == 0) { // (the bf16 table's reference for dw2 act NULL: the cpu's on act rounded once to bf16)
            float *ar = xmalloc(ny * 4 + 4);
            e->swiglu_fwd(ar, in[H1], in[H3], ny);
            for (size_t j = 0; j < ny; j++) ar[j] = bf16_to_f32(bf16_rn_bits(ar[j]));
            void *ard = up(e, ar, ny, 0);
            e->grouped_swiglu_bwd(dh1, dh3, gw, d[DXO], ard, d[H1], d[H3], d[W2], s->off, G, O, K,
                                  GM_DW_WRITE);
            res[0][nres] = down(e, gw, nw, 0);
            e->free(ard);
            free(ar);
        }
        e->fp8_amax(kmax[b], 1);
        for (int i = 0; i < NIN; i++) e->free(d[i]);
        void *all[] = {xh, out, dinp, gw, o2, h1, h3, act, dh1, dh3};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) e->free(all[i]);
    }
    static const char *name[] = {"fwd",
                                 "bwd dinp (write)",
                                 "bwd dw (write)",
                                 "bwd dinp (acc)",
                                 "bwd dw (acc)",
                                 "swiglu_fwd h1",
                                 "swiglu_fwd act",
                                 "down_fwd",
                                 "swiglu_bwd dw2",
                                 "swiglu_bwd dh1",
                                 "bwd2 dinp",
                                 "bwd2 dw1",
                                 "swiglu_bwd dw2 act NULL",
                                 "swiglu_bwd dh1 act NULL",
                                 "swiglu_bwd dw2 (packed bf16)",
                                 "bwd2 dw1 (packed bf16)"};
    size_t len[] = {ny, nx, nw, nx, nw, ny, ny, nx, nw, ny, nx, nw, nw, ny, nw, nw};
    char tag[64];
    snprintf(tag, sizeof tag, "%s K%d O%d", gb->name, K, O);
    for (int i = 0; i < nres; i++) {
        // in the bitwise mode the SwiGLU's own outputs carry expf's last bits (test_cuda_ops's BAND_ELEM,
        // relative to |ref| + the rms); everything else is the same operations in the same order
        int m = mode;
        double eb = elem;
        if (mode == 0 && (i == 6 || i == 9 || i == 13)) m = 1, eb = 1e-6;
        // act computed on each side (expf's last bits), so the kernel mode's bands; a bf16 table rounds its
        // act to bf16 before the FP8 quantisation (one e4m3 step in a few percent of the codes against the
        // cpu's float32 act: 8.4e-3 and 1.6e-2 norm-wise on an H100, 2026-12-05), so its reference is the
        // cpu's on act rounded so
        const float *ref = res[0][i];
        if (i == 12) m = 2, eb = 0.03125, ref = gb->hid == FMT_BF16 ? res[0][nres] : ref;
        cmp(name[i], tag, res[1][i], ref, len[i], m, norm, eb);
    }
    // every operand each op quantised is one of the host inputs (the fused ops' own stashes are not taken
    // here): the largest scale exponent of each tensor the same on both tables (ops.h Backend.fp8_amax)
    for (int t = 0; t < FP8T_N; t++) {
        checks++;
        if (kmax[0][t] != kmax[1][t])
            fails++,
                printf("FAIL fp8_amax %s %s: gpu %d cpu %d\n", tag, fp8_tensor_name(t), kmax[1][t],
                       kmax[0][t]);
    }
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < nres; i++) free(res[b][i]);
    free(res[0][nres]);
    for (int i = 0; i < NIN; i++) free(in[i]);
}

// --fp8-dense: the attention projections' products (matmul_fwd_multi: three of one input, xn in the table's
// hidden format; matmul_bwd_multi written and accumulated onto seeds) on the GPU's dense table against the
// cpu's, judged as run_shape judges the grouped ops (N rows, K, the three products' O).
static void run_dense(const Backend *gb, int N, int K, const int *O, int mode, double norm, double elem,
                      Rng *r) {
    const Backend *be[2] = {backend_fp8_dense(backend_cpu()), gb};
    size_t nx = (size_t)N * K, no[3], nw[3];
    float *x = xmalloc(nx * 4 + 4), *seed = xmalloc(nx * 4 + 4), *w[3], *dy[3], *res[2][12];
    fill(x, nx, r, N, K);
    for (size_t j = 0; j < nx; j++) x[j] = bf16_to_f32(bf16_rn_bits(x[j])); // (read as they are in bf16)
    fill(seed, nx, r, 0, K);
    for (int i = 0; i < 3; i++) {
        no[i] = (size_t)N * O[i], nw[i] = (size_t)O[i] * K;
        w[i] = xmalloc(nw[i] * 4 + 4), dy[i] = xmalloc(no[i] * 4 + 4);
        fill(w[i], nw[i], r, 0, K);
        block_scale(w[i], 1, O[i], K);
        fill(dy[i], no[i], r, N, O[i]);
    }
    int nres = 0;
    for (int b = 0; b < 2; b++) {
        const Backend *e = be[b];
        void *xh = up(e, x, nx, b == 1);
        float *wd[3], *dyd[3], *out[3], *gw[3], *dinp = e->alloc(nx * 4 + 4);
        for (int i = 0; i < 3; i++) {
            wd[i] = (float *)up(e, w[i], nw[i], 0);
            dyd[i] = (float *)up(e, dy[i], no[i], 0);
            out[i] = e->alloc(no[i] * 4 + 4);
            gw[i] = e->alloc(nw[i] * 4 + 4);
        }
        int k = 0;
        e->fp8_site(1);
        e->matmul_fwd_multi(3, out, xh, (const float *const *)wd, N, K, O, 0);
        for (int i = 0; i < 3; i++) res[b][k++] = down(e, out[i], no[i], 0);
        e->matmul_bwd_multi(3, dinp, gw, (const float *const *)dyd, xh, (const float *const *)wd, N, K, O,
                            GM_DW_WRITE);
        res[b][k++] = down(e, dinp, nx, 0);
        for (int i = 0; i < 3; i++) res[b][k++] = down(e, gw[i], nw[i], 0);
        e->to_device(dinp, seed, nx * 4);
        for (int i = 0; i < 3; i++) e->to_device(gw[i], seed, nw[i] * 4 < nx * 4 ? nw[i] * 4 : nx * 4);
        e->matmul_bwd_multi(3, dinp, gw, (const float *const *)dyd, xh, (const float *const *)wd, N, K, O,
                            GM_ACC_DINP);
        res[b][k++] = down(e, dinp, nx, 0);
        res[b][k++] = down(e, gw[0], nw[0], 0);
        nres = k;
        e->free(xh), e->free(dinp);
        for (int i = 0; i < 3; i++) e->free(wd[i]), e->free(dyd[i]), e->free(out[i]), e->free(gw[i]);
    }
    static const char *name[] = {"dense fwd q",
                                 "dense fwd k",
                                 "dense fwd v",
                                 "dense bwd dinp (write)",
                                 "dense bwd dw q (write)",
                                 "dense bwd dw k (write)",
                                 "dense bwd dw v (write)",
                                 "dense bwd dinp (acc)",
                                 "dense bwd dw q (acc)"};
    size_t len[] = {no[0], no[1], no[2], nx, nw[0], nw[1], nw[2], nx, nw[0]};
    char tag[64];
    snprintf(tag, sizeof tag, "%s N%d K%d", gb->name, N, K);
    for (int i = 0; i < nres; i++) cmp(name[i], tag, res[1][i], res[0][i], len[i], mode, norm, elem);
    for (int b = 0; b < 2; b++)
        for (int i = 0; i < nres; i++) free(res[b][i]);
    for (int i = 0; i < 3; i++) free(w[i]), free(dy[i]);
    free(x), free(seed);
}

// the non-finite report: an infinity in one expert's weight names its layer and tensor
static void nonfinite(const Backend *gb) {
    Shape s = {2, 128, 128, {0, 130, 260}};
    size_t n = (size_t)s.G * 128 * 128;
    float *w = xcalloc(n, 4), *x = xcalloc(260 * 128, 4);
    w[5] = INFINITY;
    void *dw = up(gb, w, n, 0), *dx = up(gb, x, 260 * 128, 0);
    float *out = gb->alloc(260 * 128 * 4);
    int layer = -9, tensor = -9;
    gb->fp8_nonfinite(&layer, &tensor); // drains earlier counts
    gb->fp8_site(3);
    gb->grouped_matmul_fwd(out, dx, dw, s.off, s.G, 128, 128);
    int64_t c = gb->fp8_nonfinite(&layer, &tensor);
    checks++;
    int bad = c != 1 || layer != 3 || tensor != FP8T_W;
    printf("%s non-finite report %s: %lld groups, layer %d, tensor %s\n", bad ? "FAIL" : "ok  ", gb->name,
           (long long)c, layer, fp8_tensor_name(tensor));
    fails += bad;
    c = gb->fp8_nonfinite(&layer, &tensor);
    checks++;
    if (c) printf("FAIL the count was not reset (%lld)\n", (long long)c), fails++;
    gb->free(dw), gb->free(dx), gb->free(out);
    free(w), free(x);
}

// --fp8-dispatch's rows (ops.h Backend.fp8_rows_*, cuda_fp8.h): pack, round and unpack on the table's hidden
// rows, bit for bit the cpu reference's on the same values (as the hidden format holds them); rows scaled
// from 2^-20 to 2^20, a NaN tile, an all-zero row
static void rows_check(const Backend *gb, int d, Rng *r) {
    const int n = 37;
    size_t nd = (size_t)n * d, rb = fp8_row_bytes(d);
    float *x = xmalloc(4 * nd);
    for (size_t i = 0; i < nd; i++)
        x[i] = (float)(rng_uniform(r) * 2 - 1) * ldexpf(1.0f, (int)(i / d % 41) - 20);
    x[2 * (size_t)d - 1] = NAN; // row 1's last tile
    memset(x + 2 * (size_t)d, 0, 4 * (size_t)d); // row 2
    void *dx = up(gb, x, nd, 1), *dy = up(gb, x, nd, 1), *dp = gb->alloc(rb * n);
    float *xh = down(gb, dx, nd, 1), *rw = xmalloc(4 * nd);
    uint8_t *want = xmalloc(rb * n), *got = xmalloc(rb * n);
    cpu_fp8_pack_rows(want, xh, n, d);
    memcpy(rw, xh, 4 * nd);
    cpu_fp8_round_rows(rw, n, d);
    gb->fp8_rows_pack(dp, dx, n, d);
    gb->to_host(got, dp, rb * n);
    gb->fp8_rows_round(dx, n, d);
    gb->fp8_rows_unpack(dy, dp, n, d);
    float *rg = down(gb, dx, nd, 1), *ug = down(gb, dy, nd, 1);
    size_t br = 0, bu = 0;
    for (size_t i = 0; i < nd; i++) {
        br += !(f32_bits(rg[i]) == f32_bits(rw[i]) || (isnan(rg[i]) && isnan(rw[i])));
        bu += !(f32_bits(ug[i]) == f32_bits(rw[i]) || (isnan(ug[i]) && isnan(rw[i])));
    }
    int bad = memcmp(got, want, rb * n) || br || bu;
    checks++;
    fails += bad;
    printf("%s rows %-22s d %3d: packed bytes %s, round %zu and unpack %zu values off the cpu's\n",
           bad ? "FAIL" : "ok  ", gb->name, d, memcmp(got, want, rb * n) ? "differ" : "equal", br, bu);
    gb->free(dx), gb->free(dy), gb->free(dp);
    free(x), free(xh), free(rw), free(want), free(got), free(rg), free(ug);
}

int main(int argc, char **argv) {
    (void)argc;
    if (!backend_cuda_available()) {
        printf("skip: no GPU\n");
        return 77;
    }
    const char *mode = getenv("MOE_FP8_GEMM");
    int ref = mode && !strcmp(mode, "ref");
    Shape sh[] = {{5, 256, 144, {0, 0, 1, 128, 257, 557}}, {3, 100, 72, {0, 129, 129, 429}}};
    Rng r;
    rng_seed(&r, 7);
    for (int i = 0; i < 2; i++) {
        run_shape(&sh[i], backend_cuda_fp8(1, 0), ref ? 0 : 2, 4e-3, 0.03125, &r);
        run_shape(&sh[i], backend_cuda_fp8(0, 0), 2, 4e-3, 0.03125, &r);
    }
    const int OD[2][3] = {{256, 128, 144}, {72, 40, 100}}, ND[2] = {300, 129}, KD[2] = {256, 100};
    for (int i = 0; i < 2; i++) {
        run_dense(backend_cuda_fp8(1, 1), ND[i], KD[i], OD[i], ref ? 0 : 2, 4e-3, 0.03125, &r);
        run_dense(backend_cuda_fp8(0, 1), ND[i], KD[i], OD[i], 2, 4e-3, 0.03125, &r);
    }
    nonfinite(backend_cuda_fp8(1, 0));
    for (int hb = 0; hb < 2; hb++)
        for (int i = 0; i < 3; i++) rows_check(backend_cuda_fp8(1 - hb, 0), (int[]){129, 300, 64}[i], &r);
    printf("%s: %d checks, %d failed\n", ref ? "MOE_FP8_GEMM=ref" : "kernel", checks, fails);
    if (!ref) { // the bitwise half: the reference GEMM in the cpu's order
        char cmd[4200];
        snprintf(cmd, sizeof cmd, "MOE_FP8_GEMM=ref '%s'", argv[0]);
        int rc = system(cmd);
        if (rc != 0) fails++;
    }
    return fails ? 1 : 0;
}
