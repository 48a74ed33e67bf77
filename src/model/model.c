// model.c — forward and hand-written backward of the MoE transformer over the current chunk of layers
// (model.h), as the orchestration of its parts:
// embed -> L x block (block.c: norm -> attention (attention.h) -> residual -> norm -> MoE FFN -> residual)
// -> RMSNorm -> LM head -> cross-entropy (the loss head), then the MTP modules (mtp.c); the router statistics
// summed over the layers (aux, z, drops, expert counts, HF's aux form; averages over the MoE layers: a dense
// layer has none), and the backward in reverse with its grads_ready calls. Must not hold: a block's
// arithmetic (block.c, attention.c), allocation (model_state.c).
#include "model/model.h"
#include <string.h>
#include "core/common.h"
#include "model/block.h"
#include "model/model_access.h"
#include "model/mtp.h"
#include "model/vocab.h"

#define F sizeof(float)

// The last chunk's head over N rows: HF's aux loss over all layers (its F_i given to every layer), the
// final norm and LM head (logits), and with targets the cross-entropy (dloss != 0: dlogits into the
// logits); returns the mean loss of this rank's tokens (0 without targets).
static double head_forward(Model *m, const int32_t *targets, int N, float dloss) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    const ModelChunk *ch = &m->chunk[m->cur];
    int d = c->d_model, E = c->n_experts;
    if (c->aux_form == AUX_HF) {
        // HF Mixtral: one loss over all layers' tokens, E * sum_i F_i * Pbar_i, F_i = all layers'
        // assignments to i / (L * Ng), Pbar_i = all layers' probability mass on i / (L * Ng);
        // its gradient on layer l's probs is E * F_i / (L * Ng): give every layer f_i = F_i (this
        // chunk's here; earlier chunks' in their backward, from hf_fe)
        double LN = (double)config_moe_layers(c) * m->la[ch->l0].moe.Ng, a = 0;
        for (int e = 0; e < E; e++) {
            double fe = m->hf_fe[e] / LN, pe = m->hf_pe[e] / LN;
            a += fe * pe;
            m->hf_fe[e] = fe;
            for (int l = ch->l0; l < ch->l1; l++) m->la[l].moe.aux_f[e] = fe;
        }
        m->aux = E * a;
    }
    be->rmsnorm_fwd(m->xn_f, m->rstd_f, m->res_final, model_param(m, m->params, PR_FINAL_NORM, -1, -1), N, d,
                    c->norm_eps);
    // (--loss-chunks: the head's backward at once, its input gradient kept in dxh)
    if (m->loss_chunks > 1)
        vocab_head_chunks(m, m->logits, m->losses, m->targets, m->xn_f, targets, N, N, 0, dloss,
                          targets && dloss != 0 ? m->dxh : NULL);
    else vocab_head_fwd(m, m->logits, m->losses, m->targets, m->xn_f, targets, N, dloss);
    if (!targets) return 0;
    float *lh = m->loss_h;
    be->to_host(lh, m->losses, (size_t)N * F);
    double s = 0;
    for (int i = 0; i < N; i++) s += lh[i];
    return s / N;
}

// Embedding dropout (--embed-dropout) on the (N,d) rows x, forward or (the same mask) backward: the seed
// dropout_hash(slot seed, -1, 3), the global token index as the residual sites' (block.c drop_rows).
static void embed_drop(const Model *m, float *x, int N) {
    uint64_t seed = model_drop_seed(m);
    if (!seed || !(m->embed_dropout > 0)) return;
    m->be->dropout(x, 1, N, 0, N, m->c.d_model, m->embed_dropout, dropout_hash(seed, -1, 3),
                   (int64_t)comm_rank(m->mesh.dp) * N);
}

double model_forward(Model *m, const int32_t *tokens, const int32_t *targets, int B, int T, float dloss,
                     uint64_t noise_seed) {
    const ModelConfig *c = &m->c;
    const ModelChunk *ch = &m->chunk[m->cur];
    CHECK(B >= 1 && T >= 1 && B * T <= m->maxN && T <= m->maxT, "model_forward: batch %dx%d exceeds %dx%d", B,
          T, m->maxB, m->maxT);
    int N = B * T, E = c->n_experts, Lm = config_moe_layers(c);
    m->B = m->slots[m->cur][m->cur_slot].B = B;
    m->T = m->slots[m->cur][m->cur_slot].T = T;
    m->slots[m->cur][m->cur_slot].drop_seed =
        m->dropout > 0 || m->embed_dropout > 0 || c->attention_dropout > 0 ? m->drop_seed : 0;
    if (ch->first) {
        vocab_embed_fwd(m, m->la[0].res_in, tokens, N); // (m->tokens: this rank's ids, for the backward)
        embed_drop(m, m->la[0].res_in, N);
        m->aux = m->z = 0;
        m->dropped = 0;
        memset(m->hf_fe, 0, sizeof(double) * E * 2);
    }
    for (int l = ch->l0; l < ch->l1; l++) {
        LayerActs *a = &m->la[l];
        float *out = l + 1 < ch->l1 ? m->la[l + 1].res_in : m->res_final;
        int n = dloss != 0 && !config_layer_dense(c, l) ? m->ampipe[l] : 1; // (a dense layer: unchunked)
        CHECK(n <= N, "--ampipe %d: a micro-batch of %d tokens has fewer rows than chunks", n, N);
        // the states a layer's forwards do not use lose their memory: whole-batch rows while chunked,
        // the chunks' states while not (--ampipe auto tries both)
        model_fit_chunks(m, l, n);
        block_forward(m, l, out, B, T, n, noise_seed ? noise_seed * 1000003ull + (uint64_t)l : 0);
        m->aux += a->moe.aux / Lm; // (a dense layer's are zero)
        m->z += a->moe.z / Lm;
        m->dropped += a->moe.dropped;
        memcpy(m->expert_counts + (size_t)l * E, a->moe.counts, sizeof(int64_t) * E);
        // aux_form hf: the sums over layers, in layer order (carried from stage to stage)
        for (int e = 0; e < E; e++) {
            m->hf_fe[e] += a->moe.counts[e];
            m->hf_pe[e] += a->moe.psum[e];
        }
    }
    if (!ch->last) return 0;
    double loss = head_forward(m, targets, N, dloss);
    // the MTP modules after the head, on the embedding output (pipeline stages: received, m->mtp_emb)
    if (c->mtp_depth && targets) mtp_forward(m, m->mtp_emb, targets, B, T, dloss, noise_seed);
    return loss;
}

void model_backward(Model *m, float aux_scale, float z_scale) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    int N = m->B * m->T, d = c->d_model, L = c->n_layers;
    float *g = m->grads;
    const ModelChunk *ch = &m->chunk[m->cur];
    if (ch->last) {
        // the MTP modules first (their gradient reaching the final norm's output: dh0), then the LM head and
        // final norm (m->logits holds dlogits in the hidden format: cross_entropy_fwd_bwd)
        const float *dh0 = c->mtp_depth ? mtp_backward(m, aux_scale, z_scale) : NULL;
        if (m->loss_chunks > 1) be->copy(m->dxn, m->dxh, (size_t)N * d * F); // (taken in the forward)
        else vocab_head_bwd(m, m->dxn, m->logits, m->xn_f, N, model_dw_write(m, -1, DW_FRESH_HEAD));
        if (dh0) be->add(m->dxn, m->dxn, dh0, (size_t)N * d);
        be->zero(m->dres, (size_t)N * d * F);
        be->rmsnorm_bwd(m->dres, model_param(m, g, PR_FINAL_NORM, -1, -1), m->dxn, m->res_final,
                        model_param(m, m->params, PR_FINAL_NORM, -1, -1), m->rstd_f, N, d);
        if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, L + c->mtp_depth);
    } else if (c->aux_form == AUX_HF) {
        for (int l = ch->l0; l < ch->l1; l++)
            memcpy(m->la[l].moe.aux_f, m->hf_fe, sizeof(double) * c->n_experts);
    }
    for (int l = ch->l1 - 1; l >= ch->l0; l--) {
        block_backward(m, l, aux_scale, z_scale);
        if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, l);
    }
    if (!ch->first) return;
    // the MTP modules' share (they read the embedding output after its dropout: the same mask follows)
    if (c->mtp_depth) be->add(m->dres, m->dres, m->mtps.demb, (size_t)N * d);
    embed_drop(m, m->dres, N); // the gradient through the forward's mask
    float *ge = model_param(m, g, PR_EMBED, -1, -1);
    if (m->embed_lent) be->zero(ge, m->embed_lent); // (it held layer 0's activations: model_state.c)
    vocab_embed_bwd(m, ge, m->dres, N);
    if (m->grads_ready) m->grads_ready(m->grads_ready_ctx, -1);
}

void model_logits_row(const Model *m, int b, int t, float *out) {
    vocab_row_to_host(m, m->logits, m->B * m->T, b * m->T + t, out);
}
