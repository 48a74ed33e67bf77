// run_save.c — what a training run writes beside its steps (see run_save.h): its checkpoints, streamed from
// the model and the optimizer's buckets, the IO note that names the last complete one, and metrics.jsonl cut
// back to a resumed step; and a resume's checkpoint streamed back in, a tensor at a time. Must not hold: the
// checkpoint format (io/), the training loop (trainer.c).
#include "train/run_save.h"
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "io/checkpoint.h"
#include "io/ckpt_dist.h"

void run_round_bf16(float *p, size_t n) {
    for (size_t i = 0; i < n; i++) p[i] = bf16_to_f32(bf16_rn_bits(p[i]));
}

static void load_put(void *ctx, int which, size_t lo, size_t n, float *src) {
    RunLoad *l = ctx;
    if (which) {
        dist_moments_set(l->dist, which - 1, lo, n, src);
        return;
    }
    if (l->wround) run_round_bf16(src, n);
    l->be->to_device(l->params + lo, src, n * sizeof(float));
}

void run_load(RunLoad *l, const char *dir, const ParamTable *t, TrainState *st, const Comm *world) {
    CkptSink sink = {load_put, l};
    ckpt_load_dist(dir, t, &sink, 1, st, world);
}

void run_metrics_truncate(const char *path, int64_t last_step) {
    size_t len;
    char *buf = read_file(path, &len);
    if (!buf) return;
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = xfopen(tmp, "w");
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        cJSON *s = j ? cJSON_GetObjectItem(j, "step") : NULL;
        if (s && cJSON_IsNumber(s) && s->valuedouble <= last_step) {
            xfputs(line, f, tmp);
            xfputs("\n", f, tmp);
        }
        cJSON_Delete(j);
    }
    xfclose(f, tmp);
    xrename(tmp, path);
    free(buf);
}

void run_note_checkpoint(const char *out) {
    char latest[2048], note[2200];
    if (ckpt_find_latest(out, latest, sizeof latest) == 0)
        snprintf(note, sizeof note,
                 "the checkpoint %s is complete and unchanged (--resume continues from it)", latest);
    else snprintf(note, sizeof note, "no checkpoint of this run is complete yet");
    io_note_set(note);
}

// The parameters for a checkpoint, a window of SAVE_WINDOW elements at a time (io/ckpt_dist.h CkptSource)
#define SAVE_WINDOW ((size_t)1 << 22) // 16 MiB of float32
static void params_window(void *ctx, int k, size_t *lo, size_t *n, float *buf) {
    const Model *m = ctx;
    *lo = (size_t)k * SAVE_WINDOW;
    *n = m->t.ltotal - *lo < SAVE_WINDOW ? m->t.ltotal - *lo : SAVE_WINDOW;
    m->be->to_host(buf, m->params + *lo, *n * sizeof(float));
}

void run_save(const Dist *dist, const TrainOptions *o, const ModelConfig *c, const Model *m,
              const TrainState *st, const Comm *world, const char *dir) {
    size_t P = m->t.ltotal;
    CkptSource ps = {(int)((P + SAVE_WINDOW - 1) / SAVE_WINDOW), P < SAVE_WINDOW ? P : SAVE_WINDOW,
                     params_window, (void *)m};
    CkptSource m1 = dist_moment_source(dist, 0), m2 = dist_moment_source(dist, 1);
    unsigned char *own = xmalloc((size_t)m->t.n + 1);
    for (int i = 0; i < m->t.n; i++) own[i] = (unsigned char)dist_owned(dist, &m->t.p[i]);
    char path[2048];
    if (dir) snprintf(path, sizeof path, "%s", dir);
    else ckpt_path(path, sizeof path, o->out, st->step);
    ckpt_save_dist(path, c, &m->t, &ps, &m1, &m2, own, st, world);
    if (comm_rank(world) == 0 && !dir) ckpt_prune(o->out, o->keep);
    comm_barrier(world);
    run_note_checkpoint(o->out);
    free(own);
}
