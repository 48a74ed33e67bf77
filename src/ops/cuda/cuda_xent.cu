// cuda_xent.cu — the cross-entropy of the cuda backends (contracts in ops/ops.h: cross_entropy_fwd,
// cross_entropy_fwd_bwd), one block a row: its max and sum of exponentials in double by a fixed block tree
// (cuda_common.h), as the cpu reference sums; the gradient float32 or, on "cuda", bf16 in place (hid 1, the
// LM head's backward reads it so: ops.h GM_DOUT_HID). Built with -fmad=false (CMakeLists.txt), so the
// elementwise arithmetic rounds like the cpu code's.
// Must not hold: any knowledge of the model or of layers.
#include <math.h>
#include <cuda_bf16.h>
#include "ops/cuda/cuda_common.h"

// One block per row: max, then sum of exp in double (as the cpu reference), lse, loss; with
// dloss != 0 (fwd_bwd) the row is overwritten with (softmax - onehot) * dloss: float32, or (HID) each value
// rounded to bf16 in place from the row's start, a block's chunk of values at a time: chunk c's values land
// in float32 elements [c B / 2, (c + 1) B / 2) (B = blockDim.x), all read by chunk c's barrier.
// Later: one pass with an online max, and fused into the LM-head GEMM's epilogue.
template <int HID>
__global__ void __launch_bounds__(1024)
    cross_entropy_k(float *losses, float *logits, const int32_t *targets, int V, float dloss, int bwd) {
    size_t i = blockIdx.x;
    float *x = logits + i * V;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, ld_f(x + j));
    mx = block_max_f(mx);
    double s = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += exp((double)ld_f(x + j) - mx);
    s = block_sum_d(s);
    float l = mx + (float)log(s);
    int t = targets[i];
    if (threadIdx.x == 0) losses[i] = l - ld_f(x + t);
    if (!bwd) return;
    __syncthreads(); // x[t] is read above before any thread overwrites it
    if (!HID) {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            float p = expf(ld_f(x + j) - l) * dloss;
            st_f(x + j, j == t ? p - dloss : p);
        }
        return;
    }
    __nv_bfloat16 *y = (__nv_bfloat16 *)x;
    for (int j0 = 0; j0 < V; j0 += blockDim.x) { // (every thread runs every chunk: the barrier)
        int j = j0 + threadIdx.x;
        float p = 0;
        if (j < V) {
            p = expf(ld_f(x + j) - l) * dloss;
            if (j == t) p = p - dloss;
        }
        __syncthreads();
        if (j < V) y[j] = __float2bfloat16_rn(p);
    }
}

// "cuda-fp32" (hidden format float32: hid changes nothing) and "cuda" (bf16)
extern "C" void cuda_cross_entropy_fwd_bwd_f32(float *losses, float *logits, const int32_t *targets, int N,
                                               int V, float dloss, int hid) {
    (void)hid;
    if (N <= 0) return;
    cross_entropy_k<0><<<N, V >= 4096 ? 1024 : 256>>>(losses, logits, targets, V, dloss, 1);
    KCHECK("cross_entropy_fwd_bwd");
}
extern "C" void cuda_cross_entropy_fwd_bwd_bf16(float *losses, float *logits, const int32_t *targets, int N,
                                                int V, float dloss, int hid) {
    if (!hid) {
        cuda_cross_entropy_fwd_bwd_f32(losses, logits, targets, N, V, dloss, 0);
        return;
    }
    if (N <= 0) return;
    cross_entropy_k<1><<<N, V >= 4096 ? 1024 : 256>>>(losses, logits, targets, V, dloss, 1);
    KCHECK("cross_entropy_fwd_bwd (bf16 dlogits)");
}

extern "C" void cuda_cross_entropy_fwd(float *losses, const float *logits, const int32_t *targets, int N,
                                       int V) {
    if (N <= 0) return;
    // bwd = 0: the kernel never writes logits
    cross_entropy_k<0><<<N, V >= 4096 ? 1024 : 256>>>(losses, (float *)logits, targets, V, 0.0f, 0);
    KCHECK("cross_entropy_fwd");
}
