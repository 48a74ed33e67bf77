// mesh.h — the parallel layout: world = PP x DP x TP (TP fastest); inside a pipeline stage the
// same TP*DP ranks are folded again for the experts as EDP x EP x ETP (ETP fastest). EP is carved
// out of the data-parallel ranks and need not equal DP; EDP = replicas of each expert.
// Groups: tp, dp, ep, etp, edp, stage (all TP*DP ranks of a stage), pp.
// Must not hold: anything about tensors or the model beyond the divisibility checks.
#pragma once
#include <stdio.h>
#include "core/config.h"
#include "parallel/comm.h"

typedef struct {
    int world, tp, dp, pp, ep, etp, edp;
    int hier; // > 1: the EP all-to-all is two-level over nodes of `hier` EP ranks (groups epn, epx)
    int vocab; // 1: the embedding and the LM head split over TP by vocabulary rows (--vocab-parallel:
               // model/vocab.h; params.h ParamSlicing.vocab)
} MeshShape;

typedef struct {
    int tp, dp, pp, ep, etp, edp,
        stage; // this rank's index in each dimension (stage: index in the stage group)
} MeshCoord;

typedef struct {
    MeshShape s;
    MeshCoord me;
    int rank;
    Comm *world, *tp, *dp, *pp, *ep, *etp, *edp, *stage;
    Comm *epn, *epx; // hier > 1: the EP ranks of my node (ep / hier equal), of my local index
                     // (ep % hier equal); NULL otherwise
} Mesh;

// Fills shape->dp and ->edp from world, tp, pp, ep, etp. Returns NULL if the layout is possible
// for the model (c may be NULL to check only the mesh), else a static message naming the numbers.
const char *mesh_shape_resolve(MeshShape *shape, const ModelConfig *c);
// Coordinates of a rank in a resolved shape.
MeshCoord mesh_coord(const MeshShape *s, int rank);
// Builds the groups over world (whose size must equal s->world).
void mesh_init(Mesh *m, const MeshShape *s, Comm *world);
// How the device buffers of a mesh travel (--gpu-comm): NCCL communicators (every rank its own GPU;
// the pipeline group's point-to-point staged), the staged transport (ranks sharing a GPU, no NCCL),
// device pointers to a CUDA-aware MPI, or ipc (every rank on one node: the all-to-all-v device to device
// through CUDA IPC, the rest staged).
typedef enum { MESH_DEV_NCCL, MESH_DEV_STAGED, MESH_DEV_DIRECT, MESH_DEV_IPC } MeshDev;
// Attaches the device transport to the world and every group (the cuda backend must already have
// selected this rank's GPU; on_gpu 0: the cpu backend's host buffers, staged or direct only, for tests).
// Collective.
void mesh_enable_device(Mesh *m, MeshDev how, int on_gpu);
// Frees the groups and the device communicators (the world keeps its host ops).
void mesh_free(Mesh *m);
// One line per group kind listing its groups, e.g. "tp: {0,1} {2,3}" (for moe info).
void mesh_print(const MeshShape *s, FILE *f);
