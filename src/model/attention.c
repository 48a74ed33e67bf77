// attention.c — the attention variants (attention.h) and what they share (the attention op over rows, the
// recompute of its output, the memory's release); grouped-query attention (GQA; MHA where KV = H) here,
// latent attention in mla.c. GQA: this rank's heads of a TP split: norm output -> q, k, v (column-parallel
// projections, then the families' biases, then QK-norm) -> RoPE -> the backend's attention op (with attention
// dropout, site 2) -> o_proj (row-parallel: partial sums), and its hand-written backward; its activations and
// scratch, and the recompute of its output and log-sum-exp (--recompute attn). Must not hold: the block's
// norms, residuals and their dropout, the TP all-reduces of o_proj's output and of the input gradient
// (block.c), the MoE, the KV cache (decode.c).
#include "model/attention.h"
#include <string.h>
#include "core/common.h"
#include "model/model_access.h"

#define F sizeof(float)
#define HQ(p, i) hid_at(m->be, (p), (i)) // element i of a buffer in the hidden format (q, k, v, att)

// ---- the q/k/v projections and the families' options around them (config.h): biases, then QK-norm, then
// RoPE
// The biases: q += 1 bias^T as a GEMM with K = 1 over the ones vector (every backend has it).
static void qkv_bias_fwd(Model *m, int l, float *q, float *k, float *v, int N) {
    int qd = m->Hl * m->c.head_dim, kvd = m->KVl * m->c.head_dim;
    const float *one = m->attn.ones;
    m->be->matmul_fwd(q, one, model_param(m, m->params, PR_BQ, l, -1), N, 1, qd, 1);
    m->be->matmul_fwd(k, one, model_param(m, m->params, PR_BK, l, -1), N, 1, kvd, 1);
    m->be->matmul_fwd(v, one, model_param(m, m->params, PR_BV, l, -1), N, 1, kvd, 1);
}
static void qkv_bias_bwd(Model *m, int l, const float *dq, const float *dk, const float *dv, int N) {
    int qd = m->Hl * m->c.head_dim, kvd = m->KVl * m->c.head_dim, O[3] = {qd, kvd, kvd};
    const float *dout[3] = {dq, dk, dv};
    ParamRole rb[3] = {PR_BQ, PR_BK, PR_BV};
    for (int i = 0; i < 3; i++)
        m->be->matmul_bwd(NULL, model_param(m, m->grads, rb[i], l, -1), dout[i], m->attn.ones,
                          model_param(m, m->params, rb[i], l, -1), N, 1, O[i], 0);
}
// The q, k, v projections of layer l as the multi-product ops take them: the tensors at base (the
// weights or their gradients) and their widths (this rank's heads).
static void qkv_tensors(const Model *m, float *base, int l, float *t[3], int O[3]) {
    t[0] = model_param(m, base, PR_WQ, l, -1);
    t[1] = model_param(m, base, PR_WK, l, -1);
    t[2] = model_param(m, base, PR_WV, l, -1);
    O[0] = m->Hl * m->c.head_dim;
    O[1] = O[2] = m->KVl * m->c.head_dim;
}

void gqa_qkv_fwd(Model *m, int l, float *q, float *k, float *v, const void *xn, int n, int flags) {
    float *out[3] = {q, k, v}, *w[3];
    int O[3];
    qkv_tensors(m, m->params, l, w, O);
    m->be->matmul_fwd_multi(3, out, xn, (const float *const *)w, n, m->c.d_model, O, flags);
    if (m->c.qkv_bias) qkv_bias_fwd(m, l, q, k, v, n);
}

void gqa_oproj_fwd(Model *m, int l, float *out, const void *att, int n) {
    float *wo = model_param(m, m->params, PR_WO, l, -1);
    int O = m->c.d_model;
    m->be->matmul_fwd_multi(1, &out, att, (const float *const *)&wo, n, m->Hl * m->c.head_dim, &O, 0);
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

void gqa_qk_norm_fwd(Model *m, int l, float *q, float *k, float *rstdq, float *rstdk, const float *qraw,
                     const float *kraw, int N) {
    const Backend *be = m->be;
    const float *wq = model_param(m, m->params, PR_QNORM, l, -1),
                *wk = model_param(m, m->params, PR_KNORM, l, -1);
    double *sums = m->attn.qk_sums;
    float eps = m->c.norm_eps;
    int r, C;
    if (qk_split(m)) {
        int hd = m->c.head_dim, Cq = m->Hl * hd, Ck = m->KVl * hd;
        be->rmsnorm_part(sums, qraw, NULL, qraw, N, Cq);
        be->rmsnorm_part(sums + N, kraw, NULL, kraw, N, Ck);
        comm_dev_allreduce(m->mesh.tp, sums, (size_t)2 * N, CT_F64);
        be->rmsnorm_fwd_part(q, rstdq, qraw, wq, sums, N, Cq, m->c.n_heads * hd, eps);
        be->rmsnorm_fwd_part(k, rstdk, kraw, wk, sums + N, N, Ck, m->c.n_kv_heads * hd, eps);
        return;
    }
    qk_rows(m, N, m->Hl, &r, &C);
    be->rmsnorm_fwd(q, rstdq, qraw, wq, r, C, eps);
    qk_rows(m, N, m->KVl, &r, &C);
    be->rmsnorm_fwd(k, rstdk, kraw, wk, r, C, eps);
}
// dq, dk (after RoPE's backward) -> dq2, dk2 (before the norms); the norm weights' gradients.
static void qk_norm_bwd(Model *m, const AttnActs *a, int l, int N) {
    const Backend *be = m->be;
    AttnScratch *s = &m->attn;
    float *gq = model_param(m, m->grads, PR_QNORM, l, -1), *gk = model_param(m, m->grads, PR_KNORM, l, -1);
    const float *wq = model_param(m, m->params, PR_QNORM, l, -1),
                *wk = model_param(m, m->params, PR_KNORM, l, -1);
    int r, C;
    qk_rows(m, N, m->Hl, &r, &C);
    be->zero(s->dq2, (size_t)r * C * F);
    int Ck = m->KVl * m->c.head_dim;
    if (qk_split(m)) { // (full rows: r = N, C = Hl*hd)
        be->zero(s->dk2, (size_t)N * Ck * F);
        be->rmsnorm_part(s->qk_sums, s->dq, wq, a->qraw, N, C);
        be->rmsnorm_part(s->qk_sums + N, s->dk, wk, a->kraw, N, Ck);
        comm_dev_allreduce(m->mesh.tp, s->qk_sums, (size_t)2 * N, CT_F64);
        be->rmsnorm_bwd_part(s->dq2, gq, s->dq, a->qraw, wq, a->rstdq, s->qk_sums, N, C,
                             m->c.n_heads * m->c.head_dim);
        be->rmsnorm_bwd_part(s->dk2, gk, s->dk, a->kraw, wk, a->rstdk, s->qk_sums + N, N, Ck,
                             m->c.n_kv_heads * m->c.head_dim);
        return;
    }
    be->rmsnorm_bwd(s->dq2, gq, s->dq, a->qraw, wq, a->rstdq, r, C);
    qk_rows(m, N, m->KVl, &r, &C);
    be->zero(s->dk2, (size_t)r * C * F);
    be->rmsnorm_bwd(s->dk2, gk, s->dk, a->kraw, wk, a->rstdk, r, C);
}

// ---- the attention op over rows of the (b, t) order
// The piece of the rows [r, r1) that one attention call covers: nb whole sequences from b (t = 0,
// te = T), or the query rows [t, te) of sequence b.
static void row_piece(int T, int r, int r1, int *b, int *t, int *nb, int *te) {
    *b = r / T;
    *t = r % T;
    *nb = 1;
    *te = T;
    if (*t == 0 && r1 - r >= T) *nb = (r1 - r) / T;
    else *te = *t + (r1 - r) < T ? *t + (r1 - r) : T;
}

// Attention forward for the rows [r0, r1): one call per run of whole sequences, one per piece of a
// sequence (query rows [t, te) of sequence b). With attention dropout (a seed and the config's
// attention_dropout): layer l's mask (site 2) over global tokens and global heads.
void attn_op_rows(const Model *m, int l, AttnActs *a, int T, int r0, int r1) {
    const ModelConfig *c = &m->c;
    int H, KV, hd, hv = attn_op_hv(m);
    attn_op_shape(m, &H, &KV, &hd);
    size_t qs = (size_t)T * H * hd, ks = (size_t)T * KV * hd, ls = (size_t)H * T;
    uint64_t ds = c->attention_dropout > 0 ? model_drop_seed(m) : 0;
    int64_t row0 = (int64_t)comm_rank(m->mesh.dp) * m->B * T;
    for (int r = r0, b, t, nb, te; r < r1; r += nb * (te - t)) {
        row_piece(T, r, r1, &b, &t, &nb, &te);
        if (ds)
            m->be->attention_drop_fwd(HQ(a->att, b * qs), a->lse + b * ls, HQ(a->q, b * qs), HQ(a->k, b * ks),
                                      HQ(a->v, b * ks), nb, T, H, KV, hd, t, te, c->attention_dropout,
                                      dropout_hash(ds, l, 2), row0 + (int64_t)b * T,
                                      comm_rank(m->mesh.tp) * H);
        else if (hv < hd && m->be->attention_fwd_v)
            m->be->attention_fwd_v(HQ(a->att, b * qs), a->lse + b * ls, HQ(a->q, b * qs), HQ(a->k, b * ks),
                                   HQ(a->v, b * ks), nb, T, H, KV, hd, hv, t, te);
        else
            m->be->attention_fwd(HQ(a->att, b * qs), a->lse + b * ls, HQ(a->q, b * qs), HQ(a->k, b * ks),
                                 HQ(a->v, b * ks), nb, T, H, KV, hd, t, te);
    }
}

// Attention backward for the query rows [r0, r1) (pieces as attn_op_rows): dq of those rows (written: each
// query row is in one piece), dk/dv of the keys they read: written by the first piece of a sequence this
// layer's backward meets (kv_seen[b] 0; the pieces come in reverse row order, so that one holds the
// sequence's last rows and reads all of its keys), added into by the later ones.
void attn_op_bwd_rows(Model *m, int l, const AttnActs *a, int T, int r0, int r1) {
    AttnScratch *s = &m->attn;
    uint8_t *seen = s->kv_seen;
    const ModelConfig *c = &m->c;
    int H, KV, hd, hv = attn_op_hv(m);
    attn_op_shape(m, &H, &KV, &hd);
    size_t qs = (size_t)T * H * hd, ks = (size_t)T * KV * hd, ls = (size_t)H * T;
    uint64_t ds = c->attention_dropout > 0 ? model_drop_seed(m) : 0; // (the forward's mask: attn_op_rows)
    int64_t row0 = (int64_t)comm_rank(m->mesh.dp) * m->B * T;
    for (int r = r0, b, t, nb, te; r < r1; r += nb * (te - t)) {
        row_piece(T, r, r1, &b, &t, &nb, &te);
        int fl = seen[b] ? ATT_ADD_DKV : 0; // (a piece of several sequences holds them whole: none seen)
        memset(seen + b, 1, (size_t)nb);
        if (ds)
            m->be->attention_drop_bwd(s->dq + b * qs, s->dk + b * ks, s->dv + b * ks, s->datt + b * qs,
                                      HQ(a->att, b * qs), a->lse + b * ls, HQ(a->q, b * qs), HQ(a->k, b * ks),
                                      HQ(a->v, b * ks), nb, T, H, KV, hd, t, te, c->attention_dropout,
                                      dropout_hash(ds, l, 2), row0 + (int64_t)b * T,
                                      comm_rank(m->mesh.tp) * H, fl);
        else if (hv < hd && m->be->attention_bwd_v)
            m->be->attention_bwd_v(s->dq + b * qs, s->dk + b * ks, s->dv + b * ks, s->datt + b * qs,
                                   HQ(a->att, b * qs), a->lse + b * ls, HQ(a->q, b * qs), HQ(a->k, b * ks),
                                   HQ(a->v, b * ks), nb, T, H, KV, hd, hv, t, te, fl);
        else
            m->be->attention_bwd(s->dq + b * qs, s->dk + b * ks, s->dv + b * ks, s->datt + b * qs,
                                 HQ(a->att, b * qs), a->lse + b * ls, HQ(a->q, b * qs), HQ(a->k, b * ks),
                                 HQ(a->v, b * ks), nb, T, H, KV, hd, t, te, fl);
    }
}

// ---- GQA's forward and backward (attention.h AttnVariant)
int gqa_qkv_hid(const ModelConfig *c, int qd, int kvd, int fp8_dense) {
    return !c->qk_norm && !c->qkv_bias && !fp8_dense && qd > MOE_GEMM_FP32_MAX_O && kvd > MOE_GEMM_FP32_MAX_O;
}
static int qkv_hid(const Model *m) {
    return gqa_qkv_hid(&m->c, m->Hl * m->c.head_dim, m->KVl * m->c.head_dim, m->be->fp8_dense);
}

// With qkv_hid, the products straight into the layer's q, k, v in the hidden format (GM_OUT_HID), RoPE on q
// and k in place: q and k rounded twice, after the product and after the rotation, as a bf16 trainer's are
// (docs/PRECISION.md; one rounding where the format is float32). Else in float32 (the backward's dq, dk, dv,
// free until then), then rounded once into the layer's: q and k by RoPE out of place, v as it is.
static void gqa_fwd_in(Model *m, int l, AttnActs *a, const void *xn, int B, int T) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    int N = B * T, H = m->Hl, KV = m->KVl, hd = c->head_dim;
    if (qkv_hid(m)) {
        gqa_qkv_fwd(m, l, a->q, a->k, a->v, xn, N, GM_OUT_HID);
        be->rope_fwd_hid(a->q, a->q, 1, B, T, H, hd, c->rope_theta);
        be->rope_fwd_hid(a->k, a->k, 1, B, T, KV, hd, c->rope_theta);
        return;
    }
    float *q32 = m->attn.dq, *k32 = m->attn.dk, *v32 = m->attn.dv;
    float *qp = c->qk_norm ? a->qraw : q32, *kp = c->qk_norm ? a->kraw : k32;
    gqa_qkv_fwd(m, l, qp, kp, v32, xn, N, 0);
    if (c->qk_norm) gqa_qk_norm_fwd(m, l, q32, k32, a->rstdq, a->rstdk, a->qraw, a->kraw, N);
    be->rope_fwd_hid(a->q, q32, 0, B, T, H, hd, c->rope_theta);
    be->rope_fwd_hid(a->k, k32, 0, B, T, KV, hd, c->rope_theta);
    be->to_hid(a->v, v32, (size_t)N * KV * hd);
}

static void gqa_out_rows(Model *m, int l, const AttnActs *a, float *out, int r0, int r1) {
    size_t qd = (size_t)m->Hl * m->c.head_dim;
    gqa_oproj_fwd(m, l, out, HQ(a->att, r0 * qd), r1 - r0);
}

// (attention.h) --recompute attn: the attention output and lse again (row for row the forward's bits, chunked
// or not; with attention dropout: the slot's seed, the same mask); dq, dk, dv: written by the attention
// backward.
void attn_bwd_begin(Model *m, int l, AttnActs *a, int B, int T) {
    if (a->shared) attn_op_rows(m, l, a, T, 0, B * T);
    memset(m->attn.kv_seen, 0, (size_t)B);
}

// o_proj's backward over the rows [r0, r1): datt's rows written, dw_o written by the step's first call.
static void gqa_bwd_out_rows(Model *m, int l, const AttnActs *a, const float *dout, int r0, int r1) {
    size_t qd = (size_t)m->Hl * m->c.head_dim;
    float *dwo = model_param(m, m->grads, PR_WO, l, -1), *wo = model_param(m, m->params, PR_WO, l, -1);
    int O = m->c.d_model;
    m->be->matmul_bwd_multi(1, m->attn.datt + r0 * qd, &dwo, &dout, HQ(a->att, r0 * qd),
                            (const float *const *)&wo, r1 - r0, (int)qd, &O,
                            model_dw_write(m, l, DW_FRESH_O));
}

// RoPE's, QK-norm's and the biases' backward, then the q, k, v projections' over one input (converted
// once), written into dxn. With qkv_hid, RoPE's backward writes dq and dk in the hidden format in place and
// dv is rounded so (ops.h rope_bwd_hid, to_hid_rows; GM_DOUT_HID): the same bits, one pass over dq and dk
// less.
static void gqa_bwd_in(Model *m, int l, const AttnActs *a, float *dxn, const void *xn, int B, int T) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    AttnScratch *s = &m->attn;
    int N = B * T, kvd = m->KVl * c->head_dim;
    int hid = qkv_hid(m);
    const float *dqp = s->dq, *dkp = s->dk;
    if (hid) {
        be->rope_bwd_hid(s->dq, B, T, m->Hl, c->head_dim, c->rope_theta);
        be->rope_bwd_hid(s->dk, B, T, m->KVl, c->head_dim, c->rope_theta);
        be->to_hid_rows(s->dv, N, kvd);
    } else {
        be->rope_bwd(s->dq, B, T, m->Hl, c->head_dim, c->rope_theta);
        be->rope_bwd(s->dk, B, T, m->KVl, c->head_dim, c->rope_theta);
        if (c->qk_norm) {
            qk_norm_bwd(m, a, l, N);
            dqp = s->dq2;
            dkp = s->dk2;
        }
        if (c->qkv_bias) qkv_bias_bwd(m, l, dqp, dkp, s->dv, N);
    }
    const float *dout[3] = {dqp, dkp, s->dv};
    float *dw[3], *w[3];
    int O[3];
    qkv_tensors(m, m->grads, l, dw, O);
    qkv_tensors(m, m->params, l, w, O);
    be->matmul_bwd_multi(3, dxn, dw, dout, xn, (const float *const *)w, N, c->d_model, O,
                         model_dw_write(m, l, DW_FRESH_QKV) | (hid ? GM_DOUT_HID : 0));
}

// ---- GQA's memory
static void gqa_scratch_init(Model *m) {
    const Backend *be = m->be;
    AttnScratch *s = &m->attn;
    size_t N = m->maxN, qd = (size_t)m->Hl * m->c.head_dim, kvd = (size_t)m->KVl * m->c.head_dim;
    s->dq = be->alloc(N * qd * F);
    s->dk = be->alloc(N * kvd * F);
    s->dv = be->alloc(N * kvd * F);
    s->datt = be->alloc(N * qd * F);
    if (m->c.qk_norm) {
        s->dq2 = be->alloc(N * qd * F);
        s->dk2 = be->alloc(N * kvd * F);
    }
    if (qk_split(m)) s->qk_sums = be->alloc(2 * N * sizeof(double));
    if (m->c.qkv_bias) {
        float *one = xmalloc(N * F);
        for (size_t i = 0; i < N; i++) one[i] = 1.0f;
        s->ones = be->alloc(N * F);
        be->to_device(s->ones, one, N * F);
        free(one);
    }
    s->kv_seen = xcalloc((size_t)m->maxB, 1);
}

void attn_scratch_free(Model *m) {
    AttnScratch *s = &m->attn;
    void *bufs[] = {s->dq,     s->dk,  s->dv, s->datt, s->dq2, s->dk2,   s->ones, s->qk_sums, s->att_rc,
                    s->lse_rc, s->kvb, s->kr, s->dqan, s->dqa, s->dckvn, s->dckv, s->dao};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) m->be->free(bufs[i]);
    free(s->kv_seen);
    memset(s, 0, sizeof *s);
}

// q, k, v; the attention output and lse unless --recompute attn drops them (acts_recompute points them at
// the shared ones); QK-norm's q, k before their norms and rstd.
static void gqa_acts_alloc(const Model *m, AttnActs *a, Arena *A, int rc) {
    const Backend *be = m->be;
    size_t N = m->maxN, qd = (size_t)m->Hl * m->c.head_dim, kvd = (size_t)m->KVl * m->c.head_dim;
    a->q = arena_alloc(A, be, N * qd * hid_size(be));
    a->k = arena_alloc(A, be, N * kvd * hid_size(be));
    a->v = arena_alloc(A, be, N * kvd * hid_size(be));
    if (!(rc & RECOMPUTE_ATTN)) {
        a->att = arena_alloc(A, be, N * qd * hid_size(be));
        a->lse = arena_alloc(A, be, (size_t)m->maxB * m->Hl * m->maxT * F);
    }
    if (m->c.qk_norm) {
        a->qraw = arena_alloc(A, be, N * qd * F);
        a->kraw = arena_alloc(A, be, N * kvd * F);
        a->rstdq = arena_alloc(A, be, N * m->Hl * F);
        a->rstdk = arena_alloc(A, be, N * m->KVl * F);
    }
}

void attn_acts_recompute(Model *m, AttnActs *a, Arena *A, int rc) {
    const Backend *be = m->be;
    int attn = (rc & RECOMPUTE_ATTN) != 0, H, KV, hd;
    attn_op_shape(m, &H, &KV, &hd);
    if (attn && !m->attn.att_rc) {
        m->attn.att_rc = be->alloc((size_t)m->maxN * H * hd * hid_size(be));
        m->attn.lse_rc = be->alloc((size_t)m->maxB * m->Hl * m->maxT * F);
    }
    if (attn && !a->shared) {
        arena_free(A, be, a->att);
        arena_free(A, be, a->lse);
        a->att = m->attn.att_rc;
        a->lse = m->attn.lse_rc;
    } else if (!attn && a->shared) {
        a->att = arena_alloc(A, be, (size_t)m->maxN * H * hd * hid_size(be));
        a->lse = arena_alloc(A, be, (size_t)m->maxB * m->Hl * m->maxT * F);
    }
    a->shared = attn;
}

void attn_acts_free(const Model *m, AttnActs *a, const Arena *A) {
    if (a->shared) { // the model's (--recompute attn)
        a->att = NULL;
        a->lse = NULL;
    }
    void *bufs[] = {a->q,     a->k,  a->v,       a->att, a->lse,     a->qraw, a->kraw, a->rstdq,
                    a->rstdk, a->qa, a->rstd_qa, a->ckv, a->rstd_kv, a->qan,  a->ckvn, a->ao};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) arena_free(A, m->be, bufs[i]);
    memset(a, 0, sizeof *a);
}

static const AttnVariant attn_gqa = {
    gqa_scratch_init, attn_scratch_free, gqa_acts_alloc, attn_acts_recompute, attn_acts_free,   gqa_fwd_in,
    attn_op_rows,     gqa_out_rows,      attn_bwd_begin, gqa_bwd_out_rows,    attn_op_bwd_rows, gqa_bwd_in};

const AttnVariant *attn_variant(const ModelConfig *c) { return config_mla(c) ? &attn_mla : &attn_gqa; }
