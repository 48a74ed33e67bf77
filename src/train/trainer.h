// trainer.h — `moe train`: the training loop (micro-batches, clipping, AdamW, schedule),
// progress lines, metrics.jsonl, periodic eval and checkpoints, resume, end-of-run report.
#pragma once
#include "model/config.h"
#include "train/options.h"

// model_explicit: the user set model options (a preset, config file or model flag); on --resume
// they must then match the checkpoint's config. Returns the process exit code.
int train_run(const ModelConfig *c, const TrainOptions *o, int model_explicit);
