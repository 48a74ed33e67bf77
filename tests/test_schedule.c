// test_schedule.c — the step's action lists (train/schedule.h): the sequential schedule is the order
// the trainer always ran (F0 B0 F1 B1 ...), and schedule_check refuses every malformed list a new
// schedule could produce (a missing, repeated or early backward, a micro-batch out of range, a wrong
// max_live), naming the violation.
#include <string.h>
#include "train/schedule.h"
#include "test_util.h"

static const char *check_list(const Action *a, int n, int micro, int max_live) {
    Schedule s = {(Action *)a, n, micro, max_live};
    return schedule_check(&s);
}

int main(void) {
    for (int m = 1; m <= 8; m++) {
        Schedule s;
        schedule_sequential(&s, m);
        EXPECT(s.n == 2 * m, "m %d: %d actions", m, s.n);
        for (int i = 0; i < s.n; i++)
            EXPECT(s.a[i].micro == i / 2 && s.a[i].kind == (i % 2 ? ACT_BACKWARD : ACT_FORWARD),
                   "m %d: action %d is (%d, micro %d)", m, i, s.a[i].kind, s.a[i].micro);
        EXPECT(s.max_live == 1, "m %d: max_live %d", m, s.max_live);
        EXPECT(schedule_check(&s) == NULL, "m %d: %s", m, schedule_check(&s));
        EXPECT(schedule_last_backward(&s) == s.n - 1, "m %d: last backward at %d", m, schedule_last_backward(&s));
        schedule_free(&s);
    }
    // an all-forwards-first list (what a pipeline's warm-up looks like) is valid with max_live = m
    Action ffbb[] = {{ACT_FORWARD, 0}, {ACT_FORWARD, 1}, {ACT_BACKWARD, 0}, {ACT_BACKWARD, 1}};
    EXPECT(check_list(ffbb, 4, 2, 2) == NULL, "F0 F1 B0 B1: %s", check_list(ffbb, 4, 2, 2));
    const char *bad = check_list(ffbb, 4, 2, 1);
    EXPECT(bad && strstr(bad, "max_live"), "F0 F1 B0 B1 with max_live 1: %s", bad ? bad : "accepted");
    Action early[] = {{ACT_BACKWARD, 0}, {ACT_FORWARD, 0}};
    bad = check_list(early, 2, 1, 1);
    EXPECT(bad && strstr(bad, "before its forward"), "B0 F0: %s", bad ? bad : "accepted");
    Action twice[] = {{ACT_FORWARD, 0}, {ACT_FORWARD, 0}};
    bad = check_list(twice, 2, 1, 1);
    EXPECT(bad && strstr(bad, "two forwards"), "F0 F0: %s", bad ? bad : "accepted");
    Action range[] = {{ACT_FORWARD, 0}, {ACT_BACKWARD, 2}};
    bad = check_list(range, 2, 1, 1);
    EXPECT(bad && strstr(bad, "outside"), "B2 of one micro-batch: %s", bad ? bad : "accepted");
    bad = check_list(ffbb, 3, 2, 2);
    EXPECT(bad && strstr(bad, "one forward and one backward"), "a list missing B1: %s", bad ? bad : "accepted");
    bad = check_list(ffbb, 0, 0, 0);
    EXPECT(bad != NULL, "no micro-batches accepted");
    return test_done("test_schedule");
}
