// schedule.h — what one training step runs on this rank, as a list of actions: the forward and the
// backward of each micro-batch on each of this rank's model chunks, in the order a schedule chooses.
// The list is computed once from (stages, virtual stages, micro-batches, this rank's stage) and is
// the thing train/step.c runs; a new schedule is a new list, not new loop code.
//   sequential   one stage: F0 B0 F1 B1 ... (one set of activations live at a time)
//   1f1b         PP stages: warm-up forwards, then one forward one backward, then the cool-down
//                backwards (PipeDream-flush / Megatron); stage s holds at most min(m, p-s) live
//   interleaved  1F1B over v chunks per rank (virtual stage c*p + s on rank s), forwards in groups
//                of p micro-batches per chunk (Megatron's order); needs m % p == 0
// Each action carries the activation slot it uses among its chunk's: the lowest free one of that
// chunk at its forward, freed at its backward; chunk c needs live[c] slots (max_live: the most
// micro-batch-chunks held at once over all chunks).
// Must not hold: running the actions (train/step.c), the model, communication.
#pragma once

typedef enum { ACT_FORWARD = 0, ACT_BACKWARD = 1 } ActionKind;
typedef enum { SCHED_SEQUENTIAL = 0, SCHED_1F1B = 1, SCHED_INTERLEAVED = 2 } ScheduleKind;

typedef struct {
    ActionKind kind;
    int micro; // micro-batch index in [0, micro_batches)
    int chunk; // this rank's model chunk in [0, vpp): virtual stage chunk * stages + stage
    int slot; // activation slot of its chunk, in [0, live[chunk])
} Action;

typedef struct {
    Action *a;
    int n;
    int micro_batches;
    int stages, stage, vpp; // pipeline stages, this rank's stage, chunks per rank
    int max_live; // most (chunk, micro-batch) pairs held at once
    int *live; // (vpp) slots each chunk needs
} Schedule;

// The list of `kind` for this stage; NULL, or a static message naming the numbers when the schedule
// cannot run them (1f1b: micro-batches < stages; interleaved: micro-batches not a multiple of
// stages, vpp < 2 or stages < 2). Sequential takes stages = vpp = 1.
const char *schedule_build(Schedule *s, ScheduleKind kind, int stages, int stage, int vpp, int micro_batches);
void schedule_free(Schedule *s);
// NULL when the list is well formed: every (chunk, micro-batch) has exactly one forward and one
// backward, the backward after the forward, slots in range of their chunk's live count and never held
// twice, max_live the most held at once; else a static message naming the first violation.
const char *schedule_check(const Schedule *s);
// Index of chunk's last backward in the list (after it that chunk's gradients are final), or -1.
int schedule_last_backward(const Schedule *s, int chunk);

// Runs every stage's list of `kind` on a model clock: a forward of one chunk takes tf, a backward tb,
// messages are instant, a forward of virtual stage k waits for k-1's forward of that micro-batch and a
// backward for k+1's backward (sends never block, receives wait: as train/step.c runs them). Returns
// the bubble fraction (idle time / step time, the mean over stages), or -1 if the lists deadlock.
double schedule_bubble(ScheduleKind kind, int stages, int vpp, int micro_batches, double tf, double tb);
// One action as schedule_simulate ran it: its stage, chunk, micro-batch and kind, from t0 to t1.
typedef struct {
    int stage, chunk, micro;
    ActionKind kind;
    double t0, t1;
} SchedEvent;
// schedule_bubble, each action recorded into ev (NULL: none; else room for every stage's actions: stages x
// 2 x vpp x micro_batches, or 2 x micro_batches when sequential), in the order the model clock runs them.
double schedule_simulate(ScheduleKind kind, int stages, int vpp, int micro_batches, double tf, double tb,
                         SchedEvent *ev);
// The model clock's times, each virtual stage its own: what a run measured (train/measure.c, from
// train/step.c's StepStats) or a model predicts (the last stage's LM head and loss make its actions longer).
typedef struct {
    const double *tf,
        *tb; // (stages x vpp, virtual stage k = chunk x stages + stage) a forward's, a backward's
} SchedTimes;
// schedule_simulate with virtual stage k's forwards taking tf[k] and its backwards tb[k] (messages instant);
// the bubble is 1 - the stages' busy time over stages x the longest stage's span (as the trainer's
// bubble_frac counts it), or -1 on a deadlock.
double schedule_simulate_times(ScheduleKind kind, int stages, int vpp, int micro_batches, const SchedTimes *t,
                               SchedEvent *ev);
// The textbook bubble: (p-1)/(m+p-1) for 1f1b (equal tf, tb), (p-1)/(v*m+p-1) interleaved, 0 sequential.
double schedule_bubble_theory(ScheduleKind kind, int stages, int vpp, int micro_batches);
