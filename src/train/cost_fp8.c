// cost_fp8.c — the cost model's bytes of the FP8 table on the cuda backend (--precision fp8, fp8-bf16;
// src/ops/cuda/cuda_fp8_ops.cu and cuda_fp8_wcache.cu): its operands' scratch (cost_fp8_scratch) and the
// weight codes it keeps between ops (cost_fp8_kept), each as the code allocates them; --fp8-dense adds the
// attention projections' products. cost.c's cuda figure takes both. Must not hold: rates or seconds.
#include "train/cost_fp8.h"
#include <math.h>
#include "core/common.h"
#include "model/params.h"

static double al256(double bytes) { return ceil(bytes / 256) * 256; }

// cuda_fp8_ops.cu's operand needs of one grouped op on R rows over G groups (R / G each) of K -> O: the
// forward's (the rows' codes and 1 x 128 tile scales, the weights' codes and 128 x 128 block scales) or
// the backward's (the output gradient's tiles and the transposed weights for dinp; dout's and the input's
// transposed tiles, each group's rows padded to 128 columns, for dw), bytes, each piece 256-aligned.
static double fp8_need(double R, double G, double K, double O, int bwd) {
    double T = ceil(K / 128), TO = ceil(O / 128), P = G * ceil(R / G / 128) * 128;
    if (!bwd) return al256(R * K) + al256(4 * R * T) + al256(G * O * K) + al256(4 * G * TO * T);
    return al256(R * O) + al256(4 * R * TO) + al256(G * O * K) + al256(4 * G * T * TO) + al256(O * P) +
        al256(4 * O * P / 128) + al256(K * P) + al256(4 * K * P / 128);
}

// --fp8-dense's products of one attention layer in their order (K, O of each; returns how many): GQA's q, k,
// v, o; latent attention's [q_a | q_proj], kv_a's latent rows and its rope rows, q_b (where q_a), kv_b, o
static int fp8_dense_products(const ModelConfig *c, double *K, double *O) {
    double d = c->d_model, H = c->n_heads;
    if (!c->kv_lora_rank) {
        double qd = H * c->head_dim, kvd = (double)c->n_kv_heads * c->head_dim;
        double k[4] = {d, d, d, qd}, o[4] = {qd, kvd, kvd, d};
        for (int i = 0; i < 4; i++) K[i] = k[i], O[i] = o[i];
        return 4;
    }
    double qr = c->q_lora_rank, hq = (double)c->qk_nope_head_dim + c->qk_rope_head_dim;
    int n = 0;
    K[n] = d, O[n++] = qr ? qr : H * hq;
    K[n] = d, O[n++] = c->kv_lora_rank;
    K[n] = d, O[n++] = c->qk_rope_head_dim;
    if (qr) K[n] = qr, O[n++] = H * hq;
    K[n] = c->kv_lora_rank, O[n++] = H * ((double)c->qk_nope_head_dim + c->v_head_dim);
    K[n] = H * c->v_head_dim, O[n++] = d;
    return n;
}

// The FP8 table's scratch (cuda_fp8_ops.cu, --precision fp8 on the cuda backend; the weight codes it keeps
// between ops: cost_fp8_kept): two buffers, each grown to an op's need to the larger of the need and 1.25 x
// the buffer so far: the codes and scales of one grouped op's operands (fp8_need) and the float32 rows inside
// a fused op (h1 and h3 before the SwiGLU, dact before its backward). The needs in a step's order: the routed
// experts' up and down forward (the rank's Re rows over E / ep groups of d_ff / etp), the shared expert's (Ns
// rows, one group), then their backwards (down, then up); under --fp8-dense (dense) the attention
// projections' products (one group of Ns rows each, fp8_dense_products) before the first and after the last.
double cost_fp8_scratch(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int dense) {
    int tp = ms ? ms->tp : 1, ep = ms ? ms->ep : 1, etp = ms ? ms->etp : 1;
    double Ns = (double)((B * T + tp - 1) / tp), Re = (double)etp * Ns * c->top_k, d = c->d_model;
    double f = (double)(c->d_ff / etp), G = (double)(c->n_experts / ep),
           fs = c->n_shared_experts * (double)c->shared_d_ff;
    double dk[8], dO[8], q[8 + 16], cq = 0, cr = 0;
    int np = dense ? fp8_dense_products(c, dk, dO) : 0, nq = 0;
    for (int i = 0; i < np; i++) q[nq++] = fp8_need(Ns, 1, dk[i], dO[i], 0);
    double moe[8] = {fp8_need(Re, G, d, f, 0),           fp8_need(Re, G, f, d, 0),
                     fs ? fp8_need(Ns, 1, d, fs, 0) : 0, fs ? fp8_need(Ns, 1, fs, d, 0) : 0,
                     fp8_need(Re, G, f, d, 1),           fp8_need(Re, G, d, f, 1),
                     fs ? fp8_need(Ns, 1, fs, d, 1) : 0, fs ? fp8_need(Ns, 1, d, fs, 1) : 0};
    for (int i = 0; i < 8; i++) q[nq++] = moe[i];
    for (int i = np - 1; i >= 0; i--) q[nq++] = fp8_need(Ns, 1, dk[i], dO[i], 1);
    double rows[4] = {8 * Re * f, fs ? 8 * Ns * fs : 0, 4 * Re * f, fs ? 4 * Ns * fs : 0};
    for (int i = 0; i < nq; i++)
        if (q[i] > cq) cq = fmax(q[i], 1.25 * cq);
    for (int i = 0; i < 4; i++)
        if (al256(rows[i]) > cr) cr = fmax(al256(rows[i]), 1.25 * cr);
    return cq + cr;
}

// The FP8 table's weight codes kept between ops (cuda_fp8_wcache.cu, the cache on: its default), bytes, of
// the grouped weights the rank's table lt holds (NULL: the whole model's, built here): each layer's routed
// experts (w1, w3, w2 of its El held experts: G El), its shared experts' and a dense layer's MLP (G 1), as
// the code allocates them. A weight (G, O, K) is kept only where it starts at a multiple of 8 elements of the
// buffer (cuda_weights.cu cuda_bf16_shadow_of); a kept one has its transposed layout's allocation, al256 of
// the codes (G O K bytes) + al256 of the 128 x 128 block scales (4 G ceil(O/128) ceil(K/128)) + 256 (the
// non-finite count). The forward layouts live in two slots, each as large as the largest of its kind: the
// single weights' (w2's, and w1's and w3's where they are not paired: al256 of the codes + the block scales)
// and the pairs' (w1 and w3, both kept, where the fused up projection runs: O % 64 == 0, K % 16 == 0,
// G <= 256, on Hopper's kernel; al256 of 2 G O K codes + a scale per row and K-tile, 8 G O ceil(K/128)).
// (--fp8-weight-cache 0 keeps none: cost.h cost_fp8_tables; MOE_FP8_GEMM=ref and other GPUs run no pair: none
// counted apart.)
static double fp8_layout(double G, double O, double K, int transposed) {
    double scales = 4 * G * ceil(O / 128) * ceil(K / 128);
    return transposed ? al256(G * O * K) + al256(scales) + 256 : al256(G * O * K) + scales;
}
// the first held tensor of role r from index i on (-1: none)
static int fp8_held_from(const ParamTable *t, int i, ParamRole r) {
    while (i < t->n && !(t->p[i].role == r && t->p[i].lnumel)) i++;
    return i < t->n ? i : -1;
}
// --fp8-dense's kept codes: each projection weight held (lt) whose product's rows start at a multiple of 8
// elements keeps its transposed layout; its forward layout goes through the single weights' slot. kv_a's
// two products (its latent rows, then its rope rows) are two weights to the cache.
static void fp8_dense_kept(const ModelConfig *c, const ParamTable *t, double *kept, double *single) {
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        ParamRole r = p->role;
        if (!p->lnumel ||
            (r != PR_WQ && r != PR_WK && r != PR_WV && r != PR_WO && r != PR_QA && r != PR_QB &&
             r != PR_KVA && r != PR_KVB))
            continue;
        double K = (double)p->lshape[1], rows[2] = {(double)p->lshape[0], 0};
        int64_t start[2] = {p->loffset, 0};
        if (r == PR_KVA)
            rows[0] = c->kv_lora_rank, rows[1] = (double)p->lshape[0] - c->kv_lora_rank,
            start[1] = p->loffset + (int64_t)c->kv_lora_rank * p->lshape[1];
        for (int h = 0; h < 2; h++) {
            if (!rows[h] || start[h] % 8) continue;
            *kept += fp8_layout(1, rows[h], K, 1);
            *single = fmax(*single, fp8_layout(1, rows[h], K, 0));
        }
    }
}

double cost_fp8_kept(const ModelConfig *c, const ParamTable *lt, int dense) {
    static const ParamRole w1s[3] = {PR_W1, PR_SH_W1, PR_D_W1}, w3s[3] = {PR_W3, PR_SH_W3, PR_D_W3},
                           w2s[3] = {PR_W2, PR_SH_W2, PR_D_W2};
    ParamTable own;
    if (!lt) params_build(&own, c);
    const ParamTable *t = lt ? lt : &own;
    double kept = 0, single = 0, pairs = 0; // (the transposed layouts; the two forward slots)
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        int b = 0;
        while (b < 3 && p->role != w1s[b]) b++;
        if (b == 3 || !p->lnumel || (i > 0 && t->p[i - 1].role == p->role && t->p[i - 1].lnumel))
            continue; // (the first held tensor of a block only)
        int G = 0; // (the routed experts' block: the layer's held experts)
        while (i + G < t->n && t->p[i + G].role == p->role && t->p[i + G].layer == p->layer &&
               t->p[i + G].lnumel)
            G++;
        int i3 = fp8_held_from(t, i + G, w3s[b]), i2 = i3 < 0 ? -1 : fp8_held_from(t, i3 + G, w2s[b]);
        CHECK(i2 >= 0 && t->p[i3].layer == p->layer && t->p[i2].layer == p->layer,
              "cost_fp8_kept: layer %d's w1 without its w3 and w2", p->layer);
        const ParamSpec *w3 = &t->p[i3], *w2 = &t->p[i2];
        double O = (double)p->lshape[0], K = (double)p->lshape[1];
        int k1 = p->loffset % 8 == 0, k3 = w3->loffset % 8 == 0;
        int pair = k1 && k3 && p->lshape[0] % 64 == 0 && p->lshape[1] % 16 == 0 && G <= 256;
        kept += (k1 + k3) * fp8_layout(G, O, K, 1);
        if (pair) pairs = fmax(pairs, al256(2 * G * O * K) + 8 * G * O * ceil(K / 128));
        else if (k1 || k3) single = fmax(single, fp8_layout(G, O, K, 0));
        if (w2->loffset % 8 == 0) {
            kept += fp8_layout(G, (double)w2->lshape[0], (double)w2->lshape[1], 1);
            single = fmax(single, fp8_layout(G, (double)w2->lshape[0], (double)w2->lshape[1], 0));
        }
    }
    if (dense) fp8_dense_kept(c, t, &kept, &single);
    if (!lt) params_free(&own);
    return kept + single + pairs;
}
