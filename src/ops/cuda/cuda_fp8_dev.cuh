// cuda_fp8_dev.cuh — the device side of the FP8 (e4m3) quantisers, one definition for the plain quantisers
// (cuda_fp8.cu) and the fused ones (cuda_fp8_fused.cu), so that both give the host reference's bits: a
// value's bits for the integer max-abs, a scale group's power-of-two scale (ops/numerics.h's rule), the
// codes by the cvt.rn.satfinite instruction, four values' loads (ld4 as float32, ldraw as stored), and the
// one warp's 1x128 row tile they all write (warp_tile), and the group's counter (note_group).
// Device code only. Must not hold: kernels.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>
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

// A scale group quantised, into its counter (cuda_fp8.h FP8_CNT): a non-finite one counted in bad[0], a
// finite one's amax (1 + its bits) raised into bad[1]. The max is read first, as cached (a stale value
// costs an atomic, not a wrong result): after the first groups of a step nearly none issues one.
__device__ __forceinline__ void note_group(unsigned long long *bad, bool nf, uint32_t amax) {
    if (!bad) return;
    if (nf) atomicAdd(bad, 1ull);
    else if ((unsigned long long)amax + 1 > bad[1]) atomicMax(bad + 1, (unsigned long long)amax + 1);
}

// Four consecutive values x[i .. i + 3] as float32 (one 16- or 8-byte load where aligned), zeros at and past
// n (the row's end: i counted in the same row as n).
__device__ __forceinline__ void ld4(const float *x, size_t i, int c, int n, float *v) {
    if (c + 3 < n && !((uintptr_t)(x + i) & 15)) {
        float4 t = *(const float4 *)(x + i);
        v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
        return;
    }
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] = c + e < n ? x[i + e] : 0.0f;
}

// A row's four values as loaded: bf16 ones as their two raw pairs (half the registers of float32 values,
// which took the weights' blocks kernel from 0.27 to 0.15 ms on a reference-model weight), float32 ones as
// they are; get(e) the value of column e as float32. ldraw loads them as ld4 does (zeros at and past n).
struct Raw4b {
    uint2 u;
    __device__ __forceinline__ float get(int e) const {
        uint32_t w = e < 2 ? u.x : u.y;
        return __uint_as_float(e & 1 ? w & 0xffff0000u : w << 16);
    }
};
struct Raw4f {
    float4 f;
    __device__ __forceinline__ float get(int e) const {
        return e == 0 ? f.x : e == 1 ? f.y : e == 2 ? f.z : f.w;
    }
};
__device__ __forceinline__ void ldraw(const __nv_bfloat16 *x, size_t i, int c, int n, Raw4b *r) {
    if (c + 3 < n && !((uintptr_t)(x + i) & 7)) {
        r->u = *(const uint2 *)(x + i);
        return;
    }
    uint16_t h[4];
#pragma unroll
    for (int e = 0; e < 4; e++) h[e] = c + e < n ? __bfloat16_as_ushort(x[i + e]) : 0;
    r->u = make_uint2(h[0] | (uint32_t)h[1] << 16, h[2] | (uint32_t)h[3] << 16);
}
__device__ __forceinline__ void ldraw(const float *x, size_t i, int c, int n, Raw4f *r) {
    float v[4];
    ld4(x, i, c, n, v);
    r->f = make_float4(v[0], v[1], v[2], v[3]);
}
__device__ __forceinline__ void ld4(const __nv_bfloat16 *x, size_t i, int c, int n, float *v) {
    Raw4b r;
    ldraw(x, i, c, n, &r);
#pragma unroll
    for (int e = 0; e < 4; e++) v[e] = r.get(e);
}

// One warp's 1x128 tile of a row: lane's four values v of columns c0 .. c0 + 3 (c0 = tile start + 4 lane;
// zeros past the row's end K) and m the max-abs bits of them. Writes the tile's codes of the columns below K
// into qrow[c0 ..] (one 32-bit store where all four are in and aligned: byte e at c0 + e as by single
// stores), lane 0 its scale into *s, and counts a non-finite tile into bad (may be NULL).
__device__ __forceinline__ void warp_tile(uint8_t *qrow, float *s, const float *v, uint32_t m, int c0, int K,
                                          int lane, unsigned long long *bad) {
    m = __reduce_max_sync(0xffffffffu, m);
    float scale, inv;
    bool nf = group_scale(m, &scale, &inv);
    if (c0 + 3 < K && !((uintptr_t)(qrow + c0) & 3)) {
        uint32_t w = 0;
#pragma unroll
        for (int e = 0; e < 4; e++) w |= code(v[e], inv, nf) << (8 * e);
        *(uint32_t *)(qrow + c0) = w;
    } else {
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (c0 + e < K) qrow[c0 + e] = (uint8_t)code(v[e], inv, nf);
    }
    if (lane == 0) {
        *s = scale;
        note_group(bad, nf, m);
    }
}
