// fp8_watch.h — --precision fp8's divergence checks, once a step before the update (issue 38's "non-finite
// or exploding amax is reported with the layer and tensor"): a scale group of the FP8 operands that held a
// NaN or an infinity stops the run, naming the first one's layer and tensor; an amax jump, a (layer,
// tensor) whose largest scale exponent this step (the log2 of its amax / 448, rounded up: ops.h
// Backend.fp8_amax, the maximum over the ranks) lies --fp8-amax-jump or more above the largest of every
// earlier step of the run, is counted and the largest named (the trainer prints a warning and
// metrics.jsonl's fp8_amax_jumps). The run goes on: a finite amax trains on, the jump is a warning of a
// divergence coming. The record starts again at a resume (the first step after it only records).
// Must not hold: printing (trainer.c), the quantisers or their counts (ops/).
#pragma once
#include <stddef.h>
#include "ops/ops.h"
#include "parallel/comm.h"

typedef struct {
    int jump; // --fp8-amax-jump (0: no amax check)
    int rows; // the model's layers (MTP's too) + 1: Backend.fp8_amax's rows
    int *rec; // (rows, FP8T_N) the largest exponent of the earlier steps (FP8_AMAX_NONE: not seen)
    int *cur, *all; // this step's (the ranks' maximum); every rank's (rows FP8T_N each)
    const Comm *world;
} Fp8Watch;

// What the step's check found: on (the amax check ran, at jump), n (layer, tensor) pairs that jumped, the
// largest of them (the first in layer, then tensor order among equal ones): its layer and tensor (FP8T_*),
// its record before this step (from) and this step's exponent (to).
typedef struct {
    int on, jump, n, layer, tensor, from, to;
} Fp8Jump;

void fp8_watch_init(Fp8Watch *w, int layers, int jump, const Comm *world);
// Before the update of step (0-based): dies on non-finite groups; else fills j (every rank the same: a
// collective over world when the check is on, so every rank calls it at the same step).
void fp8_watch_step(Fp8Watch *w, const Backend *be, int step, Fp8Jump *j);
void fp8_watch_free(Fp8Watch *w);
// The warning for a step whose check found jumps (the trainer prints it): 1, or 0 with none.
int fp8_jump_note(const Fp8Jump *j, int step, char *buf, size_t n);
