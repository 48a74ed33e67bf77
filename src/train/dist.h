// dist.h — what the trainer does across the mesh with the parameter table: gradient buckets
// reduced over each tensor's group (DP / stage / EDP) as soon as backward finishes them
// (non-blocking, overlapped with the rest of backward), ZeRO-1/2 (optimizer moments, and with
// stage 2 the reduced gradients, sharded over the group), the global gradient norm counting
// every element once, AdamW over this rank's shard, and full-tensor assembly for checkpoints.
// Must not hold: the loop itself or file formats.
#pragma once
#include "io/ckpt_dist.h"
#include <stdio.h>
#include "model/model.h"
#include "parallel/mesh.h"

// A bucket: a contiguous run of this rank's flat buffer, tensors of one layer and one group.
typedef struct {
    size_t off, n; // elements [off, off+n) of the local flat buffers
    ReduceGroup g;
    int layer; // n_layers + mtp_depth: LM head + final norm; -1: embedding
    size_t s0, s1; // the part of [0, n) this rank updates (ZeRO >= 1), else [0, n)
    size_t moff; // where that part's moments start
    float *tmp; // ZeRO-2 reduce-scatter landing buffer (s1 - s0; backend memory)
    CommReq *req; // in flight
    int started;
    OptRuns *opt; // ZeRO >= 1: the AdamW runs of this bucket (updated, then gathered)
} GradBucket;

typedef struct {
    const Mesh *mesh; // NULL: one process
    ModelMesh mm; // the groups as the model sees them
    int zero, overlap;
    size_t bucket_elems;
    GradBucket *b;
    int nb;
    size_t *counts; // 2 x the largest group's size: a bucket's shard counts and displacements (ZeRO)
    const Backend *be;
    void *m1, *m2; // AdamW moments of the elements this rank updates (backend memory): float32,
                   // or bf16 (uint16_t) under the bf16 policy (prec)
    int prec; // adamw_runs' precision policy (ops.h OPT_*), set before dist_attach
    uint64_t seed; // its stochastic rounding's seed
    size_t mom_n;
    OptRuns *opt_all; // ZeRO 0: the AdamW runs of every bucket (one launch per step)
    OptRuns *norm_runs; // the grad-norm runs: one per tensor (ZeRO-2: per tensor and bucket shard)
    int norm_ncls; // their classes: 3 norm classes (ZeRO-2: 3 groups x 3 classes)
    OptRuns *norm_rest; // dist_use_ledger: the norm runs of every tensor but the routed experts' (else NULL)
    int ledger_blocks; // ... and how many routed-expert tensors the ledger holds a sum of each step
    int ledger_used, ledger_missed; // norms taken with the ledger, and without it (it did not hold them all)
    double wait_s; // time the last step spent waiting for gradient reductions
    int bf16_shadow; // the trainer keeps the GEMMs' bf16 copy of the weights (ops.h): refresh it
                     // after ZeRO's parameter all-gathers
} Dist;

// zero: 0, 1 or 2; overlap: start bucket reductions during backward; bucket_bytes: bucket size cap.
void dist_init(Dist *d, const Mesh *mesh, int zero, int overlap, size_t bucket_bytes);
// The precision policy (ops.h OPT_MIXED, OPT_BF16_NEAREST, OPT_BF16_STOCHASTIC) and the seed of its
// stochastic rounding, before dist_attach (default: OPT_MIXED). Bytes per moment element: 4 or 2.
void dist_set_precision(Dist *d, int prec, uint64_t seed);
size_t dist_moment_bytes(const Dist *d);
// Lay the buckets and allocate the moments for this model (after model_init).
void dist_attach(Dist *d, Model *m);
void dist_free(Dist *d);
// Arms the overlap hook on the model for the coming backward (the last micro-batch of a step, on
// each of the rank's chunks), and disarms it after (a chunk's earlier backwards must not start the
// reductions of its layers).
void dist_arm(Dist *d, Model *m);
void dist_disarm(Model *m);
// Starts what is not yet started, waits for every bucket; grads then hold the reduced values
// (ZeRO-2: only on this rank's shards).
void dist_finish_grads(Dist *d, Model *m);
// Global L2 norm of the reduced gradients (all pipeline stages), identical on every rank.
double dist_grad_norm(Dist *d, const Model *m);
// The norm with the routed experts' sums of squares from the backend's gradient ledger (model_set_dw_sumsq:
// set on the model first; no ZeRO, after dist_attach; on ranks, those that reduce no expert gradient): the
// other tensors' runs are read, and the ledger stands for the experts' class where it holds exactly one sum
// per routed-expert tensor (else, as in a step whose layers ran their experts in chunks, the experts'
// gradients are read as without it; each rank decides alone and takes part in the same reductions). On the
// cpu the same bits as without it (ops.h dw_sumsq_take's order).
void dist_use_ledger(Dist *d, const Model *m);
// Clip by `scale` (1 = none), AdamW on this rank's shards, then all-gather the updated parameters.
// The clip is folded into the update (g * scale rounded to float, as a separate scaling pass would
// give); the gradient buffer itself is left unscaled (nothing reads it before the next step zeroes it).
// One multi-tensor launch per step (ZeRO 0), or per bucket followed by its gather (ZeRO 1/2).
void dist_adamw(Dist *d, Model *m, float scale, float lr, float b1, float b2, float eps, float wd, int t);
// The moments m1 (which 0) or m2 (1) for a checkpoint, in the local flat layout, a bucket at a time
// (io/ckpt_dist.h CkptSource: each window one bucket in host memory, every rank's ZeRO shards gathered
// over the bucket's group, so no full copy is made), and back from local elements [lo, lo + n) of either as a
// checkpoint is read (src: their values; my shards' part of them kept). Always
// float32 here: bf16 moments are widened (exact) and rounded back to nearest even (so a checkpoint stays
// float32 on disk in every policy). Elements in no bucket (none today) would be saved as zeros.
CkptSource dist_moment_source(const Dist *d, int which);
void dist_moments_set(Dist *d, int which, size_t lo, size_t n, const float *src);
// Does this rank write tensor s's slice into checkpoints? (Every slice of the full model has
// exactly one owner.)
int dist_owned(const Dist *d, const ParamSpec *s);
// Mean over the DP group of a per-rank value (e.g. each rank's mean loss over equal token counts).
double dist_mean_dp(const Dist *d, double v);
// Replica check (seed checklist): replicated tensors (router, norms, embeddings) bitwise equal on
// every rank; TP shards equal across DP; expert shards equal across EDP and different across EP.
// Returns the number of violations (identical on every rank); prints one line per failing kind.
int dist_check_replicas(const Dist *d, const Model *m, FILE *out);
