// calibrate.h — `moe plan --calibrate`: this machine measured on the backend at hand, as a hardware
// profile (hwprofile.h) the planner reads. Each rate is taken at the model's own shapes (one micro-batch of
// o's batch / grad_accum sequences of o's seq_len on one rank), so that the planner's compute term, which
// divides the step's FLOPs by these rates, reproduces the time those ops take here:
//  - dense_tflops: the projections (q, k, v, o), the router and the LM head, forward and backward, their
//    FLOPs over their summed time weighted as a step runs them (each layer's once, the head once);
//  - grouped_tflops: the experts' fused grouped ops (SwiGLU up-projection, down-projection, their
//    backwards) over the k x N routed rows split evenly over the experts (and the shared expert's rows);
//  - fp8_grouped_tflops: the same on the backend's FP8 table (ops.h backend_fp8: --precision fp8's experts,
//    their operands quantised per call);
//  - attention_tflops: attention forward + backward, at the causal half's FLOPs (cost.h CostFlops);
//  - hbm_gbps: AdamW over the model's parameter count (capped), 30 bytes an element as plan.c counts it;
//  - pcie_gbps: one host-to-device copy of 256 MiB (64 MiB on the cpu);
//  - launch_us: the host's time to issue one small op (queued, not waited for);
//  - sync_us: one 4-byte copy to the host with nothing queued (the routing counts' round trip);
//  - peak_tflops: a square GEMM's rate (the achievable dense peak, not a spec sheet's figure), at least
//    the highest rate above (MFU's denominator);
//  - memory_bytes, context_bytes: the GPU's total and what is taken before the run allocates (cuda), or
//    the machine's physical memory and the process's resident set at start (cpu);
//  - nvlink_gbps / internode_gbps: with several ranks, the slower of an all-to-all of one MoE layer's
//    dispatched rows (bf16) and an all-reduce of the gradients (capped), each as bytes sent per rank (ring
//    counting, cost.h CostComm) over its time: nvlink where every rank is on one node, else internode; the
//    link not measured (one rank: both) is the base profile's.
// Every rank measures; the profile holds the ranks' mean.
// Must not hold: reading or writing profiles (hwprofile.c), the planner (plan.c).
#pragma once
#include "core/config.h"
#include "parallel/comm.h"
#include "train/hwprofile.h"
#include "train/options.h"

// What a calibration measured beyond the profile's numbers.
typedef struct {
    double a2a_gbps, allreduce_gbps; // the two collectives' rates (0: one rank)
    int links; // 0: no link measured (one rank), 1: within one node (nvlink_gbps), 2: across nodes
    int groups; // the expert groups the grouped GEMMs ran (the model's, or fewer where they do not fit)
    char backend[32];
} CalibInfo;

// Measures (collective over world; every rank gets the same *p), the unmeasured links from base.
void calibrate(HwProfile *p, CalibInfo *info, const ModelConfig *c, const TrainOptions *o,
               const HwProfile *base, Comm *world);
// One line for the profile's "note": what was measured where, and what came from the base profile.
void calibrate_note(char *buf, size_t n, const CalibInfo *info, const ModelConfig *c, const TrainOptions *o,
                    const HwProfile *base, int world);
