// attention.h — the attention sublayer behind one interface, an attention variant (AttnVariant), that
// the block (block.c) and the model's memory (model_state.c) call: from the attention norm's output xn
// ((N,d), hidden format) to this rank's part of the output projection's rows, and back to xn's gradient.
// The block keeps what is common to every variant: the norm before it, the TP all-reduces after the
// output projection and after the input gradient (a variant's projections are split over TP ranks by
// heads: its input projections by columns, its output by rows), the residual, dropout on it (site 0),
// AMPipe's row chunks (rows [r0, r1) of the (b, t) order) and the timing.
// Two variants: GQA (attention.c): q/k/v projections with the families' biases and QK-norm (config.h),
// RoPE, the backend's attention op (with attention dropout: site 2) and o_proj; DeepSeek-V3's multi-head
// latent attention (mla.c): low-rank q and kv projections with their norms, a decoupled RoPE part of q and
// k, the same attention op with the value heads padded. attn_variant chooses by the config.
//
// What a variant provides (the block does not change):
//  - its weights in the parameter table: its ParamRoles (params.h), their per-layer tensors in
//    params.c's table order (HF names, shapes, the TP split in localize, init in params_init) and,
//    optionally, the dense projections whose first backward of a step writes the gradient
//    (model_state.c fresh_bit, then model_dw_write) or that only bf16 GEMMs read (params_bf16_ranges);
//  - its activations: the fields of AttnActs it keeps per layer (model_types.h), carved by acts_alloc
//    (their bytes) and given back by acts_free; with --recompute attn, acts_recompute points the
//    dropped ones at one shared copy and bwd_begin computes them again;
//  - its scratch in AttnScratch (scratch_init, scratch_free): float32 rows, gradients;
//  - its forward (fwd_in, fwd_rows, out_rows) and backward (bwd_begin, bwd_out_rows, bwd_rows, bwd_in);
//  - its KV-cached decode (decode.c: GQA's cache of keys and values, MLA's of its latent and rope key).
// Must not hold: the norms, residuals, the MoE, the TP all-reduces of the output and the input gradient
// (block.c), allocation outside the variant's own activations and scratch.
#pragma once
#include "model/model_types.h"

typedef struct AttnVariant {
    // Memory. The model's scratch (m->attn, sized for maxB x maxT; model_init, model_free).
    void (*scratch_init)(Model *m);
    void (*scratch_free)(Model *m);
    // A layer's activations for maxB x maxT rows, carved from A (arena.h: the lent memory where it fits).
    // rc: the layer's RECOMPUTE_* bits (model_access.h model_layer_recompute).
    void (*acts_alloc)(const Model *m, AttnActs *a, Arena *A, int rc);
    // m->recompute's RECOMPUTE_ATTN: the dropped activations point at the model's shared copy (allocated at
    // the first use), or the layer's own again.
    void (*acts_recompute)(Model *m, AttnActs *a, Arena *A, int rc);
    void (*acts_free)(const Model *m, AttnActs *a, const Arena *A);
    // Forward of layer l over B x T rows: fwd_in from the normed input xn (the whole micro-batch), then
    // for row ranges [r0, r1) covering it in order, fwd_rows (the attention of those query rows) and
    // out_rows (this rank's partial sums of the output projection of those rows into out, (r1-r0, d): the
    // block adds them over TP).
    void (*fwd_in)(Model *m, int l, AttnActs *a, const void *xn, int B, int T);
    void (*fwd_rows)(const Model *m, int l, AttnActs *a, int T, int r0, int r1);
    void (*out_rows)(Model *m, int l, const AttnActs *a, float *out, int r0, int r1);
    // Backward of layer l's last forward (B x T rows): bwd_begin first (recomputes what --recompute
    // dropped), then for row ranges in reverse order bwd_out_rows (the output projection's backward from
    // dout, rows [r0, r1) of the (N,d) gradient) and bwd_rows (the attention's), then bwd_in: writes dxn
    // (B x T, d), this rank's part of the normed input's gradient (the block adds them over TP). The weights'
    // gradients go into m->grads.
    void (*bwd_begin)(Model *m, int l, AttnActs *a, int B, int T);
    void (*bwd_out_rows)(Model *m, int l, const AttnActs *a, const float *dout, int r0, int r1);
    void (*bwd_rows)(Model *m, int l, const AttnActs *a, int T, int r0, int r1);
    void (*bwd_in)(Model *m, int l, const AttnActs *a, float *dxn, const void *xn, int B, int T);
} AttnVariant;

// The variant of config c: multi-head latent attention (mla.c) where the config has it, else GQA.
const AttnVariant *attn_variant(const ModelConfig *c);
extern const AttnVariant attn_mla;

// The attention op's shape on this rank: query heads H, key/value heads KV, head width hd (GQA: Hl, KVl,
// head_dim; latent attention: Hl, Hl, qk_nope_head_dim + qk_rope_head_dim, the value heads padded to it).
static inline void attn_op_shape(const Model *m, int *H, int *KV, int *hd) {
    *H = m->Hl;
    *KV = config_mla(&m->c) ? m->Hl : m->KVl;
    *hd = config_mla(&m->c) ? config_qk_head_dim(&m->c) : m->c.head_dim;
}
// The width of the values within those rows: latent attention's v_head_dim (the rest its zero padding:
// ops.h attention_fwd_v), else hd.
static inline int attn_op_hv(const Model *m) { return config_mla(&m->c) ? m->c.v_head_dim : m->c.head_dim; }
// What the variants share (attention.c), their AttnVariant entries: the attention op over the query rows
// [r0, r1) of the (b, t) order (fwd_rows: a->q, k, v -> att, lse, with attention dropout) and its backward
// (bwd_rows: m->attn.datt -> dq, dk, dv; kv_seen says which sequences' dk, dv are written); bwd_begin
// (--recompute attn: att and lse again); acts_recompute (att and lse shared or the layer's own); the
// release of every AttnActs and AttnScratch buffer (acts_free, scratch_free).
void attn_op_rows(const Model *m, int l, AttnActs *a, int T, int r0, int r1);
void attn_op_bwd_rows(Model *m, int l, const AttnActs *a, int T, int r0, int r1);
void attn_bwd_begin(Model *m, int l, AttnActs *a, int B, int T);
void attn_acts_recompute(Model *m, AttnActs *a, Arena *A, int rc);
void attn_acts_free(const Model *m, AttnActs *a, const Arena *A);
void attn_scratch_free(Model *m);

// Whether GQA's q, k, v go between their products and the attention in the hidden format, both ways (q
// width qd, k and v kvd on this rank; fp8_dense: --fp8-dense's table): nothing there reads them as float32
// (QK-norm, biases, --fp8-dense's float32 douts) and every product is wide enough for the bf16 GEMMs (ops.h
// MOE_GEMM_FP32_MAX_O: a narrow one is float32). attention.c's forward and backward and the cost model's
// bytes.
int gqa_qkv_hid(const ModelConfig *c, int qd, int kvd, int fp8_dense);

// GQA's parts that the KV-cached decode (decode.c) runs on new rows, the forward's one code:
// the q, k, v projections of layer l over n rows of the normed input xn (this rank's heads), with the
// family's biases (flags: matmul_fwd_multi's);
void gqa_qkv_fwd(Model *m, int l, float *q, float *k, float *v, const void *xn, int n, int flags);
// QK-norm of layer l over n rows (the config has one): q, k and their rstd from the projections qraw,
// kraw (this rank's heads). The full-width form over TP ranks adds its rows' sums over the TP group (a
// collective: every TP rank calls it);
void gqa_qk_norm_fwd(Model *m, int l, float *q, float *k, float *rstdq, float *rstdk, const float *qraw,
                     const float *kraw, int n);
// o_proj of layer l over n rows: out (n, d) = att Wo^T, att in the hidden format (this rank's heads; the
// tensor-parallel sum is the caller's).
void gqa_oproj_fwd(Model *m, int l, float *out, const void *att, int n);

// Latent attention's parts (mla.c) that the KV-cached decode runs on new rows, the forward's one code:
// the projections of layer l from xn (hidden format; B sequences' rows at positions [t0, t1)): q32 (rows,
// Hl*hq) float32 with RoPE on its rope columns, the kv latent after its norm into a->ckvn (hidden format),
// the rope key kr (rows, qk_rope) float32 after RoPE; a->qa, qan, rstd_qa, ckv, rstd_kv: the intermediates
// (the backward's; scratch for the decode);
void mla_proj_fwd(Model *m, int l, AttnActs *a, float *q32, float *kr, const void *xn, int B, int t0, int t1);
// the attention op's operands in the hidden format: q (nq rows) from q32, times YaRN's softmax factor; k
// and v (nkv rows, v padded with zeros to hq) from the latent ckvn through kv_b (its output in kvb, float32
// scratch of nkv rows) and the rope key kr (nkv rows, one per position, shared by the heads);
void mla_heads_fwd(Model *m, int l, void *q, void *k, void *v, const float *q32, int nq, float *kvb,
                   const void *ckvn, const float *kr, int nkv);
// o_proj over n rows of the attention output att (hidden format, (n, Hl*hq)): its value columns into ao
// (hidden format, (n, Hl*v_head_dim)), then out (n, d) = ao Wo^T (this rank's partial sums).
void mla_oproj_fwd(Model *m, int l, float *out, void *ao, const void *att, int n);
