// info.h — the figures `moe info` prints for a model config and a training layout: parameters, FLOPs
// per token, memory on the cpu and cuda backends, and for a mesh its groups and per-rank memory.
// Must not hold: option parsing or loading a checkpoint (cli/, pretrained.c).
#pragma once
#include "core/config.h"
#include "train/options.h"

// Prints them to stdout for c (dies "invalid model config: ..." if c is invalid) at o's batch and
// seq_len. The mesh part appears when world > 0 or o has tp, ep or etp > 1: world ranks (0: tp x ep
// x etp) laid out with o's tp, pp, ep, etp, and each rank's memory under o's ZeRO stage; dies
// "impossible mesh: ..." when that layout cannot be built.
void info_print(const ModelConfig *c, const TrainOptions *o, int world);
