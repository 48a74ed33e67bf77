// cmd_train.c (cli) — `moe train`: the checks across options that need the run record (after
// --resume took the run's), the agreement of an MPI job's ranks on every option, --init-from and
// --upcycle (a run started from a Hugging Face model), then the trainer. Must not hold: the training
// itself (train/trainer.c), the run record's contents (run_record.c).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "cli/commands.h"
#include "cli/run_record.h"
#include "core/common.h"
#include "io/checkpoint.h"
#include "io/hf.h"
#include "parallel/agree.h"
#include "parallel/comm.h"
#include "train/pretrained.h"
#include "text/tokenizer.h"
#include "train/trainer.h"

// --init-from HF_DIR: the model config comes from HF_DIR/config.json. Model options given as flags or
// in --config must agree with it, except the training-only router options, which may be changed.
static const char *const INIT_OVERRIDABLE[] = {"aux-coef", "z-coef",          "aux-form",    "jitter",
                                               "dispatch", "capacity-factor", "max-seq-len", "init-std",
                                               "balance",  "bias-rate",       "aux-scope"};

static void init_from_config(State *s, ModelConfig *c) {
    const char *dir = s->cli.init_from;
    if (s->cli.preset[0]) DIE("--init-from and --preset: the model config comes from %s/config.json", dir);
    if (s->train.resume)
        DIE("--init-from and --resume: --init-from starts a run (saving the imported weights as its step 0); "
            "to continue that run pass --resume alone");
    if (!hf_is_model_dir(dir))
        DIE("--init-from: '%s' is not a Hugging Face model directory (config.json plus model.safetensors or "
            "model.safetensors.index.json; our own checkpoints continue with --resume)",
            dir);
    if (s->train.upcycle && opt_set(s, "n-experts") && s->model.n_experts != s->train.upcycle)
        DIE("--upcycle %d and --n-experts %d: --upcycle gives the experts per layer; drop --n-experts",
            s->train.upcycle, s->model.n_experts);
    if (s->train.upcycle) { // E from --upcycle, k from --top-k (given or Mixtral's 2)
        hf_load_config_upcycle(dir, s->train.upcycle, opt_set(s, "top-k") ? s->model.top_k : 2, c);
        s->model.top_k = c->top_k;
        s->model.n_experts = c->n_experts;
    } else {
        hf_load_config(dir, c);
    }
    char a[64], b[64];
    int i = model_conflict(s, c, INIT_OVERRIDABLE, sizeof INIT_OVERRIDABLE / sizeof *INIT_OVERRIDABLE, a, b);
    if (i >= 0)
        DIE("--init-from %s: --%s %s contradicts its config.json (%s); drop the flag (only %s may be "
            "changed)",
            dir, opts[i].name, a, b,
            "--aux-coef, --z-coef, --aux-form, --jitter, --dispatch, --capacity-factor, --max-seq-len, "
            "--init-std, --balance, "
            "--bias-rate, --aux-scope");
    const char *bad = config_validate(c);
    if (bad) DIE("--init-from %s: invalid model config: %s", dir, bad);
}

// --init-from: the run in --out starts from the imported weights (saved as its step 0); every rank
// then continues it as a resume from step 0.
static void init_from_prepare(State *s, Comm *world) {
    ModelConfig c;
    init_from_config(s, &c);
    pretrained_start_run(s->cli.init_from, &c, &s->train, world);
    s->model = c;
    s->train.resume = 1;
    s->train.force = 0;
    s->model_explicit = 0;
}

// The run's tokenizer: --init-from's tokenizer.json (with --data: the embedded corpus is bytes) unless
// --tokenizer names one. A model from scratch
// with --tokenizer and no --vocab-size takes the tokenizer's vocabulary, rounded up to a multiple of 64;
// so does a resume that names model options (its config is compared with the checkpoint's whole), with
// the run's copy of its tokenizer.
static void tokenizer_prepare(State *s, int rank0) {
    char p[2100];
    join_path(p, sizeof p, s->cli.init_from, "tokenizer.json");
    if (s->cli.init_from[0] && !opt_set(s, "tokenizer") && s->train.data[0] && file_exists(p))
        snprintf(s->train.tokenizer, sizeof s->train.tokenizer, "%s", s->cli.init_from);
    join_path(p, sizeof p, s->train.out, RUN_TOKENIZER);
    const char *path = opt_set(s, "tokenizer")                  ? s->train.tokenizer
        : s->train.resume && s->model_explicit && dir_exists(p) ? p
                                                                : NULL;
    if (!path || s->cli.init_from[0] || opt_set(s, "vocab-size") || (s->train.resume && !s->model_explicit))
        return;
    Tokenizer *t = tok_load(path);
    s->model.vocab_size = (tok_vocab_size(t) + 63) / 64 * 64;
    if (rank0 && !s->train.resume)
        printf("--tokenizer %s: vocab_size %d (its %d ids, rounded up to a multiple of 64)\n", path,
               s->model.vocab_size, tok_vocab_size(t));
    tok_free(t);
}

// Every rank of an MPI job must train the same thing: each hashes its resolved training options
// (model, training, mesh, paths) and the environment switches that change results, and the ranks
// compare before anything is read or written (parallel/agree.h; the data's contents are compared
// once loaded, in the trainer).
static void agree_options(State *s, const Comm *world) {
    static const char *const envs[] = {"MOE_BF16_SHADOW", "MOE_GROUPED_GEMM", "MOE_FORCE_NCCL"};
    enum { NENV = sizeof envs / sizeof *envs };
    AgreeItem items[N_OPTS + NENV];
    char names[N_OPTS + NENV][40];
    int n = 0;
    for (int i = 0; i < N_OPTS; i++) {
        const Opt *o = &opts[i];
        if (!(o->cmds & C_TRAIN) || !strcmp(o->name, "preset") || !strcmp(o->name, "config")) continue;
        const void *p = opt_ptr(s, o); // (preset and config files are in the values they set)
        snprintf(names[n], sizeof names[n], "--%s", o->name);
        items[n].name = names[n];
        items[n].hash = hash_bytes(p, o->type == O_STR ? strlen(p) : o->size, 0);
        fmt_opt(items[n].shown, sizeof items[n].shown, o, p);
        n++;
    }
    for (int i = 0; i < NENV; i++) {
        const char *v = getenv(envs[i]);
        items[n].name = envs[i];
        items[n].hash = v ? hash_bytes(v, strlen(v), 1) : 0;
        snprintf(items[n].shown, sizeof items[n].shown, "%s", v ? v : "(unset)");
        n++;
    }
    comm_agree(world, "options", items, n);
}

int cmd_train(State *s, int argc, char **argv) {
    if (s->train.upcycle && !s->cli.init_from[0])
        DIE("--upcycle %d: it turns a dense model's MLPs into experts; pass the dense model with --init-from "
            "DIR",
            s->train.upcycle);
    if (s->train.data_changed && !s->train.resume)
        DIE("--data-changed: it lets a --resume continue on changed data; this command does not resume");
    int targc = argc;
    char **targv = argv; // (the command line as given, for the record: MPI may rewrite argv)
    Comm *world = comm_world_init(&argc, &argv);
    cJSON *overrides = NULL,
          *prev = s->train.resume ? resume_apply(s, comm_rank(world) == 0, &overrides) : NULL;
    if (!overrides) overrides = cJSON_CreateObject();
    resume_check_mesh(s, prev, comm_size(world));
    tokenizer_prepare(s, comm_rank(world) == 0);
    opt_check_bf16_storage(s); // (after --resume took the run's precision)
    agree_options(s, world);
    if (s->cli.init_from[0]) init_from_prepare(s, world);
    char *record = record_build(s, prev, overrides, targc, targv);
    cJSON_Delete(prev);
    int rc = train_run(&s->model, &s->train, s->model_explicit, record, world);
    free(record);
    comm_world_finalize();
    return rc;
}
