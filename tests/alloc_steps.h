// alloc_steps.h — for the allocation tests (test_alloc.c in one process, mpi_alloc.c on a mesh): a model
// built as `moe train` builds it (mesh, gradient reduction, model, step context, parameters) and a few
// training steps (train/step.h step_run), each step's host allocations (core/common.h alloc_count) and
// backend allocations (core/common.h alloc_count_backend) counted. Must not hold: the cases or the checks.
#pragma once
#include <stdio.h>
#include <string.h>
#include "core/common.h"
#include "model/params.h"
#include "parallel/mesh.h"
#include "train/step.h"

#define ALLOC_STEPS 3

// What each step allocated: host, backend.
typedef struct {
    uint64_t host[ALLOC_STEPS], dev[ALLOC_STEPS];
    double loss[ALLOC_STEPS];
} AllocSteps;

// ALLOC_STEPS training steps of config c with options o on backend be over world (its size: the mesh
// o->tp x o->ep x ..., as the trainer resolves it), with o's fixed exchange choices (--a2a-overlap,
// --expert-mode, --ampipe; no tuning), recomputation, ZeRO (o->zero, o->overlap, o->bucket_mb) and the
// balance (c.balance). Every allocation counts, the comm layer's included.
static inline AllocSteps alloc_steps_run(ModelConfig c, const TrainOptions *o, const Backend *be,
                                         Comm *world) {
    const char *bad = config_validate(&c);
    if (!bad) bad = train_options_validate(o, &c);
    CHECK(!bad, "alloc_steps_run: %s", bad);
    MeshShape shape = train_mesh_shape(o, comm_size(world));
    bad = mesh_shape_resolve(&shape, &c);
    CHECK(!bad, "alloc_steps_run: %s", bad);
    int meshed = comm_size(world) > 1;
    Dataset ds;
    data_open_split(&ds, NULL, NULL, o->val_frac, o->seed, o->seq_len);
    Mesh mesh;
    mesh_init(&mesh, &shape, world);
    if (meshed && (o->gpu_comm == GPUCOMM_STAGED || o->gpu_comm == GPUCOMM_IPC))
        mesh_enable_device(&mesh, o->gpu_comm == GPUCOMM_IPC ? MESH_DEV_IPC : MESH_DEV_STAGED,
                           be != backend_cpu());
    else if (meshed && be != backend_cpu()) mesh_enable_device(&mesh, MESH_DEV_NCCL, 1);
    Dist dist;
    dist_init(&dist, meshed ? &mesh : NULL, o->zero, o->overlap, (size_t)(o->bucket_mb * 1048576.0));
    dist_set_precision(&dist, OPT_MIXED, o->seed);
    Model m;
    model_init(&m, &c, be, o->batch / o->grad_accum / shape.dp, o->seq_len, meshed ? &dist.mm : NULL);
    model_set_expert_grads(&m, train_expert_grads(o, meshed));
    if (o->recompute) model_set_recompute(&m, o->recompute, o->recompute_layers);
    if (o->fp8_save) model_set_fp8_save(&m, 1);
    StepCtx st;
    step_init(&st, &m, &dist, &ds, o, &mesh);
    dist_attach(&dist, &m);
    for (int l = 0; l < c.n_layers; l++) { // the fixed choices of train/adapt.c (no tuning)
        if (o->a2a_overlap > 0) model_set_overlap(&m, l, o->a2a_overlap);
        if (o->expert_mode > 0) model_set_expert_mode(&m, l, MOE_GATHERED);
        if (o->ampipe > 0) model_set_ampipe(&m, l, o->ampipe);
    }
    size_t P = m.t.ltotal;
    float *ph = xmalloc(P * sizeof(float) + 1);
    params_init(&m.t, &c, ph, o->seed);
    be->to_device(m.params, ph, P * sizeof(float));
    free(ph);
    dist.bf16_shadow = 1; // the GEMMs' bf16 copy of the weights, as the trainer keeps it (a no-op on the cpu)
    be->bf16_shadow(m.params, m.t.ltotal);
    AllocSteps a;
    memset(&a, 0, sizeof a);
    StepStats r;
    memset(&r, 0, sizeof r);
    r.counts =
        xcalloc((size_t)config_all_layers(&c) * c.n_experts, sizeof(int64_t)); // (step.h: MTP rows too)
    for (int s = 0; s < ALLOC_STEPS; s++) {
        uint64_t h = alloc_count(), d = alloc_count_backend();
        step_run(&st, s, (uint64_t)s * o->batch, &r);
        a.host[s] = alloc_count() - h;
        a.dev[s] = alloc_count_backend() - d;
        a.loss[s] = r.loss;
    }
    free(r.counts);
    step_free(&st);
    dist_free(&dist);
    model_free(&m);
    mesh_free(&mesh);
    data_close(&ds);
    return a;
}
