// cuda_attention_tc.cu — causal grouped-query attention on tensor cores, for backend "cuda":
// flash-attention style (never forms T x T), bf16 operands with fp32 accumulation through
// mma.sync.m16n8k16 (sm_80+; runs on the H200's tensor cores). q, k, v (and dout) are rounded to
// bf16 (round to nearest even) once per call into the workspace, and tiles are staged from there
// into shared memory with cp.async; scores, softmax, the log-sum-exp and every accumulator stay
// float32; P (forward) and dS (backward) are rounded to bf16 as the A operand of the second
// product, as in FlashAttention-2.
// Every call covers the query rows [t0, t1) of each sequence (ops.h; AMPipe's chunks).
// Kernels: forward (4 warps of 32 query rows for head dim 128: each K/V fragment feeds two row
// groups; 16 rows for the smaller head dims; 64-key tiles, online softmax in base 2); backward dq
// (per 64-query block over 32-key tiles) and dk/dv (per 64-key block over the query heads of its
// group and 32-query tiles), so that every output element is written by one thread summing in a
// fixed order: deterministic, no atomics. Every kernel loads the next tile (cp.async, two buffers)
// while it computes on the current one, and masks only the tiles that cross the diagonal or the
// last row. (Measured on the H200: 32 query rows per warp made the forward 15% faster and the dq
// kernel 3% slower, at 255 registers either way.) D = rowsum(bf16(dout) * out) comes from
// cuda_attention.cu (dout rounded as for dp, so that dp - D cancels where it should). Head dims
// 32, 64 and 128 take this path; any other falls back to the float32 kernels of
// cuda_attention.cu (same contract, ops.h).
// Dropout on the probabilities (attention_drop_fwd/bwd, ops.h) runs in the same kernels (their DROP
// instantiations; without dropout the others, unchanged): each thread hashes the (query row, key) pairs
// of its fragments with ops.h's dropout_keep, as the cpu does. Forward: the normaliser and the lse sum
// every p; the dropped p are zeroed before the P V product (the kept ones rounded to bf16 as without
// dropout) and the output is scaled by 1/(1-p) at the end. Backward: dS = P (Z dP - D), Z = 0 or
// 1/(1-p); dV takes the kept bf16 P and is scaled by 1/(1-p) at the end (FlashAttention-2's order).
// Fragment layouts (PTX ISA, mma.m16n8k16 .bf16): g = lane/4, t = lane%4; A rows g, g+8 and
// columns 2t..2t+1, 2t+8..2t+9; B column g, rows 2t..2t+1, 2t+8..2t+9; C rows g, g+8, columns
// 2t, 2t+1. Transposed B operands come from row-major tiles through ldmatrix .trans.
// Must not hold: any knowledge of the model.
#include <cuda_bf16.h>
#include <math.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_attention_softmax.cuh"

#define TC_THREADS 128 // 4 warps
#define TC_BM 64 // query rows per block (fwd, dq); keys per block (dk/dv): 16 per warp
#define TC_BN 64 // keys per tile (fwd)
#define TC_BK 32 // keys per tile (dq: fewer registers, 4 blocks per SM)
#define TC_BQ 32 // queries per tile (dk/dv)
#define TC_LOG2E 1.4426950408889634f

typedef unsigned short bf16s; // bf16 bits in shared memory

// The dropout of a DROP kernel: key u of query row t of sequence b, head h kept iff
// dropout_keep(head seed of global head h0 + h, row0 + b T + t, u, thr) (ops.h); sc = 1/(1-p).
struct TcDrop {
    uint64_t seed;
    int64_t row0;
    uint32_t thr;
    float sc;
    int h0;
};
__device__ __forceinline__ uint64_t tc_head_seed(const TcDrop &d, int h) {
    return dropout_hash(d.seed, -1 - (int64_t)(d.h0 + h), 0);
}
__device__ __forceinline__ bool tc_keep(const TcDrop &d, uint64_t hs, int b, int T, int row, int key) {
    return dropout_keep(hs, d.row0 + (int64_t)b * T + row, key, d.thr);
}

// c += A B (m16n8k16, bf16 in, fp32 accumulate)
__device__ __forceinline__ void mma_bf16(float *c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four 8x8 bf16 matrices from shared memory (ldmatrix .x4): lane i gives the address of one row of
// matrix i / 8; lane l then holds row l / 4, columns 2 (l % 4), +1 of each (r0..r3 in matrix order),
// the A and B fragment layouts. TRANS (ldsm_x4<true>: .trans) transposes each matrix: with lane i at
// row (i & 15) of a 16-row block, columns c0 + 8 * (i >> 4), r0, r1 are then the B fragment (k = rows)
// of columns c0..c0+7, and r2, r3 that of c0+8..c0+15.
#define LDSM_X4(TR) \
    asm volatile("ldmatrix.sync.aligned.m8n8.x4" TR ".shared.b16 {%0,%1,%2,%3}, [%4];\n" \
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) \
                 : "r"(a) \
                 : "memory")
template <bool TRANS = false>
__device__ __forceinline__ void ldsm_x4(uint32_t &r0, uint32_t &r1, uint32_t &r2, uint32_t &r3,
                                        const bf16s *p) {
    uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    if constexpr (TRANS) LDSM_X4(".trans");
    else LDSM_X4("");
}
#undef LDSM_X4

// Stage ROWS rows of a (T, heads, HD) bf16 tensor (g points at row 0 of one head; rows `stride`
// elements apart) into s[ROWS][HD + 8] with 16-byte cp.async copies; rows from nvalid on are
// zero-filled. Completes at stage_wait() (then __syncthreads before reading).
template <int HD, int ROWS>
__device__ __forceinline__ void stage(bf16s *s, const bf16s *g, int row0, int nvalid, size_t stride) {
    constexpr int LD = HD + 8, C8 = HD / 8;
    for (int e = threadIdx.x; e < ROWS * C8; e += TC_THREADS) {
        int r = e / C8, c = (e % C8) * 8;
        const bf16s *src = r < nvalid ? g + (size_t)(row0 + r) * stride + c : g;
        uint32_t dst = (uint32_t)__cvta_generic_to_shared(s + r * LD + c);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                     "r"(r < nvalid ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void stage_wait(void) { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// acc[r][NJ] (RG groups of 16 rows x 8 NJ columns) += A (RG x 16 rows of sa, x HD) * B^T where B
// is the row-major tile sb (NJ*8 rows x HD): the "scores" product of rows of two tiles along the
// head dimension. Fragments through ldmatrix: A's four 8x8 blocks (rows 0-7 / 8-15 x columns 0-7 /
// 8-15 of the k-step), B's as (columns j, k 0-7), (j, k 8-15), (j + 1, k 0-7), (j + 1, k 8-15),
// each B fragment used by the RG row groups. NJ is even.
template <int HD, int NJ, int RG>
__device__ __forceinline__ void rows_dot_rg(float (*acc)[NJ][4], const bf16s *sa, const bf16s *sb, int lane) {
    constexpr int LD = HD + 8;
    const bf16s *pa = sa + ((lane & 7) + ((lane >> 3) & 1) * 8) * LD + (lane >> 4) * 8;
    const bf16s *pb = sb + ((lane & 7) + (lane >> 4) * 8) * LD + ((lane >> 3) & 1) * 8;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t a[RG][4];
#pragma unroll
        for (int r = 0; r < RG; r++) ldsm_x4(a[r][0], a[r][1], a[r][2], a[r][3], pa + r * 16 * LD + kk * 16);
#pragma unroll
        for (int j = 0; j < NJ; j += 2) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4(b0, b1, b2, b3, pb + j * 8 * LD + kk * 16);
#pragma unroll
            for (int r = 0; r < RG; r++) {
                mma_bf16(acc[r][j], a[r][0], a[r][1], a[r][2], a[r][3], b0, b1);
                mma_bf16(acc[r][j + 1], a[r][0], a[r][1], a[r][2], a[r][3], b2, b3);
            }
        }
    }
}
template <int HD, int NJ>
__device__ __forceinline__ void rows_dot(float (*acc)[4], const bf16s *sa, const bf16s *sb, int lane) {
    rows_dot_rg<HD, NJ, 1>((float(*)[NJ][4])acc, sa, sb, lane);
}

// out[r][HD/8] (RG groups of 16 rows x HD) += P[r] (16 x NJ*8, C fragments, rounded to bf16 here)
// * the row-major tile sb (NJ*8 rows x HD).
template <int HD, int NJ, int RG>
__device__ __forceinline__ void p_times_rg(float (*out)[HD / 8][4], float (*p)[NJ][4], const bf16s *sb,
                                           int lane) {
    constexpr int LD = HD + 8;
#pragma unroll
    for (int kk = 0; kk < NJ / 2; kk++) {
        uint32_t a[RG][4];
#pragma unroll
        for (int r = 0; r < RG; r++) {
            a[r][0] = pack_bf16(p[r][2 * kk][0], p[r][2 * kk][1]);
            a[r][1] = pack_bf16(p[r][2 * kk][2], p[r][2 * kk][3]);
            a[r][2] = pack_bf16(p[r][2 * kk + 1][0], p[r][2 * kk + 1][1]);
            a[r][3] = pack_bf16(p[r][2 * kk + 1][2], p[r][2 * kk + 1][3]);
        }
#pragma unroll
        for (int n = 0; n < HD / 8; n += 2) {
            uint32_t b0, b1, b2, b3;
            ldsm_x4<true>(b0, b1, b2, b3, sb + (kk * 16 + (lane & 15)) * LD + n * 8 + (lane >> 4) * 8);
#pragma unroll
            for (int r = 0; r < RG; r++) {
                mma_bf16(out[r][n], a[r][0], a[r][1], a[r][2], a[r][3], b0, b1);
                mma_bf16(out[r][n + 1], a[r][0], a[r][1], a[r][2], a[r][3], b2, b3);
            }
        }
    }
}
template <int HD, int NJ>
__device__ __forceinline__ void p_times(float (*out)[4], float (*p)[4], const bf16s *sb, int lane) {
    p_times_rg<HD, NJ, 1>((float(*)[HD / 8][4]) out, (float(*)[NJ][4])p, sb, lane);
}

// The forward's dropout on a tile of P (after softmax_tile, which summed every p into l): the dropped p of
// row group r (rows wr + 16 r, + 8; keys k0 + column) zeroed.
template <int NJ, int RG>
__device__ __forceinline__ void drop_p(float (*s)[NJ][4], const TcDrop &dr, uint64_t hs, int b, int T, int wr,
                                       int k0, int t) {
#pragma unroll
    for (int r = 0; r < RG; r++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * t + (e & 1), row = wr + 16 * r + (e < 2 ? 0 : 8);
                if (!tc_keep(dr, hs, b, T, row, key)) s[r][j][e] = 0.0f;
            }
}

// Forward over the query rows [qa, qb) of each sequence (keys 0..qb-1: rows from qb on are never
// staged, they may be unconverted). Each warp holds RG groups of 16 query rows (so every K/V
// fragment it loads feeds RG products), a block 64 RG rows. Grid (ceil((qb-qa)/(64 RG)), H, B),
// the query blocks with the most keys first. A row's key tiles start at 0 whatever qa is: the same
// bits as over [0, T).
template <int HD, int RG, bool DROP>
__global__ void __launch_bounds__(TC_THREADS)
    att_tc_fwd_k(bf16s *out, float *lse, const bf16s *q, const bf16s *k, const bf16s *v, int T, int H, int KV,
                 float sl, int qa, int qb, TcDrop dr) {
    constexpr int LD = HD + 8, NT = HD / 8, NJ = TC_BN / 8, TILE = TC_BN * LD, BM = TC_BM * RG;
    extern __shared__ __align__(16) bf16s sm[];
    bf16s *Qs = sm, *Ks = Qs + BM * LD, *Vs = Ks + 2 * TILE; // K, V: two tiles each (double-buffered)
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    AttQBlock blk = att_qblock<HD, BM, TC_BN>(T, H, KV, qa, qb);
    int b = blk.b, h = blk.h, q0 = blk.q0, ntile = blk.ntile;
    const bf16s *qg = q + blk.qoff, *kg = k + blk.koff, *vg = v + blk.koff;
    stage<HD, BM>(Qs, qg, q0, min(BM, qb - q0), (size_t)H * HD);
    stage<HD, TC_BN>(Ks, kg, 0, min(TC_BN, qb), (size_t)KV * HD);
    stage<HD, TC_BN>(Vs, vg, 0, min(TC_BN, qb), (size_t)KV * HD);
    int wr = q0 + w * 16 * RG + g; // row group r of this warp: rows wr + 16 r and wr + 16 r + 8
    float o[RG][NT][4], m[RG][2], l[RG][2];
#pragma unroll
    for (int r = 0; r < RG; r++) {
        m[r][0] = m[r][1] = -INFINITY;
        l[r][0] = l[r][1] = 0.0f;
#pragma unroll
        for (int n = 0; n < NT; n++) o[r][n][0] = o[r][n][1] = o[r][n][2] = o[r][n][3] = 0.0f;
    }
    for (int it = 0; it < ntile; it++) {
        int k0 = it * TC_BN, cur = it & 1;
        stage_wait(); // tile it (and Qs, the first time)
        __syncthreads(); // ... visible to all; every warp is done with tile it - 1's buffers
        if (it + 1 < ntile) { // tile it + 1 loads while this one is used
            int k1 = k0 + TC_BN;
            stage<HD, TC_BN>(Ks + (cur ^ 1) * TILE, kg, k1, min(TC_BN, qb - k1), (size_t)KV * HD);
            stage<HD, TC_BN>(Vs + (cur ^ 1) * TILE, vg, k1, min(TC_BN, qb - k1), (size_t)KV * HD);
        }
        float s[RG][NJ][4];
#pragma unroll
        for (int r = 0; r < RG; r++)
#pragma unroll
            for (int j = 0; j < NJ; j++) s[r][j][0] = s[r][j][1] = s[r][j][2] = s[r][j][3] = 0.0f;
        rows_dot_rg<HD, NJ, RG>(s, Qs + w * 16 * RG * LD, Ks + cur * TILE, lane);
        int mask = k0 + TC_BN > q0 || k0 + TC_BN > qb; // the diagonal tiles or the last keys
#pragma unroll
        for (int r = 0; r < RG; r++)
            softmax_tile<NJ, NT>(&s[r][0][0], &o[r][0][0], m[r][0], m[r][1], l[r][0], l[r][1], mask, k0,
                                 wr + 16 * r, wr + 16 * r + 8, qb, t, sl);
        if constexpr (DROP) drop_p<NJ, RG>(s, dr, tc_head_seed(dr, h), b, T, wr, k0, t);
        p_times_rg<HD, NJ, RG>(o, s, Vs + cur * TILE, lane);
    }
#pragma unroll
    for (int r = 0; r < RG; r++) {
        if constexpr (DROP) // the kept p's scale (l summed every p)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) o[r][n][e] *= dr.sc;
        softmax_store<NT>(out, lse, &o[r][0][0], m[r][0], m[r][1], l[r][0], l[r][1], wr + 16 * r,
                          wr + 16 * r + 8, qb, b, T, H, h, t);
    }
}

// dq += sum over keys u <= t of ds_tu k_u, ds = p (dp - D) sc, p = exp2(s sl - lse log2e),
// dp = dout . v, for the query rows t in [qa, qb). Grid (ceil((qb-qa)/64), H, B).
template <int HD, bool DROP>
__global__ void __launch_bounds__(TC_THREADS, 3)
    att_tc_dq_k(float *dq, const bf16s *dout, const float *lse, const float *Dg, const bf16s *q,
                const bf16s *k, const bf16s *v, int T, int H, int KV, float sl, float sc, int qa, int qb,
                TcDrop dr) {
    constexpr int LD = HD + 8, NT = HD / 8, NJ = TC_BK / 8, TILE = TC_BK * LD;
    extern __shared__ __align__(16) bf16s sm[];
    bf16s *Qs = sm, *Gs = Qs + TC_BM * LD, *Ks = Gs + TC_BM * LD, *Vs = Ks + 2 * TILE; // K, V double-buffered
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    AttQBlock blk = att_qblock<HD, TC_BM, TC_BK>(T, H, KV, qa, qb);
    int b = blk.b, h = blk.h, q0 = blk.q0, ntile = blk.ntile;
    size_t qoff = blk.qoff;
    const bf16s *kg = k + blk.koff, *vg = v + blk.koff;
    stage<HD, TC_BM>(Qs, q + qoff, q0, min(TC_BM, qb - q0), (size_t)H * HD);
    stage<HD, TC_BM>(Gs, dout + qoff, q0, min(TC_BM, qb - q0), (size_t)H * HD);
    stage<HD, TC_BK>(Ks, kg, 0, min(TC_BK, qb), (size_t)KV * HD);
    stage<HD, TC_BK>(Vs, vg, 0, min(TC_BK, qb), (size_t)KV * HD);
    int r0 = q0 + w * 16 + g, r1 = r0 + 8;
    size_t lrow = ((size_t)b * H + h) * T;
    float L0 = r0 < qb ? lse[lrow + r0] * TC_LOG2E : 0.0f, L1 = r1 < qb ? lse[lrow + r1] * TC_LOG2E : 0.0f;
    float D0 = r0 < qb ? Dg[lrow + r0] : 0.0f, D1 = r1 < qb ? Dg[lrow + r1] : 0.0f;
    uint64_t hs = DROP ? tc_head_seed(dr, h) : 0;
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    for (int it = 0; it < ntile; it++) {
        int k0 = it * TC_BK, cur = it & 1;
        stage_wait();
        __syncthreads();
        if (it + 1 < ntile) {
            int k1 = k0 + TC_BK;
            stage<HD, TC_BK>(Ks + (cur ^ 1) * TILE, kg, k1, min(TC_BK, qb - k1), (size_t)KV * HD);
            stage<HD, TC_BK>(Vs + (cur ^ 1) * TILE, vg, k1, min(TC_BK, qb - k1), (size_t)KV * HD);
        }
        const bf16s *Kc = Ks + cur * TILE;
        float s[NJ][4], dp[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
        rows_dot<HD, NJ>(s, Qs + w * 16 * LD, Kc, lane);
        rows_dot<HD, NJ>(dp, Gs + w * 16 * LD, Vs + cur * TILE, lane);
        int mask = k0 + TC_BK > q0 || k0 + TC_BK > qb; // the diagonal or the last keys
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * t + (e & 1), row = e < 2 ? r0 : r1;
                float p = !mask || (key <= row && key < qb) ? exp2f(s[j][e] * sl - (e < 2 ? L0 : L1)) : 0.0f;
                float d = dp[j][e];
                if constexpr (DROP) d = tc_keep(dr, hs, b, T, row, key) ? d * dr.sc : 0.0f; // Z dP
                s[j][e] = p * (d - (e < 2 ? D0 : D1)) * sc;
            }
        p_times<HD, NJ>(acc, s, Kc, lane);
    }
    add_rows<NT>(dq + qoff, &acc[0][0], r0, qb, (size_t)H * HD, t);
}

// The dk/dv kernel's query tiles: for each query head h0, h0 + 1, ... of the group in order, the
// rows [tstart, qb) in steps of TC_BQ (per tiles a head); dkdv_load stages tile i's Q and dout
// (cp.async) and its lse (times log2 e) and D (plain stores) into buffer buf.
struct DkdvTiles {
    const bf16s *q, *dout;
    const float *lse, *Dg;
    bf16s *Qs, *Gs;
    float *Ls, *Ds;
    int T, H, h0, b, tstart, per, qb;
};
template <int HD> __device__ __forceinline__ void dkdv_load(const DkdvTiles *d, int i, int buf) {
    constexpr int TILE = TC_BQ * (HD + 8);
    int h = d->h0 + i / d->per, t0 = d->tstart + (i % d->per) * TC_BQ, nq = min(TC_BQ, d->qb - t0);
    size_t qoff = ((size_t)d->b * d->T * d->H + h) * HD, lrow = ((size_t)d->b * d->H + h) * d->T;
    stage<HD, TC_BQ>(d->Qs + buf * TILE, d->q + qoff, t0, nq, (size_t)d->H * HD);
    stage<HD, TC_BQ>(d->Gs + buf * TILE, d->dout + qoff, t0, nq, (size_t)d->H * HD);
    for (int j = threadIdx.x; j < TC_BQ; j += TC_THREADS) {
        d->Ls[buf * TC_BQ + j] = j < nq ? d->lse[lrow + t0 + j] * TC_LOG2E : 0.0f;
        d->Ds[buf * TC_BQ + j] = j < nq ? d->Dg[lrow + t0 + j] : 0.0f;
    }
}

// dv_u += sum p_tu dout_t, dk_u += sum ds_tu q_t over the query heads of kv head kh and the
// queries t >= u, t in [qa, qb), for the keys u < qb. Grid (ceil(qb/64), KV, B).
template <int HD, bool DROP>
__global__ void __launch_bounds__(TC_THREADS)
    att_tc_dkdv_k(float *dk, float *dv, const bf16s *dout, const float *lse, const float *Dg, const bf16s *q,
                  const bf16s *k, const bf16s *v, int T, int H, int KV, float sl, float sc, int qa, int qb,
                  TcDrop dr) {
    constexpr int LD = HD + 8, NT = HD / 8, NJ = TC_BQ / 8, TILE = TC_BQ * LD;
    extern __shared__ __align__(16) bf16s sm[];
    // K, V of the block; Q, dout, lse, D of a query tile, double-buffered
    bf16s *Ks = sm, *Vs = Ks + TC_BM * LD, *Qs = Vs + TC_BM * LD, *Gs = Qs + 2 * TILE;
    float *Ls = (float *)(Gs + 2 * TILE), *Ds = Ls + 2 * TC_BQ;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    AttPlace pl = att_place(); // the keys from k0 (the most query tiles first)
    int b = pl.b, kh = pl.head, rep = H / KV;
    int k0 = pl.pos * TC_BM;
    size_t koff = ((size_t)b * T * KV + kh) * HD;
    stage<HD, TC_BM>(Ks, k + koff, k0, min(TC_BM, qb - k0), (size_t)KV * HD);
    stage<HD, TC_BM>(Vs, v + koff, k0, min(TC_BM, qb - k0), (size_t)KV * HD);
    int u0 = k0 + w * 16 + g, u1 = u0 + 8, wfirst = k0 + w * 16;
    float dka[NT][4], dva[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[n][e] = dva[n][e] = 0.0f;
    // the query tiles: for each query head of the group in order, [max(k0, qa), qb) in steps of TC_BQ
    int tstart = max(k0, qa), per = (qb - tstart + TC_BQ - 1) / TC_BQ, ntile = rep * per;
    DkdvTiles d = {q, dout, lse, Dg, Qs, Gs, Ls, Ds, T, H, kh * rep, b, tstart, per, qb};
    if (ntile > 0) dkdv_load<HD>(&d, 0, 0);
    for (int i = 0; i < ntile; i++) {
        int cur = i & 1, t0 = tstart + (i % per) * TC_BQ;
        stage_wait(); // tile i (and K, V, the first time)
        __syncthreads(); // ... and its lse, D visible to all; tile i - 1's buffers are used up
        if (i + 1 < ntile) dkdv_load<HD>(&d, i + 1, cur ^ 1);
        if (t0 + TC_BQ - 1 < wfirst) continue; // warp-uniform: every query precedes this warp's keys
        const bf16s *Qc = Qs + cur * TILE, *Gc = Gs + cur * TILE;
        const float *Lc = Ls + cur * TC_BQ, *Dc = Ds + cur * TC_BQ;
        float s[NJ][4], dp[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
        rows_dot<HD, NJ>(s, Ks + w * 16 * LD, Qc, lane); // s^T: keys x queries
        rows_dot<HD, NJ>(dp, Vs + w * 16 * LD, Gc, lane); // dp^T
        int mask = t0 < k0 + TC_BM || t0 + TC_BQ > qb; // the diagonal or the last queries
        uint64_t hs = DROP ? tc_head_seed(dr, d.h0 + i / per) : 0;
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = j * 8 + 2 * t + (e & 1), qt = t0 + c, key = e < 2 ? u0 : u1;
                float p = !mask || (qt >= key && qt < qb) ? exp2f(s[j][e] * sl - Lc[c]) : 0.0f;
                float zdp = dp[j][e];
                if constexpr (DROP) { // dV takes the kept p (scaled at the end), dS the masked dP
                    bool kp = tc_keep(dr, hs, b, T, qt, key);
                    zdp = kp ? zdp * dr.sc : 0.0f;
                    s[j][e] = kp ? p : 0.0f;
                } else {
                    s[j][e] = p;
                }
                dp[j][e] = p * (zdp - Dc[c]) * sc;
            }
        p_times<HD, NJ>(dva, s, Gc, lane);
        p_times<HD, NJ>(dka, dp, Qc, lane);
    }
    if constexpr (DROP)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) dva[n][e] *= dr.sc;
    add_rows<NT>(dk + koff, &dka[0][0], u0, qb, (size_t)KV * HD, t);
    add_rows<NT>(dv + koff, &dva[0][0], u0, qb, (size_t)KV * HD, t);
}

static size_t smem_fwd(int hd, int rg) { return sizeof(bf16s) * (size_t)(TC_BM * rg + 4 * TC_BN) * (hd + 8); }
static size_t smem_dq(int hd) { return sizeof(bf16s) * (size_t)(2 * TC_BM + 4 * TC_BK) * (hd + 8); }
static size_t smem_dkdv(int hd) {
    return sizeof(bf16s) * (size_t)(2 * TC_BM + 4 * TC_BQ) * (hd + 8) + sizeof(float) * 4 * TC_BQ;
}

static void smem_opt_in(const void *fn, size_t bytes) {
    if (bytes > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// The tensor-core path takes head dims 32, 64, 128 (its outputs are written as float2: the
// callers also check their 16-byte alignment).
static int tc_ok(int B, int hd, int KV, int H) {
    return (hd == 32 || hd == 64 || hd == 128) && KV > 0 && H % KV == 0 && H <= 65535 && B <= 65535;
}

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

// dst = bf16(src) for the rows [ta, tb) of each of B sequences of T rows of `width` floats (the
// rest of dst untouched): a chunk's queries, or the keys/values its queries read.
__global__ void f32_to_bf16_rows_k(bf16s *dst, const float *src, int T, int ta, int tb, int width, size_t n) {
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (size_t)gridDim.x * blockDim.x) {
        size_t per = (size_t)(tb - ta) * width, b = e / per, r = e % per;
        size_t gi = (b * T + ta) * width + r;
        __nv_bfloat16 h = __float2bfloat16_rn(src[gi]);
        dst[gi] = *(bf16s *)&h;
    }
}
static void to_bf16_rows(bf16s *dst, const float *src, int B, int T, int ta, int tb, int width) {
    size_t n = (size_t)B * (tb - ta) * width;
    if (!n) return;
    size_t blocks = cdiv_u(n, 256);
    f32_to_bf16_rows_k<<<(blocks < 4096 ? blocks : 4096), 256>>>(dst, src, T, ta, tb, width, n);
    KCHECK("attention (bf16 rows)");
}

// The workspace as float D[nd] (may be 0) then bf16 copies of `cnt` tensors of n[i] elements.
static void ws_carve(size_t nd, const size_t *n, int cnt, float **D, bf16s **p) {
    size_t total = al256(nd * sizeof(float));
    for (int i = 0; i < cnt; i++) total += al256(n[i] * sizeof(bf16s));
    char *w = (char *)cuda_workspace(total), *c = w + al256(nd * sizeof(float));
    if (D) *D = (float *)w;
    for (int i = 0; i < cnt; i++) {
        p[i] = (bf16s *)c;
        c += al256(n[i] * sizeof(bf16s));
    }
}

// Query rows per warp in the forward: 32 (two row groups) for head dim 128, where every K/V fragment
// feeding two products halves the shared-memory reads per product; 16 for the smaller head dims.
template <int HD, bool DROP>
static void fwd_launch(bf16s *out, float *lse, const bf16s *q, const bf16s *k, const bf16s *v, int B, int T,
                       int H, int KV, int t0, int t1, TcDrop dr) {
    constexpr int RG = HD == 128 ? 2 : 1;
    size_t sm = smem_fwd(HD, RG);
    smem_opt_in((const void *)att_tc_fwd_k<HD, RG, DROP>, sm);
    dim3 grid(cdiv_u(t1 - t0, TC_BM * RG), H, B);
    att_tc_fwd_k<HD, RG, DROP>
        <<<grid, TC_THREADS, sm>>>(out, lse, q, k, v, T, H, KV, TC_LOG2E / sqrtf((float)HD), t0, t1, dr);
    KCHECK("attention_fwd (tensor cores)");
}

template <int HD, bool DROP>
static void bwd_launch(float *dq, float *dk, float *dv, const bf16s *dout, const float *lse, const float *D,
                       const bf16s *q, const bf16s *k, const bf16s *v, int B, int T, int H, int KV, int t0,
                       int t1, TcDrop dr) {
    float sc = 1.0f / sqrtf((float)HD), sl = sc * TC_LOG2E;
    size_t s1 = smem_dq(HD), s2 = smem_dkdv(HD);
    smem_opt_in((const void *)att_tc_dq_k<HD, DROP>, s1);
    smem_opt_in((const void *)att_tc_dkdv_k<HD, DROP>, s2);
    dim3 gq(cdiv_u(t1 - t0, TC_BM), H, B), gk(cdiv_u(t1, TC_BM), KV, B);
    att_tc_dq_k<HD, DROP><<<gq, TC_THREADS, s1>>>(dq, dout, lse, D, q, k, v, T, H, KV, sl, sc, t0, t1, dr);
    KCHECK("attention_bwd (tensor cores, dq)");
    att_tc_dkdv_k<HD, DROP>
        <<<gk, TC_THREADS, s2>>>(dk, dv, dout, lse, D, q, k, v, T, H, KV, sl, sc, t0, t1, dr);
    KCHECK("attention_bwd (tensor cores, dk/dv)");
}

// The rows [ta, tb) of each sequence rounded to bf16 (the float32 kernels' output into the caller's bf16
// out). (The backward's dout is rounded into the workspace by the rowdot kernel; q, k, v come in bf16.)
static void to_bf16_range(bf16s *dst, const float *src, int B, int T, int ta, int tb, int width) {
    if (ta == 0 && tb == T) cuda_f32_to_bf16(dst, src, (size_t)B * T * width);
    else to_bf16_rows(dst, src, B, T, ta, tb, width);
}

static void range_check(int T, int t0, int t1) {
    if (t0 < 0 || t1 > T || t0 >= t1) DIE("cuda attention: query rows [%d, %d) outside [0, %d)", t0, t1, T);
}

// The float32 kernels' inputs where the tensor cores do not run (head dims but 32/64/128): q, k, v
// (and the backward's out) widened from bf16 into a buffer of their own (not the workspace: the float32
// backward takes its D there), and room for the forward's float32 out, rounded into the caller's after.
typedef struct {
    const float *q, *k, *v;
    float *out;
} Wide;
static Wide widen(const void *q, const void *k, const void *v, const void *out, int B, int T, int H, int KV,
                  int hd) {
    static float *buf;
    static size_t cap;
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd,
           need = (2 * nq + 2 * nk) * sizeof(float);
    if (need > cap) {
        if (buf) CUDA_CHECK(cudaFree(buf));
        CUDA_CHECK(cudaMalloc(&buf, need));
        cap = need;
    }
    cuda_bf16_to_f32(buf, q, nq);
    cuda_bf16_to_f32(buf + nq, k, nk);
    cuda_bf16_to_f32(buf + nq + nk, v, nk);
    if (out) cuda_bf16_to_f32(buf + nq + 2 * nk, out, nq);
    Wide w = {buf, buf + nq, buf + nq + nk, buf + nq + 2 * nk};
    return w;
}

// The tensor-core forward and backward (after the checks), with dropout (DROP) or without.
template <bool DROP>
static void tc_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T, int H,
                   int KV, int hd, int t0, int t1, TcDrop dr) {
    range_check(T, t0, t1);
    const bf16s *qb = (const bf16s *)q, *kb = (const bf16s *)k, *vb = (const bf16s *)v;
    bf16s *ob = (bf16s *)out;
    if (!DROP && cuda_attention_fwd_wg(ob, lse, qb, kb, vb, B, T, H, KV, hd, hd, t0, t1))
        return; // Hopper, hd 128
    if (hd == 32) fwd_launch<32, DROP>(ob, lse, qb, kb, vb, B, T, H, KV, t0, t1, dr);
    else if (hd == 64) fwd_launch<64, DROP>(ob, lse, qb, kb, vb, B, T, H, KV, t0, t1, dr);
    else fwd_launch<128, DROP>(ob, lse, qb, kb, vb, B, T, H, KV, t0, t1, dr);
}
template <bool DROP>
static void tc_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out, const float *lse,
                   const void *q, const void *k, const void *v, int B, int T, int H, int KV, int hd, int t0,
                   int t1, int flags, TcDrop dr) {
    range_check(T, t0, t1);
    // the workspace: D, dout in bf16, and the wgmma backward's dS (ops.h attention_ds_bytes; 0 where it does
    // not run)
    size_t nds = !DROP && cuda_attention_wg_runs(hd, hd)
        ? attention_ds_bytes(B, T, H, KV, hd, t0, t1) / sizeof(bf16s)
        : 0;
    size_t n[2] = {(size_t)B * T * H * hd, nds};
    float *D;
    bf16s *p[2];
    ws_carve((size_t)B * T * H, n, 2, &D, p);
    cuda_attention_rowdot(D, p[0], dout, out, 1, B, T, H, hd, t0, t1); // and dout's rows in bf16 into p[0]
    const bf16s *qb = (const bf16s *)q, *kb = (const bf16s *)k, *vb = (const bf16s *)v;
    if (!DROP &&
        cuda_attention_bwd_wg(dq, dk, dv, nds ? p[1] : NULL, nds * sizeof(bf16s), p[0], lse, D, qb, kb, vb, B,
                              T, H, KV, hd, hd, t0, t1, flags))
        return;
    cuda_attention_zero_rows(dq, dk, dv, B, T, H, KV, hd, t0, t1, flags); // (these kernels add)
    if (hd == 32) bwd_launch<32, DROP>(dq, dk, dv, p[0], lse, D, qb, kb, vb, B, T, H, KV, t0, t1, dr);
    else if (hd == 64) bwd_launch<64, DROP>(dq, dk, dv, p[0], lse, D, qb, kb, vb, B, T, H, KV, t0, t1, dr);
    else bwd_launch<128, DROP>(dq, dk, dv, p[0], lse, D, qb, kb, vb, B, T, H, KV, t0, t1, dr);
}

extern "C" void cuda_attention_fwd_tc(void *out, float *lse, const void *q, const void *k, const void *v,
                                      int B, int T, int H, int KV, int hd, int t0, int t1) {
    if (B <= 0 || T <= 0 || H <= 0) return;
    if (!tc_ok(B, hd, KV, H) || !aligned16(out)) {
        Wide w = widen(q, k, v, NULL, B, T, H, KV, hd);
        cuda_attention_fwd(w.out, lse, w.q, w.k, w.v, B, T, H, KV, hd, t0, t1);
        to_bf16_range((bf16s *)out, w.out, B, T, t0, t1, H * hd); // the rows it wrote
        return;
    }
    tc_fwd<false>(out, lse, q, k, v, B, T, H, KV, hd, t0, t1, TcDrop{});
}

extern "C" void cuda_attention_bwd_tc(float *dq, float *dk, float *dv, const float *dout, const void *out,
                                      const float *lse, const void *q, const void *k, const void *v, int B,
                                      int T, int H, int KV, int hd, int t0, int t1, int flags) {
    if (B <= 0 || T <= 0 || H <= 0) return;
    if (!tc_ok(B, hd, KV, H) || !aligned16(dq) || !aligned16(dk) || !aligned16(dv)) {
        Wide w = widen(q, k, v, out, B, T, H, KV, hd);
        cuda_attention_bwd(dq, dk, dv, dout, w.out, lse, w.q, w.k, w.v, B, T, H, KV, hd, t0, t1, flags);
        return;
    }
    tc_bwd<false>(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, t0, t1, flags, TcDrop{});
}

// With dropout on the probabilities: the tensor-core kernels' DROP instantiations (the wgmma kernels have
// none: head dim 128 takes the mma.sync ones here); the float32 kernels on q, k, v (out) widened where the
// tensor cores do not run; p = 0 is the call without dropout (ops.h: its bits).
static TcDrop tc_drop(float p, uint64_t seed, int64_t row0, int h0) {
    TcDrop d = {seed, row0, dropout_threshold(p), 1.0f / (1.0f - p), h0};
    return d;
}
extern "C" void cuda_attention_drop_fwd_bf16(void *out, float *lse, const void *q, const void *k,
                                             const void *v, int B, int T, int H, int KV, int hd, int t0,
                                             int t1, float p, uint64_t seed, int64_t row0, int h0) {
    if (B <= 0 || T <= 0 || H <= 0) return;
    if (p <= 0) {
        cuda_attention_fwd_tc(out, lse, q, k, v, B, T, H, KV, hd, t0, t1);
    } else if (!tc_ok(B, hd, KV, H) || !aligned16(out)) {
        Wide w = widen(q, k, v, NULL, B, T, H, KV, hd);
        cuda_attention_drop_fwd(w.out, lse, w.q, w.k, w.v, B, T, H, KV, hd, t0, t1, p, seed, row0, h0);
        to_bf16_range((bf16s *)out, w.out, B, T, t0, t1, H * hd); // the rows it wrote
    } else {
        tc_fwd<true>(out, lse, q, k, v, B, T, H, KV, hd, t0, t1, tc_drop(p, seed, row0, h0));
    }
}
extern "C" void cuda_attention_drop_bwd_bf16(float *dq, float *dk, float *dv, const float *dout,
                                             const void *out, const float *lse, const void *q, const void *k,
                                             const void *v, int B, int T, int H, int KV, int hd, int t0,
                                             int t1, float p, uint64_t seed, int64_t row0, int h0,
                                             int flags) {
    if (B <= 0 || T <= 0 || H <= 0) return;
    if (p <= 0) {
        cuda_attention_bwd_tc(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, t0, t1, flags);
    } else if (!tc_ok(B, hd, KV, H) || !aligned16(dq) || !aligned16(dk) || !aligned16(dv)) {
        Wide w = widen(q, k, v, out, B, T, H, KV, hd);
        cuda_attention_drop_bwd(dq, dk, dv, dout, w.out, lse, w.q, w.k, w.v, B, T, H, KV, hd, t0, t1, p, seed,
                                row0, h0, flags);
    } else {
        tc_bwd<true>(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, t0, t1, flags,
                     tc_drop(p, seed, row0, h0));
    }
}
