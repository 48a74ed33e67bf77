// info.h — `moe info`: prints the figures of a model config and a training layout (train/cost.h computes
// them): parameters, FLOPs per token, memory on the cpu and cuda backends, and for a mesh its groups, the
// memory of each rank and the bytes each rank sends per step.
// Must not hold: option parsing or loading a checkpoint (cli/, pretrained.c), the arithmetic (cost.c).
#pragma once
#include "core/config.h"
#include "train/options.h"

// Prints them to stdout for c (dies "invalid model config: ..." if c is invalid) at o's batch and
// seq_len. The mesh part appears when world > 0 or o has tp, ep or etp > 1: world ranks (0: tp x ep
// x etp) laid out with o's tp, pp, ep, etp, each rank's memory under o's ZeRO stage and the bytes it sends
// per step; dies "impossible mesh: ..." / "impossible pipeline: ..." when that layout cannot be built.
void info_print(const ModelConfig *c, const TrainOptions *o, int world);
