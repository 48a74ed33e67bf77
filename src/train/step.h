// step.h — one optimizer step of training: the schedule's actions (each micro-batch's forward and
// backward), then the gradient reduction, the global norm, clipping and AdamW. The trainer calls
// step_run once per step; a pipeline schedule changes the action list, not this contract.
// Must not hold: setup, evaluation, checkpoints, printing (train/trainer.c).
#pragma once
#include <stdint.h>
#include "data/data.h"
#include "model/model.h"
#include "train/dist.h"
#include "train/fp8_watch.h"
#include "train/options.h"
#include "train/pipe.h"
#include "train/schedule.h"

// A step whose loss or gradient norm is not finite is skipped (no update: a bad batch passes); this
// many in a row mean the run diverged (the weights give no finite loss any more): it stops with an
// error, and the skipped steps write no periodic checkpoint (the last one saved stays the latest).
#define STEP_SKIPPED_MAX 3

// What a step needs, fixed for the run.
typedef struct {
    Model *m;
    Dist *dist;
    const Dataset *ds;
    const TrainOptions *o;
    Schedule sched; // this rank's actions (micro-batches = o->grad_accum)
    Pipe pipe; // the moves between pipeline stages
    int *arm_at; // (actions) 1: the last backward of its chunk (gradients final after it)
    double *stage_idle; // (stages, 2): idle time, schedule span
    double *stage_act; // (stages, vpp, 2): seconds in forwards, backwards (receive waits excluded)
    double *stage_cpu; // (stages): the process's CPU seconds over the schedule's span
    double *gathered; // (stages + 1, 3 + 2 vpp): the pp group's allgather of the three; the last row this
                      // stage's
    int T; // tokens per sequence
    int Bm, Bl; // sequences of a global micro-batch; this DP rank's share
    int dp_rank;
    int32_t *x, *y; // (Bl, T) host tokens and targets of the micro-batch being run
    float *bias_h; // (n_experts) balance aux-free: one layer's routing bias on the host, for its update
    Fp8Watch fp8; // --precision fp8's divergence checks
} StepCtx;

// What a step measured (identical on every rank).
typedef struct {
    double loss, aux, z; // means over the step's tokens / layers and micro-batches
    double mtp; // the MTP modules' loss (model.h mtp_loss), the mean over the micro-batches (0: no MTP)
    double gnorm; // global gradient norm before clipping
    float lr;
    int skipped; // non-finite loss or norm: no update (STEP_SKIPPED_MAX in a row end the run)
    int64_t dropped; // assignments dropped by capacity, all layers and micro-batches
    int64_t *counts; // (L + mtp_depth, E) assignments per expert, summed over micro-batches (caller's array)
    int stages; // pipeline stages
    double *stage_idle; // (stages, 2) each stage's time waiting for the others this step and the
                        // time its schedule took (the bubble = idle / span; valid until the next step)
    int vpp; // chunks per pipeline stage
    double *stage_act; // (stages, vpp, 2) each stage's seconds in the forwards and in the backwards of each
                       // chunk this step, its receive waits excluded (as stage_idle: until the next step)
    double *stage_cpu; // (stages) each stage's process CPU seconds over its span (a rank that kept its core
                       // throughout spends about its span: MPI's receives wait spinning)
    Fp8Jump fp8; // --precision fp8's amax jumps this step (fp8_watch.h)
} StepStats;

// The step's pipeline bubble as the schedule's theory counts it (metrics.jsonl bubble_frac): 1 - the stages'
// busy time (span less idle) over stages x the pipeline's span (the longest stage's schedule; a stage done
// early idles until then; the reduction and the optimizer after it are no part of the pipeline); 0 with
// one stage.
double step_bubble(const StepStats *r);

// The schedule: sequential without pipeline stages, else o->pp_schedule over the mesh's pp group
// (this rank's stage, o->vpp chunks); the model gets the schedule's activation slots.
void step_init(StepCtx *s, Model *m, Dist *dist, const Dataset *ds, const TrainOptions *o, const Mesh *mesh);
// A line on what the step's setup left out of memory (model_state.h model_share_grads: the expert gradients'
// holes) into buf; 0 where there is nothing to say.
int step_memory_note(const StepCtx *s, char *buf, size_t n);
void step_free(StepCtx *s);
// Runs step `step` (0-based) starting at data position seq_pos (global sequences); fills *r
// (r->counts must hold (L + mtp_depth) * E values).
void step_run(StepCtx *s, int step, uint64_t seq_pos, StepStats *r);
