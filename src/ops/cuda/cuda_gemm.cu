// cuda_gemm.cu — the GEMMs of the cuda backends (contracts in ops/ops.h), through cuBLAS:
//   float32 (backend "cuda-fp32"): cublasSgemm, plain FP32 math (no TF32), matching the cpu to
//           float32 rounding;
//   bf16    (backend "cuda"): the float32 operands are rounded to bf16 (round to nearest even) by a
//           conversion kernel into backend-owned scratch, then cublasGemmEx with CUDA_R_16BF inputs,
//           CUBLAS_COMPUTE_32F (tensor cores, fp32 accumulation) and a float32 output; *_bwd
//           accumulate into the float32 gradients with beta = 1 (beta = 0 for a grouped dinp that
//           is overwritten, accumulate 0). Products of two bf16 values are exact in fp32, so the
//           result is the float32 GEMM of the bf16-rounded operands up to the summation order; tests/test_cuda_ops.c checks exactly that, against a cpu reference
//           that rounds the same operands.
// Precision policy of "cuda": grouped GEMMs (the experts) always run in bf16; a plain matmul runs
// in bf16 only when O > MOE_GEMM_FP32_MAX_O (ops.h). Narrower ones (the router, O = E) stay
// float32: with O outputs per input row they do O/2 FLOP per float read, under the ~16 FLOP/byte
// balance of the fp32 units, so they are memory-bound either way (the conversion would only add
// traffic), and routing decisions (top-k of the logits) then see float32 logits, as in the peers.
// Must not hold: any knowledge of the model or of layers.
#include <cuda_bf16.h>
#include "ops/cuda/cuda_common.h"

typedef __nv_bfloat16 bf16;

// ---------------------------------------------------------------- float32 -> bf16

// dst[i] = bf16_rn(src[i]). Vector path: 4 floats (16 B) in, 4 bf16 (8 B) out per step.
__global__ void f32_to_bf16_vec_k(bf16 *__restrict__ dst, const float *__restrict__ src, size_t n4) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = reinterpret_cast<const float4 *>(src)[i];
        __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
        uint2 o;
        o.x = *reinterpret_cast<uint32_t *>(&a);
        o.y = *reinterpret_cast<uint32_t *>(&b);
        reinterpret_cast<uint2 *>(dst)[i] = o;
    }
}
__global__ void f32_to_bf16_k(bf16 *__restrict__ dst, const float *__restrict__ src, size_t n) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = __float2bfloat16_rn(src[i]);
}

extern "C" void cuda_f32_to_bf16(void *dst_, const float *src, size_t n) {
    bf16 *dst = (bf16 *)dst_;
    if (!n) return;
    const int T = 256;
    size_t head = 0;
    if (((uintptr_t)src & 15) == 0 && ((uintptr_t)dst & 7) == 0 && n >= 4) {
        size_t n4 = n / 4;
        f32_to_bf16_vec_k<<<ew_grid(n4, T), T>>>(dst, src, n4);
        KCHECK("f32_to_bf16_vec");
        head = n4 * 4;
    }
    if (head < n) {
        f32_to_bf16_k<<<ew_grid(n - head, T), T>>>(dst + head, src + head, n - head);
        KCHECK("f32_to_bf16");
    }
}

static void to_bf16(bf16 *dst, const float *src, size_t n) { cuda_f32_to_bf16(dst, src, n); }

// Backend-owned bf16 scratch: up to three operands at once, each 256-byte aligned, grown on demand
// (never shrunk). Ops run in stream order on the default stream, so one region per operand slot is
// enough: the next op's conversion is ordered after this op's GEMMs.
static void *g_bf;
static size_t g_bf_bytes;

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

static void bf16_scratch(size_t n0, size_t n1, size_t n2, bf16 **p0, bf16 **p1, bf16 **p2) {
    size_t b0 = al256(n0 * sizeof(bf16)), b1 = al256(n1 * sizeof(bf16)), b2 = al256(n2 * sizeof(bf16));
    size_t need = b0 + b1 + b2;
    if (need > g_bf_bytes) {
        if (g_bf) CUDA_CHECK(cudaFree(g_bf));   // synchronises: no kernel still reads the old one
        g_bf = NULL;
        size_t grow = g_bf_bytes + g_bf_bytes / 4;   // +25%, so slowly growing shapes reallocate rarely
        g_bf_bytes = need > grow ? need : grow;
        if (g_bf_bytes < ((size_t)1 << 20)) g_bf_bytes = (size_t)1 << 20;
        cudaError_t e = cudaMalloc(&g_bf, g_bf_bytes);
        if (e != cudaSuccess) {
            cudaGetLastError();
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            char a[32], b[32];
            fmt_bytes(a, sizeof a, (double)g_bf_bytes);
            fmt_bytes(b, sizeof b, (double)fr);
            DIE("%s:%d: cudaMalloc of the bf16 GEMM scratch (%s) failed: %s; %s free on the GPU; hint: %s "
                "(or use --device cuda-fp32, which needs no scratch)", __FILE__, __LINE__, a, cudaGetErrorString(e), b,
                cuda_hint(e));
        }
    }
    char *p = (char *)g_bf;
    if (p0) *p0 = (bf16 *)p;
    if (p1) *p1 = (bf16 *)(p + b0);
    if (p2) *p2 = (bf16 *)(p + b0 + b1);
}

// ---------------------------------------------------------------- bf16 copy of the weights
// (ops.h bf16_shadow) The trainer registers its whole parameter buffer; the bf16 GEMMs then take a
// weight's bf16 values from the copy instead of converting it on each call (each weight is used by
// a forward and a backward GEMM per micro-batch), and adamw_runs writes the copy with the update.
// `valid` drops on any write into the range the backend sees (cuda_bf16_shadow_write) and when the
// buffer is freed; the GEMMs then convert as without the copy. Same bf16 values either way (round
// to nearest even of the same floats), so results do not change.
static struct {
    const float *base;
    size_t n, cap;
    bf16 *mirror;
    int valid;
} g_sh;

extern "C" void cuda_bf16_shadow(const float *p, size_t n) {
    g_sh.valid = 0;
    g_sh.base = n ? p : NULL;
    g_sh.n = p ? n : 0;
    if (!g_sh.base) return;
    if (n > g_sh.cap) {
        if (g_sh.mirror) CUDA_CHECK(cudaFree(g_sh.mirror));
        g_sh.mirror = NULL;
        g_sh.cap = 0;
        cudaError_t e = cudaMalloc(&g_sh.mirror, n * sizeof(bf16));
        if (e != cudaSuccess) {
            cudaGetLastError();
            size_t fr = 0, tot = 0;
            cudaMemGetInfo(&fr, &tot);
            char a[32], b[32];
            fmt_bytes(a, sizeof a, (double)n * sizeof(bf16));
            fmt_bytes(b, sizeof b, (double)fr);
            DIE("%s:%d: cudaMalloc of the bf16 copy of the weights (%s) failed: %s; %s free on the GPU; hint: %s "
                "(or use --device cuda-fp32, which keeps none)", __FILE__, __LINE__, a, cudaGetErrorString(e), b,
                cuda_hint(e));
        }
        g_sh.cap = n;
    }
    to_bf16(g_sh.mirror, p, n);
    g_sh.valid = 1;
}

// The copy of the whole registered buffer when p is its start and it is current (adamw_runs), else NULL.
extern "C" void *cuda_bf16_shadow_for(const float *p) { return g_sh.valid && p == g_sh.base ? g_sh.mirror : NULL; }

// A write of `bytes` at ptr by the backend: drops the copy if it overlaps the registered range.
extern "C" void cuda_bf16_shadow_write(const void *ptr, size_t bytes) {
    if (!g_sh.valid || !bytes) return;
    uintptr_t a = (uintptr_t)ptr, b0 = (uintptr_t)g_sh.base, b1 = b0 + g_sh.n * sizeof(float);
    if (a < b1 && a + bytes > b0) g_sh.valid = 0;
}

// The buffer at p is freed: forget it (and free the copy) if it is the registered one.
extern "C" void cuda_bf16_shadow_freed(const void *p) {
    if (!p || p != (const void *)g_sh.base) return;
    g_sh.valid = 0;
    g_sh.base = NULL;
    g_sh.n = g_sh.cap = 0;
    if (g_sh.mirror) CUDA_CHECK(cudaFree(g_sh.mirror));
    g_sh.mirror = NULL;
}

// bf16 values of the weight [w, w + count) from the copy, or NULL (then the caller converts). Only
// for weights at a multiple of 8 elements from the buffer's start, so that the bf16 pointer is 16-byte
// aligned like the scratch the conversion would write: cuBLAS picks its kernel by alignment, and
// another kernel would sum in another order (and a misaligned one runs slower).
static const bf16 *shadow_of(const float *w, size_t count) {
    uintptr_t a = (uintptr_t)w, b0 = (uintptr_t)g_sh.base;
    if (!g_sh.valid || a < b0 || count > g_sh.n || (a - b0) % (8 * sizeof(float)) ||
        (a - b0) / sizeof(float) > g_sh.n - count)
        return NULL;
    return g_sh.mirror + (w - g_sh.base);
}

// C (m,n) col-major [fp32] = A op (m,k) . B op (k,n) [bf16] + beta C
static void gemm_bf16(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const bf16 *A, int lda,
                      const bf16 *B, int ldb, float beta, float *C, int ldc) {
    const float one = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(cuda_cublas(), ta, tb, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb, &beta, C,
                              CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// ---------------------------------------------------------------- float32 GEMMs

// Row-major GEMMs through column-major cuBLAS: a row-major (R,C) array is the column-major (C,R)
// array, so out = inp W^T (row-major) is out^T = W^T' inp^T in column-major terms, etc.
// Plain FP32 math (CUBLAS_DEFAULT_MATH: no TF32), so results match the CPU to float32 rounding.
extern "C" void cuda_matmul_fwd_f32(float *out, const float *inp, const float *w, int N, int K, int O, int accumulate) {
    if (N <= 0 || O <= 0) return;
    if (K <= 0) {
        if (!accumulate) CUDA_CHECK(cudaMemset(out, 0, sizeof(float) * (size_t)N * O));
        return;
    }
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    // out^T (O,N) = W (O,K) . inp^T (K,N); W is column-major (K,O) with ld K, used transposed
    CUBLAS_CHECK(cublasSgemm(cuda_cublas(), CUBLAS_OP_T, CUBLAS_OP_N, O, N, K, &one, w, K, inp, K, &beta, out, O));
}

// dinp = dout W [+ dinp when acc_dinp]; dw += dout^T inp. With O = 0 an overwritten dinp is zeros.
static void mm_bwd_f32(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N, int K, int O,
                       int acc_dinp) {
    if (N <= 0 || K <= 0) return;
    if (O <= 0) {
        if (dinp && !acc_dinp) CUDA_CHECK(cudaMemset(dinp, 0, sizeof(float) * (size_t)N * K));
        return;
    }
    const float one = 1.0f, bi = acc_dinp ? 1.0f : 0.0f;
    // dinp^T (K,N) [+]= W^T (K,O) . dout^T (O,N)
    if (dinp)
        CUBLAS_CHECK(cublasSgemm(cuda_cublas(), CUBLAS_OP_N, CUBLAS_OP_N, K, N, O, &one, w, K, dout, O, &bi, dinp, K));
    // dw^T (K,O) += inp^T (K,N) . dout (N,O)
    if (dw)
        CUBLAS_CHECK(cublasSgemm(cuda_cublas(), CUBLAS_OP_N, CUBLAS_OP_T, K, O, N, &one, inp, K, dout, O, &one, dw, K));
}

extern "C" void cuda_matmul_bwd_f32(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N,
                                    int K, int O) {
    mm_bwd_f32(dinp, dw, dout, inp, w, N, K, O, 1);
}

// One GEMM per non-empty group (off is a host array).
extern "C" void cuda_grouped_matmul_fwd_f32(float *out, const float *inp, const float *w, const int64_t *off, int G,
                                            int K, int O) {
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g], n = off[g + 1] - off[g];
        if (n <= 0) continue;
        cuda_matmul_fwd_f32(out + r0 * O, inp + r0 * K, w + (size_t)g * O * K, (int)n, K, O, 0);
    }
}

extern "C" void cuda_grouped_matmul_bwd_f32(float *dinp, float *dw, const float *dout, const float *inp,
                                            const float *w, const int64_t *off, int G, int K, int O, int accumulate) {
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g], n = off[g + 1] - off[g];
        if (n <= 0) continue;
        mm_bwd_f32(dinp ? dinp + r0 * K : NULL, dw ? dw + (size_t)g * O * K : NULL, dout + r0 * O, inp + r0 * K,
                   w + (size_t)g * O * K, (int)n, K, O, accumulate);
    }
}

// ---------------------------------------------------------------- bf16 GEMMs (fp32 accumulation)

extern "C" void cuda_matmul_fwd_bf16(float *out, const float *inp, const float *w, int N, int K, int O, int accumulate) {
    if (N <= 0 || O <= 0 || K <= 0 || O <= MOE_GEMM_FP32_MAX_O) {
        cuda_matmul_fwd_f32(out, inp, w, N, K, O, accumulate);
        return;
    }
    const bf16 *ws = shadow_of(w, (size_t)O * K);
    bf16 *xb, *wb;
    bf16_scratch((size_t)N * K, ws ? 0 : (size_t)O * K, 0, &xb, &wb, NULL);
    to_bf16(xb, inp, (size_t)N * K);
    if (!ws) to_bf16(wb, w, (size_t)O * K);
    gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, O, N, K, ws ? ws : wb, K, xb, K, accumulate ? 1.0f : 0.0f, out, O);
}

extern "C" void cuda_matmul_bwd_bf16(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                                     int N, int K, int O) {
    if (N <= 0 || K <= 0 || O <= 0 || (!dinp && !dw)) return;
    if (O <= MOE_GEMM_FP32_MAX_O) {
        cuda_matmul_bwd_f32(dinp, dw, dout, inp, w, N, K, O);
        return;
    }
    const bf16 *ws = dinp ? shadow_of(w, (size_t)O * K) : NULL;
    bf16 *gb, *wb, *xb;
    bf16_scratch((size_t)N * O, dinp && !ws ? (size_t)O * K : 0, dw ? (size_t)N * K : 0, &gb, &wb, &xb);
    to_bf16(gb, dout, (size_t)N * O);
    if (dinp) {
        if (!ws) to_bf16(wb, w, (size_t)O * K);
        gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, K, N, O, ws ? ws : wb, K, gb, O, 1.0f, dinp, K);
    }
    if (dw) {
        to_bf16(xb, inp, (size_t)N * K);
        gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, K, O, N, xb, K, gb, O, 1.0f, dw, K);
    }
}

// Grouped: the rows [off[0], off[G]) and all G weight blocks are converted once (one kernel each),
// then one cublasGemmEx per non-empty group. Any counts (zeros anywhere, all zero) are fine.
extern "C" void cuda_grouped_matmul_fwd_bf16(float *out, const float *inp, const float *w, const int64_t *off, int G,
                                             int K, int O) {
    if (G <= 0 || O <= 0) return;
    int64_t base = off[0], rows = off[G] - off[0];
    if (rows <= 0) return;
    if (K <= 0) {   // empty sums: the written rows are zeros (as the cpu's GEMM with K = 0)
        CUDA_CHECK(cudaMemset(out + base * O, 0, sizeof(float) * (size_t)rows * O));
        return;
    }
    const bf16 *ws = shadow_of(w, (size_t)G * O * K);
    bf16 *xb, *wb;
    bf16_scratch((size_t)rows * K, ws ? 0 : (size_t)G * O * K, 0, &xb, &wb, NULL);
    to_bf16(xb, inp + base * K, (size_t)rows * K);
    if (ws) wb = (bf16 *)ws;
    else to_bf16(wb, w, (size_t)G * O * K);
    if (cuda_grouped_gemm(out + base * O, O, 0.0f, xb, wb, 0, off, G, K, O)) return;
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g] - base, n = off[g + 1] - off[g];
        if (n <= 0) continue;
        gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, O, (int)n, K, wb + (size_t)g * O * K, K, xb + r0 * K, K, 0.0f,
                  out + (base + r0) * O, O);
    }
}

// dinp with beta = accumulate (0: written, never read); dw with beta = 1 always (ops.h).
extern "C" void cuda_grouped_matmul_bwd_bf16(float *dinp, float *dw, const float *dout, const float *inp,
                                             const float *w, const int64_t *off, int G, int K, int O, int accumulate) {
    if (G <= 0 || K <= 0 || (!dinp && !dw)) return;
    int64_t base = off[0], rows = off[G] - off[0];
    if (rows <= 0) return;
    if (O <= 0) {   // empty sums: an overwritten dinp is zeros over the groups' rows; dw has no elements
        if (dinp && !accumulate) CUDA_CHECK(cudaMemset(dinp + base * K, 0, sizeof(float) * (size_t)rows * K));
        return;
    }
    const float bi = accumulate ? 1.0f : 0.0f;
    const bf16 *ws = dinp ? shadow_of(w, (size_t)G * O * K) : NULL;
    bf16 *gb, *wb, *xb;
    bf16_scratch((size_t)rows * O, dinp && !ws ? (size_t)G * O * K : 0, dw ? (size_t)rows * K : 0, &gb, &wb, &xb);
    to_bf16(gb, dout + base * O, (size_t)rows * O);
    if (ws) wb = (bf16 *)ws;
    else if (dinp) to_bf16(wb, w, (size_t)G * O * K);
    if (dw) to_bf16(xb, inp + base * K, (size_t)rows * K);
    // dinp_g (n,K) [+]= dout_g (n,O) . W_g (O,K): W_g is the N-major operand
    int dinp_done = dinp && cuda_grouped_gemm(dinp + base * K, K, bi, gb, wb, 1, off, G, O, K);
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g] - base, n = off[g + 1] - off[g];
        if (n <= 0) continue;
        // dinp_g^T (K,n) [+]= W_g^T (K,O) . dout_g^T (O,n)
        if (dinp && !dinp_done)
            gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, K, (int)n, O, wb + (size_t)g * O * K, K, gb + r0 * O, O, bi,
                      dinp + (base + r0) * K, K);
        // dw_g^T (K,O) += inp_g^T (K,n) . dout_g (n,O)
        if (dw)
            gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, K, O, (int)n, xb + r0 * K, K, gb + r0 * O, O, 1.0f,
                      dw + (size_t)g * O * K, K);
    }
}
