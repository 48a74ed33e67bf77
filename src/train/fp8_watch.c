// fp8_watch.c — --precision fp8's divergence checks (see fp8_watch.h): the non-finite scale groups from
// Backend.fp8_nonfinite, the amax record from Backend.fp8_amax.
#include "train/fp8_watch.h"
#include <stdio.h>
#include <stdlib.h>
#include "core/common.h"

void fp8_watch_init(Fp8Watch *w, int layers, int jump, const Comm *world) {
    w->jump = jump;
    w->rows = layers + 1;
    w->world = world;
    size_t n = (size_t)w->rows * FP8T_N;
    w->rec = xmalloc(sizeof(int) * n);
    w->cur = xmalloc(sizeof(int) * n);
    w->all = xmalloc(sizeof(int) * n * (size_t)comm_size(world));
    for (size_t i = 0; i < n; i++) w->rec[i] = FP8_AMAX_NONE;
}

void fp8_watch_free(Fp8Watch *w) {
    free(w->rec);
    free(w->cur);
    free(w->all);
}

// The non-finite groups (counted since the last step: the evaluation between steps too) stop the run;
// nothing is written, so the last checkpoint stays the run's latest.
static void nonfinite_check(const Backend *be, int step) {
    int layer, tensor;
    int64_t bad = be->fp8_nonfinite(&layer, &tensor);
    if (bad)
        DIE("step %d: --precision fp8: %lld scale group%s of the %s FP8 operands held a NaN or an "
            "infinity, the first in layer %d, tensor %s: the run diverged (the last checkpoint is intact; "
            "a lower --lr or --grad-clip, or --precision mixed)",
            step + 1, (long long)bad, bad == 1 ? "" : "s",
            be->fp8_dense ? "experts' and attention projections'" : "experts'", layer,
            fp8_tensor_name(tensor));
}

void fp8_watch_step(Fp8Watch *w, const Backend *be, int step, Fp8Jump *j) {
    j->on = j->n = 0;
    j->layer = j->tensor = -1;
    if (!be->fp8_nonfinite) return;
    nonfinite_check(be, step);
    if (!w->jump || !be->fp8_amax) return;
    size_t n = (size_t)w->rows * FP8T_N;
    be->fp8_amax(w->cur, w->rows);
    int P = comm_size(w->world);
    if (P > 1) { // (each rank quantised its own experts, stages, slices)
        comm_allgather(w->world, w->cur, w->all, n, CT_I32);
        for (int p = 0; p < P; p++)
            for (size_t i = 0; i < n; i++)
                if (w->all[(size_t)p * n + i] > w->cur[i]) w->cur[i] = w->all[(size_t)p * n + i];
    }
    j->on = 1;
    j->jump = w->jump;
    for (size_t i = 0; i < n; i++) {
        int k = w->cur[i], r = w->rec[i];
        if (k == FP8_AMAX_NONE) continue;
        if (r != FP8_AMAX_NONE && k - r >= w->jump) {
            j->n++;
            if (j->tensor < 0 || k - r > j->to - j->from) {
                j->layer = (int)(i / FP8T_N) - 1;
                j->tensor = (int)(i % FP8T_N);
                j->from = r;
                j->to = k;
            }
        }
        if (k > r) w->rec[i] = k;
    }
}

int fp8_jump_note(const Fp8Jump *j, int step, char *buf, size_t n) {
    if (!j->n) return 0;
    snprintf(
        buf, n,
        "step %d: --precision fp8: %d FP8 operand%s rose to an amax 2^%d times or more the largest of "
        "every earlier step (--fp8-amax-jump); the most, layer %d's %s: 2^%d times (scale 2^%d -> 2^%d). "
        "The run may be diverging (a lower --lr or --grad-clip)",
        step + 1, j->n, j->n == 1 ? "" : "s", j->jump, j->layer, fp8_tensor_name(j->tensor), j->to - j->from,
        j->from, j->to);
    return 1;
}
