// mla.c — multi-head latent attention (DeepSeek-V2/V3, transformers' DeepseekV3Attention), an attention
// variant (attention.h) composed of Backend ops, over this rank's heads of a TP split:
//   q = q_b(norm(q_a(xn))) (or q_proj(xn)), (N, Hl, hq) with hq = qk_nope + qk_rope: [q_nope | q_rope];
//   kv_a(xn) = [latent (kv_lora_rank) | k_rope (qk_rope)]: kv_b(norm(latent)) = (N, Hl, qk_nope + v):
//   [k_nope | v]; k_rope is one key shared by the heads;
//   RoPE (rotate_half's pairs or DeepSeek's interleaved ones; YaRN's frequencies and attention factor where
//   the config has them) on q_rope and k_rope; k = [k_nope | k_rope], v padded with zeros to hq; the
//   attention op (its scale 1/sqrt(hq); YaRN's mscale_all_dim^2 folded into q; told the values' width,
//   ops.h attention_fwd_v: attention.c); o_proj over the value columns of the output (N, Hl*v).
// The compressions (q_a, kv_a) and their norms are replicated over TP: each rank's weight gradient is its
// heads' part (reduced over the stage, params.c), as is its part of the input gradient (the block adds them).
// Must not hold: the attention op over rows and what GQA shares (attention.c), the block's norms, residuals
// and TP all-reduces (block.c), the KV cache (decode.c).
#include <math.h>
#include <string.h>
#include "core/common.h"
#include "model/attention.h"
#include "model/model_access.h"

#define F sizeof(float)
// The epsilon of q_a's and the latent's RMSNorms: 1e-6 whatever the model's norm_eps (transformers'
// DeepseekV3Attention builds them with DeepseekV3RMSNorm's default, as DeepSeek's own modeling code does).
#define MLA_NORM_EPS 1e-6f

typedef struct {
    int d, H, qr, kvr, dn, dr, dv, hq;
} Dims;
static Dims dims(const Model *m) {
    const ModelConfig *c = &m->c;
    Dims D = {c->d_model,          m->Hl,         c->q_lora_rank,       c->kv_lora_rank, c->qk_nope_head_dim,
              c->qk_rope_head_dim, c->v_head_dim, config_qk_head_dim(c)};
    return D;
}
#define P(role) model_param(m, m->params, role, l, -1)
#define G(role) model_param(m, m->grads, role, l, -1)

// ---- RoPE's frequencies and the softmax scale (transformers' _compute_yarn_parameters, yarn_get_mscale)
static double yarn_mscale(double factor, double ms) {
    return factor <= 1 ? 1.0 : 0.1 * ms * log(factor) + 1.0;
}

// YaRN's correction range over the qk_rope_head_dim / 2 pairs (truncated to whole dimensions, as
// transformers' default) and its attention factor: mscale / mscale_all_dim's where both are set, else the
// factor's own.
static RopeYarn mla_rope(const ModelConfig *c) {
    RopeYarn r = {c->rope_theta, 0, 0, 0, 1, c->rope_interleave};
    if (c->rope_factor == 0) return r;
    double f = c->rope_factor, dim = c->qk_rope_head_dim, lb = 2 * log((double)c->rope_theta),
           bf = c->yarn_beta_fast > 0 ? c->yarn_beta_fast : 32,
           bs = c->yarn_beta_slow > 0 ? c->yarn_beta_slow : 1;
    double lo = floor(dim * log(c->rope_orig_max / (bf * 2 * M_PI)) / lb),
           hi = ceil(dim * log(c->rope_orig_max / (bs * 2 * M_PI)) / lb);
    r.factor = (float)f;
    r.low = (float)(lo > 0 ? lo : 0);
    r.high = (float)(hi < dim - 1 ? hi : dim - 1);
    double ms = c->yarn_mscale, msa = c->yarn_mscale_all_dim;
    r.scale = (float)(ms != 0 && msa != 0 ? yarn_mscale(f, ms) / yarn_mscale(f, msa) : yarn_mscale(f, 1));
    return r;
}
// The factor on q (transformers' yarn_apply_mscale on the softmax scale: mscale_all_dim's mscale squared).
static float mla_q_scale(const ModelConfig *c) {
    if (c->rope_factor == 0 || c->yarn_mscale_all_dim == 0) return 1.0f;
    double s = yarn_mscale(c->rope_factor, c->yarn_mscale_all_dim);
    return (float)(s * s);
}

// ---- forward
// The first products of xn, in one call: [q_a | q_proj], the latent rows of kv_a, its rope rows (the
// weights or their gradients at base, and their widths).
static void first_tensors(const Model *m, int l, float *base, const Dims *D, float **w, int *O) {
    float *wkva = model_param(m, base, PR_KVA, l, -1);
    w[0] = model_param(m, base, D->qr ? PR_QA : PR_QB, l, -1);
    O[0] = D->qr ? D->qr : D->H * D->hq;
    w[1] = wkva;
    O[1] = D->kvr;
    w[2] = wkva + (size_t)D->kvr * D->d;
    O[2] = D->dr;
}

void mla_proj_fwd(Model *m, int l, AttnActs *a, float *q32, float *kr, const void *xn, int B, int t0,
                  int t1) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    Dims D = dims(m);
    int N = B * (t1 - t0), Oq = D.H * D.hq;
    float *out[3] = {D.qr ? a->qa : q32, a->ckv, kr}, *w[3];
    int O[3];
    first_tensors(m, l, m->params, &D, w, O);
    be->matmul_fwd_multi(3, out, xn, (const float *const *)w, N, D.d, O, 0);
    if (D.qr) {
        float *wqb = P(PR_QB);
        be->rmsnorm_fwd_hid(a->qan, a->rstd_qa, a->qa, P(PR_QA_NORM), N, D.qr, MLA_NORM_EPS);
        be->matmul_fwd_multi(1, &q32, a->qan, (const float *const *)&wqb, N, D.qr, &Oq, 0);
    }
    be->rmsnorm_fwd_hid(a->ckvn, a->rstd_kv, a->ckv, P(PR_KVA_NORM), N, D.kvr, MLA_NORM_EPS);
    RopeYarn r = mla_rope(c);
    be->rope_yarn(q32 + D.dn, B, t0, t1, D.H, D.dr, D.hq, r, 0);
    be->rope_yarn(kr, B, t0, t1, 1, D.dr, D.dr, r, 0);
}

void mla_heads_fwd(Model *m, int l, void *q, void *k, void *v, const float *q32, int nq, float *kvb,
                   const void *ckvn, const float *kr, int nkv) {
    const Backend *be = m->be;
    Dims D = dims(m);
    int kvw = D.dn + D.dv, Oq = D.H * D.hq, Okv = D.H * kvw;
    int64_t hq = D.hq, row = (int64_t)D.H * hq;
    float *wkvb = P(PR_KVB);
    be->matmul_fwd_multi(1, &kvb, ckvn, (const float *const *)&wkvb, nkv, D.kvr, &Okv, 0);
    be->copy_strided(q, 1, q32, 0, (Stride3){nq, 1, Oq, row, 0, row, 0}, mla_q_scale(&m->c), 0);
    be->copy_strided(k, 1, kvb, 0, (Stride3){nkv, D.H, D.dn, row, hq, Okv, kvw}, 1.0f, 0);
    be->copy_strided(hid_at(be, k, D.dn), 1, kr, 0, (Stride3){nkv, D.H, D.dr, row, hq, D.dr, 0}, 1.0f, 0);
    if (D.dv < D.hq) be->zero(v, (size_t)nkv * row * hid_size(be));
    be->copy_strided(v, 1, kvb + D.dn, 0, (Stride3){nkv, D.H, D.dv, row, hq, Okv, kvw}, 1.0f, 0);
}

void mla_oproj_fwd(Model *m, int l, float *out, void *ao, const void *att, int n) {
    const Backend *be = m->be;
    Dims D = dims(m);
    int64_t vd = (int64_t)D.H * D.dv, row = (int64_t)D.H * D.hq;
    be->copy_strided(ao, 1, att, 1, (Stride3){n, D.H, D.dv, vd, D.dv, row, D.hq}, 1.0f, 0);
    float *wo = P(PR_WO);
    int O = D.d;
    be->matmul_fwd_multi(1, &out, ao, (const float *const *)&wo, n, (int)vd, &O, 0);
}

// q, k, v of the heads in the hidden format from xn: the projections in float32 (q in m->attn.dq, kv_b's
// output in kvb, the rope key in kr), RoPE in place, then q (scaled), k and v (padded) rounded into the
// layer's buffers.
static void mla_fwd_in(Model *m, int l, AttnActs *a, const void *xn, int B, int T) {
    AttnScratch *s = &m->attn;
    mla_proj_fwd(m, l, a, s->dq, s->kr, xn, B, 0, T);
    mla_heads_fwd(m, l, a->q, a->k, a->v, s->dq, B * T, s->kvb, a->ckvn, s->kr, B * T);
}

// o_proj over the rows [r0, r1): the value columns of the attention output (ao, kept for the backward),
// then the product.
static void mla_out_rows(Model *m, int l, const AttnActs *a, float *out, int r0, int r1) {
    const Backend *be = m->be;
    Dims D = dims(m);
    int64_t vd = (int64_t)D.H * D.dv, row = (int64_t)D.H * D.hq;
    mla_oproj_fwd(m, l, out, hid_at(be, a->ao, r0 * vd), hid_at(be, a->att, r0 * row), r1 - r0);
}

// ---- backward
// o_proj's backward over the rows [r0, r1) (dw_o written by the step's first call), then the attention
// output's gradient: the value columns, zeros in the padding.
static void mla_bwd_out_rows(Model *m, int l, const AttnActs *a, const float *dout, int r0, int r1) {
    const Backend *be = m->be;
    AttnScratch *s = &m->attn;
    Dims D = dims(m);
    int64_t vd = (int64_t)D.H * D.dv, row = (int64_t)D.H * D.hq;
    float *dwo = G(PR_WO), *wo = P(PR_WO), *dao = s->dao + r0 * vd, *datt = s->datt + r0 * row;
    int O = D.d;
    be->matmul_bwd_multi(1, dao, &dwo, &dout, hid_at(be, a->ao, r0 * vd), (const float *const *)&wo, r1 - r0,
                         (int)vd, &O, model_dw_write(m, l, DW_FRESH_O));
    if (D.dv < D.hq) be->zero(datt, (size_t)(r1 - r0) * row * F);
    be->copy_strided(datt, 0, dao, 0, (Stride3){r1 - r0, D.H, D.dv, row, D.hq, vd, D.dv}, 1.0f, 0);
}

// From the attention op's dq, dk, dv (N, Hl, hq): q's scale and RoPE's adjoint; kv_b's output gradient
// [dk_nope | dv] and the rope key's (the sum over the heads), its RoPE adjoint; kv_b's and q_b's backward
// and the norms'; then the first products' backward over one input, written into dxn.
static void mla_bwd_in(Model *m, int l, const AttnActs *a, float *dxn, const void *xn, int B, int T) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    AttnScratch *s = &m->attn;
    Dims D = dims(m);
    int N = B * T, kvw = D.dn + D.dv, Oq = D.H * D.hq, Okv = D.H * kvw;
    int64_t hq = D.hq, row = (int64_t)D.H * hq;
    RopeYarn r = mla_rope(c);
    float qs = mla_q_scale(c);
    if (qs != 1.0f) be->copy_strided(s->dq, 0, s->dq, 0, (Stride3){N, 1, Oq, row, 0, row, 0}, qs, 0);
    be->rope_yarn(s->dq + D.dn, B, 0, T, D.H, D.dr, D.hq, r, 1);
    be->copy_strided(s->kvb, 0, s->dk, 0, (Stride3){N, D.H, D.dn, Okv, kvw, row, hq}, 1.0f, 0);
    be->copy_strided(s->kvb + D.dn, 0, s->dv, 0, (Stride3){N, D.H, D.dv, Okv, kvw, row, hq}, 1.0f, 0);
    be->zero(s->kr, (size_t)N * D.dr * F);
    be->copy_strided(s->kr, 0, s->dk + D.dn, 0, (Stride3){N, D.H, D.dr, D.dr, 0, row, hq}, 1.0f, 1);
    be->rope_yarn(s->kr, B, 0, T, 1, D.dr, D.dr, r, 1);
    float *gkvb = G(PR_KVB), *wkvb = P(PR_KVB);
    const float *dkvb = s->kvb;
    be->matmul_bwd_multi(1, s->dckvn, &gkvb, &dkvb, a->ckvn, (const float *const *)&wkvb, N, D.kvr, &Okv, 0);
    be->zero(s->dckv, (size_t)N * D.kvr * F);
    be->rmsnorm_bwd(s->dckv, G(PR_KVA_NORM), s->dckvn, a->ckv, P(PR_KVA_NORM), a->rstd_kv, N, D.kvr);
    if (D.qr) {
        float *gqb = G(PR_QB), *wqb = P(PR_QB);
        const float *dq = s->dq;
        be->matmul_bwd_multi(1, s->dqan, &gqb, &dq, a->qan, (const float *const *)&wqb, N, D.qr, &Oq, 0);
        be->zero(s->dqa, (size_t)N * D.qr * F);
        be->rmsnorm_bwd(s->dqa, G(PR_QA_NORM), s->dqan, a->qa, P(PR_QA_NORM), a->rstd_qa, N, D.qr);
    }
    const float *dout[3] = {D.qr ? s->dqa : s->dq, s->dckv, s->kr};
    float *dw[3], *w[3];
    int O[3];
    first_tensors(m, l, m->grads, &D, dw, O);
    first_tensors(m, l, m->params, &D, w, O);
    be->matmul_bwd_multi(3, dxn, dw, dout, xn, (const float *const *)w, N, D.d, O, 0);
}

// ---- memory
static void mla_scratch_init(Model *m) {
    const Backend *be = m->be;
    AttnScratch *s = &m->attn;
    Dims D = dims(m);
    size_t N = m->maxN, qd = (size_t)D.H * D.hq;
    s->dq = be->alloc(N * qd * F);
    s->dk = be->alloc(N * qd * F);
    s->dv = be->alloc(N * qd * F);
    s->datt = be->alloc(N * qd * F);
    s->kvb = be->alloc(N * D.H * (D.dn + D.dv) * F);
    s->kr = be->alloc(N * D.dr * F);
    s->dckvn = be->alloc(N * D.kvr * F);
    s->dckv = be->alloc(N * D.kvr * F);
    if (D.qr) {
        s->dqan = be->alloc(N * D.qr * F);
        s->dqa = be->alloc(N * D.qr * F);
    }
    s->dao = be->alloc(N * D.H * D.dv * F);
    s->kv_seen = xcalloc((size_t)m->maxB, 1);
}

// q, k, v (padded), the attention output and lse unless --recompute attn drops them (attn_acts_recompute),
// the compressions before and after their norms with their rstd, o_proj's input.
static void mla_acts_alloc(const Model *m, AttnActs *a, Arena *A, int rc) {
    const Backend *be = m->be;
    Dims D = dims(m);
    size_t N = m->maxN, qd = (size_t)D.H * D.hq, hs = hid_size(be);
    a->q = arena_alloc(A, be, N * qd * hs);
    a->k = arena_alloc(A, be, N * qd * hs);
    a->v = arena_alloc(A, be, N * qd * hs);
    if (!(rc & RECOMPUTE_ATTN)) {
        a->att = arena_alloc(A, be, N * qd * hs);
        a->lse = arena_alloc(A, be, (size_t)m->maxB * D.H * m->maxT * F);
    }
    if (D.qr) {
        a->qa = arena_alloc(A, be, N * D.qr * F);
        a->qan = arena_alloc(A, be, N * D.qr * hs);
        a->rstd_qa = arena_alloc(A, be, N * F);
    }
    a->ckv = arena_alloc(A, be, N * D.kvr * F);
    a->ckvn = arena_alloc(A, be, N * D.kvr * hs);
    a->rstd_kv = arena_alloc(A, be, N * F);
    a->ao = arena_alloc(A, be, N * D.H * D.dv * hs);
}

const AttnVariant attn_mla = {mla_scratch_init, attn_scratch_free, mla_acts_alloc,   attn_acts_recompute,
                              attn_acts_free,   mla_fwd_in,        attn_op_rows,     mla_out_rows,
                              attn_bwd_begin,   mla_bwd_out_rows,  attn_op_bwd_rows, mla_bwd_in};
