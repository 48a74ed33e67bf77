// gputrace.c — a measurement tool, not part of moe: a CUPTI activity tracer loaded into any CUDA
// program with LD_PRELOAD (GPUTRACE_OUT=FILE). It writes one line per kernel, memcpy, memset and
// CUDA runtime call, with CUPTI's start and end times (ns, one clock for the GPU and the host):
//   K start end name | C start end bytes copykind | S start end bytes | A start end api-name
// gputrace.py turns the file into where a step's wall time goes: kernels, and the GPU's idle gaps
// with the host calls that were running in them. Build (scripts/device/pack_libs.sh does; host_gaps.sh
// runs it):
//   gcc -O2 -shared -fPIC -I$CUDA/include gputrace.c -o libgputrace.so -L$CUPTI_DIR -lcupti
#include <cupti.h>
#include <stdio.h>
#include <stdlib.h>

static FILE *g_out;

#define CK(call) \
    do { \
        CUptiResult r_ = (call); \
        if (r_ != CUPTI_SUCCESS) { \
            const char *s_ = "?"; \
            cuptiGetResultString(r_, &s_); \
            fprintf(stderr, "gputrace: %s failed: %s\n", #call, s_); \
            exit(1); \
        } \
    } while (0)

static void CUPTIAPI buf_requested(uint8_t **buf, size_t *size, size_t *max_records) {
    *size = 8u << 20;
    *buf = aligned_alloc(8, *size);
    if (!*buf) {
        fprintf(stderr, "gputrace: out of memory\n");
        exit(1);
    }
    *max_records = 0;
}

static void CUPTIAPI buf_completed(CUcontext ctx, uint32_t stream, uint8_t *buf, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buf, valid, &rec) == CUPTI_SUCCESS) {
        switch (rec->kind) {
            case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
                const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
                fprintf(g_out, "K %llu %llu %s\n", (unsigned long long)k->start, (unsigned long long)k->end,
                        k->name ? k->name : "?");
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMCPY: {
                const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
                fprintf(g_out, "C %llu %llu %llu %u\n", (unsigned long long)m->start,
                        (unsigned long long)m->end, (unsigned long long)m->bytes, (unsigned)m->copyKind);
                break;
            }
            case CUPTI_ACTIVITY_KIND_MEMSET: {
                const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
                fprintf(g_out, "S %llu %llu %llu\n", (unsigned long long)m->start, (unsigned long long)m->end,
                        (unsigned long long)m->bytes);
                break;
            }
            case CUPTI_ACTIVITY_KIND_RUNTIME: {
                const CUpti_ActivityAPI *a = (const CUpti_ActivityAPI *)rec;
                const char *name = "?";
                cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
                fprintf(g_out, "A %llu %llu %s\n", (unsigned long long)a->start, (unsigned long long)a->end,
                        name);
                break;
            }
            default: break;
        }
    }
    free(buf);
}

static void finish(void) {
    cuptiActivityFlushAll(1);
    if (g_out) fflush(g_out);
}

__attribute__((constructor)) static void start(void) {
    const char *path = getenv("GPUTRACE_OUT");
    if (!path) return;
    g_out = fopen(path, "w");
    if (!g_out) {
        fprintf(stderr, "gputrace: cannot open %s\n", path);
        exit(1);
    }
    CK(cuptiActivityRegisterCallbacks(buf_requested, buf_completed));
    CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    CK(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME));
    CK(cuptiActivityFlushPeriod(200));
    atexit(finish);
}
