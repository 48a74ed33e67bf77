// mtp.c — multi-token prediction (mtp.h): the MTP modules' forward and hand-written backward over the
// Backend and their row maps (the shifted embedding rows, eh_proj's concatenation as an interleave of rows).
// Each module's block is block.c's, run on its layer index.
// Must not hold: the main model's layers, head or embedding (model.c), the activations' allocation
// (model_state.c), a block's arithmetic (block.c, attention.c).
#include "model/mtp.h"
#include <string.h>
#include "core/common.h"
#include "model/block.h"
#include "model/model_access.h"
#include "model/model_state.h"
#include "model/vocab.h"

#define F sizeof(float)

// The row maps of the shape (B, T), on the device (made again when the shape changes): module k's shift
// (row b T + i <- row b T + i + k, -1 past the sequence's end) and its inverse at idx + (k-1) 2N, then the
// interleave (cat row i = split rows i and N + i) and de-interleave at idx + 2ND, + 2ND + 2N.
static const int32_t *row_maps(Model *m, int B, int T) {
    MtpScratch *s = &m->mtps;
    int N = B * T, D = m->c.mtp_depth;
    if (s->B == B && s->T == T) return s->idx;
    int32_t *h = s->idx_h;
    for (int k = 1; k <= D; k++) {
        int32_t *sh = h + (size_t)(k - 1) * 2 * N, *bk = sh + N;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < T; i++) {
                sh[b * T + i] = i + k < T ? b * T + i + k : -1;
                bk[b * T + i] = i >= k ? b * T + i - k : -1;
            }
    }
    int32_t *cat = h + (size_t)D * 2 * N, *uncat = cat + 2 * N;
    for (int i = 0; i < N; i++) {
        cat[2 * i] = i;
        cat[2 * i + 1] = N + i;
        uncat[i] = 2 * i;
        uncat[N + i] = 2 * i + 1;
    }
    m->be->to_device(s->idx, h, ((size_t)D * 2 * N + 4 * (size_t)N) * sizeof(int32_t));
    s->B = B;
    s->T = T;
    return s->idx;
}

// Module k's head: the loss of a->xn through the LM head against t[i+k+1] (host targets: t[i+1] at i),
// over the rows i < T - k of each sequence (the others' dlogits zeroed); train: dlogits for dloss_k per row
// into a->logits, in the hidden format in place (dloss_k 0: zeros). Returns this rank's mean over those rows.
static double module_loss(Model *m, MtpActs *a, int k, const int32_t *targets, int B, int T, int train,
                          float dloss_k) {
    const Backend *be = m->be;
    int N = B * T, V = vocab_cols(m, NULL); // (this rank's columns)
    int32_t *t = m->mtps.tgt_h;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++) t[b * T + i] = i + k < T ? targets[b * T + i + k] : 0;
    if (m->loss_chunks > 1) { // (the head's backward at once: its input gradient in dxh; a weight of 0: none)
        vocab_head_chunks(m, a->logits, a->losses, a->targets, a->xn, t, N, T, k, dloss_k,
                          train && dloss_k != 0 ? a->dxh : NULL);
        if (train && dloss_k == 0) be->zero(a->dxh, (size_t)N * m->c.d_model * F);
    } else {
        vocab_head_fwd(m, a->logits, a->losses, a->targets, a->xn, t, N, train ? dloss_k : 0);
        // (dlogits in the hidden format in place; zeroing a row's float32 bytes zeroes its values too; a
        // weight of 0: every row's)
        if (train && dloss_k == 0) be->zero(a->logits, (size_t)N * V * F);
        else if (train)
            for (int b = 0; b < B; b++) be->zero(a->logits + ((size_t)b * T + T - k) * V, (size_t)k * V * F);
    }
    float *lh = m->loss_h;
    be->to_host(lh, a->losses, (size_t)N * F);
    double s = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T - k; i++) s += lh[b * T + i];
    return s / ((double)B * (T - k));
}

void mtp_forward(Model *m, const float *emb, const int32_t *targets, int B, int T, float dloss,
                 uint64_t noise_seed) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    int N = B * T, d = c->d_model, D = c->mtp_depth, E = c->n_experts, Lm = config_moe_layers(c);
    CHECK(T > D, "multi-token prediction of %d tokens ahead needs sequences longer than %d (got %d)", D + 1,
          D, T);
    const int32_t *idx = row_maps(m, B, T), *cat = idx + (size_t)D * 2 * N;
    float *split = m->mtps.split, *prev = m->xn_f;
    m->mtp_loss = m->mtp_aux = m->mtp_z = 0;
    for (int k = 1; k <= D; k++) {
        int l = c->n_layers + k - 1;
        MtpActs *a = &m->mtp[k - 1];
        be->combine_rows(a->es, NULL, emb, idx + (size_t)(k - 1) * 2 * N, NULL, N, 1, d, 0);
        be->rmsnorm_fwd(split, a->rstd_e, a->es, model_param(m, m->params, PR_MTP_ENORM, l, -1), N, d,
                        c->norm_eps);
        be->rmsnorm_fwd(split + (size_t)N * d, a->rstd_h, prev,
                        model_param(m, m->params, PR_MTP_HNORM, l, -1), N, d, c->norm_eps);
        be->gather_rows(a->cat, split, cat, 2 * N, d);
        be->matmul_fwd(m->la[l].res_in, a->cat, model_param(m, m->params, PR_MTP_EH, l, -1), N, 2 * d, d, 0);
        model_fit_chunks(m, l, 1);
        block_forward(m, l, a->out, B, T, 1, noise_seed ? noise_seed * 1000003ull + (uint64_t)l : 0);
        be->rmsnorm_fwd(a->xn, a->rstd, a->out, model_param(m, m->params, PR_MTP_NORM, l, -1), N, d,
                        c->norm_eps);
        float dk = dloss != 0 ? (float)((double)dloss * T / (T - k) * c->mtp_weight / D) : 0;
        m->mtp_loss += module_loss(m, a, k, targets, B, T, dloss != 0, dk) / D;
        m->mtp_aux += m->la[l].moe.aux / Lm;
        m->mtp_z += m->la[l].moe.z / Lm;
        memcpy(m->expert_counts + (size_t)l * E, m->la[l].moe.counts, sizeof(int64_t) * E);
        prev = a->xn;
    }
}

const float *mtp_backward(Model *m, float aux_scale, float z_scale) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    int B = m->B, T = m->T, N = B * T, d = c->d_model, D = c->mtp_depth;
    MtpScratch *s = &m->mtps;
    const int32_t *idx = row_maps(m, B, T), *uncat = idx + (size_t)D * 2 * N + 2 * N;
    float *g = m->grads, *dh = s->dh;
    be->zero(s->demb, (size_t)N * d * F);
    for (int k = D; k >= 1; k--) {
        int l = c->n_layers + k - 1;
        MtpActs *a = &m->mtp[k - 1];
        // the head: the gradient reaching h_k = a->xn (with the next module's, through its hnorm), then its
        // norm
        if (m->loss_chunks > 1) be->copy(m->dxn, a->dxh, (size_t)N * d * F); // (taken in the forward)
        else vocab_head_bwd(m, m->dxn, a->logits, a->xn, N, model_dw_write(m, -1, DW_FRESH_HEAD));
        if (k < D) be->add(m->dxn, m->dxn, dh, (size_t)N * d);
        be->zero(m->dres, (size_t)N * d * F);
        be->rmsnorm_bwd(m->dres, model_param(m, g, PR_MTP_NORM, l, -1), m->dxn, a->out,
                        model_param(m, m->params, PR_MTP_NORM, l, -1), a->rstd, N, d);
        block_backward(m, l, aux_scale, z_scale);
        // eh_proj, then its input's halves de-interleaved: split rows [0, N) the embedding's, [N, 2N) h's
        be->matmul_bwd(s->dcat, model_param(m, g, PR_MTP_EH, l, -1), m->dres, a->cat,
                       model_param(m, m->params, PR_MTP_EH, l, -1), N, 2 * d, d, 0);
        be->gather_rows(s->split, s->dcat, uncat, 2 * N, d);
        be->zero(m->dxn, (size_t)N * d * F);
        be->rmsnorm_bwd(m->dxn, model_param(m, g, PR_MTP_ENORM, l, -1), s->split, a->es,
                        model_param(m, m->params, PR_MTP_ENORM, l, -1), a->rstd_e, N, d);
        // the shifted rows' gradients back to the embedding rows they came from (none past the end)
        be->combine_rows(s->demb, NULL, m->dxn, idx + (size_t)(k - 1) * 2 * N + N, NULL, N, 1, d, 1);
        be->zero(dh, (size_t)N * d * F);
        be->rmsnorm_bwd(dh, model_param(m, g, PR_MTP_HNORM, l, -1), s->split + (size_t)N * d,
                        k > 1 ? m->mtp[k - 2].xn : m->xn_f, model_param(m, m->params, PR_MTP_HNORM, l, -1),
                        a->rstd_h, N, d);
        if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, l);
    }
    return dh;
}
