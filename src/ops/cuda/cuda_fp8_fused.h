// cuda_fp8_fused.h — the FP8 (e4m3) quantisers fused with what is around them (cuda_fp8_fused.cu), so that an
// operand is read once for every layout a GEMM needs: both tilings of grouped rows in one pass, the SwiGLU
// forward writing its output's tiles, the SwiGLU backward writing both tilings of its two gradients. Each
// equals, bit for bit, the plain kernels it replaces (cuda_fp8.h's quantisers after cuda_elementwise.cu's
// SwiGLU: tests/test_cuda_fp8_fused.c), and counts the same non-finite groups. A C header: the tests call
// these. Must not hold: the GEMMs or any knowledge of layers.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Both tilings of one operand of the grouped GEMMs (cuda_fp8.h's layouts): q (rows, K) / s (rows,
// ceil(K/128)), row 0 = the groups' first row, as cuda_fp8_quant_tiles; qt (K, P) / st (K, P / 128), P =
// cuda_fp8_pad_cols(off, G), as cuda_fp8_quant_tiles_t. Device pointers.
typedef struct {
    uint8_t *q, *qt;
    float *s, *st;
} Fp8Both;

// x's grouped rows [off[0], off[G]) (x counted from its row 0; off a HOST array of G+1) in both tilings from
// one read: the bits of cuda_fp8_quant_tiles(b.q, b.s, x + off[0] K, rows, K) and
// cuda_fp8_quant_tiles_t(b.qt, b.st, x, off, G, K), `bad` increased by both counts (each layout's non-finite
// tiles). x float32 (x_bf16 0) or bf16 (1).
void cuda_fp8_quant_both(Fp8Both b, const void *x, int x_bf16, const int64_t *off, int G, int K,
                         unsigned long long *bad);

// The SwiGLU's backward with its gradients' operands: over the grouped rows [off[0], off[G]) of K columns
// (every pointer counted from row 0), dh1, dh3 = swiglu_bwd(dact, h1, h3) written in the hidden format
// (hid_bf16 1: bf16, each rounded once from float32, as cuda_swiglu_bwd_hid; 0: float32 as cuda_swiglu_bwd
// with accumulate 0); h1, h3 in that format; dact float32. And b1, b3 = cuda_fp8_quant_both of the dh1, dh3
// written (bad1, bad3 their counts).
void cuda_fp8_swiglu_bwd_both(void *dh1, void *dh3, int hid_bf16, const float *dact, const void *h1,
                              const void *h3, const int64_t *off, int G, int K, Fp8Both b1, Fp8Both b3,
                              unsigned long long *bad1, unsigned long long *bad3);

// The SwiGLU's forward with its output's tiles: over M rows of O columns, act = silu(h1) h3 of float32 h1,
// h3, written in the hidden format (hid_bf16 as above), with h1o, h3o (not NULL) also h1, h3 stored again in
// it (cuda_swiglu_fwd_hid's outputs; cuda_swiglu_fwd's where both are NULL and hid_bf16 0); q (M, O) / s (M,
// ceil(O/128)) = cuda_fp8_quant_tiles of the act written (the down projection's operand).
void cuda_fp8_swiglu_fwd_tiles(void *act, void *h1o, void *h3o, int hid_bf16, const float *h1,
                               const float *h3, int M, int O, uint8_t *q, float *s, unsigned long long *bad);

#ifdef __cplusplus
}
#endif
