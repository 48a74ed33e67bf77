// step.c — one optimizer step (see step.h): the actions of the schedule, then reduce, norm, update.
#include "train/step.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "core/common.h"

// The router jitter's noise of (step, micro-batch): a function of the step, so a resume is exact.
static uint64_t noise_seed(uint64_t seed, int step, int micro) {
    uint64_t h = seed * 0x9E3779B97F4A7C15ull ^ ((uint64_t)step << 20) ^ (uint64_t)micro;
    h ^= h >> 31;
    return h ? h : 1;
}

void step_init(StepCtx *s, Model *m, Dist *dist, const Dataset *ds, const TrainOptions *o, int dp, int dp_rank) {
    memset(s, 0, sizeof *s);
    s->m = m;
    s->dist = dist;
    s->ds = ds;
    s->o = o;
    s->T = o->seq_len;
    s->Bm = o->batch / o->grad_accum;
    s->Bl = s->Bm / dp;
    s->dp_rank = dp_rank;
    const char *bad = schedule_build(&s->sched, SCHED_SEQUENTIAL, 1, 0, 1, o->grad_accum);
    if (!bad) bad = schedule_check(&s->sched);
    if (bad) DIE("the step's schedule: %s", bad);
    s->x = xmalloc(sizeof(int32_t) * (size_t)s->Bl * s->T + 1);
    s->y = xmalloc(sizeof(int32_t) * (size_t)s->Bl * s->T + 1);
}

void step_free(StepCtx *s) {
    schedule_free(&s->sched);
    free(s->x);
    free(s->y);
}

// The forward of micro-batch g: its tokens (the data position continues from the checkpoint's, so a
// resume with another --batch neither skips nor repeats sequences), the loss scaled for the step's
// mean, the router statistics added to r.
static void micro_forward(StepCtx *s, int step, uint64_t seq_pos, int g, StepStats *r) {
    Model *m = s->m;
    const ModelConfig *c = &m->c;
    int G = s->sched.micro_batches, LE = c->n_layers * c->n_experts;
    data_train_batch(s->ds, seq_pos + (uint64_t)g * s->Bm + (uint64_t)s->dp_rank * s->Bl, s->Bl, s->x, s->y);
    uint64_t ns = c->jitter > 0 ? noise_seed(s->o->seed, step, g) : 0;
    float dloss = 1.0f / ((float)(s->Bm * s->T) * G);
    r->loss += dist_mean_dp(s->dist, model_forward(m, s->x, s->y, s->Bl, s->T, dloss, ns)) / G;
    r->aux += m->aux / G;
    r->z += m->z / G;
    r->dropped += m->dropped;
    for (int i = 0; i < LE; i++) r->counts[i] += m->expert_counts[i];
}

static void micro_backward(StepCtx *s, int last) {
    int G = s->sched.micro_batches;
    if (last) dist_arm(s->dist, s->m);   // the last backward finishes the gradients: reduce as they are
    model_backward(s->m, s->m->c.aux_coef / G, s->m->c.z_coef / G);
}

// Reduce, norm, clip, AdamW (skipped when the loss or the norm is not finite).
static void update(StepCtx *s, int step, StepStats *r) {
    const TrainOptions *o = s->o;
    dist_finish_grads(s->dist, s->m);
    r->gnorm = dist_grad_norm(s->dist, s->m);
    r->lr = lr_at(o, step);
    r->skipped = !isfinite(r->loss) || !isfinite(r->gnorm);
    if (r->skipped) return;
    float clip = o->grad_clip > 0 && r->gnorm > o->grad_clip ? (float)(o->grad_clip / r->gnorm) : 1.0f;
    dist_adamw(s->dist, s->m, clip, r->lr, o->beta1, o->beta2, o->adam_eps, o->weight_decay, step + 1);
}

void step_run(StepCtx *s, int step, uint64_t seq_pos, StepStats *r) {
    Model *m = s->m;
    int64_t *counts = r->counts;
    memset(r, 0, sizeof *r);
    r->counts = counts;
    memset(counts, 0, sizeof(int64_t) * m->c.n_layers * m->c.n_experts);
    m->be->zero(m->grads, m->t.ltotal * sizeof(float));
    int last = schedule_last_backward(&s->sched);
    for (int i = 0; i < s->sched.n; i++) {
        const Action *a = &s->sched.a[i];
        if (a->kind == ACT_FORWARD) micro_forward(s, step, seq_pos, a->micro, r);
        else micro_backward(s, i == last);
    }
    update(s, step, r);
}
