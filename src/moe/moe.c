// moe.c — the MoE FFN layer forward/backward over a Backend (see moe.h). The router's small
// (N,E) arrays live on the host; token rows and expert GEMMs stay on the backend.
#include "moe/moe.h"
#include <string.h>
#include "core/common.h"
#include "core/rng.h"

void moe_layer_init(MoeLayer *m, const Backend *be, const ModelConfig *c, int maxN) {
    memset(m, 0, sizeof *m);
    m->be = be; m->maxN = maxN; m->d = c->d_model; m->f = c->d_ff; m->E = c->n_experts; m->k = c->top_k;
    size_t N = maxN, d = m->d, f = m->f, E = m->E, k = m->k, R = N * k;
    m->logits_h = xcalloc(N * E, sizeof(float));
    m->probs_h = xcalloc(N * E, sizeof(float));
    m->lse_h = xcalloc(N, sizeof(float));
    m->w_h = xcalloc(N * k, sizeof(float));
    m->rowscale_h = xcalloc(R, sizeof(float));
    m->idx_h = xcalloc(N * k, sizeof(int32_t));
    plan_alloc(&m->plan, maxN, m->E, m->k);
    if (c->jitter > 0) {
        m->noise = be->alloc(N * d * sizeof(float));
        m->xj = be->alloc(N * d * sizeof(float));
    }
    m->logits = be->alloc(N * E * sizeof(float));
    m->xs = be->alloc(R * d * sizeof(float));
    m->h1 = be->alloc(R * f * sizeof(float));
    m->h3 = be->alloc(R * f * sizeof(float));
    m->act = be->alloc(R * f * sizeof(float));
    m->ys = be->alloc(R * d * sizeof(float));
    m->rowscale = be->alloc(R * sizeof(float));
    m->rowtok = be->alloc(R * sizeof(int32_t));
}

void moe_layer_free(MoeLayer *m) {
    const Backend *be = m->be;
    free(m->logits_h); free(m->probs_h); free(m->lse_h); free(m->w_h); free(m->rowscale_h); free(m->idx_h);
    plan_free(&m->plan);
    void *dev[] = {m->noise, m->xj, m->logits, m->xs, m->h1, m->h3, m->act, m->ys, m->rowscale, m->rowtok};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) if (dev[i]) be->free(dev[i]);
    memset(m, 0, sizeof *m);
}

void moe_scratch_init(MoeScratch *s, const Backend *be, const ModelConfig *c, int maxN) {
    size_t N = maxN, d = c->d_model, f = c->d_ff, E = c->n_experts, R = N * c->top_k;
    s->dys = be->alloc(R * d * sizeof(float));
    s->dact = be->alloc(R * f * sizeof(float));
    s->dh1 = be->alloc(R * f * sizeof(float));
    s->dh3 = be->alloc(R * f * sizeof(float));
    s->dxs = be->alloc(R * d * sizeof(float));
    s->dxj = be->alloc(N * d * sizeof(float));
    s->dlogits = be->alloc(N * E * sizeof(float));
    s->rowdot = be->alloc(R * sizeof(float));
    s->dw_h = xcalloc(R, sizeof(float));
    s->dlogits_h = xcalloc(N * E, sizeof(float));
    s->rowdot_h = xcalloc(R, sizeof(float));
}

void moe_scratch_free(MoeScratch *s, const Backend *be) {
    void *dev[] = {s->dys, s->dact, s->dh1, s->dh3, s->dxs, s->dxj, s->dlogits, s->rowdot};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) be->free(dev[i]);
    free(s->dw_h); free(s->dlogits_h); free(s->rowdot_h);
    memset(s, 0, sizeof *s);
}

void moe_forward(MoeLayer *m, float *y, const float *x, int N, const MoeWeights *w, const ModelConfig *c,
                 int capacity, uint64_t noise_seed) {
    const Backend *be = m->be;
    CHECK(N <= m->maxN, "moe_forward: %d tokens > %d allocated", N, m->maxN);
    int d = m->d, f = m->f, E = m->E, k = m->k;
    m->N = N;
    const float *xin = x;
    if (m->noise) {
        // HF Mixtral jitter: the MoE input is scaled elementwise by U(1-j, 1+j), training only
        size_t n = (size_t)N * d;
        float *nh = xmalloc(n * sizeof(float));
        Rng r;
        rng_seed(&r, noise_seed);
        for (size_t i = 0; i < n; i++)
            nh[i] = noise_seed ? 1.0f - c->jitter + 2.0f * c->jitter * rng_uniform(&r) : 1.0f;
        be->to_device(m->noise, nh, n * sizeof(float));
        free(nh);
        be->mul(m->xj, x, m->noise, n);
        xin = m->xj;
    }
    // router
    be->matmul_fwd(m->logits, xin, w->router, N, d, E, 0);
    be->to_host(m->logits_h, m->logits, (size_t)N * E * sizeof(float));
    router_topk(m->logits_h, N, E, k, c->renormalize, m->probs_h, m->lse_h, m->idx_h, m->w_h);
    plan_build(&m->plan, m->idx_h, N, E, k, capacity);
    router_losses(m->probs_h, m->lse_h, m->plan.counts, N, E, &m->aux, &m->z);
    int M = m->plan.M;
    for (int r = 0; r < M; r++)
        m->rowscale_h[r] = m->w_h[(size_t)m->plan.row_tok[r] * k + m->plan.row_slot[r]];
    be->to_device(m->rowscale, m->rowscale_h, (size_t)M * sizeof(float));
    be->to_device(m->rowtok, m->plan.row_tok, (size_t)M * sizeof(int32_t));
    // permute, experts, combine
    be->gather_rows(m->xs, xin, m->rowtok, M, d);
    be->grouped_matmul_fwd(m->h1, m->xs, w->w1, m->plan.off, E, d, f);
    be->grouped_matmul_fwd(m->h3, m->xs, w->w3, m->plan.off, E, d, f);
    be->swiglu_fwd(m->act, m->h1, m->h3, (size_t)M * f);
    be->grouped_matmul_fwd(m->ys, m->act, w->w2, m->plan.off, E, f, d);
    be->zero(y, (size_t)N * d * sizeof(float));
    be->scatter_add_rows(y, m->ys, m->rowtok, m->rowscale, M, d);
}

void moe_backward(MoeLayer *m, MoeScratch *s, float *dx, const float *dy, const float *x, const MoeWeights *w,
                  MoeGrads *g, const ModelConfig *c, float aux_scale, float z_scale) {
    const Backend *be = m->be;
    int N = m->N, d = m->d, f = m->f, E = m->E, k = m->k, M = m->plan.M;
    const float *xin = m->noise ? m->xj : x;
    // combine: dys = w * dy[tok]; dw = <dy[tok], ys>
    be->gather_rows(s->dys, dy, m->rowtok, M, d);
    be->row_dot(s->rowdot, s->dys, m->ys, M, d);
    be->scale_rows(s->dys, m->rowscale, M, d);
    // experts
    size_t Mf = (size_t)M * f;
    be->zero(s->dact, Mf * sizeof(float));
    be->grouped_matmul_bwd(s->dact, g->w2, s->dys, m->act, w->w2, m->plan.off, E, f, d);
    be->zero(s->dh1, Mf * sizeof(float));
    be->zero(s->dh3, Mf * sizeof(float));
    be->swiglu_bwd(s->dh1, s->dh3, s->dact, m->h1, m->h3, Mf);
    be->zero(s->dxs, (size_t)M * d * sizeof(float));
    be->grouped_matmul_bwd(s->dxs, g->w1, s->dh1, m->xs, w->w1, m->plan.off, E, d, f);
    be->grouped_matmul_bwd(s->dxs, g->w3, s->dh3, m->xs, w->w3, m->plan.off, E, d, f);
    // un-permute into the (jittered) input gradient
    float *dxin = m->noise ? s->dxj : dx;
    if (m->noise) be->zero(s->dxj, (size_t)N * d * sizeof(float));
    be->scatter_add_rows(dxin, s->dxs, m->rowtok, NULL, M, d);
    // router
    be->to_host(s->rowdot_h, s->rowdot, (size_t)M * sizeof(float));
    for (int i = 0; i < N * k; i++) {
        int r = m->plan.slot_row[i];
        s->dw_h[i] = r >= 0 ? s->rowdot_h[r] : 0.0f;
    }
    router_backward(s->dlogits_h, s->dw_h, m->probs_h, m->lse_h, m->idx_h, m->w_h, m->plan.counts, N, E, k,
                    c->renormalize, aux_scale, z_scale);
    be->to_device(s->dlogits, s->dlogits_h, (size_t)N * E * sizeof(float));
    be->matmul_bwd(dxin, g->router, s->dlogits, xin, w->router, N, d, E);
    if (m->noise) {
        size_t n = (size_t)N * d;
        be->mul(s->dxj, s->dxj, m->noise, n);
        be->axpy(dx, s->dxj, 1.0f, n);
    }
}
