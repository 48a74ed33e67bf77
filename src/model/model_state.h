// model_state.h — the model's memory and state (model_state.c): parameters, gradients and the
// activations of live micro-batches (slots) on this rank's chunks of layers, allocated, shared with the
// gradients' memory, freed; the settings the next forwards and backwards follow (slots, recompute,
// AMPipe chunks, the MoE's overlap and expert mode, the expert gradients' format); the gradient buffer
// for a new step. The structs: model_types.h; forward and backward: model.h (which includes this).
// Must not hold: forward or backward arithmetic (model.c, block.c, attention.c), optimizer, data, files.
#pragma once
#include <stdint.h>
#include "model/model_types.h"

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
// gradients per layer. Set before forwards (it allocates the slot again). With packed expert gradients
// (model_set_expert_grads OPTG_PACKED, set before) on a backend with alloc_holes (ops.h), a layer whose lent
// activations all fit in its block's packed half keeps only that half (the rest of its float32 bytes a
// hole: 2 bytes a routed-expert parameter less; under --recompute moe every layer's but the last's, whose
// block holds the logits), the same bits again.
void model_share_grads(Model *m, int on);
// The layers whose expert block keeps only its packed half (model_share_grads), in *layers, and the bytes
// of their holes (the float32 bytes past the packed halves; the backend takes back the whole pages in them).
size_t model_grad_holes(const Model *m, int *layers);
// The format of the routed experts' weight gradients (the bf16 policy's: ops.h OptRun gbf): OPTG_F32 (as
// model_init leaves it), OPTG_BF16 (float32 memory, read rounded to bf16 by the optimizer: a caller whose
// gradients are summed over ranks first) or OPTG_PACKED (each layer's backward writes them as bf16, ops.h
// GM_DW_BF16, packed from the first element of the layer's expert block: w1's, w3's and w2's values one after
// the other in the block's first half; half the bytes written and read).
// OPTG_PACKED needs every expert gradient written once a step (one micro-batch, one chunk: moe refuses
// an accumulation), nothing reducing them, and readers that follow model_grad_format. Set before the
// optimizer's runs are built (dist_attach).
void model_set_expert_grads(Model *m, int gbf);
// The routed experts' weight gradients into the backend's gradient ledger as they are written (ops.h
// GM_DW_SUMSQ, Backend.dw_sumsq_take; on: 1): their sums of squares from the GEMMs that write them, so the
// norm need not read them again (dist_use_ledger). Only for a caller that writes each of them once a step
// in one write (one micro-batch, one chunk: a layer whose experts run in chunks (Tutel's r > 1) or gathered
// writes none into the ledger), reduces none of them over ranks and reads them as written (OPTG_F32 or
// OPTG_PACKED). The ledger is emptied by model_zero_grads.
void model_set_dw_sumsq(Model *m, int on);
// --loss-chunks n (1 <= n <= the micro-batch's rows): the LM heads (the main one and the MTP modules') run
// over n chunks of the rows, each chunk's gradient taken in the forward (vocab.h vocab_head_chunks): the
// logits of one chunk at a time, the heads' input gradients (N,d) kept for the backward; 1: the whole logits
// kept until the backward. Before model_share_grads (the slots are made again).
void model_set_loss_chunks(Model *m, int n);
// --fp8-dispatch (on: 1): every MoE layer's routed experts take their input rows as FP8 values, moved packed
// between ranks (moe.h m->fp8_dispatch). Dies where the backend has no FP8 rows (ops.h Backend.fp8_rows_*).
void model_set_fp8_dispatch(Model *m, int on);
// --fp8-save (on: 1): every MoE layer keeps its routed experts' SwiGLU inputs h1, h3 as FP8 rows and computes
// act again in the backward (moe_types.h MoeRecompute.fp8: the shared buffers, as --recompute moe's). Dies
// where the backend cannot (ops.h Backend.fp8_save) or the layers recompute their MoE rows. Not between a
// forward and its backward.
void model_set_fp8_save(Model *m, int on);
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
// The end of chunk c's layers with activations: l1, and on the last virtual stage the MTP modules' blocks
// after it (n_layers .. n_layers + mtp_depth - 1).
int model_chunk_end(const Model *m, int chunk);
// Does this rank hold layer l (in one of its chunks)?
int model_holds_layer(const Model *m, int l);
// Layer l's MoE state in its chunk's slot (l held by this rank).
MoeLayer *model_moe(Model *m, int l, int slot);
// The pipelined exchange's overlap degree of layer l's MoE (1 = none; moe.h) for the next forwards.
void model_set_overlap(Model *m, int l, int r);
// Layer l's expert mode (moe.h: MOE_SHARDED or MOE_GATHERED; only matters with ETP > 1).
void model_set_expert_mode(Model *m, int l, int mode);
// Activation recomputation (model_types.h RECOMPUTE_*): RECOMPUTE_MOE drops the experts' SwiGLU rows (h1, h3,
// act; moe.h MoeRecompute), RECOMPUTE_ATTN the attention output and its log-sum-exp, from what each layer
// keeps; the backward computes them again from the kept inputs (q, k, v; the expert rows) with the same
// kernels, so the gradients are the same bits as keeping them. Memory: one layer's worth instead of
// every layer's; time: those forwards once more. layers > 0: only the first `layers` layers (of the model's
// order, the MTP modules' blocks after them) recompute, the others keep theirs (Megatron-LM's block method;
// 0: every layer). Set before forwards, not between one and its backward.
void model_set_recompute(Model *m, int mode, int layers);
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
// n in 1, 2, 4, 8 (model_types.h AMPIPE_MAX), per layer; evaluation forwards run unchunked. With moe_timing
// the layer's time covers the block from attention on (the chunks interleave attention and MoE).
void model_set_ampipe(Model *m, int l, int n);


// The gradient buffer for a new step: zeroes every tensor but the routed experts' weights (w1, w3, w2:
// most of a MoE model's gradient bytes), the attention's q/k/v and o projections and the LM head, which
// each layer's (the last chunk's) first backward of the step writes instead of adding to (ops.h
// GM_DW_WRITE: the same bits as adding into zeros, without the zero fill and the read of the zeros;
// model_types.h DW_FRESH_*). model_grads_settle, after the step's last backward, zeroes those of a layer
// whose backward did not run (none, in the schedules there are; a guard). A caller that zeroes m->grads
// itself (be->zero) gets the plain accumulating backward.
void model_zero_grads(Model *m);
void model_grads_settle(Model *m);

// aux scope global: start a new step's running statistics (the trainer calls it before each step).
void model_scope_reset(Model *m);

// (model.c's forward) Layer l's MoE states for a forward in n AMPipe chunks: the chunks' states while
// n > 1, the whole batch's rows while n = 1; the states a layer's forwards do not use lose their memory
// (a change frees every MoE row in the layer's lent memory: its next rows are carved from the mark again).
void model_fit_chunks(Model *m, int l, int n);
