// moe.h — one MoE FFN layer on a Backend: optional jitter, router, top-k, dispatch plan
// (capacity or dropless), permute, grouped SwiGLU experts, weighted combine; and its backward.
// Must not hold: attention, the residual stream, or any parallel communication (yet).
#pragma once
#include <stdint.h>
#include "model/config.h"
#include "moe/router.h"
#include "ops/ops.h"

typedef struct {
    // expert weights are (E, f, d) blocks for w1 and w3 and an (E, d, f) block for w2
    const float *router;   // (E, d)
    const float *w1, *w3, *w2;
} MoeWeights;
typedef struct { float *router, *w1, *w3, *w2; } MoeGrads;

// Saved state of one layer's forward (one per layer: backward needs it).
typedef struct {
    const Backend *be;
    int maxN, d, f, E, k;
    int N;                         // tokens of the last forward
    // host
    float *logits_h, *probs_h, *lse_h, *w_h, *rowscale_h;   // (N,E) (N,E) (N) (N,k) (N*k)
    int32_t *idx_h;                // (N,k)
    DispatchPlan plan;
    double aux, z;                 // this layer's losses from the last forward
    // device
    float *noise;                  // (N,d) jitter factors, or NULL when jitter is off
    float *xj;                     // (N,d) jittered input (== input when no jitter; then NULL)
    float *logits;                 // (N,E)
    float *xs, *h1, *h3, *act, *ys;  // (N*k,d) (N*k,f) x3 (N*k,d): permuted rows
    float *rowscale;               // (N*k) combine weight of each row
    int32_t *rowtok;               // (N*k) token of each row
} MoeLayer;

// Scratch shared by all layers' backward passes.
typedef struct {
    float *dys, *dact, *dh1, *dh3, *dxs, *dxj, *dlogits, *rowdot;   // device
    float *dw_h, *dlogits_h, *rowdot_h;                              // host
} MoeScratch;

void moe_layer_init(MoeLayer *m, const Backend *be, const ModelConfig *c, int maxN);
void moe_layer_free(MoeLayer *m);
void moe_scratch_init(MoeScratch *s, const Backend *be, const ModelConfig *c, int maxN);
void moe_scratch_free(MoeScratch *s, const Backend *be);

// y (N,d) = MoE(x). capacity < 0: dropless. noise_seed != 0 and c->jitter > 0: apply jitter.
void moe_forward(MoeLayer *m, float *y, const float *x, int N, const MoeWeights *w, const ModelConfig *c,
                 int capacity, uint64_t noise_seed);
// dx (N,d) += d/dx; grads += d/dweights. The loss this differentiates is
// <dy, y> + aux_scale * aux + z_scale * z of the last forward.
void moe_backward(MoeLayer *m, MoeScratch *s, float *dx, const float *dy, const float *x, const MoeWeights *w,
                  MoeGrads *g, const ModelConfig *c, float aux_scale, float z_scale);
