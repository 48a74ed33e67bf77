// params.c — builds the parameter table from a config (the family's HF names, shapes, offsets,
// split and reduction metadata) and initialises the flat parameter buffer from a seed.
#include "model/params.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"

static void params_build_tensors(ParamTable *t, const ModelConfig *c);

static void add(ParamTable *t, int *cap, const char *name, int64_t r, int64_t c, ParamRole role, int layer,
                int expert, TpSplit split) {
    if (t->n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        t->p = xrealloc(t->p, (size_t)*cap * sizeof *t->p);
    }
    ParamSpec *s = &t->p[t->n++];
    memset(s, 0, sizeof *s);
    size_t nl = strnlen(name, sizeof s->name - 1); // (a copy: snprintf here took most of moe plan's time)
    memcpy(s->name, name, nl);
    s->name[nl] = 0;
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

// Local slice of tensor s under slicing sl.
// stage: each layer's pipeline rank under sl's split (NULL without one).
static void localize(ParamSpec *s, const ModelConfig *c, const ParamSlicing *sl, const int *stage) {
    s->lshape[0] = s->shape[0];
    s->lshape[1] = s->shape[1];
    s->split_dim = -1;
    s->split_start = 0;
    int held = 1, parts = 1, part = 0, dim = -1;
    switch (s->role) {
        case PR_WQ:
        case PR_WK:
        case PR_WV:
        case PR_QB:
        case PR_KVB:
        case PR_BQ:
        case PR_BK:
        case PR_BV:
            parts = sl->tp;
            part = sl->tp_rank;
            dim = 0;
            break;
        case PR_WO:
            parts = sl->tp;
            part = sl->tp_rank;
            dim = 1;
            break;
        // QK-norm: the full-width weight (OLMoE) spans every head's columns: sliced with q/k's rows (this
        // rank's heads); the per-head one (hd) is replicated
        case PR_QNORM:
        case PR_KNORM:
            if (c->qk_norm == QK_NORM_FULL) {
                parts = sl->tp;
                part = sl->tp_rank;
                dim = 0;
            }
            break;
        case PR_EMBED:
        case PR_LM_HEAD:
            if (sl->vocab) {
                parts = sl->tp;
                part = sl->tp_rank;
                dim = 0;
            }
            break;
        case PR_W1:
        case PR_W3:
        case PR_W2: {
            int El = c->n_experts / sl->ep;
            held = s->expert / El == sl->ep_rank;
            parts = sl->etp;
            part = sl->etp_rank;
            dim = s->role == PR_W2 ? 1 : 0;
            break;
        }
        default: break;
    }
    const StageSplit *ps = sl->pp_split;
    if (ps && ps->pp > 1) {
        if (s->role == PR_EMBED) held = sl->pp_rank == 0;
        else if (s->role == PR_FINAL_NORM || s->role == PR_LM_HEAD || s->layer >= c->n_layers)
            held = held && sl->pp_rank == ps->pp - 1; // (the MTP modules: the last stage's)
        else held = held && stage[s->layer] == sl->pp_rank;
    }
    if (!held) {
        s->lshape[0] = s->lshape[1] = 0;
        s->lnumel = 0;
        return;
    }
    if (parts > 1) { // (the vocabulary's rows in uneven parts where tp does not divide V)
        int64_t a = params_part_start(s->shape[dim], part, parts),
                b = params_part_start(s->shape[dim], part + 1, parts);
        s->lshape[dim] = b - a;
        s->split_dim = dim;
        s->split_start = a;
    }
    s->lnumel = (size_t)s->lshape[0] * (size_t)(s->ndim == 2 ? s->lshape[1] : 1);
}

// t->lby from the tensors' local slices.
static void tally(ParamTable *t) {
    memset(t->lby, 0, sizeof t->lby);
    for (int i = 0; i < t->n; i++) t->lby[t->p[i].reduce][t->p[i].expert >= 0] += t->p[i].lnumel;
}

// Every tensor of t (a table params_build made for c) sliced by sl (NULL: one process).
static void localize_all(ParamTable *t, const ModelConfig *c, const ParamSlicing *sl) {
    ParamSlicing one = {1, 0, 1, 0, 1, 0, NULL, 0, 0};
    if (!sl) sl = &one;
    const StageSplit *ps = sl->pp_split;
    int *stage = NULL;
    if (ps && ps->pp > 1) { // (once a layer, not once a tensor: the planner slices large tables often)
        stage = xmalloc(sizeof *stage * (size_t)(c->n_layers > 0 ? c->n_layers : 1));
        for (int l = 0; l < c->n_layers; l++) stage[l] = stages_of_layer(ps, l) % ps->pp;
    }
    t->ltotal = 0;
    for (int i = 0; i < t->n; i++) {
        localize(&t->p[i], c, sl, stage);
        t->p[i].loffset = t->ltotal;
        t->ltotal += t->p[i].lnumel;
    }
    free(stage);
    tally(t);
}
void params_build_local(ParamTable *t, const ModelConfig *c, const ParamSlicing *sl) {
    params_build(t, c);
    localize_all(t, c, sl);
}
void params_localize(ParamTable *t, const ParamTable *full, const ModelConfig *c, const ParamSlicing *sl) {
    if (!t->p) { // (else a copy of full already: localize_all rewrites every field a slicing sets)
        *t = *full;
        t->p = xmalloc(sizeof *t->p * (size_t)(full->n > 0 ? full->n : 1));
        if (full->n) memcpy(t->p, full->p, sizeof *t->p * (size_t)full->n);
    }
    CHECK(t->n == full->n && t->total == full->total, "params_localize: a table of another model");
    localize_all(t, c, sl);
}

// Walk the local slice of s as (rows of contiguous runs): calls fn(full_index, local_index, run).
void params_slice_runs(const ParamSpec *s, void (*fn)(size_t, size_t, size_t, void *), void *ctx) {
    if (!s->lnumel) return;
    if (s->split_dim != 1) { // whole tensor or a block of rows: one contiguous run
        size_t start =
            s->split_dim == 0 ? (size_t)s->split_start * (s->ndim == 2 ? (size_t)s->shape[1] : 1) : 0;
        fn(s->offset + start, s->loffset, s->lnumel, ctx);
        return;
    }
    for (int64_t r = 0; r < s->lshape[0]; r++)
        fn(s->offset + (size_t)r * s->shape[1] + s->split_start, s->loffset + (size_t)r * s->lshape[1],
           (size_t)s->lshape[1], ctx);
}
typedef struct {
    const float *src;
    float *dst;
} CopyCtx;
static void run_f2l(size_t f, size_t l, size_t n, void *p) {
    CopyCtx *c = p;
    memcpy(c->dst + l, c->src + f, n * sizeof(float));
}
void params_full_to_local(const ParamTable *t, const float *full, float *local) {
    CopyCtx c = {full, local};
    for (int i = 0; i < t->n; i++) params_slice_runs(&t->p[i], run_f2l, &c);
}

void params_build(ParamTable *t, const ModelConfig *c) {
    memset(t, 0, sizeof *t);
    params_build_tensors(t, c);
    for (int i = 0; i < t->n; i++) { // one process: the local slice is the whole tensor
        ParamSpec *s = &t->p[i];
        s->lshape[0] = s->shape[0];
        s->lshape[1] = s->shape[1];
        s->lnumel = s->numel;
        s->loffset = s->offset;
        s->split_dim = -1;
    }
    t->ltotal = t->total;
    tally(t);
}

// Latent attention's tensors of layer l (config.h): the projections to the heads split over TP by heads
// (q_b or q, kv_b: rows; o: columns), the compressions and their norms replicated, reduced over the stage.
static void mla_tensors(ParamTable *t, int *cap, const ModelConfig *c, int l) {
    int64_t d = c->d_model, H = c->n_heads, qr = c->q_lora_rank, kvr = c->kv_lora_rank,
            hq = config_qk_head_dim(c), dr = c->qk_rope_head_dim, dn = c->qk_nope_head_dim,
            dv = c->v_head_dim;
    char nm[96];
#define NM(x) (snprintf(nm, sizeof nm, "model.layers.%d.self_attn.%s", l, x), nm)
#define STAGE (t->p[t->n - 1].reduce = RED_STAGE)
    if (qr) {
        add(t, cap, NM("q_a_proj.weight"), qr, d, PR_QA, l, -1, SPLIT_REPL);
        STAGE;
        add(t, cap, NM("q_a_layernorm.weight"), qr, 0, PR_QA_NORM, l, -1, SPLIT_REPL);
        STAGE;
        add(t, cap, NM("q_b_proj.weight"), H * hq, qr, PR_QB, l, -1, SPLIT_COL);
    } else {
        add(t, cap, NM("q_proj.weight"), H * hq, d, PR_QB, l, -1, SPLIT_COL);
    }
    add(t, cap, NM("kv_a_proj_with_mqa.weight"), kvr + dr, d, PR_KVA, l, -1, SPLIT_REPL);
    STAGE;
    add(t, cap, NM("kv_a_layernorm.weight"), kvr, 0, PR_KVA_NORM, l, -1, SPLIT_REPL);
    STAGE;
    add(t, cap, NM("kv_b_proj.weight"), H * (dn + dv), kvr, PR_KVB, l, -1, SPLIT_COL);
    add(t, cap, NM("o_proj.weight"), d, H * dv, PR_WO, l, -1, SPLIT_ROW);
#undef NM
#undef STAGE
}

// GQA's tensors of layer l: q, k, v (with the family's biases), o, the family's QK-norm weights.
static void gqa_tensors(ParamTable *t, int *cap, const ModelConfig *c, int l) {
    int64_t d = c->d_model, qd = (int64_t)c->n_heads * c->head_dim,
            kvd = (int64_t)c->n_kv_heads * c->head_dim, hd = c->head_dim;
    char nm[96];
#define NM(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
    const char *qkv[3] = {"q", "k", "v"};
    int64_t rows[3] = {qd, kvd, kvd};
    ParamRole rw[3] = {PR_WQ, PR_WK, PR_WV}, rb[3] = {PR_BQ, PR_BK, PR_BV};
    for (int i = 0; i < 3; i++) {
        add(t, cap, NM("model.layers.%d.self_attn.%s_proj.weight", l, qkv[i]), rows[i], d, rw[i], l, -1,
            SPLIT_COL);
        if (c->qkv_bias) {
            add(t, cap, NM("model.layers.%d.self_attn.%s_proj.bias", l, qkv[i]), rows[i], 0, rb[i], l, -1,
                SPLIT_COL);
            t->p[t->n - 1].decay = 0;
        }
    }
    add(t, cap, NM("model.layers.%d.self_attn.o_proj.weight", l), d, qd, PR_WO, l, -1, SPLIT_ROW);
    if (c->qk_norm) { // full width: split with the heads, reduced over DP; per head: replicated, over the
                      // stage
        int full = c->qk_norm == QK_NORM_FULL;
        TpSplit sp = full ? SPLIT_COL : SPLIT_REPL;
        add(t, cap, NM("model.layers.%d.self_attn.q_norm.weight", l), full ? qd : hd, 0, PR_QNORM, l, -1, sp);
        if (!full) t->p[t->n - 1].reduce = RED_STAGE;
        add(t, cap, NM("model.layers.%d.self_attn.k_norm.weight", l), full ? kvd : hd, 0, PR_KNORM, l, -1,
            sp);
        if (!full) t->p[t->n - 1].reduce = RED_STAGE;
    }
#undef NM
}

// Layers [l0, l1)'s tensors (a main layer's, or an MTP module's block at l0 = l1 - 1 >= n_layers: MoE).
static void add_layers(ParamTable *t, int *cap_, const ModelConfig *c, int l0, int l1) {
    int cap = *cap_;
    int64_t d = c->d_model, f = c->d_ff, E = c->n_experts, fs = (int64_t)c->n_shared_experts * c->shared_d_ff;
    int mix = c->family == FAM_MIXTRAL;
    const char *moe = mix ? "block_sparse_moe" : "mlp",
               *sh = c->family == FAM_DEEPSEEK_V3 ? "shared_experts" : "shared_expert";
    const char *ew[3] = {mix ? "w1" : "gate_proj", mix ? "w3" : "up_proj", mix ? "w2" : "down_proj"};
    char nm[96];
    for (int l = l0; l < l1; l++) {
#define NM(...) (snprintf(nm, sizeof nm, __VA_ARGS__), nm)
        add(t, &cap, NM("model.layers.%d.input_layernorm.weight", l), d, 0, PR_ATTN_NORM, l, -1, SPLIT_REPL);
        if (config_mla(c)) mla_tensors(t, &cap, c, l);
        else gqa_tensors(t, &cap, c, l);
        add(t, &cap, NM("model.layers.%d.post_attention_layernorm.weight", l), d, 0, PR_FFN_NORM, l, -1,
            SPLIT_REPL);
        if (config_layer_dense(c,
                               l)) { // replicated, each TP rank runs its token slice (as the shared expert)
            int64_t fd = c->dense_d_ff;
            add(t, &cap, NM("model.layers.%d.mlp.gate_proj.weight", l), fd, d, PR_D_W1, l, -1, SPLIT_REPL);
            t->p[t->n - 1].reduce = RED_STAGE;
            add(t, &cap, NM("model.layers.%d.mlp.up_proj.weight", l), fd, d, PR_D_W3, l, -1, SPLIT_REPL);
            t->p[t->n - 1].reduce = RED_STAGE;
            add(t, &cap, NM("model.layers.%d.mlp.down_proj.weight", l), d, fd, PR_D_W2, l, -1, SPLIT_REPL);
            t->p[t->n - 1].reduce = RED_STAGE;
            continue;
        }
        add(t, &cap, NM("model.layers.%d.%s.gate.weight", l, moe), E, d, PR_ROUTER, l, -1, SPLIT_REPL);
        t->p[t->n - 1].reduce = RED_STAGE;
        if (c->balance == BALANCE_AUX_FREE) {
            add(t, &cap, NM("model.layers.%d.%s.gate.e_score_correction_bias", l, moe), E, 0, PR_ROUTE_BIAS,
                l, -1, SPLIT_REPL);
            t->p[t->n - 1].reduce = RED_STAGE;
        }
        if (fs) {
            add(t, &cap, NM("model.layers.%d.mlp.%s.gate_proj.weight", l, sh), fs, d, PR_SH_W1, l, -1,
                SPLIT_REPL);
            t->p[t->n - 1].reduce = RED_STAGE;
            add(t, &cap, NM("model.layers.%d.mlp.%s.up_proj.weight", l, sh), fs, d, PR_SH_W3, l, -1,
                SPLIT_REPL);
            t->p[t->n - 1].reduce = RED_STAGE;
            add(t, &cap, NM("model.layers.%d.mlp.%s.down_proj.weight", l, sh), d, fs, PR_SH_W2, l, -1,
                SPLIT_REPL);
            t->p[t->n - 1].reduce = RED_STAGE;
            if (c->shared_gate) {
                add(t, &cap, NM("model.layers.%d.mlp.shared_expert_gate.weight", l), 1, d, PR_SH_GATE, l, -1,
                    SPLIT_REPL);
                t->p[t->n - 1].reduce = RED_STAGE;
            }
        }
        for (int e = 0; e < E; e++)
            add(t, &cap, NM("model.layers.%d.%s.experts.%d.%s.weight", l, moe, e, ew[0]), f, d, PR_W1, l, e,
                SPLIT_COL);
        for (int e = 0; e < E; e++)
            add(t, &cap, NM("model.layers.%d.%s.experts.%d.%s.weight", l, moe, e, ew[1]), f, d, PR_W3, l, e,
                SPLIT_COL);
        for (int e = 0; e < E; e++)
            add(t, &cap, NM("model.layers.%d.%s.experts.%d.%s.weight", l, moe, e, ew[2]), d, f, PR_W2, l, e,
                SPLIT_ROW);
#undef NM
    }
    *cap_ = cap;
}

static void params_build_tensors(ParamTable *t, const ModelConfig *c) {
    int cap = 0;
    int64_t V = c->vocab_size, d = c->d_model;
    add(t, &cap, "model.embed_tokens.weight", V, d, PR_EMBED, -1, -1, SPLIT_VOCAB);
    add_layers(t, &cap, c, 0, c->n_layers);
    add(t, &cap, "model.norm.weight", d, 0, PR_FINAL_NORM, -1, -1, SPLIT_REPL);
    add(t, &cap, "lm_head.weight", V, d, PR_LM_HEAD, -1, -1, SPLIT_VOCAB);
    // the MTP modules (the released DeepSeek-V3 checkpoints' names; their embed_tokens and shared_head.head
    // are the main model's: io/hf.c checks a released checkpoint's copies); replicated, reduced over DP
    char nm[96];
    for (int k = 0; k < c->mtp_depth; k++) {
        int l = c->n_layers + k;
        snprintf(nm, sizeof nm, "model.layers.%d.enorm.weight", l);
        add(t, &cap, nm, d, 0, PR_MTP_ENORM, l, -1, SPLIT_REPL);
        snprintf(nm, sizeof nm, "model.layers.%d.hnorm.weight", l);
        add(t, &cap, nm, d, 0, PR_MTP_HNORM, l, -1, SPLIT_REPL);
        snprintf(nm, sizeof nm, "model.layers.%d.eh_proj.weight", l);
        add(t, &cap, nm, d, 2 * d, PR_MTP_EH, l, -1, SPLIT_REPL);
        add_layers(t, &cap, c, l, l + 1);
        snprintf(nm, sizeof nm, "model.layers.%d.shared_head.norm.weight", l);
        add(t, &cap, nm, d, 0, PR_MTP_NORM, l, -1, SPLIT_REPL);
    }
}

void params_free(ParamTable *t) {
    free(t->p);
    memset(t, 0, sizeof *t);
}

int params_find(const ParamTable *t, const char *name) {
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->p[i].name, name) == 0) return i;
    return -1;
}

int params_index(const ParamTable *t, ParamRole role, int layer, int expert) {
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *s = &t->p[i];
        if (s->role == role && s->layer == layer && s->expert == expert) return i;
    }
    return -1;
}

// range [a, b) appended to h, or merged into the last one where it continues it
static void add_range(size_t *h, int *nh, size_t a, size_t b) {
    if (*nh && h[2 * *nh - 1] == a) h[2 * *nh - 1] = b;
    else {
        h[2 * *nh] = a;
        h[2 * *nh + 1] = b;
        (*nh)++;
    }
}

int params_bf16_ranges(const ParamTable *t, int n_layers, int e0, int El, int64_t min_rows, size_t *h) {
    int nh = 0;
    for (int i = 0; i < t->n; i++) { // table order: ascending offsets
        const ParamSpec *p = &t->p[i];
        if (!p->lnumel) continue;
        if (p->role == PR_EMBED) { // (embedding_fwd reads a table in a hole from the copy)
            if (p->loffset % 8 == 0) add_range(h, &nh, p->loffset, p->loffset + p->lnumel);
            continue;
        }
        if (p->role == PR_WQ || p->role == PR_WK || p->role == PR_WV || p->role == PR_WO ||
            p->role == PR_LM_HEAD) {
            if (p->lshape[0] > min_rows && p->loffset % 8 == 0)
                add_range(h, &nh, p->loffset, p->loffset + p->lnumel);
            continue;
        }
        if (p->role != PR_W1 || p->expert != e0 || p->layer < 0 || p->layer >= n_layers) continue;
        int l = p->layer, i3 = params_index(t, PR_W3, l, e0), i2 = params_index(t, PR_W2, l, e0),
            ie = params_index(t, PR_W2, l, e0 + El - 1);
        if (i3 < 0 || i2 < 0 || ie < 0) continue;
        if (p->loffset % 8 || t->p[i3].loffset % 8 || t->p[i2].loffset % 8) continue;
        add_range(h, &nh, p->loffset, t->p[ie].loffset + t->p[ie].lnumel);
    }
    return nh;
}

void params_init(const ParamTable *t, const ModelConfig *c, float *local, uint64_t seed) {
    // Each tensor draws from its own stream (seed, tensor index) so init does not depend on
    // which other tensors exist, on the order they are filled, on the mesh (the full tensor is
    // generated and this rank's slice copied out of it) or on the thread count (tensors are
    // filled in parallel, each by one thread).
    float out_scale = 1.0f / sqrtf(2.0f * c->n_layers);
#pragma omp parallel
    {
        float *full = NULL;
        size_t cap = 0;
#pragma omp for schedule(dynamic)
        for (int i = 0; i < t->n; i++) {
            const ParamSpec *s = &t->p[i];
            if (!s->lnumel) continue;
            if (s->numel > cap) {
                cap = s->numel;
                full = xrealloc(full, cap * sizeof(float));
            }
            if (s->ndim == 1) { // norms 1, biases 0 (as transformers' _init_weights)
                float one =
                    s->role == PR_BQ || s->role == PR_BK || s->role == PR_BV || s->role == PR_ROUTE_BIAS
                    ? 0.0f
                    : 1.0f;
                for (size_t j = 0; j < s->numel; j++) full[j] = one;
            } else {
                Rng r;
                rng_seed(&r, seed * 0x100000001B3ull + (uint64_t)i + 1);
                float std = c->init_std *
                    ((s->role == PR_WO || s->role == PR_W2 || s->role == PR_SH_W2 || s->role == PR_D_W2)
                         ? out_scale
                         : 1.0f);
                for (size_t j = 0; j < s->numel; j++) full[j] = std * rng_normal(&r);
            }
            ParamSpec one = *s; // the tensor alone, as if it were the whole buffer
            one.offset = 0;
            one.loffset = 0;
            ParamTable tt = {.p = &one, .n = 1, .total = s->numel, .ltotal = s->lnumel};
            params_full_to_local(&tt, full, local + s->loffset);
        }
        free(full);
    }
}
