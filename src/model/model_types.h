// model_types.h — the model's state as data: the Model struct and its parts (the mesh as the model sees
// it; a layer's activations, the attention variant's among them (AttnActs) and its model-wide scratch
// (AttnScratch); a chunk of layers; the activations of one micro-batch, a slot) and the constants that
// size and select them. The files of src/model fill and read it (model_state.c allocates it, block.c,
// attention.c and model.c run over it); callers read the results of the last forward and set the few
// fields model.h names (dropout, drop_seed, grads_ready, moe_timing).
// Must not hold: functions (model_state.h, model.h: the API; model_access.h: src/model's accessors), MPI,
// NCCL or CUDA names.
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

// The attention variant's activations of one layer, kept for its backward (attention.h; GQA's today).
typedef struct {
    void *q, *k, *v; // (N,H*hd) (N,KV*hd) (N,KV*hd), after RoPE, in the hidden format (ops.h Backend.hid)
    float *qraw, *kraw, *rstdq, *rstdk; // QK-norm: q, k before their norms; rstd (N*H or N) (N*KV or N)
    void *att; // (N,H*hd) the attention output, in the hidden format (ops.h Backend.hid)
    float *lse; // (B,H,T)
    int shared; // att and lse are the model's shared ones (AttnScratch att_rc, lse_rc: --recompute attn)
    // latent attention (mla.c; q, k, v, att: (N, Hl*hq), hq = qk_nope + qk_rope head dims, v padded): q_a's
    // output (N, q_lora_rank) and the kv latent (N, kv_lora_rank) before their norms, their rstd (N), after
    // their norms (hidden format: q_b's and kv_b's input); ao (N, Hl*v_head_dim) o_proj's input (hidden)
    float *qa, *rstd_qa, *ckv, *rstd_kv;
    void *qan, *ckvn, *ao;
} AttnActs;

// The attention variant's scratch, one for the model (attention.h; GQA's today).
typedef struct {
    float *dq, *dk, *dv,
        *datt; // (dq, dk, dv: in a forward, its float32 q, k, v before RoPE rounds
               // them into the layer's; rows (N,H*hd) (N,KV*hd) (N,KV*hd))
    float *dq2, *dk2; // QK-norm: gradients of q, k before their norms
    float *ones; // (maxN) 1.0: the q/k/v biases as rank-1 GEMMs (ones x bias^T)
    double *qk_sums; // (2, maxN) full-width QK-norm over TP: q's and k's row sums, all-reduced
    uint8_t *kv_seen; // (maxB) a layer's backward: the sequences whose dk, dv it wrote
    void *att_rc; // --recompute attn: every layer's attention output (hidden format) and lse,
    float *lse_rc; // shared
    // latent attention (mla.c): kv_b's output (N, Hl*(qk_nope + v)) in a forward, its gradient in a backward;
    // the rope key (N, qk_rope) likewise; the gradients of q_a's output and of the latent after (dqan,
    // dckvn) and before (dqa, dckv) their norms; o_proj's input gradient (N, Hl*v)
    float *kvb, *kr, *dqan, *dqa, *dckvn, *dckv, *dao;
} AttnScratch;

typedef struct {
    float *res_in; // (N,d) layer input (residual stream)
    void *xn1; // (N,d) the attention norm's output, in the hidden format (ops.h Backend.hid)
    float *rstd1; // (N)
    AttnActs attn; // the attention variant's
    float *x_mid; // (N,d) after the attention residual
    float *xn2, *rstd2; // (N,d) (N)
    MoeLayer moe; // the layer's MoE state (its statistics: merged over the chunks)
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

// An MTP module's activations of one micro-batch (mtp.h; config.h mtp_depth), beside its block's LayerActs
// (la[n_layers + k - 1]): es (N,d) the shifted tokens' embeddings (rows past a sequence's end zero), rstd_e,
// rstd_h (N) the enorm's and hnorm's, cat (N,2d) eh_proj's input [enorm(es) | hnorm(h_{k-1})], out (N,d)
// the block's output, xn (N,d) and rstd (N) its shared_head.norm (h_k, the next module's input), logits
// (N,V) (after a training forward: dlogits; with --loss-chunks a chunk's rows), losses (N), targets (N:
// t[i+k+1], 0 where none), dxh (N,d; --loss-chunks > 1) the head's input gradient, taken in the forward.
typedef struct {
    float *es, *rstd_e, *rstd_h, *cat, *out, *xn, *rstd, *logits, *losses, *dxh;
    int32_t *targets;
} MtpActs;

// The MTP modules' scratch, one for the model (mtp.h): split (2N,d) the two norms' outputs, then
// their rows interleaved into cat (forward), the gradients of cat's halves (backward); dcat (N,2d);
// dh (N,d) the gradient reaching h_{k-1}; demb (N,d) the embedding output's gradient from every module;
// idx (device) the row maps of the micro-batch shape (B, T) (idx_h: on the host): per module k a shift
// (row i <- row i+k of its sequence, -1 past its end) and its inverse, then eh_proj's interleave and
// de-interleave (2N each); tgt_h (N) host targets.
typedef struct {
    float *split, *dcat, *dh, *demb;
    int32_t *idx, *idx_h, *tgt_h;
    int B, T; // the shape idx holds (0: none yet)
} MtpScratch;

// The activations of one micro-batch on one chunk (la[l] allocated for the chunk's layers only; the
// logits on the last virtual stage, tokens kept for the embedding's backward on the first; with
// --loss-chunks > 1 the logits a chunk's rows and dxh (N,d) the head's input gradient, taken in the forward).
typedef struct {
    LayerActs *la;
    float *res_final, *xn_f, *rstd_f, *logits, *losses, *dxh;
    int32_t *tokens, *targets;
    int B, T;
    uint64_t drop_seed; // the dropout seed of the forward held here (its backward's mask)
    Arena head; // model_share_grads: the last layer's expert gradients, lent to the logits
    MtpActs *mtp; // (mtp_depth) the MTP modules' (on the last virtual stage; else NULL)
    float *mtp_emb; // (N,d) the MTP modules' embedding rows: the first virtual stage's embedding output,
                    // received (on a last virtual stage that is not the first; else NULL)
} ModelSlot;

// Activation recomputation (model_state.h model_set_recompute): bits.
enum { RECOMPUTE_NONE = 0, RECOMPUTE_ATTN = 1, RECOMPUTE_MOE = 2, RECOMPUTE_FULL = 3 };
// The tensors whose first backward of a step writes their gradient (model_state.h model_zero_grads).
enum { DW_FRESH_EXPERTS = 1, DW_FRESH_QKV = 2, DW_FRESH_O = 4, DW_FRESH_HEAD = 8 };
// AMPipe: the most chunks of a micro-batch's rows (model_state.h model_set_ampipe).
#define AMPIPE_MAX 8

struct AttnVariant; // attention.h

typedef struct Model {
    ModelConfig c;
    ModelMesh mesh;
    int Hl, KVl, El, e0; // local heads, kv heads, experts, first local expert
    ParamTable t; // local slices (t.ltotal elements per flat buffer)
    const Backend *be;
    const struct AttnVariant *attv; // the attention sublayer (attention.h attn_variant)
    float *params, *grads; // flat, t.total elements each (backend memory)
    int maxB, maxT, maxN;
    ModelChunk chunk[MODEL_MAX_CHUNKS];
    int nchunks, cur; // this rank's chunks (one without pipeline stages); the current one
    ModelSlot *slots[MODEL_MAX_CHUNKS]; // each chunk's slots (its live micro-batches)
    int nslots[MODEL_MAX_CHUNKS], cur_slot;
    // the current slot's activations (model_use sets these views)
    LayerActs *la; // (L + mtp_depth: the MTP modules' blocks after the main layers)
    MtpActs *mtp; // (mtp_depth) on the last virtual stage
    float *mtp_emb; // (N,d) the embedding output the modules read, from the first virtual stage (pp)
    float *res_final, *xn_f, *rstd_f; // (N,d) (N,d) (N); res_final: the chunk's output
    float *logits; // (N,V) (on the last stage; V: this rank's columns, vocab.h); after a training forward:
                   // dlogits (--loss-chunks > 1: the last chunk's rows; the head's input gradient in dxh)
    float *dxh; // (N,d) --loss-chunks > 1: the LM head's input gradient, taken in the forward
    float *losses; // (N) per-token cross-entropy
    int32_t *tokens, *targets; // (N)
    // backward scratch
    float *dres, *dxn; // (N,d) the gradients of the residual stream and of a norm's output
    float *moe_out; // (maxN,d) a block's MoE output until it joins the residual stream, under residual
                    // dropout (without it the combine writes the block's output: block.c moe_dst); forward
                    // only: one for every layer and slot; dxn's memory where the MoE scratch is lean:
                    // moe.h moe_scratch_init)
    AttnScratch attn; // the attention variant's
    float *ddrop; // (2,N,d) the residual branches' masked gradients (allocated at the first dropout)
    float *loss_h; // (maxN) host: the forward's per-token losses, summed
    // the vocabulary's ends (vocab.h): vocab_ids (maxN, host) a call's ids as this rank's; split over TP,
    // vocab_parts (device) the cross-entropy's parts (ops.h ce_part: 3 doubles a row), this rank's (N,3) then
    // every TP rank's (TP,N,3), also the gathered row of vocab_row_to_host (V floats) (NULL where whole)
    int32_t *vocab_ids;
    double *vocab_parts;
    int64_t *budget_h; // host: AMPipe's capacity budgets and their counts (allocated at the first use)
    // Dropout (training only): the caller sets dropout (p, kept for the backwards) and drop_seed (a function
    // of the seed, step and micro-batch; 0 = none: no op runs) before a forward; the forward keeps the seed
    // in its slot for the backward. Layer l's sites use the seed dropout_hash(drop_seed, l, site) (site 0:
    // the attention output after o_proj and its TP all-reduce; 1: the MoE output), each before its residual
    // add, over the global token index (dp rank * N + b * T + t: the same mask on any mesh); site 2, with the
    // config's attention_dropout > 0, the attention probabilities (attention_drop_fwd/bwd: global heads).
    // embed_dropout: the token embeddings' (the seed dropout_hash(drop_seed, -1, 3)), after the lookup.
    float dropout, embed_dropout;
    uint64_t drop_seed;
    MoeScratch ms;
    MtpScratch mtps; // the MTP modules' (config.h mtp_depth > 0)
    // optional: called during model_backward as soon as a group of gradients is final: layer =
    // n_layers + mtp_depth for the LM head and final norm, l for layer l (n_layers + k - 1: MTP module k's
    // tensors), -1 for the embedding
    void (*grads_ready)(void *ctx, int layer);
    void *grads_ready_ctx;
    // model_zero_grads: the ranges it zeroes (every tensor but those whose first backward of the step writes
    // them: the routed experts', the q/k/v and o projections', the LM head's), and per layer which of those
    // are still unwritten this step (DW_FRESH_* bits; the LM head's: head_fresh)
    size_t *zr_off, *zr_n;
    int nzr;
    uint8_t *dw_fresh; // (n_layers + mtp_depth)
    uint8_t head_fresh;
    // results of the last forward. On a chunk that is not the first, aux, z, dropped, hf_fe and
    // hf_pe come in from the previous stage (the caller sets them) and the forward adds its layers';
    // the last chunk's forward leaves them complete (hf_fe then holds HF's final F_i, which the
    // backward of every earlier chunk needs: the caller sets it there before model_backward).
    int B, T;
    double aux, z; // mean over layers of the per-layer router losses (global)
    // MTP (with targets): mtp_loss = the mean over the modules of their mean cross-entropy (this rank's
    // tokens; the objective adds mtp_weight * mtp_loss); mtp_aux, mtp_z: the modules' router losses over
    // the main model's MoE layer count (each module's router at a main layer's coefficient: the objective
    // adds aux_coef * mtp_aux, z_coef * mtp_z); not in aux and z, which stay the main model's
    double mtp_loss, mtp_aux, mtp_z;
    int64_t *expert_counts; // (L + mtp_depth, E) assignments per expert before capacity drops (global;
                            // rows of the current chunk's layers written by its forward)
    int64_t dropped; // assignments dropped by capacity, all layers (global)
    double *hf_fe, *hf_pe; // (E) aux_form hf: assignments and probability mass over the layers
    // (per layer arrays: L = every layer, the MTP modules' blocks included: config.h config_all_layers)
    int64_t *scope_counts, *scope_tokens; // (L,E) (L) aux scope global: the step's counts and tokens so far
    int *moe_overlap; // (L) each MoE layer's overlap degree for the next forwards (moe.h)
    int *moe_mode; // (L) each MoE layer's expert mode (MOE_SHARDED / MOE_GATHERED)
    int fp8_dispatch; // every MoE layer's m->fp8_dispatch (model_set_fp8_dispatch)
    int loss_chunks; // the LM head's row chunks (model_set_loss_chunks; vocab.h vocab_head_chunks)
    int *ampipe; // (L) each layer's AMPipe chunks in training forwards (1 = none)
    int share_grads; // model_share_grads
    size_t embed_lent; // the bytes of the embedding's gradient, where it holds layer 0's activations (lent
                       // with the lean MoE scratch: moe.h); model_backward zeroes it before its backward
    int expert_gbf; // model_set_expert_grads (ops.h OPTG_*)
    unsigned char *grad_hole; // (L) or NULL: 1 where layer l's expert block keeps only its packed half (the
                              // rest a hole of Backend.alloc_holes: model_share_grads)
    int dw_sumsq; // model_set_dw_sumsq
    int recompute; // RECOMPUTE_* bits (model_set_recompute)
    int recompute_layers; // the layers [0, recompute_layers) recompute (0: every layer)
    MoeRecompute rc; // --recompute moe: every layer's experts' SwiGLU rows, shared
    int moe_timing; // 1: time each block's forward from attention on and its MoE's backward
                    // (synchronised) into moe_time
    double *moe_time; // (L) seconds, added up until the caller resets them
} Model;
