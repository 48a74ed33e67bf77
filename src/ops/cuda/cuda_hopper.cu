// cuda_hopper.cu — whether our Hopper kernels (the wgmma + TMA grouped GEMMs: cuda_grouped.cu,
// cuda_grouped_fp8.cu) can run here, asked once: an sm_90 GPU, a build carrying sm_90a code (a probe kernel
// says which code it was compiled as), and the driver's cuTensorMapEncodeTiled. Must not hold: the kernels.
#include <cuda.h>
#include "ops/cuda/cuda_common.h"

__global__ void hopper_probe(int *ok) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    *ok = 1;
#else
    *ok = 0;
#endif
}

extern "C" int cuda_hopper_tma(int *sms, void **encode) {
    static int ready = -1, nsm;
    static void *fn;
    if (ready < 0) {
        ready = 0;
        int dev, n = 0, major, minor, h = 0, *d;
        if (cudaGetDeviceCount(&n) != cudaSuccess || n < 1) {
            (void)cudaGetLastError(); // no GPU: nothing to report here
            return 0;
        }
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, dev));
        if (major != 9 || minor != 0) return 0;
        CUDA_CHECK(cudaMalloc(&d, sizeof(int)));
        hopper_probe<<<1, 1>>>(d);
        KCHECK("hopper_probe");
        CUDA_CHECK(cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaFree(d));
        if (!h) return 0; // built without sm_90a code
        cudaDriverEntryPointQueryResult q;
        CUDA_CHECK(
            cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
        if (q != cudaDriverEntryPointSuccess || !fn) return 0;
        ready = 1;
    }
    *sms = nsm;
    *encode = fn;
    return ready;
}
