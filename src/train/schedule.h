// schedule.h — what one training step runs on this rank, as a list of actions: the forward and the
// backward of each micro-batch, in the order a schedule chooses. The list is computed once from the
// schedule's inputs and is the thing train/step.c runs; a new schedule is a new list, not new loop code.
// Today: `sequential` (F0 B0 F1 B1 ...: each micro-batch's backward right after its forward, so one set
// of activations is live at a time). The pipeline schedules (1F1B, interleaved) produce their lists
// from (stages, virtual stages, micro-batches, this rank's stage).
// Must not hold: running the actions (train/step.c), the model, communication.
#pragma once

typedef enum { ACT_FORWARD = 0, ACT_BACKWARD = 1 } ActionKind;

typedef struct {
    ActionKind kind;
    int micro;                 // micro-batch index in [0, micro_batches)
} Action;

typedef struct {
    Action *a;
    int n;
    int micro_batches;
    int max_live;              // most micro-batches whose activations are held at once
} Schedule;

// F0 B0 F1 B1 ... F(m-1) B(m-1).
void schedule_sequential(Schedule *s, int micro_batches);
void schedule_free(Schedule *s);
// NULL when every micro-batch has exactly one forward and one backward, the backward after the
// forward, and max_live is the most forwards not yet matched by their backward; else a static
// message naming the first violation.
const char *schedule_check(const Schedule *s);
// Index of the last backward in the list (the one that finishes the step's gradients), or -1.
int schedule_last_backward(const Schedule *s);
