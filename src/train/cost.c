// cost.c — the cost model's arithmetic (see cost.h): parameter and FLOP counts from the config, activation
// bytes of each buffer the forward keeps and the backward uses, per layer and per rank of a mesh, the
// optimizer state of each rank's slices, and the bytes each collective of a step sends.
// Must not hold: printing (train/info.c), running a schedule or a model.
#include "train/cost.h"
#include "train/cost_acts.h"
#include <math.h>
#include <string.h>
#include "core/common.h"
#include "model/model.h"
#include "model/params.h"
#include "moe/moe.h"
#include "train/cost_fp8.h"
#include "train/schedule.h"

// Latent attention's (config.h): its projections' parameters (q_a with its norm and q_b, or q; kv_a, the
// latent's norm, kv_b; o), and their multiply-adds per token.
static size_t mla_params(const ModelConfig *c) {
    size_t d = c->d_model, H = c->n_heads, qr = c->q_lora_rank, kvr = c->kv_lora_rank,
           hq = config_qk_head_dim(c);
    size_t q = qr ? d * qr + qr + qr * H * hq : d * H * hq;
    return q + d * (kvr + c->qk_rope_head_dim) + kvr + kvr * H * (c->qk_nope_head_dim + c->v_head_dim) +
        H * c->v_head_dim * d;
}
static double mla_macs(const ModelConfig *c) {
    double qr = c->q_lora_rank, kvr = c->kv_lora_rank;
    return (double)mla_params(c) - (qr ? qr : 0) - kvr; // (less the norms' weights)
}
void cost_params(CostParams *p, const ModelConfig *c) {
    size_t d = c->d_model, hd = c->head_dim, H = c->n_heads, KV = c->n_kv_heads, f = c->d_ff,
           E = c->n_experts, k = c->top_k;
    size_t attn = config_mla(c) ? mla_params(c) : d * H * hd * 2 + d * KV * hd * 2;
    size_t layer = 2 * d + attn + E * d + E * 3 * d * f;
    if (c->qk_norm == QK_NORM_FULL) layer += (H + KV) * hd;
    if (c->qk_norm == QK_NORM_HEAD) layer += 2 * hd;
    if (c->qkv_bias) layer += (H + 2 * KV) * hd;
    layer += 3 * d * (size_t)c->n_shared_experts * c->shared_d_ff + (c->shared_gate ? d : 0);
    // a dense layer: the attention's and the norms' as an MoE layer's, one MLP of dense_d_ff for the FFN
    size_t Lm = (size_t)config_moe_layers(c), Ld = (size_t)c->n_layers - Lm;
    size_t dense = layer - (E * d + E * 3 * d * f) - 3 * d * (size_t)c->n_shared_experts * c->shared_d_ff -
        (c->shared_gate ? d : 0) + 3 * d * (size_t)c->dense_d_ff;
    // an MTP module (config.h mtp_depth): an MoE layer, eh_proj and three norms (its embedding and head
    // shared)
    size_t D = (size_t)c->mtp_depth;
    p->total = 2 * (size_t)c->vocab_size * d + d + Lm * layer + Ld * dense + D * (layer + 2 * d * d + 3 * d);
    p->active = p->total - (Lm + D) * (E - k) * 3 * d * f;
    ParamTable t;
    params_build(&t, c);
    p->tensors = t.n;
    p->dense = p->expert = 0;
    for (int i = 0; i < t.n; i++) *(t.p[i].expert >= 0 ? &p->expert : &p->dense) += t.p[i].numel;
    params_free(&t);
}

double cost_flops(CostFlops *f, const ModelConfig *c, int T) {
    double d = c->d_model, hd = c->head_dim, H = c->n_heads, KV = c->n_kv_heads, ff = c->d_ff;
    double E = c->n_experts, k = c->top_k, V = c->vocab_size;
    CostFlops x;
    x.attn_proj = config_mla(c) ? 2 * mla_macs(c) : 2 * d * hd * (2 * H + 2 * KV); // q, o + k, v
    // QK^T and PV, causal half (latent attention: qk_nope + qk_rope wide, PV of v_head_dim)
    x.attn_scores =
        config_mla(c) ? 2 * H * (config_qk_head_dim(c) + c->v_head_dim) * T / 2.0 : 2 * 2 * H * hd * T / 2.0;
    x.router = 2 * d * E;
    x.experts = k * 2 * 3 * d * ff + 2 * 3 * d * (double)c->n_shared_experts * c->shared_d_ff;
    x.head = 2 * d * V;
    double Lm = config_moe_layers(c), dense = 2 * 3 * d * (double)c->dense_d_ff; // (a dense layer's MLP)
    double fwd = c->n_layers * (x.attn_proj + x.attn_scores) + Lm * (x.router + x.experts) +
        (c->n_layers - Lm) * dense + x.head;
    // each MTP module: eh_proj (2d -> d), an MoE layer, the LM head again
    fwd += c->mtp_depth * (2 * 2 * d * d + x.attn_proj + x.attn_scores + x.router + x.experts + x.head);
    x.train = 3 * fwd;
    if (f) *f = x;
    return x.train;
}

// Bytes per AdamW moment element: float32, or bf16 under --precision bf16 and fp8-bf16 (dist.c
// dist_moment_bytes).
static double moment_bytes(const TrainOptions *o) { return prec_bf16_storage(o->precision) ? 2.0 : 4.0; }

// The ranks a gradient of reduce group r is reduced over (NULL: one process): under ZeRO its optimizer state,
// and under ZeRO 2 the gradient, is split over them.
static int reduce_ranks(int r, const MeshShape *ms) {
    return !ms ? 1 : r == RED_DP ? ms->dp : r == RED_EDP ? ms->edp : ms->tp * ms->dp;
}

// The moment elements a rank updates: two per element of its slices, over their reduce group under ZeRO
// (the table's sums by group: params.h ParamTable.lby).
static double moment_elems(const ParamTable *lt, const MeshShape *ms, const TrainOptions *o) {
    double mom = 0;
    for (int r = 0; r < 3; r++)
        mom += 2.0 * (double)(lt->lby[r][0] + lt->lby[r][1]) / (o->zero ? reduce_ranks(r, ms) : 1);
    return mom;
}

double cost_gnorm_bytes(const ParamTable *lt, const MeshShape *ms, const TrainOptions *o) {
    int meshed = ms && ms->world > 1, packed = train_expert_grads(o, meshed) == OPTG_PACKED,
        ledger = train_dw_ledger(o, meshed, meshed ? ms->edp : 1);
    double bytes = 0;
    for (int r = 0; r < 3; r++)
        for (int e = 0; e < 1 + !ledger; e++)
            bytes += (double)lt->lby[r][e] / (o->zero ? reduce_ranks(r, ms) : 1) * (packed && e ? 2 : 4);
    return bytes;
}

// --precision bf16 in one process: the float32 buffer's whole 2 MiB pages inside the ranges of the weights
// only the bf16 GEMMs read (the routed experts', the attention projections', the LM head's) and the
// embedding table's (model_bf16_weights).
static double weights_alone(const ModelConfig *c) {
    ParamTable t;
    params_build(&t, c);
    int La = config_all_layers(c);
    size_t *h = xmalloc(sizeof(size_t) * params_bf16_ranges_max(La)), pg = (size_t)2 << 20;
    int nh = params_bf16_ranges(&t, La, 0, c->n_experts, MOE_GEMM_FP32_MAX_O, h);
    double alone = 0;
    for (int i = 0; i < nh; i++) {
        size_t a = (4 * h[2 * i] + pg - 1) / pg, b = 4 * h[2 * i + 1] / pg;
        if (b > a) alone += (double)(b - a) * pg;
    }
    free(h);
    params_free(&t);
    return alone;
}

// A buffer carved as the cuda backend carves its scratch: each piece rounded up to 256 bytes.
static double al256(double bytes) { return ceil(bytes / 256) * 256; }

// The cuda backend's bf16 GEMM operand scratch (cuda_gemm.cu bf16_scratch_v) on a rank running N tokens
// through its heads' projections (the router's Ns rows) and the LM head where head: one buffer, grown to an
// op's need (its operands' bf16 copies, each 256-byte aligned; weights none: the GEMMs read the bf16 copy of
// the weights; the fused expert ops none: their rows are bf16 already and the Hopper kernel takes them; the
// heads' output gradient none where the vocabulary is a multiple of 8: the cross-entropy leaves it in bf16 in
// place, GM_DOUT_HID) to the larger of the need and 1.25 x the buffer so
// far, at least 1 MiB. A product of at most MOE_GEMM_FP32_MAX_O columns runs in float32, its bf16 input
// widened (2 bf16 slots a value; a head that narrow widens its output gradient). The needs in a step's order:
// a layer's q/k/v, o and router forward, the head's forward and backward (its input), then a layer's router,
// o and q/k/v backward (the largest output gradient, the widened input). (cuBLAS's fallback for the grouped
// GEMMs, off the Hopper kernel, adds float32 rows: not counted.)
static double cuda_gemm_scratch(const ModelConfig *c, int tp, double N, double Ns, int head, double V,
                                double Nh) {
    // (V: the head's columns here, Nh its rows at once: --loss-chunks)
    double d = c->d_model, E = c->n_experts, lim = MOE_GEMM_FP32_MAX_O;
    double qd = (double)att_qd(c, tp), kvd = (double)att_kvd(c, tp);
    double wide_qkv = qd <= lim || kvd <= lim ? al256(4 * N * d) : 0,
           wide_o = d <= lim ? al256(4 * N * qd) : 0;
    double gqkv = fmax(qd > lim ? qd : 0, kvd > lim ? kvd : 0), need[8], cap = 0;
    int n = 0;
    need[n++] = wide_qkv;
    need[n++] = wide_o;
    need[n++] = E > lim ? al256(2 * Ns * d) : 0;
    need[n++] = head && V > lim ? al256(2 * Nh * d) : 0;
    need[n++] = !head ? 0 // the head's backward: dlogits widened (narrow) or packed (V not a multiple of 8)
        : V <= lim    ? al256(4 * Nh * V)
                      : al256(2 * Nh * d) + (fmod(V, 8) != 0 ? al256(2 * Nh * V) : 0);
    need[n++] = E > lim ? al256(2 * Ns * E) + al256(2 * Ns * d) : 0;
    need[n++] = (d > lim ? al256(2 * N * d) : 0) + wide_o;
    need[n++] = al256(2 * N * gqkv) + wide_qkv;
    for (int i = 0; i < n; i++)
        if (need[i] > cap) cap = fmax(fmax(need[i], 1.25 * cap), 1048576.0);
    return cap;
}

// Latent attention's backward on the Hopper kernels (cuda_attention_mla.cu cuda_attention_bwd_tcv, its
// default way, over whole sequences), workspace bytes: D (B, H, T) float and dout's rows in bf16 (2 bytes a q
// element), each 256-aligned, then the dS scratch as the kernel sizes it (ops.h attention_mla_ds_bytes; none
// fit: dS computed again, and dout's rows unaligned).
static double mla_workspace(int B, int T, int H, int KV, int hd) {
    size_t ng = (size_t)B * T * H * hd, nd = ((size_t)B * H * T * 4 + 255) & ~(size_t)255;
    size_t nds = attention_mla_ds_bytes(B, T, H, KV, hd, 0, T, 0, NULL, NULL);
    if (!nds) return (double)(nd + 2 * ng);
    return (double)(nd + ((2 * ng + 255) & ~(size_t)255) + nds);
}

// The cuda backend's workspace (cuda_backend.cu cuda_workspace) on a rank running B sequences of T tokens
// with its heads (the router's Ns rows): one buffer grown to the largest request, at least 1 MiB: the
// attention backward's (the tensor-core path at head dims 32, 64, 128: D, dout in bf16 and, at 128, dS: ops.h
// attention_ds_bytes; otherwise the float32 kernels' D, with q, k, v and out widened to float32 in a buffer
// of their own, added; latent attention at q head width 192 and value width 128: mla_workspace), the router's
// weight gradient of at most MOE_GEMM_FP32_MAX_O experts (float32 sums of 128 rows each), the norms' (double
// sums of 64 rows each: the d-wide rows', and q's whole or per head where the model norms q and k).
static double cuda_workspace_bytes(const ModelConfig *c, int tp, size_t B, size_t T, double Ns) {
    int H = c->n_heads / tp, KV = (int)(att_kvd(c, tp) / att_hd(c)), hd = (int)att_hd(c);
    double N = (double)B * T, qd = (double)H * hd, kvd = (double)KV * hd;
    int tc = (hd == 32 || hd == 64 || hd == 128) && KV > 0 && H % KV == 0;
    int wg = config_mla(c) && hd == 192 && c->v_head_dim == 128 && KV > 0 && H % KV == 0;
    double att = tc ? al256(4 * N * H) + al256(2 * N * qd) +
            al256((double)attention_ds_bytes((int)B, (int)T, H, KV, hd, 0, (int)T))
        : wg ? mla_workspace((int)B, (int)T, H, KV, hd)
             : 4 * N * H;
    double wide = tc || wg ? 0 : 4 * (2 * N * qd + 2 * N * kvd);
    double router =
        c->n_experts <= MOE_GEMM_FP32_MAX_O ? 4.0 * c->n_experts * c->d_model * ceil(Ns / 128) : 0;
    double qk = c->qk_norm == QK_NORM_FULL ? ceil(N / 64) * qd
        : c->qk_norm == QK_NORM_HEAD       ? ceil(N * H / 64) * hd
                                           : 0;
    double norm = 8.0 * fmax(ceil(N / 64) * c->d_model, qk);
    return fmax(fmax(att, router), fmax(norm, 1048576.0)) + wide;
}

// Of inst layer instances, irc of them recomputing, those that keep their SwiGLU rows (the shared copy counts
// as one).
static int kept_rows(const TrainOptions *o, int inst, int irc) {
    if (o->fp8_save) return inst > 0; // (all drop them; each keeps its FP8 rows: routed_fp8)
    return o->recompute & RECOMPUTE_MOE ? inst - irc + (irc > 0) : inst;
}
// --fp8-save's FP8 rows of inst layer instances where they are sized by the rows the rank's experts receive.
static double routed_fp8(const ModelConfig *c, const MeshShape *ms, const TrainOptions *o, size_t B, size_t T,
                         int inst) {
    return o->fp8_save && !local_exchange(ms) ? inst * acts_fp8_saved(c, ms, B, T) : 0;
}

// The cuda backend's figure (ops.h Backend.hid FMT_BF16) for one process (ms NULL) or one rank of a mesh
// holding inst layer instances' activations of B sequences of T tokens (one per layer; with pipeline stages,
// each live micro-batch's), np parameters (its slices), the LM head where head, and held bytes in the
// float32 accounting before lending (state + activations); meshed: several ranks. The same buffers on the
// GPU but the experts' hidden rows (h1, h3, act), the rows sent to them, the attention norm's output and the
// attention's q, k, v and output in bf16 (half of their bytes in every instance that keeps them: the routed
// SwiGLU rows in one under --recompute moe, the rest in all; and the backward's dy rows, dh1, dh3), plus the
// bf16 copy of the weights the GEMMs read (ops.h bf16_shadow) and the backend's two scratch buffers, apart:
// the bf16 GEMM operands' (cuda_gemm_scratch) and the workspace (cuda_workspace_bytes); under --precision
// fp8 the FP8 table's two (cost_fp8_scratch) and the weight codes it keeps (cost_fp8_kept: of the layers and
// experts the rank holds: fp8_kept, the caller's), less the backward scratch the lean MoE scratch does
// without (acts_lean). irc of the inst instances recompute (--recompute-layers).
static void cuda_memory(CostCuda *k, const ModelConfig *c, const MeshShape *ms, const TrainOptions *o,
                        size_t B, size_t T, int inst, int irc, double np, double held, int meshed, int head,
                        double fp8_kept) {
    int tp = ms ? ms->tp : 1, rc = o->recompute, f8 = fp8_save_bit(o); // (--fp8-save: every layer drops)
    size_t N = B * T, Ns = (N + tp - 1) / tp;
    k->hid = irc * acts_hid_saved(c, ms, B, T, rc | f8) + (inst - irc) * acts_hid_saved(c, ms, B, T, f8) +
        ((irc && (rc & RECOMPUTE_MOE)) || (f8 && inst) ? 0.5 * acts_hidden(c, ms, B, T, 0)
                                                       : 0) + // (the copy)
        (acts_scratch(c, ms, B, T, 4) - acts_scratch(c, ms, B, T, 2));
    k->shadow = 2.0 * np;
    double Nh = (double)params_chunk_len(N, o->loss_chunks);
    k->gemm = cuda_gemm_scratch(c, tp, (double)N, (double)Ns, head, acts_vocab(c, ms), Nh);
    k->workspace = cuda_workspace_bytes(c, tp, B, T, (double)Ns);
    k->scratch = k->gemm + k->workspace;
    int fp8 = prec_fp8(o->precision);
    k->kept = fp8 ? fp8_kept : 0;
    k->fp8 = fp8 ? cost_fp8_scratch(c, ms, B, T, o->fp8_dense) + k->kept : 0;
    k->alone = train_bf16_weights_alone(o, meshed) ? weights_alone(c) : 0;
    k->lent = acts_lent(c, ms, o, B, T, 1);
    k->lean = acts_lean(c, ms, B, T, fp8, 0);
    k->holes = !meshed ? acts_holes(c, o, B, T, 1) : 0; // (packed: one process)
    k->total = held - k->hid + k->shadow + k->scratch + k->fp8 - k->lent - k->alone - k->lean - k->holes;
    k->routed = acts_routed(c, ms, B, T, inst, kept_rows(o, inst, irc), 2) - acts_lean(c, ms, B, T, fp8, 1) +
        routed_fp8(c, ms, o, B, T, inst);
}

void cost_whole(CostWhole *w, const ModelConfig *c, const TrainOptions *o, int meshed) {
    int T = o->seq_len, B = o->batch;
    CostParams cp;
    cost_params(&cp, c);
    size_t np = cp.total;
    // float32 cpu backend: params + grads + two AdamW moments (bf16 under bf16 storage; the weights stay
    // in their float32 buffer, holding bf16 values)
    w->state = (8.0 + 2 * moment_bytes(o)) * np;
    size_t N = (size_t)B * T;
    w->acts = acts_layers(c, NULL, (size_t)B, (size_t)T, 0, c->n_layers, o) +
        acts_head(c, NULL, N, o->loss_chunks) + acts_scratch(c, NULL, (size_t)B, (size_t)T, 4) +
        acts_mtp(c, NULL, (size_t)B, (size_t)T, o->loss_chunks);
    // (--grad-memory shared: part of the activations in the expert gradients' memory)
    w->lent = acts_lent(c, NULL, o, (size_t)B, (size_t)T, 0);
    w->holes = meshed ? 0 : acts_holes(c, o, (size_t)B, (size_t)T, 0); // (packed: one process)
    w->total = w->state + w->acts - w->lent - w->holes;
    cuda_memory(&w->cuda, c, NULL, o, (size_t)B, (size_t)T, c->n_layers, rc_count(o, 0, c->n_layers),
                (double)np, w->state + w->acts, meshed, 1,
                cost_fp8_tables(o) ? cost_fp8_kept(c, NULL, cost_fp8_tables(o) == 2) : 0);
}

// A rank of a mesh without pipeline stages (ct: its slices): one micro-batch's activations.
static void rank_memory(CostMemory *r, const ModelConfig *c, const TrainOptions *o, const CostMesh *m,
                        const CostTable *ct) {
    const MeshShape *ms = &m->ms;
    const ParamTable *lt = ct->t;
    int T = o->seq_len, Bl = m->Bl;
    double mom = moment_elems(lt, ms, o);
    double ra = acts_layers(c, ms, (size_t)Bl, (size_t)T, 0, c->n_layers, o) +
        acts_head(c, ms, (size_t)Bl * T, o->loss_chunks) + acts_scratch(c, ms, (size_t)Bl, (size_t)T, 4) +
        acts_mtp(c, ms, (size_t)Bl, (size_t)T, o->loss_chunks) + acts_vocab_parts(c, ms, (size_t)Bl * T);
    double rl = acts_lent(c, ms, o, (size_t)Bl, (size_t)T, 0);
    r->params = 4.0 * lt->ltotal;
    r->moments = moment_bytes(o) * mom;
    r->acts = ra;
    r->lent = rl;
    r->holes = ms->world == 1 ? acts_holes(c, o, (size_t)Bl, (size_t)T, 0) : 0; // (packed: one process)
    r->total = 8.0 * lt->ltotal + moment_bytes(o) * mom + ra - rl - r->holes;
    int L = c->n_layers, irc = rc_count(o, 0, L);
    r->routed = acts_routed(c, ms, (size_t)Bl, (size_t)T, L, kept_rows(o, L, irc), 4) +
        routed_fp8(c, ms, o, (size_t)Bl, (size_t)T, L);
    cuda_memory(&r->cuda, c, ms, o, (size_t)Bl, (size_t)T, L, irc, (double)lt->ltotal,
                8.0 * lt->ltotal + moment_bytes(o) * mom + ra, ms->world > 1, 1, ct->fp8_kept);
}

// A rank of pipeline stage s (ct: its slices): each chunk's live micro-batches x its layers (+ the head's
// on the last virtual stage); with --recompute every recomputing (micro-batch, layer) but one drops its rows
// (the rank's shared buffers); the backward's scratch once.
static void stage_memory(CostMemory *r, const ModelConfig *c, const TrainOptions *o, const CostMesh *m, int s,
                         const CostTable *ct) {
    const MeshShape *ms = &m->ms;
    const ParamTable *lt = ct->t;
    const int *first = m->sp.first;
    size_t Bl = (size_t)m->Bl, T = (size_t)o->seq_len;
    double mom = moment_elems(lt, ms, o), acts = 0;
    int inst = 0, irc = 0, head = 0, ir = 0;
    for (int ch = 0; ch < m->vpp; ch++) {
        int v = ch * ms->pp + s, live = m->stage[s].live[ch];
        inst += live * (first[v + 1] - first[v]);
        irc += live * rc_count(o, first[v], first[v + 1]);
        ir += live * routed_layers(c, first[v], first[v + 1]);
        head |= v == ms->pp * m->vpp - 1;
        acts += live *
            (acts_layers(c, ms, Bl, T, first[v], first[v + 1], NULL) +
             (v == ms->pp * m->vpp - 1
                  ? acts_head(c, ms, Bl * o->seq_len, o->loss_chunks) + acts_mtp(c, ms, Bl, T, o->loss_chunks)
                  : 0));
    }
    if (irc > 1) acts -= (irc - 1) * acts_dropped(c, ms, Bl, T, o->recompute);
    if (o->fp8_save) acts += acts_fp8_change(c, ms, Bl, T, ir);
    acts += acts_scratch(c, ms, Bl, T, 4) + (head ? acts_vocab_parts(c, ms, Bl * T) : 0); // (once a rank)
    r->params = 4.0 * lt->ltotal;
    r->moments = moment_bytes(o) * mom;
    r->acts = acts;
    r->lent = 0;
    r->total = 8.0 * lt->ltotal + moment_bytes(o) * mom + acts;
    r->routed =
        acts_routed(c, ms, Bl, T, inst, kept_rows(o, inst, irc), 4) + routed_fp8(c, ms, o, Bl, T, inst);
    cuda_memory(&r->cuda, c, ms, o, Bl, T, inst, irc, (double)lt->ltotal, r->total, ms->world > 1, head,
                ct->fp8_kept);
}

// The bytes a rank of stage s (lt: its slices) sends in a step; hb: bytes of a value of the rows sent to
// the experts (ops.h Backend.hid). Per layer and micro-batch of N tokens (replicated over TP), the rank
// routes M = N/TP x k rows.
static void stage_comm(CostComm *cm, const ModelConfig *c, const TrainOptions *o, const CostMesh *m, int s,
                       const ParamTable *lt, double hb) {
    const MeshShape *ms = &m->ms;
    double tp = ms->tp, ep = ms->ep, etp = ms->etp, d = c->d_model, mb = m->micro;
    double N = (double)m->Bl * o->seq_len, M = N / tp * c->top_k;
    int layers = 0, moe = 0; // (a dense layer has no exchange)
    double pp = 0;
    for (int ch = 0; ch < m->vpp; ch++) {
        int v = ch * ms->pp + s;
        layers += m->sp.first[v + 1] - m->sp.first[v];
        for (int l = m->sp.first[v]; l < m->sp.first[v + 1]; l++) moe += !config_layer_dense(c, l);
        pp += (v < ms->pp * m->vpp - 1) + (v > 0); // the forward's output on, the backward's gradient back
    }
    double ar = 2 * (tp - 1) / tp, ag = (tp - 1) / tp; // all-reduce, all-gather over TP: parts of the bytes
    double tpl = 2 * (ar + ag) * N * d * 4 + (c->qk_norm == QK_NORM_FULL ? 2 * ar * 2 * N * 8 : 0);
    // --vocab-parallel (model/vocab.h): the embedding's rows summed (first stage); each head's input gradient
    // summed and its cross-entropy's parts gathered (2 floats a row; the last stage: the MTP modules' too)
    int first = s == 0, last = s == ms->pp - 1;
    double heads = last ? 1.0 + c->mtp_depth : 0,
           voc = ms->vocab ? (first * ar * N * d * 4 + heads * (ar * N * d * 4 + ag * 3 * N * 8 * tp)) : 0;
    // x (--fp8-dispatch: packed FP8 rows), dy in hb, the outputs and dx float32
    double xr = o->fp8_dispatch ? (double)fp8_row_bytes(c->d_model) : d * hb;
    double epl = (ep - 1) / ep * M * (xr + d * (hb + 8));
    double etpl = o->expert_mode == 1 ? 2 * (etp - 1) / etp * 3 * (c->n_experts / ms->ep) * c->d_ff * d * 4
                                      : 2 * (etp - 1) * M * d * (hb + 4);
    cm->tp = mb * (layers * tpl + voc);
    cm->ep = mb * moe * epl;
    cm->ep_back = mb * moe * 2 * (ep - 1) / ep * M * d * 4;
    cm->etp = mb * moe * etpl;
    cm->pp = mb * pp * N * d * 4;
    // once a step: each gradient over its group (ZeRO 2: reduce-scattered), ZeRO's weights all-gathered
    cm->dp = 0;
    for (int r = 0; r < 3; r++) {
        int g = reduce_ranks(r, ms);
        double part = (g - 1.0) / g * 4.0 * (double)(lt->lby[r][0] + lt->lby[r][1]);
        cm->dp += (o->zero == 2 ? 1 : 2) * part + (o->zero ? part : 0);
    }
    cm->total = cm->tp + cm->ep + cm->etp + cm->dp + cm->pp;
}

const char *cost_pipe(CostPipe *p, const TrainOptions *o, int pp, int n_layers) {
    memset(p, 0, sizeof *p);
    ScheduleKind k = o->pp_schedule;
    p->pp = pp;
    p->vpp = pp > 1 && k == SCHED_INTERLEAVED ? o->vpp : 1;
    p->micro = o->grad_accum;
    if (pp == 1) { // one stage: every layer, sequential
        p->sp.pp = p->sp.vpp = 1;
        p->sp.first[0] = 0;
        p->sp.first[1] = n_layers;
        p->live = xcalloc(1, sizeof(int));
        p->live[0] = 1;
        return NULL;
    }
    const char *bad = stages_split(&p->sp, n_layers, pp, p->vpp, o->pp_layers);
    if (bad) return bad;
    p->live = xcalloc((size_t)pp * p->vpp, sizeof(int));
    Schedule sc;
    for (int s = 0; s < pp; s++) {
        if ((bad = schedule_build(&sc, k, pp, s, p->vpp, p->micro))) {
            cost_pipe_free(p);
            return bad;
        }
        memcpy(p->live + (size_t)s * p->vpp, sc.live, sizeof(int) * p->vpp);
        schedule_free(&sc);
    }
    p->bubble = schedule_bubble_theory(k, pp, p->vpp, p->micro);
    p->bubble_sim = schedule_bubble(k, pp, p->vpp, p->micro, 1, 2);
    return NULL;
}

void cost_pipe_free(CostPipe *p) {
    free(p->live);
    memset(p, 0, sizeof *p);
}

const char *cost_mesh(CostMesh *m, const ModelConfig *c, const TrainOptions *o, const MeshShape *ms) {
    return cost_mesh_tables(m, c, o, ms, NULL, NULL);
}

void cost_table_of(CostTable *ct, const ModelConfig *c, const ParamTable *t, int fp8) {
    ct->t = t;
    ct->fp8_kept = fp8 ? cost_fp8_kept(c, t, fp8 == 2) : 0;
}

const char *cost_mesh_tables(CostMesh *m, const ModelConfig *c, const TrainOptions *o, const MeshShape *ms,
                             const CostTable *lts, const CostPipe *pipe) {
    memset(m, 0, sizeof *m);
    CostPipe own;
    if (!pipe) {
        const char *bad = cost_pipe(&own, o, ms->pp, c->n_layers);
        if (bad) return bad;
    }
    const CostPipe *p = pipe ? pipe : &own;
    CHECK(p->pp == ms->pp && p->micro == o->grad_accum, "cost_mesh_tables: a pipeline of another layout");
    m->ms = *ms;
    m->sp = p->sp;
    m->vpp = p->vpp;
    m->micro = p->micro;
    m->bubble = p->bubble;
    m->bubble_sim = p->bubble_sim;
    m->Bl = o->batch / o->grad_accum / ms->dp;
    m->stage = xcalloc((size_t)ms->pp, sizeof *m->stage);
    for (int s = 0; s < ms->pp; s++) m->stage[s].live = p->live + (size_t)s * m->vpp;
    if (!pipe) m->own_live = own.live; // (the rest of own is copied above)
    for (int s = 0; s < ms->pp; s++) {
        CostStage *st = &m->stage[s];
        ParamSlicing sl = {ms->tp, 0, ms->ep, 0, ms->etp, 0, ms->pp > 1 ? &m->sp : NULL, s, ms->vocab};
        ParamTable own_t;
        CostTable oct;
        if (!lts) {
            params_build_local(&own_t, c, &sl);
            cost_table_of(&oct, c, &own_t, cost_fp8_tables(o));
        }
        const CostTable *ct = lts ? &lts[s] : &oct;
        const ParamTable *lt = ct->t;
        if (ms->pp == 1) rank_memory(&st->mem, c, o, m, ct);
        else stage_memory(&st->mem, c, o, m, s, ct);
        stage_comm(&st->comm, c, o, m, s, lt, 4);
        stage_comm(&st->comm16, c, o, m, s, lt, 2);
        st->gnorm = cost_gnorm_bytes(lt, ms, o);
        if (!lts) params_free(&own_t);
    }
    return NULL;
}

void cost_mesh_free(CostMesh *m) {
    free(m->own_live);
    free(m->stage);
    memset(m, 0, sizeof *m);
}
