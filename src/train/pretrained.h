// pretrained.h — what a command starts from: `--ckpt DIR` (one of our checkpoints, a run directory's
// newest complete checkpoint, or a Hugging Face model directory) resolved, its config read and its
// weights loaded into a model; and `train --init-from` (a run whose step 0 is a Hugging Face
// model's weights). Must not hold: option parsing (cli/) or file formats (checkpoint.c, hf.c).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "core/config.h"
#include "model/model.h"
#include "parallel/comm.h"
#include "io/checkpoint.h"
#include "train/options.h"

// The directory --ckpt DIR names, into out: DIR itself if it is a checkpoint (complete or not) or a
// Hugging Face model directory, else the newest complete checkpoint of the run in DIR. Dies with a
// message naming --ckpt when DIR is empty, not a directory, or holds neither.
void pretrained_resolve(const char *dir, char *out, size_t n);
// The model config of a resolved directory (a checkpoint: verified first; an HF model: config.json).
void pretrained_config(const char *dir, ModelConfig *c);
// Builds m (maxB x maxT, maxT capped at the config's max_seq_len) on the backend named by device
// and loads the weights of dir. st: the checkpoint's state, or for a Hugging Face directory (no
// state.json) step 0 with the given seed.
void pretrained_load(Model *m, const char *dir, int maxB, int maxT, TrainState *st, uint64_t seed,
                     const char *device);

// train --init-from: c is the model config (from hf_dir/config.json, with any overrides), o the run's
// options. Validates the options and the data against c first, rank 0 refuses a run already in o->out
// unless o->force, and every check of the run to come passes (train_check); then rank 0 deletes the
// old run (o->force) and saves hf_dir's weights with zero AdamW moments as step 0 of the run in o->out.
// Collective over world. The run is then continued as a resume from step 0, which is exactly a fresh start
// from those weights.
void pretrained_start_run(const char *hf_dir, const ModelConfig *c, const TrainOptions *o, Comm *world);
