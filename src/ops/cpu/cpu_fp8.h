// cpu_fp8.h — the host reference of FP8 training's numerics, which the GPU kernels must equal: the
// fine-grained e4m3 quantisation (activations per 1x128 tile along the reduction dimension, weights per
// 128x128 block; element rounding and the scale rule in ops/numerics.h) and the FP8 GEMM with float32
// promotion every 128 products (the fp8 backend's grouped GEMMs compose them: cpu_fp8_ops.c). Must not
// hold: the backend interface or anything that knows layers or the model.
//
// The three GEMMs of an expert (W (N, K) the weight, X (M, K) its input rows, dY (M, N) the output's
// gradient) all take both operands with the reduction dimension contiguous (FP8 wgmma reads K-major only):
//   forward    Y  (M, N) = X · W^T:   A = X,    tiles along K;  B = W (N, K),    blocks
//   act. grad  dX (M, K) = dY · W:    A = dY,   tiles along N;  B = W^T (K, N),  blocks (W's codes and block
//                                     scales transposed: a 128x128 block and its scale serve both layouts)
//   wt. grad   dW (N, K) = dY^T · X:  A = dY^T (N, M), tiles along M;  B = X^T (K, M), tiles along M
//                                     (the transposed tiling of the saved input: cpu_fp8_quant_tiles_t)
// A scale group (tile or block) that holds a NaN or an infinity has no scale: the quantisers count such
// groups (the caller turns a non-zero count into an error naming the tensor) and write scale NaN and codes
// 0x7f (NaN) for them, so nothing that ignores the count computes with their values.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "ops/numerics.h"

// x (M, K) row-major -> q (M, K) e4m3 codes and s (M, fp8_ntiles(K)) scales, tile (m, t) = row m, columns
// [128 t, min(128 t + 128, K)) (the last tile covers the remaining columns; a GPU kernel that pads the
// tile to 128 pads with zeros, which change neither amax nor the GEMM). Returns the non-finite tiles.
int64_t cpu_fp8_quant_tiles(uint8_t *q, float *s, const float *x, int M, int K);
// The same tiling of x's transpose without forming it: q (K, M), s (K, fp8_ntiles(M)), tile (k, t) =
// column k of x, rows [128 t, ...): equals cpu_fp8_quant_tiles of the transposed matrix bit for bit.
int64_t cpu_fp8_quant_tiles_t(uint8_t *q, float *s, const float *x, int M, int K);
// w (N, K) -> q (N, K) and s (fp8_ntiles(N), fp8_ntiles(K)), block (i, j) = rows [128 i, ...) x columns
// [128 j, ...) (edge blocks cover what remains). Returns the non-finite blocks.
int64_t cpu_fp8_quant_blocks(uint8_t *q, float *s, const float *w, int N, int K);
// x = e4m3_to_f32(q) * scale, exact: the inverse layouts of the two quantisers above.
void cpu_fp8_dequant_tiles(float *x, const uint8_t *q, const float *s, int M, int K);
void cpu_fp8_dequant_blocks(float *w, const uint8_t *q, const float *s, int N, int K);
// FP8 rows as the MoE dispatch moves them (--fp8-dispatch; the packed layout: numerics.h fp8_row_bytes):
// pack returns the non-finite tiles; unpack writes e4m3_to_f32(code) * 2^k (exact: the values
// cpu_fp8_dequant_tiles gives for quant_tiles' codes), NaN for the elements of a bad tile. Packing unpacked
// rows gives back the same values (the scale may come out one power of two lower with every code doubled,
// where a tile's largest code rounded down to 224: the same values, and the same FP8 GEMM results, products
// and sums being exact in float32).
int64_t cpu_fp8_pack_rows(uint8_t *p, const float *x, int n, int d);
void cpu_fp8_unpack_rows(float *x, const uint8_t *p, int n, int d);
// unpack(pack(x)) in place, without the packed rows.
void cpu_fp8_round_rows(float *x, int n, int d);
// C (M, N) = A (M, K) · B (N, K)^T, A tile-quantised (quant_tiles), B tile-quantised (b_blocks 0) or
// block-quantised (b_blocks 1). The order (the GPU kernel equals it up to the order and precision of the
// sum inside one K-tile): for each (m, n) and each K-tile t in increasing order, p = the float32 sum, in
// increasing k, of the products e4m3(a) * e4m3(b) (exact in float32); then c += p * (sa * sb) in float32
// (sa * sb and the product with p are exact: powers of two); c starts at 0, and is stored, not added to.
void cpu_fp8_gemm(float *c, const uint8_t *a, const float *sa, const uint8_t *b, const float *sb, int M,
                  int N, int K, int b_blocks);
