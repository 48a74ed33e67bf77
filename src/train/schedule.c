// schedule.c — the action lists of a training step (see schedule.h).
#include "train/schedule.h"
#include <stdlib.h>
#include "core/common.h"

void schedule_sequential(Schedule *s, int micro_batches) {
    s->micro_batches = micro_batches;
    s->n = 2 * micro_batches;
    s->a = xmalloc(sizeof(Action) * (size_t)s->n + 1);
    for (int g = 0; g < micro_batches; g++) {
        s->a[2 * g] = (Action){ACT_FORWARD, g};
        s->a[2 * g + 1] = (Action){ACT_BACKWARD, g};
    }
    s->max_live = micro_batches > 0;
}

void schedule_free(Schedule *s) { free(s->a); s->a = NULL; s->n = 0; }

const char *schedule_check(const Schedule *s) {
    int M = s->micro_batches, live = 0, most = 0;
    if (M < 1) return "a schedule needs at least one micro-batch";
    if (s->n != 2 * M) return "a schedule has one forward and one backward per micro-batch";
    char *seen = xcalloc((size_t)M * 2, 1);   // [micro][kind]
    const char *bad = NULL;
    for (int i = 0; i < s->n && !bad; i++) {
        const Action *a = &s->a[i];
        if (a->micro < 0 || a->micro >= M) bad = "an action names a micro-batch outside the step";
        else if (seen[a->micro * 2 + a->kind]) bad = "a micro-batch has two forwards or two backwards";
        else if (a->kind == ACT_BACKWARD && !seen[a->micro * 2]) bad = "a backward comes before its forward";
        else {
            seen[a->micro * 2 + a->kind] = 1;
            live += a->kind == ACT_FORWARD ? 1 : -1;
            if (live > most) most = live;
        }
    }
    free(seen);
    if (!bad && most != s->max_live) bad = "max_live is not the most micro-batches held at once";
    return bad;
}

int schedule_last_backward(const Schedule *s) {
    for (int i = s->n - 1; i >= 0; i--)
        if (s->a[i].kind == ACT_BACKWARD) return i;
    return -1;
}
