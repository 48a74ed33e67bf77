// vocab.c — the embedding and the LM head with its cross-entropy, whole or split over TP (vocab.h).
#include "model/vocab.h"
#include "core/common.h"
#include "model/model_access.h"

#define F sizeof(float)

int vocab_split(const Model *m) { return m->mesh.sl.vocab && comm_size(m->mesh.tp) > 1; }

int vocab_cols(const Model *m, int *v0) {
    int V = m->c.vocab_size, split = vocab_split(m), r = split ? comm_rank(m->mesh.tp) : 0,
        tp = split ? comm_size(m->mesh.tp) : 1;
    int a = (int)params_part_start(V, r, tp);
    if (v0) *v0 = a;
    return (int)params_part_start(V, r + 1, tp) - a;
}

// ids (N, host, each in [0, V)) as this rank's (id - v0; -1 where another rank's), to the device buffer dev.
static void local_ids(Model *m, int32_t *dev, const int32_t *ids, int N, const char *what) {
    int V = m->c.vocab_size, v0, Vl = vocab_cols(m, &v0);
    int32_t *h = m->vocab_ids;
    for (int i = 0; i < N; i++) {
        CHECK(ids[i] >= 0 && ids[i] < V, "%s %d at position %d is outside the vocabulary (%d)", what, ids[i],
              i, V);
        h[i] = ids[i] - v0 >= 0 && ids[i] - v0 < Vl ? ids[i] - v0 : -1;
    }
    m->be->to_device(dev, h, (size_t)N * sizeof(int32_t));
}

void vocab_embed_fwd(Model *m, float *out, const int32_t *ids, int N) {
    int d = m->c.d_model, Vl = vocab_cols(m, NULL);
    local_ids(m, m->tokens, ids, N, "token");
    m->be->embedding_fwd(out, m->tokens, model_param(m, m->params, PR_EMBED, -1, -1), N, d, Vl);
    if (vocab_split(m)) comm_dev_allreduce(m->mesh.tp, out, (size_t)N * d, CT_F32);
}

void vocab_embed_bwd(Model *m, float *dtable, const float *dout, int N) {
    m->be->embedding_bwd(dtable, dout, m->tokens, N, m->c.d_model, vocab_cols(m, NULL));
}

void vocab_head_fwd(Model *m, float *logits, float *losses, int32_t *tdev, const float *xn, const int32_t *t,
                    int N, float dloss) {
    const Backend *be = m->be;
    int d = m->c.d_model, Vl = vocab_cols(m, NULL);
    be->matmul_fwd(logits, xn, model_param(m, m->params, PR_LM_HEAD, -1, -1), N, d, Vl, 0);
    if (!t) return;
    local_ids(m, tdev, t, N, "target");
    if (!vocab_split(m)) {
        // (dlogits in the hidden format in place: the LM head's backward reads them so, GM_DOUT_HID)
        if (dloss != 0) be->cross_entropy_fwd_bwd(losses, logits, tdev, N, Vl, dloss);
        else be->cross_entropy_fwd(losses, logits, tdev, N, Vl);
        return;
    }
    int tp = comm_size(m->mesh.tp);
    double *part = m->vocab_parts, *all = part + 3 * (size_t)N;
    be->ce_part(part, logits, tdev, N, Vl);
    comm_dev_allgather(m->mesh.tp, part, all, 3 * (size_t)N, CT_F64);
    be->ce_finish(losses, logits, all, tdev, N, Vl, tp, dloss);
}

void vocab_head_bwd(Model *m, float *dxn, const float *dlogits, const float *xn, int N, int flags) {
    int d = m->c.d_model, Vl = vocab_cols(m, NULL);
    m->be->matmul_bwd(dxn, model_param(m, m->grads, PR_LM_HEAD, -1, -1), dlogits, xn,
                      model_param(m, m->params, PR_LM_HEAD, -1, -1), N, d, Vl, flags | GM_DOUT_HID);
    if (vocab_split(m)) comm_dev_allreduce(m->mesh.tp, dxn, (size_t)N * d, CT_F32);
}

void vocab_head_chunks(Model *m, float *logits, float *losses, int32_t *tdev, const float *xn,
                       const int32_t *t, int N, int T, int k, float dloss, float *dx) {
    int d = m->c.d_model, Vl = vocab_cols(m, NULL), rows = (int)params_chunk_len((size_t)N, m->loss_chunks);
    for (int r0 = 0; r0 < N; r0 += rows) {
        int n = N - r0 < rows ? N - r0 : rows;
        const float *x = xn + (size_t)r0 * d;
        vocab_head_fwd(m, logits, losses + r0, tdev + r0, x, t ? t + r0 : NULL, n, dx ? dloss : 0);
        if (!dx) continue;
        for (int r = r0; r < r0 + n; r++) // (a position without a target: no gradient)
            if (r % T >= T - k) m->be->zero(logits + (size_t)(r - r0) * Vl, Vl * F);
        vocab_head_bwd(m, dx + (size_t)r0 * d, logits, x, n, model_dw_write(m, -1, DW_FRESH_HEAD));
    }
}

void vocab_row_to_host(const Model *m, const float *logits, int N, int r, float *out) {
    int V = m->c.vocab_size, rows = (int)params_chunk_len((size_t)N, m->loss_chunks),
        r0 = (N - 1) / rows * rows;
    CHECK(r >= r0 && r < N, "vocab_row_to_host: row %d of %d is not in the last chunk's logits (from %d)", r,
          N, r0);
    const float *row = logits + (size_t)(r - r0) * vocab_cols(m, NULL);
    if (!vocab_split(m)) {
        m->be->to_host(out, row, (size_t)V * F);
        return;
    }
    int tp = comm_size(m->mesh.tp);
    size_t *counts = xmalloc(2 * sizeof(size_t) * tp), *displs = counts + tp;
    for (int q = 0; q < tp; q++) {
        displs[q] = (size_t)params_part_start(V, q, tp);
        counts[q] = (size_t)params_part_start(V, q + 1, tp) - displs[q];
    }
    comm_dev_allgatherv(m->mesh.tp, row, counts[comm_rank(m->mesh.tp)], (float *)m->vocab_parts, counts,
                        displs, CT_F32);
    m->be->to_host(out, (float *)m->vocab_parts, (size_t)V * F);
    free(counts);
}
