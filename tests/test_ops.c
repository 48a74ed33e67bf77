// test_ops.c — every op of backend_cpu() against an independent reference on fresh random inputs.
//
// Forwards: compared with straightforward double-precision implementations written here.
// Tolerance FWD_RTOL = 1e-5 relative to the magnitude of the terms that make up each element
// (e.g. sum_k |x_k w_k| for a dot product, not |result|, which may cancel to ~0). Why: float32
// has eps = 6e-8 and the longest sum here has 64 terms, so even the worst-case rounding bound
// (n * eps * sum|terms| ~ 4e-6) stays under 1e-5, while any wrong index, term, sign or factor
// moves an element by O(its magnitude).
//
// Backwards: against central finite differences of L = sum(dout * out) with the float32 forward
// and the sum taken in double (per element on a subset, and along two directions: fd_check).
// The perturbation is the float-rounded (x0 + h) - (x0 - h), h = 1e-2. Tolerance per element:
// 1e-2 |an| + 1e-3 rms(an) + 1e-4. Why:
// the noise in L is the float32 rounding of the outputs that the element moves (<~1e-6 on these
// small sizes), i.e. <~5e-5 after dividing by 2h; the O(h^2) truncation term of the nonlinear
// ops (rmsnorm, attention, swiglu, cross-entropy) is ~1e-4 relative; a wrong term is O(|an|).
// Also every *_bwd must ACCUMULATE: it is run once on zeroed gradient buffers (g0) and once on
// buffers pre-filled with random values (pre); the second must give pre + g0 (to 1e-5 of the
// magnitudes: only the summation order may differ). Where it takes an `accumulate` argument
// (grouped_matmul_bwd's dinp, swiglu_bwd) it is also run with accumulate 0 on buffers poisoned with
// NaN: the result must be g0 (same band; the NaN must be gone, i.e. neither read nor left), and
// the buffers it must not touch (dw, rows outside the groups) keep their values.
// Outputs are poisoned with NaN before every forward, so an unwritten element fails.
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "ops/plain.h"
#include "router_ref.h"
#include "test_util.h"
#include "test_runs.h"
#include "cpu_oracle.h"
#include "test_death.h"
#include "moe/moe.h"

#define FWD_RTOL 1e-5
#define FD_H 1e-2f
#define FD_RTOL 1e-2
#define FD_RMS 1e-3
#define FD_ATOL 1e-4
#define ACC_RTOL 1e-5

static Rng R;
static const Backend *be;

static float *fnew(size_t n) { return xcalloc(n ? n : 1, sizeof(float)); }
static double *dnew(size_t n) { return xcalloc(n ? n : 1, sizeof(double)); }
static void fill_normal(float *x, size_t n, float sd) {
    for (size_t i = 0; i < n; i++) x[i] = sd * rng_normal(&R);
}
static void fill_nan(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}
static float *fcopy(const float *x, size_t n) {
    float *y = fnew(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}

// |got - ref| <= rtol * (mag ? mag : |ref|) + atol for every element (NaN fails).
static void check_arr(const char *what, const float *got, const double *ref, const double *mag, size_t n,
                      double rtol, double atol) {
    size_t bad = 0, first = 0;
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double tol = rtol * (mag ? mag[i] : fabs(ref[i])) + atol, err = fabs((double)got[i] - ref[i]);
        if (!(err <= tol)) {
            if (!bad) first = i;
            bad++;
        } else if (tol > 0 && err / tol > worst) worst = err / tol;
    }
    EXPECT(bad == 0, "%s: %zu of %zu elements out of tolerance; first [%zu] got %.9g ref %.9g", what, bad, n,
           first, bad ? got[first] : 0.0, bad ? ref[first] : 0.0);
}
static void check_exact(const char *what, const float *got, const float *ref, size_t n) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (!(got[i] == ref[i])) {
            if (!bad) first = i;
            bad++;
        }
    EXPECT(bad == 0, "%s: %zu of %zu elements differ; first [%zu] got %.9g want %.9g", what, bad, n, first,
           bad ? got[first] : 0.0, bad ? ref[first] : 0.0);
}

// Central differences of f (which evaluates L at the current x) against an: per element on
// FD_ELEMS elements (all of them when n <= FD_ELEMS, else an evenly spaced set with a random
// start), and along two unit directions over the whole tensor: an/|an| and a random one. (Every
// forward is an OpenMP region; few evaluations keep the test fast on a loaded 2-core machine.)
// The directional tolerance is 1e-2 |an.u| + 1e-3 |an| + 1e-4: the noise of L now comes from
// every output, ~1e-5 |an| after dividing by 2h on these sizes.
#define FD_ELEMS 12
typedef double (*LossFn)(void *ctx);
static void fd_check(const char *what, LossFn f, void *ctx, float *x, size_t n, const float *an) {
    double rms = 0;
    for (size_t i = 0; i < n; i++) rms += (double)an[i] * an[i];
    double norm = sqrt(rms);
    rms = sqrt(rms / (n ? n : 1));
    size_t bad = 0, first = 0, ne = n <= FD_ELEMS ? n : FD_ELEMS,
           start = n <= FD_ELEMS ? 0 : rng_below(&R, (uint32_t)n);
    double fd_first = 0;
    for (size_t s = 0; s < ne; s++) {
        size_t i = n <= FD_ELEMS ? s : (start + s * n / FD_ELEMS) % n;
        float x0 = x[i], xp = x0 + FD_H, xm = x0 - FD_H;
        x[i] = xp;
        double lp = f(ctx);
        x[i] = xm;
        double lm = f(ctx);
        x[i] = x0;
        double fd = (lp - lm) / ((double)xp - (double)xm);
        double tol = FD_RTOL * fabs(an[i]) + FD_RMS * rms + FD_ATOL, err = fabs(fd - an[i]);
        if (!(err <= tol)) {
            if (!bad) {
                first = i;
                fd_first = fd;
            }
            bad++;
        }
    }
    EXPECT(bad == 0,
           "%s: %zu of %zu elements disagree with finite differences; first [%zu] fd %.7g analytic %.7g",
           what, bad, ne, first, fd_first, bad ? an[first] : 0.0);
    if (n <= FD_ELEMS) return;
    float *x0 = fcopy(x, n), *u = fnew(n);
    for (int dir = 0; dir < 2; dir++) {
        double un = 0;
        for (size_t i = 0; i < n; i++) {
            u[i] = dir == 0 && norm > 0 ? an[i] : rng_normal(&R);
            un += (double)u[i] * u[i];
        }
        un = sqrt(un);
        double anu = 0; // an . (xp - xm) / 2h: the directional derivative along the rounded step
        for (size_t i = 0; i < n; i++) x[i] = x0[i] + FD_H * (float)(u[i] / un);
        for (size_t i = 0; i < n; i++) anu += (double)an[i] * x[i];
        double lp = f(ctx);
        for (size_t i = 0; i < n; i++) x[i] = x0[i] - FD_H * (float)(u[i] / un);
        for (size_t i = 0; i < n; i++) anu -= (double)an[i] * x[i];
        double lm = f(ctx);
        memcpy(x, x0, n * sizeof(float));
        double fd = (lp - lm) / (2.0 * FD_H);
        anu /= 2.0 * FD_H;
        double tol = FD_RTOL * fabs(anu) + FD_RMS * norm + FD_ATOL;
        EXPECT(fabs(fd - anu) <= tol,
               "%s: directional derivative (%s direction) fd %.7g analytic %.7g (|g| %.3g)", what,
               dir == 0 ? "gradient" : "random", fd, anu, norm);
    }
    free(x0);
    free(u);
}

// g1 (bwd run on pre-filled buffers) == pre + g0 (bwd run on zeroed buffers)
static void check_accum(const char *what, const float *g1, const float *pre, const float *g0, size_t n) {
    double rms = 0;
    for (size_t i = 0; i < n; i++) rms += (double)g0[i] * g0[i];
    rms = sqrt(rms / (n ? n : 1));
    double *ref = dnew(n), *mag = dnew(n);
    for (size_t i = 0; i < n; i++) {
        ref[i] = (double)pre[i] + g0[i];
        mag[i] = fabs(pre[i]) + fabs(g0[i]) + rms;
    }
    char buf[160];
    snprintf(buf, sizeof buf, "%s accumulates (+=)", what);
    check_arr(buf, g1, ref, mag, n, ACC_RTOL, 1e-30);
    free(ref);
    free(mag);
}
// g1 (bwd with accumulate 0 on NaN-poisoned buffers) == g0 (bwd run on zeroed buffers, accumulating)
static void check_overwrite(const char *what, const float *g1, const float *g0, size_t n) {
    double rms = 0;
    for (size_t i = 0; i < n; i++) rms += (double)g0[i] * g0[i];
    rms = sqrt(rms / (n ? n : 1));
    double *ref = dnew(n), *mag = dnew(n);
    for (size_t i = 0; i < n; i++) {
        ref[i] = g0[i];
        mag[i] = fabs(g0[i]) + rms;
    }
    char buf[160];
    snprintf(buf, sizeof buf, "%s overwrites (accumulate 0)", what);
    check_arr(buf, g1, ref, mag, n, ACC_RTOL, 1e-30);
    free(ref);
    free(mag);
}

static double dot_d(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

// ---------------------------------------------------------------- memory
static void test_memory(void) {
    size_t n = 37;
    float *d = be->alloc(n * sizeof(float)), *h = fnew(n), *h2 = fnew(n);
    int zero = 1;
    for (size_t i = 0; i < n; i++) zero &= d[i] == 0.0f; // cpu: device memory is host memory
    EXPECT(zero, "alloc returns zeroed memory");
    fill_normal(h, n, 1);
    be->to_device(d, h, n * sizeof(float));
    float *d2 = be->alloc(n * sizeof(float));
    be->copy(d2, d, n * sizeof(float));
    fill_nan(h2, n);
    be->to_host(h2, d2, n * sizeof(float));
    be->sync();
    check_exact("to_device/copy/to_host round trip", h2, h, n);
    be->zero(d2, n * sizeof(float));
    be->to_host(h2, d2, n * sizeof(float));
    float *z = fnew(n);
    check_exact("zero", h2, z, n);
    be->free(d);
    be->free(d2);
    free(h);
    free(h2);
    free(z);
}

// alloc_holes (ops.h): zeroed and usable outside its holes, including a hole's edge pages; a touch of an
// element whose page lies wholly inside a hole ends the process (a child's, by signal); free gives it back.
static int hole_touch(float *p, size_t i) { // 1: the child died touching p[i] (by the signal, or under
                                            // AddressSanitizer by its SEGV report's exit)
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(0); // (the sanitizer's report of the expected fault)
        ((volatile float *)p)[i] = 1.0f;
        _exit(0);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
    return WIFSIGNALED(st) || (WIFEXITED(st) && WEXITSTATUS(st) != 0);
}
static void test_alloc_holes(void) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE) / sizeof(float), n = 40 * pg;
    // hole 0 covers pages 3..9 and ends mid-page; hole 1 is smaller than a page (no page wholly inside)
    size_t hole[4] = {3 * pg - 5, 10 * pg + 7, 20 * pg + 3, 20 * pg + 9};
    float *p = be->alloc_holes(n, hole, 2);
    int zero = 1;
    size_t edge[] = {0, 3 * pg - 5, 3 * pg - 1, 10 * pg, 10 * pg + 7, 20 * pg + 5, n - 1};
    for (size_t j = 0; j < sizeof edge / sizeof edge[0]; j++) {
        zero &= p[edge[j]] == 0.0f;
        p[edge[j]] = (float)j;
    }
    EXPECT(zero, "alloc_holes: the buffer outside the holes' pages reads zeros");
    EXPECT(p[10 * pg + 7] == 4.0f && p[20 * pg + 5] == 5.0f,
           "alloc_holes: edge and sub-page hole keep writes");
    EXPECT(hole_touch(p, 3 * pg) && hole_touch(p, 9 * pg + pg - 1) && hole_touch(p, 6 * pg + 11),
           "alloc_holes: a touch of a page wholly inside a hole ends the process");
    EXPECT(!hole_touch(p, 2 * pg) && !hole_touch(p, 10 * pg),
           "alloc_holes: a touch outside the hole's pages is fine");
    be->free(p);
    float *q = be->alloc(8); // (free gave the mapping back, and plain buffers still free as before)
    be->free(q);
}

// ---------------------------------------------------------------- matmul
typedef struct {
    float *x, *w, *out;
    const float *dout;
    int N, K, O;
    const int64_t *off;
    int G;
} MatCtx;
static double matmul_loss(void *p) {
    MatCtx *c = p;
    be->matmul_fwd(c->out, c->x, c->w, c->N, c->K, c->O, 0);
    return dot_d(c->dout, c->out, (size_t)c->N * c->O);
}
static void matmul_ref(double *ref, double *mag, const float *x, const float *w, int N, int K, int O) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < O; o++) {
            double s = 0, m = 0;
            for (int k = 0; k < K; k++) {
                double t = (double)x[(size_t)n * K + k] * w[(size_t)o * K + k];
                s += t;
                m += fabs(t);
            }
            ref[(size_t)n * O + o] = s;
            mag[(size_t)n * O + o] = m;
        }
}

static void test_matmul(int N, int K, int O) {
    char lab[96];
    size_t nx = (size_t)N * K, nw = (size_t)O * K, no = (size_t)N * O;
    float *x = fnew(nx), *w = fnew(nw), *out = fnew(no), *pre = fnew(no), *dout = fnew(no);
    double *ref = dnew(no), *mag = dnew(no);
    fill_normal(x, nx, 1);
    fill_normal(w, nw, 1);
    fill_normal(pre, no, 1);
    fill_normal(dout, no, 1);
    matmul_ref(ref, mag, x, w, N, K, O);
    fill_nan(out, no);
    be->matmul_fwd(out, x, w, N, K, O, 0);
    snprintf(lab, sizeof lab, "matmul_fwd N=%d K=%d O=%d", N, K, O);
    check_arr(lab, out, ref, mag, no, FWD_RTOL, 1e-30);
    memcpy(out, pre, no * sizeof(float));
    be->matmul_fwd(out, x, w, N, K, O, 1);
    for (size_t i = 0; i < no; i++) {
        ref[i] += pre[i];
        mag[i] += fabs(pre[i]);
    }
    snprintf(lab, sizeof lab, "matmul_fwd accumulate N=%d K=%d O=%d", N, K, O);
    check_arr(lab, out, ref, mag, no, FWD_RTOL, 1e-30);

    // backward
    float *dx0 = fnew(nx), *dw0 = fnew(nw);
    be->matmul_bwd(dx0, dw0, dout, x, w, N, K, O, GM_ACC_DINP);
    MatCtx c = {x, w, out, dout, N, K, O, NULL, 0};
    snprintf(lab, sizeof lab, "matmul_bwd dinp N=%d K=%d O=%d", N, K, O);
    fd_check(lab, matmul_loss, &c, x, nx, dx0);
    snprintf(lab, sizeof lab, "matmul_bwd dw N=%d K=%d O=%d", N, K, O);
    fd_check(lab, matmul_loss, &c, w, nw, dw0);
    float *px = fnew(nx), *pw = fnew(nw);
    fill_normal(px, nx, 1);
    fill_normal(pw, nw, 1);
    float *dx1 = fcopy(px, nx), *dw1 = fcopy(pw, nw);
    be->matmul_bwd(dx1, dw1, dout, x, w, N, K, O, GM_ACC_DINP);
    check_accum("matmul_bwd dinp", dx1, px, dx0, nx);
    check_accum("matmul_bwd dw", dw1, pw, dw0, nw);
    // dinp written (flags 0) over NaN: the sums added into zeros, bit for bit; dw still added
    fill_nan(dx1, nx);
    memcpy(dw1, pw, nw * sizeof(float));
    be->matmul_bwd(dx1, dw1, dout, x, w, N, K, O, 0);
    EXPECT(!memcmp(dx1, dx0, nx * sizeof(float)),
           "matmul_bwd N=%d K=%d O=%d: dinp written (flags 0) differs from "
           "the sums added into zeros",
           N, K, O);
    check_accum("matmul_bwd dw (dinp written)", dw1, pw, dw0, nw);
    // dw written (GM_DW_WRITE) over NaN: the same bits as adding into zeros
    fill_nan(dw1, nw);
    memcpy(dx1, px, nx * sizeof(float));
    be->matmul_bwd(dx1, dw1, dout, x, w, N, K, O, GM_ACC_DINP | GM_DW_WRITE);
    EXPECT(!memcmp(dw1, dw0, nw * sizeof(float)),
           "matmul_bwd N=%d K=%d O=%d: dw written (GM_DW_WRITE) differs from "
           "the sums added into zeros",
           N, K, O);
    check_accum("matmul_bwd dinp (dw written)", dx1, px, dx0, nx);
    // NULL gradient pointers
    memcpy(dx1, px, nx * sizeof(float));
    be->matmul_bwd(dx1, NULL, dout, x, w, N, K, O, GM_ACC_DINP);
    check_accum("matmul_bwd dinp (dw NULL)", dx1, px, dx0, nx);
    memcpy(dw1, pw, nw * sizeof(float));
    be->matmul_bwd(NULL, dw1, dout, x, w, N, K, O, GM_ACC_DINP);
    check_accum("matmul_bwd dw (dinp NULL)", dw1, pw, dw0, nw);
    free(x);
    free(w);
    free(out);
    free(pre);
    free(dout);
    free(ref);
    free(mag);
    free(dx0);
    free(dw0);
    free(px);
    free(pw);
    free(dx1);
    free(dw1);
}

static double gmm_loss(void *p) {
    MatCtx *c = p;
    be->grouped_matmul_fwd(c->out, c->x, c->w, c->off, c->G, c->K, c->O);
    return dot_d(c->dout, c->out, (size_t)c->N * c->O);
}

// ops.h GM_DW_BF16's layout: element j of buf's first 2n bytes the bf16 (nearest even) of ref[j], and
// nothing else written: buf holds 2n floats, and every byte past the packed 2n (the float32 blocks' other
// half, where another block's packed values or a hole may lie, and the n floats past the blocks) is that of
// before (the same buffer before the op).
static void check_packed(const char *what, const float *buf, const float *before, const float *ref,
                         size_t n) {
    size_t bad = 0, first = n, kept = 0;
    for (size_t j = 0; j < n; j++) {
        uint16_t h;
        memcpy(&h, (const char *)buf + 2 * j, 2);
        if (h != bf16_rn_bits(ref[j])) {
            bad++;
            if (first == n) first = j;
        }
    }
    if (!memcmp((const char *)buf + 2 * n, (const char *)before + 2 * n, 6 * n)) kept = 1;
    EXPECT(bad == 0, "%s: %zu of %zu packed values are not the bf16 of the float32 result; first [%zu]", what,
           bad, n, first);
    EXPECT(kept, "%s: a write past the packed values (in the float32 blocks' other half or past them)", what);
}

static void test_grouped_matmul(void) {
    // groups 1 and 4 have 0 rows (one in the middle, one at the end)
    enum { G = 5, K = 6, O = 5 };
    const int64_t off[G + 1] = {0, 3, 3, 8, 10, 10};
    int N = (int)off[G];
    size_t nx = (size_t)N * K, nw = (size_t)G * O * K, no = (size_t)N * O;
    float *x = fnew(nx), *w = fnew(nw), *out = fnew(no), *dout = fnew(no);
    double *ref = dnew(no), *mag = dnew(no);
    fill_normal(x, nx, 1);
    fill_normal(w, nw, 1);
    fill_normal(dout, no, 1);
    for (int g = 0; g < G; g++)
        matmul_ref(ref + off[g] * O, mag + off[g] * O, x + off[g] * K, w + (size_t)g * O * K,
                   (int)(off[g + 1] - off[g]), K, O);
    fill_nan(out, no);
    be->grouped_matmul_fwd(out, x, w, off, G, K, O);
    check_arr("grouped_matmul_fwd (with 0-row groups)", out, ref, mag, no, FWD_RTOL, 1e-30);

    float *dx0 = fnew(nx), *dw0 = fnew(nw);
    be->grouped_matmul_bwd(dx0, dw0, dout, x, w, off, G, K, O, 1);
    MatCtx c = {x, w, out, dout, N, K, O, off, G};
    fd_check("grouped_matmul_bwd dinp", gmm_loss, &c, x, nx, dx0);
    fd_check("grouped_matmul_bwd dw", gmm_loss, &c, w, nw, dw0);
    int empty_zero = 1;
    for (int g = 0; g < G; g++)
        if (off[g] == off[g + 1])
            for (size_t i = 0; i < (size_t)O * K; i++) empty_zero &= dw0[(size_t)g * O * K + i] == 0.0f;
    EXPECT(empty_zero, "grouped_matmul_bwd: dw of a 0-row group must stay 0");
    float *px = fnew(nx), *pw = fnew(nw);
    fill_normal(px, nx, 1);
    fill_normal(pw, nw, 1);
    float *dx1 = fcopy(px, nx), *dw1 = fcopy(pw, nw);
    be->grouped_matmul_bwd(dx1, dw1, dout, x, w, off, G, K, O, 1);
    check_accum("grouped_matmul_bwd dinp", dx1, px, dx0, nx);
    check_accum("grouped_matmul_bwd dw", dw1, pw, dw0, nw);
    memcpy(dx1, px, nx * sizeof(float));
    be->grouped_matmul_bwd(dx1, NULL, dout, x, w, off, G, K, O, 1);
    check_accum("grouped_matmul_bwd dinp (dw NULL)", dx1, px, dx0, nx);
    memcpy(dw1, pw, nw * sizeof(float));
    be->grouped_matmul_bwd(NULL, dw1, dout, x, w, off, G, K, O, 1);
    check_accum("grouped_matmul_bwd dw (dinp NULL)", dw1, pw, dw0, nw);
    // accumulate 0: dinp overwritten, dw still accumulated
    fill_nan(dx1, nx);
    memcpy(dw1, pw, nw * sizeof(float));
    be->grouped_matmul_bwd(dx1, dw1, dout, x, w, off, G, K, O, 0);
    check_overwrite("grouped_matmul_bwd dinp", dx1, dx0, nx);
    check_accum("grouped_matmul_bwd dw (dinp overwritten)", dw1, pw, dw0, nw);
    fill_nan(dx1, nx);
    be->grouped_matmul_bwd(dx1, NULL, dout, x, w, off, G, K, O, 0);
    check_overwrite("grouped_matmul_bwd dinp (dw NULL)", dx1, dx0, nx);
    // GM_DW_WRITE: dw written over NaN, the same bits as added into zeros (dw0: the 0-row groups'
    // blocks zeros); dinp as GM_ACC_DINP says; with no rows at all every block zeros
    fill_nan(dw1, nw);
    memcpy(dx1, px, nx * sizeof(float));
    be->grouped_matmul_bwd(dx1, dw1, dout, x, w, off, G, K, O, GM_ACC_DINP | GM_DW_WRITE);
    check_overwrite("grouped_matmul_bwd dw (GM_DW_WRITE)", dw1, dw0, nw);
    check_accum("grouped_matmul_bwd dinp (GM_DW_WRITE)", dx1, px, dx0, nx);
    // GM_DW_BF16: the blocks as bf16 values (nearest even of GM_DW_WRITE's floats) packed from dw, the bytes
    // past them as they were; dinp as without it. Also through the compositions that pass the flags on
    // (plain.h: grouped_swiglu_bwd's dw, grouped_matmul_bwd2's second weight)
    {
        float *pk = fnew(2 * nw), *pk0 = fnew(2 * nw), *pk2 = fnew(2 * nw);
        fill_nan(pk, 2 * nw);
        memcpy(pk0, pk, 2 * nw * sizeof(float));
        memcpy(dx1, px, nx * sizeof(float));
        be->grouped_matmul_bwd(dx1, pk, dout, x, w, off, G, K, O, GM_ACC_DINP | GM_DW_WRITE | GM_DW_BF16);
        check_packed("grouped_matmul_bwd dw (GM_DW_BF16)", pk, pk0, dw0, nw);
        check_accum("grouped_matmul_bwd dinp (GM_DW_BF16)", dx1, px, dx0, nx);
        fill_nan(pk, 2 * nw);
        fill_nan(pk2, 2 * nw);
        be->grouped_matmul_bwd2(dx1, pk, pk2, dout, dout, x, w, w, off, G, K, O, GM_DW_WRITE | GM_DW_BF16);
        check_packed("grouped_matmul_bwd2 dwa (GM_DW_BF16)", pk, pk0, dw0, nw);
        check_packed("grouped_matmul_bwd2 dwb (GM_DW_BF16)", pk2, pk0, dw0, nw);
        float *h = fnew(nx), *d1 = fnew(nx), *d3 = fnew(nx);
        fill_normal(h, nx, 1);
        fill_nan(pk, 2 * nw);
        be->grouped_swiglu_bwd(d1, d3, pk, dout, x, h, h, w, off, G, K, O, GM_DW_WRITE | GM_DW_BF16);
        check_packed("grouped_swiglu_bwd dw (GM_DW_BF16)", pk, pk0, dw0, nw);
        free(pk);
        free(pk0);
        free(pk2);
        free(h);
        free(d1);
        free(d3);
    }
    const int64_t none[G + 1] = {0};
    float *zw = fnew(nw);
    fill_nan(dw1, nw);
    be->grouped_matmul_bwd(NULL, dw1, dout, x, w, none, G, K, O, GM_DW_WRITE);
    check_overwrite("grouped_matmul_bwd dw (GM_DW_WRITE, no rows)", dw1, zw, nw);
    free(zw);
    // groups over rows [L, L + N) of buffers of L + N + L rows: with accumulate 0 those rows are
    // written, the L rows on either side keep their values (bitwise); with O = 0 (empty sums) the
    // written rows are zeros
    enum { L = 2 };
    int64_t offs[G + 1];
    for (int g = 0; g <= G; g++) offs[g] = off[g] + L;
    size_t nxs = (size_t)(N + 2 * L) * K, nos = (size_t)(N + 2 * L) * O;
    float *xs = fnew(nxs), *douts = fnew(nos), *dxs = fnew(nxs), *side = fnew(nxs);
    fill_normal(xs, nxs, 1);
    fill_normal(douts, nos, 1);
    fill_normal(side, nxs, 1);
    memcpy(xs + (size_t)L * K, x, nx * sizeof(float));
    memcpy(douts + (size_t)L * O, dout, no * sizeof(float));
    for (int o0 = 0; o0 < 2; o0++) {
        memcpy(dxs, side, nxs * sizeof(float));
        fill_nan(dxs + (size_t)L * K, nx);
        be->grouped_matmul_bwd(dxs, NULL, douts, xs, w, offs, G, K, o0 ? 0 : O, 0);
        float *want = o0 ? fnew(nx) : dx0;
        check_overwrite(o0 ? "grouped_matmul_bwd dinp (O = 0, rows from off[0] = 2)"
                           : "grouped_matmul_bwd dinp (rows from off[0] = 2)",
                        dxs + (size_t)L * K, want, nx);
        check_exact("grouped_matmul_bwd: rows before off[0] untouched", dxs, side, (size_t)L * K);
        check_exact("grouped_matmul_bwd: rows from off[G] untouched", dxs + (size_t)(L + N) * K,
                    side + (size_t)(L + N) * K, (size_t)L * K);
        if (o0) free(want);
    }
    free(xs);
    free(douts);
    free(dxs);
    free(side);
    free(x);
    free(w);
    free(out);
    free(dout);
    free(ref);
    free(mag);
    free(dx0);
    free(dw0);
    free(px);
    free(pw);
    free(dx1);
    free(dw1);
}

// ---------------------------------------------------------------- embedding
typedef struct {
    float *table, *out;
    const float *dout;
    const int32_t *tok;
    int N, C, V;
} EmbCtx;
static double emb_loss(void *p) {
    EmbCtx *c = p;
    be->embedding_fwd(c->out, c->tok, c->table, c->N, c->C, c->V);
    return dot_d(c->dout, c->out, (size_t)c->N * c->C);
}
static void test_embedding(void) {
    enum { V = 11, C = 6, N = 9 };
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)rng_below(&R, V - 2); // rows V-2, V-1 unused
    tok[5] = tok[0]; // a repeated token
    float *table = fnew(V * C), *out = fnew(N * C), *dout = fnew(N * C), *want = fnew(N * C);
    fill_normal(table, V * C, 1);
    fill_normal(dout, N * C, 1);
    for (int i = 0; i < N; i++) memcpy(want + i * C, table + tok[i] * C, C * sizeof(float));
    fill_nan(out, N * C);
    be->embedding_fwd(out, tok, table, N, C, V);
    check_exact("embedding_fwd", out, want, N * C);
    float *g0 = fnew(V * C);
    be->embedding_bwd(g0, dout, tok, N, C, V);
    EmbCtx c = {table, out, dout, tok, N, C, V};
    fd_check("embedding_bwd", emb_loss, &c, table, V * C, g0);
    float *pre = fnew(V * C);
    fill_normal(pre, V * C, 1);
    float *g1 = fcopy(pre, V * C);
    be->embedding_bwd(g1, dout, tok, N, C, V);
    check_accum("embedding_bwd", g1, pre, g0, V * C);
    check_exact("embedding_bwd leaves unused rows", g1 + (V - 2) * C, pre + (V - 2) * C, 2 * C);
    // ids outside [0, V) (another TP rank's rows of a vocab-parallel table): zero rows, nothing added
    int32_t t2[N];
    memcpy(t2, tok, sizeof t2);
    t2[2] = -1;
    t2[6] = V;
    for (int c = 0; c < C; c++) want[2 * C + c] = want[6 * C + c] = 0;
    fill_nan(out, N * C);
    be->embedding_fwd(out, t2, table, N, C, V);
    check_exact("embedding_fwd: ids -1 and V give zero rows, the others theirs", out, want, N * C);
    float *g2 = fnew((V + 1) * C), *d2 = fcopy(dout, N * C); // (a row past the table: must stay as it is)
    memcpy(g2, pre, sizeof(float) * V * C);
    memcpy(g2 + V * C, pre, sizeof(float) * C);
    for (int c = 0; c < C; c++) d2[2 * C + c] = d2[6 * C + c] = 0; // (the same sums without those rows)
    be->embedding_bwd(g2, dout, t2, N, C, V);
    memcpy(g1, pre, V * C * sizeof(float));
    be->embedding_bwd(g1, d2, tok, N, C, V);
    check_exact("embedding_bwd: ids -1 and V add nothing (= their rows' gradients zero)", g2, g1, V * C);
    check_exact("embedding_bwd: the row past the table untouched", g2 + V * C, pre, C);
    free(g2);
    free(d2);
    free(table);
    free(out);
    free(dout);
    free(want);
    free(g0);
    free(pre);
    free(g1);
}

// ---------------------------------------------------------------- rmsnorm
typedef struct {
    float *x, *w, *out, *rstd;
    const float *dout;
    int N, C;
    float eps;
} RmsCtx;
static double rms_loss(void *p) {
    RmsCtx *c = p;
    be->rmsnorm_fwd(c->out, c->rstd, c->x, c->w, c->N, c->C, c->eps);
    return dot_d(c->dout, c->out, (size_t)c->N * c->C);
}
static void test_rmsnorm(void) {
    enum { N = 5, C = 24 };
    const float eps = 1e-5f;
    float *x = fnew(N * C), *w = fnew(C), *out = fnew(N * C), *rstd = fnew(N), *dout = fnew(N * C);
    fill_normal(x, N * C, 1);
    fill_normal(dout, N * C, 1);
    for (int c = 0; c < C; c++) w[c] = 1.0f + 0.3f * rng_normal(&R);
    for (int c = 0; c < C; c++)
        x[2 * C + c] *= 0.3f; // one smaller-norm row (still >> h, so FD stays accurate)
    double *ref = dnew(N * C), *rref = dnew(N);
    for (int n = 0; n < N; n++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[n * C + c] * x[n * C + c];
        rref[n] = 1.0 / sqrt(ss / C + (double)eps);
        for (int c = 0; c < C; c++) ref[n * C + c] = x[n * C + c] * rref[n] * w[c];
    }
    fill_nan(out, N * C);
    fill_nan(rstd, N);
    be->rmsnorm_fwd(out, rstd, x, w, N, C, eps);
    check_arr("rmsnorm_fwd out", out, ref, NULL, N * C, FWD_RTOL, 1e-30);
    check_arr("rmsnorm_fwd rstd", rstd, rref, NULL, N, FWD_RTOL, 0);
    { // into the (float32) hidden format: the same bits
        float *oh = fnew(N * C), *rh = fnew(N);
        fill_nan(oh, N * C);
        fill_nan(rh, N);
        be->rmsnorm_fwd_hid(oh, rh, x, w, N, C, eps);
        EXPECT(be->hid == FMT_F32 && !memcmp(oh, out, sizeof(float) * N * C) &&
                   !memcmp(rh, rstd, sizeof(float) * N),
               "rmsnorm_fwd_hid differs from rmsnorm_fwd");
        free(oh);
        free(rh);
    }

    float *dx0 = fnew(N * C), *dw0 = fnew(C);
    be->rmsnorm_fwd(out, rstd, x, w, N, C, eps);
    float *rstd0 = fcopy(rstd, N);
    be->rmsnorm_bwd(dx0, dw0, dout, x, w, rstd0, N, C);
    RmsCtx c = {x, w, out, rstd, dout, N, C, eps};
    fd_check("rmsnorm_bwd dinp", rms_loss, &c, x, N * C, dx0);
    fd_check("rmsnorm_bwd dw", rms_loss, &c, w, C, dw0);
    float *px = fnew(N * C), *pw = fnew(C);
    fill_normal(px, N * C, 1);
    fill_normal(pw, C, 1);
    float *dx1 = fcopy(px, N * C), *dw1 = fcopy(pw, C);
    be->rmsnorm_bwd(dx1, dw1, dout, x, w, rstd0, N, C);
    check_accum("rmsnorm_bwd dinp", dx1, px, dx0, N * C);
    check_accum("rmsnorm_bwd dw", dw1, pw, dw0, C);
    memcpy(dx1, px, N * C * sizeof(float));
    be->rmsnorm_bwd(dx1, NULL, dout, x, w, rstd0, N, C);
    check_accum("rmsnorm_bwd dinp (dw NULL)", dx1, px, dx0, N * C);
    free(x);
    free(w);
    free(out);
    free(rstd);
    free(dout);
    free(ref);
    free(rref);
    free(dx0);
    free(dw0);
    free(rstd0);
    free(px);
    free(pw);
    free(dx1);
    free(dw1);
}

// The row split by columns over ranks (rmsnorm_part, rmsnorm_fwd_part, rmsnorm_bwd_part; OLMoE's full-width
// QK-norm under TP): the columns [0, C0) and [C0, C) as two ranks' (N, C0) and (N, C - C0) blocks, the
// parts added as the TP all-reduce adds them, against rmsnorm_fwd / rmsnorm_bwd over the whole rows.
// Bands: the parts are the row's sums in double (checked to 1e-12 relative of sum |terms| against a sum
// here); the whole sum is then the same as one pass to double round-off (~1e-16), so rstd, a float rounded
// from it, is the same float or one ulp away, and out = x rstd w, dx = rstd g w - k x (k = dot/C rstd^3,
// the same) and dw = sum g x rstd move by at most a few float ulps of their terms: 4e-7 relative to the
// terms' magnitudes (|x r w|; |r g w| + |k x|, as dx may cancel; sum |g x r|). A part missing its other
// half, a wrong Ctot or a local mean moves them by O(1). With C0 = C (one rank) the ops give rmsnorm_fwd /
// rmsnorm_bwd's bits (ops.h): checked exactly.
#define SPLIT_RTOL 4e-7
static void cols(float *dst, const float *src, int N, int C, int c0, int c1) { // columns [c0, c1) of (N, C)
    for (int n = 0; n < N; n++)
        memcpy(dst + (size_t)n * (c1 - c0), src + (size_t)n * C + c0, sizeof(float) * (c1 - c0));
}
static void test_rmsnorm_split(int N, int C, int C0) {
    const float eps = 1e-5f;
    int C1 = C - C0, Cs[2] = {C0, C1}, off[2] = {0, C0};
    float *x = fnew(N * C), *w = fnew(C), *dout = fnew(N * C), *out = fnew(N * C), *rstd = fnew(N);
    fill_normal(x, N * C, 1);
    fill_normal(dout, N * C, 1);
    for (int c = 0; c < C; c++) w[c] = 1.0f + 0.3f * rng_normal(&R);
    for (int c = 0; c < C; c++) x[C + c] *= 1e-3f; // a small row: eps matters in its rstd
    float *dx = fnew(N * C), *dw = fnew(C);
    be->rmsnorm_fwd(out, rstd, x, w, N, C, eps);
    be->rmsnorm_bwd(dx, dw, dout, x, w, rstd, N, C);
    // each part's blocks: x, dout, w, out, rstd, dx, dw
    float *px[2], *pg[2], *pw[2], *po[2], *pr[2], *pdx[2], *pdw[2];
    double *ss = dnew(N), *dot = dnew(N), *part = dnew(N);
    for (int k = 0; k < 2; k++) {
        px[k] = fnew(N * Cs[k]);
        pg[k] = fnew(N * Cs[k]);
        po[k] = fnew(N * Cs[k]);
        pdx[k] = fnew(N * Cs[k]);
        pr[k] = fnew(N);
        pdw[k] = fnew(Cs[k]);
        pw[k] = fcopy(w + off[k], Cs[k]);
        cols(px[k], x, N, C, off[k], off[k] + Cs[k]);
        cols(pg[k], dout, N, C, off[k], off[k] + Cs[k]);
        for (int pass = 0; pass < 2; pass++) { // the sum of squares, then the backward's dot
            for (int n = 0; n < N; n++) part[n] = NAN;
            if (!pass) be->rmsnorm_part(part, px[k], NULL, px[k], N, Cs[k]);
            else be->rmsnorm_part(part, pg[k], pw[k], px[k], N, Cs[k]);
            for (int n = 0; n < N; n++) {
                double ref = 0, mag = 0;
                for (int c = 0; c < Cs[k]; c++) {
                    double xv = px[k][n * Cs[k] + c],
                           t = pass ? (double)pg[k][n * Cs[k] + c] * pw[k][c] * xv : xv * xv;
                    ref += t;
                    mag += fabs(t);
                }
                EXPECT(fabs(part[n] - ref) <= 1e-12 * mag,
                       "rmsnorm_part (%s) part %d row %d: %.17g, ref %.17g", pass ? "dot" : "sum of squares",
                       k, n, part[n], ref);
                (pass ? dot : ss)[n] += part[n]; // the TP all-reduce
            }
        }
    }
    double *ref = dnew(N * C), *mag = dnew(N * C);
    for (int k = 0; k < 2; k++) {
        fill_nan(po[k], N * Cs[k]);
        fill_nan(pr[k], N);
        be->rmsnorm_fwd_part(po[k], pr[k], px[k], pw[k], ss, N, Cs[k], C, eps);
        for (int n = 0; n < N; n++)
            for (int c = 0; c < Cs[k]; c++) {
                ref[n * Cs[k] + c] = out[n * C + off[k] + c];
                mag[n * Cs[k] + c] = fabs((double)x[n * C + off[k] + c] * rstd[n] * w[off[k] + c]);
            }
        check_arr(k ? "rmsnorm_fwd_part out (part 1)" : "rmsnorm_fwd_part out (part 0)", po[k], ref, mag,
                  N * Cs[k], SPLIT_RTOL, 1e-30);
        for (int n = 0; n < N; n++) ref[n] = rstd[n];
        check_arr("rmsnorm_fwd_part rstd", pr[k], ref, NULL, N, SPLIT_RTOL, 0);
        be->rmsnorm_bwd_part(pdx[k], pdw[k], pg[k], px[k], pw[k], pr[k], dot, N, Cs[k], C);
        for (int n = 0; n < N; n++) {
            double r = pr[k][n], kk = dot[n] / C * r * r * r;
            for (int c = 0; c < Cs[k]; c++) {
                size_t i = (size_t)n * Cs[k] + c;
                ref[i] = dx[n * C + off[k] + c];
                mag[i] = fabs(r * pg[k][i] * pw[k][c]) + fabs(kk * px[k][i]);
            }
        }
        check_arr("rmsnorm_bwd_part dinp", pdx[k], ref, mag, N * Cs[k], SPLIT_RTOL, 1e-30);
        for (int c = 0; c < Cs[k]; c++) {
            ref[c] = dw[off[k] + c];
            mag[c] = 0;
            for (int n = 0; n < N; n++)
                mag[c] += fabs((double)pg[k][n * Cs[k] + c] * px[k][n * Cs[k] + c] * pr[k][n]);
        }
        check_arr("rmsnorm_bwd_part dw", pdw[k], ref, mag, Cs[k], SPLIT_RTOL, 1e-30);
        // accumulates (+=), and without dw
        float *pre = fnew(N * Cs[k]), *prw = fnew(Cs[k]);
        fill_normal(pre, N * Cs[k], 1);
        fill_normal(prw, Cs[k], 1);
        float *dx1 = fcopy(pre, N * Cs[k]), *dw1 = fcopy(prw, Cs[k]);
        be->rmsnorm_bwd_part(dx1, dw1, pg[k], px[k], pw[k], pr[k], dot, N, Cs[k], C);
        check_accum("rmsnorm_bwd_part dinp", dx1, pre, pdx[k], N * Cs[k]);
        check_accum("rmsnorm_bwd_part dw", dw1, prw, pdw[k], Cs[k]);
        memcpy(dx1, pre, sizeof(float) * N * Cs[k]);
        be->rmsnorm_bwd_part(dx1, NULL, pg[k], px[k], pw[k], pr[k], dot, N, Cs[k], C);
        check_accum("rmsnorm_bwd_part dinp (dw NULL)", dx1, pre, pdx[k], N * Cs[k]);
        free(pre);
        free(prw);
        free(dx1);
        free(dw1);
    }
    // one rank (C0 = C): rmsnorm_fwd / rmsnorm_bwd's bits
    float *o1 = fnew(N * C), *r1 = fnew(N), *dx1 = fnew(N * C), *dw1 = fnew(C);
    be->rmsnorm_part(ss, x, NULL, x, N, C);
    be->rmsnorm_fwd_part(o1, r1, x, w, ss, N, C, C, eps);
    be->rmsnorm_part(dot, dout, w, x, N, C);
    be->rmsnorm_bwd_part(dx1, dw1, dout, x, w, r1, dot, N, C, C);
    check_exact("rmsnorm_fwd_part, one part: rmsnorm_fwd's out", o1, out, N * C);
    check_exact("rmsnorm_fwd_part, one part: rmsnorm_fwd's rstd", r1, rstd, N);
    check_exact("rmsnorm_bwd_part, one part: rmsnorm_bwd's dinp", dx1, dx, N * C);
    check_exact("rmsnorm_bwd_part, one part: rmsnorm_bwd's dw", dw1, dw, C);
    free(o1);
    free(r1);
    free(dx1);
    free(dw1);
    for (int k = 0; k < 2; k++) {
        free(px[k]);
        free(pg[k]);
        free(pw[k]);
        free(po[k]);
        free(pr[k]);
        free(pdx[k]);
        free(pdw[k]);
    }
    free(x);
    free(w);
    free(dout);
    free(out);
    free(rstd);
    free(dx);
    free(dw);
    free(ss);
    free(dot);
    free(part);
    free(ref);
    free(mag);
}

// ---------------------------------------------------------------- rope
typedef struct {
    float *x, *tmp;
    const float *dout;
    int B, T, nh, hd;
    float theta;
} RopeCtx;
static double rope_loss(void *p) {
    RopeCtx *c = p;
    size_t n = (size_t)c->B * c->T * c->nh * c->hd;
    memcpy(c->tmp, c->x, n * sizeof(float));
    be->rope_fwd(c->tmp, c->B, c->T, c->nh, c->hd, c->theta);
    return dot_d(c->dout, c->tmp, n);
}
static void test_rope(int B, int T, int nh, int hd, float theta) {
    char lab[96];
    size_t n = (size_t)B * T * nh * hd;
    int half = hd / 2;
    float *x = fnew(n), *y = fnew(n), *dout = fnew(n), *tmp = fnew(n);
    double *ref = dnew(n), *mag = dnew(n);
    fill_normal(x, n, 1);
    fill_normal(dout, n, 1);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < nh; h++) {
                size_t o = (((size_t)b * T + t) * nh + h) * hd;
                for (int j = 0; j < half; j++) {
                    double ang = t * pow((double)theta, -2.0 * j / hd), cs = cos(ang), sn = sin(ang);
                    double x1 = x[o + j], x2 = x[o + j + half];
                    ref[o + j] = x1 * cs - x2 * sn;
                    ref[o + j + half] = x2 * cs + x1 * sn;
                    mag[o + j] = mag[o + j + half] = fabs(x1) + fabs(x2);
                }
            }
    memcpy(y, x, n * sizeof(float));
    be->rope_fwd(y, B, T, nh, hd, theta);
    snprintf(lab, sizeof lab, "rope_fwd B=%d T=%d nh=%d hd=%d theta=%g", B, T, nh, hd, theta);
    check_arr(lab, y, ref, mag, n, FWD_RTOL, 1e-30);
    // rope_bwd is the exact inverse rotation
    be->rope_bwd(y, B, T, nh, hd, theta);
    double *xd = dnew(n), *one = dnew(n);
    for (size_t i = 0; i < n; i++) {
        xd[i] = x[i];
        one[i] = 1.0 + fabs(x[i]);
    }
    snprintf(lab, sizeof lab, "rope_bwd(rope_fwd(x)) == x (1e-6) B=%d T=%d hd=%d", B, T, hd);
    check_arr(lab, y, xd, one, n, 1e-6, 0);
    // rope_bwd as the gradient (in place: it transforms dout, there is nothing to accumulate)
    float *g = fcopy(dout, n);
    be->rope_bwd(g, B, T, nh, hd, theta);
    RopeCtx c = {x, tmp, dout, B, T, nh, hd, theta};
    snprintf(lab, sizeof lab, "rope_bwd gradient B=%d T=%d nh=%d hd=%d", B, T, nh, hd);
    fd_check(lab, rope_loss, &c, x, n, g);
    free(x);
    free(y);
    free(dout);
    free(tmp);
    free(ref);
    free(mag);
    free(xd);
    free(one);
    free(g);
}

// ---------------------------------------------------------------- attention
typedef struct {
    float *q, *k, *v, *out, *lse;
    const float *dout;
    int B, T, H, KV, hd;
} AttCtx;
static double att_loss(void *p) {
    AttCtx *c = p;
    be->attention_fwd(c->out, c->lse, c->q, c->k, c->v, c->B, c->T, c->H, c->KV, c->hd, 0, c->T);
    return dot_d(c->dout, c->out, (size_t)c->B * c->T * c->H * c->hd);
}
static void test_attention(int B, int T, int H, int KV, int hd) {
    char lab[128];
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, nl = (size_t)B * H * T;
    float *q = fnew(nq), *k = fnew(nk), *v = fnew(nk), *out = fnew(nq), *lse = fnew(nl), *dout = fnew(nq);
    fill_normal(q, nq, 1);
    fill_normal(k, nk, 1);
    fill_normal(v, nk, 1);
    fill_normal(dout, nq, 1);
    double *ref = dnew(nq), *mag = dnew(nq), *lref = dnew(nl), *lmag = dnew(nl);
    double *S = dnew((size_t)T * T); // the materialised causal (T, T) score matrix of one (b, h)
    double sc = 1.0 / sqrt((double)hd);
    int rep = H / KV;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            int kh = h / rep;
            for (int t = 0; t < T; t++)
                for (int u = 0; u < T; u++) {
                    if (u > t) {
                        S[t * T + u] = -INFINITY;
                        continue;
                    }
                    double a = 0;
                    for (int i = 0; i < hd; i++)
                        a += (double)q[(((size_t)b * T + t) * H + h) * hd + i] *
                            k[(((size_t)b * T + u) * KV + kh) * hd + i];
                    S[t * T + u] = a * sc;
                }
            for (int t = 0; t < T; t++) {
                double mx = -INFINITY, s = 0, smax = 0;
                for (int u = 0; u < T; u++)
                    if (S[t * T + u] > mx) mx = S[t * T + u];
                for (int u = 0; u < T; u++) s += exp(S[t * T + u] - mx); // exp(-inf) = 0: masked
                for (int u = 0; u <= t; u++)
                    if (fabs(S[t * T + u]) > smax) smax = fabs(S[t * T + u]);
                lref[((size_t)b * H + h) * T + t] = mx + log(s);
                lmag[((size_t)b * H + h) * T + t] = fabs(mx + log(s)) + smax;
                for (int i = 0; i < hd; i++) {
                    double o = 0, m = 0;
                    for (int u = 0; u <= t; u++) {
                        double pr = exp(S[t * T + u] - mx) / s,
                               vv = v[(((size_t)b * T + u) * KV + kh) * hd + i];
                        o += pr * vv;
                        m += pr * fabs(vv);
                    }
                    ref[(((size_t)b * T + t) * H + h) * hd + i] = o;
                    mag[(((size_t)b * T + t) * H + h) * hd + i] = m;
                }
            }
        }
    fill_nan(out, nq);
    fill_nan(lse, nl);
    be->attention_fwd(out, lse, q, k, v, B, T, H, KV, hd, 0, T);
    snprintf(lab, sizeof lab, "attention_fwd out B=%d T=%d H=%d KV=%d hd=%d", B, T, H, KV, hd);
    check_arr(lab, out, ref, mag, nq, FWD_RTOL, 1e-30);
    snprintf(lab, sizeof lab, "attention_fwd lse B=%d T=%d H=%d KV=%d hd=%d", B, T, H, KV, hd);
    check_arr(lab, lse, lref, lmag, nl, FWD_RTOL, 1e-30);

    float *out0 = fcopy(out, nq), *lse0 = fcopy(lse, nl);
    float *dq0 = fnew(nq), *dk0 = fnew(nk), *dv0 = fnew(nk);
    be->attention_bwd(dq0, dk0, dv0, dout, out0, lse0, q, k, v, B, T, H, KV, hd, 0, T,
                      ATT_ADD_DQ | ATT_ADD_DKV);
    AttCtx c = {q, k, v, out, lse, dout, B, T, H, KV, hd};
    snprintf(lab, sizeof lab, "attention_bwd dq B=%d T=%d H=%d KV=%d hd=%d", B, T, H, KV, hd);
    fd_check(lab, att_loss, &c, q, nq, dq0);
    snprintf(lab, sizeof lab, "attention_bwd dk B=%d T=%d H=%d KV=%d hd=%d", B, T, H, KV, hd);
    fd_check(lab, att_loss, &c, k, nk, dk0);
    snprintf(lab, sizeof lab, "attention_bwd dv B=%d T=%d H=%d KV=%d hd=%d", B, T, H, KV, hd);
    fd_check(lab, att_loss, &c, v, nk, dv0);
    float *pq = fnew(nq), *pk = fnew(nk), *pv = fnew(nk);
    fill_normal(pq, nq, 1);
    fill_normal(pk, nk, 1);
    fill_normal(pv, nk, 1);
    float *dq1 = fcopy(pq, nq), *dk1 = fcopy(pk, nk), *dv1 = fcopy(pv, nk);
    be->attention_bwd(dq1, dk1, dv1, dout, out0, lse0, q, k, v, B, T, H, KV, hd, 0, T,
                      ATT_ADD_DQ | ATT_ADD_DKV);
    check_accum("attention_bwd dq", dq1, pq, dq0, nq);
    check_accum("attention_bwd dk", dk1, pk, dk0, nk);
    check_accum("attention_bwd dv", dv1, pv, dv0, nk);
    // written (flags 0) over NaN: the bits of adding into zeros
    fill_nan(dq1, nq);
    fill_nan(dk1, nk);
    fill_nan(dv1, nk);
    be->attention_bwd(dq1, dk1, dv1, dout, out0, lse0, q, k, v, B, T, H, KV, hd, 0, T, 0);
    snprintf(lab, sizeof lab, "attention_bwd written (flags 0) == added into zeros: dq T=%d", T);
    check_exact(lab, dq1, dq0, nq);
    snprintf(lab, sizeof lab, "attention_bwd written (flags 0) == added into zeros: dk T=%d", T);
    check_exact(lab, dk1, dk0, nk);
    snprintf(lab, sizeof lab, "attention_bwd written (flags 0) == added into zeros: dv T=%d", T);
    check_exact(lab, dv1, dv0, nk);
    free(q);
    free(k);
    free(v);
    free(out);
    free(lse);
    free(dout);
    free(ref);
    free(mag);
    free(lref);
    free(lmag);
    free(S);
    free(out0);
    free(lse0);
    free(dq0);
    free(dk0);
    free(dv0);
    free(pq);
    free(pk);
    free(pv);
    free(dq1);
    free(dk1);
    free(dv1);
}

// Query rows in chunks (AMPipe): chunk j = rows [T*j/n, T*(j+1)/n). The forward over the chunks is
// the same bits as one call and leaves the rows outside its chunk untouched; the backward over the
// chunks (in reverse, as the block schedule runs them) gives the same dq bits (each row's sum is
// the one call's) and dk/dv to float32 round-off (each key's sum is split by chunk).
static void test_attention_chunks(int B, int T, int H, int KV, int hd, int n) {
    char lab[128];
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, nl = (size_t)B * H * T;
    float *q = fnew(nq), *k = fnew(nk), *v = fnew(nk), *dout = fnew(nq);
    fill_normal(q, nq, 1);
    fill_normal(k, nk, 1);
    fill_normal(v, nk, 1);
    fill_normal(dout, nq, 1);
    float *o1 = fnew(nq), *l1 = fnew(nl), *on = fnew(nq), *ln = fnew(nl);
    be->attention_fwd(o1, l1, q, k, v, B, T, H, KV, hd, 0, T);
    fill_nan(on, nq);
    fill_nan(ln, nl);
    for (int j = 0; j < n; j++) {
        int t0 = T * j / n, t1 = T * (j + 1) / n;
        if (t0 == t1) continue;
        be->attention_fwd(on, ln, q, k, v, B, T, H, KV, hd, t0, t1);
        int bad = 0; // rows of later chunks are still unwritten (NaN)
        for (int b = 0; b < B; b++)
            for (int t = t1; t < T; t++)
                for (int h = 0; h < H; h++)
                    bad += !isnan(on[(((size_t)b * T + t) * H + h) * hd]) +
                        !isnan(ln[((size_t)b * H + h) * T + t]);
        snprintf(lab, sizeof lab, "attention_fwd rows [%d,%d) leave the later rows untouched (T=%d)", t0, t1,
                 T);
        EXPECT(bad == 0, "%s: %d values written", lab, bad);
    }
    snprintf(lab, sizeof lab, "attention_fwd over %d chunks == one call: out B=%d T=%d H=%d KV=%d hd=%d", n,
             B, T, H, KV, hd);
    check_exact(lab, on, o1, nq);
    snprintf(lab, sizeof lab, "attention_fwd over %d chunks == one call: lse T=%d", n, T);
    check_exact(lab, ln, l1, nl);
    // as the model calls it (model/attention.c attn_bwd_rows): dq written, dk and dv written by the first
    // chunk (the last rows, which read every key) and added into by the others; over NaN
    float *dq1 = fnew(nq), *dk1 = fnew(nk), *dv1 = fnew(nk), *dqn = fnew(nq), *dkn = fnew(nk),
          *dvn = fnew(nk);
    fill_nan(dq1, nq);
    fill_nan(dk1, nk);
    fill_nan(dv1, nk);
    fill_nan(dqn, nq);
    fill_nan(dkn, nk);
    fill_nan(dvn, nk);
    be->attention_bwd(dq1, dk1, dv1, dout, o1, l1, q, k, v, B, T, H, KV, hd, 0, T, 0);
    for (int j = n - 1, first = 1; j >= 0; j--) {
        int t0 = T * j / n, t1 = T * (j + 1) / n;
        if (t0 < t1)
            be->attention_bwd(dqn, dkn, dvn, dout, o1, l1, q, k, v, B, T, H, KV, hd, t0, t1,
                              first ? 0 : ATT_ADD_DKV);
        if (t0 < t1) first = 0;
    }
    snprintf(lab, sizeof lab, "attention_bwd over %d chunks == one call: dq T=%d", n, T);
    check_exact(lab, dqn, dq1, nq);
    double *r = dnew(nk), *mg = dnew(nk);
    float *got[2] = {dkn, dvn}, *want[2] = {dk1, dv1};
    for (int w = 0; w < 2; w++) {
        double rms = 0; // scale: the sums cancel, so a key's error is relative to the typical term
        for (size_t i = 0; i < nk; i++) rms += (double)want[w][i] * want[w][i];
        rms = sqrt(rms / nk);
        for (size_t i = 0; i < nk; i++) {
            r[i] = want[w][i];
            mg[i] = fabs(want[w][i]) + rms;
        }
        snprintf(lab, sizeof lab, "attention_bwd over %d chunks ~ one call: %s T=%d (round-off)", n,
                 w ? "dv" : "dk", T);
        check_arr(lab, got[w], r, mg, nk, 1e-5, 1e-30);
    }
    free(q);
    free(k);
    free(v);
    free(dout);
    free(o1);
    free(l1);
    free(on);
    free(ln);
    free(dq1);
    free(dk1);
    free(dv1);
    free(dqn);
    free(dkn);
    free(dvn);
    free(r);
    free(mg);
}

// ---------------------------------------------------------------- swiglu
typedef struct {
    float *h1, *h3, *out;
    const float *dout;
    size_t n;
} SwiCtx;
static double swi_loss(void *p) {
    SwiCtx *c = p;
    be->swiglu_fwd(c->out, c->h1, c->h3, c->n);
    return dot_d(c->dout, c->out, c->n);
}
static void test_swiglu(void) {
    enum { n = 48 };
    float *h1 = fnew(n), *h3 = fnew(n), *out = fnew(n), *dout = fnew(n);
    fill_normal(h1, n, 3);
    fill_normal(h3, n, 1);
    fill_normal(dout, n, 1);
    h1[0] = 0;
    h1[1] = 20;
    h1[2] = -20; // silu(0) = 0, saturated ends
    double *ref = dnew(n);
    for (int i = 0; i < n; i++) ref[i] = (double)h1[i] / (1.0 + exp(-(double)h1[i])) * h3[i];
    fill_nan(out, n);
    be->swiglu_fwd(out, h1, h3, n);
    check_arr("swiglu_fwd", out, ref, NULL, n, FWD_RTOL, 1e-30);
    float *d10 = fnew(n), *d30 = fnew(n);
    be->swiglu_bwd(d10, d30, dout, h1, h3, n, 1);
    SwiCtx c = {h1, h3, out, dout, n};
    fd_check("swiglu_bwd dh1", swi_loss, &c, h1, n, d10);
    fd_check("swiglu_bwd dh3", swi_loss, &c, h3, n, d30);
    float *p1 = fnew(n), *p3 = fnew(n);
    fill_normal(p1, n, 1);
    fill_normal(p3, n, 1);
    float *d11 = fcopy(p1, n), *d31 = fcopy(p3, n);
    be->swiglu_bwd(d11, d31, dout, h1, h3, n, 1);
    check_accum("swiglu_bwd dh1", d11, p1, d10, n);
    check_accum("swiglu_bwd dh3", d31, p3, d30, n);
    // accumulate 0 on NaN: the same values bitwise (x, not 0 + x: equal under ==, which ignores the
    // sign of a zero)
    fill_nan(d11, n);
    fill_nan(d31, n);
    be->swiglu_bwd(d11, d31, dout, h1, h3, n, 0);
    check_exact("swiglu_bwd dh1 overwrites (accumulate 0)", d11, d10, n);
    check_exact("swiglu_bwd dh3 overwrites (accumulate 0)", d31, d30, n);
    free(h1);
    free(h3);
    free(out);
    free(dout);
    free(ref);
    free(d10);
    free(d30);
    free(p1);
    free(p3);
    free(d11);
    free(d31);
}

// ---------------------------------------------------------------- gather, gather_dot_scale, mul, axpy
// scatter_add_rows, scale_rows, row_dot and scale are cpu_oracle.h's (no longer Backend ops): they
// are checked here against double references too, since gather_dot_scale and adamw_runs are
// checked bit for bit against compositions of them.
typedef struct {
    float *inp, *scale, *out;
    const float *pre, *dout;
    const int32_t *idx;
    int n, rows, C;
} RowCtx;
static double gather_loss(void *p) {
    RowCtx *c = p;
    be->gather_rows(c->out, c->inp, c->idx, c->n, c->C);
    return dot_d(c->dout, c->out, (size_t)c->n * c->C);
}
static double scatter_loss(void *p) {
    RowCtx *c = p;
    memcpy(c->out, c->pre, (size_t)c->rows * c->C * sizeof(float));
    oracle_scatter_add_rows(c->out, c->inp, c->idx, c->scale, c->n, c->C);
    return dot_d(c->dout, c->out, (size_t)c->rows * c->C);
}
static void test_rows(void) {
    enum { rows = 6, n = 10, C = 5, CD = 40 };
    int32_t idx[n];
    for (int i = 0; i < n; i++) idx[i] = (int32_t)rng_below(&R, rows - 1); // row rows-1 never hit
    idx[7] = idx[2]; // a repeated row
    float *inp = fnew(rows * C), *out = fnew(n * C), *want = fnew(n * C), *dout = fnew(n * C);
    fill_normal(inp, rows * C, 1);
    fill_normal(dout, n * C, 1);
    // gather_rows; its backward is scatter_add_rows (dinp[idx[i]] += dout[i])
    for (int i = 0; i < n; i++) memcpy(want + i * C, inp + idx[i] * C, C * sizeof(float));
    fill_nan(out, n * C);
    be->gather_rows(out, inp, idx, n, C);
    check_exact("gather_rows", out, want, n * C);
    float *g = fnew(rows * C);
    oracle_scatter_add_rows(g, dout, idx, NULL, n, C);
    RowCtx gc = {inp, NULL, out, NULL, dout, idx, n, rows, C};
    fd_check("gather_rows backward (scatter_add_rows)", gather_loss, &gc, inp, rows * C, g);

    // scatter_add_rows with and without scale, into pre-filled rows
    float *src = fnew(n * C), *scale = fnew(n), *pre = fnew(rows * C), *acc = fnew(rows * C),
          *dacc = fnew(rows * C);
    fill_normal(src, n * C, 1);
    fill_normal(scale, n, 1);
    fill_normal(pre, rows * C, 1);
    fill_normal(dacc, rows * C, 1);
    double *ref = dnew(rows * C), *mag = dnew(rows * C);
    for (int with_scale = 0; with_scale < 2; with_scale++) {
        for (int i = 0; i < rows * C; i++) {
            ref[i] = pre[i];
            mag[i] = fabs(pre[i]);
        }
        for (int i = 0; i < n; i++)
            for (int c = 0; c < C; c++) {
                double t = (with_scale ? (double)scale[i] : 1.0) * src[i * C + c];
                ref[idx[i] * C + c] += t;
                mag[idx[i] * C + c] += fabs(t);
            }
        memcpy(acc, pre, rows * C * sizeof(float));
        oracle_scatter_add_rows(acc, src, idx, with_scale ? scale : NULL, n, C);
        check_arr(with_scale ? "oracle scatter_add_rows (scale)" : "oracle scatter_add_rows (scale NULL)",
                  acc, ref, mag, rows * C, FWD_RTOL, 1e-30);
    }
    // the combine backward built from these ops (as moe.c did): dsrc = scale * gather(dacc),
    // dscale = row_dot(gather(dacc), src)
    float *gd = fnew(n * C), *dsrc = fnew(n * C), *dscale = fnew(n);
    be->gather_rows(gd, dacc, idx, n, C);
    fill_nan(dscale, n);
    oracle_row_dot(dscale, gd, src, n, C);
    memcpy(dsrc, gd, n * C * sizeof(float));
    oracle_scale_rows(dsrc, scale, n, C);
    // ... and the fused op moe.c calls: the same floats, bit for bit
    float *fo = fnew(n * C), *fd = fnew(n);
    fill_nan(fo, n * C);
    fill_nan(fd, n);
    be->gather_dot_scale(fo, fd, dacc, idx, src, scale, n, C, 0);
    EXPECT(!memcmp(fo, dsrc, sizeof(float) * n * C) && !memcmp(fd, dscale, sizeof(float) * n),
           "gather_dot_scale differs from gather_rows + row_dot + scale_rows");
    // into the hidden format, float32 on the cpu (Backend.hid FMT_F32): the same floats; gather_rows_hid from
    // float32 or from rows of the format: gather_rows
    fill_nan(fo, n * C);
    fill_nan(fd, n);
    be->gather_dot_scale(fo, fd, dacc, idx, src, scale, n, C, 1);
    EXPECT(be->hid == FMT_F32 && !memcmp(fo, dsrc, sizeof(float) * n * C) &&
               !memcmp(fd, dscale, sizeof(float) * n),
           "gather_dot_scale into the (float32) hidden format differs");
    for (int h = 0; h < 2; h++) {
        fill_nan(fo, n * C);
        be->gather_rows_hid(fo, dacc, h, idx, n, C);
        EXPECT(!memcmp(fo, gd, sizeof(float) * n * C),
               "gather_rows_hid (from_hid %d) differs from gather_rows", h);
    }
    free(fo);
    free(fd);
    RowCtx sc = {src, scale, acc, pre, dacc, idx, n, rows, C};
    fd_check("scatter_add_rows backward dinp (gather + scale_rows)", scatter_loss, &sc, src, n * C, dsrc);
    fd_check("scatter_add_rows backward dscale (gather + row_dot)", scatter_loss, &sc, scale, n, dscale);

    // scale_rows
    float *x = fnew(n * C);
    fill_normal(x, n * C, 1);
    double *xr = dnew(n * C);
    for (int i = 0; i < n; i++)
        for (int c = 0; c < C; c++) xr[i * C + c] = (double)x[i * C + c] * scale[i];
    oracle_scale_rows(x, scale, n, C);
    check_arr("oracle scale_rows", x, xr, NULL, n * C, FWD_RTOL, 1e-30);

    // row_dot over rows of CD
    float *a = fnew(n * CD), *b = fnew(n * CD), *dot = fnew(n);
    fill_normal(a, n * CD, 1);
    fill_normal(b, n * CD, 1);
    double dref[n], dmag[n];
    for (int i = 0; i < n; i++) {
        dref[i] = dmag[i] = 0;
        for (int c = 0; c < CD; c++) {
            double t = (double)a[i * CD + c] * b[i * CD + c];
            dref[i] += t;
            dmag[i] += fabs(t);
        }
    }
    fill_nan(dot, n);
    oracle_row_dot(dot, a, b, n, CD);
    check_arr("oracle row_dot", dot, dref, dmag, n, FWD_RTOL, 1e-30);

    // mul (and aliased out == a), axpy, oracle scale
    size_t m = n * CD;
    float *o = fnew(m), *a2 = fcopy(a, m);
    double *mr = dnew(m), *ar = dnew(m), *sr = dnew(m);
    for (size_t i = 0; i < m; i++) mr[i] = (double)a[i] * b[i];
    fill_nan(o, m);
    be->mul(o, a, b, m);
    check_arr("mul", o, mr, NULL, m, FWD_RTOL, 1e-30);
    be->mul(a2, a2, b, m);
    check_arr("mul (out aliases a)", a2, mr, NULL, m, FWD_RTOL, 1e-30);
    double *amag = dnew(m);
    for (size_t i = 0; i < m; i++) {
        ar[i] = (double)a[i] + 0.37 * (double)b[i];
        amag[i] = fabs(a[i]) + fabs(0.37 * b[i]);
    }
    float *y = fcopy(a, m);
    be->axpy(y, b, 0.37f, m);
    check_arr("axpy", y, ar, amag, m, FWD_RTOL, 1e-30);
    for (size_t i = 0; i < m; i++) sr[i] = (double)a[i] * -1.7f;
    float *s2 = fcopy(a, m);
    oracle_scale(s2, -1.7f, m);
    check_arr("oracle scale", s2, sr, NULL, m, FWD_RTOL, 1e-30);

    free(inp);
    free(out);
    free(want);
    free(dout);
    free(g);
    free(src);
    free(scale);
    free(pre);
    free(acc);
    free(dacc);
    free(ref);
    free(mag);
    free(gd);
    free(dsrc);
    free(dscale);
    free(x);
    free(xr);
    free(a);
    free(b);
    free(dot);
    free(o);
    free(a2);
    free(mr);
    free(ar);
    free(sr);
    free(amag);
    free(y);
    free(s2);
}

// ---------------------------------------------------------------- cross-entropy
typedef struct {
    float *logits, *losses;
    const int32_t *tg;
    int N, V;
    float dloss;
} CeCtx;
static double ce_loss(void *p) {
    CeCtx *c = p;
    be->cross_entropy_fwd(c->losses, c->logits, c->tg, c->N, c->V);
    double s = 0;
    for (int i = 0; i < c->N; i++) s += (double)c->dloss * c->losses[i];
    return s;
}
// combine_rows: out[t] (+)= sum_j (w ? w[t,j] : 1) * rows[slot_row[t,j]], slots in order j, dropped
// slots (-1) skipped, then with res res[t] + that (one rounding more: an add after). Against a double
// reference (FWD_RTOL of the terms' magnitudes), against the contract's exact float order (bit for bit),
// against the scatter_add_rows formulation it replaces (the MoE combine: every kept row once), and its
// gradients by finite differences.
typedef struct {
    float *rows, *w, *out;
    const float *dout;
    const int32_t *sr;
    int N, k, C;
} CombCtx;
static double comb_loss(void *p) {
    CombCtx *c = p;
    be->combine_rows(c->out, NULL, c->rows, c->sr, c->w, c->N, c->k, c->C, 0);
    return dot_d(c->dout, c->out, (size_t)c->N * c->C);
}
static void test_combine_rows(int N, int k, int C, int M) {
    // slot_row: a random assignment of rows to slots; slot (t,j) -> -1 with probability 1/4, every
    // slot of token 1 dropped, some rows used twice (the op allows it), some rows unused
    int32_t *sr = xcalloc((size_t)N * k, sizeof(int32_t));
    for (int i = 0; i < N * k; i++) sr[i] = rng_below(&R, 4) == 0 ? -1 : (int32_t)rng_below(&R, (uint32_t)M);
    if (N > 1)
        for (int j = 0; j < k; j++) sr[k + j] = -1;
    float *rows = fnew((size_t)M * C), *w = fnew((size_t)N * k), *pre = fnew((size_t)N * C),
          *out = fnew((size_t)N * C);
    fill_normal(rows, (size_t)M * C, 1);
    fill_normal(w, (size_t)N * k, 1);
    fill_normal(pre, (size_t)N * C, 1);
    double *ref = dnew((size_t)N * C), *mag = dnew((size_t)N * C);
    float *exact = fnew((size_t)N * C);
    char name[96];
    float *res = fnew((size_t)N * C);
    fill_normal(res, (size_t)N * C, 1);
    for (int rs = 0; rs < 2; rs++)
        for (int acc = 0; acc < 2; acc++)
            for (int ws = 0; ws < 2; ws++) {
                for (int t = 0; t < N; t++)
                    for (int c = 0; c < C; c++) {
                        size_t o = (size_t)t * C + c;
                        ref[o] = acc ? pre[o] : 0;
                        mag[o] = fabs(ref[o]);
                        float e = acc ? pre[o] : 0.0f;
                        for (int j = 0; j < k; j++) {
                            int32_t r = sr[(size_t)t * k + j];
                            if (r < 0) continue;
                            float sc = ws ? w[(size_t)t * k + j] : 1.0f;
                            double term = (double)sc * rows[(size_t)r * C + c];
                            ref[o] += term;
                            mag[o] += fabs(term);
                            e += sc * rows[(size_t)r * C + c];
                        }
                        if (rs) { // the residual last: res + (the sum as rounded)
                            ref[o] += res[o];
                            mag[o] += fabs(res[o]);
                            e = res[o] + e;
                        }
                        exact[o] = e;
                    }
                if (acc) memcpy(out, pre, sizeof(float) * N * C);
                else fill_nan(out, (size_t)N * C);
                be->combine_rows(out, rs ? res : NULL, rows, sr, ws ? w : NULL, N, k, C, acc);
                snprintf(name, sizeof name, "combine_rows N=%d k=%d C=%d (%s, %s%s)", N, k, C,
                         ws ? "w" : "w NULL", acc ? "accumulate" : "overwrite", rs ? ", res" : "");
                check_arr(name, out, ref, mag, (size_t)N * C, FWD_RTOL, 1e-30);
                snprintf(name, sizeof name, "combine_rows N=%d k=%d C=%d (%s, %s%s): slot order", N, k, C,
                         ws ? "w" : "w NULL", acc ? "accumulate" : "overwrite", rs ? ", res" : "");
                check_exact(name, out, exact, (size_t)N * C);
            }
    free(res);
    // gradients of L = <dout, out>: d rows[r] = sum over slots (t,j) -> r of w[t,j] dout[t] (a
    // scatter-add of dout by token, which is how moe.c's backward gets it), d w[t,j] = <dout[t], rows[r]>
    float *dout = fnew((size_t)N * C), *drows = fnew((size_t)M * C), *dw = fnew((size_t)N * k);
    fill_normal(dout, (size_t)N * C, 1);
    int32_t *tok = xcalloc((size_t)N * k, sizeof(int32_t)), *rr = xcalloc((size_t)N * k, sizeof(int32_t));
    float *sc = fnew((size_t)N * k), *gd = fnew((size_t)N * k * C);
    int n = 0;
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++)
            if (sr[(size_t)t * k + j] >= 0) {
                tok[n] = t;
                rr[n] = sr[(size_t)t * k + j];
                sc[n] = w[(size_t)t * k + j];
                n++;
            }
    be->gather_rows(gd, dout, tok, n, C);
    oracle_scale_rows(gd, sc, n, C);
    oracle_scatter_add_rows(drows, gd, rr, NULL, n, C);
    for (int t = 0; t < N; t++)
        for (int j = 0; j < k; j++) {
            int32_t r = sr[(size_t)t * k + j];
            double d = 0;
            if (r >= 0)
                for (int c = 0; c < C; c++) d += (double)dout[(size_t)t * C + c] * rows[(size_t)r * C + c];
            dw[(size_t)t * k + j] = (float)d;
        }
    CombCtx cc = {rows, w, out, dout, sr, N, k, C};
    snprintf(name, sizeof name, "combine_rows N=%d k=%d C=%d backward d rows", N, k, C);
    fd_check(name, comb_loss, &cc, rows, (size_t)M * C, drows);
    snprintf(name, sizeof name, "combine_rows N=%d k=%d C=%d backward d w", N, k, C);
    fd_check(name, comb_loss, &cc, w, (size_t)N * k, dw);
    // the MoE combine it replaces: rows sorted by expert, each kept slot its own row; the old path
    // zeroed y and scatter-added rows (rowtok, rowscale) in row order; the same sums in another order
    {
        int32_t *perm = xcalloc((size_t)N * k, sizeof(int32_t)),
                *sr2 = xcalloc((size_t)N * k, sizeof(int32_t));
        int32_t *rowtok = xcalloc((size_t)N * k, sizeof(int32_t));
        float *rowsc = fnew((size_t)N * k), *rows2 = fnew((size_t)N * k * C), *y_old = fnew((size_t)N * C);
        fill_normal(rows2, (size_t)N * k * C, 1);
        for (int i = 0; i < N * k; i++) perm[i] = i;
        for (int i = N * k - 1; i > 0; i--) {
            int q = (int)rng_below(&R, (uint32_t)i + 1), tq = perm[i];
            perm[i] = perm[q];
            perm[q] = tq;
        }
        int Mk = 0; // kept rows: slot i -> row perm[i] compacted
        for (int i = 0; i < N * k; i++) sr2[i] = sr[i] < 0 ? -1 : 0;
        for (int i = 0; i < N * k; i++)
            if (sr2[perm[i]] == 0) {
                sr2[perm[i]] = Mk;
                rowtok[Mk] = perm[i] / k;
                rowsc[Mk] = w[perm[i]];
                Mk++;
            }
        oracle_scatter_add_rows(y_old, rows2, rowtok, rowsc, Mk, C);
        fill_nan(out, (size_t)N * C);
        be->combine_rows(out, NULL, rows2, sr2, w, N, k, C, 0);
        double *r2 = dnew((size_t)N * C), *m2 = dnew((size_t)N * C);
        for (int i = 0; i < Mk; i++)
            for (int c = 0; c < C; c++) {
                double term = (double)rowsc[i] * rows2[(size_t)i * C + c];
                r2[(size_t)rowtok[i] * C + c] += term;
                m2[(size_t)rowtok[i] * C + c] += fabs(term);
            }
        snprintf(name, sizeof name, "combine_rows N=%d k=%d C=%d vs scatter_add_rows (MoE combine)", N, k, C);
        check_arr(name, out, r2, m2, (size_t)N * C, FWD_RTOL, 1e-30);
        double *yo = dnew((size_t)N * C);
        for (size_t i = 0; i < (size_t)N * C; i++) yo[i] = y_old[i];
        check_arr(name, out, yo, m2, (size_t)N * C, FWD_RTOL, 1e-30);
        free(perm);
        free(sr2);
        free(rowtok);
        free(rowsc);
        free(rows2);
        free(y_old);
        free(r2);
        free(m2);
        free(yo);
    }
    free(sr);
    free(rows);
    free(w);
    free(pre);
    free(out);
    free(ref);
    free(mag);
    free(exact);
    free(dout);
    free(drows);
    free(dw);
    free(tok);
    free(rr);
    free(sc);
    free(gd);
}

// router_topk against a double-precision reference (softmax, top-k by probability with ties to the
// lower index, renormalised weights; 1e-6 relative: float32 exp and one division), and the sums
// against the row sums of the op's own outputs; router_bwd reading dw through a plan with dropped
// slots (slot_row -1) against router.c's router_backward_ex given dw directly, bit for bit.
// plan_counts + plan_rows against router.c's plan_build_budget (checked against a brute force in
// test_router): the same rows in the same order, dropless (keep = counts) and with capacity budgets
// (router_budget for one process), on random choices with empty experts.
static void test_plan_ops(int N, int E, int k, int capacity) {
    int32_t *idx = xcalloc((size_t)N * k, sizeof(int32_t)), *rank = xcalloc((size_t)N * k, sizeof(int32_t));
    int32_t *cnt = xcalloc((size_t)k * E, sizeof(int32_t)), *kf = xcalloc((size_t)2 * k * E, sizeof(int32_t));
    float *w = fnew((size_t)N * k), *rs = fnew((size_t)N * k);
    int32_t *sr = xcalloc((size_t)N * k, sizeof(int32_t)), *rt = xcalloc((size_t)N * k, sizeof(int32_t));
    fill_normal(w, (size_t)N * k, 1);
    for (int t = 0; t < N; t++) // k distinct experts per token, from the first E - 1 (the last stays empty)
        for (int j = 0; j < k; j++) {
            int e, dup;
            do {
                e = (int)(rng_u64(&R) % (uint64_t)(E > 1 ? E - 1 : 1));
                dup = 0;
                for (int i = 0; i < j; i++) dup |= idx[(size_t)t * k + i] == e;
            } while (dup && k < E);
            idx[(size_t)t * k + j] = e;
        }
    be->plan_counts(cnt, rank, idx, N, E, k);
    int64_t *c64 = xcalloc((size_t)k * E, sizeof(int64_t)), *budget = xcalloc((size_t)k * E, sizeof(int64_t));
    router_slot_counts(idx, N, E, k, c64);
    int same = 1;
    for (size_t q = 0; q < (size_t)k * E; q++) same &= cnt[q] == c64[q];
    EXPECT(same, "plan_counts N=%d E=%d k=%d: counts differ from router_slot_counts", N, E, k);
    router_budget(c64, 1, 0, E, k, capacity < 0 ? (int64_t)N * k : capacity, budget);
    DispatchPlan p;
    plan_alloc(&p, N, E, k);
    plan_build_budget(&p, idx, N, E, k, capacity < 0 ? NULL : budget);
    int32_t *keep = kf, *first = kf + (size_t)k * E;
    for (int e = 0, o = 0; e < E; e++)
        for (int j = 0; j < k; j++) {
            size_t q = (size_t)j * E + e;
            keep[q] = capacity < 0 ? cnt[q] : (int32_t)budget[q];
            first[q] = o;
            o += keep[q];
        }
    for (int i = 0; i < N * k; i++) {
        rt[i] = -7;
        rs[i] = NAN;
    }
    be->plan_rows(sr, rt, rs, rank, idx, w, keep, first, N, E, k);
    int ok =
        !memcmp(sr, p.slot_row, sizeof(int32_t) * N * k) && !memcmp(rt, p.row_tok, sizeof(int32_t) * p.M);
    for (int r = 0; r < p.M; r++) ok &= rs[r] == w[(size_t)p.row_tok[r] * k + p.row_slot[r]];
    EXPECT(ok, "plan_rows N=%d E=%d k=%d capacity %d: rows differ from plan_build_budget's (M %d)", N, E, k,
           capacity, p.M);
    plan_free(&p);
    free(idx);
    free(rank);
    free(cnt);
    free(kf);
    free(w);
    free(rs);
    free(sr);
    free(rt);
    free(c64);
    free(budget);
}

static void test_router_ops(int N, int E, int k, int renorm) {
    float *lg = fnew((size_t)N * E);
    fill_normal(lg, (size_t)N * E, 2);
    float *p1 = fnew((size_t)N * E), *l1 = fnew(N), *w1 = fnew((size_t)N * k);
    int32_t *i1 = xcalloc((size_t)N * k, sizeof(int32_t));
    double *sums = dnew(E + 1), *sref = dnew(E + 1), *smag = dnew(E + 1), *pd = dnew(E);
    fill_nan(p1, (size_t)N * E);
    fill_nan(l1, N);
    fill_nan(w1, (size_t)N * k);
    for (int i = 0; i < E + 1; i++) sums[i] = NAN;
    be->router_topk(p1, l1, i1, w1, sums, lg, NULL, N, E, (RouteRule){.k = k, .renorm = renorm});
    char name[96];
    snprintf(name, sizeof name, "router_topk N=%d E=%d k=%d renorm=%d", N, E, k, renorm);
    int badp = 0, badi = 0, badw = 0;
    for (int t = 0; t < N; t++) {
        const float *x = lg + (size_t)t * E;
        double mx = -INFINITY, z = 0;
        for (int e = 0; e < E; e++)
            if (x[e] > mx) mx = x[e];
        for (int e = 0; e < E; e++) z += exp((double)x[e] - mx);
        for (int e = 0; e < E; e++) {
            pd[e] = exp((double)x[e] - mx) / z;
            badp += !(fabs(p1[(size_t)t * E + e] - pd[e]) <= 1e-6 * pd[e] + 1e-12);
        }
        badp += !(fabs(l1[t] - (mx + log(z))) <= 1e-6 * fabs(mx + log(z)) + 1e-6);
        double wsum = 0;
        int chosen[64] = {0};
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!chosen[e] && (best < 0 || pd[e] > pd[best])) best = e;
            chosen[best] = 1;
            badi += i1[(size_t)t * k + j] != best;
            wsum += pd[best];
        }
        for (int j = 0; j < k; j++) {
            double wr = pd[i1[(size_t)t * k + j]] / (renorm ? wsum : 1.0);
            badw += !(fabs(w1[(size_t)t * k + j] - wr) <= 1e-6 * wr + 1e-12);
        }
    }
    EXPECT(!badp && !badi && !badw, "%s: %d probs/lse, %d choices, %d weights off the double reference", name,
           badp, badi, badw);
    for (int t = 0; t < N; t++) {
        for (int e = 0; e < E; e++) {
            sref[e] += p1[(size_t)t * E + e];
            smag[e] += p1[(size_t)t * E + e];
        }
        sref[E] += (double)l1[t] * l1[t];
        smag[E] += (double)l1[t] * l1[t];
    }
    int bad = 0;
    for (int e = 0; e <= E; e++) bad += !(fabs(sums[e] - sref[e]) <= 1e-12 * smag[e] + 1e-300);
    EXPECT(!bad, "%s: %d of %d sums differ from the row sums", name, bad, E + 1);
    // backward: rowdot of M rows, slot_row with dropped slots
    int M = N * k;
    int32_t *sr = xcalloc((size_t)N * k, sizeof(int32_t));
    for (int i = 0; i < N * k; i++) sr[i] = rng_below(&R, 5) == 0 ? -1 : (int32_t)rng_below(&R, (uint32_t)M);
    float *rowdot = fnew(M), *dw = fnew((size_t)N * k), *aux = fnew(E), *d1 = fnew((size_t)N * E),
          *d2 = fnew((size_t)N * E);
    fill_normal(rowdot, M, 1);
    fill_normal(aux, E, 0.1f);
    for (int i = 0; i < N * k; i++) dw[i] = sr[i] >= 0 ? rowdot[sr[i]] : 0.0f;
    router_backward_ex(d1, dw, p1, l1, i1, w1, N, E, k, renorm, aux, 0.37f);
    fill_nan(d2, (size_t)N * E);
    be->router_bwd(d2, rowdot, sr, p1, l1, i1, w1, aux, 0.37f, N, E, (RouteRule){.k = k, .renorm = renorm});
    snprintf(name, sizeof name, "router_bwd N=%d E=%d k=%d renorm=%d vs router_backward_ex", N, E, k, renorm);
    check_exact(name, d2, d1, (size_t)N * E);
    free(lg);
    free(p1);
    free(l1);
    free(w1);
    free(i1);
    free(sums);
    free(sref);
    free(smag);
    free(pd);
    free(sr);
    free(rowdot);
    free(dw);
    free(aux);
    free(d1);
    free(d2);
}

// The vocab-parallel cross-entropy (ops.h ce_part / ce_finish) on test_cross_entropy's rows (N 6, V 37): one
// block gives cross_entropy_fwd_bwd's bits (want: its dlogits; with dloss 0 cross_entropy_fwd's, the logits
// untouched); three uneven column blocks, each row's target in one of them (in the others below 0 or past the
// block), their parts gathered in block order, give the double reference's losses and each block's columns of
// its dlogits.
static void test_ce_parts(const float *lg, const int32_t *tg, float dloss, const float *want,
                          const double *lref, const double *lmag, const double *gref, const double *gmag) {
    enum { N = 6, V = 37, NB = 3 };
    const int b0[NB + 1] = {0, 10, 25, V};
    double *part = dnew(NB * 3 * N);
    float *x = fcopy(lg, N * V), *y = fcopy(lg, N * V), *l1 = fnew(N), *l0 = fnew(N);
    be->ce_part(part, x, tg, N, V);
    be->ce_finish(l1, x, part, tg, N, V, 1, dloss);
    be->cross_entropy_fwd_bwd(l0, y, tg, N, V, dloss);
    EXPECT(!floats_differ(l1, l0, N) && !floats_differ(x, want, (size_t)N * V),
           "ce_part + ce_finish of one block: cross_entropy_fwd_bwd's losses and dlogits bit for bit");
    memcpy(x, lg, sizeof(float) * N * V);
    be->ce_finish(l1, x, part, tg, N, V, 1, 0);
    be->cross_entropy_fwd(l0, lg, tg, N, V);
    EXPECT(!floats_differ(l1, l0, N) && !floats_differ(x, lg, (size_t)N * V),
           "ce_finish with dloss 0: cross_entropy_fwd's losses bit for bit, the logits untouched");
    float *blk[NB];
    int32_t *tb[NB];
    for (int b = 0; b < NB; b++) {
        int Vb = b0[b + 1] - b0[b];
        blk[b] = fnew(N * Vb);
        tb[b] = malloc(sizeof(int32_t) * N);
        for (int i = 0; i < N; i++) {
            memcpy(blk[b] + i * Vb, lg + i * V + b0[b], sizeof(float) * Vb);
            tb[b][i] = tg[i] - b0[b];
        }
        be->ce_part(part + (size_t)b * 3 * N, blk[b], tb[b], N, Vb);
    }
    for (int b = 0; b < NB; b++) {
        int Vb = b0[b + 1] - b0[b];
        double *gr = dnew(N * Vb), *gm = dnew(N * Vb);
        for (int i = 0; i < N; i++)
            for (int j = 0; j < Vb; j++) {
                gr[i * Vb + j] = gref[i * V + b0[b] + j];
                gm[i * Vb + j] = gmag[i * V + b0[b] + j];
            }
        fill_nan(l1, N);
        be->ce_finish(l1, blk[b], part, tb[b], N, Vb, NB, dloss);
        char what[96];
        snprintf(what, sizeof what, "ce_finish over 3 blocks: block %d's losses", b);
        check_arr(what, l1, lref, lmag, N, FWD_RTOL, 1e-30);
        snprintf(what, sizeof what, "ce_finish over 3 blocks: block %d's dlogits (columns %d..%d)", b, b0[b],
                 b0[b + 1] - 1);
        check_arr(what, blk[b], gr, gm, N * Vb, FWD_RTOL, 1e-12);
        free(gr);
        free(gm);
        free(blk[b]);
        free(tb[b]);
    }
    free(part);
    free(x);
    free(y);
    free(l1);
    free(l0);
}

static void test_cross_entropy(void) {
    enum { N = 6, V = 37 };
    const float dloss = 0.37f;
    int32_t tg[N];
    for (int i = 0; i < N; i++) tg[i] = (int32_t)rng_below(&R, V);
    tg[1] = 0;
    tg[2] = V - 1;
    tg[4] = 10; // (test_ce_parts: the first and last column of its middle block)
    tg[5] = 24;
    float *lg = fnew(N * V), *losses = fnew(N);
    fill_normal(lg, N * V, 3);
    lg[3 * V + tg[3]] = 30; // a confident correct row (loss ~ 0)
    double lref[N], lmag[N], *gref = dnew(N * V), *gmag = dnew(N * V);
    for (int i = 0; i < N; i++) {
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++)
            if (lg[i * V + j] > mx) mx = lg[i * V + j];
        for (int j = 0; j < V; j++) s += exp((double)lg[i * V + j] - mx);
        double l = mx + log(s);
        lref[i] = l - lg[i * V + tg[i]];
        lmag[i] = fabs(l) + fabs(lg[i * V + tg[i]]);
        for (int j = 0; j < V; j++) {
            double pr = exp((double)lg[i * V + j] - l), oh = j == tg[i];
            gref[i * V + j] = (pr - oh) * dloss;
            gmag[i * V + j] = (pr + oh) * dloss;
        }
    }
    fill_nan(losses, N);
    be->cross_entropy_fwd(losses, lg, tg, N, V);
    check_arr("cross_entropy_fwd", losses, lref, lmag, N, FWD_RTOL, 1e-30);
    float *lg2 = fcopy(lg, N * V);
    fill_nan(losses, N);
    be->cross_entropy_fwd_bwd(losses, lg2, tg, N, V, dloss);
    check_arr("cross_entropy_fwd_bwd losses", losses, lref, lmag, N, FWD_RTOL, 1e-30);
    check_arr("cross_entropy_fwd_bwd dlogits vs (softmax - onehot) * dloss", lg2, gref, gmag, N * V, FWD_RTOL,
              1e-12);
    EXPECT(be->hid == FMT_F32, "the cpu's hidden format is not float32: its dlogits above are float32 rows");
    CeCtx c = {lg, losses, tg, N, V, dloss};
    fd_check("cross_entropy_fwd_bwd dlogits vs finite differences", ce_loss, &c, lg, N * V, lg2);
    test_ce_parts(lg, tg, dloss, lg2, lref, lmag, gref, gmag);
    free(lg);
    free(losses);
    free(gref);
    free(gmag);
    free(lg2);
}

// ---------------------------------------------------------------- sumsq, adamw of one tensor
// A run list of one run (0, n): what a single-tensor sumsq / adamw was.
static OptRuns *one_run(size_t n, int decay) {
    OptRun r = {0, 0, (int64_t)n, (int32_t)decay, 0, 0, 0, 0, 0, OPTG_F32, 0};
    return be->runs_create(&r, 1);
}

// sumsq_runs of one tensor against a double sum in reverse order (1e-12 relative), and bitwise the
// cpu's chunked sum (cpu_oracle.h, the reference the GPU test compares with).
static void test_sumsq(void) {
    size_t sizes[] = {0, 1, 7, 40000}; // 40000 spans several of the kernel's chunks
    for (int s = 0; s < 4; s++) {
        size_t n = sizes[s];
        float *x = fnew(n);
        fill_normal(x, n, 2);
        double ref = 0;
        for (size_t i = n; i-- > 0;) ref += (double)x[i] * x[i]; // reverse order: independent
        OptRuns *h = one_run(n, 0);
        double got = NAN, want = oracle_sumsq(x, n);
        be->sumsq_runs(&got, 1, x, h);
        be->runs_free(h);
        char lab[64];
        snprintf(lab, sizeof lab, "sumsq n=%zu (double accumulator)", n);
        EXPECT_NEAR(got, ref, 1e-12 * ref, lab);
        EXPECT(memcmp(&got, &want, sizeof got) == 0, "%s: %.17g, cpu_oracle.h sumsq %.17g", lab, got, want);
        free(x);
    }
}

static void test_adamw(int t, float wd, int zero_state, int zero_grad) {
    enum { n = 40 };
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f;
    float *p = fnew(n), *g = fnew(n), *m = fnew(n), *v = fnew(n);
    fill_normal(p, n, 1);
    if (!zero_grad) fill_normal(g, n, 0.1f);
    if (!zero_grad) g[3] = 0;
    if (!zero_state) {
        fill_normal(m, n, 0.05f);
        for (int i = 0; i < n; i++) v[i] = 0.01f * fabsf(rng_normal(&R));
    }
    double pr[n], mr[n], vr[n], pm[n], mm[n], vm[n];
    double c1 = 1 - pow(b1, t), c2 = 1 - pow(b2, t);
    for (int i = 0; i < n; i++) {
        mr[i] = (double)b1 * m[i] + (1 - (double)b1) * g[i];
        vr[i] = (double)b2 * v[i] + (1 - (double)b2) * (double)g[i] * g[i];
        double upd = (mr[i] / c1) / (sqrt(vr[i] / c2) + eps);
        pr[i] = p[i] - lr * (upd + (double)wd * p[i]); // decoupled decay on the old p
        pm[i] = fabs(p[i]) + lr * (fabs(upd) + fabs((double)wd * p[i]));
        mm[i] = fabs((double)b1 * m[i]) + fabs((1 - (double)b1) * g[i]);
        vm[i] = fabs((double)b2 * v[i]) + fabs((1 - (double)b2) * (double)g[i] * g[i]);
    }
    OptRuns *h = one_run(n, 1);
    be->adamw_runs(p, g, m, v, h, 1.0f, lr, b1, b2, eps, wd, t, OPT_MIXED, 0);
    be->runs_free(h);
    char lab[96];
    snprintf(lab, sizeof lab, "adamw p (t=%d wd=%g%s%s)", t, wd, zero_state ? " fresh" : "",
             zero_grad ? " g=0" : "");
    check_arr(lab, p, pr, pm, n, FWD_RTOL, 1e-30);
    snprintf(lab, sizeof lab, "adamw m (t=%d)", t);
    check_arr(lab, m, mr, mm, n, FWD_RTOL, 1e-30);
    snprintf(lab, sizeof lab, "adamw v (t=%d)", t);
    check_arr(lab, v, vr, vm, n, FWD_RTOL, 1e-30);
    free(p);
    free(g);
    free(m);
    free(v);
}

// ---------------------------------------------------------------- multi-tensor runs: sumsq_runs, adamw_runs
// Run lists: tests/test_runs.h.

// Per class: a double sum in reverse order (independent of the op's order), to 1e-12 relative
// (double accumulation of <= 50000 terms: ~n * 1e-16); and bitwise the per-run sumsq() values added
// in list order (cpu_oracle.h), which is what keeps the trainer's gradient norm unchanged on the cpu.
static void test_sumsq_runs(size_t N, int maxlen, int ncls) {
    OptRun runs[4096];
    size_t mt;
    int nr = test_gen_runs(&R, runs, 4096, N, (size_t)maxlen, ncls, 0, &mt);
    float *x = fnew(N);
    fill_normal(x, N, 2);
    OptRuns *h = be->runs_create(runs, nr);
    double got[9], ref[9], seq[9];
    for (int c = 0; c < 9; c++) got[c] = NAN, ref[c] = seq[c] = 0;
    be->sumsq_runs(got, ncls, x, h);
    for (int i = nr; i-- > 0;)
        for (int64_t j = runs[i].n; j-- > 0;)
            ref[runs[i].cls] += (double)x[runs[i].off + j] * x[runs[i].off + j];
    for (int i = 0; i < nr; i++) seq[runs[i].cls] += oracle_sumsq(x + runs[i].off, (size_t)runs[i].n);
    char lab[96];
    for (int c = 0; c < ncls; c++) {
        snprintf(lab, sizeof lab, "sumsq_runs N=%zu %d runs class %d", N, nr, c);
        EXPECT_NEAR(got[c], ref[c], 1e-12 * ref[c], lab);
        EXPECT(memcmp(&got[c], &seq[c], sizeof(double)) == 0, "%s: %.17g, per-run sumsq in order %.17g", lab,
               got[c], seq[c]);
    }
    be->runs_free(h);
    OptRuns *e = be->runs_create(NULL, 0); // an empty list: zeros
    be->sumsq_runs(got, 3, x, e);
    EXPECT(got[0] == 0 && got[1] == 0 && got[2] == 0, "sumsq_runs of no runs: %g %g %g", got[0], got[1],
           got[2]);
    be->runs_free(e);
    free(x);
}

// Against a double reference per element (as test_adamw, with the gradient g * gscale rounded to
// float: that rounding is the op's contract), FWD_RTOL; elements outside every run and g itself
// bitwise unchanged; and bitwise equal to scale() on each run's gradient then adamw() per run (the
// unfused sequence the trainer ran before, so its results are unchanged).
// ---------------------------------------------------------------- the bf16 policy (ops.h OPT_BF16_*)
// The rounding of weights through the cpu's adamw_runs with lr 0 (the pre-rounding value is p itself):
// x lies between two bf16 neighbours lo < hi at fraction q. Stochastic: the mean over n draws (n elements of
// one call: their global indices pick the bits; and one element over n steps t) is x within 4 standard
// errors (hi - lo) sqrt(q (1 - q) / n), both neighbours occur, nothing else; nearest: always the nearer one.
// Also the integer roundings themselves: nearest even on ties, exact bf16 values kept, NaN kept.
static double sr_mean(float x, int prec, int over_t, int n, int *others, float lo, float hi) {
    float *p = fnew((size_t)n), *g = fnew((size_t)n);
    uint16_t *m = calloc((size_t)n, 2), *v = calloc((size_t)n, 2);
    double sum = 0;
    *others = 0;
    if (!over_t) {
        OptRun r = {0, 0, n, 0, 0, 12345, 0, 0, 0, OPTG_F32, 0};
        OptRuns *h = be->runs_create(&r, 1);
        for (int i = 0; i < n; i++) p[i] = x;
        be->adamw_runs(p, g, m, v, h, 1.0f, 0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, 3, prec, 42);
        for (int i = 0; i < n; i++) {
            sum += p[i];
            *others += p[i] != lo && p[i] != hi;
        }
        be->runs_free(h);
    } else {
        OptRun r = {0, 0, 1, 0, 0, 777, 0, 0, 0, OPTG_F32, 0};
        OptRuns *h = be->runs_create(&r, 1);
        for (int t = 1; t <= n; t++) {
            p[0] = x;
            be->adamw_runs(p, g, m, v, h, 1.0f, 0.0f, 0.9f, 0.95f, 1e-8f, 0.0f, t, prec, 42);
            sum += p[0];
            *others += p[0] != lo && p[0] != hi;
        }
        be->runs_free(h);
    }
    free(p);
    free(g);
    free(m);
    free(v);
    return sum / n;
}

// The stochastic rounding's random bits are even: over 2^22 consecutive global indices (one run starting at
// 0, one across 2^32, where the index's high word enters) at two steps, the 4096 bins of their top 12 bits
// pass a chi-square test at 6 standard deviations (the same mix without its last xorshift, the product's
// top 16 bits, gave z 7-10 on such ranges).
static void test_sr_bits_even(void) {
    enum { N = 1 << 22, BINS = 4096 };
    unsigned *cnt = calloc(BINS, sizeof(unsigned));
    for (int c = 0; c < 2; c++) {
        uint64_t key = bf16_sr_key(42 + c, 3 + c);
        int64_t base = c ? ((int64_t)5 << 32) - N / 2 : 0;
        memset(cnt, 0, BINS * sizeof(unsigned));
        for (int64_t i = 0; i < N; i++) cnt[bf16_sr_rand(key, base + i) >> 4]++;
        double e = (double)N / BINS, chi = 0;
        for (int b = 0; b < BINS; b++) chi += (cnt[b] - e) * (cnt[b] - e) / e;
        double z = (chi - (BINS - 1)) / sqrt(2.0 * (BINS - 1));
        EXPECT(fabs(z) < 6,
               "bf16_sr_rand: 2^22 consecutive indices from %lld: chi-square %.0f over %d bins, z %.1f",
               (long long)base, chi, BINS, z);
        printf("bf16_sr_rand over 2^22 indices from %lld: chi-square z %+.2f\n", (long long)base, z);
    }
    free(cnt);
}

static void test_bf16_rounding(void) {
    const float los[3] = {1.0f, -3.140625f, 6.103515625e-05f};
    const double qs[3] = {0.3, 0.9, 0.015625};
    const int n = 20000;
    for (int k = 0; k < 3; k++) {
        float lo = los[k], hi = f32_of_bits(f32_bits(lo) + 0x10000u); // the next bf16 away from zero
        float x = f32_of_bits(f32_bits(lo) + (uint32_t)(qs[k] * 65536));
        double q = ((double)x - lo) / ((double)hi - lo), se = fabs((double)hi - lo) * sqrt(q * (1 - q) / n);
        for (int over_t = 0; over_t < 2; over_t++) {
            int others;
            double mean = sr_mean(x, OPT_BF16_STOCHASTIC, over_t, n, &others, lo, hi);
            EXPECT(fabs(mean - x) <= 4 * se && others == 0,
                   "bf16 stochastic rounding of %.9g (between %.9g and %.9g, "
                   "over %s): mean %.9g, %.2f standard errors off; %d values not a neighbour",
                   x, lo, hi, over_t ? "steps t" : "elements", mean, (mean - x) / se, others);
            double mn = sr_mean(x, OPT_BF16_NEAREST, over_t, n, &others, lo, hi);
            float near = q < 0.5 ? lo : hi;
            EXPECT(mn == near, "bf16 nearest rounding of %.9g over %s: mean %.9g, want always %.9g", x,
                   over_t ? "steps t" : "elements", mn, near);
            printf("bf16 rounding of %.9g (q %.4f) over %-8s: stochastic mean off by %+.2f standard errors "
                   "(se %.3g); "
                   "nearest always %.9g\n",
                   x, q, over_t ? "steps t" : "elements", (mean - x) / se, se, mn);
        }
    }
    // the integer operations: ties to even, bf16 values unchanged by either, NaN stays NaN
    EXPECT(bf16_rn_bits(f32_of_bits(0x3f808000u)) == 0x3f80 &&
               bf16_rn_bits(f32_of_bits(0x3f818000u)) == 0x3f82,
           "bf16_rn_bits: ties must go to even");
    int kept = 1;
    for (uint32_t r = 0; r < 65536; r += 257)
        kept &= bf16_sr_bits(1.5f, r) == 0x3fc0 && bf16_sr_bits(-2.0f, r) == 0xc000;
    EXPECT(kept, "bf16_sr_bits: a bf16 value must stay itself for any random bits");
    EXPECT(isnan(bf16_to_f32(bf16_rn_bits(NAN))) && isnan(bf16_to_f32(bf16_sr_bits(NAN, 0xffff))),
           "bf16 roundings: NaN must stay NaN");
}

// adamw_runs under the bf16 policy on the cpu against a reference built here: the float32 update of
// cpu_oracle.h's oracle_adamw on the widened moments, then the moments rounded to nearest even and each
// weight rounded with the bits of bf16_sr_rand(bf16_sr_key(seed, t), its global index), that index walked
// element by element through the run's column layout (not optrun_gidx's division), so a wrong index, t or
// seed, or a missing rounding, shows; bit for bit. Every p, m, v a bf16 value; g and elements outside the
// runs unchanged.
static void test_adamw_runs_bf16(size_t N, int maxlen, float gscale, int t, int prec) {
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const uint64_t seed = 99 + (uint64_t)t;
    OptRun runs[4096];
    size_t M;
    int nr = test_gen_runs(&R, runs, 4096, N, (size_t)maxlen, 1, 0, &M);
    test_gen_global(&R, runs, nr);
    float *p = fnew(N), *g = fnew(N), *pr = fnew(N), *mf = fnew(M + 1), *vf = fnew(M + 1);
    uint16_t *m = calloc(M + 1, 2), *v = calloc(M + 1, 2), *mr = calloc(M + 1, 2), *vr = calloc(M + 1, 2);
    fill_normal(p, N, 1);
    fill_normal(g, N, 0.1f);
    for (size_t i = 0; i < N; i++) p[i] = bf16_to_f32(bf16_rn_bits(p[i]));
    for (size_t i = 0; i < M; i++) {
        m[i] = bf16_rn_bits(0.05f * rng_normal(&R));
        v[i] = bf16_rn_bits(0.01f * fabsf(rng_normal(&R)));
    }
    float *g0 = fnew(N);
    memcpy(g0, g, N * sizeof(float));
    memcpy(pr, p, N * sizeof(float));
    for (size_t i = 0; i < M; i++) {
        mf[i] = bf16_to_f32(m[i]);
        vf[i] = bf16_to_f32(v[i]);
    }
    for (int r = 0; r < nr; r++) {
        const OptRun *u = &runs[r];
        if (!u->n) continue;
        float *gs = fnew((size_t)u->n);
        memcpy(gs, g + u->off, sizeof(float) * (size_t)u->n);
        if (gscale != 1.0f) oracle_scale(gs, gscale, (size_t)u->n);
        oracle_adamw(pr + u->off, gs, mf + u->moff, vf + u->moff, (size_t)u->n, lr, b1, b2, eps,
                     u->decay ? wd : 0.0f, t);
        int64_t gi = u->gidx, col = u->col0;
        for (int64_t i = 0; i < u->n; i++) {
            mr[u->moff + i] = bf16_rn_bits(mf[u->moff + i]);
            vr[u->moff + i] = bf16_rn_bits(vf[u->moff + i]);
            float x = pr[u->off + i];
            if (prec != OPT_BF16_MOMENTS) // (OPT_BF16_MOMENTS: the float32 update stays)
                pr[u->off + i] = bf16_to_f32(prec == OPT_BF16_STOCHASTIC
                                                 ? bf16_sr_bits(x, bf16_sr_rand(bf16_sr_key(seed, t), gi))
                                                 : bf16_rn_bits(x));
            gi++;
            if (u->lcols && ++col == u->lcols) {
                col = 0;
                gi += u->gcols - u->lcols;
            }
        }
        free(gs);
    }
    // elements outside the runs keep their moments (the reference left them as they were)
    for (size_t i = 0; i < M; i++)
        if (mr[i] == 0 && vr[i] == 0) {
            mr[i] = m[i];
            vr[i] = v[i];
        }
    OptRuns *h = be->runs_create(runs, nr);
    be->adamw_runs(p, g, m, v, h, gscale, lr, b1, b2, eps, wd, t, prec, seed);
    be->runs_free(h);
    char lab[128];
    snprintf(lab, sizeof lab, "adamw_runs bf16 %s p (N=%zu, %d runs, t=%d)",
             prec == OPT_BF16_STOCHASTIC    ? "stochastic"
                 : prec == OPT_BF16_NEAREST ? "nearest"
                                            : "none",
             N, nr, t);
    check_exact(lab, p, pr, N);
    size_t nb = 0, dm = 0;
    for (size_t i = 0; i < N; i++) nb += (f32_bits(p[i]) & 0xffffu) != 0;
    for (size_t i = 0; i < M; i++) dm += m[i] != mr[i] || v[i] != vr[i];
    if (prec != OPT_BF16_MOMENTS) EXPECT(nb == 0, "%s: %zu weights are not bf16 values", lab, nb);
    else EXPECT(nb > 0, "%s: every weight is a bf16 value (rounded after all?)", lab);
    EXPECT(dm == 0, "%s: %zu moments differ from the reference", lab, dm);
    check_exact("adamw_runs bf16 leaves g unchanged", g, g0, N);
    free(p);
    free(g);
    free(pr);
    free(mf);
    free(vf);
    free(m);
    free(v);
    free(mr);
    free(vr);
    free(g0);
}

// The gradient formats (OptRun gbf: float32, bf16 read rounded, bf16 packed; test_gen_formats): sumsq_runs
// and adamw_runs (policy prec) on the formatted buffer give, bit for bit, what they give on the rounded
// values read as float32 (and sumsq differs from the unrounded gradients', so the rounding is seen); g
// unchanged.
static void test_grad_formats(size_t N, int maxlen, int prec) {
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    OptRun runs[4096], plain[4096];
    size_t M;
    int nr = test_gen_runs(&R, runs, 4096, N, (size_t)maxlen, 3, 0, &M);
    test_gen_global(&R, runs, nr);
    float *gf = fnew(N), *gx = fnew(N), *gr = fnew(N), *g0 = fnew(N);
    fill_normal(gf, N, 0.1f);
    size_t changed = test_gen_formats(&R, runs, nr, gf, gx, gr, N);
    memcpy(g0, gx, sizeof(float) * N);
    for (int i = 0; i < nr; i++) {
        plain[i] = runs[i];
        plain[i].gbf = OPTG_F32;
        plain[i].gb = 0;
    }
    OptRuns *h = be->runs_create(runs, nr), *hp = be->runs_create(plain, nr);
    double a[3], b[3], c[3];
    be->sumsq_runs(a, 3, gx, h);
    be->sumsq_runs(b, 3, gr, hp);
    be->sumsq_runs(c, 3, gf, hp);
    char lab[128];
    snprintf(lab, sizeof lab, "grad formats N=%zu, %d runs (%zu elements rounded)", N, nr, changed);
    EXPECT(changed > 0, "%s: no element changed by its rounding (the test sees nothing)", lab);
    EXPECT(!memcmp(a, b, sizeof a),
           "%s: sumsq_runs %.17g %.17g %.17g, on the rounded float32 %.17g %.17g %.17g", lab, a[0], a[1],
           a[2], b[0], b[1], b[2]);
    EXPECT(memcmp(a, c, sizeof a), "%s: sumsq_runs the same as the unrounded gradients' (formats ignored?)",
           lab);
    size_t es = prec == OPT_MIXED ? 4 : 2;
    float *p1 = fnew(N), *p2 = fnew(N);
    void *m1 = calloc(M + 1, es), *v1 = calloc(M + 1, es), *m2 = calloc(M + 1, es), *v2 = calloc(M + 1, es);
    fill_normal(p1, N, 1);
    if (prec != OPT_MIXED)
        for (size_t i = 0; i < N; i++) p1[i] = bf16_to_f32(bf16_rn_bits(p1[i]));
    memcpy(p2, p1, sizeof(float) * N);
    for (int t = 1; t <= 2; t++) {
        be->adamw_runs(p1, gx, m1, v1, h, 0.37f, lr, b1, b2, eps, wd, t, prec, 7);
        be->adamw_runs(p2, gr, m2, v2, hp, 0.37f, lr, b1, b2, eps, wd, t, prec, 7);
    }
    snprintf(lab + strlen(lab), sizeof lab - strlen(lab), ", adamw prec %d", prec);
    check_exact(lab, p1, p2, N);
    EXPECT(!memcmp(m1, m2, es * M) && !memcmp(v1, v2, es * M), "%s: the moments differ", lab);
    EXPECT(!memcmp(gx, g0, sizeof(float) * N), "%s: g changed", lab);
    be->runs_free(h);
    be->runs_free(hp);
    free(gf);
    free(gx);
    free(gr);
    free(g0);
    free(p1);
    free(p2);
    free(m1);
    free(v1);
    free(m2);
    free(v2);
}

// bf16 weight gradients are written once, never accumulated: the op refuses GM_DW_BF16 without GM_DW_WRITE,
// and the MoE layer refuses an accumulating backward into packed gradients (one message, non-zero exit).
static void die_packed_accumulate_op(void *arg) {
    (void)arg;
    float x[8] = {0}, w[8] = {0}, d[8] = {0}, dw[8] = {0};
    const int64_t off[2] = {0, 2};
    be->grouped_matmul_bwd(NULL, dw, d, x, w, off, 1, 2, 2, GM_DW_BF16);
}
static void die_packed_accumulate_moe(void *arg) {
    (void)arg;
    MoeGrads g = {.packed = 1, .fresh = 0};
    moe_dw_flags(&g, 1, 1);
}
static void test_packed_refusals(void) {
    expect_death_msg("GM_DW_BF16 without GM_DW_WRITE", die_packed_accumulate_op, NULL,
                     "GM_DW_BF16 without GM_DW_WRITE", "never accumulated", 1);
    expect_death_msg("an accumulation into packed expert gradients", die_packed_accumulate_moe, NULL,
                     "an accumulation into bf16 expert gradients", "written once a step", 1);
    MoeGrads g = {.packed = 1, .fresh = 1};
    EXPECT(moe_dw_flags(&g, 1, 1) == (GM_DW_WRITE | GM_DW_BF16), "moe_dw_flags: packed and fresh gives %d",
           moe_dw_flags(&g, 1, 1));
    MoeGrads f = {.packed = 0, .fresh = 0, .sumsq = 1};
    EXPECT(moe_dw_flags(&f, 1, 1) == 0 && moe_dw_flags(&f, 0, 1) == 0,
           "moe_dw_flags: an accumulation into float32 gives flags");
    // the ledger (GM_DW_SUMSQ) takes a write that is the step's whole gradient, not a first chunk's
    MoeGrads s = {.fresh = 1, .sumsq = 1};
    EXPECT(moe_dw_flags(&s, 1, 1) == (GM_DW_WRITE | GM_DW_SUMSQ) && moe_dw_flags(&s, 1, 0) == GM_DW_WRITE,
           "moe_dw_flags: the ledger's write gives %d, a first chunk's %d", moe_dw_flags(&s, 1, 1),
           moe_dw_flags(&s, 1, 0));
}

// The gradient ledger (ops.h GM_DW_SUMSQ, dw_sumsq_take): the blocks a grouped backward writes, counted, and
// their sum of squares the bits sumsq_runs gives over the same blocks as runs in address order (float32 and
// packed bf16), whatever order the writes came in; an empty take returns 0 blocks; GM_DW_SUMSQ on an
// accumulation dies.
static void die_sumsq_accumulate(void *arg) {
    (void)arg;
    float x[8] = {0}, w[8] = {0}, d[8] = {0}, dw[8] = {0};
    const int64_t off[2] = {0, 2};
    be->grouped_matmul_bwd(NULL, dw, d, x, w, off, 1, 2, 2, GM_DW_SUMSQ);
}
static void test_dw_ledger(void) {
    expect_death_msg("GM_DW_SUMSQ without GM_DW_WRITE", die_sumsq_accumulate, NULL,
                     "GM_DW_SUMSQ without GM_DW_WRITE", "not accumulations", 1);
    be->dw_sumsq_take(NULL);
    const int G = 3, K = 40, O = 24, N = 50;
    const int64_t off[4] = {0, 20, 20, 50}; // (group 1 without rows: its block is zeros, counted)
    size_t blk = (size_t)O * K;
    float *x = fnew((size_t)N * K), *d = fnew((size_t)N * O), *w = fnew(G * blk);
    fill_normal(x, (size_t)N * K, 1.0f);
    fill_normal(d, (size_t)N * O, 1.0f);
    float *dw = xcalloc(4 * G * blk, sizeof(float)); // two gradients: float32 (at 2 G blk), packed (at 0)
    float *dwf = dw + 2 * G * blk;
    // the packed one first and the float32 one after it in memory, written in the other order
    be->grouped_matmul_bwd(NULL, dwf, d, x, w, off, G, K, O, GM_DW_WRITE | GM_DW_SUMSQ);
    be->grouped_matmul_bwd(NULL, dw, d, x, w, off, G, K, O, GM_DW_WRITE | GM_DW_BF16 | GM_DW_SUMSQ);
    double led = -1;
    int n = be->dw_sumsq_take(&led);
    OptRun runs[6];
    for (int g = 0; g < G; g++) {
        runs[g] = (OptRun){.off = (int64_t)(g * blk), .n = (int64_t)blk, .gbf = OPTG_PACKED, .gb = 0};
        runs[G + g] = (OptRun){.off = (int64_t)((2 * G + g) * blk), .n = (int64_t)blk, .gbf = OPTG_F32};
    }
    OptRuns *r = be->runs_create(runs, 2 * G);
    double ref = -2;
    be->sumsq_runs(&ref, 1, dw, r);
    be->runs_free(r);
    EXPECT(n == 2 * G, "dw ledger: %d blocks counted, %d written", n, 2 * G);
    EXPECT(led == ref && ref > 0, "dw ledger: sum %.17g, sumsq_runs over the same blocks %.17g", led, ref);
    double again = -1;
    EXPECT(be->dw_sumsq_take(&again) == 0 && again == 0, "dw ledger: a second take holds %g", again);
    free(x);
    free(d);
    free(w);
    free(dw);
}

static void test_adamw_runs(size_t N, int maxlen, float gscale, int t) {
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    OptRun runs[4096];
    size_t M;
    int nr = test_gen_runs(&R, runs, 4096, N, (size_t)maxlen, 1, 0, &M);
    float *p = fnew(N), *g = fnew(N), *m = fnew(M), *v = fnew(M);
    fill_normal(p, N, 1);
    fill_normal(g, N, 0.1f);
    fill_normal(m, M, 0.05f);
    for (size_t i = 0; i < M; i++) v[i] = 0.01f * fabsf(rng_normal(&R));
    float *g0 = fcopy(g, N);
    float *p2 = fcopy(p, N), *g2 = fcopy(g, N), *m2 = fcopy(m, M), *v2 = fcopy(v, M);
    double *pr = dnew(N), *pm = dnew(N), *mr = dnew(M), *mm = dnew(M), *vr = dnew(M), *vm = dnew(M);
    for (size_t i = 0; i < N; i++) pr[i] = p[i], pm[i] = 0; // untouched: exactly itself
    double c1 = 1 - pow(b1, t), c2 = 1 - pow(b2, t);
    for (int r = 0; r < nr; r++) {
        for (int64_t j = 0; j < runs[r].n; j++) {
            size_t i = (size_t)(runs[r].off + j), k = (size_t)(runs[r].moff + j);
            float ge = g[i] * gscale;
            double w = runs[r].decay ? wd : 0;
            mr[k] = (double)b1 * m[k] + (1 - (double)b1) * ge;
            vr[k] = (double)b2 * v[k] + (1 - (double)b2) * (double)ge * ge;
            double upd = (mr[k] / c1) / (sqrt(vr[k] / c2) + eps);
            pr[i] = p[i] - lr * (upd + w * p[i]);
            pm[i] = fabs(p[i]) + lr * (fabs(upd) + fabs(w * p[i]));
            mm[k] = fabs((double)b1 * m[k]) + fabs((1 - (double)b1) * ge);
            vm[k] = fabs((double)b2 * v[k]) + fabs((1 - (double)b2) * (double)ge * ge);
        }
        // the unfused sequence
        float *gs = g2 + runs[r].off;
        if (gscale != 1.0f) oracle_scale(gs, gscale, (size_t)runs[r].n);
        oracle_adamw(p2 + runs[r].off, gs, m2 + runs[r].moff, v2 + runs[r].moff, (size_t)runs[r].n, lr, b1,
                     b2, eps, runs[r].decay ? wd : 0.0f, t);
    }
    OptRuns *h = be->runs_create(runs, nr);
    be->adamw_runs(p, g, m, v, h, gscale, lr, b1, b2, eps, wd, t, OPT_MIXED, 0);
    be->runs_free(h);
    char lab[96];
    snprintf(lab, sizeof lab, "adamw_runs p (N=%zu, %d runs, gscale %g, t=%d)", N, nr, gscale, t);
    check_arr(lab, p, pr, pm, N, FWD_RTOL, 1e-30);
    check_exact(lab, p, p2, N);
    snprintf(lab, sizeof lab, "adamw_runs m (N=%zu, gscale %g)", N, gscale);
    check_arr(lab, m, mr, mm, M, FWD_RTOL, 1e-30);
    check_exact(lab, m, m2, M);
    snprintf(lab, sizeof lab, "adamw_runs v (N=%zu, gscale %g)", N, gscale);
    check_arr(lab, v, vr, vm, M, FWD_RTOL, 1e-30);
    check_exact(lab, v, v2, M);
    check_exact("adamw_runs leaves g unchanged", g, g0, N);
    free(p);
    free(g);
    free(m);
    free(v);
    free(g0);
    free(p2);
    free(g2);
    free(m2);
    free(v2);
    free(pr);
    free(pm);
    free(mr);
    free(mm);
    free(vr);
    free(vm);
}

// dropout: about p of the elements zeroed (within 4 sigma), the others scaled by exactly 1/(1-p); the mask
// a function of the global token and feature only: one call over B sequences equals calls over row
// chunks [t0, t1) and over single sequences at their own row0 (how DP ranks and sequence chunks call it).
static void test_dropout(void) {
    enum { B = 3, T = 20, C = 50 };
    float p = 0.25f, sc = 1.0f / (1.0f - p);
    size_t n = (size_t)B * T * C;
    float *x = malloc(n * sizeof(float)), *a = malloc(n * sizeof(float)), *y = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)(rng_uniform(&R) + 0.5); // never 0
    memcpy(a, x, n * sizeof(float));
    be->dropout(a, B, T, 0, T, C, p, 99, 1000);
    size_t zeros = 0, bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] == 0) zeros++;
        else if (a[i] != x[i] * sc) bad++;
    }
    double sd = sqrt(n * p * (1 - p));
    EXPECT(fabs(zeros - n * p) <= 4 * sd, "dropout p=%g: %zu of %zu zeroed (expected %.0f +- %.0f)", p, zeros,
           n, n * p, 4 * sd);
    EXPECT(bad == 0, "dropout: %zu kept elements not scaled by exactly 1/(1-p)", bad);
    // sequence chunks [0, 7) and [7, T): rows of each chunk in (b, t) order
    int cut = 7;
    for (int part = 0; part < 2; part++) {
        int t0 = part ? cut : 0, t1 = part ? T : cut, k = t1 - t0;
        for (int b = 0; b < B; b++)
            memcpy(y + (size_t)b * k * C, x + ((size_t)b * T + t0) * C, (size_t)k * C * sizeof(float));
        be->dropout(y, B, T, t0, t1, C, p, 99, 1000);
        int same = 1;
        for (int b = 0; b < B; b++)
            same &=
                !memcmp(y + (size_t)b * k * C, a + ((size_t)b * T + t0) * C, (size_t)k * C * sizeof(float));
        EXPECT(same, "dropout over rows [%d, %d) differs from the call over [0, %d)", t0, t1, T);
    }
    // each sequence alone at its global row0 (a DP rank's share)
    int same = 1;
    for (int b = 0; b < B; b++) {
        memcpy(y, x + (size_t)b * T * C, (size_t)T * C * sizeof(float));
        be->dropout(y, 1, T, 0, T, C, p, 99, 1000 + (int64_t)b * T);
        same &= !memcmp(y, a + (size_t)b * T * C, (size_t)T * C * sizeof(float));
    }
    EXPECT(same, "dropout of one sequence at row0 + b*T differs from the call over all sequences");
    memcpy(y, x, n * sizeof(float));
    be->dropout(y, B, T, 0, T, C, p, 98, 1000);
    EXPECT(memcmp(y, a, n * sizeof(float)) != 0, "dropout: another seed gave the same mask");
    free(x);
    free(a);
    free(y);
}

// ops.h attention_ds_bytes against a count of what the dq kernel reads: for each query tile of 64 rows
// from t0 (the last one partial), every key tile of 64 up to the tile's last possible row t0 + 64 m + 63,
// 8 KiB each, per sequence and head; 0 at other head dims and for empty ranges. (The default cap, 1024
// MiB, is above every case here; moe info's use of it is checked in test_cli_errors.sh.)
static void test_attention_ds_bytes(void) {
    int cases[][4] = {{1, 64, 0, 64},  {2, 130, 0, 130}, {2, 130, 65, 130}, {1, 2048, 1024, 2048},
                      {3, 97, 33, 70}, {1, 5, 0, 5},     {4, 2048, 0, 2048}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int B = cases[c][0], T = cases[c][1], t0 = cases[c][2], t1 = cases[c][3], H = 3;
        size_t tiles = 0;
        for (int q0 = t0; q0 < t1; q0 += 64) tiles += (size_t)((q0 + 63) / 64 + 1);
        size_t want = (size_t)B * H * tiles * 64 * 64 * 2, got = attention_ds_bytes(B, T, H, 1, 128, t0, t1);
        EXPECT(got == want, "attention_ds_bytes(B %d, T %d, [%d, %d)): %zu, want %zu", B, T, t0, t1, got,
               want);
    }
    EXPECT(attention_ds_bytes(2, 130, 3, 3, 64, 0, 130) == 0, "attention_ds_bytes at head dim 64: not 0");
    EXPECT(attention_ds_bytes(2, 130, 3, 3, 128, 40, 40) == 0, "attention_ds_bytes of an empty range: not 0");
}

// ops.h attention_ds_pass_heads: the kv heads a pass when a pair takes `pair` bytes of `budget`: the fewest
// passes that fit (ceil(KV / min(fit, KV)) of them), their sizes as even as can be (the largest pass
// ceil(KV / passes)); checked by counting, for every budget of 0 .. 20 pairs (and one byte short of a
// pair), the passes that a size h makes and that h pairs fit.
static void test_attention_ds_pass_heads(void) {
    for (int KV = 1; KV <= 17; KV++)
        for (size_t n = 0; n <= 20; n++)
            for (int shy = 0; shy < 2; shy++) {
                size_t pair = 1000, budget = n * pair - (shy && n ? 1 : 0);
                int h = attention_ds_pass_heads(pair, budget, KV);
                size_t fit = budget / pair;
                if (!fit) {
                    EXPECT(h == 0, "pass heads (KV %d, budget %zu): %d, want 0 (not one pair fits)", KV,
                           budget, h);
                    continue;
                }
                int most = fit < (size_t)KV ? (int)fit : KV, passes = (KV + most - 1) / most;
                EXPECT(
                    h >= 1 && (size_t)h <= fit && h <= KV && (KV + h - 1) / h == passes &&
                        (KV + passes - 1) / passes == h,
                    "pass heads (KV %d, %zu pairs fit): %d (want %d passes, the largest as small as can be)",
                    KV, fit, h, passes);
            }
    EXPECT(attention_ds_pass_heads(0, 100, 4) == 0, "pass heads of an empty pair: not 0");
}

// ops.h attention_ds_range_tiles against a count of the tiles (query tile m, key tile j), j0 <= j < j1, that
// the rows of m see (j <= a + m, a = ceil(t0 / 64)); attention_ds_range_end against the bytes of the range
// it returns and of the one a key tile longer (or the last key tile ceil(t1 / 64) - 1 reached).
static void test_attention_ds_ranges(void) {
    int rows[][2] = {{0, 64}, {0, 600}, {200, 400}, {400, 600}, {33, 70}, {0, 1}, {130, 1000}};
    for (size_t c = 0; c < sizeof rows / sizeof rows[0]; c++) {
        int t0 = rows[c][0], t1 = rows[c][1], nq = (t1 - t0 + 63) / 64, a = (t0 + 63) / 64,
            nkt = (t1 + 63) / 64;
        for (int j0 = 0; j0 <= nkt; j0++)
            for (int j1 = j0; j1 <= nkt + 2; j1++) {
                size_t want = 0;
                for (int m = 0; m < nq; m++)
                    for (int j = j0; j < j1; j++) want += j <= a + m;
                size_t got = attention_ds_range_tiles(t0, t1, j0, j1);
                EXPECT(got == want, "attention_ds_range_tiles([%d, %d), keys [%d, %d)): %zu, want %zu", t0,
                       t1, j0, j1, got, want);
            }
        for (size_t budget = 0; budget <= 40 * 8192; budget += 4096)
            for (int j0 = 0; j0 < nkt; j0++) {
                int e = attention_ds_range_end(t0, t1, 2, 2, budget, j0);
                size_t fit = 4 * attention_ds_range_tiles(t0, t1, j0, e) * 8192,
                       more = e < nkt ? 4 * attention_ds_range_tiles(t0, t1, j0, e + 1) * 8192 : 0;
                EXPECT(e >= j0 && e <= nkt && fit <= budget && (e == nkt || more > budget),
                       "attention_ds_range_end([%d, %d), from %d, budget %zu): %d (%zu bytes; one more %zu)",
                       t0, t1, j0, budget, e, fit, more);
            }
    }
    // The lengths of issue 38 at the default cap (1024 MiB), 16 query heads on 8 kv heads, B 1: T 8192 keeps
    // its passes over kv heads (a pair 2 x 8256 tiles of 8 KiB, 129 MiB; 8 of them over the cap, 7 fit the
    // most any rows take, 2 x 8384 tiles: passes of 4 kv heads); from T 16384 two kv heads over key ranges.
    // T 16384 (256 query tiles): the first range of w key tiles holds 256 w - w (w - 1) / 2 tiles a head,
    // 32768 fit the cap over 4 heads: w 240 (32760; w 241: 32776): 480 dk/dv blocks (2 w), over the 256 a
    // range must hold (8 x 256 = 2048 in the call). T 32768 (512): 512 w - w (w - 1) / 2: w 68 (32538; w 69:
    // 32982), 136 blocks: dS again (0).
    size_t want[3] = {4 * 2 * 8256 * 8192ull, 4ull * 32760 * 8192, 0};
    int T[3] = {8192, 16384, 32768};
    for (int i = 0; i < 3; i++) {
        size_t got = attention_ds_bytes(1, T[i], 16, 8, 128, 0, T[i]);
        EXPECT(got == want[i], "attention_ds_bytes(T %d, 16 / 8 heads): %zu, want %zu", T[i], got, want[i]);
    }
}

// matmul_fwd_multi's flags (plain.h mm_fwd_multi_flags_error, the one rule every backend checks): GM_OUT_HID
// alone, on products wider than MOE_GEMM_FP32_MAX_O; a narrow product under it dies naming both; the cpu's
// (float32 format) products under it the bits of flags 0
static void mm_multi_narrow_hid(void *arg) {
    (void)arg;
    float x[6] = {0}, w[2 * 3 * 64] = {0}, o1[2 * 64], o2[2 * 64], *out[2] = {o1, o2};
    const float *ws[2] = {w, w};
    be->matmul_fwd_multi(2, out, x, ws, 2, 3, (const int[2]){64, 64}, GM_OUT_HID);
}
static void test_mm_fwd_multi_flags(void) {
    EXPECT(!mm_fwd_multi_flags_error(2, (const int[2]){65, 200}, GM_OUT_HID),
           "GM_OUT_HID on 65 and 200 refused");
    EXPECT(!mm_fwd_multi_flags_error(1, (const int[1]){3}, 0), "flags 0 on a narrow product refused");
    EXPECT(mm_fwd_multi_flags_error(2, (const int[2]){65, 64}, GM_OUT_HID), "GM_OUT_HID on 64 columns taken");
    EXPECT(mm_fwd_multi_flags_error(1, (const int[1]){100}, GM_ACC_DINP), "GM_ACC_DINP taken");
    EXPECT(mm_fwd_multi_flags_error(1, (const int[1]){100}, GM_OUT_HID | GM_DOUT_HID), "GM_DOUT_HID taken");
    expect_death_msg("matmul_fwd_multi: GM_OUT_HID on 64 columns", mm_multi_narrow_hid, NULL, "GM_OUT_HID",
                     "MOE_GEMM_FP32_MAX_O", 0);
    int N = 5, K = 7, O[3] = {70, 66, 80};
    float *x = xmalloc(sizeof(float) * N * K), *w[3], *a[3], *b[3];
    for (int i = 0; i < N * K; i++) x[i] = rng_normal(&R);
    for (int i = 0; i < 3; i++) {
        w[i] = xmalloc(sizeof(float) * O[i] * K);
        for (int j = 0; j < O[i] * K; j++) w[i][j] = rng_normal(&R);
        a[i] = xmalloc(sizeof(float) * N * O[i]);
        b[i] = xmalloc(sizeof(float) * N * O[i]);
    }
    be->matmul_fwd_multi(3, a, x, (const float *const *)w, N, K, O, 0);
    be->matmul_fwd_multi(3, b, x, (const float *const *)w, N, K, O, GM_OUT_HID);
    for (int i = 0; i < 3; i++) {
        EXPECT(memcmp(a[i], b[i], sizeof(float) * N * O[i]) == 0,
               "cpu GM_OUT_HID product %d: not flags 0's bits", i);
        free(w[i]);
        free(a[i]);
        free(b[i]);
    }
    free(x);
}

int main(void) {
    be = backend_cpu();
    test_attention_ds_bytes();
    test_attention_ds_pass_heads();
    test_attention_ds_ranges();
    rng_seed(&R, 20240607);
    test_memory();
    test_alloc_holes();
    test_mm_fwd_multi_flags();
    test_matmul(7, 33, 9);
    test_matmul(4, 64, 3);
    test_matmul(1, 5, 1);
    test_grouped_matmul();
    test_embedding();
    test_rmsnorm();
    test_rmsnorm_split(6, 48, 24); // two ranks' halves (tp 2: H*hd = 48 of 2 x 24)
    test_rmsnorm_split(3, 40, 8); // unequal parts
    test_rope(2, 5, 3, 8, 10000.0f);
    test_rope(1, 7, 2, 4, 100.0f);
    test_dropout();
    test_attention(2, 5, 4, 2, 4); // GQA
    test_attention(1, 6, 3, 3, 8); // MHA
    test_attention(1, 4, 2, 1, 6); // MQA
    test_attention(2, 1, 2, 1, 4); // T = 1: out = v
    test_attention_chunks(2, 12, 4, 2, 8, 2);
    test_attention_chunks(2, 13, 4, 2, 8, 4); // uneven chunks
    test_attention_chunks(1, 5, 2, 1, 4, 5); // one row each
    test_swiglu();
    test_rows();
    test_combine_rows(9, 3, 5, 20);
    test_combine_rows(6, 8, 33, 30); // k = 8: the unrolled slot loop's width on the GPU
    test_combine_rows(4, 1, 7, 4);
    test_router_ops(37, 8, 2, 1);
    test_plan_ops(300, 8, 2, -1);
    test_plan_ops(300, 8, 2, 40); // capacity: drops
    test_plan_ops(200, 64, 8, -1);
    test_plan_ops(200, 64, 8, 20);
    test_router_ops(20, 64, 8, 0);
    test_router_ops(5, 3, 3, 1);
    test_cross_entropy();
    test_sumsq();
    test_adamw(1, 0.1f, 1, 0);
    test_adamw(5, 0.1f, 0, 0);
    test_adamw(3, 0.0f, 0, 0);
    test_adamw(1, 0.1f, 1, 1); // g = 0: pure decoupled decay
    test_sumsq_runs(3000, 200, 3);
    test_sumsq_runs(50000, 20000, 9); // runs over several of sumsq's chunks; ZeRO-2's 9 classes
    test_adamw_runs(3000, 200, 0.37f, 1);
    test_adamw_runs(3000, 200, 1.0f, 4); // no clipping: g exactly
    test_adamw_runs(20000, 5000, 1e-3f, 2);
    test_bf16_rounding();
    test_sr_bits_even();
    test_adamw_runs_bf16(3000, 200, 0.37f, 1, OPT_BF16_STOCHASTIC);
    test_adamw_runs_bf16(20000, 5000, 1.0f, 5, OPT_BF16_STOCHASTIC);
    test_adamw_runs_bf16(3000, 200, 1.0f, 2, OPT_BF16_NEAREST);
    test_adamw_runs_bf16(3000, 200, 0.5f, 3, OPT_BF16_MOMENTS);
    test_grad_formats(3000, 200, OPT_BF16_STOCHASTIC);
    test_grad_formats(20000, 5000, OPT_BF16_NEAREST);
    test_grad_formats(3000, 200, OPT_MIXED);
    test_packed_refusals();
    test_dw_ledger();
    return test_done("test_ops");
}
