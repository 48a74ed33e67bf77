// numerics.h — number formats and their arithmetic, alike on every backend (host and device: MOE_HD):
// the element formats a buffer may hold (ElemFormat: float32, bf16; FP8 with its scales joins here),
// the precision policies of training (PREC_*), bf16 <-> float32 conversion by integer arithmetic,
// bf16 stochastic rounding's counter-based random bits, and FP8 e4m3 <-> float32 with the power-of-two
// scale rule of the fine-grained (1x128 tile, 128x128 block) quantisation. Must not hold: the backend
// interface (ops.h) or anything that knows tensors, layers or the model.
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
// GEMM operands on cuda); PREC_BF16 bf16 moments, weights rounded to bf16 values after every update;
// PREC_FP8 the storage of PREC_MIXED (float32 weights and moments) with the experts' GEMMs in FP8 e4m3
// (ops.h Backend.fp8: the fine-grained recipe below, on every backend); PREC_FP8_BF16 the storage of
// PREC_BF16 with the experts' GEMMs in FP8 (the two are independent: prec_bf16_storage, prec_fp8).
enum { PREC_MIXED = 0, PREC_BF16 = 1, PREC_FP8 = 2, PREC_FP8_BF16 = 3 };
// Its --precision word (state.json, run.json, notes).
static inline const char *prec_name(int p) {
    return p == PREC_BF16 ? "bf16" : p == PREC_FP8 ? "fp8" : p == PREC_FP8_BF16 ? "fp8-bf16" : "mixed";
}
// Whether policy p stores the bf16 policy's way (bf16 AdamW moments, weights rounded to bf16 values).
static inline int prec_bf16_storage(int p) { return p == PREC_BF16 || p == PREC_FP8_BF16; }
// Whether policy p runs the routed experts' GEMMs by the FP8 recipe.
static inline int prec_fp8(int p) { return p == PREC_FP8 || p == PREC_FP8_BF16; }

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

// FP8 e4m3 (OCP "E4M3", torch.float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities;
// S.1111.111 is NaN (0x7f, 0xff); max finite 448 (0x7e); min normal 2^-6; subnormals m * 2^-9, m 1..7.
// Float32 -> e4m3 rounds to nearest even and saturates, as PTX cvt.rn.satfinite.e4m3x2.f32 and
// cuda_fp8.h's __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3) do (the GPU quantiser uses them and
// must equal this bit for bit): |x| > 448 (+-inf included) -> +-448; |x| <= 2^-10 -> +-0 (the sign kept);
// any NaN -> 0x7f, the canonical NaN, its sign dropped as __nv_cvt_float_to_fp8 does (the quantiser never
// encodes one: a tile holding a NaN is reported first, ops/cpu/cpu_fp8.h). Integer arithmetic only: alike
// on any device. tests/test_fp8_cuda_ref.sh compares it with cuda_fp8.h (all 2^32 inputs: identical) and,
// on a GPU, with the cvt instruction itself.
static inline MOE_HD uint8_t e4m3_rn_bits(float x) {
    uint32_t u = f32_bits(x), a = u & 0x7fffffffu;
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (a > 0x7f800000u) return 0x7fu;
    if (a > 0x43e00000u) return (uint8_t)(sign | 0x7eu); // beyond 448: saturate
    if (a >= 0x3c800000u) { // normal (>= 2^-6): keep 3 of the 23 mantissa bits, round the 20 dropped
        uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u); // a carry moves into the exponent, as it should
        return (uint8_t)(sign | ((r >> 20) - (120u << 3)));
    }
    // subnormal: |x| in units of 2^-9 is sig * 2^-(141 - E); round that to an integer 0..8 (8 is 2^-6)
    uint32_t e = a >> 23, shift = 141u - e;
    if (shift > 24u) return sign; // |x| < 2^-10 (a float32 subnormal too): zero
    uint32_t sig = (a & 0x7fffffu) | 0x800000u, q = sig >> shift, rem = sig & ((1u << shift) - 1u),
             half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint8_t)(sign | q);
}
// e4m3 -> float32, exact (every e4m3 value is a float32); NaN codes give a quiet NaN with their sign.
static inline MOE_HD float e4m3_to_f32(uint8_t c) {
    uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = (c >> 3) & 15u, m = c & 7u;
    if (e == 15u && m == 7u) return f32_of_bits(sign | 0x7fc00000u);
    if (e == 0u) { // m * 2^-9: m as a float32 (exact), exponent lowered by 9
        if (m == 0u) return f32_of_bits(sign);
        uint32_t mb = f32_bits((float)m);
        return f32_of_bits(sign | (mb - (9u << 23)));
    }
    return f32_of_bits(sign | ((e + 120u) << 23) | (m << 20));
}

// The fine-grained scale rule (DeepSeek-V3's tiles and blocks; its float32 amax / 448 scale replaced by a
// power of two, as torchao's rowwise float8 recipe and DeepSeek-V3.1's UE8M0 scales round them): a tile
// (1x128 of an activation row along the reduction dimension) or block (128x128 of a weight) with max-abs amax
// gets the scale 2^k, k the smallest integer with amax / 2^k <= 448, clamped to [FP8_SCALE_EXP_MIN,
// FP8_SCALE_EXP_MAX]; its elements are stored as e4m3_rn_bits(x * 2^-k) and stand for e4m3_to_f32(q) * 2^k. A
// power of two makes x * 2^-k, x / 2^k and the GEMM's scale products exact (no second rounding for the GPU to
// reproduce; a float32 amax / 448 scale would make the result depend on division vs reciprocal-multiply and
// on FMA contraction), at most one bit of e4m3's range unused. The floor 2^-100: an all-zero tile gets 2^-100
// (its codes are +-0), and any float32 subnormal times 2^100 stays below 2^-26, so it encodes to +-0
// whether or not the device flushes subnormals (inputs, or products below 2^-126: +-0 either way). The
// ceiling 2^119: 448 * 2^119 < FLT_MAX, so no finite input dequantises to infinity (amax beyond 448 * 2^119
// saturates instead).
#define FP8_SCALE_EXP_MIN (-100)
#define FP8_SCALE_EXP_MAX 119
// amax_bits: the largest (f32_bits(x) & 0x7fffffff) of the tile, an integer max (NaN and inf bits are
// above every finite one, so one max both finds amax and detects a non-finite element; fmaxf would skip
// a NaN). Callers check amax_bits < 0x7f800000 (finite) first.
static inline MOE_HD int fp8_scale_exp(uint32_t amax_bits) {
    int k = (int)(amax_bits >> 23) - 127 - 8 + ((amax_bits & 0x7fffffu) > 0x600000u); // 448 = 1.75 * 2^8
    return k < FP8_SCALE_EXP_MIN ? FP8_SCALE_EXP_MIN : k > FP8_SCALE_EXP_MAX ? FP8_SCALE_EXP_MAX : k;
}
static inline MOE_HD float fp8_pow2(int k) { return f32_of_bits((uint32_t)(k + 127) << 23); } // normal k
// k of a scale 2^k that the rule gave (a normal float: its exponent field); fp8_pow2's inverse
static inline MOE_HD int fp8_scale_log2(float s) { return (int)((f32_bits(s) >> 23) & 0xffu) - 127; }

#define FP8_TILE 128 // the tile length, the block side and the GEMM's promotion interval
static inline MOE_HD int fp8_ntiles(int n) { return (n + FP8_TILE - 1) / FP8_TILE; }
// FP8 rows (the MoE dispatch's, --fp8-dispatch): a row of d values packed into fp8_row_bytes(d) bytes, its
// d e4m3 codes (1x128 tiles along the row, the last one shorter) then one byte a tile, the tile's scale
// exponent k as a signed byte (FP8_SCALE_EXP_MIN..MAX) or FP8_ROW_BAD for a tile holding a NaN or an
// infinity (its codes NaN).
#define FP8_ROW_BAD (-128)
static inline MOE_HD size_t fp8_row_bytes(int d) { return (size_t)d + (size_t)fp8_ntiles(d); }
