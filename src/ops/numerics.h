// numerics.h — number formats and their arithmetic, alike on every backend (host and device: MOE_HD):
// the element formats a buffer may hold (ElemFormat: float32, bf16; FP8 with its scales joins here),
// the precision policies of training (PREC_*), bf16 <-> float32 conversion by integer arithmetic and
// bf16 stochastic rounding's counter-based random bits. Must not hold: the backend interface (ops.h) or
// anything that knows tensors, layers or the model.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define MOE_HD __host__ __device__
#else
#define MOE_HD
#endif

// What one element of a buffer is. fmt_size gives its bytes; a format with scales (FP8 blocks) will say
// where its scales live beside the elements rather than be guessed from a byte width.
typedef enum { FMT_F32 = 0, FMT_BF16 = 1 } ElemFormat;
static inline MOE_HD size_t fmt_size(ElemFormat f) { return f == FMT_BF16 ? 2 : 4; }

// The precision policies of training (--precision): PREC_MIXED float32 weights and AdamW moments (bf16
// GEMM operands on cuda); PREC_BF16 bf16 moments, weights rounded to bf16 values after every update.
enum { PREC_MIXED = 0, PREC_BF16 = 1 };

// bf16 <-> float32 bit operations shared by every backend (integer arithmetic: the same bits on any
// device). NaN stays NaN (quiet); an overflow rounds to infinity as the hardware conversion does.
static inline MOE_HD uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}
static inline MOE_HD float f32_of_bits(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}
static inline MOE_HD uint16_t bf16_rn_bits(float x) { // round to nearest even
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
// Stochastic: rounds up (away from zero) with probability (the 16 bits dropped) / 2^16, so the
// expected value is x; r16: 16 random bits.
static inline MOE_HD uint16_t bf16_sr_bits(float x, uint32_t r16) {
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) >= 0x7f800000u)
        return (uint16_t)((u >> 16) | ((u & 0x7fffffffu) > 0x7f800000u ? 0x40 : 0));
    return (uint16_t)((u + (r16 & 0xffffu)) >> 16);
}
static inline MOE_HD float bf16_to_f32(uint16_t b) { return f32_of_bits((uint32_t)b << 16); }
// The random bits of stochastic rounding for the element of global index gi at step t, counter-based (no
// RNG state), so any backend and any mesh draws the same: bf16_sr_key(seed, t) once per step (the dropout
// hash's splitmix64 mix, other constants), then per element one 32-bit mix of gi with that key (a
// lowbias32's multiply-xorshift, its low 16 bits: without the last xorshift the top 16 bits of the product
// were measurably uneven over 2^22 consecutive indices, chi-square z 7-10). 32-bit multiplies only: the
// 64-bit mix per element cost the bf16 AdamW ~6 ms of a reference-model step (2026-12-02).
static inline MOE_HD uint64_t bf16_sr_key(uint64_t seed, int t) {
    uint64_t z = seed ^ 0x5851F42D4C957F2Dull ^ ((uint64_t)(uint32_t)t * 0xC2B2AE3D27D4EB4Full);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline MOE_HD uint32_t bf16_sr_rand(uint64_t key, int64_t gi) {
    uint32_t x = (((uint32_t)gi ^ (uint32_t)key) + (uint32_t)((uint64_t)gi >> 32) * 0x9E3779B1u) ^
        (uint32_t)(key >> 32);
    x ^= x >> 16;
    x *= 0x7FEB352Du;
    x ^= x >> 15;
    x *= 0x846CA68Bu;
    return (x ^ (x >> 16)) & 0xFFFFu;
}
