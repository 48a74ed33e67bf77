// test_schedule.c — the step's action lists (train/schedule.h):
//  - sequential is the order the trainer always ran (F0 B0 F1 B1 ...);
//  - 1f1b and interleaved lists are well formed for every stage (schedule_check), have the textbook
//    shape (1f1b: p-s-1 warm-up forwards, then alternating, then the cool-down; at most min(m, p-s)
//    live), and run without deadlock on the model clock with the textbook bubble: (p-1)/(m+p-1) for
//    1f1b and (p-1)/(v m+p-1) interleaved when a forward and a backward take equal time;
//  - schedule_check refuses every malformed list a new schedule could produce, naming the violation;
//  - impossible inputs (1f1b with m < p, interleaved with m % p != 0) are refused with the numbers.
#include <string.h>
#include "train/schedule.h"
#include "test_util.h"

static const char *check_list(Action *a, int n, int micro, int max_live) {
    int live = max_live;
    Schedule s = {a, n, micro, 1, 0, 1, max_live, &live};
    return schedule_check(&s);
}

int main(void) {
    for (int m = 1; m <= 8; m++) {
        Schedule s;
        EXPECT(schedule_build(&s, SCHED_SEQUENTIAL, 1, 0, 1, m) == NULL, "sequential m %d", m);
        EXPECT(s.n == 2 * m, "m %d: %d actions", m, s.n);
        for (int i = 0; i < s.n; i++)
            EXPECT(s.a[i].micro == i / 2 && s.a[i].kind == (i % 2 ? ACT_BACKWARD : ACT_FORWARD) &&
                       s.a[i].slot == 0,
                   "m %d: action %d is (%d, micro %d, slot %d)", m, i, s.a[i].kind, s.a[i].micro,
                   s.a[i].slot);
        EXPECT(s.max_live == 1, "m %d: max_live %d", m, s.max_live);
        EXPECT(schedule_check(&s) == NULL, "m %d: %s", m, schedule_check(&s));
        EXPECT(schedule_last_backward(&s, 0) == s.n - 1, "m %d: last backward at %d", m,
               schedule_last_backward(&s, 0));
        EXPECT(schedule_bubble(SCHED_SEQUENTIAL, 1, 1, m, 1, 2) == 0, "sequential has no bubble");
        schedule_free(&s);
    }
    // 1f1b: shape, well-formedness, bubble
    for (int p = 1; p <= 8; p++)
        for (int m = p; m <= p + 9; m++) {
            for (int st = 0; st < p; st++) {
                Schedule s;
                const char *e = schedule_build(&s, SCHED_1F1B, p, st, 1, m);
                EXPECT(e == NULL, "1f1b p %d s %d m %d: %s", p, st, m, e);
                if (e) continue;
                EXPECT(schedule_check(&s) == NULL, "1f1b p %d s %d m %d: %s", p, st, m, schedule_check(&s));
                int w = p - st - 1 < m ? p - st - 1 : m, ok = 1;
                for (int i = 0; i < w; i++) ok &= s.a[i].kind == ACT_FORWARD && s.a[i].micro == i;
                for (int i = w, f = w, b = 0; i < s.n; i++) {
                    int steady = i < w + 2 * (m - w);
                    ActionKind want = steady ? ((i - w) % 2 ? ACT_BACKWARD : ACT_FORWARD) : ACT_BACKWARD;
                    ok &= s.a[i].kind == want && s.a[i].micro == (want == ACT_FORWARD ? f++ : b++);
                }
                EXPECT(ok, "1f1b p %d s %d m %d: not warm-up / one-forward-one-backward / cool-down", p, st,
                       m);
                int live = p - st < m ? p - st : m;
                EXPECT(s.max_live == live, "1f1b p %d s %d m %d: max_live %d, want %d", p, st, m, s.max_live,
                       live);
                schedule_free(&s);
            }
            double b = schedule_bubble(SCHED_1F1B, p, 1, m, 1, 1),
                   th = schedule_bubble_theory(SCHED_1F1B, p, 1, m);
            EXPECT_NEAR(b, th, 1e-12, "1f1b bubble (tf = tb) vs (p-1)/(m+p-1)");
            double b2 = schedule_bubble(SCHED_1F1B, p, 1, m, 1, 2);
            EXPECT_NEAR(b2, th, 1e-12, "1f1b bubble (tb = 2 tf) vs (p-1)/(m+p-1)");
        }
    // interleaved
    for (int p = 2; p <= 4; p++)
        for (int v = 2; v <= 3; v++)
            for (int m = p; m <= 4 * p; m += p) {
                for (int st = 0; st < p; st++) {
                    Schedule s;
                    const char *e = schedule_build(&s, SCHED_INTERLEAVED, p, st, v, m);
                    EXPECT(e == NULL, "interleaved p %d v %d s %d m %d: %s", p, v, st, m, e);
                    if (e) continue;
                    EXPECT(schedule_check(&s) == NULL, "interleaved p %d v %d s %d m %d: %s", p, v, st, m,
                           schedule_check(&s));
                    // per-chunk slots: no chunk needs more than the rank's most live, together at least that
                    // many
                    int sum = 0, most = 0;
                    for (int c = 0; c < v; c++) {
                        sum += s.live[c];
                        if (s.live[c] > most) most = s.live[c];
                    }
                    EXPECT(most <= s.max_live && sum >= s.max_live,
                           "interleaved p %d v %d s %d m %d: live per chunk "
                           "(max %d, sum %d) vs max_live %d",
                           p, v, st, m, most, sum, s.max_live);
                    // the first chunk's forwards come in micro-batch order, the last backward is on chunk 0
                    EXPECT(s.a[0].kind == ACT_FORWARD && s.a[0].micro == 0 && s.a[0].chunk == 0,
                           "first action");
                    int i0 = schedule_last_backward(&s, 0);
                    const Action *lb = &s.a[i0];
                    EXPECT(i0 == s.n - 1 && lb->chunk == 0 && lb->micro == m - 1,
                           "last backward (index %d of %d, "
                           "chunk %d micro %d)",
                           i0, s.n, lb->chunk, lb->micro);
                    for (int c = 1; c < v; c++)
                        EXPECT(schedule_last_backward(&s, c) >= 0 && schedule_last_backward(&s, c) < i0,
                               "chunk %d's last backward before chunk 0's", c);
                    schedule_free(&s);
                }
                double b = schedule_bubble(SCHED_INTERLEAVED, p, v, m, 1, 1);
                double th = schedule_bubble_theory(SCHED_INTERLEAVED, p, v, m);
                EXPECT(b >= 0, "interleaved p %d v %d m %d deadlocks", p, v, m);
                EXPECT_NEAR(b, th, 1e-12, "interleaved bubble vs (p-1)/(v m+p-1)");
                EXPECT(b < schedule_bubble(SCHED_1F1B, p, 1, m, 1, 1),
                       "interleaved p %d v %d m %d: bubble %.3f not "
                       "below 1f1b's",
                       p, v, m, b);
            }
    // refusals
    Schedule s;
    const char *e = schedule_build(&s, SCHED_1F1B, 4, 0, 1, 3);
    EXPECT(e && strstr(e, "--grad-accum 3") && strstr(e, "--pp 4"), "1f1b m < p: %s", e ? e : "accepted");
    e = schedule_build(&s, SCHED_INTERLEAVED, 2, 0, 2, 3);
    EXPECT(e && strstr(e, "multiple of --pp 2"), "interleaved m %% p: %s", e ? e : "accepted");
    e = schedule_build(&s, SCHED_INTERLEAVED, 2, 0, 1, 4);
    EXPECT(e && strstr(e, "--vpp"), "interleaved vpp 1: %s", e ? e : "accepted");
    // an all-forwards-first list is valid with max_live = m (slots 0, 1)
    Action ffbb[] = {
        {ACT_FORWARD, 0, 0, 0}, {ACT_FORWARD, 1, 0, 1}, {ACT_BACKWARD, 0, 0, 0}, {ACT_BACKWARD, 1, 0, 1}};
    EXPECT(check_list(ffbb, 4, 2, 2) == NULL, "F0 F1 B0 B1: %s", check_list(ffbb, 4, 2, 2));
    const char *bad = check_list(ffbb, 4, 2, 1);
    EXPECT(bad && strstr(bad, "slot"), "F0 F1 B0 B1 with max_live 1: %s", bad ? bad : "accepted");
    Action shared[] = {
        {ACT_FORWARD, 0, 0, 0}, {ACT_FORWARD, 1, 0, 0}, {ACT_BACKWARD, 0, 0, 0}, {ACT_BACKWARD, 1, 0, 0}};
    bad = check_list(shared, 4, 2, 2);
    EXPECT(bad && strstr(bad, "held"), "two live micro-batches in one slot: %s", bad ? bad : "accepted");
    Action early[] = {{ACT_BACKWARD, 0, 0, 0}, {ACT_FORWARD, 0, 0, 0}};
    bad = check_list(early, 2, 1, 1);
    EXPECT(bad && strstr(bad, "before its forward"), "B0 F0: %s", bad ? bad : "accepted");
    Action twice[] = {{ACT_FORWARD, 0, 0, 0}, {ACT_FORWARD, 0, 0, 0}};
    bad = check_list(twice, 2, 1, 1);
    EXPECT(bad && strstr(bad, "two forwards"), "F0 F0: %s", bad ? bad : "accepted");
    Action range[] = {{ACT_FORWARD, 0, 0, 0}, {ACT_BACKWARD, 2, 0, 0}};
    bad = check_list(range, 2, 1, 1);
    EXPECT(bad && strstr(bad, "outside"), "B2 of one micro-batch: %s", bad ? bad : "accepted");
    bad = check_list(ffbb, 3, 2, 2);
    EXPECT(bad && strstr(bad, "one forward and one backward"), "a list missing B1: %s",
           bad ? bad : "accepted");
    bad = check_list(ffbb, 0, 0, 0);
    EXPECT(bad != NULL, "no micro-batches accepted");
    // each virtual stage its own times (schedule_simulate_times), worked by hand. 1f1b, 2 stages, 2
    // micro-batches, the last stage twice as slow (tf 1, 2; tb 2, 4): stage 0 runs F0 [0,1] F1 [1,2], stage 1
    // F0 [1,3] B0 [3,7] F1 [7,9] B1 [9,13], stage 0 B0 [7,9] B1 [13,15]: busy 6 + 12 over 2 x 15.
    double tf1[] = {1, 2}, tb1[] = {2, 4};
    SchedTimes t1 = {tf1, tb1};
    SchedEvent ev1[8];
    EXPECT_NEAR(schedule_simulate_times(SCHED_1F1B, 2, 1, 2, &t1, ev1), 1 - 18.0 / 30, 1e-12,
                "1f1b, the last stage twice as slow: bubble 0.4 by hand");
    int found = 0;
    for (int i = 0; i < 8; i++)
        if (ev1[i].stage == 0 && ev1[i].kind == ACT_BACKWARD && ev1[i].micro == 1)
            found = ev1[i].t0 == 13 && ev1[i].t1 == 15;
    EXPECT(found, "1f1b by hand: stage 0's B1 waits for stage 1's (13 to 15)");
    EXPECT_NEAR(
        schedule_simulate_times(SCHED_1F1B, 2, 1, 2, &(SchedTimes){(double[]){1, 1}, (double[]){2, 2}}, NULL),
        schedule_bubble(SCHED_1F1B, 2, 1, 2, 1, 2), 1e-15, "equal times: schedule_bubble's");
    // interleaved, 2 stages x 2 chunks, 2 micro-batches, the last virtual stage (3) twice as slow: stage 0
    // F(0,m0) [0,1] F(0,m1) [1,2] F(2,m0) [2,3] F(2,m1) [3,4] B(2,m0) [9,11] B(2,m1) [15,17] B(0,m0) [17,19]
    // B(0,m1) [19,21]; stage 1 F(1,m0) [1,2] F(1,m1) [2,3] F(3,m0) [3,5] B(3,m0) [5,9] F(3,m1) [9,11]
    // B(3,m1) [11,15] B(1,m0) [15,17] B(1,m1) [17,19]: busy 12 + 18 over 2 x 21.
    double tf2[] = {1, 1, 1, 2}, tb2[] = {2, 2, 2, 4};
    SchedTimes t2 = {tf2, tb2};
    EXPECT_NEAR(schedule_simulate_times(SCHED_INTERLEAVED, 2, 2, 2, &t2, NULL), 1 - 30.0 / 42, 1e-12,
                "interleaved, the last virtual stage twice as slow: bubble 12/42 by hand");
    return test_done("test_schedule");
}
