// moe.c — the MoE FFN layer forward/backward over a Backend and a mesh (see moe.h). Everything
// runs on the backend: router GEMM, softmax/top-k and its sums, permute, experts, combine, router
// backward. The host gets one copy of the router's outputs per forward (the top-k choices for the
// dispatch plan and the counts, plus logits and probs for eval.c's and dump.c's readers), builds the plan
// and sends it back in one copy; the backward's only host traffic is the E aux coefficients.
#include "moe/moe.h"
#include <stdio.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "moe/moe_experts.h"

// Make sure the expert-side buffers hold Rg rows (xg only when the exchange is not local: then the
// GEMMs read the gathered rows xs directly): rows_cap grows by a2a_rows (at most every row the EP group
// routes, gathered over ETP; where the exchange is local, its Rmax rows at once).
static void expert_buffers(MoeLayer *m, int Rg) {
    const Backend *be = m->be;
    if ((size_t)Rg > m->rows_cap || !m->rows_cap) {
        m->regrown |= m->rows_cap > 0;
        m->rows_cap =
            a2a_rows((size_t)Rg, m->rows_cap, exchange_rows_typical(m->xu), exchange_rows_worst(m->xu));
    }
    size_t rows = m->rows_cap, nf = moe_rows_bytes(m);
    // (the SwiGLU rows first: the largest, they take a lent arena's room before the outputs)
    if (m->rc) moe_rc_rows(m, nf);
    else {
        void **const bf[] = {&m->h1, &m->h3, &m->act};
        moe_grown_n(be, m->arena, bf, 3, &m->cap_f, nf);
    }
    m->yg = moe_grown(be, m->arena, m->yg, &m->cap_d, rows * m->d * F);
    if (!m->xu->local) m->xg = moe_grown(be, m->arena, m->xg, &m->cap_xg, rows * m->d * hid_size(be));
}

void moe_rows_carve(MoeLayer *m) {
    if (m->dense) return;
    CHECK(exchange_local(m->xu), "moe_rows_carve: layer %d exchanges its rows (one process's layers only)",
          m->layer);
    int R = m->Rmax;
    if (!m->xs) m->xs = arena_alloc(m->arena, m->be, (size_t)(R ? R : 1) * m->d * hid_size(m->be));
    expert_buffers(m, R); // (the first forward's order: xs at its dispatch, then the expert buffers)
}

// The backward's expert-side scratch for the layer's rows (rows_cap, as its forward buffers) and its
// token-side rows (Rmax at most).
static void scratch_buffers(MoeScratch *s, const MoeLayer *m) {
    const Backend *be = s->be;
    size_t rows = m->rows_cap, d = m->d, nf = rows * m->fu * hid_size(be);
    if (!s->lean_rows) s->dxg = moe_grown(be, NULL, s->dxg, &s->cap_d, rows * d * F);
    if (!m->xu->local) {
        s->dyg = moe_grown(be, NULL, s->dyg, &s->cap_dyg, rows * d * hid_size(be));
        s->dxs = moe_grown(be, NULL, s->dxs, &s->cap_dxs, (size_t)(m->Rmax ? m->Rmax : 1) * d * F);
    }
    void **const bf[] = {&s->dh1, &s->dh3};
    if (!s->lean_dh) moe_grown_n(be, NULL, bf, 2, &s->cap_f, nf);
}

// The router block for Ns rows (byte offsets): sums (E+1 doubles), the plan's slot counts (k*E
// int32), idx, w, logits, probs (up to idx copied to the host in training, all of it with
// host_router_out, in one copy), then lse (device only). 256-byte aligned sections.
typedef struct {
    size_t cnt, idx, w, logits, probs, copy, lse, total;
} RtLayout;
static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }
static RtLayout rt_layout(int Ns, int E, int k) {
    RtLayout L;
    L.cnt = al256(sizeof(double) * (E + 1));
    L.idx = L.cnt + al256(4 * (size_t)k * E);
    L.w = L.idx + al256(4 * (size_t)Ns * k);
    L.logits = L.w + al256(4 * (size_t)Ns * k);
    L.probs = L.logits + al256(4 * (size_t)Ns * E);
    L.copy = L.probs + 4 * (size_t)Ns * E;
    L.lse = al256(L.copy);
    L.total = L.lse + 4 * (size_t)(Ns ? Ns : 1);
    return L;
}
// Points the router arrays (device and host copies) into the blocks for Ns rows.
static void rt_point(MoeLayer *m, int Ns) {
    RtLayout L = rt_layout(Ns, m->E, m->k);
    char *d = m->rt_d, *h = m->rt_h;
    m->sums = (double *)d;
    m->cnt = (int32_t *)(d + L.cnt);
    m->idx = (int32_t *)(d + L.idx);
    m->wdev = (float *)(d + L.w);
    m->logits = (float *)(d + L.logits);
    m->probs = (float *)(d + L.probs);
    m->lse = (float *)(d + L.lse);
    m->sums_h = (double *)h;
    m->cnt_h = (int32_t *)(h + L.cnt);
    m->idx_h = (int32_t *)(h + L.idx);
    m->logits_h = (float *)(h + L.logits);
    m->probs_h = (float *)(h + L.probs);
}

// The shared expert's (or a dense layer's) rows for Ns rows of width fs (none: fs 0).
static void shared_alloc(MoeLayer *m, size_t Ns, int fs) {
    const Backend *be = m->be;
    size_t d = m->d;
    m->fs = fs;
    if (!fs) return;
    size_t nf = (Ns ? Ns : 1) * (size_t)fs * hid_size(be);
    m->sh_h1 = be->alloc(nf);
    m->sh_h3 = be->alloc(nf);
    m->sh_act = be->alloc(nf);
    m->sh_x = be->alloc((Ns ? Ns : 1) * d * hid_size(be));
    m->sh_y = be->alloc((Ns ? Ns : 1) * d * F);
    m->sh_g = be->alloc((Ns ? Ns : 1) * F);
    m->ident = be->alloc((Ns ? Ns : 1) * sizeof(int32_t));
    int32_t *id = xmalloc((Ns ? Ns : 1) * sizeof(int32_t));
    for (size_t i = 0; i < Ns; i++) id[i] = (int32_t)i;
    be->to_device(m->ident, id, Ns * sizeof(int32_t));
    free(id);
}

void moe_layer_init(MoeLayer *m, const Backend *be, const ModelConfig *c, int maxN, const MoeComms *cm) {
    memset(m, 0, sizeof *m);
    m->be = be;
    m->layer = -1;
    if (cm) m->cm = *cm;
    int TP = comm_size(m->cm.tp), EP = comm_size(m->cm.ep), ETP = comm_size(m->cm.etp),
        S = comm_size(m->cm.stage);
    m->maxN = maxN;
    m->d = c->d_model;
    m->fl = c->d_ff / ETP;
    m->E = c->n_experts;
    m->El = c->n_experts / EP;
    m->k = c->top_k;
    m->sigmoid = c->route_sigmoid;
    size_t Ns = (size_t)(maxN + TP - 1) / TP, d = m->d, E = m->E, k = m->k, R = Ns * k;
    RtLayout L = rt_layout((int)Ns, (int)E, (int)k);
    m->rt_h = xcalloc(1, L.copy);
    m->rt_d = be->alloc(L.total);
    rt_point(m, (int)Ns);
    m->Rmax = (int)R;
    m->kf_h = xcalloc(2 * k * E, sizeof(int32_t));
    m->plan.off = xcalloc(E + 1, sizeof(int64_t)); // the plan's arrays live on the backend (plan_d)
    m->plan.N = (int)Ns;
    m->plan.E = (int)E;
    m->plan.k = (int)k;
    m->cnt_all = xcalloc((size_t)S * (k * E + 1), sizeof(int64_t));
    m->counts = xcalloc(E, sizeof(int64_t));
    m->psum = xcalloc(E, sizeof(double));
    m->aux_f = xcalloc(E, sizeof(double));
    m->mine_h = xcalloc(k * E + 1, sizeof(int64_t));
    m->ps_h = xcalloc(E + 1, sizeof(double));
    m->slots_h = xcalloc((size_t)S * k * E + k * E + E, sizeof(int64_t));
    m->bud_h = m->slots_h + (size_t)S * k * E;
    m->kept_h = m->bud_h + k * E;
    m->tp_cnt = xcalloc(2 * (size_t)TP, sizeof(size_t));
    if (c->jitter > 0) {
        m->noise = be->alloc(Ns * d * F);
        m->xj = be->alloc(Ns * d * F);
        m->noise_h = xcalloc(Ns ? Ns * d : 1, F);
    }
    // xs (R,d), my kept rows: allocated by the first moe_start (a layer whose forward runs in AMPipe
    // chunks never needs its whole-batch rows)
    // the plan arrays in one block: rowtok, slotrow, rowscale, rank (R 4-byte elements each), keep
    // and first (k*E each)
    m->plan_d = be->alloc((4 * (R ? R : 1) + 2 * k * E) * 4);
    m->rowtok = m->plan_d;
    m->slotrow = m->rowtok + R;
    m->rowscale = (float *)(m->slotrow + R);
    m->rank = (int32_t *)(m->rowscale + R);
    m->kf_d = m->rank + R;
    if (TP > 1) m->yslice = be->alloc(Ns * d * F);
    exchange_init(&m->x, be, m->cm.ep, m->cm.etp, m->cm.epn, m->cm.epx, m->El, m->d, m->Rmax);
    shared_alloc(m, Ns, c->n_shared_experts * c->shared_d_ff);
    m->overlap = m->r = 1;
    m->xu = &m->x;
    m->fu = m->fl;
}

void moe_dense_init(MoeLayer *m, const Backend *be, const ModelConfig *c, int maxN, const MoeComms *cm) {
    memset(m, 0, sizeof *m);
    m->be = be;
    m->layer = -1;
    if (cm) m->cm = *cm;
    int TP = comm_size(m->cm.tp);
    size_t Ns = (size_t)(maxN + TP - 1) / TP, E = c->n_experts;
    m->dense = 1;
    m->maxN = maxN;
    m->d = c->d_model;
    m->E = c->n_experts;
    m->k = c->top_k;
    m->counts = xcalloc(E, sizeof(int64_t)); // (the statistics over layers read them: zeros)
    m->psum = xcalloc(E, sizeof(double));
    m->aux_f = xcalloc(E, sizeof(double));
    m->tp_cnt = xcalloc(2 * (size_t)TP, sizeof(size_t));
    if (TP > 1) m->yslice = be->alloc(Ns * m->d * F);
    shared_alloc(m, Ns, c->dense_d_ff);
    m->overlap = m->r = 1;
}

void moe_layer_free(MoeLayer *m) {
    const Backend *be = m->be;
    if (m->rc) m->h1 = m->h3 = m->act = NULL; // the shared buffers (MoeRecompute) are not the layer's
    void *host[] = {m->rt_h,   m->kf_h,    m->cnt_all, m->counts, m->psum,     m->aux_f,
                    m->mine_h, m->ps_h,    m->slots_h, m->tp_cnt, m->noise_h,  m->cidx_h,
                    m->kc_h,   m->etp_cnt, m->seq_f,   m->seq_st, m->seq_dp_h, m->seq_seg};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    if (m->seq_dp) be->free(m->seq_dp);
    plan_free(&m->plan);
    void *dev[] = {m->noise,  m->xj,   m->rt_d, m->xs,   m->ys,    m->plan_d, m->yslice,
                   m->xg,     m->h1,   m->h3,   m->act,  m->yg,    m->sh_h1,  m->sh_h3,
                   m->sh_act, m->sh_x, m->sh_y, m->sh_g, m->ident, m->hq};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) arena_free(m->arena, be, dev[i]);
    if (m->x.be) exchange_free(&m->x);
    for (int i = 0; i < MOE_MAX_OVERLAP; i++)
        if (m->xc[i].be) exchange_free(&m->xc[i]);
    if (m->xe.be) exchange_free(&m->xe);
    void *own[] = {m->wfull, m->wstage, m->widx, m->cidx, m->xsc, m->ysc}; // (icidx shares cidx's block)
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (own[i]) be->free(own[i]);
    memset(m, 0, sizeof *m);
}

void moe_set_recompute(MoeLayer *m, MoeRecompute *rc) {
    if (rc == m->rc) return;
    if (!m->rc) { // its own rows go; the shared ones are pointed at by the next forward
        void **bf[] = {&m->h1, &m->h3, &m->act};
        for (int i = 0; i < 3; i++) {
            arena_free(m->arena, m->be, *bf[i]);
            *bf[i] = NULL;
        }
    } else {
        m->h1 = m->h3 = m->act = NULL;
    }
    arena_free(m->arena, m->be, m->hq); // (--fp8-save's rows: grown again where rc->fp8)
    m->hq = NULL;
    m->cap_f = m->cap_q = 0;
    m->rc = rc;
}

void moe_layer_trim(MoeLayer *m) {
    if (m->rc) m->h1 = m->h3 = m->act = NULL;
    void *bufs[] = {m->xs, m->ys, m->xg, m->yg, m->xsc, m->ysc, m->h1, m->h3, m->act, m->hq};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) arena_free(m->arena, m->be, bufs[i]);
    m->xs = m->xg = m->xsc = m->h1 = m->h3 = m->act = m->hq = NULL;
    m->ys = m->yg = m->ysc = NULL;
    if (m->cidx) {
        m->be->free(m->cidx);
        m->cidx = m->icidx = NULL;
    }
    m->cap_d = m->cap_f = m->cap_xg = m->cap_ys = m->cap_q = 0;
}

void moe_scratch_init(MoeScratch *s, const Backend *be, const ModelConfig *c, int maxN) {
    memset(s, 0, sizeof *s);
    s->be = be;
    size_t N = maxN, d = c->d_model, E = c->n_experts, R = N * c->top_k;
    s->lean_rows = be->hid == FMT_BF16 && !moe_act_mem_old();
    s->lean_dh = s->lean_rows && !be->fp8;
    s->maxN = maxN;
    s->d = c->d_model;
    s->dys = be->alloc(R * d * hid_size(be));
    if (!s->lean_rows) s->dxj = be->alloc(N * d * F);
    s->dlogits = be->alloc(N * E * F);
    s->rowdot = be->alloc(R * F);
    s->aux_dp = be->alloc(E * F);
    s->aux_dp_h = xcalloc(E, F);
    size_t fs = (size_t)c->n_shared_experts * c->shared_d_ff;
    if ((size_t)c->dense_d_ff > fs) fs = (size_t)c->dense_d_ff; // (the dense layers' use it too)
    if (fs) {
        s->sh_dy = be->alloc(N * d * hid_size(be));
        s->sh_dh1 = s->lean_dh ? NULL : be->alloc(N * fs * hid_size(be));
        s->sh_dh3 = s->lean_dh ? NULL : be->alloc(N * fs * hid_size(be));
        s->sh_dg = be->alloc(N * F);
    }
}

void moe_scratch_free(MoeScratch *s) {
    void *dev[] = {s->dys,    s->dxs,   s->dxj,    s->dlogits, s->rowdot, s->aux_dp, s->dyg,
                   s->dh1,    s->dh3,   s->dxg,    s->dysc,    s->dxsc,   s->gfull,  s->gstage,
                   s->gslice, s->sh_dy, s->sh_dh1, s->sh_dh3,  s->sh_dg};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i]) s->be->free(dev[i]);
    free(s->aux_dp_h);
    memset(s, 0, sizeof *s);
}

// Slice of N rows for TP rank r of TP: [N*r/TP, N*(r+1)/TP)
static void slice_of(int N, int TP, int r, int *s0, int *n) {
    *s0 = (int)((int64_t)N * r / TP);
    *n = (int)((int64_t)N * (r + 1) / TP) - *s0;
}

// Gather every TP rank's slice (Ns_r, d) into full (N, d).
static void tp_gather(const MoeLayer *m, const float *slice, float *full) {
    int TP = comm_size(m->cm.tp);
    size_t *cnt = m->tp_cnt, *dsp = cnt + TP;
    for (int r = 0; r < TP; r++) {
        int s0, n;
        slice_of(m->N, TP, r, &s0, &n);
        cnt[r] = (size_t)n * m->d;
        dsp[r] = (size_t)s0 * m->d;
    }
    comm_dev_allgatherv(m->cm.tp, slice, (size_t)m->Ns * m->d, full, cnt, dsp, CT_F32);
}

void moe_route(MoeLayer *m, const float *x, int N, const MoeWeights *w, const ModelConfig *c,
               uint64_t noise_seed, int64_t row0) {
    const Backend *be = m->be;
    CHECK(N <= m->maxN, "moe_forward: %d tokens > %d allocated", N, m->maxN);
    CHECK(!m->dense, "moe_route: layer %d is dense (moe_forward runs it)", m->layer);
    int d = m->d, E = m->E, k = m->k, TP = comm_size(m->cm.tp);
    int S = comm_size(m->cm.stage);
    m->N = N;
    m->row0 = row0;
    slice_of(N, TP, comm_rank(m->cm.tp), &m->s0, &m->Ns);
    int Ns = m->Ns;
    const float *xin = x + (size_t)m->s0 * d;
    if (m->noise) {
        // HF Mixtral jitter: the MoE input is scaled elementwise by U(1-j, 1+j), training only
        size_t n = (size_t)Ns * d;
        float *nh = m->noise_h;
        for (int i = 0; i < Ns; i++) {
            Rng r;
            rng_seed(&r, noise_seed ^ ((uint64_t)(row0 + m->s0 + i) * 0x9E3779B97F4A7C15ull));
            for (int j = 0; j < d; j++)
                nh[(size_t)i * d + j] =
                    noise_seed ? 1.0f - c->jitter + 2.0f * c->jitter * rng_uniform(&r) : 1.0f;
        }
        be->to_device(m->noise, nh, n * F);
        be->mul(m->xj, xin, m->noise, n);
        xin = m->xj;
    }
    // router on my slice: logits, softmax/top-k and the sums on the backend, then one copy of
    // sums, idx and w to the host (and of logits and probs when asked: host_router_out)
    rt_point(m, Ns);
    be->matmul_fwd(m->logits, xin, w->router, Ns, d, E, 0);
    be->router_topk(m->probs, m->lse, m->idx, m->wdev, m->sums, m->logits, w->route_bias, Ns, E,
                    router_rule(c));
    be->plan_counts(m->cnt, m->rank, m->idx, Ns, E, k);
    RtLayout rl = rt_layout(Ns, E, k);
    // (the sequence scope reads each row's choices and probabilities)
    be->to_host(m->rt_h, m->rt_d, m->host_router_out || c->aux_scope == AUX_SCOPE_SEQ ? rl.copy : rl.idx);
    // global statistics over the stage: slot counts of every rank (+ its token count), prob sums, lse^2
    size_t per = (size_t)k * E + 1;
    int64_t *mine = m->mine_h;
    for (size_t q = 0; q + 1 < per; q++) mine[q] = m->cnt_h[q];
    mine[per - 1] = Ns;
    comm_allgather(m->cm.stage, mine, m->cnt_all, per, CT_I64);
    m->Ng = 0;
    memset(m->counts, 0, sizeof(int64_t) * E);
    for (int s = 0; s < S; s++) {
        const int64_t *cs = m->cnt_all + (size_t)s * per;
        m->Ng += cs[per - 1];
        for (int j = 0; j < k; j++)
            for (int e = 0; e < E; e++) m->counts[e] += cs[(size_t)j * E + e];
    }
    double *ps = m->ps_h;
    memcpy(ps, m->sums_h, sizeof(double) * (E + 1));
    comm_allreduce(m->cm.stage, ps, E + 1, CT_F64);
    double a = 0;
    for (int e = 0; e < E; e++) {
        a += ((double)m->counts[e] / m->Ng) * (ps[e] / m->Ng);
        m->psum[e] = ps[e];
        m->aux_f[e] = (double)m->counts[e] / m->Ng;
    }
    m->aux = E * a;
    m->z = m->sigmoid ? 0 : ps[E] / m->Ng; // (sigmoid scores: no z-loss; config.h route_sigmoid)
    m->Nl = m->Ng;
    m->xraw = x + (size_t)m->s0 * d;
    m->aux_scope = c->aux_scope;
    if (c->aux_scope == AUX_SCOPE_GLOBAL && m->run_counts) { // f_i over the step's micro-batches so far
        *m->run_tokens += m->Ng;
        a = 0;
        for (int e = 0; e < E; e++) {
            m->run_counts[e] += m->counts[e];
            m->aux_f[e] = (double)m->run_counts[e] / (double)*m->run_tokens;
            a += m->aux_f[e] * (ps[e] / m->Ng);
        }
        m->aux = E * a;
    } else if (c->aux_scope == AUX_SCOPE_SEQ && !m->chunk_part) { // (a chunk's: moe_stats_merge)
        moe_seq_stats(m);
    }
    m->xin = xin;
}

void moe_stats_merge(MoeLayer *const *part, int n, MoeLayer *whole) {
    int E = whole->E;
    double lse2 = 0, a = 0;
    whole->Ng = 0;
    whole->dropped = 0;
    memset(whole->counts, 0, sizeof(int64_t) * E);
    memset(whole->psum, 0, sizeof(double) * E);
    for (int i = 0; i < n; i++) {
        const MoeLayer *p = part[i];
        whole->Ng += p->Ng;
        lse2 += p->z * (double)p->Ng;
        for (int e = 0; e < E; e++) {
            whole->counts[e] += p->counts[e];
            whole->psum[e] += p->psum[e];
        }
    }
    for (int e = 0; e < E; e++) {
        a += ((double)whole->counts[e] / whole->Ng) * (whole->psum[e] / whole->Ng);
        whole->aux_f[e] = (double)whole->counts[e] / whole->Ng;
    }
    whole->aux = E * a;
    whole->aux_scope = part[0]->aux_scope;
    if (whole->aux_scope == AUX_SCOPE_GLOBAL &&
        whole->run_counts) { // f_i over the step's micro-batches so far
        *whole->run_tokens += whole->Ng;
        a = 0;
        for (int e = 0; e < E; e++) {
            whole->run_counts[e] += whole->counts[e];
            whole->aux_f[e] = (double)whole->run_counts[e] / (double)*whole->run_tokens;
            a += whole->aux_f[e] * (whole->psum[e] / whole->Ng);
        }
        whole->aux = E * a;
    }
    if (whole->aux_scope == AUX_SCOPE_SEQ) { // the sequences the chunks cut, whole again
        int T = part[0]->seq_len;
        CHECK(T >= 1 && whole->Ng % T == 0, "aux scope sequence: %lld tokens are not whole sequences of %d",
              (long long)whole->Ng, T);
        whole->seq_len = T;
        moe_seq_alloc(whole, (int)(whole->Ng / T));
        memset(whole->seq_st, 0, sizeof(double) * (size_t)whole->nseq * 2 * E);
        for (int i = 0; i < n; i++) moe_seq_add(part[i], T, whole->seq_st);
        moe_seq_finish(whole, T);
    }
    whole->z = lse2 / whole->Ng;
    whole->Nl = whole->Ng;
    for (int i = 0; i < n; i++) moe_loss_from(part[i], whole);
}

void moe_loss_from(MoeLayer *part, const MoeLayer *whole) {
    memcpy(part->aux_f, whole->aux_f, sizeof(double) * whole->E);
    if (whole->aux_scope == AUX_SCOPE_SEQ) { // each sequence's f, for the part's rows of it
        moe_seq_alloc(part, whole->nseq);
        memcpy(part->seq_f, whole->seq_f, sizeof(double) * (size_t)whole->nseq * whole->E);
    }
    part->Nl = whole->Nl;
}

void moe_slot_counts(const MoeLayer *m, int64_t *out) {
    int k = m->k, E = m->E;
    size_t per = (size_t)k * E + 1;
    for (int s = 0; s < comm_size(m->cm.stage); s++)
        memcpy(out + (size_t)s * k * E, m->cnt_all + (size_t)s * per, sizeof(int64_t) * k * E);
}

// Row buffers that held rows and grew again (the routing less even than so far: more rows for this
// rank's experts than any forward before): one line on stderr naming the layer and the new size.
static void report_regrowth(MoeLayer *m) {
    int again = m->regrown || m->xu->regrown;
    for (int i = 0; i < m->r && m->r > 1; i++) again |= m->xc[i].regrown;
    if (!again) return;
    char at[48] = "an MoE layer";
    if (m->layer >= 0) snprintf(at, sizeof at, "layer %d", m->layer);
    fprintf(stderr,
            "moe: note: %s (EP rank %d of %d, ETP rank %d of %d): the routing sends it more rows than "
            "before: its row buffers grew (room for %zu expert-side rows of %d values now)\n",
            at, comm_rank(m->cm.ep), comm_size(m->cm.ep), comm_rank(m->cm.etp), comm_size(m->cm.etp),
            m->rows_cap, m->fu);
    m->regrown = m->xu->regrown = 0;
    for (int i = 0; i < m->r && m->r > 1; i++) m->xc[i].regrown = 0;
}

void moe_start(MoeLayer *m, const MoeWeights *w, const ModelConfig *c, const int64_t *budget) {
    const Backend *be = m->be;
    int d = m->d, fl = m->fl, E = m->E, k = m->k, Ns = m->Ns;
    int S = comm_size(m->cm.stage), me = comm_rank(m->cm.stage);
    const float *xin = m->xin;
    // dispatch plan over my slice (router.h's order; capacity decided globally: same drops as one
    // process): the host turns the counts into keep (k,E: the first keep[j,e] of slot j's
    // assignments to e in token order stay) and first (their first row), the backend writes the rows
    int32_t *keep = m->kf_h, *first = keep + (size_t)k * E;
    if (c->dispatch == DISPATCH_CAPACITY && budget) {
        for (size_t q = 0; q < (size_t)k * E; q++) keep[q] = (int32_t)budget[q];
    } else if (c->dispatch == DISPATCH_CAPACITY) {
        int64_t *slots = m->slots_h, *bud = m->bud_h;
        moe_slot_counts(m, slots);
        router_budget(slots, S, me, E, k, capacity_for(c, (int)m->Ng), bud);
        for (size_t q = 0; q < (size_t)k * E; q++) keep[q] = (int32_t)bud[q];
    } else {
        for (size_t q = 0; q < (size_t)k * E; q++) keep[q] = m->cnt_h[q];
    }
    m->plan.off[0] = 0;
    for (int e = 0; e < E; e++) {
        int64_t o = m->plan.off[e];
        for (int j = 0; j < k; j++) {
            first[(size_t)j * E + e] = (int32_t)o;
            o += keep[(size_t)j * E + e];
        }
        m->plan.off[e + 1] = o;
    }
    m->plan.M = (int)m->plan.off[E];
    m->plan.dropped = Ns * k - m->plan.M;
    if (c->dispatch == DISPATCH_CAPACITY) {
        int64_t kept = m->plan.M;
        comm_allreduce(m->cm.stage, &kept, 1, CT_I64);
        m->dropped = m->Ng * k - kept;
    } else {
        m->dropped = 0;
    }
    int M = m->plan.M, R = m->Rmax;
    if (!m->xs) m->xs = arena_alloc(m->arena, be, (size_t)(R ? R : 1) * d * hid_size(be));
    be->to_device(m->kf_d, keep, sizeof(int32_t) * 2 * k * E);
    be->plan_rows(m->slotrow, m->rowtok, m->rowscale, m->rank, m->idx, m->wdev, m->kf_d,
                  m->kf_d + (size_t)k * E, Ns, E, k);
    // permute, send to the expert owners, experts, and back
    be->gather_rows_hid(m->xs, xin, 0, m->rowtok, M, d);
    int64_t *kept = m->kept_h;
    for (int e = 0; e < E; e++) kept[e] = m->plan.off[e + 1] - m->plan.off[e];
    // sharded (ETP slices, tokens gathered over ETP) or gathered (whole experts, my tokens: EP only)
    m->gathered = m->mode == MOE_GATHERED && comm_size(m->cm.etp) > 1;
    MoeWeights wf = *w;
    if (m->gathered) {
        moe_gathered_setup(m);
        moe_gather_experts(m, w, &wf);
    }
    m->xu = m->gathered ? &m->xe : &m->x;
    m->fu = m->gathered ? fl * comm_size(m->cm.etp) : fl;
    exchange_plan(m->xu, kept);
    // --fp8-dispatch: the rows' FP8 values, here where they stay (an exchange packs them: the same values)
    if (m->fp8_dispatch && m->xu->local) be->fp8_rows_round(m->xs, M, d);
    // the pipelined exchange where there is an exchange to overlap (EP/ETP > 1, or forced NCCL)
    m->r = m->xu->local || m->gathered ? 1 : m->overlap;
    if (m->r > 1) moe_plan_chunks(m, kept);
    int Rg = m->r > 1 ? (int)m->gstart[m->r] : m->xu->Rg;
    expert_buffers(m, Rg);
    report_regrowth(m);
    if (!m->xu->local && !m->ys) m->ys = arena_alloc(m->arena, be, (size_t)(R ? R : 1) * d * F);
    m->wu = wf;
    // with early_dispatch (AMPipe) the unchunked dispatch is in flight until moe_finish
    m->started = m->early_dispatch && m->r == 1 && !m->xu->local;
    if (m->started) exchange_dispatch_start(m->xu, m->xs, m->fp8_dispatch);
}

void moe_finish(MoeLayer *m, float *y, const float *res, const MoeWeights *w) {
    const Backend *be = m->be;
    int d = m->d, El = m->El, k = m->k, Ns = m->Ns, fu = m->fu, TP = comm_size(m->cm.tp);
    const MoeWeights *wu = &m->wu;
    if (be->fp8_site) be->fp8_site(m->layer); // (FP8: the quantisers' non-finite report names the layer)
    // the shared rows again (--recompute moe): another state's moe_start (AMPipe's next chunk) may have
    // grown, that is moved, them since ours
    if (m->rc) moe_rc_rows(m, moe_rows_bytes(m));
    if (m->r > 1) {
        m->xgp = m->xg;
        moe_experts_chunked(m, w);
    } else {
        m->xgp = m->started ? exchange_dispatch_finish(m->xu, m->xs, m->xg)
                            : exchange_dispatch(m->xu, m->xs, m->xg, m->fp8_dispatch);
        m->started = 0;
        be->grouped_swiglu_fwd(m->h1, m->h3, m->act, m->xgp, wu->w1, wu->w3, m->xu->off, El, d, fu);
        be->grouped_down_fwd(m->yg, m->act, wu->w2, m->xu->off, El, fu, d);
        m->ysp = exchange_combine(m->xu, m->yg, m->ys);
    }
    moe_rc_keep(m); // (--fp8-save: h1, h3 kept as FP8 rows)
    // weighted combine, un-permuted: y[t] = sum_j w[t,j] ys[slot_row[t,j]] (slot order)
    // (res joins the combine where it writes y whole; else it is added after the shared expert and gather)
    float *yout = TP > 1 ? m->yslice : y;
    int join = TP == 1 && !m->fs;
    be->combine_rows(yout, join ? res : NULL, m->ysp, m->slotrow, m->wdev, Ns, k, d, 0);
    if (m->fs) moe_shared_forward(m, yout, m->xraw, w); // the un-jittered input
    if (TP > 1) tp_gather(m, m->yslice, y);
    if (res && !join) be->add(y, res, y, (size_t)m->N * d);
}

// A dense layer's forward: the MLP on my slice, all-gathered over TP.
static void dense_forward(MoeLayer *m, float *y, const float *x, int N, const MoeWeights *w, int64_t row0) {
    CHECK(N <= m->maxN, "moe_forward: %d tokens > %d allocated", N, m->maxN);
    int TP = comm_size(m->cm.tp);
    m->N = N;
    m->row0 = row0;
    slice_of(N, TP, comm_rank(m->cm.tp), &m->s0, &m->Ns);
    m->Ng = m->Nl = (int64_t)N * (comm_size(m->cm.stage) / TP); // every DP rank's N tokens
    float *yout = TP > 1 ? m->yslice : y;
    moe_shared_forward(m, yout, x + (size_t)m->s0 * m->d, w);
    if (TP > 1) tp_gather(m, m->yslice, y);
}

void moe_forward(MoeLayer *m, float *y, const float *res, const float *x, int N, const MoeWeights *w,
                 const ModelConfig *c, uint64_t noise_seed, int64_t row0) {
    if (m->dense) {
        dense_forward(m, y, x, N, w, row0);
        if (res) m->be->add(y, res, y, (size_t)N * m->d);
        return;
    }
    moe_route(m, x, N, w, c, noise_seed, row0);
    moe_start(m, w, c, NULL);
    moe_finish(m, y, res, w);
}

void moe_backward_start(MoeLayer *m, MoeScratch *s, const float *dy) {
    const Backend *be = m->be;
    int d = m->d, M = m->plan.M;
    // combine: dys = w * dy[tok]; dw = <dy[tok], ys> (one pass)
    m->dyb = dy + (size_t)m->s0 * d;
    be->gather_dot_scale(s->dys, s->rowdot, m->dyb, m->rowtok, m->ysp, m->rowscale, M, d, 1);
    scratch_buffers(s, m);
    // with early_dispatch the unchunked dispatch of dys is in flight until moe_backward_finish
    m->started = m->early_dispatch && m->r == 1 && !m->xu->local;
    if (m->started) exchange_dispatch_start(m->xu, s->dys, 0);
}

void moe_backward(MoeLayer *m, MoeScratch *s, float *dx, const float *dy, const float *x, const MoeWeights *w,
                  MoeGrads *g, const ModelConfig *c, float aux_scale, float z_scale) {
    if (m->dense) { // the MLP's backward on my slice (it writes dxin), all-gathered over TP
        int TP = comm_size(m->cm.tp);
        float *dxin = TP > 1 ? moe_tp_dx(s) : dx;
        moe_shared_backward(m, s, dxin, dy + (size_t)m->s0 * m->d, x + (size_t)m->s0 * m->d, w, g);
        if (TP > 1) tp_gather(m, dxin, dx);
        return;
    }
    moe_backward_start(m, s, dy);
    moe_backward_finish(m, s, dx, x, w, g, c, aux_scale, z_scale);
}

void moe_backward_finish(MoeLayer *m, MoeScratch *s, float *dx, const float *x, const MoeWeights *w,
                         MoeGrads *g, const ModelConfig *c, float aux_scale, float z_scale) {
    const Backend *be = m->be;
    int d = m->d, fu = m->fu, E = m->E, El = m->El, k = m->k, Ns = m->Ns;
    int TP = comm_size(m->cm.tp);
    if (be->fp8_site) be->fp8_site(m->layer);
    // gathered: the forward's whole experts, and whole-expert gradients reduce-scattered at the end
    MoeWeights wf;
    MoeGrads gf, *gu = g;
    const MoeWeights *wu = w;
    if (m->gathered) {
        size_t wn = (size_t)El * fu * d;
        wf = (MoeWeights){.router = w->router, .w1 = m->wfull, .w3 = m->wfull + wn, .w2 = m->wfull + 2 * wn};
        wu = &wf;
        moe_gathered_grads(m, s, &gf);
        gu = &gf;
    }
    const float *xin = m->noise ? m->xj : x + (size_t)m->s0 * d;
    if (m->rc) moe_rc_recompute(m, wu);
    // to the experts (same routes as the forward), expert backward, and back
    const float *dxs;
    if (m->r > 1) {
        dxs = moe_experts_bwd_chunked(m, s, w, g);
    } else {
        const void *dyg = m->started ? exchange_dispatch_finish(m->xu, s->dys, s->dyg)
                                     : exchange_dispatch(m->xu, s->dys, s->dyg, 0);
        m->started = 0;
        // No zero fills: the groups of x.off partition exactly the Rg expert-major rows (off[0] = 0,
        // off[El] = Rg, also after the EP/ETP exchange; capacity-dropped slots have no row), so the
        // first write of each buffer overwrites every row it holds (flags without GM_ACC_DINP); dxg = dh1 W1
        // + dh3 W3 in one call (grouped_matmul_bwd2). The weight gradients accumulate, or are written where
        // they hold nothing yet this step (g->fresh: ops.h GM_DW_WRITE).
        int dwf = moe_dw_flags(gu, 1, 1);
        void *dh1, *dh3;
        float *dxg;
        moe_bwd_rows(m, s, &dh1, &dh3, &dxg);
        be->grouped_swiglu_bwd(dh1, dh3, gu->w2, dyg, moe_act_kept(m, 0), m->h1, m->h3, wu->w2, m->xu->off,
                               El, fu, d, dwf);
        be->grouped_matmul_bwd2(dxg, gu->w1, gu->w3, dh1, dh3, m->xgp, wu->w1, wu->w3, m->xu->off, El, d, fu,
                                dwf);
        dxs = exchange_combine(m->xu, dxg, s->dxs);
    }
    if (m->gathered) moe_scatter_grads(m, s, &gf, g);
    g->fresh = 0; // the expert gradients hold this backward's share now
    // un-permute into the gradient of my slice of the (jittered) input (overwrites: slot order); without TP
    // my slice is the whole dx, which this writes in place
    float *dxin = TP > 1 ? moe_tp_dx(s) : dx;
    be->combine_rows(dxin, NULL, dxs, m->slotrow, NULL, Ns, k, d, 0);
    // router backward on the backend, with the global aux / z coefficients; the gradient of each
    // combine weight is its row's rowdot, read through the plan's slot_row
    double Ng = (double)m->Nl;
    float zdl = m->sigmoid ? 0.0f : (float)(2.0 * z_scale / Ng); // (ops.h router_bwd: no z term with sigmoid)
    if (m->aux_scope == AUX_SCOPE_SEQ) {
        // per segment of my rows within one sequence s: d aux / d probs[t,e] = E cnt_se / (T^2 S) = E f_se /
        // (T S)
        int T = m->seq_len, S = m->nseq, nseg = 0;
        int64_t g0 = m->row0 + m->s0;
        float *dp = m->seq_dp_h;
        int *segs = m->seq_seg;
        for (int i = 0; i < Ns; i++) {
            if (i && (g0 + i) % T) continue;
            int sq = (int)((g0 + i) / T);
            for (int e = 0; e < E; e++)
                dp[(size_t)nseg * E + e] =
                    (float)(aux_scale * E * m->seq_f[(size_t)sq * E + e] / ((double)T * S));
            segs[nseg++] = i;
        }
        segs[nseg] = Ns;
        be->to_device(m->seq_dp, dp, sizeof(float) * (size_t)nseg * E);
        for (int q = 0; q < nseg; q++) {
            int o = segs[q], n = segs[q + 1] - o;
            be->router_bwd(s->dlogits + (size_t)o * E, s->rowdot, m->slotrow + (size_t)o * k,
                           m->probs + (size_t)o * E, m->lse + o, m->idx + (size_t)o * k,
                           m->wdev + (size_t)o * k, m->seq_dp + (size_t)q * E, zdl, n, E, router_rule(c));
        }
    } else {
        for (int e = 0; e < E; e++) s->aux_dp_h[e] = (float)(aux_scale * E * m->aux_f[e] / Ng);
        be->to_device(s->aux_dp, s->aux_dp_h, (size_t)E * F);
        be->router_bwd(s->dlogits, s->rowdot, m->slotrow, m->probs, m->lse, m->idx, m->wdev, s->aux_dp, zdl,
                       Ns, E, router_rule(c));
    }
    be->matmul_bwd(dxin, g->router, s->dlogits, xin, w->router, Ns, d, E, GM_ACC_DINP);
    if (m->noise) be->mul(dxin, dxin, m->noise, (size_t)Ns * d);
    if (m->fs) moe_shared_backward(m, s, dxin, m->dyb, x + (size_t)m->s0 * d, w, g);
    if (TP > 1) tp_gather(m, dxin, dx); // every TP rank needs the whole dx
}
