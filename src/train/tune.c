// tune.c — the measured choice among candidates (see tune.h).
#include "train/tune.h"
#include <string.h>
#include "core/common.h"

void tuner_init(Tuner *t, const int *cand, int n, int trials, double margin, double retune) {
    memset(t, 0, sizeof *t);
    CHECK(n >= 1 && n <= TUNE_MAX, "tuner: %d candidates; 1..%d are measured (TUNE_MAX)", n, TUNE_MAX);
    t->n = n;
    memcpy(t->cand, cand, sizeof(int) * t->n);
    t->trials = trials > 0 ? trials : 1;
    t->margin = margin;
    t->retune = retune;
    t->tuning = 1;
    t->choice = -1;
    for (int i = 0; i < TUNE_MAX; i++) t->mean[i] = -1;
}

int tuner_current(const Tuner *t) { return t->cand[t->tuning ? t->idx : t->choice]; }

static void start_tuning(Tuner *t) {
    t->tuning = 1;
    t->idx = t->seen = 0;
    memset(t->sum, 0, sizeof t->sum);
    memset(t->cnt, 0, sizeof t->cnt);
}

int tuner_observe(Tuner *t, double seconds, double load) {
    if (!t->tuning) {
        // settled: a running mean of the last steps; re-tune on a load shift or a slowdown
        if (seconds >= 0) t->recent = t->recent > 0 ? 0.75 * t->recent + 0.25 * seconds : seconds;
        t->recent_load = 0.75 * t->recent_load + 0.25 * load;
        double shift = t->load0 > 0 ? (t->recent_load - t->load0) / t->load0 : 0;
        if (shift < 0) shift = -shift;
        if (shift > t->retune || t->recent > t->choice_t * (1 + t->retune)) start_tuning(t);
        return 0;
    }
    if (t->seen++ > 0) {
        t->sum[t->idx] += seconds;
        t->cnt[t->idx]++;
    } // the first step warms up
    if (t->seen <= t->trials) return 0;
    t->mean[t->idx] = t->sum[t->idx] / t->cnt[t->idx];
    t->seen = 0;
    if (++t->idx < t->n) return 0;
    // every candidate measured: the fastest (the first of equals), unless the incumbent is within margin
    int best = 0;
    for (int i = 1; i < t->n; i++)
        if (t->mean[i] < t->mean[best]) best = i;
    if (t->choice >= 0 && t->mean[best] > t->mean[t->choice] * (1 - t->margin)) best = t->choice;
    t->choice = best;
    t->choice_t = t->mean[best];
    t->recent = 0;
    t->load0 = t->recent_load = load;
    t->tuning = 0;
    t->tunings++;
    return 1;
}
