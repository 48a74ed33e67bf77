// measure.h — what a run measures of itself for checking the models against it, beyond metrics.jsonl:
//  - OUT/pipeline.jsonl (runs with pipeline stages; rewritten by each start, a line a step): each stage's
//    idle time and span, each virtual stage's mean forward and backward seconds (its receive waits
//    excluded), the measured bubble (metrics.jsonl's bubble_frac) and the schedule simulator's bubble on
//    those times (schedule_simulate_times: the structure of the schedule, the run's own speeds);
//  - OUT/memory.json (at the end of training, before the final evaluation): each rank's resident set
//    before its model was built, the largest at the end of a step (what the run's buffers hold: what
//    `moe info`'s per-rank float32 accounting counts; tests/test_memory_mesh.sh) and its peak since the
//    start (VmHWM: also what lived only inside a step, as MPI's temporary buffers of a collective).
// Must not hold: the step's timing itself (train/step.c), metrics.jsonl and the progress line
// (train/trainer.c).
#pragma once
#include <stdio.h>
#include "parallel/comm.h"
#include "train/step.h"

typedef struct {
    FILE *pf; // pipeline.jsonl (rank 0, with stages)
    char path[2048];
    double rss_base; // this rank's resident bytes before the model was built
    double rss_step; // the most at the end of a step
} Measure;

// Before the model allocates: the resident set it starts from.
void measure_base(Measure *m);
// pipeline.jsonl opened in out (rank 0 of a run with stages > 1; else nothing to write).
void measure_open(Measure *m, const char *out, int rank0, int stages);
// Step `step` (0-based)'s line: the schedule kind and micro-batches the step ran.
void measure_step(Measure *m, int step, const StepStats *s, ScheduleKind kind, int micro);
// After a step: its resident set (the most is kept).
void measure_after_step(Measure *m);
// Every rank's base, step and peak resident set to rank 0, which writes out/memory.json (collective).
void measure_memory(const Measure *m, const Comm *world, const char *out);
void measure_close(Measure *m);
