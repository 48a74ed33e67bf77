// test_cuda_fp8_quant.c — the GPU FP8 quantisers (src/ops/cuda/cuda_fp8.cu) against the host reference
// (ops/cpu/cpu_fp8.c, itself checked from the format's definition by test_fp8.c): codes, scales and the
// count of non-finite groups and the largest finite group's scale exponent (the counter's amax word: ops.h
// Backend.fp8_amax reads it) bit for bit, from float32 and bf16 inputs, at awkward sizes (0, 1, 127, 128,
// 129, 300 rows; K 1, 100, 128, 129, 300) and with edge values in the data (an all-zero tile, a NaN, an
// infinity, values beyond 448 * 2^119, float32 subnormals, e4m3 rounding midpoints). The transposed tiling
// of grouped rows is checked per group against cpu_fp8_quant_tiles_t of that group's rows, its padding
// columns against zero; the blocks' transposed copy against the transpose of the codes and scales.
// Skips (exit 77) without the CUDA backend or a GPU.
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
#include "gpu_util.h"

static int fails, checks, self_test; // self_test: the next difference is expected

static uint64_t rs = 88172645463325252ull;
static uint32_t rnd(void) {
    rs ^= rs << 13, rs ^= rs >> 7, rs ^= rs << 17;
    return (uint32_t)(rs >> 16);
}
// A value of the kind a tensor holds, with the edge kinds mixed in at about one in 50 elements.
static float value(int edges) {
    float v = ((float)(rnd() % 2000001) - 1e6f) * 1e-6f * ldexpf(1.0f, (int)(rnd() % 17) - 8);
    if (!edges || rnd() % 50) return v;
    switch (rnd() % 5) {
        case 0: return ldexpf(1.0f, -140) * (float)(rnd() % 100); // float32 subnormal
        case 1: { // an e4m3 rounding midpoint (still one after the tile's power-of-two scale)
            uint8_t c = (uint8_t)(rnd() % 0x7e);
            return (e4m3_to_f32(c) + e4m3_to_f32((uint8_t)(c + 1))) * 0.5f;
        }
        case 2: return 448.0f;
        case 3: return -448.0f * 1.0625f;
        default: return 0.0f;
    }
}

// the host copy of x as the device reads it: float32, or bf16 (x rounded, the reference given its values)
static void *device_input(float *x, size_t n, int bf16) {
    if (!bf16) return cu_put(x, n * 4);
    uint16_t *b = xmalloc(n * 2 + 2);
    for (size_t i = 0; i < n; i++) {
        b[i] = isnan(x[i]) ? 0x7fc0 : bf16_rn_bits(x[i]);
        x[i] = bf16_to_f32(b[i]);
    }
    void *d = cu_put(b, n * 2);
    free(b);
    return d;
}

static void same(const char *what, const void *a, const void *b, size_t bytes, int M, int K, int bf16) {
    checks++;
    if (!memcmp(a, b, bytes)) return;
    fails++;
    const uint8_t *x = a, *y = b;
    size_t i = 0;
    while (x[i] == y[i]) i++;
    printf("%s %s M %d K %d bf16 %d: first differing byte %zu (gpu 0x%02x, cpu 0x%02x)\n",
           self_test ? "(found, as it must be)" : "FAIL", what, M, K, bf16, i, x[i], y[i]);
}

static void poison(float *x, int M, int K, int kind) {
    if (!M || !K) return;
    int m = (int)(rnd() % M), k = (int)(rnd() % K);
    x[(size_t)m * K + k] = kind == 0 ? NAN : kind == 1 ? -INFINITY : 3e38f;
}

// The largest exponent of the finite scales s[0 .. n) (FP8_AMAX_NONE: none), and the counter's amax word read
// the way the fp8 table reads it; checked equal
static int scales_kmax(const float *s, size_t n) {
    int k = FP8_AMAX_NONE;
    for (size_t i = 0; i < n; i++) {
        uint32_t b = f32_bits(s[i]);
        int e = (int)((b >> 23) & 0xffu) - 127;
        if ((b & 0x7fffffffu) < 0x7f800000u && e > k) k = e;
    }
    return k;
}
static void same_kmax(const char *what, unsigned long long word, int want, int M, int K) {
    int got = word ? fp8_scale_exp((uint32_t)(word - 1)) : FP8_AMAX_NONE;
    checks++;
    if (got != want)
        fails++, printf("FAIL %s amax exponent M %d K %d: gpu %d cpu %d\n", what, M, K, got, want);
}

static void check_tiles(int M, int K, int bf16, int special) {
    size_t n = (size_t)M * K, T = fp8_ntiles(K);
    float *x = xmalloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) x[i] = value(1);
    if (special && M > 1) { // an all-zero tile, and one of each non-finite kind and a huge value elsewhere
        for (int k = 0; k < K && k < 128; k++) x[k] = 0.0f;
        for (int kind = 0; kind < 3; kind++) poison(x + K, M - 1, K, kind);
    }
    void *dx = device_input(x, n, bf16);
    uint8_t *q = xmalloc(n + 1), *dq;
    float *s = xmalloc(M * T * 4 + 4), *ds;
    CU_CK(cudaMalloc((void **)&dq, n + 1));
    CU_CK(cudaMalloc((void **)&ds, M * T * 4 + 4));
    unsigned long long *bad = cu_counter();
    cuda_fp8_quant_tiles(dq, ds, dx, bf16, M, K, bad);
    unsigned long long am;
    long long nb = cu_count_amax(bad, &am);
    long long rb = cpu_fp8_quant_tiles(q, s, x, M, K);
    same_kmax("tiles", am, scales_kmax(s, (size_t)M * T), M, K);
    uint8_t *gq = cu_get(dq, n);
    float *gs = cu_get(ds, M * T * 4);
    same("tiles codes", gq, q, n, M, K, bf16);
    same("tiles scales", gs, s, M * T * 4, M, K, bf16); // NaN scales compare by their bits
    checks++;
    if (nb != rb) fails++, printf("FAIL tiles non-finite count M %d K %d: gpu %lld cpu %lld\n", M, K, nb, rb);
    free(x), free(q), free(s), free(gq), free(gs);
    CU_CK(cudaFree(dx));
    CU_CK(cudaFree(dq));
    CU_CK(cudaFree(ds));
}

static void check_tiles_t(const int *rows, int G, int K, int bf16, int special) {
    int64_t off[16] = {0};
    for (int g = 0; g < G; g++) off[g + 1] = off[g] + rows[g];
    int M = (int)off[G];
    int64_t P = cuda_fp8_pad_cols(off, G);
    size_t n = (size_t)M * K;
    float *x = xmalloc(n * 4 + 4);
    for (size_t i = 0; i < n; i++) x[i] = value(1);
    if (special) poison(x, M, K, 0), poison(x, M, K, 1), poison(x, M, K, 2);
    void *dx = device_input(x, n, bf16);
    uint8_t *dq;
    float *ds;
    CU_CK(cudaMalloc((void **)&dq, (size_t)K * P + 1));
    CU_CK(cudaMalloc((void **)&ds, (size_t)K * (P / 128) * 4 + 4));
    CU_CK(cudaMemset(dq, 0xAB, (size_t)K * P + 1)); // the padding must be written
    unsigned long long *bad = cu_counter();
    cuda_fp8_quant_tiles_t(dq, ds, dx, bf16, off, G, K, bad);
    unsigned long long am;
    long long nb = cu_count_amax(bad, &am), rb = 0;
    int kmax = FP8_AMAX_NONE;
    uint8_t *gq = cu_get(dq, (size_t)K * P);
    float *gs = cu_get(ds, (size_t)K * (P / 128) * 4);
    for (int g = 0; g < G; g++) {
        int Mg = rows[g], T = fp8_ntiles(Mg);
        int64_t p = cuda_fp8_pad_cols(off, g), W = (T * 128);
        if (!Mg) continue;
        uint8_t *q = xmalloc((size_t)K * Mg), *pq = xmalloc((size_t)K * W), *zq = xcalloc((size_t)K * W, 1);
        float *s = xmalloc((size_t)K * T * 4), *ps = xmalloc((size_t)K * T * 4);
        rb += cpu_fp8_quant_tiles_t(q, s, x + off[g] * K, Mg, K);
        int kg = scales_kmax(s, (size_t)K * T);
        if (kg > kmax) kmax = kg;
        for (int k = 0; k < K; k++) {
            memcpy(pq + (size_t)k * W, gq + (size_t)k * P + p, W);
            memcpy(ps + (size_t)k * T, gs + (size_t)k * (P / 128) + p / 128, T * 4);
            memset(zq + (size_t)k * W, 0, W);
            memcpy(zq + (size_t)k * W, q + (size_t)k * Mg, Mg);
        }
        same("tiles_t codes+padding", pq, zq, (size_t)K * W, Mg, K, bf16);
        same("tiles_t scales", ps, s, (size_t)K * T * 4, Mg, K, bf16);
        free(q), free(pq), free(zq), free(s), free(ps);
    }
    checks++;
    if (nb != rb) fails++, printf("FAIL tiles_t non-finite count K %d: gpu %lld cpu %lld\n", K, nb, rb);
    same_kmax("tiles_t", am, kmax, M, K);
    free(x), free(gq), free(gs);
    CU_CK(cudaFree(dx));
    CU_CK(cudaFree(dq));
    CU_CK(cudaFree(ds));
}

static void check_blocks(int G, int N, int K, int bf16, int special) {
    size_t n = (size_t)G * N * K, BN = fp8_ntiles(N), BK = fp8_ntiles(K), nsc = G * BN * BK;
    float *w = xmalloc(n * 4);
    for (size_t i = 0; i < n; i++) w[i] = value(1);
    if (special) poison(w, N, K, 0), poison(w + (size_t)N * K * (G - 1), N, K, 1);
    void *dw = device_input(w, n, bf16);
    uint8_t *dq, *dqt;
    float *ds, *dst;
    CU_CK(cudaMalloc((void **)&dq, n));
    CU_CK(cudaMalloc((void **)&dqt, n));
    CU_CK(cudaMalloc((void **)&ds, nsc * 4));
    CU_CK(cudaMalloc((void **)&dst, nsc * 4));
    unsigned long long *bad = cu_counter();
    cuda_fp8_quant_blocks(dq, ds, dqt, dst, dw, bf16, G, N, K, bad);
    unsigned long long am;
    long long nb = cu_count_amax(bad, &am), rb = 0;
    uint8_t *gq = cu_get(dq, n), *gqt = cu_get(dqt, n), *q = xmalloc(n), *qt = xmalloc(n);
    float *gs = cu_get(ds, nsc * 4), *gst = cu_get(dst, nsc * 4), *s = xmalloc(nsc * 4),
          *st = xmalloc(nsc * 4);
    for (int g = 0; g < G; g++) {
        size_t o = (size_t)g * N * K, so = (size_t)g * BN * BK;
        rb += cpu_fp8_quant_blocks(q + o, s + so, w + o, N, K);
        for (int r = 0; r < N; r++)
            for (int c = 0; c < K; c++) qt[o + (size_t)c * N + r] = q[o + (size_t)r * K + c];
        for (size_t i = 0; i < BN; i++)
            for (size_t j = 0; j < BK; j++) st[so + j * BN + i] = s[so + i * BK + j];
    }
    same("blocks codes", gq, q, n, N, K, bf16);
    same("blocks scales", gs, s, nsc * 4, N, K, bf16);
    same("blocks transposed codes", gqt, qt, n, N, K, bf16);
    same("blocks transposed scales", gst, st, nsc * 4, N, K, bf16);
    checks++;
    if (nb != rb)
        fails++, printf("FAIL blocks non-finite count N %d K %d: gpu %lld cpu %lld\n", N, K, nb, rb);
    same_kmax("blocks", am, scales_kmax(s, nsc), N, K);
    // without the transposed copy the same codes
    CU_CK(cudaMemset(dq, 0, n));
    cuda_fp8_quant_blocks(dq, ds, NULL, NULL, dw, bf16, G, N, K, NULL);
    free(gq);
    gq = cu_get(dq, n);
    same("blocks codes (no transposed copy)", gq, q, n, N, K, bf16);
    free(w), free(gq), free(gqt), free(q), free(qt), free(gs), free(gst), free(s), free(st);
    CU_CK(cudaFree(dw));
    CU_CK(cudaFree(dq));
    CU_CK(cudaFree(dqt));
    CU_CK(cudaFree(ds));
    CU_CK(cudaFree(dst));
}

int main(void) {
    if (!backend_cuda_available()) {
        printf("skip: no GPU\n");
        return 77;
    }
    backend_cuda(); // the device context as the trainer makes it
    static const int Ms[] = {0, 1, 127, 128, 129, 300}, Ks[] = {1, 100, 128, 129, 300};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 5; j++) check_tiles(Ms[i], Ks[j], bf16, (i + j) & 1);
        check_tiles(1000, 4096, bf16, 1);
        static const int r1[] = {0, 1, 127, 129, 300, 0, 128}, r2[] = {700}, r3[] = {0, 0};
        for (int j = 0; j < 5; j++) check_tiles_t(r1, 7, Ks[j], bf16, j & 1);
        check_tiles_t(r2, 1, 33, bf16, 1);
        check_tiles_t(r3, 2, 64, bf16, 0);
        check_blocks(3, 129, 300, bf16, 1);
        check_blocks(2, 256, 128, bf16, 0);
        check_blocks(1, 1, 1, bf16, 0);
        check_blocks(2, 300, 100, bf16, 1);
    }
    // the checks can fail: a flipped code is found
    {
        uint8_t a[4] = {1, 2, 3, 4}, b[4] = {1, 2, 3, 5};
        int f0 = fails;
        self_test = 1;
        same("self-test", a, b, 4, 1, 4, 0);
        self_test = 0;
        if (fails != f0 + 1) printf("FAIL the comparison missed a difference\n"), fails = f0 + 2;
        else fails = f0;
    }
    printf("test_cuda_fp8_quant: %d checks, %d failed\n", checks, fails); // (as the device recipes read it)
    return fails ? 1 : 0;
}
#else
int main(void) {
    printf("skip: built without CUDA\n");
    return 77;
}
#endif
