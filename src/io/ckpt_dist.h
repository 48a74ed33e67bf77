// ckpt_dist.h — checkpoints on a mesh: every rank writes only the slices it owns straight into the
// checkpoint's files (pwrite at offsets from the parameter table) and reads only the tensors it
// holds, so a run saved on one mesh resumes on any other. Must not hold: file formats (io/safetensors.c,
// checkpoint.c).
#pragma once
#include "model/params.h"
#include "parallel/comm.h"
#include "io/checkpoint.h"

// This rank's values of one local flat buffer (its layout: t's offsets), handed over in windows so that
// no full copy is made: get(ctx, k, &lo, &n, buf) puts local elements [lo, lo + n) into buf (at most max
// of them; elements in no window are written as zeros). Every rank calls get for k = 0..nwin-1 in order
// (it may be collective, e.g. gathering ZeRO shards).
typedef struct {
    int nwin;
    size_t max;
    void (*get)(void *ctx, int k, size_t *lo, size_t *n, float *buf);
    void *ctx;
} CkptSource;

// Collective over world. t: this rank's local table; params/m/v: its local values (m, v NULL: no
// optimizer file; moments in the local layout, ZeRO shards gathered by the source); own[i]: this rank
// writes tensor i's slice (each slice of the full model owned by exactly one rank). Rank 0 creates and
// commits the directory.
void ckpt_save_dist(const char *dir, const ModelConfig *c, const ParamTable *t, const CkptSource *params,
                    const CkptSource *m, const CkptSource *v, const unsigned char *own, const TrainState *st,
                    const Comm *world);
// Where a checkpoint's values go as they are read, a tensor at a time (no full copy of the model is made):
// put(ctx, which, lo, n, src) hands over this rank's local elements [lo, lo + n) of the parameters (which 0),
// the first moments (1) or the second (2); src is the reader's scratch, which put may change.
typedef struct {
    void (*put)(void *ctx, int which, size_t lo, size_t n, float *src);
    void *ctx;
} CkptSink;

// Collective: rank 0 verifies the checksums first (a corrupt file ends every rank), then each rank
// reads the tensors it holds into sink; with_opt: the moments too.
void ckpt_load_dist(const char *dir, const ParamTable *t, const CkptSink *sink, int with_opt, TrainState *st,
                    const Comm *world);
