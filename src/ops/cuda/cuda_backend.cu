// cuda_backend.cu — the CUDA Backends (float32 buffers): device memory, the error hints, the A/B switches,
// the scratch workspace, and the two tables that gather every cuda op: "cuda" (bf16 tensor-core GEMMs
// and attention, the GEMMs' bf16 copy of the weights) and "cuda-fp32" (all float32); they differ
// only there (cuda_gemm.cu, cuda_attention_tc.cu).
// Everything runs on the legacy default stream, so ops are ordered as they are called and a
// to_host copy waits for the kernels before it (a small to_device does not: it is staged and enqueued). Must
// not hold: kernels (cuda_nn.cu, cuda_optim.cu, cuda_attention*.cu, cuda_gemm.cu) or any knowledge of the
// model.
#include <stdlib.h>
#include <string.h>
#include "ops/cuda/cuda_common.h"

extern "C" const char *cuda_hint(cudaError_t e) {
    switch (e) {
        case cudaErrorMemoryAllocation:
            return "out of device memory: use a smaller --batch/--seq-len or model, or free the GPU "
                   "(nvidia-smi)";
        case cudaErrorNoDevice:
        case cudaErrorInsufficientDriver:
            return "no usable CUDA GPU or driver: check nvidia-smi and CUDA_VISIBLE_DEVICES, or run with the "
                   "cpu backend";
        case cudaErrorNoKernelImageForDevice:
        case cudaErrorUnsupportedPtxVersion:
            return "this binary was not built for this GPU: rebuild with -DCMAKE_CUDA_ARCHITECTURES=<your "
                   "sm>";
        case cudaErrorIllegalAddress:
        case cudaErrorLaunchFailure:
            return "a kernel touched memory outside its buffers: rerun under compute-sanitizer, or "
                   "MOE_CUDA_SYNC=1 to name the kernel";
        case cudaErrorInvalidConfiguration:
            return "a launch had a bad grid/block/shared-memory size (shape too large for this kernel?)";
        default: return "rerun with MOE_CUDA_SYNC=1 (or under compute-sanitizer) to find the failing call";
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

extern "C" int cuda_env_switch(const char *name, const char *on, const char *off, const char *on_is,
                               const char *off_is) {
    const char *e = getenv(name);
    if (!e || !*e || !strcmp(e, on)) return 1;
    if (!strcmp(e, off)) return 0;
    DIE("%s must be %s (%s, the default) or %s (%s) (got '%s')", name, on, on_is, off, off_is, e);
}

static cublasHandle_t g_cublas;
static void *g_ws;
static size_t g_ws_bytes;

extern "C" cublasHandle_t cuda_cublas(void) { return g_cublas; }

static void *cuda_alloc(size_t bytes) {
    alloc_note_backend();
    void *p = NULL;
    size_t n = bytes ? bytes : 1; // a unique non-NULL pointer even for 0 bytes, like calloc
    cudaError_t e = cudaMalloc(&p, n);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        cudaGetLastError();
        cudaMemGetInfo(&fr, &tot);
        char need[32], have[32], all[32];
        fmt_bytes(need, sizeof need, (double)n);
        fmt_bytes(have, sizeof have, (double)fr);
        fmt_bytes(all, sizeof all, (double)tot);
        DIE("%s:%d: cudaMalloc(%zu bytes = %s) failed: %s; %s free of %s on the GPU; hint: %s", __FILE__,
            __LINE__, n, need, cudaGetErrorString(e), have, all, cuda_hint(e));
    }
    CUDA_CHECK(cudaMemset(p, 0, n));
    return p;
}

// ops.h alloc_holes: virtual memory with the holes' pages unbacked (cuda_vm.cu); without holes a buffer as
// alloc's (nothing to leave out)
static float *cuda_alloc_holes_be(size_t n, const size_t *hole, int nh) {
    return nh ? cuda_alloc_holes(n, hole, nh) : (float *)cuda_alloc(n * sizeof(float));
}

static void cuda_free(void *p) {
    if (cuda_bf16_params_free(p) || cuda_holes_free(p)) return;
    cuda_bf16_shadow_freed(p);
    if (p) CUDA_CHECK(cudaFree(p));
}

extern "C" void *cuda_workspace(size_t bytes) {
    if (bytes > g_ws_bytes) {
        if (g_ws) CUDA_CHECK(cudaFree(g_ws)); // synchronises: no kernel still uses the old one
        g_ws_bytes = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes;
        CUDA_CHECK(cudaMalloc(&g_ws, g_ws_bytes));
    }
    return g_ws;
}

// Small host-to-device copies (up to UP_SLOT bytes: the MoE layer's plan and router coefficients, a few
// a layer) do not wait for the GPU: the bytes go into one slot of a pinned ring and the copy is enqueued
// on the stream, after the kernels before it and before the ones after it; a slot is written again only
// after the event behind its last copy (UP_SLOTS copies later). A pageable cudaMemcpy would drain the
// stream first and leave the GPU idle while the host launches again (docs/PERFORMANCE.md). Larger
// copies are synchronous.
#define UP_SLOT ((size_t)64 << 10)
#define UP_SLOTS 64
static struct {
    char *ring;
    cudaEvent_t ev[UP_SLOTS];
    unsigned long long n; // copies so far: the next takes slot n % UP_SLOTS, used before once n >= UP_SLOTS
} g_up;

static int upload_async(void *dst, const void *src, size_t bytes) {
    if (bytes > UP_SLOT) return 0;
    if (!g_up.ring) {
        CUDA_CHECK(cudaHostAlloc((void **)&g_up.ring, UP_SLOT * UP_SLOTS, cudaHostAllocDefault));
        for (int i = 0; i < UP_SLOTS; i++)
            CUDA_CHECK(cudaEventCreateWithFlags(&g_up.ev[i], cudaEventDisableTiming));
    }
    int s = (int)(g_up.n % UP_SLOTS);
    if (g_up.n++ >= UP_SLOTS) CUDA_CHECK(cudaEventSynchronize(g_up.ev[s]));
    char *slot = g_up.ring + (size_t)s * UP_SLOT;
    memcpy(slot, src, bytes);
    CUDA_CHECK(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, 0));
    CUDA_CHECK(cudaEventRecord(g_up.ev[s], 0));
    return 1;
}

static void cuda_to_device(void *dst, const void *src, size_t bytes) {
    if (cuda_bf16_params_to_device(dst, src, bytes)) return;
    cuda_bf16_shadow_write(dst, bytes);
    if (bytes && !upload_async(dst, src, bytes))
        CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
}
static void cuda_to_host(void *dst, const void *src, size_t bytes) {
    if (cuda_bf16_params_to_host(dst, src, bytes)) return;
    if (bytes) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
}
static void cuda_copy(void *dst, const void *src, size_t bytes) {
    cuda_bf16_shadow_write(dst, bytes);
    if (bytes && dst != src) CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice));
}
// to_hid where the hidden format is float32 (cuda-fp32): a copy
static void cuda_to_hid_f32(void *out, const float *inp, size_t n) { cuda_copy(out, inp, n * sizeof(float)); }
// to_hid_rows where it is float32: the rows are the format already
static void cuda_to_hid_rows_f32(float *x, int N, int C) { (void)x, (void)N, (void)C; }
static void cuda_copy_strided_f32(void *dst, int dh, const void *src, int sh, Stride3 s, float a, int acc) {
    cuda_copy_strided(dst, dh, src, sh, s, a, acc, 0);
}
static void cuda_copy_strided_bf16(void *dst, int dh, const void *src, int sh, Stride3 s, float a, int acc) {
    cuda_copy_strided(dst, dh, src, sh, s, a, acc, 1);
}
static void cuda_zero(void *p, size_t bytes) {
    cuda_bf16_shadow_write(p, bytes);
    if (bytes) CUDA_CHECK(cudaMemset(p, 0, bytes));
}
static void cuda_sync(void) { CUDA_CHECK(cudaDeviceSynchronize()); }

extern "C" int backend_cuda_available(void) {
    static int avail = -1;
    if (avail < 0) {
        int n = 0;
        cudaError_t e = cudaGetDeviceCount(&n);
        if (e != cudaSuccess) cudaGetLastError(); // clear: no driver / no device is not an error here
        avail = e == cudaSuccess && n > 0;
    }
    return avail;
}

// The ops both backends share (everything but the GEMMs).
static void fill_common(Backend *be) {
    be->alloc = cuda_alloc;
    be->free = cuda_free;
    be->alloc_holes = cuda_alloc_holes_be;
    be->to_device = cuda_to_device;
    be->to_host = cuda_to_host;
    be->copy = cuda_copy;
    be->zero = cuda_zero;
    be->sync = cuda_sync;
    be->embedding_fwd = cuda_embedding_fwd;
    be->embedding_bwd = cuda_embedding_bwd;
    be->rmsnorm_fwd = cuda_rmsnorm_fwd;
    be->add_rmsnorm_fwd = cuda_add_rmsnorm_fwd;
    be->rmsnorm_bwd = cuda_rmsnorm_bwd;
    be->rmsnorm_part = cuda_rmsnorm_part;
    be->rmsnorm_fwd_part = cuda_rmsnorm_fwd_part;
    be->rmsnorm_bwd_part = cuda_rmsnorm_bwd_part;
    be->rope_fwd = cuda_rope_fwd;
    be->rope_bwd = cuda_rope_bwd;
    be->rope_rows = cuda_rope_rows;
    be->rope_fwd_hid = cuda_rope_fwd_f32;
    be->to_hid = cuda_to_hid_f32;
    be->rope_bwd_hid = cuda_rope_bwd;
    be->to_hid_rows = cuda_to_hid_rows_f32;
    be->rope_yarn = cuda_rope_yarn;
    be->copy_strided = cuda_copy_strided_f32;
    be->dropout = cuda_dropout;
    be->attention_drop_fwd = cuda_attention_drop_fwd; // (float32 kernels; "cuda" sets its own below)
    be->attention_drop_bwd = cuda_attention_drop_bwd;
    be->attention_fwd = cuda_attention_fwd;
    be->attention_bwd = cuda_attention_bwd;
    be->swiglu_fwd = cuda_swiglu_fwd;
    be->swiglu_bwd = cuda_swiglu_bwd;
    be->gather_rows = cuda_gather_rows;
    be->combine_rows = cuda_combine_rows;
    be->router_topk = cuda_router_topk;
    be->router_bwd = cuda_router_bwd;
    be->plan_counts = cuda_plan_counts;
    be->plan_rows = cuda_plan_rows;
    be->cross_entropy_fwd_bwd = cuda_cross_entropy_fwd_bwd_f32;
    be->cross_entropy_fwd = cuda_cross_entropy_fwd;
    be->ce_part = cuda_ce_part;
    be->ce_finish = cuda_ce_finish_f32;
    be->mul = cuda_mul;
    be->sigmoid_fwd = cuda_sigmoid_fwd;
    be->sigmoid_bwd = cuda_sigmoid_bwd;
    be->axpy = cuda_axpy;
    be->add = cuda_add;
    be->runs_create = cuda_runs_create;
    be->runs_free = cuda_runs_free;
    be->sumsq_runs = cuda_sumsq_runs;
    be->dw_sumsq_take = cuda_dw_sumsq_take;
    be->adamw_runs = cuda_adamw_runs;
}

static void cuda_bf16_shadow_none(const float *p, size_t n) {
    (void)p;
    (void)n;
} // cuda-fp32: float32 GEMMs

static Backend g_be_bf16, g_be_f32;
static int g_local_rank; // backend_cuda_set_rank: the GPU is g_local_rank % (visible GPUs)

extern "C" void backend_cuda_set_rank(int local_rank) { g_local_rank = local_rank; }

extern "C" int backend_cuda_gpus(size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
    if (!backend_cuda_available()) return 0;
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    if (g_cublas) CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
    return n;
}

extern "C" int backend_cuda_device_name(char *name, size_t n) {
    if (n) name[0] = 0;
    if (!g_cublas || !n) return 0;
    int dev = 0;
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaGetDeviceProperties(&p, dev));
    snprintf(name, n, "%s", p.name);
    return 1;
}

// Both tables, the device and the cuBLAS handle, once.
static void cuda_init(void) {
    if (g_cublas) return;
    if (!backend_cuda_available())
        DIE("the cuda backend needs a CUDA GPU, and none is visible: check nvidia-smi and "
            "CUDA_VISIBLE_DEVICES, "
            "or use the cpu backend");
    // one GPU per process: the node-local rank picks it (under mpirun/srun; 0 otherwise)
    int ngpu = 0;
    CUDA_CHECK(cudaGetDeviceCount(&ngpu));
    CUDA_CHECK(cudaSetDevice(g_local_rank % ngpu));
    CUBLAS_CHECK(cublasCreate(&g_cublas));
    // FP32 math without TF32 for the float32 GEMMs; GEMMs with bf16 operands use tensor cores anyway
    CUBLAS_CHECK(cublasSetMathMode(g_cublas, CUBLAS_DEFAULT_MATH));
    CUBLAS_CHECK(cublasSetPointerMode(g_cublas, CUBLAS_POINTER_MODE_HOST));
    fill_common(&g_be_bf16);
    g_be_bf16.name = "cuda";
    g_be_bf16.matmul_fwd = cuda_matmul_fwd_bf16;
    g_be_bf16.matmul_bwd = cuda_matmul_bwd_bf16;
    g_be_bf16.matmul_fwd_multi = cuda_matmul_fwd_multi_bf16;
    g_be_bf16.matmul_bwd_multi = cuda_matmul_bwd_multi_bf16;
    g_be_bf16.grouped_matmul_fwd = cuda_grouped_matmul_fwd_bf16;
    g_be_bf16.grouped_matmul_bwd = cuda_grouped_matmul_bwd_bf16;
    g_be_bf16.hid = FMT_BF16;
    g_be_bf16.grouped_swiglu_fwd = cuda_grouped_swiglu_fwd_bf16;
    g_be_bf16.grouped_down_fwd = cuda_grouped_down_fwd_bf16;
    g_be_bf16.grouped_swiglu_bwd = cuda_grouped_swiglu_bwd_bf16;
    g_be_bf16.grouped_matmul_bwd2 = cuda_grouped_matmul_bwd2_bf16;
    g_be_bf16.gather_rows_hid = cuda_gather_rows_hid_bf16;
    g_be_bf16.rmsnorm_fwd_hid = cuda_rmsnorm_fwd_hid_bf16;
    g_be_bf16.gather_dot_scale = cuda_gather_dot_scale_bf16;
    g_be_bf16.bf16_shadow = cuda_bf16_shadow;
    g_be_bf16.alloc_bf16_params = cuda_alloc_bf16_params;
    g_be_bf16.attention_fwd = cuda_attention_fwd_tc;
    g_be_bf16.attention_bwd = cuda_attention_bwd_tc;
    g_be_bf16.attention_fwd_v = cuda_attention_fwd_tcv;
    g_be_bf16.attention_bwd_v = cuda_attention_bwd_tcv;
    g_be_bf16.attention_drop_fwd = cuda_attention_drop_fwd_bf16;
    g_be_bf16.attention_drop_bwd = cuda_attention_drop_bwd_bf16;
    g_be_bf16.rope_fwd_hid = cuda_rope_fwd_bf16;
    g_be_bf16.to_hid = cuda_f32_to_bf16;
    g_be_bf16.rope_bwd_hid = cuda_rope_bwd_hid_bf16;
    g_be_bf16.to_hid_rows = cuda_to_hid_rows_bf16;
    g_be_bf16.copy_strided = cuda_copy_strided_bf16;
    g_be_bf16.cross_entropy_fwd_bwd = cuda_cross_entropy_fwd_bwd_bf16;
    g_be_bf16.ce_finish = cuda_ce_finish_bf16;
    fill_common(&g_be_f32);
    g_be_f32.name = "cuda-fp32";
    g_be_f32.matmul_fwd = cuda_matmul_fwd_f32;
    g_be_f32.matmul_bwd = cuda_matmul_bwd_f32;
    g_be_f32.matmul_fwd_multi = cuda_matmul_fwd_multi_f32;
    g_be_f32.matmul_bwd_multi = cuda_matmul_bwd_multi_f32;
    g_be_f32.grouped_matmul_fwd = cuda_grouped_matmul_fwd_f32;
    g_be_f32.grouped_matmul_bwd = cuda_grouped_matmul_bwd_f32;
    g_be_f32.hid = FMT_F32;
    g_be_f32.grouped_swiglu_fwd = cuda_grouped_swiglu_fwd_f32;
    g_be_f32.grouped_down_fwd = cuda_grouped_down_fwd_f32;
    g_be_f32.grouped_swiglu_bwd = cuda_grouped_swiglu_bwd_f32;
    g_be_f32.grouped_matmul_bwd2 = cuda_grouped_matmul_bwd2_f32;
    g_be_f32.gather_rows_hid = cuda_gather_rows_hid_f32;
    g_be_f32.rmsnorm_fwd_hid = cuda_rmsnorm_fwd_hid_f32;
    g_be_f32.gather_dot_scale = cuda_gather_dot_scale_f32;
    g_be_f32.bf16_shadow = cuda_bf16_shadow_none;
}

extern "C" const Backend *backend_cuda(void) {
    cuda_init();
    return &g_be_bf16;
}

extern "C" const Backend *backend_cuda_fp32(void) {
    cuda_init();
    return &g_be_f32;
}
