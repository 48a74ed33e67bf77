// cuda_xent.cu — the cross-entropy of the cuda backends (contracts in ops/ops.h: cross_entropy_fwd,
// cross_entropy_fwd_bwd, and over TP ranks' column blocks ce_part / ce_finish), one block a row: its max,
// then its sum of exponentials (each expf, summed in double by a fixed block tree, cuda_common.h; the cpu
// reference takes each exp in double: the two agree to round-off), the gradient float32 or, on "cuda", bf16
// in place (the LM head's backward reads it so: ops.h GM_DOUT_HID). Built with -fmad=false (CMakeLists.txt),
// so the elementwise arithmetic rounds like the cpu code's.
// Must not hold: any knowledge of the model or of layers.
#include <math.h>
#include <cuda_bf16.h>
#include "ops/cuda/cuda_common.h"

// unit u of a row: values 4u .. 4u + 3 (VEC) or value u
template <int VEC> __device__ __forceinline__ void load_u(float *v, const float *x, int u);
template <> __device__ __forceinline__ void load_u<1>(float *v, const float *x, int u) {
    float4 a = ((const float4 *)x)[u];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
}
template <> __device__ __forceinline__ void load_u<0>(float *v, const float *x, int u) { v[0] = ld_f(x + u); }

// The row's lse from the threads' max mx and partial sums s (block_sum_d's tree), its loss by thread 0; with
// bwd a barrier after it, so that x[t] is read before any thread overwrites the row.
__device__ __forceinline__ float row_lse_loss(float *losses, const float *x, int t, float mx, double s,
                                              int bwd) {
    s = block_sum_d(s);
    float l = mx + (float)log(s);
    if (threadIdx.x == 0) losses[blockIdx.x] = l - ld_f(x + t);
    if (bwd) __syncthreads();
    return l;
}
// one dlogit: (softmax - onehot) dloss
__device__ __forceinline__ float dlogit(float v, float l, float dloss, int is_t) {
    float p = expf(v - l) * dloss;
    return is_t ? p - dloss : p;
}

// One block per row: max, then the sum of expf(x - max) in double, lse, loss; with
// dloss != 0 (fwd_bwd) the row is overwritten with (softmax - onehot) * dloss: float32, or (HID) each value
// rounded to bf16 in place from the row's start, a block's chunk of values at a time: chunk c's values land
// in float32 elements [c U B / 2, (c + 1) U B / 2) (B = blockDim.x), all read by chunk c's barrier. A thread
// takes U values at a time (VEC: a float4, V % 4 == 0 and the rows 16-byte aligned; else one).
// (Each exp in float and 256 threads on float4s: a double exp per logit and 1024 threads on single floats
// made this kernel ~4x its bytes' time at a 32000 vocabulary. Later: fused into the LM-head GEMM's epilogue.)
// A row's max (the block's, in every thread) and this thread's part of its sum of exponentials.
template <int VEC> __device__ __forceinline__ float row_stats(const float *x, int nu, double *ps) {
    const int U = VEC ? 4 : 1;
    float mx = -INFINITY;
#pragma unroll 4
    for (int u = threadIdx.x; u < nu; u += blockDim.x) {
        float v[U];
        load_u<VEC>(v, x, u);
#pragma unroll
        for (int k = 0; k < U; k++) mx = fmaxf(mx, v[k]);
    }
    mx = block_max_f(mx);
    double s = 0;
#pragma unroll 4
    for (int u = threadIdx.x; u < nu; u += blockDim.x) {
        float v[U];
        load_u<VEC>(v, x, u);
#pragma unroll
        for (int k = 0; k < U; k++) s += (double)expf(v[k] - mx);
    }
    *ps = s;
    return mx;
}

// The row overwritten with its dlogits (lse l; the onehot at column t, none where t is outside the row).
template <int HID, int VEC>
__device__ __forceinline__ void row_grad(float *x, int nu, float l, float dloss, int t) {
    const int U = VEC ? 4 : 1;
    for (int u0 = 0; u0 < nu; u0 += blockDim.x) { // (HID: every thread runs every chunk, for the barrier)
        int u = u0 + threadIdx.x;
        float p[U];
        if (u < nu) {
            load_u<VEC>(p, x, u);
#pragma unroll
            for (int k = 0; k < U; k++) p[k] = dlogit(p[k], l, dloss, u * U + k == t);
        }
        if (HID) __syncthreads();
        if (u >= nu) continue;
        if (!HID && VEC) store4(x + 4 * u, p[0], p[1], p[2], p[3]);
        else if (!HID) st_f(x + u, p[0]);
        else if (VEC) store4((__nv_bfloat16 *)x + 4 * u, p[0], p[1], p[2], p[3]);
        else ((__nv_bfloat16 *)x)[u] = __float2bfloat16_rn(p[0]);
    }
}

template <int HID, int VEC>
__global__ void __launch_bounds__(256)
    cross_entropy_k(float *losses, float *logits, const int32_t *targets, int V, float dloss, int bwd) {
    int nu = V / (VEC ? 4 : 1);
    size_t i = blockIdx.x;
    float *x = logits + i * V;
    double s;
    float mx = row_stats<VEC>(x, nu, &s);
    int t = targets[i];
    float l = row_lse_loss(losses, x, t, mx, s, bwd);
    if (bwd) row_grad<HID, VEC>(x, nu, l, dloss, t);
}

// ce_part (ops.h): a row's max, its sum of exponentials (cross_entropy_k's tree) and its target's logit (0
// where the target is another block's), 3 doubles a row.
template <int VEC>
__global__ void __launch_bounds__(256)
    ce_part_k(double *part, const float *logits, const int32_t *targets, int V) {
    size_t i = blockIdx.x;
    const float *x = logits + i * V;
    double s;
    float mx = row_stats<VEC>(x, V / (VEC ? 4 : 1), &s);
    s = block_sum_d(s);
    int t = targets[i];
    if (threadIdx.x == 0) {
        part[3 * i] = mx;
        part[3 * i + 1] = s;
        part[3 * i + 2] = t >= 0 && t < V ? ld_f(x + t) : 0.0;
    }
}

// ce_finish (ops.h): the n parts of row i combined (every thread the same sums, in block order), its loss,
// and with bwd its dlogits over this block's columns.
template <int HID, int VEC>
__global__ void __launch_bounds__(256)
    ce_finish_k(float *losses, float *logits, const double *parts, const int32_t *targets, int N, int V,
                int n, float dloss, int bwd) {
    size_t i = blockIdx.x;
    double M = -INFINITY, s = 0, tl = 0;
    for (int r = 0; r < n; r++) M = fmax(M, parts[((size_t)r * N + i) * 3]);
    for (int r = 0; r < n; r++) {
        const double *p = parts + ((size_t)r * N + i) * 3;
        s += p[1] * exp(p[0] - M);
        tl += p[2];
    }
    float l = (float)M + (float)log(s);
    if (threadIdx.x == 0) losses[i] = l - (float)tl;
    if (bwd) row_grad<HID, VEC>(logits + i * V, V / (VEC ? 4 : 1), l, dloss, targets[i]);
}

// The same with the row in registers (XR_T threads, XR_N float4s each: vocabularies of 16385-32768 in float4
// rows): read from memory once, every value written from registers after the loss's barrier (so the bf16
// writes overwrite nothing still to be read). Each value's arithmetic is cross_entropy_k's; its sums run in
// another order (the threads' values differ).
#define XR_T 1024
#define XR_N 8
template <int HID>
__global__ void __launch_bounds__(XR_T, 1)
    cross_entropy_reg_k(float *losses, float *logits, const int32_t *targets, int V, float dloss, int bwd) {
    int nu = V / 4;
    size_t i = blockIdx.x;
    float *x = logits + i * V;
    float v[XR_N][4];
    float mx = -INFINITY;
#pragma unroll
    for (int k = 0; k < XR_N; k++) {
        int u = threadIdx.x + k * XR_T;
        if (u < nu) load_u<1>(v[k], x, u);
        else v[k][0] = v[k][1] = v[k][2] = v[k][3] = -INFINITY;
        mx = fmaxf(mx, fmaxf(fmaxf(v[k][0], v[k][1]), fmaxf(v[k][2], v[k][3])));
    }
    mx = block_max_f(mx);
    double s = 0;
#pragma unroll
    for (int k = 0; k < XR_N; k++)
        if (threadIdx.x + k * XR_T < nu)
#pragma unroll
            for (int j = 0; j < 4; j++) s += (double)expf(v[k][j] - mx);
    int t = targets[i];
    float l = row_lse_loss(losses, x, t, mx, s, bwd);
    if (!bwd) return;
#pragma unroll
    for (int k = 0; k < XR_N; k++) {
        int u = threadIdx.x + k * XR_T;
        if (u >= nu) continue;
        float p[4];
#pragma unroll
        for (int j = 0; j < 4; j++) p[j] = dlogit(v[k][j], l, dloss, u * 4 + j == t);
        if (HID) store4((__nv_bfloat16 *)x + 4 * u, p[0], p[1], p[2], p[3]);
        else store4(x + 4 * u, p[0], p[1], p[2], p[3]);
    }
}

// The kernel for the row length and the logits' alignment (the register-resident one for V in (4 XR_T XR_N /
// 2, 4 XR_T XR_N], float4 accesses where V % 4 == 0 and logits is 16-byte aligned), one block a row.
template <int HID>
static void xent_launch(float *losses, float *logits, const int32_t *targets, int N, int V, float dloss,
                        int bwd) {
    int vec = V % 4 == 0 && !((uintptr_t)logits % 16);
    if (vec && V > 4 * XR_T * XR_N / 2 && V <= 4 * XR_T * XR_N)
        cross_entropy_reg_k<HID><<<N, XR_T>>>(losses, logits, targets, V, dloss, bwd);
    else if (vec) cross_entropy_k<HID, 1><<<N, 256>>>(losses, logits, targets, V, dloss, bwd);
    else cross_entropy_k<HID, 0><<<N, 256>>>(losses, logits, targets, V, dloss, bwd);
}

// "cuda-fp32" (hidden format float32) and "cuda" (bf16)
extern "C" void cuda_cross_entropy_fwd_bwd_f32(float *losses, float *logits, const int32_t *targets, int N,
                                               int V, float dloss) {
    if (N <= 0) return;
    xent_launch<0>(losses, logits, targets, N, V, dloss, 1);
    KCHECK("cross_entropy_fwd_bwd");
}
extern "C" void cuda_cross_entropy_fwd_bwd_bf16(float *losses, float *logits, const int32_t *targets, int N,
                                                int V, float dloss) {
    if (N <= 0) return;
    xent_launch<1>(losses, logits, targets, N, V, dloss, 1);
    KCHECK("cross_entropy_fwd_bwd (bf16 dlogits)");
}

extern "C" void cuda_cross_entropy_fwd(float *losses, const float *logits, const int32_t *targets, int N,
                                       int V) {
    if (N <= 0) return;
    // bwd = 0: the kernel never writes logits
    xent_launch<0>(losses, (float *)logits, targets, N, V, 0.0f, 0);
    KCHECK("cross_entropy_fwd");
}

// The vocab-parallel parts (one block a row; float4 reads where the row allows: n = 1 gives cross_entropy_k's
// bits, not cross_entropy_reg_k's)
extern "C" void cuda_ce_part(double *part, const float *logits, const int32_t *targets, int N, int V) {
    if (N <= 0) return;
    if (V % 4 == 0 && !((uintptr_t)logits % 16)) ce_part_k<1><<<N, 256>>>(part, logits, targets, V);
    else ce_part_k<0><<<N, 256>>>(part, logits, targets, V);
    KCHECK("ce_part");
}
template <int HID>
static void ce_finish_launch(float *losses, float *logits, const double *parts, const int32_t *targets, int N,
                             int V, int n, float dloss) {
    if (N <= 0) return;
    int bwd = dloss != 0;
    if (V % 4 == 0 && !((uintptr_t)logits % 16))
        ce_finish_k<HID, 1><<<N, 256>>>(losses, logits, parts, targets, N, V, n, dloss, bwd);
    else ce_finish_k<HID, 0><<<N, 256>>>(losses, logits, parts, targets, N, V, n, dloss, bwd);
    KCHECK("ce_finish");
}
extern "C" void cuda_ce_finish_f32(float *losses, float *logits, const double *parts, const int32_t *targets,
                                   int N, int V, int n, float dloss) {
    ce_finish_launch<0>(losses, logits, parts, targets, N, V, n, dloss);
}
extern "C" void cuda_ce_finish_bf16(float *losses, float *logits, const double *parts, const int32_t *targets,
                                    int N, int V, int n, float dloss) {
    ce_finish_launch<1>(losses, logits, parts, targets, N, V, n, dloss);
}
