// decode.c — KV-cached forward for sampling (see decode.h): the same ops as the training forward (block.c,
// GQA's parts of attention.c, model.c's head) on the new rows only, over GQA's cache of keys and values.
// Must not hold: the training forward/backward, the sampling policy (train/sample.c).
#include "model/decode.h"
#include <string.h>
#include "core/common.h"
#include "model/attention.h"
#include "model/model_access.h"

#define F sizeof(float)

int model_decode_supported(const Model *m) {
    return !config_mla(&m->c) && m->nchunks == 1 && m->chunk[0].l0 == 0 && m->chunk[0].l1 == m->c.n_layers &&
        m->chunk[0].first && m->chunk[0].last;
}

void kv_init(KvCache *kc, const Model *m, int W) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    CHECK(model_decode_supported(m), "the KV cache needs every layer on this rank (no pipeline stages)");
    CHECK(W >= 1 && W <= m->maxN && W <= c->max_seq_len, "KV cache of %d positions: the model takes 1..%d", W,
          m->maxN < c->max_seq_len ? m->maxN : c->max_seq_len);
    memset(kc, 0, sizeof *kc);
    size_t L = c->n_layers, d = c->d_model, qd = (size_t)m->Hl * c->head_dim,
           kvd = (size_t)m->KVl * c->head_dim;
    kc->W = W;
    size_t hb = hid_size(be);
    kc->k = xcalloc(L, sizeof(void *));
    kc->v = xcalloc(L, sizeof(void *));
    for (size_t l = 0; l < L; l++) {
        kc->k[l] = be->alloc(W * kvd * hb);
        kc->v[l] = be->alloc(W * kvd * hb);
    }
    kc->q = be->alloc(W * qd * hb);
    kc->att = be->alloc(W * qd * hb);
    kc->lse = be->alloc((size_t)m->Hl * W * F);
    kc->x = be->alloc(W * d * F);
    kc->xn = be->alloc(W * d * F);
    kc->xmid = be->alloc(W * d * F);
    kc->mo = be->alloc(W * d * F);
    kc->rstd = be->alloc(W * F);
    if (c->qk_norm) { // the projections before their norms, and the norms' rstd
        kc->qraw = be->alloc(W * qd * F);
        kc->kraw = be->alloc(W * kvd * F);
        kc->rstdqk = be->alloc(W * (size_t)(m->Hl > m->KVl ? m->Hl : m->KVl) * F);
    }
    kc->logits = be->alloc((size_t)c->vocab_size * F);
}

void kv_free(KvCache *kc, const Model *m) {
    const Backend *be = m->be;
    for (int l = 0; l < m->c.n_layers; l++) {
        be->free(kc->k[l]);
        be->free(kc->v[l]);
    }
    free(kc->k);
    free(kc->v);
    void *bufs[] = {kc->q,  kc->att,  kc->lse,    kc->x,    kc->xn,   kc->xmid,
                    kc->mo, kc->rstd, kc->logits, kc->qraw, kc->kraw, kc->rstdqk};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]) be->free(bufs[i]);
    memset(kc, 0, sizeof *kc);
}

void model_decode(Model *m, KvCache *kc, const int32_t *tokens, int n, float *out) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    int t0 = kc->len, t1 = kc->len + n, W = kc->W;
    CHECK(n >= 1 && t1 <= W, "model_decode: positions %d..%d beyond the cache's %d", t0, t1 - 1, W);
    int d = c->d_model, H = m->Hl, KV = m->KVl, hd = c->head_dim, V = c->vocab_size, qd = H * hd,
        kvd = KV * hd;
    for (int i = 0; i < n; i++)
        CHECK(tokens[i] >= 0 && tokens[i] < V, "token %d is outside the vocabulary (%d)", tokens[i], V);
    be->to_device(m->tokens, tokens, (size_t)n * sizeof(int32_t));
    be->embedding_fwd(kc->x, m->tokens, model_param(m, m->params, PR_EMBED, -1, -1), n, d);
    for (int l = 0; l < c->n_layers; l++) {
        // the new rows in float32 (the backward's scratch, maxN >= W rows)
        float *q = m->attn.dq, *k = m->attn.dk, *v = m->attn.dv;
        // (kc->xn holds the attention norm's output in the hidden format here, the FFN norm's float32 below)
        be->rmsnorm_fwd_hid(kc->xn, kc->rstd, kc->x, model_param(m, m->params, PR_ATTN_NORM, l, -1), n, d,
                            c->norm_eps);
        // the families' options as the forward's (attention.c): biases, then QK-norm, then RoPE
        float *qp = c->qk_norm ? kc->qraw : q, *kp = c->qk_norm ? kc->kraw : k;
        gqa_qkv_fwd(m, l, qp, kp, v, kc->xn, n); // + the biases over the model's ones vector (maxN >= W rows)
        // (the full-width form over TP sums its rows over the TP ranks, which all decode the same rows)
        if (c->qk_norm) gqa_qk_norm_fwd(m, l, q, k, kc->rstdqk, kc->rstdqk, qp, kp, n);
        be->rope_rows(q, 1, t0, t1, H, hd, c->rope_theta, 0);
        be->rope_rows(k, 1, t0, t1, KV, hd, c->rope_theta, 0);
        be->to_hid(hid_at(be, kc->q, (size_t)t0 * qd), q, (size_t)n * qd);
        be->to_hid(hid_at(be, kc->k[l], (size_t)t0 * kvd), k, (size_t)n * kvd);
        be->to_hid(hid_at(be, kc->v[l], (size_t)t0 * kvd), v, (size_t)n * kvd);
        be->attention_fwd(kc->att, kc->lse, kc->q, kc->k[l], kc->v[l], 1, W, H, KV, hd, t0, t1);
        gqa_oproj_fwd(m, l, kc->xmid, hid_at(be, kc->att, (size_t)t0 * qd), n);
        if (comm_size(m->mesh.tp) > 1) comm_dev_allreduce(m->mesh.tp, kc->xmid, (size_t)n * d, CT_F32);
        be->add_rmsnorm_fwd(kc->xmid, kc->xn, kc->rstd, kc->x, model_param(m, m->params, PR_FFN_NORM, l, -1),
                            n, d, c->norm_eps);
        MoeWeights w;
        model_moe_weights(m, m->params, l, &w);
        MoeLayer *ml = model_moe(m, l, 0);
        ml->overlap = m->moe_overlap[l];
        ml->mode = m->moe_mode[l];
        ml->seq_len = n; // (the rows of one call: the sequence-scope statistics are not used here)
        moe_forward(ml, kc->mo, kc->xn, n, &w, c, 0, (int64_t)comm_rank(m->mesh.dp) * n);
        be->add(kc->x, kc->xmid, kc->mo, (size_t)n * d);
    }
    float *last = kc->x + (size_t)(n - 1) * d;
    be->rmsnorm_fwd(kc->xn, kc->rstd, last, model_param(m, m->params, PR_FINAL_NORM, -1, -1), 1, d,
                    c->norm_eps);
    be->matmul_fwd(kc->logits, kc->xn, model_param(m, m->params, PR_LM_HEAD, -1, -1), 1, d, V, 0);
    be->to_host(out, kc->logits, (size_t)V * F);
    kc->len = t1;
}
