// cuda_fp8.h — the FP8 (e4m3) quantisers on the GPU: DeepSeek-V3's fine-grained scales (1x128 tiles of
// activations along the reduction dimension, 128x128 blocks of weights), equal bit for bit to the host
// reference ops/cpu/cpu_fp8.h (its scale rule, codes and the NaN scale of a non-finite group), and the padded
// layout of the weight gradient's transposed operands. A C header: the tests call these directly.
// Must not hold: the GEMMs (cuda_grouped_fp8.h) or any knowledge of layers.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// The weight gradient's operands (dY^T, X^T) hold each group's rows as columns, padded with zero columns to
// a multiple of 128 so that no 1x128 tile spans two groups: group g's columns start at
// cuda_fp8_pad_cols(off, g) (a multiple of 128) and the width of the whole is cuda_fp8_pad_cols(off, G).
// off: the groups' row offsets (a HOST array of G+1 entries, off[0] the first row).
static inline int64_t cuda_fp8_pad_cols(const int64_t *off, int g) {
    int64_t p = 0;
    for (int h = 0; h < g; h++) p += (off[h + 1] - off[h] + 127) / 128 * 128;
    return p;
}

#define FP8_CNT \
    2 // the words of a quantiser's counter: the non-finite groups, 1 + the finite groups' amax bits

// x (M, K) row-major, float32 (x_bf16 0) or bf16 (1) -> q (M, K) codes, s (M, ceil(K/128)) scales: equals
// cpu_fp8_quant_tiles of x's float32 values. `bad` (a device counter of FP8_CNT words, may be NULL): its
// bad[0] is increased by the number of tiles holding a NaN or an infinity (their scale NaN, codes 0x7f), its
// bad[1] raised to 1 + the largest amax bits (numerics.h: f32_bits & 0x7fffffff) of a finite tile where that
// is more (0: no finite group yet), as by every quantiser below. Default stream.
void cuda_fp8_quant_tiles(uint8_t *q, float *s, const void *x, int x_bf16, int M, int K,
                          unsigned long long *bad);
// The transposed tiling per group: x (rows, K) with group g's rows [off[g], off[g+1]) (counted from x's
// first row; off a HOST array) -> q (K, P) and s (K, P / 128), P = cuda_fp8_pad_cols(off, G): column
// cuda_fp8_pad_cols(off, g) + r of row k is x[off[g] + r][k]'s code; each group's columns equal
// cpu_fp8_quant_tiles_t of its rows; the padding columns hold code 0 and take no part in any amax.
void cuda_fp8_quant_tiles_t(uint8_t *q, float *s, const void *x, int x_bf16, const int64_t *off, int G, int K,
                            unsigned long long *bad);
// w (G, N, K) -> q (G, N, K), s (G, ceil(N/128), ceil(K/128)): each group as cpu_fp8_quant_blocks. With
// qt and st not NULL also the transposed layout (the activation gradient's B = W^T): qt (G, K, N) the same
// codes transposed, st (G, ceil(K/128), ceil(N/128)) the same scales transposed (a block and its scale
// serve both layouts). q and s may be NULL where only the transposed layout is wanted.
void cuda_fp8_quant_blocks(uint8_t *q, float *s, uint8_t *qt, float *st, const void *w, int w_bf16, int G,
                           int N, int K, unsigned long long *bad);
// The same blocks with the forward codes written into one half of a pair's layout (two weights' rows
// interleaved by 64, the SwiGLU's up projections as one GEMM: cuda_grouped_fp8.h
// cuda_fp8_grouped_gemm_swiglu): q2 (G, 2 N, K) gets w's row n at row n / 64 * 128 + half * 64 + n % 64 of
// its group, s2 (G 2 N, ceil(K/128)) that row's block scale in each K-tile; qt, st (may be NULL) as above. N
// a multiple of 64.
void cuda_fp8_quant_blocks_pair(uint8_t *q2, float *s2, int half, uint8_t *qt, float *st, const void *w,
                                int w_bf16, int G, int N, int K, unsigned long long *bad);

// --fp8-dispatch's rows (ops.h Backend.fp8_rows_*; numerics.h fp8_row_bytes): x (n, d) float32 (x_bf16 0) or
// bf16 (1) -> p packed (n fp8_row_bytes(d) bytes), equal to cpu_fp8_pack_rows of x's float32 values;
// round: x replaced by its tiles' FP8 values (cpu_fp8_round_rows'); unpack: p -> x (cpu_fp8_unpack_rows',
// rounded to bf16 where x_bf16: exactly). Default stream.
void cuda_fp8_pack_rows(uint8_t *p, const void *x, int x_bf16, int n, int d);
void cuda_fp8_round_rows(void *x, int x_bf16, int n, int d);
void cuda_fp8_unpack_rows(void *x, int x_bf16, const uint8_t *p, int n, int d);

#ifdef __cplusplus
}
#endif
