// decode.h — KV-cached inference: the model's forward one position (or a prompt) at a time over a
// cache of every layer's keys and values, for sampling. Each call runs the same ops as model_forward
// on the new rows only: q/k/v of the new positions (with the families' biases and QK-norm; float32 in
// the attention's scratch dq/dk/dv, model_types.h AttnScratch), RoPE at their positions (rope_rows),
// rounded into the cache's hidden format once (to_hid: the bits of the training forward's rope_fwd_hid from
// float32; where attention.c qkv_hid holds, the forward rounds q and k after their products too),
// attention of the query rows [t0, t1) against the cached keys 0..t1-1 (attention_fwd's row range over
// the cache, laid out (1, W, ...)), o_proj (+ the TP all-reduce), the MoE layer on the new rows, and the
// final norm and LM head on the last row only. Dropout and jitter never run here. GQA's cache holds the
// keys and values; latent attention's (config.h kv_lora_rank) the latent after its norm and the rope key
// after RoPE of each position, from which each call expands the heads' keys and values of the positions
// 0..t1-1 (mla.c: the forward's ops on those rows).
// Must not hold: the sampling policy (train/sample.c: window, temperature, top-k/top-p), files.
#pragma once
#include <stdint.h>
#include "model/model.h"

typedef struct {
    int W, len; // positions the cache holds (its window), positions filled
    void **k, **v; // per layer (W, KVl*hd): keys after RoPE, values, in the hidden format (ops.h)
    void *q, *att; // (W, Hl*hd) queries after RoPE, the attention output: in the hidden format
    float *lse; // (Hl, W): attention_fwd's layout, B = 1, T = W
    float *x, *xn, *xmid; // (W, d): the residual stream of the rows of one call, norm, mid
    float *rstd, *logits; // (W) (V)
    float *qraw, *kraw, *rstdqk; // QK-norm (families): q, k before their norms, the norms' rstd (else NULL)
    // latent attention (else NULL): per layer the latent (W, kv_lora_rank; hidden format) and the rope key
    // (W, qk_rope_head_dim; float32); the keys and values expanded from them for the layer being run (W,
    // Hl*hq; hidden format; k and v above are not used), o_proj's input (W, Hl*v_head_dim; hidden format)
    void **lat;
    float **kr;
    void *kx, *vx, *ao;
} KvCache;

// 1 when m can decode with a cache: one chunk holding every layer (no pipeline stages).
int model_decode_supported(const Model *m);
// A cache of W positions (1 <= W <= the model's maxB * maxT rows and <= max_seq_len), empty.
void kv_init(KvCache *kc, const Model *m, int W);
void kv_free(KvCache *kc, const Model *m);
// Runs tokens[0..n) (host) at positions kc->len .. kc->len + n - 1 (kc->len + n <= W), appending their
// keys and values; writes the logits of the last of them into out (V floats, host). Collective over
// the model's mesh like model_forward (every rank decodes the same tokens).
void model_decode(Model *m, KvCache *kc, const int32_t *tokens, int n, float *out);
