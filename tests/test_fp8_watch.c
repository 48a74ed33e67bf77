// test_fp8_watch.c — --precision fp8's divergence checks (train/fp8_watch.c) on a scripted backend whose
// fp8_amax hands out tables written here, step by step, with the jumps worked out by hand (--fp8-amax-jump
// 8, two layers):
//   step 1: first sight of layer 0's x (-10) and layer 1's w1 (-5): nothing to compare, no jump;
//   step 2: x -2 (8 above its record: counted, the boundary), w1 2 (7: not), layer 1's dy 30 (first sight:
//   not); step 3: w1 11 (9 above its record 2), row 0 (no layer named) x 50 (first sight): one, w1's; step 4:
//   x 6 and w1 19, both 8 above: two, the largest the first in layer order (layer 0's x); step 5: x -50
//   (below its record: none); step 6: x 13, 7 above the record 6, not above -50's 63: none (the record is the
//   largest seen, not the last value);
// then --fp8-amax-jump 0 and a table without fp8_amax (on 0, fp8_amax not called), the warning's text, and
// the non-finite check's one-line error naming the step, the count, the layer and the tensor.
#include <string.h>
#include "core/common.h"
#include "ops/ops.h"
#include "train/fp8_watch.h"
#include "test_death.h"
#include "test_util.h"

#define LAYERS 2
#define ROWS (LAYERS + 1)
static int g_next[ROWS * FP8T_N], g_amax_calls;
static int64_t g_bad;

static void amax(int *k, int rows) {
    EXPECT(rows == ROWS, "fp8_amax asked for %d rows (want %d: the layers + 1)", rows, ROWS);
    memcpy(k, g_next, sizeof(int) * ROWS * FP8T_N);
    g_amax_calls++;
}
static int64_t nonfinite(int *layer, int *tensor) {
    *layer = g_bad ? 1 : -1;
    *tensor = g_bad ? FP8T_W2 : -1;
    return g_bad;
}

// The table of one step: every entry none, then the pairs (layer, tensor, exponent) given
static void table(int n, const int *ltk) {
    for (int i = 0; i < ROWS * FP8T_N; i++) g_next[i] = FP8_AMAX_NONE;
    for (int i = 0; i < n; i++) g_next[(ltk[3 * i] + 1) * FP8T_N + ltk[3 * i + 1]] = ltk[3 * i + 2];
}

static void step(Fp8Watch *w, const Backend *be, int s, int n, const int *ltk, int want_n, int want_layer,
                 int want_tensor, int want_from, int want_to) {
    table(n, ltk);
    Fp8Jump j;
    fp8_watch_step(w, be, s, &j);
    EXPECT(j.on && j.n == want_n, "step %d: %d jumps (want %d)", s + 1, j.n, want_n);
    if (want_n)
        EXPECT(j.layer == want_layer && j.tensor == want_tensor && j.from == want_from && j.to == want_to,
               "step %d: the largest layer %d tensor %d %d -> %d (want layer %d tensor %d %d -> %d)", s + 1,
               j.layer, j.tensor, j.from, j.to, want_layer, want_tensor, want_from, want_to);
}

static Backend g_be;
static void die_nonfinite(void *arg) {
    (void)arg;
    Fp8Watch w;
    fp8_watch_init(&w, LAYERS, 8, NULL);
    Fp8Jump j;
    g_bad = 2;
    fp8_watch_step(&w, &g_be, 3, &j);
}

int main(void) {
    g_be = *backend_cpu();
    g_be.fp8 = 1;
    g_be.fp8_nonfinite = nonfinite;
    g_be.fp8_amax = amax;
    Fp8Watch w;
    fp8_watch_init(&w, LAYERS, 8, NULL);
    const int s1[] = {0, FP8T_X, -10, 1, FP8T_W1, -5};
    step(&w, &g_be, 0, 2, s1, 0, 0, 0, 0, 0);
    const int s2[] = {0, FP8T_X, -2, 1, FP8T_W1, 2, 1, FP8T_DY, 30};
    step(&w, &g_be, 1, 3, s2, 1, 0, FP8T_X, -10, -2);
    const int s3[] = {0, FP8T_X, -2, 1, FP8T_W1, 11, -1, FP8T_X, 50};
    step(&w, &g_be, 2, 3, s3, 1, 1, FP8T_W1, 2, 11);
    const int s4[] = {0, FP8T_X, 6, 1, FP8T_W1, 19};
    step(&w, &g_be, 3, 2, s4, 2, 0, FP8T_X, -2, 6);
    const int s5[] = {0, FP8T_X, -50};
    step(&w, &g_be, 4, 1, s5, 0, 0, 0, 0, 0);
    const int s6[] = {0, FP8T_X, 13};
    step(&w, &g_be, 5, 1, s6, 0, 0, 0, 0, 0);

    // the warning of step 2's case
    table(3, s2);
    Fp8Watch w2;
    fp8_watch_init(&w2, LAYERS, 8, NULL);
    Fp8Jump j;
    table(2, s1);
    fp8_watch_step(&w2, &g_be, 0, &j);
    char note[512];
    EXPECT(!fp8_jump_note(&j, 0, note, sizeof note), "no note without a jump");
    table(3, s2);
    fp8_watch_step(&w2, &g_be, 1, &j);
    EXPECT(fp8_jump_note(&j, 1, note, sizeof note) &&
               !strcmp(note,
                       "step 2: --precision fp8: 1 FP8 operand rose to an amax 2^8 times or more the largest "
                       "of every earlier step (--fp8-amax-jump); the most, layer 0's x (the experts' input "
                       "rows): 2^8 times (scale 2^-10 -> 2^-2). The run may be diverging (a lower --lr or "
                       "--grad-clip)"),
           "the warning: %s", note);
    fp8_watch_free(&w2);

    // off: --fp8-amax-jump 0, or a table without fp8_amax
    int calls = g_amax_calls;
    Fp8Watch off;
    fp8_watch_init(&off, LAYERS, 0, NULL);
    fp8_watch_step(&off, &g_be, 0, &j);
    EXPECT(!j.on && !j.n && g_amax_calls == calls,
           "--fp8-amax-jump 0: on %d, %d jumps, fp8_amax called %d times", j.on, j.n, g_amax_calls - calls);
    fp8_watch_free(&off);
    Backend none = g_be;
    none.fp8_amax = NULL;
    fp8_watch_step(&w, &none, 6, &j);
    EXPECT(!j.on && !j.n, "no fp8_amax: on %d, %d jumps", j.on, j.n);
    fp8_watch_free(&w);

    expect_death_msg("non-finite groups", die_nonfinite, NULL,
                     "step 4: --precision fp8: 2 scale groups of the experts' FP8 operands held a NaN or an "
                     "infinity, the first in layer 1, tensor w2 (the experts' down weights)",
                     "the last checkpoint is intact", 1);
    return test_done("test_fp8_watch");
}
