// cuda_fp8_trace.cu — the FP8 tables' per-kernel GPU times (contracts in cuda_fp8_trace.h): one event pair
// reused for every launch, the sums by name in a small table. Must not hold: kernels, or knowledge of
// which op launches what (the callers name their launches).
#include <string.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_fp8_trace.h"

#define TR_MAX 48 // distinct names (more: summed under the last)

static struct {
    char name[48];
    int calls;
    double ms, bytes, flops;
} g_tr[TR_MAX];
static int g_n, g_on;
static cudaEvent_t g_e0, g_e1;

extern "C" void cuda_fp8_trace_arm(int on) {
    if (on && !g_e0) {
        CUDA_CHECK(cudaEventCreate(&g_e0));
        CUDA_CHECK(cudaEventCreate(&g_e1));
    }
    if (on) g_n = 0;
    g_on = on;
}

int cuda_fp8_trace_on(void) { return g_on; }

void cuda_fp8_trace_begin(void) {
    if (g_on) CUDA_CHECK(cudaEventRecord(g_e0, 0));
}

void cuda_fp8_trace_end(const char *name, double bytes, double flops) {
    if (!g_on) return;
    CUDA_CHECK(cudaEventRecord(g_e1, 0));
    CUDA_CHECK(cudaEventSynchronize(g_e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, g_e0, g_e1));
    int i = 0;
    while (i < g_n && strcmp(g_tr[i].name, name)) i++;
    if (i == g_n) {
        if (g_n == TR_MAX) i = TR_MAX - 1;
        else {
            g_n++;
            memset(&g_tr[i], 0, sizeof g_tr[i]);
            snprintf(g_tr[i].name, sizeof g_tr[i].name, "%s", name);
        }
    }
    g_tr[i].calls++;
    g_tr[i].ms += ms;
    g_tr[i].bytes += bytes;
    g_tr[i].flops += flops;
}

extern "C" void cuda_fp8_trace_print(FILE *f, double peak_gbs, double peak_tflops) {
    double ms = 0, by = 0, gms = 0;
    fprintf(f, "  %-34s %5s %9s %8s %8s %6s %8s %6s\n", "kernel", "calls", "ms", "GB", "GB/s", "%bw",
            "TFLOP/s", "%mma");
    for (int i = 0; i < g_n; i++) {
        double t = g_tr[i].ms, gbs = t > 0 ? g_tr[i].bytes / t / 1e6 : 0,
               tf = t > 0 ? g_tr[i].flops / t / 1e9 : 0;
        fprintf(f, "  %-34s %5d %9.3f %8.3f %8.0f %5.1f%%", g_tr[i].name, g_tr[i].calls, t,
                g_tr[i].bytes / 1e9, gbs, 100 * gbs / peak_gbs);
        if (g_tr[i].flops > 0) fprintf(f, " %8.1f %5.1f%%\n", tf, 100 * tf / peak_tflops);
        else fprintf(f, " %8s %6s\n", "-", "-");
        ms += t;
        by += g_tr[i].bytes;
        if (g_tr[i].flops > 0) gms += t;
    }
    fprintf(f, "  %-34s %5s %9.3f %8.3f   (GEMMs %.3f ms, the rest %.3f ms)\n", "total (serialised)", "", ms,
            by / 1e9, gms, ms - gms);
}
