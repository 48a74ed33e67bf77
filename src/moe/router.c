// router.c — softmax/top-k, dispatch plan with capacity drops, aux and z losses with gradients.
#include "moe/router.h"
#include <math.h>
#include <string.h>
#include "core/common.h"

void router_topk(const float *logits, int N, int E, int k, int renorm, float *probs, float *lse,
                 int32_t *idx, float *w) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const float *x = logits + (size_t)t * E;
        float *p = probs + (size_t)t * E;
        float mx = -INFINITY;
        for (int e = 0; e < E; e++) if (x[e] > mx) mx = x[e];
        double s = 0;
        for (int e = 0; e < E; e++) s += exp((double)x[e] - mx);
        float l = mx + (float)log(s);
        lse[t] = l;
        for (int e = 0; e < E; e++) p[e] = expf(x[e] - l);
        int32_t *ix = idx + (size_t)t * k;
        float *wt = w + (size_t)t * k;
        for (int j = 0; j < k; j++) {   // selection: k is small
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int m = 0; m < j; m++) taken |= ix[m] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            ix[j] = best;
            wt[j] = p[best];
        }
        if (renorm) {
            double sw = 0;
            for (int j = 0; j < k; j++) sw += wt[j];
            for (int j = 0; j < k; j++) wt[j] = (float)(wt[j] / sw);
        }
    }
}

void plan_alloc(DispatchPlan *p, int N, int E, int k) {
    memset(p, 0, sizeof *p);
    p->off = xcalloc(E + 1, sizeof *p->off);
    p->counts = xcalloc(E, sizeof *p->counts);
    p->row_tok = xcalloc((size_t)N * k, sizeof *p->row_tok);
    p->row_slot = xcalloc((size_t)N * k, sizeof *p->row_slot);
    p->slot_row = xcalloc((size_t)N * k, sizeof *p->slot_row);
    p->N = N; p->E = E; p->k = k;
}

void plan_free(DispatchPlan *p) {
    free(p->off); free(p->counts); free(p->row_tok); free(p->row_slot); free(p->slot_row);
    memset(p, 0, sizeof *p);
}

void router_slot_counts(const int32_t *idx, int N, int E, int k, int64_t *cnt) {
    memset(cnt, 0, sizeof(int64_t) * k * E);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) cnt[(size_t)j * E + idx[(size_t)t * k + j]]++;
}

void router_budget(const int64_t *all, int S, int me, int E, int k, int64_t capacity, int64_t *budget) {
    for (int e = 0; e < E; e++) {
        int64_t before = 0;                     // assignments ranked ahead of mine
        for (int j = 0; j < k; j++) {
            int64_t b = before;
            for (int s = 0; s < me; s++) b += all[((size_t)s * k + j) * E + e];
            int64_t mine = all[((size_t)me * k + j) * E + e];
            int64_t left = capacity - b;
            budget[(size_t)j * E + e] = left < 0 ? 0 : left > mine ? mine : left;
            for (int s = 0; s < S; s++) before += all[((size_t)s * k + j) * E + e];
        }
    }
}

void plan_build(DispatchPlan *p, const int32_t *idx, int N, int E, int k, int capacity) {
    if (capacity < 0) { plan_build_budget(p, idx, N, E, k, NULL); return; }
    int64_t *cnt = xmalloc(sizeof(int64_t) * k * E), *budget = xmalloc(sizeof(int64_t) * k * E);
    router_slot_counts(idx, N, E, k, cnt);
    router_budget(cnt, 1, 0, E, k, capacity, budget);
    plan_build_budget(p, idx, N, E, k, budget);
    free(cnt);
    free(budget);
}

void plan_build_budget(DispatchPlan *p, const int32_t *idx, int N, int E, int k, const int64_t *budget) {
    CHECK(N <= p->N && E == p->E && k == p->k, "plan_build: plan sized for N=%d E=%d k=%d, got N=%d E=%d k=%d",
          p->N, p->E, p->k, N, E, k);
    memset(p->counts, 0, sizeof(int64_t) * E);
    for (int i = 0; i < N * k; i++) p->counts[idx[i]]++;
    p->off[0] = 0;
    for (int e = 0; e < E; e++) {
        int64_t kept = p->counts[e];
        if (budget) { kept = 0; for (int j = 0; j < k; j++) kept += budget[(size_t)j * E + e]; }
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

void router_losses(const float *probs, const float *lse, const int64_t *counts, int N, int E,
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

void router_backward(float *dlogits, const float *dw, const float *probs, const float *lse,
                     const int32_t *idx, const float *w, const int64_t *counts, int N, int E, int k,
                     int renorm, float aux_scale, float z_scale) {
    // aux = E * sum_e (counts_e / N) * (sum_t p_te / N): d/dp_te = E * counts_e / N^2
    float *aux_dp = xmalloc(sizeof(float) * E);
    for (int e = 0; e < E; e++) aux_dp[e] = N ? aux_scale * (float)E * ((float)counts[e] / N) / N : 0;
    router_backward_ex(dlogits, dw, probs, lse, idx, w, N, E, k, renorm, aux_dp, N ? 2.0f * z_scale / N : 0);
    free(aux_dp);
}

void router_backward_ex(float *dlogits, const float *dw, const float *probs, const float *lse,
                        const int32_t *idx, const float *w, int N, int E, int k, int renorm,
                        const float *aux_dp, float z_dl) {
#pragma omp parallel
    {
        float *dp = xcalloc(E, sizeof(float));
#pragma omp for schedule(static)
        for (int t = 0; t < N; t++) {
            const float *p = probs + (size_t)t * E;
            const int32_t *ix = idx + (size_t)t * k;
            const float *wt = w + (size_t)t * k, *g = dw + (size_t)t * k;
            for (int e = 0; e < E; e++) dp[e] = aux_dp[e];
            if (renorm) {
                // w_j = p_j / S: dp_j += (g_j - sum_m g_m w_m) / S
                double S = 0, gw = 0;
                for (int j = 0; j < k; j++) { S += p[ix[j]]; gw += (double)g[j] * wt[j]; }
                for (int j = 0; j < k; j++) dp[ix[j]] += (float)((g[j] - gw) / S);
            } else {
                for (int j = 0; j < k; j++) dp[ix[j]] += g[j];
            }
            double pdp = 0;
            for (int e = 0; e < E; e++) pdp += (double)p[e] * dp[e];
            float zc = z_dl * lse[t];
            float *dl = dlogits + (size_t)t * E;
            for (int e = 0; e < E; e++) dl[e] = p[e] * (dp[e] - (float)pdp) + zc * p[e];
        }
        free(dp);
    }
}
