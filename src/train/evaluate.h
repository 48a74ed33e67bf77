// evaluate.h — validation loss (overall and per kind of line for the synthetic corpus, with
// which experts each kind is routed to) and text sampling from a model.
// Must not hold: the training loop or checkpoint IO.
#pragma once
#include <stdint.h>
#include <stdio.h>
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

// Sampling. The context of each new token is ctx[s, len), at positions 0..len-s-1, with len - s <= window:
// s starts at max(0, len - window) and, when a new token would make the context longer than the window,
// slides to keep the last ceil(window/2) tokens (re-prefilled through the cache: one prefill per
// window/2 tokens, and every context is between window/2 and window tokens long, as in training).
typedef struct {
    float temperature; // 0 = greedy (argmax, ties to the lower id)
    int top_k; // keep the k most likely tokens (0 = all)
    float top_p; // then the smallest set of most likely tokens whose probability is >= top_p (1 = all)
    int window; // context positions (1..the model's maxT; the training length)
    int cache; // 1: KV cache (model_decode; one chunk of every layer only, else as 0);
               // 0: each token runs the whole context again (the reference)
    uint64_t seed; // the draws
} SampleOptions;
typedef struct {
    int tokens, prefills, cached;
    double seconds;
} SampleStats;
// Appends n sampled tokens to the prompt (ctx of *len tokens, capacity cap). stats may be NULL.
// With the cache and without, the same tokens (the same logits up to float round-off; the capacity
// dispatch decodes each token alone, so it drops nothing there).
void sample_tokens(Pipe *p, int32_t *ctx, int *len, int cap, int n, const SampleOptions *so,
                   SampleStats *stats);
// Prints tokens as text (vocab 256: bytes with escapes for non-printables; else ids).
void print_tokens(FILE *f, const int32_t *tok, int n, int vocab);

// HF Mixtral's load-balancing loss (transformers' load_balancing_loss_func) of the last forward:
// the router outputs of ALL layers taken as one set of L*N rows,
//   E * sum_e (assignments to e over all layers and slots / (L*N)) * (sum of p_e over those rows / (L*N)).
// (Our per-layer form averages E * sum_e f_e P_e over layers instead.) One process only.
double eval_aux_hf(const Model *m);

// Writes a safetensors file (F32) describing the first validation batch (B sequences of ds->T), for
// comparing with another implementation (moe eval --dump): tokens and targets (B,T), logits (B,T,V),
// losses (B,T) per-token cross-entropy, router_logits.<layer> (B*T,E), and the scalars loss (mean
// cross-entropy), aux_loss (m->aux: the model's aux form), aux_loss_hf (eval_aux_hf), z_loss. With
// grads: grad.<tensor name> of every parameter after one backward (no jitter) of
//   mean cross-entropy + aux_coef * aux_loss + z_coef * z_loss.
// The scalars are also in the header metadata at full precision ("%.17g"), with the keys of
// extra_meta (a JSON object of strings; may be NULL).
void eval_dump(Model *m, const Dataset *ds, int B, const char *path, int grads, float aux_coef, float z_coef,
               const char *extra_meta);
