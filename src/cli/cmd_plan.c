// cmd_plan.c (cli) — `moe plan`: its options checked, the hardware profile loaded (or measured here:
// --calibrate, written to --out), the model's flags gathered for the launch commands, then the planner's
// table, one --explain layout (its timeline PNG with --out), or for a model that fits nowhere the smallest
// GPU count that fits. Must not hold: the planner (train/plan.c), its printing (train/plan_print.c,
// plan_timeline.c), the measurements (train/calibrate.c).
#include <stdio.h>
#include <string.h>
#include "cli/commands.h"
#include "core/common.h"
#include "train/calibrate.h"
#include "train/plan.h"
#include "train/plan_print.h"
#include "train/plan_timeline.h"

// The search for a GPU count that fits stops here (each count enumerates every layout).
#define PLAN_MAX_GPUS 1024

// The flags that give `moe train` this model and policy: --preset, --config, each model option set
// (flag or config file) and --precision / --grad-memory / --fp8-dispatch / --fp8-save / --fp8-weight-cache /
// --vocab-parallel / --loss-chunks when set (the plan counts them); each with its leading space.
static void model_args(const State *s, char *buf, size_t n) {
    size_t w = 0;
    buf[0] = 0;
    if (s->cli.preset[0]) w += (size_t)snprintf(buf + w, n - w, " --preset %s", s->cli.preset);
    if (s->cli.config[0] && w < n) w += (size_t)snprintf(buf + w, n - w, " --config %s", s->cli.config);
    for (int i = 0; i < N_OPTS && w < n; i++) {
        const Opt *o = &opts[i];
        int policy = !strcmp(o->name, "precision") || !strcmp(o->name, "grad-memory") ||
            !strcmp(o->name, "fp8-dispatch") || !strcmp(o->name, "fp8-save") ||
            !strcmp(o->name, "fp8-weight-cache") || !strcmp(o->name, "vocab-parallel") ||
            !strcmp(o->name, "loss-chunks");
        if (!s->set[i] || !(o->cmds & C_PLAN) || (o->where != W_MODEL && !policy)) continue;
        char v[1100];
        opt_text(v, sizeof v, o, opt_ptr((State *)s, o));
        w += (size_t)snprintf(buf + w, n - w, " --%s %s", o->name, v);
    }
    CHECK(w < n, "plan: the model's flags do not fit in %zu bytes", n);
}

// --out's file: its directory exists and it is not one (checked before anything is measured or drawn).
static void check_out(const char *out) {
    char dir[1100];
    path_parent(dir, sizeof dir, out);
    if (!dir_exists(dir)) DIE("plan: --out %s: no directory '%s'", out, dir);
    if (dir_exists(out)) DIE("plan: --out %s is a directory; name the file", out);
}

// --calibrate: this machine measured (every rank of an mpirun), the profile written by rank 0 to --out
// (or printed). Returns 1 on the rank that goes on to plan (rank 0, with --gpus), else 0; the MPI world
// is finalized.
static int calibrate_here(State *s, HwProfile *hw) {
    const CliOptions *cl = &s->cli;
    const char *out = opt_set(s, "out") ? s->train.out : NULL;
    if (out && opt_set(s, "calibrate") && cl->explain[0])
        DIE("plan: --out names the profile of --calibrate or the timeline of --explain, not both (calibrate "
            "first, then --explain with --gpu PROFILE --out FILE.png)");
    if (out && !opt_set(s, "calibrate") && !cl->explain[0])
        DIE("plan: --out applies to --calibrate (the profile) or --explain (the timeline PNG)");
    if (out) check_out(out);
    if (!opt_set(s, "calibrate")) {
        if (opt_set(s, "device")) DIE("plan: --device applies to --calibrate");
        return 1;
    }
    HwProfile base;
    hwprofile_load(&base, cl->gpu);
    Comm *world = comm_world_init(NULL, NULL);
    CalibInfo info;
    calibrate(hw, &info, &s->model, &s->train, &base, world);
    int rank0 = comm_rank(world) == 0, n = comm_size(world);
    if (rank0) {
        char note[1024];
        calibrate_note(note, sizeof note, &info, &s->model, &s->train, &base, n);
        hwprofile_write(hw, note, out);
        if (out) printf("calibrated: %s (%s)\n", out, note);
    }
    comm_world_finalize();
    return rank0 && opt_set(s, "gpus");
}

// The index of v among the NULL-ended words w; dies naming the option and its words otherwise.
static int word(const char *v, const char *opt, const char *const *w) {
    char all[128] = "";
    for (int i = 0; w[i]; i++) {
        if (!strcmp(v, w[i])) return i;
        snprintf(all + strlen(all), sizeof all - strlen(all), "%s%s", i ? "|" : "", w[i]);
    }
    DIE("%s '%s': takes %s", opt, v, all);
}

// For a model that fits nowhere on --gpus: the smallest GPU count that fits under the precision asked, then
// under each other policy the profile has rates for (an FP8 one needs fp8_grouped_tflops).
static void smallest_fits(const State *s, const PlanSpec *sp) {
    const CliOptions *cl = &s->cli;
    int asked = s->train.precision, g = plan_smallest_fit(&s->model, &s->train, sp, PLAN_MAX_GPUS);
    printf("fits nowhere on %d GPU%s; the smallest GPU count that fits (in whole nodes of %d past one): ",
           cl->gpus, cl->gpus > 1 ? "s" : "", sp->nodes_of);
    if (g) printf("%d (moe plan --gpus %d ...)\n", g, g);
    else printf("none up to %d\n", PLAN_MAX_GPUS);
    static const int precs[4] = {PREC_MIXED, PREC_BF16, PREC_FP8_BF16, PREC_FP8};
    const char *sep = "  under";
    for (int i = 0; i < 4; i++) {
        TrainOptions o = s->train;
        o.precision = precs[i];
        if (precs[i] == asked || (prec_fp8(precs[i]) && !(sp->hw.fp8_grouped_tflops > 0)) ||
            train_options_validate(&o, &s->model))
            continue;
        int gp = plan_smallest_fit(&s->model, &o, sp, PLAN_MAX_GPUS);
        if (gp) printf("%s --precision %s: %d", sep, prec_name(precs[i]), gp);
        else printf("%s --precision %s: none up to %d", sep, prec_name(precs[i]), PLAN_MAX_GPUS);
        sep = ";";
    }
    if (sep[0] == ';') printf("\n");
}

int cmd_plan(State *s) {
    const CliOptions *cl = &s->cli;
    if (!opt_set(s, "gpus") && !opt_set(s, "calibrate"))
        DIE("plan: --gpus N is required (the GPUs to plan for)");
    if (opt_set(s, "gpus") && (cl->gpus < 1 || cl->gpus > 1 << 16))
        DIE("--gpus must be in [1, 65536] (got %d)", cl->gpus);
    if (cl->nodes_of < 1) DIE("--nodes-of must be >= 1 (got %d)", cl->nodes_of);
    if (cl->top < 1) DIE("--top must be >= 1 (got %d)", cl->top);
    if (!(cl->imbalance >= 1 && cl->imbalance <= 64))
        DIE("--imbalance must be in [1, 64] (got %g)", cl->imbalance);
    if (!(cl->comm_exposed >= 0 && cl->comm_exposed <= 1))
        DIE("--comm-exposed must be in [0, 1] (got %g)", cl->comm_exposed);
    if (!(cl->internode_gbps >= 0 && cl->internode_gbps <= 1e5))
        DIE("--internode-gbps must be in [0, 100000] GB/s (got %g; 0: the profile's)", cl->internode_gbps);
    if (cl->overlap_sms < 0 || cl->overlap_sms >= PLAN_GPU_SMS)
        DIE("--overlap-sms must be in [0, %d) (the GPU's SMs; got %d)", PLAN_GPU_SMS, cl->overlap_sms);
    if (s->train.pp_layers[0] && !cl->explain[0])
        DIE("plan: --pp-layers applies to --explain (the search splits the layers evenly)");
    const char *bad = config_validate(&s->model);
    if (bad) DIE("invalid model config: %s", bad);
    if ((bad = train_options_validate(&s->train, &s->model))) DIE("%s", bad);
    PlanSpec sp;
    memset(&sp, 0, sizeof sp);
    sp.gpus = cl->gpus;
    sp.nodes_of = cl->nodes_of;
    sp.imbalance = cl->imbalance;
    sp.exposed = cl->comm_exposed;
    sp.hide_a2a = word(cl->hide_a2a, "--hide-a2a", (const char *const[]){"none", "experts", "1f1b", NULL});
    sp.a2a_links = word(cl->a2a_links, "--a2a-links", (const char *const[]){"flat", "split", "deepep", NULL});
    sp.combine_bf16 = word(cl->combine, "--combine", (const char *const[]){"f32", "bf16", NULL});
    sp.grouped_shape =
        word(cl->grouped_rate, "--grouped-rate", (const char *const[]){"profile", "shape", NULL});
    sp.hide_tp = word(cl->hide_tp, "--hide-tp", (const char *const[]){"none", "gemm", NULL});
    sp.hide_pp = word(cl->hide_pp, "--hide-pp", (const char *const[]){"none", "next", NULL});
    sp.hide_dp = word(cl->hide_dp, "--hide-dp", (const char *const[]){"none", "grads", "grads+params", NULL});
    sp.overlap_sms = cl->overlap_sms;
    sp.vocab_search = !opt_set(s, "vocab-parallel");
    sp.megatron_memory =
        word(cl->memory_model, "--memory-model", (const char *const[]){"ours", "megatron", NULL});
    if (!calibrate_here(s, &sp.hw)) return 0;
    if (!opt_set(s, "calibrate")) hwprofile_load(&sp.hw, cl->gpu);
    if (cl->internode_gbps > 0) sp.hw.internode_gbps = cl->internode_gbps;
    if (prec_fp8(s->train.precision) && !(sp.hw.fp8_grouped_tflops > 0))
        DIE("plan --precision %s: profile %s has no \"fp8_grouped_tflops\" (calibrate with --precision fp8 "
            "on the cuda backend, or add it)",
            prec_name(s->train.precision), sp.hw.name);
    char args[4096];
    model_args(s, args, sizeof args);
    if (cl->explain[0]) {
        PlanLayout l;
        if ((bad = plan_parse_layout(&l, cl->explain, &s->train))) DIE("%s", bad);
        PlanRow row;
        PlanPipe pipe;
        if ((bad = plan_layout(&row, &s->model, &s->train, &sp, &l, NULL, &pipe)))
            DIE("impossible layout '%s': %s", cl->explain, bad);
        plan_print_explain(&row, &pipe, &sp, &s->train, args);
        return opt_set(s, "out") && plan_timeline(&row, &pipe, s->train.out) ? 1 : 0;
    }
    PlanResult r;
    plan_enumerate(&r, &s->model, &s->train, &sp, 0);
    plan_print_table(&r, &sp, &s->train, cl->top, args);
    if (!r.n) smallest_fits(s, &sp);
    plan_result_free(&r);
    return 0;
}
