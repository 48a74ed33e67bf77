// metrics.h — a run's metrics.jsonl read back (for plot.c's PNGs and compare.c's table): the training
// lines (loss, router losses, throughput, expert load) and the validation lines, sorted by step with a
// re-done step's latest line kept. Must not hold: writing metrics (trainer.c), drawing (plot.c).
#pragma once
#include <stddef.h>

typedef struct {
    long step, seq; // seq: the line's position in the file
    double loss, aux, z; // NAN where absent or not finite
    double tokens_s, step_time; // tokens_per_s, step_time_s; NAN where absent
    long load; // row in Metrics.loads, -1 = none
} TrainRec;
typedef struct {
    long step, seq;
    double val;
} ValRec;

typedef struct {
    TrainRec *tr;
    size_t ntr, captr;
    ValRec *va;
    size_t nva, capva;
    float *loads;
    size_t nloads, caploads; // nloads records of L*E shares each
    int L, E; // expert_load shape (0 = none seen yet)
} Metrics;

// Reads path into m (zero-initialised) and sorts it by step (metrics_sort). Lines that are not JSON objects
// with a step are skipped. Returns 0, or -1 with errno set when the file cannot be opened or read.
int metrics_read(const char *path, Metrics *m);
void metrics_free(Metrics *m);
