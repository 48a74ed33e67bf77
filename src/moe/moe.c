// moe.c — the MoE FFN layer forward/backward over a Backend and a mesh (see moe.h). The router's
// small (Ns,E) arrays live on the host; token rows and expert GEMMs stay on the backend.
#include "moe/moe.h"
#include <string.h>
#include "core/common.h"
#include "core/rng.h"

#define F sizeof(float)
static int csize(const Comm *c) { return c ? c->size : 1; }
static int crank(const Comm *c) { return c ? c->rank : 0; }

// Make sure the expert-side buffers hold Rg rows.
static void expert_buffers(MoeLayer *m, int Rg) {
    const Backend *be = m->be;
    size_t nd = (size_t)(Rg ? Rg : 1) * m->d * F, nf = (size_t)(Rg ? Rg : 1) * m->fl * F;
    if (nd > m->cap_d) {
        float **bd[] = {&m->xg, &m->yg};
        for (int i = 0; i < 2; i++) { if (*bd[i]) be->free(*bd[i]); *bd[i] = be->alloc(nd); }
        m->cap_d = nd;
    }
    if (nf > m->cap_f) {
        float **bf[] = {&m->h1, &m->h3, &m->act};
        for (int i = 0; i < 3; i++) { if (*bf[i]) be->free(*bf[i]); *bf[i] = be->alloc(nf); }
        m->cap_f = nf;
    }
}

static void scratch_buffers(MoeScratch *s, int Rg, int d, int fl) {
    const Backend *be = s->be;
    size_t nd = (size_t)(Rg ? Rg : 1) * d * F, nf = (size_t)(Rg ? Rg : 1) * fl * F;
    if (nd > s->cap_d) {
        float **bd[] = {&s->dyg, &s->dxg};
        for (int i = 0; i < 2; i++) { if (*bd[i]) be->free(*bd[i]); *bd[i] = be->alloc(nd); }
        s->cap_d = nd;
    }
    if (nf > s->cap_f) {
        float **bf[] = {&s->dact, &s->dh1, &s->dh3};
        for (int i = 0; i < 3; i++) { if (*bf[i]) be->free(*bf[i]); *bf[i] = be->alloc(nf); }
        s->cap_f = nf;
    }
}

void moe_layer_init(MoeLayer *m, const Backend *be, const ModelConfig *c, int maxN, const MoeComms *cm) {
    memset(m, 0, sizeof *m);
    m->be = be;
    if (cm) m->cm = *cm;
    int TP = csize(m->cm.tp), EP = csize(m->cm.ep), ETP = csize(m->cm.etp), S = csize(m->cm.stage);
    m->maxN = maxN; m->d = c->d_model; m->fl = c->d_ff / ETP; m->E = c->n_experts; m->El = c->n_experts / EP;
    m->k = c->top_k;
    size_t Ns = (size_t)(maxN + TP - 1) / TP, d = m->d, E = m->E, k = m->k, R = Ns * k;
    m->logits_h = xcalloc(Ns * E, F);
    m->probs_h = xcalloc(Ns * E, F);
    m->lse_h = xcalloc(Ns, F);
    m->w_h = xcalloc(Ns * k, F);
    m->rowscale_h = xcalloc(R, F);
    m->idx_h = xcalloc(Ns * k, sizeof(int32_t));
    plan_alloc(&m->plan, (int)Ns, m->E, m->k);
    m->cnt_all = xcalloc((size_t)S * (k * E + 1), sizeof(int64_t));
    m->counts = xcalloc(E, sizeof(int64_t));
    m->psum = xcalloc(E, sizeof(double));
    m->aux_f = xcalloc(E, sizeof(double));
    if (c->jitter > 0) {
        m->noise = be->alloc(Ns * d * F);
        m->xj = be->alloc(Ns * d * F);
    }
    m->logits = be->alloc(Ns * E * F);
    m->xs = be->alloc(R * d * F);
    m->ys = be->alloc(R * d * F);
    m->rowscale = be->alloc(R * F);
    m->rowtok = be->alloc(R * sizeof(int32_t));
    if (TP > 1) m->yslice = be->alloc(Ns * d * F);
    exchange_init(&m->x, be, m->cm.ep, m->cm.etp, m->El, m->d);
}

void moe_layer_free(MoeLayer *m) {
    const Backend *be = m->be;
    free(m->logits_h); free(m->probs_h); free(m->lse_h); free(m->w_h); free(m->rowscale_h); free(m->idx_h);
    free(m->cnt_all); free(m->counts); free(m->psum); free(m->aux_f);
    plan_free(&m->plan);
    void *dev[] = {m->noise, m->xj, m->logits, m->xs, m->ys, m->rowscale, m->rowtok, m->yslice,
                   m->xg, m->h1, m->h3, m->act, m->yg};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) if (dev[i]) be->free(dev[i]);
    exchange_free(&m->x);
    memset(m, 0, sizeof *m);
}

void moe_scratch_init(MoeScratch *s, const Backend *be, const ModelConfig *c, int maxN) {
    memset(s, 0, sizeof *s);
    s->be = be;
    size_t N = maxN, d = c->d_model, E = c->n_experts, R = N * c->top_k;
    s->dys = be->alloc(R * d * F);
    s->dxs = be->alloc(R * d * F);
    s->dxj = be->alloc(N * d * F);
    s->dxfull = be->alloc(N * d * F);
    s->dlogits = be->alloc(N * E * F);
    s->rowdot = be->alloc(R * F);
    s->dw_h = xcalloc(R, F);
    s->dlogits_h = xcalloc(N * E, F);
    s->rowdot_h = xcalloc(R, F);
}

void moe_scratch_free(MoeScratch *s) {
    void *dev[] = {s->dys, s->dxs, s->dxj, s->dxfull, s->dlogits, s->rowdot, s->dyg, s->dact, s->dh1, s->dh3, s->dxg};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) if (dev[i]) s->be->free(dev[i]);
    free(s->dw_h); free(s->dlogits_h); free(s->rowdot_h);
    memset(s, 0, sizeof *s);
}

// Slice of N rows for TP rank r of TP: [N*r/TP, N*(r+1)/TP)
static void slice_of(int N, int TP, int r, int *s0, int *n) {
    *s0 = (int)((int64_t)N * r / TP);
    *n = (int)((int64_t)N * (r + 1) / TP) - *s0;
}

// Gather every TP rank's slice (Ns_r, d) into full (N, d).
static void tp_gather(const MoeLayer *m, const float *slice, float *full) {
    int TP = csize(m->cm.tp);
    size_t *cnt = xmalloc(sizeof(size_t) * TP * 2), *dsp = cnt + TP;
    for (int r = 0; r < TP; r++) {
        int s0, n;
        slice_of(m->N, TP, r, &s0, &n);
        cnt[r] = (size_t)n * m->d;
        dsp[r] = (size_t)s0 * m->d;
    }
    comm_dev_allgatherv(m->cm.tp, slice, (size_t)m->Ns * m->d, full, cnt, dsp, CT_F32);
    free(cnt);
}

void moe_forward(MoeLayer *m, float *y, const float *x, int N, const MoeWeights *w, const ModelConfig *c,
                 uint64_t noise_seed, int64_t row0) {
    const Backend *be = m->be;
    CHECK(N <= m->maxN, "moe_forward: %d tokens > %d allocated", N, m->maxN);
    int d = m->d, fl = m->fl, E = m->E, El = m->El, k = m->k, TP = csize(m->cm.tp);
    int S = csize(m->cm.stage), me = crank(m->cm.stage);
    m->N = N;
    slice_of(N, TP, crank(m->cm.tp), &m->s0, &m->Ns);
    int Ns = m->Ns;
    const float *xin = x + (size_t)m->s0 * d;
    if (m->noise) {
        // HF Mixtral jitter: the MoE input is scaled elementwise by U(1-j, 1+j), training only
        size_t n = (size_t)Ns * d;
        float *nh = xmalloc((n ? n : 1) * F);
        for (int i = 0; i < Ns; i++) {
            Rng r;
            rng_seed(&r, noise_seed ^ ((uint64_t)(row0 + m->s0 + i) * 0x9E3779B97F4A7C15ull));
            for (int j = 0; j < d; j++)
                nh[(size_t)i * d + j] = noise_seed ? 1.0f - c->jitter + 2.0f * c->jitter * rng_uniform(&r) : 1.0f;
        }
        be->to_device(m->noise, nh, n * F);
        free(nh);
        be->mul(m->xj, xin, m->noise, n);
        xin = m->xj;
    }
    // router on my slice
    be->matmul_fwd(m->logits, xin, w->router, Ns, d, E, 0);
    be->to_host(m->logits_h, m->logits, (size_t)Ns * E * F);
    router_topk(m->logits_h, Ns, E, k, c->renormalize, m->probs_h, m->lse_h, m->idx_h, m->w_h);
    // global statistics over the stage: slot counts of every rank (+ its token count), prob sums, lse^2
    size_t per = (size_t)k * E + 1;
    int64_t *mine = xmalloc(sizeof(int64_t) * per);
    router_slot_counts(m->idx_h, Ns, E, k, mine);
    mine[per - 1] = Ns;
    comm_allgather(m->cm.stage, mine, m->cnt_all, per, CT_I64);
    free(mine);
    int64_t *slots = xmalloc(sizeof(int64_t) * S * k * E);   // (S,k,E) without the token counts
    m->Ng = 0;
    memset(m->counts, 0, sizeof(int64_t) * E);
    for (int s = 0; s < S; s++) {
        const int64_t *cs = m->cnt_all + (size_t)s * per;
        memcpy(slots + (size_t)s * k * E, cs, sizeof(int64_t) * k * E);
        m->Ng += cs[per - 1];
        for (int j = 0; j < k; j++) for (int e = 0; e < E; e++) m->counts[e] += cs[(size_t)j * E + e];
    }
    double *ps = xcalloc(E + 1, sizeof(double));
    for (int t = 0; t < Ns; t++) {
        for (int e = 0; e < E; e++) ps[e] += m->probs_h[(size_t)t * E + e];
        ps[E] += (double)m->lse_h[t] * m->lse_h[t];
    }
    comm_allreduce(m->cm.stage, ps, E + 1, CT_F64);
    double a = 0;
    for (int e = 0; e < E; e++) {
        a += ((double)m->counts[e] / m->Ng) * (ps[e] / m->Ng);
        m->psum[e] = ps[e];
        m->aux_f[e] = (double)m->counts[e] / m->Ng;
    }
    m->aux = E * a;
    m->z = ps[E] / m->Ng;
    free(ps);
    // dispatch plan over my slice; capacity decided globally (same drops as one process)
    if (c->dispatch == DISPATCH_CAPACITY) {
        int64_t *budget = xmalloc(sizeof(int64_t) * k * E);
        router_budget(slots, S, me, E, k, capacity_for(c, (int)m->Ng), budget);
        plan_build_budget(&m->plan, m->idx_h, Ns, E, k, budget);
        free(budget);
        int64_t kept = m->plan.M;
        comm_allreduce(m->cm.stage, &kept, 1, CT_I64);
        m->dropped = m->Ng * k - kept;
    } else {
        plan_build_budget(&m->plan, m->idx_h, Ns, E, k, NULL);
        m->dropped = 0;
    }
    free(slots);
    int M = m->plan.M;
    for (int r = 0; r < M; r++)
        m->rowscale_h[r] = m->w_h[(size_t)m->plan.row_tok[r] * k + m->plan.row_slot[r]];
    be->to_device(m->rowscale, m->rowscale_h, (size_t)M * F);
    be->to_device(m->rowtok, m->plan.row_tok, (size_t)M * sizeof(int32_t));
    // permute, send to the expert owners, experts, and back
    be->gather_rows(m->xs, xin, m->rowtok, M, d);
    int64_t *kept = xmalloc(sizeof(int64_t) * E);
    for (int e = 0; e < E; e++) kept[e] = m->plan.off[e + 1] - m->plan.off[e];
    exchange_plan(&m->x, kept);
    free(kept);
    int Rg = m->x.Rg;
    expert_buffers(m, Rg);
    exchange_dispatch(&m->x, m->xs, m->xg);
    be->grouped_matmul_fwd(m->h1, m->xg, w->w1, m->x.off, El, d, fl);
    be->grouped_matmul_fwd(m->h3, m->xg, w->w3, m->x.off, El, d, fl);
    be->swiglu_fwd(m->act, m->h1, m->h3, (size_t)Rg * fl);
    be->grouped_matmul_fwd(m->yg, m->act, w->w2, m->x.off, El, fl, d);
    exchange_combine(&m->x, m->yg, m->ys);
    float *yout = TP > 1 ? m->yslice : y;
    be->zero(yout, (size_t)Ns * d * F);
    be->scatter_add_rows(yout, m->ys, m->rowtok, m->rowscale, M, d);
    if (TP > 1) tp_gather(m, m->yslice, y);
}

void moe_backward(MoeLayer *m, MoeScratch *s, float *dx, const float *dy, const float *x, const MoeWeights *w,
                  MoeGrads *g, const ModelConfig *c, float aux_scale, float z_scale) {
    const Backend *be = m->be;
    int d = m->d, fl = m->fl, E = m->E, El = m->El, k = m->k, M = m->plan.M, Ns = m->Ns, Rg = m->x.Rg;
    int TP = csize(m->cm.tp);
    const float *xin = m->noise ? m->xj : x + (size_t)m->s0 * d;
    const float *dys_in = dy + (size_t)m->s0 * d;
    // combine: dys = w * dy[tok]; dw = <dy[tok], ys>
    be->gather_rows(s->dys, dys_in, m->rowtok, M, d);
    be->row_dot(s->rowdot, s->dys, m->ys, M, d);
    be->scale_rows(s->dys, m->rowscale, M, d);
    // to the experts (same routes as the forward), expert backward, and back
    scratch_buffers(s, Rg, d, fl);
    exchange_dispatch(&m->x, s->dys, s->dyg);
    size_t Rf = (size_t)Rg * fl;
    be->zero(s->dact, Rf * F);
    be->grouped_matmul_bwd(s->dact, g->w2, s->dyg, m->act, w->w2, m->x.off, El, fl, d);
    be->zero(s->dh1, Rf * F);
    be->zero(s->dh3, Rf * F);
    be->swiglu_bwd(s->dh1, s->dh3, s->dact, m->h1, m->h3, Rf);
    be->zero(s->dxg, (size_t)Rg * d * F);
    be->grouped_matmul_bwd(s->dxg, g->w1, s->dh1, m->xg, w->w1, m->x.off, El, d, fl);
    be->grouped_matmul_bwd(s->dxg, g->w3, s->dh3, m->xg, w->w3, m->x.off, El, d, fl);
    exchange_combine(&m->x, s->dxg, s->dxs);
    // un-permute into the gradient of my slice of the (jittered) input
    float *dxin = s->dxj;
    be->zero(dxin, (size_t)Ns * d * F);
    be->scatter_add_rows(dxin, s->dxs, m->rowtok, NULL, M, d);
    // router, with the global aux / z coefficients
    be->to_host(s->rowdot_h, s->rowdot, (size_t)M * F);
    for (int i = 0; i < Ns * k; i++) {
        int r = m->plan.slot_row[i];
        s->dw_h[i] = r >= 0 ? s->rowdot_h[r] : 0.0f;
    }
    float *aux_dp = xmalloc(sizeof(float) * E);
    double Ng = (double)m->Ng;
    for (int e = 0; e < E; e++) aux_dp[e] = (float)(aux_scale * E * m->aux_f[e] / Ng);
    router_backward_ex(s->dlogits_h, s->dw_h, m->probs_h, m->lse_h, m->idx_h, m->w_h, Ns, E, k, c->renormalize,
                       aux_dp, (float)(2.0 * z_scale / Ng));
    free(aux_dp);
    be->to_device(s->dlogits, s->dlogits_h, (size_t)Ns * E * F);
    be->matmul_bwd(dxin, g->router, s->dlogits, xin, w->router, Ns, d, E);
    if (m->noise) be->mul(dxin, dxin, m->noise, (size_t)Ns * d);
    // every TP rank needs the whole dx
    if (TP > 1) {
        tp_gather(m, dxin, s->dxfull);
        be->axpy(dx, s->dxfull, 1.0f, (size_t)m->N * d);
    } else {
        be->axpy(dx, dxin, 1.0f, (size_t)Ns * d);
    }
}
