// cpu_router.c — the router ops of the float32 reference backend (contracts in ops/ops.h):
// softmax (or DeepSeek-V3's sigmoid scores, group-limited choice, weight scale) + top-k + the per-expert
// probability sums, the dispatch plan's counts and rows (the
// order of moe/router.c's plan_build_budget), and the router backward: the float32
// reference of this math (src/moe/router.c's host functions call these); the sums run over the
// rows in order. tests/test_ops.c checks them against double references, test_router against
// finite differences.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "ops/cpu/cpu_ops.h"

// The groups a row may choose from (bit g: group g), DeepSeek-V3's group-limited routing: the topk_group of
// highest sum of their two best scores sc (descending order, ties: the lower group); all groups without.
static uint64_t route_groups(const float *p, const float *bias, int E, RouteRule r) {
    if (r.n_group <= 1) return ~(uint64_t)0;
    int G = r.n_group, per = E / G;
    float gs[64];
    for (int g = 0; g < G; g++) {
        float a = -INFINITY, b = -INFINITY; // the two best of the group
        for (int e = g * per; e < (g + 1) * per; e++) {
            float sc = bias ? p[e] + bias[e] : p[e];
            if (sc > a) {
                b = a;
                a = sc;
            } else if (sc > b) {
                b = sc;
            }
        }
        gs[g] = a + b;
    }
    uint64_t m = 0;
    for (int j = 0; j < r.topk_group; j++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!(m >> g & 1) && (best < 0 || gs[g] > gs[best])) best = g;
        m |= (uint64_t)1 << best;
    }
    return m;
}

void cpu_router_topk(float *probs, float *lse, int32_t *idx, float *w, double *sums, const float *logits,
                     const float *bias, int N, int E, RouteRule r) {
    int k = r.k, per = r.n_group > 1 ? E / r.n_group : E;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        const float *x = logits + (size_t)t * E;
        float *p = probs + (size_t)t * E;
        float mx = -INFINITY;
        for (int e = 0; e < E; e++)
            if (x[e] > mx) mx = x[e];
        double s = 0;
        for (int e = 0; e < E; e++) s += exp((double)x[e] - mx);
        float l = mx + (float)log(s);
        lse[t] = l;
        if (r.sigmoid)
            for (int e = 0; e < E; e++) p[e] = 1.0f / (1.0f + expf(-x[e]));
        else
            for (int e = 0; e < E; e++) p[e] = expf(x[e] - l);
        uint64_t gm = route_groups(p, bias, E, r);
        int32_t *ix = idx + (size_t)t * k;
        float *wt = w + (size_t)t * k;
        for (int j = 0; j < k; j++) { // selection: k is small
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = !(gm >> (e / per) & 1);
                for (int m = 0; m < j; m++) taken |= ix[m] == e;
                float se = bias ? p[e] + bias[e] : p[e];
                if (!taken && (best < 0 || se > (bias ? p[best] + bias[best] : p[best]))) best = e;
            }
            ix[j] = best;
            wt[j] = p[best];
        }
        if (r.renorm) {
            double sw = 0;
            for (int j = 0; j < k; j++) sw += wt[j];
            for (int j = 0; j < k; j++) wt[j] = (float)(wt[j] / sw);
        }
        if (r.scale != 0 && r.scale != 1)
            for (int j = 0; j < k; j++) wt[j] *= r.scale;
    }
    if (sums) {
        memset(sums, 0, sizeof(double) * (E + 1));
        for (int t = 0; t < N; t++) {
            const float *p = probs + (size_t)t * E;
            if (r.sigmoid) { // the aux statistics over the scores normalised to sum 1 (DeepSeek-V3)
                double P = 0;
                for (int e = 0; e < E; e++) P += p[e];
                for (int e = 0; e < E; e++) sums[e] += p[e] / P;
            } else {
                for (int e = 0; e < E; e++) sums[e] += p[e];
            }
            sums[E] += (double)lse[t] * lse[t];
        }
    }
}

void cpu_plan_counts(int32_t *cnt, int32_t *rank, const int32_t *idx, int N, int E, int k) {
    memset(cnt, 0, sizeof(int32_t) * (size_t)k * E);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            size_t q = (size_t)t * k + j;
            rank[q] = cnt[(size_t)j * E + idx[q]]++;
        }
}

void cpu_plan_rows(int32_t *slot_row, int32_t *row_tok, float *row_scale, const int32_t *rank,
                   const int32_t *idx, const float *w, const int32_t *keep, const int32_t *first, int N,
                   int E, int k) {
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            size_t q = (size_t)t * k + j, c = (size_t)j * E + idx[q];
            if (rank[q] < keep[c]) {
                int32_t row = first[c] + rank[q];
                slot_row[q] = row;
                row_tok[row] = t;
                row_scale[row] = w[q];
            } else {
                slot_row[q] = -1;
            }
        }
}

void cpu_router_bwd(float *dlogits, const float *rowdot, const int32_t *slot_row, const float *probs,
                    const float *lse, const int32_t *idx, const float *w, const float *aux_dp, float z_dl,
                    int N, int E, RouteRule r) {
    int k = r.k;
    float sc = r.scale != 0 ? r.scale : 1.0f; // (times 1: the same bits as unscaled)
    size_t per = (size_t)(E ? E : 1) + (size_t)(k ? k : 1); // each thread's dp (E) and g (k)
    float *scr = cpu_scratch(sizeof(float) * per * omp_get_max_threads());
#pragma omp parallel
    {
        float *dp = scr + per * omp_get_thread_num(), *g = dp + (E ? E : 1);
#pragma omp for schedule(static)
        for (int t = 0; t < N; t++) {
            const float *p = probs + (size_t)t * E;
            const int32_t *ix = idx + (size_t)t * k;
            const float *wt = w + (size_t)t * k;
            for (int j = 0; j < k; j++) {
                int32_t q = slot_row[(size_t)t * k + j];
                g[j] = q >= 0 ? rowdot[q] : 0.0f;
            }
            if (r.sigmoid) { // the aux term on q = p / P: dp_e = (aux_dp_e - sum_m aux_dp_m q_m) / P
                double P = 0, cq = 0;
                for (int e = 0; e < E; e++) P += p[e];
                for (int e = 0; e < E; e++) cq += (double)aux_dp[e] * (p[e] / P);
                for (int e = 0; e < E; e++) dp[e] = (float)((aux_dp[e] - cq) / P);
            } else {
                for (int e = 0; e < E; e++) dp[e] = aux_dp[e];
            }
            if (r.renorm) {
                // w_j = sc p_j / S: dp_j += (sc g_j - sum_m g_m w_m) / S
                double S = 0, gw = 0;
                for (int j = 0; j < k; j++) {
                    S += p[ix[j]];
                    gw += (double)g[j] * wt[j];
                }
                for (int j = 0; j < k; j++) dp[ix[j]] += (float)((g[j] * sc - gw) / S);
            } else {
                for (int j = 0; j < k; j++) dp[ix[j]] += g[j] * sc;
            }
            float *dl = dlogits + (size_t)t * E;
            if (r.sigmoid) { // dp/dlogit = p (1 - p), each score its own logit's
                for (int e = 0; e < E; e++) dl[e] = dp[e] * (p[e] * (1.0f - p[e]));
                continue;
            }
            double pdp = 0;
            for (int e = 0; e < E; e++) pdp += (double)p[e] * dp[e];
            float zc = z_dl * lse[t];
            for (int e = 0; e < E; e++) dl[e] = p[e] * (dp[e] - (float)pdp) + zc * p[e];
        }
    }
}
