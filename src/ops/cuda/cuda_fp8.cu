// cuda_fp8.cu — the FP8 (e4m3) quantisers (contracts in cuda_fp8.h): a scale group's max-abs as an integer
// max over the float32 bit patterns (a NaN or infinity is above every finite value, so one max finds amax
// and detects a non-finite group, as the host reference does), the power-of-two scale of ops/numerics.h,
// and the codes by the cvt.rn.satfinite instruction (equal to numerics.h's e4m3_rn_bits on every float32:
// tests/test_fp8_cuda_ref.sh). x * 2^-k is exact, so the codes do not depend on the order of anything.
//   tiles:   one warp per 1x128 tile, four elements a lane;
//   tiles_t: one block per (128-row tile of one group) x (32 columns), staged through shared memory so
//            that both the reads of x's rows and the writes of q's columns are coalesced;
//   blocks:  one block per 128x128 block; the transposed copy through shared memory.
// The device helpers (max-abs bits, scale, code, a warp's row tile) are cuda_fp8_dev.cuh's. Must not hold:
// the GEMMs or any knowledge of layers.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_fp8.h"
#include "ops/cuda/cuda_fp8_dev.cuh"
#include "ops/numerics.h"

#define QT_COLS 32 // tiles_t: the columns of x one block takes
#define QT_MAXG 256 // tiles_t: groups per launch (QTArgs stays within the kernel-parameter space)

// ---------------------------------------------------------------- tiles along K
template <typename T>
__global__ void quant_tiles_k(uint8_t *q, float *s, const T *x, int M, int K, int tiles,
                              unsigned long long *bad) {
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x & 31;
    if (w >= (long long)M * tiles) return;
    int m = (int)(w / tiles), t = (int)(w % tiles);
    size_t row = (size_t)m * K;
    int c0 = t * 128 + lane * 4;
    float v[4];
    ld4(x, row + c0, c0, K, v);
    uint32_t amax = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) amax = max(amax, abs_bits(v[i]));
    warp_tile(q + row, s + (size_t)m * tiles + t, v, amax, c0, K, lane, bad);
}

extern "C" void cuda_fp8_quant_tiles(uint8_t *q, float *s, const void *x, int x_bf16, int M, int K,
                                     unsigned long long *bad) {
    if (M <= 0 || K <= 0) return;
    int tiles = (K + 127) / 128;
    long long warps = (long long)M * tiles;
    unsigned grid = (unsigned)((warps + 7) / 8);
    if (x_bf16) quant_tiles_k<<<grid, 256>>>(q, s, (const __nv_bfloat16 *)x, M, K, tiles, bad);
    else quant_tiles_k<<<grid, 256>>>(q, s, (const float *)x, M, K, tiles, bad);
    KCHECK("fp8_quant_tiles");
}

// ---------------------------------------------------------------- tiles along each group's rows (transposed)
struct QTArgs {
    int G, K;
    long long P; // the padded width
    int tstart[QT_MAXG + 1]; // the first 128-column tile of each group in q; tstart[G] = P / 128
    long long rstart[QT_MAXG + 1]; // each group's first row in x
};

template <typename T>
__global__ void __launch_bounds__(256)
    quant_tiles_t_k(uint8_t *q, float *s, const T *x, QTArgs a, unsigned long long *bad) {
    __shared__ float tile[128][QT_COLS + 1];
    __shared__ uint32_t part[8][QT_COLS];
    int j = blockIdx.x, lx = threadIdx.x & 31, ly = threadIdx.x >> 5;
    int lo = 0, hi = a.G; // the group g with tstart[g] <= j < tstart[g + 1] (empty groups have no tiles)
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (a.tstart[mid] <= j) lo = mid;
        else hi = mid;
    }
    int g = lo;
    long long r0 = a.rstart[g] + (long long)(j - a.tstart[g]) * 128;
    int rows = (int)min(128ll, a.rstart[g + 1] - r0);
    int k0 = blockIdx.y * QT_COLS, k = k0 + lx;
    uint32_t amax = 0;
    for (int r = ly; r < 128; r += 8) {
        float v = (r < rows && k < a.K) ? ldx(x, (size_t)(r0 + r) * a.K + k) : 0.0f;
        tile[r][lx] = v;
        amax = max(amax, abs_bits(v));
    }
    part[ly][lx] = amax;
    __syncthreads();
    // warp ly writes columns ly, ly + 8, ...: lane lx the codes of rows 4 lx .. 4 lx + 3 (one 32-bit store)
    for (int c = ly; c < QT_COLS; c += 8) {
        int kc = k0 + c;
        if (kc >= a.K) break;
        uint32_t m = 0;
#pragma unroll
        for (int i = 0; i < 8; i++) m = max(m, part[i][c]);
        float scale, inv;
        bool nf = group_scale(m, &scale, &inv);
        uint32_t word = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = lx * 4 + i;
            uint32_t b = r < rows ? code(tile[r][c], inv, nf) : 0u;
            word |= b << (8 * i);
        }
        size_t o = (size_t)kc * a.P + (size_t)j * 128;
        ((uint32_t *)(q + o))[lx] = word;
        if (lx == 0) {
            s[(size_t)kc * (a.P / 128) + j] = scale;
            if (nf && bad) atomicAdd(bad, 1ull);
        }
    }
}

extern "C" void cuda_fp8_quant_tiles_t(uint8_t *q, float *s, const void *x, int x_bf16, const int64_t *off,
                                       int G, int K, unsigned long long *bad) {
    long long P = cuda_fp8_pad_cols(off, G);
    if (P == 0 || K <= 0) return;
    // groups in launches of at most QT_MAXG; each launch writes its own tiles of the shared q and s
    for (int g0 = 0; g0 < G; g0 += QT_MAXG) {
        QTArgs a;
        a.G = G - g0 < QT_MAXG ? G - g0 : QT_MAXG;
        a.K = K;
        a.P = P;
        int t0 = (int)(cuda_fp8_pad_cols(off, g0) / 128);
        for (int g = 0; g <= a.G; g++) {
            a.tstart[g] = (int)(cuda_fp8_pad_cols(off, g0 + g) / 128) - t0;
            a.rstart[g] = off[g0 + g];
        }
        if (a.tstart[a.G] == 0) continue;
        // the kernel indexes q and s by tile within this launch: shift them to the launch's first tile
        dim3 grid((unsigned)a.tstart[a.G], (unsigned)((K + QT_COLS - 1) / QT_COLS));
        uint8_t *qg = q + (size_t)t0 * 128;
        float *sg = s + t0;
        if (x_bf16) quant_tiles_t_k<<<grid, 256>>>(qg, sg, (const __nv_bfloat16 *)x, a, bad);
        else quant_tiles_t_k<<<grid, 256>>>(qg, sg, (const float *)x, a, bad);
        KCHECK("fp8_quant_tiles_t");
    }
}

// ---------------------------------------------------------------- 128x128 blocks of the weights
// ilv 0: q (G, N, K) and s per block; ilv 1 or 2: q is a pair's (G, 2 N, K), this weight's row n at row
// n / 64 * 128 + (ilv - 1) * 64 + n % 64 of its group, and s that row's scale (G 2 N, ceil(K/128))
template <typename T>
__global__ void __launch_bounds__(256)
    quant_blocks_k(uint8_t *q, float *s, uint8_t *qt, float *st, const T *w, int N, int K, int ilv,
                   unsigned long long *bad) {
    __shared__ uint32_t red[8];
    __shared__ uint8_t codes[128][128 + 4];
    int bj = blockIdx.x, bi = blockIdx.y, g = blockIdx.z, BN = gridDim.y, BK = gridDim.x;
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    size_t base = (size_t)g * N * K;
    int n0 = bi * 128, c0 = bj * 128 + lane * 4;
    float v[16][4];
    uint32_t amax = 0;
#pragma unroll
    for (int i = 0; i < 16; i++) { // (a row's four values by one 8- or 16-byte load where aligned: ld4)
        int n = n0 + wp + 8 * i;
        if (n < N) ld4(w, base + (size_t)n * K + c0, c0, K, v[i]);
        else v[i][0] = v[i][1] = v[i][2] = v[i][3] = 0.0f;
#pragma unroll
        for (int e = 0; e < 4; e++) amax = max(amax, abs_bits(v[i][e]));
    }
    amax = __reduce_max_sync(0xffffffffu, amax);
    if (lane == 0) red[wp] = amax;
    __syncthreads();
    amax = 0;
#pragma unroll
    for (int i = 0; i < 8; i++) amax = max(amax, red[i]);
    float scale, inv;
    bool nf = group_scale(amax, &scale, &inv);
#pragma unroll
    for (int i = 0; i < 16; i++) {
        int r = wp + 8 * i, n = n0 + r;
        size_t qrow = ilv ? (size_t)g * 2 * N + n / 64 * 128 + (ilv - 1) * 64 + n % 64 : (size_t)g * N + n;
        uint32_t word = 0;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            uint32_t b = code(v[i][e], inv, nf);
            codes[r][lane * 4 + e] = (uint8_t)b;
            word |= b << (8 * e);
        }
        uint8_t *qr = q ? q + qrow * K + c0 : NULL; // (four codes in one store where all are in and aligned)
        if (qr && n < N && c0 + 3 < K && !((uintptr_t)qr & 3)) *(uint32_t *)qr = word;
        else if (qr && n < N)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (c0 + e < K) qr[e] = (uint8_t)(word >> (8 * e));
        if (ilv && s && lane == 0 && n < N) s[qrow * BK + bj] = scale;
    }
    if (threadIdx.x == 0) {
        if (s && !ilv) s[((size_t)g * BN + bi) * BK + bj] = scale;
        if (st) st[((size_t)g * BK + bj) * BN + bi] = scale;
        if (nf && bad) atomicAdd(bad, 1ull);
    }
    if (!qt) return;
    __syncthreads();
    // qt row k (= column of w) holds the block's codes of rows n0 .. n0 + 127: warp wp rows k = wp + 8 i
    int nn = n0 + lane * 4;
    for (int i = 0; i < 16; i++) {
        int kr = wp + 8 * i, k = bj * 128 + kr;
        if (k >= K) break;
        uint8_t *qr = qt + base + (size_t)k * N + nn; // (one store of four where all are in and aligned)
        if (nn + 3 < N && !((uintptr_t)qr & 3))
            *(uint32_t *)qr = (uint32_t)codes[lane * 4][kr] | (uint32_t)codes[lane * 4 + 1][kr] << 8 |
                (uint32_t)codes[lane * 4 + 2][kr] << 16 | (uint32_t)codes[lane * 4 + 3][kr] << 24;
        else
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (nn + e < N) qr[e] = codes[lane * 4 + e][kr];
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
