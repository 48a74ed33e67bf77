// cuda_grouped.h — the entry points of our bf16 Hopper grouped GEMMs (cuda_grouped.cu; the contract at its
// top), callable from C: the backend's grouped ops (cuda_gemm.cu) and the FP8 bench's bf16 rows beside them
// (bench/fp8_gemm_bench.c), so that both compile against one declaration. Device pointers; the group offsets
// are host arrays. Each returns 1 when the work is queued and 0 where the kernel does not run here (no sm_90
// GPU or sm_90a code, shapes or alignments it does not take): then nothing was written and the caller uses
// cuBLAS. Must not hold: kernels.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

int cuda_grouped_gemm(float *C, long long ldc, float beta, const void *A, const void *B, const void *A2,
                      const void *B2, int nmajor_b, const int64_t *off, int G, int K, int K2, int N);
// (packed: the output as bf16 packed from dw, ops.h GM_DW_BF16; beta 0. sumsq: the G blocks into the
// gradient ledger, cuda_dw_ledger_slots; beta 0)
int cuda_grouped_gemm_dw(float *dw, float beta, int packed, int sumsq, const void *dout, const void *x,
                         const int64_t *off, int G, int K, int O);

#ifdef __cplusplus
}
#endif
