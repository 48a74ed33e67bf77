// moe_experts.c — the MoE layer's expert-side variants (see moe.h; called by moe.c only, through
// moe_experts.h): the pipelined exchange's chunks (Tutel's overlap degree r), the gathered expert mode
// (whole experts from the ETP slices), the shared expert (Qwen2-MoE), the per-sequence router
// statistics (--aux-scope sequence), the recomputation of the SwiGLU rows (--recompute moe), the
// flags of the experts' weight-gradient writes and the backward's rows (moe.h moe_bwd_rows: lean or not;
// moe_act_mem_old: MOE_ACT_MEM_OLD).
// Must not hold: the router, the dispatch plan or the layer's schedule (moe.c), or calls into moe.c.
#include "moe/moe_experts.h"
#include "moe/moe.h"
#include <string.h>
#include "core/common.h"

int moe_dw_flags(const MoeGrads *g, int first, int whole) {
    int w = first && g->fresh;
    CHECK(w || !g->packed,
          "moe_dw_flags: an accumulation into bf16 expert gradients (model_set_expert_grads OPTG_PACKED "
          "needs each written once a step: one micro-batch, one chunk)");
    return w ? GM_DW_WRITE | (g->packed ? GM_DW_BF16 : 0) | (whole && g->sumsq ? GM_DW_SUMSQ : 0) : 0;
}

// Recomputation (m->rc): the layer's h1, h3, act are the shared buffers, grown to nf bytes each (and under
// rc->fp8 its own FP8 rows hq to its rows_cap rows: grown only where the forward's rows grow).
void moe_rc_rows(MoeLayer *m, size_t nf) {
    MoeRecompute *rc = m->rc;
    if (nf > rc->cap) {
        void **bf[] = {&rc->h1, &rc->h3, &rc->act};
        for (int i = 0; i < 3; i++) {
            if (*bf[i]) rc->be->free(*bf[i]);
            *bf[i] = rc->be->alloc(nf);
        }
        rc->cap = nf;
    }
    m->h1 = rc->h1;
    m->h3 = rc->h3;
    m->act = rc->act;
    if (rc->fp8) m->hq = moe_grown(m->be, m->arena, m->hq, &m->cap_q, 2 * m->rows_cap * fp8_row_bytes(m->fu));
}

// The expert-side rows of the last forward (the chunks' together where r > 1).
static int moe_rows_used(const MoeLayer *m) { return m->r > 1 ? (int)m->gstart[m->r] : m->xu->Rg; }

void moe_rc_keep(MoeLayer *m) {
    if (!m->rc || !m->rc->fp8) return;
    int n = moe_rows_used(m);
    m->be->fp8_rows_pack(m->hq, m->h1, n, m->fu);
    m->be->fp8_rows_pack((char *)m->hq + m->rows_cap * fp8_row_bytes(m->fu), m->h3, n, m->fu);
}

// ... and their contents again, before the backward: the forward's SwiGLU GEMMs on the kept inputs
// (the expert rows and weights it used: the same kernels on the same operands, the same bits); under
// rc->fp8 h1 and h3 unpacked from hq (act is the backward's to compute: moe_act_kept NULL).
void moe_rc_recompute(MoeLayer *m, const MoeWeights *wu) {
    int r = m->r, d = m->d, fu = m->fu, El = m->El;
    const Backend *be = m->be;
    moe_rc_rows(m, moe_rows_bytes(m));
    if (m->rc->fp8) {
        int n = moe_rows_used(m);
        be->fp8_rows_unpack(m->h1, m->hq, n, fu);
        be->fp8_rows_unpack(m->h3, (char *)m->hq + m->rows_cap * fp8_row_bytes(fu), n, fu);
        return;
    }
    if (r == 1) {
        be->grouped_swiglu_fwd(m->h1, m->h3, m->act, m->xgp, wu->w1, wu->w3, m->xu->off, El, d, fu);
        return;
    }
    for (int i = 0; i < r; i++) {
        size_t g = (size_t)m->gstart[i];
        be->grouped_swiglu_fwd(hid_at(be, m->h1, g * fu), hid_at(be, m->h3, g * fu),
                               hid_at(be, m->act, g * fu), hid_at(be, m->xg, g * d), wu->w1, wu->w3,
                               m->xc[i].off, El, d, fu);
    }
}

// ---- the shared expert (Qwen2-MoE) on my slice x (Ns,d), added into y (Ns,d):
// y += g * (silu(x W1^T) * (x W3^T)) W2^T, g = sigmoid(x w_gate) per token (1 without a gate); a dense
// layer's MLP (m->dense): y = (silu(x W1^T) * (x W3^T)) W2^T written, and its backward writes dx.
// Its SwiGLU runs as one group of the routed experts' fused ops (ops.h: the GEMM epilogue computes
// it; its rows, the input's too, in the hidden format); on the cpu the same sums as plain matmuls.
void moe_shared_forward(MoeLayer *m, float *y, const float *x, const MoeWeights *w) {
    const Backend *be = m->be;
    int Ns = m->Ns, d = m->d, fs = m->fs;
    m->sh_off[0] = 0;
    m->sh_off[1] = Ns;
    be->gather_rows_hid(m->sh_x, x, 0, m->ident, Ns, d);
    be->grouped_swiglu_fwd(m->sh_h1, m->sh_h3, m->sh_act, m->sh_x, w->sh_w1, w->sh_w3, m->sh_off, 1, d, fs);
    if (m->dense) { // a dense layer: the MLP's output is the layer's (written)
        be->grouped_down_fwd(y, m->sh_act, w->sh_w2, m->sh_off, 1, fs, d);
        return;
    }
    be->grouped_down_fwd(m->sh_y, m->sh_act, w->sh_w2, m->sh_off, 1, fs, d);
    if (!w->sh_gate) {
        be->combine_rows(y, NULL, m->sh_y, m->ident, NULL, Ns, 1, d, 1);
        return;
    }
    be->matmul_fwd(m->sh_g, x, w->sh_gate, Ns, d, 1, 0);
    be->sigmoid_fwd(m->sh_g, m->sh_g, (size_t)Ns);
    be->combine_rows(y, NULL, m->sh_y, m->ident, m->sh_g, Ns, 1, d, 1);
}

// Its backward for dy (Ns,d): dx (Ns,d) += d/dx, the weights' gradients += (this rank's tokens).
void moe_shared_backward(MoeLayer *m, MoeScratch *s, float *dx, const float *dy, const float *x,
                         const MoeWeights *w, MoeGrads *g) {
    const Backend *be = m->be;
    int Ns = m->Ns, d = m->d, fs = m->fs;
    if (w->sh_gate) { // d(sh_y) = g dy; dg = <dy, sh_y>; d(gate logit) = dg g (1 - g)
        be->gather_dot_scale(s->sh_dy, s->sh_dg, dy, m->ident, m->sh_y, m->sh_g, Ns, d, 1);
        be->sigmoid_bwd(s->sh_dg, s->sh_dg, m->sh_g, (size_t)Ns);
        be->matmul_bwd(dx, g->sh_gate, s->sh_dg, x, w->sh_gate, Ns, d, 1, GM_ACC_DINP);
    } else {
        be->gather_rows_hid(s->sh_dy, dy, 0, m->ident, Ns, d);
    }
    void *dh1 = s->lean_dh ? m->sh_h1 : s->sh_dh1, *dh3 = s->lean_dh ? m->sh_h3 : s->sh_dh3; // (moe.h)
    be->grouped_swiglu_bwd(dh1, dh3, g->sh_w2, s->sh_dy, m->sh_act, m->sh_h1, m->sh_h3, w->sh_w2, m->sh_off,
                           1, fs, d, 0);
    be->grouped_matmul_bwd2(dx, g->sh_w1, g->sh_w3, dh1, dh3, m->sh_x, w->sh_w1, w->sh_w3, m->sh_off, 1, d,
                            fs,
                            m->dense ? 0 : GM_ACC_DINP); // (a dense layer's: written)
}

// ---- the sequence-scope aux loss: each global sequence's counts and probability sums (my rows' share,
// summed over the stage), aux = mean over the sequences of E sum_i (cnt_si / T) (psum_si / T)
void moe_seq_alloc(MoeLayer *m, int S) {
    int E = m->E;
    if (S > m->seq_cap) {
        free(m->seq_f);
        free(m->seq_st);
        free(m->seq_dp_h);
        free(m->seq_seg);
        if (m->seq_dp) m->be->free(m->seq_dp);
        m->seq_f = xmalloc(sizeof(double) * (size_t)S * E);
        m->seq_st = xmalloc(sizeof(double) * (size_t)S * 2 * E);
        m->seq_dp = m->be->alloc(sizeof(float) * (size_t)(S + 2) * E); // my rows span at most S + 2 segments
        m->seq_dp_h = xmalloc(sizeof(float) * (size_t)(S + 2) * E);
        m->seq_seg = xmalloc(sizeof(int) * (size_t)(S + 3));
        m->seq_cap = S;
    }
    m->nseq = S;
}

void moe_seq_add(const MoeLayer *m, int T, double *st) {
    int E = m->E, k = m->k;
    for (int i = 0; i < m->Ns; i++) {
        double *sq = st + (size_t)((m->row0 + m->s0 + i) / T) * 2 * E;
        for (int j = 0; j < k; j++) sq[m->idx_h[(size_t)i * k + j]] += 1;
        const float *p = m->probs_h + (size_t)i * E;
        double P = 1; // sigmoid scores: each row's over their sum (ops.h router_topk's sums)
        if (m->sigmoid) {
            P = 0;
            for (int e = 0; e < E; e++) P += p[e];
        }
        for (int e = 0; e < E; e++) sq[E + e] += m->sigmoid ? p[e] / P : p[e];
    }
}

void moe_seq_finish(MoeLayer *m, int T) {
    int S = m->nseq, E = m->E;
    comm_allreduce(m->cm.stage, m->seq_st, (size_t)S * 2 * E, CT_F64);
    double aux = 0;
    for (int s = 0; s < S; s++) {
        double a = 0;
        for (int e = 0; e < E; e++) {
            double f = m->seq_st[(size_t)s * 2 * E + e] / T;
            m->seq_f[(size_t)s * E + e] = f;
            a += f * (m->seq_st[(size_t)s * 2 * E + E + e] / T);
        }
        aux += E * a;
    }
    m->aux = aux / S;
}

void moe_seq_stats(MoeLayer *m) {
    int T = m->seq_len;
    CHECK(T >= 1 && m->Ng % T == 0, "aux scope sequence: %lld tokens are not whole sequences of %d",
          (long long)m->Ng, T);
    moe_seq_alloc(m, (int)(m->Ng / T));
    memset(m->seq_st, 0, sizeof(double) * (size_t)m->nseq * 2 * m->E);
    moe_seq_add(m, T, m->seq_st);
    moe_seq_finish(m, T);
}

// ---- the gathered expert mode: whole experts from the ETP slices, and the gradients back
// Row maps (built once): w1/w3 whole row e*f + p*fl + i is rank p's row e*fl + i (rows of d); w2 whole
// row (e*d + r)*S + p (rows of fl) is rank p's row e*d + r; the inverses map back to rank-major order.
void moe_gathered_setup(MoeLayer *m) {
    if (m->wfull) return;
    const Backend *be = m->be;
    int S = comm_size(m->cm.etp), El = m->El, fl = m->fl, f = fl * S, d = m->d;
    size_t n13 = (size_t)El * f, n2 = (size_t)El * d * S, w = (size_t)El * f * d;
    m->wfull = be->alloc(3 * w * F);
    m->wstage = be->alloc(w * F);
    int32_t *ix = xmalloc(sizeof(int32_t) * 2 * (n13 + n2));
    int32_t *i13 = ix, *i2 = ix + n13, *v13 = i2 + n2, *v2 = v13 + n13;
    for (int p = 0; p < S; p++)
        for (int e = 0; e < El; e++) {
            for (int i = 0; i < fl; i++) {
                int32_t whole = e * f + p * fl + i, part = (p * El + e) * fl + i;
                i13[whole] = part;
                v13[part] = whole;
            }
            for (int r = 0; r < d; r++) {
                int32_t whole = (e * d + r) * S + p, part = (p * El + e) * d + r;
                i2[whole] = part;
                v2[part] = whole;
            }
        }
    m->widx = be->alloc(sizeof(int32_t) * 2 * (n13 + n2));
    be->to_device(m->widx, ix, sizeof(int32_t) * 2 * (n13 + n2));
    free(ix);
    exchange_init(&m->xe, be, m->cm.ep, NULL, m->cm.epn, m->cm.epx, El, d, m->Rmax);
    m->etp_cnt = xcalloc(S, sizeof(size_t));
}

// The layer's slices all-gathered over ETP into whole experts (m->wfull: w1, w3, w2), into *wf.
void moe_gather_experts(MoeLayer *m, const MoeWeights *w, MoeWeights *wf) {
    const Backend *be = m->be;
    int S = comm_size(m->cm.etp), El = m->El, fl = m->fl, f = fl * S, d = m->d;
    size_t n13 = (size_t)El * f, n2 = (size_t)El * d * S, ws = (size_t)El * fl * d;
    float *w1 = m->wfull, *w3 = w1 + (size_t)El * f * d, *w2 = w3 + (size_t)El * f * d;
    const float *src[3] = {w->w1, w->w3, w->w2};
    float *dst[3] = {w1, w3, w2};
    for (int t = 0; t < 3; t++) {
        comm_dev_allgather(m->cm.etp, src[t], m->wstage, ws, CT_F32);
        if (t < 2) be->gather_rows(dst[t], m->wstage, m->widx, (int)n13, d);
        else be->gather_rows(dst[t], m->wstage, m->widx + n13, (int)n2, fl);
    }
    *wf = (MoeWeights){.router = w->router, .w1 = w1, .w3 = w3, .w2 = w2};
}

// Gathered mode's backward: whole-expert gradients (zeroed) for the grouped ops to add into.
void moe_gathered_grads(MoeLayer *m, MoeScratch *s, MoeGrads *gf) {
    const Backend *be = m->be;
    size_t w = (size_t)m->El * m->fu * m->d;
    if (w * F > s->cap_g) {
        float **b[] = {&s->gfull, &s->gstage, &s->gslice};
        size_t n[] = {3 * w, w, w};
        for (int i = 0; i < 3; i++) {
            if (*b[i]) be->free(*b[i]);
            *b[i] = be->alloc(n[i] * F);
        }
        s->cap_g = w * F;
    }
    be->zero(s->gfull, 3 * w * F);
    *gf = (MoeGrads){.router = NULL, .w1 = s->gfull, .w3 = s->gfull + w, .w2 = s->gfull + 2 * w};
}

// ... and their sum over the ETP group, each rank's slice added into its gradients.
void moe_scatter_grads(MoeLayer *m, MoeScratch *s, const MoeGrads *gf, MoeGrads *g) {
    const Backend *be = m->be;
    int S = comm_size(m->cm.etp), El = m->El, fl = m->fl, f = fl * S, d = m->d;
    size_t n13 = (size_t)El * f, n2 = (size_t)El * d * S, ws = (size_t)El * fl * d;
    size_t *cnt = m->etp_cnt;
    for (int p = 0; p < S; p++) cnt[p] = ws;
    CHECK(!g->packed,
          "moe_scatter_grads: the gathered expert mode's gradients are summed over ETP: not packed in bf16");
    const float *whole[3] = {gf->w1, gf->w3, gf->w2};
    float *mine[3] = {g->w1, g->w3, g->w2};
    for (int t = 0; t < 3; t++) {
        if (t < 2) be->gather_rows(s->gstage, whole[t], m->widx + n13 + n2, (int)n13, d);
        else be->gather_rows(s->gstage, whole[t], m->widx + 2 * n13 + n2, (int)n2, fl);
        comm_dev_reduce_scatter(m->cm.etp, s->gstage, s->gslice, cnt, CT_F32);
        if (g->fresh) be->copy(mine[t], s->gslice, ws * F); // nothing there yet this step (MoeGrads.fresh)
        else be->axpy(mine[t], s->gslice, 1.0f, ws);
    }
}

// The chunks of the pipelined exchange: chunk i takes rows [kept[e] i/r, kept[e] (i+1)/r) of each
// expert's block (off[e] = plan.off[e]), so every chunk is expert-sorted too; its routes (collective
// over EP/ETP, every rank in the same order), the chunk-major order of my rows (cidx) and its inverse.
// A chunk sends at most ceil(kept[e] / r) rows of each expert e.
void moe_plan_chunks(MoeLayer *m, const int64_t *kept) {
    const Backend *be = m->be;
    int r = m->r, E = m->E, M = m->plan.M, R = m->Rmax ? m->Rmax : 1;
    if (!m->cidx_h) {
        m->cidx_h = xmalloc(sizeof(int32_t) * 2 * (size_t)R);
        m->kc_h = xmalloc(sizeof(int64_t) * E);
    }
    int32_t *ci = m->cidx_h, *ici = ci + R;
    int64_t *kc = m->kc_h, p = 0;
    m->gstart[0] = 0;
    for (int i = 0; i < r; i++) {
        m->cstart[i] = p;
        for (int e = 0; e < E; e++) {
            int64_t lo = m->plan.off[e] + kept[e] * i / r, hi = m->plan.off[e] + kept[e] * (i + 1) / r;
            for (int64_t row = lo; row < hi; row++) {
                ci[p] = (int32_t)row;
                ici[row] = (int32_t)p;
                p++;
            }
            kc[e] = hi - lo;
        }
        if (!m->xc[i].be)
            exchange_init(&m->xc[i], be, m->cm.ep, m->cm.etp, m->cm.epn, m->cm.epx, m->El, m->d,
                          (R + r - 1) / r + E);
        exchange_plan(&m->xc[i], kc);
        m->gstart[i + 1] = m->gstart[i] + m->xc[i].Rg;
    }
    m->cstart[r] = p;
    if (!m->cidx) { // R rows at most: both maps in one block, and the chunk-major row buffers
        m->cidx = be->alloc(sizeof(int32_t) * (size_t)(m->Rmax ? m->Rmax : 1) * 2);
        m->icidx = m->cidx + (m->Rmax ? m->Rmax : 1);
        m->xsc = be->alloc((size_t)(m->Rmax ? m->Rmax : 1) * m->d * hid_size(be));
        m->ysc = be->alloc((size_t)(m->Rmax ? m->Rmax : 1) * m->d * F);
    }
    be->to_device(m->cidx, ci, sizeof(int32_t) * M);
    be->to_device(m->icidx, ici, sizeof(int32_t) * M);
}

// The experts over r chunks, pipelined: chunk i+1's dispatch and chunk i's combine are in flight
// while chunk i's GEMMs run. xs (M,d) my rows in expert order -> ys (M,d) their outputs.
void moe_experts_chunked(MoeLayer *m, const MoeWeights *w) {
    const Backend *be = m->be;
    int r = m->r, d = m->d, fl = m->fl, El = m->El, M = m->plan.M;
    be->gather_rows_hid(m->xsc, m->xs, 1, m->cidx, M, d);
    exchange_dispatch_start(&m->xc[0], m->xsc, m->fp8_dispatch);
    for (int i = 0; i < r; i++) {
        size_t g = (size_t)m->gstart[i];
        void *xg = hid_at(be, m->xg, g * d);
        float *yg = m->yg + g * d;
        exchange_dispatch_finish(&m->xc[i], hid_at(be, m->xsc, m->cstart[i] * d), xg);
        if (i + 1 < r)
            exchange_dispatch_start(&m->xc[i + 1], hid_at(be, m->xsc, m->cstart[i + 1] * d), m->fp8_dispatch);
        void *act = hid_at(be, m->act, g * fl);
        be->grouped_swiglu_fwd(hid_at(be, m->h1, g * fl), hid_at(be, m->h3, g * fl), act, xg, w->w1, w->w3,
                               m->xc[i].off, El, d, fl);
        be->grouped_down_fwd(yg, act, w->w2, m->xc[i].off, El, fl, d);
        exchange_combine_start(&m->xc[i], yg, m->ysc + m->cstart[i] * d);
    }
    for (int i = 0; i < r; i++) exchange_combine_finish(&m->xc[i], NULL, m->ysc + m->cstart[i] * d);
    be->gather_rows(m->ys, m->ysc, m->icidx, M, d);
    m->ysp = m->ys;
}

// ---- the lean backward scratch (moe.h moe_scratch_init)
int moe_act_mem_old(void) {
    const char *v = getenv("MOE_ACT_MEM_OLD");
    if (v && *v && strcmp(v, "0") && strcmp(v, "1"))
        DIE("MOE_ACT_MEM_OLD must be 0 (the lean backward scratch, the default) or 1 (the scratch's own "
            "buffers), not '%s'",
            v);
    return v && !strcmp(v, "1");
}

float *moe_tp_dx(MoeScratch *s) {
    if (!s->dxj) s->dxj = s->be->alloc((size_t)s->maxN * s->d * F);
    return s->dxj;
}

void moe_bwd_rows(const MoeLayer *m, const MoeScratch *s, void **dh1, void **dh3, float **dxg) {
    *dh1 = s->lean_dh ? m->h1 : s->dh1;
    *dh3 = s->lean_dh ? m->h3 : s->dh3;
    *dxg = s->lean_rows ? m->yg : s->dxg;
}

// The experts' backward over the forward's r chunks, pipelined as the forward (chunk i+1's dy
// dispatch and chunk i's dx combine in flight during chunk i's GEMMs); the weight gradients add up
// chunk by chunk. s->dys (M,d) in my row order -> the returned dxs (M,d).
const float *moe_experts_bwd_chunked(MoeLayer *m, MoeScratch *s, const MoeWeights *w, MoeGrads *gw) {
    const Backend *be = m->be;
    int r = m->r, d = m->d, fl = m->fl, El = m->El, M = m->plan.M;
    size_t need = (size_t)(m->Rmax ? m->Rmax : 1) * d * F; // (dysc, in the hidden format, needs at most this)
    if (need > s->cap_c) {
        if (s->dysc) be->free(s->dysc);
        if (s->dxsc) be->free(s->dxsc);
        s->dysc = be->alloc(need);
        s->dxsc = be->alloc(need);
        s->cap_c = need;
    }
    be->gather_rows_hid(s->dysc, s->dys, 1, m->cidx, M, d);
    exchange_dispatch_start(&m->xc[0], s->dysc, 0);
    void *dh1b, *dh3b;
    float *dxgb;
    moe_bwd_rows(m, s, &dh1b, &dh3b, &dxgb);
    for (int i = 0; i < r; i++) {
        size_t g = (size_t)m->gstart[i];
        void *dyg = hid_at(be, s->dyg, g * d);
        float *dxg = dxgb + g * d;
        void *dh1 = hid_at(be, dh1b, g * fl), *dh3 = hid_at(be, dh3b, g * fl);
        exchange_dispatch_finish(&m->xc[i], hid_at(be, s->dysc, m->cstart[i] * d), dyg);
        if (i + 1 < r) exchange_dispatch_start(&m->xc[i + 1], hid_at(be, s->dysc, m->cstart[i + 1] * d), 0);
        int dwf = moe_dw_flags(gw, i == 0, 0); // the first chunk writes unwritten gradients
        be->grouped_swiglu_bwd(dh1, dh3, gw->w2, dyg, moe_act_kept(m, g * fl), hid_at(be, m->h1, g * fl),
                               hid_at(be, m->h3, g * fl), w->w2, m->xc[i].off, El, fl, d, dwf);
        be->grouped_matmul_bwd2(dxg, gw->w1, gw->w3, dh1, dh3, hid_at(be, m->xg, g * d), w->w1, w->w3,
                                m->xc[i].off, El, d, fl, dwf);
        exchange_combine_start(&m->xc[i], dxg, s->dxsc + m->cstart[i] * d);
    }
    for (int i = 0; i < r; i++) exchange_combine_finish(&m->xc[i], NULL, s->dxsc + m->cstart[i] * d);
    be->gather_rows(s->dxs, s->dxsc, m->icidx, M, d);
    return s->dxs;
}
