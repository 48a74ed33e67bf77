// cuda_swiglu.cuh — the SwiGLU arithmetic of the CUDA backends, one definition for the plain kernels
// (cuda_nn.cu) and the grouped GEMM's epilogues (cuda_grouped.cu), so that fused and plain ops give the
// same bits: every operation explicit (no contraction, whatever the file's -fmad), left to right as the
// cpu's (cpu_nn.c) silu(a) h3 and its gradient. Device code only.
// The sigmoid's reciprocal 1 / (1 + exp(-a)) is the hardware's approximation refined by one Newton step
// (within an ulp of the IEEE quotient; 0 where the quotient is below 2^-126, i.e. a < -87.3), not the
// IEEE division, which calls a slow-path routine per value (128 calls in a GEMM epilogue). Measured
// (ncu, H200, same call): the SwiGLU backward kernel 3% faster, the forward unchanged. The cpu keeps the
// IEEE division: the two agree to the float32 band (test_cuda_ops).
#pragma once

__device__ __forceinline__ float swiglu_sigm(float a) {
    float d = __fadd_rn(1.0f, expf(-a)), r;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
    float n = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
    return r == 0.0f ? 0.0f : n; // d = inf: the step would make inf * 0
}
// silu(a) h3
__device__ __forceinline__ float swiglu_silu_mul(float a, float h3) {
    return __fmul_rn(__fmul_rn(a, swiglu_sigm(a)), h3);
}
// the gradients of silu(a) h3 given g: g1 = g h3 s (1 + a (1 - s)) (s = sigmoid(a)), g3 = g silu(a)
__device__ __forceinline__ void swiglu_grad(float g, float a, float h3, float *g1, float *g3) {
    float sg = swiglu_sigm(a), silu = __fmul_rn(a, sg);
    *g1 = __fmul_rn(__fmul_rn(__fmul_rn(g, h3), sg), __fadd_rn(1.0f, __fmul_rn(a, __fsub_rn(1.0f, sg))));
    *g3 = __fmul_rn(g, silu);
}
