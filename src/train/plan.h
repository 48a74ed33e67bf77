// plan.h — the layout planner behind `moe plan`: every layout of a model on G GPUs (TP x EP x ETP x PP x
// VPP, DP the rest; ZeRO stage, --recompute, micro-batch count), the ones the mesh, the batch or the
// schedule refuse counted by reason, each remaining one's memory per GPU from the cost model (cost.h
// cost_mesh: the figures `moe info --world G` prints for it) and a predicted step time from a hardware
// profile (hwprofile.h). A first model, not the final one; its assumptions:
//  - compute: each rank's share of the training FLOPs (cost.h cost_flops' parts: the routed and shared
//    experts at the profile's grouped-GEMM rate, the projections, router and LM head at its dense GEMM
//    rate, attention's scores at its attention rate), split evenly over the ranks of a stage (routing
//    balanced; TP splits the heads and the router's rows, EP/ETP the experts' rows, DP the batch); the LM
//    head on every TP rank of the last stage; plus AdamW over the elements the rank updates at the
//    profile's HBM rate (30 bytes an element, 22 with bf16 moments); the other ops as memory-bound passes
//    (cost.h cost_bytes: norms, RoPE, gathers and combines, router, cross-entropy, adds, embedding, clears;
//    their bytes at PLAN_MEMOPS_HBM x the HBM rate) and the gradient norm (every gradient read once, at the
//    HBM rate);
//  - communication: cost_mesh's bytes sent per rank and step (rows to the experts in bf16), each kind
//    over the link its group spans (every rank of the group on one node of --nodes-of GPUs: NVLink, else
//    inter-node), exposed in full unless --comm-exposed says otherwise; the slowest stage sets the step;
//    the mechanisms of a Megatron-Core run, each off by default (PlanSpec): the all-to-all hidden behind
//    compute (min(all-to-all, the compute it overlaps) per micro-batch), the links an all-to-all across nodes
//    takes (NVLink beside the network; DeepEP's node deduplication), the rows back in bf16, the experts'
//    rate at the nearest measured shape, Megatron's distributed-optimizer memory, a given inter-node rate,
//    the TP collectives, the pipeline's sends and the DP gradients each hidden behind the compute it
//    overlaps (min(messages, that compute)), the LM head split over TP; the messages hidden on a stage
//    share its compute as one budget (their sum at most the compute; above it each scaled alike), and each
//    hidden second costs the compute PlanSpec.overlap_sms / PLAN_GPU_SMS of a second (the SMs the
//    communication's kernels hold);
//  - dense layers (config dense_layers) run their MLP at the dense rate; the last stage also runs the MTP
//    modules;
//  - host overhead: the backend ops a step launches (counted per layer, micro-batch and step from the
//    code) at the profile's launch_us, costing what exceeds the stage's compute (queued launches overlap
//    the GPU's work), and its host synchronisations (the routing's counts, once per MoE layer forward) at
//    sync_us each (0 in the built-in profiles: not calibrated, docs/PLAN.md);
//  - the pipeline: each virtual stage's forward and backward of one micro-batch from its own layers'
//    compute (stages.h's split, the trainer's; the LM head and the MTP modules on the last virtual stage;
//    the embedding on the first through its table's AdamW, its lookup having no FLOPs here; a forward a
//    third of the training FLOPs, the recomputed forwards in the backward), plus the stage's exposed
//    messages where they are sent (TP, EP, ETP per layer, half in the forward; PP at each boundary), its
//    AdamW, host overhead and DP gradients (once a step) spread over its actions in proportion to their
//    compute; the schedule simulated on those times (PlanPipe, plan_pipe_simulate): the step is its span,
//    the bubble fraction the stages' mean idle, the bubble's seconds the slowest stage's idle (the step less
//    its compute, host overhead and exposed comm). One stage: the step is that sum, no bubble;
//  - memory: the largest stage's per-rank cuda total of cost_mesh (CostMemory.cuda: the cuda backend's
//    accounting, as moe info prints it), plus the imbalance headroom on the buffers sized by routing
//    (CostMemory.cuda.routed x (--imbalance - 1)) and the profile's context bytes (the CUDA context, the
//    allocator's reserve).
// Must not hold: printing or option parsing (train/plan_print.c, cli/cmd_plan.c), the cost arithmetic
// (cost.c), reading a profile (hwprofile.c).
#pragma once
#include "core/config.h"
#include "parallel/mesh.h"
#include "parallel/stages.h"
#include "train/hwprofile.h"
#include "train/options.h"
#include "train/schedule.h"

// The memory-bound ops (cost.h cost_bytes) run at this fraction of the profile's hbm_gbps, which AdamW's
// stream sets (docs/PLAN.md "The model": the reference model's kernels in a CUPTI trace ran at 0.78 of it,
// MOE_PROFILE's times less their per-call synchronisation at 0.79-0.99); the gradient norm, one stream over
// every gradient like AdamW, at hbm_gbps itself (measured 1.05 of it).
#define PLAN_MEMOPS_HBM 0.8
// The SMs of the GPUs the built-in and published profiles describe (H100 and H200 SXM): an overlapped
// communication's kernels hold PlanSpec.overlap_sms of them.
#define PLAN_GPU_SMS 132

// One layout: the flags of `moe train` that choose it.
typedef struct {
    int tp, ep, etp, pp, vpp, dp;
    int zero, recompute, micro; // --zero, --recompute (RECOMPUTE_*), --grad-accum
    int rc_layers; // --recompute-layers (0: every layer recomputes)
    int vocab; // --vocab-parallel (with tp > 1: the embedding and the LM head split over TP)
} PlanLayout;

// Its figures (bytes, seconds).
typedef struct {
    PlanLayout l;
    double mem_info; // the largest stage's per-rank cuda total, as moe info prints it
    double mem_headroom; // (imbalance - 1) x the routed buffers of that stage
    double mem; // mem_info + mem_headroom + the profile's context
    double compute, comm; // the step's parts: the slowest stage's compute and exposed comm,
    double bubble_s; // and its idle (the step less its busy time)
    double host; // and its host overhead (launches the GPU's work does not hide, synchronisations)
    double launches, syncs; // that stage's backend ops (CUDA launches) and host synchronisations a step
    double bubble; // the simulated bubble fraction: the stages' mean idle over the step
    double step, tokens_s, mfu; // seconds a step, tokens/s, model FLOPs / (GPUs x peak)
    double comm_kind[5]; // exposed seconds: tp, ep, etp, dp, pp (of the slowest stage)
    double hidden[5]; // of that stage's tp, ep, etp, dp, pp messages, the seconds hidden behind compute
                      // (--hide-tp, --hide-a2a, --hide-dp, --hide-pp; etp none): together at most its compute
    double hide_want; // the seconds the mechanisms would hide each alone (their sum: above the compute, the
                      // hidden share it in proportion)
    double overlap_cost; // of compute, what the hidden seconds cost it (the SMs their kernels hold)
    double memops; // of compute, the memory-bound ops' (cost.h cost_bytes, the gradient norm) at the HBM rate
    double grouped_tflops; // the rate its experts were counted at
    const char *shape; // with PlanSpec.grouped_shape: the measured expert shape that rate is scaled to
    int inter[5]; // 1: that kind's groups span nodes
} PlanRow;

// The EP all-to-all hidden behind compute (--hide-a2a), per micro-batch: none; behind the experts' grouped
// GEMMs of another chunk of rows (our --a2a-overlap); behind the compute of the micro-batch 1F1B pairs it
// with (Megatron-Core's --overlap-moe-expert-parallel-comm), in the schedule's steady phase only.
enum { PLAN_HIDE_NONE, PLAN_HIDE_EXPERTS, PLAN_HIDE_1F1B };
// How the links carry an EP all-to-all whose group spans nodes (--a2a-links): flat (every row over the
// inter-node link), split (the own node's rows over NVLink beside the rest), deepep (DeepEP's node
// deduplication: a token's rows for one remote node cross the network once).
enum { PLAN_LINKS_FLAT, PLAN_LINKS_SPLIT, PLAN_LINKS_DEEPEP };
// The DP gradients hidden behind compute (--hide-dp): none; the reduction behind the last micro-batch's
// backward (our --overlap 1, Megatron's --overlap-grad-reduce); and ZeRO's weight all-gather behind the
// first micro-batch's forward (Megatron's --overlap-param-gather).
enum { PLAN_HIDE_DP_NONE, PLAN_HIDE_DP_GRADS, PLAN_HIDE_DP_PARAMS };

// What to plan for.
typedef struct {
    int gpus, nodes_of;
    double imbalance; // >= 1: headroom factor on the routed buffers
    double exposed; // in [0, 1]: the fraction of the communication not hidden
    HwProfile hw;
    // the mechanisms of a Megatron-Core run (docs/PLAN.md "Published runs"); 0 each: today's model
    int hide_a2a; // PLAN_HIDE_*
    int a2a_links; // PLAN_LINKS_*
    int combine_bf16; // 1: the rows back (the combine's, dx) in bf16 as Megatron sends them; 0: float32
                      // (ours)
    int grouped_shape; // 1: the experts' rate scaled to the nearest measured expert shape
                       // (hwprofile_grouped_shape); 0: the profile's rate at every shape
    int hide_tp; // 1: the TP collectives behind the TP-split layers' GEMMs (TE's --tp-comm-overlap)
    int hide_pp; // 1: each pipeline send behind the compute after it, interleaved schedules only (Megatron's
                 // --overlap-p2p-comm, on by default there)
    int hide_dp; // PLAN_HIDE_DP_*
    int overlap_sms; // the SMs (of PLAN_GPU_SMS) an overlapped communication's kernels hold while they run:
                     // each second hidden behind compute costs that compute overlap_sms / PLAN_GPU_SMS of a
                     // second (0: free)
    int vocab_search; // 1: every TP layout priced both with and without --vocab-parallel (the option not
                      // given); 0: as TrainOptions.vocab_parallel says
    int megatron_memory; // 1: the weights, gradients and optimizer state as Megatron's distributed optimizer
                         // keeps them (bf16 weights, float32 gradients, float32 master weights and moments
                         // sharded over the data-parallel group: 6 + 12 / DP bytes a parameter) in place of
                         // ours; the activations and scratch ours
} PlanSpec;

// The refusals of an enumeration, by reason.
enum { PLAN_R_MESH, PLAN_R_PIPELINE, PLAN_R_BATCH, PLAN_R_SCHEDULE, PLAN_R_MEMORY, PLAN_R_N };
extern const char *const plan_reason_name[PLAN_R_N];

typedef struct {
    PlanRow *rows; // those that fit, fastest first
    int n, cap;
    int candidates; // layouts the mesh, batch and schedule allow (fitting or not)
    int refused[PLAN_R_N];
} PlanResult;

// A layout's pipeline as the planner simulates it (one stage: sequential), in seconds.
typedef struct {
    ScheduleKind kind;
    int pp, vpp, micro; // stages, chunks a stage (1 but interleaved), micro-batches a step
    double tf[STAGES_MAX], tb[STAGES_MAX]; // (pp x vpp, virtual stage chunk x pp + stage) its forward and
                                           // backward of one micro-batch
    double part[STAGES_MAX][3]; // (pp) a stage's busy seconds a step: compute and host overhead, exchange
                                // (tp, ep, etp, pp messages), reduction (dp gradients)
} PlanPipe;
// The schedule simulated on p's times (schedule_simulate_times), each action into ev (NULL: none; else room
// for 2 x pp x vpp x micro): returns the bubble fraction (the stages' mean idle), *span the step.
double plan_pipe_simulate(const PlanPipe *p, SchedEvent *ev, double *span);

// Every layout of c on sp->gpus GPUs for o's batch and seq_len (o's other options as given: schedule
// kinds follow vpp, o's zero / recompute / grad_accum / pp / tp ... are replaced per layout). stop_at_fit:
// return at the first layout that fits (r->rows holds it alone, counts partial).
void plan_enumerate(PlanResult *r, const ModelConfig *c, const TrainOptions *o, const PlanSpec *sp,
                    int stop_at_fit);
void plan_result_free(PlanResult *r);
// One layout's figures, its layers split as o->pp_layers gives ("": evenly; plan_enumerate searches the even
// split only): NULL, or a static message naming the rule that refuses it ("mesh: ...", "pipeline: ...",
// "batch: ...", "schedule: ..."); *reason (may be NULL) its PLAN_R_* index; *pipe (may be NULL) the pipeline
// its step was simulated on. Fits or not: row->mem against sp->hw.mem_bytes is the caller's.
const char *plan_layout(PlanRow *row, const ModelConfig *c, const TrainOptions *o, const PlanSpec *sp,
                        const PlanLayout *l, int *reason, PlanPipe *pipe);
// The smallest GPU count above sp->gpus, up to max_gpus, on which some layout fits (past one node of
// sp->nodes_of GPUs, in whole nodes; none below the count the weights, gradients and moments alone need);
// 0 if none.
int plan_smallest_fit(const ModelConfig *c, const TrainOptions *o, const PlanSpec *sp, int max_gpus);
// Parses "tp2 ep4 etp1 pp2 vpp2 zero1 micro8 recompute-moe recompute-layers3" (any order; the words left
// out: 1, zero 0, recompute none, micro o->grad_accum, every layer recomputing; dp is the rest); NULL, or a
// static message naming the bad word (plan_print.c).
const char *plan_parse_layout(PlanLayout *l, const char *text, const TrainOptions *o);
