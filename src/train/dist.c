// dist.c — gradient reduction, global norm and full-tensor assembly over the mesh (see dist.h).
#include "train/dist.h"
#include <string.h>
#include <math.h>
#include "core/common.h"

void dist_init(Dist *d, const Mesh *mesh) {
    memset(d, 0, sizeof *d);
    d->mesh = mesh;
    d->mm.sl = (ParamSlicing){1, 0, 1, 0, 1, 0};
    if (!mesh) return;
    d->mm.tp = mesh->tp; d->mm.dp = mesh->dp; d->mm.ep = mesh->ep; d->mm.etp = mesh->etp;
    d->mm.edp = mesh->edp; d->mm.stage = mesh->stage;
    d->mm.sl = (ParamSlicing){mesh->s.tp, mesh->me.tp, mesh->s.ep, mesh->me.ep, mesh->s.etp, mesh->me.etp};
}

int dist_rank0(const Dist *d) { return !d->mesh || d->mesh->rank == 0; }

static const Comm *group_of(const Dist *d, ReduceGroup g) {
    if (!d->mesh) return NULL;
    return g == RED_DP ? d->mesh->dp : g == RED_EDP ? d->mesh->edp : d->mesh->stage;
}

void dist_reduce_grads(const Dist *d, const Model *m) {
    if (!d->mesh) return;
    const ParamTable *t = &m->t;
    // contiguous runs of tensors sharing a group
    int i = 0;
    while (i < t->n) {
        if (!t->p[i].lnumel) { i++; continue; }
        ReduceGroup g = t->p[i].reduce;
        size_t start = t->p[i].loffset, n = 0;
        while (i < t->n && (!t->p[i].lnumel || t->p[i].reduce == g)) { n += t->p[i].lnumel; i++; }
        const Comm *c = group_of(d, g);
        if (c && c->size > 1) comm_allreduce(c, m->grads + start, n, CT_F32);
    }
}

double dist_grad_norm(const Dist *d, const Model *m) {
    const ParamTable *t = &m->t;
    // rep: whole tensors replicated everywhere; tp: dense shards (sum over TP); ex: expert shards
    // (sum over ETP and EP; EDP replicas are equal)
    double rep = 0, tp = 0, ex = 0;
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *s = &t->p[i];
        if (!s->lnumel) continue;
        double v = m->be->sumsq(m->grads + s->loffset, s->lnumel);
        if (s->expert >= 0) ex += v;
        else if (s->split_dim >= 0) tp += v;
        else rep += v;
    }
    if (d->mesh) {
        comm_allreduce(d->mesh->tp, &tp, 1, CT_F64);
        comm_allreduce(d->mesh->etp, &ex, 1, CT_F64);
        comm_allreduce(d->mesh->ep, &ex, 1, CT_F64);
    }
    return sqrt(rep + tp + ex);
}

void dist_gather_full(const Dist *d, const ParamTable *t, const float *local, float *full) {
    memset(full, 0, t->total * sizeof(float));
    if (!d->mesh) { params_local_to_full(t, local, full); return; }
    // each slice is contributed once: replicated tensors by stage rank 0, TP shards by DP rank 0,
    // expert shards by EDP rank 0; the world sum then holds every element exactly once
    const MeshCoord *me = &d->mesh->me;
    ParamTable own = *t;
    own.p = xmalloc(sizeof(ParamSpec) * t->n);
    for (int i = 0; i < t->n; i++) {
        own.p[i] = t->p[i];
        const ParamSpec *s = &t->p[i];
        int mine = s->expert >= 0 ? me->edp == 0 : s->split_dim >= 0 ? me->dp == 0 : me->stage == 0;
        if (me->pp != 0) mine = 0;
        if (!mine) own.p[i].lnumel = 0;
    }
    params_local_to_full(&own, local, full);
    free(own.p);
    comm_allreduce(d->mesh->world, full, t->total, CT_F32);
}

double dist_mean_dp(const Dist *d, double v) {
    if (!d->mesh || d->mesh->s.dp == 1) return v;
    comm_allreduce(d->mesh->dp, &v, 1, CT_F64);
    return v / d->mesh->s.dp;
}

#include <zlib.h>
static uint32_t crc_of(const float *p, size_t n) { return (uint32_t)crc32(0L, (const Bytef *)p, (uInt)(n * sizeof(float))); }

// 1 if all ranks of c hold the same value v, else 0
static int all_same(const Comm *c, uint32_t v) {
    int n = c ? c->size : 1;
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
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *s = &t->p[i];
        if (!s->lnumel) continue;
        uint32_t c = crc_of(m->params + s->loffset, s->lnumel);
        if (s->expert >= 0) ex = ex * 31 + c;
        else if (s->split_dim >= 0) tp = tp * 31 + c;
        else rep = rep * 31 + c;
    }
    int bad = 0;
    const Mesh *me = d->mesh;
    if (!all_same(me->world, rep)) { bad++; if (out) fprintf(out, "replica check: replicated tensors (router, norms, embeddings) differ across ranks\n"); }
    if (!all_same(me->dp, tp)) { bad++; if (out) fprintf(out, "replica check: TP shards differ across DP ranks\n"); }
    if (!all_same(me->edp, ex)) { bad++; if (out) fprintf(out, "replica check: expert shards differ across EDP replicas\n"); }
    if (me->s.ep > 1) {
        // every pair of EP ranks must hold different expert weights
        int n = me->ep->size;
        int64_t *all = xmalloc(sizeof(int64_t) * n), mine = ex;
        comm_allgather(me->ep, &mine, all, 1, CT_I64);
        for (int i = 0; i < n; i++)
            for (int j = i + 1; j < n; j++)
                if (all[i] == all[j]) { bad++; if (out) fprintf(out, "replica check: EP ranks %d and %d hold identical experts\n", i, j); }
        free(all);
    }
    int64_t b = bad;
    comm_allreduce(me->world, &b, 1, CT_I64);
    return (int)b;
}
