// model.h — the Mixtral-style MoE transformer on a Backend: parameters and gradients as flat
// buffers laid out by the parameter table, activations for one micro-batch, forward, backward.
// On a mesh the forward and backward include the collectives that are part of the math (the
// attention output's and its input gradient's all-reduce over TP; the MoE layer's exchanges),
// through the comm API (parallel/comm.h), a layer below: model/ knows nothing of MPI, NCCL or CUDA.
// Must not hold: optimizer, data, files, MPI/NCCL/CUDA calls, or the gradient reductions across
// DP/EDP (train/dist.c).
#pragma once
#include <stdint.h>
#include "core/config.h"
#include "model/params.h"
#include "moe/moe.h"
#include "ops/ops.h"
#include "parallel/comm.h"

// The mesh as the model sees it (NULL groups = size 1). Each DP rank runs B of the global
// micro-batch's sequences; TP splits attention heads; EP/ETP split experts (see moe.h).
typedef struct {
    const Comm *tp, *dp, *ep, *etp, *edp, *stage;
    ParamSlicing sl;
} ModelMesh;

typedef struct {
    float *res_in;                 // (N,d) layer input (residual stream)
    float *xn1, *rstd1;            // (N,d) (N)
    float *q, *k, *v;              // (N,H*hd) (N,KV*hd) (N,KV*hd), after RoPE
    float *att, *lse;              // (N,H*hd) (B,H,T)
    float *x_mid;                  // (N,d) after the attention residual
    float *xn2, *rstd2;            // (N,d) (N)
    float *moe_out;                // (N,d)
    MoeLayer moe;
} LayerActs;

typedef struct {
    ModelConfig c;
    ModelMesh mesh;
    int Hl, KVl, El, e0;           // local heads, kv heads, experts, first local expert
    ParamTable t;                  // local slices (t.ltotal elements per flat buffer)
    const Backend *be;
    float *params, *grads;         // flat, t.total elements each (backend memory)
    int maxB, maxT, maxN;
    LayerActs *la;                 // (L)
    float *res_final, *xn_f, *rstd_f;   // (N,d) (N,d) (N)
    float *logits;                 // (N,V); after a training forward: dlogits
    float *losses;                 // (N) per-token cross-entropy
    int32_t *tokens, *targets;     // (N)
    // backward scratch
    float *dres, *dxn, *dq, *dk, *dv, *datt;
    MoeScratch ms;
    // optional: called during model_backward as soon as a group of gradients is final:
    // layer = n_layers for the LM head and final norm, l for layer l, -1 for the embedding
    void (*grads_ready)(void *ctx, int layer);
    void *grads_ready_ctx;
    // results of the last forward
    int B, T;
    double aux, z;                 // mean over layers of the per-layer router losses (global)
    int64_t *expert_counts;        // (L,E) assignments per expert before capacity drops (global)
    int64_t dropped;               // assignments dropped by capacity, all layers (global)
} Model;

// Allocates parameters, gradients and activations for micro-batches up to maxB x maxT (per DP
// rank). mesh may be NULL (one process).
void model_init(Model *m, const ModelConfig *c, const Backend *be, int maxB, int maxT, const ModelMesh *mesh);
void model_free(Model *m);

// Forward over tokens (B,T) (host). targets (host) may be NULL: logits only.
// dloss != 0 (training): m->logits is overwritten with dlogits for a loss scaled by dloss per token,
// ready for model_backward. noise_seed != 0 enables router jitter. Returns the mean cross-entropy
// of this rank's tokens (0 when targets is NULL).
double model_forward(Model *m, const int32_t *tokens, const int32_t *targets, int B, int T, float dloss,
                     uint64_t noise_seed);
// Accumulates into m->grads the gradient of  dloss * sum_t ce_t + aux_scale * aux + z_scale * z
// (aux and z are the layer means) for the last forward (which must have had dloss != 0).
void model_backward(Model *m, float aux_scale, float z_scale);

// Row of logits (V floats, host) at position (b, t) of the last forward.
void model_logits_row(const Model *m, int b, int t, float *out);
