// params.c — builds the parameter table from a config (HF Mixtral names, shapes, offsets,
// split and reduction metadata) and initialises the flat parameter buffer from a seed.
#include "model/params.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"

static void add(ParamTable *t, int *cap, const char *name, int64_t r, int64_t c, ParamRole role,
                int layer, int expert, TpSplit split) {
    if (t->n == *cap) { *cap = *cap ? 2 * *cap : 64; t->p = xrealloc(t->p, (size_t)*cap * sizeof *t->p); }
    ParamSpec *s = &t->p[t->n++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->ndim = c ? 2 : 1;
    s->shape[0] = r;
    s->shape[1] = c;
    s->numel = (size_t)r * (size_t)(c ? c : 1);
    s->offset = t->total;
    s->role = role;
    s->layer = layer;
    s->expert = expert;
    s->reduce = expert >= 0 ? RED_EDP : RED_DP;
    s->tp_split = split;
    s->decay = c ? 1 : 0;
    t->total += s->numel;
}

void params_build(ParamTable *t, const ModelConfig *c) {
    memset(t, 0, sizeof *t);
    int cap = 0;
    int64_t V = c->vocab_size, d = c->d_model, qd = (int64_t)c->n_heads * c->head_dim,
            kvd = (int64_t)c->n_kv_heads * c->head_dim, f = c->d_ff, E = c->n_experts;
    char nm[96];
    add(t, &cap, "model.embed_tokens.weight", V, d, PR_EMBED, -1, -1, SPLIT_VOCAB);
    for (int l = 0; l < c->n_layers; l++) {
#define NM(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
        add(t, &cap, NM("model.layers.%d.input_layernorm.weight", l), d, 0, PR_ATTN_NORM, l, -1, SPLIT_REPL);
        add(t, &cap, NM("model.layers.%d.self_attn.q_proj.weight", l), qd, d, PR_WQ, l, -1, SPLIT_COL);
        add(t, &cap, NM("model.layers.%d.self_attn.k_proj.weight", l), kvd, d, PR_WK, l, -1, SPLIT_COL);
        add(t, &cap, NM("model.layers.%d.self_attn.v_proj.weight", l), kvd, d, PR_WV, l, -1, SPLIT_COL);
        add(t, &cap, NM("model.layers.%d.self_attn.o_proj.weight", l), d, qd, PR_WO, l, -1, SPLIT_ROW);
        add(t, &cap, NM("model.layers.%d.post_attention_layernorm.weight", l), d, 0, PR_FFN_NORM, l, -1, SPLIT_REPL);
        add(t, &cap, NM("model.layers.%d.block_sparse_moe.gate.weight", l), E, d, PR_ROUTER, l, -1, SPLIT_REPL);
        for (int e = 0; e < E; e++)
            add(t, &cap, NM("model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l, e), f, d, PR_W1, l, e, SPLIT_COL);
        for (int e = 0; e < E; e++)
            add(t, &cap, NM("model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l, e), f, d, PR_W3, l, e, SPLIT_COL);
        for (int e = 0; e < E; e++)
            add(t, &cap, NM("model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l, e), d, f, PR_W2, l, e, SPLIT_ROW);
#undef NM
    }
    add(t, &cap, "model.norm.weight", d, 0, PR_FINAL_NORM, -1, -1, SPLIT_REPL);
    add(t, &cap, "lm_head.weight", V, d, PR_LM_HEAD, -1, -1, SPLIT_VOCAB);
}

void params_free(ParamTable *t) { free(t->p); memset(t, 0, sizeof *t); }

int params_find(const ParamTable *t, const char *name) {
    for (int i = 0; i < t->n; i++) if (strcmp(t->p[i].name, name) == 0) return i;
    return -1;
}

int params_index(const ParamTable *t, ParamRole role, int layer, int expert) {
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *s = &t->p[i];
        if (s->role == role && s->layer == layer && s->expert == expert) return i;
    }
    return -1;
}

void params_init(const ParamTable *t, const ModelConfig *c, float *flat, uint64_t seed) {
    // Each tensor draws from its own stream (seed, tensor index) so init does not depend on
    // which other tensors exist or on the order they are filled.
    float out_scale = 1.0f / sqrtf(2.0f * c->n_layers);
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *s = &t->p[i];
        float *p = flat + s->offset;
        if (s->ndim == 1) { for (size_t j = 0; j < s->numel; j++) p[j] = 1.0f; continue; }
        Rng r;
        rng_seed(&r, seed * 0x100000001B3ull + (uint64_t)i + 1);
        float std = c->init_std * ((s->role == PR_WO || s->role == PR_W2) ? out_scale : 1.0f);
        for (size_t j = 0; j < s->numel; j++) p[j] = std * rng_normal(&r);
    }
}
