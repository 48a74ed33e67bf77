// router_ref.h — the router's host reference for the tests: softmax + top-k, the dispatch plan
// built on the host (priority order, capacity drops through router_budget), the aux/z losses and
// their exact gradients. The MoE layer runs all of this on the backend (ops.h router_topk,
// plan_counts, plan_rows, router_bwd; moe.c); these are what those ops are tested against
// (test_ops.c), themselves checked against brute force and finite differences (test_router.c).
// Header-only: each test program that needs it includes it.
// Must not hold: tests; anything src/ calls (moe/router.h).
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "moe/router.h"
#include "ops/ops.h"

// probs (N,E) = softmax(logits); lse (N) = logsumexp(logits); idx/w (N,k): top-k experts by
// probability, descending (ties: lower expert index first); w renormalised to sum 1 if renorm.
static inline void router_topk(const float *logits, int N, int E, int k, int renorm, float *probs, float *lse,
                               int32_t *idx, float *w) {
    // the float32 reference is the cpu backend's op (the MoE layer calls it through the Backend)
    backend_cpu()->router_topk(probs, lse, idx, w, NULL, logits, NULL, N, E,
                               (RouteRule){.k = k, .renorm = renorm});
}

static inline void plan_alloc(DispatchPlan *p, int N, int E, int k) {
    memset(p, 0, sizeof *p);
    p->off = xcalloc(E + 1, sizeof *p->off);
    p->counts = xcalloc(E, sizeof *p->counts);
    p->row_tok = xcalloc((size_t)N * k, sizeof *p->row_tok);
    p->row_slot = xcalloc((size_t)N * k, sizeof *p->row_slot);
    p->slot_row = xcalloc((size_t)N * k, sizeof *p->slot_row);
    p->N = N;
    p->E = E;
    p->k = k;
}

// cnt (k, E): this process's slot-j assignments to expert e.
static inline void router_slot_counts(const int32_t *idx, int N, int E, int k, int64_t *cnt) {
    memset(cnt, 0, sizeof(int64_t) * k * E);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) cnt[(size_t)j * E + idx[(size_t)t * k + j]]++;
}

// General form: budget (k, E) = how many of this process's slot-j assignments to expert e are kept
// (the first ones in token order); NULL = keep all. plan_build computes it for one process;
// a mesh computes it from every rank's counts (router_budget) so drops match one process.
static inline void plan_build_budget(DispatchPlan *p, const int32_t *idx, int N, int E, int k,
                                     const int64_t *budget) {
    CHECK(N <= p->N && E == p->E && k == p->k,
          "plan_build: plan sized for N=%d E=%d k=%d, got N=%d E=%d k=%d", p->N, p->E, p->k, N, E, k);
    memset(p->counts, 0, sizeof(int64_t) * E);
    for (int i = 0; i < N * k; i++) p->counts[idx[i]]++;
    p->off[0] = 0;
    for (int e = 0; e < E; e++) {
        int64_t kept = p->counts[e];
        if (budget) {
            kept = 0;
            for (int j = 0; j < k; j++) kept += budget[(size_t)j * E + e];
        }
        p->off[e + 1] = p->off[e] + kept;
    }
    p->M = (int)p->off[E];
    p->dropped = N * k - p->M;
    int64_t *fill = xcalloc(E, sizeof *fill), *used = xcalloc((size_t)k * E, sizeof *used);
    for (int j = 0; j < k; j++)
        for (int t = 0; t < N; t++) {
            int e = idx[(size_t)t * k + j];
            if (!budget || used[(size_t)j * E + e] < budget[(size_t)j * E + e]) {
                int64_t pos = p->off[e] + fill[e]++;
                used[(size_t)j * E + e]++;
                p->row_tok[pos] = t;
                p->row_slot[pos] = j;
                p->slot_row[(size_t)t * k + j] = (int32_t)pos;
            } else {
                p->slot_row[(size_t)t * k + j] = -1;
            }
        }
    free(fill);
    free(used);
}

// capacity < 0: dropless.
static inline void plan_build(DispatchPlan *p, const int32_t *idx, int N, int E, int k, int capacity) {
    if (capacity < 0) {
        plan_build_budget(p, idx, N, E, k, NULL);
        return;
    }
    int64_t *cnt = xmalloc(sizeof(int64_t) * k * E), *budget = xmalloc(sizeof(int64_t) * k * E);
    router_slot_counts(idx, N, E, k, cnt);
    router_budget(cnt, 1, 0, E, k, capacity, budget);
    plan_build_budget(p, idx, N, E, k, budget);
    free(cnt);
    free(budget);
}

// Losses of one layer over the N tokens: aux = E * sum_i (counts_i / N) * mean_t probs[t,i]
// (so balanced routing gives k, as in HF Mixtral), z = mean_t lse_t^2.
static inline void router_losses(const float *probs, const float *lse, const int64_t *counts, int N, int E,
                                 double *aux, double *z) {
    double a = 0, zz = 0;
    for (int e = 0; e < E; e++) {
        double P = 0;
        for (int t = 0; t < N; t++) P += probs[(size_t)t * E + e];
        a += ((double)counts[e] / N) * (P / N);
    }
    for (int t = 0; t < N; t++) zz += (double)lse[t] * lse[t];
    *aux = N ? E * a : 0;
    *z = N ? zz / N : 0;
}

// General form of router_backward: aux_dp (E) = d(aux term)/d probs[t,e] (the same for every
// token), and the z term contributes z_dl * lse_t * probs[t,e] to dlogits[t,e]. router_backward
// computes both for one process; a mesh uses global counts and the global token count.
static inline void router_backward_ex(float *dlogits, const float *dw, const float *probs, const float *lse,
                                      const int32_t *idx, const float *w, int N, int E, int k, int renorm,
                                      const float *aux_dp, float z_dl) {
    // the cpu backend's router_bwd, reading dw[t,j] through an identity plan (slot (t,j) -> row t*k+j)
    int32_t *ident = xmalloc(sizeof(int32_t) * ((size_t)N * k + 1));
    for (int i = 0; i < N * k; i++) ident[i] = i;
    backend_cpu()->router_bwd(dlogits, dw, ident, probs, lse, idx, w, aux_dp, z_dl, N, E,
                              (RouteRule){.k = k, .renorm = renorm});
    free(ident);
}

// dlogits (N,E) = d/dlogits of [ sum_{t,j} dw[t,j] * w[t,j]  +  aux_scale * aux  +  z_scale * z ]
// where dw (N,k) is the gradient flowing into the combine weights.
static inline void router_backward(float *dlogits, const float *dw, const float *probs, const float *lse,
                                   const int32_t *idx, const float *w, const int64_t *counts, int N, int E,
                                   int k, int renorm, float aux_scale, float z_scale) {
    // aux = E * sum_e (counts_e / N) * (sum_t p_te / N): d/dp_te = E * counts_e / N^2
    float *aux_dp = xmalloc(sizeof(float) * E);
    for (int e = 0; e < E; e++) aux_dp[e] = N ? aux_scale * (float)E * ((float)counts[e] / N) / N : 0;
    router_backward_ex(dlogits, dw, probs, lse, idx, w, N, E, k, renorm, aux_dp, N ? 2.0f * z_scale / N : 0);
    free(aux_dp);
}
