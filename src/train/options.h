// options.h — training options (everything `moe train` needs besides the model config),
// their defaults and validation. Must not hold: argument parsing (cli/) or the loop (trainer.c).
#pragma once
#include <stdint.h>
#include "core/config.h"
#include "ops/ops.h"
#include "parallel/mesh.h"
#include "train/schedule.h"

typedef struct {
    int steps; // optimizer steps in the run (--resume continues up to this)
    int batch; // global batch: sequences per optimizer step (on any mesh)
    int grad_accum; // micro-batches per step (batch % grad_accum == 0)
    int seq_len; // T
    float lr; // peak learning rate
    float min_lr_frac; // cosine decays to lr * min_lr_frac
    int warmup; // linear warmup steps
    float weight_decay; // decoupled, matrices only (not norms)
    float beta1, beta2, adam_eps;
    float grad_clip; // global-norm clip; 0 = off
    uint64_t seed; // init, data order, jitter
    int eval_every; // steps between val-loss evaluations (0 = only at the end)
    int eval_batches; // val micro-batches per evaluation (0 = the whole validation set)
    int save_every; // steps between checkpoints (0 = only at the end, -1 = never: benchmarks)
    int keep; // checkpoints kept (older ones removed); 0 = keep all
    int keep_best; // 1: OUT/best holds the checkpoint of the lowest validation loss (never pruned)
    float dropout; // residual-branch dropout probability in training (0 = none: no op runs)
    float embed_dropout; // dropout on the token embeddings in training, as nanoGPT's (0 = none: no op runs)
    int sample_tokens; // tokens sampled at the end of the run (0 = none)
    int plots; // write loss.png / expert_load.png
    int tensorboard; // write TensorBoard scalar event files in the run directory
    float mfu_peak; // --mfu-peak: one device's peak TFLOP/s for the MFU shown (0: the GPU's built-in profile)
    int quiet; // no per-step progress lines (metrics.jsonl still written)
    int check_replicas; // at the end, verify replicas are bitwise equal across the mesh
    int resume, force;
    int data_changed; // --resume: continue although the data differs from the run record's
    // parallel layout (world size from the launcher; DP = world / (TP * PP))
    int tp, ep, etp, pp;
    int vpp; // model chunks per pipeline rank (interleaved schedule)
    ScheduleKind pp_schedule; // 1f1b | interleaved (sequential when pp == 1)
    char pp_layers[256]; // "" = even split; else one layer count per virtual stage
    int zero; // 0: replicated optimizer; 1: moments sharded; 2: + reduced gradients sharded
    int overlap; // 1: reduce gradient buckets during backward (non-blocking)
    float bucket_mb; // gradient bucket size cap (MB)
    int a2a_overlap; // the MoE exchange pipelined over this many chunks (1, 2, 4, 8); 0 = auto
    int upcycle; // --init-from a dense Llama/Mistral directory: each MLP into this many experts (0: off)
    int recompute; // RECOMPUTE_* (model.h): activations computed again in backward instead of kept
    int recompute_layers; // only the first this many layers recompute (0: every layer)
    int ampipe; // AMPipe: each block from attention on in this many chunks (1, 2, 4, 8); 0 = auto
    int a2a_hier; // the EP all-to-all two-level over nodes of this many EP ranks: -1 auto, 0 off
    int expert_mode; // MoE layers with ETP > 1: 0 sharded, 1 gathered, -1 auto (measured)
    int precision; // PREC_MIXED: float32 weights and AdamW moments (bf16 GEMM operands on cuda);
                   // PREC_BF16: bf16 moments, weights rounded to bf16 values after every update;
                   // PREC_FP8 / PREC_FP8_BF16: those storages, the experts' GEMMs FP8 (ops/numerics.h)
    int grad_memory; // GRADMEM_SHARED: with --grad-accum 1 and no --pp, the expert gradients share memory
                     // with the next layer's activations (model.h model_share_grads); GRADMEM_SEPARATE
    int bf16_rounding; // PREC_BF16's (and PREC_FP8_BF16's) weight rounding: ROUND_STOCHASTIC, ROUND_NEAREST
                       // or ROUND_NONE
    int bf16_grads; // PREC_BF16 / PREC_FP8_BF16: 1 the routed experts' weight gradients are bf16 values
                    // (train_expert_grads)
    int fp8_dense; // PREC_FP8 / PREC_FP8_BF16: 1 the attention projections' products in FP8 too (ops.h
                   // backend_fp8_dense)
    int fp8_dispatch; // PREC_FP8 / PREC_FP8_BF16: 1 the routed experts' input rows FP8 values from the
                      // dispatch on, moved packed (moe.h m->fp8_dispatch)
    int fp8_weight_cache; // PREC_FP8 / PREC_FP8_BF16: 1 each expert weight's FP8 codes kept between uses
                          // (cuda; ops.h Backend.fp8_keep_weights), 0 quantised at every use
    int fp8_save; // PREC_FP8 / PREC_FP8_BF16: 1 the routed experts' SwiGLU inputs kept as FP8 rows, act
                  // computed again in the backward (model_state.h model_set_fp8_save)
    int vocab_parallel; // 1: under TP the embedding and LM head split by vocabulary rows (model/vocab.h)
    int loss_chunks; // the LM heads' row chunks, each chunk's gradient in the forward (model_set_loss_chunks)
    int fp8_amax_jump; // PREC_FP8 / PREC_FP8_BF16: a (layer, tensor)'s amax this many powers of two above
                       // every earlier step's is reported (train/fp8_watch.h); 0: not checked
    int gpu_comm; // GPUCOMM_*: the device transport of GPU ranks (train/placement.c)
    float a2a_retune; // auto: re-tune a layer when its load (busiest expert / mean) moves by this fraction
    char out[1024];
    char data[1024]; // "" = embedded synthetic corpus
    char val_data[1024]; // "" = the held-out tail of --data (val_frac); else the validation file
    char tokenizer[1024]; // "" = none (text --data is bytes); else a tokenizer.json or its directory
    float val_frac; // the fraction of --data held out as its tail (default 0.1)
    char device[16]; // cpu | cuda | "" (auto)
} TrainOptions;

enum { GRADMEM_SHARED = 0, GRADMEM_SEPARATE = 1 };
enum { GPUCOMM_AUTO = 0, GPUCOMM_NCCL = 1, GPUCOMM_STAGED = 2, GPUCOMM_MPI = 3, GPUCOMM_IPC = 4 };
enum { ROUND_STOCHASTIC = 0, ROUND_NEAREST = 1, ROUND_NONE = 2 };

void train_options_default(TrainOptions *o);
// NULL if valid, else a static message naming the option and value.
const char *train_options_validate(const TrainOptions *o, const ModelConfig *c);

// Whether the weights only bf16 GEMMs read may live in the GEMMs' bf16 copy alone (model.h
// model_bf16_weights):
// --precision bf16 with rounded weights, in one process (meshed 0: no collective writes the float32 buffer).
// The trainer's choice and moe info's memory line both ask this.
static inline int train_bf16_weights_alone(const TrainOptions *o, int meshed) {
    return !meshed && prec_bf16_storage(o->precision) && o->bf16_rounding != ROUND_NONE;
}

// The format of the routed experts' weight gradients (model.h model_set_expert_grads; ops.h OPTG_*):
// float32 (OPTG_F32) but under --precision bf16 with --bf16-grads 1, where they are bf16 values, rounded
// to nearest even once they are whole: written so by the GEMMs and stored packed (OPTG_PACKED) where
// each is written once a step and nothing sums them (one process, one micro-batch, one chunk, no ZeRO),
// else float32 memory read rounded by the optimizer (OPTG_BF16: after the sum over ranks). fp8-bf16: float32
// (the FP8 weight-gradient GEMMs write float32 sums).
static inline int train_expert_grads(const TrainOptions *o, int meshed) {
    if (!prec_bf16_storage(o->precision) || !o->bf16_grads) return OPTG_F32;
    return !meshed && o->grad_accum == 1 && o->pp == 1 && o->ampipe == 1 && !o->zero ? OPTG_PACKED
                                                                                     : OPTG_BF16;
}
// Ranks that write each routed-expert gradient once a step, as it is read (OPTG_F32 or OPTG_PACKED), and
// reduce none of them (edp 1: every expert held by one rank; one process: meshed 0, edp 1): the gradient
// ledger can stand for them in the norm (model_set_dw_sumsq, dist_use_ledger).
static inline int train_dw_ledger(const TrainOptions *o, int meshed, int edp) {
    return edp == 1 && o->grad_accum == 1 && o->pp == 1 && o->ampipe == 1 && !o->zero &&
        train_expert_grads(o, meshed) != OPTG_BF16;
}

// The mesh the options ask for on world ranks (dp and edp unresolved: parallel/mesh.h mesh_shape_resolve).
static inline MeshShape train_mesh_shape(const TrainOptions *o, int world) {
    MeshShape ms = {world, o->tp, 0, o->pp, o->ep, o->etp, 0, o->a2a_hier > 1 ? o->a2a_hier : 0, 0};
    ms.vocab = o->vocab_parallel && o->tp > 1;
    return ms;
}

// Learning rate at step (0-based): linear warmup to lr, then cosine to lr * min_lr_frac.
float lr_at(const TrainOptions *o, int step);
