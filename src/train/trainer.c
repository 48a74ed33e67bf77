// trainer.c — `moe train` as parts (see trainer.h): run_open (validate, mesh, model, then the output
// directory: --force deletes the old run only there; init or resume), then per step step_run (train/step.c)
// and run_record (metrics.jsonl, the progress line), evaluation and checkpoints on their schedule, and
// run_close (replica check, the end-of-run report: final evaluation, a sample, plots). One process, one
// backend, or one rank of a mesh; losses are means over the step's tokens, aux and z means over layers and
// micro-batches.
#include "train/trainer.h"
#include <signal.h>
#include <math.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "core/common.h"
#include "data/data.h"
#include "model/model.h"
#include "io/checkpoint.h"
#include "io/ckpt_dist.h"
#include "train/eval.h"
#include "train/sample.h"
#include "train/cost.h"
#include "train/dist.h"
#include "train/plot.h"
#include "train/step.h"
#include "train/adapt.h"
#include "train/placement.h"
#include "train/resume.h"
#include "train/run_save.h"
#include "train/tboard.h"
#include "train/hwprofile.h"
#include "train/textdata.h"
#include "train/measure.h"
#include "parallel/agree.h"
#include "parallel/mesh.h"
#include "parallel/stages.h"

// Everything a run holds from run_open to run_close.
typedef struct {
    const TrainOptions *o;
    ModelConfig c;
    Comm *world;
    int rank0, profile;
    const Backend *be;
    Dataset ds;
    TextData td; // the tokenizer and the text it tokenised (none: text is bytes)
    Mesh mesh;
    StageSplit split; // the layers of each pipeline stage
    Dist dist;
    Model m;
    StepCtx step;
    TrainState st;
    int first; // the step the run starts at (0, or the checkpoint's)
    FILE *out; // progress and report (stdout on rank 0, /dev/null elsewhere)
    FILE *mf; // metrics.jsonl (rank 0)
    TbWriter *tb; // the TensorBoard event file (rank 0): metrics.jsonl's scalars
    char metrics_path[2048];
    int64_t *counts; // (L, E) the last step's expert load
    Adapt adapt; // the MoE exchange's run-time choices (--a2a-overlap / --expert-mode auto)
    double t_start, flops_tok;
    double mfu_peak; // perf/mfu's peak FLOP/s a GPU (this GPU's built-in profile; 0: no MFU scalar)
    int preempted; // the signal that stopped the run (its checkpoint written), or 0
    Placement place; // the backend and the mesh's device transport
    int meshed, bf16_shadow; // place's
    int resuming; // from the checkpoint latest (--resume)
    char latest[2048];
    MeshShape shape;
    Measure meas; // pipeline.jsonl, memory.json
    double best_loss; // --keep-best: the validation loss of OUT/best (HUGE_VAL: none yet)
    int64_t best_step;
} Run;

static int config_equal(const ModelConfig *a, const ModelConfig *b) { return memcmp(a, b, sizeof *a) == 0; }

static void fmt_eta(char *buf, size_t n, double s) {
    if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, n, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

// The mesh and the pipeline's stage split for this config, or DIE naming the numbers (before any
// allocation or file is touched).
static MeshShape resolve_mesh(const TrainOptions *o, const ModelConfig *c, int world, StageSplit *split) {
    MeshShape ms = train_mesh_shape(o, world);
    const char *bad = mesh_shape_resolve(&ms, c);
    if (bad) DIE("impossible mesh: %s", bad);
    if (o->batch % ((int64_t)o->grad_accum * ms.dp)) // (64 bits: the product can pass INT_MAX)
        DIE("impossible mesh: --batch %d is not divisible by --grad-accum %d x dp %d (each DP rank takes an "
            "equal "
            "share of every micro-batch)",
            o->batch, o->grad_accum, ms.dp);
    int64_t Bl = o->batch / o->grad_accum / ms.dp;
    if (Bl * o->seq_len > config_max_tokens(c))
        DIE("--batch %d / (--grad-accum %d x dp %d) x --seq-len %d = %lld tokens per micro-batch on a rank; "
            "this model "
            "takes at most %lld",
            o->batch, o->grad_accum, ms.dp, o->seq_len, (long long)(Bl * o->seq_len),
            (long long)config_max_tokens(c));
    if (o->loss_chunks > Bl * o->seq_len)
        DIE("--loss-chunks %d: a micro-batch on a rank has %lld rows", o->loss_chunks,
            (long long)(Bl * o->seq_len));
    if (o->pp == 1 && (o->vpp > 1 || o->pp_layers[0]))
        DIE("--vpp and --pp-layers split the layers between pipeline stages: they need --pp > 1");
    bad = stages_split(split, c->n_layers, o->pp, o->pp > 1 ? o->vpp : 1, o->pp_layers);
    if (bad) DIE("impossible pipeline: %s", bad);
    if (o->pp > 1) {
        Schedule sc;
        bad = schedule_build(&sc, o->pp_schedule, o->pp, 0, o->vpp, o->grad_accum);
        if (bad) DIE("impossible pipeline: %s", bad);
        schedule_free(&sc);
    }
    return ms;
}

// The output directory's checks: refuse to overwrite a run unless --resume or --force; with --resume,
// the checkpoint's config becomes the model's (latest: its path). Reads only: --force deletes the old
// run in run_dir_start, once everything that can refuse the run has passed. Every rank decides the same
// from the same files.
static int check_out_dir(Run *r, int model_explicit, char *latest, size_t n) {
    const TrainOptions *o = r->o;
    char held[256];
    // (--resume: a replacement of a checkpoint that a kill stopped between its renames is finished first)
    if (o->resume && r->rank0) ckpt_run_recover(o->out);
    comm_barrier(r->world);
    int has_run = ckpt_run_present(o->out, held, sizeof held), resuming = 0;
    comm_barrier(r->world);
    if (o->resume) {
        if (ckpt_find_latest(o->out, latest, n) != 0) DIE("--resume: no complete checkpoint in '%s'", o->out);
        ModelConfig saved;
        ckpt_load_config(latest, &saved);
        if (model_explicit && !config_equal(&saved, &r->c))
            DIE("--resume: the model options given differ from the checkpoint's config (%s/config.json); "
                "drop them to continue that model",
                latest);
        r->c = saved;
        const char *bad = train_options_validate(o, &r->c);
        if (bad) DIE("%s", bad);
        resuming = 1;
    }
    if (r->ds.max_token >= r->c.vocab_size)
        DIE("the data's tokens (up to id %d, from %s) do not fit the model's vocab_size %d", r->ds.max_token,
            r->ds.source, r->c.vocab_size);
    if (!o->resume && has_run && !o->force)
        DIE("'%s' already holds a training run (%s); pass --resume to continue it or --force to start over "
            "(which deletes it)",
            o->out, held);
    return resuming;
}

// The output directory made ready, once every rank has passed every check and set its model up: --force
// deletes the old run (rank 0), then the directory exists and the log is appended to.
static void run_dir_start(const Run *r) {
    const TrainOptions *o = r->o;
    comm_barrier(r->world);
    if (!o->resume && o->force && r->rank0) ckpt_run_clear(o->out);
    if (r->rank0) mkdir_p(o->out);
    comm_barrier(r->world);
    if (r->rank0) { // the log: everything printed from here on, appended (a resume continues it)
        char log[2100];
        join_path(log, sizeof log, o->out, RUN_LOG);
        stdout_tee(log);
        ckpt_run_tidy(o->out); // what a killed save or prune left
    }
}

// The model's parameters and moments: from the checkpoint (any mesh resumes any checkpoint: each
// rank reads the tensors it holds and keeps its slices, a tensor at a time), or initialised from the seed.
static void load_or_init(Run *r, int resuming, const char *latest) {
    Model *m = &r->m;
    size_t P = m->t.ltotal;
    int bf16 = prec_bf16_storage(r->o->precision), wround = bf16 && r->o->bf16_rounding != ROUND_NONE;
    if (resuming) {
        RunLoad rl = {r->be, m->params, &r->dist, wround};
        run_load(&rl, latest, &m->t, &r->st, r->world);
        if (r->st.seed != r->o->seed)
            DIE("--resume: the checkpoint was trained with --seed %llu, not %llu",
                (unsigned long long)r->st.seed, (unsigned long long)r->o->seed);
        if (r->rank0) run_metrics_truncate(r->metrics_path, r->st.step);
        if (r->rank0) printf("resuming from %s (step %lld)\n", latest, (long long)r->st.step);
        int was = prec_bf16_storage(r->st.precision);
        if (r->rank0 && r->st.precision != r->o->precision)
            printf(
                "note: the checkpoint was trained with --precision %s; continuing with --precision %s (%s)\n",
                prec_name(r->st.precision), prec_name(r->o->precision),
                was && bf16 ? "the same bf16 values and AdamW moments (bf16 and fp8-bf16 store alike)"
                    : bf16 && wround ? "its weights and AdamW moments rounded to bf16, to nearest"
                    : bf16           ? "its AdamW moments rounded to bf16, to nearest"
                    : was            ? "its bf16 values as float32"
                                     : "the same float32 weights and AdamW moments (mixed and fp8 "
                                       "store alike)");
    } else {
        float *ph = xmalloc(P * sizeof(float) + 1);
        params_init(&m->t, &r->c, ph, r->o->seed);
        if (wround) run_round_bf16(ph, P);
        r->be->to_device(m->params, ph, P * sizeof(float));
        free(ph);
        r->st.seed = r->o->seed;
    }
    r->st.precision = r->o->precision; // what the next checkpoint records
}

static void print_header(const Run *r, const MeshShape *shape) {
    const ModelConfig *c = &r->c;
    const TrainOptions *o = r->o;
    FILE *out = r->out;
    char nb[32], ab[32];
    CostParams cp;
    cost_params(&cp, c);
    fmt_count(nb, sizeof nb, (double)cp.total);
    fmt_count(ab, sizeof ab, (double)cp.active);
    fprintf(
        out,
        "model: %s params (%s active per token), d %d, %d layers, %d heads (%d kv), %d experts top-%d, f %d, "
        "vocab %d, %s\n",
        nb, ab, c->d_model, c->n_layers, c->n_heads, c->n_kv_heads, c->n_experts, c->top_k, c->d_ff,
        c->vocab_size, c->dispatch == DISPATCH_CAPACITY ? "capacity dispatch" : "dropless dispatch");
    fprintf(out, "data: %s, %zu tokens, %zu train / %zu val windows of %d\n", r->ds.source, r->ds.n_tokens,
            r->ds.n_train, r->ds.n_val, o->seq_len);
    char desc[512];
    if (r->ds.split != DATA_SPLIT_EVERY10) { // (the embedded corpus's header stays as it always was)
        data_split_desc(&r->ds, desc, sizeof desc);
        fprintf(out, "  %s\n", desc);
    }
    int avail = eval_batches_available(&r->ds, o->batch / o->grad_accum);
    if (o->eval_batches > avail)
        fprintf(
            out,
            "  note: --eval-batches %d exceeds the validation set (%d whole batches of %d sequences): each "
            "evaluation takes those %d\n",
            o->eval_batches, avail, o->batch / o->grad_accum, avail);
    fprintf(out, "train: %d steps x %d sequences (%d micro-batches of %d) x %d tokens, lr %g, backend %s\n",
            o->steps, o->batch, o->grad_accum, o->batch / o->grad_accum, o->seq_len, o->lr, r->be->name);
    if (r->place.threads[0]) fprintf(out, "%s\n", r->place.threads);
    char mn[256];
    if (step_memory_note(&r->step, mn, sizeof mn)) fprintf(out, "%s\n", mn);
    if (o->fp8_dispatch)
        fprintf(out,
                "fp8: --fp8-dispatch: the experts' input rows rounded to FP8 where they are gathered; "
                "between ranks %zu bytes a row (%zu unpacked)\n",
                fp8_row_bytes(c->d_model), hid_size(r->be) * (size_t)c->d_model);
    if (o->fp8_save)
        fprintf(
            out,
            "fp8: --fp8-save: the experts' SwiGLU inputs kept as FP8 rows, %zu bytes a row each (h1, h3 and "
            "act: %zu)\n",
            fp8_row_bytes(c->d_ff), 3 * hid_size(r->be) * (size_t)c->d_ff);
    if (comm_size(r->world) > 1) mesh_print(shape, out);
    if (r->place.why[0]) fprintf(out, "%s\n", r->place.why);
}

// The ranks read the same tokens (the options agree already: main.c; here the files' contents).
static void agree_data(const Dataset *ds, const Comm *world) {
    if (comm_size(world) == 1) return;
    DataPrint d = data_print(ds, 0), v = data_print(ds, 1);
    AgreeItem it = {"--data contents", v.tokens ? hash_bytes(&v.hash, sizeof v.hash, d.hash) : d.hash, ""};
    snprintf(it.shown, sizeof it.shown, "%zu tokens, hash %016llx", ds->n_tokens,
             (unsigned long long)it.hash);
    comm_agree(world, "data", &it, 1);
}

// Attention-probability dropout needs the backend's attention_drop_* ops (every backend of ours has them).
static void check_attn_dropout(const Run *r) {
    if (r->c.attention_dropout > 0 && !r->be->attention_drop_fwd)
        DIE("attention dropout (--attn-dropout / attention_dropout %g) is not implemented on --device %s; "
            "use "
            "--dropout (the residual branches) there",
            r->c.attention_dropout, r->be->name);
}

// AMPipe's chunks split a micro-batch's rows on a rank: more chunks than rows cannot run (model.c
// would stop at the first step).
static void check_ampipe(const TrainOptions *o, const MeshShape *shape) {
    int64_t rows = (int64_t)(o->batch / o->grad_accum / shape->dp) * o->seq_len;
    if (o->ampipe > rows)
        DIE("--ampipe %d: a micro-batch of %lld tokens has fewer rows than chunks", o->ampipe,
            (long long)rows);
}

// Everything that can refuse the run, then the run built up to its parameters (mesh, model, the step's
// buffers: what dies there dies too) without writing a byte to the output directory.
static void run_setup(Run *r, const ModelConfig *cfg_in, const TrainOptions *o, int model_explicit,
                      Comm *world) {
    memset(r, 0, sizeof *r);
    r->o = o;
    r->c = *cfg_in;
    r->world = world;
    r->rank0 = comm_rank(world) == 0;
    const char *bad = config_validate(&r->c);
    if (bad) DIE("invalid model config: %s", bad);
    bad = train_options_validate(o, &r->c);
    if (bad) DIE("%s", bad);
    MeshShape shape = resolve_mesh(o, &r->c, comm_size(world), &r->split);
    check_ampipe(o, &shape);
    placement_choose(&r->place, o, world);
    r->be = r->place.be;
    r->meshed = r->place.meshed;
    r->profile = r->place.profile;
    r->bf16_shadow = r->place.bf16_shadow;
    check_attn_dropout(r);
    snprintf(r->metrics_path, sizeof r->metrics_path, "%s/metrics.jsonl", o->out);

    textdata_open(&r->td, o, &r->c, world); // (text --data with a tokenizer: its cached shards)
    data_open_split(&r->ds, r->td.data, r->td.val_data, o->val_frac, o->seed, o->seq_len);
    textdata_name(&r->td, &r->ds);
    textdata_check_ids(&r->td, &r->ds);
    agree_data(&r->ds, world);
    eval_batches_available(&r->ds, o->batch / o->grad_accum); // one evaluation batch at least, or stop here
    r->resuming = check_out_dir(r, model_explicit, r->latest, sizeof r->latest);
    if (r->resuming) resume_check_data(&r->ds, o);
    check_attn_dropout(r); // (a resumed model's config is the checkpoint's)

    shape = resolve_mesh(o, &r->c, comm_size(world), &r->split); // (the checkpoint's config)
    check_ampipe(o, &shape);
    if (o->a2a_hier < 0 && shape.ep > 1) shape.hier = adapt_hier(world, &shape);
    r->shape = shape;
    mesh_init(&r->mesh, &shape, world);
    placement_check_memory(&r->place, &r->c, o, &shape, world); // (before the model allocates)
    if (r->place.attach) mesh_enable_device(&r->mesh, r->place.dev, r->place.on_gpu);
    dist_init(&r->dist, r->meshed ? &r->mesh : NULL, o->zero, o->overlap, (size_t)(o->bucket_mb * 1048576.0));
    // the precision policy (ops.h OPT_*); stochastic rounding's bits: a hash of the seed, step and element
    dist_set_precision(&r->dist,
                       !prec_bf16_storage(o->precision)        ? OPT_MIXED
                           : o->bf16_rounding == ROUND_NEAREST ? OPT_BF16_NEAREST
                           : o->bf16_rounding == ROUND_NONE    ? OPT_BF16_MOMENTS
                                                               : OPT_BF16_STOCHASTIC,
                       o->seed);
    if (shape.pp > 1) r->dist.mm.sl.pp_split = &r->split;
    int Bl = o->batch / o->grad_accum / shape.dp;
    measure_base(&r->meas);
    model_init(&r->m, &r->c, r->be, Bl, o->seq_len, r->meshed ? &r->dist.mm : NULL);
    model_set_loss_chunks(&r->m, o->loss_chunks);
    // --precision bf16 (rounded weights) in one process with the GEMMs' bf16 copy: the weights only bf16
    // GEMMs read live in that copy alone (model_bf16_weights; cuda: 4 bytes a parameter less)
    if (r->bf16_shadow && train_bf16_weights_alone(o, r->meshed)) model_bf16_weights(&r->m);
    model_set_expert_grads(&r->m, train_expert_grads(o, r->meshed)); // (before dist_attach builds the runs)
    const char *e = getenv("MOE_DW_SUMSQ"); // (0: the experts' gradients read again for the norm, the A/B)
    int ledger = train_dw_ledger(o, r->meshed, r->meshed ? shape.edp : 1) && r->be->dw_sumsq_take &&
        !(e && !strcmp(e, "0"));
    model_set_dw_sumsq(&r->m, ledger);
    model_set_fp8_dispatch(&r->m, o->fp8_dispatch);
    if (o->recompute)
        model_set_recompute(&r->m, o->recompute, o->recompute_layers); // (before step_init's slots)
    model_set_fp8_save(&r->m, o->fp8_save);
    // the slots (and the activations moved into the expert gradients' memory) before the optimizer state:
    // the activations' own buffers are freed before the moments take their memory
    step_init(&r->step, &r->m, &r->dist, &r->ds, o, &r->mesh);
    dist_attach(&r->dist, &r->m);
    if (ledger) dist_use_ledger(&r->dist, &r->m);
    textdata_keep(); // (every check passed: the tokenised text stays)
}

// What run_setup built, freed (run_close frees a whole run).
static void run_setup_free(Run *r) {
    step_free(&r->step);
    dist_free(&r->dist);
    model_free(&r->m);
    data_close(&r->ds);
    textdata_close(&r->td);
    mesh_free(&r->mesh);
}

void train_check(const ModelConfig *cfg, const TrainOptions *o, Comm *world) {
    Run r;
    run_setup(&r, cfg, o, 0, world);
    run_setup_free(&r);
}

// The MFU's peak (FLOP/s a device; the progress lines' MFU and TensorBoard's perf/mfu): --mfu-peak, else the
// bf16 dense peak of this GPU's built-in profile (hwprofile_for_gpu by the device's name), else 0: no MFU,
// said once here. cpu runs have none unless given.
static double mfu_peak(const Run *r) {
    char name[256];
    if (r->o->mfu_peak > 0) return r->o->mfu_peak * 1e12;
    if (!r->place.on_gpu) return 0;
    backend_cuda_device_name(name, sizeof name);
    const HwProfile *p = hwprofile_for_gpu(name);
    if (!p)
        fprintf(r->out,
                "MFU: no built-in peak for the GPU \"%s\" (profiles %s; --mfu-peak TFLOPS gives one)\n", name,
                hwprofile_names());
    return p ? p->peak_tflops * 1e12 : 0;
}

// Validates everything and sets the run up, then the output directory (--force deletes the old run
// here, not before), the parameters (initialised or resumed) and the report's header.
static void run_open(Run *r, const ModelConfig *cfg_in, const TrainOptions *o, int model_explicit,
                     Comm *world) {
    run_setup(r, cfg_in, o, model_explicit, world);
    run_dir_start(r);
    load_or_init(r, r->resuming, r->latest);
    run_note_checkpoint(o->out);
    r->best_loss = resume_best(o->out, r->metrics_path, r->st.step, &r->best_step);
    adapt_init(&r->adapt, o, &r->shape, r->meshed, &r->m);

    r->out = r->rank0 ? stdout : fopen("/dev/null", "w");
    if (!r->out) DIE("cannot open /dev/null");
    print_header(r, &r->shape);
    r->mf = r->rank0 ? xfopen(r->metrics_path, "a") : NULL;
    measure_open(&r->meas, o->out, r->rank0, r->shape.pp);
    r->counts = xmalloc(sizeof(int64_t) * config_all_layers(&r->c) * r->c.n_experts);
    r->flops_tok = cost_flops(NULL, &r->c, o->seq_len);
    r->first = (int)r->st.step;
    r->tb = r->rank0 && o->tensorboard ? tb_open(o->out, r->first, 12 + r->c.n_layers) : NULL;
    r->mfu_peak = mfu_peak(r);
    if (r->first >= o->steps)
        fprintf(r->out, "the checkpoint is at step %d, which already reaches --steps %d: nothing to train\n",
                r->first, o->steps);
    // the bf16 GEMMs read the weights from one bf16 copy that AdamW keeps current (ops.h bf16_shadow;
    // a no-op on cpu and cuda-fp32); MOE_BF16_SHADOW=0 converts the weights on every GEMM instead
    // (the same results bit for bit: for checking that)
    r->dist.bf16_shadow = r->bf16_shadow;
    if (r->dist.bf16_shadow) r->be->bf16_shadow(r->m.params, r->m.t.ltotal);
    r->t_start = now_seconds();
}

// The model FLOPs utilisation at tps tokens a second: model FLOPs over ranks x one device's peak (mfu_peak >
// 0)
static double run_mfu(const Run *r, double tps) {
    return tps * r->flops_tok / (comm_size(r->world) * r->mfu_peak);
}

// The step's scalars in the TensorBoard file (the per-layer load balance added by run_record); MFU where the
// GPU has a built-in profile (mfu_peak), each rank counted as one GPU.
static void tb_record(Run *r, int step, const StepStats *s, double tps, double worst) {
    tb_add(r->tb, "train/loss", s->loss);
    tb_add(r->tb, "train/aux_loss", s->aux);
    tb_add(r->tb, "train/z_loss", s->z);
    tb_add(r->tb, "train/lr", s->lr);
    tb_add(r->tb, "train/grad_norm", s->gnorm);
    tb_add(r->tb, "perf/tokens_per_s", tps);
    tb_add(r->tb, "perf/tflops", tps * r->flops_tok / 1e12);
    if (r->mfu_peak > 0) tb_add(r->tb, "perf/mfu", run_mfu(r, tps));
    tb_add(r->tb, "load/max_over_mean", worst);
    tb_write(r->tb, step + 1);
}

// One metrics.jsonl line and (unless --quiet) one progress line for the step just run.
static void run_record(Run *r, int step, const StepStats *s, double dt, int tuned) {
    const TrainOptions *o = r->o;
    int L = r->c.n_layers, E = r->c.n_experts;
    double tps = o->batch * o->seq_len / dt;
    // load balance: per layer max/mean tokens per expert
    double worst = 0;
    char per_layer[256] = "";
    for (int l = 0; l < L; l++) {
        int64_t mx = 0, tot = 0;
        for (int e = 0; e < E; e++) {
            tot += s->counts[l * E + e];
            if (s->counts[l * E + e] > mx) mx = s->counts[l * E + e];
        }
        double ratio = tot ? (double)mx * E / tot : 0;
        if (ratio > worst) worst = ratio;
        if (r->tb) {
            char tag[32];
            snprintf(tag, sizeof tag, "load/layer_%02d_max_over_mean", l);
            tb_add(r->tb, tag, ratio);
        }
        if (L <= 4)
            snprintf(per_layer + strlen(per_layer), sizeof per_layer - strlen(per_layer), "%s%.2f",
                     l ? " " : "", ratio);
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "step", step + 1);
    cJSON_AddNumberToObject(j, "loss", s->loss);
    if (r->c.mtp_depth)
        cJSON_AddNumberToObject(j, "mtp_loss", s->mtp); // (the objective adds mtp_weight x it)
    cJSON_AddNumberToObject(j, "aux_loss", s->aux);
    cJSON_AddNumberToObject(j, "z_loss", s->z);
    cJSON_AddNumberToObject(j, "lr", s->lr);
    cJSON_AddNumberToObject(j, "grad_norm", s->gnorm);
    cJSON_AddNumberToObject(j, "tokens_per_s", tps);
    cJSON_AddNumberToObject(j, "tflops", tps * r->flops_tok / 1e12);
    cJSON_AddNumberToObject(j, "step_time_s", dt);
    cJSON_AddNumberToObject(j, "grad_wait_s", r->dist.wait_s);
    cJSON_AddNumberToObject(j, "load_max_over_mean", worst);
    cJSON_AddNumberToObject(j, "dropped", (double)s->dropped);
    cJSON_AddBoolToObject(j, "skipped", s->skipped);
    if (s->fp8.on) cJSON_AddNumberToObject(j, "fp8_amax_jumps", s->fp8.n);
    double bubble = step_bubble(s);
    if (s->stages > 1) { // the pipeline's idle time: per stage, and its mean share of the step
        cJSON *pi = cJSON_AddArrayToObject(j, "pp_idle_s");
        for (int k = 0; k < s->stages; k++)
            cJSON_AddItemToArray(pi, cJSON_CreateNumber(s->stage_idle[2 * k]));
        cJSON_AddNumberToObject(j, "bubble_frac", bubble);
        measure_step(&r->meas, step, s, o->pp_schedule, o->grad_accum); // (pipeline.jsonl)
    }
    adapt_record(&r->adapt, &r->m, j, tuned);
    cJSON *el = cJSON_AddArrayToObject(j, "expert_load");
    for (int l = 0; l < L; l++) {
        cJSON *row = cJSON_CreateArray();
        for (int e = 0; e < E; e++)
            cJSON_AddItemToArray(row, cJSON_CreateNumber((double)s->counts[l * E + e]));
        cJSON_AddItemToArray(el, row);
    }
    char *txt = cJSON_PrintUnformatted(j);
    if (r->mf) {
        size_t n = strlen(txt);
        char *line = xmalloc(n + 2);
        memcpy(line, txt, n);
        memcpy(line + n, "\n", 2);
        xfappend(line, r->mf, r->metrics_path);
        free(line);
        stdout_tee_check(); // (the log's writes are the tee thread's: a failure shows here, a step later)
    }
    free(txt);
    cJSON_Delete(j);
    if (r->tb) tb_record(r, step, s, tps, worst);
    char note[512];
    if (r->rank0 && fp8_jump_note(&s->fp8, step, note, sizeof note)) printf("warning: %s\n", note);
    if (o->quiet || !r->rank0) return;
    char eta[32];
    double el_s = now_seconds() - r->t_start;
    fmt_eta(eta, sizeof eta, el_s / (step + 1 - r->first) * (o->steps - step - 1));
    char wait[128] = "";
    if (comm_size(r->world) > 1) snprintf(wait, sizeof wait, " | grad wait %.1fms", 1e3 * r->dist.wait_s);
    if (s->stages > 1)
        snprintf(wait + strlen(wait), sizeof wait - strlen(wait), " | bubble %.0f%%", 100 * bubble);
    adapt_progress(&r->adapt, &r->m, wait + strlen(wait), sizeof wait - strlen(wait));
    char mtp[32] = "", mfu[32] = "";
    if (r->c.mtp_depth) snprintf(mtp, sizeof mtp, " | mtp %.4f", s->mtp);
    if (r->mfu_peak > 0) snprintf(mfu, sizeof mfu, " | MFU %.1f%%", 100 * run_mfu(r, tps));
    printf("step %*d/%d | loss %.4f%s | aux %.4f | z %.4f | lr %.2e | gnorm %.3f | %6.0f tok/s%s | "
           "load max/mean %.2f%s%s%s%s | ETA %s\n",
           (int)(snprintf(NULL, 0, "%d", o->steps)), step + 1, o->steps, s->loss, mtp, s->aux, s->z, s->lr,
           s->gnorm, tps, mfu, worst, L <= 4 ? " (" : "", per_layer, L <= 4 ? ")" : "", wait, eta);
    fflush(stdout);
}

// The validation loss, into metrics.jsonl and the progress.
static void run_evaluate(Run *r, int step) {
    EvalResult ev;
    evaluate(&r->step.pipe, &r->ds, r->step.Bm, r->o->eval_batches, 0, &ev, &r->dist);
    if (r->mf) {
        char line[160];
        if (isfinite(ev.loss))
            snprintf(line, sizeof line, "{\"step\":%d,\"val_loss\":%.6f}\n", step + 1, ev.loss);
        else snprintf(line, sizeof line, "{\"step\":%d,\"val_loss\":null}\n", step + 1); // JSON has no NaN
        xfappend(line, r->mf, r->metrics_path);
    }
    if (r->tb) {
        tb_add(r->tb, "val/loss", ev.loss);
        tb_write(r->tb, step + 1);
    }
    if (!r->o->quiet) fprintf(r->out, "  eval: val loss %.4f\n", ev.loss);
    if (r->o->keep_best && ev.loss < r->best_loss) { // the same on every rank: ev.loss is global
        char dir[2100];
        join_path(dir, sizeof dir, r->o->out, RUN_BEST);
        run_save(&r->dist, r->o, &r->c, &r->m, &r->st, r->world, dir); // (r->st.step is step + 1 already)
        if (!r->o->quiet) fprintf(r->out, "  best: %s (step %d, val loss %.4f)\n", dir, step + 1, ev.loss);
        r->best_loss = ev.loss;
        r->best_step = step + 1;
    }
}

// The sample printed at the end of a run: a prompt of the synthetic corpus, or the first 16 tokens
// of the first validation window.
static void run_sample(Run *r) {
    const TrainOptions *o = r->o;
    int cap = 32 + o->sample_tokens;
    int32_t *ctx = xmalloc(sizeof(int32_t) * cap);
    int len = 0;
    if (r->ds.n_kinds) {
        for (const char *p = "12+34="; *p; p++) ctx[len++] = (unsigned char)*p;
    } else {
        int32_t *x = xmalloc(sizeof(int32_t) * (size_t)o->seq_len),
                *y = xmalloc(sizeof(int32_t) * (size_t)o->seq_len);
        data_val_batch(&r->ds, 0, 1, x, y, NULL);
        for (int i = 0; i < 16 && i < o->seq_len; i++) ctx[len++] = x[i];
        free(x);
        free(y);
    }
    int plen = len;
    SampleOptions so = {0.8f, 0, 1.0f, o->seq_len, 1, o->seed, NULL, NULL};
    SampleStats ss;
    sample_tokens(&r->step.pipe, ctx, &len, cap, o->sample_tokens, &so, &ss);
    fprintf(r->out, "sample (temperature 0.8, window %d, %d tokens at %.0f tokens/s%s):\n---\n", o->seq_len,
            ss.tokens, ss.seconds > 0 ? ss.tokens / ss.seconds : 0.0, ss.cached ? ", KV cache" : "");
    TokStream *ts = r->td.tok ? tok_stream_new(r->td.tok, 0) : NULL; // (none: bytes or ids)
    print_tokens(r->out, ts, ctx, plen, r->c.vocab_size);
    fprintf(r->out, "|");
    print_tokens(r->out, ts, ctx + plen, len - plen, r->c.vocab_size);
    tok_stream_free(ts);
    fprintf(r->out, "\n---\n");
    free(ctx);
}

// The replica check, the end-of-run report (final evaluation, a sample, where things went), and
// everything freed.
static void run_close(Run *r) {
    const TrainOptions *o = r->o;
    if (r->mf) xfclose(r->mf, r->metrics_path);
    measure_close(&r->meas);
    tb_close(r->tb);
    if (r->preempted) { // a scheduler wants the cores back: no report, only where to continue
        char latest[2048];
        if (r->rank0 && ckpt_find_latest(o->out, latest, sizeof latest) == 0)
            fprintf(stderr,
                    "moe: preempted by %s after step %lld: checkpoint %s written; continue with the same "
                    "command and --resume (exit status %d)\n",
                    r->preempted == SIGINT        ? "SIGINT"
                        : r->preempted == SIGUSR1 ? "SIGUSR1"
                        : r->preempted == SIGUSR2 ? "SIGUSR2"
                                                  : "SIGTERM",
                    (long long)r->st.step, latest, MOE_EXIT_PREEMPTED);
        goto free_all;
    }
    double wall = now_seconds() - r->t_start;
    if (o->check_replicas) {
        int bad = dist_check_replicas(&r->dist, &r->m, r->rank0 ? stderr : NULL);
        if (bad) DIE("replica check failed (%d violations)", bad);
        fprintf(
            r->out,
            "replica check: ok (router and dense replicas bitwise equal on %d ranks; experts equal across "
            "EDP, distinct across EP)\n",
            comm_size(r->world));
    }
    if (r->profile && r->rank0) backend_profile_report(stdout, o->steps - r->first - 1);
    fprintf(r->out, "\n");
    if (o->steps > r->first)
        fprintf(r->out, "trained steps %d..%d in %.1fs (%.0f tokens/s)\n", r->first + 1, o->steps, wall,
                (o->steps - r->first) * (double)o->batch * o->seq_len / wall);
    const Dist *d = &r->dist;
    if (d->norm_rest)
        fprintf(r->out,
                "grad norm: the routed experts' sums from the GEMMs that wrote them on %d of %d steps%s\n",
                d->ledger_used, d->ledger_used + d->ledger_missed,
                d->ledger_missed ? " (the others read them again: a layer ran its experts in chunks)" : "");
    EvalResult ev;
    evaluate(&r->step.pipe, &r->ds, r->step.Bm, o->eval_batches, 1, &ev, &r->dist);
    if (r->rank0) eval_print(&ev, &r->ds, &r->c);
    eval_result_free(&ev);
    if (o->sample_tokens > 0) run_sample(r);
    char latest[2048];
    if (ckpt_find_latest(o->out, latest, sizeof latest) == 0) fprintf(r->out, "checkpoint: %s\n", latest);
    fprintf(r->out, "metrics: %s\n", r->metrics_path);
    if (r->rank0 && o->plots && plot_run(o->out) == 0)
        fprintf(r->out, "plots: %s/loss.png %s/expert_load.png\n", o->out, o->out);
free_all:
    free(r->counts);
    adapt_free(&r->adapt);
    if (!r->rank0) fclose(r->out);
    run_setup_free(r);
    if (r->rank0) {
        stdout_tee_end();
        stdout_tee_check();
    }
}

int train_run(const ModelConfig *cfg, const TrainOptions *o, int model_explicit, const char *record,
              Comm *world) {
    Run r;
    run_open(&r, cfg, o, model_explicit, world);
    if (record && r.rank0) { // the directory is ready (cleared by --force)
        char *full = textdata_record(resume_record_data(record, &r.ds, o), &r.td);
        run_record_write(o->out, full);
        free(full);
    }
    if (r.rank0) textdata_save(&r.td, o->out);
    StepStats s = {.counts = r.counts};
    fault_point("startup");
    preempt_arm(1); // (before: start-up, where a signal ends the process at once)
    int skipped = 0; // steps skipped in a row (non-finite loss or norm)
    for (int step = r.first; step < o->steps; step++) {
        if (r.profile && step == r.first + 1) backend_profile_reset(); // the first step warms up
        double t0 = now_seconds();
        adapt_before(&r.adapt, &r.m);
        step_run(&r.step, step, r.st.seq_pos, &s);
        int tuned = adapt_after(&r.adapt, &r.m, s.counts, world);
        r.st.step = step + 1;
        r.st.seq_pos += (uint64_t)o->batch;
        r.st.total_steps = o->steps;
        r.st.tokens_seen += (double)o->batch * o->seq_len;
        run_record(&r, step, &s, now_seconds() - t0, tuned);
        measure_after_step(&r.meas);
        skipped = s.skipped ? skipped + 1 : 0; // (the same on every rank: loss and norm are global)
        if (skipped == STEP_SKIPPED_MAX)
            DIE("step %d: the loss or gradient norm was not finite for %d steps in a row (steps %d..%d, "
                "skipped, no checkpoint written): the run diverged",
                step + 1, STEP_SKIPPED_MAX, step + 2 - STEP_SKIPPED_MAX, step + 1);
        int last = step + 1 == o->steps;
        if ((o->eval_every > 0 && (step + 1) % o->eval_every == 0) || last) run_evaluate(&r, step);
        int saved = (o->save_every > 0 && (step + 1) % o->save_every == 0 && !s.skipped) ||
            (last && o->save_every >= 0);
        if (saved) run_save(&r.dist, o, &r.c, &r.m, &r.st, world, NULL);
        // SIGTERM / SIGINT / SIGUSR1/2: every rank stops after the same step (the flag is summed over the
        // ranks); after the last step too: its checkpoint is written, the report is skipped
        int stop = preempt_signal() != 0;
        if (comm_size(world) > 1) comm_allreduce(world, &stop, 1, CT_I32);
        if (stop) {
            if (!saved) run_save(&r.dist, o, &r.c, &r.m, &r.st, world, NULL);
            r.preempted = preempt_signal() ? preempt_signal() : SIGTERM;
            break;
        }
    }
    // the report (final evaluation, sample, plots) checks for no signal: one ends the process at once,
    // as does one that came after the last step's check
    preempt_arm(0);
    if (!r.preempted && preempt_signal()) raise(preempt_signal());
    if (!r.preempted) measure_memory(&r.meas, world, o->out); // (before the evaluation's buffers)
    run_close(&r);
    return r.preempted ? MOE_EXIT_PREEMPTED : 0;
}
