// adapt.h — the MoE exchange's run-time choices for a run (Tutel's adaptivity): the overlap degree,
// the expert mode and AMPipe's chunks of every MoE layer, fixed by the options or measured (--a2a-overlap /
// --expert-mode auto: one Tuner per layer, fed the slowest rank's time so every rank chooses alike), and the
// two-level all-to-all's node size (--a2a-hier auto, from the hosts). Also what they log.
// Must not hold: the tuner's logic (train/tune.c), the exchange itself (moe/).
#pragma once
#include <cjson/cJSON.h>
#include "model/model.h"
#include "parallel/mesh.h"
#include "train/options.h"
#include "train/tune.h"

typedef struct {
    Tuner *tune; // (L) NULL unless some choice is auto; a candidate is r + 16 x expert mode
                 // + 256 x AMPipe chunks (when > 1)
    int log_overlap, log_mode, log_ampipe; // metrics.jsonl carries a2a_overlap / expert_mode / ampipe
} Adapt;

// The fixed settings onto the model, and the tuners for the auto ones. meshed: the mesh's code paths
// run (several ranks, or forced NCCL): only then is there an exchange to overlap.
void adapt_init(Adapt *a, const TrainOptions *o, const MeshShape *shape, int meshed, Model *m);
void adapt_free(Adapt *a);
// Before a step: each layer's setting from its tuner; the MoE layers timed while any tunes.
void adapt_before(Adapt *a, Model *m);
// After it: each layer's time (the max over the world's ranks) and load (busiest expert / mean, from
// counts (L,E)) to its tuner. Returns 1 when a tuning ended.
int adapt_after(Adapt *a, Model *m, const int64_t *counts, const Comm *world);
// Into a metrics.jsonl line: each layer's overlap degree and expert mode, and when a tuning ended
// (tuned), what each candidate took and the choice.
void adapt_record(const Adapt *a, const Model *m, cJSON *line, int tuned);
// The progress line's part (" | a2a r 4,2g"), appended to buf (n bytes left).
void adapt_progress(const Adapt *a, const Model *m, char *buf, size_t n);
// --a2a-hier auto: the node size G when every EP group spans several hosts as consecutive blocks of
// G ranks (hostnames all-gathered over the world; every rank then takes the same G), else 0 (flat).
int adapt_hier(const Comm *world, const MeshShape *ms);
