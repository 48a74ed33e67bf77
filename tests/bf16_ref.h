// bf16_ref.h — for the GPU tests: a cpu Backend whose GEMMs compute what the "cuda" backend's
// tensor-core GEMMs compute, so that the two can be compared with float32 bands. The cuda backend
// rounds each float32 operand to bf16 (round to nearest even) and multiplies with fp32
// accumulation; a product of two bf16 values is exact in float32, so its result is the float32
// GEMM of the rounded operands up to the order of the sums. This backend rounds the same operands
// on the host and calls the cpu (CBLAS) GEMM. It follows the same policy (ops.h): every grouped
// GEMM, and a matmul only when O > MOE_GEMM_FP32_MAX_O; every other op is the cpu's.
// Must not hold: tests (those are in test_cuda_ops.c / test_cuda_model.c).
#pragma once
#include <stdint.h>
#include <string.h>
#include "core/common.h"
#include "ops/ops.h"

// float32 -> bf16 (round to nearest even; NaN stays NaN, overflow goes to inf) -> float32
static inline float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) {
        if (u & 0x7fffffu) u |= 0x00400000u;   // quiet NaN
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
    }
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

static inline float *bf16_copy(const float *x, size_t n) {
    float *y = xmalloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = bf16_round(x[i]);
    return y;
}

static void bfr_matmul_fwd(float *out, const float *inp, const float *w, int N, int K, int O, int accumulate) {
    const Backend *c = backend_cpu();
    if (N <= 0 || K <= 0 || O <= MOE_GEMM_FP32_MAX_O) { c->matmul_fwd(out, inp, w, N, K, O, accumulate); return; }
    float *xr = bf16_copy(inp, (size_t)N * K), *wr = bf16_copy(w, (size_t)O * K);
    c->matmul_fwd(out, xr, wr, N, K, O, accumulate);
    free(xr); free(wr);
}

static void bfr_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N, int K,
                           int O) {
    const Backend *c = backend_cpu();
    if (N <= 0 || K <= 0 || O <= MOE_GEMM_FP32_MAX_O) { c->matmul_bwd(dinp, dw, dout, inp, w, N, K, O); return; }
    float *gr = bf16_copy(dout, (size_t)N * O), *wr = bf16_copy(w, (size_t)O * K), *xr = bf16_copy(inp, (size_t)N * K);
    c->matmul_bwd(dinp, dw, gr, xr, wr, N, K, O);
    free(gr); free(wr); free(xr);
}

static void bfr_grouped_fwd(float *out, const float *inp, const float *w, const int64_t *off, int G, int K, int O) {
    size_t rows = G > 0 ? (size_t)off[G] : 0;
    float *xr = bf16_copy(inp, rows * K), *wr = bf16_copy(w, (size_t)G * O * K);
    backend_cpu()->grouped_matmul_fwd(out, xr, wr, off, G, K, O);
    free(xr); free(wr);
}

static void bfr_grouped_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                            const int64_t *off, int G, int K, int O) {
    size_t rows = G > 0 ? (size_t)off[G] : 0;
    float *gr = bf16_copy(dout, rows * O), *xr = bf16_copy(inp, rows * K), *wr = bf16_copy(w, (size_t)G * O * K);
    backend_cpu()->grouped_matmul_bwd(dinp, dw, gr, xr, wr, off, G, K, O);
    free(gr); free(xr); free(wr);
}

// The cpu backend with the cuda backend's bf16 GEMMs (name "cpu-bf16ref").
static inline const Backend *backend_cpu_bf16ref(void) {
    static Backend b;
    if (!b.name) {
        b = *backend_cpu();
        b.name = "cpu-bf16ref";
        b.matmul_fwd = bfr_matmul_fwd;
        b.matmul_bwd = bfr_matmul_bwd;
        b.grouped_matmul_fwd = bfr_grouped_fwd;
        b.grouped_matmul_bwd = bfr_grouped_bwd;
    }
    return &b;
}
