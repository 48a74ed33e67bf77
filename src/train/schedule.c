// schedule.c — the action lists of a training step and their simulation (see schedule.h).
#include "train/schedule.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"

static void add(Schedule *s, ActionKind kind, int micro, int chunk) {
    s->a[s->n++] = (Action){kind, micro, chunk, -1};
}

// Megatron's task order: forward task k runs chunk (k / p) % v on micro-batch (k / (p v)) p + k % p;
// backward task k the same micro-batch on chunk v - 1 - (k / p) % v. With v = 1: micro-batch k.
static void task(const Schedule *s, int k, int backward, int *micro, int *chunk) {
    int p = s->stages, v = s->vpp;
    if (v == 1) {
        *micro = k;
        *chunk = 0;
        return;
    }
    int c = (k / p) % v;
    *chunk = backward ? v - 1 - c : c;
    *micro = (k / (p * v)) * p + k % p;
}

// Slots, per chunk: the lowest free one of the chunk at each forward, freed by the backward of the
// same (chunk, micro). The lowest-free rule makes a chunk's slot count its most live at once.
static void assign_slots(Schedule *s) {
    int M = s->micro_batches, V = s->vpp;
    int *held = xmalloc(sizeof(int) * (size_t)V * M + 1), *nheld = xcalloc((size_t)V, sizeof(int));
    int *slot_of = xmalloc(sizeof(int) * (size_t)M * V + 1), live = 0;
    s->live = xcalloc((size_t)V, sizeof(int));
    s->max_live = 0;
    for (int i = 0; i < s->n; i++) {
        Action *a = &s->a[i];
        int key = a->chunk * M + a->micro, *h = held + (size_t)a->chunk * M, *nh = &nheld[a->chunk];
        if (a->kind == ACT_FORWARD) {
            int k = 0;
            while (k < *nh && h[k] >= 0) k++;
            if (k == *nh) h[(*nh)++] = -1;
            h[k] = key;
            slot_of[key] = k;
            a->slot = k;
            if (*nh > s->live[a->chunk]) s->live[a->chunk] = *nh;
            if (++live > s->max_live) s->max_live = live;
        } else {
            a->slot = slot_of[key];
            h[a->slot] = -1;
            while (*nh > 0 && h[*nh - 1] < 0) (*nh)--;
            live--;
        }
    }
    free(held);
    free(nheld);
    free(slot_of);
}

const char *schedule_build(Schedule *s, ScheduleKind kind, int stages, int stage, int vpp, int m) {
    static char msg[200];
    memset(s, 0, sizeof *s);
    if (kind == SCHED_SEQUENTIAL) stages = 1, stage = 0, vpp = 1;
    if (kind == SCHED_1F1B) vpp = 1;
    if (m < 1) return "a step needs at least one micro-batch";
    if (stages < 1 || stage < 0 || stage >= stages) return "stage outside the pipeline";
    if (kind == SCHED_1F1B && m < stages) {
        snprintf(msg, sizeof msg,
                 "the 1f1b schedule needs at least as many micro-batches (--grad-accum %d) as "
                 "pipeline stages (--pp %d)",
                 m, stages);
        return msg;
    }
    if (kind == SCHED_INTERLEAVED) {
        if (stages < 2 || vpp < 2) {
            snprintf(msg, sizeof msg,
                     "the interleaved schedule needs --pp >= 2 and --vpp >= 2 (got --pp %d --vpp %d)", stages,
                     vpp);
            return msg;
        }
        if (m % stages) {
            snprintf(msg, sizeof msg,
                     "the interleaved schedule needs micro-batches (--grad-accum %d) to be a "
                     "multiple of --pp %d",
                     m, stages);
            return msg;
        }
    }
    s->micro_batches = m;
    s->stages = stages;
    s->stage = stage;
    s->vpp = vpp;
    int total = m * vpp;
    s->a = xmalloc(sizeof(Action) * (size_t)total * 2);
    if (kind == SCHED_SEQUENTIAL) {
        for (int g = 0; g < m; g++) {
            add(s, ACT_FORWARD, g, 0);
            add(s, ACT_BACKWARD, g, 0);
        }
    } else {
        int warm = kind == SCHED_1F1B ? stages - stage - 1 : (stages - stage - 1) * 2 + (vpp - 1) * stages;
        if (warm > total) warm = total;
        int mi, ch;
        for (int k = 0; k < warm; k++) {
            task(s, k, 0, &mi, &ch);
            add(s, ACT_FORWARD, mi, ch);
        }
        for (int k = 0; k < total - warm; k++) {
            task(s, warm + k, 0, &mi, &ch);
            add(s, ACT_FORWARD, mi, ch);
            task(s, k, 1, &mi, &ch);
            add(s, ACT_BACKWARD, mi, ch);
        }
        for (int k = total - warm; k < total; k++) {
            task(s, k, 1, &mi, &ch);
            add(s, ACT_BACKWARD, mi, ch);
        }
    }
    assign_slots(s);
    return NULL;
}

void schedule_free(Schedule *s) {
    free(s->a);
    free(s->live);
    s->a = NULL;
    s->live = NULL;
    s->n = 0;
}

const char *schedule_check(const Schedule *s) {
    int M = s->micro_batches, V = s->vpp, live = 0, most = 0;
    if (M < 1 || V < 1) return "a schedule needs at least one micro-batch and one chunk";
    if (s->n != 2 * M * V) return "a schedule has one forward and one backward per micro-batch and chunk";
    int cap = 0;
    for (int c = 0; c < V; c++)
        if (s->live && s->live[c] > cap) cap = s->live[c];
    char *seen = xcalloc((size_t)M * V * 2, 1); // [chunk][micro][kind]
    int *slot_key = xmalloc(sizeof(int) * (size_t)V * (cap > 0 ? cap : 1)); // [chunk][slot]
    for (int k = 0; k < V * (cap > 0 ? cap : 1); k++) slot_key[k] = -1;
    const char *bad = s->live ? NULL : "a schedule has no slot counts";
    for (int i = 0; i < s->n && !bad; i++) {
        const Action *a = &s->a[i];
        int key = a->chunk * M + a->micro;
        if (a->micro < 0 || a->micro >= M || a->chunk < 0 || a->chunk >= V)
            bad = "an action names a micro-batch or chunk outside the step";
        else if (a->slot < 0 || a->slot >= s->live[a->chunk])
            bad = "an action's slot is outside its chunk's [0, live)";
        else if (seen[key * 2 + a->kind])
            bad = "a micro-batch has two forwards or two backwards on one chunk";
        else if (a->kind == ACT_BACKWARD && !seen[key * 2]) bad = "a backward comes before its forward";
        else {
            int *sk = &slot_key[a->chunk * cap + a->slot];
            if (a->kind == ACT_FORWARD && *sk >= 0) bad = "a forward takes a slot that is held";
            else if (a->kind == ACT_BACKWARD && *sk != key)
                bad = "a backward names another slot than its forward";
            else {
                seen[key * 2 + a->kind] = 1;
                *sk = a->kind == ACT_FORWARD ? key : -1;
                live += a->kind == ACT_FORWARD ? 1 : -1;
                if (live > most) most = live;
            }
        }
    }
    free(seen);
    free(slot_key);
    if (!bad && most != s->max_live) bad = "max_live is not the most micro-batches held at once";
    return bad;
}

int schedule_last_backward(const Schedule *s, int chunk) {
    for (int i = s->n - 1; i >= 0; i--)
        if (s->a[i].kind == ACT_BACKWARD && s->a[i].chunk == chunk) return i;
    return -1;
}

double schedule_simulate_times(ScheduleKind kind, int p, int v, int m, const SchedTimes *t, SchedEvent *ev) {
    if (kind == SCHED_SEQUENTIAL) p = v = 1;
    if (kind == SCHED_1F1B) v = 1;
    int S = p * v;
    Schedule *sc = xcalloc((size_t)p, sizeof *sc);
    for (int s = 0; s < p; s++)
        if (schedule_build(&sc[s], kind, p, s, v, m)) {
            for (int k = 0; k < s; k++) schedule_free(&sc[k]);
            free(sc);
            return -1;
        }
    // finish times of F and B of (virtual stage, micro), < 0 while not run
    double *fdone = xmalloc(sizeof(double) * (size_t)S * m), *bdone = xmalloc(sizeof(double) * (size_t)S * m);
    for (int i = 0; i < S * m; i++) fdone[i] = bdone[i] = -1;
    double *clock = xcalloc((size_t)p, sizeof(double)), busy = 0;
    int *next = xcalloc((size_t)p, sizeof(int)), left = 0, nev = 0;
    for (int s = 0; s < p; s++) left += sc[s].n;
    for (int progress = 1; left > 0 && progress;) {
        progress = 0;
        for (int s = 0; s < p; s++) {
            while (next[s] < sc[s].n) {
                const Action *a = &sc[s].a[next[s]];
                int vs = a->chunk * p + s, i = vs * m + a->micro;
                double ready;
                if (a->kind == ACT_FORWARD) ready = vs == 0 ? 0 : fdone[i - m];
                else ready = vs == S - 1 ? fdone[i] : bdone[i + m];
                if (ready < 0) break; // waits on a receive
                double t0 = clock[s] > ready ? clock[s] : ready,
                       dt = a->kind == ACT_FORWARD ? t->tf[vs] : t->tb[vs];
                clock[s] = t0 + dt;
                busy += dt;
                (a->kind == ACT_FORWARD ? fdone : bdone)[i] = clock[s];
                if (ev) ev[nev++] = (SchedEvent){s, a->chunk, a->micro, a->kind, t0, clock[s]};
                next[s]++;
                left--;
                progress = 1;
            }
        }
    }
    double span = 0;
    for (int s = 0; s < p; s++)
        if (clock[s] > span) span = clock[s];
    double bubble = left > 0 ? -1 : 1 - busy / (span * p);
    for (int s = 0; s < p; s++) schedule_free(&sc[s]);
    free(sc);
    free(fdone);
    free(bdone);
    free(clock);
    free(next);
    return bubble;
}

double schedule_simulate(ScheduleKind kind, int p, int v, int m, double tf, double tb, SchedEvent *ev) {
    if (kind == SCHED_SEQUENTIAL) p = v = 1;
    if (kind == SCHED_1F1B) v = 1;
    double *f = xmalloc(sizeof(double) * (size_t)p * v * 2), *b = f + p * v;
    for (int k = 0; k < p * v; k++) f[k] = tf, b[k] = tb;
    SchedTimes t = {f, b};
    double bubble = schedule_simulate_times(kind, p, v, m, &t, ev);
    free(f);
    return bubble;
}

double schedule_bubble(ScheduleKind kind, int p, int v, int m, double tf, double tb) {
    return schedule_simulate(kind, p, v, m, tf, tb, NULL);
}

double schedule_bubble_theory(ScheduleKind kind, int p, int v, int m) {
    if (kind == SCHED_SEQUENTIAL) return 0;
    if (kind == SCHED_1F1B) v = 1;
    return (double)(p - 1) / ((double)v * m + p - 1);
}
