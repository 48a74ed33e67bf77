// test_cuda_fp8_gemm.c — the FP8 grouped GEMMs on Hopper (src/ops/cuda/cuda_grouped_fp8.cu) against the
// host reference cpu_fp8_gemm (ops/cpu/cpu_fp8.h), group by group, on operands quantised by the host
// quantisers. Skips (77) without a GPU or without the kernel (a build without CUDA, a GPU that is not
// sm_90); on an sm_90 GPU the kernel must be there. MOE_FP8_CASE=n runs case n alone (the device script
// runs each case in its own process, so that one crash hides nothing); MOE_FP8_CASE=count prints the count.
//
// Bounds. Both sides sum the same terms: an e4m3 x e4m3 product has at most 8 significant bits, so it is
// exact in float32 on both; the scales are powers of two, so p * (sa * sb) is exact, and the promotion
// r += p * (sa * sb) runs in the same order on both sides. What differs is the sum p of one K-tile's 128
// products: the reference adds them one by one in float32 (error <= 127 * 2^-24 * S_t, S_t the sum of
// their magnitudes), the tensor cores in their own order and with FP8 wgmma's limited accumulation
// precision (DeepSeek-V3 report 3.3: about 14 bits kept). Model: an accumulation step aligns its terms
// (products and the running sum, at most 33 of them for a k32 step, 132 alignments over a K-tile) to the
// largest and keeps 13 bits below it, so each term loses less than 2^-13 of a magnitude <= S_t: at most
// 132 * 2^-13 = 0.0161 < 2^-5 of S_t (the emulation of that model on the host, sums truncated toward zero,
// gave worst ratios of 5e-4 on these cases: the bound has room for a coarser accumulator). Then the float32
// result r takes T rounded additions on each side (<= 2 T 2^-24 S). Per output element, with S = sum over t
// of (sa sb) S_t (cpu_fp8_gemm of the codes' magnitudes):
//   |gpu - ref| <= (2^-5 + (127 + 2 T) 2^-24) * S                                            (bound_tc)
// (the measured worst ratio is printed, for a later tightening). A wrong scale or index is O(1) of a tile's
// p, caught there and below; the bound is checked to fail on a reference with rotated scales.
// Exact cases (bound 0): codes v * 128, |v| <= 2 integers, every tile's or block's largest exactly 2 * 2^e
// (so the scale is 2^(e-7)), e in [-2, 2]: products are multiples of 2^14 below 2^17, a K-tile's partial sums
// multiples of 2^14 below 2^23 (9 significant bits: exact with 13 kept bits, in any order), and the
// dequantised result multiples of 2^-4 below 2^16 (20 bits: every float32 addition exact). Any difference is
// a bug. bf16 output: the bits of bf16_rn_bits of the float32 output of the same call (round to nearest
// even). The weight gradient's packed bf16 output (beta 0, ops.h GM_DW_BF16): the same bits of the float32
// output's, in the first half of the buffer's bytes (the rest not written), the ledger's sum that of the
// packed values.
#include <math.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "ops/cpu/cpu_fp8.h"
#include "ops/numerics.h"
#include "ops/ops.h"
#include "test_util.h"
#ifdef MOE_HAVE_CUDA // the whole test: a build without CUDA only skips
#include <cuda_runtime_api.h>
#include "ops/cuda/cuda_grouped_fp8.h"

static Rng R;
static const Backend *gpu;

// x (rows, cols) in scale groups of br rows x 128 columns (br 1: tiles; 128: blocks); exact 0: normal values
// times 2^e per group, e in [-4, 4]; exact 1: v 2^e, v in {-2..2}, the group's first element +-2 2^e,
// e in [-2, 2] (see the top)
static void fill(float *x, int rows, int cols, int br, int exact) {
    for (int i0 = 0; i0 < rows; i0 += br)
        for (int j0 = 0; j0 < cols; j0 += FP8_TILE) {
            float sc =
                exact ? ldexpf(1.0f, (int)rng_below(&R, 5) - 2) : ldexpf(1.0f, (int)rng_below(&R, 9) - 4);
            for (int i = i0; i < rows && i < i0 + br; i++)
                for (int j = j0; j < cols && j < j0 + FP8_TILE; j++) {
                    float v = exact ? (float)((int)rng_below(&R, 5) - 2) : rng_normal(&R);
                    if (exact && i == i0 && j == j0) v = rng_below(&R, 2) ? 2.0f : -2.0f;
                    x[(size_t)i * cols + j] = v * sc;
                }
        }
}

static void *dput(const void *h, size_t bytes) {
    void *d = gpu->alloc(bytes ? bytes : 16);
    if (bytes) gpu->to_device(d, h, bytes);
    return d;
}

// the magnitudes of e4m3 codes (sign bit cleared; NaN codes are never written here)
static uint8_t *abs_codes(const uint8_t *q, size_t n) {
    uint8_t *a = xmalloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) a[i] = q[i] & 0x7fu;
    return a;
}

// got against ref (n = rows x cols) within e * S per element (S: the reference of the magnitudes; e 0:
// exact, bits); prints the first mismatch with its row and column and the worst |got - ref| / S.
// Returns the mismatches.
static long compare(const char *what, const float *got, const float *ref, const float *S, size_t rows,
                    int cols, double e) {
    long bad = 0;
    double worst = 0.0;
    for (size_t i = 0; i < rows * (size_t)cols; i++) {
        double d = fabs((double)got[i] - (double)ref[i]), b = e * (double)S[i];
        int ok = e > 0 ? d <= b : (f32_bits(got[i]) == f32_bits(ref[i]));
        if (S[i] > 0 && d / S[i] > worst) worst = d / S[i];
        if (!ok && bad++ == 0)
            printf("  %s: first mismatch at row %zu col %zu: gpu %.9g cpu %.9g |diff| %.3g bound %.3g\n",
                   what, i / cols, i % cols, got[i], ref[i], d, b);
    }
    printf("  %s: %zu x %d, worst |gpu - cpu| / S %.3g, %ld beyond the bound\n", what, rows, cols, worst,
           bad);
    return bad;
}

static double bound_tc(int K) { return ldexp(1.0, -5) + (127.0 + 2.0 * fp8_ntiles(K)) * ldexp(1.0, -24); }

typedef struct {
    int G;
    const int *rows; // rows of each group
    int K, N, b_blocks, exact, beta, bf16;
} RowsCase;

// The rows-grouped GEMM: C = A . B_g^T per group (beta 1: C starts random and the result is added).
static void run_rows(const char *name, RowsCase c) {
    int G = c.G, K = c.K, N = c.N, TK = fp8_ntiles(K), TN = fp8_ntiles(N);
    int64_t off[65];
    off[0] = 0;
    for (int g = 0; g < G; g++) off[g + 1] = off[g] + c.rows[g];
    size_t M = (size_t)off[G], nb = (size_t)G * N;
    float *x = xmalloc((M ? M : 1) * K * sizeof(float)), *w = xmalloc(nb * K * sizeof(float));
    fill(x, (int)M, K, 1, c.exact);
    size_t nsb = c.b_blocks ? (size_t)G * TN * TK : nb * TK;
    uint8_t *qa = xmalloc(M * K + 1), *qb = xmalloc(nb * K);
    float *sa = xmalloc((M * TK + 1) * sizeof(float)), *sb = xmalloc(nsb * sizeof(float));
    cpu_fp8_quant_tiles(qa, sa, x, (int)M, K);
    for (int g = 0; g < G; g++) { // each group's weight on its own (blocks never span two groups)
        float *wg = w + (size_t)g * N * K;
        fill(wg, N, K, c.b_blocks ? FP8_TILE : 1, c.exact);
        if (c.b_blocks) cpu_fp8_quant_blocks(qb + (size_t)g * N * K, sb + (size_t)g * TN * TK, wg, N, K);
        else cpu_fp8_quant_tiles(qb + (size_t)g * N * K, sb + (size_t)g * N * TK, wg, N, K);
    }
    // the reference, per group, of the codes and of their magnitudes
    uint8_t *aa = abs_codes(qa, M * K), *ab = abs_codes(qb, nb * K);
    float *ref = xcalloc(M * N + 1, sizeof(float)), *S = xcalloc(M * N + 1, sizeof(float)),
          *c0 = xmalloc((M * N + 1) * sizeof(float));
    for (int g = 0; g < G; g++) {
        size_t o = (size_t)off[g];
        const float *sbg = sb + (c.b_blocks ? (size_t)g * TN * TK : (size_t)g * N * TK);
        cpu_fp8_gemm(ref + o * N, qa + o * K, sa + o * TK, qb + (size_t)g * N * K, sbg, c.rows[g], N, K,
                     c.b_blocks);
        cpu_fp8_gemm(S + o * N, aa + o * K, sa + o * TK, ab + (size_t)g * N * K, sbg, c.rows[g], N, K,
                     c.b_blocks);
    }
    for (size_t i = 0; i < M * N; i++) { // beta 1: a random C; beta 0: NaN, so an unwritten element fails
        c0[i] = c.beta ? rng_normal(&R) : NAN;
        if (c.beta) ref[i] = c0[i] + ref[i];
    }
    void *dA = dput(qa, M * K), *dB = dput(qb, nb * K), *dsa = dput(sa, M * TK * sizeof(float)),
         *dsb = dput(sb, nsb * sizeof(float)), *dC = dput(c0, M * N * sizeof(float));
    float *got = xmalloc((M * N + 1) * sizeof(float));
    printf("%s: G %d, rows", name, G);
    for (int g = 0; g < G; g++) printf(" %d", c.rows[g]);
    printf(", K %d, N %d, B %s, beta %d%s%s\n", K, N, c.b_blocks ? "blocks" : "tiles", c.beta,
           c.exact ? ", exact" : "", c.bf16 ? ", bf16 output too" : "");
    int ran = cuda_fp8_grouped_gemm(dC, 0, (float)c.beta, dA, dsa, dB, dsb, c.b_blocks, off, G, K, N);
    EXPECT(ran, "%s: the kernel refused the call", name);
    if (ran) {
        gpu->to_host(got, dC, M * N * sizeof(float));
        long bad = compare(name, got, ref, S, M, N, c.exact ? 0.0 : bound_tc(K));
        EXPECT(bad == 0, "%s: %ld elements beyond the bound", name, bad);
    }
    if (ran && c.bf16) { // the bf16 form: the float32 result rounded to nearest even, bit for bit
        uint16_t *hb = xmalloc((M * N + 1) * 2);
        memset(hb, 0xff, M * N * 2); // NaN
        void *dCb = dput(hb, M * N * 2);
        EXPECT(cuda_fp8_grouped_gemm(dCb, 1, 0.0f, dA, dsa, dB, dsb, c.b_blocks, off, G, K, N), "%s: bf16",
               name);
        gpu->to_host(hb, dCb, M * N * 2);
        long bad = 0;
        for (size_t i = 0; i < M * N; i++)
            if (hb[i] != bf16_rn_bits(got[i]) && bad++ == 0)
                printf("  %s bf16: first mismatch at row %zu col %zu: 0x%04x, want 0x%04x\n", name, i / N,
                       i % N, hb[i], bf16_rn_bits(got[i]));
        printf("  %s bf16: %ld of %zu differ from the float32 output rounded\n", name, bad, M * N);
        EXPECT(bad == 0, "%s: bf16 output", name);
        gpu->free(dCb);
        free(hb);
    }
    if (ran && !c.exact && !c.beta && K > FP8_TILE) {
        // the comparison can fail: a reference whose scales are taken from the next K-tile (a wrong scale
        // index) is far outside the bound, for A's scales and for B's
        float *sw = xmalloc((M * TK + nsb + 1) * sizeof(float)), *wrong = xcalloc(M * N + 1, sizeof(float));
        for (int which = 0; which < 2; which++) {
            size_t ns = which ? nsb : M * TK;
            const float *s0 = which ? sb : sa;
            for (size_t i = 0; i < ns; i++) sw[i] = s0[i - i % TK + (i % TK + 1) % TK];
            for (int g = 0; g < G; g++) {
                size_t o = (size_t)off[g], bo = c.b_blocks ? (size_t)g * TN * TK : (size_t)g * N * TK;
                cpu_fp8_gemm(wrong + o * N, qa + o * K, (which ? sa : sw) + o * TK, qb + (size_t)g * N * K,
                             (which ? sw : sb) + bo, c.rows[g], N, K, c.b_blocks);
            }
            long bad = compare(which ? "(wrong B scale index)" : "(wrong A scale index)", got, wrong, S, M, N,
                               bound_tc(K));
            EXPECT(bad > 0, "%s: a reference with rotated %s scales passed the comparison", name,
                   which ? "B" : "A");
        }
        free(sw);
        free(wrong);
    }
    gpu->free(dA);
    gpu->free(dB);
    gpu->free(dsa);
    gpu->free(dsb);
    gpu->free(dC);
    free(x), free(w), free(qa), free(qb), free(sa), free(sb), free(aa), free(ab), free(ref), free(S),
        free(c0), free(got);
}

// The reduction-grouped GEMM (weight gradients): dW_g (N, K) = dY_g^T X_g, dY_g (m_g, N), X_g (m_g, K),
// quantised as the transposed tiling of each group's rows placed at p[g] (the rows padded to multiples of
// 128 with zero codes).
static void run_dw(const char *name, int G, const int *rows, int N, int K, int exact, int beta) {
    int64_t p[65];
    p[0] = 0;
    for (int g = 0; g < G; g++) p[g + 1] = p[g] + (int64_t)fp8_ntiles(rows[g]) * FP8_TILE;
    size_t Mp = (size_t)p[G], TM = Mp / FP8_TILE, nc = (size_t)G * N * K;
    uint8_t *qa = xcalloc(N * Mp + 1, 1), *qb = xcalloc(K * Mp + 1, 1);
    float *sa = xcalloc(N * TM + 1, sizeof(float)), *sb = xcalloc(K * TM + 1, sizeof(float));
    float *ref = xcalloc(nc, sizeof(float)), *S = xcalloc(nc, sizeof(float)),
          *c0 = xmalloc(nc * sizeof(float)), *got = xmalloc(nc * sizeof(float));
    for (int g = 0; g < G; g++) {
        int m = rows[g], T = fp8_ntiles(m);
        if (!m) continue;
        float *dy = xmalloc((size_t)m * N * sizeof(float)), *x = xmalloc((size_t)m * K * sizeof(float));
        // scale groups of the transposed tiling: 128 rows of one column (fill's groups are along rows, so
        // fill the transposes and transpose back)
        float *t1 = xmalloc((size_t)m * N * sizeof(float)), *t2 = xmalloc((size_t)m * K * sizeof(float));
        fill(t1, N, m, 1, exact);
        fill(t2, K, m, 1, exact);
        for (int i = 0; i < m; i++) {
            for (int j = 0; j < N; j++) dy[(size_t)i * N + j] = t1[(size_t)j * m + i];
            for (int j = 0; j < K; j++) x[(size_t)i * K + j] = t2[(size_t)j * m + i];
        }
        uint8_t *ga = xmalloc((size_t)N * m), *gb = xmalloc((size_t)K * m);
        float *gsa = xmalloc((size_t)N * T * sizeof(float)), *gsb = xmalloc((size_t)K * T * sizeof(float));
        cpu_fp8_quant_tiles_t(ga, gsa, dy, m, N);
        cpu_fp8_quant_tiles_t(gb, gsb, x, m, K);
        uint8_t *aa = abs_codes(ga, (size_t)N * m), *ab = abs_codes(gb, (size_t)K * m);
        cpu_fp8_gemm(ref + (size_t)g * N * K, ga, gsa, gb, gsb, N, K, m, 0);
        cpu_fp8_gemm(S + (size_t)g * N * K, aa, gsa, ab, gsb, N, K, m, 0);
        size_t c0l = (size_t)p[g], t0 = c0l / FP8_TILE;
        for (int n = 0; n < N; n++) {
            memcpy(qa + (size_t)n * Mp + c0l, ga + (size_t)n * m, m);
            memcpy(sa + (size_t)n * TM + t0, gsa + (size_t)n * T, T * sizeof(float));
        }
        for (int k = 0; k < K; k++) {
            memcpy(qb + (size_t)k * Mp + c0l, gb + (size_t)k * m, m);
            memcpy(sb + (size_t)k * TM + t0, gsb + (size_t)k * T, T * sizeof(float));
        }
        free(dy), free(x), free(t1), free(t2), free(ga), free(gb), free(gsa), free(gsb), free(aa), free(ab);
    }
    for (size_t i = 0; i < nc; i++) {
        c0[i] = beta ? rng_normal(&R) : NAN;
        if (beta) ref[i] = c0[i] + ref[i];
    }
    printf("%s: dW, G %d, rows", name, G);
    for (int g = 0; g < G; g++) printf(" %d", rows[g]);
    printf(", N %d, K %d, beta %d%s\n", N, K, beta, exact ? ", exact" : "");
    void *dA = dput(qa, N * Mp), *dB = dput(qb, K * Mp), *dsa = dput(sa, N * TM * sizeof(float)),
         *dsb = dput(sb, K * TM * sizeof(float)), *dC = dput(c0, nc * sizeof(float));
    // (beta 0: the gradient ledger too, ops.h GM_DW_SUMSQ: G blocks, the stored values' sum of squares to the
    // kernel's float sums of 32 squares)
    gpu->dw_sumsq_take(NULL);
    int ran = cuda_fp8_grouped_gemm_dw(dC, (float)beta, 0, !beta, dA, dsa, dB, dsb, p, G, N, K);
    EXPECT(ran, "%s: the kernel refused the call", name);
    if (ran) {
        gpu->to_host(got, dC, nc * sizeof(float));
        int maxr = 1;
        for (int g = 0; g < G; g++) maxr = rows[g] > maxr ? rows[g] : maxr;
        long bad = compare(name, got, ref, S, (size_t)G * N, K, exact ? 0.0 : bound_tc(maxr));
        EXPECT(bad == 0, "%s: %ld elements beyond the bound", name, bad);
        double led = -1, hs = 0;
        int blocks = gpu->dw_sumsq_take(&led);
        for (size_t i = 0; i < nc; i++) hs += (double)got[i] * got[i];
        EXPECT(beta || (blocks == G && fabs(led - hs) <= 4e-6 * hs),
               "%s: the ledger holds %d blocks (%d written), sum %.17g against the stored values' %.17g",
               name, blocks, G, led, hs);
        if (!beta) { // packed: into a buffer of NaN bits (0xffff halves), then its bits against got's rounded
            uint16_t *pk = xmalloc(nc * sizeof(float));
            memset(pk, 0xff, nc * sizeof(float));
            gpu->to_device(dC, pk, nc * sizeof(float));
            EXPECT(cuda_fp8_grouped_gemm_dw(dC, 0.0f, 1, 1, dA, dsa, dB, dsb, p, G, N, K),
                   "%s: the kernel refused the packed call", name);
            gpu->to_host(pk, dC, nc * sizeof(float));
            size_t wrong = 0, first = 0, kept = 0;
            double ps = 0;
            for (size_t i = 0; i < nc; i++) {
                if (pk[i] != bf16_rn_bits(got[i]) && !wrong++) first = i;
                ps += (double)bf16_to_f32(pk[i]) * bf16_to_f32(pk[i]);
            }
            for (size_t i = nc; i < 2 * nc; i++) kept += pk[i] == 0xffff;
            EXPECT(!wrong,
                   "%s packed: %zu of %zu values are not the float32 output rounded (first %zu: %04x, "
                   "want %04x)",
                   name, wrong, nc, first, pk[first], bf16_rn_bits(got[first]));
            EXPECT(kept == nc, "%s packed: %zu of the %zu halves after the packed values were written", name,
                   nc - kept, nc);
            blocks = gpu->dw_sumsq_take(&led);
            EXPECT(blocks == G && fabs(led - ps) <= 4e-6 * ps,
                   "%s packed: the ledger holds %d blocks (%d written), sum %.17g against the packed values' "
                   "%.17g",
                   name, blocks, G, led, ps);
            free(pk);
        }
    }
    gpu->free(dA);
    gpu->free(dB);
    gpu->free(dsa);
    gpu->free(dsb);
    gpu->free(dC);
    free(qa), free(qb), free(sa), free(sb), free(ref), free(S), free(c0), free(got);
}

static const int R1a[] = {129}, R1b[] = {1}, R1c[] = {300}, R8[] = {0, 1, 127, 129, 300, 0, 64, 200},
                 RD1[] = {700}, RD4[] = {0, 1, 129, 700}, RD8[] = {129, 0, 700, 1, 0, 256, 5, 128};

// the cases; n: the case to run (-1: all, -2: none); returns the count. Each case draws from the seed plus
// its number, so that it sees the same operands alone or in the whole run.
static int cases(int n, uint64_t seed) {
    int i = 0;
#define CASE(call) \
    do { \
        rng_seed(&R, seed + (uint64_t)i); \
        if (n == -1 || n == i) call; \
        i++; \
    } while (0)
    CASE(run_rows("rows-1", (RowsCase){1, R1a, 128, 128, 1, 0, 0, 0}));
    CASE(run_rows("rows-2", (RowsCase){1, R1b, 144, 144, 1, 0, 0, 0}));
    CASE(run_rows("rows-3", (RowsCase){1, R1c, 256, 512, 0, 0, 0, 1}));
    CASE(run_rows("rows-4", (RowsCase){8, R8, 1024, 512, 1, 0, 0, 1}));
    CASE(run_rows("rows-5", (RowsCase){8, R8, 144, 144, 0, 0, 0, 0}));
    CASE(run_rows("rows-6", (RowsCase){8, R8, 256, 128, 1, 0, 1, 0}));
    CASE(run_rows("rows-7", (RowsCase){8, R8, 1024, 144, 0, 0, 1, 0}));
    CASE(run_rows("rows-8", (RowsCase){8, R8, 128, 512, 0, 0, 0, 0}));
    CASE(run_rows("rows-9", (RowsCase){8, R8, 256, 384, 1, 0, 0, 1})); // (a lone half-tile of 128 columns)
    CASE(run_rows("exact-1", (RowsCase){1, R1a, 128, 128, 1, 1, 0, 0}));
    CASE(run_rows("exact-2", (RowsCase){8, R8, 1024, 512, 1, 1, 0, 0}));
    CASE(run_rows("exact-3", (RowsCase){8, R8, 144, 144, 0, 1, 1, 0}));
    CASE(run_dw("dw-1", 1, RD1, 512, 144, 0, 0));
    CASE(run_dw("dw-2", 4, RD4, 144, 1024, 0, 0));
    CASE(run_dw("dw-3", 4, RD4, 512, 256, 0, 1));
    CASE(run_dw("dw-4", 8, RD8, 128, 144, 0, 0));
    CASE(run_dw("dw-5", 4, RD4, 144, 384, 0, 0)); // (a lone half-tile of 128 columns)
    CASE(run_dw("exact-dw", 4, RD4, 144, 512, 1, 0));
#undef CASE
    return i;
}

int main(void) {
    if (!backend_cuda_available()) TEST_SKIP("no CUDA GPU: backend_cuda_available() = 0");
    const char *only = getenv("MOE_FP8_CASE");
    if (only && !strcmp(only, "count")) {
        printf("%d\n", cases(-2, 0));
        return 0;
    }
    gpu = backend_cuda();
    int d = 0, major = 0, minor = 0;
    if (cudaGetDevice(&d) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d) ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d))
        DIE("cannot read the GPU's compute capability");
    if (!cuda_fp8_grouped_kernel()) {
        // an sm_90 GPU must run it (else every check below would silently be skipped)
        EXPECT(major * 10 + minor != 90, "sm_90 GPU but the fp8 kernel is not available (no sm_90a code?)");
        if (t_failures) return test_done("test_cuda_fp8_gemm");
        TEST_SKIP("the fp8 kernel needs an sm_90 GPU and sm_90a code (device %d.%d)", major, minor);
    }
    const char *seed = getenv("MOE_TEST_SEED"); // other random operands: MOE_TEST_SEED=n
    cases(only && *only ? atoi(only) : -1, seed && *seed ? strtoull(seed, NULL, 10) : 20261203);
    return test_done("test_cuda_fp8_gemm");
}
#else
int main(void) { TEST_SKIP("a build without CUDA"); }
#endif
