// model.h — the Mixtral-style MoE transformer on a Backend: parameters and gradients as flat
// buffers laid out by the parameter table, activations of live micro-batches (slots), forward,
// backward. With pipeline stages a rank holds chunks of layers (its virtual stages, ModelMesh.sl)
// and the forward and backward run the current chunk only: the embedding on the first virtual
// stage, the final norm, LM head and loss on the last; between stages the caller moves the residual
// stream (model_stage_in / model_stage_out, m->dres) and the router statistics carried along (aux,
// z, dropped, hf_fe/hf_pe).
// On a mesh the forward and backward include the collectives that are part of the math (the
// attention output's and its input gradient's all-reduce over TP, the full-width QK-norm's row sums over
// TP; the MoE layer's exchanges), through the comm API (parallel/comm.h), a layer below: model/ knows
// nothing of MPI, NCCL or CUDA.
// Must not hold: optimizer, data, files, MPI/NCCL/CUDA calls, or the gradient reductions across
// DP/EDP (train/dist.c).
#pragma once
#include <stdint.h>
#include "core/config.h"
#include "model/params.h"
#include "moe/moe.h"
#include "ops/arena.h"
#include "ops/ops.h"
#include "parallel/comm.h"

// The mesh as the model sees it (NULL groups = size 1). Each DP rank runs B of the global
// micro-batch's sequences; TP splits attention heads; EP/ETP split experts (see moe.h).
typedef struct {
    const Comm *tp, *dp, *ep, *etp, *edp, *stage;
    ParamSlicing sl;
    const Comm *epn, *epx; // the MoE's two-level all-to-all (NULL: flat)
} ModelMesh;

typedef struct {
    float *res_in; // (N,d) layer input (residual stream)
    void *xn1; // (N,d) the attention norm's output, in the hidden format (ops.h hid_elem)
    float *rstd1; // (N)
    void *q, *k, *v; // (N,H*hd) (N,KV*hd) (N,KV*hd), after RoPE, in the hidden format (ops.h hid_elem)
    float *qraw, *kraw, *rstdq, *rstdk; // QK-norm: q, k before their norms; rstd (N*H or N) (N*KV or N)
    void *att; // (N,H*hd) the attention output, in the hidden format (ops.h hid_elem)
    float *lse; // (B,H,T)
    float *x_mid; // (N,d) after the attention residual
    float *xn2, *rstd2; // (N,d) (N)
    MoeLayer moe; // the layer's MoE state (its statistics: merged over the chunks)
    int att_shared; // att and lse are the model's shared ones (--recompute attn)
    MoeLayer *mc; // (nmc) AMPipe: each chunk's MoE state (rows [R_j, R_j+1))
    int nmc;
    int nrun; // the chunks the last forward ran (1: unchunked, state in moe)
    Arena arena; // model_share_grads: the previous layer's expert gradients, lent (else none)
} LayerActs;

// A chunk: the layers [l0, l1) of one virtual stage; first: it embeds the tokens; last: it holds the
// final norm, the LM head and the loss.
typedef struct {
    int l0, l1, first, last;
} ModelChunk;
#define MODEL_MAX_CHUNKS 16

// The activations of one micro-batch on one chunk (la[l] allocated for the chunk's layers only; the
// logits on the last virtual stage, tokens kept for the embedding's backward on the first).
typedef struct {
    LayerActs *la;
    float *res_final, *xn_f, *rstd_f, *logits, *losses;
    int32_t *tokens, *targets;
    int B, T;
    uint64_t drop_seed; // the dropout seed of the forward held here (its backward's mask)
    Arena head; // model_share_grads: the last layer's expert gradients, lent to the logits
} ModelSlot;

typedef struct {
    ModelConfig c;
    ModelMesh mesh;
    int Hl, KVl, El, e0; // local heads, kv heads, experts, first local expert
    ParamTable t; // local slices (t.ltotal elements per flat buffer)
    const Backend *be;
    float *params, *grads; // flat, t.total elements each (backend memory)
    int maxB, maxT, maxN;
    ModelChunk chunk[MODEL_MAX_CHUNKS];
    int nchunks, cur; // this rank's chunks (one without pipeline stages); the current one
    ModelSlot *slots[MODEL_MAX_CHUNKS]; // each chunk's slots (its live micro-batches)
    int nslots[MODEL_MAX_CHUNKS], cur_slot;
    // the current slot's activations (model_use sets these views)
    LayerActs *la; // (L)
    float *res_final, *xn_f, *rstd_f; // (N,d) (N,d) (N); res_final: the chunk's output
    float *logits; // (N,V) (on the last stage); after a training forward: dlogits
    float *losses; // (N) per-token cross-entropy
    float *losses_h; // (maxN) their host copy (model_forward's mean)
    int64_t *budget_h; // AMPipe's capacity budgets: (AMPIPE_MAX,k,E), and the stage's slot counts they
                       // come from, (S,k,E) and (S,AMPIPE_MAX,k,E)
    int32_t *tokens, *targets; // (N)
    // backward scratch
    float *dres, *dxn, *dq, *dk, *dv,
        *datt; // (dq, dk, dv: in a forward, its float32 q, k, v before RoPE rounds
               // them into the layer's; rows (N,H*hd) (N,KV*hd) (N,KV*hd))
    float *moe_out; // (maxN,d) a block's MoE output until it joins the residual stream (forward
                    // only: one for every layer and slot)
    float *dq2, *dk2; // QK-norm: gradients of q, k before their norms
    float *ones; // (maxN) 1.0: the q/k/v biases as rank-1 GEMMs (ones x bias^T)
    double *qk_sums; // (2, maxN) full-width QK-norm over TP: q's and k's row sums, all-reduced
    float *ddrop; // (2,N,d) the residual branches' masked gradients (allocated at the first dropout)
    // Dropout (training only): the caller sets dropout (p, kept for the backwards) and drop_seed (a function
    // of the seed, step and micro-batch; 0 = none: no op runs) before a forward; the forward keeps the seed
    // in its slot for the backward. Layer l's sites use the seed dropout_hash(drop_seed, l, site) (site 0:
    // the attention output after o_proj and its TP all-reduce; 1: the MoE output), each before its residual
    // add, over the global token index (dp rank * N + b * T + t: the same mask on any mesh); site 2, with the
    // config's attention_dropout > 0, the attention probabilities (attention_drop_fwd/bwd: global heads).
    float dropout;
    uint64_t drop_seed;
    MoeScratch ms;
    // optional: called during model_backward as soon as a group of gradients is final:
    // layer = n_layers for the LM head and final norm, l for layer l, -1 for the embedding
    void (*grads_ready)(void *ctx, int layer);
    void *grads_ready_ctx;
    // model_zero_grads: the ranges it zeroes (every tensor but those whose first backward of the step writes
    // them: the routed experts', the q/k/v and o projections', the LM head's), and per layer which of those
    // are still unwritten this step (DW_FRESH_* bits; the LM head's: head_fresh)
    size_t *zr_off, *zr_n;
    int nzr;
    uint8_t *dw_fresh; // (n_layers)
    uint8_t head_fresh;
    uint8_t *kv_seen; // (maxB) model_backward: the sequences whose dk, dv this layer wrote
    // results of the last forward. On a chunk that is not the first, aux, z, dropped, hf_fe and
    // hf_pe come in from the previous stage (the caller sets them) and the forward adds its layers';
    // the last chunk's forward leaves them complete (hf_fe then holds HF's final F_i, which the
    // backward of every earlier chunk needs: the caller sets it there before model_backward).
    int B, T;
    double aux, z; // mean over layers of the per-layer router losses (global)
    int64_t *expert_counts; // (L,E) assignments per expert before capacity drops (global; rows
                            // of the current chunk's layers written by its forward)
    int64_t dropped; // assignments dropped by capacity, all layers (global)
    double *hf_fe, *hf_pe; // (E) aux_form hf: assignments and probability mass over the layers
    int64_t *scope_counts, *scope_tokens; // (L,E) (L) aux scope global: the step's counts and tokens so far
    int *moe_overlap; // (L) each MoE layer's overlap degree for the next forwards (moe.h)
    int *moe_mode; // (L) each MoE layer's expert mode (MOE_SHARDED / MOE_GATHERED)
    int *ampipe; // (L) each layer's AMPipe chunks in training forwards (1 = none)
    int share_grads; // model_share_grads
    int expert_gbf; // model_set_expert_grads (ops.h OPTG_*)
    int recompute; // RECOMPUTE_* bits (model_set_recompute)
    MoeRecompute rc; // --recompute moe: every layer's experts' SwiGLU rows, shared
    void *att_rc; // --recompute attn: every layer's attention output (hidden format) and lse,
    float *lse_rc; // shared
    int moe_timing; // 1: time each block's forward from attention on and its MoE's backward
                    // (synchronised) into moe_time
    double *moe_time; // (L) seconds, added up until the caller resets them
} Model;

// Allocates parameters, gradients and activations for micro-batches up to maxB x maxT (per DP
// rank). mesh may be NULL (one process).
// One slot; chunks from mesh->sl.pp_split (NULL: one chunk of every layer).
void model_init(Model *m, const ModelConfig *c, const Backend *be, int maxB, int maxT, const ModelMesh *mesh);
void model_free(Model *m);
// Activations for n live micro-batches of chunk c (n >= 1; the pipeline schedule's live[c]).
void model_set_slots(Model *m, int chunk, int n);
// Gradient memory shared with activations (on = 1; 0: separate, as model_init leaves it), for a caller
// that runs one forward and its backward per step on one chunk of one slot (no gradient accumulation, no
// pipeline stages: refused otherwise): layer l's routed-expert gradients (written by its backward, ops.h
// GM_DW_WRITE, after layer l+1's backward read its activations for the last time) hold layer l+1's
// activations, as many as fit in that order (the norms' and attention's, then its MoE's kept rows), and
// the last layer's hold the logits; they are overwritten by the next forward, so they are read before it
// (the norm, the update). The same bits as separate memory; less memory by about a layer's expert
// gradients per layer. Set before forwards (it allocates the slot again).
void model_share_grads(Model *m, int on);
// The format of the routed experts' weight gradients (the bf16 policy's: ops.h OptRun gbf): OPTG_F32 (as
// model_init leaves it), OPTG_BF16 (float32 memory, read rounded to bf16 by the optimizer: a caller whose
// gradients are summed over ranks first) or OPTG_PACKED (each layer's backward writes them as bf16, ops.h
// GM_DW_BF16, packed from each weight kind's first expert of the layer: half the bytes written and read).
// OPTG_PACKED needs every expert gradient written once a step (one micro-batch, one chunk: moe refuses
// an accumulation), nothing reducing them, and readers that follow model_grad_format. Set before the
// optimizer's runs are built (dist_attach).
void model_set_expert_grads(Model *m, int gbf);
// The format of tensor s's gradient (OptRun gbf) and, where packed, the element its block starts at (*gb).
int model_grad_format(const Model *m, const ParamSpec *s, int64_t *gb);
// The bf16 policy's weight storage (ops.h alloc_bf16_params): the weights that only bf16 GEMMs read (the
// routed experts', the attention projections' and the LM head's: params.h params_bf16_ranges) live in the
// backend's bf16 copy alone, without float32 memory (4 bytes a parameter
// less). Only for a caller whose weights are bf16 values (--precision bf16, rounded) and that writes the
// parameters through to_device and adamw_runs alone (one process: no collective writes them). Call
// before the parameters are written (they are allocated again, zeroed) and register the copy with
// bf16_shadow(params, ltotal) after. Returns 0 where the backend keeps no bf16 copy (nothing changes).
int model_bf16_weights(Model *m);
// Selects the chunk the next forward/backward runs and the slot holding its micro-batch.
void model_use(Model *m, int chunk, int slot);
// The current chunk's input (its first layer's residual stream: the caller fills it on a chunk that
// is not the first) and output (the caller sends it on a chunk that is not the last). (N,d)
float *model_stage_in(const Model *m);
float *model_stage_out(const Model *m);
// Does this rank hold layer l (in one of its chunks)?
int model_holds_layer(const Model *m, int l);
// Layer l's MoE state in its chunk's slot (l held by this rank).
MoeLayer *model_moe(Model *m, int l, int slot);
// The pipelined exchange's overlap degree of layer l's MoE (1 = none; moe.h) for the next forwards.
void model_set_overlap(Model *m, int l, int r);
// Layer l's expert mode (moe.h: MOE_SHARDED or MOE_GATHERED; only matters with ETP > 1).
void model_set_expert_mode(Model *m, int l, int mode);
// Activation recomputation: RECOMPUTE_MOE drops the experts' SwiGLU rows (h1, h3, act; moe.h
// MoeRecompute), RECOMPUTE_ATTN the attention output and its log-sum-exp, from what each layer keeps;
// the backward computes them again from the kept inputs (q, k, v; the expert rows) with the same
// kernels, so the gradients are the same bits as keeping them. Memory: one layer's worth instead of
// every layer's; time: those forwards once more. Set before forwards, not between one and its backward.
enum { RECOMPUTE_NONE = 0, RECOMPUTE_ATTN = 1, RECOMPUTE_MOE = 2, RECOMPUTE_FULL = 3 };
void model_set_recompute(Model *m, int mode);
// AMPipe: the training forwards (dloss != 0) run each block from attention on in n chunks of the
// micro-batch's rows (chunk j: rows [R_j, R_j+1), R_j = N j / n of the (b, t) order: pieces of
// sequences), so that chunk j's MoE exchange is in flight while chunk j+1's attention runs. Chunk j's
// attention is its query rows against every key before them (the same bits as unchunked). Dropless:
// each chunk is routed, planned and dispatched before the next chunk's attention. Capacity: the
// routers of all chunks run first (a token's drop depends on every earlier token's routing), then
// the budgets of the whole micro-batch (exactly n = 1's drops), then the chunks' exchanges, each
// chunk's dispatch in flight during the previous chunk's experts. The aux and z losses are the whole
// micro-batch's. Backward: the chunks in reverse, chunk j-1's dy dispatch in flight while chunk j's
// attention backward runs (its query rows; dk/dv add up over the chunks). Each attention row is n = 1's
// bits; the GEMM libraries pick kernels by row count and the weight and key/value gradients' sums are
// split by chunk, so n > 1 equals n = 1 to round-off (tests/test_ampipe.sh).
// n in 1, 2, 4, 8 (AMPIPE_MAX), per layer; evaluation forwards run unchunked. With moe_timing the
// layer's time covers the block from attention on (the chunks interleave attention and MoE).
#define AMPIPE_MAX 8
void model_set_ampipe(Model *m, int l, int n);

// Forward of the current chunk over tokens (B,T) (host; read on the first chunk). targets (host; read
// on the last chunk) may be NULL: logits only.
// dloss != 0 (training): m->logits is overwritten with dlogits for a loss scaled by dloss per token,
// ready for model_backward. noise_seed != 0 enables router jitter. Returns the mean cross-entropy
// of this rank's tokens (0 when targets is NULL or the chunk is not the last).
double model_forward(Model *m, const int32_t *tokens, const int32_t *targets, int B, int T, float dloss,
                     uint64_t noise_seed);
// Accumulates into m->grads the gradient of  dloss * sum_t ce_t + aux_scale * aux + z_scale * z
// (aux and z are the layer means) for the current slot's forward (which must have had dloss != 0),
// over the current chunk's layers: on a chunk that is not the last, m->dres must hold the gradient
// of its output; on one that is not the first, m->dres ends holding the gradient of its input.
void model_backward(Model *m, float aux_scale, float z_scale);
// The gradient buffer for a new step: zeroes every tensor but the routed experts' weights (w1, w3, w2:
// most of a MoE model's gradient bytes), the attention's q/k/v and o projections and the LM head, which
// each layer's (the last chunk's) first backward of the step writes instead of adding to (ops.h
// GM_DW_WRITE: the same bits as adding into zeros, without the zero fill and the read of the zeros).
// model_grads_settle, after the step's last backward, zeroes those of a layer whose backward did not run
// (none, in the schedules there are; a guard). A caller that zeroes m->grads itself (be->zero) gets the plain
// accumulating backward.
enum { DW_FRESH_EXPERTS = 1, DW_FRESH_QKV = 2, DW_FRESH_O = 4, DW_FRESH_HEAD = 8 };
void model_zero_grads(Model *m);
void model_grads_settle(Model *m);

// The q, k, v projections of layer l over n rows of the normed input xn (this rank's heads), with the
// family's biases: the forward's and the KV-cached decode's one code.
void model_qkv_fwd(Model *m, int l, float *q, float *k, float *v, const void *xn, int n);
// Layer l's o_proj over n rows: out (n, d) = att Wo^T, att in the hidden format (this rank's heads; the
// tensor-parallel sum is the caller's): the forward's and the KV-cached decode's one call.
void model_oproj_fwd(Model *m, int l, float *out, const void *att, int n);

// QK-norm of layer l over n rows (the config has one): q, k and their rstd from the projections qraw,
// kraw (this rank's heads). The full-width form over TP ranks adds its rows' sums over the TP group (a
// collective: every TP rank calls it). The forward's and the KV-cached decode's (decode.c) one code.
void model_qk_norm_fwd(Model *m, int l, float *q, float *k, float *rstdq, float *rstdk, const float *qraw,
                       const float *kraw, int n);

// aux scope global: start a new step's running statistics (the trainer calls it before each step).
void model_scope_reset(Model *m);

// Row of logits (V floats, host) at position (b, t) of the last forward.
void model_logits_row(const Model *m, int b, int t, float *out);
