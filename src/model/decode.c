// decode.c — KV-cached forward for sampling (see decode.h): the same ops as the training forward (block.c,
// GQA's parts of attention.c, latent attention's of mla.c, model.c's head) on the new rows only, over GQA's
// cache of keys and values or latent attention's of its latent and rope key.
// Must not hold: the training forward/backward, the sampling policy (train/sample.c).
#include "model/decode.h"
#include <string.h>
#include "core/common.h"
#include "model/attention.h"
#include "model/model_access.h"
#include "model/vocab.h"

#define F sizeof(float)

int model_decode_supported(const Model *m) {
    return m->nchunks == 1 && m->chunk[0].l0 == 0 && m->chunk[0].l1 == m->c.n_layers && m->chunk[0].first &&
        m->chunk[0].last;
}

void kv_init(KvCache *kc, const Model *m, int W) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    CHECK(model_decode_supported(m), "the KV cache needs every layer on this rank (no pipeline stages)");
    CHECK(W >= 1 && W <= m->maxN && W <= c->max_seq_len, "KV cache of %d positions: the model takes 1..%d", W,
          m->maxN < c->max_seq_len ? m->maxN : c->max_seq_len);
    memset(kc, 0, sizeof *kc);
    int mla = config_mla(c);
    size_t L = c->n_layers, d = c->d_model, hq = mla ? (size_t)config_qk_head_dim(c) : (size_t)c->head_dim,
           qd = (size_t)m->Hl * hq, kvd = (size_t)m->KVl * c->head_dim;
    kc->W = W;
    size_t hb = hid_size(be);
    kc->k = xcalloc(L, sizeof(void *));
    kc->v = xcalloc(L, sizeof(void *));
    if (mla) {
        kc->lat = xcalloc(L, sizeof(void *));
        kc->kr = xcalloc(L, sizeof(float *));
        for (size_t l = 0; l < L; l++) {
            kc->lat[l] = be->alloc(W * (size_t)c->kv_lora_rank * hb);
            kc->kr[l] = be->alloc(W * (size_t)c->qk_rope_head_dim * F);
        }
        kc->kx = be->alloc(W * qd * hb);
        kc->vx = be->alloc(W * qd * hb);
        kc->ao = be->alloc(W * (size_t)m->Hl * c->v_head_dim * hb);
    }
    for (size_t l = 0; l < L && !mla; l++) {
        kc->k[l] = be->alloc(W * kvd * hb);
        kc->v[l] = be->alloc(W * kvd * hb);
    }
    kc->q = be->alloc(W * qd * hb);
    kc->att = be->alloc(W * qd * hb);
    kc->lse = be->alloc((size_t)m->Hl * W * F);
    kc->x = be->alloc(W * d * F);
    kc->xn = be->alloc(W * d * F);
    kc->xmid = be->alloc(W * d * F);
    kc->rstd = be->alloc(W * F);
    if (c->qk_norm) { // the projections before their norms, and the norms' rstd
        kc->qraw = be->alloc(W * qd * F);
        kc->kraw = be->alloc(W * kvd * F);
        kc->rstdqk = be->alloc(W * (size_t)(m->Hl > m->KVl ? m->Hl : m->KVl) * F);
    }
    kc->logits = be->alloc((size_t)vocab_cols(m, NULL) * F);
}

void kv_free(KvCache *kc, const Model *m) {
    const Backend *be = m->be;
    for (int l = 0; l < m->c.n_layers; l++) {
        void *lb[] = {kc->k[l], kc->v[l], kc->lat ? kc->lat[l] : NULL, kc->kr ? kc->kr[l] : NULL};
        for (int i = 0; i < 4; i++)
            if (lb[i]) be->free(lb[i]);
    }
    free(kc->k);
    free(kc->v);
    free(kc->lat);
    free(kc->kr);
    void *bufs[] = {kc->q,      kc->att,  kc->lse,  kc->x,      kc->xn, kc->xmid, kc->rstd,
                    kc->logits, kc->qraw, kc->kraw, kc->rstdqk, kc->kx, kc->vx,   kc->ao};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) be->free(bufs[i]);
    memset(kc, 0, sizeof *kc);
}

// GQA's attention of the rows [t0, t1) of layer l from kc->xn into kc->xmid (this rank's partial sums): the
// new rows' q, k, v in float32 (the backward's scratch, maxN >= W rows), the families' options as the
// forward's (attention.c): biases, then QK-norm, then RoPE; k and v appended to the cache.
static void gqa_attn(Model *m, KvCache *kc, int l, int t0, int t1) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    int n = t1 - t0, H = m->Hl, KV = m->KVl, hd = c->head_dim, qd = H * hd, kvd = KV * hd;
    float *q = m->attn.dq, *k = m->attn.dk, *v = m->attn.dv;
    float *qp = c->qk_norm ? kc->qraw : q, *kp = c->qk_norm ? kc->kraw : k;
    gqa_qkv_fwd(m, l, qp, kp, v, kc->xn, n, 0); // + the biases over the model's ones vector (maxN >= W rows)
    // (the full-width form over TP sums its rows over the TP ranks, which all decode the same rows)
    if (c->qk_norm) gqa_qk_norm_fwd(m, l, q, k, kc->rstdqk, kc->rstdqk, qp, kp, n);
    be->rope_rows(q, 1, t0, t1, H, hd, c->rope_theta, 0);
    be->rope_rows(k, 1, t0, t1, KV, hd, c->rope_theta, 0);
    be->to_hid(hid_at(be, kc->q, (size_t)t0 * qd), q, (size_t)n * qd);
    be->to_hid(hid_at(be, kc->k[l], (size_t)t0 * kvd), k, (size_t)n * kvd);
    be->to_hid(hid_at(be, kc->v[l], (size_t)t0 * kvd), v, (size_t)n * kvd);
    be->attention_fwd(kc->att, kc->lse, kc->q, kc->k[l], kc->v[l], 1, kc->W, H, KV, hd, t0, t1);
    gqa_oproj_fwd(m, l, kc->xmid, hid_at(be, kc->att, (size_t)t0 * qd), n);
}

// Latent attention's (mla.c): the new rows' projections (the intermediates in the model's scratch), their
// latent and rope key appended to the cache, the keys and values of the positions 0..t1-1 expanded from it,
// the attention of the new rows, o_proj.
static void mla_attn(Model *m, KvCache *kc, int l, int t0, int t1) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    AttnScratch *s = &m->attn;
    int n = t1 - t0, H = m->Hl, hq = config_qk_head_dim(c);
    size_t qd = (size_t)H * hq;
    AttnActs a;
    memset(&a, 0, sizeof a);
    a.qa = s->dqa;
    a.qan = s->dqan; // (float32 scratch of maxN rows: room for the hidden format's)
    a.rstd_qa = a.rstd_kv = kc->rstd;
    a.ckv = s->dckv;
    a.ckvn = hid_at(be, kc->lat[l], (size_t)t0 * c->kv_lora_rank);
    mla_proj_fwd(m, l, &a, s->dq, kc->kr[l] + (size_t)t0 * c->qk_rope_head_dim, kc->xn, 1, t0, t1);
    mla_heads_fwd(m, l, hid_at(be, kc->q, t0 * qd), kc->kx, kc->vx, s->dq, n, s->kvb, kc->lat[l], kc->kr[l],
                  t1);
    if (c->v_head_dim < hq && be->attention_fwd_v) // (the values' width, as attention.c's forward)
        be->attention_fwd_v(kc->att, kc->lse, kc->q, kc->kx, kc->vx, 1, kc->W, H, H, hq, c->v_head_dim, t0,
                            t1);
    else be->attention_fwd(kc->att, kc->lse, kc->q, kc->kx, kc->vx, 1, kc->W, H, H, hq, t0, t1);
    mla_oproj_fwd(m, l, kc->xmid, kc->ao, hid_at(be, kc->att, t0 * qd), n);
}

void model_decode(Model *m, KvCache *kc, const int32_t *tokens, int n, float *out) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    int t0 = kc->len, t1 = kc->len + n, W = kc->W;
    CHECK(n >= 1 && t1 <= W, "model_decode: positions %d..%d beyond the cache's %d", t0, t1 - 1, W);
    int d = c->d_model;
    vocab_embed_fwd(m, kc->x, tokens, n);
    for (int l = 0; l < c->n_layers; l++) {
        // (kc->xn holds the attention norm's output in the hidden format here, the FFN norm's float32 below)
        be->rmsnorm_fwd_hid(kc->xn, kc->rstd, kc->x, model_param(m, m->params, PR_ATTN_NORM, l, -1), n, d,
                            c->norm_eps);
        if (config_mla(c)) mla_attn(m, kc, l, t0, t1);
        else gqa_attn(m, kc, l, t0, t1);
        if (comm_size(m->mesh.tp) > 1) comm_dev_allreduce(m->mesh.tp, kc->xmid, (size_t)n * d, CT_F32);
        be->add_rmsnorm_fwd(kc->xmid, kc->xn, kc->rstd, kc->x, model_param(m, m->params, PR_FFN_NORM, l, -1),
                            n, d, c->norm_eps);
        MoeWeights w;
        model_moe_weights(m, m->params, l, &w);
        MoeLayer *ml = model_moe(m, l, 0);
        ml->overlap = m->moe_overlap[l];
        ml->mode = m->moe_mode[l];
        ml->fp8_dispatch = m->fp8_dispatch;
        ml->seq_len = n; // (the rows of one call: the sequence-scope statistics are not used here)
        moe_forward(ml, kc->x, kc->xmid, kc->xn, n, &w, c, 0,
                    (int64_t)comm_rank(m->mesh.dp) * n); // x = mid + MoE
    }
    float *last = kc->x + (size_t)(n - 1) * d;
    be->rmsnorm_fwd(kc->xn, kc->rstd, last, model_param(m, m->params, PR_FINAL_NORM, -1, -1), 1, d,
                    c->norm_eps);
    vocab_head_fwd(m, kc->logits, NULL, NULL, kc->xn, NULL, 1, 0); // (this rank's columns)
    vocab_row_to_host(m, kc->logits, 1, 0, out);
    kc->len = t1;
}
