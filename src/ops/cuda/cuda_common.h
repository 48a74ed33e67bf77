// cuda_common.h — what every CUDA source of the cuda backend shares: the checked-call macros
// (file:line, the call, the error string and a hint, then DIE), launch checks, the element-type
// helpers that let a kernel later read bf16 instead of float, the scratch workspace and the cuBLAS
// handle. Must not hold: kernels, or any knowledge of the model.
#pragma once
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

extern "C" {
#include "core/common.h"
#include "ops/ops.h"
}
#include "ops/cuda/cuda_grouped.h"

// Hint for a failed CUDA runtime call (never NULL).
extern "C" const char *cuda_hint(cudaError_t e);
extern "C" const char *cublas_status_name(cublasStatus_t s);

#define CUDA_CHECK(call) \
    do { \
        cudaError_t _e = (call); \
        if (_e != cudaSuccess) \
            DIE("%s:%d: %s failed: %s (%s); hint: %s", __FILE__, __LINE__, #call, cudaGetErrorName(_e), \
                cudaGetErrorString(_e), cuda_hint(_e)); \
    } while (0)
#define CUBLAS_CHECK(call) \
    do { \
        cublasStatus_t _s = (call); \
        if (_s != CUBLAS_STATUS_SUCCESS) \
            DIE("%s:%d: %s failed: %s; hint: %s", __FILE__, __LINE__, #call, cublas_status_name(_s), \
                _s == CUBLAS_STATUS_ALLOC_FAILED ? "out of device memory for cuBLAS's workspace" \
                    : _s == CUBLAS_STATUS_NOT_INITIALIZED \
                    ? "no usable CUDA device or driver (check nvidia-smi)" \
                    : "the GEMM shape or leading dimensions are invalid, or an earlier kernel failed " \
                      "(rerun with MOE_CUDA_SYNC=1)"); \
    } while (0)

// After every kernel launch: the launch error, and with MOE_CUDA_SYNC=1 in the environment a full
// synchronisation so that an asynchronous fault is reported at the kernel that caused it.
extern "C" int cuda_sync_each_launch(void);
#define KCHECK(name) \
    do { \
        cudaError_t _e = cudaGetLastError(); \
        if (_e == cudaSuccess && cuda_sync_each_launch()) _e = cudaDeviceSynchronize(); \
        if (_e != cudaSuccess) \
            DIE("%s:%d: kernel %s failed: %s (%s); hint: %s", __FILE__, __LINE__, name, \
                cudaGetErrorName(_e), cudaGetErrorString(_e), cuda_hint(_e)); \
    } while (0)

// An A/B switch in the environment (its caller reads it once): NAME unset, empty or ON gives 1, OFF gives 0,
// any other value stops the run naming both ways (on_is: what ON runs, the default; off_is: what OFF runs).
extern "C" int cuda_env_switch(const char *name, const char *on, const char *off, const char *on_is,
                               const char *off_is);

// 1 where our Hopper kernels run (cuda_hopper.cu: an sm_90 GPU, sm_90a code in this build, the driver's
// tensor-map encoder), with the SM count and cuTensorMapEncodeTiled; 0 otherwise (never dies for a missing
// GPU).
extern "C" int cuda_hopper_tma(int *sms, void **encode);

// The cuBLAS handle of the backend (created by backend_cuda()).
extern "C" cublasHandle_t cuda_cublas(void);
// A device scratch buffer of at least `bytes`, reused by every op (ops run in stream order on the
// default stream, so one buffer is enough); its contents are undefined.
extern "C" void *cuda_workspace(size_t bytes);

// Element access: kernels read and write activations through these, so that a bf16 variant only
// has to change the storage type (fp32 accumulation stays).
__device__ __forceinline__ float ld_f(const float *p) { return *p; }
__device__ __forceinline__ float ld_f(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st_f(float *p, float v) { *p = v; }
// Two floats rounded to bf16 (round to nearest even) in one 32-bit word, lo in the low half (the lower
// address in memory; the register layout of an mma A fragment's pair of columns).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    union {
        __nv_bfloat162 b;
        uint32_t u;
    } c;
    c.b = __floats2bfloat162_rn(lo, hi); // .x (low half) = lo
    return c.u;
}
// The two floats of such a word (lo the low half).
__device__ __forceinline__ float2 bf2_f2(uint32_t u) {
    return __bfloat1622float2(*(const __nv_bfloat162 *)&u);
}

// Threads of a one-block-per-row kernel over C units (floats, float4s, ...): C rounded up to whole warps,
// 32 to 256 (cuda_nn.cu, cuda_norm.cu).
static inline int row_threads(int C) {
    int t = (C + 31) / 32 * 32;
    return t > 256 ? 256 : t < 32 ? 32 : t;
}

// one output value or four (consecutive, 16-byte float32 / 8-byte bf16 aligned), float32 or rounded to bf16
__device__ __forceinline__ void store1(float *p, float v) { *p = v; }
__device__ __forceinline__ void store1(__nv_bfloat16 *p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store4(float *p, float a, float b, float c, float d) {
    *(float4 *)p = make_float4(a, b, c, d);
}
__device__ __forceinline__ void store4(__nv_bfloat16 *p, float a, float b, float c, float d) {
    *(uint2 *)p = make_uint2(pack_bf16(a, b), pack_bf16(c, d));
}


// A grid-stride loop over n elements: e takes this thread's indices.
#define GRID_STRIDE(e, n) \
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < (n); \
         e += (size_t)gridDim.x * blockDim.x)
static inline unsigned cdiv_u(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
// A kernel's dynamic shared memory beyond the default 48 KB allowed (set each call where needed: cheap).
static inline void cuda_smem_allow(const void *fn, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}
// Grid for a grid-stride elementwise loop over n elements.
static inline unsigned ew_grid(size_t n, int threads) {
    size_t g = (n + threads - 1) / threads;
    if (g < 1) g = 1;
    if (g > 65535u * 16) g = 65535u * 16;
    return (unsigned)g;
}

// Deterministic block reduction (fixed shuffle tree, then a fixed-order pass over the warps).
// Every thread gets the block sum. blockDim.x must be a multiple of 32, at most 1024.
__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_sum_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max_f(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ double block_sum_d(double v) {
    __shared__ double part[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads(); // part[] may still be read by a previous call
    if (lane == 0) part[w] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < nw; i++) s += part[i];
    return s;
}
__device__ __forceinline__ float block_max_f(float v) {
    __shared__ float partm[32];
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max_f(v);
    __syncthreads();
    if (lane == 0) partm[w] = v;
    __syncthreads();
    float m = -INFINITY;
    for (int i = 0; i < nw; i++) m = fmaxf(m, partm[i]);
    return m;
}

// Entry points of cuda_nn.cu, cuda_elementwise.cu, cuda_plan.cu and cuda_optim.cu (same contracts as ops.h).
extern "C" {
void cuda_embedding_fwd(float *out, const int32_t *tokens, const float *table, int N, int C, int V);
void cuda_embedding_bwd(float *dtable, const float *dout, const int32_t *tokens, int N, int C, int V);
void cuda_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
void cuda_add_rmsnorm_fwd(float *x, float *out, float *rstd, const float *res, const float *w, int N, int C,
                          float eps);
void cuda_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                      const float *rstd, int N, int C);
void cuda_rmsnorm_part(double *part, const float *a, const float *w, const float *b, int N, int C);
void cuda_rmsnorm_fwd_part(float *out, float *rstd, const float *inp, const float *w, const double *ss, int N,
                           int C, int Ctot, float eps);
void cuda_rmsnorm_bwd_part(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                           const float *rstd, const double *dot, int N, int C, int Ctot);
void cuda_rope_fwd(float *x, int B, int T, int nh, int hd, float theta);
void cuda_rope_bwd(float *dx, int B, int T, int nh, int hd, float theta);
void cuda_rope_rows(float *x, int B, int t0, int t1, int nh, int hd, float theta, int inverse);
// rope_fwd_hid / to_hid (ops.h) of the float32 backend ("cuda-fp32": a copy) and of "cuda" (bf16)
void cuda_rope_fwd_f32(void *out, const void *inp, int from_hid, int B, int T, int nh, int hd, float theta);
void cuda_rope_fwd_bf16(void *out, const void *inp, int from_hid, int B, int T, int nh, int hd, float theta);
void cuda_rope_bwd_hid_bf16(float *dx, int B, int T, int nh, int hd, float theta);
void cuda_to_hid_rows_bf16(float *x, int N, int C);
void cuda_rope_yarn(float *x, int B, int t0, int t1, int nh, int hd, int ld, RopeYarn r, int adjoint);
// copy_strided (ops.h) where the hidden format is bf16 (bf16 1: "cuda") or float32 (0: "cuda-fp32")
void cuda_copy_strided(void *dst, int dst_hid, const void *src, int src_hid, Stride3 s, float alpha, int acc,
                       int bf16);
void cuda_dropout(float *x, int B, int T, int t0, int t1, int C, float p, uint64_t seed, int64_t row0);
void cuda_attention_drop_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                             int H, int KV, int hd, int t0, int t1, float p, uint64_t seed, int64_t row0,
                             int h0);
void cuda_attention_drop_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out,
                             const float *lse, const void *q, const void *k, const void *v, int B, int T,
                             int H, int KV, int hd, int t0, int t1, float p, uint64_t seed, int64_t row0,
                             int h0, int flags);
void cuda_swiglu_fwd(float *out, const float *h1, const float *h3, size_t n);
// The same in the hidden format of "cuda" (bf16, ops.h Backend.hid; the fused ops' fallback where our grouped
// kernel does not run): h1, h3 and act = silu(h1) h3 of float32 h1f, h3f, each rounded to bf16; and dh1, dh3
// (bf16, overwritten) from float32 dout and bf16 h1, h3.
void cuda_swiglu_fwd_hid(void *h1, void *h3, void *act, const float *h1f, const float *h3f, size_t n);
void cuda_swiglu_bwd_hid(void *dh1, void *dh3, const float *dout, const void *h1, const void *h3, size_t n);
// act = silu(h1) h3 of bf16 h1, h3 (float32 sums), rounded to bf16 (--fp8-save's act: ops.h
// Backend.fp8_save).
void cuda_swiglu_act_hid(void *act, const void *h1, const void *h3, size_t n);
void cuda_swiglu_bwd(float *dh1, float *dh3, const float *dout, const float *h1, const float *h3, size_t n,
                     int accumulate);
void cuda_gather_rows(float *out, const float *inp, const int32_t *idx, int n, int C);
void cuda_combine_rows(float *out, const float *res, const float *rows, const int32_t *slot_row,
                       const float *w, int N, int k, int C, int accumulate);
void cuda_router_topk(float *probs, float *lse, int32_t *idx, float *w, double *sums, const float *logits,
                      const float *bias, int N, int E, RouteRule r);
void cuda_router_bwd(float *dlogits, const float *rowdot, const int32_t *slot_row, const float *probs,
                     const float *lse, const int32_t *idx, const float *w, const float *aux_dp, float z_dl,
                     int N, int E, RouteRule r);
void cuda_gather_dot_scale_bf16(void *out, float *dot, const float *inp, const int32_t *idx, const float *b,
                                const float *scale, int n, int C, int hid);
void cuda_gather_dot_scale_f32(void *out, float *dot, const float *inp, const int32_t *idx, const float *b,
                               const float *scale, int n, int C, int hid);
void cuda_rmsnorm_fwd_hid_bf16(void *out, float *rstd, const float *inp, const float *w, int N, int C,
                               float eps);
void cuda_rmsnorm_fwd_hid_f32(void *out, float *rstd, const float *inp, const float *w, int N, int C,
                              float eps);
void cuda_gather_rows_hid_bf16(void *out, const void *inp, int from_hid, const int32_t *idx, int n, int C);
void cuda_gather_rows_hid_f32(void *out, const void *inp, int from_hid, const int32_t *idx, int n, int C);
void cuda_cross_entropy_fwd_bwd_f32(float *losses, float *logits, const int32_t *targets, int N, int V,
                                    float dloss);
void cuda_cross_entropy_fwd_bwd_bf16(float *losses, float *logits, const int32_t *targets, int N, int V,
                                     float dloss);
void cuda_cross_entropy_fwd(float *losses, const float *logits, const int32_t *targets, int N, int V);
void cuda_ce_part(double *part, const float *logits, const int32_t *targets, int N, int V);
void cuda_ce_finish_f32(float *losses, float *logits, const double *parts, const int32_t *targets, int N,
                        int V, int n, float dloss);
void cuda_ce_finish_bf16(float *losses, float *logits, const double *parts, const int32_t *targets, int N,
                         int V, int n, float dloss);
void cuda_mul(float *out, const float *a, const float *b, size_t n);
void cuda_sigmoid_fwd(float *out, const float *inp, size_t n);
void cuda_sigmoid_bwd(float *dinp, const float *dout, const float *out, size_t n);
void cuda_axpy(float *y, const float *x, float a, size_t n);
void cuda_add(float *out, const float *a, const float *b, size_t n);
// cuda_plan.cu
void cuda_plan_counts(int32_t *cnt, int32_t *rank, const int32_t *idx, int N, int E, int k);
void cuda_plan_rows(int32_t *slot_row, int32_t *row_tok, float *row_scale, const int32_t *rank,
                    const int32_t *idx, const float *w, const int32_t *keep, const int32_t *first, int N,
                    int E, int k);
// cuda_optim.cu
OptRuns *cuda_runs_create(const OptRun *runs, int n);
void cuda_runs_free(OptRuns *r);
void cuda_sumsq_runs(double *out, int ncls, const float *x, const OptRuns *r);
// The gradient ledger (ops.h GM_DW_SUMSQ, dw_sumsq_take; cuda_optim.cu): n partial sums appended for a
// kernel to write (every one of them) and G blocks counted; or the n values of a written block range
// (float32, or bf16 packed: ops.h GM_DW_BF16) summed into it by a kernel of its own, counted as G blocks.
double *cuda_dw_ledger_slots(size_t n, int G);
void cuda_dw_ledger_sum(const void *dw, size_t n, int packed, int G);
int cuda_dw_sumsq_take(double *sum);
void cuda_adamw_runs(float *p, const float *g, void *m, void *v, const OptRuns *r, float gscale, float lr,
                     float b1, float b2, float eps, float wd, int t, int prec, uint64_t seed);
// cuda_weights.cu: the bf16 copy of the weights (ops.h bf16_shadow): register/refresh; the copy of p's
// buffer if p is the registered start and current (else NULL); a weight's bf16 values in it (or NULL); a
// backend write or free that may touch the range. The parameter buffer with holes (ops.h
// alloc_bf16_params): alloc; free (1 if p was it); to_host / to_device over ranges meeting its holes (1 if
// they did, and were copied); whether [off, off + n) lies in a hole (dies across a hole's edge); which
// buffer with holes p is (0: none). The copy's version (cuda_bf16_shadow_version): a counter that every
// change of the copy's contents or of the buffer it covers increases (registering, refreshing, any write the
// backend sees into the range, adamw_runs writing the copy: cuda_bf16_shadow_updated, freeing), so that
// anything derived from the copy (the FP8 weights' codes, cuda_fp8_wcache.cu) is current while the version is
// unchanged; the registered buffer (NULL: none).
void cuda_bf16_shadow(const float *p, size_t n);
unsigned long long cuda_bf16_shadow_version(void);
const float *cuda_bf16_shadow_base(void);
void cuda_bf16_shadow_updated(void);
void *cuda_bf16_shadow_for(const float *p);
const void *cuda_bf16_shadow_of(const float *w, size_t count);
const void *cuda_bf16_hole_of(const float *w, size_t count);
void cuda_bf16_shadow_write(const void *ptr, size_t bytes);
void cuda_bf16_shadow_freed(const void *p);
float *cuda_alloc_bf16_params(size_t n, const size_t *hole, int nh);
int cuda_bf16_params_free(const void *p);
int cuda_bf16_params_to_host(void *dst, const void *src, size_t bytes);
int cuda_bf16_params_to_device(void *dst, const void *src, size_t bytes);
int cuda_bf16_in_hole(const float *p, size_t off, size_t n);
unsigned cuda_bf16_holes_gen(const float *p);
// cuda_vm.cu: ops.h alloc_holes (virtual memory, the holes' whole pages unbacked); free (1 if p was one).
float *cuda_alloc_holes(size_t n, const size_t *hole, int nh);
int cuda_holes_free(const void *p);
// cuda_gemm.cu: float32 (cuda-fp32) and bf16 tensor-core (cuda) GEMMs; same contracts as ops.h
// dst (n bf16) = src (n floats) rounded to nearest even; any alignment (vectorised where 16-byte aligned);
// and back (exact)
void cuda_f32_to_bf16(void *dst, const float *src, size_t n);
void cuda_bf16_to_f32(float *dst, const void *src, size_t n);
void cuda_matmul_fwd_f32(float *out, const float *inp, const float *w, int N, int K, int O, int accumulate);
void cuda_matmul_bwd_f32(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N,
                         int K, int O, int flags);
void cuda_grouped_matmul_fwd_f32(float *out, const float *inp, const float *w, const int64_t *off, int G,
                                 int K, int O);
void cuda_grouped_matmul_bwd_f32(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                                 const int64_t *off, int G, int K, int O, int flags);
void cuda_matmul_fwd_bf16(float *out, const float *inp, const float *w, int N, int K, int O, int accumulate);
void cuda_matmul_bwd_bf16(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N,
                          int K, int O, int flags);
void cuda_matmul_fwd_multi_f32(int n, float *const *out, const void *inp, const float *const *w, int N, int K,
                               const int *O, int flags);
void cuda_matmul_bwd_multi_f32(int n, float *dinp, float *const *dw, const float *const *dout,
                               const void *inp, const float *const *w, int N, int K, const int *O, int flags);
void cuda_matmul_fwd_multi_bf16(int n, float *const *out, const void *inp, const float *const *w, int N,
                                int K, const int *O, int flags);
void cuda_matmul_bwd_multi_bf16(int n, float *dinp, float *const *dw, const float *const *dout,
                                const void *inp, const float *const *w, int N, int K, const int *O,
                                int flags);
void cuda_grouped_matmul_fwd_bf16(float *out, const float *inp, const float *w, const int64_t *off, int G,
                                  int K, int O);
void cuda_grouped_matmul_bwd_bf16(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                                  const int64_t *off, int G, int K, int O, int flags);
void cuda_grouped_swiglu_fwd_f32(void *h1, void *h3, void *act, const void *inp, const float *w1,
                                 const float *w3, const int64_t *off, int G, int K, int O);
void cuda_grouped_down_fwd_f32(float *out, const void *act, const float *w, const int64_t *off, int G, int K,
                               int O);
void cuda_grouped_swiglu_bwd_f32(void *dh1, void *dh3, float *dw, const void *dout, const void *act,
                                 const void *h1, const void *h3, const float *w, const int64_t *off, int G,
                                 int K, int O, int flags);
void cuda_grouped_matmul_bwd2_f32(float *dinp, float *dwa, float *dwb, const void *douta, const void *doutb,
                                  const void *inp, const float *wa, const float *wb, const int64_t *off,
                                  int G, int K, int O, int flags);
void cuda_grouped_swiglu_fwd_bf16(void *h1, void *h3, void *act, const void *inp, const float *w1,
                                  const float *w3, const int64_t *off, int G, int K, int O);
void cuda_grouped_down_fwd_bf16(float *out, const void *act, const float *w, const int64_t *off, int G, int K,
                                int O);
void cuda_grouped_swiglu_bwd_bf16(void *dh1, void *dh3, float *dw, const void *dout, const void *act,
                                  const void *h1, const void *h3, const float *w, const int64_t *off, int G,
                                  int K, int O, int flags);
void cuda_grouped_matmul_bwd2_bf16(float *dinp, float *dwa, float *dwb, const void *douta, const void *doutb,
                                   const void *inp, const float *wa, const float *wb, const int64_t *off,
                                   int G, int K, int O, int flags);
// cuda_narrow.cu: dw (O, K) [+]= dout^T inp for a narrow O (beta 1: added), its chunks' sums in order
void cuda_dw_narrow(float *dw, const float *dout, const float *inp, int N, int K, int O, int beta);
int cuda_grouped_swiglu_fwd(void *h1, void *h3, void *act, const void *x, const void *w1, const void *w3,
                            const int64_t *off, int G, int K, int O);
int cuda_grouped_swiglu_bwd(void *dh1, void *dh3, const void *h1, const void *h3, const void *dout,
                            const void *w, const int64_t *off, int G, int K, int O);
// cuda_attention.cu
// (query rows [t0, t1) of each sequence: ops.h; q, k, v float32: the float32 backend's hidden format)
void cuda_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                        int H, int KV, int hd, int t0, int t1);
void cuda_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out, const float *lse,
                        const void *q, const void *k, const void *v, int B, int T, int H, int KV, int hd,
                        int t0, int t1, int flags);
// The rows attention_bwd writes under `flags` (ops.h ATT_ADD_*) set to zeros, for kernels that add.
void cuda_attention_zero_rows(float *dq, float *dk, float *dv, int B, int T, int H, int KV, int hd, int t0,
                              int t1, int flags);
// D[b,h,t] = <dout, out> per query row t in [t0, t1) (layouts as ops.h; D is (B, H, T)); gout (bf16,
// dout's layout) or NULL: dout rounded to bf16 first and those rows stored there (the tensor-core
// backward's operand); out float32 or (out_bf16) bf16
void cuda_attention_rowdot(float *D, void *gout, const float *dout, const void *out, int out_bf16, int B,
                           int T, int H, int hd, int t0, int t1);
// cuda_attention_wg.cu: the forward and backward on Hopper's wgmma from the bf16 copies of q, k, v
// (and dout; head dims (hd, hv) 128 / 128 or latent attention's 192 / 128: rows hd wide, v's, dout's and
// out's first hv columns the values, ops.h attention_fwd_v; 0 where they do not run:
// cuda_attention_wg_runs); the backward's ds: ops.h attention_ds_bytes of scratch (head dim 128) or NULL
int cuda_attention_wg_runs(int hd, int hv);
int cuda_attention_fwd_wg(unsigned short *out, float *lse, const unsigned short *q, const unsigned short *k,
                          const unsigned short *v, int B, int T, int H, int KV, int hd, int hv, int t0,
                          int t1);
// cuda_attention_wgf.cu: the forward at (hd, hv) 128 / 128 and 192 / 128 (the layouts of
// cuda_attention_fwd_wg) on 128-key tiles (TMA, warp-specialised); 0 where it does not run
// (MOE_ATTN_FWD_OLD=1, no TMA here, operands not 16-byte aligned: the caller's kernel then)
int cuda_attention_fwd_wgf(unsigned short *out, float *lse, const unsigned short *q, const unsigned short *k,
                           const unsigned short *v, int B, int T, int H, int KV, int hd, int t0, int t1);
int cuda_attention_bwd_wg(float *dq, float *dk, float *dv, void *ds, size_t ds_bytes,
                          const unsigned short *dout, const float *lse, const float *D,
                          const unsigned short *q, const unsigned short *k, const unsigned short *v, int B,
                          int T, int H, int KV, int hd, int hv, int t0, int t1, int flags);
// latent attention's dq (192 / 128) by the kernel that computes S, dP and dS again, added into dq where add
// (cuda_attention_mla.cu's MOE_ATTN_MLA=recompute)
void cuda_attention_dq_wg(float *dq, const unsigned short *dout, const float *lse, const float *D,
                          const unsigned short *q, const unsigned short *k, const unsigned short *v, int B,
                          int T, int H, int KV, int t0, int t1, int add);
// cuda_attention_tc.cu: the same ops for backend "cuda" (q, k, v, out bf16: its hidden format): on tensor
// cores (head dims 32, 64, 128; with dropout too), else the float32 kernels on q, k, v (out) widened
void cuda_attention_fwd_tc(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                           int H, int KV, int hd, int t0, int t1);
void cuda_attention_bwd_tc(float *dq, float *dk, float *dv, const float *dout, const void *out,
                           const float *lse, const void *q, const void *k, const void *v, int B, int T, int H,
                           int KV, int hd, int t0, int t1, int flags);
// latent attention's values (ops.h attention_fwd_v/bwd_v): the wgmma kernels at 192 / 128, else the above
void cuda_attention_fwd_tcv(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                            int H, int KV, int hd, int hv, int t0, int t1);
void cuda_attention_bwd_tcv(float *dq, float *dk, float *dv, const float *dout, const void *out,
                            const float *lse, const void *q, const void *k, const void *v, int B, int T,
                            int H, int KV, int hd, int hv, int t0, int t1, int flags);
void cuda_attention_drop_fwd_bf16(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                                  int T, int H, int KV, int hd, int t0, int t1, float p, uint64_t seed,
                                  int64_t row0, int h0);
void cuda_attention_drop_bwd_bf16(float *dq, float *dk, float *dv, const float *dout, const void *out,
                                  const float *lse, const void *q, const void *k, const void *v, int B, int T,
                                  int H, int KV, int hd, int t0, int t1, float p, uint64_t seed, int64_t row0,
                                  int h0, int flags);
}
