// info.c — `moe info`: prints the cost model's figures (train/cost.h) for a model config and a training
// layout: parameters, FLOPs per token, memory on the cpu and cuda backends, and for a mesh its groups, each
// rank's memory (per pipeline stage) and the bytes each rank sends per step.
// Must not hold: the arithmetic behind the figures (train/cost.c).
#include "train/info.h"
#include <stdio.h>
#include <string.h>
#include "core/common.h"
#include "model/params.h"
#include "parallel/mesh.h"
#include "train/cost.h"

// The model's shape, dispatch, parameters and FLOPs per token.
static void print_model(const ModelConfig *c, const TrainOptions *o) {
    int T = o->seq_len, B = o->batch;
    char b1[32], b2[32];
    CostParams cp;
    cost_params(&cp, c);
    fmt_count(b1, sizeof b1, (double)cp.total);
    fmt_count(b2, sizeof b2, (double)cp.active);
    printf("model: d %d, %d layers, %d heads (%d kv, head dim %d), %d experts top-%d (%s), f %d, vocab %d, "
           "max seq %d\n",
           c->d_model, c->n_layers, c->n_heads, c->n_kv_heads, c->head_dim, c->n_experts, c->top_k,
           c->renormalize ? "renormalised" : "not renormalised", c->d_ff, c->vocab_size, c->max_seq_len);
    if (config_mla(c)) {
        printf("latent attention: %d heads x (%d + %d rope) qk, %d v; q %s%d, kv latent %d", c->n_heads,
               c->qk_nope_head_dim, c->qk_rope_head_dim, c->v_head_dim, c->q_lora_rank ? "lora " : "proj ",
               c->q_lora_rank ? c->q_lora_rank : c->n_heads * config_qk_head_dim(c), c->kv_lora_rank);
        if (c->rope_factor != 0)
            printf("; YaRN factor %g over %d positions", c->rope_factor, c->rope_orig_max);
        printf("\n");
    }
    int Lm = config_moe_layers(c);
    if (Lm < c->n_layers) { // the dense layers, as a list
        printf("dense layers: %d of %d (a SwiGLU MLP of f %d in place of the experts):", c->n_layers - Lm,
               c->n_layers, c->dense_d_ff);
        for (int l = 0; l < c->n_layers; l++)
            if (config_layer_dense(c, l)) printf(" %d", l);
        printf("\n");
    }
    if (c->route_sigmoid || c->n_group > 1 || (c->route_scale != 0 && c->route_scale != 1) ||
        (c->n_shared_experts && !c->shared_gate)) { // DeepSeek-V3's routing and shared experts
        printf("routing: %s scores", c->route_sigmoid ? "sigmoid" : "softmax");
        if (c->n_group > 1) printf(", the best %d of %d expert groups", c->topk_group, c->n_group);
        if (c->route_scale != 0 && c->route_scale != 1) printf(", weights x %g", c->route_scale);
        if (c->n_shared_experts)
            printf("; %d shared expert%s of f %d (%s)", c->n_shared_experts,
                   c->n_shared_experts > 1 ? "s" : "", c->shared_d_ff,
                   c->shared_gate ? "sigmoid-gated" : "ungated");
        printf("\n");
    }
    if (c->mtp_depth) // (cost.c counts their parameters, FLOPs and activations)
        printf(
            "multi-token prediction: %d module%s (layers %d..%d: eh_proj, an MoE block, norms; the embedding "
            "and LM head shared), loss weight %g\n",
            c->mtp_depth, c->mtp_depth > 1 ? "s" : "", c->n_layers, c->n_layers + c->mtp_depth - 1,
            c->mtp_weight);
    printf("dispatch: %s", c->dispatch == DISPATCH_CAPACITY ? "capacity" : "dropless");
    if (c->dispatch == DISPATCH_CAPACITY)
        printf(" (factor %g: %lld slots per expert for %lld tokens)", c->capacity_factor,
               (long long)capacity_for(c, (int64_t)B * T), (long long)B * T);
    printf("; aux coef %g, z coef %g, jitter %g\n", c->aux_coef, c->z_coef, c->jitter);
    printf("parameters: %s total, %s active per token (%zu / %zu)\n", b1, b2, cp.total, cp.active);
    fmt_count(b1, sizeof b1, cp.dense);
    fmt_count(b2, sizeof b2, cp.expert);
    printf("  tensors: %d (%s dense params reduced over DP, %s expert params reduced over EDP)\n", cp.tensors,
           b1, b2);
    fmt_count(b1, sizeof b1, cost_flops(NULL, c, T));
    printf("training FLOPs per token at seq %d: %s (6 x active params + attention)\n", T, b1);
    // the memory-bound ops (cost_ops.c) of one process on the cuda backend (bf16 rows), a step
    CostBytes mb;
    int ga = o->grad_accum > 0 ? o->grad_accum : 1;
    cost_bytes(&mb, c, NULL, (double)B / ga * T, 0, c->n_layers, 1, 1, 2);
    ParamTable t;
    params_build(&t, c);
    double gn = cost_gnorm_bytes(&t, NULL, o), g = 1e9 / ga;
    params_free(&t);
    printf(
        "memory-bound ops a step (cuda, one process): %.2f GB: norms %.2f, RoPE %.2f, gathers/combines %.2f, "
        "router %.3f, cross-entropy %.2f, adds %.2f, embedding %.2f, clears %.2f, gradient norm %.2f\n",
        (ga * mb.total + gn) / 1e9, mb.norm / g, mb.rope / g, mb.rows / g, mb.router / g, mb.ce / g,
        mb.elem / g, mb.embed / g, mb.copies / g, gn / 1e9);
}

// The cuda backend's figure (cost.h CostCuda): head, then its deltas from the float32 figure and its total.
static void print_cuda(const CostCuda *k, const char *head, int dense) {
    char b1[32], b2[32], b3[32], b4[32], bl[32], b5[256] = "", g[32], ws[32];
    fmt_bytes(b1, sizeof b1, k->hid);
    fmt_bytes(b2, sizeof b2, k->shadow);
    fmt_bytes(b3, sizeof b3, k->scratch);
    fmt_bytes(g, sizeof g, k->gemm);
    fmt_bytes(ws, sizeof ws, k->workspace);
    fmt_bytes(b4, sizeof b4, k->total);
    fmt_bytes(bl, sizeof bl, k->lent);
    if (k->fp8 > 0) {
        char a[32], kc[32], sc[32];
        fmt_bytes(a, sizeof a, k->fp8);
        fmt_bytes(kc, sizeof kc, k->kept);
        fmt_bytes(sc, sizeof sc, k->fp8 - k->kept);
        snprintf(b5 + strlen(b5), sizeof b5 - strlen(b5),
                 " + fp8 operands %s (%s weight codes kept %s, operand scratch %s)", a,
                 dense ? "expert and attention projection" : "expert", kc, sc);
    }
    if (k->alone > 0) {
        char a[32];
        fmt_bytes(a, sizeof a, k->alone);
        snprintf(b5 + strlen(b5), sizeof b5 - strlen(b5), " - float32 weights in the bf16 copy alone %s", a);
    }
    char ln[128] = "";
    if (k->lean > 0) {
        char a[32];
        fmt_bytes(a, sizeof a, k->lean);
        snprintf(ln, sizeof ln, " - lean backward scratch %s", a);
    }
    if (k->holes > 0) {
        char a[32];
        fmt_bytes(a, sizeof a, k->holes);
        snprintf(ln + strlen(ln), sizeof ln - strlen(ln), " - packed expert gradients' holes %s", a);
    }
    printf(
        "%s - bf16 rows %s + bf16 weights %s%s + scratch %s (bf16 GEMM operands %s, workspace %s)%s, %s of "
        "the activations in the gradients' memory): %s plus the CUDA context\n",
        head, b1, b2, b5, b3, g, ws, ln, bl, b4);
}

// The whole model's memory in one process, on the cpu and the cuda backend.
static void print_whole(const ModelConfig *c, const TrainOptions *o, int meshed) {
    CostWhole w;
    cost_whole(&w, c, o, meshed);
    char b1[32], b2[32], b3[32], bl[32], bh[64] = "";
    fmt_bytes(b1, sizeof b1, w.state);
    fmt_bytes(b2, sizeof b2, w.acts);
    fmt_bytes(b3, sizeof b3, w.total);
    fmt_bytes(bl, sizeof bl, w.lent);
    if (w.holes) {
        fmt_bytes(bh + 2, sizeof bh - 2, w.holes);
        memcpy(bh, ", ", 2);
        strncat(bh, " of the packed expert gradients left out", sizeof bh - strlen(bh) - 1);
    }
    printf("memory, whole model (cpu, %s): params+grads+adam %s, activations for batch %d x %d: %s (%s of "
           "them in the expert gradients' memory%s), total %s\n",
           o->precision == PREC_BF16 ? "float32, AdamW moments bf16"
               : o->precision == PREC_FP8 && o->fp8_dense
               ? "float32, the experts' and attention projections' GEMMs in fp8 e4m3 (operands quantised per "
                 "call)"
               : o->precision == PREC_FP8
               ? "float32, the experts' GEMMs in fp8 e4m3 (operands quantised per call)"
               : o->precision == PREC_FP8_BF16 && o->fp8_dense
               ? "float32, AdamW moments bf16, the experts' and attention projections' GEMMs in fp8 e4m3 "
                 "(operands quantised per call)"
               : o->precision == PREC_FP8_BF16
               ? "float32, AdamW moments bf16, the experts' GEMMs in fp8 e4m3 (operands quantised per call)"
               : "float32",
           b1, o->batch, o->seq_len, b2, bl, bh, b3);
    print_cuda(&w.cuda, "memory (cuda, the same buffers", o->fp8_dense);
    if (o->fp8_save) { // (cost_acts.c acts_fp8_change)
        char q[32];
        fmt_bytes(q, sizeof q, 2.0 * o->batch * o->seq_len * c->top_k * fp8_row_bytes(c->d_ff));
        printf("--fp8-save: each MoE layer keeps its experts' SwiGLU inputs as FP8 rows (%s a layer) where "
               "it kept "
               "h1, h3 and act; one shared copy of those\n",
               q);
    }
    if (o->loss_chunks > 1) { // (cost_acts.c acts_head)
        double N = (double)(o->batch / o->grad_accum) * o->seq_len,
               n = (double)params_chunk_len((size_t)N, o->loss_chunks); // (a micro-batch)
        char q[32], w[32], x[32];
        fmt_bytes(q, sizeof q, 4.0 * n * c->vocab_size);
        fmt_bytes(w, sizeof w, 4.0 * N * c->vocab_size);
        fmt_bytes(x, sizeof x, 4.0 * N * c->d_model);
        printf("--loss-chunks %d: the LM head's logits %s a chunk at a time in place of %s (and its input "
               "gradient kept: %s)%s\n",
               o->loss_chunks, q, w, x, c->mtp_depth ? "; each MTP module's as much" : "");
    }
    if (o->ampipe !=
        1) // the chunks' MoE states replace the whole batch's (moe_layer_trim): the same rows in all
        printf("--ampipe %s: the activations above hold for every n (a chunked layer keeps its n chunks' MoE "
               "rows, "
               "N/n each, in place of the whole micro-batch's)\n",
               o->ampipe ? "n" : "auto");
}

// A rank of a mesh without pipeline stages.
static void print_rank(const CostMesh *m, const TrainOptions *o) {
    const CostMemory *r = &m->stage[0].mem;
    char a1[32], a2[32], a3[32], a4[32], a5[32];
    fmt_bytes(a1, sizeof a1, r->params);
    fmt_bytes(a2, sizeof a2, r->moments);
    fmt_bytes(a3, sizeof a3, r->acts);
    fmt_bytes(a4, sizeof a4, r->total);
    fmt_bytes(a5, sizeof a5, r->lent);
    printf("per rank (zero %d, %s): params %s, grads %s, AdamW moments %s, activations %s (a "
           "micro-batch "
           "of %d x %d; %s of them in the expert gradients' memory); total %s\n",
           o->zero,
           o->precision == PREC_BF16           ? "float32, moments bf16"
               : o->precision == PREC_FP8      ? "float32, experts' GEMMs fp8"
               : o->precision == PREC_FP8_BF16 ? "float32, moments bf16, experts' GEMMs fp8"
                                               : "float32",
           a1, a1, a2, a3, m->Bl, o->seq_len, a5, a4);
    print_cuda(&r->cuda, "per rank (cuda, the same buffers", o->fp8_dense);
}

// With pipeline stages: each stage's layers, parameters, optimizer state and peak activations (the
// schedule's live micro-batches), and the bubble.
static void print_stages(const CostMesh *m, const TrainOptions *o) {
    int pp = m->ms.pp, vpp = m->vpp;
    const int *first = m->sp.first;
    ScheduleKind k = o->pp_schedule;
    printf("pipeline: %d stages x %d chunks, %s, %d micro-batches of %d sequences per DP rank; bubble %s = "
           "%.1f%% "
           "(simulated with backward = 2 x forward: %.1f%%)\n",
           pp, vpp, k == SCHED_INTERLEAVED ? "interleaved 1F1B" : "1F1B", m->micro, m->Bl,
           k == SCHED_INTERLEAVED ? "(p-1)/(v m+p-1)" : "(p-1)/(m+p-1)", 100 * m->bubble,
           100 * m->bubble_sim);
    for (int s = 0; s < pp; s++) {
        const CostStage *st = &m->stage[s];
        char what[160] = "", lv[64] = "";
        for (int ch = 0; ch < vpp; ch++) {
            int v = ch * pp + s;
            size_t w = strlen(what);
            if (first[v + 1] - first[v] == 1)
                snprintf(what + w, sizeof what - w, "%s%d", ch ? "," : "", first[v]);
            else snprintf(what + w, sizeof what - w, "%s%d-%d", ch ? "," : "", first[v], first[v + 1] - 1);
            snprintf(lv + strlen(lv), sizeof lv - strlen(lv), "%s%d", ch ? "+" : "", st->live[ch]);
        }
        char a1[32], a2[32], a3[32], a4[32];
        fmt_bytes(a1, sizeof a1, st->mem.params);
        fmt_bytes(a2, sizeof a2, st->mem.moments);
        fmt_bytes(a3, sizeof a3, st->mem.acts);
        fmt_bytes(a4, sizeof a4, st->mem.total);
        printf("  stage %d: layers %s%s%s: params %s, grads %s, AdamW %s, activations %s (%s live "
               "micro-batches); "
               "%s per rank\n",
               s, what, s == 0 ? " + embedding" : "", s == pp - 1 ? " + final norm, LM head" : "", a1, a1, a2,
               a3, lv, a4);
        char head[64];
        snprintf(head, sizeof head, "  stage %d per rank (cuda, the same buffers", s);
        print_cuda(&st->mem.cuda, head, o->fp8_dense);
    }
}

// The bytes each rank sends per step, by purpose (per stage with pipeline stages).
static void print_comm(const CostMesh *m) {
    int pp = m->ms.pp;
    printf("communication per rank and step (bytes sent, as ring collectives, routing balanced)%s",
           pp > 1 ? ":\n" : ": ");
    for (int s = 0; s < pp; s++) {
        const CostComm *a = &m->stage[s].comm;
        char b[6][32], c16[32];
        double v[6] = {a->tp, a->ep, a->etp, a->dp, a->pp, a->total};
        for (int i = 0; i < 6; i++) fmt_bytes(b[i], sizeof b[i], v[i]);
        fmt_bytes(c16, sizeof c16, m->stage[s].comm16.total);
        if (pp > 1) printf("  stage %d sends ", s);
        printf(
            "tp %s, ep all-to-all %s, etp %s, dp gradients %s, pp %s; total %s (cuda, rows to the experts in "
            "bf16: %s)\n",
            b[0], b[1], b[2], b[3], b[4], b[5], c16);
    }
}

void info_print(const ModelConfig *c, const TrainOptions *o, int world) {
    const char *bad = config_validate(c);
    if (bad) DIE("invalid model config: %s", bad);
    bad = train_options_validate(o, c); // the batch, sequence and mesh figures info shows
    if (bad) DIE("%s", bad);
    print_model(c, o);
    int meshed = world > 0 || o->tp > 1 || o->ep > 1 || o->etp > 1 || o->pp > 1;
    print_whole(c, o, world > 1 || o->tp > 1 || o->ep > 1 || o->etp > 1 || o->pp > 1);
    if (!meshed) return;
    long long ranks = (long long)o->tp * o->ep * o->etp * o->pp; // the smallest world for the layout
    if (world <= 0 && ranks > 1 << 30)
        DIE("impossible mesh: tp %d x ep %d x etp %d x pp %d = %lld ranks", o->tp, o->ep, o->etp, o->pp,
            ranks);
    MeshShape ms = train_mesh_shape(o, world > 0 ? world : (int)ranks);
    bad = mesh_shape_resolve(&ms, c);
    if (bad) DIE("impossible mesh: %s", bad);
    mesh_print(&ms, stdout);
    CostMesh m;
    bad = cost_mesh(&m, c, o, &ms); // (one stage: never fails)
    if (ms.pp == 1) print_rank(&m, o); // (with stages: per stage, below)
    if (o->zero == 2)
        printf("  (zero 2 reduces each bucket straight into this rank's shard; the gradient accumulation "
               "buffer "
               "stays whole, so its memory is as zero 1)\n");
    if (bad) DIE("impossible pipeline: %s", bad);
    if (ms.pp > 1) print_stages(&m, o);
    print_comm(&m);
    cost_mesh_free(&m);
}
