// plan_print.c — `moe plan`'s output: the ranked table of the layouts that fit (memory per GPU, the step's
// parts (compute with its host overhead, exposed communication, bubble), tokens/s, MFU, the command that
// launches each), one layout explained line by line, and the smallest GPU count for a model that fits
// nowhere; the layout words --explain reads (plan_parse_layout).
// Must not hold: the planner's arithmetic (plan.c), option parsing (cli/cmd_plan.c).
#include "train/plan_print.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "model/model.h"

static const char *rc_name(int rc) {
    return rc == RECOMPUTE_MOE ? "moe"
        : rc == RECOMPUTE_ATTN ? "attn"
        : rc == RECOMPUTE_FULL ? "full"
                               : "none";
}

// "tp2 ep4 etp1 pp2 vpp1 dp1 zero1 micro8 recompute-moe [recompute-layers3] [vocab]": the words --explain
// reads back (plan_parse_layout below).
static void plan_layout_name(char *buf, size_t n, const PlanLayout *l) {
    int k = snprintf(buf, n, "tp%d ep%d etp%d pp%d vpp%d dp%d zero%d micro%d recompute-%s", l->tp, l->ep,
                     l->etp, l->pp, l->vpp, l->dp, l->zero, l->micro, rc_name(l->recompute));
    if (l->rc_layers && k > 0 && (size_t)k < n)
        k += snprintf(buf + k, n - (size_t)k, " recompute-layers%d", l->rc_layers);
    if (l->vocab && l->tp > 1 && k > 0 && (size_t)k < n) snprintf(buf + k, n - (size_t)k, " vocab");
}

// The command that trains layout l: mpirun, the model's flags (model_args), the batch, the layout.
static void print_command(const PlanRow *row, const PlanSpec *sp, const TrainOptions *o,
                          const char *model_args) {
    const PlanLayout *l = &row->l;
    printf("     mpirun -np %d build/moe train%s --batch %d --seq-len %d --tp %d --ep %d --etp %d --pp %d",
           sp->gpus, model_args, o->batch, o->seq_len, l->tp, l->ep, l->etp, l->pp);
    if (l->vpp > 1) printf(" --pp-schedule interleaved --vpp %d", l->vpp);
    if (o->pp_layers[0]) printf(" --pp-layers %s", o->pp_layers);
    printf(" --zero %d --recompute %s", l->zero, rc_name(l->recompute));
    if (l->rc_layers) printf(" --recompute-layers %d", l->rc_layers);
    if (l->vocab && l->tp > 1 && !o->vocab_parallel) printf(" --vocab-parallel 1"); // (else in model_args)
    printf(" --grad-accum %d%s --device cuda\n", l->micro,
           sp->hide_a2a == PLAN_HIDE_EXPERTS ? " --a2a-overlap auto" : "");
}

static void print_head(const PlanSpec *sp, const TrainOptions *o) {
    printf("plan: %d GPUs of profile %s (%.1f GiB each; nodes of %d), batch %d x %d, %s precision; routing "
           "headroom x%.2f on the routed buffers, communication %.0f%% exposed\n",
           sp->gpus, sp->hw.name, sp->hw.mem_bytes / 1073741824.0, sp->nodes_of, o->batch, o->seq_len,
           prec_name(o->precision), sp->imbalance, 100 * sp->exposed);
    static const char *const hide[3] = {"none", "behind the experts (--a2a-overlap)",
                                        "1F1B-paired (Megatron)"};
    static const char *const links[3] = {"flat", "split NVLink / network", "DeepEP's node deduplication"};
    if (sp->hide_a2a || sp->a2a_links || sp->combine_bf16 || sp->grouped_shape || sp->megatron_memory)
        printf("mechanisms: all-to-all hidden: %s; across nodes: %s; rows back in %s; experts' rate: %s; "
               "memory: %s; inter-node "
               "%g GB/s\n",
               hide[sp->hide_a2a], links[sp->a2a_links], sp->combine_bf16 ? "bf16" : "float32",
               sp->grouped_shape ? "the nearest measured expert shape's" : "the profile's",
               sp->megatron_memory ? "Megatron's distributed optimizer (6 + 12 / DP bytes a parameter)"
                                   : "ours (cuda)",
               sp->hw.internode_gbps);
    static const char *const dp[3] = {"none", "the reduction (--overlap-grad-reduce)",
                                      ("the reduction and the weights' all-gather (--overlap-grad-reduce, "
                                       "--overlap-param-gather)")};
    if (sp->hide_tp || sp->hide_pp || sp->hide_dp)
        printf(
            "Megatron-Core's overlaps: TP collectives hidden: %s; pipeline sends hidden: %s; DP hidden: %s\n",
            sp->hide_tp ? "behind their GEMMs (--tp-comm-overlap)" : "none",
            sp->hide_pp ? "behind the next action (--overlap-p2p-comm, interleaved)" : "none",
            dp[sp->hide_dp]);
}

void plan_print_table(const PlanResult *r, const PlanSpec *sp, const TrainOptions *o, int top,
                      const char *model_args) {
    print_head(sp, o);
    printf("layouts: %d allowed by the mesh, batch and schedule, %d of them fit; refused:", r->candidates,
           r->n);
    for (int k = 0; k < PLAN_R_N; k++)
        printf(" %s %d%s", plan_reason_name[k], r->refused[k], k < PLAN_R_N - 1 ? "," : "\n");
    if (!r->n) return;
    int wide = 54; // (the layout column: wider where a printed row names its recomputing layers)
    char name[160], m1[32], m2[32];
    for (int i = 0; i < r->n && i < top; i++) {
        plan_layout_name(name, sizeof name, &r->rows[i].l);
        if ((int)strlen(name) > wide) wide = (int)strlen(name);
    }
    printf("%3s  %-*s %10s %10s %9s %9s %9s %9s %10s %6s\n", "#", wide, "layout", "mem/GPU", "(moe info)",
           "compute", "comm", "bubble", "step", "tokens/s", "MFU");
    for (int i = 0; i < r->n && i < top; i++) {
        const PlanRow *w = &r->rows[i];
        plan_layout_name(name, sizeof name, &w->l);
        fmt_bytes(m1, sizeof m1, w->mem);
        fmt_bytes(m2, sizeof m2, w->mem_info);
        printf("%3d  %-*s %10s %10s %7.1fms %7.1fms %7.1fms %7.1fms %10.0f %5.1f%%\n", i + 1, wide, name, m1,
               m2, 1e3 * (w->compute + w->host), 1e3 * w->comm, 1e3 * w->bubble_s, 1e3 * w->step, w->tokens_s,
               100 * w->mfu);
        print_command(w, sp, o, model_args);
    }
}

void plan_print_explain(const PlanRow *w, const PlanPipe *pipe, const PlanSpec *sp, const TrainOptions *o,
                        const char *model_args) {
    static const char *const kinds[5] = {"tp", "ep all-to-all", "etp", "dp gradients", "pp"};
    char name[160], b[4][32];
    plan_layout_name(name, sizeof name, &w->l);
    print_head(sp, o);
    printf("layout: %s\n", name);
    fmt_bytes(b[0], sizeof b[0], w->mem_info);
    fmt_bytes(b[1], sizeof b[1], w->mem_headroom);
    fmt_bytes(b[2], sizeof b[2], sp->hw.context_bytes);
    fmt_bytes(b[3], sizeof b[3], w->mem);
    printf("memory per GPU: %s (moe info --world %d's largest per-rank cuda total) + routing headroom %s + "
           "context %s = "
           "%s of %.1f GiB: %s\n",
           b[0], sp->gpus, b[1], b[2], b[3], sp->hw.mem_bytes / 1073741824.0,
           w->mem <= sp->hw.mem_bytes ? "fits" : "does not fit");
    printf("compute (the slowest stage): %.2f ms\n", 1e3 * w->compute);
    printf(
        "  of it memory-bound ops: %.2f ms (norms, RoPE, gathers and combines, router, cross-entropy, adds, "
        "embedding, clears at %.0f%% of the HBM rate; the gradient norm at the HBM rate)\n",
        1e3 * w->memops, 100 * PLAN_MEMOPS_HBM);
    if (sp->grouped_shape)
        printf("experts at %.1f TFLOP/s (the profile's x the nearest measured shape's rate over the "
               "reference's: "
               "%s)\n",
               w->grouped_tflops, w->shape);
    printf(
        "host overhead: %.2f ms (%.0f launches at %g us, queued behind the compute; %.0f synchronisations at "
        "%g us%s)\n",
        1e3 * w->host, w->launches, sp->hw.launch_us, w->syncs, sp->hw.sync_us,
        sp->hw.launch_us > 0 || sp->hw.sync_us > 0 ? "" : ": not calibrated in this profile");
    for (int k = 0; k < 5; k++)
        printf("exposed %-13s %8.2f ms (%s)\n", kinds[k], 1e3 * w->comm_kind[k],
               w->inter[k] ? "between nodes" : "NVLink");
    if (sp->hide_a2a) printf("all-to-all hidden behind compute: %.2f ms\n", 1e3 * w->hidden[1]);
    if (sp->hide_tp) printf("TP collectives hidden behind the TP-split GEMMs: %.2f ms\n", 1e3 * w->hidden[0]);
    if (sp->hide_dp) printf("DP gradients hidden behind compute: %.2f ms\n", 1e3 * w->hidden[3]);
    if (sp->hide_pp) printf("pipeline sends hidden behind compute: %.2f ms\n", 1e3 * w->hidden[4]);
    if (sp->hide_a2a || sp->hide_tp || sp->hide_dp || sp->hide_pp) {
        double h = w->hidden[0] + w->hidden[1] + w->hidden[2] + w->hidden[3] + w->hidden[4];
        printf(
            "hidden in all: %.2f ms of the %.2f ms the mechanisms hide each alone (one budget: the stage's "
            "compute); their kernels hold %d of %d SMs: %.2f ms more compute (in the compute above)\n",
            1e3 * h, 1e3 * w->hide_want, sp->overlap_sms, PLAN_GPU_SMS, 1e3 * w->overlap_cost);
    }
    if (pipe->pp > 1) {
        printf("stages' busy time (compute, host overhead, exposed comm):");
        for (int s = 0; s < pipe->pp; s++)
            printf("%s %.2f", s ? " /" : "", 1e3 * (pipe->part[s][0] + pipe->part[s][1] + pipe->part[s][2]));
        printf(" ms\n");
    }
    printf(
        "pipeline bubble: %.1f%% (simulated on each stage's own times: the stages' mean idle); the slowest "
        "stage idles %.2f ms\n",
        100 * w->bubble, 1e3 * w->bubble_s);
    printf("step: %.2f ms, %.0f tokens/s, MFU %.1f%%\n", 1e3 * w->step, w->tokens_s, 100 * w->mfu);
    print_command(w, sp, o, model_args);
}

const char *plan_parse_layout(PlanLayout *l, const char *text, const TrainOptions *o) {
    static char msg[200];
    static const char *const keys[] = {"etp", "ep", "tp", "vpp", "pp", "dp", "zero", "micro"};
    *l = (PlanLayout){1, 1, 1, 1, 1, 0, 0, RECOMPUTE_NONE, o->grad_accum, 0, o->vocab_parallel};
    int *slot[] = {&l->etp, &l->ep, &l->tp, &l->vpp, &l->pp, &l->dp, &l->zero, &l->micro};
    char buf[512];
    if (strlen(text) >= sizeof buf) return "--explain: the layout is too long";
    strcpy(buf, text);
    for (char *w = strtok(buf, " ,"); w; w = strtok(NULL, " ,")) {
        if (!strcmp(w, "vocab")) { // (--vocab-parallel 1 for this layout)
            l->vocab = 1;
            continue;
        }
        if (!strncmp(w, "recompute-layers", 16)) {
            char *end;
            long v = strtol(w + 16, &end, 10);
            if (end == w + 16 || *end || v < 1 || v > 1 << 20)
                return snprintf(msg, sizeof msg, "--explain: '%s': recompute-layersN, N >= 1", w), msg;
            l->rc_layers = (int)v;
            continue;
        }
        if (!strncmp(w, "recompute-", 10)) {
            const char *v = w + 10;
            l->recompute = !strcmp(v, "none") ? RECOMPUTE_NONE
                : !strcmp(v, "moe")           ? RECOMPUTE_MOE
                : !strcmp(v, "attn")          ? RECOMPUTE_ATTN
                : !strcmp(v, "full")          ? RECOMPUTE_FULL
                                              : -1;
            if (l->recompute < 0)
                return snprintf(msg, sizeof msg, "--explain: '%s': recompute-none|attn|moe|full", w), msg;
            continue;
        }
        size_t k = 0, n = sizeof keys / sizeof *keys;
        while (k < n && strncmp(w, keys[k], strlen(keys[k]))) k++;
        char *end;
        long v = k < n ? strtol(w + strlen(keys[k]), &end, 10) : 0;
        if (k == n || end == w + strlen(keys[k]) || *end || v < (k == 6 ? 0 : 1) ||
            v > (k == 6 ? 2 : 1 << 20))
            return snprintf(
                       msg, sizeof msg,
                       "--explain: '%s' is not a layout word (tpN epN etpN ppN vppN dpN zero0|1|2 microN "
                       "recompute-none|attn|moe|full recompute-layersN vocab)",
                       w),
                   msg;
        *slot[k] = (int)v;
    }
    if (l->rc_layers && l->recompute == RECOMPUTE_NONE)
        return "--explain: recompute-layersN limits recompute-attn|moe|full to the first N layers: name one";
    return NULL;
}
