// cuda_attention.cu — causal grouped-query attention, forward and backward, float32, without
// materialising the T x T scores: flash-attention style tiles of ATT_KT keys (or queries) staged
// in shared memory, one warp per query row (forward, dq) or key row (dk/dv), online softmax in
// the forward, the saved log-sum-exp in the backward. Each lane owns head dimensions
// lane, lane+32, ... (hd <= 32 * ATT_MAXR); in a tile, lane j scores key (or query) j of the tile.
// Deterministic: every output element is written by one warp, summing in a fixed order.
// Layouts (as ops.h): q/out (B*T, H, hd), k/v (B*T, KV, hd), lse (B, H, T). A call covers the
// query rows [t0, t1) of each sequence (ops.h): the grids span those rows (and, for dk/dv, the keys
// 0..t1-1); a row's tiles start at key 0 as over [0, T), so the forward's rows are the same bits.
// Backend "cuda" runs cuda_attention_tc.cu (tensor cores) and falls back to these kernels for
// head dims it does not take; "cuda-fp32" always runs these. Dropout on the probabilities
// (attention_drop_fwd/bwd) runs here for "cuda-fp32" and for "cuda" where its tensor cores do not.
// Must not hold: any knowledge of the model.
#include <cuda_bf16.h>
#include <math.h>
#include "ops/cuda/cuda_common.h"

#define ATT_WARPS 8 // query (forward, dq) or key (dk/dv) rows per block
#define ATT_KT 32 // keys (or queries) per shared-memory tile: one per lane
#define ATT_MAXR 8 // head dims per lane: hd <= 256

// Dropout on the probabilities (attention_drop_fwd/bwd, ops.h): thr 0 = none (the kernels' plain
// path); else key u of query row t of sequence b, head h is kept iff dropout_keep(head seed of global
// head h0 + h, row0 + b*T + t, u, thr), and kept probabilities are scaled by sc.
typedef struct {
    uint32_t thr;
    float sc;
    uint64_t seed;
    int64_t row0;
    int h0;
} AttDrop;
__device__ __forceinline__ float att_drop_z(const AttDrop &dr, int b, int T, int t, int h, int u) {
    uint64_t hs = dropout_hash(dr.seed, -1 - (int64_t)(dr.h0 + h), 0);
    return dropout_keep(hs, dr.row0 + (int64_t)b * T + t, u, dr.thr) ? dr.sc : 0.0f;
}

// The forward's and dq's key tile: keys u0 .. min(u0 + ATT_KT - 1, tmax) of kv head kh in sequence b,
// their k and v rows into Ks, Vs [ATT_KT][hd+1] (padded rows), the block's threads striding over
// the tile's elements. The caller synchronises before (the previous tile is used up) and after.
__device__ __forceinline__ void load_kv_tile(float *Ks, float *Vs, const float *k, const float *v, int b,
                                             int T, int KV, int kh, int hd, int u0, int tmax) {
    int ld = hd + 1, nk = tmax + 1 - u0 < ATT_KT ? tmax + 1 - u0 : ATT_KT;
    for (int e = threadIdx.x; e < nk * hd; e += blockDim.x) {
        int j = e / hd, i = e % hd;
        size_t gi = (((size_t)b * T + u0 + j) * KV + kh) * hd + i;
        Ks[j * ld + i] = ld_f(k + gi);
        Vs[j * ld + i] = ld_f(v + gi);
    }
}

// acc (this lane's head dims lane, lane+32, ...) += x_j * row j of S (rows of ld floats) for the
// tile's rows j = 0..jn-1 in order, x_j being lane j's x: the forward's P V and dq's dS K.
__device__ __forceinline__ void tile_rows_axpy(float *acc, float x, const float *S, int ld, int jn, int lane,
                                               int hd) {
    for (int j = 0; j < jn; j++) {
        float xj = __shfl_sync(0xffffffffu, x, j);
        const float *sr = S + j * ld;
#pragma unroll
        for (int r = 0; r < ATT_MAXR; r++) {
            int i = lane + 32 * r;
            if (i < hd) acc[r] += xj * sr[i];
        }
    }
}

// Forward. Grid (ceil(T/ATT_WARPS), H, B). Shared: Ks, Vs [ATT_KT][hd+1] (padded: lane j reads
// row j without bank conflicts), Qs [ATT_WARPS][hd].
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attention_fwd_k(float *out, float *lse, const float *q, const float *k, const float *v, int T, int H,
                    int KV, int hd, float sc, int t0, int t1, AttDrop dr) {
    extern __shared__ float sm[];
    int ld = hd + 1;
    float *Ks = sm, *Vs = Ks + ATT_KT * ld, *Qs = Vs + ATT_KT * ld;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int b = blockIdx.z, h = blockIdx.y, kh = h / (H / KV);
    int tb = t0 + blockIdx.x * ATT_WARPS, t = tb + w;
    int tmax = tb + ATT_WARPS - 1 < t1 - 1 ? tb + ATT_WARPS - 1 : t1 - 1;
    const float *qt = q + (((size_t)b * T + t) * H + h) * hd;
    if (t < t1)
        for (int i = lane; i < hd; i += 32) Qs[w * hd + i] = ld_f(qt + i);
    float m = -INFINITY, l = 0.0f, o[ATT_MAXR];
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) o[r] = 0.0f;
    for (int u0 = 0; u0 <= tmax; u0 += ATT_KT) {
        __syncthreads(); // previous tile fully used (and Qs written, on the first pass)
        load_kv_tile(Ks, Vs, k, v, b, T, KV, kh, hd, u0, tmax);
        __syncthreads();
        if (t >= t1 || u0 > t) continue; // warp-uniform
        int u = u0 + lane;
        float s = -INFINITY;
        if (u <= t) {
            float a = 0.0f;
            const float *kr = Ks + lane * ld, *qr = Qs + w * hd;
            for (int i = 0; i < hd; i++) a += qr[i] * kr[i];
            s = a * sc;
        }
        float mn = fmaxf(m, warp_max_f(s)); // finite: key u0 <= t is in this tile
        float p = u <= t ? expf(s - mn) : 0.0f;
        float corr = expf(m - mn); // 0 on the first tile (m = -inf)
        l = l * corr + warp_sum_f(p);
        int jn = t - u0 + 1 < ATT_KT ? t - u0 + 1 : ATT_KT;
#pragma unroll
        for (int r = 0; r < ATT_MAXR; r++) o[r] *= corr;
        // with dropout: the normaliser l sums every p, the output only the kept ones (scaled)
        float pv = dr.thr && u <= t ? p * att_drop_z(dr, b, T, t, h, u) : p;
        tile_rows_axpy(o, pv, Vs, ld, jn, lane, hd);
        m = mn;
    }
    if (t >= t1) return;
    float inv = 1.0f / l;
    float *ot = out + (((size_t)b * T + t) * H + h) * hd;
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) {
        int i = lane + 32 * r;
        if (i < hd) st_f(ot + i, o[r] * inv);
    }
    if (lane == 0) lse[((size_t)b * H + h) * T + t] = m + logf(l);
}

// D[b,h,t] = <dout, out> of each query row: one warp per row. gout: dout rounded to bf16 first (and
// stored there, the tensor-core backward's operand: one pass over dout for both), so that
// D = sum_u p_u dp_u holds to float32 rounding where dp = dout . v comes from the rounded dout, and
// ds = p (dp - D) does not turn dout's rounding error into a gradient (it would where dp ~ D, e.g. the
// first query row, whose gradient is exactly 0). NULL: dout as it is.
__device__ __forceinline__ float ld_out(const float *p) { return ld_f(p); }
__device__ __forceinline__ float ld_out(const __nv_bfloat16 *p) { return __bfloat162float(*p); }
template <typename TO>
__global__ void attention_rowdot_k(float *D, __nv_bfloat16 *gout, const float *dout, const TO *out, int B,
                                   int T, int H, int hd, int t0, int t1) {
    size_t cr = (size_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); // (b*(t1-t0) + t-t0)*H + h
    int lane = threadIdx.x & 31, Tc = t1 - t0;
    if (cr >= (size_t)B * Tc * H) return;
    size_t bc = cr / H, row = (((bc / Tc) * T + t0 + bc % Tc)) * H + cr % H; // (b*T + t)*H + h
    const float *g = dout + row * hd;
    const TO *o = out + row * hd;
    float s = 0.0f;
    for (int i0 = lane; i0 < hd; i0 += 128) { // elements lane, lane + 32, ... in order; 4 loads in flight
        float gv[4], ov[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = i0 + 32 * u;
            gv[u] = i < hd ? ld_f(g + i) : 0.0f;
            ov[u] = i < hd ? ld_out(o + i) : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            int i = i0 + 32 * u;
            if (i >= hd) break;
            float gi = gv[u];
            if (gout) {
                __nv_bfloat16 r = __float2bfloat16_rn(gi);
                gout[row * hd + i] = r;
                gi = __bfloat162float(r);
            }
            s += gi * ov[u];
        }
    }
    s = warp_sum_f(s);
    int h = (int)(row % H);
    size_t bt = row / H;
    int b = (int)(bt / T), t = (int)(bt % T);
    if (lane == 0) D[((size_t)b * H + h) * T + t] = s;
}

// dq: as the forward, one warp per query row, over key tiles. ds = p (dp - D) sc,
// p = exp(q.k sc - lse), dp = dout.v; dq += sum_u ds k_u.
// Shared: Ks, Vs [ATT_KT][hd+1], Qs, Gs [ATT_WARPS][hd] (q and dout rows).
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attention_bwd_dq_k(float *dq, const float *dout, const float *lse, const float *Dg, const float *q,
                       const float *k, const float *v, int T, int H, int KV, int hd, float sc, int t0, int t1,
                       AttDrop dr) {
    extern __shared__ float sm[];
    int ld = hd + 1;
    float *Ks = sm, *Vs = Ks + ATT_KT * ld, *Qs = Vs + ATT_KT * ld, *Gs = Qs + ATT_WARPS * hd;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int b = blockIdx.z, h = blockIdx.y, kh = h / (H / KV);
    int tb = t0 + blockIdx.x * ATT_WARPS, t = tb + w;
    int tmax = tb + ATT_WARPS - 1 < t1 - 1 ? tb + ATT_WARPS - 1 : t1 - 1;
    size_t qi = (((size_t)b * T + t) * H + h) * hd;
    float L = 0.0f, Dt = 0.0f;
    if (t < t1) {
        for (int i = lane; i < hd; i += 32) {
            Qs[w * hd + i] = ld_f(q + qi + i);
            Gs[w * hd + i] = ld_f(dout + qi + i);
        }
        L = lse[((size_t)b * H + h) * T + t];
        Dt = Dg[((size_t)b * H + h) * T + t];
    }
    float acc[ATT_MAXR];
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) acc[r] = 0.0f;
    for (int u0 = 0; u0 <= tmax; u0 += ATT_KT) {
        __syncthreads();
        load_kv_tile(Ks, Vs, k, v, b, T, KV, kh, hd, u0, tmax);
        __syncthreads();
        if (t >= t1 || u0 > t) continue;
        int u = u0 + lane;
        float ds = 0.0f;
        if (u <= t) {
            float a = 0.0f, dp = 0.0f;
            const float *kr = Ks + lane * ld, *vr = Vs + lane * ld, *qr = Qs + w * hd, *gr = Gs + w * hd;
            for (int i = 0; i < hd; i++) {
                a += qr[i] * kr[i];
                dp += gr[i] * vr[i];
            }
            float p = expf(a * sc - L);
            if (dr.thr) dp *= att_drop_z(dr, b, T, t, h, u);
            ds = p * (dp - Dt) * sc;
        }
        int jn = t - u0 + 1 < ATT_KT ? t - u0 + 1 : ATT_KT;
        tile_rows_axpy(acc, ds, Ks, ld, jn, lane, hd);
    }
    if (t >= t1) return;
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) {
        int i = lane + 32 * r;
        if (i < hd) st_f(dq + qi + i, ld_f(dq + qi + i) + acc[r]);
    }
}

// dk, dv: one warp per key row u < t1 of kv head kh, over the query heads of its group and tiles of
// query rows t >= max(u, t0), t < t1. dv_u += sum p dout_t; dk_u += sum ds q_t.
// Grid (ceil(t1/ATT_WARPS), KV, B). Shared: Qs, Gs [ATT_KT][hd+1], Ls, Ds [ATT_KT],
// Kb, Vb [ATT_WARPS][hd].
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attention_bwd_dkdv_k(float *dk, float *dv, const float *dout, const float *lse, const float *Dg,
                         const float *q, const float *k, const float *v, int T, int H, int KV, int hd,
                         float sc, int qa, int qb, AttDrop dr) {
    extern __shared__ float sm[];
    int ld = hd + 1;
    float *Qs = sm, *Gs = Qs + ATT_KT * ld, *Ls = Gs + ATT_KT * ld, *Ds = Ls + ATT_KT, *Kb = Ds + ATT_KT,
          *Vb = Kb + ATT_WARPS * hd;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int b = blockIdx.z, kh = blockIdx.y, rep = H / KV;
    int ub = blockIdx.x * ATT_WARPS, u = ub + w;
    size_t ki = (((size_t)b * T + u) * KV + kh) * hd;
    if (u < qb)
        for (int i = lane; i < hd; i += 32) {
            Kb[w * hd + i] = ld_f(k + ki + i);
            Vb[w * hd + i] = ld_f(v + ki + i);
        }
    float dka[ATT_MAXR], dva[ATT_MAXR];
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) dka[r] = dva[r] = 0.0f;
    for (int h = kh * rep; h < (kh + 1) * rep; h++)
        for (int t0 = ub > qa ? ub : qa; t0 < qb; t0 += ATT_KT) {
            __syncthreads();
            int nq = qb - t0 < ATT_KT ? qb - t0 : ATT_KT;
            for (int e = threadIdx.x; e < nq * hd; e += blockDim.x) {
                int j = e / hd, i = e % hd;
                size_t gi = (((size_t)b * T + t0 + j) * H + h) * hd + i;
                Qs[j * ld + i] = ld_f(q + gi);
                Gs[j * ld + i] = ld_f(dout + gi);
            }
            for (int j = threadIdx.x; j < nq; j += blockDim.x) {
                Ls[j] = lse[((size_t)b * H + h) * T + t0 + j];
                Ds[j] = Dg[((size_t)b * H + h) * T + t0 + j];
            }
            __syncthreads();
            if (u >= qb || t0 + nq - 1 < u) continue; // warp-uniform: no query of this tile sees key u
            int t = t0 + lane;
            float p = 0.0f, ds = 0.0f;
            if (lane < nq && t >= u) {
                float a = 0.0f, dp = 0.0f;
                const float *qr = Qs + lane * ld, *gr = Gs + lane * ld, *kr = Kb + w * hd, *vr = Vb + w * hd;
                for (int i = 0; i < hd; i++) {
                    a += qr[i] * kr[i];
                    dp += gr[i] * vr[i];
                }
                p = expf(a * sc - Ls[lane]);
                if (dr.thr) { // dv takes the kept probabilities, ds the masked dp
                    float z = att_drop_z(dr, b, T, t, h, u);
                    dp *= z;
                    ds = p * (dp - Ds[lane]) * sc;
                    p *= z;
                } else {
                    ds = p * (dp - Ds[lane]) * sc;
                }
            }
            int j0 = u - t0 > 0 ? u - t0 : 0; // queries before u contribute 0
            for (int j = j0; j < nq; j++) {
                float pj = __shfl_sync(0xffffffffu, p, j), dsj = __shfl_sync(0xffffffffu, ds, j);
                const float *qr = Qs + j * ld, *gr = Gs + j * ld;
#pragma unroll
                for (int r = 0; r < ATT_MAXR; r++) {
                    int i = lane + 32 * r;
                    if (i < hd) {
                        dva[r] += pj * gr[i];
                        dka[r] += dsj * qr[i];
                    }
                }
            }
        }
    if (u >= qb) return;
#pragma unroll
    for (int r = 0; r < ATT_MAXR; r++) {
        int i = lane + 32 * r;
        if (i < hd) {
            st_f(dk + ki + i, ld_f(dk + ki + i) + dka[r]);
            st_f(dv + ki + i, ld_f(dv + ki + i) + dva[r]);
        }
    }
}

static void att_check(int B, int T, int H, int KV, int hd, int t0, int t1) {
    if (t0 < 0 || t1 > T || t0 >= t1) DIE("cuda attention: query rows [%d, %d) outside [0, %d)", t0, t1, T);
    if (hd > 32 * ATT_MAXR)
        DIE("cuda attention: head_dim %d > %d is not supported by this kernel yet", hd, 32 * ATT_MAXR);
    if (KV <= 0 || H % KV) DIE("cuda attention: n_heads %d is not a multiple of n_kv_heads %d", H, KV);
    if (H > 65535 || B > 65535) DIE("cuda attention: %d heads x batch %d exceeds the launch grid", H, B);
}

// Opt in to more than 48 KiB of dynamic shared memory where a large head_dim needs it.
static void att_smem(const void *fn, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

extern "C" void cuda_attention_rowdot(float *D, void *gout, const float *dout, const void *out, int out_bf16,
                                      int B, int T, int H, int hd, int t0, int t1) {
    size_t rows = (size_t)B * (t1 - t0) * H;
    __nv_bfloat16 *g = (__nv_bfloat16 *)gout;
    if (out_bf16)
        attention_rowdot_k<<<cdiv_u(rows, 8), 256>>>(D, g, dout, (const __nv_bfloat16 *)out, B, T, H, hd, t0,
                                                     t1);
    else attention_rowdot_k<<<cdiv_u(rows, 8), 256>>>(D, g, dout, (const float *)out, B, T, H, hd, t0, t1);
    KCHECK("attention_bwd (rowdot)");
}

static void att_fwd(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                    int H, int KV, int hd, int t0, int t1, AttDrop dr) {
    if (B <= 0 || T <= 0 || H <= 0) return;
    att_check(B, T, H, KV, hd, t0, t1);
    size_t smem = sizeof(float) * ((size_t)2 * ATT_KT * (hd + 1) + (size_t)ATT_WARPS * hd);
    att_smem((const void *)attention_fwd_k, smem);
    dim3 grid(cdiv_u(t1 - t0, ATT_WARPS), H, B);
    attention_fwd_k<<<grid, ATT_WARPS * 32, smem>>>(out, lse, q, k, v, T, H, KV, hd, 1.0f / sqrtf((float)hd),
                                                    t0, t1, dr);
    KCHECK("attention_fwd");
}

static AttDrop att_drop(float p, uint64_t seed, int64_t row0, int h0) {
    AttDrop dr = {p > 0 ? dropout_threshold(p) : 0u, p > 0 ? 1.0f / (1.0f - p) : 1.0f, seed, row0, h0};
    return dr;
}

#define FP(x) ((const float *)(x))
extern "C" void cuda_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                                   int T, int H, int KV, int hd, int t0, int t1) {
    att_fwd((float *)out, lse, FP(q), FP(k), FP(v), B, T, H, KV, hd, t0, t1, att_drop(0, 0, 0, 0));
}

extern "C" void cuda_attention_drop_fwd(void *out, float *lse, const void *q, const void *k, const void *v,
                                        int B, int T, int H, int KV, int hd, int t0, int t1, float p,
                                        uint64_t seed, int64_t row0, int h0) {
    att_fwd((float *)out, lse, FP(q), FP(k), FP(v), B, T, H, KV, hd, t0, t1, att_drop(p, seed, row0, h0));
}

extern "C" void cuda_attention_zero_rows(float *dq, float *dk, float *dv, int B, int T, int H, int KV, int hd,
                                         int t0, int t1, int flags) {
    size_t qrow = sizeof(float) * H * hd, krow = sizeof(float) * KV * hd;
    if (!(flags & ATT_ADD_DQ)) // rows [t0, t1) of each sequence
        CUDA_CHECK(cudaMemset2D((char *)dq + t0 * qrow, T * qrow, 0, (t1 - t0) * qrow, B));
    if (!(flags & ATT_ADD_DKV)) { // rows [0, t1)
        CUDA_CHECK(cudaMemset2D(dk, T * krow, 0, t1 * krow, B));
        CUDA_CHECK(cudaMemset2D(dv, T * krow, 0, t1 * krow, B));
    }
}

static void att_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                    const float *q, const float *k, const float *v, int B, int T, int H, int KV, int hd,
                    int t0, int t1, AttDrop dr, int flags) {
    if (B <= 0 || T <= 0 || H <= 0) return;
    att_check(B, T, H, KV, hd, t0, t1);
    cuda_attention_zero_rows(dq, dk, dv, B, T, H, KV, hd, t0, t1, flags); // (these kernels add)
    float sc = 1.0f / sqrtf((float)hd);
    size_t rows = (size_t)B * T * H;
    float *D = (float *)cuda_workspace(rows * sizeof(float));
    cuda_attention_rowdot(D, NULL, dout, out, 0, B, T, H, hd, t0, t1);
    size_t smem_q = sizeof(float) * ((size_t)2 * ATT_KT * (hd + 1) + (size_t)2 * ATT_WARPS * hd);
    att_smem((const void *)attention_bwd_dq_k, smem_q);
    dim3 gq(cdiv_u(t1 - t0, ATT_WARPS), H, B);
    attention_bwd_dq_k<<<gq, ATT_WARPS * 32, smem_q>>>(dq, dout, lse, D, q, k, v, T, H, KV, hd, sc, t0, t1,
                                                       dr);
    KCHECK("attention_bwd (dq)");
    size_t smem_kv =
        sizeof(float) * ((size_t)2 * ATT_KT * (hd + 1) + 2 * ATT_KT + (size_t)2 * ATT_WARPS * hd);
    att_smem((const void *)attention_bwd_dkdv_k, smem_kv);
    dim3 gk(cdiv_u(t1, ATT_WARPS), KV, B);
    attention_bwd_dkdv_k<<<gk, ATT_WARPS * 32, smem_kv>>>(dk, dv, dout, lse, D, q, k, v, T, H, KV, hd, sc, t0,
                                                          t1, dr);
    KCHECK("attention_bwd (dkdv)");
}

extern "C" void cuda_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out,
                                   const float *lse, const void *q, const void *k, const void *v, int B,
                                   int T, int H, int KV, int hd, int t0, int t1, int flags) {
    att_bwd(dq, dk, dv, dout, FP(out), lse, FP(q), FP(k), FP(v), B, T, H, KV, hd, t0, t1,
            att_drop(0, 0, 0, 0), flags);
}

extern "C" void cuda_attention_drop_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out,
                                        const float *lse, const void *q, const void *k, const void *v, int B,
                                        int T, int H, int KV, int hd, int t0, int t1, float p, uint64_t seed,
                                        int64_t row0, int h0, int flags) {
    att_bwd(dq, dk, dv, dout, FP(out), lse, FP(q), FP(k), FP(v), B, T, H, KV, hd, t0, t1,
            att_drop(p, seed, row0, h0), flags);
}
