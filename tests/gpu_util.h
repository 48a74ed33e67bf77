// gpu_util.h — what the GPU test programs (tests/test_cuda_*.c) share, header-only: MOE_TEST_SMALL, device
// buffers through a Backend (float32 and its hidden format, bf16 or float32: put, read back, NaN-filled),
// the raw CUDA buffers and non-finite counters of the tests that call the kernels' entry points directly, and
// the error of a result against a reference (per element relative to |want| + rms(want), and norm-wise). Must
// not hold: assertions, printing or the "N checks" line (test_util.h), any one test's shapes or bands.
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "ops/numerics.h"
#include "ops/ops.h"

// MOE_TEST_SMALL set to anything but "" or "0": small shapes only (compute-sanitizer's runs, which are slow)
static inline int gpu_test_small(void) {
    const char *s = getenv("MOE_TEST_SMALL");
    return s && *s && strcmp(s, "0");
}

// ---------------------------------------------------------------- buffers of a Backend
static inline void *gpu_put(const Backend *be, const void *h, size_t bytes) {
    void *d = be->alloc(bytes);
    be->to_device(d, h, bytes);
    return d;
}
static inline float *gpu_putf(const Backend *be, const float *h, size_t n) {
    return gpu_put(be, h, n * sizeof(float));
}
static inline float *gpu_getf(const Backend *be, const float *d, size_t n) {
    float *h = xcalloc(n, sizeof(float));
    be->to_host(h, d, n * sizeof(float));
    return h;
}
// n host floats, every one NaN
static inline float *host_nanf(size_t n) {
    float *h = xcalloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    return h;
}
// n floats, every one NaN (an output the op must write: what it leaves shows)
static inline float *gpu_nanf(const Backend *be, size_t n) {
    float *h = host_nanf(n);
    float *d = gpu_putf(be, h, n);
    free(h);
    return d;
}
// the backend's hidden format (ops.h Backend.hid: bf16 bits, each value rounded to nearest even; or float32
// as given) from float values, NaN-filled, and read back
static inline void *gpu_hid_put(const Backend *be, const float *h, size_t n) {
    if (be->hid == FMT_F32) return gpu_putf(be, h, n);
    uint16_t *b = xcalloc(n, 2);
    for (size_t i = 0; i < n; i++) b[i] = bf16_rn_bits(h[i]);
    void *d = gpu_put(be, b, n * 2);
    free(b);
    return d;
}
static inline void *gpu_hid_nan(const Backend *be, size_t n) {
    float *h = host_nanf(n);
    void *d = gpu_hid_put(be, h, n);
    free(h);
    return d;
}
static inline float *gpu_hid_get(const Backend *be, const void *d, size_t n) {
    if (be->hid == FMT_F32) return gpu_getf(be, d, n);
    uint16_t *b = xcalloc(n, 2);
    be->to_host(b, d, n * 2);
    float *h = xcalloc(n, sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = bf16_to_f32(b[i]);
    free(b);
    return h;
}

// ---------------------------------------------------------------- the error of a result
// got against want (host arrays of n): e_i = |got_i - want_i| / (|want_i| + rms(want)). bad: how many e_i are
// not <= band (a NaN is out), first: the first of them; worst: the largest e_i (a NaN counts as infinity);
// norm: ||got - want|| / ||want|| (||got - want|| where want is all zeros; a NaN: infinity). gpu_err_at:
// where want is all zeros, e_i is judged against zero_rms in place of rms(want) (0: against none).
typedef struct {
    size_t bad, first;
    double worst, norm;
} GpuErr;
static inline GpuErr gpu_err_at(const float *got, const float *want, size_t n, double band, double zero_rms) {
    GpuErr r = {0, 0, 0.0, 0.0};
    double ss = 0, dd = 0;
    for (size_t i = 0; i < n; i++) ss += (double)want[i] * want[i];
    double rms = ss == 0 ? zero_rms : sqrt(ss / (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i], e = fabs(d) / (fabs(want[i]) + rms + 1e-30);
        dd += d * d;
        if (!(e <= band) && r.bad++ == 0) r.first = i;
        if (!(e <= r.worst)) r.worst = isnan(e) ? INFINITY : e;
    }
    r.norm = ss > 0 ? sqrt(dd / ss) : sqrt(dd);
    if (isnan(r.norm)) r.norm = INFINITY;
    return r;
}
static inline GpuErr gpu_err(const float *got, const float *want, size_t n, double band) {
    return gpu_err_at(got, want, n, band, 0);
}

// ---------------------------------------------------------------- raw CUDA buffers (the kernels' entry
// points)
#ifdef MOE_HAVE_CUDA
#include <cuda_runtime.h>
#define CU_CK(call) \
    do { \
        cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) DIE("%s: %s", #call, cudaGetErrorString(e_)); \
    } while (0)
// bytes of device memory (1 at least), every byte `fill`
static inline void *cu_alloc(size_t bytes, int fill) {
    void *d;
    CU_CK(cudaMalloc(&d, bytes ? bytes : 1));
    CU_CK(cudaMemset(d, fill, bytes ? bytes : 1));
    return d;
}
static inline void *cu_put(const void *h, size_t bytes) {
    void *d = cu_alloc(bytes, 0);
    if (bytes) CU_CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    return d;
}
static inline void *cu_get(const void *d, size_t bytes) {
    void *h = xmalloc(bytes);
    if (bytes) CU_CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
    return h;
}
// a quantiser's counter (cuda_fp8.h: the non-finite count, then 1 + the finite groups' largest amax bits):
// zeroed on the device; then its count (the counter freed), and where amax is not NULL its second word
static inline unsigned long long *cu_counter(void) { return cu_alloc(2 * sizeof(unsigned long long), 0); }
static inline long long cu_count_amax(unsigned long long *c, unsigned long long *amax) {
    unsigned long long h[2];
    CU_CK(cudaMemcpy(h, c, sizeof h, cudaMemcpyDeviceToHost));
    CU_CK(cudaFree(c));
    if (amax) *amax = h[1];
    return (long long)h[0];
}
static inline long long cu_count(unsigned long long *c) { return cu_count_amax(c, NULL); }
#endif
