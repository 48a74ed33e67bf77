// test_fp8_dispatch.c — --fp8-dispatch's FP8 rows (numerics.h fp8_row_bytes; ops/cpu/cpu_fp8.c
// cpu_fp8_pack_rows / _unpack_rows / _round_rows; ops.h Backend.fp8_rows_*) and what they do to the MoE layer
// in one process (moe.h m->fp8_dispatch; the mesh half is tests/mpi_moe.c's, the training half
// tests/test_fp8_train.sh's).
//   rows: for row widths 1, 127, 128, 129, 200 and 300 (tiles of 128, the last shorter), rows scaled by
//   powers
//     of two from 2^-20 to 2^20 and the edge rows (all zero, a NaN, an infinity, values beyond e4m3's range
//     at the top scale, float32 subnormals): the packed row is fp8_row_bytes(d) = d + ceil(d / 128) bytes,
//     its codes cpu_fp8_quant_tiles' (test_fp8.c holds that to the definitions), its exponent bytes the log2
//     of quant_tiles' scales or FP8_ROW_BAD where the scale is NaN, pack's count quant_tiles'; unpack gives
//     cpu_fp8_dequant_tiles' values bit for bit (NaN where they are NaN); round equals unpack(pack); packing
//     rounded rows gives their values back (exactly); a tile whose largest code rounds down to 224 packs
//     again one power of two lower (codes doubled: the values the same); the FP8 GEMM of rounded rows
//     equals that of the rows themselves, bit for bit (the experts' forward is unchanged).
//   table: the cpu's FP8 table has the three ops (the same bytes and values as the reference), the float32
//     table has none.
//   layer: one MoE layer (d 200, f 136, 4 experts top-2, 300 tokens: groups straddling 128-row tiles) on the
//     cpu's FP8 table, with and without fp8_dispatch, from the same weights and rows: the output, the input
//     gradient, the router's and the down projections' weight gradients bit for bit; the gate and up
//     projections' weight gradients not (their transposed tiles are taken from the rounded rows), but within
//     1e-5 of them (measured 1.6e-7 and 2.1e-7): with power-of-two scales e4m3's rounding of a normal value
//     is to 4 significant bits at any scale, so rounding twice changes only the values subnormal in one of
//     the two tilings (a wrong scale or code would move whole values by 2^-4 or more); and the rows the
//     experts received are FP8 values (rounding them again changes no bit).
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "moe/moe.h"
#include "ops/cpu/cpu_fp8.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/ops.h"
#include "test_util.h"



// n rows of d values: row r scaled by 2^(r % 41 - 20), then the edge rows overwritten
static void rows_fill(float *x, int n, int d, Rng *r) {
    for (int m = 0; m < n; m++)
        for (int k = 0; k < d; k++)
            x[(size_t)m * d + k] = (float)(rng_uniform(r) * 2 - 1) * ldexpf(1.0f, m % 41 - 20);
    float *z = x, *nan = x + (size_t)1 * d, *inf = x + (size_t)2 * d, *big = x + (size_t)3 * d,
          *sub = x + (size_t)4 * d;
    for (int k = 0; k < d; k++) {
        z[k] = 0;
        big[k] =
            (k % 2 ? -1.0f : 1.0f) * (k % 128 ? 1.0e38f / 7.0f * (float)(k % 7 + 1) : 3.0e38f); // each tile's
        // first beyond 448 * 2^119 (saturated at the top scale)
        sub[k] = (k % 3 ? 1 : -1) * 1e-39f * (float)(k + 1) / (float)d; // float32 subnormals
    }
    nan[d - 1] = NAN; // (the last tile's)
    inf[0] = -INFINITY;
}

static void rows_checks(int d) {
    const int n = 50;
    Rng r;
    rng_seed(&r, 7 + (uint64_t)d);
    int T = fp8_ntiles(d);
    size_t rb = fp8_row_bytes(d), nd = (size_t)n * d;
    EXPECT(rb == (size_t)d + (size_t)(d + 127) / 128, "d %d: %zu bytes a row", d, rb);
    float *x = xmalloc(4 * nd), *s = xmalloc(sizeof(float) * n * T), *deq = xmalloc(4 * nd),
          *un = xmalloc(4 * nd), *rd = xmalloc(4 * nd), *again = xmalloc(4 * nd);
    uint8_t *q = xmalloc(nd), *p = xmalloc(rb * n), *p2 = xmalloc(rb * n);
    rows_fill(x, n, d, &r);
    int64_t bad = cpu_fp8_quant_tiles(q, s, x, n, d);
    cpu_fp8_dequant_tiles(deq, q, s, n, d);
    int64_t pbad = cpu_fp8_pack_rows(p, x, n, d);
    EXPECT(pbad == bad && bad == 2, "d %d: pack counts %lld bad tiles, quant_tiles %lld (want 2)", d,
           (long long)pbad, (long long)bad);
    size_t code_diff = 0, exp_diff = 0;
    for (int m = 0; m < n; m++) {
        code_diff += memcmp(p + (size_t)m * rb, q + (size_t)m * d, (size_t)d) != 0;
        for (int t = 0; t < T; t++) {
            float sc = s[(size_t)m * T + t];
            int want = isnan(sc) ? FP8_ROW_BAD : ilogbf(sc);
            exp_diff += (int8_t)p[(size_t)m * rb + d + t] != want;
        }
    }
    EXPECT(!code_diff && !exp_diff, "d %d: %zu rows' codes and %zu tiles' exponents not quant_tiles'", d,
           code_diff, exp_diff);
    EXPECT((int8_t)p[3 * rb + d] == FP8_SCALE_EXP_MAX && (int8_t)p[0 * rb + d] == FP8_SCALE_EXP_MIN,
           "d %d: the saturated row's exponent %d (want %d), the zero row's %d (want %d)", d,
           (int8_t)p[3 * rb + d], FP8_SCALE_EXP_MAX, (int8_t)p[0 * rb + d], FP8_SCALE_EXP_MIN);
    cpu_fp8_unpack_rows(un, p, n, d);
    EXPECT(!floats_differ(un, deq, nd), "d %d: unpack differs from dequant_tiles in %zu values", d,
           floats_differ(un, deq, nd));
    EXPECT(isnan(un[(size_t)1 * d + d - 1]) && isnan(un[(size_t)2 * d]) && isfinite(un[(size_t)5 * d]),
           "d %d: the bad tiles' values NaN, the others finite", d);
    memcpy(rd, x, 4 * nd);
    cpu_fp8_round_rows(rd, n, d);
    EXPECT(!floats_differ(rd, un, nd), "d %d: round differs from unpack(pack) in %zu values", d,
           floats_differ(rd, un, nd));
    // packed again: the same values (rows 1 and 2 hold NaN tiles: NaN again)
    cpu_fp8_pack_rows(p2, rd, n, d);
    cpu_fp8_unpack_rows(again, p2, n, d);
    EXPECT(!floats_differ(again, rd, nd), "d %d: rounded rows packed again change %zu values", d,
           floats_differ(again, rd, nd));
    free(x), free(s), free(deq), free(un), free(rd), free(again), free(q), free(p), free(p2);
}

// A tile whose largest value rounds down to the code 224: packed again, one power of two lower.
static void exponent_drop(void) {
    const int d = 130; // two tiles
    float x[130], y[130], z[130];
    for (int k = 0; k < d; k++) x[k] = (float)(k % 7) * 0.01f;
    x[5] = 225.0f * 0x1p-8f; // amax 225 * 2^-8: scale 2^-8, code 224 (225 lies between 224 and 240)
    uint8_t p[132], p2[132];
    cpu_fp8_pack_rows(p, x, 1, d);
    cpu_fp8_unpack_rows(y, p, 1, d);
    cpu_fp8_pack_rows(p2, y, 1, d);
    cpu_fp8_unpack_rows(z, p2, 1, d);
    EXPECT((int8_t)p[d] == -8 && y[5] == 224.0f * 0x1p-8f && (int8_t)p2[d] == -9 && p2[5] == p[5] + 8,
           "the 224 tile: exponent %d then %d (want -8, -9), value %g, codes 0x%02x then 0x%02x",
           (int8_t)p[d], (int8_t)p2[d], y[5], p[5], p2[5]);
    EXPECT(!floats_differ(y, z, d), "the 224 tile's values packed again: %zu differ", floats_differ(y, z, d));
}

// The forward GEMM of rounded rows equals that of the rows, bit for bit (finite rows: scaled, with a 224
// tile)
static void gemm_same(void) {
    const int M = 40, K = 300, N = 64;
    Rng r;
    rng_seed(&r, 11);
    float *x = xmalloc(4 * M * K), *w = xmalloc(4 * N * K), *xr = xmalloc(4 * M * K);
    for (int i = 0; i < M * K; i++) x[i] = (float)(rng_uniform(&r) * 2 - 1) * ldexpf(1.0f, i / K % 13 - 6);
    for (int i = 0; i < N * K; i++) w[i] = (float)(rng_uniform(&r) * 2 - 1) * 0.05f;
    x[3] = 225.0f * 0x1p-6f; // row 0's tile 0: above its other values (at most 2^-6)
    memcpy(xr, x, 4 * M * K);
    cpu_fp8_round_rows(xr, M, K);
    int T = fp8_ntiles(K);
    uint8_t *qa = xmalloc(M * K), *qb = xmalloc(M * K), *qw = xmalloc(N * K);
    float *sa = xmalloc(4 * M * T), *sb = xmalloc(4 * M * T), *sw = xmalloc(4 * T * T),
          *c1 = xmalloc(4 * M * N), *c2 = xmalloc(4 * M * N);
    cpu_fp8_quant_tiles(qa, sa, x, M, K);
    cpu_fp8_quant_tiles(qb, sb, xr, M, K);
    cpu_fp8_quant_blocks(qw, sw, w, N, K);
    cpu_fp8_gemm(c1, qa, sa, qw, sw, M, N, K, 1);
    cpu_fp8_gemm(c2, qb, sb, qw, sw, M, N, K, 1);
    EXPECT(!floats_differ(c1, c2, (size_t)M * N) && memcmp(qa, qb, (size_t)M * K),
           "the FP8 GEMM of rounded rows: %zu of %d values differ (want 0; the codes themselves %s)",
           floats_differ(c1, c2, (size_t)M * N), M * N,
           memcmp(qa, qb, (size_t)M * K) ? "differ" : "the same");
    free(x), free(w), free(xr), free(qa), free(qb), free(qw), free(sa), free(sb), free(sw), free(c1),
        free(c2);
}

static void table_checks(void) {
    const Backend *f = backend_cpu_fp8(), *c = backend_cpu();
    EXPECT(f->fp8_rows_round && f->fp8_rows_pack && f->fp8_rows_unpack && !c->fp8_rows_round &&
               !c->fp8_rows_pack && !c->fp8_rows_unpack,
           "the FP8 table has the rows' ops, the float32 table none");
    const int n = 9, d = 200;
    Rng r;
    rng_seed(&r, 5);
    float x[9 * 200], a[9 * 200], b[9 * 200];
    uint8_t p[9 * 202], q[9 * 202];
    rows_fill(x, n, d, &r);
    f->fp8_rows_pack(p, x, n, d);
    cpu_fp8_pack_rows(q, x, n, d);
    f->fp8_rows_unpack(a, p, n, d);
    memcpy(b, x, sizeof b);
    f->fp8_rows_round(b, n, d);
    EXPECT(!memcmp(p, q, sizeof p) && !floats_differ(a, b, (size_t)n * d),
           "the table's ops: the reference's bytes and values");
}

// One MoE layer on the FP8 table, fp8_dispatch 0 and 1: what changes and what does not.
typedef struct {
    float *y, *dx, *gr, *g1, *g3, *g2;
    int round_again; // values of the experts' input rows that rounding again changes
} LayerOut;

static void layer_run(const ModelConfig *c, int N, const MoeWeights *W, const float *x, const float *dy,
                      int on, LayerOut *o) {
    const Backend *be = backend_cpu_fp8();
    int d = c->d_model, f = c->d_ff, E = c->n_experts;
    MoeLayer m;
    MoeScratch s;
    moe_layer_init(&m, be, c, N, NULL);
    moe_scratch_init(&s, be, c, N);
    m.fp8_dispatch = on;
    o->y = xcalloc((size_t)N * d, 4), o->dx = xcalloc((size_t)N * d, 4);
    o->gr = xcalloc((size_t)E * d, 4), o->g1 = xcalloc((size_t)E * f * d, 4),
    o->g3 = xcalloc((size_t)E * f * d, 4), o->g2 = xcalloc((size_t)E * d * f, 4);
    MoeGrads g = {.router = o->gr, .w1 = o->g1, .w3 = o->g3, .w2 = o->g2};
    moe_forward(&m, o->y, NULL, x, N, W, c, 0, 0);
    int M = m.plan.M;
    float *xs = xmalloc(sizeof(float) * M * d);
    memcpy(xs, m.xs, sizeof(float) * M * d);
    cpu_fp8_round_rows(xs, M, d);
    o->round_again = (int)floats_differ(xs, (const float *)m.xs, (size_t)M * d);
    free(xs);
    moe_backward(&m, &s, o->dx, dy, x, W, &g, c, 0.3f, 0.05f);
    moe_layer_free(&m);
    moe_scratch_free(&s);
}

static double relerr(const float *a, const float *b, size_t n) {
    double mx = 0, md = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabs(a[i]) > mx) mx = fabs(a[i]);
        double e = fabs((double)a[i] - b[i]);
        if (e > md) md = e;
    }
    return md / (mx > 0 ? mx : 1);
}

static void layer_checks(void) {
    ModelConfig c;
    config_preset(&c, "tiny");
    c.d_model = 200;
    c.d_ff = 136;
    c.n_experts = 4;
    c.top_k = 2;
    const int N = 300;
    int d = c.d_model, f = c.d_ff, E = c.n_experts;
    Rng r;
    rng_seed(&r, 3);
    float *x = xmalloc(4 * (size_t)N * d), *dy = xmalloc(4 * (size_t)N * d), *wr = xmalloc(4 * (size_t)E * d),
          *w1 = xmalloc(4 * (size_t)E * f * d), *w3 = xmalloc(4 * (size_t)E * f * d),
          *w2 = xmalloc(4 * (size_t)E * d * f);
    for (size_t i = 0; i < (size_t)N * d; i++) {
        x[i] = (float)rng_normal(&r) * ldexpf(1.0f, (int)(i / d % 5) - 2);
        dy[i] = (float)rng_normal(&r);
    }
    for (size_t i = 0; i < (size_t)E * d; i++) wr[i] = (float)rng_normal(&r) * 0.1f;
    for (size_t i = 0; i < (size_t)E * f * d; i++) {
        w1[i] = (float)rng_normal(&r) * 0.05f;
        w3[i] = (float)rng_normal(&r) * 0.05f;
        w2[i] = (float)rng_normal(&r) * 0.05f;
    }
    MoeWeights W = {.router = wr, .w1 = w1, .w3 = w3, .w2 = w2};
    LayerOut a, b;
    layer_run(&c, N, &W, x, dy, 0, &a);
    layer_run(&c, N, &W, x, dy, 1, &b);
    size_t nd = (size_t)N * d, nw = (size_t)E * f * d;
    EXPECT(
        a.round_again > 0 && b.round_again == 0,
        "the experts' input rows: %d values change when rounded without fp8_dispatch (want > 0), %d with it "
        "(want 0)",
        a.round_again, b.round_again);
    EXPECT(!floats_differ(a.y, b.y, nd) && !floats_differ(a.dx, b.dx, nd) &&
               !floats_differ(a.gr, b.gr, (size_t)E * d) && !floats_differ(a.g2, b.g2, nw),
           "bit for bit with and without: y %zu, dx %zu, router %zu, w2 %zu values differ",
           floats_differ(a.y, b.y, nd), floats_differ(a.dx, b.dx, nd),
           floats_differ(a.gr, b.gr, (size_t)E * d), floats_differ(a.g2, b.g2, nw));
    double e1 = relerr(a.g1, b.g1, nw), e3 = relerr(a.g3, b.g3, nw);
    EXPECT(floats_differ(a.g1, b.g1, nw) && floats_differ(a.g3, b.g3, nw) && e1 < 1e-5 && e3 < 1e-5,
           "w1, w3 gradients from the rounded rows: %zu and %zu values differ (want some), relative %.2e and "
           "%.2e "
           "(want < 1e-5)",
           floats_differ(a.g1, b.g1, nw), floats_differ(a.g3, b.g3, nw), e1, e3);
    printf("layer: w1 / w3 gradients %.2e / %.2e relative to the unrounded rows'\n", e1, e3);
    LayerOut *o[] = {&a, &b};
    for (int i = 0; i < 2; i++)
        free(o[i]->y), free(o[i]->dx), free(o[i]->gr), free(o[i]->g1), free(o[i]->g3), free(o[i]->g2);
    free(x), free(dy), free(wr), free(w1), free(w3), free(w2);
}

int main(void) {
    const int widths[] = {1, 127, 128, 129, 200, 300};
    for (int i = 0; i < 6; i++) rows_checks(widths[i]);
    exponent_drop();
    gemm_same();
    table_checks();
    layer_checks();
    return test_done("test_fp8_dispatch");
}
