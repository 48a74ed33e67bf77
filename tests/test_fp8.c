// test_fp8.c — the FP8 (e4m3) element format and scale rule (ops/numerics.h) and the host reference of
// fine-grained quantisation and the FP8 GEMM (ops/cpu/cpu_fp8.c), against references written here from
// the definitions only: a code's value from its sign, exponent and mantissa fields; rounding as "the
// nearest value of that table, ties to the even code, beyond 448 saturated"; a tile's scale as the
// smallest power of two 2^k with amax <= 448 * 2^k (k clamped to [-100, 119]).
//
// GEMM tolerance: the reference sums the (exact) products of one 128-tile in float32 (at most 127
// roundings), scales exactly (powers of two) and sums the T tiles in float32 (T - 1 roundings), so by the
// standard bound |c - exact| <= gamma_d * sum |a_k b_k| with d = min(K, 128) + T and gamma_d = d u / (1 -
// d u), u = 2^-24; the float64 product here adds at most K 2^-53 of the same magnitude. A wrong tile or
// block scale moves a tile's contribution by a factor of at least 2: far outside (checked, below).
//
// `test_fp8 --encode IN OUT` writes e4m3_rn_bits of IN's float32 values (raw, little-endian) to OUT, for
// tests/fp8_ref.py's comparison with ml_dtypes.
#include <float.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "ops/numerics.h"
#include "ops/cpu/cpu_fp8.h"
#include "test_util.h"

static double VAL[256]; // VAL[c]: the value of code c from the format's definition (NaN for 0x7f, 0xff)

static double def_value(int c) {
    int s = c >> 7, e = (c >> 3) & 15, m = c & 7;
    double v = e == 15 && m == 7 ? NAN : e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10); // (1 + m/8) 2^(e-7)
    return s ? -v : v;
}

// The code nearest to x (ties: the even code), saturated to +-448; NaN -> 0x7f (the canonical NaN).
static int ref_encode(double x) {
    int sign = signbit(x) ? 0x80 : 0;
    if (isnan(x)) return 0x7f;
    double a = fabs(x);
    if (a >= 448.0) return sign | 0x7e;
    int lo = 0, hi = 0x7e; // codes 0..0x7e: the non-negative finite values in increasing order (checked)
    while (lo < hi) { // the first code whose value is >= a
        int mid = (lo + hi) / 2;
        if (VAL[mid] < a) lo = mid + 1;
        else hi = mid;
    }
    if (VAL[hi] == a || hi == 0) return sign | hi;
    double dlo = a - VAL[hi - 1], dhi = VAL[hi] - a;
    int c = dlo < dhi ? hi - 1 : dhi < dlo ? hi : (hi % 2 == 0 ? hi : hi - 1);
    return sign | c;
}

// The smallest k with amax <= 448 * 2^k, clamped: by exact comparisons in double.
static int ref_scale_exp(double amax) {
    int k = FP8_SCALE_EXP_MIN;
    while (k < FP8_SCALE_EXP_MAX && amax > ldexp(448.0, k)) k++;
    return k;
}

static int same_float(float a, double b) {
    if (isnan(b)) return isnan(a) && !signbit(a) == !signbit(b);
    return a == b && !signbit(a) == !signbit(b);
}

static void test_format(void) {
    for (int c = 0; c < 256; c++) VAL[c] = def_value(c);
    for (int c = 0; c < 256; c++)
        EXPECT(same_float(e4m3_to_f32((uint8_t)c), VAL[c]), "decode 0x%02x: %g vs %g", c,
               e4m3_to_f32((uint8_t)c), VAL[c]);
    for (int c = 0; c < 0x7e; c++) EXPECT(VAL[c] < VAL[c + 1], "codes not increasing at 0x%02x", c);
    // the format's landmarks (OCP FP8 E4M3)
    EXPECT(e4m3_to_f32(0x7e) == 448.0f && e4m3_to_f32(0xfe) == -448.0f, "max finite");
    EXPECT(e4m3_to_f32(0x38) == 1.0f && e4m3_to_f32(0x08) == 0x1p-6f && e4m3_to_f32(0x01) == 0x1p-9f,
           "1, 2^-6, 2^-9");
    EXPECT(e4m3_to_f32(0x77) == 240.0f && e4m3_to_f32(0x07) == 7 * 0x1p-9f, "240, largest subnormal");
    EXPECT(isnan(e4m3_to_f32(0x7f)) && isnan(e4m3_to_f32(0xff)), "NaN codes");
    for (int c = 0; c < 256; c++)
        if ((c & 0x7f) != 0x7f)
            EXPECT(e4m3_rn_bits(e4m3_to_f32((uint8_t)c)) == c, "encode(decode(0x%02x)) = 0x%02x", c,
                   e4m3_rn_bits(e4m3_to_f32((uint8_t)c)));
}

static void expect_code(float x, int want) {
    int got = e4m3_rn_bits(x);
    EXPECT(got == want, "encode(%a) = 0x%02x, want 0x%02x", x, got, want);
}

static void test_rounding(void) {
    // every midpoint between adjacent codes (exact in float32: at most 5 significant bits), and either side
    for (int c = 0; c < 0x7e; c++) {
        double mid = (VAL[c] + VAL[c + 1]) / 2;
        float f = (float)mid;
        EXPECT(f == mid, "midpoint %g not a float", mid);
        int even = c % 2 == 0 ? c : c + 1;
        for (int s = 0; s < 2; s++) {
            float sf = s ? -f : f;
            int sg = s ? 0x80 : 0;
            expect_code(sf, sg | even);
            expect_code(nextafterf(sf, 0.0f), sg | c);
            expect_code(nextafterf(sf, s ? -INFINITY : INFINITY), sg | (c + 1));
        }
    }
    // saturation, infinities, NaN, zeros and float32 subnormals as chosen (numerics.h)
    const float sat[] = {
        448.0f,  nextafterf(448.0f, INFINITY), 463.99f, 464.0f, 464.01f, 480.0f, 1e4f, 1e30f, FLT_MAX,
        INFINITY};
    for (size_t i = 0; i < sizeof sat / sizeof *sat; i++) {
        expect_code(sat[i], 0x7e);
        expect_code(-sat[i], 0xfe);
    }
    expect_code(NAN, 0x7f);
    expect_code(copysignf(NAN, -1.0f), 0x7f);
    expect_code(0.0f, 0x00);
    expect_code(-0.0f, 0x80);
    expect_code(0x1p-10f, 0x00); // half the smallest subnormal: the tie goes to the even code, zero
    expect_code(nextafterf(0x1p-10f, 1.0f), 0x01);
    expect_code(-nextafterf(0x1p-10f, 1.0f), 0x81);
    expect_code(FLT_MIN, 0x00);
    expect_code(FLT_TRUE_MIN, 0x00);
    expect_code(-FLT_TRUE_MIN, 0x80);
    // against the table-search reference: a dense sweep of float32 bit patterns over e4m3's range (2^-13
    // to 512, every 7th pattern, both signs), then random bit patterns (NaN, inf, huge and tiny among them)
    int64_t bad = 0, n = 0;
    for (uint32_t u = 0x39000000u; u < 0x44000000u; u += 7, n++) {
        float x = f32_of_bits(u);
        bad += e4m3_rn_bits(x) != ref_encode(x);
        bad += e4m3_rn_bits(-x) != ref_encode(-(double)x);
    }
    Rng r;
    rng_seed(&r, 38);
    for (int i = 0; i < 1000000; i++, n++) {
        float x = f32_of_bits((uint32_t)rng_u64(&r));
        bad += e4m3_rn_bits(x) != ref_encode(x);
    }
    EXPECT(bad == 0, "%lld of %lld floats encode unlike the nearest-even table search", (long long)bad,
           (long long)n);
}

static void test_scale_rule(void) {
    const float amax[] = {448.0f,
                          nextafterf(448.0f, INFINITY),
                          1.75f,
                          nextafterf(1.75f, 2.0f),
                          1.0f,
                          0.0f,
                          1e-30f,
                          FLT_TRUE_MIN,
                          3e38f,
                          FLT_MAX,
                          448.0f * 0x1p119f,
                          0x1p-92f};
    const int want[] = {0, 1, -8, -7, -8, -100, -100, -100, 119, 119, 119, -100};
    for (size_t i = 0; i < sizeof amax / sizeof *amax; i++)
        EXPECT(fp8_scale_exp(f32_bits(amax[i])) == want[i], "scale exponent of %a: %d, want %d", amax[i],
               fp8_scale_exp(f32_bits(amax[i])), want[i]);
    Rng r;
    rng_seed(&r, 7);
    int bad = 0;
    for (int i = 0; i < 200000; i++) {
        uint32_t u = (uint32_t)rng_u64(&r) & 0x7fffffffu;
        if (u >= 0x7f800000u) continue;
        bad += fp8_scale_exp(u) != ref_scale_exp(f32_of_bits(u));
    }
    EXPECT(bad == 0, "%d random amax give another scale exponent than the definition", bad);
    for (int k = FP8_SCALE_EXP_MIN; k <= FP8_SCALE_EXP_MAX; k++)
        EXPECT(fp8_pow2(k) == ldexp(1.0, k) && fp8_pow2(-k) == ldexp(1.0, -k), "2^%d", k);
}

// Values spread over ~2^30 of magnitude (per tile of 128 columns and per row, so tiles differ), some zeros.
static float *rand_matrix(Rng *r, int M, int K) {
    float *x = xmalloc(((size_t)M * K + 1) * sizeof(float));
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) {
            int e = (m % 5) * 3 + (k / FP8_TILE) * 4 - 12 + (int)rng_below(r, 7) - 3;
            x[(size_t)m * K + k] = rng_below(r, 50) == 0 ? 0.0f : ldexpf(rng_normal(r), e);
        }
    return x;
}

static float *transpose(const float *x, int M, int K) {
    float *y = xmalloc(((size_t)M * K + 1) * sizeof(float));
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++) y[(size_t)k * M + m] = x[(size_t)m * K + k];
    return y;
}

// One scale group of x (rows r0.., columns c0.., ni x nj, row length K) quantised as q, s: the scale by
// the definition, every code the nearest-even of x / s, the error within half an e4m3 ulp of x (2^-4
// relative in the normal range, 2^-10 s below it), and the dequantised values exactly decode(q) * s.
static void check_group(const float *x, const uint8_t *q, float s, const float *deq, int K, int r0, int c0,
                        int ni, int nj, const char *what) {
    double amax = 0;
    for (int i = r0; i < r0 + ni; i++)
        for (int j = c0; j < c0 + nj; j++) amax = fmax(amax, fabs(x[(size_t)i * K + j]));
    double ws = ldexp(1.0, ref_scale_exp(amax));
    EXPECT(s == ws, "%s group (%d, %d): scale %g, want %g", what, r0, c0, s, ws);
    int bad = 0;
    for (int i = r0; i < r0 + ni; i++)
        for (int j = c0; j < c0 + nj; j++) {
            size_t o = (size_t)i * K + j;
            double xv = x[o], d = VAL[q[o]] * ws, err = fabs(d - xv);
            int ok = q[o] == ref_encode(xv / ws) && same_float(deq[o], d);
            ok &= fabs(xv) / ws >= 0x1p-6 ? err <= 0x1p-4 * fabs(xv) : err <= 0x1p-10 * ws;
            bad += !ok;
        }
    EXPECT(bad == 0, "%s group (%d, %d): %d elements quantised wrongly", what, r0, c0, bad);
}

static void test_tiles(Rng *r) {
    const int Ms[] = {0, 1, 127, 128, 129}, Ks[] = {1, 100, 128, 129, 300};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 5; b++) {
            int M = Ms[a], K = Ks[b], T = fp8_ntiles(K), TM = fp8_ntiles(M);
            size_t n = (size_t)M * K + 1;
            float *x = rand_matrix(r, M, K), *xt = transpose(x, M, K), *deq = xmalloc(n * sizeof(float));
            float *s = xmalloc(((size_t)M * T + 1) * sizeof(float)), *st = xmalloc(((size_t)K * TM + 1) * 4);
            float *st2 = xmalloc(((size_t)K * TM + 1) * 4);
            uint8_t *q = xmalloc(n), *qt = xmalloc(n), *qt2 = xmalloc(n);
            memset(q, 0xaa, n);
            for (size_t i = 0; i < n; i++) deq[i] = NAN;
            EXPECT(cpu_fp8_quant_tiles(q, s, x, M, K) == 0, "finite tiles flagged (M %d K %d)", M, K);
            cpu_fp8_dequant_tiles(deq, q, s, M, K);
            for (int m = 0; m < M; m++)
                for (int t = 0; t < T; t++)
                    check_group(x, q, s[(size_t)m * T + t], deq, K, m, t * FP8_TILE, 1,
                                K - t * FP8_TILE < FP8_TILE ? K - t * FP8_TILE : FP8_TILE, "tile");
            // the transposed tiling equals the tiling of the transpose
            EXPECT(cpu_fp8_quant_tiles_t(qt, st, x, M, K) == 0, "finite tiles flagged (transposed)");
            cpu_fp8_quant_tiles(qt2, st2, xt, K, M);
            EXPECT(!memcmp(qt, qt2, (size_t)M * K) && !memcmp(st, st2, (size_t)K * TM * 4),
                   "quant_tiles_t differs from quant_tiles of the transpose (M %d K %d)", M, K);
            free(x), free(xt), free(deq), free(s), free(st), free(st2), free(q), free(qt), free(qt2);
        }
}

static void test_blocks(Rng *r) {
    const int Ns[] = {0, 1, 127, 128, 129, 300}, Ks[] = {1, 100, 128, 129, 300};
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 5; b++) {
            int N = Ns[a], K = Ks[b], BN = fp8_ntiles(N), BK = fp8_ntiles(K);
            size_t n = (size_t)N * K + 1, ns = (size_t)BN * BK + 1;
            float *w = rand_matrix(r, N, K), *wt = transpose(w, N, K), *deq = xmalloc(n * sizeof(float));
            float *s = xmalloc(ns * 4), *st = xmalloc(ns * 4);
            uint8_t *q = xmalloc(n), *qt = xmalloc(n);
            EXPECT(cpu_fp8_quant_blocks(q, s, w, N, K) == 0, "finite blocks flagged (N %d K %d)", N, K);
            cpu_fp8_dequant_blocks(deq, q, s, N, K);
            for (int i = 0; i < BN; i++)
                for (int j = 0; j < BK; j++) {
                    int ni = N - i * FP8_TILE < FP8_TILE ? N - i * FP8_TILE : FP8_TILE;
                    int nj = K - j * FP8_TILE < FP8_TILE ? K - j * FP8_TILE : FP8_TILE;
                    check_group(w, q, s[(size_t)i * BK + j], deq, K, i * FP8_TILE, j * FP8_TILE, ni, nj,
                                "block");
                }
            // the weight's transpose (the activation gradient's operand) has the transposed codes and scales
            cpu_fp8_quant_blocks(qt, st, wt, K, N);
            int bad = 0;
            for (int i = 0; i < N; i++)
                for (int j = 0; j < K; j++) bad += qt[(size_t)j * N + i] != q[(size_t)i * K + j];
            for (int i = 0; i < BN; i++)
                for (int j = 0; j < BK; j++) bad += st[(size_t)j * BN + i] != s[(size_t)i * BK + j];
            EXPECT(bad == 0, "blocks of W^T are not W's transposed (N %d K %d): %d differ", N, K, bad);
            free(w), free(wt), free(deq), free(s), free(st), free(q), free(qt);
        }
}

// All-zero tiles and blocks (scale 2^-100, codes +-0), an outlier (its tile alone pays), values beyond
// 448 * 2^119 (saturated, still finite), and non-finite groups (counted, scale NaN, codes NaN).
static void test_edges(Rng *r) {
    enum { K = 300 };
    float x[3 * K], deq[3 * K], s[9], s2[4];
    uint8_t q[3 * K];
    memset(x, 0, sizeof x);
    for (int k = 0; k < K; k += 3) x[K + k] = -0.0f; // row 1: zeros of both signs
    for (int k = 0; k < K; k++) x[2 * K + k] = 1e-2f * rng_normal(r);
    x[2 * K + 17] = 3000.0f; // outlier in row 2's tile 0
    EXPECT(cpu_fp8_quant_tiles(q, s, x, 3, K) == 0, "zero tiles flagged");
    cpu_fp8_dequant_tiles(deq, q, s, 3, K);
    for (int t = 0; t < 6; t++) EXPECT(s[t] == 0x1p-100f, "zero tile %d: scale %a", t, s[t]);
    int bad = 0;
    for (int k = 0; k < 2 * K; k++) bad += q[k] != (signbit(x[k]) ? 0x80 : 0) || !same_float(deq[k], x[k]);
    EXPECT(bad == 0, "zero tiles: %d codes not +-0", bad);
    EXPECT(s[6] == 8.0f, "outlier tile scale %g, want 8 (3000 <= 448 * 8)", s[6]);
    for (int t = 0; t < 3; t++)
        check_group(x, q, s[6 + t], deq, K, 2, t * 128, 1, t < 2 ? 128 : K - 256, "outlier");
    EXPECT(s[7] < s[6] / 64, "the outlier's neighbour tile has its own small scale: %g vs %g", s[7], s[6]);
    // an all-zero block beside a non-zero one
    float z[2 * 130] = {0}, zs[2], zdeq[2 * 130];
    uint8_t zq[2 * 130];
    z[129] = -5.0f; // scale 2^-6 (5 = 1.25 * 2^2 <= 448 * 2^-6), -320 = -(1 + 2/8) 2^8: code 1.1111.010
    EXPECT(cpu_fp8_quant_blocks(zq, zs, z, 2, 130) == 0, "zero block flagged");
    cpu_fp8_dequant_blocks(zdeq, zq, zs, 2, 130);
    EXPECT(zs[0] == 0x1p-100f && zs[1] == 0x1p-6f && zq[129] == 0xfa && zdeq[129] == -5.0f && zdeq[0] == 0.0f,
           "zero block: scales %a %a, code 0x%02x", zs[0], zs[1], zq[129]);
    // beyond the scale ceiling: saturates to 448 * 2^119 instead of overflowing
    float big[2] = {FLT_MAX, -3e38f}, bdeq[2], bs;
    uint8_t bq[2];
    cpu_fp8_quant_tiles(bq, &bs, big, 1, 2);
    cpu_fp8_dequant_tiles(bdeq, bq, &bs, 1, 2);
    EXPECT(bs == 0x1p119f && bq[0] == 0x7e && bq[1] == 0xfe && bdeq[0] == 448.0f * 0x1p119f,
           "ceiling: %a %x %x", bs, bq[0], bq[1]);
    // non-finite groups
    x[5] = NAN;
    x[2 * K + 290] = INFINITY;
    x[2 * K + 299] = -INFINITY;
    EXPECT(cpu_fp8_quant_tiles(q, s, x, 3, K) == 2, "non-finite tiles not counted");
    EXPECT(isnan(s[0]) && isnan(s[8]) && !isnan(s[1]) && !isnan(s[6]) && !isnan(s[7]), "non-finite scales");
    EXPECT(q[0] == 0x7f && q[5] == 0x7f && q[127] == 0x7f && q[2 * K + 256] == 0x7f && q[128] == 0,
           "NaN codes");
    uint8_t qt[3 * K];
    float st[K];
    EXPECT(cpu_fp8_quant_tiles_t(qt, st, x, 3, K) == 3, "non-finite transposed tiles not counted");
    EXPECT(cpu_fp8_quant_blocks(q, s2, x, 3, K) == 2 && isnan(s2[0]) && isnan(s2[2]) && !isnan(s2[1]),
           "non-finite blocks");
}

// The float64 product of the operands dequantised here (decode table, scales indexed here), and sum |a b|.
static void ref_gemm(double *c, double *mag, const uint8_t *a, const float *sa, const uint8_t *b,
                     const float *sb, int M, int N, int K, int b_blocks) {
    int T = fp8_ntiles(K);
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double acc = 0, am = 0;
            for (int k = 0; k < K; k++) {
                double sbv = sb[(size_t)(b_blocks ? n / 128 : n) * T + k / 128];
                double p =
                    VAL[a[(size_t)m * K + k]] * sa[(size_t)m * T + k / 128] * VAL[b[(size_t)n * K + k]] * sbv;
                acc += p, am += fabs(p);
            }
            c[(size_t)m * N + n] = acc, mag[(size_t)m * N + n] = am;
        }
}

// Runs cpu_fp8_gemm (with scales sa_run, sb_run and B's layout run_blocks) and compares it with the
// float64 product of the operands as quantised (sa, sb, b_blocks) under the derived bound; returns the
// elements outside it (the caller expects 0, or many for corrupted scales) and those outside row 0.
static int gemm_outside(const uint8_t *a, const float *sa, const uint8_t *b, const float *sb,
                        const float *sa_run, const float *sb_run, int M, int N, int K, int b_blocks,
                        int run_blocks, int *bad_other) {
    size_t n = (size_t)M * N + 1;
    float *c = xmalloc(n * sizeof(float));
    double *ref = xmalloc(n * sizeof(double)), *mag = xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) c[i] = NAN;
    cpu_fp8_gemm(c, a, sa_run, b, sb_run, M, N, K, run_blocks);
    ref_gemm(ref, mag, a, sa, b, sb, M, N, K, b_blocks);
    double d = (K < 128 ? K : 128) + fp8_ntiles(K), u = 0x1p-24, gamma = d * u / (1 - d * u);
    int out = 0;
    if (bad_other) *bad_other = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            size_t o = (size_t)i * N + j;
            int bad = !(fabs(c[o] - ref[o]) <= (gamma + K * 0x1p-53) * mag[o]);
            out += bad;
            if (bad && bad_other && i != 0) (*bad_other)++;
        }
    free(c), free(ref), free(mag);
    return out;
}

typedef struct {
    uint8_t *q;
    float *s;
} Q8;

static Q8 quant(const float *x, int R, int C, int how) { // how: 0 tiles, 1 blocks, 2 tiles of the transpose
    Q8 r = {xmalloc((size_t)R * C + 1), xmalloc(((size_t)(R + 1) * (C + 1) + 1) * sizeof(float))};
    int64_t bad = how == 0 ? cpu_fp8_quant_tiles(r.q, r.s, x, R, C)
        : how == 1         ? cpu_fp8_quant_blocks(r.q, r.s, x, R, C)
                           : cpu_fp8_quant_tiles_t(r.q, r.s, x, R, C);
    EXPECT(bad == 0, "finite operand flagged");
    return r;
}

// The three GEMMs of an expert at awkward sizes: tokens M, model width D (the forward's K), hidden H.
static void test_gemm(Rng *r) {
    const int Ms[] = {0, 1, 127, 129}, Ds[] = {1, 100, 128, 300}, Hs[] = {1, 129, 128, 200};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            int M = Ms[a], D = Ds[b], H = Hs[b];
            float *x = rand_matrix(r, M, D), *w = rand_matrix(r, H, D), *dy = rand_matrix(r, M, H);
            float *wt = transpose(w, H, D);
            Q8 qx = quant(x, M, D, 0), qw = quant(w, H, D, 1), qwt = quant(wt, D, H, 1),
               qdy = quant(dy, M, H, 0);
            Q8 qdyt = quant(dy, M, H, 2), qxt = quant(x, M, D, 2);
            EXPECT(gemm_outside(qx.q, qx.s, qw.q, qw.s, qx.s, qw.s, M, H, D, 1, 1, NULL) == 0,
                   "forward M %d D %d H %d", M, D, H);
            EXPECT(gemm_outside(qdy.q, qdy.s, qwt.q, qwt.s, qdy.s, qwt.s, M, D, H, 1, 1, NULL) == 0,
                   "activation grad M %d D %d H %d", M, D, H);
            EXPECT(gemm_outside(qdyt.q, qdyt.s, qxt.q, qxt.s, qdyt.s, qxt.s, H, D, M, 0, 0, NULL) == 0,
                   "weight grad M %d D %d H %d", M, D, H);
            free(x), free(w), free(dy), free(wt);
            Q8 all[] = {qx, qw, qwt, qdy, qdyt, qxt};
            for (int i = 0; i < 6; i++) free(all[i].q), free(all[i].s);
        }
    // The bound catches a wrong tile index: row 0's first two A tile scales swapped (the tiles' magnitudes
    // differ by 2^4, rand_matrix), or B's first two blocks' scales swapped; only those outputs move.
    int M = 5, N = 130, K = 300, T = fp8_ntiles(K), rows_other;
    float *x = rand_matrix(r, M, K), *w = rand_matrix(r, N, K);
    Q8 qa = quant(x, M, K, 0), qb = quant(w, N, K, 1), qbt = quant(w, N, K, 0);
    size_t ns = (size_t)(M + 1) * (K + 1) * sizeof(float);
    float *sa = xmalloc(ns), *sb = xmalloc((size_t)(N + 1) * (K + 1) * sizeof(float));
    memcpy(sa, qa.s, (size_t)M * T * sizeof(float));
    sa[0] = qa.s[1], sa[1] = qa.s[0];
    EXPECT(qa.s[0] != qa.s[1], "test data: tile scales equal");
    EXPECT(gemm_outside(qa.q, qa.s, qb.q, qb.s, sa, qb.s, M, N, K, 1, 1, &rows_other) > N / 2 &&
               rows_other == 0,
           "a swapped A tile scale was not caught (or moved other rows: %d)", rows_other);
    memcpy(sb, qb.s, (size_t)fp8_ntiles(N) * T * sizeof(float));
    sb[0] = qb.s[1], sb[1] = qb.s[0];
    EXPECT(qb.s[0] != qb.s[1], "test data: block scales equal");
    EXPECT(gemm_outside(qa.q, qa.s, qb.q, qb.s, qa.s, sb, M, N, K, 1, 1, NULL) > M * 64,
           "a swapped B block scale was not caught");
    // B's tile scales read as block scales (b_blocks 1 where 0 is meant: row n/128's scales for row n)
    EXPECT(gemm_outside(qa.q, qa.s, qbt.q, qbt.s, qa.s, qbt.s, M, N, K, 0, 0, NULL) == 0, "B tiles");
    EXPECT(gemm_outside(qa.q, qa.s, qbt.q, qbt.s, qa.s, qbt.s, M, N, K, 0, 1, NULL) > M * 64,
           "B tiles read as blocks not caught");
    free(x), free(w), free(sa), free(sb), free(qa.q), free(qa.s), free(qb.q), free(qb.s), free(qbt.q),
        free(qbt.s);
}

// The documented order (cpu_fp8.h), written out here with the promotion interval as a parameter: the
// GPU kernel's comparison depends on it. The data make the order visible: the same sums promoted every
// 64 products, or with the tiles taken last to first, give other bits somewhere (checked too).
static float order_sum(const Q8 *qa, const Q8 *qb, int m, int n, int K, int every, int reverse) {
    int T = fp8_ntiles(K);
    float acc = 0;
    for (int i = 0; i < T; i++) {
        int t = reverse ? T - 1 - i : i;
        float p = 0;
        for (int k = t * 128; k < K && k < t * 128 + 128; k++) {
            volatile float prod = (float)VAL[qa->q[(size_t)m * K + k]] * (float)VAL[qb->q[(size_t)n * K + k]];
            p = p + prod;
            if (k % every == every - 1 && k % 128 != 127 && k + 1 < K) { // an early promotion
                volatile float ps = p * (qa->s[(size_t)m * T + t] * qb->s[(size_t)(n / 128) * T + t]);
                acc = acc + ps, p = 0;
            }
        }
        volatile float ps = p * (qa->s[(size_t)m * T + t] * qb->s[(size_t)(n / 128) * T + t]);
        acc = acc + ps;
    }
    return acc;
}

static void test_gemm_order(Rng *r) {
    enum { M = 24, N = 24, K = 300 };
    float *x = rand_matrix(r, M, K), *w = rand_matrix(r, N, K), c[M * N];
    Q8 qa = quant(x, M, K, 0), qb = quant(w, N, K, 1);
    cpu_fp8_gemm(c, qa.q, qa.s, qb.q, qb.s, M, N, K, 1);
    int bad = 0, every64 = 0, reversed = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            bad += f32_bits(order_sum(&qa, &qb, m, n, K, 128, 0)) != f32_bits(c[m * N + n]);
            every64 += f32_bits(order_sum(&qa, &qb, m, n, K, 64, 0)) != f32_bits(c[m * N + n]);
            reversed += f32_bits(order_sum(&qa, &qb, m, n, K, 128, 1)) != f32_bits(c[m * N + n]);
        }
    EXPECT(bad == 0, "%d GEMM outputs differ from the documented order's bits", bad);
    EXPECT(every64 > 0 && reversed > 0, "test data blind to the order: %d, %d outputs differ", every64,
           reversed);
    free(x), free(w), free(qa.q), free(qa.s), free(qb.q), free(qb.s);
}

static int encode_file(const char *in, const char *out) {
    FILE *f = xfopen(in, "rb"), *g = xfopen(out, "wb");
    float x;
    while (fread(&x, 4, 1, f) == 1) {
        uint8_t c = e4m3_rn_bits(x);
        if (fwrite(&c, 1, 1, g) != 1) DIE("writing %s", out);
    }
    fclose(f);
    if (fclose(g)) DIE("writing %s", out);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--encode")) return encode_file(argv[2], argv[3]);
    Rng r;
    rng_seed(&r, 1234);
    test_format();
    test_rounding();
    test_scale_rule();
    test_tiles(&r);
    test_blocks(&r);
    test_edges(&r);
    test_gemm(&r);
    test_gemm_order(&r);
    return test_done("test_fp8");
}
