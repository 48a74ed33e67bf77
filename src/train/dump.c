// dump.c — moe eval --dump: the first validation batch's tensors and losses to a safetensors file (see
// dump.h).
#include "train/dump.h"
#include <string.h>
#include "core/common.h"
#include "io/safetensors.h"
#include <cjson/cJSON.h>

// HF Mixtral's load-balancing loss (transformers' load_balancing_loss_func) of the last forward:
// the router outputs of ALL layers taken as one set of L*N rows,
//   E * sum_e (assignments to e over all layers and slots / (L*N)) * (sum of p_e over those rows / (L*N)).
// (Our per-layer form averages E * sum_e f_e P_e over layers instead.) One process only.
static double eval_aux_hf(const Model *m) { // after a forward with host_router_out set on every layer
    int L = m->c.n_layers, E = m->c.n_experts, k = m->c.top_k;
    double *cnt = xcalloc((size_t)E, sizeof(double)), *P = xcalloc((size_t)E, sizeof(double));
    double rows = 0;
    for (int l = 0; l < L; l++) {
        const MoeLayer *a = &m->la[l].moe;
        if (a->dense) continue; // (no router)
        CHECK(a->Ns == a->N, "eval_aux_hf: one process only (this rank routes %d of %d tokens)", a->Ns, a->N);
        for (int t = 0; t < a->Ns; t++) {
            for (int j = 0; j < k; j++) cnt[a->idx_h[(size_t)t * k + j]] += 1;
            const float *p = a->probs_h + (size_t)t * E;
            double S = 1; // sigmoid scores: over their sum (as the aux statistics)
            if (a->sigmoid) {
                S = 0;
                for (int e = 0; e < E; e++) S += p[e];
            }
            for (int e = 0; e < E; e++) P[e] += a->sigmoid ? p[e] / S : p[e];
        }
        rows += a->Ns;
    }
    double s = 0;
    for (int e = 0; e < E; e++) s += (cnt[e] / rows) * (P[e] / rows);
    free(cnt);
    free(P);
    return rows ? s * E : 0;
}

static void meta_num(cJSON *j, const char *key, double v) {
    char b[40];
    snprintf(b, sizeof b, "%.17g", v);
    cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    cJSON_AddStringToObject(j, key, b);
}

void eval_dump(Model *m, const Dataset *ds, int B, const char *path, int grads, float aux_coef, float z_coef,
               const char *extra_meta) {
    const Backend *be = m->be;
    int T = ds->T, N = B * T, V = m->c.vocab_size, E = m->c.n_experts, L = m->c.n_layers;
    int32_t *x = xmalloc((size_t)N * 4), *y = xmalloc((size_t)N * 4);
    data_val_batch(ds, 0, B, x, y, NULL);
    float *tok = xmalloc((size_t)N * 2 * sizeof(float));
    for (int i = 0; i < N; i++) {
        tok[i] = (float)x[i];
        tok[N + i] = (float)y[i];
    }
    // forward: logits, per-token losses, router logits (and probs, for eval_aux_hf), aux and z
    for (int l = 0; l < L; l++) m->la[l].moe.host_router_out = 1;
    double loss = model_forward(m, x, y, B, T, 0, 0);
    for (int l = 0; l < L; l++) m->la[l].moe.host_router_out = 0;
    double aux = m->aux, aux_hf = eval_aux_hf(m), z = m->z;
    float *logits = xmalloc((size_t)N * V * sizeof(float)), *losses = xmalloc((size_t)N * sizeof(float));
    CHECK(m->loss_chunks == 1 && !m->mesh.sl.vocab, "eval_dump: the logits are not every row's and column's");
    be->to_host(logits, m->logits, (size_t)N * V * sizeof(float));
    be->to_host(losses, m->losses, (size_t)N * sizeof(float));
    float *rl = xmalloc((size_t)L * N * E * sizeof(float));
    for (int l = 0; l < L; l++) // (a dense layer's rows: zeros)
        if (m->la[l].moe.dense) memset(rl + (size_t)l * N * E, 0, (size_t)N * E * sizeof(float));
        else memcpy(rl + (size_t)l * N * E, m->la[l].moe.logits_h, (size_t)N * E * sizeof(float));
    float sc[4] = {(float)loss, (float)aux, (float)aux_hf, (float)z};

    int nt = 8 + L + (grads ? m->t.n : 0), n = 0;
    StTensor *ts = xcalloc((size_t)nt, sizeof *ts);
#define TENSOR(NAME, DATA, ND, S0, S1, S2) \
    do { \
        StTensor *q = &ts[n++]; \
        snprintf(q->name, sizeof q->name, "%s", NAME); \
        q->ndim = ND; \
        q->shape[0] = S0; \
        q->shape[1] = S1; \
        q->shape[2] = S2; \
        q->data = DATA; \
    } while (0)
    TENSOR("tokens", tok, 2, B, T, 0);
    TENSOR("targets", tok + N, 2, B, T, 0);
    TENSOR("logits", logits, 3, B, T, V);
    TENSOR("losses", losses, 2, B, T, 0);
    TENSOR("loss", sc, 1, 1, 0, 0);
    TENSOR("aux_loss", sc + 1, 1, 1, 0, 0);
    TENSOR("aux_loss_hf", sc + 2, 1, 1, 0, 0);
    TENSOR("z_loss", sc + 3, 1, 1, 0, 0);
    char nm[128];
    for (int l = 0; l < L; l++) {
        snprintf(nm, sizeof nm, "router_logits.%d", l);
        TENSOR(nm, rl + (size_t)l * N * E, 2, N, E, 0);
    }
    float *g = NULL;
    if (grads) {
        be->zero(m->grads, m->t.ltotal * sizeof(float));
        model_forward(m, x, y, B, T, 1.0f / (float)N, 0);
        model_backward(m, aux_coef, z_coef);
        g = xmalloc(m->t.ltotal * sizeof(float));
        be->to_host(g, m->grads, m->t.ltotal * sizeof(float));
        for (int i = 0; i < m->t.n; i++) {
            const ParamSpec *s = &m->t.p[i];
            CHECK(s->lnumel == s->numel, "eval_dump: gradients of a sliced model are not supported (%s)",
                  s->name);
            int k = snprintf(nm, sizeof nm, "grad.%s", s->name);
            CHECK(k > 0 && (size_t)k < sizeof nm, "eval_dump: tensor name too long: %s", s->name);
            TENSOR(nm, g + s->loffset, s->ndim, s->shape[0], s->ndim > 1 ? s->shape[1] : 0, 0);
        }
    }
#undef TENSOR
    cJSON *meta = extra_meta && extra_meta[0] ? cJSON_Parse(extra_meta) : cJSON_CreateObject();
    CHECK(cJSON_IsObject(meta), "eval_dump: extra metadata is not a JSON object");
    meta_num(meta, "loss", loss);
    meta_num(meta, "aux_loss", aux);
    meta_num(meta, "aux_loss_hf", aux_hf);
    meta_num(meta, "z_loss", z);
    meta_num(meta, "batch", B);
    meta_num(meta, "seq_len", T);
    if (grads) {
        meta_num(meta, "grad_aux_coef", aux_coef);
        meta_num(meta, "grad_z_coef", z_coef);
        cJSON_AddStringToObject(meta, "grad_loss",
                                m->c.mtp_depth
                                    ? "mean cross-entropy + mtp_weight * mtp_loss + grad_aux_coef * "
                                      "(aux_loss + mtp_aux_loss) + grad_z_coef * (z_loss + mtp_z_loss)"
                                    : "mean cross-entropy + grad_aux_coef * aux_loss + grad_z_coef * z_loss");
    }
    if (grads && m->c.mtp_depth) { // the MTP modules' terms of the gradients' objective (model_types.h)
        meta_num(meta, "mtp_weight", m->c.mtp_weight);
        meta_num(meta, "mtp_loss", m->mtp_loss);
        meta_num(meta, "mtp_aux_loss", m->mtp_aux);
        meta_num(meta, "mtp_z_loss", m->mtp_z);
    }
    char *mj = cJSON_PrintUnformatted(meta);
    cJSON_Delete(meta);
    safetensors_write(path, ts, n, mj);
    cJSON_free(mj);
    free(ts);
    free(g);
    free(rl);
    free(logits);
    free(losses);
    free(tok);
    free(x);
    free(y);
}
