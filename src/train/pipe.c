// pipe.c — one pipeline action with its messages (see pipe.h).
#include "train/pipe.h"
#include <string.h>
#include "core/common.h"

// A backward's outgoing gradient (backend memory) and HF fractions, with their sends.
struct PipeSendBuf {
    float *g;
    double *hf;
    CommReq *req[2];
};

// Tags: messages into virtual stage k: 4k (activations), 4k+1 (carry); gradients into k: 4k+2, 4k+3. MTP
// (model.h): over S virtual stages, 4S (the embedding output into the last), 4S+1 (its gradient into the
// first).
enum { TAG_ACT = 0, TAG_CARRY = 1, TAG_GRAD = 2, TAG_HF = 3 };

void pipe_init(Pipe *p, Model *m, const Comm *pp, int vpp) {
    memset(p, 0, sizeof *p);
    p->m = m;
    p->pp = pp;
    p->stages = comm_size(pp);
    p->stage = comm_rank(pp);
    p->vpp = vpp;
    p->ncarry = 3 + 2 * m->c.n_experts;
    p->soff[0] = 0;
    for (int c = 0; c < m->nchunks; c++) p->soff[c + 1] = p->soff[c] + m->nslots[c];
    p->carry = xcalloc((size_t)p->soff[m->nchunks] * p->ncarry, sizeof(double));
    p->sreq = xcalloc((size_t)p->soff[m->nchunks] * 3, sizeof(CommReq *));
}

static void finish(CommReq **r) {
    if (*r) {
        comm_wait(*r);
        *r = NULL;
    }
}
// (i: a chunk-slot index, soff[chunk] + slot)
static void wait_slot(Pipe *p, int i) {
    for (int j = 0; j < 3; j++) finish(&p->sreq[i * 3 + j]);
}

// A send buffer whose sends have completed (polled), or a new one.
static struct PipeSendBuf *free_buf(Pipe *p) {
    for (int i = 0; i < p->npool; i++) {
        struct PipeSendBuf *b = &p->pool[i];
        for (int j = 0; j < 2; j++)
            if (b->req[j] && comm_test(b->req[j])) finish(&b->req[j]);
        if (!b->req[0] && !b->req[1]) return b;
    }
    p->pool = xrealloc(p->pool, sizeof *p->pool * (size_t)(p->npool + 1));
    struct PipeSendBuf *b = &p->pool[p->npool++];
    memset(b, 0, sizeof *b);
    b->g = p->m->be->alloc((size_t)p->m->maxN * p->m->c.d_model * sizeof(float));
    b->hf = xcalloc((size_t)p->m->c.n_experts, sizeof(double));
    return b;
}

void pipe_flush(Pipe *p) {
    for (int i = 0; i < p->soff[p->m->nchunks]; i++) wait_slot(p, i);
    for (int i = 0; i < p->npool; i++) {
        finish(&p->pool[i].req[0]);
        finish(&p->pool[i].req[1]);
    }
}

void pipe_free(Pipe *p) {
    pipe_flush(p);
    for (int i = 0; i < p->npool; i++) {
        p->m->be->free(p->pool[i].g);
        free(p->pool[i].hf);
    }
    free(p->pool);
    free(p->carry);
    free(p->sreq);
    memset(p, 0, sizeof *p);
}

static int vstage(const Pipe *p, int chunk) { return chunk * p->stages + p->stage; }
// MTP's embedding rows cross the pipeline (model.h): with stages, modules and targets.
static int mtp_moves(const Pipe *p, const int32_t *y) { return p->stages > 1 && p->m->c.mtp_depth && y; }
int pipe_first(const Pipe *p, int chunk) { return p->m->chunk[chunk].first; }
int pipe_last(const Pipe *p, int chunk) { return p->m->chunk[chunk].last; }

// Receives n elements from virtual stage k's rank into buf, waiting (counted as idle time).
static void recv_wait(Pipe *p, void *buf, size_t n, CommType t, int from_vs, int tag, int dev) {
    double t0 = now_seconds();
    int peer = from_vs % p->stages;
    CommReq *r = dev ? comm_dev_irecv(p->pp, buf, n, t, peer, tag) : comm_irecv(p->pp, buf, n, t, peer, tag);
    comm_wait(r);
    p->idle_s += now_seconds() - t0;
}

double pipe_forward(Pipe *p, int chunk, int slot, const int32_t *x, const int32_t *y, int B, int T,
                    float dloss, uint64_t noise_seed) {
    Model *m = p->m;
    int E = m->c.n_experts, k = vstage(p, chunk);
    size_t nd = (size_t)B * T * m->c.d_model;
    int cs = p->soff[chunk] + slot;
    wait_slot(p, cs); // received already (the slot's last backward came after the receiver's)
    model_use(m, chunk, slot);
    double *carry = p->carry + (size_t)cs * p->ncarry;
    if (!pipe_first(p, chunk)) {
        recv_wait(p, model_stage_in(m), nd, CT_F32, k - 1, 4 * k + TAG_ACT, 1);
        recv_wait(p, carry, p->ncarry, CT_F64, k - 1, 4 * k + TAG_CARRY, 0);
        m->aux = carry[0];
        m->z = carry[1];
        m->dropped = (int64_t)carry[2];
        memcpy(m->hf_fe, carry + 3, sizeof(double) * 2 * E); // hf_fe then hf_pe
    }
    int S = p->stages * p->vpp;
    if (mtp_moves(p, y) && pipe_last(p, chunk)) recv_wait(p, m->mtp_emb, nd, CT_F32, 0, 4 * S + TAG_ACT, 1);
    double loss = model_forward(m, x, y, B, T, dloss, noise_seed);
    if (mtp_moves(p, y) && pipe_first(p, chunk)) // (from the slot, as the output: kept until the backward)
        p->sreq[cs * 3 + 2] =
            comm_dev_isend(p->pp, model_stage_in(m), nd, CT_F32, p->stages - 1, 4 * S + TAG_ACT);
    if (!pipe_last(p, chunk)) {
        carry[0] = m->aux;
        carry[1] = m->z;
        carry[2] = (double)m->dropped;
        memcpy(carry + 3, m->hf_fe, sizeof(double) * 2 * E);
        int to = (k + 1) % p->stages;
        p->sreq[cs * 3] = comm_dev_isend(p->pp, model_stage_out(m), nd, CT_F32, to, 4 * (k + 1) + TAG_ACT);
        p->sreq[cs * 3 + 1] = comm_isend(p->pp, carry, p->ncarry, CT_F64, to, 4 * (k + 1) + TAG_CARRY);
    }
    return loss;
}

void pipe_backward(Pipe *p, int chunk, int slot, float aux_scale, float z_scale) {
    Model *m = p->m;
    int E = m->c.n_experts, k = vstage(p, chunk), hf = m->c.aux_form == AUX_HF;
    model_use(m, chunk, slot);
    size_t nd = (size_t)m->B * m->T * m->c.d_model;
    if (!pipe_last(p, chunk)) {
        recv_wait(p, m->dres, nd, CT_F32, k + 1, 4 * k + TAG_GRAD, 1);
        if (hf) recv_wait(p, m->hf_fe, E, CT_F64, k + 1, 4 * k + TAG_HF, 0);
    }
    int S = p->stages * p->vpp, mtp = p->stages > 1 && m->c.mtp_depth;
    if (mtp && pipe_first(p, chunk)) recv_wait(p, m->mtps.demb, nd, CT_F32, S - 1, 4 * S + TAG_GRAD, 1);
    model_backward(m, aux_scale, z_scale);
    if (mtp && pipe_last(p, chunk)) {
        struct PipeSendBuf *b = free_buf(p);
        m->be->copy(b->g, m->mtps.demb, nd * sizeof(float));
        b->req[0] = comm_dev_isend(p->pp, b->g, nd, CT_F32, 0, 4 * S + TAG_GRAD);
    }
    if (!pipe_first(p, chunk)) {
        struct PipeSendBuf *b = free_buf(p);
        int to = (k - 1) % p->stages;
        m->be->copy(b->g, m->dres, nd * sizeof(float));
        b->req[0] = comm_dev_isend(p->pp, b->g, nd, CT_F32, to, 4 * (k - 1) + TAG_GRAD);
        if (hf) {
            // HF's final F_i of this micro-batch: its layers' aux_f (per slot; m->hf_fe may belong to
            // a later forward by now)
            memcpy(b->hf, m->la[m->chunk[chunk].l0].moe.aux_f, sizeof(double) * E);
            b->req[1] = comm_isend(p->pp, b->hf, E, CT_F64, to, 4 * (k - 1) + TAG_HF);
        }
    }
}

void pipe_forward_all(Pipe *p, const int32_t *x, const int32_t *y, int B, int T) {
    for (int c = 0; c < p->vpp; c++) pipe_forward(p, c, 0, x, y, B, T, 0, 0);
    pipe_flush(p);
}

void pipe_losses(Pipe *p, float *out, int N) {
    if (p->m->losses && pipe_last(p, p->vpp - 1))
        p->m->be->to_host(out, p->m->losses, (size_t)N * sizeof(float));
    if (p->stages > 1) comm_bcast(p->pp, out, (size_t)N, CT_F32, p->stages - 1);
}

void pipe_logits_row(Pipe *p, int b, int t, float *out) {
    if (pipe_last(p, p->vpp - 1)) model_logits_row(p->m, b, t, out);
    if (p->stages > 1) comm_bcast(p->pp, out, (size_t)p->m->c.vocab_size, CT_F32, p->stages - 1);
}
