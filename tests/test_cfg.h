// test_cfg.h — the small model config the checkpoint and Hugging Face file tests build their tensors
// from (2 layers, d 16, 4 experts top-2, GQA 4/2). Must not hold: the tests themselves.
#pragma once
#include <string.h>
#include "core/config.h"

// The tiny preset at d 32, GQA 4/2 (head dim 8), f 48, 4 experts top-2, vocab 64 (the model tests of
// slots and decoding), with the given layers and context.
static inline void test_tiny_cfg(ModelConfig *c, int n_layers, int max_seq_len) {
    config_preset(c, "tiny");
    c->n_layers = n_layers;
    c->d_model = 32;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 8;
    c->d_ff = 48;
    c->n_experts = 4;
    c->top_k = 2;
    c->vocab_size = 64;
    c->max_seq_len = max_seq_len;
}

// The finite-difference tests' model: the tiny preset at d 8, 2 layers, GQA 2/1 (head dim 4), f 12, 4
// experts top-2, context 16, init std 0.3 (large enough that every path moves the loss), the given vocab.
static inline ModelConfig test_fd_cfg(int vocab_size) {
    ModelConfig c;
    config_preset(&c, "tiny");
    c.vocab_size = vocab_size;
    c.d_model = 8;
    c.n_layers = 2;
    c.n_heads = 2;
    c.n_kv_heads = 1;
    c.head_dim = 4;
    c.d_ff = 12;
    c.n_experts = 4;
    c.top_k = 2;
    c.max_seq_len = 16;
    c.init_std = 0.3f;
    return c;
}

static inline ModelConfig test_small_cfg(void) {
    ModelConfig c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 32;
    c.d_model = 16;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 4;
    c.d_ff = 24;
    c.n_experts = 4;
    c.top_k = 2;
    c.max_seq_len = 64;
    c.rope_theta = 10000.0f;
    c.norm_eps = 1e-5f;
    c.init_std = 0.02f;
    c.renormalize = 1;
    c.jitter = 0.0f;
    c.aux_coef = 0.01f;
    c.z_coef = 0.001f;
    c.dispatch = DISPATCH_DROPLESS;
    c.capacity_factor = 1.25f;
    return c;
}
