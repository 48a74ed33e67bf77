// cuda_elementwise.cu — the cuda backend's elementwise float32 kernels (contracts in ops/ops.h): dropout
// (the mask of ops.h dropout_keep), SwiGLU forward and backward (float32 and the hidden format's bf16 rows,
// the act of --fp8-save's backward), mul, sigmoid, add, axpy. Built with -fmad=false (CMakeLists.txt), so
// each rounds as the cpu code does. Rows, the embedding and the router are in cuda_nn.cu.
// Must not hold: any knowledge of the model or of layers.
#include <math.h>
#include <cuda_bf16.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_swiglu.cuh"

// ---------------------------------------------------------------- dropout (ops.h: the mask of dropout_keep)

__global__ void dropout_k(float *x, int B, int T, int t0, int n, int C, uint32_t thr, float scale,
                          uint64_t seed, int64_t row0) {
    GRID_STRIDE(e, (size_t)B * n * C) {
        int c = (int)(e % C);
        size_t i = e / C;
        int b = (int)(i / n), t = t0 + (int)(i % n);
        int64_t g = row0 + (int64_t)b * T + t;
        st_f(x + e, dropout_keep(seed, g, c, thr) ? ld_f(x + e) * scale : 0.0f);
    }
}

extern "C" void cuda_dropout(float *x, int B, int T, int t0, int t1, int C, float p, uint64_t seed,
                             int64_t row0) {
    size_t n = (size_t)B * (t1 - t0) * C;
    if (!n || p <= 0) return;
    dropout_k<<<ew_grid(n, 256), 256>>>(x, B, T, t0, t1 - t0, C, dropout_threshold(p), 1.0f / (1.0f - p),
                                        seed, row0);
    KCHECK("dropout");
}

// ---------------------------------------------------------------- SwiGLU

// element loads and stores of float32 or bf16 (round to nearest even) rows
__device__ __forceinline__ float ld_h(const float *p) { return ld_f(p); }
__device__ __forceinline__ float ld_h(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st_h(float *p, float x) { st_f(p, x); }
__device__ __forceinline__ void st_h(__nv_bfloat16 *p, float x) { *p = __float2bfloat16_rn(x); }

// out = silu(h1) h3 of h1, h3 as S; with h1o, h3o (the hidden format's fallback) also h1, h3 stored again as
// D
template <typename D, typename S = float>
__global__ void swiglu_fwd_k(D *out, D *h1o, D *h3o, const S *h1, const S *h3, size_t n) {
    GRID_STRIDE(i, n) {
        float a = ld_h(h1 + i), b = ld_h(h3 + i);
        st_h(out + i, swiglu_silu_mul(a, b));
        if (h1o) {
            st_h(h1o + i, a);
            st_h(h3o + i, b);
        }
    }
}

// accumulate 0: dh1/dh3 are only written (not read), 1: read and added to
template <int ACC, typename H>
__global__ void swiglu_bwd_k(H *dh1, H *dh3, const float *dout, const H *h1, const H *h3, size_t n) {
    GRID_STRIDE(i, n) {
        float g1, g3;
        swiglu_grad(ld_f(dout + i), ld_h(h1 + i), ld_h(h3 + i), &g1, &g3);
        st_h(dh1 + i, ACC ? ld_h(dh1 + i) + g1 : g1);
        st_h(dh3 + i, ACC ? ld_h(dh3 + i) + g3 : g3);
    }
}

extern "C" void cuda_swiglu_fwd(float *out, const float *h1, const float *h3, size_t n) {
    if (!n) return;
    swiglu_fwd_k<float><<<ew_grid(n, 256), 256>>>(out, NULL, NULL, h1, h3, n);
    KCHECK("swiglu_fwd");
}

extern "C" void cuda_swiglu_fwd_hid(void *h1, void *h3, void *act, const float *h1f, const float *h3f,
                                    size_t n) {
    if (!n) return;
    typedef __nv_bfloat16 bf16;
    swiglu_fwd_k<bf16><<<ew_grid(n, 256), 256>>>((bf16 *)act, (bf16 *)h1, (bf16 *)h3, h1f, h3f, n);
    KCHECK("swiglu_fwd (bf16 rows)");
}

extern "C" void cuda_swiglu_act_hid(void *act, const void *h1, const void *h3, size_t n) {
    if (!n) return;
    typedef __nv_bfloat16 bf16;
    swiglu_fwd_k<bf16, bf16>
        <<<ew_grid(n, 256), 256>>>((bf16 *)act, NULL, NULL, (const bf16 *)h1, (const bf16 *)h3, n);
    KCHECK("swiglu act (bf16 rows)");
}

extern "C" void cuda_swiglu_bwd_hid(void *dh1, void *dh3, const float *dout, const void *h1, const void *h3,
                                    size_t n) {
    if (!n) return;
    typedef __nv_bfloat16 bf16;
    swiglu_bwd_k<0, bf16>
        <<<ew_grid(n, 256), 256>>>((bf16 *)dh1, (bf16 *)dh3, dout, (const bf16 *)h1, (const bf16 *)h3, n);
    KCHECK("swiglu_bwd (bf16 rows)");
}

extern "C" void cuda_swiglu_bwd(float *dh1, float *dh3, const float *dout, const float *h1, const float *h3,
                                size_t n, int accumulate) {
    if (!n) return;
    if (accumulate) swiglu_bwd_k<1, float><<<ew_grid(n, 256), 256>>>(dh1, dh3, dout, h1, h3, n);
    else swiglu_bwd_k<0, float><<<ew_grid(n, 256), 256>>>(dh1, dh3, dout, h1, h3, n);
    KCHECK("swiglu_bwd");
}

// ---------------------------------------------------------------- elementwise

__global__ void mul_k(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) st_f(out + i, ld_f(a + i) * ld_f(b + i));
}
__global__ void axpy_k(float *y, const float *x, float a, size_t n) {
    GRID_STRIDE(i, n) st_f(y + i, ld_f(y + i) + a * ld_f(x + i));
}

extern "C" void cuda_mul(float *out, const float *a, const float *b, size_t n) {
    cuda_bf16_shadow_write(out, n * sizeof(float));
    if (!n) return;
    mul_k<<<ew_grid(n, 256), 256>>>(out, a, b, n);
    KCHECK("mul");
}
__global__ void sigmoid_k(float *out, const float *inp, size_t n) {
    GRID_STRIDE(i, n) st_f(out + i, __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-ld_f(inp + i)))));
}
__global__ void sigmoid_bwd_k(float *dinp, const float *dout, const float *out, size_t n) {
    GRID_STRIDE(i, n) {
        float s = ld_f(out + i);
        st_f(dinp + i, __fmul_rn(ld_f(dout + i), __fmul_rn(s, __fsub_rn(1.0f, s))));
    }
}
extern "C" void cuda_sigmoid_fwd(float *out, const float *inp, size_t n) {
    cuda_bf16_shadow_write(out, n * sizeof(float));
    if (!n) return;
    sigmoid_k<<<ew_grid(n, 256), 256>>>(out, inp, n);
    KCHECK("sigmoid_fwd");
}
extern "C" void cuda_sigmoid_bwd(float *dinp, const float *dout, const float *out, size_t n) {
    cuda_bf16_shadow_write(dinp, n * sizeof(float));
    if (!n) return;
    sigmoid_bwd_k<<<ew_grid(n, 256), 256>>>(dinp, dout, out, n);
    KCHECK("sigmoid_bwd");
}
__global__ void add_k(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n / 4) {
        float4 u = ((const float4 *)a)[i], v = ((const float4 *)b)[i];
        ((float4 *)out)[i] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
    }
    size_t t = blockIdx.x * (size_t)blockDim.x + threadIdx.x; // the last n % 4
    if (t < n % 4) out[n / 4 * 4 + t] = a[n / 4 * 4 + t] + b[n / 4 * 4 + t];
}
__global__ void add1_k(float *out, const float *a, const float *b, size_t n) {
    GRID_STRIDE(i, n) st_f(out + i, ld_f(a + i) + ld_f(b + i));
}
extern "C" void cuda_add(float *out, const float *a, const float *b, size_t n) {
    cuda_bf16_shadow_write(out, n * sizeof(float));
    if (!n) return;
    if (((uintptr_t)out | (uintptr_t)a | (uintptr_t)b) % 16) add1_k<<<ew_grid(n, 256), 256>>>(out, a, b, n);
    else add_k<<<ew_grid(n / 4 + 1, 256), 256>>>(out, a, b, n);
    KCHECK("add");
}
extern "C" void cuda_axpy(float *y, const float *x, float a, size_t n) {
    cuda_bf16_shadow_write(y, n * sizeof(float));
    if (!n) return;
    axpy_k<<<ew_grid(n, 256), 256>>>(y, x, a, n);
    KCHECK("axpy");
}
