// cuda_fp8_wcache.h — the experts' weights as FP8 operands kept between ops (cuda_fp8_wcache.cu): each
// grouped weight's 128x128-block codes and scales in the layouts its GEMMs take (the forward's W, the
// activation gradient's W^T, or the forward's half of an up-projection pair), quantised once per version of
// the bf16 copy of the weights they come from (ops.h bf16_shadow; cuda_common.h cuda_bf16_shadow_version)
// instead of once per GEMM. The same bits as quantising on each use (the same kernel on the same values), and
// the same non-finite counts: each use adds the version's count of non-finite blocks into the counter the use
// names, as its own quantisation would have. cuda_fp8_weight_keep(0) turns it off (--fp8-weight-cache 0:
// each use quantises again, no memory kept). Memory: each weight's transposed layout (the backward's), 1 byte
// a weight plus 4 bytes per 128x128 block; the forward layouts only in two slots, one for a single weight's
// and one for a pair's, each holding the last one asked for (the largest of each kind's bytes: about one
// layer's forward codes). So a forward layout returned stays valid only until the next forward layout of its
// kind is asked for: launch the GEMM that reads it first (in stream order the next one's codes are written
// after it). Must not hold: kernels beyond the counts' add.
#pragma once
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const uint8_t *q, *qt; // (G, O, K) and (G, K, O); NULL where not asked for
    const float *s, *st; // (G, ceil(O/128), ceil(K/128)) and its transpose
} Fp8Weight;
enum { FP8W_FWD = 1, FP8W_T = 2 }; // the layouts (a mask)

// The operands of the grouped weight w (G, O, K) float32, read from its bf16 copy, in the layouts `need`
// asks for: 1 with *out set where w lies in the registered copy (and the cache is on), else 0 (nothing done:
// the caller quantises). `bad` (a device counter) receives the weight's non-finite blocks, as
// cuda_fp8_quant_blocks would add them.
int cuda_fp8_weight(Fp8Weight *out, const float *w, int G, int O, int K, int need, unsigned long long *bad);
// W1's and W3's forward operands (both (G, O, K)) as one pair for cuda_fp8_grouped_gemm_swiglu (its layout:
// 64 rows of each in turn, a scale per row: cuda_fp8_quant_blocks_pair), kept as above (each call counts one
// use of each weight, into bad1 and bad3): 1 with *q, *s set; 0 where either weight is not kept, or O is not
// a multiple of 64 or K of 16. A pair's weights need no FP8W_FWD layout of their own.
int cuda_fp8_weight_pair(const uint8_t **q, const float **s, const float *w1, const float *w3, int G, int O,
                         int K, unsigned long long *bad1, unsigned long long *bad3);
// Adds every use's pending count into its counter (before the counters are read).
void cuda_fp8_weight_counts(void);
// 1 (the default): keep the codes as above; 0: keep none (cuda_fp8_weight and _pair return 0; the caller
// quantises at every use; what was kept is freed). ops.h Backend.fp8_keep_weights.
void cuda_fp8_weight_keep(int on);

#ifdef __cplusplus
}
#endif
