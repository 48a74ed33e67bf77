// test_router.c — properties of the router's host reference (router_ref.h: softmax/top-k, the
// dispatch plan's priority order and capacity drops, router_budget across ranks, the aux/z losses
// and their gradients) and of the MoE layer's routing and combine, each against a brute-force or
// double-precision computation written here; DeepSeek-V3's routing (sigmoid scores, group-limited choice, the
// weight scale, the aux statistics over normalised scores) against a double reference and finite differences.
//
// Tolerances (each stated where used): probabilities and weights are float32 softmaxes of O(1)
// logits, so they carry ~1e-7 relative rounding; 2e-6 is used. The MoE output chains three
// float32 GEMMs with sums of <= 24 terms (~1e-6 relative to the magnitude of the terms) after a
// float32 softmax; the test allows 1e-4 of sum_j |w_j| sum_i |W2[c,i] a_i| (any wrong expert,
// weight or row moves y by O(that magnitude)). Finite differences use h = 1e-2 in float32 with
// the loss summed in double: noise ~1e-5, O(h^2) truncation ~1e-4 relative, so 1e-2 relative
// (+ small absolute floors) catches any wrong term without flaking.
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "moe/moe.h"
#include "router_ref.h"
#include "test_util.h"

static Rng R;

static float *fnew(size_t n) { return xcalloc(n ? n : 1, sizeof(float)); }
static void fill_normal(float *x, size_t n, float sd) {
    for (size_t i = 0; i < n; i++) x[i] = sd * rng_normal(&R);
}
static double dot_dd(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}
static int all_finite(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

// Indices 0..E-1 ordered by p descending, ties to the lower index (insertion sort: stable).
static void order_desc_f(const float *p, int E, int *ord) {
    for (int e = 0; e < E; e++) {
        int i = e;
        while (i > 0 && p[ord[i - 1]] < p[e]) {
            ord[i] = ord[i - 1];
            i--;
        }
        ord[i] = e;
    }
}
static void order_desc_d(const double *p, int E, int *ord) {
    for (int e = 0; e < E; e++) {
        int i = e;
        while (i > 0 && p[ord[i - 1]] < p[e]) {
            ord[i] = ord[i - 1];
            i--;
        }
        ord[i] = e;
    }
}
static void softmax_d(const float *x, int E, double *p, double *lse) {
    double mx = -INFINITY, s = 0;
    for (int e = 0; e < E; e++)
        if (x[e] > mx) mx = x[e];
    for (int e = 0; e < E; e++) s += exp((double)x[e] - mx);
    for (int e = 0; e < E; e++) p[e] = exp((double)x[e] - mx) / s;
    *lse = mx + log(s);
}

// ---------------------------------------------------------------- top-k
static void check_topk(const char *label, const float *logits, int N, int E, int k, int renorm) {
    float *probs = fnew(N * E), *lse = fnew(N), *w = fnew(N * k);
    int32_t *idx = xcalloc(N * k, sizeof(int32_t));
    router_topk(logits, N, E, k, renorm, probs, lse, idx, w);
    int bad_p = 0, bad_sum = 0, bad_lse = 0, bad_idx = 0, bad_w = 0, bad_wsum = 0;
    double *pd = xcalloc(E, sizeof(double));
    int *ord = xcalloc(E, sizeof(int));
    for (int t = 0; t < N; t++) {
        const float *p = probs + t * E;
        double l, s = 0;
        softmax_d(logits + t * E, E, pd, &l);
        for (int e = 0; e < E; e++) {
            s += p[e];
            bad_p += !(fabs(p[e] - pd[e]) <= 2e-6 * pd[e] + 1e-30); // float softmax: ~1e-7 relative
        }
        bad_sum += !(fabs(s - 1.0) <= 1e-5);
        bad_lse += !(fabs(lse[t] - l) <= 2e-6 * (fabs(l) + 1));
        // the k largest of the returned probs, descending, ties to the lower index
        order_desc_f(p, E, ord);
        for (int j = 0; j < k; j++) bad_idx += idx[t * k + j] != ord[j];
        double S = 0, ws = 0;
        for (int j = 0; j < k; j++) S += p[ord[j]];
        for (int j = 0; j < k; j++) {
            float wj = w[t * k + j];
            ws += wj;
            if (renorm) bad_w += !(fabs(wj - p[ord[j]] / S) <= 2e-6 * (p[ord[j]] / S));
            else bad_w += !(wj == p[ord[j]]); // without renormalisation: exactly the probs
        }
        if (renorm) bad_wsum += !(fabs(ws - 1.0) <= 2e-6 * k);
    }
    EXPECT(!bad_p, "[%s] %d probs differ from a double softmax", label, bad_p);
    EXPECT(!bad_sum, "[%s] %d rows of probs do not sum to 1", label, bad_sum);
    EXPECT(!bad_lse, "[%s] %d lse differ from a double logsumexp", label, bad_lse);
    EXPECT(!bad_idx, "[%s] %d top-k indices are not the k largest probs (desc, ties to lower index)", label,
           bad_idx);
    EXPECT(!bad_w, "[%s] %d weights wrong (%s)", label, bad_w, renorm ? "p/sum of top-k p" : "== probs");
    EXPECT(!bad_wsum, "[%s] %d rows of renormalised weights do not sum to 1", label, bad_wsum);
    free(probs);
    free(lse);
    free(w);
    free(idx);
    free(pd);
    free(ord);
}

static void test_topk(void) {
    int Es[] = {1, 2, 5, 8}, ks[] = {1, 2, 3, 8};
    for (int a = 0; a < 4; a++)
        for (int b = 0; b < 4; b++) {
            int E = Es[a], k = ks[b];
            if (k > E) continue;
            for (int renorm = 0; renorm < 2; renorm++) {
                int N = 37;
                float *lg = fnew(N * E);
                fill_normal(lg, N * E, 2);
                char lab[64];
                snprintf(lab, sizeof lab, "topk E=%d k=%d renorm=%d", E, k, renorm);
                check_topk(lab, lg, N, E, k, renorm);
                check_topk("topk N=1", lg, 1, E, k, renorm);
                free(lg);
            }
        }
    // exact ties: equal logits give bit-equal probs; the lower index must win
    const float tie[3][6] = {{1, 3, 3, 1, 3, 0}, {0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, {-2, 7, -2, 7, 7, 7}};
    const int32_t want3[3][3] = {{1, 2, 4}, {0, 1, 2}, {1, 3, 4}},
                  want4[3][4] = {{1, 2, 4, 0}, {0, 1, 2, 3}, {1, 3, 4, 5}};
    float probs[18], lse[3], w[12];
    int32_t idx[12];
    router_topk(&tie[0][0], 3, 6, 3, 1, probs, lse, idx, w);
    EXPECT(!memcmp(idx, want3, sizeof want3), "ties k=3: got %d %d %d | %d %d %d | %d %d %d", idx[0], idx[1],
           idx[2], idx[3], idx[4], idx[5], idx[6], idx[7], idx[8]);
    EXPECT(w[3] == w[4] && w[4] == w[5] && fabsf(w[3] - 1.0f / 3) < 1e-7f,
           "ties: equal weights 1/3, got %g %g %g", w[3], w[4], w[5]);
    router_topk(&tie[0][0], 3, 6, 4, 0, probs, lse, idx, w);
    EXPECT(!memcmp(idx, want4, sizeof want4), "ties k=4: got %d %d %d %d | %d %d %d %d | %d %d %d %d", idx[0],
           idx[1], idx[2], idx[3], idx[4], idx[5], idx[6], idx[7], idx[8], idx[9], idx[10], idx[11]);
    check_topk("topk ties", &tie[0][0], 3, 6, 4, 1);
    // k = E: every expert, a permutation sorted by prob; renormalised weights == probs
    float lg[2 * 5];
    fill_normal(lg, 10, 1);
    router_topk(lg, 2, 5, 5, 1, probs, lse, idx, w);
    int bad = 0;
    for (int t = 0; t < 2; t++)
        for (int j = 0; j < 5; j++)
            bad += !(fabsf(w[t * 5 + j] - probs[t * 5 + idx[t * 5 + j]]) <=
                     2e-6f * probs[t * 5 + idx[t * 5 + j]]);
    EXPECT(!bad, "k=E renorm: weights must equal probs (%d differ)", bad);
}

// ---------------------------------------------------------------- dispatch plan
// Brute force, written independently of plan_build's loops: for each expert in turn, walk the
// priority order (slot j outer, token t inner) and keep the first `cap`.
typedef struct {
    int64_t counts[64], off[65];
    int32_t rt[4096], rs[4096], sr[4096];
    int M, dropped;
} RefPlan;
static void plan_ref(RefPlan *r, const int32_t *idx, int N, int E, int k, int cap) {
    r->M = 0;
    for (int e = 0; e < E; e++) {
        r->counts[e] = 0;
        r->off[e] = r->M;
        for (int j = 0; j < k; j++)
            for (int t = 0; t < N; t++) {
                if (idx[t * k + j] != e) continue;
                r->counts[e]++;
                if (cap < 0 || r->counts[e] <= cap) {
                    r->rt[r->M] = t;
                    r->rs[r->M] = j;
                    r->sr[t * k + j] = r->M;
                    r->M++;
                } else {
                    r->sr[t * k + j] = -1;
                }
            }
    }
    r->off[E] = r->M;
    r->dropped = N * k - r->M;
}

static int check_plan(const char *label, const DispatchPlan *p, const int32_t *idx, int N, int E, int k,
                      int cap) {
    int f0 = t_failures;
    static RefPlan r;
    plan_ref(&r, idx, N, E, k, cap);
    // counts: brute-force count (before drops)
    int bad = 0;
    for (int e = 0; e < E; e++) {
        int64_t c = 0;
        for (int i = 0; i < N * k; i++) c += idx[i] == e;
        bad += p->counts[e] != c;
    }
    EXPECT(!bad, "[%s] counts differ from a brute-force count", label);
    // off: prefix sum of kept counts, kept = min(count, cap)
    bad = p->off[0] != 0;
    for (int e = 0; e < E; e++) {
        int64_t kept = cap < 0 || p->counts[e] < cap ? p->counts[e] : cap;
        bad += p->off[e + 1] != p->off[e] + kept;
    }
    EXPECT(!bad, "[%s] off is not the prefix sum of min(count, capacity)", label);
    EXPECT(p->M == p->off[E] && p->M == r.M, "[%s] M %d, off[E] %lld, brute force %d", label, p->M,
           (long long)p->off[E], r.M);
    EXPECT(p->M + p->dropped == N * k, "[%s] M %d + dropped %d != N*k %d", label, p->M, p->dropped, N * k);
    EXPECT(p->dropped == r.dropped, "[%s] dropped %d, brute force %d", label, p->dropped, r.dropped);
    if (cap < 0) EXPECT(p->M == N * k && p->dropped == 0, "[%s] dropless must keep all N*k", label);
    // rows sorted by expert; within an expert in (slot, token) priority order, strictly increasing
    int bad_sort = 0, bad_prio = 0, bad_inv = 0;
    for (int e = 0; e < E; e++)
        for (int64_t rr = p->off[e]; rr < p->off[e + 1] && rr < p->M; rr++) {
            int t = p->row_tok[rr], j = p->row_slot[rr];
            if (t < 0 || t >= N || j < 0 || j >= k) {
                bad_sort++;
                continue;
            }
            bad_sort += idx[t * k + j] != e;
            if (rr > p->off[e]) {
                int t0 = p->row_tok[rr - 1], j0 = p->row_slot[rr - 1];
                bad_prio += !(j0 < j || (j0 == j && t0 < t));
            }
            bad_inv += p->slot_row[t * k + j] != rr;
        }
    EXPECT(!bad_sort, "[%s] %d rows not in their expert's range", label, bad_sort);
    EXPECT(!bad_prio, "[%s] %d rows out of priority order (slot 0 of all tokens, then slot 1, ...)", label,
           bad_prio);
    EXPECT(!bad_inv, "[%s] %d rows where slot_row[row_tok, row_slot] != row", label, bad_inv);
    // slot_row -> row -> (tok, slot) is the identity; -1 exactly for the dropped ones, and those are the
    // last ones in priority order (every kept assignment of the expert comes before every dropped one)
    int ndrop = 0;
    bad_inv = 0;
    int bad_first = 0;
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            int32_t rr = p->slot_row[t * k + j];
            if (rr < 0) {
                ndrop++;
                int e = idx[t * k + j];
                for (int64_t q = p->off[e]; q < p->off[e + 1]; q++) {
                    int tq = p->row_tok[q], jq = p->row_slot[q];
                    bad_first += !(jq < j || (jq == j && tq < t));
                }
                bad_first += p->off[e + 1] - p->off[e] != cap; // dropped only when the expert is full
                continue;
            }
            bad_inv += rr >= p->M || p->row_tok[rr] != t || p->row_slot[rr] != j;
        }
    EXPECT(!bad_inv, "[%s] %d assignments where row_tok/row_slot[slot_row] != (t, j)", label, bad_inv);
    EXPECT(ndrop == p->dropped, "[%s] %d slot_row == -1 but dropped = %d", label, ndrop, p->dropped);
    EXPECT(!bad_first,
           "[%s] %d violations: a dropped assignment precedes a kept one, or its expert is not full", label,
           bad_first);
    // and exactly the brute force
    EXPECT(!memcmp(p->row_tok, r.rt, sizeof(int32_t) * r.M) &&
               !memcmp(p->row_slot, r.rs, sizeof(int32_t) * r.M) &&
               !memcmp(p->slot_row, r.sr, sizeof(int32_t) * N * k),
           "[%s] plan differs from the brute-force plan", label);
    return t_failures - f0;
}

static void random_idx(int32_t *idx, int N, int E, int k, int skew) {
    // top-k of random logits with a per-expert bias: skew makes some experts popular (so capacity
    // drops happen) and, where k < E, never picks expert E-1 (a zero-token expert)
    float *lg = fnew(N * E), *probs = fnew(N * E), *lse = fnew(N), *w = fnew(N * k);
    fill_normal(lg, N * E, 1);
    if (skew)
        for (int t = 0; t < N; t++)
            for (int e = 0; e < E; e++)
                lg[t * E + e] += e == E - 1 && k < E ? -100.0f : 2.0f * (e == 0) + 1.0f * (e == 1);
    router_topk(lg, N, E, k, 1, probs, lse, idx, w);
    free(lg);
    free(probs);
    free(lse);
    free(w);
}

static void test_plan(void) {
    const int maxN = 40;
    int Es[] = {1, 4, 8}, ks[] = {1, 2, 8}, Ns[] = {1, 7, 40, 13};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++) {
            int E = Es[a], k = ks[b];
            if (k > E) continue;
            DispatchPlan p;
            plan_alloc(&p, maxN, E, k); // one plan reused for every build below (stale state must not leak)
            int32_t idx[40 * 8];
            for (int ni = 0; ni < 4; ni++)
                for (int skew = 0; skew < 2; skew++) {
                    int N = Ns[ni];
                    random_idx(idx, N, E, k, skew);
                    int caps[] = {-1, 0, 1, 3, N * k / E, N * k};
                    for (int ci = 0; ci < 6; ci++) {
                        char lab[96];
                        snprintf(lab, sizeof lab, "plan N=%d E=%d k=%d skew=%d cap=%d", N, E, k, skew,
                                 caps[ci]);
                        plan_build(&p, idx, N, E, k, caps[ci]);
                        check_plan(lab, &p, idx, N, E, k, caps[ci]);
                        if (skew && k < E)
                            EXPECT(p.off[E - 1] == p.off[E] && p.counts[E - 1] == 0,
                                   "[%s] expert E-1 has no tokens: off[e] == off[e+1]", lab);
                    }
                }
            plan_free(&p);
        }

    // Hand-made capacity case, N=4 E=3 k=2 capacity 2. Choices (slot0, slot1):
    //   t0 (0,1)  t1 (0,2)  t2 (0,1)  t3 (1,0)
    // expert 0: priority t0.0 t1.0 t2.0 | t3.1 -> keeps t0.0 t1.0, drops t2.0 t3.1
    // expert 1: priority t3.0 | t0.1 t2.1  -> keeps t3.0 t0.1, drops t2.1 (slot 0 of a later token wins)
    // expert 2: t1.1 kept. Token 2 loses both choices.
    {
        const int32_t idx[8] = {0, 1, 0, 2, 0, 1, 1, 0};
        const int64_t counts[3] = {4, 3, 1}, off[4] = {0, 2, 4, 5};
        const int32_t rt[5] = {0, 1, 3, 0, 1}, rs[5] = {0, 0, 0, 1, 1}, sr[8] = {0, 3, 1, 4, -1, -1, 2, -1};
        DispatchPlan p;
        plan_alloc(&p, 4, 3, 2);
        plan_build(&p, idx, 4, 3, 2, 2);
        EXPECT(!memcmp(p.counts, counts, sizeof counts), "hand case counts %lld %lld %lld",
               (long long)p.counts[0], (long long)p.counts[1], (long long)p.counts[2]);
        EXPECT(!memcmp(p.off, off, sizeof off), "hand case off %lld %lld %lld %lld", (long long)p.off[0],
               (long long)p.off[1], (long long)p.off[2], (long long)p.off[3]);
        EXPECT(p.M == 5 && p.dropped == 3, "hand case M %d dropped %d (want 5, 3)", p.M, p.dropped);
        EXPECT(!memcmp(p.row_tok, rt, sizeof rt) && !memcmp(p.row_slot, rs, sizeof rs), "hand case rows");
        EXPECT(!memcmp(p.slot_row, sr, sizeof sr), "hand case slot_row %d %d %d %d %d %d %d %d",
               p.slot_row[0], p.slot_row[1], p.slot_row[2], p.slot_row[3], p.slot_row[4], p.slot_row[5],
               p.slot_row[6], p.slot_row[7]);
        check_plan("hand case", &p, idx, 4, 3, 2, 2);
        // dropless: everything kept, same order without the cut
        plan_build(&p, idx, 4, 3, 2, -1);
        const int32_t rt2[8] = {0, 1, 2, 3, 3, 0, 2, 1}, rs2[8] = {0, 0, 0, 1, 0, 1, 1, 1};
        EXPECT(p.M == 8 && !memcmp(p.row_tok, rt2, sizeof rt2) && !memcmp(p.row_slot, rs2, sizeof rs2),
               "hand case dropless rows");
        plan_free(&p);
    }
    // all tokens on one expert (k=1), capacity 3: off = {0,0,3,3,3} and the first 3 tokens kept
    {
        int32_t idx[10];
        for (int t = 0; t < 10; t++) idx[t] = 2;
        DispatchPlan p;
        plan_alloc(&p, 10, 4, 1);
        plan_build(&p, idx, 10, 4, 1, -1);
        EXPECT(p.off[0] == 0 && p.off[1] == 0 && p.off[2] == 0 && p.off[3] == 10 && p.off[4] == 10,
               "all on expert 2, dropless: off");
        check_plan("all on one expert dropless", &p, idx, 10, 4, 1, -1);
        plan_build(&p, idx, 10, 4, 1, 3);
        EXPECT(p.off[3] == 3 && p.off[4] == 3 && p.M == 3 && p.dropped == 7 && p.slot_row[0] == 0 &&
                   p.slot_row[2] == 2 && p.slot_row[3] == -1 && p.slot_row[9] == -1,
               "all on expert 2, capacity 3: first 3 tokens kept");
        check_plan("all on one expert cap 3", &p, idx, 10, 4, 1, 3);
        plan_free(&p);
    }
}

// Token slices on S ranks (rank s holds earlier tokens than s+1; a slice may be empty): with the
// budgets from router_budget over every rank's slot counts, the union of the per-rank plans keeps
// exactly the assignments a single process keeps.
static void test_budget(void) {
    enum { N = 23, E = 4, k = 2 };
    int32_t idx[N * k];
    const int cuts[][6] = {{0, 23}, {0, 11, 23}, {0, 0, 5, 5, 17, 23}, {0, 1, 2, 3, 22, 23}};
    const int nS[] = {1, 2, 5, 5};
    for (int skew = 0; skew < 2; skew++) {
        random_idx(idx, N, E, k, skew);
        int caps[] = {-1, 0, 1, 4, 7, 12, 100};
        for (int ci = 0; ci < 7; ci++) {
            int cap = caps[ci];
            DispatchPlan one;
            plan_alloc(&one, N, E, k);
            plan_build(&one, idx, N, E, k, cap);
            for (int sc = 0; sc < 4; sc++) {
                int S = nS[sc];
                const int *b = cuts[sc];
                int64_t *all = xcalloc((size_t)S * k * E, sizeof(int64_t)), budget[k * E];
                for (int r = 0; r < S; r++)
                    router_slot_counts(idx + b[r] * k, b[r + 1] - b[r], E, k, all + (size_t)r * k * E);
                int bad = 0, kept = 0;
                int64_t per_e[E] = {0};
                for (int r = 0; r < S; r++) {
                    int n = b[r + 1] - b[r];
                    DispatchPlan p;
                    plan_alloc(&p, n, E, k);
                    if (cap < 0) plan_build_budget(&p, idx + b[r] * k, n, E, k, NULL);
                    else {
                        router_budget(all, S, r, E, k, cap, budget);
                        plan_build_budget(&p, idx + b[r] * k, n, E, k, budget);
                    }
                    for (int t = 0; t < n; t++)
                        for (int j = 0; j < k; j++) {
                            int mine = p.slot_row[t * k + j] >= 0,
                                single = one.slot_row[(b[r] + t) * k + j] >= 0;
                            bad += mine != single;
                            if (mine) {
                                kept++;
                                per_e[idx[(b[r] + t) * k + j]]++;
                            }
                        }
                    plan_free(&p);
                }
                int over = 0;
                for (int e = 0; e < E; e++) over += cap >= 0 && per_e[e] > cap;
                EXPECT(!bad && kept == one.M && !over,
                       "budget S=%d cap=%d skew=%d: %d assignments kept/dropped differently from one process "
                       "(kept %d vs %d, %d experts over capacity)",
                       S, cap, skew, bad, kept, one.M, over);
                free(all);
            }
            plan_free(&one);
        }
    }
}

// ---------------------------------------------------------------- aux and z losses
static void test_losses(void) {
    // perfectly balanced routing with uniform probs: aux == k exactly (E=4, k=2, N=8)
    {
        enum { N = 8, E = 4 };
        float probs[N * E], lse[N];
        for (int i = 0; i < N * E; i++) probs[i] = 0.25f;
        for (int t = 0; t < N; t++) lse[t] = 0;
        int64_t counts[E] = {4, 4, 4, 4};
        double aux, z;
        router_losses(probs, lse, counts, N, E, &aux, &z);
        EXPECT_NEAR(aux, 2.0, 1e-12, "aux, balanced + uniform, E=4 k=2");
        EXPECT_NEAR(z, 0.0, 0, "z with lse = 0");
        // fully collapsed (k=1): every token on expert 0 with prob 1 -> aux = E
        for (int i = 0; i < N * E; i++) probs[i] = i % E == 0 ? 1.0f : 0.0f;
        int64_t c1[E] = {N, 0, 0, 0};
        router_losses(probs, lse, c1, N, E, &aux, &z);
        EXPECT_NEAR(aux, 4.0, 1e-12, "aux, collapsed on one expert, k=1");
    }
    // random: aux = E sum_e (counts_e/N) mean_t p[t,e]; z = mean_t lse_t^2 with lse computed here in double
    {
        enum { N = 9, E = 5, k = 2 };
        float lg[N * E], probs[N * E], lse[N], w[N * k];
        int32_t idx[N * k];
        fill_normal(lg, N * E, 3);
        router_topk(lg, N, E, k, 1, probs, lse, idx, w);
        int64_t counts[E] = {0};
        for (int i = 0; i < N * k; i++) counts[idx[i]]++;
        double aux, z, a = 0, zz = 0, pd[E], l;
        router_losses(probs, lse, counts, N, E, &aux, &z);
        for (int e = 0; e < E; e++) {
            double P = 0;
            for (int t = 0; t < N; t++) P += probs[t * E + e];
            a += (double)counts[e] / N * P / N;
        }
        for (int t = 0; t < N; t++) {
            softmax_d(lg + t * E, E, pd, &l);
            zz += l * l;
        }
        EXPECT_NEAR(aux, E * a, 1e-12 * E * a, "aux vs its definition");
        EXPECT_NEAR(z, zz / N, 4e-6 * zz / N, "z vs mean squared logsumexp (double, from the logits)");
    }
}

// dlogits vs central differences of sum dw*w + aux_scale*aux + z_scale*z, counts (and idx) held fixed
typedef struct {
    const float *lg;
    const float *dw;
    const int64_t *counts;
    const int32_t *idx0;
    int N, E, k, renorm;
    float as, zs;
    int flipped;
} RbCtx;
static double rb_loss(RbCtx *c) {
    int N = c->N, E = c->E, k = c->k;
    float *probs = fnew(N * E), *lse = fnew(N), *w = fnew(N * k);
    int32_t *idx = xcalloc(N * k, sizeof(int32_t));
    router_topk(c->lg, N, E, k, c->renorm, probs, lse, idx, w);
    if (memcmp(idx, c->idx0, sizeof(int32_t) * N * k)) c->flipped = 1;
    double aux, z, L = 0;
    router_losses(probs, lse, c->counts, N, E, &aux, &z);
    for (int i = 0; i < N * k; i++) L += (double)c->dw[i] * w[i];
    L += c->as * aux + c->zs * z;
    free(probs);
    free(lse);
    free(w);
    free(idx);
    return L;
}

static void test_router_backward(void) {
    enum { N = 6, E = 5, k = 2 };
    const float h = 1e-2f;
    for (int renorm = 0; renorm < 2; renorm++)
        for (int which = 0; which < 4; which++) { // 0 aux only, 1 z only, 2 dw only, 3 all
            float lg[N * E], probs[N * E], lse[N], w[N * k], dw[N * k], dl[N * E];
            int32_t idx[N * k];
            fill_normal(lg, N * E, 1.5f);
            fill_normal(dw, N * k, 1);
            router_topk(lg, N, E, k, renorm, probs, lse, idx, w);
            int64_t counts[E] = {0};
            for (int i = 0; i < N * k; i++) counts[idx[i]]++;
            float as = which == 0 || which == 3 ? 0.7f : 0, zs = which == 1 || which == 3 ? 0.3f : 0;
            if (which < 2) memset(dw, 0, sizeof dw);
            for (int i = 0; i < N * E; i++) dl[i] = NAN; // every element must be written
            router_backward(dl, dw, probs, lse, idx, w, counts, N, E, k, renorm, as, zs);
            float lgp[N * E];
            memcpy(lgp, lg, sizeof lg);
            RbCtx c = {lgp, dw, counts, idx, N, E, k, renorm, as, zs, 0};
            double rms = 0;
            for (int i = 0; i < N * E; i++) rms += (double)dl[i] * dl[i];
            rms = sqrt(rms / (N * E));
            int bad = 0, skipped = 0, first = -1;
            double fd_first = 0;
            for (int i = 0; i < N * E; i++) {
                float x0 = lgp[i], xp = x0 + h, xm = x0 - h;
                c.flipped = 0;
                lgp[i] = xp;
                double lp = rb_loss(&c);
                lgp[i] = xm;
                double lm = rb_loss(&c);
                lgp[i] = x0;
                if (c.flipped && which >= 2) {
                    skipped++;
                    continue;
                } // top-k changed: w not smooth here
                double fd = (lp - lm) / ((double)xp - xm);
                // noise: float probs ~1e-7 relative in L ~ O(1) -> ~1e-5 after / 2h; truncation ~h^2
                if (!(fabs(fd - dl[i]) <= 1e-2 * fabs(dl[i]) + 1e-3 * rms + 2e-5)) {
                    if (first < 0) {
                        first = i;
                        fd_first = fd;
                    }
                    bad++;
                }
            }
            const char *names[] = {"aux", "z", "dw.w", "all"};
            EXPECT(!bad,
                   "router_backward %s renorm=%d: %d of %d dlogits disagree with finite differences; first "
                   "[%d] fd %.7g "
                   "analytic %.7g",
                   names[which], renorm, bad, N * E, first, fd_first, first >= 0 ? dl[first] : 0.0f);
            EXPECT(skipped <= 4, "router_backward %s renorm=%d: %d elements skipped for top-k flips",
                   names[which], renorm, skipped);
        }
}

// ---------------------------------------------------------------- the MoE layer
typedef struct {
    ModelConfig c;
    int N, cap;
    float *x, *wr, *w1, *w3, *w2;
} Case;

// cf <= 0: dropless; else capacity mode with capacity_factor cf (capacity = capacity_for(c, N)).
static void case_init(Case *K, int N, int d, int f, int E, int k, int renorm, float cf, float router_sd) {
    memset(K, 0, sizeof *K);
    config_preset(&K->c, "tiny");
    K->c.d_model = d;
    K->c.d_ff = f;
    K->c.n_experts = E;
    K->c.top_k = k;
    K->c.renormalize = renorm;
    K->c.jitter = 0;
    K->c.dispatch = cf <= 0 ? DISPATCH_DROPLESS : DISPATCH_CAPACITY;
    if (cf > 0) K->c.capacity_factor = cf;
    K->N = N;
    K->cap = cf <= 0 ? -1 : capacity_for(&K->c, N);
    K->x = fnew(N * d);
    K->wr = fnew(E * d);
    K->w1 = fnew((size_t)E * f * d);
    K->w3 = fnew((size_t)E * f * d);
    K->w2 = fnew((size_t)E * d * f);
    fill_normal(K->x, N * d, 1);
    fill_normal(K->wr, E * d, router_sd);
    fill_normal(K->w1, (size_t)E * f * d, 1.0f / sqrtf(d));
    fill_normal(K->w3, (size_t)E * f * d, 1.0f / sqrtf(d));
    fill_normal(K->w2, (size_t)E * d * f, 1.0f / sqrtf(f));
}
static void case_free(Case *K) {
    free(K->x);
    free(K->wr);
    free(K->w1);
    free(K->w3);
    free(K->w2);
}
// rig: feature 0 of every token is 1 and the router's column 0 is a per-expert bias
static void case_bias(Case *K, const float *bias) {
    int d = K->c.d_model;
    for (int t = 0; t < K->N; t++) K->x[t * d] = 1.0f;
    for (int e = 0; e < K->c.n_experts; e++) K->wr[e * d] = bias[e];
}

// y computed token by token in double: route with a double softmax, drop by the priority rule,
// then sum_j w_j * expert_{e_j}(x_t).
// Also the aux and z losses over the N tokens, from the double probs and logsumexps.
static void moe_ref(const Case *K, double *y, double *mag, int32_t *idx, int *kept, double *aux, double *z) {
    int N = K->N, d = K->c.d_model, f = K->c.d_ff, E = K->c.n_experts, k = K->c.top_k;
    double *lg = xcalloc(E, sizeof(double)), *p = xcalloc(E, sizeof(double)),
           *wt = xcalloc((size_t)N * k, sizeof(double));
    double *a = xcalloc(f, sizeof(double));
    int *ord = xcalloc(E, sizeof(int)), *fill = xcalloc(E, sizeof(int));
    double *P = xcalloc(E, sizeof(double)), zz = 0;
    for (int t = 0; t < N; t++) {
        double mx = -INFINITY, s = 0, S = 0;
        for (int e = 0; e < E; e++) {
            lg[e] = 0;
            for (int i = 0; i < d; i++) lg[e] += (double)K->x[t * d + i] * K->wr[e * d + i];
            if (lg[e] > mx) mx = lg[e];
        }
        for (int e = 0; e < E; e++) s += exp(lg[e] - mx);
        for (int e = 0; e < E; e++) {
            p[e] = exp(lg[e] - mx) / s;
            P[e] += p[e];
        }
        zz += (mx + log(s)) * (mx + log(s));
        order_desc_d(p, E, ord);
        for (int j = 0; j < k; j++) {
            idx[t * k + j] = ord[j];
            S += p[ord[j]];
        }
        for (int j = 0; j < k; j++) wt[t * k + j] = K->c.renormalize ? p[ord[j]] / S : p[ord[j]];
    }
    *aux = 0;
    for (int e = 0; e < E; e++) {
        int cnt = 0;
        for (int i = 0; i < N * k; i++) cnt += idx[i] == e;
        *aux += (double)E * cnt / N * P[e] / N;
    }
    *z = zz / N;
    for (int j = 0; j < k; j++)
        for (int t = 0; t < N; t++) {
            int e = idx[t * k + j];
            kept[t * k + j] = K->cap < 0 || fill[e] < K->cap;
            fill[e] += kept[t * k + j];
        }
    for (int t = 0; t < N; t++) {
        const float *xt = K->x + t * d;
        for (int c = 0; c < d; c++) y[t * d + c] = mag[t * d + c] = 0;
        for (int j = 0; j < k; j++) {
            if (!kept[t * k + j]) continue;
            int e = idx[t * k + j];
            double w = wt[t * k + j];
            for (int i = 0; i < f; i++) {
                double h1 = 0, h3 = 0;
                for (int c = 0; c < d; c++) {
                    h1 += (double)K->w1[((size_t)e * f + i) * d + c] * xt[c];
                    h3 += (double)K->w3[((size_t)e * f + i) * d + c] * xt[c];
                }
                a[i] = h1 / (1 + exp(-h1)) * h3;
            }
            for (int c = 0; c < d; c++)
                for (int i = 0; i < f; i++) {
                    double term = (double)K->w2[((size_t)e * d + c) * f + i] * a[i];
                    y[t * d + c] += w * term;
                    mag[t * d + c] += fabs(w * term);
                }
        }
    }
    free(lg);
    free(p);
    free(wt);
    free(a);
    free(ord);
    free(fill);
    free(P);
}

typedef struct {
    MoeLayer m;
    MoeScratch s;
    Case *K;
    float *y;
    const float *dy;
    float as, zs;
} MoeRun;
static double moe_loss(MoeRun *r) {
    Case *K = r->K;
    MoeWeights W = {.router = K->wr, .w1 = K->w1, .w3 = K->w3, .w2 = K->w2};
    moe_forward(&r->m, r->y, NULL, K->x, K->N, &W, &K->c, 0, 0);
    return dot_dd(r->dy, r->y, (size_t)K->N * K->c.d_model) + r->as * r->m.aux + r->zs * r->m.z;
}

// Runs forward (vs moe_ref) and backward (finite, accumulating, vs directional finite differences).
static void check_moe(const char *label, Case *K, int expect_dropped_token) {
    int N = K->N, d = K->c.d_model, f = K->c.d_ff, E = K->c.n_experts, k = K->c.top_k;
    const Backend *be = backend_cpu();
    MoeRun r;
    r.K = K;
    MoeComms cm = {0}; // every group of one: a single process
    moe_layer_init(&r.m, be, &K->c, N, &cm);
    r.m.host_router_out = 1; // the checks below read the routing on the host (idx_h)
    moe_scratch_init(&r.s, be, &K->c, N);
    r.y = fnew(N * d);
    float *dy = fnew(N * d);
    fill_normal(dy, N * d, 1);
    r.dy = dy;
    r.as = 0.2f;
    r.zs = 0.05f;
    for (int i = 0; i < N * d; i++) r.y[i] = NAN;
    double L0 = moe_loss(&r);
    // forward vs the direct per-token computation
    double *yr = xcalloc((size_t)N * d, sizeof(double)), *ym = xcalloc((size_t)N * d, sizeof(double));
    int32_t *idx = xcalloc(N * k, sizeof(int32_t));
    int *kept = xcalloc(N * k, sizeof(int));
    double aux, z;
    moe_ref(K, yr, ym, idx, kept, &aux, &z);
    // float32 probs / lse: ~1e-7 relative each
    char what[128];
    snprintf(what, sizeof what, "[%s] aux loss of the layer vs E sum_e f_e P_e in double", label);
    EXPECT_NEAR(r.m.aux, aux, 1e-5 * aux, what);
    snprintf(what, sizeof what, "[%s] z loss of the layer vs mean lse^2 in double", label);
    EXPECT_NEAR(r.m.z, z, 1e-5 * z + 1e-9, what);
    EXPECT(!memcmp(idx, r.m.idx_h, sizeof(int32_t) * N * k),
           "[%s] routing differs from the double-precision top-k", label);
    int bad = 0, first = -1, ndropped_tok = 0, bad_zero = 0;
    for (int i = 0; i < N * d; i++)
        if (!(fabs(r.y[i] - yr[i]) <= 1e-4 * ym[i] + 1e-7)) {
            if (first < 0) first = i;
            bad++;
        }
    EXPECT(!bad,
           "[%s] moe_forward y: %d of %d differ from sum_j w_j expert_j(x); first [%d] got %.8g want %.8g",
           label, bad, N * d, first, first >= 0 ? r.y[first] : 0.0, first >= 0 ? yr[first] : 0.0);
    for (int t = 0; t < N; t++) {
        int any = 0;
        for (int j = 0; j < k; j++) any |= kept[t * k + j];
        if (any) continue;
        ndropped_tok++;
        for (int c = 0; c < d; c++) bad_zero += r.y[t * d + c] != 0.0f;
    }
    EXPECT(!bad_zero, "[%s] a token whose every choice is dropped must get y = 0 exactly", label);
    if (expect_dropped_token)
        EXPECT(ndropped_tok > 0, "[%s] the case was built to fully drop a token", label);
    int M = 0;
    for (int i = 0; i < N * k; i++) M += kept[i];
    EXPECT(r.m.plan.M == M && r.m.dropped == N * k - M, "[%s] kept rows %d, dropped %lld; reference %d, %d",
           label, r.m.plan.M, (long long)r.m.dropped, M, N * k - M);
    EXPECT(isfinite(L0) && all_finite(r.y, N * d), "[%s] forward not finite", label);

    // backward: from zero buffers, then from pre-filled buffers: the weight gradients must add, dx is written
    // (moe.h), the same bits whatever it held
    size_t nw[5] = {(size_t)N * d, (size_t)E * d, (size_t)E * f * d, (size_t)E * f * d, (size_t)E * d * f};
    float *par[5] = {K->x, K->wr, K->w1, K->w3, K->w2};
    const char *pname[5] = {"dx", "router", "w1", "w3", "w2"};
    float *g0[5], *g1[5], *pre[5];
    for (int q = 0; q < 5; q++) {
        g0[q] = fnew(nw[q]);
        pre[q] = fnew(nw[q]);
        fill_normal(pre[q], nw[q], 1);
        g1[q] = fnew(nw[q]);
        memcpy(g1[q], pre[q], nw[q] * sizeof(float));
    }
    MoeWeights W = {.router = K->wr, .w1 = K->w1, .w3 = K->w3, .w2 = K->w2};
    MoeGrads G0 = {.router = g0[1], .w1 = g0[2], .w3 = g0[3], .w2 = g0[4]},
             G1 = {.router = g1[1], .w1 = g1[2], .w3 = g1[3], .w2 = g1[4]};
    moe_backward(&r.m, &r.s, g0[0], dy, K->x, &W, &G0, &K->c, r.as, r.zs);
    moe_backward(&r.m, &r.s, g1[0], dy, K->x, &W, &G1, &K->c, r.as, r.zs);
    for (int q = 0; q < 5; q++) {
        EXPECT(all_finite(g0[q], nw[q]), "[%s] gradient %s not finite", label, pname[q]);
        int bad_acc = 0;
        if (q == 0) {
            EXPECT(!memcmp(g1[0], g0[0], nw[0] * sizeof(float)),
                   "[%s] moe_backward dx must be written (=), not added", label);
            continue;
        }
        for (size_t i = 0; i < nw[q]; i++)
            bad_acc += !(fabs((double)g1[q][i] - ((double)pre[q][i] + g0[q][i])) <=
                         1e-5 * (fabs(pre[q][i]) + fabs(g0[q][i])) + 1e-7);
        EXPECT(!bad_acc, "[%s] moe_backward %s must accumulate (+=): %d elements", label, pname[q], bad_acc);
    }
    // experts with no kept rows get exactly zero weight gradient
    for (int e = 0; e < E; e++) {
        if (r.m.plan.off[e] != r.m.plan.off[e + 1]) continue;
        int nz = 0;
        for (int q = 2; q < 5; q++)
            for (size_t i = 0; i < (size_t)f * d; i++) nz += g0[q][(size_t)e * f * d + i] != 0.0f;
        EXPECT(!nz, "[%s] expert %d has no rows but %d nonzero weight gradients", label, e, nz);
    }
    // directional finite differences (gradient direction and a random one) for every tensor
    int32_t *idx0 = xcalloc(N * k, sizeof(int32_t)), *sr0 = xcalloc(N * k, sizeof(int32_t));
    memcpy(idx0, r.m.idx_h, sizeof(int32_t) * N * k);
    memcpy(sr0, r.m.slotrow, sizeof(int32_t) * N * k);
    const float h = 1e-2f;
    int skipped = 0;
    for (int q = 0; q < 5; q++) {
        size_t n = nw[q];
        float *p = par[q], *p0 = fnew(n), *u = fnew(n);
        memcpy(p0, p, n * sizeof(float));
        double gn = 0;
        for (size_t i = 0; i < n; i++) gn += (double)g0[q][i] * g0[q][i];
        gn = sqrt(gn);
        for (int dir = 0; dir < 2; dir++) {
            double un = 0, an = 0;
            for (size_t i = 0; i < n; i++) {
                u[i] = dir == 0 && gn > 0 ? g0[q][i] : rng_normal(&R);
                un += (double)u[i] * u[i];
            }
            un = sqrt(un);
            for (size_t i = 0; i < n; i++) p[i] = p0[i] + h * (float)(u[i] / un);
            for (size_t i = 0; i < n; i++) an += (double)g0[q][i] * p[i];
            double lp = moe_loss(&r);
            int flip = memcmp(idx0, r.m.idx_h, sizeof(int32_t) * N * k) ||
                memcmp(sr0, r.m.slotrow, sizeof(int32_t) * N * k);
            for (size_t i = 0; i < n; i++) p[i] = p0[i] - h * (float)(u[i] / un);
            for (size_t i = 0; i < n; i++) an -= (double)g0[q][i] * p[i];
            double lm = moe_loss(&r);
            flip |= memcmp(idx0, r.m.idx_h, sizeof(int32_t) * N * k) ||
                memcmp(sr0, r.m.slotrow, sizeof(int32_t) * N * k);
            memcpy(p, p0, n * sizeof(float));
            if (flip) {
                skipped++;
                continue;
            }
            double fd = (lp - lm) / (2.0 * h);
            an /= 2.0 * h;
            EXPECT(fabs(fd - an) <= 1e-2 * fabs(an) + 1e-3 * gn + 1e-4,
                   "[%s] moe_backward %s (%s direction): finite diff %.7g vs analytic %.7g (|g| %.3g)", label,
                   pname[q], dir ? "random" : "gradient", fd, an, gn);
        }
        free(p0);
        free(u);
    }
    EXPECT(skipped <= 1, "[%s] %d directions skipped for routing flips", label, skipped);
    for (int q = 0; q < 5; q++) {
        free(g0[q]);
        free(g1[q]);
        free(pre[q]);
    }
    free(idx0);
    free(sr0);
    free(yr);
    free(ym);
    free(idx);
    free(kept);
    free(dy);
    free(r.y);
    moe_scratch_free(&r.s);
    moe_layer_free(&r.m);
}

static void test_moe(void) {
    Case K;
    // random routing, dropless, renorm and not
    case_init(&K, 12, 16, 24, 4, 2, 1, 0, 1.0f);
    check_moe("moe dropless renorm k=2", &K, 0);
    case_free(&K);
    case_init(&K, 12, 16, 24, 4, 2, 0, 0, 1.0f);
    check_moe("moe dropless no-renorm k=2", &K, 0);
    case_free(&K);
    // capacity with drops: cf 0.5 -> capacity ceil(0.5 * 12 * 2 / 4) = 3; cf 0.8 -> 5
    case_init(&K, 12, 16, 24, 4, 2, 1, 0.5f, 1.0f);
    EXPECT(K.cap == 3, "capacity_for: %d", K.cap);
    check_moe("moe capacity 3 renorm k=2", &K, 0);
    case_free(&K);
    case_init(&K, 12, 16, 24, 4, 2, 0, 0.8f, 1.0f);
    EXPECT(K.cap == 5, "capacity_for: %d", K.cap);
    check_moe("moe capacity 5 no-renorm k=2", &K, 0);
    case_free(&K);
    // k = E and k = 1; N = 1
    case_init(&K, 6, 8, 12, 4, 4, 1, 0, 1.0f);
    check_moe("moe dropless k=E", &K, 0);
    case_free(&K);
    case_init(&K, 6, 8, 12, 4, 1, 1, 0, 1.0f);
    check_moe("moe dropless k=1", &K, 0);
    case_free(&K);
    case_init(&K, 1, 8, 12, 4, 2, 1, 0, 1.0f);
    check_moe("moe N=1", &K, 0);
    case_free(&K);
    // all tokens on expert 2 (k=1): three zero-token experts
    {
        const float bias[4] = {0, 0, 8, 0};
        case_init(&K, 10, 8, 12, 4, 1, 1, 0, 0.3f);
        case_bias(&K, bias);
        check_moe("moe all tokens on one expert", &K, 0);
        case_free(&K);
        // and capacity 4 (cf 1.5: ceil(1.5 * 10 * 1 / 4)): the 6 later tokens lose their only choice
        case_init(&K, 10, 8, 12, 4, 1, 1, 1.5f, 0.3f);
        case_bias(&K, bias);
        EXPECT(K.cap == 4, "capacity_for: %d", K.cap);
        check_moe("moe all on one expert, capacity 4", &K, 1);
        case_free(&K);
    }
    // experts 4 and 5 of 6 never chosen (k=2)
    {
        const float bias[6] = {0, 0, 0, 0, -8, -8};
        case_init(&K, 10, 8, 12, 6, 2, 1, 0, 0.3f);
        case_bias(&K, bias);
        check_moe("moe zero-token experts", &K, 0);
        case_free(&K);
    }
    // the smallest capacity (capacity_for clamps to 1): most assignments dropped
    case_init(&K, 5, 8, 12, 4, 2, 1, 0.01f, 1.0f);
    EXPECT(K.cap == 1, "capacity_for: %d", K.cap);
    check_moe("moe capacity 1", &K, 0);
    case_free(&K);
    // the hand-made capacity case of test_plan (capacity 2 = ceil(0.7 * 4 * 2 / 3)), routed through a
    // rigged router: x_t = one-hot(t) in dims 0..3 (+ random dims 4..7 the router ignores),
    // router[e][t] = logit(t, e)
    {
        const float L[4][3] = {{6, 4, 0}, {6, 0, 4}, {6, 4, 0}, {4, 6, 0}};
        case_init(&K, 4, 8, 12, 3, 2, 1, 0.7f, 1.0f);
        EXPECT(K.cap == 2, "capacity_for: %d", K.cap);
        for (int t = 0; t < 4; t++)
            for (int i = 0; i < 4; i++) K.x[t * 8 + i] = i == t;
        for (int e = 0; e < 3; e++)
            for (int i = 0; i < 8; i++) K.wr[e * 8 + i] = i < 4 ? L[i][e] : 0.0f;
        check_moe("moe hand-made capacity case", &K, 1);
        // and the plan it built is the hand-computed one
        MoeLayer m;
        MoeComms cm = {0};
        moe_layer_init(&m, backend_cpu(), &K.c, 4, &cm);
        float y[32];
        MoeWeights W = {.router = K.wr, .w1 = K.w1, .w3 = K.w3, .w2 = K.w2};
        moe_forward(&m, y, NULL, K.x, 4, &W, &K.c, 0, 0);
        const int32_t sr[8] = {0, 3, 1, 4, -1, -1, 2, -1};
        EXPECT(!memcmp(m.slotrow, sr, sizeof sr) && m.plan.M == 5, "hand-made moe case: plan");
        int z = 1;
        for (int c = 0; c < 8; c++) z &= y[2 * 8 + c] == 0.0f;
        EXPECT(z, "hand-made moe case: token 2 lost both choices, y[2] must be 0");
        moe_layer_free(&m);
        case_free(&K);
    }
}

// ---------------------------------------------------------------- DeepSeek-V3's routing
// The reference in double, written from DeepSeek-V3's description (transformers' DeepseekV3TopkRouter):
// s = sigmoid(logit); choice scores c = s + bias; group score = the sum of its two best c; the topk_group
// best groups (ties: the lower group); the top-k of c among their experts (ties: the lower expert);
// w = s of those, / their sum when renormalised, * scale; the aux statistic q = s / sum(s).
static void ds_ref(const float *x, const float *bias, int E, RouteRule r, double *s, int32_t *idx, double *w,
                   double *q) {
    int G = r.n_group > 1 ? r.n_group : 1, per = E / G;
    double c[256], gs[64], S = 0;
    for (int e = 0; e < E; e++) {
        s[e] = 1.0 / (1.0 + exp(-(double)x[e]));
        c[e] = s[e] + (bias ? bias[e] : 0);
        S += s[e];
    }
    for (int e = 0; e < E; e++) q[e] = s[e] / S;
    for (int g = 0; g < G; g++) { // the two best of the group: sort its scores
        double b1 = -INFINITY, b2 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; e++) {
            if (c[e] > b1) {
                b2 = b1;
                b1 = c[e];
            } else if (c[e] > b2) {
                b2 = c[e];
            }
        }
        gs[g] = b1 + b2;
    }
    int allowed[256] = {0}, gtaken[64] = {0};
    for (int j = 0; j < (G > 1 ? r.topk_group : 1); j++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!gtaken[g] && (best < 0 || gs[g] > gs[best])) best = g;
        gtaken[best] = 1;
        for (int e = best * per; e < (best + 1) * per; e++) allowed[e] = 1;
    }
    double sw = 0;
    for (int j = 0; j < r.k; j++) {
        int best = -1;
        for (int e = 0; e < E; e++)
            if (allowed[e] && (best < 0 || c[e] > c[best])) best = e;
        allowed[best] = 0;
        idx[j] = best;
        w[j] = s[best];
        sw += s[best];
    }
    for (int j = 0; j < r.k; j++) w[j] = w[j] / (r.renorm ? sw : 1.0) * (r.scale != 0 ? r.scale : 1.0);
}

// The loss L = sum_j dw_j w_j + sum_e aux_e q_e of one row in double, its choices held (idx0: NULL: none).
static double ds_loss(const float *x, const float *bias, int E, RouteRule r, const double *dw,
                      const double *aux, const int32_t *idx0, int *flipped) {
    double s[256], w[64], q[256], L = 0;
    int32_t idx[64];
    ds_ref(x, bias, E, r, s, idx, w, q);
    if (idx0 && memcmp(idx, idx0, sizeof(int32_t) * r.k)) *flipped = 1;
    for (int j = 0; j < r.k; j++) L += dw[j] * w[j];
    for (int e = 0; e < E; e++) L += aux[e] * q[e];
    return L;
}

// The cpu backend's router_topk and router_bwd (the float32 reference the cuda ops are tested against)
// under DeepSeek-V3's rules against ds_ref: the choices exactly, the weights and the aux sums to float
// rounding (2e-6 relative), and the backward against central differences of ds_loss (h 1e-3 in double:
// truncation ~1e-6; 1e-4 relative + 1e-6 absolute catches any wrong term).
static void test_deepseek_routing(void) {
    enum { N = 40 };
    struct {
        int E;
        RouteRule r;
        int bias;
    } cases[] = {
        {16, {.k = 4, .renorm = 1, .sigmoid = 1, .n_group = 4, .topk_group = 2, .scale = 2.5f}, 1},
        {16, {.k = 3, .renorm = 0, .sigmoid = 1, .n_group = 8, .topk_group = 3, .scale = 0}, 0},
        {12, {.k = 2, .renorm = 1, .sigmoid = 1, .n_group = 0, .topk_group = 0, .scale = 1}, 1},
        {32, {.k = 8, .renorm = 1, .sigmoid = 1, .n_group = 8, .topk_group = 4, .scale = 2.5f}, 1},
    };
    const Backend *be = backend_cpu();
    for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        int E = cases[ci].E, k = cases[ci].r.k;
        RouteRule r = cases[ci].r;
        char label[96];
        snprintf(label, sizeof label, "deepseek routing E %d k %d groups %d/%d renorm %d scale %g%s", E, k,
                 r.topk_group, r.n_group, r.renorm, r.scale, cases[ci].bias ? " bias" : "");
        float *lg = fnew((size_t)N * E), *bias = cases[ci].bias ? fnew(E) : NULL;
        fill_normal(lg, (size_t)N * E, 1.5f);
        if (bias) fill_normal(bias, E, 0.1f);
        float *p = fnew((size_t)N * E), *lse = fnew(N), *w = fnew((size_t)N * k);
        int32_t *idx = xcalloc((size_t)N * k, sizeof(int32_t));
        double *sums = xcalloc(E + 1, sizeof(double)), *qs = xcalloc(E, sizeof(double));
        be->router_topk(p, lse, idx, w, sums, lg, bias, N, E, r);
        int badi = 0, badw = 0, badp = 0;
        for (int t = 0; t < N; t++) {
            double s[256], wr[64], q[256];
            int32_t ir[64];
            ds_ref(lg + (size_t)t * E, bias, E, r, s, ir, wr, q);
            for (int e = 0; e < E; e++) {
                badp += !(fabs(p[(size_t)t * E + e] - s[e]) <= 2e-6 * s[e]);
                qs[e] += q[e];
            }
            for (int j = 0; j < k; j++) {
                badi += idx[(size_t)t * k + j] != ir[j];
                badw += !(fabs(w[(size_t)t * k + j] - wr[j]) <= 2e-6 * fabs(wr[j]));
            }
        }
        int bads = 0;
        for (int e = 0; e < E; e++) bads += !(fabs(sums[e] - qs[e]) <= 2e-6 * qs[e]);
        EXPECT(!badi && !badw && !badp && !bads,
               "%s: %d choices, %d weights, %d scores, %d aux sums differ from the double reference", label,
               badi, badw, badp, bads);
        // the backward: dw (N,k) through an identity plan, aux coefficients (E)
        float *rowdot = fnew((size_t)N * k), *aux = fnew(E), *dl = fnew((size_t)N * E);
        fill_normal(rowdot, (size_t)N * k, 1);
        fill_normal(aux, E, 0.5f);
        int32_t *ident = xcalloc((size_t)N * k, sizeof(int32_t));
        for (int i = 0; i < N * k; i++) ident[i] = i;
        be->router_bwd(dl, rowdot, ident, p, lse, idx, w, aux, 0.0f, N, E, r);
        int bad = 0, skipped = 0, first = -1;
        double fd_first = 0;
        for (int t = 0; t < N; t++) {
            double dwd[64], auxd[256];
            for (int j = 0; j < k; j++) dwd[j] = rowdot[(size_t)t * k + j];
            for (int e = 0; e < E; e++) auxd[e] = aux[e];
            float x[256];
            memcpy(x, lg + (size_t)t * E, sizeof(float) * E);
            for (int e = 0; e < E; e++) {
                const double h = 1e-3;
                float x0 = x[e];
                int flipped = 0;
                x[e] = (float)(x0 + h);
                double hp = (double)x[e] - x0,
                       lp = ds_loss(x, bias, E, r, dwd, auxd, idx + (size_t)t * k, &flipped);
                x[e] = (float)(x0 - h);
                double hm = x0 - (double)x[e],
                       lm = ds_loss(x, bias, E, r, dwd, auxd, idx + (size_t)t * k, &flipped);
                x[e] = x0;
                if (flipped) {
                    skipped++;
                    continue;
                }
                double fd = (lp - lm) / (hp + hm), an = dl[(size_t)t * E + e];
                if (!(fabs(fd - an) <= 1e-4 * fabs(fd) + 1e-6)) {
                    if (first < 0) {
                        first = t * E + e;
                        fd_first = fd;
                    }
                    bad++;
                }
            }
        }
        EXPECT(!bad,
               "%s: %d of %d dlogits disagree with finite differences; first [%d] fd %.9g analytic %.9g",
               label, bad, N * E, first, fd_first, first >= 0 ? dl[first] : 0.0f);
        EXPECT(skipped <= N * E / 50, "%s: %d of %d elements skipped for flipped choices", label, skipped,
               N * E);
        printf("%s: choices, weights, sums and %d dlogits checked (%d skipped)\n", label, N * E - skipped,
               skipped);
        free(lg);
        free(bias);
        free(p);
        free(lse);
        free(w);
        free(idx);
        free(sums);
        free(qs);
        free(rowdot);
        free(aux);
        free(dl);
        free(ident);
    }
}

int main(void) {
    rng_seed(&R, 777);
    test_deepseek_routing();
    test_topk();
    test_plan();
    test_budget();
    test_losses();
    test_router_backward();
    test_moe();
    return test_done("test_router");
}
