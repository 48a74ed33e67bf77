// block.c — one transformer block, forward and backward (block.h): the attention norm, the attention
// variant (attention.h), the TP all-reduces around it (o_proj's partial sums; the input gradient), the
// residual-branch dropout and the residual adds, the FFN norm, the MoE layer (moe/); AMPipe's chunked
// forms, where chunk j's MoE exchange is in flight during chunk j+1's attention (model_state.h
// model_set_ampipe), and the MoE timing.
// Must not hold: the attention's arithmetic (attention.c), the allocation of activations (model_state.c),
// the embedding, final norm, LM head and loss, and the statistics over layers (model.c).
#include "model/block.h"
#include <string.h>
#include "core/common.h"
#include "model/attention.h"
#include "model/model_access.h"

#define F sizeof(float)

// Wall time for the MoE timing, after the backend's queued work (only while timing: 0 otherwise).
static double moe_clock(const Model *m) {
    if (!m->moe_timing) return 0;
    m->be->sync();
    return now_seconds();
}

// Residual-branch dropout of layer l's site (0 attention, 1 MoE) on the rows [r0, r1) of the current
// micro-batch's (N,d) activations (x: row r0), forward or (the same mask and scale) backward; the
// micro-batch's rows as one sequence of N, so row r is global token dp rank * N + r on any split.
static void drop_rows(const Model *m, float *x, int l, int site, int r0, int r1) {
    uint64_t seed = model_drop_seed(m);
    if (!seed || !(m->dropout > 0)) return;
    int N = m->B * m->T;
    m->be->dropout(x, 1, N, r0, r1, m->c.d_model, m->dropout, dropout_hash(seed, l, site),
                   (int64_t)comm_rank(m->mesh.dp) * N);
}

// The gradient reaching a dropped branch over rows [r0, r1): dres's rows, or with residual dropout a
// copy of them through the site's mask (in ddrop: the site's half, at the same rows; allocated once).
static const float *dropped_rows(Model *m, int l, int site, int r0, int r1) {
    size_t d = m->c.d_model;
    if (!model_drop_seed(m) || !(m->dropout > 0)) return m->dres + (size_t)r0 * d;
    if (!m->ddrop) m->ddrop = m->be->alloc((size_t)2 * m->maxN * d * F);
    // a half per site: AMPipe's backward keeps a chunk's MoE dy in flight while the o_proj rows are masked
    float *x = m->ddrop + ((size_t)(site == 0) * m->maxN + (size_t)r0) * d;
    m->be->copy(x, m->dres + (size_t)r0 * d, (size_t)(r1 - r0) * d * F);
    drop_rows(m, x, l, site, r0, r1);
    return x;
}

// AMPipe's chunk boundaries: chunk j = rows [R[j], R[j+1]) of N, R[j] = N j / n (R: n + 1 entries).
static void chunk_rows(int N, int n, int *R) {
    for (int j = 0; j <= n; j++) R[j] = (int)((int64_t)N * j / n);
}

// The attention block's output rows [r0, r1) and the MoE's input, in two parts around the TP
// all-reduce of the row-parallel o_proj's partial sums (over the TP ranks' heads): oproj_rows starts
// it (nonblocking: returned in flight; else done; NULL without TP), resid_norm_rows finishes it and adds
// x_mid = res_in + that, xn2 = norm(x_mid). attn_out_rows: the two with a blocking all-reduce.
static CommReq *oproj_rows(Model *m, LayerActs *a, int l, int r0, int r1, int nonblocking) {
    size_t d = m->c.d_model, n = (size_t)(r1 - r0);
    m->attv->out_rows(m, l, &a->attn, a->x_mid + r0 * d, r0, r1);
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
                           model_param(m, m->params, PR_FFN_NORM, l, -1), (int)n, (int)d, c->norm_eps);
}
static void attn_out_rows(Model *m, LayerActs *a, int l, int r0, int r1) {
    resid_norm_rows(m, a, l, r0, r1, oproj_rows(m, a, l, r0, r1, 0));
}

// The block's output rows [r0, r1): out = x_mid + the MoE's. Without residual dropout the MoE writes them
// itself (moe_finish's res: the add joined to its combine, the same bits); with it, its output goes to
// moe_out, is masked, then added. moe_dst / moe_res: where moe_finish writes and what it adds; out_rows: the
// rest.
static int joined(const Model *m) { return !model_drop_seed(m) || !(m->dropout > 0); }
static float *moe_dst(const Model *m, float *out, int r0) {
    return (joined(m) ? out : m->moe_out) + (size_t)r0 * m->c.d_model;
}
static const float *moe_res(const Model *m, const LayerActs *a, int r0) {
    return joined(m) ? a->x_mid + (size_t)r0 * m->c.d_model : NULL;
}
static void out_rows(const Model *m, const LayerActs *a, int l, float *out, int r0, int r1) {
    if (joined(m)) return;
    size_t d = m->c.d_model, n = (size_t)(r1 - r0);
    drop_rows(m, m->moe_out + r0 * d, l, 1, r0, r1);
    m->be->add(out + r0 * d, a->x_mid + r0 * d, m->moe_out + r0 * d, n * d);
}

// The capacity budgets of AMPipe's chunks (all routed): n = 1's drops. The micro-batch's tokens in
// global order are (DP rank, row); chunk j's rows on stage rank s = dp TP + tp are the tp-th slice of
// rows [R_j, R_j+1): segments ordered (dp, j, tp), each a run of consecutive tokens, so a prefix of
// the global order meets each segment in a prefix of it. router_budget over the segments gives
// each of mine its kept count; budget: (n, k, E), in the model's host scratch budget_h (allocated at the
// first use: (AMPIPE_MAX, k, E) budgets, then the stage's counts (S, k, E) and their segments
// (S * AMPIPE_MAX, k, E)).
static int64_t *chunk_budgets(Model *m, LayerActs *a, int n) {
    const ModelConfig *c = &m->c;
    int E = c->n_experts, k = c->top_k, TP = comm_size(m->mesh.tp), S = comm_size(a->mc[0].cm.stage);
    int me = comm_rank(a->mc[0].cm.stage), DP = S / TP, Sg = S * n;
    size_t ke = (size_t)k * E;
    if (!m->budget_h)
        m->budget_h = xmalloc(sizeof(int64_t) * ke * (AMPIPE_MAX + (size_t)S * (1 + AMPIPE_MAX)));
    int64_t *budget = m->budget_h, *per = budget + AMPIPE_MAX * ke, *all = per + S * ke, Ng = 0;
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
    return budget;
}

// The block from the attention on over n > 1 AMPipe chunks: chunk j's exchange in flight during chunk
// j+1's attention (model_state.h model_set_ampipe).
static void forward_chunked(Model *m, LayerActs *a, int l, float *out, int T, int n, uint64_t seed,
                            const MoeWeights *w) {
    const ModelConfig *c = &m->c;
    const AttnVariant *at = m->attv;
    int N = m->B * T, d = c->d_model;
    int64_t row0 = (int64_t)comm_rank(m->mesh.dp) * N;
    CHECK(a->nmc == n, "layer %d: %d AMPipe chunk states for %d chunks", l, a->nmc, n);
    MoeLayer *mc = a->mc, *part[AMPIPE_MAX];
    int R[AMPIPE_MAX + 1] = {0};
    chunk_rows(N, n, R);
    for (int j = 0; j < n; j++) {
        part[j] = &mc[j];
        mc[j].overlap = m->moe_overlap[l];
        mc[j].mode = m->moe_mode[l];
        mc[j].fp8_dispatch = m->fp8_dispatch;
        mc[j].early_dispatch = 1;
        mc[j].chunk_part = 1;
        mc[j].seq_len = T;
    }
    int cap = c->dispatch == DISPATCH_CAPACITY;
    at->fwd_rows(m, l, &a->attn, T, R[0], R[1]);
    CommReq *ar = oproj_rows(m, a, l, R[0], R[1], 1);
    for (int j = 0; j < n; j++) {
        // chunk j's TP all-reduce (and, dropless, chunk j-1's dispatch) in flight during chunk j+1's
        // attention
        if (j + 1 < n) at->fwd_rows(m, l, &a->attn, T, R[j + 1], R[j + 2]);
        resid_norm_rows(m, a, l, R[j], R[j + 1], ar);
        moe_route(&mc[j], a->xn2 + (size_t)R[j] * d, R[j + 1] - R[j], w, c, seed, row0 + R[j]);
        if (!cap) {
            moe_start(&mc[j], w, c, NULL);
            if (j > 0) {
                moe_finish(&mc[j - 1], moe_dst(m, out, R[j - 1]), moe_res(m, a, R[j - 1]), w);
                out_rows(m, a, l, out, R[j - 1], R[j]);
            }
        }
        if (j + 1 < n) ar = oproj_rows(m, a, l, R[j + 1], R[j + 2], 1);
    }
    if (cap) { // every chunk routed: the whole micro-batch's budgets, then the exchanges pipelined
        int64_t *budget = chunk_budgets(m, a, n);
        size_t ke = (size_t)c->top_k * c->n_experts;
        moe_start(&mc[0], w, c, budget);
        for (int j = 0; j < n; j++) {
            if (j + 1 < n) moe_start(&mc[j + 1], w, c, budget + (j + 1) * ke);
            moe_finish(&mc[j], moe_dst(m, out, R[j]), moe_res(m, a, R[j]), w);
            out_rows(m, a, l, out, R[j], R[j + 1]);
        }
    } else {
        moe_finish(&mc[n - 1], moe_dst(m, out, R[n - 1]), moe_res(m, a, R[n - 1]), w);
        out_rows(m, a, l, out, R[n - 1], N);
    }
    moe_stats_merge(part, n, &a->moe);
    a->moe.dropped = 0;
    for (int j = 0; j < n; j++) a->moe.dropped += mc[j].dropped;
}

void block_forward(Model *m, int l, float *out, int B, int T, int n, uint64_t seed) {
    const ModelConfig *c = &m->c;
    LayerActs *a = &m->la[l];
    int N = B * T;
    if (m->be->fp8_site)
        m->be->fp8_site(l); // (FP8: the attention's products under --fp8-dense are layer l's)
    m->be->rmsnorm_fwd_hid(a->xn1, a->rstd1, a->res_in, model_param(m, m->params, PR_ATTN_NORM, l, -1), N,
                           c->d_model, c->norm_eps);
    m->attv->fwd_in(m, l, &a->attn, a->xn1, B, T);
    MoeWeights w;
    model_moe_weights(m, m->params, l, &w);
    double t0 = moe_clock(m); // (with moe_timing: the block from attention on)
    a->nrun = n;
    if (n == 1) {
        m->attv->fwd_rows(m, l, &a->attn, T, 0, N);
        attn_out_rows(m, a, l, 0, N);
        a->moe.overlap = m->moe_overlap[l];
        a->moe.mode = m->moe_mode[l];
        a->moe.fp8_dispatch = m->fp8_dispatch;
        a->moe.seq_len = T;
        moe_forward(&a->moe, moe_dst(m, out, 0), moe_res(m, a, 0), a->xn2, N, &w, c, seed,
                    (int64_t)comm_rank(m->mesh.dp) * N);
        out_rows(m, a, l, out, 0, N);
    } else {
        forward_chunked(m, a, l, out, T, n, seed, &w);
    }
    if (m->moe_timing) m->moe_time[l] += moe_clock(m) - t0;
}

// The backward of the rows [r0, r1) between the MoE and attention: the FFN norm (into dres: the
// gradient of x_mid) and the attention's output projection, from m->dxn (the MoE input's gradient) and
// m->dres (through the attention output's dropout mask).
static void mid_bwd(Model *m, LayerActs *a, int l, int r0, int r1) {
    size_t d = m->c.d_model, n = (size_t)(r1 - r0);
    m->be->rmsnorm_bwd(m->dres + r0 * d, model_param(m, m->grads, PR_FFN_NORM, l, -1), m->dxn + r0 * d,
                       a->x_mid + r0 * d, model_param(m, m->params, PR_FFN_NORM, l, -1), a->rstd2 + r0,
                       (int)n, (int)d);
    m->attv->bwd_out_rows(m, l, &a->attn, dropped_rows(m, l, 0, r0, r1), r0, r1);
}

// Layer l's MoE weight gradients (the shared expert's where w has one; a dense layer's MLP's).
static void moe_grads(Model *m, int l, const MoeWeights *w, MoeGrads *gw) {
    float *g = m->grads;
    if (!w->router) { // a dense layer: its MLP's
        *gw = (MoeGrads){.sh_w1 = model_param(m, g, PR_D_W1, l, -1),
                         .sh_w3 = model_param(m, g, PR_D_W3, l, -1),
                         .sh_w2 = model_param(m, g, PR_D_W2, l, -1)};
        return;
    }
    gw->router = model_param(m, g, PR_ROUTER, l, -1);
    gw->w1 = model_expert_dw(m, PR_W1, l); // (packed: where the grouped ops write the bf16 values)
    gw->w3 = model_expert_dw(m, PR_W3, l);
    gw->w2 = model_expert_dw(m, PR_W2, l);
    gw->sh_w1 = w->sh_w1 ? model_param(m, g, PR_SH_W1, l, -1) : NULL;
    gw->sh_w3 = w->sh_w1 ? model_param(m, g, PR_SH_W3, l, -1) : NULL;
    gw->sh_w2 = w->sh_w1 ? model_param(m, g, PR_SH_W2, l, -1) : NULL;
    gw->sh_gate = w->sh_gate ? model_param(m, g, PR_SH_GATE, l, -1) : NULL;
    gw->fresh =
        m->dw_fresh ? m->dw_fresh[l] & DW_FRESH_EXPERTS : 0; // (moe clears it at its first expert write)
    gw->packed = m->expert_gbf == OPTG_PACKED;
    gw->sumsq = m->dw_sumsq;
}

void block_backward(Model *m, int l, float aux_scale, float z_scale) {
    const ModelConfig *c = &m->c;
    const AttnVariant *at = m->attv;
    int B = m->B, T = m->T, N = B * T, d = c->d_model, L = config_moe_layers(c);
    LayerActs *a = &m->la[l];
    // MoE block: out = x_mid + moe(norm(x_mid)); with AMPipe chunks (the forward's MoE states
    // a->mc) chunk by chunk in reverse, each with its rows of the norm, o_proj and attention
    MoeWeights w;
    MoeGrads gw;
    model_moe_weights(m, m->params, l, &w);
    moe_grads(m, l, &w, &gw);
    int n = a->nrun;
    if (m->be->fp8_site) m->be->fp8_site(l);
    at->bwd_begin(m, l, &a->attn, B, T);
    double t0 = moe_clock(m);
    if (n == 1) {
        // the MoE output's gradient through its dropout mask (dres itself without dropout); it writes dxn
        moe_backward(&a->moe, &m->ms, m->dxn, dropped_rows(m, l, 1, 0, N), a->xn2, &w, &gw, c, aux_scale / L,
                     z_scale / L);
        mid_bwd(m, a, l, 0, N);
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
            mid_bwd(m, a, l, R[j], R[j + 1]);
            if (j > 0) moe_backward_start(&a->mc[j - 1], &m->ms, dropped_rows(m, l, 1, R[j - 1], R[j]));
            at->bwd_rows(m, l, &a->attn, T, R[j], R[j + 1]);
        }
    }
    if (m->dw_fresh)
        m->dw_fresh[l] &= (uint8_t)~DW_FRESH_EXPERTS; // the layer's expert gradients are written now
    if (m->moe_timing) m->moe_time[l] += moe_clock(m) - t0;
    // attention block: x_mid = res_in + o(attn(...)) (n = 1: the attention's backward at once)
    if (n == 1) at->bwd_rows(m, l, &a->attn, T, 0, N);
    at->bwd_in(m, l, &a->attn, m->dxn, a->xn1, B, T);
    // column-parallel input projections: each TP rank holds part of dxn1
    if (comm_size(m->mesh.tp) > 1) comm_dev_allreduce(m->mesh.tp, m->dxn, (size_t)N * d, CT_F32);
    m->be->rmsnorm_bwd(m->dres, model_param(m, m->grads, PR_ATTN_NORM, l, -1), m->dxn, a->res_in,
                       model_param(m, m->params, PR_ATTN_NORM, l, -1), a->rstd1, N, d);
}
