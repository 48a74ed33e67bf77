// run_record.c (cli) — what the run record (run.json) holds: the resolved options of a training run
// as text the flags read back, the command lines that started and resumed it, and the overrides of
// each resume; and what a --resume takes back from it. Must not hold: the file IO
// (io/checkpoint.c), the options' parsing (options.c).
#include "cli/run_record.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/common.h"
#include "io/checkpoint.h"

// What a --resume takes from the run record when not given: the data and its split, the batch, the
// schedule, evaluation and saving. Not remembered: the mesh, the device and this invocation's paths
// (a run may resume on another layout), and the model (the checkpoint's config.json holds it).
static const char *const REMEMBERED[] = {
    "data",         "val-data",    "val-frac",    "seq-len",       "batch",         "grad-accum",
    "steps",        "lr",          "min-lr-frac", "warmup",        "weight-decay",  "beta1",
    "beta2",        "adam-eps",    "grad-clip",   "seed",          "eval-every",    "eval-batches",
    "save-every",   "keep",        "keep-best",   "dropout",       "embed-dropout", "sample-tokens",
    "plots",        "tensorboard", "precision",   "bf16-rounding", "bf16-grads",    "fp8-dense",
    "fp8-dispatch", "fp8-save",    "loss-chunks"};

static int remembered(const char *name) {
    for (size_t k = 0; k < sizeof REMEMBERED / sizeof *REMEMBERED; k++)
        if (!strcmp(name, REMEMBERED[k])) return 1;
    return 0;
}

// The command line as a shell would take it back (arguments quoted where needed); malloc'd.
static char *command_line(int argc, char **argv) {
    size_t n = 1;
    for (int a = 0; a < argc; a++) n += 4 * strlen(argv[a]) + 3;
    char *buf = xmalloc(n), *p = buf;
    for (int a = 0; a < argc; a++) {
        const char *w = argv[a];
        int plain = *w != 0;
        for (const char *q = w; *q; q++)
            plain &= isalnum((unsigned char)*q) || strchr("_./=:,+-@%", *q) != NULL;
        if (a) *p++ = ' ';
        if (plain) {
            strcpy(p, w);
            p += strlen(w);
            continue;
        }
        *p++ = '\'';
        for (const char *q = w; *q; q++) {
            if (*q == '\'') {
                memcpy(p, "'\\''", 4);
                p += 4;
            } else *p++ = *q;
        }
        *p++ = '\'';
    }
    *p = 0;
    return buf;
}

// A path option's value as recorded: absolute where it names an existing file (so `moe eval` and
// --resume find it from any directory), as given otherwise (a shard pattern).
static void record_path(char *buf, size_t n, const char *v) {
    char *abs = v[0] ? realpath(v, NULL) : NULL;
    snprintf(buf, n, "%s", abs ? abs : v);
    free(abs);
}

// --resume: the run record of --out gives every remembered option the user did not set; each one set
// to another value than the record's is an override, printed (rank 0) and returned in *overrides
// for the record. A model option that contradicts the checkpoint's config is refused by name.
// Returns the previous record (NULL: none, a run of an older moe).
cJSON *resume_apply(State *s, int rank0, cJSON **overrides) {
    *overrides = cJSON_CreateObject();
    if (!dir_exists(s->train.out))
        DIE("--resume: no complete checkpoint in '%s': it %s (there is no run to continue; drop --resume to "
            "start one there)",
            s->train.out, access(s->train.out, F_OK) == 0 ? "is not a directory" : "does not exist");
    char latest[2048];
    int found = ckpt_find_latest(s->train.out, latest, sizeof latest) == 0;
    if (found) {
        ModelConfig saved;
        ckpt_load_config(latest, &saved);
        char a[64], b[64];
        int i = model_conflict(s, &saved, NULL, 0, a, b);
        if (i >= 0)
            DIE("--resume: the model options given differ from the checkpoint's config (%s/config.json): "
                "--%s %s, the "
                "checkpoint's %s; drop --%s to continue that model",
                latest, opts[i].name, a, b, opts[i].name);
    }
    cJSON *prev = run_record_read(s->train.out);
    if (!prev) { // (no checkpoint either: the trainer says so)
        if (rank0 && found)
            printf("--resume: %s has no %s (a run of an older moe): the options are as given\n", s->train.out,
                   RUN_RECORD);
        return NULL;
    }
    cJSON *rec = cJSON_GetObjectItem(prev, "options");
    char applied[4096] = "";
    // a bf16 run resumed with --precision mixed (a documented conversion: the trainer notes it): its
    // bf16-only options are kept for the record but not as given (cmd_train refuses those with mixed);
    // (--bf16-rounding and --bf16-grads are bf16's and fp8-bf16's)
    const cJSON *rp = cJSON_GetObjectItem(rec, "precision");
    int rec_p = PREC_MIXED;
    for (int p = PREC_BF16; p <= PREC_FP8_BF16; p++)
        if (cJSON_IsString(rp) && !strcmp(rp->valuestring, prec_name(p))) rec_p = p;
    int prec = opt_set(s, "precision") ? s->train.precision : rec_p, bf16 = prec_bf16_storage(prec);
    char missing[2048] = "";
    for (int i = 0; i < N_OPTS; i++) {
        const Opt *o = &opts[i];
        cJSON *v = cJSON_GetObjectItem(rec, o->name);
        if (!(o->cmds & C_TRAIN) || !remembered(o->name)) continue;
        if (!cJSON_IsString(v)) { // (a run of an older moe, or an edited file: said, not guessed)
            size_t l = strlen(missing);
            if (!s->set[i]) snprintf(missing + l, sizeof missing - l, " --%s", o->name);
            continue;
        }
        char now[1100], was[1100];
        opt_text(now, sizeof now, o, opt_ptr(s, o));
        if (is_path_opt(o->name)) record_path(now, sizeof now, now);
        snprintf(was, sizeof was, "%s", v->valuestring);
        if (!strcmp(now, was)) continue;
        if (s->set[i]) { // an override (floats shown short, recorded exactly)
            char a[64], b[64];
            if (o->type == O_FLOAT) {
                snprintf(a, sizeof a, "%g", strtof(now, NULL));
                snprintf(b, sizeof b, "%g", strtof(was, NULL));
            }
            if (rank0)
                printf("--resume: --%s %s overrides the run's %s (%s/%s)\n", o->name,
                       o->type == O_FLOAT ? a
                           : now[0]       ? now
                                          : "''",
                       o->type == O_FLOAT ? b
                           : was[0]       ? was
                                          : "''",
                       s->train.out, RUN_RECORD);
            cJSON *ov = cJSON_AddObjectToObject(*overrides, o->name);
            cJSON_AddStringToObject(ov, "recorded", was);
            cJSON_AddStringToObject(ov, "now", now);
            continue;
        }
        char who[1200];
        snprintf(who, sizeof who, "%s/%s:", s->train.out, RUN_RECORD);
        set_recorded(s, i, was, who);
        if (!bf16 && (!strcmp(o->name, "bf16-rounding") || !strcmp(o->name, "bf16-grads"))) {
            s->set[i] = 0; // (inert under mixed precision; a later bf16 resume takes it back)
            continue;
        }
        if (!prec_fp8(prec) &&
            (!strcmp(o->name, "fp8-dense") || !strcmp(o->name, "fp8-dispatch") ||
             !strcmp(o->name, "fp8-save") || !strcmp(o->name, "fp8-weight-cache"))) {
            s->set[i] = 0; // (fp8's alone: off, or the cache's default, under the others)
            s->train.fp8_dense = s->train.fp8_dispatch = s->train.fp8_save = 0;
            s->train.fp8_weight_cache = 1;
            continue;
        }
        size_t l = strlen(applied);
        snprintf(applied + l, sizeof applied - l, " --%s %s", o->name, was[0] ? was : "''");
    }
    if (rank0 && applied[0])
        printf("--resume: the run's options (%s/%s):%s\n", s->train.out, RUN_RECORD, applied);
    if (rank0 && missing[0])
        fprintf(stderr,
                "moe: warning: --resume: %s/%s records no value for%s (written by an older moe, or edited): "
                "their defaults apply; pass them to be sure\n",
                s->train.out, RUN_RECORD, missing);
    return prev;
}

// The options that make the mesh's layout (run.json records them; a resume takes none of them back).
static const char *const MESH_OPTS[] = {"tp", "ep", "etp", "pp", "vpp", "pp-schedule", "pp-layers", "zero"};
enum { N_MESH_OPTS = sizeof MESH_OPTS / sizeof *MESH_OPTS };

void resume_check_mesh(State *s, const cJSON *prev, int world_size) {
    if (!prev || world_size == 1) return; // (one process: its one layout; an older moe's run)
    const cJSON *rec = cJSON_GetObjectItem(prev, "options");
    char differ[1024] = "", flags[1024] = "";
    for (int k = 0; k < N_MESH_OPTS; k++)
        if (opt_set(s, MESH_OPTS[k])) return; // a mesh named: resharding onto it is allowed
    for (int k = 0; k < N_MESH_OPTS; k++) {
        int i = find_opt(MESH_OPTS[k], C_TRAIN);
        const cJSON *v = cJSON_GetObjectItem(rec, MESH_OPTS[k]);
        char now[1100];
        opt_text(now, sizeof now, &opts[i], opt_ptr(s, &opts[i]));
        if (!cJSON_IsString(v) || !strcmp(now, v->valuestring)) continue;
        size_t l = strlen(differ), f = strlen(flags);
        snprintf(differ + l, sizeof differ - l, "%s--%s %s", l ? ", " : "", MESH_OPTS[k],
                 now[0] ? now : "''");
        snprintf(flags + f, sizeof flags - f, " --%s %s", MESH_OPTS[k],
                 v->valuestring[0] ? v->valuestring : "''");
    }
    if (differ[0])
        DIE("--resume on %d processes names no mesh option, so it would train on the default layout (%s), "
            "not "
            "the run's (%s/%s): pass%s to continue on the run's mesh, or name the mesh to reshard onto",
            world_size, differ, s->train.out, RUN_RECORD, flags);
}

// The run record: the resolved options (as text set_opt reads back), the command line that started
// the run, and each resume's command line and overrides. On a resume the model options are the
// previous record's (the checkpoint's config holds the model; the flags may not change it).
char *record_build(State *s, const cJSON *prev, cJSON *overrides, int argc, char **argv) {
    char *cl = command_line(argc, argv);
    cJSON *j = cJSON_CreateObject(), *o = cJSON_CreateObject();
    const cJSON *po = prev ? cJSON_GetObjectItem(prev, "options") : NULL;
    const cJSON *pcl = prev ? cJSON_GetObjectItem(prev, "command_line") : NULL;
    cJSON_AddStringToObject(j, "command_line", cJSON_IsString(pcl) ? pcl->valuestring : cl);
    for (int i = 0; i < N_OPTS; i++) {
        const Opt *op = &opts[i];
        if (!(op->cmds & C_TRAIN) || !strcmp(op->name, "preset") || !strcmp(op->name, "config") ||
            !strcmp(op->name, "resume") || !strcmp(op->name, "force") || !strcmp(op->name, "init-from") ||
            !strcmp(op->name, "data-changed"))
            continue;
        const cJSON *pv = po ? cJSON_GetObjectItem(po, op->name) : NULL;
        char v[1100];
        opt_text(v, sizeof v, op, opt_ptr(s, op));
        if (is_path_opt(op->name)) record_path(v, sizeof v, v);
        cJSON_AddStringToObject(o, op->name,
                                op->where == W_MODEL && cJSON_IsString(pv) ? pv->valuestring : v);
    }
    cJSON_AddItemToObject(j, "options", o);
    const cJSON *pr = prev ? cJSON_GetObjectItem(prev, "resumes") : NULL;
    cJSON *rs = cJSON_IsArray(pr) ? cJSON_Duplicate(pr, 1) : cJSON_CreateArray();
    if (s->train.resume && prev) {
        cJSON *one = cJSON_CreateObject();
        cJSON_AddStringToObject(one, "command_line", cl);
        cJSON_AddItemToObject(one, "overrides", overrides);
        cJSON_AddItemToArray(rs, one);
    } else {
        cJSON_Delete(overrides);
    }
    cJSON_AddItemToObject(j, "resumes", rs);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    free(cl);
    return text;
}
