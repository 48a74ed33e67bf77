// model.h — the Mixtral-style MoE transformer on a Backend: parameters and gradients as flat
// buffers laid out by the parameter table, activations of live micro-batches (slots), forward,
// backward. With pipeline stages a rank holds chunks of layers (its virtual stages, ModelMesh.sl)
// and the forward and backward run the current chunk only: the embedding on the first virtual
// stage, the final norm, LM head and loss on the last; between stages the caller moves the residual
// stream (model_stage_in / model_stage_out, m->dres) and the router statistics carried along (aux,
// z, dropped, hf_fe/hf_pe).
// On a mesh the forward and backward include the collectives that are part of the math (the
// attention output's and its input gradient's all-reduce over TP, the full-width QK-norm's row sums over
// TP; the MoE layer's exchanges), through the comm API (parallel/comm.h), a layer below: model/ knows
// nothing of MPI, NCCL or CUDA.
// The parts: model_types.h (the state's structs), model_state.h (its memory and settings, included
// here), this file (forward and backward: model.c over the blocks of block.c, whose attention is a
// variant of attention.h), decode.h (the KV-cached forward for sampling).
// Must not hold: optimizer, data, files, MPI/NCCL/CUDA calls, or the gradient reductions across
// DP/EDP (train/dist.c).
#pragma once
#include <stdint.h>
#include "model/model_state.h"

// Forward of the current chunk over tokens (B,T) (host; read on the first chunk). targets (host; read
// on the last chunk) may be NULL: logits only.
// dloss != 0 (training): m->logits is overwritten with dlogits for a loss scaled by dloss per token,
// ready for model_backward. noise_seed != 0 enables router jitter. Returns the mean cross-entropy
// of this rank's tokens (0 when targets is NULL or the chunk is not the last).
double model_forward(Model *m, const int32_t *tokens, const int32_t *targets, int B, int T, float dloss,
                     uint64_t noise_seed);
// Accumulates into m->grads the gradient of  dloss * sum_t ce_t + aux_scale * aux + z_scale * z
// (aux and z are the layer means) for the current slot's forward (which must have had dloss != 0),
// over the current chunk's layers: on a chunk that is not the last, m->dres must hold the gradient
// of its output; on one that is not the first, m->dres ends holding the gradient of its input.
void model_backward(Model *m, float aux_scale, float z_scale);
// With MTP modules (config.h mtp_depth) and pipeline stages: the first virtual stage's embedding output
// (its model_stage_in after a forward) goes to the last, which reads it from m->mtp_emb (the current
// slot's) in its forward with targets; the last's backward leaves the embedding output's gradient from
// the modules in m->mtps.demb, which the first's backward reads there (the caller moves both).
// Row of logits (V floats, host) at position (b, t) of the last forward.
void model_logits_row(const Model *m, int b, int t, float *out);
