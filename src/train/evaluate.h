// evaluate.h — validation loss (overall and per kind of line for the synthetic corpus, with
// which experts each kind is routed to) and text sampling from a model.
// Must not hold: the training loop or checkpoint IO.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include "data/data.h"
#include "model/model.h"

typedef struct {
    double loss;                               // mean cross-entropy over evaluated target tokens
    int64_t tokens;
    int n_kinds;
    double kind_loss[DATA_MAX_KINDS];          // mean loss of target tokens of each kind
    int64_t kind_tokens[DATA_MAX_KINDS];
    int64_t *kind_expert;                      // (kinds, L, E) assignments of tokens of each kind (may be NULL)
} EvalResult;

// Evaluates n_batches micro-batches of B sequences from the validation set (from index 0).
// With want_kinds, fills the per-kind tables (kind_expert malloc'd; free with eval_result_free).
void evaluate(Model *m, const Dataset *ds, int B, int n_batches, int want_kinds, EvalResult *r);
void eval_result_free(EvalResult *r);
void eval_print(const EvalResult *r, const Dataset *ds, const ModelConfig *c);

// Appends n sampled tokens to the prompt (ctx of *len tokens, capacity cap); temperature 0 = greedy.
// Uses only the last maxT tokens as context.
void sample_tokens(Model *m, int32_t *ctx, int *len, int cap, int n, float temperature, uint64_t seed);
// Prints tokens as text (vocab 256: bytes with escapes for non-printables; else ids).
void print_tokens(FILE *f, const int32_t *tok, int n, int vocab);
