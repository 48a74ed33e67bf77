// cuda_gemm.cu — the GEMMs of the cuda backends (contracts in ops/ops.h), through cuBLAS:
//   float32 (backend "cuda-fp32"): cublasSgemm, plain FP32 math (no TF32), matching the cpu to
//           float32 rounding;
//   bf16    (backend "cuda"): the float32 operands are rounded to bf16 (round to nearest even) by a
//           conversion kernel into backend-owned scratch, then cublasGemmEx with CUDA_R_16BF inputs,
//           CUBLAS_COMPUTE_32F (tensor cores, fp32 accumulation) and a float32 output; *_bwd
//           accumulate into the float32 gradients with beta = 1 (beta = 0 for a grouped dinp that
//           is overwritten, accumulate 0). Products of two bf16 values are exact in fp32, so the
//           result is the float32 GEMM of the bf16-rounded operands up to the summation order;
//           tests/test_cuda_ops.c checks exactly that, against a cpu reference that rounds the same operands.
//           A dout already in the hidden format in place of its float32 rows (ops.h GM_DOUT_HID: the LM
//           head's dlogits, gqa's dq, dk, dv; to_hid_rows rounds rows so) is read as it is.
// Precision policy of "cuda": grouped GEMMs (the experts) always run in bf16; a plain matmul runs
// in bf16 only when O > MOE_GEMM_FP32_MAX_O (ops.h). Narrower ones (the router, O = E) stay
// float32: with O outputs per input row they do O/2 FLOP per float read, under the ~16 FLOP/byte
// balance of the fp32 units, so they are memory-bound either way (the conversion would only add
// traffic), and routing decisions (top-k of the logits) then see float32 logits, as in the peers.
// Must not hold: any knowledge of the model or of layers.
#include <cuda_bf16.h>
#include "ops/cuda/cuda_common.h"
#include "ops/plain.h"

typedef __nv_bfloat16 bf16;

// ---------------------------------------------------------------- float32 -> bf16

// dst[i] = bf16_rn(src[i]). Vector path: 4 floats (16 B) in, 4 bf16 (8 B) out per step.
__global__ void f32_to_bf16_vec_k(bf16 *__restrict__ dst, const float *__restrict__ src, size_t n4) {
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = reinterpret_cast<const float4 *>(src)[i];
        reinterpret_cast<uint2 *>(dst)[i] = make_uint2(pack_bf16(v.x, v.y), pack_bf16(v.z, v.w));
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

// cnt operands of sz[i] bf16 values each (0: none; p[i] is then unusable)
static void bf16_scratch_v(int cnt, const size_t *sz, bf16 **p) {
    size_t need = 0;
    for (int i = 0; i < cnt; i++) need += al256(sz[i] * sizeof(bf16));
    if (need > g_bf_bytes) {
        if (g_bf) CUDA_CHECK(cudaFree(g_bf)); // synchronises: no kernel still reads the old one
        g_bf = NULL;
        size_t grow = g_bf_bytes + g_bf_bytes / 4; // +25%, so slowly growing shapes reallocate rarely
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
                "(or use --device cuda-fp32, which needs no scratch)",
                __FILE__, __LINE__, a, cudaGetErrorString(e), b, cuda_hint(e));
        }
    }
    char *q = (char *)g_bf;
    for (int i = 0; i < cnt; i++) {
        p[i] = (bf16 *)q;
        q += al256(sz[i] * sizeof(bf16));
    }
}

static void bf16_scratch(size_t n0, size_t n1, size_t n2, bf16 **p0, bf16 **p1, bf16 **p2) {
    size_t sz[3] = {n0, n1, n2};
    bf16 *p[3];
    bf16_scratch_v(3, sz, p);
    if (p0) *p0 = p[0];
    if (p1) *p1 = p[1];
    if (p2) *p2 = p[2];
}

// bf16 values of the weight [w, w + count) from the weights' bf16 copy (cuda_weights.cu), or NULL: then
// the caller converts w.
static const bf16 *shadow_of(const float *w, size_t count) {
    return (const bf16 *)cuda_bf16_shadow_of(w, count);
}

// C (m,n) col-major [fp32, or bf16 where ct says: each fp32 result rounded once] = A op (m,k) . B op (k,n)
// [bf16] + beta C
static void gemm_bf16_to(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const bf16 *A,
                         int lda, const bf16 *B, int ldb, float beta, void *C, cudaDataType_t ct, int ldc) {
    const float one = 1.0f;
    CUBLAS_CHECK(cublasGemmEx(cuda_cublas(), ta, tb, m, n, k, &one, A, CUDA_R_16BF, lda, B, CUDA_R_16BF, ldb,
                              &beta, C, ct, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}
static void gemm_bf16(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const bf16 *A, int lda,
                      const bf16 *B, int ldb, float beta, float *C, int ldc) {
    gemm_bf16_to(ta, tb, m, n, k, A, lda, B, ldb, beta, C, CUDA_R_32F, ldc);
}

// ---------------------------------------------------------------- float32 GEMMs

// Row-major GEMMs through column-major cuBLAS: a row-major (R,C) array is the column-major (C,R)
// array, so out = inp W^T (row-major) is out^T = W^T' inp^T in column-major terms, etc.
// Plain FP32 math (CUBLAS_DEFAULT_MATH: no TF32), so results match the CPU to float32 rounding.
extern "C" void cuda_matmul_fwd_f32(float *out, const float *inp, const float *w, int N, int K, int O,
                                    int accumulate) {
    if (N <= 0 || O <= 0) return;
    if (K <= 0) {
        if (!accumulate) CUDA_CHECK(cudaMemset(out, 0, sizeof(float) * (size_t)N * O));
        return;
    }
    const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
    // out^T (O,N) = W (O,K) . inp^T (K,N); W is column-major (K,O) with ld K, used transposed
    CUBLAS_CHECK(
        cublasSgemm(cuda_cublas(), CUBLAS_OP_T, CUBLAS_OP_N, O, N, K, &one, w, K, inp, K, &beta, out, O));
}

// dinp = dout W [+ dinp with GM_ACC_DINP]; dw += dout^T inp. With O = 0 an overwritten dinp is zeros.
// flags (ops.h): GM_ACC_DINP adds into dinp, GM_DW_WRITE writes dw (zeros without rows)
static void mm_bwd_f32(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N,
                       int K, int O, int flags) {
    if (K <= 0 || O <= 0) { // dw has no elements; dinp's sums are empty
        if (dinp && N > 0 && K > 0 && !(flags & GM_ACC_DINP))
            CUDA_CHECK(cudaMemset(dinp, 0, sizeof(float) * (size_t)N * K));
        return;
    }
    if (N <= 0) {
        if (dw && (flags & GM_DW_WRITE)) CUDA_CHECK(cudaMemset(dw, 0, sizeof(float) * (size_t)O * K));
        return;
    }
    const float one = 1.0f, bi = flags & GM_ACC_DINP ? 1.0f : 0.0f, bw = flags & GM_DW_WRITE ? 0.0f : 1.0f;
    // dinp^T (K,N) [+]= W^T (K,O) . dout^T (O,N)
    if (dinp)
        CUBLAS_CHECK(
            cublasSgemm(cuda_cublas(), CUBLAS_OP_N, CUBLAS_OP_N, K, N, O, &one, w, K, dout, O, &bi, dinp, K));
    // dw^T (K,O) [+]= inp^T (K,N) . dout (N,O)
    if (dw && O <= MOE_GEMM_FP32_MAX_O) cuda_dw_narrow(dw, dout, inp, N, K, O, !(flags & GM_DW_WRITE));
    else if (dw)
        CUBLAS_CHECK(
            cublasSgemm(cuda_cublas(), CUBLAS_OP_N, CUBLAS_OP_T, K, O, N, &one, inp, K, dout, O, &bw, dw, K));
}

extern "C" void cuda_matmul_bwd_f32(float *dinp, float *dw, const float *dout, const float *inp,
                                    const float *w, int N, int K, int O, int flags) {
    mm_bwd_f32(dinp, dw, dout, inp, w, N, K, O, flags & (GM_ACC_DINP | GM_DW_WRITE));
}

// One GEMM per non-empty group (off is a host array).
extern "C" void cuda_grouped_matmul_fwd_f32(float *out, const float *inp, const float *w, const int64_t *off,
                                            int G, int K, int O) {
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g], n = off[g + 1] - off[g];
        if (n <= 0) continue;
        cuda_matmul_fwd_f32(out + r0 * O, inp + r0 * K, w + (size_t)g * O * K, (int)n, K, O, 0);
    }
}

// The group's float32 block of a GM_DW_BF16 write where cuBLAS computes it (a buffer of its own: the GEMM
// paths use the workspace and the bf16 scratch themselves), then packed into its bf16 block at dw (dw_pack);
// without packing the block in dw itself.
static float *g_dwblk;
static size_t g_dwblk_cap;
static float *dw_block(float *dw, int g, size_t blk, int packed) {
    if (!packed) return dw + g * blk;
    if (blk > g_dwblk_cap) {
        if (g_dwblk) CUDA_CHECK(cudaFree(g_dwblk));
        CUDA_CHECK(cudaMalloc(&g_dwblk, sizeof(float) * blk));
        g_dwblk_cap = blk;
    }
    return g_dwblk;
}
static void dw_pack(float *dw, int g, size_t blk, const float *b, int packed) {
    if (packed) cuda_f32_to_bf16((bf16 *)dw + g * blk, b, blk);
}
// ops.h's rule on the weight-gradient flags
static void dw_flags_check(int flags) {
    const char *fe = gm_dw_flags_error(flags);
    CHECK(!fe, "grouped weight gradients: %s", fe);
}

// (GM_DW_BF16: each group's block computed apart, then packed: dw_block, dw_pack)
extern "C" void cuda_grouped_matmul_bwd_f32(float *dinp, float *dw, const float *dout, const float *inp,
                                            const float *w, const int64_t *off, int G, int K, int O,
                                            int flags) {
    int packed = dw && (flags & GM_DW_BF16) && O > 0 && K > 0;
    dw_flags_check(flags);
    size_t blk = (size_t)O * K;
    for (int g = 0; g < G; g++) { // (a group without rows: only GM_DW_WRITE's zeros)
        int64_t r0 = off[g], n = off[g + 1] - off[g];
        if (n <= 0 && !(dw && (flags & GM_DW_WRITE))) continue;
        float *b = dw ? dw_block(dw, g, blk, packed) : NULL;
        mm_bwd_f32(dinp ? dinp + r0 * K : NULL, b, dout + r0 * O, inp + r0 * K, w + (size_t)g * O * K,
                   (int)(n > 0 ? n : 0), K, O, flags & (GM_ACC_DINP | GM_DW_WRITE));
        if (b) dw_pack(dw, g, blk, b, packed);
    }
    if (dw && (flags & GM_DW_SUMSQ) && G > 0 && blk > 0) cuda_dw_ledger_sum(dw, (size_t)G * blk, packed, G);
}

// The fused expert ops (ops.h grouped_swiglu_*, grouped_down_fwd, grouped_matmul_bwd2) as their plain
// ops: float32 (hidden rows float32, Backend.hid FMT_F32) has no conversion to share.
extern "C" void cuda_grouped_swiglu_fwd_f32(void *h1, void *h3, void *act, const void *inp, const float *w1,
                                            const float *w3, const int64_t *off, int G, int K, int O) {
    backend_grouped_swiglu_fwd_plain(backend_cuda_fp32(), h1, h3, act, inp, w1, w3, off, G, K, O);
}

extern "C" void cuda_grouped_down_fwd_f32(float *out, const void *act, const float *w, const int64_t *off,
                                          int G, int K, int O) {
    backend_grouped_down_fwd_plain(backend_cuda_fp32(), out, act, w, off, G, K, O);
}

extern "C" void cuda_grouped_swiglu_bwd_f32(void *dh1, void *dh3, float *dw, const void *dout,
                                            const void *act, const void *h1, const void *h3, const float *w,
                                            const int64_t *off, int G, int K, int O, int flags) {
    backend_grouped_swiglu_bwd_plain(backend_cuda_fp32(), dh1, dh3, dw, dout, act, h1, h3, w, off, G, K, O,
                                     flags);
}

extern "C" void cuda_grouped_matmul_bwd2_f32(float *dinp, float *dwa, float *dwb, const void *douta,
                                             const void *doutb, const void *inp, const float *wa,
                                             const float *wb, const int64_t *off, int G, int K, int O,
                                             int flags) {
    backend_grouped_matmul_bwd2_plain(backend_cuda_fp32(), dinp, dwa, dwb, douta, doutb, inp, wa, wb, off, G,
                                      K, O, flags);
}

extern "C" void cuda_matmul_fwd_multi_f32(int n, float *const *out, const void *inp, const float *const *w,
                                          int N, int K, const int *O, int flags) {
    backend_matmul_fwd_multi_plain(backend_cuda_fp32(), n, out, inp, w, N, K, O, flags);
}

extern "C" void cuda_matmul_bwd_multi_f32(int n, float *dinp, float *const *dw, const float *const *dout,
                                          const void *inp, const float *const *w, int N, int K, const int *O,
                                          int flags) {
    backend_matmul_bwd_multi_plain(backend_cuda_fp32(), n, dinp, dw, dout, inp, w, N, K, O, flags);
}

// ---------------------------------------------------------------- bf16 GEMMs (fp32 accumulation)

// One product from bf16 operands, the weight from its copy or converted into wb: out = beta out + x W^T
// (xb: the input, N x K; out float32, or bf16 with hid: beta 0).
static void mm_fwd_one(void *out, int hid, const bf16 *xb, const float *w, bf16 *wb, int N, int K, int O,
                       float beta) {
    const bf16 *ws = shadow_of(w, (size_t)O * K);
    if (!ws) to_bf16(wb, w, (size_t)O * K);
    gemm_bf16_to(CUBLAS_OP_T, CUBLAS_OP_N, O, N, K, ws ? ws : wb, K, xb, K, beta, out,
                 hid ? CUDA_R_16BF : CUDA_R_32F, O);
}

// One product's backward from bf16 dout (gb, N x O, rows ldg apart) and input (xb, N x K; read only for dw):
// dinp = dout W (+ dinp with GM_ACC_DINP), dw += dout^T x (written with GM_DW_WRITE; either may be NULL), the
// weight from its copy or converted into wb.
static void mm_bwd_one(float *dinp, float *dw, const bf16 *gb, int ldg, const bf16 *xb, const float *w,
                       bf16 *wb, int N, int K, int O, int flags) {
    if (dinp) {
        const bf16 *ws = shadow_of(w, (size_t)O * K);
        if (!ws) to_bf16(wb, w, (size_t)O * K);
        gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, K, N, O, ws ? ws : wb, K, gb, ldg,
                  flags & GM_ACC_DINP ? 1.0f : 0.0f, dinp, K);
    }
    if (dw)
        gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, K, O, N, xb, K, gb, ldg, flags & GM_DW_WRITE ? 0.0f : 1.0f, dw,
                  K);
}

// GM_DOUT_HID's bf16 rows (row i at src + 2 O i) as packed rows (N, O) of T: float32 (widened) or bf16
template <typename T> __global__ void hid_rows_k(T *dst, const bf16 *src, int O, size_t n) {
    GRID_STRIDE(i, n) dst[i] = (T)src[i / O * 2 * O + i % O];
}
template <typename T> static void hid_rows(T *dst, const float *src, int N, int O) {
    size_t n = (size_t)N * O;
    hid_rows_k<T><<<ew_grid(n, 256), 256>>>(dst, (const bf16 *)src, O, n);
    KCHECK("hid_rows");
}

// to_hid_rows (ops.h): a block a row, its float32 values into shared memory, then stored as bf16 from the
// row's first byte (in place: no other block touches the row)
__global__ void to_hid_rows_k(float *x, int C) {
    extern __shared__ float th_row[];
    float *row = x + (size_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) th_row[i] = row[i];
    __syncthreads();
    bf16 *o = (bf16 *)row;
    for (int i = threadIdx.x; i < C; i += blockDim.x) o[i] = __float2bfloat16_rn(th_row[i]);
}
extern "C" void cuda_to_hid_rows_bf16(float *x, int N, int C) {
    if (N <= 0 || C <= 0) return;
    size_t sm = (size_t)C * sizeof(float);
    cuda_smem_allow((const void *)to_hid_rows_k, sm);
    to_hid_rows_k<<<N, 256, sm>>>(x, C);
    KCHECK("to_hid_rows");
}

extern "C" void cuda_matmul_fwd_bf16(float *out, const float *inp, const float *w, int N, int K, int O,
                                     int accumulate) {
    if (N <= 0 || O <= 0 || K <= 0 || O <= MOE_GEMM_FP32_MAX_O) {
        cuda_matmul_fwd_f32(out, inp, w, N, K, O, accumulate);
        return;
    }
    bf16 *xb, *wb;
    bf16_scratch((size_t)N * K, shadow_of(w, (size_t)O * K) ? 0 : (size_t)O * K, 0, &xb, &wb, NULL);
    to_bf16(xb, inp, (size_t)N * K);
    mm_fwd_one(out, 0, xb, w, wb, N, K, O, accumulate ? 1.0f : 0.0f);
}

extern "C" void cuda_matmul_bwd_bf16(float *dinp, float *dw, const float *dout, const float *inp,
                                     const float *w, int N, int K, int O, int flags) {
    if (N <= 0 || K <= 0 || O <= 0 || (!dinp && !dw)) {
        if (O <= 0 || N <= 0)
            cuda_matmul_bwd_f32(dinp, dw, dout, inp, w, N, K, O, flags); // (empty sums: zeros if written)
        return;
    }
    int hid = flags & GM_DOUT_HID;
    if (O <= MOE_GEMM_FP32_MAX_O) {
        if (hid) { // float32 products on the bf16 values widened (2 bf16 slots a value)
            bf16 *f;
            bf16_scratch(2 * (size_t)N * O, 0, 0, &f, NULL, NULL);
            hid_rows((float *)f, dout, N, O);
            dout = (const float *)f;
        }
        cuda_matmul_bwd_f32(dinp, dw, dout, inp, w, N, K, O, flags);
        return;
    }
    // GM_DOUT_HID's rows in place (ld 2 O) where O % 8 = 0; else packed (cuBLAS: other alignment, other bits)
    int inplace = hid && O % 8 == 0;
    bf16 *gb, *wb, *xb;
    bf16_scratch(inplace ? 0 : (size_t)N * O, dinp && !shadow_of(w, (size_t)O * K) ? (size_t)O * K : 0,
                 dw ? (size_t)N * K : 0, &gb, &wb, &xb);
    if (inplace) gb = (bf16 *)dout;
    else if (hid) hid_rows(gb, dout, N, O);
    else to_bf16(gb, dout, (size_t)N * O);
    if (dw) to_bf16(xb, inp, (size_t)N * K);
    mm_bwd_one(dinp, dw, gb, inplace ? 2 * O : O, xb, w, wb, N, K, O, flags);
}

// Several products of one input (ops.h matmul_fwd_multi / _bwd_multi): inp is bf16 already (the hidden
// format), each product through the single ops' mm_fwd_one / mm_bwd_one (the same GEMM calls in the same
// order as the single ops on the same bf16 values); narrow ones (O <= MOE_GEMM_FP32_MAX_O) float32 on inp's
// values widened.
static int mm_bf16_path(int N, int K, int O) { return N > 0 && K > 0 && O > MOE_GEMM_FP32_MAX_O; }

__global__ void bf16_to_f32_k(float *dst, const bf16 *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = __bfloat162float(src[i]);
}
extern "C" void cuda_bf16_to_f32(float *dst, const void *src, size_t n) {
    if (!n) return;
    bf16_to_f32_k<<<ew_grid(n, 256), 256>>>(dst, (const bf16 *)src, n);
    KCHECK("bf16_to_f32");
}
// inp's values as float32 for the narrow products (2 bf16 slots per value in the scratch slot xf), or
// inp itself where no product is narrow or there is nothing to read
static const float *narrow_inp(const void *inp, bf16 *xf, int any_narrow, int N, int K) {
    if (!any_narrow || N <= 0 || K <= 0) return (const float *)inp;
    cuda_bf16_to_f32((float *)xf, inp, (size_t)N * K);
    return (const float *)xf;
}

extern "C" void cuda_matmul_fwd_multi_bf16(int n, float *const *out, const void *inp, const float *const *w,
                                           int N, int K, const int *O, int flags) {
    const char *e = mm_fwd_multi_flags_error(n, O, flags);
    CHECK(!e, "matmul_fwd_multi: %s", e);
    size_t wmax = 0;
    int narrow = 0;
    for (int i = 0; i < n; i++) {
        if (!mm_bf16_path(N, K, O[i])) {
            narrow = 1;
            continue;
        }
        if (!shadow_of(w[i], (size_t)O[i] * K) && (size_t)O[i] * K > wmax) wmax = (size_t)O[i] * K;
    }
    size_t sz[2] = {wmax, narrow && N > 0 && K > 0 ? 2 * (size_t)N * K : 0};
    bf16 *p[2];
    bf16_scratch_v(2, sz, p);
    const float *xf = narrow_inp(inp, p[1], narrow, N, K);
    for (int i = 0; i < n; i++) {
        if (!mm_bf16_path(N, K, O[i])) {
            cuda_matmul_fwd_f32(out[i], xf, w[i], N, K, O[i], 0);
            continue;
        }
        mm_fwd_one(out[i], flags & GM_OUT_HID, (const bf16 *)inp, w[i], p[0], N, K, O[i], 0.0f);
    }
}

extern "C" void cuda_matmul_bwd_multi_bf16(int n, float *dinp, float *const *dw, const float *const *dout,
                                           const void *inp, const float *const *w, int N, int K, const int *O,
                                           int flags) {
    // GM_DOUT_HID: dout[i]'s bf16 rows in place (ld 2 O, read as they are) where O % 8 = 0, else packed into
    // the scratch as matmul_bwd packs them; a narrow product's widened there (2 bf16 slots a value)
    int hid = flags & GM_DOUT_HID;
    size_t gmax = 0, wmax = 0;
    int narrow = 0;
    for (int i = 0; i < n; i++) {
        if (!mm_bf16_path(N, K, O[i])) {
            narrow = 1;
            if (hid && 2 * (size_t)N * O[i] > gmax) gmax = 2 * (size_t)N * O[i];
            continue;
        }
        if ((!hid || O[i] % 8) && (size_t)N * O[i] > gmax) gmax = (size_t)N * O[i];
        if (!shadow_of(w[i], (size_t)O[i] * K) && (size_t)O[i] * K > wmax) wmax = (size_t)O[i] * K;
    }
    size_t sz[3] = {gmax, wmax, narrow && N > 0 && K > 0 ? 2 * (size_t)N * K : 0};
    bf16 *p[3];
    bf16_scratch_v(3, sz, p);
    const float *xf = narrow_inp(inp, p[2], narrow, N, K);
    for (int i = 0; i < n; i++) {
        int fl = (i ? GM_ACC_DINP | (flags & GM_DW_WRITE) : flags) & ~GM_DOUT_HID;
        if (!mm_bf16_path(N, K, O[i])) { // (also the empty products: matmul_bwd's zeros or nothing)
            const float *g = dout[i];
            if (hid && N > 0 && O[i] > 0) {
                hid_rows((float *)p[0], dout[i], N, O[i]);
                g = (const float *)p[0];
            }
            cuda_matmul_bwd_f32(dinp, dw[i], g, xf, w[i], N, K, O[i], fl);
            continue;
        }
        const bf16 *g = p[0];
        int ld = O[i];
        if (hid && O[i] % 8 == 0) g = (const bf16 *)dout[i], ld = 2 * O[i];
        else if (hid) hid_rows(p[0], dout[i], N, O[i]);
        else to_bf16(p[0], dout[i], (size_t)N * O[i]);
        mm_bwd_one(dinp, dw[i], g, ld, (const bf16 *)inp, w[i], p[1], N, K, O[i], fl);
    }
}

// Grouped: the rows [off[0], off[G]) and all G weight blocks are converted once (one kernel each;
// the weights not at all where the bf16 copy has them), then our Hopper kernel (cuda_grouped.cu)
// in one launch, or where it cannot run one cublasGemmEx per non-empty group. Any counts (zeros
// anywhere, all zero) are fine.

// the groups' output rows = x W_g^T from bf16 operands (xb, out0: the groups' rows from off[0])
static void gfwd(float *out0, const bf16 *xb, const bf16 *wb, const int64_t *off, int G, int K, int O) {
    if (cuda_grouped_gemm(out0, O, 0.0f, xb, wb, NULL, NULL, 0, off, G, K, 0, O)) return;
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g] - off[0], n = off[g + 1] - off[g];
        if (n <= 0) continue;
        gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, O, (int)n, K, wb + (size_t)g * O * K, K, xb + r0 * K, K, 0.0f,
                  out0 + r0 * O, O);
    }
}

// the groups' dinp rows = beta dinp + ga W_a [+ gb W_b] (gb NULL: one product; dinp0: row off[0]);
// the pair in one kernel pass
static void gdinp(float *dinp0, float beta, const bf16 *ga, const bf16 *wa, const bf16 *gb, const bf16 *wb,
                  const int64_t *off, int G, int K, int O) {
    if (cuda_grouped_gemm(dinp0, K, beta, ga, wa, gb, wb, 1, off, G, O, gb ? O : 0, K)) return;
    for (int h = 0; h < (gb ? 2 : 1); h++)
        for (int g = 0; g < G; g++) {
            int64_t r0 = off[g] - off[0], n = off[g + 1] - off[g];
            if (n <= 0) continue;
            // dinp_g^T (K,n) = W_g^T (K,O) . dout_g^T (O,n) + beta dinp_g^T
            gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, K, (int)n, O, (h ? wb : wa) + (size_t)g * O * K, K,
                      (h ? gb : ga) + r0 * O, O, h ? 1.0f : beta, dinp0 + r0 * K, K);
        }
}

// GM_DW_WRITE's zeros: the dw blocks (O x K each) of the groups without rows (all G: every group, and with
// GM_DW_SUMSQ those G blocks counted in the ledger, their sum 0); packed: bf16 blocks packed from dw (ops.h
// GM_DW_BF16; a bf16 zero is all zero bits)
static void dw_zero_empty(float *dw, const int64_t *off, int G, int K, int O, int all, int flags) {
    int packed = (flags & GM_DW_BF16) != 0;
    size_t blk = (size_t)O * K, es = packed ? sizeof(bf16) : sizeof(float);
    for (int g = 0; g < G; g++)
        if (all || off[g + 1] <= off[g]) CUDA_CHECK(cudaMemset((char *)dw + g * blk * es, 0, es * blk));
    if (all && (flags & GM_DW_SUMSQ)) cuda_dw_ledger_slots(0, G);
}

// dw_g += dout_g^T x_g (flags GM_DW_WRITE: =; GM_DW_BF16: packed bf16) for every non-empty group (our kernel,
// or cuBLAS per group); with write, the other groups' blocks are zeroed
static void gdw(float *dw, const bf16 *gb, const bf16 *xb, const int64_t *off, int G, int K, int O,
                int flags) {
    int write = flags & GM_DW_WRITE, packed = (flags & GM_DW_BF16) != 0, sumsq = (flags & GM_DW_SUMSQ) != 0;
    dw_flags_check(flags);
    if (write) dw_zero_empty(dw, off, G, K, O, 0, flags);
    if (cuda_grouped_gemm_dw(dw, write ? 0.0f : 1.0f, packed, sumsq, gb, xb, off, G, K, O)) return;
    int64_t base = off[0];
    size_t blk = (size_t)O * K;
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g] - base, n = off[g + 1] - off[g];
        if (n <= 0) continue;
        // dw_g^T (K,O) [+]= inp_g^T (K,n) . dout_g (n,O)
        float *b = dw_block(dw, g, blk, packed);
        gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, K, O, (int)n, xb + r0 * K, K, gb + r0 * O, O, write ? 0.0f : 1.0f,
                  b, K);
        dw_pack(dw, g, blk, b, packed);
    }
    if (sumsq) cuda_dw_ledger_sum(dw, (size_t)G * blk, packed, G);
}

// the bf16 values of the G weight blocks at w: the copy's, or converted into dst
static const bf16 *weights_bf16(bf16 *dst, const float *w, size_t n) {
    const bf16 *ws = shadow_of(w, n);
    if (ws) return ws;
    to_bf16(dst, w, n);
    return dst;
}

// rows of the groups, or 0 after handling an empty call (nothing to do / K = 0 zeros); outputs of
// elem bytes per value (a bf16 zero is all zero bits, as a float32 one)
static int64_t fwd_rows(void *const *outs, int nout, size_t elem, const int64_t *off, int G, int K, int O) {
    if (G <= 0 || O <= 0) return 0;
    int64_t rows = off[G] - off[0];
    if (rows <= 0) return 0;
    if (K <= 0) { // empty sums: the written rows are zeros (as the cpu's GEMM with K = 0)
        for (int i = 0; i < nout; i++)
            CUDA_CHECK(cudaMemset((char *)outs[i] + off[0] * O * elem, 0, elem * (size_t)rows * O));
        return 0;
    }
    return rows;
}

extern "C" void cuda_grouped_matmul_fwd_bf16(float *out, const float *inp, const float *w, const int64_t *off,
                                             int G, int K, int O) {
    void *o = out;
    int64_t rows = fwd_rows(&o, 1, sizeof(float), off, G, K, O);
    if (!rows) return;
    size_t nw = (size_t)G * O * K, sz[2] = {(size_t)rows * K, shadow_of(w, nw) ? 0 : nw};
    bf16 *p[2];
    bf16_scratch_v(2, sz, p);
    to_bf16(p[0], inp + off[0] * K, (size_t)rows * K);
    gfwd(out + off[0] * O, p[0], weights_bf16(p[1], w, nw), off, G, K, O);
}

// the experts' down-projection: its input rows are bf16 already (the hidden format), no conversion
extern "C" void cuda_grouped_down_fwd_bf16(float *out, const void *act, const float *w, const int64_t *off,
                                           int G, int K, int O) {
    void *o = out;
    int64_t rows = fwd_rows(&o, 1, sizeof(float), off, G, K, O);
    if (!rows) return;
    size_t nw = (size_t)G * O * K, sz[1] = {shadow_of(w, nw) ? 0 : nw};
    bf16 *p[1];
    bf16_scratch_v(1, sz, p);
    gfwd(out + off[0] * O, (const bf16 *)act + off[0] * K, weights_bf16(p[0], w, nw), off, G, K, O);
}

// the experts' up-projection: the input rows bf16 already (the hidden format); h1, h3 and act = silu(h1) h3
// (bf16) from one kernel (the SwiGLU in its epilogue), or where it cannot run two GEMM sets into float32
// scratch and swiglu_fwd writing the three rows in bf16
extern "C" void cuda_grouped_swiglu_fwd_bf16(void *h1, void *h3, void *act, const void *inp, const float *w1,
                                             const float *w3, const int64_t *off, int G, int K, int O) {
    void *outs[3] = {h1, h3, act};
    int64_t rows = fwd_rows(outs, 3, sizeof(bf16), off, G, K, O);
    if (!rows) return;
    size_t nw = (size_t)G * O * K, nh = (size_t)rows * O;
    const bf16 *x = (const bf16 *)inp + off[0] * K;
    size_t sz[2] = {shadow_of(w1, nw) ? 0 : nw, shadow_of(w3, nw) ? 0 : nw};
    bf16 *p[2];
    bf16_scratch_v(2, sz, p);
    const bf16 *b1 = weights_bf16(p[0], w1, nw), *b3 = weights_bf16(p[1], w3, nw);
    if (cuda_grouped_swiglu_fwd(h1, h3, act, x, b1, b3, off, G, K, O)) return;
    // where it cannot run: the weights again beside two float32 row blocks (2 bf16 slots per value;
    // growing the scratch may have moved them)
    size_t sf[4] = {sz[0], sz[1], 2 * nh, 2 * nh};
    bf16 *q[4];
    bf16_scratch_v(4, sf, q);
    b1 = weights_bf16(q[0], w1, nw);
    b3 = weights_bf16(q[1], w3, nw);
    float *f1 = (float *)q[2], *f3 = (float *)q[3];
    gfwd(f1, x, b1, off, G, K, O);
    gfwd(f3, x, b3, off, G, K, O);
    size_t b = (size_t)off[0] * O;
    cuda_swiglu_fwd_hid((bf16 *)h1 + b, (bf16 *)h3 + b, (bf16 *)act + b, f1, f3, nh);
}

// the down-projection's backward into the SwiGLU: dact only in the kernel's registers (dh1, dh3 from its
// epilogue), or where it cannot run through float32 scratch and swiglu_bwd; dout (the dact and dw operand),
// act (the dw operand), h1, h3, dh1, dh3 bf16 (the hidden format)
extern "C" void cuda_grouped_swiglu_bwd_bf16(void *dh1, void *dh3, float *dw, const void *dout,
                                             const void *act, const void *h1, const void *h3, const float *w,
                                             const int64_t *off, int G, int K, int O, int flags) {
    if (G <= 0 || K <= 0) return;
    int64_t rows = off[G] - off[0], base = off[0];
    int write = dw && (flags & GM_DW_WRITE) && O > 0;
    if (rows <= 0) {
        if (write) dw_zero_empty(dw, off, G, K, O, 1, flags);
        return;
    }
    size_t n = (size_t)rows * K, b = (size_t)base * K;
    bf16 *d1 = (bf16 *)dh1 + b, *d3 = (bf16 *)dh3 + b;
    if (O <= 0) { // dact = 0: dh1 = dh3 = 0 (0 * finite); dw has no elements
        CUDA_CHECK(cudaMemset(d1, 0, sizeof(bf16) * n));
        CUDA_CHECK(cudaMemset(d3, 0, sizeof(bf16) * n));
        return;
    }
    size_t nw = (size_t)G * O * K;
    const bf16 *g = (const bf16 *)dout + base * O;
    size_t sz[1] = {shadow_of(w, nw) ? 0 : nw};
    bf16 *p[1];
    bf16_scratch_v(1, sz, p);
    const bf16 *wb = weights_bf16(p[0], w, nw);
    if (!cuda_grouped_swiglu_bwd(dh1, dh3, h1, h3, g, wb, off, G, K, O)) {
        // the weights again beside a float32 dact block (growing the scratch may have moved them)
        size_t sf[2] = {sz[0], 2 * n};
        bf16 *q[2];
        bf16_scratch_v(2, sf, q);
        wb = weights_bf16(q[0], w, nw);
        float *dact = (float *)q[1];
        gdinp(dact, 0.0f, g, wb, NULL, NULL, off, G, K, O);
        cuda_swiglu_bwd_hid(d1, d3, dact, (const bf16 *)h1 + b, (const bf16 *)h3 + b, n);
    }
    if (dw) gdw(dw, g, (const bf16 *)act + b, off, G, K, O, flags & GM_DW_FLAGS);
}

// rows of the groups, or 0 after handling an empty call (O = 0: an overwritten dinp is zeros; no rows:
// GM_DW_WRITE's zeros in the G blocks of each of the dws)
static int64_t bwd_rows(float *dinp, float *const *dws, int ndw, const int64_t *off, int G, int K, int O,
                        int flags) {
    int any = dinp != NULL;
    for (int i = 0; i < ndw; i++) any |= dws[i] != NULL;
    if (G <= 0 || K <= 0 || !any) return 0;
    int64_t rows = off[G] - off[0];
    if (rows <= 0) {
        for (int i = 0; i < ndw; i++)
            if (dws[i] && (flags & GM_DW_WRITE) && O > 0) dw_zero_empty(dws[i], off, G, K, O, 1, flags);
        return 0;
    }
    if (O <= 0) { // empty sums: an overwritten dinp is zeros over the groups' rows; dw has no elements
        if (dinp && !(flags & GM_ACC_DINP))
            CUDA_CHECK(cudaMemset(dinp + off[0] * K, 0, sizeof(float) * (size_t)rows * K));
        return 0;
    }
    return rows;
}

// dinp with beta = GM_ACC_DINP (0: written, never read); dw with beta 1, or 0 with GM_DW_WRITE (ops.h).
extern "C" void cuda_grouped_matmul_bwd_bf16(float *dinp, float *dw, const float *dout, const float *inp,
                                             const float *w, const int64_t *off, int G, int K, int O,
                                             int flags) {
    int64_t rows = bwd_rows(dinp, &dw, 1, off, G, K, O, flags);
    if (!rows) return;
    int64_t base = off[0];
    size_t nw = (size_t)G * O * K;
    size_t sz[3] = {(size_t)rows * O, dinp && !shadow_of(w, nw) ? nw : 0, dw ? (size_t)rows * K : 0};
    bf16 *p[3];
    bf16_scratch_v(3, sz, p);
    to_bf16(p[0], dout + base * O, (size_t)rows * O);
    if (dinp)
        gdinp(dinp + base * K, flags & GM_ACC_DINP ? 1.0f : 0.0f, p[0], weights_bf16(p[1], w, nw), NULL, NULL,
              off, G, K, O);
    if (dw) {
        to_bf16(p[2], inp + base * K, (size_t)rows * K);
        gdw(dw, p[0], p[2], off, G, K, O, flags & GM_DW_FLAGS);
    }
}

// the pair's backward: dinp [+]= douta Wa + doutb Wb in one pass; douta, doutb (dh1, dh3) and inp (the dw
// operand) bf16 already (the hidden format)
extern "C" void cuda_grouped_matmul_bwd2_bf16(float *dinp, float *dwa, float *dwb, const void *douta,
                                              const void *doutb, const void *inp, const float *wa,
                                              const float *wb, const int64_t *off, int G, int K, int O,
                                              int flags) {
    float *dws[2] = {dwa, dwb};
    int64_t rows = bwd_rows(dinp, dws, 2, off, G, K, O, flags);
    if (!rows) return;
    int64_t base = off[0];
    size_t nw = (size_t)G * O * K;
    size_t sz[2] = {dinp && !shadow_of(wa, nw) ? nw : 0, dinp && !shadow_of(wb, nw) ? nw : 0};
    bf16 *p[2];
    bf16_scratch_v(2, sz, p);
    const bf16 *ga = (const bf16 *)douta + base * O, *gb = (const bf16 *)doutb + base * O;
    const bf16 *x = (const bf16 *)inp + base * K;
    if (dinp)
        gdinp(dinp + base * K, flags & GM_ACC_DINP ? 1.0f : 0.0f, ga, weights_bf16(p[0], wa, nw), gb,
              weights_bf16(p[1], wb, nw), off, G, K, O);
    if (dwa) gdw(dwa, ga, x, off, G, K, O, flags & GM_DW_FLAGS);
    if (dwb) gdw(dwb, gb, x, off, G, K, O, flags & GM_DW_FLAGS);
}
