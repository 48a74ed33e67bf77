// cpu_oracle.h — for the op tests (test_ops.c, test_cuda_ops.c): plain host loops of ops that the
// Backend no longer has (nothing in src/ calls them) but that the tests compose into references for
// the ops it does have: gather_dot_scale (= gather_rows, row_dot, scale_rows), adamw_runs (= scale,
// then adamw per run), sumsq_runs (= sumsq per run), the combine's backward (scatter_add_rows).
// Each is written exactly as backend_cpu() computed it (the same float/double operations in the
// same order), so the bit-for-bit checks against them say what they said before.
// Must not hold: the tests themselves.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>

// out[idx[i]] += scale[i] * inp[i] (rows of C), serially over i; scale may be NULL (= 1).
static inline void oracle_scatter_add_rows(float *out, const float *inp, const int32_t *idx,
                                           const float *scale, int n, int C) {
    for (int i = 0; i < n; i++) {
        float s = scale ? scale[i] : 1.0f;
        float *o = out + (size_t)idx[i] * C;
        const float *x = inp + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] += s * x[c];
    }
}

// x[i] *= scale[i] for rows of C
static inline void oracle_scale_rows(float *x, const float *scale, int n, int C) {
    for (int i = 0; i < n; i++)
        for (int c = 0; c < C; c++) x[(size_t)i * C + c] *= scale[i];
}

// dot[i] = <a[i], b[i]> over rows of C, summed in order in double
static inline void oracle_row_dot(float *dot, const float *a, const float *b, int n, int C) {
    for (int i = 0; i < n; i++) {
        double s = 0;
        for (int c = 0; c < C; c++) s += (double)a[(size_t)i * C + c] * b[(size_t)i * C + c];
        dot[i] = (float)s;
    }
}

// x *= a
static inline void oracle_scale(float *x, float a, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] *= a;
}

// Sum of squares in double: chunks of 2^14 elements each summed in order, the chunks' sums added
// in order (the cpu's order whatever its thread count).
static inline double oracle_sumsq(const float *x, size_t n) {
    enum { CHUNK = 1 << 14 };
    double s = 0;
    for (size_t c0 = 0; c0 < n; c0 += CHUNK) {
        size_t e = c0 + CHUNK < n ? c0 + CHUNK : n;
        double part = 0;
        for (size_t i = c0; i < e; i++) part += (double)x[i] * x[i];
        s += part;
    }
    return s;
}

// AdamW on n elements: decoupled decay wd, bias-corrected at step t (1-based), torch.optim.AdamW's
// arrangement of the bias corrections: the step size lr / (1 - b1^t) and the denominator
// sqrt(v) / sqrt(1 - b2^t) + eps, here with that square root's reciprocal as a factor (each scalar from
// double rounded to float); the decay lr wd p subtracted with the step.
static inline void oracle_adamw(float *p, const float *g, float *m, float *v, size_t n, float lr, float b1,
                                float b2, float eps, float wd, int t) {
    float step = (float)(lr / (1.0 - pow(b1, t))), rs2 = (float)(1.0 / sqrt(1.0 - pow(b2, t)));
    float lwd = (float)((double)lr * wd);
    for (size_t i = 0; i < n; i++) {
        float gi = g[i];
        float mi = b1 * m[i] + (1.0f - b1) * gi;
        float vi = b2 * v[i] + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float den = sqrtf(vi) * rs2 + eps;
        p[i] = p[i] - (step * (mi / den) + lwd * p[i]);
    }
}
