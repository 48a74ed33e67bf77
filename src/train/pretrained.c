// pretrained.c — resolving --ckpt, reading a checkpoint's or Hugging Face model's config and weights
// into a model, and starting a run from Hugging Face weights (see pretrained.h).
#include "train/pretrained.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "data/data.h"
#include "model/params.h"
#include "io/hf.h"
#include "train/trainer.h"

void pretrained_resolve(const char *dir, char *out, size_t n) {
    if (!dir[0]) DIE("--ckpt is required");
    if (!dir_exists(dir)) DIE("--ckpt: '%s' is not a directory", dir);
    char p[4200];
    join_path(p, sizeof p, dir, "model.safetensors");
    if (hf_is_model_dir(dir) || file_exists(p) || ckpt_is_complete(dir)) {
        snprintf(out, n, "%s", dir);
        return;
    }
    if (ckpt_find_latest(dir, out, n) != 0)
        DIE("--ckpt: no complete checkpoint in '%s' (nor is it a Hugging Face model directory)", dir);
    join_path(p, sizeof p, dir, RUN_BEST);
    if (ckpt_is_complete(p)) { // a run of --keep-best: say which of its two checkpoints this is
        TrainState newest, best;
        ckpt_load_state(out, &newest);
        ckpt_load_state(p, &best);
        fflush(stdout);
        fprintf(
            stderr,
            "moe: note: reading %s, the run's newest checkpoint (step %lld); --keep-best kept %s (step %lld, "
            "the lowest validation loss): --ckpt %s reads that one\n",
            out, (long long)newest.step, p, (long long)best.step, p);
    }
}

void pretrained_config(const char *dir, ModelConfig *c) {
    if (hf_is_model_dir(dir)) hf_load_config(dir, c);
    else ckpt_load_config(dir, c);
}

void pretrained_load(Model *m, const char *dir, int maxB, int maxT, TrainState *st, uint64_t seed,
                     const char *device) {
    ModelConfig c;
    pretrained_config(dir, &c);
    if (maxT > c.max_seq_len) maxT = c.max_seq_len;
    model_init(m, &c, backend_by_name(device), maxB, maxT, NULL);
    float *full = xmalloc(m->t.total * sizeof(float)), *local = xmalloc(m->t.ltotal * sizeof(float));
    int hf = hf_is_model_dir(dir);
    if (hf) hf_load_params(dir, &m->t, full, 0);
    else ckpt_load(dir, &m->t, full, NULL, NULL, st);
    params_full_to_local(&m->t, full, local);
    m->be->to_device(m->params, local, m->t.ltotal * sizeof(float));
    free(full);
    free(local);
    if (hf) {
        memset(st, 0, sizeof *st);
        st->seed = seed;
    }
}

void pretrained_start_run(const char *hf_dir, const ModelConfig *c, const TrainOptions *o, Comm *world) {
    const char *bad = train_options_validate(o, c);
    if (bad) DIE("%s", bad);
    // the data first: a bad data file fails before the run directory is touched (text through a tokenizer:
    // train_check tokenises it, with its checks)
    Dataset ds;
    if (!o->tokenizer[0]) {
        data_open_split(&ds, o->data[0] ? o->data : NULL, o->val_data[0] ? o->val_data : NULL, o->val_frac,
                        o->seed, o->seq_len);
        if (ds.max_token >= c->vocab_size)
            DIE("--init-from %s: the data (%s) has token %d; the model's vocab_size is %d", hf_dir, ds.source,
                ds.max_token, c->vocab_size);
        data_close(&ds);
    }
    char p[2048], what[256];
    if (comm_rank(world) == 0 && ckpt_run_present(o->out, what, sizeof what) && !o->force)
        DIE("'%s' already holds a training run (%s); pass --force to start over from --init-from (which "
            "deletes it)",
            o->out, what);
    train_check(c, o, world); // the mesh, device, environment, model: refused before anything is deleted
    if (comm_rank(world) == 0) {
        // the weights are read (and so checked) before --force deletes anything or --out is created
        ParamTable t;
        params_build(&t, c);
        float *w = xmalloc(t.total * sizeof(float)), *zero = xcalloc(t.total, sizeof(float));
        if (o->upcycle) params_init(&t, c, w, o->seed); // the routers' initialisation (the rest is read)
        hf_load_params(hf_dir, &t, w, o->upcycle > 0);
        ckpt_run_clear(o->out);
        mkdir_p(o->out);
        TrainState st;
        memset(&st, 0, sizeof st);
        st.seed = o->seed;
        st.total_steps = o->steps;
        st.precision = o->precision; // (the weights are rounded to bf16 when the run loads them)
        ckpt_path(p, sizeof p, o->out, 0);
        ckpt_save(p, c, &t, w, zero, zero, &st);
        free(w);
        free(zero);
        params_free(&t);
        printf("initialised from %s: its weights are step 0 of this run (%s)\n", hf_dir, p);
    }
    comm_barrier(world);
}
