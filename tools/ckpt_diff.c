// ckpt_diff.c — test tool: compare the model tensors of two checkpoints (same config).
// usage: ckpt_diff A B [TOL]  prints the worst tensor's max|a-b| / max|a| and exits 1 if it
// exceeds TOL (default 0: report only). Used by the mesh tests to compare final parameters.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include "core/common.h"
#include "model/params.h"
#include "train/checkpoint.h"

int main(int argc, char **argv) {
    if (argc < 3) { fprintf(stderr, "usage: ckpt_diff A B [TOL]\n"); return 2; }
    double tol = argc > 3 ? atof(argv[3]) : 0;
    char a[2048], b[2048];
    if (ckpt_find_latest(argv[1], a, sizeof a) != 0) snprintf(a, sizeof a, "%s", argv[1]);
    if (ckpt_find_latest(argv[2], b, sizeof b) != 0) snprintf(b, sizeof b, "%s", argv[2]);
    ModelConfig ca, cb;
    ckpt_load_config(a, &ca);
    ckpt_load_config(b, &cb);
    ParamTable t;
    params_build(&t, &ca);
    float *pa = xmalloc(t.total * sizeof(float)), *pb = xmalloc(t.total * sizeof(float));
    ckpt_load(a, &t, pa, NULL, NULL, NULL);
    ckpt_load(b, &t, pb, NULL, NULL, NULL);
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
        if (r > worst) { worst = r; wi = i; }
    }
    printf("max relative difference %.3e (%s)\n", worst, t.p[wi].name);
    return tol > 0 && worst > tol ? 1 : 0;
}
