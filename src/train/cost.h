// cost.h — the cost model of a training layout, as numbers: parameters, FLOPs per token, memory (the
// whole model in one process; each rank of a mesh, per pipeline stage) and the bytes each rank sends per
// step. `moe info` prints them (train/info.c), the trainer's tflops figure reads the FLOPs, and a mesh
// planner can ask it about every candidate mesh. Bytes are the float32 cpu backend's unless a field says
// otherwise.
// Must not hold: printing, option parsing, anything that runs the model or talks to other ranks.
#pragma once
#include <stddef.h>
#include "core/config.h"
#include "model/params.h"
#include "parallel/mesh.h"
#include "parallel/stages.h"
#include "train/options.h"

// The model's parameters: counted from the config, and the parameter table's tensors (model/params.h).
typedef struct {
    size_t total; // every trained parameter (not the aux-free routing bias: no gradient)
    size_t active; // those one token passes through: k of the E routed experts
    int tensors; // the table's tensors
    double dense, expert; // the table's elements outside / inside the routed experts
} CostParams;
void cost_params(CostParams *p, const ModelConfig *c);

// Forward FLOPs of one token (a multiply-add counts two) in one layer at sequence length T, and the
// training FLOPs per token: forward + backward = 3 x forward.
typedef struct {
    double attn_proj; // the q, k, v and o projections
    double attn_scores; // Q K^T and P V over the causal half of the T positions
    double router; // the d x E router logits
    double experts; // k routed SwiGLU experts and the shared experts
    double head; // the LM head (once, after the layers)
    double train; // 3 x (n_layers x (the four above) + head)
} CostFlops;
// Fills *f (NULL: only the return) and returns the training FLOPs per token.
double cost_flops(CostFlops *f, const ModelConfig *c, int T);

// The bytes a step's memory-bound ops read and write (cost_ops.c): all but the GEMMs, attention's kernels and
// AdamW (cost_flops and the optimizer count those), on one micro-batch of N tokens on a rank of mesh ms
// (NULL: one process; N replicated over its TP group, N / tp of them routed by it) for layers [l0, l1), the
// embedding where first, the final norm, cross-entropy and MTP modules where last (--recompute adds none of
// these); h: bytes of a value of the backend's hidden rows (ops.h Backend.hid: 2 cuda's bf16, 4 float32).
typedef struct {
    double norm, rope, rows, router, ce, elem, embed, copies; // by kind: the norms; RoPE and q, k, v's
                                                              // rounding; gathers and combines; the router's
                                                              // softmax, top-k and plan; cross-entropy;
                                                              // residual adds; embedding; clears
    double fwd; // of the total, the forwards'
    double total;
} CostBytes;
void cost_bytes(CostBytes *b, const ModelConfig *c, const MeshShape *ms, double N, int l0, int l1, int first,
                int last, double h);
// The gradient norm's read, once a step, of the gradients the rank's optimizer updates (lt: its slices; ZeRO:
// their shards, as AdamW's; ms NULL: one process), bytes: float32, the routed experts' bf16 where they are
// stored packed (options.h train_expert_grads), and none of theirs where the gradient ledger stands for them
// (options.h train_dw_ledger: the GEMMs that write them sum their squares).
double cost_gnorm_bytes(const ParamTable *lt, const MeshShape *ms, const TrainOptions *o);
// The attention op's widths per token on a rank of a TP group of tp: its q (and output), its k (and v).
size_t cost_att_qd(const ModelConfig *c, int tp);
size_t cost_att_kvd(const ModelConfig *c, int tp);

// The cuda backend's memory for the same buffers as a float32 figure (the whole model in one process, or one
// rank of a mesh), bytes: the float32 figure
typedef struct {
    double hid; // less: the rows it keeps in bf16 (half of their float32 bytes)
    double shadow; // plus: the bf16 copy of the weights the GEMMs read (of the process's or rank's slices)
    double scratch; // plus: the backend's scratch: gemm + workspace (two buffers apart)
    double gemm; // of it, the bf16 operand copies of the GEMMs (the LM head's output gradient the largest)
    double workspace; // of it, the workspace (the attention backward's D, bf16 dout and dS the largest)
    double fp8; // plus, under --precision fp8: the FP8 table's operand codes and scales and float32 rows
    double kept; // of fp8, the experts' weight codes and scales it keeps between ops (cuda_fp8_wcache.cu)
    double alone; // less: the float32 pages of weights only bf16 GEMMs read (--precision bf16, one process)
    double lent; // of its activations, in the expert gradients' memory (replaces the float32 figure's) and,
                 // with the lean MoE scratch, layer 0's in the embedding's gradient
    double lean; // less: the backward's scratch its lean MoE scratch does without (moe.h moe_scratch_init)
    double holes; // less: the packed expert gradients' blocks left out (ops.h alloc_holes; one process)
    double total; // its total (the CUDA context aside)
    double routed; // as CostMemory.routed, with the rows in the cuda backend's formats
} CostCuda;

// The whole model in one process, one step of o->batch sequences of o->seq_len under o's --recompute,
// --precision and --grad-memory, bytes.
typedef struct {
    double state; // params + grads + the two AdamW moments (bf16 moments under --precision bf16)
    double acts; // activations of every layer and the LM head, and the backward's scratch
    double lent; // of acts, in the expert gradients' memory (--grad-memory shared)
    double holes; // of state, the packed expert gradients' blocks left out (model_share_grads; the cpu's)
    double total; // state + acts - lent - holes
    CostCuda cuda; // the cuda backend: the same buffers, less and plus its deltas
} CostWhole;
// meshed: the run has several ranks (the float32 weights stay whole: train_bf16_weights_alone).
void cost_whole(CostWhole *w, const ModelConfig *c, const TrainOptions *o, int meshed);

// One rank's memory on a mesh, bytes.
typedef struct {
    double params; // its slices of the weights (the gradients: as many)
    double moments; // the two AdamW moments of what it updates (ZeRO: its shards)
    double acts; // activations: one micro-batch's; with pipeline stages the schedule's live ones
    double lent; // of acts, in the expert gradients' memory (--grad-memory shared; 0 with stages)
    double holes; // of the gradients, the packed expert gradients' blocks left out (one rank: CostWhole's)
    double total; // params + grads + moments + acts - lent - holes
    double routed; // of acts, the buffers sized by the rows this rank's experts receive (the exchange's
                   // rows and their SwiGLU rows, kept and in the backward's scratch): what grows when
                   // routing sends more than the mean to this rank (0 where the exchange is local)
    CostCuda cuda; // the cuda backend's figure for this rank, as CostWhole's for one process (a mesh of
                   // one rank: equal to it)
} CostMemory;

// The bytes one rank sends in one optimizer step (every micro-batch, forward and backward). Collectives
// are counted as ring algorithms send them: an all-reduce of S bytes over g ranks 2 (g-1)/g S, an
// all-gather or reduce-scatter of S bytes in all (g-1)/g S, an all-to-all the rows bound for other ranks;
// routing balanced (every rank receives as many rows as it sends) and nothing dropped. Left out: the small
// collectives (router counts and statistics, norms, losses) and the pipeline's per-micro-batch scalars.
typedef struct {
    double tp; // attention: o_proj's partial sums (forward) and the q/k/v input gradient (backward)
               // all-reduced, OLMoE's QK-norm sums; the MoE output and its input gradient all-gathered
    double ep; // the MoE exchange's all-to-all: rows to the experts' owners and back, forward and backward
    double ep_back; // of ep, the float32 rows back: the combine's outputs (forward) and dx (backward)
    double etp; // sharded experts: rows all-gathered and partial outputs reduce-scattered over ETP;
                // --expert-mode gathered: the experts' weights all-gathered, their gradients reduce-scattered
                // (auto, chosen by measuring at run time, is counted as sharded)
    double dp; // gradients reduced over their groups (DP, EDP, the stage); ZeRO: the weights all-gathered
    double pp; // activations to the next pipeline stage, their gradients to the previous one
    double total;
} CostComm;

typedef struct {
    CostMemory mem; // each rank of the stage (rank 0's figures; the others hold as much)
    CostComm comm; // rows in float32 (cpu, cuda-fp32)
    CostComm comm16; // the cuda backend: the rows sent to the experts (x, dy) in bf16
    double gnorm; // the gradient norm's bytes a step (cost_gnorm_bytes)
    const int *live; // (vpp) the micro-batches each chunk holds at once (the schedule's activation slots; in
                     // the mesh's pipeline)
} CostStage;

typedef struct {
    MeshShape ms;
    StageSplit sp; // virtual stage k holds layers [sp.first[k], sp.first[k+1])
    int vpp; // chunks per pipeline rank
    int micro; // micro-batches per step (--grad-accum)
    int Bl; // sequences of a micro-batch on each DP rank
    double bubble, bubble_sim; // the pipeline bubble: the textbook figure; simulated, backward 2 x forward
    CostStage *stage; // (ms.pp)
    int *own_live; // the live counts of a pipeline cost_mesh_tables made itself (NULL: the caller's)
} CostMesh;

// The figures of the resolved mesh *ms (parallel/mesh.h mesh_shape_resolve) for o's batch, micro-batches,
// seq_len, schedule, --zero, --recompute, --precision and --grad-memory. Returns NULL, or a static message
// naming the numbers when the pipeline cannot be split or scheduled (m is then empty). Free with
// cost_mesh_free.
const char *cost_mesh(CostMesh *m, const ModelConfig *c, const TrainOptions *o, const MeshShape *ms);
// A stage's parameter table with what the figures take from the table alone, derived once (the planner
// prices every option of a mesh on one table; walking DeepSeek-V3's 47k tensors per option took two thirds
// of its search): cost_table_of.
typedef struct {
    const ParamTable *t;
    double fp8_kept; // the FP8 table's kept weight codes, bytes (--precision fp8 on cuda)
} CostTable;
// ct for table t of model c; fp8: whether the figures will be asked under --precision fp8 (1; 2: with
// --fp8-dense, the attention projections' codes kept too; 0: fp8_kept is left 0: the walk over every tensor
// is the derivation's cost).
void cost_table_of(CostTable *ct, const ModelConfig *c, const ParamTable *t, int fp8);
// cost_table_of's fp8 for the options: 0 (no codes kept: not an FP8 precision, or --fp8-weight-cache 0), 1,
// or 2
// (--fp8-dense's too)
static inline int cost_fp8_tables(const TrainOptions *o) {
    return prec_fp8(o->precision) && o->fp8_weight_cache ? 1 + (o->fp8_dense != 0) : 0;
}
// A mesh's pipeline as the figures take it: the layers' split into virtual stages (o's --vpp under the
// interleaved schedule, --pp-layers), each stage's live micro-batches (its schedule's activation slots: live
// is pp x vpp) and the bubbles, for pp stages and o's --grad-accum micro-batches. It depends on nothing else,
// so the planner makes one for every --zero and --recompute of a (mesh, vpp, micro-batches). Returns NULL,
// or a static message naming the numbers when the layers cannot be split or scheduled (p then empty).
typedef struct {
    StageSplit sp;
    int pp, vpp, micro;
    int *live;
    double bubble, bubble_sim; // as CostMesh's
} CostPipe;
const char *cost_pipe(CostPipe *p, const TrainOptions *o, int pp, int n_layers);
void cost_pipe_free(CostPipe *p);
// As cost_mesh, on the stages' parameter tables built by the caller (lts: ms->pp tables, stage s's from
// params_build_local with *ms's TP/EP/ETP and, with stages, the split o gives; NULL: built here) and its
// pipeline (cost_pipe of the same o and ms->pp, kept until m is freed; NULL: made here): the planner asks
// about many options (--zero, --recompute, micro-batches) of one mesh and split.
const char *cost_mesh_tables(CostMesh *m, const ModelConfig *c, const TrainOptions *o, const MeshShape *ms,
                             const CostTable *lts, const CostPipe *pipe);
void cost_mesh_free(CostMesh *m);
