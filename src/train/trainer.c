// trainer.c — the training loop of `moe train` (see trainer.h). One process, one backend;
// the global batch is split into grad_accum micro-batches; losses are means over the step's
// tokens; aux and z losses are means over layers and micro-batches.
#include "train/trainer.h"
#include <omp.h>
#include <math.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "core/common.h"
#include "data/data.h"
#include "model/model.h"
#include "train/checkpoint.h"
#include "train/ckpt_dist.h"
#include "train/evaluate.h"
#include "train/dist.h"
#include "train/plot.h"
#include "parallel/mesh.h"

static uint64_t noise_seed(uint64_t seed, int step, int micro) {
    uint64_t h = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)step << 20) ^ (uint64_t)micro;
    h ^= h >> 31;
    return h ? h : 1;
}

// metrics.jsonl lines with step <= last_step are kept (resume), later ones dropped.
static void truncate_metrics(const char *path, int64_t last_step) {
    size_t len;
    char *buf = read_file(path, &len);
    if (!buf) return;
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = xfopen(tmp, "w");
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        cJSON *s = j ? cJSON_GetObjectItem(j, "step") : NULL;
        if (s && cJSON_IsNumber(s) && s->valuedouble <= last_step) fprintf(f, "%s\n", line);
        cJSON_Delete(j);
    }
    xfclose(f, tmp);
    if (rename(tmp, path) != 0) DIE("cannot replace %s", path);
    free(buf);
}

// Every rank writes the slices it owns (params and AdamW moments, ZeRO shards gathered first);
// rank 0 creates and commits the directory.
static void save(const Dist *dist, const TrainOptions *o, const ModelConfig *c, const Model *m, const TrainState *st,
                 const Comm *world) {
    size_t P = m->t.ltotal;
    float *m1 = xmalloc(P * sizeof(float) * 3 + 1), *m2 = m1 + P, *ph = m2 + P;
    dist_moments_get(dist, m, m1, m2);
    m->be->to_host(ph, m->params, P * sizeof(float));
    unsigned char *own = xmalloc((size_t)m->t.n + 1);
    for (int i = 0; i < m->t.n; i++) own[i] = (unsigned char)dist_owned(dist, &m->t.p[i]);
    char path[2048];
    ckpt_path(path, sizeof path, o->out, st->step);
    ckpt_save_dist(path, c, &m->t, ph, m1, m2, own, st, world);
    if (world->rank == 0) ckpt_prune(o->out, o->keep);
    comm_barrier(world);
    free(own);
    free(m1);
}

static int config_equal(const ModelConfig *a, const ModelConfig *b) { return memcmp(a, b, sizeof *a) == 0; }

static void fmt_eta(char *buf, size_t n, double s) {
    if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, n, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

// The mesh for this config, or DIE naming the numbers (before any allocation).
static MeshShape resolve_mesh(const TrainOptions *o, const ModelConfig *c, int world) {
    MeshShape ms = {world, o->tp, 0, o->pp, o->ep, o->etp, 0};
    const char *bad = mesh_shape_resolve(&ms, c);
    if (bad) DIE("impossible mesh: %s", bad);
    if (o->batch % (o->grad_accum * ms.dp))
        DIE("impossible mesh: --batch %d is not divisible by --grad-accum %d x dp %d (each DP rank takes an equal "
            "share of every micro-batch)", o->batch, o->grad_accum, ms.dp);
    return ms;
}

int train_run(const ModelConfig *cfg_in, const TrainOptions *o, int model_explicit, Comm *world) {
    ModelConfig c = *cfg_in;
    const char *bad = config_validate(&c);
    if (bad) DIE("invalid model config: %s", bad);
    bad = train_options_validate(o, &c);
    if (bad) DIE("%s", bad);
    resolve_mesh(o, &c, world->size);
    int rank0 = world->rank == 0;
    // several ranks on one machine share its cores: unless told otherwise, each takes its share
    const char *local = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
    if (world->size > 1 && !getenv("OMP_NUM_THREADS") && local && atoi(local) > 0) {
        int t = omp_get_num_procs() / atoi(local);
        omp_set_num_threads(t > 0 ? t : 1);
    }
    // several processes on GPUs talk through NCCL (the comm API's device ops); MOE_FORCE_NCCL=1
    // takes that path with one process too (tests on one GPU)
    int force_nccl = comm_nccl_forced();
    if (!comm_have_nccl() && world->size > 1 && !strcmp(o->device, "cuda"))
        DIE("--device cuda with %d processes: multi-GPU runs need the NCCL backend, and this moe was built without "
            "it (CMake found no NCCL, or -DMOE_NCCL=OFF); use one process per run on the GPU, or --device cpu",
            world->size);
    const Backend *be = backend_by_name(o->device);
    int on_gpu = be != backend_cpu();
    if (world->size > 1 && on_gpu && !comm_have_nccl())
        DIE("--device %s with %d processes: multi-GPU runs need the NCCL backend, and this moe was built without "
            "it (CMake found no NCCL, or -DMOE_NCCL=OFF); use one process per run on the GPU, or --device cpu",
            be->name, world->size);
    if (force_nccl && !on_gpu) DIE("MOE_FORCE_NCCL=1 runs the NCCL path on the GPU: it needs --device cuda");
    int meshed = world->size > 1 || force_nccl;   // the mesh's code paths, even for one rank
    // MOE_PROFILE=1: time every op (serialised) and print where a step's time goes at the end
    int profile = getenv("MOE_PROFILE") && atoi(getenv("MOE_PROFILE")) > 0;
    if (profile) be = backend_profiled(be);
    // MOE_BF16_SHADOW=0: no bf16 copy of the weights for the GEMMs (below, before the first step)
    const char *shv = getenv("MOE_BF16_SHADOW");
    if (shv && *shv && strcmp(shv, "0") && strcmp(shv, "1"))
        DIE("MOE_BF16_SHADOW must be 0 (convert the weights per GEMM) or 1 (the default), not '%s'", shv);
    int bf16_shadow = !(shv && !strcmp(shv, "0"));
    // MOE_GROUPED_GEMM=cublas: the expert GEMMs through cuBLAS instead of our Hopper kernel (cuda)
    const char *ggv = getenv("MOE_GROUPED_GEMM");
    if (ggv && *ggv && strcmp(ggv, "auto") && strcmp(ggv, "cublas"))
        DIE("MOE_GROUPED_GEMM must be auto (the default) or cublas, not '%s'", ggv);
    char metrics_path[2048], latest[2048];
    snprintf(metrics_path, sizeof metrics_path, "%s/metrics.jsonl", o->out);

    // data first: a bad data file must fail before anything in the output directory is touched
    Dataset ds;
    data_open(&ds, o->data[0] ? o->data : NULL, o->seed, o->seq_len);

    // ---- output directory: refuse to overwrite a run unless --resume / --force
    // (every check that can fail comes before --force deletes anything)
    TrainState st = {0};
    int resuming = 0;
    char held[256];
    int has_run = ckpt_run_present(o->out, held, sizeof held);
    // every rank decides the same from the same files; only rank 0 changes them
    comm_barrier(world);
    if (o->resume) {
        if (ckpt_find_latest(o->out, latest, sizeof latest) != 0)
            DIE("--resume: no complete checkpoint in '%s'", o->out);
        ModelConfig saved;
        ckpt_load_config(latest, &saved);
        if (model_explicit && !config_equal(&saved, &c))
            DIE("--resume: the model options given differ from the checkpoint's config (%s/config.json); "
                "drop them to continue that model", latest);
        c = saved;
        bad = train_options_validate(o, &c);
        if (bad) DIE("%s", bad);
        resuming = 1;
    }
    if (ds.max_token >= c.vocab_size)
        DIE("the data's tokens (up to id %d, from %s) do not fit the model's vocab_size %d", ds.max_token, ds.source,
            c.vocab_size);
    if (!o->resume && has_run && !o->force)
        DIE("'%s' already holds a training run (%s); pass --resume to continue it or --force to start over "
            "(which deletes it)", o->out, held);
    else if (!o->resume && o->force && rank0)
        ckpt_run_clear(o->out);
    if (rank0) mkdir_p(o->out);
    comm_barrier(world);

    // ---- data and model
    MeshShape shape = resolve_mesh(o, &c, world->size);
    Mesh mesh;
    mesh_init(&mesh, &shape, world);
    if (meshed && on_gpu) mesh_enable_device(&mesh);
    Dist dist;
    dist_init(&dist, meshed ? &mesh : NULL, o->zero, o->overlap, (size_t)(o->bucket_mb * 1048576.0));
    int DP = shape.dp, dp_rank = mesh.me.dp;
    // Bm: sequences of a global micro-batch; Bl: this DP rank's share
    int T = o->seq_len, G = o->grad_accum, Bm = o->batch / G, Bl = Bm / DP, Ng = Bm * T;
    Model m;
    model_init(&m, &c, be, Bl, T, meshed ? &dist.mm : NULL);
    size_t P = m.t.ltotal;
    dist_attach(&dist, &m);
    if (resuming) {
        // any mesh resumes any checkpoint: each rank reads the tensors it holds, keeps its slices
        float *m1 = xmalloc(P * sizeof(float) * 3 + 1), *m2 = m1 + P, *ph = m2 + P;
        ckpt_load_dist(latest, &m.t, ph, m1, m2, &st, world);
        be->to_device(m.params, ph, P * sizeof(float));
        dist_moments_set(&dist, &m, m1, m2);
        free(m1);
        if (st.seed != o->seed)
            DIE("--resume: the checkpoint was trained with --seed %llu, not %llu", (unsigned long long)st.seed,
                (unsigned long long)o->seed);
        if (rank0) truncate_metrics(metrics_path, st.step);
        if (rank0) printf("resuming from %s (step %lld)\n", latest, (long long)st.step);
    } else {
        float *ph = xmalloc(P * sizeof(float) + 1);
        params_init(&m.t, &c, ph, o->seed);
        be->to_device(m.params, ph, P * sizeof(float));
        free(ph);
        st.seed = o->seed;
    }
    FILE *out = rank0 ? stdout : fopen("/dev/null", "w");
    if (!out) DIE("cannot open /dev/null");
    char nb[32], ab[32];
    fmt_count(nb, sizeof nb, (double)config_num_params(&c));
    fmt_count(ab, sizeof ab, (double)config_num_active_params(&c));
    fprintf(out, "model: %s params (%s active per token), d %d, %d layers, %d heads (%d kv), %d experts top-%d, f %d, "
           "vocab %d, %s\n", nb, ab, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.n_experts, c.top_k, c.d_ff,
           c.vocab_size, c.dispatch == DISPATCH_CAPACITY ? "capacity dispatch" : "dropless dispatch");
    fprintf(out, "data: %s, %zu tokens, %zu train / %zu val windows of %d\n", ds.source, ds.n_tokens, ds.n_train,
           ds.n_val, T);
    fprintf(out, "train: %d steps x %d sequences (%d micro-batches of %d) x %d tokens, lr %g, backend %s\n", o->steps,
           o->batch, G, Bm, T, o->lr, be->name);

    if (world->size > 1) mesh_print(&shape, out);
    FILE *mf = rank0 ? xfopen(metrics_path, "a") : NULL;
    int32_t *x = xmalloc((size_t)Bm * T * 4), *y = xmalloc((size_t)Bm * T * 4);
    int L = c.n_layers, E = c.n_experts;
    int64_t *counts = xmalloc(sizeof(int64_t) * L * E);
    double flops_tok = config_flops_per_token(&c, T);
    double t_start = now_seconds();
    int first = (int)st.step;
    if (first >= o->steps)
        fprintf(out, "the checkpoint is at step %d, which already reaches --steps %d: nothing to train\n", first,
                o->steps);
    // the bf16 GEMMs read the weights from one bf16 copy that AdamW keeps current (ops.h bf16_shadow;
    // a no-op on cpu and cuda-fp32); MOE_BF16_SHADOW=0 converts the weights on every GEMM instead
    // (the same results bit for bit: for checking that)
    dist.bf16_shadow = bf16_shadow;
    if (dist.bf16_shadow) be->bf16_shadow(m.params, P);
    EvalResult ev;
    for (int step = first; step < o->steps; step++) {
        if (profile && step == first + 1) backend_profile_reset();   // the first step warms up
        double t0 = now_seconds();
        be->zero(m.grads, P * sizeof(float));
        memset(counts, 0, sizeof(int64_t) * L * E);
        double loss = 0, aux = 0, z = 0;
        int64_t dropped = 0;
        for (int g = 0; g < G; g++) {
            // the data position continues from the checkpoint's (so a resume with another --batch
            // neither skips nor repeats sequences)
            data_train_batch(&ds, st.seq_pos + (uint64_t)g * Bm + (uint64_t)dp_rank * Bl, Bl, x, y);
            uint64_t ns = c.jitter > 0 ? noise_seed(o->seed, step, g) : 0;
            loss += dist_mean_dp(&dist, model_forward(&m, x, y, Bl, T, 1.0f / ((float)Ng * G), ns)) / G;
            aux += m.aux / G;
            z += m.z / G;
            dropped += m.dropped;
            for (int i = 0; i < L * E; i++) counts[i] += m.expert_counts[i];
            if (g == G - 1) dist_arm(&dist, &m);   // the last backward finishes the gradients
            model_backward(&m, c.aux_coef / G, c.z_coef / G);
        }
        dist_finish_grads(&dist, &m);
        double gnorm = dist_grad_norm(&dist, &m);
        float lr = lr_at(o, step);
        int skipped = !isfinite(loss) || !isfinite(gnorm);
        if (skipped && rank0) {
            fprintf(stderr, "moe: warning: step %d: non-finite %s; update skipped\n", step + 1,
                    isfinite(loss) ? "gradient norm" : "loss");
        }
        if (!skipped) {
            float clip = o->grad_clip > 0 && gnorm > o->grad_clip ? (float)(o->grad_clip / gnorm) : 1.0f;
            dist_adamw(&dist, &m, clip, lr, o->beta1, o->beta2, o->adam_eps, o->weight_decay, step + 1);
        }
        st.step = step + 1;
        st.seq_pos += (uint64_t)o->batch;
        st.total_steps = o->steps;
        st.tokens_seen += (double)o->batch * T;
        double dt = now_seconds() - t0, tps = o->batch * T / dt;
        // load balance: per layer max/mean tokens per expert
        double worst = 0;
        char per_layer[256] = "";
        for (int l = 0; l < L; l++) {
            int64_t mx = 0, tot = 0;
            for (int e = 0; e < E; e++) { tot += counts[l * E + e]; if (counts[l * E + e] > mx) mx = counts[l * E + e]; }
            double r = tot ? (double)mx * E / tot : 0;
            if (r > worst) worst = r;
            if (L <= 4) snprintf(per_layer + strlen(per_layer), sizeof per_layer - strlen(per_layer), "%s%.2f",
                                 l ? " " : "", r);
        }
        // metrics line
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "step", step + 1);
        cJSON_AddNumberToObject(j, "loss", loss);
        cJSON_AddNumberToObject(j, "aux_loss", aux);
        cJSON_AddNumberToObject(j, "z_loss", z);
        cJSON_AddNumberToObject(j, "lr", lr);
        cJSON_AddNumberToObject(j, "grad_norm", gnorm);
        cJSON_AddNumberToObject(j, "tokens_per_s", tps);
        cJSON_AddNumberToObject(j, "tflops", tps * flops_tok / 1e12);
        cJSON_AddNumberToObject(j, "step_time_s", dt);
        cJSON_AddNumberToObject(j, "grad_wait_s", dist.wait_s);
        cJSON_AddNumberToObject(j, "load_max_over_mean", worst);
        cJSON_AddNumberToObject(j, "dropped", (double)dropped);
        cJSON_AddBoolToObject(j, "skipped", skipped);
        cJSON *el = cJSON_AddArrayToObject(j, "expert_load");
        for (int l = 0; l < L; l++) {
            cJSON *row = cJSON_CreateArray();
            for (int e = 0; e < E; e++) cJSON_AddItemToArray(row, cJSON_CreateNumber((double)counts[l * E + e]));
            cJSON_AddItemToArray(el, row);
        }
        char *s = cJSON_PrintUnformatted(j);
        if (mf) { fprintf(mf, "%s\n", s); fflush(mf); }
        free(s);
        cJSON_Delete(j);
        if (!o->quiet && rank0) {
            char eta[32];
            double el_s = now_seconds() - t_start;
            fmt_eta(eta, sizeof eta, el_s / (step + 1 - first) * (o->steps - step - 1));
            char wait[48] = "";
            if (world->size > 1) snprintf(wait, sizeof wait, " | grad wait %.1fms", 1e3 * dist.wait_s);
            printf("step %*d/%d | loss %.4f | aux %.4f | z %.4f | lr %.2e | gnorm %.3f | %6.0f tok/s | "
                   "load max/mean %.2f%s%s%s%s | ETA %s\n",
                   (int)(snprintf(NULL, 0, "%d", o->steps)), step + 1, o->steps, loss, aux, z, lr, gnorm, tps, worst,
                   L <= 4 ? " (" : "", per_layer, L <= 4 ? ")" : "", wait, eta);
            fflush(stdout);
        }
        int last = step + 1 == o->steps;
        if ((o->eval_every > 0 && (step + 1) % o->eval_every == 0) || last) {
            evaluate(&m, &ds, Bm, o->eval_batches, 0, &ev, &dist);
            if (mf) { fprintf(mf, "{\"step\":%d,\"val_loss\":%.6f}\n", step + 1, ev.loss); fflush(mf); }
            if (!o->quiet) fprintf(out, "  eval: val loss %.4f\n", ev.loss);
        }
        if ((o->save_every > 0 && (step + 1) % o->save_every == 0) || (last && o->save_every >= 0))
            save(&dist, o, &c, &m, &st, world);
    }
    if (mf) xfclose(mf, metrics_path);
    double wall = now_seconds() - t_start;

    if (o->check_replicas) {
        int bad = dist_check_replicas(&dist, &m, rank0 ? stderr : NULL);
        if (bad) DIE("replica check failed (%d violations)", bad);
        fprintf(out, "replica check: ok (router and dense replicas bitwise equal on %d ranks; experts equal across "
                     "EDP, distinct across EP)\n", world->size);
    }
    if (profile && rank0) backend_profile_report(stdout, o->steps - first - 1);
    // ---- end of run report
    fprintf(out, "\n");
    if (o->steps > first)
        fprintf(out, "trained steps %d..%d in %.1fs (%.0f tokens/s)\n", first + 1, o->steps, wall,
               (o->steps - first) * (double)o->batch * T / wall);
    evaluate(&m, &ds, Bm, o->eval_batches, 1, &ev, &dist);
    if (rank0) eval_print(&ev, &ds, &c);
    eval_result_free(&ev);
    if (o->sample_tokens > 0) {
        int cap = 32 + o->sample_tokens;
        int32_t *ctx = xmalloc(sizeof(int32_t) * cap);
        int len = 0;
        if (ds.n_kinds) {
            const char *prompt = "12+34=";
            for (const char *p = prompt; *p; p++) ctx[len++] = (unsigned char)*p;
        } else {
            data_val_batch(&ds, 0, 1, x, y, NULL);
            for (int i = 0; i < 16 && i < T; i++) ctx[len++] = x[i];
        }
        int plen = len;
        sample_tokens(&m, ctx, &len, cap, o->sample_tokens, 0.8f, o->seed);
        fprintf(out, "sample (temperature 0.8):\n---\n");
        print_tokens(out, ctx, plen, c.vocab_size);
        fprintf(out, "|");
        print_tokens(out, ctx + plen, len - plen, c.vocab_size);
        fprintf(out, "\n---\n");
        free(ctx);
    }
    if (ckpt_find_latest(o->out, latest, sizeof latest) == 0) fprintf(out, "checkpoint: %s\n", latest);
    fprintf(out, "metrics: %s\n", metrics_path);
    if (rank0 && o->plots && plot_run(o->out) == 0) fprintf(out, "plots: %s/loss.png %s/expert_load.png\n", o->out, o->out);
    free(x); free(y); free(counts);
    dist_free(&dist);
    model_free(&m);
    data_close(&ds);
    if (!rank0) fclose(out);
    mesh_free(&mesh);
    return 0;
}
