// cmd_plan.c (cli) — `moe plan`: its options checked, the hardware profile loaded, the model's flags
// gathered for the launch commands, then the planner's table, one --explain layout, or for a model that
// fits nowhere the smallest GPU count that fits. Must not hold: the planner (train/plan.c) or its
// printing (train/plan_print.c).
#include <stdio.h>
#include <string.h>
#include "cli/commands.h"
#include "core/common.h"
#include "train/plan.h"
#include "train/plan_print.h"

// The search for a GPU count that fits stops here (each count enumerates every layout).
#define PLAN_MAX_GPUS 1024

// The flags that give `moe train` this model and policy: --preset, --config, each model option set
// (flag or config file) and --precision / --grad-memory when set; each with its leading space.
static void model_args(const State *s, char *buf, size_t n) {
    size_t w = 0;
    buf[0] = 0;
    if (s->cli.preset[0]) w += (size_t)snprintf(buf + w, n - w, " --preset %s", s->cli.preset);
    if (s->cli.config[0] && w < n) w += (size_t)snprintf(buf + w, n - w, " --config %s", s->cli.config);
    for (int i = 0; i < N_OPTS && w < n; i++) {
        const Opt *o = &opts[i];
        int policy = !strcmp(o->name, "precision") || !strcmp(o->name, "grad-memory");
        if (!s->set[i] || !(o->cmds & C_PLAN) || (o->where != W_MODEL && !policy)) continue;
        char v[1100];
        opt_text(v, sizeof v, o, opt_ptr((State *)s, o));
        w += (size_t)snprintf(buf + w, n - w, " --%s %s", o->name, v);
    }
    CHECK(w < n, "plan: the model's flags do not fit in %zu bytes", n);
}

int cmd_plan(State *s) {
    const CliOptions *cl = &s->cli;
    if (!opt_set(s, "gpus")) DIE("plan: --gpus N is required (the GPUs to plan for)");
    if (cl->gpus < 1 || cl->gpus > 1 << 16) DIE("--gpus must be in [1, 65536] (got %d)", cl->gpus);
    if (cl->nodes_of < 1) DIE("--nodes-of must be >= 1 (got %d)", cl->nodes_of);
    if (cl->top < 1) DIE("--top must be >= 1 (got %d)", cl->top);
    if (s->train.precision == PREC_FP8)
        DIE("plan: --precision fp8 is not in the planner's model yet (its memory and step time are "
            "mixed's plus the FP8 operands; plan with --precision mixed meanwhile)");
    if (!(cl->imbalance >= 1 && cl->imbalance <= 64))
        DIE("--imbalance must be in [1, 64] (got %g)", cl->imbalance);
    if (!(cl->comm_exposed >= 0 && cl->comm_exposed <= 1))
        DIE("--comm-exposed must be in [0, 1] (got %g)", cl->comm_exposed);
    const char *bad = config_validate(&s->model);
    if (bad) DIE("invalid model config: %s", bad);
    if ((bad = train_options_validate(&s->train, &s->model))) DIE("%s", bad);
    PlanSpec sp;
    memset(&sp, 0, sizeof sp);
    sp.gpus = cl->gpus;
    sp.nodes_of = cl->nodes_of;
    sp.imbalance = cl->imbalance;
    sp.exposed = cl->comm_exposed;
    hwprofile_load(&sp.hw, cl->gpu);
    char args[4096];
    model_args(s, args, sizeof args);
    if (cl->explain[0]) {
        PlanLayout l;
        if ((bad = plan_parse_layout(&l, cl->explain, &s->train))) DIE("%s", bad);
        PlanRow row;
        if ((bad = plan_layout(&row, &s->model, &s->train, &sp, &l, NULL)))
            DIE("impossible layout '%s': %s", cl->explain, bad);
        plan_print_explain(&row, &sp, &s->train, args);
        return 0;
    }
    PlanResult r;
    plan_enumerate(&r, &s->model, &s->train, &sp, 0);
    plan_print_table(&r, &sp, &s->train, cl->top, args);
    if (!r.n) {
        int g = plan_smallest_fit(&s->model, &s->train, &sp, PLAN_MAX_GPUS);
        if (g)
            printf(
                "fits nowhere on %d GPU%s; the smallest GPU count that fits: %d (moe plan --gpus %d ...)\n",
                cl->gpus, cl->gpus > 1 ? "s" : "", g, g);
        else
            printf("fits nowhere on %d GPU%s, nor on any count up to %d\n", cl->gpus, cl->gpus > 1 ? "s" : "",
                   PLAN_MAX_GPUS);
    }
    plan_result_free(&r);
    return 0;
}
