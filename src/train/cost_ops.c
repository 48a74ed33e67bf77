// cost_ops.c — the cost model's bytes of a step's memory-bound ops (cost.h CostBytes): everything a step
// runs but the GEMMs, attention's kernels and AdamW (cost_flops and the optimizer's bytes count those):
// the norms, RoPE and the rounding of q, k, v, the MoE's gathers and combines, the router's softmax and
// top-k, the cross-entropy, the residual adds, the embedding, the copies and clears, and the gradient norm.
// Each count is the tensors the code reads and writes (cited at each term), once each: a kernel that reads a
// row twice inside one block (a norm's sum of squares, then its scaling) is counted once.
// Must not hold: rates or seconds (the planner's: plan.c), printing.
#include <string.h>
#include "train/cost.h"
#include "train/cost_acts.h"
#include "core/common.h"
#include "model/attention.h"
#include "ops/ops.h"

// An RMSNorm backward over N rows of d: dout, the input and dinp read, dinp written, and rmsnorm_dw's second
// read of dout and the input, but in the hidden format's backend (cuda) where the rows are many and a row's
// float4s fit a block (cuda_norm.cu rmsnorm_bwd_fused_k: 64 chunks of 64 rows at least, d <= 4096; its
// thresholds, written again here; cuda-fp32 runs the kernel too, but its rows are float32 like the cpu's, h
// 4, so it is counted as the cpu).
static double norm_bwd_bytes(double N, double d, double h) {
    int fused = h < 4 && N >= 4096 && d <= 4096 && (long)d % 4 == 0;
    return (fused ? 4 : 6) * N * d * 4;
}

// One layer's bytes on one micro-batch (b accumulates): N rows of the residual stream (replicated over TP),
// Ns = N / tp of them routed by this rank, M = k Ns rows sent to the experts (routing balanced: as many
// arrive), Rg the rows the rank's experts compute (its ETP group's: etp M), f = 4 bytes a float32 value, h of
// the hidden format (ops.h Backend.hid: cuda's bf16 2). --recompute adds none: it runs the experts' w1 and
// w3 GEMMs again (their SwiGLU in the epilogue) and the attention kernel's forward (q, k, v are kept).
static void layer_bytes(CostBytes *b, const ModelConfig *c, const MeshShape *ms, double N, int dense,
                        double h) {
    int tp = ms ? ms->tp : 1, etp = ms ? ms->etp : 1, lo = !ms || (ms->ep == 1 && ms->etp == 1);
    double d = c->d_model, Ns = N / tp, M = Ns * c->top_k, Rg = etp * M, E = c->n_experts, f = 4;
    double qd = (double)cost_att_qd(c, tp), kvd = (double)cost_att_kvd(c, tp);
    double fs = (double)c->n_shared_experts * c->shared_d_ff;
    // norms (block.c, cuda_norm.cu): the attention norm reads res_in and writes xn1 in h (rmsnorm_fwd_hid);
    // add_rmsnorm_fwd reads x_mid and res_in, writes x_mid and xn2; each backward (the FFN norm's in mid_bwd,
    // the attention norm's) reads dout, the input and dinp (it accumulates into dres) and writes dinp, then
    // its weight gradient's pass reads dout and the input again (rmsnorm_dw): 6 N d f each, or 4 where one
    // kernel does both (norm_bwd_bytes)
    double norm_f = N * d * (f + h) + 4 * N * d * f, norm_b = 2 * norm_bwd_bytes(N, d, h);
    // RoPE (attention.c gqa_fwd_in, gqa_bwd_in). Where q, k, v stay in h between their products and the
    // attention (GQA in h < 4 where attention.h gqa_qkv_hid holds; --fp8-dense, which would stop it, is not
    // seen by this count) the forward rotates q and k in place, read and written in h
    // (rope_fwd_hid from_hid), and the backward reads dq and dk in f and writes them in h (rope_bwd_hid), dv
    // too (to_hid_rows). Else q and k are read in f, rotated and written in h, v rounded to h (to_hid), and
    // the backward rotates dq and dk in place (rope_bwd: read and written in f).
    int qkv_hid = h < 4 && !config_mla(c) && gqa_qkv_hid(c, (int)qd, (int)kvd, 0);
    double rope_f = qkv_hid ? 2 * h * N * (qd + kvd) : N * (qd + 2 * kvd) * (f + h);
    double rope_b = qkv_hid ? N * (qd + 2 * kvd) * (f + h) : 2 * f * N * (qd + kvd);
    // the residual add (block.c out_rows): x_mid and moe_out read, out written; joined to the combine (moe.c
    // moe_finish: TP 1, no shared expert, a routed layer, no residual dropout) only x_mid read more, by the
    // combine that writes out
    double elem_f = (tp == 1 && fs == 0 && !dense ? 1 : 3) * N * d * f;
    double rows_f = 0, rows_b = 0, router = 0;
    if (dense) { // the MLP's input rounded to h and its output, as a shared expert's (below)
        rows_f = Ns * d * (f + h) + 3 * Ns * d * f;
        rows_b = Ns * d * (f + h);
    } else {
        // moe.c: gather_rows_hid xs (M rows read in f, written in h), combine_rows (M rows of yg read, Ns
        // written); the backward's gather_dot_scale (dy's M rows and ys read in f, dys written in h) and
        // combine_rows of dx (M read, Ns written)
        rows_f = M * d * (f + h) + (M + Ns) * d * f;
        rows_b = M * d * (2 * f + h) + (M + Ns) * d * f;
        if (!lo) { // exchange.c: the arrived rows permuted into expert order (h), the outputs back (f); and
                   // in the backward dys (h) and dx (f): each Rg rows read and written
            rows_f += 2 * Rg * d * (h + f);
            rows_b += 2 * Rg * d * (h + f);
        }
        if (fs > 0) { // moe_experts.c: the shared expert's input gathered to h, its output combined into y
                      // (read, accumulated); the backward's dy gathered to h
            rows_f += Ns * d * (f + h) + 3 * Ns * d * f;
            rows_b += Ns * d * (f + h);
        }
        // router (moe.c moe_route, router_bwd): the logits read and probs written (Ns x E), each row's k
        // indices and weights, the plan's M slot rows (index, token, scale); the backward reads probs, writes
        // dlogits
        router = 2 * Ns * E * f + 2 * Ns * c->top_k * 4 + 3 * M * 4 + 2 * Ns * E * f;
    }
    double fwd = norm_f + rope_f + elem_f + rows_f + (dense ? 0 : router / 2);
    b->norm += norm_f + norm_b;
    b->rope += rope_f + rope_b;
    b->elem += elem_f;
    b->rows += rows_f + rows_b;
    b->router += router;
    b->fwd += fwd;
}

void cost_bytes(CostBytes *b, const ModelConfig *c, const MeshShape *ms, double N, int l0, int l1, int first,
                int last, double h) {
    memset(b, 0, sizeof *b);
    double d = c->d_model, V = acts_vocab(c, ms), f = 4; // (V: this rank's columns of the logits)
    for (int l = l0; l < l1; l++) layer_bytes(b, c, ms, N, config_layer_dense(c, l), h);
    if (first) { // model.c: embedding_fwd reads N table rows and writes res_in; embedding_bwd reads dres and
                 // reads and writes the N table rows it adds into (cuda_nn.cu embedding_bwd_k)
        b->embed = 2 * N * d * f + 3 * N * d * f;
        b->fwd += 2 * N * d * f;
    }
    if (last) {
        // model.c: the final norm (forward: read, write; backward as a layer's, norm_bwd_bytes) and the clear
        // of dres before it (N d f); the cross-entropy (cuda_nn.cu cross_entropy_k, one block a row): the N x
        // V logits read three times (max, sum of exp, the gradient) and overwritten by their gradient, run at
        // the forward's end. The MTP modules (config.h mtp_depth): each an MoE layer, its norms (three
        // forward and backward: enorm, hnorm, the final) and the cross-entropy again.
        double D = c->mtp_depth, ce = 4 * N * V * f;
        for (int k = 0; k < (int)D; k++) layer_bytes(b, c, ms, N, 0, h);
        b->norm += (1 + 3 * D) * (2 * N * d * f + norm_bwd_bytes(N, d, h));
        b->copies += N * d * f;
        b->ce += (1 + D) * ce;
        b->fwd += (1 + 3 * D) * 2 * N * d * f + (1 + D) * ce;
    }
    b->total = b->norm + b->rope + b->rows + b->router + b->ce + b->elem + b->embed + b->copies;
}
