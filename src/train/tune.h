// tune.h — choosing among candidate settings by measuring them (Tutel's adaptivity: the MoE exchange's
// overlap degree, chosen at run time for the current load). A Tuner runs each candidate for one
// warm-up step and `trials` measured steps, settles on the fastest, and re-tunes when the routing
// load (a running mean over the last steps: one odd step does not count) moves by more than `retune`
// (relative) from the load it tuned at, or the settled setting's running time grows by more than
// `retune`; a re-tune switches only to a candidate faster than the incumbent
// by more than `margin` (hysteresis: noise below the margin never flips a choice).
// Every rank must feed the same numbers (the trainer reduces them first) so every rank chooses alike.
// Must not hold: what the candidates mean, timing, communication.
#pragma once

// The most candidates one tuner measures: the adaptive MoE exchange's largest set is 15 (AMPipe's
// n = 1, 2, 4, each with the gathered mode and r = 1, 2, 4, 8: train/adapt.c); tuner_init refuses more.
#define TUNE_MAX 16

typedef struct {
    int n, cand[TUNE_MAX]; // the candidates, in the order they are tried
    int trials; // measured steps per candidate
    double margin, retune;
    int tuning; // 1 while measuring candidates
    int idx, seen; // the candidate being measured and the steps it has run (the first is warm-up)
    double sum[TUNE_MAX]; // its measured time so far
    int cnt[TUNE_MAX];
    double mean[TUNE_MAX]; // the last tuning's mean time of each candidate (-1: not measured)
    int choice; // index of the settled candidate (-1 before the first tuning ends)
    double choice_t, load0; // its time and the load when it was chosen
    double recent; // the settled candidate's recent time (running mean of the last few steps)
    double recent_load; // and the recent load
    int tunings; // completed tunings
} Tuner;

void tuner_init(Tuner *t, const int *cand, int n, int trials, double margin, double retune);
// The candidate the next step runs.
int tuner_current(const Tuner *t);
// The step that ran tuner_current() took `seconds` at routing load `load` (e.g. the busiest expert over
// the mean); seconds < 0: not measured (settled steps need not be timed: only the load shift then
// re-tunes). Returns 1 when the tuner has just settled (a tuning ended; tuner_current() may change).
int tuner_observe(Tuner *t, double seconds, double load);
