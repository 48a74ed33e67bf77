// calibrate.c — the measurements behind `moe plan --calibrate` (calibrate.h says what each number is and
// at which shapes it is taken): backend ops timed at the model's shapes on zeroed buffers (a GEMM's time
// does not depend on its values), host overheads, copies and, with several ranks, the collectives.
// Must not hold: the profile's file format (hwprofile.c), the planner (plan.c).
#include "train/calibrate.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "core/common.h"
#include "ops/ops.h"
#include "parallel/mesh.h"
#include "train/cost.h"
#include "train/placement.h"

#define GIB 1073741824.0

typedef void (*CalOp)(void *ctx);

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

// Seconds one call of f takes: a warm-up call (the backend's scratch grows there), one timed call to size
// the rounds, then 5 rounds of 1 to 20 calls (about budget seconds in all), each round's calls queued and
// waited for once; the fastest round's mean (another process sharing the machine only adds time).
static double op_seconds(const Backend *be, CalOp f, void *ctx, double budget) {
    f(ctx);
    be->sync();
    double t0 = now_seconds();
    f(ctx);
    be->sync();
    double t1 = now_seconds() - t0, r[5];
    int reps = t1 > 0 ? (int)fmin(20, fmax(1, budget / 5 / t1)) : 20;
    for (int k = 0; k < 5; k++) {
        t0 = now_seconds();
        for (int i = 0; i < reps; i++) f(ctx);
        be->sync();
        r[k] = (now_seconds() - t0) / reps;
    }
    qsort(r, 5, sizeof *r, cmp_double);
    return r[0];
}

// A dense GEMM forward and backward (input and weight gradients), as a Linear layer runs it.
typedef struct {
    const Backend *be;
    float *x, *w, *y, *dx, *dw, *dy;
    int N, K, O;
} CalMm;
static void mm_step(void *a) {
    CalMm *m = a;
    m->be->matmul_fwd(m->y, m->x, m->w, m->N, m->K, m->O, 0);
    m->be->matmul_bwd(m->dx, m->dw, m->dy, m->x, m->w, m->N, m->K, m->O, GM_DW_WRITE);
}
static void mm_fwd(void *a) {
    CalMm *m = a;
    m->be->matmul_fwd(m->y, m->x, m->w, m->N, m->K, m->O, 0);
}

// The experts' fused grouped ops of one MoE layer, forward and backward (moe_experts.c's sequence).
typedef struct {
    const Backend *be;
    void *inp, *h1, *h3, *act, *dout, *dh1, *dh3;
    float *w1, *w3, *w2, *dw1, *dw3, *dw2, *out, *dinp;
    int64_t *off;
    int G, d, f;
} CalGrouped;
static void grouped_step(void *a) {
    CalGrouped *g = a;
    const Backend *be = g->be;
    be->grouped_swiglu_fwd(g->h1, g->h3, g->act, g->inp, g->w1, g->w3, g->off, g->G, g->d, g->f);
    be->grouped_down_fwd(g->out, g->act, g->w2, g->off, g->G, g->f, g->d);
    be->grouped_swiglu_bwd(g->dh1, g->dh3, g->dw2, g->dout, g->act, g->h1, g->h3, g->w2, g->off, g->G, g->f,
                           g->d, GM_DW_WRITE);
    be->grouped_matmul_bwd2(g->dinp, g->dw1, g->dw3, g->dh1, g->dh3, g->inp, g->w1, g->w3, g->off, g->G, g->d,
                            g->f, GM_DW_WRITE);
}

// Attention forward and backward over B sequences of T.
typedef struct {
    const Backend *be;
    void *q, *k, *v, *out;
    float *lse, *dq, *dk, *dv, *dout;
    int B, T, H, KV, hd;
} CalAttn;
static void attn_step(void *a) {
    CalAttn *t = a;
    t->be->attention_fwd(t->out, t->lse, t->q, t->k, t->v, t->B, t->T, t->H, t->KV, t->hd, 0, t->T);
    t->be->attention_bwd(t->dq, t->dk, t->dv, t->dout, t->out, t->lse, t->q, t->k, t->v, t->B, t->T, t->H,
                         t->KV, t->hd, 0, t->T, 0);
}

typedef struct {
    const Backend *be;
    float *p, *g, *m, *v;
    OptRuns *runs;
    int t;
} CalAdam;
static void adam_step(void *a) {
    CalAdam *s = a;
    s->be->adamw_runs(s->p, s->g, s->m, s->v, s->runs, 1.0f, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, ++s->t,
                      OPT_MIXED, 0);
}

static double budget_s(const Backend *be) { return be == backend_cpu() ? 0.1 : 0.3; }

// The dense rate: the projections of one layer (q, k, v, o), the router (weighted by the layers) and
// the LM head, forward and backward, their FLOPs over their time. Weights in one buffer, registered as
// the bf16 copy a training run keeps.
static double dense_rate(const Backend *be, const ModelConfig *c, int N) {
    int d = c->d_model, qd = c->n_heads * c->head_dim, kvd = c->n_kv_heads * c->head_dim;
    int K[5] = {d, d, d, qd, d}, O[5] = {qd, kvd, kvd, d, c->n_experts};
    double wsum = (double)c->vocab_size * d, L = c->n_layers;
    size_t xk = (size_t)(qd > d ? qd : d), yo = (size_t)c->vocab_size;
    for (int i = 0; i < 5; i++) {
        wsum += (double)K[i] * O[i];
        if ((size_t)O[i] > yo) yo = (size_t)O[i];
    }
    CalMm m = {be, NULL, NULL, NULL, NULL, NULL, NULL, N, 0, 0};
    m.x = be->alloc(sizeof(float) * N * xk);
    m.dx = be->alloc(sizeof(float) * N * xk);
    m.y = be->alloc(sizeof(float) * N * yo);
    m.dy = be->alloc(sizeof(float) * N * yo);
    float *wall = be->alloc(sizeof(float) * (size_t)wsum), *w = wall;
    m.dw = be->alloc(sizeof(float) * xk * yo); // (every weight's gradient: K <= xk, O <= yo)
    be->bf16_shadow(wall, (size_t)wsum);
    double flops = 0, secs = 0;
    for (int i = 0; i < 6; i++) {
        m.K = i < 5 ? K[i] : d;
        m.O = i < 5 ? O[i] : c->vocab_size;
        m.w = w;
        w += (size_t)m.K * m.O;
        double wt = i < 5 ? L : 1; // each layer's projections and router, the head once
        flops += wt * 6.0 * N * m.K * m.O;
        secs += wt * op_seconds(be, mm_step, &m, budget_s(be));
    }
    be->bf16_shadow(NULL, 0);
    be->free(wall);
    be->free(m.x), be->free(m.dx), be->free(m.y), be->free(m.dy), be->free(m.dw);
    return flops / secs / 1e12;
}

// A square GEMM's rate (S x S x S forward, its weight registered as a bf16 copy).
static double square_rate(const Backend *be) {
    int S = be == backend_cpu() ? 1024 : 8192;
    CalMm m = {be, NULL, NULL, NULL, NULL, NULL, NULL, S, S, S};
    size_t n = (size_t)S * S;
    m.x = be->alloc(sizeof(float) * n);
    m.w = be->alloc(sizeof(float) * n);
    m.y = be->alloc(sizeof(float) * n);
    be->bf16_shadow(m.w, n);
    double t = op_seconds(be, mm_fwd, &m, budget_s(be));
    be->bf16_shadow(NULL, 0);
    be->free(m.x), be->free(m.w), be->free(m.y);
    return 2.0 * n * S / t / 1e12;
}

// One grouped measurement: R rows over G groups of width f (experts of d x f); returns seconds, *flops.
static double grouped_once(const Backend *be, int R, int G, int d, int f, double *flops) {
    size_t hb = fmt_size(be->hid), W = (size_t)G * f * d;
    CalGrouped g = {.be = be};
    g.G = G, g.d = d, g.f = f;
    g.off = xmalloc(sizeof(int64_t) * (G + 1));
    for (int i = 0; i <= G; i++) g.off[i] = (int64_t)R * i / G;
    g.inp = be->alloc(hb * R * d), g.dout = be->alloc(hb * R * d);
    g.h1 = be->alloc(hb * R * f), g.h3 = be->alloc(hb * R * f), g.act = be->alloc(hb * R * f);
    g.dh1 = be->alloc(hb * R * f), g.dh3 = be->alloc(hb * R * f);
    g.out = be->alloc(sizeof(float) * R * d), g.dinp = be->alloc(sizeof(float) * R * d);
    float *wall = be->alloc(sizeof(float) * 3 * W), *dwall = be->alloc(sizeof(float) * 3 * W);
    g.w1 = wall, g.w3 = wall + W, g.w2 = wall + 2 * W;
    g.dw1 = dwall, g.dw3 = dwall + W, g.dw2 = dwall + 2 * W;
    be->bf16_shadow(wall, 3 * W);
    double t = op_seconds(be, grouped_step, &g, budget_s(be));
    be->bf16_shadow(NULL, 0);
    *flops = 18.0 * R * d * f;
    void *bufs[] = {g.inp, g.dout, g.h1, g.h3, g.act, g.dh1, g.dh3, g.out, g.dinp, wall, dwall};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
    free(g.off);
    return t;
}

// The grouped rate: one MoE layer's routed experts (k x N rows, balanced over E groups; fewer groups, each
// as large, where the weights would not fit in cap bytes) and the shared expert's N rows.
static double grouped_rate(const Backend *be, const ModelConfig *c, int N, int *groups) {
    double cap = be == backend_cpu() ? 2 * GIB : 24 * GIB, per = 6.0 * 4 * c->d_model * (double)c->d_ff;
    int G = c->n_experts;
    while (G > 1 && G * per > cap) G--;
    *groups = G;
    int R = (int)((long long)N * c->top_k * G / c->n_experts);
    double f1, f2 = 0, t = grouped_once(be, R, G, c->d_model, c->d_ff, &f1);
    // (each of the E / G slices of the layer runs as long as the one measured)
    double s = t * c->n_experts / G, fl = f1 * c->n_experts / G;
    if (c->n_shared_experts)
        s += grouped_once(be, N, 1, c->d_model, c->n_shared_experts * c->shared_d_ff, &f2);
    return (fl + f2) / s / 1e12;
}

// The attention rate at the planner's FLOPs (cost.h CostFlops.attn_scores, 3 x for forward + backward).
static double attention_rate(const Backend *be, const ModelConfig *c, int B, int T) {
    size_t hb = fmt_size(be->hid), N = (size_t)B * T, qd = (size_t)c->n_heads * c->head_dim,
           kvd = (size_t)c->n_kv_heads * c->head_dim;
    CalAttn a = {.be = be};
    a.B = B, a.T = T, a.H = c->n_heads, a.KV = c->n_kv_heads, a.hd = c->head_dim;
    a.q = be->alloc(hb * N * qd), a.out = be->alloc(hb * N * qd);
    a.k = be->alloc(hb * N * kvd), a.v = be->alloc(hb * N * kvd);
    a.lse = be->alloc(sizeof(float) * N * c->n_heads);
    a.dq = be->alloc(sizeof(float) * N * qd), a.dout = be->alloc(sizeof(float) * N * qd);
    a.dk = be->alloc(sizeof(float) * N * kvd), a.dv = be->alloc(sizeof(float) * N * kvd);
    double t = op_seconds(be, attn_step, &a, budget_s(be));
    void *bufs[] = {a.q, a.out, a.k, a.v, a.lse, a.dq, a.dout, a.dk, a.dv};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) be->free(bufs[i]);
    CostFlops fl;
    cost_flops(&fl, c, T);
    return 3.0 * N * fl.attn_scores / t / 1e12;
}

// AdamW over the model's parameter count (at most 2^28 elements on a GPU, 2^25 on the cpu), the weights
// registered as the bf16 copy (updated with them): 30 bytes an element (plan.c's count under mixed).
static double adamw_rate(const Backend *be, const ModelConfig *c) {
    CostParams cp;
    cost_params(&cp, c);
    size_t cap = be == backend_cpu() ? (size_t)1 << 25 : (size_t)1 << 28, n = cp.total < cap ? cp.total : cap;
    CalAdam s = {.be = be};
    s.p = be->alloc(sizeof(float) * n), s.g = be->alloc(sizeof(float) * n);
    s.m = be->alloc(sizeof(float) * n), s.v = be->alloc(sizeof(float) * n);
    OptRun run = {0, 0, (int64_t)n, 1, 0, 0, 0, 0, 0, OPTG_F32, 0};
    s.runs = be->runs_create(&run, 1);
    be->bf16_shadow(s.p, n);
    double t = op_seconds(be, adam_step, &s, budget_s(be));
    be->bf16_shadow(NULL, 0);
    be->runs_free(s.runs);
    be->free(s.p), be->free(s.g), be->free(s.m), be->free(s.v);
    return 30.0 * n / t / 1e9;
}

// The host's overheads: launch_us, the mean host time of issuing 256 one-element ops (queued); sync_us,
// the mean of 64 four-byte copies to the host, each after the queue drained. *pcie: a host-to-device copy
// of 256 MiB (64 MiB on the cpu), GB/s.
static void host_terms(const Backend *be, double *launch_us, double *sync_us, double *pcie) {
    float *y = be->alloc(64), *x = be->alloc(64), h[16];
    double issue = 0, sync = 0;
    for (int r = 0; r < 3; r++) { // the first round warms up; the last two count
        be->sync();
        double t0 = now_seconds();
        for (int i = 0; i < 256; i++) be->axpy(y, x, 1.0f, 1);
        if (r) issue += now_seconds() - t0;
        be->sync();
    }
    for (int i = 0; i < 65; i++) {
        be->sync();
        double t0 = now_seconds();
        be->to_host(h, y, 4);
        if (i) sync += now_seconds() - t0;
    }
    *launch_us = issue / 512 * 1e6;
    *sync_us = sync / 64 * 1e6;
    be->free(y), be->free(x);
    size_t S = be == backend_cpu() ? (size_t)64 << 20 : (size_t)256 << 20;
    char *host = xmalloc(S);
    memset(host, 1, S);
    void *dev = be->alloc(S);
    be->to_device(dev, host, S); // (warm-up: the pages mapped)
    be->sync();
    double t0 = now_seconds();
    for (int i = 0; i < 4; i++) be->to_device(dev, host, S);
    be->sync();
    *pcie = 4.0 * S / (now_seconds() - t0) / 1e9;
    be->free(dev);
    free(host);
}

// Physical memory and this process's resident set (the cpu backend's "GPU" and "context").
static void host_memory(double *total, double *resident) {
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    *total = pages > 0 && psz > 0 ? (double)pages * psz : 0;
    long rss = 0, size = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &size, &rss) != 2) rss = 0;
        fclose(f);
    }
    *resident = rss > 0 ? (double)rss * psz : 64.0 * 1048576;
}

typedef struct {
    const Comm *c;
    void *send, *recv;
    size_t *cnt, *dis;
    float *buf;
    size_t nred;
} CalLink;
static void a2a_step(void *a) {
    CalLink *l = a;
    comm_dev_alltoallv(l->c, l->send, l->cnt, l->dis, l->recv, l->cnt, l->dis, CT_BF16);
}
static void allreduce_step(void *a) {
    CalLink *l = a;
    comm_dev_allreduce(l->c, l->buf, l->nred, CT_F32);
}

// Collective op over the world, timed from a barrier to the last rank's end (the slowest rank's time).
static double link_seconds(const Backend *be, const Comm *w, CalOp f, void *ctx) {
    f(ctx); // warm-up
    be->sync();
    comm_barrier(w);
    double t0 = now_seconds();
    for (int i = 0; i < 5; i++) f(ctx);
    be->sync();
    comm_barrier(w);
    return (now_seconds() - t0) / 5;
}

// With several ranks: the all-to-all of one MoE layer's dispatched rows (k N rows of d bf16 values, spread
// evenly over the ranks) and an all-reduce of the gradients (at most 64 Mi floats; 8 Mi on the cpu), GB/s
// sent per rank.
static void link_rates(const Backend *be, const Placement *pl, const ModelConfig *c, int N, Comm *world,
                       double *a2a, double *ar) {
    int g = comm_size(world);
    MeshShape ms = {g, 1, 0, 1, 1, 1, 0, 0, 0};
    Mesh mesh;
    CHECK(!mesh_shape_resolve(&ms, NULL), "calibrate: a mesh of %d ranks", g);
    mesh_init(&mesh, &ms, world);
    if (pl->attach) mesh_enable_device(&mesh, pl->dev, pl->on_gpu);
    size_t per = ((size_t)N * c->top_k * c->d_model + g - 1) / g;
    CalLink l = {.c = mesh.world};
    l.cnt = xmalloc(sizeof(size_t) * g), l.dis = xmalloc(sizeof(size_t) * g);
    for (int r = 0; r < g; r++) l.cnt[r] = per, l.dis[r] = per * r;
    l.send = be->alloc(2 * per * g), l.recv = be->alloc(2 * per * g);
    *a2a = (g - 1.0) * per * 2 / link_seconds(be, mesh.world, a2a_step, &l) / 1e9;
    CostParams cp;
    cost_params(&cp, c);
    size_t cap = be == backend_cpu() ? (size_t)1 << 23 : (size_t)1 << 26;
    l.nred = cp.total < cap ? cp.total : cap;
    l.buf = be->alloc(sizeof(float) * l.nred);
    *ar = 2.0 * (g - 1) / g * 4.0 * l.nred / link_seconds(be, mesh.world, allreduce_step, &l) / 1e9;
    be->free(l.send), be->free(l.recv), be->free(l.buf);
    free(l.cnt), free(l.dis);
    mesh_free(&mesh);
}

void calibrate(HwProfile *p, CalibInfo *info, const ModelConfig *c, const TrainOptions *o,
               const HwProfile *base, Comm *world) {
    Placement pl;
    TrainOptions t = *o;
    if (prec_fp8(t.precision)) // (the base backend; its fp8 table measured apart)
        t.precision = t.precision == PREC_FP8 ? PREC_MIXED : PREC_BF16;
    placement_choose(&pl, &t, world);
    const Backend *be = pl.be;
    memset(info, 0, sizeof *info);
    snprintf(info->backend, sizeof info->backend, "%s", be->name);
    *p = *base;
    int B = o->batch / o->grad_accum, T = o->seq_len, N = B * T;
    size_t fr = 0, tot = 0;
    if (pl.on_gpu && backend_cuda_gpus(&fr, &tot) > 0 && tot > fr) {
        p->mem_bytes = (double)tot;
        p->context_bytes = (double)(tot - fr);
    } else host_memory(&p->mem_bytes, &p->context_bytes);
    host_terms(be, &p->launch_us, &p->sync_us, &p->pcie_gbps);
    p->dense_tflops = dense_rate(be, c, N);
    p->grouped_tflops = grouped_rate(be, c, N, &info->groups);
    p->fp8_grouped_tflops = grouped_rate(backend_fp8(be), c, N, &info->groups);
    p->attention_tflops = attention_rate(be, c, B, T);
    p->hbm_gbps = adamw_rate(be, c);
    p->peak_tflops =
        fmax(square_rate(be), fmax(p->dense_tflops, fmax(p->grouped_tflops, p->attention_tflops)));
    // the ranks' mean (each measured on its own device, at once: as a mesh's ranks run)
    int g = comm_size(world);
    double *dst[11] = {&p->mem_bytes,      &p->context_bytes,    &p->peak_tflops,       &p->dense_tflops,
                       &p->grouped_tflops, &p->attention_tflops, &p->hbm_gbps,          &p->pcie_gbps,
                       &p->launch_us,      &p->sync_us,          &p->fp8_grouped_tflops},
           v[11];
    for (int i = 0; i < 11; i++) v[i] = *dst[i];
    comm_allreduce(world, v, 11, CT_F64);
    for (int i = 0; i < 11; i++) *dst[i] = v[i] / g;
    if (g > 1) {
        link_rates(be, &pl, c, N, world, &info->a2a_gbps, &info->allreduce_gbps);
        double both[2] = {info->a2a_gbps, info->allreduce_gbps};
        comm_bcast(world, both, 2, CT_F64, 0); // (rank 0's clock timed the slowest rank)
        info->a2a_gbps = both[0], info->allreduce_gbps = both[1];
        info->links = comm_local_size() == g ? 1 : 2;
        *(info->links == 1 ? &p->nvlink_gbps : &p->internode_gbps) = fmin(both[0], both[1]);
    }
    snprintf(p->name, sizeof p->name, "calibrated-%s", be->name);
}

void calibrate_note(char *buf, size_t n, const CalibInfo *info, const ModelConfig *c, const TrainOptions *o,
                    const HwProfile *base, int world) {
    char links[256];
    if (info->links)
        snprintf(
            links, sizeof links,
            "%s_gbps: the slower of all-to-all %.3g and all-reduce %.3g GB/s over %d ranks; %s_gbps from "
            "%s",
            info->links == 1 ? "nvlink" : "internode", info->a2a_gbps, info->allreduce_gbps, world,
            info->links == 1 ? "internode" : "nvlink", base->name);
    else snprintf(links, sizeof links, "one rank: nvlink_gbps and internode_gbps from %s", base->name);
    snprintf(
        buf, n,
        "moe plan --calibrate on --device %s at %d x %d tokens a micro-batch (d %d, %d layers, %d experts "
        "of %d, %d run, top-%d, vocab %d); %s",
        info->backend, o->batch / o->grad_accum, o->seq_len, c->d_model, c->n_layers, c->n_experts, c->d_ff,
        info->groups, c->top_k, c->vocab_size, links);
}
