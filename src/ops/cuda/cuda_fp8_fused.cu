// cuda_fp8_fused.cu — the fused FP8 quantisers (contracts in cuda_fp8_fused.h): each reads its operand once
// and writes every layout the GEMMs take, with the element arithmetic of the kernels it replaces (the
// SwiGLU's from cuda_swiglu.cuh, the quantisation's from cuda_fp8_dev.cuh), so the bits are theirs.
//   both:        one block of 512 threads per (128-row tile of one group) x (128 columns): each warp takes
//                8 rows, a lane four consecutive columns, so a warp holds one 1x128 row tile (a warp max
//                gives its scale: the row layout is written from registers); the values are staged in shared
//                memory (in the operand's own format: its values exactly) and each warp then takes 8
//                columns, a lane four rows, for the transposed tiles (a 32-bit store of four codes a lane).
//                Without the row layout it is cuda_fp8.h's tiles_t;
//   swiglu_bwd:  the same block with two staged tiles (dh1, dh3), the gradients computed as they are loaded;
//   swiglu_fwd:  one warp per 1x128 tile of act, four elements a lane.
// Must not hold: the GEMMs, or any knowledge of layers.
#include <cuda_bf16.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_fp8.h"
#include "ops/cuda/cuda_fp8_dev.cuh"
#include "ops/cuda/cuda_fp8_fused.h"
#include "ops/cuda/cuda_swiglu.cuh"

typedef __nv_bfloat16 bf16;

#define QB_MAXG 256 // groups per launch (QBArgs stays within the kernel-parameter space)
#define QB_WARPS 16 // both: the warps of a block (8 a block: 0.64 against 0.60 ms on the SwiGLU backward's)

// A value stored in the operand's format and read back: float32 as it is, bf16 rounded to nearest even.
__device__ __forceinline__ float val(float v) { return v; }
__device__ __forceinline__ float val(bf16 v) { return __bfloat162float(v); }
template <typename T> __device__ __forceinline__ T put(float v);
template <> __device__ __forceinline__ float put<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16 put<bf16>(float v) { return __float2bfloat16_rn(v); }

struct QBArgs {
    int G, K;
    long long P; // the transposed layout's padded width
    long long row0; // the groups' first row: row layout row 0
    int tstart[QB_MAXG + 1]; // each group's first 128-row tile in this launch; tstart[G] = the launch's tiles
    long long rstart[QB_MAXG + 1]; // each group's first row
};

// One operand's outputs: the row layout (q, s: not shifted) and this launch's transposed tiles (qt, st
// shifted to the launch's first tile), and its count.
struct QBOut {
    uint8_t *q, *qt;
    float *s, *st;
    unsigned long long *bad;
};

// The row tile of row r (its four values a lane in v, lane's max-abs bits m): codes and scale.
__device__ __forceinline__ void row_tile(const QBOut &o, const float *v, uint32_t m, size_t qrow, int K,
                                         int c0, int kt, int nkt, int lane) {
    warp_tile(o.q + qrow * K, o.s + qrow * nkt + kt, v, m, c0, K, lane, o.bad);
}

// The transposed tile of column k (staged column c of `tile`, rows 0..rows-1 valid, the rest zeros) of the
// launch's 128-row tile j: four codes a lane in one 32-bit store.
template <typename T, int TP>
__device__ __forceinline__ void col_tile(const QBOut &o, const T *tile, int c, int rows, long long k,
                                         long long P, int j, int lane) {
    float v[4];
    uint32_t m = 0;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        v[e] = val(tile[(lane * 4 + e) * TP + c]);
        m = max(m, abs_bits(v[e]));
    }
    m = __reduce_max_sync(0xffffffffu, m);
    float scale, inv;
    bool nf = group_scale(m, &scale, &inv);
    uint32_t word = 0;
#pragma unroll
    for (int e = 0; e < 4; e++) word |= (lane * 4 + e < rows ? code(v[e], inv, nf) : 0u) << (8 * e);
    ((uint32_t *)(o.qt + (size_t)k * P + (size_t)j * 128))[lane] = word;
    if (lane == 0) {
        o.st[(size_t)k * (P / 128) + j] = scale;
        note_group(o.bad, nf, m);
    }
}

// Four values at p as T (one 16-byte float32 / 8-byte bf16 store where all are in and aligned; else those
// below n only, one at a time)
template <typename T> __device__ __forceinline__ void st4(T *p, const float *v, int c, int n) {
    if (c + 3 < n && !((uintptr_t)p & (4 * sizeof(T) - 1))) store4(p, v[0], v[1], v[2], v[3]);
    else
        for (int e = 0; e < 4 && c + e < n; e++) store1(p + e, v[e]);
}

// SW 0: x's values (format T) in both layouts into o1 (the row layout only where o1.q is not NULL). SW 1:
// dh1, dh3 (format T) = the SwiGLU's gradients of dact, h1, h3, written, and each in both layouts (o1, o3).
// QB_WARPS warps: warp wp takes rows wp, wp + QB_WARPS, ..., then columns wp, wp + QB_WARPS, ...
template <typename T, int SW>
__global__ void __launch_bounds__(QB_WARPS * 32)
    quant_both_k(QBArgs a, const T *x, const float *dact, const T *h1, const T *h3, T *dh1, T *dh3, QBOut o1,
                 QBOut o3) {
    constexpr int TP = 128 + (sizeof(T) == 4 ? 1 : 2); // (a row's stride: off the banks' period)
    extern __shared__ __align__(16) unsigned char smem[];
    T *t1 = (T *)smem, *t3 = t1 + 128 * TP;
    int j = blockIdx.x, lane = threadIdx.x & 31, wp = threadIdx.x >> 5;
    int lo = 0, hi = a.G; // the group g with tstart[g] <= j < tstart[g + 1] (empty groups have no tiles)
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (a.tstart[mid] <= j) lo = mid;
        else hi = mid;
    }
    int g = lo;
    long long r0 = a.rstart[g] + (long long)(j - a.tstart[g]) * 128;
    int rows = (int)min(128ll, a.rstart[g + 1] - r0);
    int kt = blockIdx.y, nkt = (a.K + 127) / 128, c0 = kt * 128 + lane * 4;
    for (int r = wp; r < 128; r += QB_WARPS) { // (uniform over the warp)
        size_t row = (size_t)(r0 + r) * a.K;
        float v1[4] = {0.0f, 0.0f, 0.0f, 0.0f}, v3[4] = {0.0f, 0.0f, 0.0f, 0.0f}, d4[4], a4[4], b4[4];
        uint32_t m1 = 0, m3 = 0;
        if (!SW && r < rows) ld4(x, row + c0, c0, a.K, v1); // (zeros past K)
        if (SW && r < rows) {
            ld4(dact, row + c0, c0, a.K, d4);
            ld4(h1, row + c0, c0, a.K, a4);
            ld4(h3, row + c0, c0, a.K, b4);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            if (SW && r < rows && c0 + e < a.K) {
                float g1, g3;
                swiglu_grad(d4[e], a4[e], b4[e], &g1, &g3);
                v1[e] = val(put<T>(g1)), v3[e] = val(put<T>(g3)); // (the values stored: rounded once)
            }
            t1[r * TP + lane * 4 + e] = put<T>(v1[e]); // (exact: v1 is a value of T)
            m1 = max(m1, abs_bits(v1[e]));
            if (SW) {
                t3[r * TP + lane * 4 + e] = put<T>(v3[e]);
                m3 = max(m3, abs_bits(v3[e]));
            }
        }
        if (r >= rows) continue;
        if (SW) { // (one 8- or 16-byte store a lane: scalar stores left the kernel bound by L2's writes)
            st4(dh1 + row + c0, v1, c0, a.K);
            st4(dh3 + row + c0, v3, c0, a.K);
        }
        if (!o1.q) continue;
        size_t qrow = (size_t)(r0 + r - a.row0);
        row_tile(o1, v1, m1, qrow, a.K, c0, kt, nkt, lane);
        if (SW) row_tile(o3, v3, m3, qrow, a.K, c0, kt, nkt, lane);
    }
    __syncthreads();
    for (int c = wp; c < 128; c += QB_WARPS) {
        long long k = (long long)kt * 128 + c;
        if (k >= a.K) break;
        col_tile<T, TP>(o1, t1, c, rows, k, a.P, j, lane);
        if (SW) col_tile<T, TP>(o3, t3, c, rows, k, a.P, j, lane);
    }
}

template <typename T, int SW> static size_t both_smem(void) {
    return (size_t)128 * (128 + (sizeof(T) == 4 ? 1 : 2)) * sizeof(T) * (SW ? 2 : 1);
}

// The launches over groups of at most QB_MAXG (each writes its own transposed tiles and its groups' rows).
template <typename T, int SW>
static void launch_both(const int64_t *off, int G, int K, const void *x, const float *dact, const void *h1,
                        const void *h3, void *dh1, void *dh3, Fp8Both b1, Fp8Both b3,
                        unsigned long long *bad1, unsigned long long *bad3) {
    long long P = cuda_fp8_pad_cols(off, G);
    if (P == 0 || K <= 0) return;
    size_t smem = both_smem<T, SW>();
    static int attr; // (the shared-memory opt-in, once per instantiation)
    if (!attr) {
        CUDA_CHECK(cudaFuncSetAttribute(quant_both_k<T, SW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)smem));
        attr = 1;
    }
    for (int g0 = 0; g0 < G; g0 += QB_MAXG) {
        QBArgs a;
        a.G = G - g0 < QB_MAXG ? G - g0 : QB_MAXG;
        a.K = K;
        a.P = P;
        a.row0 = off[0];
        int t0 = (int)(cuda_fp8_pad_cols(off, g0) / 128);
        for (int g = 0; g <= a.G; g++) {
            a.tstart[g] = (int)(cuda_fp8_pad_cols(off, g0 + g) / 128) - t0;
            a.rstart[g] = off[g0 + g];
        }
        if (a.tstart[a.G] == 0) continue;
        QBOut o1 = {b1.q, b1.qt + (size_t)t0 * 128, b1.s, b1.st + t0, bad1};
        QBOut o3 = {b3.q, b3.qt ? b3.qt + (size_t)t0 * 128 : NULL, b3.s, b3.st ? b3.st + t0 : NULL, bad3};
        dim3 grid((unsigned)a.tstart[a.G], (unsigned)((K + 127) / 128));
        quant_both_k<T, SW><<<grid, QB_WARPS * 32, smem>>>(a, (const T *)x, dact, (const T *)h1,
                                                           (const T *)h3, (T *)dh1, (T *)dh3, o1, o3);
        KCHECK(SW ? "fp8_swiglu_bwd_both" : "fp8_quant_both");
    }
}

extern "C" void cuda_fp8_quant_both(Fp8Both b, const void *x, int x_bf16, const int64_t *off, int G, int K,
                                    unsigned long long *bad) {
    Fp8Both none = {NULL, NULL, NULL, NULL};
    if (x_bf16) launch_both<bf16, 0>(off, G, K, x, NULL, NULL, NULL, NULL, NULL, b, none, bad, NULL);
    else launch_both<float, 0>(off, G, K, x, NULL, NULL, NULL, NULL, NULL, b, none, bad, NULL);
}

// (cuda_fp8.h's transposed tiling alone: the same kernel without the row layout)
extern "C" void cuda_fp8_quant_tiles_t(uint8_t *q, float *s, const void *x, int x_bf16, const int64_t *off,
                                       int G, int K, unsigned long long *bad) {
    Fp8Both b = {NULL, q, NULL, s};
    cuda_fp8_quant_both(b, x, x_bf16, off, G, K, bad);
}

extern "C" void cuda_fp8_swiglu_bwd_both(void *dh1, void *dh3, int hid_bf16, const float *dact,
                                         const void *h1, const void *h3, const int64_t *off, int G, int K,
                                         Fp8Both b1, Fp8Both b3, unsigned long long *bad1,
                                         unsigned long long *bad3) {
    if (hid_bf16) launch_both<bf16, 1>(off, G, K, NULL, dact, h1, h3, dh1, dh3, b1, b3, bad1, bad3);
    else launch_both<float, 1>(off, G, K, NULL, dact, h1, h3, dh1, dh3, b1, b3, bad1, bad3);
}

// ---------------------------------------------------------------- the SwiGLU forward with act's tiles
template <typename T>
__global__ void swiglu_fwd_tiles_k(T *act, T *h1o, T *h3o, const float *h1, const float *h3, int M, int O,
                                   int tiles, uint8_t *q, float *s, unsigned long long *bad) {
    long long w = ((long long)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    int lane = threadIdx.x & 31;
    if (w >= (long long)M * tiles) return; // (uniform over the warp)
    int m = (int)(w / tiles), t = (int)(w % tiles);
    size_t row = (size_t)m * O;
    int c0 = t * 128 + lane * 4;
    float v[4];
    uint32_t amax = 0;
#pragma unroll
    for (int e = 0; e < 4; e++) {
        int c = c0 + e;
        v[e] = 0.0f;
        if (c < O) {
            float a = h1[row + c], b = h3[row + c];
            T o = put<T>(swiglu_silu_mul(a, b));
            act[row + c] = o;
            if (h1o) {
                h1o[row + c] = put<T>(a);
                h3o[row + c] = put<T>(b);
            }
            v[e] = val(o);
        }
        amax = max(amax, abs_bits(v[e]));
    }
    warp_tile(q + row, s + (size_t)m * tiles + t, v, amax, c0, O, lane, bad);
}

extern "C" void cuda_fp8_swiglu_fwd_tiles(void *act, void *h1o, void *h3o, int hid_bf16, const float *h1,
                                          const float *h3, int M, int O, uint8_t *q, float *s,
                                          unsigned long long *bad) {
    if (M <= 0 || O <= 0) return;
    int tiles = (O + 127) / 128;
    long long warps = (long long)M * tiles;
    unsigned grid = (unsigned)((warps + 7) / 8);
    if (hid_bf16)
        swiglu_fwd_tiles_k<bf16>
            <<<grid, 256>>>((bf16 *)act, (bf16 *)h1o, (bf16 *)h3o, h1, h3, M, O, tiles, q, s, bad);
    else
        swiglu_fwd_tiles_k<float>
            <<<grid, 256>>>((float *)act, (float *)h1o, (float *)h3o, h1, h3, M, O, tiles, q, s, bad);
    KCHECK("fp8_swiglu_fwd_tiles");
}
