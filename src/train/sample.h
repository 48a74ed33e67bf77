// sample.h — text sampling from a model (temperature, top-k, top-p; through the KV cache or not) and
// printing tokens as text.
// Must not hold: evaluation (train/eval.h), the training loop.
#pragma once
#include <stdint.h>
#include <stdio.h>
#include "text/tokenizer.h"
#include "train/pipe.h"

// Sampling. The context of each new token is ctx[s, len), at positions 0..len-s-1, with len - s <= window:
// s starts at max(0, len - window) and, when a new token would make the context longer than the window,
// slides to keep the last ceil(window/2) tokens (re-prefilled through the cache: one prefill per
// window/2 tokens, and every context is between window/2 and window tokens long, as in training).
// The most tokens one sampling call appends (`moe sample --tokens`, `moe train --sample-tokens`): a bound
// that keeps the context's int sizes far from overflow and a run's end in reasonable time.
#define SAMPLE_MAX_TOKENS (1 << 20)

typedef struct {
    float temperature; // 0 = greedy (argmax, ties to the lower id)
    int top_k; // keep the k most likely tokens (0 = all)
    float top_p; // then the smallest set of most likely tokens whose probability is >= top_p (1 = all)
    int window; // context positions (1..the model's maxT; the training length)
    int cache; // 1: KV cache (model_decode; one chunk of every layer only, else as 0);
               // 0: each token runs the whole context again (the reference)
    uint64_t seed; // the draws
    void (*emit)(void *arg, int32_t id); // (may be NULL) called with each token as it is drawn
    void *emit_arg;
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
// Prints tokens as text: through a tokenizer's streaming decoder s (a character split over tokens is
// printed once it is whole; an id beyond the tokenizer's vocabulary as U+FFFD), else (s NULL) with vocab
// 256 bytes with escapes for non-printables, and ids otherwise.
void print_tokens(FILE *f, TokStream *s, const int32_t *tok, int n, int vocab);
