// eval.h — validation loss, overall and per kind of line for the synthetic corpus, with which experts each
// kind is routed to.
// Must not hold: the training loop, sampling (train/sample.h), tensor dumps (train/dump.h), checkpoint IO.
#pragma once
#include <stdint.h>
#include "data/data.h"
#include "model/model.h"
#include "train/dist.h"
#include "train/pipe.h"

typedef struct {
    double loss; // mean cross-entropy over evaluated target tokens
    int64_t tokens;
    int batches; // batches evaluated (the request, clipped to the set)
    int available; // whole batches of B the validation set holds
    int n_kinds;
    double kind_loss[DATA_MAX_KINDS]; // mean loss of target tokens of each kind
    int64_t kind_tokens[DATA_MAX_KINDS];
    int64_t *kind_expert; // (kinds, L, E) assignments of tokens of each kind (may be NULL)
} EvalResult;

// Evaluates n_batches micro-batches of B sequences (global; each DP rank takes its share) from the
// validation set (from index 0); n_batches 0 = all of it; a request beyond the set is clipped to its
// whole batches (r->batches < n_batches then: eval_clip_note says so), never wrapped. With want_kinds, fills
// the per-kind tables (kind_expert malloc'd; free with eval_result_free). Results are global. dist may be
// NULL (one process). The model runs through p (its pipeline stages; a Pipe of one stage for a model alone).
void evaluate(Pipe *p, const Dataset *ds, int B, int n_batches, int want_kinds, EvalResult *r,
              const Dist *dist);
void eval_result_free(EvalResult *r);
// Whole batches of B sequences in ds's validation set; dies naming the sizes when there is not one.
int eval_batches_available(const Dataset *ds, int B);
// The note for a clipped request ("--eval-batches 500 exceeds the validation set: ..."), or "" when
// the request was met (requested 0 = all is never clipped).
void eval_clip_note(char *buf, size_t n, const EvalResult *r, int requested, int B);
void eval_print(const EvalResult *r, const Dataset *ds, const ModelConfig *c);
