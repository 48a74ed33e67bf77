// cuda_fp8_dev.cuh — the device side of the FP8 (e4m3) quantisers, one definition for the plain quantisers
// (cuda_fp8.cu) and the fused ones (cuda_fp8_fused.cu), so that both give the host reference's bits: a
// value's bits for the integer max-abs, a scale group's power-of-two scale (ops/numerics.h's rule) and the
// codes by the cvt.rn.satfinite instruction. Device code only. Must not hold: kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include "ops/numerics.h"

__device__ __forceinline__ float ldx(const float *x, size_t i) { return x[i]; }
__device__ __forceinline__ float ldx(const __nv_bfloat16 *x, size_t i) { return __bfloat162float(x[i]); }

__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

// The code of v * inv (inv = 2^-k, exact) for a finite group; 0x7f for a non-finite one.
__device__ __forceinline__ uint32_t code(float v, float inv, bool bad) {
    return bad ? 0x7fu : (uint32_t)__nv_cvt_float_to_fp8(v * inv, __NV_SATFINITE, __NV_E4M3);
}

// The group's scale and inverse from its amax bits; returns whether it is non-finite.
__device__ __forceinline__ bool group_scale(uint32_t amax, float *scale, float *inv) {
    bool bad = amax >= 0x7f800000u;
    int k = bad ? 0 : fp8_scale_exp(amax);
    *scale = bad ? __int_as_float(0x7fc00000) : fp8_pow2(k);
    *inv = fp8_pow2(-k);
    return bad;
}
