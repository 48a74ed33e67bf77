// placement.h — where a run's ranks compute and how their device buffers travel: the compute backend
// (--device and the environment's switches), the device transport of a mesh (--gpu-comm: nccl, staged
// or mpi, chosen alike on every rank, the choice and its reason printed once), and whether the ranks
// that share a GPU fit in its memory (checked before the model allocates, with the numbers).
// Must not hold: the mesh's groups (parallel/mesh.c), the run's steps (trainer.c).
#pragma once
#include "core/config.h"
#include "ops/ops.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"
#include "train/options.h"

typedef struct {
    const Backend *be; // wrapped for MOE_PROFILE=1
    int meshed; // run the mesh's code paths (several ranks, or MOE_FORCE_NCCL=1 with one)
    int profile, bf16_shadow; // MOE_PROFILE=1; keep the GEMMs' bf16 copy of the weights
    int on_gpu;
    int attach; // a device transport is attached to the mesh (dev)
    MeshDev dev;
    char why[256]; // "gpu-comm: staged (...)": the choice and its reason (empty: none)
    char threads[256]; // cpu backend, moe's wait policy: "threads: ..." (OpenMP's count and wait); or empty
} Placement;

// Checks the backend, the environment and --gpu-comm, and chooses (collective over world when it has
// several ranks: every rank makes the same choice). Dies with one message naming the problem.
void placement_choose(Placement *p, const TrainOptions *o, const Comm *world);
// The ranks on each GPU fit: the bytes `moe info` counts for each rank's stage plus a CUDA context each,
// summed over the ranks sharing a GPU, against that GPU's memory. Collective; dies naming the numbers.
void placement_check_memory(const Placement *p, const ModelConfig *c, const TrainOptions *o,
                            const MeshShape *ms, const Comm *world);
