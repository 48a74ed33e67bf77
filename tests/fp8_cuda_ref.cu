// fp8_cuda_ref.cu — ops/numerics.h's e4m3 conversions against NVIDIA's own (cuda_fp8.h), for
// tests/test_fp8_cuda_ref.sh: on the host, e4m3_rn_bits against __nv_cvt_float_to_fp8(x, __NV_SATFINITE,
// __NV_E4M3) (cuda_fp8.h's software path) on every `stride`-th float32 bit pattern (stride 1: all 2^32) and
// e4m3_to_f32 against __nv_cvt_fp8_to_halfraw on all 256 codes; where a GPU is present (sm_89 or later),
// also on the device, where the conversion is the PTX cvt.rn.satfinite.e4m3x2.f32 instruction the GPU
// quantiser will use: every float32 bit pattern, our integer encoder compiled for the device against it.
// Must not hold: anything the moe binary uses (a check, built by the script, not by CMake).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
extern "C" {
#include "ops/numerics.h"
}

__global__ void differ_on_device(uint64_t base, unsigned long long *bad) {
    uint64_t u = base + (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
    float x = f32_of_bits((uint32_t)u);
    if (e4m3_rn_bits(x) != (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3)) atomicAdd(bad, 1ull);
}

static int device_check(void) {
    int n = 0;
    cudaDeviceProp p;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0 || cudaGetDeviceProperties(&p, 0) != cudaSuccess ||
        p.major * 10 + p.minor < 89) {
        printf("fp8_cuda_ref: no sm_89+ GPU here, device check skipped\n");
        return 0;
    }
    unsigned long long *bad, h = 0;
    if (cudaMalloc(&bad, sizeof *bad) != cudaSuccess || cudaMemset(bad, 0, sizeof *bad) != cudaSuccess)
        return 1;
    for (uint64_t base = 0; base < (1ull << 32); base += 1ull << 30)
        differ_on_device<<<1 << 22, 256>>>(base, bad);
    if (cudaMemcpy(&h, bad, sizeof h, cudaMemcpyDeviceToHost) != cudaSuccess) {
        printf("FAIL: device check did not run: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 1;
    }
    cudaFree(bad);
    printf("fp8_cuda_ref: device (%s): %llu of 2^32 float32 encode unlike cvt.rn.satfinite.e4m3x2.f32\n",
           p.name, h);
    return h != 0;
}

int main(int argc, char **argv) {
    uint64_t stride = argc > 1 ? strtoull(argv[1], NULL, 10) : 1, n = 0, bad = 0;
    if (stride < 1) stride = 1;
    for (uint64_t u = 0; u < (1ull << 32); u += stride, n++) {
        float x = f32_of_bits((uint32_t)u);
        uint8_t a = e4m3_rn_bits(x), b = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
        if (a != b && bad++ < 5) printf("FAIL: %08x: ours %02x, cuda_fp8.h %02x\n", (unsigned)u, a, b);
    }
    int dbad = 0;
    for (int c = 0; c < 256; c++) {
        __half_raw r = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)c, __NV_E4M3);
        __half h;
        memcpy(&h, &r, sizeof h);
        float f = __half2float(h), g = e4m3_to_f32((uint8_t)c);
        dbad += !(f == g || (f != f && g != g));
    }
    printf("fp8_cuda_ref: host: %llu of %llu float32 encode, %d of 256 codes decode unlike cuda_fp8.h\n",
           (unsigned long long)bad, (unsigned long long)n, dbad);
    return (bad || dbad) | device_check();
}
