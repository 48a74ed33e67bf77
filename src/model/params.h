// params.h — the parameter table: the single list of the model's tensors (HF Mixtral names),
// their shapes, offsets into one flat buffer, and how each is split and reduced in a mesh.
// Everything that walks tensors (optimizer, checkpoint, grad buckets, ZeRO, export) uses this.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "model/config.h"

typedef enum {
    PR_EMBED, PR_ATTN_NORM, PR_WQ, PR_WK, PR_WV, PR_WO, PR_FFN_NORM, PR_ROUTER,
    PR_W1, PR_W3, PR_W2, PR_FINAL_NORM, PR_LM_HEAD
} ParamRole;

typedef enum { RED_DP = 0, RED_EDP = 1 } ReduceGroup;        // dense params: DP; expert params: EDP
typedef enum { SPLIT_REPL = 0, SPLIT_COL, SPLIT_ROW, SPLIT_VOCAB } TpSplit;  // how TP splits a dense tensor

typedef struct {
    char name[96];        // HF name, e.g. model.layers.3.block_sparse_moe.experts.5.w1.weight
    int ndim;
    int64_t shape[2];     // full logical shape (row-major; Linear weights are (out, in))
    size_t numel;
    size_t offset;        // element offset into the flat buffer
    ParamRole role;
    int layer;            // -1 for embed / final norm / lm_head
    int expert;           // -1 unless an expert tensor
    ReduceGroup reduce;
    TpSplit tp_split;     // for expert tensors: ETP splits along f (w1/w3 rows, w2 cols)
    int decay;            // 1: weight decay applies (matrices); 0: norms
} ParamSpec;

typedef struct {
    ParamSpec *p;
    int n;
    size_t total;         // elements in the flat buffer
} ParamTable;

// Order: embed; per layer: attn_norm, q, k, v, o, ffn_norm, router, w1[0..E), w3[0..E), w2[0..E);
// final norm; lm_head. So each layer's expert w1 block is one contiguous (E, f, d) array.
void params_build(ParamTable *t, const ModelConfig *c);
void params_free(ParamTable *t);
int params_find(const ParamTable *t, const char *name);  // index or -1
// Index of a role in a layer (expert = -1 for non-expert roles).
int params_index(const ParamTable *t, ParamRole role, int layer, int expert);

// Deterministic init from seed: norms = 1, linears ~ N(0, init_std), o_proj/w2 scaled by 1/sqrt(2L).
void params_init(const ParamTable *t, const ModelConfig *c, float *flat, uint64_t seed);
