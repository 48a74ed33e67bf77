// router.h — the router's host-side math: softmax + top-k (+ renormalisation), the dispatch plan
// (per-expert counts, sorted order, capacity drops), the aux/z losses and their exact gradients.
// Pure functions on host arrays; the MoE layer (moe.c) moves data to and from the backend.
#pragma once
#include <stdint.h>
#include "core/config.h"

// probs (N,E) = softmax(logits); lse (N) = logsumexp(logits); idx/w (N,k): top-k experts by
// probability, descending (ties: lower expert index first); w renormalised to sum 1 if renorm.
void router_topk(const float *logits, int N, int E, int k, int renorm, float *probs, float *lse,
                 int32_t *idx, float *w);

// Dispatch plan. Assignments (token t, slot j) are ordered by expert, and within an expert by
// priority: slot 0 of every token (in token order), then slot 1, ... (GShard/DeepSpeed: first
// choices win). In capacity mode each expert keeps its first `capacity` assignments in that
// order and drops the rest (the token still gets its other experts; a token whose every choice
// dropped passes through the residual only).
typedef struct {
    int N, E, k;
    int64_t *off;          // (E+1) row offsets of kept assignments per expert
    int64_t *counts;       // (E) assignments routed to each expert, before drops (for stats/aux)
    int32_t *row_tok;      // (M) token of each kept row
    int32_t *row_slot;     // (M) slot j of each kept row
    int32_t *slot_row;     // (N*k) row of assignment (t,j), or -1 if dropped
    int M;                 // kept rows
    int dropped;           // dropped assignments
} DispatchPlan;

// The MoE layer builds its plan on the backend (ops.h plan_counts / plan_rows, from the counts and
// router_budget's budgets); plan_build* are the host reference those ops are tested against
// (tests/test_ops.c), themselves checked against a brute force (tests/test_router.c).
void plan_alloc(DispatchPlan *p, int N, int E, int k);
void plan_free(DispatchPlan *p);
// capacity < 0: dropless.
void plan_build(DispatchPlan *p, const int32_t *idx, int N, int E, int k, int capacity);
// General form: budget (k, E) = how many of this process's slot-j assignments to expert e are kept
// (the first ones in token order); NULL = keep all. plan_build computes it for one process;
// a mesh computes it from every rank's counts (router_budget) so drops match one process.
void plan_build_budget(DispatchPlan *p, const int32_t *idx, int N, int E, int k, const int64_t *budget);
// cnt (k, E): this process's slot-j assignments to expert e.
void router_slot_counts(const int32_t *idx, int N, int E, int k, int64_t *cnt);
// all (S, k, E): every rank's slot counts in global token order (rank s holds earlier tokens than
// s+1). For rank `me`: budget[j][e] = clamp(capacity - (all slot<j assignments to e)
// - (slot-j assignments to e on ranks before me), 0, mine).
void router_budget(const int64_t *all, int S, int me, int E, int k, int64_t capacity, int64_t *budget);

// Losses of one layer over the N tokens: aux = E * sum_i (counts_i / N) * mean_t probs[t,i]
// (so balanced routing gives k, as in HF Mixtral), z = mean_t lse_t^2.
void router_losses(const float *probs, const float *lse, const int64_t *counts, int N, int E,
                   double *aux, double *z);

// dlogits (N,E) = d/dlogits of [ sum_{t,j} dw[t,j] * w[t,j]  +  aux_scale * aux  +  z_scale * z ]
// where dw (N,k) is the gradient flowing into the combine weights.
void router_backward(float *dlogits, const float *dw, const float *probs, const float *lse,
                     const int32_t *idx, const float *w, const int64_t *counts, int N, int E, int k,
                     int renorm, float aux_scale, float z_scale);
// General form: aux_dp (E) = d(aux term)/d probs[t,e] (the same for every token), and the z term
// contributes z_dl * lse_t * probs[t,e] to dlogits[t,e]. router_backward computes both for one
// process; a mesh uses global counts and the global token count.
void router_backward_ex(float *dlogits, const float *dw, const float *probs, const float *lse,
                        const int32_t *idx, const float *w, int N, int E, int k, int renorm,
                        const float *aux_dp, float z_dl);
