// test_util.h — tiny assertion helpers for the C test programs (each test_*.c is one ctest test).
// A failed EXPECT prints file:line and the values and marks the test failed; exit code 77 = skipped.
#pragma once
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>

static int t_failures = 0, t_checks = 0;
#define EXPECT(cond, ...) \
    do { \
        t_checks++; \
        if (!(cond)) { \
            t_failures++; \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__); \
            fprintf(stderr, "\n"); \
        } \
    } while (0)
#define EXPECT_NEAR(a, b, tol, what) \
    do { \
        double _a = (a), _b = (b); \
        EXPECT(fabs(_a - _b) <= (tol), "%s: %.9g vs %.9g (|diff| %.3g > tol %.3g)", what, _a, _b, \
               fabs(_a - _b), (double)(tol)); \
    } while (0)
#define TEST_SKIP(...) \
    do { \
        printf("SKIP: "); \
        printf(__VA_ARGS__); \
        printf("\n"); \
        exit(77); \
    } while (0)
static inline int test_done(const char *name) {
    printf("%s: %d checks, %d failed\n", name, t_checks, t_failures);
    return t_failures ? 1 : 0;
}

// How many of n floats differ from b's in their bits (a NaN equals any NaN).
static inline size_t floats_differ(const float *a, const float *b, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t x, y;
        memcpy(&x, a + i, 4), memcpy(&y, b + i, 4);
        k += x != y && !(a[i] != a[i] && b[i] != b[i]);
    }
    return k;
}

// The current CUDA device's compute capability (major * 10 + minor); 0 without CUDA or a GPU.
#ifdef MOE_HAVE_CUDA
#include <cuda_runtime_api.h>
static inline int cuda_device_cc(void) {
    int d = 0, a = 0, b = 0;
    if (cudaGetDevice(&d) != cudaSuccess ||
        cudaDeviceGetAttribute(&a, cudaDevAttrComputeCapabilityMajor, d) != cudaSuccess ||
        cudaDeviceGetAttribute(&b, cudaDevAttrComputeCapabilityMinor, d) != cudaSuccess)
        return 0;
    return a * 10 + b;
}
#else
static inline int cuda_device_cc(void) { return 0; }
#endif
