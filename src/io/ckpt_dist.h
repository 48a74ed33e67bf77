// ckpt_dist.h — checkpoints on a mesh: every rank writes only the slices it owns straight into the
// checkpoint's files (pwrite at offsets from the parameter table) and reads only the tensors it
// holds, so a run saved on one mesh resumes on any other. Must not hold: file formats (io/safetensors.c,
// checkpoint.c).
#pragma once
#include "model/params.h"
#include "parallel/comm.h"
#include "io/checkpoint.h"

// Collective over world. t: this rank's local table; params/m/v: its local host buffers (m and v in
// the local layout, ZeRO shards already gathered); own[i]: this rank writes tensor i's slice (each
// slice of the full model owned by exactly one rank). Rank 0 creates and commits the directory.
void ckpt_save_dist(const char *dir, const ModelConfig *c, const ParamTable *t, const float *params,
                    const float *m, const float *v, const unsigned char *own, const TrainState *st,
                    const Comm *world);
// Collective: rank 0 verifies the checksums first (a corrupt file ends every rank), then each rank
// reads the tensors it holds into its local host buffers. m, v may be NULL.
void ckpt_load_dist(const char *dir, const ParamTable *t, float *params, float *m, float *v, TrainState *st,
                    const Comm *world);
