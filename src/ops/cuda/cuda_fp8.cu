// cuda_fp8.cu — the FP8 (e4m3) quantisers (contracts in cuda_fp8.h): a scale group's max-abs as an integer
// max over the float32 bit patterns (a NaN or infinity is above every finite value, so one max finds amax
// and detects a non-finite group, as the host reference does), the power-of-two scale of ops/numerics.h,
// and the codes by the cvt.rn.satfinite instruction (equal to numerics.h's e4m3_rn_bits on every float32:
// tests/test_fp8_cuda_ref.sh). x * 2^-k is exact, so the codes do not depend on the order of anything.
//   tiles:   a warp per two 1x128 tiles (both loads in flight before either is reduced), four elements a
//            lane;
//   blocks:  one block per 128x128 block, a thread 16 rows x 4 columns held as loaded (bf16 pairs: half the
//            registers of float32 values), the transposed copy by byte permutes in registers and one 16-byte
//            store of a column's 16 codes.
// (tiles_t, the transposed tiling of grouped rows, is cuda_fp8_fused.cu's both-tilings kernel without its row
// layout.) Timed on the reference model's shapes by `moe_bench_fp8 --quant-only 1` (bench/fp8_gemm_bench.c).
// The device helpers (max-abs bits, scale, code, a warp's row tile) are cuda_fp8_dev.cuh's. Must not hold:
// the GEMMs or any knowledge of layers.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_fp8.h"
#include "ops/cuda/cuda_fp8_dev.cuh"
#include "ops/numerics.h"

#define QW 2 // tiles: the tiles a warp takes (4: more registers, fewer warps, slower)

// ---------------------------------------------------------------- tiles along K
template <typename T>
__global__ void quant_tiles_k(uint8_t *q, float *s, const T *x, int M, int K, int tiles,
                              unsigned long long *bad) {
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32 * QW, n = (long long)M * tiles;
    int lane = threadIdx.x & 31;
    if (w >= n) return;
    int m0 = (int)(w / tiles), t0 = (int)(w % tiles);
    float v[QW][4];
#pragma unroll
    for (int u = 0; u < QW; u++) {
        int t = t0 + u, m = m0 + t / tiles, c0 = (t % tiles) * 128 + lane * 4;
        if (w + u < n) ld4(x, (size_t)m * K + c0, c0, K, v[u]);
    }
#pragma unroll
    for (int u = 0; u < QW; u++) {
        if (w + u >= n) return; // (uniform over the warp)
        int t = t0 + u, m = m0 + t / tiles, c0 = (t % tiles) * 128 + lane * 4;
        uint32_t amax = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) amax = max(amax, abs_bits(v[u][i]));
        warp_tile(q + (size_t)m * K, s + (size_t)m * tiles + t % tiles, v[u], amax, c0, K, lane, bad);
    }
}

extern "C" void cuda_fp8_quant_tiles(uint8_t *q, float *s, const void *x, int x_bf16, int M, int K,
                                     unsigned long long *bad) {
    if (M <= 0 || K <= 0) return;
    int tiles = (K + 127) / 128;
    long long warps = ((long long)M * tiles + QW - 1) / QW;
    unsigned grid = (unsigned)((warps + 7) / 8);
    if (x_bf16) quant_tiles_k<<<grid, 256>>>(q, s, (const __nv_bfloat16 *)x, M, K, tiles, bad);
    else quant_tiles_k<<<grid, 256>>>(q, s, (const float *)x, M, K, tiles, bad);
    KCHECK("fp8_quant_tiles");
}

// ---------------------------------------------------------------- 128x128 blocks of the weights
template <typename T> struct RawOf { typedef Raw4f type; };
template <> struct RawOf<__nv_bfloat16> { typedef Raw4b type; };

// ilv 0: q (G, N, K) and s per block; ilv 1 or 2: q is a pair's (G, 2 N, K), this weight's row n at row
// n / 64 * 128 + (ilv - 1) * 64 + n % 64 of its group, and s that row's scale (G 2 N, ceil(K/128)). Warp wp
// takes rows 16 wp .. 16 wp + 15 of the block, lane four consecutive columns of each.
template <typename T>
__global__ void __launch_bounds__(256, 2)
    quant_blocks_k(uint8_t *q, float *s, uint8_t *qt, float *st, const T *w, int N, int K, int ilv,
                   unsigned long long *bad) {
    __shared__ uint32_t red[8];
    int bj = blockIdx.x, bi = blockIdx.y, g = blockIdx.z, BN = gridDim.y, BK = gridDim.x;
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    size_t base = (size_t)g * N * K;
    int n0 = bi * 128 + wp * 16, c0 = bj * 128 + lane * 4;
    typename RawOf<T>::type v[16];
    uint32_t amax = 0;
#pragma unroll
    for (int i = 0; i < 16; i++) {
        if (n0 + i < N) ldraw(w, base + (size_t)(n0 + i) * K + c0, c0, K, &v[i]);
        else ldraw(w, 0, 0, 0, &v[i]);
#pragma unroll
        for (int e = 0; e < 4; e++) amax = max(amax, abs_bits(v[i].get(e)));
    }
    amax = __reduce_max_sync(0xffffffffu, amax);
    if (lane == 0) red[wp] = amax;
    __syncthreads();
    amax = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) amax = max(amax, red[i]);
    float scale, inv;
    bool nf = group_scale(amax, &scale, &inv);
    uint32_t b[16]; // row n0 + i's four codes, byte e column c0 + e
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int n = n0 + i;
        b[i] = 0;
#pragma unroll
        for (int e = 0; e < 4; e++) b[i] |= code(v[i].get(e), inv, nf) << (8 * e);
        size_t qrow = ilv ? (size_t)g * 2 * N + n / 64 * 128 + (ilv - 1) * 64 + n % 64 : (size_t)g * N + n;
        uint8_t *qr = q ? q + qrow * K + c0 : NULL; // (four codes in one store where all are in and aligned)
        if (qr && n < N && c0 + 3 < K && !((uintptr_t)qr & 3)) *(uint32_t *)qr = b[i];
        else if (qr && n < N)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (c0 + e < K) qr[e] = (uint8_t)(b[i] >> (8 * e));
        if (ilv && s && lane == 0 && n < N) s[qrow * BK + bj] = scale;
    }
    if (threadIdx.x == 0) {
        if (s && !ilv) s[((size_t)g * BN + bi) * BK + bj] = scale;
        if (st) st[((size_t)g * BK + bj) * BN + bi] = scale;
        note_group(bad, nf, amax);
    }
    if (!qt) return;
    // t[j][e]: column c0 + e's codes of rows n0 + 4 j .. n0 + 4 j + 3 (byte i row n0 + 4 j + i): each 4 x 4
    // byte transpose in two rounds of byte permutes (__byte_perm's selector nibble n picks result byte n from
    // the eight bytes of its two words)
    uint32_t t[4][4];
#pragma unroll
    for (int j = 0; j < 4; j++) {
        uint32_t lo01 = __byte_perm(b[4 * j], b[4 * j + 1], 0x5140),
                 hi01 = __byte_perm(b[4 * j], b[4 * j + 1], 0x7362);
        uint32_t lo23 = __byte_perm(b[4 * j + 2], b[4 * j + 3], 0x5140),
                 hi23 = __byte_perm(b[4 * j + 2], b[4 * j + 3], 0x7362);
        t[j][0] = __byte_perm(lo01, lo23, 0x5410), t[j][1] = __byte_perm(lo01, lo23, 0x7632);
        t[j][2] = __byte_perm(hi01, hi23, 0x5410), t[j][3] = __byte_perm(hi01, hi23, 0x7632);
    }
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int k = c0 + e;
        if (k >= K) break;
        uint8_t *qr = qt + base + (size_t)k * N + n0; // (16 codes in one store where all are in and aligned)
        if (n0 + 15 < N && !((uintptr_t)qr & 15))
            *(uint4 *)qr = make_uint4(t[0][e], t[1][e], t[2][e], t[3][e]);
        else
#pragma unroll
            for (int i = 0; i < 16; i++)
                if (n0 + i < N) qr[i] = (uint8_t)(b[i] >> (8 * e));
    }
}

extern "C" void cuda_fp8_quant_blocks(uint8_t *q, float *s, uint8_t *qt, float *st, const void *w, int w_bf16,
                                      int G, int N, int K, unsigned long long *bad) {
    if (G <= 0 || N <= 0 || K <= 0) return;
    dim3 grid((unsigned)((K + 127) / 128), (unsigned)((N + 127) / 128), (unsigned)G);
    if (w_bf16) quant_blocks_k<<<grid, 256>>>(q, s, qt, st, (const __nv_bfloat16 *)w, N, K, 0, bad);
    else quant_blocks_k<<<grid, 256>>>(q, s, qt, st, (const float *)w, N, K, 0, bad);
    KCHECK("fp8_quant_blocks");
}

extern "C" void cuda_fp8_quant_blocks_pair(uint8_t *q2, float *s2, int half, uint8_t *qt, float *st,
                                           const void *w, int w_bf16, int G, int N, int K,
                                           unsigned long long *bad) {
    CHECK(N % 64 == 0 && (half == 0 || half == 1), "fp8_quant_blocks_pair: N %d (a multiple of 64), half %d",
          N, half);
    if (G <= 0 || N <= 0 || K <= 0) return;
    dim3 grid((unsigned)((K + 127) / 128), (unsigned)((N + 127) / 128), (unsigned)G);
    if (w_bf16) quant_blocks_k<<<grid, 256>>>(q2, s2, qt, st, (const __nv_bfloat16 *)w, N, K, half + 1, bad);
    else quant_blocks_k<<<grid, 256>>>(q2, s2, qt, st, (const float *)w, N, K, half + 1, bad);
    KCHECK("fp8_quant_blocks_pair");
}

// ---------------------------------------------------------------- FP8 rows (--fp8-dispatch)
__device__ __forceinline__ void stx(float *x, size_t i, float v) { x[i] = v; }
__device__ __forceinline__ void stx(__nv_bfloat16 *x, size_t i, float v) { x[i] = __float2bfloat16_rn(v); }

// A warp per 1x128 tile of a row, four values a lane: round 0 writes the tile's codes and its exponent byte
// into the packed row (numerics.h fp8_row_bytes), round 1 the tile's FP8 values over x (exact in bf16: at
// most 4 significant bits, exponents within bf16's range).
template <typename T> __global__ void rows_k(uint8_t *p, T *x, int n, int d, int tiles, int round) {
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x & 31;
    if (w >= (long long)n * tiles) return; // (uniform over the warp)
    int m = (int)(w / tiles), t = (int)(w % tiles), c0 = t * 128 + lane * 4;
    float v[4];
    ld4((const T *)x, (size_t)m * d + c0, c0, d, v);
    uint32_t amax = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) amax = max(amax, abs_bits(v[i]));
    amax = __reduce_max_sync(0xffffffffu, amax);
    float scale, inv;
    bool nf = group_scale(amax, &scale, &inv);
    uint8_t *row = p ? p + (size_t)m * fp8_row_bytes(d) : NULL;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        if (c0 + e >= d) break;
        uint32_t c = code(v[e], inv, nf);
        if (round) stx(x, (size_t)m * d + c0 + e, e4m3_to_f32((uint8_t)c) * scale);
        else row[c0 + e] = (uint8_t)c;
    }
    if (!round && lane == 0) row[d + t] = (uint8_t)(int8_t)(nf ? FP8_ROW_BAD : fp8_scale_exp(amax));
}

template <typename T> __global__ void unpack_k(T *x, const uint8_t *p, int n, int d) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (size_t)n * d) return;
    int m = (int)(i / d), k = (int)(i % d);
    const uint8_t *row = p + (size_t)m * fp8_row_bytes(d);
    int e = (int8_t)row[d + k / 128];
    stx(x, i, e == FP8_ROW_BAD ? __int_as_float(0x7fc00000) : e4m3_to_f32(row[k]) * fp8_pow2(e));
}

static void rows_launch(uint8_t *p, void *x, int x_bf16, int n, int d, int round) {
    if (n <= 0 || d <= 0) return;
    int tiles = (d + 127) / 128;
    unsigned grid = (unsigned)(((long long)n * tiles + 7) / 8);
    if (x_bf16) rows_k<<<grid, 256>>>(p, (__nv_bfloat16 *)x, n, d, tiles, round);
    else rows_k<<<grid, 256>>>(p, (float *)x, n, d, tiles, round);
    KCHECK(round ? "fp8_round_rows" : "fp8_pack_rows");
}

extern "C" void cuda_fp8_pack_rows(uint8_t *p, const void *x, int x_bf16, int n, int d) {
    rows_launch(p, (void *)x, x_bf16, n, d, 0);
}

extern "C" void cuda_fp8_round_rows(void *x, int x_bf16, int n, int d) {
    rows_launch(NULL, x, x_bf16, n, d, 1);
}

extern "C" void cuda_fp8_unpack_rows(void *x, int x_bf16, const uint8_t *p, int n, int d) {
    if (n <= 0 || d <= 0) return;
    unsigned grid = (unsigned)(((size_t)n * d + 255) / 256);
    if (x_bf16) unpack_k<<<grid, 256>>>((__nv_bfloat16 *)x, p, n, d);
    else unpack_k<<<grid, 256>>>((float *)x, p, n, d);
    KCHECK("fp8_unpack_rows");
}
