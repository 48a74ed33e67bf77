// cuda_stub.c — backend_cuda() and backend_cuda_fp32() for builds without CUDA (MOE_CUDA=OFF): reports "not
// available". Must not hold: anything else (the real backend is src/ops/cuda/).
#include "core/common.h"
#include "ops/ops.h"

int backend_cuda_available(void) { return 0; }
void backend_cuda_set_rank(int local_rank) { (void)local_rank; }
int backend_cuda_grouped_kernel(void) { return 0; }
int backend_cuda_gpus(size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    return 0;
}
int backend_cuda_device_name(char *name, size_t n) {
    if (n) name[0] = 0;
    return 0;
}

const Backend *backend_cuda(void) {
    DIE("this build has no CUDA backend: rebuild with a CUDA compiler (nvcc) and -DMOE_CUDA=ON, "
        "or use the cpu backend");
}

const Backend *backend_cuda_fp32(void) { return backend_cuda(); }

const Backend *backend_cuda_fp8(int fp32, int dense) {
    (void)fp32, (void)dense;
    return backend_cuda();
}
