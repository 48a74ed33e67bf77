// test_tune.c — the run-time selector (train/tune.h) on injected timings: it measures every candidate
// (after a warm-up step each), settles on the fastest, keeps its choice under noise smaller than the
// margin, re-tunes when the load shifts past the threshold (and when its choice slows down), switches
// on a re-tune only to a candidate faster by more than the margin, and two tuners fed the same numbers
// choose alike (what makes every rank agree).
#include <math.h>
#include "core/rng.h"
#include "train/tune.h"
#include "test_util.h"

// run steps with time(candidate) = base[c] * (1 + noise * u), u in [-1, 1]; load fixed
static int run(Tuner *t, const double *base, double noise, double load, int steps, Rng *r) {
    int settled = 0;
    for (int s = 0; s < steps; s++) {
        int c = tuner_current(t), i = 0;
        while (t->cand[i] != c) i++;
        double u = 2 * rng_uniform(r) - 1;
        settled += tuner_observe(t, base[i] * (1 + noise * u), load);
    }
    return settled;
}

int main(void) {
    int cand[] = {1, 2, 4, 8};
    double base[] = {1.0, 0.7, 0.6, 0.9}; // r = 4 is fastest
    Rng r;
    rng_seed(&r, 7);
    Tuner t;
    tuner_init(&t, cand, 4, 3, 0.05, 0.25);
    EXPECT(tuner_current(&t) == 1, "tries the first candidate first");
    // 4 candidates x (1 warm-up + 3 trials) = 16 steps to settle
    int settled = run(&t, base, 0, 1.2, 15, &r);
    EXPECT(settled == 0 && t.tuning, "still tuning after 15 steps");
    settled = run(&t, base, 0, 1.2, 1, &r);
    EXPECT(settled == 1 && !t.tuning, "settled after 16 steps");
    EXPECT(tuner_current(&t) == 4, "picks the fastest (r = 4), got %d", tuner_current(&t));
    EXPECT(fabs(t.mean[0] - 1.0) < 1e-12 && fabs(t.mean[2] - 0.6) < 1e-12, "means exclude the warm-up step");
    // noise of 3% (below the 25% slow-down threshold): no re-tune over 200 steps
    settled = run(&t, base, 0.03, 1.2, 200, &r);
    EXPECT(!t.tuning && t.tunings == 1 && tuner_current(&t) == 4, "stable under noise (tunings %d)",
           t.tunings);
    // one step at an odd load does not re-tune; a lasting shift past 25% does, within a few steps;
    // with unchanged timings the choice stays
    tuner_observe(&t, 0.6, 1.2 * 1.6);
    EXPECT(!t.tuning, "a single step at +60%% load does not re-tune");
    tuner_observe(&t, 0.6, 1.2);
    int k = 0;
    while (!t.tuning && k < 20) {
        tuner_observe(&t, 0.6, 1.56);
        k++;
    }
    EXPECT(t.tuning && k <= 8, "a lasting 30%% load shift starts a re-tune (after %d steps)", k);
    run(&t, base, 0, 1.56, 16, &r);
    EXPECT(!t.tuning && t.tunings == 2 && tuner_current(&t) == 4, "re-tuned, kept r = 4");
    // the load drops back (36%), and now r = 2 is faster than r = 4 by only 3% (inside the margin): keep r =
    // 4
    double close[] = {1.0, 0.582, 0.6, 0.9};
    for (k = 0; !t.tuning && k < 20; k++) tuner_observe(&t, 0.6, 1.0);
    EXPECT(t.tuning, "load shift back re-tunes");
    run(&t, close, 0, 1.0, 16, &r);
    EXPECT(!t.tuning && tuner_current(&t) == 4,
           "a 3%% faster candidate does not flip the choice (hysteresis): %d", tuner_current(&t));
    // r = 2 clearly faster (20%): a slow-down of the settled choice triggers a re-tune, which switches
    double shifted[] = {1.0, 0.5, 0.9, 0.9};
    run(&t, shifted, 0, 1.0, 4, &r); // r = 4 now takes 0.9 > 0.6 * 1.25: re-tune
    EXPECT(t.tuning, "a slowed-down choice starts a re-tune");
    run(&t, shifted, 0, 1.0, 16, &r);
    EXPECT(!t.tuning && tuner_current(&t) == 2,
           "switches to r = 2 when it is faster by more than the margin: %d", tuner_current(&t));
    // agreement: two tuners fed the same numbers make the same choices step by step
    Tuner a, b;
    tuner_init(&a, cand, 4, 2, 0.05, 0.2);
    tuner_init(&b, cand, 4, 2, 0.05, 0.2);
    Rng ra, rb;
    rng_seed(&ra, 3);
    rng_seed(&rb, 3);
    int same = 1;
    for (int s = 0; s < 300; s++) {
        double load = 1 + 0.5 * (s / 100);
        double ua = rng_uniform(&ra), ub = rng_uniform(&rb);
        same &= tuner_current(&a) == tuner_current(&b);
        tuner_observe(&a, 0.5 + ua, load);
        tuner_observe(&b, 0.5 + ub, load);
    }
    EXPECT(same && a.tunings == b.tunings && a.tunings >= 3, "two tuners agree (tunings %d, %d)", a.tunings,
           b.tunings);
    // one candidate: settles on it
    Tuner one;
    int c1[] = {1};
    tuner_init(&one, c1, 1, 2, 0.05, 0.2);
    for (int s = 0; s < 3; s++) tuner_observe(&one, 1.0, 1.0);
    EXPECT(!one.tuning && tuner_current(&one) == 1, "a single candidate settles");
    return test_done("test_tune");
}
