// cpu_fp8.c — the host reference of FP8 (e4m3) fine-grained quantisation, dequantisation and the FP8
// GEMM (contracts and the three expert GEMMs' operand layouts in ops/cpu/cpu_fp8.h; the element format
// and the scale rule in ops/numerics.h). OpenMP over independent scale groups and output rows; every sum
// is taken in a fixed order, so results do not depend on the thread count.
// Must not hold: the bf16/float32 kernels (cpu_nn.c) or any knowledge of layers.
#include <math.h>
#include <omp.h>
#include "ops/numerics.h"
#include "ops/cpu/cpu_fp8.h"

// One scale group: ni x nj elements x[i * xi + j * xj], codes to q[i * qi + j * qj]; writes its scale and
// returns 1 when it holds a non-finite element (scale NaN, codes NaN), else 0.
static int quant_group(uint8_t *q, size_t qi, size_t qj, float *scale, const float *x, size_t xi, size_t xj,
                       int ni, int nj) {
    uint32_t amax = 0;
    for (int i = 0; i < ni; i++)
        for (int j = 0; j < nj; j++) {
            uint32_t a = f32_bits(x[i * xi + j * xj]) & 0x7fffffffu;
            if (a > amax) amax = a;
        }
    int bad = amax >= 0x7f800000u, k = bad ? 0 : fp8_scale_exp(amax);
    float inv = fp8_pow2(-k);
    *scale = bad ? NAN : fp8_pow2(k);
    for (int i = 0; i < ni; i++)
        for (int j = 0; j < nj; j++)
            q[i * qi + j * qj] = bad ? 0x7fu : e4m3_rn_bits(x[i * xi + j * xj] * inv);
    return bad;
}

static inline int tile_len(int t, int n) { return n - t * FP8_TILE < FP8_TILE ? n - t * FP8_TILE : FP8_TILE; }

int64_t cpu_fp8_quant_tiles(uint8_t *q, float *s, const float *x, int M, int K) {
    int T = fp8_ntiles(K);
    int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (int m = 0; m < M; m++)
        for (int t = 0; t < T; t++) {
            size_t o = (size_t)m * K + (size_t)t * FP8_TILE;
            bad += quant_group(q + o, 0, 1, s + (size_t)m * T + t, x + o, 0, 1, 1, tile_len(t, K));
        }
    return bad;
}

int64_t cpu_fp8_quant_tiles_t(uint8_t *q, float *s, const float *x, int M, int K) {
    int T = fp8_ntiles(M);
    int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (int k = 0; k < K; k++)
        for (int t = 0; t < T; t++) {
            size_t r0 = (size_t)t * FP8_TILE;
            bad += quant_group(q + (size_t)k * M + r0, 0, 1, s + (size_t)k * T + t, x + r0 * K + k, 0,
                               (size_t)K, 1, tile_len(t, M));
        }
    return bad;
}

int64_t cpu_fp8_quant_blocks(uint8_t *q, float *s, const float *w, int N, int K) {
    int BN = fp8_ntiles(N), BK = fp8_ntiles(K);
    int64_t bad = 0;
#pragma omp parallel for schedule(static) collapse(2) reduction(+ : bad)
    for (int i = 0; i < BN; i++)
        for (int j = 0; j < BK; j++) {
            size_t o = (size_t)i * FP8_TILE * K + (size_t)j * FP8_TILE;
            bad += quant_group(q + o, (size_t)K, 1, s + (size_t)i * BK + j, w + o, (size_t)K, 1,
                               tile_len(i, N), tile_len(j, K));
        }
    return bad;
}

void cpu_fp8_dequant_tiles(float *x, const uint8_t *q, const float *s, int M, int K) {
    int T = fp8_ntiles(K);
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++)
            x[(size_t)m * K + k] = e4m3_to_f32(q[(size_t)m * K + k]) * s[(size_t)m * T + k / FP8_TILE];
}

void cpu_fp8_dequant_blocks(float *w, const uint8_t *q, const float *s, int N, int K) {
    int BK = fp8_ntiles(K);
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++)
            w[(size_t)n * K + k] =
                e4m3_to_f32(q[(size_t)n * K + k]) * s[(size_t)(n / FP8_TILE) * BK + k / FP8_TILE];
}

int64_t cpu_fp8_pack_rows(uint8_t *p, const float *x, int n, int d) {
    int T = fp8_ntiles(d);
    size_t rb = fp8_row_bytes(d);
    int64_t bad = 0;
#pragma omp parallel for schedule(static) reduction(+ : bad)
    for (int m = 0; m < n; m++)
        for (int t = 0; t < T; t++) {
            float s;
            uint8_t *row = p + (size_t)m * rb;
            int b = quant_group(row + (size_t)t * FP8_TILE, 0, 1, &s,
                                x + (size_t)m * d + (size_t)t * FP8_TILE, 0, 1, 1, tile_len(t, d));
            bad += b;
            row[d + t] = (uint8_t)(int8_t)(b ? FP8_ROW_BAD : fp8_scale_log2(s));
        }
    return bad;
}

void cpu_fp8_unpack_rows(float *x, const uint8_t *p, int n, int d) {
    size_t rb = fp8_row_bytes(d);
#pragma omp parallel for schedule(static)
    for (int m = 0; m < n; m++) {
        const uint8_t *row = p + (size_t)m * rb;
        for (int k = 0; k < d; k++) {
            int e = (int8_t)row[d + k / FP8_TILE];
            x[(size_t)m * d + k] = e == FP8_ROW_BAD ? NAN : e4m3_to_f32(row[k]) * fp8_pow2(e);
        }
    }
}

void cpu_fp8_round_rows(float *x, int n, int d) {
    int T = fp8_ntiles(d);
#pragma omp parallel for schedule(static)
    for (int m = 0; m < n; m++)
        for (int t = 0; t < T; t++) {
            uint8_t q[FP8_TILE];
            float s, *v = x + (size_t)m * d + (size_t)t * FP8_TILE;
            int len = tile_len(t, d);
            quant_group(q, 0, 1, &s, v, 0, 1, 1, len);
            for (int k = 0; k < len; k++) v[k] = e4m3_to_f32(q[k]) * s; // (a bad tile: NaN codes, NaN scale)
        }
}

void cpu_fp8_gemm(float *c, const uint8_t *a, const float *sa, const uint8_t *b, const float *sb, int M,
                  int N, int K, int b_blocks) {
    float val[256];
    for (int i = 0; i < 256; i++) val[i] = e4m3_to_f32((uint8_t)i);
    int T = fp8_ntiles(K);
#pragma omp parallel for schedule(static)
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const uint8_t *ar = a + (size_t)m * K, *br = b + (size_t)n * K;
            const float *sbr = sb + (size_t)(b_blocks ? n / FP8_TILE : n) * T;
            float acc = 0.0f;
            for (int t = 0; t < T; t++) {
                float p = 0.0f; // each product is exact, so a contracted multiply-add rounds the same
                for (int k = t * FP8_TILE; k < t * FP8_TILE + tile_len(t, K); k++)
                    p += val[ar[k]] * val[br[k]];
                acc += p * (sa[(size_t)m * T + t] * sbr[t]);
            }
            c[(size_t)m * N + n] = acc;
        }
}
