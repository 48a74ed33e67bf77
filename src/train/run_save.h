// run_save.h — what a training run writes beside its steps: checkpoints streamed from the model (no full
// host copy), the IO note naming the last complete checkpoint, metrics.jsonl cut back on resume; and the
// checkpoint a resume reads, streamed into the model and the optimizer (no full host copy either).
// Must not hold: the checkpoint format (io/checkpoint.c, io/ckpt_dist.c), the training loop (trainer.c).
#pragma once
#include <stdint.h>
#include "core/config.h"
#include "io/checkpoint.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "train/dist.h"
#include "train/options.h"

// Collective: every rank writes the slices it owns (parameters in 16 MiB windows, AdamW moments a bucket at
// a time with ZeRO shards gathered), rank 0 commits. dir NULL: the step's checkpoint OUT/step_N (then the
// old ones pruned to --keep); else that directory (OUT/best). Then run_note_checkpoint.
void run_save(const Dist *dist, const TrainOptions *o, const ModelConfig *c, const Model *m,
              const TrainState *st, const Comm *world, const char *dir);
// The IO note (core/common.h io_note_set) of a run in out: its newest complete checkpoint, which a save in
// progress never touches (it writes into "<dir>.tmp"), or that none is complete yet: what a failed write
// (a full disk, a read-only run directory) leaves to resume from.
void run_note_checkpoint(const char *out);
// --precision bf16: every weight is a bf16 value from step 0 (the initialisation, a float32 checkpoint
// or --init-from's import rounded once, to nearest even); AdamW keeps them so (ops.h OPT_BF16_*). Not
// with --bf16-rounding none: the weights stay float32, only the moments are bf16.
void run_round_bf16(float *p, size_t n);

// Where a resume's checkpoint goes: the weights to the backend's params (rounded to bf16 first with wround;
// a bf16 checkpoint's are bf16 values, unchanged), the moments to dist's shards (bf16 moments rounded to
// nearest; a bf16 run's unchanged).
typedef struct {
    const Backend *be;
    float *params;
    Dist *dist;
    int wround;
} RunLoad;
// Collective: reads checkpoint dir (io/ckpt_dist.h ckpt_load_dist, a tensor at a time) into l, and its
// state into st.
void run_load(RunLoad *l, const char *dir, const ParamTable *t, TrainState *st, const Comm *world);

// metrics.jsonl at path: the lines with step <= last_step kept (resume), later ones dropped (replaced
// through path.tmp and a rename).
void run_metrics_truncate(const char *path, int64_t last_step);
