// cost_acts.c — the cost model's activation bytes (see cost_acts.h): what the forward keeps and the
// backward uses per layer and rank, the rows in the hidden format, --recompute's share, what lives in the
// expert gradients' memory (--grad-memory shared) and the packed gradients' holes.
// Must not hold: parameters, FLOPs, the optimizer's state, scratch of a backend's kernels (cost.c).
#include "train/cost_acts.h"
#include "train/cost.h"
#include "core/common.h"
#include "model/model.h"
#include "moe/moe.h"

// The attention op's head width (latent attention: qk_nope + qk_rope, the values padded to it), and the
// widths per token of its q (and output) and its k (and v) on a rank of a TP group of tp (GQA's as the
// formulas always took them: H hd / tp, KV hd / tp).
size_t att_hd(const ModelConfig *c) {
    return config_mla(c) ? (size_t)config_qk_head_dim(c) : (size_t)c->head_dim;
}
size_t att_qd(const ModelConfig *c, int tp) { return (size_t)c->n_heads * att_hd(c) / tp; }
size_t cost_att_qd(const ModelConfig *c, int tp) { return att_qd(c, tp); }
size_t att_kvd(const ModelConfig *c, int tp) {
    return (size_t)(config_mla(c) ? c->n_heads : c->n_kv_heads) * att_hd(c) / tp;
}
size_t cost_att_kvd(const ModelConfig *c, int tp) { return att_kvd(c, tp); }
// Latent attention's other activations per token on a rank (floats; 0 for GQA): kept (q_a's output
// before and after its norm, the latent's, their rstd, o_proj's input: hid, the ones in the hidden format
// among them), and the backward's scratch (kv_b's output, the rope key, the compressions' gradients before
// and after their norms, o_proj's input gradient).
size_t mla_kept(const ModelConfig *c, int tp, int hid) {
    if (!config_mla(c)) return 0;
    size_t qr = c->q_lora_rank, kvr = c->kv_lora_rank, ao = (size_t)c->n_heads / tp * c->v_head_dim;
    return hid ? qr + kvr + ao : 2 * qr + 2 * kvr + 2 + ao;
}
size_t mla_scratch(const ModelConfig *c, int tp) {
    if (!config_mla(c)) return 0;
    size_t Hl = (size_t)c->n_heads / tp;
    return Hl * (c->qk_nope_head_dim + c->v_head_dim) + c->qk_rope_head_dim + 2 * (size_t)c->kv_lora_rank +
        2 * (size_t)c->q_lora_rank + Hl * c->v_head_dim;
}

// The MoE exchange is local (no copies of the rows: the experts read the dispatched rows xs and the
// combine their outputs yg in place) when the rank's EP and ETP groups are of one.
int local_exchange(const MeshShape *ms) { return !ms || (ms->ep == 1 && ms->etp == 1); }

// Activation bytes of one layer on one rank of a mesh (ms; NULL: one process) running B sequences of T
// tokens: the float32 buffers the forward keeps for the backward: four rows of d a token (model_state.c
// slot_alloc: the layer's input res_in, the attention norm's output xn1, the residual after attention x_mid,
// the MoE norm's output xn2; not the MoE output: the model's one buffer, acts_scratch) and the two norms'
// rstd, its heads (TP), its slice of the router's rows (N/TP) and their dispatched copies (xs; ys and the
// expert side's xg where the exchange is not local), and the expert rows it computes (its ETP group's, k per
// routed token: the mean over a balanced load: yg and the SwiGLU rows); the shared expert's rows (h1, h3,
// act of its width, its input rows, its output and gate) on the router's slice.
double acts_layer(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int dense) {
    int tp = ms ? ms->tp : 1, etp = ms ? ms->etp : 1, lo = local_exchange(ms);
    size_t N = B * T, d = c->d_model, qd = att_qd(c, tp), kvd = att_kvd(c, tp), Ns = (N + tp - 1) / tp,
           mk = mla_kept(c, tp, 0);
    size_t Re = (size_t)etp * Ns * c->top_k, fl = (size_t)c->d_ff / etp, k = c->top_k;
    // the families' buffers: q, k before their norms and the norms' rstd; the shared expert's
    size_t fs = (size_t)c->n_shared_experts * c->shared_d_ff;
    size_t qk = !c->qk_norm ? 0 : qd + kvd + (c->qk_norm == QK_NORM_HEAD ? (qd + kvd) / c->head_dim : 2);
    if (dense) // a dense layer: the attention's and the norms', its MLP's rows as the shared expert's
        return 4.0 *
            (N * (4 * d + 2 * qd + 2 * kvd + 2 + qk + mk) + B * (c->n_heads / tp) * T +
             Ns * (3 * (size_t)c->dense_d_ff + 2 * d + 1));
    return 4.0 *
        (N * (4 * d + 2 * qd + 2 * kvd + 2 + qk + mk) + Ns * (c->n_experts + (lo ? 1 : 2) * k * d) +
         Re * ((lo ? 1 : 2) * d + 3 * fl) + B * (c->n_heads / tp) * T + (fs ? Ns * (3 * fs + 2 * d + 1) : 0));
}
// The rows of one layer kept for the backward in the hidden format besides the SwiGLU rows (the attention
// norm's output xn1; q, k, v after RoPE and the attention output, unless --recompute attn (rc) drops it; the
// rows sent to the experts: xs, xg where the exchange is not local, the shared expert's input), as float32:
// a backend with bf16 rows (ops.h Backend.hid) halves them.
double acts_hid_rows(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int rc) {
    int tp = ms ? ms->tp : 1, etp = ms ? ms->etp : 1;
    size_t N = B * T, Ns = (N + tp - 1) / tp, d = c->d_model, Re = (size_t)etp * Ns * c->top_k;
    size_t qd = config_mla(c) ? att_qd(c, tp) : (size_t)c->n_heads / tp * c->head_dim,
           qkv = config_mla(c) ? qd + 2 * att_kvd(c, tp) + mla_kept(c, tp, 1)
                               : qd + (size_t)2 * c->n_kv_heads / tp * c->head_dim;
    return 4.0 *
        (N * d + N * (qkv + (rc & RECOMPUTE_ATTN ? 0 : qd)) + Ns * c->top_k * d +
         (local_exchange(ms) ? 0 : Re * d) + (c->n_shared_experts ? Ns * d : 0));
}
// The experts' SwiGLU rows (h1, h3, act) of one layer, as float32: the routed experts' (shared 0) or
// the shared expert's (shared 1). A backend with bf16 hidden rows (ops.h Backend.hid) halves them.
double acts_hidden(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int shared) {
    int tp = ms ? ms->tp : 1, etp = ms ? ms->etp : 1;
    size_t Ns = (B * T + tp - 1) / tp, Re = (size_t)etp * Ns * c->top_k, fl = (size_t)c->d_ff / etp;
    return shared ? 4.0 * Ns * 3 * c->n_shared_experts * c->shared_d_ff : 4.0 * Re * 3 * fl;
}
// The part of a layer's activations --recompute drops (rc: RECOMPUTE_* bits): the experts' SwiGLU rows (moe),
// the attention output and lse (attn). One layer's worth stays (the shared buffers).
double acts_dropped(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int rc) {
    int tp = ms ? ms->tp : 1;
    size_t N = B * T, qd = att_qd(c, tp);
    return (rc & RECOMPUTE_MOE ? acts_hidden(c, ms, B, T, 0) : 0) +
        4.0 * (rc & RECOMPUTE_ATTN ? N * qd + B * (c->n_heads / tp) * T : 0);
}
// Of inst layer instances' activations (kept: those that keep their SwiGLU rows) and the backward's
// scratch, the bytes sized by the rows the rank's experts receive (Re): the dispatched and returned rows
// (xg in the hidden format of hb bytes a value (ops.h Backend.hid), yg float32; their dxg, dy copies) and
// the SwiGLU rows (hidden format); 0 where the exchange is local (one rank computes every row it routes,
// whatever the routing).
double acts_routed(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int inst, int kept,
                   double hb) {
    if (local_exchange(ms)) return 0;
    size_t Ns = (B * T + ms->tp - 1) / ms->tp, Re = (size_t)ms->etp * Ns * c->top_k,
           fl = (size_t)c->d_ff / ms->etp, d = c->d_model;
    return inst * (4.0 + hb) * Re * d + kept * hb * Re * 3 * fl + (4.0 + hb) * Re * d + hb * 2 * Re * fl;
}
// --fp8-save (o->fp8_save): one layer instance's FP8 rows of its routed experts' h1 and h3 (MoeLayer.hq: Re
// rows of 2 x numerics.h fp8_row_bytes(fl) bytes), where it keeps no SwiGLU rows in the hidden format (every
// layer's leave it as under --recompute moe, one shared copy stays: fp8_save_bit adds that bit to a layer's);
// the routed layers of [l0, l1).
double acts_fp8_saved(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T) {
    int tp = ms ? ms->tp : 1, etp = ms ? ms->etp : 1;
    size_t Ns = (B * T + tp - 1) / tp, Re = (size_t)etp * Ns * c->top_k;
    return 2.0 * Re * fp8_row_bytes(c->d_ff / etp);
}
int fp8_save_bit(const TrainOptions *o) { return o && o->fp8_save ? RECOMPUTE_MOE : 0; }
int routed_layers(const ModelConfig *c, int l0, int l1) {
    int n = 0;
    for (int l = l0; l < l1; l++) n += !config_layer_dense(c, l);
    return n;
}
// The change --fp8-save makes to n routed layer instances' activations: each keeps its FP8 rows, all but one
// (the shared copy) drop their SwiGLU rows.
double acts_fp8_change(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int n) {
    return n * acts_fp8_saved(c, ms, B, T) - (n > 1 ? (n - 1) * acts_hidden(c, ms, B, T, 0) : 0);
}
// Layer l's RECOMPUTE_* bits under o (--recompute-layers: the first ones only; model_access.h's rule), and
// how many of the layers [l0, l1) recompute.
int rc_of(const TrainOptions *o, int l) {
    return !o->recompute_layers || l < o->recompute_layers ? o->recompute : 0;
}
int rc_count(const TrainOptions *o, int l0, int l1) {
    int e = !o->recompute ? l0 : !o->recompute_layers || o->recompute_layers > l1 ? l1 : o->recompute_layers;
    return e > l0 ? e - l0 : 0;
}
// The activations of layers [l0, l1) under o's --recompute (o NULL: none; a dense layer's MLP rows are kept):
// of the n that recompute, all but one shared layer's worth drop their rows.
double acts_layers(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int l0, int l1,
                   const TrainOptions *o) {
    double a = 0;
    for (int l = l0; l < l1; l++) a += acts_layer(c, ms, B, T, config_layer_dense(c, l));
    int n = o ? rc_count(o, l0, l1) : 0;
    if (fp8_save_bit(o)) a += acts_fp8_change(c, ms, B, T, routed_layers(c, l0, l1));
    return a - (n > 1 ? (n - 1) * acts_dropped(c, ms, B, T, o->recompute) : 0);
}
// The backward's scratch on one rank (one set, whatever the layers), rows in the hidden format of hb bytes a
// value (ops.h Backend.hid): the model's gradients of the residual stream, the norms' outputs, q, k, v and
// the attention output (and of q, k before QK-norm), the forward's MoE output (model.h moe_out); the MoE
// layer's (moe.h MoeScratch, sized for the whole micro-batch): dy rows (hidden format), dx (token side, my
// slice of the jittered input: TP; counted always), dlogits, the expert side's dxg and dh1, dh3 (and the dy,
// dx copies where the exchange is not local), the shared expert's.
double acts_scratch(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, double hb) {
    int tp = ms ? ms->tp : 1, etp = ms ? ms->etp : 1, lo = local_exchange(ms);
    size_t N = B * T, d = c->d_model, qd = att_qd(c, tp), kvd = att_kvd(c, tp), Ns = (N + tp - 1) / tp,
           R = N * c->top_k;
    size_t Re = (size_t)etp * Ns * c->top_k, fl = (size_t)c->d_ff / etp;
    size_t fs = (size_t)c->n_shared_experts * c->shared_d_ff;
    double model = 4.0 * N * (3 * d + 2 * qd + 2 * kvd + (c->qk_norm ? qd + kvd : 0) + mla_scratch(c, tp));
    double moe = 4.0 * (N * d + N * c->n_experts + R + Re * d + (lo ? 0 : R * d)) +
        hb * (R * d + (lo ? 0 : Re * d)) + hb * 2 * Re * fl + (fs ? 4.0 * N + hb * N * (d + 2 * fs) : 0);
    return model + moe;
}
// Of acts_scratch, the bytes the cuda backend's lean MoE scratch does without (moe.h moe_scratch_init; none
// under MOE_ACT_MEM_OLD=1): the experts' input gradient dxg (Re rows of d float32: written into the layer's
// yg), the TP slice's dx (N rows of d float32: allocated only where TP > 1), the forward's MoE output (N
// rows of d float32: in dxn) and, without an FP8 table (fp8 0), the bf16 dh1 and dh3 (Re rows of fl each:
// over h1 and h3) and the shared expert's (N rows of fs each). rows: only the part sized by the rows the
// rank's experts receive (acts_routed's dxg and dh1, dh3; 0 where the exchange is local).
double acts_lean(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int fp8, int rows) {
    int tp = ms ? ms->tp : 1, etp = ms ? ms->etp : 1;
    size_t N = B * T, d = c->d_model, Ns = (N + tp - 1) / tp, Re = (size_t)etp * Ns * c->top_k,
           fl = (size_t)c->d_ff / etp, fs = (size_t)c->n_shared_experts * c->shared_d_ff;
    if (moe_act_mem_old() || (rows && local_exchange(ms))) return 0;
    double expert = 4.0 * Re * d + (fp8 ? 0 : 2.0 * 2 * Re * fl);
    return rows ? expert : expert + 4.0 * N * d * (tp == 1) + 4.0 * N * d + (fp8 ? 0 : 2.0 * N * 2 * fs);
}
// The logits' columns of the TP rank with the most: V, or split (MeshShape.vocab: model/vocab.h) ceil(V /
// tp).
double acts_vocab(const ModelConfig *c, const MeshShape *ms) {
    int tp = ms && ms->vocab ? ms->tp : 1;
    return (double)((c->vocab_size + tp - 1) / tp);
}
// The logits' rows at once: N, or with --loss-chunks lc > 1 a chunk's, ceil(N / lc) (model_set_loss_chunks).
static double head_rows(size_t N, int lc) { return (double)params_chunk_len(N, lc); }
// The activations of the final norm and LM head (--loss-chunks lc > 1: a chunk's logits and the head's input
// gradient, N x d).
double acts_head(const ModelConfig *c, const MeshShape *ms, size_t N, int lc) {
    double d = c->d_model;
    return 4.0 * N * 2.0 * d + 4.0 * head_rows(N, lc) * acts_vocab(c, ms) + (lc > 1 ? 4.0 * N * d : 0);
}
// The split vocabulary's cross-entropy parts (model.h vocab_parts), once a model holding the head (not an
// activation of each micro-batch, and not lent).
double acts_vocab_parts(const ModelConfig *c, const MeshShape *ms, size_t N) {
    double tp = ms && ms->vocab ? ms->tp : 0;
    return tp ? fmax(8.0 * (tp + 1) * 3 * N, 4.0 * c->vocab_size) : 0;
}
// The MTP modules' activations (model_types.h MtpActs and their blocks' LayerActs, on the last stage) and
// their model-wide scratch (MtpScratch: split, dcat, dh, demb); 0 without modules.
double acts_mtp(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int lc) {
    size_t N = B * T, d = c->d_model;
    if (!c->mtp_depth) return 0;
    return c->mtp_depth *
        (acts_layer(c, ms, B, T, 0) + 4.0 * N * (5 * d + 5) + 4.0 * head_rows(N, lc) * acts_vocab(c, ms) +
         (lc > 1 ? 4.0 * N * d : 0)) +
        4.0 * N * 6 * d;
}
// The bytes a backend with bf16 rows (ops.h Backend.hid FMT_BF16) saves in one layer that keeps its
// activations under
// --recompute rc: half of the SwiGLU rows it keeps (the routed ones unless rc drops them) and of
// acts_hid_rows.
double acts_hid_saved(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int rc) {
    return 0.5 *
        ((rc & RECOMPUTE_MOE ? 0 : acts_hidden(c, ms, B, T, 0)) + acts_hidden(c, ms, B, T, 1) +
         acts_hid_rows(c, ms, B, T, rc));
}
// --grad-memory shared (with --grad-accum 1 and no --pp: model.h model_share_grads): the activation bytes
// that live in the expert gradients' memory on one rank (about: a buffer that does not fit whole goes to the
// allocator, where this counts the part that would fit): each layer's but the first, up to the previous
// layer's expert gradients, and the head's, up to the last layer's. hid: a backend with bf16 rows, where
// the lean MoE scratch (moe.h moe_scratch_init) also lends layer 0 the embedding's gradient (model_state.c).
// Layer l's activations that live in the previous layer's expert gradients (--grad-memory shared): what it
// keeps under its --recompute bits, less the hidden rows' halves where hid (a backend with bf16 rows).
static double acts_lendable(const ModelConfig *c, const MeshShape *ms, const TrainOptions *o, size_t B,
                            size_t T, int l, int hid) {
    int rc = rc_of(o, l) | fp8_save_bit(o);
    return acts_layer(c, ms, B, T, 0) - acts_dropped(c, ms, B, T, rc) -
        (hid ? acts_hid_saved(c, ms, B, T, rc) : 0) + (o->fp8_save ? acts_fp8_saved(c, ms, B, T) : 0);
}
double acts_lent(const ModelConfig *c, const MeshShape *ms, const TrainOptions *o, size_t B, size_t T,
                 int hid) {
    int ep = ms ? ms->ep : 1, etp = ms ? ms->etp : 1, pp = ms ? ms->pp : o->pp;
    if (o->grad_memory != GRADMEM_SHARED || o->grad_accum != 1 || pp > 1) return 0;
    double g = 4.0 * 3 * (c->n_experts / ep) * (double)(c->d_ff / etp) * c->d_model, lent = 0, la0 = 0;
    for (int l = 0; l < c->n_layers; l++) { // (layer l's activations lent by layer l - 1's gradients)
        double la = acts_lendable(c, ms, o, B, T, l, hid);
        if (l) lent += fmin(la, g);
        else la0 = la;
    }
    double emb = hid && !moe_act_mem_old() ? fmin(la0, 4.0 * acts_vocab(c, ms) * c->d_model) : 0;
    return lent + fmin(acts_head(c, ms, B * T, o->loss_chunks), g) + emb;
}
// The expert gradients' bytes a backend with holes leaves out (ops.h alloc_holes; model_share_grads): where
// they are packed, half of each block whose lent activations (acts_lent's) fit in that half.
double acts_holes(const ModelConfig *c, const TrainOptions *o, size_t B, size_t T, int hid) {
    if (!acts_lent(c, NULL, o, B, T, hid) || train_expert_grads(o, 0) != OPTG_PACKED) return 0;
    double h = 6.0 * c->n_experts * c->d_ff * c->d_model, holes = 0; // (a block's packed half: 2 bytes each)
    for (int l = 1; l < c->n_layers; l++) // (layer l's activations in layer l - 1's block)
        holes += acts_lendable(c, NULL, o, B, T, l, hid) <= h ? h : 0;
    return holes + (acts_head(c, NULL, B * T, o->loss_chunks) <= h ? h : 0);
}
