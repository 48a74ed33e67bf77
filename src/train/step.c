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

void step_init(StepCtx *s, Model *m, Dist *dist, const Dataset *ds, const TrainOptions *o, const Mesh *mesh) {
    memset(s, 0, sizeof *s);
    s->m = m;
    s->dist = dist;
    s->ds = ds;
    s->o = o;
    s->T = o->seq_len;
    s->Bm = o->batch / o->grad_accum;
    s->Bl = s->Bm / mesh->s.dp;
    s->dp_rank = mesh->me.dp;
    int pp = mesh->s.pp;
    const char *bad = schedule_build(&s->sched, pp > 1 ? o->pp_schedule : SCHED_SEQUENTIAL, pp, mesh->me.pp,
                                     pp > 1 ? o->vpp : 1, o->grad_accum);
    if (!bad) bad = schedule_check(&s->sched);
    if (bad) DIE("%s", bad);
    for (int c = 0; c < s->sched.vpp; c++) model_set_slots(m, c, s->sched.live[c]);
    // one forward and its backward per step: the expert gradients in the next layer's activations
    if (o->grad_memory == GRADMEM_SHARED && pp == 1 && o->grad_accum == 1) model_share_grads(m, 1);
    pipe_init(&s->pipe, m, pp > 1 ? mesh->pp : NULL, s->sched.vpp);
    // arm the gradient reductions before each chunk's last backward
    s->arm_at = xcalloc((size_t)s->sched.n + 1, sizeof(int));
    s->stage_idle = xcalloc((size_t)pp * 2, sizeof(double));
    s->stage_act = xcalloc((size_t)pp * s->sched.vpp * 2, sizeof(double));
    s->stage_cpu = xcalloc((size_t)pp, sizeof(double));
    s->gathered = xcalloc((size_t)(pp + 1) * (3 + 2 * s->sched.vpp), sizeof(double)); // (+ this stage's)
    for (int c = 0; c < s->sched.vpp; c++) s->arm_at[schedule_last_backward(&s->sched, c)] = 1;
    s->x = xmalloc(sizeof(int32_t) * (size_t)s->Bl * s->T + 1);
    s->y = xmalloc(sizeof(int32_t) * (size_t)s->Bl * s->T + 1);
    if (m->c.balance == BALANCE_AUX_FREE) s->bias_h = xmalloc(sizeof(float) * m->c.n_experts);
    fp8_watch_init(&s->fp8, config_all_layers(&m->c), o->fp8_amax_jump, mesh->world);
}

int step_memory_note(const StepCtx *s, char *buf, size_t n) {
    int hl;
    size_t hb = model_grad_holes(s->m, &hl);
    if (!hl) return 0;
    snprintf(
        buf, n,
        "memory: the routed experts' bf16 gradients keep only their packed half in %d of %d layers (%.2f "
        "MiB not allocated: the activations they hold fit there)",
        hl, config_moe_layers(&s->m->c), hb / 1048576.0);
    return 1;
}

void step_free(StepCtx *s) {
    pipe_free(&s->pipe);
    free(s->arm_at);
    free(s->stage_idle);
    free(s->stage_act);
    free(s->stage_cpu);
    free(s->gathered);
    schedule_free(&s->sched);
    free(s->x);
    free(s->y);
    free(s->bias_h);
    fp8_watch_free(&s->fp8);
}

// The forward of micro-batch g on chunk c: its tokens (the data position continues from the
// checkpoint's, so a resume with another --batch neither skips nor repeats sequences), the loss
// scaled for the step's mean; the loss and router statistics (carried through the stages, complete
// on the last virtual stage) and this chunk's expert load added to r.
static void micro_forward(StepCtx *s, int step, uint64_t seq_pos, const Action *a, StepStats *r) {
    Model *m = s->m;
    const ModelConfig *c = &m->c;
    int G = s->sched.micro_batches, g = a->micro, E = c->n_experts;
    data_train_batch(s->ds, seq_pos + (uint64_t)g * s->Bm + (uint64_t)s->dp_rank * s->Bl, s->Bl, s->x, s->y);
    uint64_t ns = c->jitter > 0 ? noise_seed(s->o->seed, step, g) : 0;
    float dloss = 1.0f / ((float)(s->Bm * s->T) * G);
    // dropout: a function of (seed, step, micro-batch) like the jitter; the seed cleared after the forward
    // (its slot keeps it for the backward), so evaluation and sampling never drop
    m->dropout = s->o->dropout;
    m->embed_dropout = s->o->embed_dropout;
    m->drop_seed = s->o->dropout > 0 || s->o->embed_dropout > 0 || c->attention_dropout > 0
        ? noise_seed(s->o->seed ^ 0xD50Full, step, g)
        : 0;
    double loss = pipe_forward(&s->pipe, a->chunk, a->slot, s->x, s->y, s->Bl, s->T, dloss, ns);
    m->drop_seed = 0;
    if (pipe_last(&s->pipe, a->chunk)) {
        r->loss += dist_mean_dp(s->dist, loss) / G;
        r->aux += m->aux / G;
        r->z += m->z / G;
        r->dropped += m->dropped;
        if (c->mtp_depth) r->mtp += dist_mean_dp(s->dist, m->mtp_loss) / G;
    }
    const ModelChunk *ch = &m->chunk[a->chunk];
    size_t end = (size_t)model_chunk_end(m, a->chunk) * E; // (the MTP modules' layers on the last chunk)
    for (size_t i = (size_t)ch->l0 * E; i < end; i++) r->counts[i] += m->expert_counts[i];
}

static void micro_backward(StepCtx *s, const Action *a, int arm) {
    int G = s->sched.micro_batches;
    if (arm) dist_arm(s->dist, s->m); // the chunk's gradients are final after this one: reduce as they are
    pipe_backward(&s->pipe, a->chunk, a->slot, s->m->c.aux_coef / G, s->m->c.z_coef / G);
    if (arm) dist_disarm(s->m);
}

// With pipeline stages: the loss and router statistics from the last stage, the expert load of every
// stage's layers and every stage's idle time, to every rank.
// mine: this stage's (idle, span, CPU time, then its chunks' forward and backward seconds).
static void gather_stages(StepCtx *s, StepStats *r, double *mine) {
    const Comm *pp = s->pipe.pp;
    int P = comm_size(pp), n = 3 + 2 * s->sched.vpp;
    r->stages = P;
    r->vpp = s->sched.vpp;
    r->stage_idle = s->stage_idle;
    r->stage_act = s->stage_act;
    r->stage_cpu = s->stage_cpu;
    if (P > 1) comm_allgather(pp, mine, s->gathered, (size_t)n, CT_F64);
    else memcpy(s->gathered, mine, sizeof(double) * n);
    for (int k = 0; k < P; k++) {
        memcpy(s->stage_idle + 2 * k, s->gathered + (size_t)k * n, sizeof(double) * 2);
        s->stage_cpu[k] = s->gathered[(size_t)k * n + 2];
        memcpy(s->stage_act + (size_t)k * (n - 3), s->gathered + (size_t)k * n + 3, sizeof(double) * (n - 3));
    }
    if (P <= 1) return;
    double v[5] = {r->loss, r->aux, r->z, (double)r->dropped, r->mtp};
    comm_bcast(pp, v, 5, CT_F64, comm_size(pp) - 1);
    r->loss = v[0];
    r->aux = v[1];
    r->z = v[2];
    r->dropped = (int64_t)v[3];
    r->mtp = v[4];
    comm_allreduce(pp, r->counts, (size_t)config_all_layers(&s->m->c) * s->m->c.n_experts, CT_I64);
}

// Reduce, norm, clip, AdamW (skipped when the loss or the norm is not finite).
static void update(StepCtx *s, int step, StepStats *r) {
    const TrainOptions *o = s->o;
    fp8_watch_step(&s->fp8, s->m->be, step, &r->fp8);
    dist_finish_grads(s->dist, s->m);
    r->gnorm = dist_grad_norm(s->dist, s->m);
    r->lr = lr_at(o, step);
    r->skipped = !isfinite(r->loss) || !isfinite(r->gnorm);
    if (r->skipped) return;
    float clip = o->grad_clip > 0 && r->gnorm > o->grad_clip ? (float)(o->grad_clip / r->gnorm) : 1.0f;
    dist_adamw(s->dist, s->m, clip, r->lr, o->beta1, o->beta2, o->adam_eps, o->weight_decay, step + 1);
}

// balance aux-free (DeepSeek-V3): after the update, each held layer's routing bias moves by
// rate * sign(mean load - load) per expert, from the step's global counts (the same on every rank, so
// every replica of the bias stays equal). No gradient reaches it: AdamW left it as it was.
static void route_bias_step(StepCtx *s, const StepStats *r) {
    Model *m = s->m;
    int E = m->c.n_experts;
    float rate = m->c.bias_rate;
    float *b = s->bias_h;
    for (int l = 0; l < config_all_layers(&m->c); l++) {
        int i = params_index(&m->t, PR_ROUTE_BIAS, l, -1);
        if (i < 0 || !m->t.p[i].lnumel) continue;
        float *dev = m->params + m->t.p[i].loffset;
        const int64_t *cnt = r->counts + (size_t)l * E;
        int64_t tot = 0;
        for (int e = 0; e < E; e++) tot += cnt[e];
        m->be->to_host(b, dev, sizeof(float) * E);
        for (int e = 0; e < E; e++) {
            int64_t err = tot - (int64_t)E * cnt[e]; // E (mean - load): its sign
            b[e] += err > 0 ? rate : err < 0 ? -rate : 0.0f;
        }
        m->be->to_device(dev, b, sizeof(float) * E);
    }
    // to_device dropped the GEMMs' bf16 copy of the weights (ops.h): make it again where one is kept
    if (s->dist->bf16_shadow) m->be->bf16_shadow(m->params, m->t.ltotal);
}

double step_bubble(const StepStats *r) {
    if (r->stages <= 1) return 0;
    double span = 0, busy = 0;
    for (int k = 0; k < r->stages; k++) {
        busy += r->stage_idle[2 * k + 1] - r->stage_idle[2 * k];
        if (r->stage_idle[2 * k + 1] > span) span = r->stage_idle[2 * k + 1];
    }
    return span > 0 ? 1 - busy / (span * r->stages) : 0;
}

void step_run(StepCtx *s, int step, uint64_t seq_pos, StepStats *r) {
    Model *m = s->m;
    int64_t *counts = r->counts;
    memset(r, 0, sizeof *r);
    r->counts = counts;
    memset(counts, 0, sizeof(int64_t) * config_all_layers(&m->c) * m->c.n_experts);
    model_zero_grads(m); // (the routed experts' gradients: written by their first backward instead)
    model_scope_reset(m);
    s->pipe.idle_s = 0;
    int n = 3 + 2 * s->sched.vpp;
    double t0 = now_seconds(), c0 = cpu_seconds(), *mine = s->gathered + (size_t)s->sched.stages * n;
    memset(mine, 0, sizeof(double) * n);
    for (int i = 0; i < s->sched.n; i++) {
        const Action *a = &s->sched.a[i];
        double a0 = now_seconds(), idle0 = s->pipe.idle_s;
        if (a->kind == ACT_FORWARD) micro_forward(s, step, seq_pos, a, r);
        else micro_backward(s, a, s->arm_at[i]);
        mine[3 + 2 * a->chunk + a->kind] += now_seconds() - a0 - (s->pipe.idle_s - idle0);
    }
    pipe_flush(&s->pipe);
    model_grads_settle(m);
    mine[0] = s->pipe.idle_s;
    mine[1] = now_seconds() - t0;
    mine[2] = cpu_seconds() - c0;
    gather_stages(s, r, mine);
    update(s, step, r);
    if (m->c.balance == BALANCE_AUX_FREE && !r->skipped) route_bias_step(s, r);
}
