// mtp.h — multi-token prediction (DeepSeek-V3's MTP, config.h mtp_depth), the part of the loss head after
// the main model's: module k (1..D) at layer index n_layers + k - 1 takes h_{k-1} (h_0: the main model's
// normed last hidden state, the final norm's output, as the released checkpoints' inference code feeds it)
// and the embedding of the token k positions ahead,
//   x_k = eh_proj [enorm(Emb(t[i+k])) | hnorm(h_{k-1}[i])],  h_k = shared_head.norm(block_k(x_k)),
// with block_k a main layer's block (block.c: whatever attention and FFN the model has) and the loss the
// cross-entropy of h_k through the main model's LM head against t[i+k+1], over the positions where that
// token is in the sequence (i < T - k; past the end the embedding rows are zero and the loss is masked).
// The model's forward and backward (model.c) call these on the last chunk. src/model only.
// Must not hold: the main model's layers, head or embedding (model.c, block.c), allocation of the
// activations and of the modules' scratch (model_state.c).
#pragma once
#include <stdint.h>
#include "model/model_types.h"

// Forward of every module over the current slot's micro-batch (B, T) from m->xn_f and the embedding
// output emb (N,d: the main model's, unshifted) with targets (host, (B,T): t[i+1] at i); dloss != 0
// (training): each module's logits become dlogits for (mtp_weight / D) times its mean loss (dloss scaled by
// T / (T - k): dloss is the main loss's per-token factor over B*T rows). Sets m->mtp_loss, mtp_aux, mtp_z
// and the modules' rows of m->expert_counts.
void mtp_forward(Model *m, const float *emb, const int32_t *targets, int B, int T, float dloss,
                 uint64_t noise_seed);
// Backward of every module (D down to 1) of the current slot's forward, accumulating the modules' weight
// gradients (the LM head's and the embedding's included: the latter as the embedding output's gradient,
// written into m->mtps.demb) and calling grads_ready per module; returns the gradient reaching m->xn_f
// (N,d: m->mtps.dh), which the caller adds to its head's.
const float *mtp_backward(Model *m, float aux_scale, float z_scale);
