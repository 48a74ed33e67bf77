// test_fp8_save.c — --fp8-save on one MoE layer (moe_types.h MoeRecompute.fp8: the routed experts' SwiGLU
// inputs kept as FP8 rows, act computed again in the backward; ops.h Backend.fp8_save), on the cpu's FP8
// table, in one process (the mesh and the trainer: tests/test_fp8_save.sh). One layer (d 200, f 136: two
// tiles a SwiGLU row, the second of 8 values; 4 experts top-2, 300 tokens: groups straddling 128-row tiles)
// from the same weights and rows, three ways:
//   kept   the rows kept as they are (no MoeRecompute);
//   saved  MoeRecompute with fp8 1;
//   defined  kept, but between its forward and backward the layer's h1 and h3 replaced by their 1x128 tiles'
//          FP8 values (cpu_fp8_round_rows, the reference quantiser's round trip) and act by silu(h1) h3 of
//          those (cpu_swiglu_fwd): what --fp8-save means, built from the reference ops, not the layer's path.
// saved equals defined bit for bit in every output and gradient (the packing, unpacking and act's
// recomputation are the definition's); saved's forward output and router gradient equal kept's bit for bit
// (the forward is unchanged, and the router's gradient reads only the forward's outputs), and its input and
// expert weight gradients do not, but lie within 2^-3 of kept's norm-wise (e4m3 keeps 4 significant bits:
// each SwiGLU input moves by at most 2^-4 of itself where it is normal in its tile, and the gradients' terms
// are products of one or two of them, and act is quantised again for w2 in both; measured 2.5e-2 to 5.2e-2; a
// wrong scale or row would move them by 2^-3 and more). The layer's SwiGLU rows are the shared buffers and it
// holds 2 x rows x (f + ceil(f / 128)) bytes of its own for them (against 3 x rows x f floats kept). A NaN in
// a tile of the saved rows comes back as that tile's NaNs (the definition's too).
#include <math.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "moe/moe.h"
#include "ops/cpu/cpu_fp8.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"
#include "test_util.h"

enum { KEPT, SAVED, DEFINED };

typedef struct {
    float *y, *dx, *gr, *g1, *g3, *g2;
} Out;

// ||a - b|| / ||a||
static double rel(const float *a, const float *b, size_t n) {
    double s = 0, e = 0;
    for (size_t i = 0; i < n; i++) {
        s += (double)a[i] * a[i];
        e += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    }
    return sqrt(e / (s > 0 ? s : 1));
}

static void run(const ModelConfig *c, int N, const MoeWeights *W, const float *x, const float *dy, int how,
                Out *o) {
    const Backend *be = backend_cpu_fp8();
    int d = c->d_model, f = c->d_ff, E = c->n_experts;
    MoeLayer m;
    MoeScratch s;
    MoeRecompute rc = {.be = be, .fp8 = 1};
    moe_layer_init(&m, be, c, N, NULL);
    moe_scratch_init(&s, be, c, N);
    if (how == SAVED) moe_set_recompute(&m, &rc);
    o->y = xcalloc((size_t)N * d, 4), o->dx = xcalloc((size_t)N * d, 4), o->gr = xcalloc((size_t)E * d, 4);
    o->g1 = xcalloc((size_t)E * f * d, 4), o->g3 = xcalloc((size_t)E * f * d, 4);
    o->g2 = xcalloc((size_t)E * d * f, 4);
    MoeGrads g = {.router = o->gr, .w1 = o->g1, .w3 = o->g3, .w2 = o->g2};
    moe_forward(&m, o->y, NULL, x, N, W, c, 0, 0);
    int R = m.x.Rg;
    if (how == SAVED) {
        size_t want = 2 * m.rows_cap * fp8_row_bytes(f);
        EXPECT(m.h1 == rc.h1 && m.h3 == rc.h3 && m.act == rc.act && m.hq && m.cap_q == want,
               "saved: the SwiGLU rows the shared buffers (%d) and %zu bytes of FP8 rows (want %zu = 2 x %zu "
               "rows "
               "x %zu)",
               m.h1 == rc.h1 && m.h3 == rc.h3 && m.act == rc.act, m.cap_q, want, m.rows_cap,
               fp8_row_bytes(f));
    }
    if (how == DEFINED) {
        cpu_fp8_round_rows((float *)m.h1, R, f);
        cpu_fp8_round_rows((float *)m.h3, R, f);
        cpu_swiglu_fwd((float *)m.act, (const float *)m.h1, (const float *)m.h3, (size_t)R * f);
    }
    moe_backward(&m, &s, o->dx, dy, x, W, &g, c, 0.3f, 0.05f);
    moe_layer_free(&m);
    moe_scratch_free(&s);
    be->free(rc.h1), be->free(rc.h3), be->free(rc.act);
}

static void outs_free(Out *o) { free(o->y), free(o->dx), free(o->gr), free(o->g1), free(o->g3), free(o->g2); }

// The three runs on rows x; nan 1: one value of one token's rows NaN (its tiles' SwiGLU rows NaN).
static void compare(int nan) {
    ModelConfig c;
    config_preset(&c, "tiny");
    c.d_model = 200, c.d_ff = 136, c.n_experts = 4, c.top_k = 2;
    const int N = 300;
    int d = c.d_model, f = c.d_ff, E = c.n_experts;
    Rng r;
    rng_seed(&r, 5);
    size_t nd = (size_t)N * d, nw = (size_t)E * f * d;
    float *x = xmalloc(4 * nd), *dy = xmalloc(4 * nd), *wr = xmalloc(4 * (size_t)E * d),
          *w1 = xmalloc(4 * nw), *w3 = xmalloc(4 * nw), *w2 = xmalloc(4 * nw);
    for (size_t i = 0; i < nd; i++) {
        x[i] = (float)rng_normal(&r) * ldexpf(1.0f, (int)(i / d % 7) - 3); // (rows at 7 scales)
        dy[i] = (float)rng_normal(&r);
    }
    for (size_t i = 0; i < (size_t)E * d; i++) wr[i] = (float)rng_normal(&r) * 0.1f;
    for (size_t i = 0; i < nw; i++) {
        w1[i] = (float)rng_normal(&r) * 0.05f;
        w3[i] = (float)rng_normal(&r) * 0.05f;
        w2[i] = (float)rng_normal(&r) * 0.05f;
    }
    if (nan) x[(size_t)17 * d + 3] = NAN;
    MoeWeights W = {.router = wr, .w1 = w1, .w3 = w3, .w2 = w2};
    Out o[3];
    for (int h = 0; h < 3; h++) run(&c, N, &W, x, dy, h, &o[h]);
    const char *tag = nan ? "with a NaN input" : "finite";
    size_t dd[6] = {floats_differ(o[SAVED].y, o[DEFINED].y, nd),
                    floats_differ(o[SAVED].dx, o[DEFINED].dx, nd),
                    floats_differ(o[SAVED].gr, o[DEFINED].gr, (size_t)E * d),
                    floats_differ(o[SAVED].g1, o[DEFINED].g1, nw),
                    floats_differ(o[SAVED].g3, o[DEFINED].g3, nw),
                    floats_differ(o[SAVED].g2, o[DEFINED].g2, nw)};
    EXPECT(!(dd[0] | dd[1] | dd[2] | dd[3] | dd[4] | dd[5]),
           "%s: saved against defined, values differing: y %zu, dx %zu, router %zu, w1 %zu, w3 %zu, w2 %zu "
           "(want 0)",
           tag, dd[0], dd[1], dd[2], dd[3], dd[4], dd[5]);
    if (nan) {
        EXPECT(isnan(o[SAVED].g2[0]) || isnan(o[SAVED].dx[(size_t)17 * d]),
               "with a NaN input: the saved run's gradients carry it (w2[0] %g, dx[17,0] %g)", o[SAVED].g2[0],
               o[SAVED].dx[(size_t)17 * d]);
    } else {
        EXPECT(!floats_differ(o[KEPT].y, o[SAVED].y, nd) &&
                   !floats_differ(o[KEPT].gr, o[SAVED].gr, (size_t)E * d),
               "saved against kept: the output (%zu values differ) and the router's gradient (%zu) the same "
               "bits",
               floats_differ(o[KEPT].y, o[SAVED].y, nd),
               floats_differ(o[KEPT].gr, o[SAVED].gr, (size_t)E * d));
        const float *a[] = {o[KEPT].dx, o[KEPT].g1, o[KEPT].g3, o[KEPT].g2},
                    *b[] = {o[SAVED].dx, o[SAVED].g1, o[SAVED].g3, o[SAVED].g2};
        const char *nm[] = {"dx", "w1", "w3", "w2"};
        size_t n[] = {nd, nw, nw, nw};
        for (int i = 0; i < 4; i++) {
            double e = rel(a[i], b[i], n[i]);
            EXPECT(floats_differ(a[i], b[i], n[i]) > n[i] / 2 && e > 0x1p-10 && e < 0x1p-3,
                   "saved against kept: %s from the FP8 SwiGLU rows, %zu of %zu values differ (want most), "
                   "norm-wise %.2e (want in (2^-10, 2^-3))",
                   nm[i], floats_differ(a[i], b[i], n[i]), n[i], e);
            printf("saved against kept: %s relative %.2e\n", nm[i], e);
        }
    }
    for (int h = 0; h < 3; h++) outs_free(&o[h]);
    free(x), free(dy), free(wr), free(w1), free(w3), free(w2);
}

int main(void) {
    EXPECT(backend_cpu_fp8()->fp8_save && !backend_cpu()->fp8_save,
           "Backend.fp8_save: the cpu's FP8 table 1 (%d), the float32 table 0 (%d)",
           backend_cpu_fp8()->fp8_save, backend_cpu()->fp8_save);
    compare(0);
    compare(1);
    return test_done("test_fp8_save");
}
