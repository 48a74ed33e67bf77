// model_access.h — the accessors of the model's state that the files of src/model share (src/model only):
// a tensor of the parameter table in a flat buffer (the weights or their gradients), a layer's routed-expert
// block and where its gradients are written (packed or not), a layer's MoE weights, the first-write
// bookkeeping of a dense weight gradient (ops.h GM_DW_WRITE) and the dropout seed of the current slot's
// forward. Must not hold: arithmetic on activations, allocation, collectives.
#pragma once
#include <string.h>
#include "core/common.h"
#include "model/model_types.h"

// Tensor (role, layer, expert) of this rank's slice table in base (m->params or m->grads).
static inline float *model_param(const Model *m, float *base, ParamRole role, int layer, int expert) {
    int i = params_index(&m->t, role, layer, expert);
    CHECK(i >= 0, "parameter role %d layer %d expert %d missing from the table", (int)role, layer, expert);
    return base + m->t.p[i].loffset;
}

// Layer l's routed-expert block on this rank (w1, w3 and w2 of experts e0 .. e0+El-1: one contiguous range
// of elements in params.h's order, w1's first and w2's last): its first element, and its length in *len (0
// where the rank holds no experts of the layer).
static inline size_t model_expert_block(const Model *m, int l, size_t *len) {
    int i = params_index(&m->t, PR_W1, l, m->e0), j = params_index(&m->t, PR_W2, l, m->e0 + m->El - 1);
    *len = 0;
    if (i < 0 || j < 0 || !m->t.p[i].lnumel) return 0;
    *len = m->t.p[j].loffset + m->t.p[j].lnumel - m->t.p[i].loffset;
    return m->t.p[i].loffset;
}
// Of a block of len elements, the floats its packed gradients take (2 bytes an element: ops.h GM_DW_BF16).
static inline size_t model_packed_len(size_t len) { return (len + 1) / 2; }

// Where the grouped ops write layer l's routed-expert gradients of kind role (PR_W1, PR_W3, PR_W2: this
// rank's experts from e0, one block each): in m->grads, or, packed (model_state.h model_set_expert_grads
// OPTG_PACKED), at the kind's packed values: 2 bytes an element from the first of the layer's block.
static inline float *model_expert_dw(const Model *m, ParamRole role, int l) {
    float *g = model_param(m, m->grads, role, l, m->e0);
    if (m->expert_gbf != OPTG_PACKED) return g;
    size_t len, b0 = model_expert_block(m, l, &len), o = (size_t)(g - m->grads);
    CHECK((o - b0) % 2 == 0, "model_expert_dw: layer %d's role %d starts at an odd element %zu of its block",
          l, (int)role, o - b0);
    return m->grads + b0 + (o - b0) / 2;
}

// Layer l's RECOMPUTE_* bits (model_state.h model_set_recompute): the model's in its first recompute_layers
// layers (every layer where 0), none in the others.
static inline int model_layer_recompute(const Model *m, int l) {
    return !m->recompute_layers || l < m->recompute_layers ? m->recompute : 0;
}

// Layer l's MoE weights in base (the routing bias and the shared expert where the config has them; a dense
// layer's MLP as sh_w1, sh_w3, sh_w2 and nothing else).
static inline void model_moe_weights(const Model *m, float *base, int l, MoeWeights *w) {
    memset(w, 0, sizeof *w);
    if (config_layer_dense(&m->c, l)) { // a dense layer: its MLP in the shared expert's place (moe.h)
        w->sh_w1 = model_param(m, base, PR_D_W1, l, -1);
        w->sh_w3 = model_param(m, base, PR_D_W3, l, -1);
        w->sh_w2 = model_param(m, base, PR_D_W2, l, -1);
        return;
    }
    w->router = model_param(m, base, PR_ROUTER, l, -1);
    w->w1 = model_param(m, base, PR_W1, l, m->e0);
    w->w3 = model_param(m, base, PR_W3, l, m->e0);
    w->w2 = model_param(m, base, PR_W2, l, m->e0);
    if (m->c.balance == BALANCE_AUX_FREE) w->route_bias = model_param(m, base, PR_ROUTE_BIAS, l, -1);
    if (m->c.n_shared_experts) {
        w->sh_w1 = model_param(m, base, PR_SH_W1, l, -1);
        w->sh_w3 = model_param(m, base, PR_SH_W3, l, -1);
        w->sh_w2 = model_param(m, base, PR_SH_W2, l, -1);
        if (m->c.shared_gate) w->sh_gate = model_param(m, base, PR_SH_GATE, l, -1);
    }
}

// The flags of a dense matmul_bwd into layer l's tensor of bit b (model_types.h DW_FRESH_*; the LM head's:
// DW_FRESH_HEAD): GM_DW_WRITE while the step has not written it yet (model_zero_grads left it), the bit
// then cleared; 0 (add) otherwise.
static inline int model_dw_write(Model *m, int l, int b) {
    uint8_t *f = b == DW_FRESH_HEAD ? &m->head_fresh : m->dw_fresh ? &m->dw_fresh[l] : NULL;
    if (!f || !(*f & b)) return 0;
    *f &= (uint8_t)~b;
    return GM_DW_WRITE;
}

// The dropout seed of the current slot's forward (0: none; model_types.h Model.drop_seed).
static inline uint64_t model_drop_seed(const Model *m) { return m->slots[m->cur][m->cur_slot].drop_seed; }
