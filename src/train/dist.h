// dist.h — what the trainer does across the mesh with the parameter table: gradient reduction
// by each tensor's group (DP / stage / EDP), the global gradient norm counting every element once,
// and assembling full tensors from the ranks' slices (checkpoints) or slicing full ones (resume).
// Must not hold: the loop itself or file formats.
#pragma once
#include "model/model.h"
#include "parallel/mesh.h"

typedef struct {
    const Mesh *mesh;          // NULL: one process
    ModelMesh mm;              // the groups as the model sees them
} Dist;

void dist_init(Dist *d, const Mesh *mesh);
// Sum gradients over each tensor's reduction group (blocking).
void dist_reduce_grads(const Dist *d, const Model *m);
// Global L2 norm of the (reduced) gradients, identical on every rank.
double dist_grad_norm(const Dist *d, const Model *m);
// full (t.total floats, every rank) = the whole model assembled from every rank's local buffer.
void dist_gather_full(const Dist *d, const ParamTable *t, const float *local, float *full);
// Mean over the DP group of a per-rank value (e.g. each rank's mean loss over equal token counts).
double dist_mean_dp(const Dist *d, double v);
int dist_rank0(const Dist *d);

// Replica check (seed checklist): replicated tensors (router, norms, embeddings) bitwise equal on
// every rank; TP shards equal across DP; expert shards equal across EDP and different across EP.
// Returns the number of violations (identical on every rank); prints one line per failing kind.
int dist_check_replicas(const Dist *d, const Model *m, FILE *out);
