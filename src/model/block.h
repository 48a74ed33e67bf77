// block.h — one transformer block of the current slot, forward and backward:
// x_mid = res_in + drop(attn(norm(res_in))), out = x_mid + drop(moe(norm(x_mid))), with the attention
// sublayer an attention variant (attention.h) and the MoE layer moe/'s; AMPipe's chunked forms (model_state.h
// model_set_ampipe). model.c runs the blocks of a chunk in order (and back).
// Must not hold: the embedding, the final norm, LM head and loss, the statistics summed over layers
// (model.c), allocation of the activations (model_state.c).
#pragma once
#include <stdint.h>
#include "model/model_types.h"

// Forward of layer l over the micro-batch (B, T) from m->la[l].res_in into out (N,d), in n AMPipe chunks
// (1: none; the layer's MoE states fitted to n: model_state.h model_fit_chunks); seed: the router's jitter
// (0: none).
void block_forward(Model *m, int l, float *out, int B, int T, int n, uint64_t seed);
// Backward of layer l's last forward: from m->dres (the gradient of its output) to m->dres (of its input),
// its weights' gradients into m->grads; the router losses scaled by aux_scale, z_scale (per layer).
void block_backward(Model *m, int l, float aux_scale, float z_scale);
