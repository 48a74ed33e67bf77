// info.c — `moe info`'s figures for a model config and a training layout (see info.h).
#include "train/info.h"
#include <math.h>
#include <stdio.h>
#include "core/common.h"
#include "model/model.h"
#include "model/params.h"
#include <string.h>
#include "parallel/mesh.h"
#include "parallel/stages.h"
#include "train/schedule.h"

// The MoE exchange is local (no copies of the rows: the experts read the dispatched rows xs and the
// combine their outputs yg in place) when the rank's EP and ETP groups are of one.
static int local_exchange(const MeshShape *ms) { return !ms || (ms->ep == 1 && ms->etp == 1); }

// Activation bytes of one layer on one rank of a mesh (ms; NULL: one process) running B sequences of T
// tokens: the float32 buffers the forward keeps for the backward: the residual stream and norms (not the MoE
// output: the model's one buffer, acts_scratch), its
// heads (TP), its slice of the router's rows (N/TP) and their dispatched copies (xs; ys and the expert
// side's xg where the exchange is not local), and the expert rows it computes (its ETP group's, k per
// routed token: the mean over a balanced load: yg and the SwiGLU rows); the shared expert's rows (h1, h3,
// act of its width, its input rows, its output and gate) on the router's slice.
static double acts_layer(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T) {
    int tp = ms ? ms->tp : 1, etp = ms ? ms->etp : 1, lo = local_exchange(ms);
    size_t N = B * T, d = c->d_model, qd = (size_t)c->n_heads * c->head_dim / tp,
           kvd = (size_t)c->n_kv_heads * c->head_dim / tp, Ns = (N + tp - 1) / tp;
    size_t Re = (size_t)etp * Ns * c->top_k, fl = (size_t)c->d_ff / etp, k = c->top_k;
    // the families' buffers: q, k before their norms and the norms' rstd; the shared expert's
    size_t fs = (size_t)c->n_shared_experts * c->shared_d_ff;
    size_t qk = !c->qk_norm ? 0 : qd + kvd + (c->qk_norm == QK_NORM_HEAD ? (qd + kvd) / c->head_dim : 2);
    return 4.0 *
        (N * (5 * d + 2 * qd + 2 * kvd + 2 + qk) + Ns * (c->n_experts + (lo ? 1 : 2) * k * d) +
         Re * ((lo ? 1 : 2) * d + 3 * fl) + B * (c->n_heads / tp) * T + (fs ? Ns * (3 * fs + 2 * d + 1) : 0));
}
// The rows of one layer kept for the backward in the hidden format besides the SwiGLU rows (the attention
// norm's output xn1; q, k, v after RoPE and the attention output, unless --recompute attn (rc) drops it; the
// rows sent to the experts: xs, xg where the exchange is not local, the shared expert's input), as float32:
// a backend with bf16 rows (ops.h hid_elem) halves them.
static double acts_hid_rows(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int rc) {
    int tp = ms ? ms->tp : 1, etp = ms ? ms->etp : 1;
    size_t N = B * T, Ns = (N + tp - 1) / tp, d = c->d_model, Re = (size_t)etp * Ns * c->top_k;
    size_t qd = (size_t)c->n_heads / tp * c->head_dim,
           qkv = qd + (size_t)2 * c->n_kv_heads / tp * c->head_dim;
    return 4.0 *
        (N * d + N * (qkv + (rc & RECOMPUTE_ATTN ? 0 : qd)) + Ns * c->top_k * d +
         (local_exchange(ms) ? 0 : Re * d) + (c->n_shared_experts ? Ns * d : 0));
}
// The experts' SwiGLU rows (h1, h3, act) of one layer, as float32: the routed experts' (shared 0) or
// the shared expert's (shared 1). A backend with bf16 hidden rows (ops.h hid_elem) halves them.
static double acts_hidden(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int shared) {
    int tp = ms ? ms->tp : 1, etp = ms ? ms->etp : 1;
    size_t Ns = (B * T + tp - 1) / tp, Re = (size_t)etp * Ns * c->top_k, fl = (size_t)c->d_ff / etp;
    return shared ? 4.0 * Ns * 3 * c->n_shared_experts * c->shared_d_ff : 4.0 * Re * 3 * fl;
}
// The part of a layer's activations --recompute drops (rc: RECOMPUTE_* bits): the experts' SwiGLU rows (moe),
// the attention output and lse (attn). One layer's worth stays (the shared buffers).
static double acts_dropped(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int rc) {
    int tp = ms ? ms->tp : 1;
    size_t N = B * T, qd = (size_t)c->n_heads * c->head_dim / tp;
    return (rc & RECOMPUTE_MOE ? acts_hidden(c, ms, B, T, 0) : 0) +
        4.0 * (rc & RECOMPUTE_ATTN ? N * qd + B * (c->n_heads / tp) * T : 0);
}
// L layers' activations under --recompute rc.
static double acts_layers(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int L, int rc) {
    return L * acts_layer(c, ms, B, T) - (L > 1 ? (L - 1) * acts_dropped(c, ms, B, T, rc) : 0);
}
// The backward's scratch on one rank (one set, whatever the layers), rows in the hidden format of hb bytes a
// value (ops.h hid_elem): the model's gradients of the residual stream, the norms' outputs, q, k, v and the
// attention output (and of q, k before QK-norm), the forward's MoE output (model.h moe_out); the MoE layer's
// (moe.h MoeScratch, sized for the whole micro-batch): dy rows (hidden format), dx (token side, my slice of
// the jittered input: TP; counted always), dlogits, the expert side's dxg and dh1, dh3 (and the dy, dx copies
// where the exchange is not local), the shared expert's.
static double acts_scratch(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, double hb) {
    int tp = ms ? ms->tp : 1, etp = ms ? ms->etp : 1, lo = local_exchange(ms);
    size_t N = B * T, d = c->d_model, qd = (size_t)c->n_heads * c->head_dim / tp,
           kvd = (size_t)c->n_kv_heads * c->head_dim / tp, Ns = (N + tp - 1) / tp, R = N * c->top_k;
    size_t Re = (size_t)etp * Ns * c->top_k, fl = (size_t)c->d_ff / etp;
    size_t fs = (size_t)c->n_shared_experts * c->shared_d_ff;
    double model = 4.0 * N * (3 * d + 2 * qd + 2 * kvd + (c->qk_norm ? qd + kvd : 0));
    double moe = 4.0 * (N * d + N * c->n_experts + R + Re * d + (lo ? 0 : R * d)) +
        hb * (R * d + (lo ? 0 : Re * d)) + hb * 2 * Re * fl + (fs ? 4.0 * N + hb * N * (d + 2 * fs) : 0);
    return model + moe;
}
// The activations of the final norm and LM head.
static double acts_head(const ModelConfig *c, size_t N) { return 4.0 * N * (2 * c->d_model + c->vocab_size); }
// The bytes a backend with bf16 rows (ops.h hid_elem 2) saves in one layer that keeps its activations under
// --recompute rc: half of the SwiGLU rows it keeps (the routed ones unless rc drops them) and of
// acts_hid_rows.
static double acts_hid_saved(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int rc) {
    return 0.5 *
        ((rc & RECOMPUTE_MOE ? 0 : acts_hidden(c, ms, B, T, 0)) + acts_hidden(c, ms, B, T, 1) +
         acts_hid_rows(c, ms, B, T, rc));
}
// --grad-memory shared (with --grad-accum 1 and no --pp: model.h model_share_grads): the activation bytes
// that live in the expert gradients' memory on one rank (about: a buffer that does not fit whole goes to the
// allocator, where this counts the part that would fit): each layer's but the first, up to the previous
// layer's expert gradients, and the head's, up to the last layer's. hid: a backend with bf16 rows.
static double acts_lent(const ModelConfig *c, const MeshShape *ms, const TrainOptions *o, size_t B, size_t T,
                        int hid) {
    int ep = ms ? ms->ep : 1, etp = ms ? ms->etp : 1, pp = ms ? ms->pp : o->pp;
    if (o->grad_memory != GRADMEM_SHARED || o->grad_accum != 1 || pp > 1) return 0;
    double g = 4.0 * 3 * (c->n_experts / ep) * (double)(c->d_ff / etp) * c->d_model;
    double la = acts_layer(c, ms, B, T) - acts_dropped(c, ms, B, T, o->recompute);
    if (hid) la -= acts_hid_saved(c, ms, B, T, o->recompute);
    return (c->n_layers - 1) * fmin(la, g) + fmin(acts_head(c, B * T), g);
}
// Bytes per AdamW moment element: float32, or bf16 under --precision bf16 (dist.c dist_moment_bytes).
static double moment_bytes(const TrainOptions *o) { return o->precision == PREC_BF16 ? 2.0 : 4.0; }

// With pipeline stages: each stage's layers, parameters, optimizer state and peak activations (the
// schedule's live micro-batches), and the bubble.
static void print_stages(const ModelConfig *c, const TrainOptions *o, const MeshShape *ms) {
    StageSplit sp;
    int vpp = o->pp_schedule == SCHED_INTERLEAVED ? o->vpp : 1;
    const char *bad = stages_split(&sp, c->n_layers, ms->pp, vpp, o->pp_layers);
    if (bad) DIE("impossible pipeline: %s", bad);
    int m = o->grad_accum, Bl = o->batch / m / ms->dp;
    ScheduleKind k = o->pp_schedule;
    Schedule sc;
    bad = schedule_build(&sc, k, ms->pp, 0, vpp, m);
    if (bad) DIE("impossible pipeline: %s", bad);
    schedule_free(&sc);
    double th = schedule_bubble_theory(k, ms->pp, vpp, m), sim = schedule_bubble(k, ms->pp, vpp, m, 1, 2);
    printf("pipeline: %d stages x %d chunks, %s, %d micro-batches of %d sequences per DP rank; bubble %s = "
           "%.1f%% "
           "(simulated with backward = 2 x forward: %.1f%%)\n",
           ms->pp, vpp, k == SCHED_INTERLEAVED ? "interleaved 1F1B" : "1F1B", m, Bl,
           k == SCHED_INTERLEAVED ? "(p-1)/(v m+p-1)" : "(p-1)/(m+p-1)", 100 * th, 100 * sim);
    for (int s = 0; s < ms->pp; s++) {
        ParamSlicing sl = {ms->tp, 0, ms->ep, 0, ms->etp, 0, &sp, s};
        ParamTable lt;
        params_build_local(&lt, c, &sl);
        double mom = 0;
        for (int i = 0; i < lt.n; i++) {
            const ParamSpec *p = &lt.p[i];
            int group = p->reduce == RED_DP ? ms->dp : p->reduce == RED_EDP ? ms->edp : ms->tp * ms->dp;
            mom += 2.0 * p->lnumel / (o->zero ? group : 1);
        }
        schedule_build(&sc, k, ms->pp, s, vpp, m);
        char what[160] = "";
        for (int ch = 0; ch < vpp; ch++) {
            int v = ch * ms->pp + s;
            size_t w = strlen(what);
            if (sp.first[v + 1] - sp.first[v] == 1)
                snprintf(what + w, sizeof what - w, "%s%d", ch ? "," : "", sp.first[v]);
            else
                snprintf(what + w, sizeof what - w, "%s%d-%d", ch ? "," : "", sp.first[v],
                         sp.first[v + 1] - 1);
        }
        // each chunk's live micro-batches x its layers (+ the head's on the last virtual stage); with
        // --recompute every (micro-batch, layer) but one drops its rows (the rank's shared buffers)
        double acts = 0;
        int inst = 0;
        for (int ch = 0; ch < vpp; ch++) {
            int v = ch * ms->pp + s;
            inst += sc.live[ch] * (sp.first[v + 1] - sp.first[v]);
            acts += sc.live[ch] *
                (acts_layers(c, ms, (size_t)Bl, (size_t)o->seq_len, sp.first[v + 1] - sp.first[v], 0) +
                 (v == ms->pp * vpp - 1 ? acts_head(c, (size_t)Bl * o->seq_len) : 0));
        }
        if (inst > 1) acts -= (inst - 1) * acts_dropped(c, ms, (size_t)Bl, (size_t)o->seq_len, o->recompute);
        acts += acts_scratch(c, ms, (size_t)Bl, (size_t)o->seq_len, 4); // the backward's, once
        char a1[32], a2[32], a3[32], a4[32];
        fmt_bytes(a1, sizeof a1, 4.0 * lt.ltotal);
        fmt_bytes(a2, sizeof a2, moment_bytes(o) * mom);
        fmt_bytes(a3, sizeof a3, acts);
        fmt_bytes(a4, sizeof a4, 8.0 * lt.ltotal + moment_bytes(o) * mom + acts);
        char lv[64] = "";
        for (int ch = 0; ch < vpp; ch++)
            snprintf(lv + strlen(lv), sizeof lv - strlen(lv), "%s%d", ch ? "+" : "", sc.live[ch]);
        printf("  stage %d: layers %s%s%s: params %s, grads %s, AdamW %s, activations %s (%s live "
               "micro-batches); "
               "%s per rank\n",
               s, what, s == 0 ? " + embedding" : "", s == ms->pp - 1 ? " + final norm, LM head" : "", a1, a1,
               a2, a3, lv, a4);
        schedule_free(&sc);
        params_free(&lt);
    }
}

void info_print(const ModelConfig *c, const TrainOptions *o, int world) {
    const char *bad = config_validate(c);
    if (bad) DIE("invalid model config: %s", bad);
    bad = train_options_validate(o, c); // the batch, sequence and mesh figures info shows
    if (bad) DIE("%s", bad);
    int T = o->seq_len, B = o->batch;
    char b1[32], b2[32], b3[32];
    size_t np = config_num_params(c), na = config_num_active_params(c);
    fmt_count(b1, sizeof b1, (double)np);
    fmt_count(b2, sizeof b2, (double)na);
    printf("model: d %d, %d layers, %d heads (%d kv, head dim %d), %d experts top-%d (%s), f %d, vocab %d, "
           "max seq %d\n",
           c->d_model, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->n_experts, c->top_k,
           c->renormalize ? "renormalised" : "not renormalised", c->d_ff, c->vocab_size, c->max_seq_len);
    printf("dispatch: %s", c->dispatch == DISPATCH_CAPACITY ? "capacity" : "dropless");
    if (c->dispatch == DISPATCH_CAPACITY)
        printf(" (factor %g: %lld slots per expert for %lld tokens)", c->capacity_factor,
               (long long)capacity_for(c, (int64_t)B * T), (long long)B * T);
    printf("; aux coef %g, z coef %g, jitter %g\n", c->aux_coef, c->z_coef, c->jitter);
    printf("parameters: %s total, %s active per token (%zu / %zu)\n", b1, b2, np, na);
    ParamTable t;
    params_build(&t, c);
    double dense = 0, expert = 0;
    for (int i = 0; i < t.n; i++) *(t.p[i].expert >= 0 ? &expert : &dense) += t.p[i].numel;
    fmt_count(b1, sizeof b1, dense);
    fmt_count(b2, sizeof b2, expert);
    printf("  tensors: %d (%s dense params reduced over DP, %s expert params reduced over EDP)\n", t.n, b1,
           b2);
    double fl = config_flops_per_token(c, T);
    fmt_count(b1, sizeof b1, fl);
    printf("training FLOPs per token at seq %d: %s (6 x active params + attention)\n", T, b1);
    // memory, float32 cpu backend: params + grads + two AdamW moments (bf16 under --precision bf16; the
    // weights stay in their float32 buffer, holding bf16 values)
    double state = (8.0 + 2 * moment_bytes(o)) * np;
    size_t N = (size_t)B * T, d = c->d_model, qd = (size_t)c->n_heads * c->head_dim;
    size_t Rk = N * c->top_k;
    double scr32 = acts_scratch(c, NULL, (size_t)B, (size_t)T, 4),
           scr16 = acts_scratch(c, NULL, (size_t)B, (size_t)T, 2);
    double acts =
        acts_layers(c, NULL, (size_t)B, (size_t)T, c->n_layers, o->recompute) + acts_head(c, N) + scr32;
    // (--grad-memory shared: part of the activations in the expert gradients' memory)
    double lent32 = acts_lent(c, NULL, o, (size_t)B, (size_t)T, 0),
           lent16 = acts_lent(c, NULL, o, (size_t)B, (size_t)T, 1);
    char bl[32];
    fmt_bytes(b1, sizeof b1, state);
    fmt_bytes(b2, sizeof b2, acts);
    fmt_bytes(b3, sizeof b3, state + acts - lent32);
    fmt_bytes(bl, sizeof bl, lent32);
    printf("memory, whole model (cpu, %s): params+grads+adam %s, activations for batch %d x %d: %s (%s of "
           "them in the "
           "expert gradients' memory), total %s\n",
           o->precision == PREC_BF16 ? "float32, AdamW moments bf16" : "float32", b1, B, T, b2, bl, b3);
    // cuda: the same buffers on the GPU but the experts' hidden rows (h1, h3, act), the rows sent to them,
    // the attention norm's output and the attention's q, k, v and output in bf16 (ops.h hid_elem: half of
    // their bytes in every layer that keeps them: the routed SwiGLU rows in one under --recompute moe, the
    // rest in all; and the backward's dy rows, dh1, dh3), plus the bf16 copy of the weights the GEMMs read
    // (ops.h bf16_shadow) and the bf16 operand scratch the GEMM and attention ops convert activations into
    // (below)
    double hid = c->n_layers * acts_hid_saved(c, NULL, (size_t)B, (size_t)T, o->recompute) +
        (o->recompute & RECOMPUTE_MOE ? 0.5 * acts_hidden(c, NULL, (size_t)B, (size_t)T, 0) : 0) +
        (scr32 - scr16); // (under --recompute moe the one shared copy of the routed rows)
    // (the workspace: the larger of a layer's bf16 expert rows and the attention backward's D, bf16 dout
    // and, at head dim 128, its dS: ops.h attention_ds_bytes)
    double att_ws = 4.0 * B * c->n_heads * T + 2.0 * N * qd +
        (double)attention_ds_bytes(B, T, c->n_heads, c->head_dim, 0, T);
    double shadow = 2.0 * np, scratch = fmax(2.0 * Rk * d, att_ws);
    // --precision bf16 (rounded weights) in one process: the weights only the bf16 GEMMs read (the routed
    // experts', the attention projections', the LM head's) in the bf16 copy alone (model_bf16_weights): the
    // float32 buffer's whole 2 MiB pages inside each of their ranges are not there
    double alone = 0;
    if (train_bf16_weights_alone(o, world > 1 || o->tp > 1 || o->ep > 1 || o->etp > 1 || o->pp > 1)) {
        size_t *h = xmalloc(sizeof(size_t) * params_bf16_ranges_max(c->n_layers)), pg = (size_t)2 << 20;
        int nh = params_bf16_ranges(&t, c->n_layers, 0, c->n_experts, MOE_GEMM_FP32_MAX_O, h);
        for (int i = 0; i < nh; i++) {
            size_t a = (4 * h[2 * i] + pg - 1) / pg, b = 4 * h[2 * i + 1] / pg;
            if (b > a) alone += (double)(b - a) * pg;
        }
        free(h);
    }
    fmt_bytes(b1, sizeof b1, hid);
    fmt_bytes(b2, sizeof b2, shadow);
    fmt_bytes(b3, sizeof b3, scratch);
    char b4[32], b5[48] = "";
    fmt_bytes(b4, sizeof b4, state + acts - hid + shadow + scratch - lent16 - alone);
    fmt_bytes(bl, sizeof bl, lent16);
    if (alone > 0) {
        char a[32];
        fmt_bytes(a, sizeof a, alone);
        snprintf(b5, sizeof b5, " - float32 GEMM weights %s", a);
    }
    printf("memory (cuda, the same buffers - bf16 rows %s + bf16 weights %s%s + bf16 operand scratch %s, %s "
           "of the "
           "activations in the expert gradients' memory): %s plus the CUDA context\n",
           b1, b2, b5, b3, bl, b4);
    if (o->ampipe !=
        1) // the chunks' MoE states replace the whole batch's (moe_layer_trim): the same rows in all
        printf("--ampipe %s: the activations above hold for every n (a chunked layer keeps its n chunks' MoE "
               "rows, "
               "N/n each, in place of the whole micro-batch's)\n",
               o->ampipe ? "n" : "auto");
    params_free(&t);
    if (world > 0 || o->tp > 1 || o->ep > 1 || o->etp > 1 || o->pp > 1) {
        long long ranks = (long long)o->tp * o->ep * o->etp * o->pp; // the smallest world for the layout
        if (world <= 0 && ranks > 1 << 30)
            DIE("impossible mesh: tp %d x ep %d x etp %d x pp %d = %lld ranks", o->tp, o->ep, o->etp, o->pp,
                ranks);
        MeshShape ms = {world > 0 ? world : (int)ranks,   o->tp, 0, o->pp, o->ep, o->etp, 0,
                        o->a2a_hier > 1 ? o->a2a_hier : 0};
        bad = mesh_shape_resolve(&ms, c);
        if (bad) DIE("impossible mesh: %s", bad);
        mesh_print(&ms, stdout);
        // per-rank memory (rank 0; every rank holds the same amount by symmetry)
        ParamSlicing sl = {ms.tp, 0, ms.ep, 0, ms.etp, 0, NULL, 0};
        ParamTable lt;
        params_build_local(&lt, c, &sl);
        double mom = 0;
        for (int i = 0; i < lt.n; i++) {
            const ParamSpec *p = &lt.p[i];
            int group = p->reduce == RED_DP ? ms.dp : p->reduce == RED_EDP ? ms.edp : ms.tp * ms.dp;
            mom += 2.0 * p->lnumel / (o->zero ? group : 1);
        }
        // activations: one micro-batch (pipeline stages: printed per stage below)
        int Bl = o->batch / (o->grad_accum > 0 ? o->grad_accum : 1) / ms.dp;
        double ra = ms.pp > 1 ? 0
                              : acts_layers(c, &ms, (size_t)Bl, (size_t)T, c->n_layers, o->recompute) +
                acts_head(c, (size_t)Bl * T) + acts_scratch(c, &ms, (size_t)Bl, (size_t)T, 4);
        double rl = acts_lent(c, &ms, o, (size_t)Bl, (size_t)T, 0);
        char a1[32], a2[32], a3[32], a4[32], a5[32];
        fmt_bytes(a1, sizeof a1, 4.0 * lt.ltotal);
        fmt_bytes(a2, sizeof a2, moment_bytes(o) * mom);
        fmt_bytes(a3, sizeof a3, ra);
        fmt_bytes(a4, sizeof a4, 8.0 * lt.ltotal + moment_bytes(o) * mom + ra - rl);
        fmt_bytes(a5, sizeof a5, rl);
        if (ms.pp == 1) // (with stages: per stage, below)
            printf("per rank (zero %d, %s): params %s, grads %s, AdamW moments %s, activations %s (a "
                   "micro-batch "
                   "of %d x %d; %s of them in the expert gradients' memory); total %s\n",
                   o->zero, o->precision == PREC_BF16 ? "float32, moments bf16" : "float32", a1, a1, a2, a3,
                   Bl, T, a5, a4);
        if (o->zero == 2)
            printf("  (zero 2 reduces each bucket straight into this rank's shard; the gradient accumulation "
                   "buffer "
                   "stays whole, so its memory is as zero 1)\n");
        params_free(&lt);
        if (ms.pp > 1) print_stages(c, o, &ms);
    }
}
