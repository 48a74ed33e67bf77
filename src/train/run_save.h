// run_save.h — what a training run writes beside its steps: checkpoints streamed from the model (no full
// host copy), the IO note naming the last complete checkpoint, metrics.jsonl cut back on resume.
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
// metrics.jsonl at path: the lines with step <= last_step kept (resume), later ones dropped (replaced
// through path.tmp and a rename).
void run_metrics_truncate(const char *path, int64_t last_step);
