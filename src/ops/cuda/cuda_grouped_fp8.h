// cuda_grouped_fp8.h — the entry points of the FP8 (e4m3) grouped GEMMs on Hopper (cuda_grouped_fp8.cu),
// callable from C: the operands and scales are those of ops/cpu/cpu_fp8.h's quantisers, and the results equal
// cpu_fp8_gemm's up to the order of the float32 sum inside one 128-deep K-tile. Device pointers throughout;
// the group offsets are host arrays. Each returns 1 when the work is queued (on the default stream) and 0
// where the kernel cannot run (no sm_90 GPU or a build without sm_90a code, shapes or alignments it does
// not take): then nothing was written and the caller falls back. Must not hold: kernels, or the backend
// interface (these are not backend ops yet).
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// 1 where this build and GPU run the kernel (sm_90 device, sm_90a code), else 0. Never dies for want of
// a GPU's features (a CUDA runtime failure still dies).
int cuda_fp8_grouped_kernel(void);

// Grouped over rows (the experts' forward Y = X W^T and activation gradient dX = dY W): for each group g
// and its rows [off[g], off[g+1]) (counted so that A, sa and C point at row off[0]):
//   C (rows, N) = A (rows, K) . B_g^T  [+ beta C]
// A: e4m3 codes (rows, K), sa: (rows, fp8_ntiles(K)) 1x128 tile scales (cpu_fp8_quant_tiles);
// B_g = B + g N K: (N, K) e4m3; its scales: b_blocks 1: 128x128 blocks, sb + g fp8_ntiles(N) fp8_ntiles(K)
// (cpu_fp8_quant_blocks), b_blocks 0: 1x128 tiles of each row, sb + g N fp8_ntiles(K) (cpu_fp8_quant_tiles).
// c_bf16 0: C float32, beta 0: C = result (C is not read), beta 1: C += result (after the sum: C + result);
// c_bf16 1: C bf16, the result rounded to nearest even, stored (beta must be 0). Any other beta dies. K and N
// multiples of 16, A and B 16-byte aligned (TMA); a K not a multiple of 128 has its last K-tile zero-filled.
int cuda_fp8_grouped_gemm(void *C, int c_bf16, float beta, const uint8_t *A, const float *sa,
                          const uint8_t *B, const float *sb, int b_blocks, const int64_t *off, int G, int K,
                          int N);

// The experts' up projections with the SwiGLU in the epilogue (bf16 hidden rows): B (G, 2 O, K) holds W1's
// and W3's codes interleaved by 64 rows (rows [128 i, 128 i + 64) of group g are W1_g's rows [64 i, 64 i +
// 64), the next 64 W3_g's same rows) with 1x128 tile scales per row, sb (G 2 O, ceil(K/128)), equal over each
// 64 rows (their 128x128 blocks' scales: cuda_fp8_wcache.h cuda_fp8_weight_pair; the kernel reads one per 64,
// or with MOE_FP8_PAIR_SCALE=0 each row's); A and sa as above. Writes h1 (rows, O) = bf16(A W1^T), h3
// likewise and act = bf16(silu(h1) h3) of the float32 results (cuda_swiglu.cuh), h1, h3, act counted from row
// off[0]: the bits of two cuda_fp8_grouped_gemm (float32 C) and cuda_swiglu_fwd_hid, the products' sums being
// the kernel's own. O a multiple of 64, the outputs 4-byte aligned; 0 where not (or where the GEMM above is
// not).
int cuda_fp8_grouped_gemm_swiglu(void *h1, void *h3, void *act, const uint8_t *A, const float *sa,
                                 const uint8_t *B, const float *sb, const int64_t *off, int G, int K, int O);

// Grouped over the reduction (the weight gradient dW_g (N, K) = dY_g^T X_g): A = dY^T (N, Mp) and B = X^T
// (K, Mp) e4m3 with 1x128 tile scales sa (N, Mp / 128), sb (K, Mp / 128), Mp = p[G]; group g owns the
// columns [p[g], p[g+1]), each p[g] a multiple of 128 and p[0] = 0 (a group's rows padded with zero
// columns: cpu_fp8_quant_tiles_t of each group's rows placed at p[g]). C_g = C + g N K (N, K) float32:
// beta 0 stores the result (zeros for a group without columns), beta 1 adds it (a group without columns
// is left as it is). packed (beta 0): C_g is stored as bf16 values instead, rounded to nearest even, at
// element g N K of C read as a bf16 array (ops.h GM_DW_BF16). N and K multiples of 16; p that breaks the
// rules above dies (a caller's bug). sumsq (beta 0): the G blocks' sums of squares, as stored, into the
// gradient ledger (ops.h GM_DW_SUMSQ).
int cuda_fp8_grouped_gemm_dw(float *C, float beta, int packed, int sumsq, const uint8_t *A, const float *sa,
                             const uint8_t *B, const float *sb, const int64_t *p, int G, int N, int K);

#ifdef __cplusplus
}
#endif
