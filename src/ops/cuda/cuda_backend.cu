// cuda_backend.cu — the CUDA Backend (float32 buffers): device memory, the error hints, the
// scratch workspace, GEMMs through cuBLAS, and the table that gathers every cuda op.
// Everything runs on the legacy default stream, so ops are ordered as they are called and a
// to_host copy waits for the kernels before it. Must not hold: kernels (cuda_nn.cu,
// cuda_attention.cu) or any knowledge of the model.
#include <stdlib.h>
#include <string.h>
#include "ops/cuda/cuda_common.h"

extern "C" const char *cuda_hint(cudaError_t e) {
    switch (e) {
    case cudaErrorMemoryAllocation:
        return "out of device memory: use a smaller --batch/--seq-len or model, or free the GPU (nvidia-smi)";
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return "no usable CUDA GPU or driver: check nvidia-smi and CUDA_VISIBLE_DEVICES, or run with the cpu backend";
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
        return "this binary was not built for this GPU: rebuild with -DCMAKE_CUDA_ARCHITECTURES=<your sm>";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
        return "a kernel touched memory outside its buffers: rerun under compute-sanitizer, or MOE_CUDA_SYNC=1 to name the kernel";
    case cudaErrorInvalidConfiguration:
        return "a launch had a bad grid/block/shared-memory size (shape too large for this kernel?)";
    default:
        return "rerun with MOE_CUDA_SYNC=1 (or under compute-sanitizer) to find the failing call";
    }
}

extern "C" const char *cublas_status_name(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    default: return "CUBLAS_STATUS_(unknown)";
    }
}

extern "C" int cuda_sync_each_launch(void) {
    static int v = -1;
    if (v < 0) {
        const char *s = getenv("MOE_CUDA_SYNC");
        v = s && *s && strcmp(s, "0") != 0;
    }
    return v;
}

static cublasHandle_t g_cublas;
static void *g_ws;
static size_t g_ws_bytes;

extern "C" cublasHandle_t cuda_cublas(void) { return g_cublas; }

static void *cuda_alloc(size_t bytes) {
    void *p = NULL;
    size_t n = bytes ? bytes : 1;   // a unique non-NULL pointer even for 0 bytes, like calloc
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        char need[32], have[32], all[32];
        fmt_bytes(need, sizeof need, (double)n);
        fmt_bytes(have, sizeof have, (double)fr);
        fmt_bytes(all, sizeof all, (double)tot);
        DIE("%s:%d: cudaMalloc(%zu bytes = %s) failed: %s; %s free of %s on the GPU; hint: %s", __FILE__, __LINE__,
            n, need, cudaGetErrorString(e), have, all, cuda_hint(e));
    }
    CUDA_CHECK(cudaMemset(p, 0, n));
    return p;
}

static void cuda_free(void *p) { if (p) CUDA_CHECK(cudaFree(p)); }

extern "C" void *cuda_workspace(size_t bytes) {
    if (bytes > g_ws_bytes) {
        if (g_ws) CUDA_CHECK(cudaFree(g_ws));   // synchronises: no kernel still uses the old one
        g_ws_bytes = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes;
        CUDA_CHECK(cudaMalloc(&g_ws, g_ws_bytes));
    }
    return g_ws;
}

static void cuda_to_device(void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
static void cuda_to_host(void *dst, const void *src, size_t bytes) {
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
static void cuda_copy(void *dst, const void *src, size_t bytes) {
    if (bytes && dst != src) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}
static void cuda_zero(void *p, size_t bytes) { if (bytes) CUDA_CHECK(cudaMemset(p, 0, bytes)); }
static void cuda_sync(void) { CUDA_CHECK(cudaDeviceSynchronize()); }

// Row-major GEMMs through column-major cuBLAS: a row-major (R,C) array is the column-major (C,R)
// array, so out = inp W^T (row-major) is out^T = W^T' inp^T in column-major terms, etc.
// Plain FP32 math (CUBLAS_DEFAULT_MATH: no TF32), so results match the CPU to float32 rounding.
static void cuda_matmul_fwd(float *out, const float *inp, const float *w, int N, int K, int O, int accumulate) {
    if (N <= 0 || O <= 0) return;
    if (K <= 0) { if (!accumulate) cuda_zero(out, sizeof(float) * (size_t)N * O); return; }
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    // out^T (O,N) = W (O,K) . inp^T (K,N); W is column-major (K,O) with ld K, used transposed
    CUBLAS_CHECK(cublasSgemm(g_cublas, CUBLAS_OP_T, CUBLAS_OP_N, O, N, K, &one, w, K, inp, K, &beta, out, O));
}

static void cuda_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                            int N, int K, int O) {
    if (N <= 0 || K <= 0 || O <= 0) return;
    const float one = 1.0f;
    // dinp^T (K,N) += W^T (K,O) . dout^T (O,N)
    if (dinp) CUBLAS_CHECK(cublasSgemm(g_cublas, CUBLAS_OP_N, CUBLAS_OP_N, K, N, O, &one, w, K, dout, O, &one, dinp, K));
    // dw^T (K,O) += inp^T (K,N) . dout (N,O)
    if (dw) CUBLAS_CHECK(cublasSgemm(g_cublas, CUBLAS_OP_N, CUBLAS_OP_T, K, O, N, &one, inp, K, dout, O, &one, dw, K));
}

// One GEMM per non-empty group (off is a host array). Later: a single grouped kernel.
static void cuda_grouped_matmul_fwd(float *out, const float *inp, const float *w, const int64_t *off, int G,
                                    int K, int O) {
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g], n = off[g + 1] - off[g];
        if (n <= 0) continue;
        cuda_matmul_fwd(out + r0 * O, inp + r0 * K, w + (size_t)g * O * K, (int)n, K, O, 0);
    }
}

static void cuda_grouped_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                                    const int64_t *off, int G, int K, int O) {
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g], n = off[g + 1] - off[g];
        if (n <= 0) continue;
        cuda_matmul_bwd(dinp ? dinp + r0 * K : NULL, dw ? dw + (size_t)g * O * K : NULL, dout + r0 * O,
                        inp + r0 * K, w + (size_t)g * O * K, (int)n, K, O);
    }
}

extern "C" int backend_cuda_available(void) {
    static int avail = -1;
    if (avail < 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess) cudaGetLastError();   // clear: no driver / no device is not an error here
        avail = e == cudaSuccess && n > 0;
    }
    return avail;
}

extern "C" const Backend *backend_cuda(void) {
    static Backend be;
    if (!g_cublas) {
        be.name = "cuda";
        be.alloc = cuda_alloc;
        be.free = cuda_free;
        be.to_device = cuda_to_device;
        be.to_host = cuda_to_host;
        be.copy = cuda_copy;
        be.zero = cuda_zero;
        be.sync = cuda_sync;
        be.matmul_fwd = cuda_matmul_fwd;
        be.matmul_bwd = cuda_matmul_bwd;
        be.grouped_matmul_fwd = cuda_grouped_matmul_fwd;
        be.grouped_matmul_bwd = cuda_grouped_matmul_bwd;
        be.embedding_fwd = cuda_embedding_fwd;
        be.embedding_bwd = cuda_embedding_bwd;
        be.rmsnorm_fwd = cuda_rmsnorm_fwd;
        be.rmsnorm_bwd = cuda_rmsnorm_bwd;
        be.rope_fwd = cuda_rope_fwd;
        be.rope_bwd = cuda_rope_bwd;
        be.attention_fwd = cuda_attention_fwd;
        be.attention_bwd = cuda_attention_bwd;
        be.swiglu_fwd = cuda_swiglu_fwd;
        be.swiglu_bwd = cuda_swiglu_bwd;
        be.gather_rows = cuda_gather_rows;
        be.scatter_add_rows = cuda_scatter_add_rows;
        be.scale_rows = cuda_scale_rows;
        be.row_dot = cuda_row_dot;
        be.cross_entropy_fwd_bwd = cuda_cross_entropy_fwd_bwd;
        be.cross_entropy_fwd = cuda_cross_entropy_fwd;
        be.mul = cuda_mul;
        be.axpy = cuda_axpy;
        be.scale = cuda_scale;
        be.sumsq = cuda_sumsq;
        be.adamw = cuda_adamw;
        if (!backend_cuda_available())
            DIE("the cuda backend needs a CUDA GPU, and none is visible: check nvidia-smi and CUDA_VISIBLE_DEVICES, "
                "or use the cpu backend");
        CUDA_CHECK(cudaSetDevice(0));
        CUBLAS_CHECK(cublasCreate(&g_cublas));
        CUBLAS_CHECK(cublasSetMathMode(g_cublas, CUBLAS_DEFAULT_MATH));   // FP32, no TF32
        CUBLAS_CHECK(cublasSetPointerMode(g_cublas, CUBLAS_POINTER_MODE_HOST));
    }
    return &be;
}
