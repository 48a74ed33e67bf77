// dist.c — gradient reduction, global norm and full-tensor assembly over the mesh (see dist.h).
#include "train/dist.h"
#include <string.h>
#include <math.h>
#include "core/common.h"

void dist_init(Dist *d, const Mesh *mesh, int zero, int overlap, size_t bucket_bytes) {
    memset(d, 0, sizeof *d);
    d->mesh = mesh;
    d->zero = mesh ? zero : 0;
    d->overlap = overlap;
    d->bucket_elems = bucket_bytes / sizeof(float);
    if (d->bucket_elems < 1024) d->bucket_elems = 1024;
    d->mm.sl = (ParamSlicing){1, 0, 1, 0, 1, 0, NULL, 0, 0};
    if (!mesh) return;
    d->mm.tp = mesh->tp;
    d->mm.dp = mesh->dp;
    d->mm.ep = mesh->ep;
    d->mm.etp = mesh->etp;
    d->mm.edp = mesh->edp;
    d->mm.stage = mesh->stage;
    d->mm.epn = mesh->epn;
    d->mm.epx = mesh->epx;
    d->mm.sl = (ParamSlicing){mesh->s.tp,   mesh->me.tp, mesh->s.ep,  mesh->me.ep,  mesh->s.etp,
                              mesh->me.etp, NULL,        mesh->me.pp, mesh->s.vocab};
}

static const Comm *group_of(const Dist *d, ReduceGroup g) {
    if (!d->mesh) return NULL;
    return g == RED_DP ? d->mesh->dp : g == RED_EDP ? d->mesh->edp : d->mesh->stage;
}

static int layer_key(const ParamSpec *s, int L) {
    if (s->role == PR_EMBED) return -1;
    if (s->role == PR_LM_HEAD || s->role == PR_FINAL_NORM) return L;
    return s->layer;
}

// class of a tensor for the norm: 0 replicated everywhere, 1 TP shard (sum over TP), 2 expert shard
static int norm_class(const ParamSpec *s) { return s->expert >= 0 ? 2 : s->split_dim >= 0 ? 1 : 0; }

typedef struct {
    OptRun *r;
    int n, cap;
} RunList;
static OptRun *run_add(RunList *l, size_t off, size_t moff, size_t n, int decay, int cls) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->r = xrealloc(l->r, sizeof(OptRun) * l->cap);
    }
    l->r[l->n] = (OptRun){(int64_t)off, (int64_t)moff, (int64_t)n, decay, cls, 0, 0, 0, 0, OPTG_F32, 0};
    return &l->r[l->n++];
}
// The format the run's gradient is read in (the model's: OptRun gbf, gb), for a run inside tensor s.
static OptRun *run_format(OptRun *r, const Model *m, const ParamSpec *s) {
    r->gbf = model_grad_format(m, s, &r->gb);
    return r;
}

// Where the run starting at local element a of tensor s lies in the full model (OptRun's gidx, gcols,
// lcols, col0: the global index that the bf16 policy's stochastic rounding hashes), by the slicing of
// params_slice_runs: a block of columns (TP/ETP column splits) is one piece per row.
static void run_global(OptRun *r, const ParamSpec *s, size_t a) {
    size_t j = a - s->loffset;
    if (s->split_dim == 1 && s->lshape[1] != s->shape[1]) {
        int64_t lc = s->lshape[1];
        r->lcols = (int32_t)lc;
        r->col0 = (int32_t)((int64_t)j % lc);
        r->gcols = s->shape[1];
        r->gidx = (int64_t)s->offset + ((int64_t)j / lc) * s->shape[1] + s->split_start + r->col0;
        return;
    }
    size_t start = s->split_dim == 0 ? (size_t)s->split_start * (s->ndim == 2 ? (size_t)s->shape[1] : 1) : 0;
    r->gidx = (int64_t)(s->offset + start + j);
}

// The AdamW runs of bucket b: the pieces of its tensors inside the part this rank updates, in table
// order; moments at b->moff + (offset - start of that part).
static void bucket_runs(const GradBucket *b, const Model *m, RunList *l) {
    const ParamTable *tb = &m->t;
    size_t lo = b->off + b->s0, hi = b->off + b->s1;
    for (int i = 0; i < tb->n; i++) {
        const ParamSpec *s = &tb->p[i];
        size_t a = s->loffset > lo ? s->loffset : lo,
               e = s->loffset + s->lnumel < hi ? s->loffset + s->lnumel : hi;
        if (a < e) run_global(run_format(run_add(l, a, b->moff + (a - lo), e - a, s->decay, 0), m, s), s, a);
    }
}

// The optimizer's run lists, built once (they do not change between steps): AdamW per step (ZeRO 0)
// or per bucket (ZeRO 1/2: each bucket is gathered after its update), and the grad norm's, in the
// order the per-tensor sums were always taken (so the cpu result is unchanged).
static void build_runs(Dist *d, Model *m) {
    const ParamTable *t = &m->t;
    const Backend *be = m->be;
    RunList l = {0};
    if (!d->zero) {
        for (int k = 0; k < d->nb; k++) bucket_runs(&d->b[k], m, &l);
        d->opt_all = be->runs_create(l.r, l.n);
    } else {
        for (int k = 0; k < d->nb; k++) {
            l.n = 0;
            bucket_runs(&d->b[k], m, &l);
            d->b[k].opt = be->runs_create(l.r, l.n);
        }
    }
    l.n = 0;
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *s = &t->p[i];
        if (!s->lnumel) continue;
        if (d->zero != 2) {
            run_format(run_add(&l, s->loffset, 0, s->lnumel, 0, norm_class(s)), m, s);
            continue;
        }
        // ZeRO-2: only my shard of each bucket holds reduced values; class = group * 3 + norm class
        for (int k = 0; k < d->nb; k++) {
            const GradBucket *b = &d->b[k];
            size_t lo = b->off + b->s0, hi = b->off + b->s1;
            size_t a = s->loffset > lo ? s->loffset : lo,
                   e = s->loffset + s->lnumel < hi ? s->loffset + s->lnumel : hi;
            if (a < e) run_format(run_add(&l, a, 0, e - a, 0, (int)b->g * 3 + norm_class(s)), m, s);
        }
    }
    d->norm_ncls = d->zero == 2 ? 9 : 3;
    d->norm_runs = be->runs_create(l.r, l.n);
    free(l.r);
}

void dist_attach(Dist *d, Model *m) {
    const ParamTable *t = &m->t;
    int L = config_all_layers(&m->c), cap = 0; // (the head's key: after the MTP modules' layers)
    for (int i = 0; i < t->n;) {
        const ParamSpec *s = &t->p[i];
        if (!s->lnumel) {
            i++;
            continue;
        }
        ReduceGroup g = s->reduce;
        int key = layer_key(s, L);
        size_t off = s->loffset, n = 0;
        while (i < t->n && (!t->p[i].lnumel || (t->p[i].reduce == g && layer_key(&t->p[i], L) == key))) {
            n += t->p[i].lnumel;
            i++;
        }
        for (size_t o = 0; o < n; o += d->bucket_elems) {
            if (d->nb == cap) {
                cap = cap ? 2 * cap : 64;
                d->b = xrealloc(d->b, sizeof(GradBucket) * cap);
            }
            GradBucket *b = &d->b[d->nb++];
            memset(b, 0, sizeof *b);
            b->off = off + o;
            b->n = n - o < d->bucket_elems ? n - o : d->bucket_elems;
            b->g = g;
            b->layer = key;
            const Comm *c = group_of(d, g);
            int S = d->zero ? comm_size(c) : 1, r = d->zero ? comm_rank(c) : 0;
            b->s0 = b->n * r / S;
            b->s1 = b->n * (r + 1) / S;
            b->moff = d->mom_n;
            d->mom_n += b->s1 - b->s0;
            if (d->zero == 2) b->tmp = m->be->alloc(sizeof(float) * (b->s1 - b->s0 ? b->s1 - b->s0 : 1));
        }
    }
    int S = 1; // the largest group a bucket is reduced over
    for (int g = RED_DP; g <= RED_STAGE; g++)
        if (comm_size(group_of(d, (ReduceGroup)g)) > S) S = comm_size(group_of(d, (ReduceGroup)g));
    d->counts = xmalloc(sizeof(size_t) * 2 * S);
    d->be = m->be;
    size_t es = dist_moment_bytes(d);
    d->m1 = m->be->alloc(es * (d->mom_n ? d->mom_n : 1));
    d->m2 = m->be->alloc(es * (d->mom_n ? d->mom_n : 1));
    build_runs(d, m);
}

void dist_free(Dist *d) {
    for (int i = 0; i < d->nb; i++) {
        if (d->b[i].tmp) d->be->free(d->b[i].tmp);
        if (d->b[i].opt) d->be->runs_free(d->b[i].opt);
    }
    free(d->b);
    free(d->counts);
    d->counts = NULL;
    if (d->be) {
        d->be->free(d->m1);
        d->be->free(d->m2);
        if (d->opt_all) d->be->runs_free(d->opt_all);
        if (d->norm_runs) d->be->runs_free(d->norm_runs);
        if (d->norm_rest) d->be->runs_free(d->norm_rest);
    }
    d->opt_all = d->norm_runs = d->norm_rest = NULL;
    d->ledger_blocks = 0;
    d->b = NULL;
    d->nb = 0;
}

// rows of bucket b owned by each rank of its group (ZeRO-2 reduce-scatter counts)
static void shard_counts(const GradBucket *b, int S, size_t *counts) {
    for (int r = 0; r < S; r++) counts[r] = b->n * (r + 1) / S - b->n * r / S;
}

// gradients are backend buffers: device variants (on GPUs, NCCL on the communication stream
// while backward goes on)
static void start_bucket(Dist *d, Model *m, GradBucket *b) {
    b->started = 1;
    const Comm *c = group_of(d, b->g);
    if (!comm_dev_due(c)) return;
    float *g = m->grads + b->off;
    if (d->zero == 2) {
        shard_counts(b, comm_size(c), d->counts); // (the comm layer copies what it keeps)
        b->req = comm_dev_ireduce_scatter(c, g, b->tmp, d->counts, CT_F32);
    } else {
        b->req = comm_dev_iallreduce(c, g, b->n, CT_F32);
    }
}

typedef struct {
    Dist *d;
    Model *m;
} HookCtx;
static HookCtx hook_ctx;
static void on_ready(void *ctx, int layer) {
    HookCtx *h = ctx;
    for (int i = 0; i < h->d->nb; i++) {
        GradBucket *b = &h->d->b[i];
        if (!b->started && b->layer == layer) start_bucket(h->d, h->m, b);
    }
    // drive progress of what is in flight (MPI advances non-blocking collectives inside its calls)
    for (int i = 0; i < h->d->nb; i++)
        if (h->d->b[i].req) comm_test(h->d->b[i].req);
}

void dist_arm(Dist *d, Model *m) {
    if (!d->mesh || !d->overlap) return;
    hook_ctx.d = d;
    hook_ctx.m = m;
    m->grads_ready = on_ready;
    m->grads_ready_ctx = &hook_ctx;
}

void dist_disarm(Model *m) {
    m->grads_ready = NULL;
    m->grads_ready_ctx = NULL;
}

void dist_finish_grads(Dist *d, Model *m) {
    dist_disarm(m);
    double t0 = now_seconds();
    for (int i = 0; i < d->nb; i++)
        if (!d->b[i].started) start_bucket(d, m, &d->b[i]);
    for (int i = 0; i < d->nb; i++) {
        GradBucket *b = &d->b[i];
        if (b->req) {
            comm_wait(b->req);
            b->req = NULL;
        }
        if (d->zero == 2 && comm_dev_due(group_of(d, b->g)) && b->s1 > b->s0)
            m->be->copy(m->grads + b->off + b->s0, b->tmp, sizeof(float) * (b->s1 - b->s0));
        b->started = 0;
    }
    d->wait_s = now_seconds() - t0;
}

void dist_use_ledger(Dist *d, const Model *m) {
    CHECK(!d->zero && d->norm_runs && m->dw_sumsq,
          "dist_use_ledger: no ZeRO, after dist_attach, with "
          "model_set_dw_sumsq on");
    RunList l = {0};
    d->ledger_blocks = 0;
    for (int i = 0; i < m->t.n; i++) {
        const ParamSpec *s = &m->t.p[i];
        if (!s->lnumel) continue;
        if (params_routed(s)) d->ledger_blocks++; // (the tensors whose gradients the ledger sums)
        else run_format(run_add(&l, s->loffset, 0, s->lnumel, 0, norm_class(s)), m, s);
    }
    d->norm_rest = m->be->runs_create(l.r, l.n);
    free(l.r);
}

double dist_grad_norm(Dist *d, const Model *m) {
    double cls[3] = {0, 0, 0}, led = 0;
    // (a rank's own choice: either way it takes part in the same reductions below)
    int used = d->norm_rest && m->be->dw_sumsq_take(&led) == d->ledger_blocks;
    d->ledger_used += used;
    d->ledger_missed += d->norm_rest && !used;
    if (used) {
        m->be->sumsq_runs(cls, 3, m->grads, d->norm_rest);
        cls[2] += led; // (after any other tensor of the experts' class: norm_class)
    } else if (d->zero == 2) {
        // only my shard of each bucket holds reduced values: sum the shards over each group
        double per[3][3]; // [group][class]
        m->be->sumsq_runs(&per[0][0], 9, m->grads, d->norm_runs);
        for (int g = 0; g < 3; g++) {
            comm_allreduce(group_of(d, (ReduceGroup)g), per[g], 3, CT_F64);
            for (int c = 0; c < 3; c++) cls[c] += per[g][c];
        }
    } else {
        m->be->sumsq_runs(cls, 3, m->grads, d->norm_runs);
    }
    if (d->mesh) {
        comm_allreduce(d->mesh->tp, &cls[1], 1, CT_F64);
        comm_allreduce(d->mesh->etp, &cls[2], 1, CT_F64);
        comm_allreduce(d->mesh->ep, &cls[2], 1, CT_F64);
        if (d->mesh->s.pp > 1)
            comm_allreduce(d->mesh->pp, cls, 3, CT_F64); // each stage holds its own tensors
    }
    return sqrt(cls[0] + cls[1] + cls[2]);
}

// all-gather bucket b's shards of buf over its group (in place); buf is a backend buffer (dev)
// or host memory
// at: the bucket's first element (its shard at at + s0; every rank's shard lands at its place)
static int gather_bucket(const Dist *d, const GradBucket *b, float *at, int dev) {
    const Comm *c = group_of(d, b->g);
    int S = comm_size(c);
    if (!d->zero || (dev ? !comm_dev_due(c) : S == 1)) return 0;
    size_t *cnt = d->counts, *dsp = cnt + S;
    shard_counts(b, S, cnt);
    for (int r = 0; r < S; r++) dsp[r] = b->n * r / S;
    if (dev) comm_dev_allgatherv(c, at + b->s0, b->s1 - b->s0, at, cnt, dsp, CT_F32);
    else comm_allgatherv(c, at + b->s0, b->s1 - b->s0, at, cnt, dsp, CT_F32);
    return 1;
}

void dist_set_precision(Dist *d, int prec, uint64_t seed) {
    CHECK(!d->m1, "dist_set_precision after dist_attach");
    d->prec = prec;
    d->seed = seed;
}

size_t dist_moment_bytes(const Dist *d) { return d->prec == OPT_MIXED ? sizeof(float) : sizeof(uint16_t); }

void dist_adamw(Dist *d, Model *m, float scale, float lr, float b1, float b2, float eps, float wd, int t) {
    if (!d->zero) {
        m->be->adamw_runs(m->params, m->grads, d->m1, d->m2, d->opt_all, scale, lr, b1, b2, eps, wd, t,
                          d->prec, d->seed);
        return;
    }
    int gathered = 0;
    for (int k = 0; k < d->nb; k++) {
        GradBucket *b = &d->b[k];
        m->be->adamw_runs(m->params, m->grads, d->m1, d->m2, b->opt, scale, lr, b1, b2, eps, wd, t, d->prec,
                          d->seed);
        gathered |= gather_bucket(d, b, m->params + b->off, 1);
    }
    // the collectives wrote other ranks' shards into params behind the backend's back: refresh the
    // GEMMs' bf16 copy of the weights (ops.h bf16_shadow) if the trainer keeps one
    if (gathered && d->bf16_shadow) m->be->bf16_shadow(m->params, m->t.ltotal);
}

// A shard of moments to host float32 (bf16 policy: widened, exact) and back (bf16: rounded to nearest
// even, which keeps a bf16 value; a float32 checkpoint's moments are rounded once).
static void moment_to_host(const Dist *d, float *dst, const void *src, size_t n) {
    if (d->prec == OPT_MIXED) {
        d->be->to_host(dst, src, sizeof(float) * n);
        return;
    }
    uint16_t *h = xmalloc(sizeof(uint16_t) * n + 1);
    d->be->to_host(h, src, sizeof(uint16_t) * n);
    for (size_t i = 0; i < n; i++) dst[i] = bf16_to_f32(h[i]);
    free(h);
}
static void moment_to_device(const Dist *d, void *dst, const float *src, size_t n) {
    if (d->prec == OPT_MIXED) {
        d->be->to_device(dst, src, sizeof(float) * n);
        return;
    }
    uint16_t *h = xmalloc(sizeof(uint16_t) * n + 1);
    for (size_t i = 0; i < n; i++) h[i] = bf16_rn_bits(src[i]);
    d->be->to_device(dst, h, sizeof(uint16_t) * n);
    free(h);
}

// One bucket of m1 (which 0) or m2 (1) into buf: this rank's shard, then every rank's gathered.
static void moment_window(const Dist *d, int which, int k, size_t *lo, size_t *n, float *buf) {
    const GradBucket *b = &d->b[k];
    size_t es = dist_moment_bytes(d);
    moment_to_host(d, buf + b->s0, (const char *)(which ? d->m2 : d->m1) + es * b->moff, b->s1 - b->s0);
    gather_bucket(d, b, buf, 0);
    *lo = b->off;
    *n = b->n;
}
static void m1_window(void *ctx, int k, size_t *lo, size_t *n, float *buf) {
    moment_window(ctx, 0, k, lo, n, buf);
}
static void m2_window(void *ctx, int k, size_t *lo, size_t *n, float *buf) {
    moment_window(ctx, 1, k, lo, n, buf);
}

CkptSource dist_moment_source(const Dist *d, int which) {
    CkptSource s = {d->nb, 1, which ? m2_window : m1_window, (void *)d};
    for (int k = 0; k < d->nb; k++)
        if (d->b[k].n > s.max) s.max = d->b[k].n;
    return s;
}

void dist_moments_set(Dist *d, int which, size_t lo, size_t n, const float *src) {
    size_t es = dist_moment_bytes(d), hi = lo + n;
    for (int k = 0; k < d->nb; k++) { // my shard of bucket k: local elements [off + s0, off + s1)
        const GradBucket *b = &d->b[k];
        size_t a = b->off + b->s0, e = b->off + b->s1;
        if (a < lo) a = lo;
        if (e > hi) e = hi;
        if (a >= e) continue;
        moment_to_device(d, (char *)(which ? d->m2 : d->m1) + es * (b->moff + (a - b->off - b->s0)),
                         src + (a - lo), e - a);
    }
}

int dist_owned(const Dist *d, const ParamSpec *s) {
    if (!s->lnumel) return 0;
    if (!d->mesh) return 1;
    // each slice has one owner: replicated tensors stage rank 0, TP shards DP rank 0, expert
    // shards EDP rank 0 (of the pipeline stage that holds the tensor)
    const MeshCoord *me = &d->mesh->me;
    return s->expert >= 0 ? me->edp == 0 : s->split_dim >= 0 ? me->dp == 0 : me->stage == 0;
}

double dist_mean_dp(const Dist *d, double v) {
    if (!d->mesh || d->mesh->s.dp == 1) return v;
    comm_allreduce(d->mesh->dp, &v, 1, CT_F64);
    return v / d->mesh->s.dp;
}

#include <zlib.h>
static uint32_t crc_of(const float *p, size_t n) {
    return (uint32_t)crc32(0L, (const Bytef *)p, (uInt)(n * sizeof(float)));
}

// 1 if all ranks of c hold the same value v, else 0
static int all_same(const Comm *c, uint32_t v) {
    int n = comm_size(c);
    int64_t *all = xmalloc(sizeof(int64_t) * n), mine = v;
    comm_allgather(c, &mine, all, 1, CT_I64);
    int same = 1;
    for (int i = 0; i < n; i++) same &= all[i] == all[0];
    free(all);
    return same;
}

int dist_check_replicas(const Dist *d, const Model *m, FILE *out) {
    if (!d->mesh) return 0;
    const ParamTable *t = &m->t;
    uint32_t rep = 0, tp = 0, ex = 0;
    float *ph = xmalloc(sizeof(float) * (t->ltotal ? t->ltotal : 1)); // params may live on a GPU
    m->be->to_host(ph, m->params, sizeof(float) * t->ltotal);
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *s = &t->p[i];
        if (!s->lnumel) continue;
        uint32_t c = crc_of(ph + s->loffset, s->lnumel);
        if (s->expert >= 0) ex = ex * 31 + c;
        else if (s->split_dim >= 0) tp = tp * 31 + c;
        else rep = rep * 31 + c;
    }
    free(ph);
    int bad = 0;
    const Mesh *me = d->mesh;
    if (!all_same(me->stage, rep)) {
        bad++;
        if (out)
            fprintf(out,
                    "replica check: replicated tensors (router, norms, embeddings) differ across ranks\n");
    }
    if (!all_same(me->dp, tp)) {
        bad++;
        if (out) fprintf(out, "replica check: TP shards differ across DP ranks\n");
    }
    if (!all_same(me->edp, ex)) {
        bad++;
        if (out) fprintf(out, "replica check: expert shards differ across EDP replicas\n");
    }
    if (me->s.ep > 1) {
        // every pair of EP ranks must hold different expert weights
        int n = comm_size(me->ep);
        int64_t *all = xmalloc(sizeof(int64_t) * n), mine = ex;
        comm_allgather(me->ep, &mine, all, 1, CT_I64);
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++)
                if (all[i] == all[j]) {
                    bad++;
                    if (out) fprintf(out, "replica check: EP ranks %d and %d hold identical experts\n", i, j);
                }
        free(all);
    }
    int64_t b = bad;
    comm_allreduce(me->world, &b, 1, CT_I64);
    return (int)b;
}
