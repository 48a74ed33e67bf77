// cuda_norm.cu — float32 CUDA kernels of the cuda backend for RMSNorm and RoPE (contracts in ops/ops.h):
// RMSNorm forward (float32 or bf16 outputs, fused with the residual add: add_rmsnorm), backward (dx, and
// dw by a fixed two-pass column sum; dx and dw's first pass in one kernel where the rows are many), and
// the parts for rows whose columns are split across TP ranks (rmsnorm_part: a rank's sums; the forward and
// backward given the whole sums); RoPE (HF rotate_half) forward, backward, on a window of rows, into
// float32 or bf16 copies, and backward into bf16 in place of its float32 rows (rope_bwd_hid: GM_DOUT_HID's
// layout); RoPE with YaRN's frequencies on strided rows and the strided copy (multi-head latent attention's
// rope parts and head blocks).
// Determinism as cuda_nn.cu: per-row sums through one fixed-order row_dot and block_sum_d; built with
// -fmad=false (CMakeLists.txt), so the elementwise arithmetic rounds like the cpu reference.
// Must not hold: any knowledge of the model or of layers.
#include <math.h>
#include <cuda_bf16.h>
#include "ops/cuda/cuda_common.h"

// ---------------------------------------------------------------- RMSNorm

// The row sums of the RMSNorm kernels (the forward's sum of squares, the backward's dot, the _part
// kernels'): sum over c of a[c] (* w[c]) * b[c] in double, thread t adding columns t, t + blockDim, ...
// (VEC, float4 rows: the 4 columns of float4 t, t + blockDim, ..., in column order), then block_sum_d.
// Every kernel below sums through it, so a rank's part with C = Ctot gives the whole row's bits.
template <int VEC>
__device__ __forceinline__ double row_dot(const float *a, const float *w, const float *b, int C) {
    double s = 0;
    if (VEC) {
        const float4 *a4 = (const float4 *)a, *b4 = (const float4 *)b, *w4 = (const float4 *)w;
        for (int c = threadIdx.x; c < C / 4; c += blockDim.x) {
            float4 x = a4[c], y = b4[c];
            if (w) {
                float4 v = w4[c];
                s += (double)x.x * v.x * y.x;
                s += (double)x.y * v.y * y.y;
                s += (double)x.z * v.z * y.z;
                s += (double)x.w * v.w * y.w;
            } else {
                s += (double)x.x * y.x;
                s += (double)x.y * y.y;
                s += (double)x.z * y.z;
                s += (double)x.w * y.w;
            }
        }
    } else if (w) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) s += (double)ld_f(a + c) * w[c] * ld_f(b + c);
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            double v = ld_f(a + c);
            s += v * ld_f(b + c);
        }
    }
    return block_sum_d(s);
}
// out = x r w over a row (VEC: float4), float32 or each value rounded to bf16 (OT)
template <int VEC, typename OT>
__device__ __forceinline__ void row_scale(OT *o, const float *x, float r, const float *w, int C) {
    if (VEC) {
        for (int c = threadIdx.x; c < C / 4; c += blockDim.x) {
            float4 v = ((const float4 *)x)[c], s = ((const float4 *)w)[c];
            store4(o + 4 * c, v.x * r * s.x, v.y * r * s.y, v.z * r * s.z, v.w * r * s.w);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) store1(o + c, ld_f(x + c) * r * w[c]);
    }
}
// dx += r g w - k x over a row (VEC: float4)
template <int VEC>
__device__ __forceinline__ void row_dx(float *dx, const float *g, const float *x, float r, float k,
                                       const float *w, int C) {
    if (VEC) {
        for (int c = threadIdx.x; c < C / 4; c += blockDim.x) {
            float4 d = ((float4 *)dx)[c], u = ((const float4 *)g)[c], v = ((const float4 *)x)[c],
                   s = ((const float4 *)w)[c];
            d.x = d.x + (r * u.x * s.x - k * v.x);
            d.y = d.y + (r * u.y * s.y - k * v.y);
            d.z = d.z + (r * u.z * s.z - k * v.z);
            d.w = d.w + (r * u.w * s.w - k * v.w);
            ((float4 *)dx)[c] = d;
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x)
            st_f(dx + c, ld_f(dx + c) + (r * ld_f(g + c) * w[c] - k * ld_f(x + c)));
    }
}
// the rows may go as float4: C % 4 == 0 and every row pointer's base 16-byte aligned
static int rms_vec(int C, const void *a, const void *b, const void *c, const void *d) {
    return C % 4 == 0 && !(((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) % 16);
}
// A kernel K<VD, VE>: VD, the row sum on float4 rows (decided by the summed operands alone, and the block
// size with it: the sum's order depends on both, and a part with C = Ctot must meet the whole row's);
// VE, the elementwise pass on float4 rows (any block size).
#define RMS_LAUNCH(K, N, C, vd, ve, ...) \
    do { \
        int th_ = (vd) ? row_threads((C) / 4) : row_threads(C); \
        if (vd && ve) K<1, 1><<<N, th_>>>(__VA_ARGS__); \
        else if (vd) K<1, 0><<<N, th_>>>(__VA_ARGS__); \
        else if (ve) K<0, 1><<<N, th_>>>(__VA_ARGS__); \
        else K<0, 0><<<N, th_>>>(__VA_ARGS__); \
    } while (0)

// One row's norm (block i): the sum of squares, rstd, out = x r w (float32, or rounded to bf16)
template <int VD, int VE, typename OT>
__device__ __forceinline__ void rmsnorm_row(OT *out, float *rstd, const float *x, const float *w, int C,
                                            float eps) {
    size_t i = blockIdx.x;
    double ss = row_dot<VD>(x, NULL, x, C);
    float r = (float)(1.0 / sqrt(ss / C + eps));
    if (threadIdx.x == 0) rstd[i] = r;
    row_scale<VE>(out + i * C, x, r, w, C);
}
template <int VD, int VE>
__global__ void rmsnorm_fwd_k(float *out, float *rstd, const float *inp, const float *w, int C, float eps) {
    rmsnorm_row<VD, VE>(out, rstd, inp + (size_t)blockIdx.x * C, w, C, eps);
}
template <int VD, int VE>
__global__ void rmsnorm_fwd_bf16_k(__nv_bfloat16 *out, float *rstd, const float *inp, const float *w, int C,
                                   float eps) {
    rmsnorm_row<VD, VE>(out, rstd, inp + (size_t)blockIdx.x * C, w, C, eps);
}

extern "C" void cuda_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C,
                                 float eps) {
    if (N <= 0) return;
    RMS_LAUNCH(rmsnorm_fwd_k, N, C, rms_vec(C, inp, NULL, inp, NULL), rms_vec(C, out, inp, w, NULL), out,
               rstd, inp, w, C, eps);
    KCHECK("rmsnorm_fwd");
}

// ops.h rmsnorm_fwd_hid: "cuda" rounds each value of rmsnorm_fwd's to bf16 in the kernel (the same
// floats); "cuda-fp32" (float32 hidden format) is rmsnorm_fwd
extern "C" void cuda_rmsnorm_fwd_hid_bf16(void *out, float *rstd, const float *inp, const float *w, int N,
                                          int C, float eps) {
    if (N <= 0) return;
    RMS_LAUNCH(rmsnorm_fwd_bf16_k, N, C, rms_vec(C, inp, NULL, inp, NULL), rms_vec(C, out, inp, w, NULL),
               (__nv_bfloat16 *)out, rstd, inp, w, C, eps);
    KCHECK("rmsnorm_fwd (bf16 out)");
}
extern "C" void cuda_rmsnorm_fwd_hid_f32(void *out, float *rstd, const float *inp, const float *w, int N,
                                         int C, float eps) {
    cuda_rmsnorm_fwd((float *)out, rstd, inp, w, N, C, eps);
}

// x += res over a row, then rmsnorm_fwd_k on it: the block size and the sum's order are rmsnorm_fwd's for
// x (VD from x alone), the add is axpy's (x + 1 res, one rounding); the row goes back to memory before the
// norm reads it (its pieces are not the threads' own where VD differs from the add's width).
template <int VD, int VE>
__global__ void add_rmsnorm_fwd_k(float *xg, float *out, float *rstd, const float *res, const float *w, int C,
                                  float eps, int va) {
    size_t i = blockIdx.x;
    float *x = xg + i * C;
    const float *y = res + i * C;
    if (va) {
        for (int c = threadIdx.x; c < C / 4; c += blockDim.x) {
            float4 u = ((const float4 *)x)[c], v = ((const float4 *)y)[c];
            ((float4 *)x)[c] = make_float4(u.x + v.x, u.y + v.y, u.z + v.z, u.w + v.w);
        }
    } else {
        for (int c = threadIdx.x; c < C; c += blockDim.x) x[c] = x[c] + y[c];
    }
    __syncthreads();
    rmsnorm_row<VD, VE>(out, rstd, x, w, C, eps);
}

extern "C" void cuda_add_rmsnorm_fwd(float *x, float *out, float *rstd, const float *res, const float *w,
                                     int N, int C, float eps) {
    cuda_bf16_shadow_write(x, (size_t)N * C * sizeof(float));
    if (N <= 0) return;
    RMS_LAUNCH(add_rmsnorm_fwd_k, N, C, rms_vec(C, x, NULL, x, NULL), rms_vec(C, out, x, w, NULL), x, out,
               rstd, res, w, C, eps, rms_vec(C, x, res, NULL, NULL));
    KCHECK("add_rmsnorm_fwd");
}

// dx = r (g w) - x r^3 mean(g w x), one block per row
template <int VD, int VE>
__global__ void rmsnorm_bwd_dx_k(float *dinp, const float *dout, const float *inp, const float *w,
                                 const float *rstd, int C) {
    size_t i = blockIdx.x;
    const float *x = inp + i * C, *g = dout + i * C;
    float r = rstd[i];
    double dot = row_dot<VD>(g, w, x, C);
    float k = (float)(dot / C) * r * r * r;
    row_dx<VE>(dinp + i * C, g, x, r, k, w, C);
}

// dw[c] += sum_i g[i,c] x[i,c] rstd[i]: pass 1 sums fixed chunks of RMS_ROWS rows per column into
// part[chunk][c] (double); pass 2 adds the chunks in order. Deterministic for any launch shape. The fused
// kernel below takes the same chunks, so fused or not the bits are the same (chunks of 16 and 32 rows timed
// no faster: docs/PERFORMANCE.md "Kept").
#define RMS_ROWS 64
__global__ void rmsnorm_bwd_dw_part_k(double *part, const float *dout, const float *inp, const float *rstd,
                                      int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, ch = blockIdx.y;
    if (c >= C) return;
    int i0 = ch * RMS_ROWS, i1 = i0 + RMS_ROWS < N ? i0 + RMS_ROWS : N;
    double s = 0;
    for (int i = i0; i < i1; i++)
        s += (double)ld_f(dout + (size_t)i * C + c) * ld_f(inp + (size_t)i * C + c) * rstd[i];
    part[(size_t)ch * C + c] = s;
}
__global__ void rmsnorm_bwd_dw_sum_k(float *dw, const double *part, int nch, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    double s = 0;
#pragma unroll 8
    for (int ch = 0; ch < nch; ch++) s += part[(size_t)ch * C + c];
    dw[c] += (float)s;
}

// dx (rmsnorm_bwd_dx_k<1, 1>) and dw's pass 1 (rmsnorm_bwd_dw_part_k) from one read of g and x: block ch
// takes chunk ch's RMS_ROWS rows in order, each row's dot in row_dot's order (the same row_threads(C / 4)
// threads, float4 t, t + blockDim, ... of a row each) and its dx as row_dx's, while each thread sums its own
// columns' g x r in row order from 0, as pass 1's threads: both the two kernels' bits. The next row's g and
// x are loaded before this row's sum (its latency behind the block's reduction). FV: float4s a thread a row
// (C <= 4 FV blockDim).
template <int FV>
__global__ void __launch_bounds__(256, FV <= 2 ? 2 : 1)
    rmsnorm_bwd_fused_k(float *dinp, double *part, const float *dout, const float *inp, const float *w,
                        const float *rstd, int N, int C) {
    const int C4 = C / 4, i0 = blockIdx.x * RMS_ROWS, i1 = min(i0 + RMS_ROWS, N);
    const float4 *w4 = (const float4 *)w;
    float4 wv[FV], g[FV], x[FV], d[FV], gn[FV], xn[FV], dn[FV];
    double dw[FV][4];
    const float4 z = make_float4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < FV; j++) {
        int c = threadIdx.x + j * blockDim.x;
        wv[j] = c < C4 ? w4[c] : z;
        gn[j] = c < C4 ? ((const float4 *)(dout + (size_t)i0 * C))[c] : z;
        xn[j] = c < C4 ? ((const float4 *)(inp + (size_t)i0 * C))[c] : z;
        dn[j] = c < C4 ? ((const float4 *)(dinp + (size_t)i0 * C))[c] : z;
        dw[j][0] = dw[j][1] = dw[j][2] = dw[j][3] = 0;
    }
    for (int i = i0; i < i1; i++) {
        double s = 0;
#pragma unroll
        for (int j = 0; j < FV; j++) {
            int c = threadIdx.x + j * blockDim.x;
            g[j] = gn[j];
            x[j] = xn[j];
            d[j] = dn[j];
            if (i + 1 < i1 && c < C4) {
                gn[j] = ((const float4 *)(dout + (size_t)(i + 1) * C))[c];
                xn[j] = ((const float4 *)(inp + (size_t)(i + 1) * C))[c];
                dn[j] = ((const float4 *)(dinp + (size_t)(i + 1) * C))[c];
            }
            if (c < C4) {
                s += (double)g[j].x * wv[j].x * x[j].x;
                s += (double)g[j].y * wv[j].y * x[j].y;
                s += (double)g[j].z * wv[j].z * x[j].z;
                s += (double)g[j].w * wv[j].w * x[j].w;
            }
        }
        double dot = block_sum_d(s);
        float r = rstd[i], k = (float)(dot / C) * r * r * r;
        float4 *dx4 = (float4 *)(dinp + (size_t)i * C);
#pragma unroll
        for (int j = 0; j < FV; j++) {
            int c = threadIdx.x + j * blockDim.x;
            if (c >= C4) continue;
            float4 o = d[j];
            o.x = o.x + (r * g[j].x * wv[j].x - k * x[j].x);
            o.y = o.y + (r * g[j].y * wv[j].y - k * x[j].y);
            o.z = o.z + (r * g[j].z * wv[j].z - k * x[j].z);
            o.w = o.w + (r * g[j].w * wv[j].w - k * x[j].w);
            dx4[c] = o;
            dw[j][0] += (double)g[j].x * x[j].x * r;
            dw[j][1] += (double)g[j].y * x[j].y * r;
            dw[j][2] += (double)g[j].z * x[j].z * r;
            dw[j][3] += (double)g[j].w * x[j].w * r;
        }
    }
    double *pc = part + (size_t)blockIdx.x * C;
#pragma unroll
    for (int j = 0; j < FV; j++) {
        int c = threadIdx.x + j * blockDim.x;
        if (c < C4)
            for (int e = 0; e < 4; e++) pc[4 * c + e] = dw[j][e];
    }
}
// The fused form where it fills the GPU and its rows go as float4 (rms_vec), unless MOE_NORM_FUSED=0 (the
// A/B: the same bits either way); RMS_FUSE_MIN chunks at least (8192 rows: 128).
#define RMS_FUSE_MIN 64
static int fused_on(void) {
    static int v = -1;
    if (v < 0)
        v = cuda_env_switch("MOE_NORM_FUSED", "1", "0",
                            "RMSNorm's backward in one kernel where the rows are many",
                            "the two kernels, dx then dw");
    return v;
}

static void rmsnorm_dw_sum(float *dw, const double *part, int nch, int C) {
    rmsnorm_bwd_dw_sum_k<<<cdiv_u(C, 128), 128>>>(dw, part, nch, C);
    KCHECK("rmsnorm_bwd (dw pass 2)");
}
static void rmsnorm_dw(float *dw, const float *dout, const float *inp, const float *rstd, int N, int C) {
    int nch = (N + RMS_ROWS - 1) / RMS_ROWS;
    double *part = (double *)cuda_workspace((size_t)nch * C * sizeof(double));
    dim3 grid(cdiv_u(C, 128), nch);
    rmsnorm_bwd_dw_part_k<<<grid, 128>>>(part, dout, inp, rstd, N, C);
    KCHECK("rmsnorm_bwd (dw pass 1)");
    rmsnorm_dw_sum(dw, part, nch, C);
}

extern "C" void cuda_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                                 const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    int nch = (N + RMS_ROWS - 1) / RMS_ROWS, th = row_threads(C / 4),
        fv = (C / 4 + th - 1) / th; // (float4s a thread a row)
    if (dw && N >= RMS_FUSE_MIN * 64 && fv <= 4 && rms_vec(C, dout, w, inp, NULL) &&
        rms_vec(C, dinp, dout, inp, w) && fused_on()) {
        double *part = (double *)cuda_workspace((size_t)nch * C * sizeof(double));
        if (fv == 1) rmsnorm_bwd_fused_k<1><<<nch, th>>>(dinp, part, dout, inp, w, rstd, N, C);
        else if (fv == 2) rmsnorm_bwd_fused_k<2><<<nch, th>>>(dinp, part, dout, inp, w, rstd, N, C);
        else rmsnorm_bwd_fused_k<4><<<nch, th>>>(dinp, part, dout, inp, w, rstd, N, C);
        KCHECK("rmsnorm_bwd (dx and dw pass 1)");
        rmsnorm_dw_sum(dw, part, nch, C);
        return;
    }
    RMS_LAUNCH(rmsnorm_bwd_dx_k, N, C, rms_vec(C, dout, w, inp, NULL), rms_vec(C, dinp, dout, inp, w), dinp,
               dout, inp, w, rstd, C);
    KCHECK("rmsnorm_bwd (dx)");
    if (dw) rmsnorm_dw(dw, dout, inp, rstd, N, C);
}

// RMSNorm over rows split by columns across ranks (ops.h rmsnorm_part / _fwd_part / _bwd_part): the
// same per-row block sums and elementwise operations as the kernels above, so that one rank's part
// (C = Ctot) gives their bits; the dw passes are rmsnorm_bwd's.
template <int VD, int VE>
__global__ void rmsnorm_part_k(double *part, const float *a, const float *w, const float *b, int C) {
    size_t i = blockIdx.x;
    double s = row_dot<VD>(a + i * C, w, b + i * C, C);
    if (threadIdx.x == 0) part[i] = s;
}
template <int VD, int VE>
__global__ void rmsnorm_fwd_part_k(float *out, float *rstd, const float *inp, const float *w,
                                   const double *ss, int C, int Ctot, float eps) {
    size_t i = blockIdx.x;
    float r = (float)(1.0 / sqrt(ss[i] / Ctot + eps));
    if (threadIdx.x == 0) rstd[i] = r;
    row_scale<VE>(out + i * C, inp + i * C, r, w, C);
}
template <int VD, int VE>
__global__ void rmsnorm_bwd_part_dx_k(float *dinp, const float *dout, const float *inp, const float *w,
                                      const float *rstd, const double *dot, int C, int Ctot) {
    size_t i = blockIdx.x;
    float r = rstd[i];
    float k = (float)(dot[i] / Ctot) * r * r * r;
    row_dx<VE>(dinp + i * C, dout + i * C, inp + i * C, r, k, w, C);
}

extern "C" void cuda_rmsnorm_part(double *part, const float *a, const float *w, const float *b, int N,
                                  int C) {
    if (N <= 0) return;
    RMS_LAUNCH(rmsnorm_part_k, N, C, rms_vec(C, a, w, b, NULL), 0, part, a, w, b, C);
    KCHECK("rmsnorm_part");
}

extern "C" void cuda_rmsnorm_fwd_part(float *out, float *rstd, const float *inp, const float *w,
                                      const double *ss, int N, int C, int Ctot, float eps) {
    if (N <= 0) return;
    RMS_LAUNCH(rmsnorm_fwd_part_k, N, C, 0, rms_vec(C, out, inp, w, NULL), out, rstd, inp, w, ss, C, Ctot,
               eps);
    KCHECK("rmsnorm_fwd_part");
}

extern "C" void cuda_rmsnorm_bwd_part(float *dinp, float *dw, const float *dout, const float *inp,
                                      const float *w, const float *rstd, const double *dot, int N, int C,
                                      int Ctot) {
    if (N <= 0 || C <= 0) return;
    RMS_LAUNCH(rmsnorm_bwd_part_dx_k, N, C, 0, rms_vec(C, dinp, dout, inp, w), dinp, dout, inp, w, rstd, dot,
               C, Ctot);
    KCHECK("rmsnorm_bwd_part (dx)");
    if (dw) rmsnorm_dw(dw, dout, inp, rstd, N, C);
}

// ---------------------------------------------------------------- RoPE

// HF rotate_half: pairs (j, j + hd/2), angle = pos * theta^(-2j/hd), computed in double exactly as the cpu
// reference does, then its cos and sin rounded to float: once per (position, pair) into a table (rope_tab)
// that the kernels read. The double pow, cos and sin per element left the kernels bound by the FP64 units
// (rope_bwd's 256 of them a row: ~52 us a launch on the reference model's q, as on its k at half the bytes).
// The table of positions [0, T) for one (hd, theta), grown on demand to twice its positions at least (the
// KV-cached decode asks one position more a token; cudaFree synchronises, only then): element pos * (hd / 2)
// + j = (cos, sin) of that angle, whatever the table's size.
__global__ void rope_tab_k(float2 *cs, int T, int hd, float theta) {
    int half = hd / 2;
    GRID_STRIDE(e, (size_t)T * half) {
        int pos = (int)(e / half), j = (int)(e % half);
        double freq = pow((double)theta, -2.0 * j / hd);
        double ang = pos * freq;
        cs[e] = make_float2((float)cos(ang), (float)sin(ang));
    }
}
static struct {
    float2 *cs;
    int T, hd;
    float theta;
} g_rope;
static const float2 *rope_tab(int T, int hd, float theta) {
    int same = g_rope.cs && g_rope.hd == hd && g_rope.theta == theta;
    if (same && g_rope.T >= T) return g_rope.cs;
    if (same && T < 2 * g_rope.T) T = 2 * g_rope.T;
    if (g_rope.cs) CUDA_CHECK(cudaFree(g_rope.cs));
    size_t n = (size_t)T * (hd / 2);
    CUDA_CHECK(cudaMalloc((void **)&g_rope.cs, (n ? n : 1) * sizeof(float2)));
    g_rope.T = T;
    g_rope.hd = hd;
    g_rope.theta = theta;
    if (n) {
        rope_tab_k<<<ew_grid(n, 256), 256>>>(g_rope.cs, T, hd, theta);
        KCHECK("rope_tab");
    }
    return g_rope.cs;
}
// One thread per (row bt, pair j), looping over the heads; (c, s) from the table cs (positions to t0 + T), s
// negated for dir -1 (exact: the value of rounding the negated sine). Rows of x: positions t0 + bt % T
// (rope_rows: the rows [t0, t0 + T) of each sequence). out = x (in place, float) or another buffer of the
// same layout (rope_fwd_hid: float32 or bf16 each way, each value stored by store1; a thread reads its pair's
// values before it stores them, so bf16 in place too).
template <typename TO, typename TI>
__global__ void rope_k(TO *out, const TI *x, const float2 *cs, int BT, int T, int nh, int hd, int dir,
                       int t0) {
    int half = hd / 2;
    size_t n = (size_t)BT * half;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        int bt = (int)(e / half), j = (int)(e % half), pos = t0 + bt % T;
        float2 t = cs[(size_t)pos * half + j];
        float c = t.x, s = dir < 0 ? -t.y : t.y;
        const TI *row = x + (size_t)bt * nh * hd;
        TO *orow = out + (size_t)bt * nh * hd;
        for (int h = 0; h < nh; h += 4) { // four heads' loads in flight before their stores
            int m = nh - h < 4 ? nh - h : 4;
            float x1[4], x2[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (u < m) {
                    x1[u] = ld_f(row + (size_t)(h + u) * hd + j);
                    x2[u] = ld_f(row + (size_t)(h + u) * hd + j + half);
                }
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (u < m) {
                    store1(orow + (size_t)(h + u) * hd + j, x1[u] * c - x2[u] * s);
                    store1(orow + (size_t)(h + u) * hd + j + half, x2[u] * c + x1[u] * s);
                }
        }
    }
}

template <typename TO, typename TI>
static void rope_launch(TO *out, const TI *x, int BT, int T, int nh, int hd, float theta, int dir, int t0,
                        const char *what) {
    size_t n = (size_t)BT * (hd / 2);
    if (!n || nh <= 0) return;
    rope_k<TO, TI><<<ew_grid(n, 256), 256>>>(out, x, rope_tab(t0 + T, hd, theta), BT, T, nh, hd, dir, t0);
    KCHECK(what);
}

extern "C" void cuda_rope_fwd(float *x, int B, int T, int nh, int hd, float theta) {
    rope_launch(x, x, B * T, T, nh, hd, theta, 1, 0, "rope_fwd");
}

extern "C" void cuda_rope_bwd(float *dx, int B, int T, int nh, int hd, float theta) {
    rope_launch(dx, dx, B * T, T, nh, hd, theta, -1, 0, "rope_bwd");
}

extern "C" void cuda_rope_rows(float *x, int B, int t0, int t1, int nh, int hd, float theta, int inverse) {
    rope_launch(x, x, B * (t1 - t0), t1 - t0, nh, hd, theta, inverse ? -1 : 1, t0, "rope_rows");
}

// (the float32 format: from_hid or not, inp is float32)
extern "C" void cuda_rope_fwd_f32(void *out, const void *inp, int from_hid, int B, int T, int nh, int hd,
                                  float theta) {
    (void)from_hid;
    rope_launch((float *)out, (const float *)inp, B * T, T, nh, hd, theta, 1, 0, "rope_fwd_hid (float32)");
}

// rope_fwd_hid from bf16 rows where hd % 4 = 0 and the rows are 4-byte aligned: rope_k's arithmetic on two
// adjacent pairs j, j + 1 a thread, each loaded and stored as a bf16 pair (a warp 128 contiguous bytes an
// access, as rope_k's float loads), (c, s) from the table. The same values, the same products (this file is
// compiled without FMA contraction): rope_k's bits, in place too.
__global__ void rope_hid2_k(__nv_bfloat16 *out, const __nv_bfloat16 *x, const float2 *cs, int BT, int T,
                            int nh, int hd) {
    int half = hd / 2, hp = half / 2;
    size_t n = (size_t)BT * hp;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        int bt = (int)(e / hp), j = 2 * (int)(e % hp);
        float2 t0 = cs[(size_t)(bt % T) * half + j], t1 = cs[(size_t)(bt % T) * half + j + 1];
        float c[2] = {t0.x, t1.x}, s[2] = {t0.y, t1.y};
        const __nv_bfloat162 *row = (const __nv_bfloat162 *)(x + (size_t)bt * nh * hd);
        __nv_bfloat162 *orow = (__nv_bfloat162 *)(out + (size_t)bt * nh * hd);
        for (int h = 0; h < nh; h += 4) { // four heads' loads in flight before their stores
            int m = nh - h < 4 ? nh - h : 4;
            float2 a[4], b[4];
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (u < m) {
                    a[u] = __bfloat1622float2(row[((size_t)(h + u) * hd + j) / 2]);
                    b[u] = __bfloat1622float2(row[((size_t)(h + u) * hd + j + half) / 2]);
                }
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (u < m) {
                    orow[((size_t)(h + u) * hd + j) / 2] =
                        __floats2bfloat162_rn(a[u].x * c[0] - b[u].x * s[0], a[u].y * c[1] - b[u].y * s[1]);
                    orow[((size_t)(h + u) * hd + j + half) / 2] =
                        __floats2bfloat162_rn(b[u].x * c[0] + a[u].x * s[0], b[u].y * c[1] + a[u].y * s[1]);
                }
        }
    }
}

extern "C" void cuda_rope_fwd_bf16(void *out, const void *inp, int from_hid, int B, int T, int nh, int hd,
                                   float theta) {
    typedef __nv_bfloat16 bf;
    size_t n = (size_t)B * T * (hd / 4);
    if (from_hid && hd % 4 == 0 && n && nh > 0 && (uintptr_t)out % 4 == 0 && (uintptr_t)inp % 4 == 0) {
        rope_hid2_k<<<ew_grid(n, 256), 256>>>((bf *)out, (const bf *)inp, rope_tab(T, hd, theta), B * T, T,
                                              nh, hd);
        KCHECK("rope_fwd_hid (bf16 pairs)");
    } else if (from_hid)
        rope_launch((bf *)out, (const bf *)inp, B * T, T, nh, hd, theta, 1, 0, "rope_fwd_hid (bf16)");
    else
        rope_launch((bf *)out, (const float *)inp, B * T, T, nh, hd, theta, 1, 0,
                    "rope_fwd_hid (f32 -> bf16)");
}

// rope_bwd_hid (ops.h): a block a row (bt), the row's float32 values into shared memory first, then its
// values rotated as rope_k rotates them (its c and s, its products) and stored as bf16 from the row's first
// byte: in place, as no other block touches the row. Thread t takes pair j = t % half of the heads t / half,
// t / half + G, ... (G = blockDim / half): one (c, s) of the table a thread, as rope_k.
__global__ void rope_bwd_hid_k(float *x, const float2 *cs, int T, int nh, int hd) {
    extern __shared__ float rs_row[];
    int half = hd / 2, C = nh * hd, bt = blockIdx.x, G = blockDim.x / half;
    float *row = x + (size_t)bt * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) rs_row[i] = row[i];
    __syncthreads();
    int j = threadIdx.x % half, g = threadIdx.x / half;
    if (g >= G) return;
    float2 t = cs[(size_t)(bt % T) * half + j];
    float c = t.x, s = -t.y;
    __nv_bfloat16 *o = (__nv_bfloat16 *)row;
    for (int h = g; h < nh; h += G) {
        float x1 = rs_row[h * hd + j], x2 = rs_row[h * hd + j + half];
        store1(o + (size_t)h * hd + j, x1 * c - x2 * s);
        store1(o + (size_t)h * hd + j + half, x2 * c + x1 * s);
    }
}
extern "C" void cuda_rope_bwd_hid_bf16(float *dx, int B, int T, int nh, int hd, float theta) {
    int half = hd / 2, C = nh * hd;
    if (B * T <= 0 || nh <= 0 || half <= 0) return;
    int th = half >= 256 ? half : 256 / half * half;
    size_t sm = (size_t)C * sizeof(float);
    cuda_smem_allow((const void *)rope_bwd_hid_k, sm);
    rope_bwd_hid_k<<<B * T, th, sm>>>(dx, rope_tab(T, hd, theta), T, nh, hd);
    KCHECK("rope_bwd_hid (bf16)");
}

// RopeYarn's frequency of pair j of hd (ops.h), in double as the cpu's yarn_freq.
__device__ __forceinline__ double yarn_freq(RopeYarn r, int j, int hd) {
    double f = pow((double)r.theta, -2.0 * j / hd);
    if (!(r.factor > 1)) return f;
    double hi = r.high == r.low ? r.low + 0.001 : r.high, ramp = (j - r.low) / (hi - r.low);
    double e = 1.0 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
    return f / r.factor * (1.0 - e) + f * e;
}
// One thread per (row bt, pair j), looping over the heads (rope_k's order of operations).
__global__ void rope_yarn_k(float *x, int BT, int T, int nh, int hd, int ld, RopeYarn r, int dir, int t0) {
    int half = hd / 2;
    size_t n = (size_t)BT * half;
    float sc = r.scale;
    GRID_STRIDE(e, n) {
        int bt = (int)(e / half), j = (int)(e % half), pos = t0 + bt % T;
        double ang = pos * yarn_freq(r, j, hd);
        float c = (float)cos(ang), s = (float)(dir * sin(ang));
        for (int h = 0; h < nh; h++) {
            float *p = x + ((size_t)bt * nh + h) * ld;
            float *p1 = p + (r.interleave ? 2 * j : j), *p2 = p + (r.interleave ? 2 * j + 1 : j + half);
            float x1 = *p1, x2 = *p2, y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
            *p1 = sc == 1.0f ? y1 : sc * y1;
            *p2 = sc == 1.0f ? y2 : sc * y2;
        }
    }
}
extern "C" void cuda_rope_yarn(float *x, int B, int t0, int t1, int nh, int hd, int ld, RopeYarn r,
                               int adjoint) {
    size_t n = (size_t)B * (t1 - t0) * (hd / 2);
    if (!n || nh <= 0) return;
    rope_yarn_k<<<ew_grid(n, 256), 256>>>(x, B * (t1 - t0), t1 - t0, nh, hd, ld, r, adjoint ? -1 : 1, t0);
    KCHECK("rope_yarn");
}

__device__ __forceinline__ float ld_any(const float *p) { return *p; }
__device__ __forceinline__ float ld_any(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
// One thread per (i, c), the j in order (ops.h copy_strided).
template <typename TD, typename TS>
__global__ void copy_strided_k(TD *dst, const TS *src, Stride3 s, float alpha, int acc) {
    size_t n = (size_t)s.n0 * s.cols;
    GRID_STRIDE(e, n) {
        int64_t i = (int64_t)(e / s.cols), c = (int64_t)(e % s.cols);
        for (int j = 0; j < s.n1; j++) {
            float v = ld_any(src + i * s.s0 + j * s.s1 + c);
            if (alpha != 1.0f) v = alpha * v;
            TD *d = dst + i * s.d0 + j * s.d1 + c;
            if (acc) v = ld_any(d) + v;
            store1(d, v);
        }
    }
}
template <typename TD, typename TS>
static void copy_strided_launch(void *dst, const void *src, Stride3 s, float alpha, int acc) {
    size_t n = (size_t)s.n0 * s.cols;
    if (!n || s.n1 <= 0) return;
    copy_strided_k<TD, TS><<<ew_grid(n, 256), 256>>>((TD *)dst, (const TS *)src, s, alpha, acc);
    KCHECK("copy_strided");
}
// bf16: the hidden format is bf16 ("cuda"), else float32 ("cuda-fp32").
extern "C" void cuda_copy_strided(void *dst, int dst_hid, const void *src, int src_hid, Stride3 s,
                                  float alpha, int acc, int bf16) {
    int dh = bf16 && dst_hid, sh = bf16 && src_hid;
    if (acc && dh) DIE("copy_strided: accumulating into a bf16 buffer");
    if (dh && sh) copy_strided_launch<__nv_bfloat16, __nv_bfloat16>(dst, src, s, alpha, acc);
    else if (dh) copy_strided_launch<__nv_bfloat16, float>(dst, src, s, alpha, acc);
    else if (sh) copy_strided_launch<float, __nv_bfloat16>(dst, src, s, alpha, acc);
    else copy_strided_launch<float, float>(dst, src, s, alpha, acc);
}
