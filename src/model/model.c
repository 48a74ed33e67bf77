// model.c — forward and hand-written backward of the MoE transformer (see model.h):
// embed -> L x [RMSNorm -> GQA attention with RoPE -> residual -> RMSNorm -> MoE FFN -> residual]
// -> RMSNorm -> LM head -> cross-entropy.
#include "model/model.h"
#include <string.h>
#include "core/common.h"

#define F sizeof(float)

static float *P(const Model *m, float *base, ParamRole role, int layer, int expert) {
    int i = params_index(&m->t, role, layer, expert);
    CHECK(i >= 0, "parameter role %d layer %d expert %d missing from the table", (int)role, layer, expert);
    return base + m->t.p[i].loffset;
}

static void layer_weights(const Model *m, float *base, int l, MoeWeights *w) {
    memset(w, 0, sizeof *w);
    w->router = P(m, base, PR_ROUTER, l, -1);
    w->w1 = P(m, base, PR_W1, l, m->e0);
    w->w3 = P(m, base, PR_W3, l, m->e0);
    w->w2 = P(m, base, PR_W2, l, m->e0);
    if (m->c.balance == BALANCE_AUX_FREE) w->route_bias = P(m, base, PR_ROUTE_BIAS, l, -1);
    if (m->c.n_shared_experts) {
        w->sh_w1 = P(m, base, PR_SH_W1, l, -1);
        w->sh_w3 = P(m, base, PR_SH_W3, l, -1);
        w->sh_w2 = P(m, base, PR_SH_W2, l, -1);
        if (m->c.shared_gate) w->sh_gate = P(m, base, PR_SH_GATE, l, -1);
    }
}

// ---- family options around the q/k/v projections (config.h): biases, then QK-norm, then RoPE
// The biases: q += 1 bias^T as a GEMM with K = 1 over the ones vector (every backend has it).
static void qkv_bias_fwd(Model *m, int l, float *q, float *k, float *v, int N) {
    int qd = m->Hl * m->c.head_dim, kvd = m->KVl * m->c.head_dim;
    m->be->matmul_fwd(q, m->ones, P(m, m->params, PR_BQ, l, -1), N, 1, qd, 1);
    m->be->matmul_fwd(k, m->ones, P(m, m->params, PR_BK, l, -1), N, 1, kvd, 1);
    m->be->matmul_fwd(v, m->ones, P(m, m->params, PR_BV, l, -1), N, 1, kvd, 1);
}
static void qkv_bias_bwd(Model *m, int l, const float *dq, const float *dk, const float *dv, int N) {
    int qd = m->Hl * m->c.head_dim, kvd = m->KVl * m->c.head_dim;
    float *g = m->grads, *p = m->params;
    m->be->matmul_bwd(NULL, P(m, g, PR_BQ, l, -1), dq, m->ones, P(m, p, PR_BQ, l, -1), N, 1, qd, 0);
    m->be->matmul_bwd(NULL, P(m, g, PR_BK, l, -1), dk, m->ones, P(m, p, PR_BK, l, -1), N, 1, kvd, 0);
    m->be->matmul_bwd(NULL, P(m, g, PR_BV, l, -1), dv, m->ones, P(m, p, PR_BV, l, -1), N, 1, kvd, 0);
}
// The q, k, v projections of layer l as the multi-product ops take them: the tensors at base (the
// weights or their gradients) and their widths (this rank's heads).
static void qkv_tensors(const Model *m, float *base, int l, float *t[3], int O[3]) {
    t[0] = P(m, base, PR_WQ, l, -1);
    t[1] = P(m, base, PR_WK, l, -1);
    t[2] = P(m, base, PR_WV, l, -1);
    O[0] = m->Hl * m->c.head_dim;
    O[1] = O[2] = m->KVl * m->c.head_dim;
}

void model_qkv_fwd(Model *m, int l, float *q, float *k, float *v, const void *xn, int n) {
    float *out[3] = {q, k, v}, *w[3];
    int O[3];
    qkv_tensors(m, m->params, l, w, O);
    m->be->matmul_fwd_multi(3, out, xn, (const float *const *)w, n, m->c.d_model, O);
    if (m->c.qkv_bias) qkv_bias_fwd(m, l, q, k, v, n);
}

void model_oproj_fwd(Model *m, int l, float *out, const void *att, int n) {
    float *wo = P(m, m->params, PR_WO, l, -1);
    int O = m->c.d_model;
    m->be->matmul_fwd_multi(1, &out, att, (const float *const *)&wo, n, m->Hl * m->c.head_dim, &O);
}

// QK-norm as RMSNorm rows: full (OLMoE) rows of H*hd / KV*hd, per head (Qwen3-MoE) rows of hd.
static void qk_rows(const Model *m, int N, int heads, int *rows, int *C) {
    int full = m->c.qk_norm == QK_NORM_FULL;
    *rows = full ? N : N * heads;
    *C = full ? heads * m->c.head_dim : m->c.head_dim;
}
// The full form over TP: each rank holds its heads' columns of a row (Hl*hd of H*hd; its slice of the
// weight, params.c), so the row sums (the forward's sum of squares, the backward's dot) are taken in
// parts, q's and k's added over the TP ranks in one all-reduce of 2N doubles, and applied on each rank.
// With one TP rank the plain rmsnorm ops (the same bits).
static int qk_split(const Model *m) { return m->c.qk_norm == QK_NORM_FULL && comm_size(m->mesh.tp) > 1; }

void model_qk_norm_fwd(Model *m, int l, float *q, float *k, float *rstdq, float *rstdk, const float *qraw,
                       const float *kraw, int N) {
    const Backend *be = m->be;
    const float *wq = P(m, m->params, PR_QNORM, l, -1), *wk = P(m, m->params, PR_KNORM, l, -1);
    float eps = m->c.norm_eps;
    int r, C;
    if (qk_split(m)) {
        int hd = m->c.head_dim, Cq = m->Hl * hd, Ck = m->KVl * hd;
        be->rmsnorm_part(m->qk_sums, qraw, NULL, qraw, N, Cq);
        be->rmsnorm_part(m->qk_sums + N, kraw, NULL, kraw, N, Ck);
        comm_dev_allreduce(m->mesh.tp, m->qk_sums, (size_t)2 * N, CT_F64);
        be->rmsnorm_fwd_part(q, rstdq, qraw, wq, m->qk_sums, N, Cq, m->c.n_heads * hd, eps);
        be->rmsnorm_fwd_part(k, rstdk, kraw, wk, m->qk_sums + N, N, Ck, m->c.n_kv_heads * hd, eps);
        return;
    }
    qk_rows(m, N, m->Hl, &r, &C);
    be->rmsnorm_fwd(q, rstdq, qraw, wq, r, C, eps);
    qk_rows(m, N, m->KVl, &r, &C);
    be->rmsnorm_fwd(k, rstdk, kraw, wk, r, C, eps);
}
// dq, dk (after RoPE's backward) -> m->dq2, m->dk2 (before the norms); the norm weights' gradients.
static void qk_norm_bwd(Model *m, LayerActs *a, int l, int N) {
    const Backend *be = m->be;
    float *gq = P(m, m->grads, PR_QNORM, l, -1), *gk = P(m, m->grads, PR_KNORM, l, -1);
    const float *wq = P(m, m->params, PR_QNORM, l, -1), *wk = P(m, m->params, PR_KNORM, l, -1);
    int r, C;
    qk_rows(m, N, m->Hl, &r, &C);
    be->zero(m->dq2, (size_t)r * C * F);
    int Ck = m->KVl * m->c.head_dim;
    if (qk_split(m)) { // (full rows: r = N, C = Hl*hd)
        be->zero(m->dk2, (size_t)N * Ck * F);
        be->rmsnorm_part(m->qk_sums, m->dq, wq, a->qraw, N, C);
        be->rmsnorm_part(m->qk_sums + N, m->dk, wk, a->kraw, N, Ck);
        comm_dev_allreduce(m->mesh.tp, m->qk_sums, (size_t)2 * N, CT_F64);
        be->rmsnorm_bwd_part(m->dq2, gq, m->dq, a->qraw, wq, a->rstdq, m->qk_sums, N, C,
                             m->c.n_heads * m->c.head_dim);
        be->rmsnorm_bwd_part(m->dk2, gk, m->dk, a->kraw, wk, a->rstdk, m->qk_sums + N, N, Ck,
                             m->c.n_kv_heads * m->c.head_dim);
        return;
    }
    be->rmsnorm_bwd(m->dq2, gq, m->dq, a->qraw, wq, a->rstdq, r, C);
    qk_rows(m, N, m->KVl, &r, &C);
    be->zero(m->dk2, (size_t)r * C * F);
    be->rmsnorm_bwd(m->dk2, gk, m->dk, a->kraw, wk, a->rstdk, r, C);
}

// Wall time for the MoE timing, after the backend's queued work (only while timing: 0 otherwise).
static double moe_clock(const Model *m) {
    if (!m->moe_timing) return 0;
    m->be->sync();
    return now_seconds();
}

// The dropout seed of the current slot's forward (0: none; see model.h).
static uint64_t slot_drop_seed(const Model *m) { return m->slots[m->cur][m->cur_slot].drop_seed; }

// Residual-branch dropout of layer l's site (0 attention, 1 MoE) on the rows [r0, r1) of the current
// micro-batch's (N,d) activations (x: row r0), forward or (the same mask and scale) backward; the
// micro-batch's rows as one sequence of N, so row r is global token dp rank * N + r on any split.
static void drop_rows(const Model *m, float *x, int l, int site, int r0, int r1) {
    uint64_t seed = slot_drop_seed(m);
    if (!seed || !(m->dropout > 0)) return;
    int N = m->B * m->T;
    m->be->dropout(x, 1, N, r0, r1, m->c.d_model, m->dropout, dropout_hash(seed, l, site),
                   (int64_t)comm_rank(m->mesh.dp) * N);
}

// The gradient reaching a dropped branch over rows [r0, r1): dres's rows, or with residual dropout a
// copy of them through the site's mask (in ddrop: the site's half, at the same rows).
static const float *dropped_rows(Model *m, int l, int site, int r0, int r1) {
    size_t d = m->c.d_model;
    if (!slot_drop_seed(m) || !(m->dropout > 0)) return m->dres + (size_t)r0 * d;
    if (!m->ddrop) m->ddrop = m->be->alloc((size_t)2 * m->maxN * d * F);
    // a half per site: AMPipe's backward keeps a chunk's MoE dy in flight while the o_proj rows are masked
    float *x = m->ddrop + ((size_t)(site == 0) * m->maxN + (size_t)r0) * d;
    m->be->copy(x, m->dres + (size_t)r0 * d, (size_t)(r1 - r0) * d * F);
    drop_rows(m, x, l, site, r0, r1);
    return x;
}

static int chunk_of(const Model *m, int l) {
    for (int k = 0; k < m->nchunks; k++)
        if (l >= m->chunk[k].l0 && l < m->chunk[k].l1) return k;
    return -1;
}
int model_holds_layer(const Model *m, int l) { return chunk_of(m, l) >= 0; }
MoeLayer *model_moe(Model *m, int l, int slot) {
    int k = chunk_of(m, l);
    CHECK(k >= 0 && slot >= 0 && slot < m->nslots[k], "model_moe: layer %d slot %d not held", l, slot);
    return &m->slots[k][slot].la[l].moe;
}

// AMPipe's chunk boundaries: chunk j = rows [R[j], R[j+1]) of N, R[j] = N j / n (R: n + 1 entries).
static void chunk_rows(int N, int n, int *R) {
    for (int j = 0; j <= n; j++) R[j] = (int)((int64_t)N * j / n);
}

// AMPipe's per-chunk MoE states of one layer's activations: n of them, for chunks of up to
// ceil(maxN / n) rows (none for n = 1).
static void chunk_moes(Model *m, LayerActs *a, int n) {
    for (int i = 0; i < a->nmc; i++) moe_layer_free(&a->mc[i]);
    free(a->mc);
    a->mc = NULL;
    a->nmc = 0;
    if (n <= 1) return;
    MoeComms cm = {m->mesh.tp, m->mesh.ep, m->mesh.etp, m->mesh.stage, m->mesh.epn, m->mesh.epx};
    a->mc = xcalloc(n, sizeof *a->mc);
    for (int i = 0; i < n; i++) {
        moe_layer_init(&a->mc[i], m->be, &m->c, (m->maxN + n - 1) / n, &cm);
        a->mc[i].layer = a->moe.layer;
        if (m->recompute & RECOMPUTE_MOE) moe_set_recompute(&a->mc[i], &m->rc);
        a->mc[i].arena = &a->arena;
    }
    a->nmc = n;
}

// One layer's activations under m->recompute: attention output and lse its own or the shared ones;
// its MoE states' SwiGLU rows kept or shared.
static void layer_recompute(Model *m, LayerActs *a) {
    const Backend *be = m->be;
    int attn = (m->recompute & RECOMPUTE_ATTN) != 0;
    if (attn && !a->att_shared) {
        arena_free(&a->arena, be, a->att);
        arena_free(&a->arena, be, a->lse);
        a->att = m->att_rc;
        a->lse = m->lse_rc;
    } else if (!attn && a->att_shared) {
        a->att = arena_alloc(&a->arena, be, (size_t)m->maxN * m->Hl * m->c.head_dim * be->hid_elem);
        a->lse = arena_alloc(&a->arena, be, (size_t)m->maxB * m->Hl * m->maxT * F);
    }
    a->att_shared = attn;
    MoeRecompute *rc = m->recompute & RECOMPUTE_MOE ? &m->rc : NULL;
    moe_set_recompute(&a->moe, rc);
    for (int i = 0; i < a->nmc; i++) moe_set_recompute(&a->mc[i], rc);
}

void model_set_recompute(Model *m, int mode) {
    CHECK(mode >= RECOMPUTE_NONE && mode <= RECOMPUTE_FULL, "model_set_recompute: %d", mode);
    m->recompute = mode;
    if ((mode & RECOMPUTE_ATTN) && !m->att_rc) {
        m->att_rc = m->be->alloc((size_t)m->maxN * m->Hl * m->c.head_dim * m->be->hid_elem);
        m->lse_rc = m->be->alloc((size_t)m->maxB * m->Hl * m->maxT * F);
    }
    for (int k = 0; k < m->nchunks; k++)
        for (int i = 0; i < m->nslots[k]; i++)
            for (int l = m->chunk[k].l0; l < m->chunk[k].l1; l++) layer_recompute(m, &m->slots[k][i].la[l]);
}

// The bytes of layer l's routed-expert gradients (one contiguous block: params.h's order), 256-aligned,
// lent to an arena (model_share_grads); none where this rank holds no experts of the layer.
static Arena expert_grads_arena(const Model *m, int l) {
    Arena a = {0};
    int i = params_index(&m->t, PR_W1, l, m->e0), j = params_index(&m->t, PR_W2, l, m->e0 + m->El - 1);
    if (i < 0 || j < 0 || !m->t.p[i].lnumel) return a;
    char *b = (char *)(m->grads + m->t.p[i].loffset),
         *e = (char *)(m->grads + m->t.p[j].loffset + m->t.p[j].lnumel);
    char *b2 = (char *)(((uintptr_t)b + 255) & ~(uintptr_t)255);
    if (b2 >= e) return a;
    a.base = b2;
    a.cap = (size_t)(e - b2);
    return a;
}

static void slot_alloc(Model *m, ModelSlot *s, int chunk) {
    const ModelChunk *ch = &m->chunk[chunk];
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    size_t N = m->maxN, d = c->d_model, qd = (size_t)m->Hl * c->head_dim, kvd = (size_t)m->KVl * c->head_dim,
           V = c->vocab_size;
    s->la = xcalloc(c->n_layers, sizeof *s->la);
    MoeComms cm = {m->mesh.tp, m->mesh.ep, m->mesh.etp, m->mesh.stage, m->mesh.epn, m->mesh.epx};
    for (int l = ch->l0; l < ch->l1; l++) {
        LayerActs *a = &s->la[l];
        Arena *A = &a->arena;
        if (m->share_grads && l > ch->l0) *A = expert_grads_arena(m, l - 1);
        a->res_in = arena_alloc(A, be, N * d * F);
        a->xn1 = arena_alloc(A, be, N * d * be->hid_elem);
        a->rstd1 = arena_alloc(A, be, N * F);
        a->q = arena_alloc(A, be, N * qd * be->hid_elem);
        a->k = arena_alloc(A, be, N * kvd * be->hid_elem);
        a->v = arena_alloc(A, be, N * kvd * be->hid_elem);
        if (!(m->recompute & RECOMPUTE_ATTN)) { // (else the model's shared ones: layer_recompute below)
            a->att = arena_alloc(A, be, N * qd * be->hid_elem);
            a->lse = arena_alloc(A, be, (size_t)m->maxB * m->Hl * m->maxT * F);
        }
        a->x_mid = arena_alloc(A, be, N * d * F);
        a->xn2 = arena_alloc(A, be, N * d * F);
        a->rstd2 = arena_alloc(A, be, N * F);
        if (c->qk_norm) {
            a->qraw = arena_alloc(A, be, N * qd * F);
            a->kraw = arena_alloc(A, be, N * kvd * F);
            a->rstdq = arena_alloc(A, be, N * m->Hl * F);
            a->rstdk = arena_alloc(A, be, N * m->KVl * F);
        }
        moe_layer_init(&a->moe, be, c, m->maxN, &cm);
        a->moe.layer = l;
        if (m->recompute) layer_recompute(m, a);
        A->mark = A->used; // the MoE's rows from here (again after each change of AMPipe chunks)
        a->moe.arena = A;
        a->moe.run_counts = m->scope_counts + (size_t)l * c->n_experts; // aux scope global: the step's sums
        a->moe.run_tokens = m->scope_tokens + l;
    }
    Arena *H = &s->head;
    *H = m->share_grads && ch->last ? expert_grads_arena(m, ch->l1 - 1) : (Arena){0};
    s->logits =
        ch->last ? arena_alloc(H, be, N * V * F) : NULL; // the largest activation: the last stage's only
    s->res_final = arena_alloc(H, be, N * d * F);
    s->xn_f = arena_alloc(H, be, N * d * F);
    s->rstd_f = be->alloc(N * F);
    s->losses = be->alloc(N * F);
    s->tokens = be->alloc(N * sizeof(int32_t));
    s->targets = be->alloc(N * sizeof(int32_t));
}

static void slot_free(Model *m, ModelSlot *s, int chunk) {
    const Backend *be = m->be;
    for (int l = m->chunk[chunk].l0; l < m->chunk[chunk].l1; l++) {
        LayerActs *a = &s->la[l];
        if (a->att_shared) {
            a->att = NULL;
            a->lse = NULL;
        } // the model's (--recompute attn)
        void *bufs[] = {a->res_in, a->xn1, a->rstd1, a->q,    a->k,    a->v,     a->att,  a->lse,
                        a->x_mid,  a->xn2, a->rstd2, a->qraw, a->kraw, a->rstdq, a->rstdk};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) arena_free(&a->arena, be, bufs[i]);
        moe_layer_free(&a->moe);
        chunk_moes(m, a, 1);
    }
    free(s->la);
    void *bufs[] = {s->res_final, s->xn_f, s->rstd_f, s->logits, s->losses, s->tokens, s->targets};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) arena_free(&s->head, be, bufs[i]);
    s->head = (Arena){0};
}

// This rank's chunks: virtual stages k = c * PP + pp_rank of the split (one chunk of every layer
// without one).
static void find_chunks(Model *m) {
    const StageSplit *ps = m->mesh.sl.pp_split;
    int L = m->c.n_layers;
    if (!ps || ps->pp * ps->vpp == 1) {
        m->nchunks = 1;
        m->chunk[0] = (ModelChunk){0, L, 1, 1};
        return;
    }
    int S = ps->pp * ps->vpp;
    CHECK(ps->vpp <= MODEL_MAX_CHUNKS, "--vpp %d: at most %d chunks per rank", ps->vpp, MODEL_MAX_CHUNKS);
    m->nchunks = ps->vpp;
    for (int c = 0; c < ps->vpp; c++) {
        int k = c * ps->pp + m->mesh.sl.pp_rank;
        m->chunk[c] = (ModelChunk){ps->first[k], ps->first[k + 1], k == 0, k == S - 1};
    }
}

void model_init(Model *m, const ModelConfig *c, const Backend *be, int maxB, int maxT,
                const ModelMesh *mesh) {
    memset(m, 0, sizeof *m);
    const char *bad = config_validate(c);
    if (bad) DIE("invalid model config: %s", bad);
    CHECK(maxB >= 1 && maxT >= 1 && (int64_t)maxB * maxT <= config_max_tokens(c),
          "a micro-batch of %d x %d tokens exceeds the model's limit of %lld", maxB, maxT,
          (long long)config_max_tokens(c));
    CHECK(maxT <= c->max_seq_len, "sequence length %d exceeds the model's max_seq_len %d", maxT,
          c->max_seq_len);
    m->c = *c;
    m->be = be;
    if (mesh) m->mesh = *mesh;
    else m->mesh.sl = (ParamSlicing){1, 0, 1, 0, 1, 0, NULL, 0};
    const ParamSlicing *sl = &m->mesh.sl;
    params_build_local(&m->t, c, sl);
    find_chunks(m);
    m->Hl = c->n_heads / sl->tp;
    m->KVl = c->n_kv_heads / sl->tp;
    m->El = c->n_experts / sl->ep;
    m->e0 = sl->ep_rank * m->El;
    m->maxB = maxB;
    m->maxT = maxT;
    m->maxN = maxB * maxT;
    size_t N = m->maxN, d = c->d_model, qd = (size_t)m->Hl * c->head_dim, kvd = (size_t)m->KVl * c->head_dim;
    m->params = be->alloc(m->t.ltotal * F);
    m->grads = be->alloc(m->t.ltotal * F);
    m->scope_counts = xcalloc((size_t)c->n_layers * c->n_experts, sizeof(int64_t));
    m->scope_tokens = xcalloc((size_t)c->n_layers, sizeof(int64_t));
    for (int k = 0; k < m->nchunks; k++) model_set_slots(m, k, 1);
    m->dres = be->alloc(N * d * F);
    m->moe_out = be->alloc(N * d * F);
    m->dxn = be->alloc(N * d * F);
    m->dq = be->alloc(N * qd * F);
    m->dk = be->alloc(N * kvd * F);
    m->dv = be->alloc(N * kvd * F);
    m->datt = be->alloc(N * qd * F);
    if (c->qk_norm) {
        m->dq2 = be->alloc(N * qd * F);
        m->dk2 = be->alloc(N * kvd * F);
    }
    if (qk_split(m)) m->qk_sums = be->alloc(2 * N * sizeof(double));
    if (c->qkv_bias) {
        float *one = xmalloc(N * F);
        for (size_t i = 0; i < N; i++) one[i] = 1.0f;
        m->ones = be->alloc(N * F);
        be->to_device(m->ones, one, N * F);
        free(one);
    }
    moe_scratch_init(&m->ms, be, c, m->maxN);
    m->losses_h = xmalloc(N * F);
    size_t ke = (size_t)c->top_k * c->n_experts, S = (size_t)comm_size(m->mesh.stage);
    m->budget_h = xmalloc(sizeof(int64_t) * ke * (AMPIPE_MAX + S + S * AMPIPE_MAX));
    m->expert_counts = xcalloc((size_t)c->n_layers * c->n_experts, sizeof(int64_t));
    m->kv_seen = xcalloc((size_t)maxB, 1);
    m->hf_fe = xcalloc((size_t)c->n_experts * 2, sizeof(double));
    m->moe_overlap = xmalloc(sizeof(int) * (size_t)c->n_layers);
    m->moe_time = xcalloc((size_t)c->n_layers, sizeof(double));
    m->moe_mode = xcalloc((size_t)c->n_layers, sizeof(int));
    m->rc.be = be;
    m->ampipe = xmalloc(sizeof(int) * (size_t)c->n_layers);
    for (int l = 0; l < c->n_layers; l++) m->moe_overlap[l] = m->ampipe[l] = 1;
    m->hf_pe = m->hf_fe + c->n_experts;
}

void model_share_grads(Model *m, int on) {
    CHECK(!on || (m->nchunks == 1 && m->nslots[0] == 1),
          "model_share_grads: %d chunks, %d slots (one of each)", m->nchunks, m->nslots[0]);
    if (m->share_grads == !!on) return;
    slot_free(m, &m->slots[0][0], 0);
    m->share_grads = !!on;
    slot_alloc(m, &m->slots[0][0], 0);
    model_use(m, 0, 0);
}

void model_set_expert_grads(Model *m, int gbf) {
    CHECK(gbf == OPTG_F32 || gbf == OPTG_BF16 || gbf == OPTG_PACKED, "model_set_expert_grads: format %d",
          gbf);
    m->expert_gbf = gbf;
}

int model_grad_format(const Model *m, const ParamSpec *s, int64_t *gb) {
    *gb = 0;
    int routed = s->expert >= 0 && (s->role == PR_W1 || s->role == PR_W3 || s->role == PR_W2);
    if (!routed || m->expert_gbf == OPTG_F32) return OPTG_F32;
    if (m->expert_gbf == OPTG_PACKED) {
        int i = params_index(&m->t, s->role, s->layer, m->e0);
        CHECK(i >= 0, "model_grad_format: layer %d holds no expert %d", s->layer, m->e0);
        *gb = (int64_t)m->t.p[i].loffset;
    }
    return m->expert_gbf;
}

int model_bf16_weights(Model *m) {
    if (!m->be->alloc_bf16_params) return 0;
    size_t *h = xmalloc(sizeof(size_t) * params_bf16_ranges_max(m->c.n_layers));
    int nh = params_bf16_ranges(&m->t, m->c.n_layers, m->e0, m->El, MOE_GEMM_FP32_MAX_O, h);
    if (nh) {
        m->be->free(m->params);
        m->params = m->be->alloc_bf16_params(m->t.ltotal, h, nh);
    }
    free(h);
    return nh > 0;
}

void model_set_slots(Model *m, int chunk, int n) {
    CHECK(!m->share_grads || n == 1, "model_set_slots: %d slots with the gradients' memory shared", n);
    CHECK(n >= 1 && chunk >= 0 && chunk < m->nchunks, "model_set_slots: chunk %d, %d slots", chunk, n);
    for (int i = n; i < m->nslots[chunk]; i++) slot_free(m, &m->slots[chunk][i], chunk);
    m->slots[chunk] = xrealloc(m->slots[chunk], sizeof(ModelSlot) * (size_t)n);
    for (int i = m->nslots[chunk]; i < n; i++) slot_alloc(m, &m->slots[chunk][i], chunk);
    m->nslots[chunk] = n;
    model_use(m, 0, 0);
}

void model_use(Model *m, int chunk, int slot) {
    CHECK(chunk >= 0 && chunk < m->nchunks && slot >= 0 && slot < m->nslots[chunk],
          "model_use: chunk %d of %d, slot %d of %d", chunk, m->nchunks, slot,
          m->nslots[chunk < 0 ? 0 : chunk]);
    m->cur = chunk;
    m->cur_slot = slot;
    ModelSlot *s = &m->slots[chunk][slot];
    m->la = s->la;
    m->res_final = s->res_final;
    m->xn_f = s->xn_f;
    m->rstd_f = s->rstd_f;
    m->logits = s->logits;
    m->losses = s->losses;
    m->tokens = s->tokens;
    m->targets = s->targets;
    m->B = s->B;
    m->T = s->T;
}

void model_set_overlap(Model *m, int l, int r) {
    CHECK(l >= 0 && l < m->c.n_layers && r >= 1 && r <= MOE_MAX_OVERLAP, "model_set_overlap: layer %d, r %d",
          l, r);
    m->moe_overlap[l] = r;
}

void model_set_expert_mode(Model *m, int l, int mode) {
    CHECK(l >= 0 && l < m->c.n_layers && (mode == MOE_SHARDED || mode == MOE_GATHERED),
          "model_set_expert_mode: %d %d", l, mode);
    m->moe_mode[l] = mode;
}

void model_set_ampipe(Model *m, int l, int n) {
    CHECK(l >= 0 && l < m->c.n_layers && (n == 1 || n == 2 || n == 4 || n == 8),
          "model_set_ampipe: layer %d, %d chunks (1, 2, 4 or 8)", l, n);
    m->ampipe[l] = n;
}

float *model_stage_in(const Model *m) { return m->la[m->chunk[m->cur].l0].res_in; }
float *model_stage_out(const Model *m) { return m->res_final; }

// The dw_fresh bit of a tensor whose first backward of the step writes its gradient (model.h DW_FRESH_*;
// the LM head's: head_fresh), 0 for the tensors model_zero_grads zeroes.
static int fresh_bit(const ParamSpec *p) {
    switch (p->role) {
        case PR_W1:
        case PR_W3:
        case PR_W2: return DW_FRESH_EXPERTS;
        case PR_WQ:
        case PR_WK:
        case PR_WV: return DW_FRESH_QKV;
        case PR_WO: return DW_FRESH_O;
        case PR_LM_HEAD: return DW_FRESH_HEAD;
        default: return 0;
    }
}
// That tensor's gradient is still unwritten this step.
static int still_fresh(const Model *m, const ParamSpec *p) {
    int b = fresh_bit(p);
    return b && (b == DW_FRESH_HEAD ? m->head_fresh : m->dw_fresh[p->layer] & b);
}
// The flags of a dense matmul_bwd into layer l's tensor of bit b (GM_DW_WRITE while fresh; bits cleared).
static int dw_write(Model *m, int l, int b) {
    uint8_t *f = b == DW_FRESH_HEAD ? &m->head_fresh : m->dw_fresh ? &m->dw_fresh[l] : NULL;
    if (!f || !(*f & b)) return 0;
    *f &= (uint8_t)~b;
    return GM_DW_WRITE;
}

void model_zero_grads(Model *m) {
    const ParamTable *t = &m->t;
    if (!m->dw_fresh) { // once: the ranges of every tensor not written by its first backward, adjacent ones
                        // merged
        m->dw_fresh = xcalloc((size_t)m->c.n_layers, 1);
        m->zr_off = xmalloc(sizeof(size_t) * (t->n + 1));
        m->zr_n = xmalloc(sizeof(size_t) * (t->n + 1));
        for (int i = 0; i < t->n; i++) {
            const ParamSpec *p = &t->p[i];
            if (!p->lnumel || fresh_bit(p)) continue;
            if (m->nzr && m->zr_off[m->nzr - 1] + m->zr_n[m->nzr - 1] == p->loffset) {
                m->zr_n[m->nzr - 1] += p->lnumel;
            } else {
                m->zr_off[m->nzr] = p->loffset;
                m->zr_n[m->nzr++] = p->lnumel;
            }
        }
    }
    for (int i = 0; i < m->nzr; i++) m->be->zero(m->grads + m->zr_off[i], m->zr_n[i] * sizeof(float));
    // (a layer this rank does not hold has no tensors to write)
    memset(m->dw_fresh, DW_FRESH_EXPERTS | DW_FRESH_QKV | DW_FRESH_O, (size_t)m->c.n_layers);
    m->head_fresh = DW_FRESH_HEAD;
}

void model_grads_settle(Model *m) {
    if (!m->dw_fresh) return;
    const ParamTable *t = &m->t;
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        if (p->lnumel && still_fresh(m, p)) m->be->zero(m->grads + p->loffset, p->lnumel * sizeof(float));
    }
    memset(m->dw_fresh, 0, (size_t)m->c.n_layers);
    m->head_fresh = 0;
}

void model_free(Model *m) {
    const Backend *be = m->be;
    for (int k = 0; k < m->nchunks; k++) {
        for (int i = 0; i < m->nslots[k]; i++) slot_free(m, &m->slots[k][i], k);
        free(m->slots[k]);
    }
    void *bufs[] = {m->params, m->grads, m->dres,  m->moe_out, m->dxn,  m->dq,      m->dk,
                    m->dv,     m->datt,  m->dq2,   m->dk2,     m->ones, m->qk_sums, m->att_rc,
                    m->lse_rc, m->rc.h1, m->rc.h3, m->rc.act,  m->ddrop};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(bufs[i]);
    moe_scratch_free(&m->ms);
    free(m->losses_h);
    free(m->budget_h);
    free(m->expert_counts);
    free(m->kv_seen);
    free(m->scope_counts);
    free(m->scope_tokens);
    free(m->hf_fe);
    free(m->moe_overlap);
    free(m->ampipe);
    free(m->moe_time);
    free(m->moe_mode);
    free(m->zr_off);
    free(m->zr_n);
    free(m->dw_fresh);
    params_free(&m->t);
    memset(m, 0, sizeof *m);
}

// The piece of the rows [r, r1) of the (b, t) order that one attention call covers: nb whole
// sequences from b (t = 0, te = T), or the query rows [t, te) of sequence b.
static void row_piece(int T, int r, int r1, int *b, int *t, int *nb, int *te) {
    *b = r / T;
    *t = r % T;
    *nb = 1;
    *te = T;
    if (*t == 0 && r1 - r >= T) *nb = (r1 - r) / T;
    else *te = *t + (r1 - r) < T ? *t + (r1 - r) : T;
}

// Attention forward for the rows [r0, r1) of the (b, t) order: one call per run of whole sequences,
// one per piece of a sequence (query rows [t, te) of sequence b). With attention dropout (a seed and the
// config's attention_dropout): layer l's mask (site 2) over global tokens and global heads.
#define HQ(p, i) hid_at(m->be, (p), (i)) // element i of a buffer in the hidden format (q, k, v, att)
static void attn_rows(const Model *m, LayerActs *a, int l, int T, int r0, int r1) {
    const ModelConfig *c = &m->c;
    int H = m->Hl, KV = m->KVl, hd = c->head_dim;
    size_t qs = (size_t)T * H * hd, ks = (size_t)T * KV * hd, ls = (size_t)H * T;
    uint64_t ds = c->attention_dropout > 0 ? slot_drop_seed(m) : 0;
    int64_t row0 = (int64_t)comm_rank(m->mesh.dp) * m->B * T;
    for (int r = r0, b, t, nb, te; r < r1; r += nb * (te - t)) {
        row_piece(T, r, r1, &b, &t, &nb, &te);
        if (ds)
            m->be->attention_drop_fwd(HQ(a->att, b * qs), a->lse + b * ls, HQ(a->q, b * qs), HQ(a->k, b * ks),
                                      HQ(a->v, b * ks), nb, T, H, KV, hd, t, te, c->attention_dropout,
                                      dropout_hash(ds, l, 2), row0 + (int64_t)b * T,
                                      comm_rank(m->mesh.tp) * H);
        else
            m->be->attention_fwd(HQ(a->att, b * qs), a->lse + b * ls, HQ(a->q, b * qs), HQ(a->k, b * ks),
                                 HQ(a->v, b * ks), nb, T, H, KV, hd, t, te);
    }
}

// The attention block's output rows [r0, r1) and the MoE's input, in two parts around the TP
// all-reduce of the row-parallel o_proj's partial sums (over the TP ranks' heads): oproj_rows starts
// it (nonblocking: returned in flight; else done; NULL without TP), resid_norm_rows finishes it and adds
// x_mid = res_in + that, xn2 = norm(x_mid). attn_out_rows: the two with a blocking all-reduce.
static CommReq *oproj_rows(Model *m, LayerActs *a, int l, int r0, int r1, int nonblocking) {
    const ModelConfig *c = &m->c;
    size_t d = c->d_model, qd = (size_t)m->Hl * c->head_dim, n = (size_t)(r1 - r0);
    model_oproj_fwd(m, l, a->x_mid + r0 * d, HQ(a->att, r0 * qd), (int)n);
    if (comm_size(m->mesh.tp) == 1) return NULL;
    if (nonblocking) return comm_dev_iallreduce(m->mesh.tp, a->x_mid + r0 * d, n * d, CT_F32);
    comm_dev_allreduce(m->mesh.tp, a->x_mid + r0 * d, n * d, CT_F32);
    return NULL;
}
static void resid_norm_rows(Model *m, LayerActs *a, int l, int r0, int r1, CommReq *ar) {
    const ModelConfig *c = &m->c;
    size_t d = c->d_model, n = (size_t)(r1 - r0);
    float *xm = a->x_mid + r0 * d;
    if (ar) comm_wait(ar);
    drop_rows(m, xm, l, 0, r0, r1);
    m->be->add_rmsnorm_fwd(xm, a->xn2 + r0 * d, a->rstd2 + r0, a->res_in + r0 * d,
                           P(m, m->params, PR_FFN_NORM, l, -1), (int)n, (int)d, c->norm_eps);
}
static void attn_out_rows(Model *m, LayerActs *a, int l, int r0, int r1) {
    resid_norm_rows(m, a, l, r0, r1, oproj_rows(m, a, l, r0, r1, 0));
}

// The block's output rows [r0, r1): out = x_mid + moe_out.
static void out_rows(const Model *m, const LayerActs *a, int l, float *out, int r0, int r1) {
    size_t d = m->c.d_model, n = (size_t)(r1 - r0);
    drop_rows(m, m->moe_out + r0 * d, l, 1, r0, r1);
    m->be->add(out + r0 * d, a->x_mid + r0 * d, m->moe_out + r0 * d, n * d);
}

// The capacity budgets of AMPipe's chunks (all routed): n = 1's drops. The micro-batch's tokens in
// global order are (DP rank, row); chunk j's rows on stage rank s = dp TP + tp are the tp-th slice of
// rows [R_j, R_j+1): segments ordered (dp, j, tp), each a run of consecutive tokens, so a prefix of
// the global order meets each segment in a prefix of it. router_budget over the segments gives
// each of mine its kept count; budget: (n, k, E).
static void chunk_budgets(const Model *m, LayerActs *a, int n, int64_t *budget) {
    const ModelConfig *c = &m->c;
    int E = c->n_experts, k = c->top_k, TP = comm_size(m->mesh.tp), S = comm_size(a->mc[0].cm.stage);
    int me = comm_rank(a->mc[0].cm.stage), DP = S / TP, Sg = S * n;
    size_t ke = (size_t)k * E;
    int64_t *per = m->budget_h + AMPIPE_MAX * ke, *all = per + S * ke, Ng = 0;
    for (int j = 0; j < n; j++) {
        moe_slot_counts(&a->mc[j], per);
        Ng += a->mc[j].Ng;
        for (int dp = 0; dp < DP; dp++)
            for (int tp = 0; tp < TP; tp++)
                memcpy(all + ((size_t)(dp * n + j) * TP + tp) * ke, per + (size_t)(dp * TP + tp) * ke,
                       sizeof(int64_t) * ke);
    }
    int64_t cap = capacity_for(c, Ng);
    for (int j = 0; j < n; j++)
        router_budget(all, Sg, ((me / TP) * n + j) * TP + me % TP, E, k, cap, budget + (size_t)j * ke);
}

// One block forward over the micro-batch (B, T): attention from the normed input, then the MoE; in n
// AMPipe chunks when n > 1 (model.h), chunk j's exchange in flight during chunk j+1's attention.
static void layer_forward(Model *m, int l, float *out, int B, int T, int n, uint64_t seed) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    LayerActs *a = &m->la[l];
    int N = B * T, d = c->d_model, H = m->Hl, KV = m->KVl, hd = c->head_dim;
    int64_t row0 = (int64_t)comm_rank(m->mesh.dp) * N;
    be->rmsnorm_fwd_hid(a->xn1, a->rstd1, a->res_in, P(m, m->params, PR_ATTN_NORM, l, -1), N, d, c->norm_eps);
    // q, k, v in float32 (the backward's dq, dk, dv, free until then), then rounded into the layer's: q and k
    // by RoPE out of place, v as it is
    float *q32 = m->dq, *k32 = m->dk, *v32 = m->dv;
    float *qp = c->qk_norm ? a->qraw : q32, *kp = c->qk_norm ? a->kraw : k32;
    model_qkv_fwd(m, l, qp, kp, v32, a->xn1, N);
    if (c->qk_norm) model_qk_norm_fwd(m, l, q32, k32, a->rstdq, a->rstdk, a->qraw, a->kraw, N);
    be->rope_fwd_hid(a->q, q32, B, T, H, hd, c->rope_theta);
    be->rope_fwd_hid(a->k, k32, B, T, KV, hd, c->rope_theta);
    be->to_hid(a->v, v32, (size_t)N * KV * hd);
    MoeWeights w;
    layer_weights(m, m->params, l, &w);
    double t0 = moe_clock(m); // (with moe_timing: the block from attention on)
    a->nrun = n;
    if (n == 1) {
        attn_rows(m, a, l, T, 0, N);
        attn_out_rows(m, a, l, 0, N);
        a->moe.overlap = m->moe_overlap[l];
        a->moe.mode = m->moe_mode[l];
        a->moe.seq_len = T;
        moe_forward(&a->moe, m->moe_out, a->xn2, N, &w, c, seed, row0);
        out_rows(m, a, l, out, 0, N);
        if (m->moe_timing) m->moe_time[l] += moe_clock(m) - t0;
        return;
    }
    CHECK(a->nmc == n, "layer %d: %d AMPipe chunk states for %d chunks", l, a->nmc, n);
    MoeLayer *mc = a->mc, *part[AMPIPE_MAX];
    int R[AMPIPE_MAX + 1] = {0};
    chunk_rows(N, n, R);
    for (int j = 0; j < n; j++) {
        part[j] = &mc[j];
        mc[j].overlap = m->moe_overlap[l];
        mc[j].mode = m->moe_mode[l];
        mc[j].early_dispatch = 1;
        mc[j].chunk_part = 1;
        mc[j].seq_len = T;
    }
    int cap = c->dispatch == DISPATCH_CAPACITY;
    int64_t *budget = cap ? m->budget_h : NULL;
    attn_rows(m, a, l, T, R[0], R[1]);
    CommReq *ar = oproj_rows(m, a, l, R[0], R[1], 1);
    for (int j = 0; j < n; j++) {
        // chunk j's TP all-reduce (and, dropless, chunk j-1's dispatch) in flight during chunk j+1's
        // attention
        if (j + 1 < n) attn_rows(m, a, l, T, R[j + 1], R[j + 2]);
        resid_norm_rows(m, a, l, R[j], R[j + 1], ar);
        moe_route(&mc[j], a->xn2 + (size_t)R[j] * d, R[j + 1] - R[j], &w, c, seed, row0 + R[j]);
        if (!cap) {
            moe_start(&mc[j], &w, c, NULL);
            if (j > 0) {
                moe_finish(&mc[j - 1], m->moe_out + (size_t)R[j - 1] * d, &w);
                out_rows(m, a, l, out, R[j - 1], R[j]);
            }
        }
        if (j + 1 < n) ar = oproj_rows(m, a, l, R[j + 1], R[j + 2], 1);
    }
    if (cap) { // every chunk routed: the whole micro-batch's budgets, then the exchanges pipelined
        chunk_budgets(m, a, n, budget);
        size_t ke = (size_t)c->top_k * c->n_experts;
        moe_start(&mc[0], &w, c, budget);
        for (int j = 0; j < n; j++) {
            if (j + 1 < n) moe_start(&mc[j + 1], &w, c, budget + (j + 1) * ke);
            moe_finish(&mc[j], m->moe_out + (size_t)R[j] * d, &w);
            out_rows(m, a, l, out, R[j], R[j + 1]);
        }
    } else {
        moe_finish(&mc[n - 1], m->moe_out + (size_t)R[n - 1] * d, &w);
        out_rows(m, a, l, out, R[n - 1], N);
    }
    moe_stats_merge(part, n, &a->moe);
    a->moe.dropped = 0;
    for (int j = 0; j < n; j++) a->moe.dropped += mc[j].dropped;
    if (m->moe_timing) m->moe_time[l] += moe_clock(m) - t0;
}

double model_forward(Model *m, const int32_t *tokens, const int32_t *targets, int B, int T, float dloss,
                     uint64_t noise_seed) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    const ModelChunk *ch = &m->chunk[m->cur];
    CHECK(B >= 1 && T >= 1 && B * T <= m->maxN && T <= m->maxT, "model_forward: batch %dx%d exceeds %dx%d", B,
          T, m->maxB, m->maxT);
    int N = B * T, d = c->d_model, V = c->vocab_size, E = c->n_experts;
    m->B = m->slots[m->cur][m->cur_slot].B = B;
    m->T = m->slots[m->cur][m->cur_slot].T = T;
    m->slots[m->cur][m->cur_slot].drop_seed = m->dropout > 0 || c->attention_dropout > 0 ? m->drop_seed : 0;
    if (ch->first) {
        for (int i = 0; i < N; i++)
            CHECK(tokens[i] >= 0 && tokens[i] < V, "token %d at position %d is outside the vocabulary (%d)",
                  tokens[i], i, V);
        be->to_device(m->tokens, tokens, (size_t)N * sizeof(int32_t));
        be->embedding_fwd(m->la[0].res_in, m->tokens, P(m, m->params, PR_EMBED, -1, -1), N, d);
        m->aux = m->z = 0;
        m->dropped = 0;
        memset(m->hf_fe, 0, sizeof(double) * E * 2);
    }
    for (int l = ch->l0; l < ch->l1; l++) {
        LayerActs *a = &m->la[l];
        float *out = l + 1 < ch->l1 ? m->la[l + 1].res_in : m->res_final;
        int n = dloss != 0 ? m->ampipe[l] : 1;
        CHECK(n <= N, "--ampipe %d: a micro-batch of %d tokens has fewer rows than chunks", n, N);
        // the states a layer's forwards do not use lose their memory: whole-batch rows while chunked,
        // the chunks' states while not (--ampipe auto tries both)
        // (a change frees every MoE row in the layer's lent memory: its next rows are carved from the mark
        // again)
        if (n > 1 && a->nmc != n) {
            chunk_moes(m, a, n);
            moe_layer_trim(&a->moe);
            arena_reset(&a->arena);
        } else if (n > 1) {
            moe_layer_trim(&a->moe);
        } else if (a->nmc) {
            chunk_moes(m, a, 1);
            arena_reset(&a->arena);
        }
        layer_forward(m, l, out, B, T, n, noise_seed ? noise_seed * 1000003ull + (uint64_t)l : 0);
        m->aux += a->moe.aux / c->n_layers;
        m->z += a->moe.z / c->n_layers;
        m->dropped += a->moe.dropped;
        memcpy(m->expert_counts + (size_t)l * E, a->moe.counts, sizeof(int64_t) * E);
        // aux_form hf: the sums over layers, in layer order (carried from stage to stage)
        for (int e = 0; e < E; e++) {
            m->hf_fe[e] += a->moe.counts[e];
            m->hf_pe[e] += a->moe.psum[e];
        }
    }
    if (!ch->last) return 0;
    if (c->aux_form == AUX_HF) {
        // HF Mixtral: one loss over all layers' tokens, E * sum_i F_i * Pbar_i, F_i = all layers'
        // assignments to i / (L * Ng), Pbar_i = all layers' probability mass on i / (L * Ng);
        // its gradient on layer l's probs is E * F_i / (L * Ng): give every layer f_i = F_i (this
        // chunk's here; earlier chunks' in their backward, from hf_fe)
        double LN = (double)c->n_layers * m->la[ch->l0].moe.Ng, a = 0;
        for (int e = 0; e < E; e++) {
            double fe = m->hf_fe[e] / LN, pe = m->hf_pe[e] / LN;
            a += fe * pe;
            m->hf_fe[e] = fe;
            for (int l = ch->l0; l < ch->l1; l++) m->la[l].moe.aux_f[e] = fe;
        }
        m->aux = E * a;
    }
    be->rmsnorm_fwd(m->xn_f, m->rstd_f, m->res_final, P(m, m->params, PR_FINAL_NORM, -1, -1), N, d,
                    c->norm_eps);
    be->matmul_fwd(m->logits, m->xn_f, P(m, m->params, PR_LM_HEAD, -1, -1), N, d, V, 0);
    if (!targets) return 0;
    for (int i = 0; i < N; i++)
        CHECK(targets[i] >= 0 && targets[i] < V, "target %d at position %d is outside the vocabulary (%d)",
              targets[i], i, V);
    be->to_device(m->targets, targets, (size_t)N * sizeof(int32_t));
    if (dloss != 0) be->cross_entropy_fwd_bwd(m->losses, m->logits, m->targets, N, V, dloss);
    else be->cross_entropy_fwd(m->losses, m->logits, m->targets, N, V);
    float *lh = m->losses_h;
    be->to_host(lh, m->losses, (size_t)N * F);
    double s = 0;
    for (int i = 0; i < N; i++) s += lh[i];
    return s / N;
}

// The backward of the rows [r0, r1) between the MoE and attention: the FFN norm (into dres: the
// gradient of x_mid) and o_proj (datt), from m->dxn (the MoE input's gradient) and m->dres.
static void block_mid_bwd(Model *m, LayerActs *a, int l, int r0, int r1) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    float *g = m->grads;
    size_t d = c->d_model, qd = (size_t)m->Hl * c->head_dim, n = (size_t)(r1 - r0);
    be->rmsnorm_bwd(m->dres + r0 * d, P(m, g, PR_FFN_NORM, l, -1), m->dxn + r0 * d, a->x_mid + r0 * d,
                    P(m, m->params, PR_FFN_NORM, l, -1), a->rstd2 + r0, (int)n, (int)d);
    float *dwo = P(m, g, PR_WO, l, -1), *wo = P(m, m->params, PR_WO, l, -1);
    const float *dout = dropped_rows(m, l, 0, r0, r1);
    int O = (int)d;
    be->matmul_bwd_multi(
        1, m->datt + r0 * qd, &dwo, &dout, HQ(a->att, r0 * qd), (const float *const *)&wo, (int)n, (int)qd,
        &O, dw_write(m, l, DW_FRESH_O)); // (datt's rows [r0, r1) written; dw_o written by the first call)
}

// Attention backward for the query rows [r0, r1) of the (b, t) order (pieces as attn_rows): dq of
// those rows (written: each query row is in one piece), dk/dv of the keys they read: written by the first
// piece of a sequence this layer's backward meets (seen[b] 0; the pieces come in reverse row order, so
// that one holds the sequence's last rows and reads all of its keys), added into by the later ones.
static void attn_bwd_rows(Model *m, LayerActs *a, int l, int T, int r0, int r1) {
    uint8_t *seen = m->kv_seen;
    const ModelConfig *c = &m->c;
    int H = m->Hl, KV = m->KVl, hd = c->head_dim;
    size_t qs = (size_t)T * H * hd, ks = (size_t)T * KV * hd, ls = (size_t)H * T;
    uint64_t ds = c->attention_dropout > 0 ? slot_drop_seed(m) : 0; // (the forward's mask: attn_rows)
    int64_t row0 = (int64_t)comm_rank(m->mesh.dp) * m->B * T;
    for (int r = r0, b, t, nb, te; r < r1; r += nb * (te - t)) {
        row_piece(T, r, r1, &b, &t, &nb, &te);
        int fl = seen[b] ? ATT_ADD_DKV : 0; // (a piece of several sequences holds them whole: none seen)
        memset(seen + b, 1, (size_t)nb);
        if (ds)
            m->be->attention_drop_bwd(m->dq + b * qs, m->dk + b * ks, m->dv + b * ks, m->datt + b * qs,
                                      HQ(a->att, b * qs), a->lse + b * ls, HQ(a->q, b * qs), HQ(a->k, b * ks),
                                      HQ(a->v, b * ks), nb, T, H, KV, hd, t, te, c->attention_dropout,
                                      dropout_hash(ds, l, 2), row0 + (int64_t)b * T,
                                      comm_rank(m->mesh.tp) * H, fl);
        else
            m->be->attention_bwd(m->dq + b * qs, m->dk + b * ks, m->dv + b * ks, m->datt + b * qs,
                                 HQ(a->att, b * qs), a->lse + b * ls, HQ(a->q, b * qs), HQ(a->k, b * ks),
                                 HQ(a->v, b * ks), nb, T, H, KV, hd, t, te, fl);
    }
}

void model_backward(Model *m, float aux_scale, float z_scale) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    int B = m->B, T = m->T, N = B * T, d = c->d_model, H = m->Hl, KV = m->KVl, hd = c->head_dim;
    int V = c->vocab_size, L = c->n_layers;
    float *g = m->grads;
    const ModelChunk *ch = &m->chunk[m->cur];
    if (ch->last) {
        // LM head and final norm (m->logits holds dlogits)
        be->matmul_bwd(m->dxn, P(m, g, PR_LM_HEAD, -1, -1), m->logits, m->xn_f,
                       P(m, m->params, PR_LM_HEAD, -1, -1), N, d, V, dw_write(m, -1, DW_FRESH_HEAD));
        be->zero(m->dres, (size_t)N * d * F);
        be->rmsnorm_bwd(m->dres, P(m, g, PR_FINAL_NORM, -1, -1), m->dxn, m->res_final,
                        P(m, m->params, PR_FINAL_NORM, -1, -1), m->rstd_f, N, d);
        if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, L);
    } else if (c->aux_form == AUX_HF) {
        for (int l = ch->l0; l < ch->l1; l++)
            memcpy(m->la[l].moe.aux_f, m->hf_fe, sizeof(double) * c->n_experts);
    }
    for (int l = ch->l1 - 1; l >= ch->l0; l--) {
        LayerActs *a = &m->la[l];
        // MoE block: out = x_mid + moe(norm(x_mid)); with AMPipe chunks (the forward's MoE states
        // a->mc) chunk by chunk in reverse, each with its rows of the norm, o_proj and attention
        MoeWeights w;
        MoeGrads gw;
        layer_weights(m, m->params, l, &w);
        gw.router = P(m, g, PR_ROUTER, l, -1);
        gw.w1 = P(m, g, PR_W1, l, m->e0);
        gw.w3 = P(m, g, PR_W3, l, m->e0);
        gw.w2 = P(m, g, PR_W2, l, m->e0);
        gw.sh_w1 = w.sh_w1 ? P(m, g, PR_SH_W1, l, -1) : NULL;
        gw.sh_w3 = w.sh_w1 ? P(m, g, PR_SH_W3, l, -1) : NULL;
        gw.sh_w2 = w.sh_w1 ? P(m, g, PR_SH_W2, l, -1) : NULL;
        gw.sh_gate = w.sh_gate ? P(m, g, PR_SH_GATE, l, -1) : NULL;
        gw.fresh =
            m->dw_fresh ? m->dw_fresh[l] & DW_FRESH_EXPERTS : 0; // (moe clears it at its first expert write)
        gw.packed = m->expert_gbf == OPTG_PACKED;
        int n = a->nrun;
        // --recompute attn: the attention output and lse again (row for row the forward's bits, chunked or
        // not)
        if (a->att_shared)
            attn_rows(m, a, l, T, 0, N); // (with attention dropout: the slot's seed, the same mask)
        memset(m->kv_seen, 0, (size_t)B); // dq, dk, dv: written by the attention backward (attn_bwd_rows)
        double t0 = moe_clock(m);
        if (n == 1) {
            // the MoE output's gradient through its dropout mask (dres itself without dropout); it writes dxn
            moe_backward(&a->moe, &m->ms, m->dxn, dropped_rows(m, l, 1, 0, N), a->xn2, &w, &gw, c,
                         aux_scale / L, z_scale / L);
            block_mid_bwd(m, a, l, 0, N);
        } else {
            // AMPipe, chunks in reverse: chunk j-1's dy travels while chunk j's attention backward runs
            CHECK(n <= AMPIPE_MAX && a->nmc == n, "layer %d: backward of %d chunks, %d states", l, n, a->nmc);
            int R[AMPIPE_MAX + 1] = {0};
            chunk_rows(N, n, R);
            for (int j = 0; j < n; j++) moe_loss_from(&a->mc[j], &a->moe);
            moe_backward_start(&a->mc[n - 1], &m->ms, dropped_rows(m, l, 1, R[n - 1], N));
            for (int j = n - 1; j >= 0; j--) {
                size_t r0 = R[j];
                moe_backward_finish(&a->mc[j], &m->ms, m->dxn + r0 * d, a->xn2 + r0 * d, &w, &gw, c,
                                    aux_scale / L, z_scale / L);
                block_mid_bwd(m, a, l, R[j], R[j + 1]);
                if (j > 0) moe_backward_start(&a->mc[j - 1], &m->ms, dropped_rows(m, l, 1, R[j - 1], R[j]));
                attn_bwd_rows(m, a, l, T, R[j], R[j + 1]);
            }
        }
        if (m->dw_fresh)
            m->dw_fresh[l] &= (uint8_t)~DW_FRESH_EXPERTS; // the layer's expert gradients are written now
        if (m->moe_timing) m->moe_time[l] += moe_clock(m) - t0;
        // attention block: x_mid = res_in + o(attn(rope(q), rope(k), v)) (n = 1: attention at once)
        if (n == 1) attn_bwd_rows(m, a, l, T, 0, N);
        be->rope_bwd(m->dq, B, T, H, hd, c->rope_theta);
        be->rope_bwd(m->dk, B, T, KV, hd, c->rope_theta);
        const float *dqp = m->dq, *dkp = m->dk;
        if (c->qk_norm) {
            qk_norm_bwd(m, a, l, N);
            dqp = m->dq2;
            dkp = m->dk2;
        }
        if (c->qkv_bias) qkv_bias_bwd(m, l, dqp, dkp, m->dv, N);
        { // the q, k, v projections' backward over one input (converted once), written into dxn
            const float *dout[3] = {dqp, dkp, m->dv};
            float *dw[3], *w[3];
            int O[3];
            qkv_tensors(m, g, l, dw, O);
            qkv_tensors(m, m->params, l, w, O);
            be->matmul_bwd_multi(3, m->dxn, dw, dout, a->xn1, (const float *const *)w, N, d, O,
                                 dw_write(m, l, DW_FRESH_QKV));
        }
        // column-parallel q/k/v: each TP rank holds part of dxn1
        if (comm_size(m->mesh.tp) > 1) comm_dev_allreduce(m->mesh.tp, m->dxn, (size_t)N * d, CT_F32);
        be->rmsnorm_bwd(m->dres, P(m, g, PR_ATTN_NORM, l, -1), m->dxn, a->res_in,
                        P(m, m->params, PR_ATTN_NORM, l, -1), a->rstd1, N, d);
        if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, l);
    }
    if (!ch->first) return;
    be->embedding_bwd(P(m, g, PR_EMBED, -1, -1), m->dres, m->tokens, N, d);
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, -1);
}

void model_scope_reset(Model *m) {
    memset(m->scope_counts, 0, sizeof(int64_t) * (size_t)m->c.n_layers * m->c.n_experts);
    memset(m->scope_tokens, 0, sizeof(int64_t) * (size_t)m->c.n_layers);
}

void model_logits_row(const Model *m, int b, int t, float *out) {
    size_t V = m->c.vocab_size;
    m->be->to_host(out, m->logits + ((size_t)b * m->T + t) * V, V * F);
}
