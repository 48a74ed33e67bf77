// ckpt_diff.c — test tool: compare the model tensors of two checkpoints (same config).
// usage: ckpt_diff A B [TOL]  prints the worst tensor's max|a-b| / max|a| and exits 1 if it
// exceeds TOL (default 0: report only). Used by the mesh tests to compare final parameters.
// ckpt_diff --bf16 A: counts the weights and AdamW moments of A that are not bf16 values (low 16 bits
// of the float32 not zero); exits 1 if any (tests/test_precision.sh: --precision bf16's checkpoints).
// ckpt_diff --changed A B MAXFRAC: how many weights of two bf16-policy checkpoints differ at all (in
// total, and in the worst tensor of 256 elements or more); exits 1 if that tensor's fraction exceeds
// MAXFRAC. A stochastic rounding decision flipped by a last-bit difference (mesh summation orders)
// changes a few scattered weights by one bf16 step; a wrong hash index, gradient or update changes
// most of a tensor (tests/test_precision.sh).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "model/params.h"
#include "io/checkpoint.h"

static size_t not_bf16(const float *x, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        k += (u & 0xffffu) != 0;
    }
    return k;
}

// A checkpoint argument: a checkpoint directory, or a run directory (its newest complete checkpoint).
static void ckpt_dir(const char *arg, char *out, size_t n) {
    if (ckpt_find_latest(arg, out, n) != 0) snprintf(out, n, "%s", arg);
}

// The weights of checkpoints A and B (both configs read; A's gives the table) into *pa, *pb.
static void load_pair(const char *A, const char *B, ParamTable *t, float **pa, float **pb) {
    char a[2048], b[2048];
    ckpt_dir(A, a, sizeof a);
    ckpt_dir(B, b, sizeof b);
    ModelConfig ca, cb;
    ckpt_load_config(a, &ca);
    ckpt_load_config(b, &cb);
    params_build(t, &ca);
    *pa = xmalloc(t->total * sizeof(float));
    *pb = xmalloc(t->total * sizeof(float));
    ckpt_load(a, t, *pa, NULL, NULL, NULL);
    ckpt_load(b, t, *pb, NULL, NULL, NULL);
}

static int bf16_check(const char *dir) {
    char a[2048];
    ckpt_dir(dir, a, sizeof a);
    ModelConfig c;
    ckpt_load_config(a, &c);
    ParamTable t;
    params_build(&t, &c);
    float *p = xmalloc(t.total * sizeof(float) * 3), *m = p + t.total, *v = m + t.total;
    ckpt_load(a, &t, p, m, v, NULL);
    size_t bp = not_bf16(p, t.total), bm = not_bf16(m, t.total) + not_bf16(v, t.total);
    printf("not bf16 values: %zu of %zu weights, %zu of %zu AdamW moments\n", bp, t.total, bm, 2 * t.total);
    return bp || bm;
}

static int changed_check(const char *da, const char *db, double maxfrac) {
    ParamTable t;
    float *pa, *pb;
    load_pair(da, db, &t, &pa, &pb);
    size_t nd = 0;
    double worst = 0;
    int wi = -1;
    for (int i = 0; i < t.n; i++) {
        const ParamSpec *s = &t.p[i];
        size_t k = 0;
        for (size_t j = 0; j < s->numel; j++) k += memcmp(&pa[s->offset + j], &pb[s->offset + j], 4) != 0;
        nd += k;
        double f = (double)k / (double)(s->numel ? s->numel : 1);
        if (s->numel >= 256 && f > worst) {
            worst = f;
            wi = i;
        }
    }
    printf("changed weights: %zu of %zu (%.3g%%); worst tensor %.3g%% (%s)\n", nd, t.total,
           100.0 * (double)nd / (double)(t.total ? t.total : 1), 100 * worst,
           wi >= 0 ? t.p[wi].name : "none");
    return worst > maxfrac;
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--changed")) return changed_check(argv[2], argv[3], atof(argv[4]));
    if (argc == 3 && !strcmp(argv[1], "--bf16")) return bf16_check(argv[2]);
    if (argc < 3) {
        fprintf(stderr,
                "usage: ckpt_diff A B [TOL] | ckpt_diff --bf16 A | ckpt_diff --changed A B MAXFRAC\n");
        return 2;
    }
    double tol = argc > 3 ? atof(argv[3]) : 0;
    ParamTable t;
    float *pa, *pb;
    load_pair(argv[1], argv[2], &t, &pa, &pb);
    double worst = 0;
    int wi = 0;
    for (int i = 0; i < t.n; i++) {
        const ParamSpec *s = &t.p[i];
        double mx = 0, md = 0;
        for (size_t j = 0; j < s->numel; j++) {
            double x = pa[s->offset + j], y = pb[s->offset + j];
            if (fabs(x) > mx) mx = fabs(x);
            if (fabs(x - y) > md || isnan(y)) md = isnan(y) ? INFINITY : fabs(x - y);
        }
        double r = md / (mx > 0 ? mx : 1);
        if (r > worst) {
            worst = r;
            wi = i;
        }
    }
    printf("max relative difference %.3e (%s)\n", worst, t.p[wi].name);
    return tol > 0 && worst > tol ? 1 : 0;
}
