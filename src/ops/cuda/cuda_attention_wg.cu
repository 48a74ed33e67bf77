// cuda_attention_wg.cu — causal grouped-query attention on Hopper's warpgroup MMA (wgmma, sm_90a) for
// backend "cuda" (cuda_attention_tc.cu calls it on the bf16 copies it makes, and keeps its mma.sync
// kernels for other head dims and GPUs), at two shapes: head dim 128, and multi-head latent attention's
// query/key width 192 with value width 128 (ops.h attention_fwd_v: v, out and dout keep rows 192 wide,
// their columns from 128 on the caller's zero padding; these kernels read and compute only the first
// 128 and write the padding of out (and of dv where written) as zeros). Kernels are templates on the two
// widths (HQ, HV); WgShape says how many warpgroups a block holds at each. Same contract and the same
// roundings as the mma.sync kernels (ops.h; bf16 operands, P rounded to bf16 for the second product, fp32
// accumulation, softmax and log-sum-exp), computed by wgmma instead of mma.sync.
// Forward: a block of NF warpgroups holds 64 NF query rows (64 each: wgmma's M); per 64-key tile,
// S = Q K^T (m64n64k16, both operands from shared memory) then O += P V (m64n128k16, P from
// registers, V N-major from shared memory). Tiles are staged with cp.async into the 128-byte-
// swizzled layout of cuda_wgmma.cuh (64-column blocks: two per 128-wide row, three per 192-wide), the
// next K/V tile loading while the current one is used; only tiles crossing the diagonal or the last key
// are masked; a warpgroup skips the tiles entirely above its rows.
// Backward (D = rowsum(bf16(dout) out) given): a dk/dv kernel (NK warpgroups per block, each 64 keys,
// over the group's query heads: S^T = K Q^T and dP^T = V dout^T, then dV += P^T dout and dK += dS^T Q
// from registers; products 192 wide as a 128-wide and a 64-wide wgmma) that also stores dS (bf16) in a
// scratch (head dim 128 only), then a dq kernel of one product, dQ = dS K (both operands from shared
// memory); without the scratch (ops.h attention_ds_bytes: over its cap, or width 192) a dq kernel that
// computes S = Q K^T, dP = dout V^T and dS again (one warpgroup per 64 queries, dQ += dS K with dS from
// registers). Each output is written by one thread in a fixed order: deterministic, no atomics, as the
// mma.sync kernels.
// Fragment layout of a wgmma accumulator (as mma.sync's C per warp): warp w of the warpgroup holds
// rows 16 w + lane / 4 (+ 8), columns 8 j + 2 (lane % 4) (+ 1) in d[4 j + {0, 1}] ({2, 3} for + 8); a
// 192-wide accumulator is the 128-wide one's 64 values then the 64-wide one's 32 (columns 128 on): the
// same formula.
// Must not hold: any knowledge of the model.
#include <cuda_bf16.h>
#include <math.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_attention_softmax.cuh"
#include "ops/cuda/cuda_wgmma.cuh"

#define WG_BN 64 // keys per tile
#define WG_LOG2E 1.4426950408889634f
#define WG_BLK (64 * 128) // one 64-column block of a 64-row tile (bytes)

// The shapes the kernels take: query/key width HQ, value width HV (each a multiple of 64: QB, VB column
// blocks); the forward's warpgroups NF (query rows 64 NF per block) and the dk/dv kernel's NK (keys 64 NK
// per block, sharing the staged query tiles), and the shared memory of each kernel (+1024 for the
// alignment of the base). At 128 / 128 two blocks fit an SM (forward) and NK = 1; at 192 / 128 the
// tiles are half as large again: one block of three forward warpgroups (Q 72 KB, K and V double-buffered
// 80 KB), two dk/dv warpgroups sharing Q and dout's double buffers (160 KB).
template <int HQ, int HV> struct WgShape {
    static constexpr int QB = HQ / 64, VB = HV / 64;
    static constexpr int NF = HQ == 128 ? 2 : 3, NK = HQ == 128 ? 1 : 2;
    // Q (QB column blocks x 64 NF rows), then K and V, each 2 buffers of a 64-row tile
    static constexpr int SMEM_FWD = QB * NF * WG_BLK + 2 * (QB + VB) * WG_BLK + 1024;
    static constexpr int SMEM_DQ = 2 * (QB + VB) * WG_BLK + 1024; // Q, dout, K, V
    // K, V (64 NK rows); Q, dout double-buffered; lse, D; dS^T (head dim 128: the scratch's tile)
    static constexpr int SMEM_DKDV =
        NK * (QB + VB) * WG_BLK + 2 * (QB + VB) * WG_BLK + 4 * 64 * 4 + (HQ == 128 ? 8192 : 0) + 1024;
};
#define WG_SMEM_DQS (2 * 16384 + 4 * WG_BLK + 1024) // 2 x dS^T, K double-buffered (head dim 128)

typedef unsigned short bf16s;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// D (64 x 64: 32 per thread) = [D +] A (64 x 16) B (16 x 64), both from shared memory, K-major
__device__ __forceinline__ void wgmma_n64_ss(float *d, uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
                 "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
                 "%27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "l"(da), "l"(db), "r"(scale_d));
}

// D (64 x 128: 64 per thread) += A (64 x 16, from registers: each warp's 16 rows as the
// mma.m16n8k16 A fragment) B (16 x 128, shared memory, N-major)
__device__ __forceinline__ void wgmma_n128_rs(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
                 "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
                 "%27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
                 "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, "
                 "%63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
                   "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                   "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
                   "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
                   "+f"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}

// D (64 x 64) += A (64 x 16, from registers as above) B (16 x 64, shared memory, N-major)
__device__ __forceinline__ void wgmma_n64_rs(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, "
                 "%9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, "
                 "%27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
                   "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
                   "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
                   "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
                   "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}

// D (64 x 128) += A (64 x 16) B (16 x 128), both from shared memory and both M/N-major (transposed):
// A's 16 rows of K hold 64 contiguous M values, B's 16 rows 128 N values (two 64-column blocks)
__device__ __forceinline__ void wgmma_n128_ss_t(float *d, uint64_t da, uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, "
        "%11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, "
        "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, "
        "%51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),
          "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),
          "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
          "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),
          "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),
          "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),
          "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db));
}

// Stage ROWS rows (row0.., rows `stride` elements apart; rows from nvalid on zero-filled) of their
// first W bf16 (a multiple of 64) into the swizzled tile at dst: column block a (elements 64a..64a+63)
// at dst + a ROWS 128, the 16-byte chunk c of row r at chunk c ^ (r % 8); the block's NTH threads share
// the copies. Completes at stage_done.
template <int ROWS, int NTH, int W = 128>
__device__ __forceinline__ void stage_sw(uint32_t dst, const bf16s *g, int row0, int nvalid, size_t stride) {
    constexpr int C = W / 8; // 16-byte chunks a row
    for (int e = threadIdx.x; e < ROWS * C; e += NTH) {
        int r = C == 16 ? e >> 4 : e / C, c16 = C == 16 ? e & 15 : e % C, blk = c16 >> 3, c = c16 & 7;
        const bf16s *src = r < nvalid ? g + (size_t)(row0 + r) * stride + c16 * 8 : g;
        uint32_t d = dst + blk * ROWS * 128 + r * 128 + ((c ^ (r & 7)) << 4);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                     "r"(r < nvalid ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;\n" ::);
}
// the staged tiles are complete and visible to wgmma (the async proxy) and to every thread
__device__ __forceinline__ void stage_done(void) {
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A fragments (keys or queries 16 kk .. 16 kk + 15 = accumulator columns 2 kk, 2 kk + 1) from a
// 64 x 64 accumulator, rounded to bf16
__device__ __forceinline__ void wg_frags(uint32_t (*f)[4], const float *a) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) f[kk][i] = pack_bf16(a[8 * kk + 2 * i], a[8 * kk + 2 * i + 1]);
}

// S (64 x 64) = A B^T over the first HD columns: A's 64 rows at sa, B's 64 rows at sb, both tiles of
// `arows` / `brows` rows in the swizzled layout (their 64-column blocks arows x 128 B apart)
template <int HD>
__device__ __forceinline__ void wg_scores(float *s, uint32_t sa, int arows, uint32_t sb, int brows) {
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
        wgmma_n64_ss(s, desc_sw128(sa + (kk >> 2) * arows * 128 + 32 * (kk & 3), 16, 1024),
                     desc_sw128(sb + (kk >> 2) * brows * 128 + 32 * (kk & 3), 16, 1024), kk);
}

// acc (64 x N, N 128 or 192) += F (64 x 64, A fragments) X where X is a 64-row tile at sx read N-major:
// its first two column blocks by m64n128k16, the third (N 192) by m64n64k16 into acc[64..95]
template <int N> __device__ __forceinline__ void wg_times(float *acc, uint32_t (*f)[4], uint32_t sx) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
        wgmma_n128_rs(acc, f[kk][0], f[kk][1], f[kk][2], f[kk][3], desc_sw128(sx + 2048 * kk, WG_BLK, 1024));
    if constexpr (N == 192) {
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            wgmma_n64_rs(acc + 64, f[kk][0], f[kk][1], f[kk][2], f[kk][3],
                         desc_sw128(sx + 2 * WG_BLK + 2048 * kk, WG_BLK, 1024));
    }
    static_assert(N == 128 || N == 192, "wg_times: N 128 or 192");
}
#endif

// Query rows [qa, qb) of each sequence, keys 0..qb-1 (rows from qb on are never read as data: they
// are zero-filled). Grid (ceil((qb-qa)/(64 NF)), H, B), the blocks with the most keys first. q, k, v
// rows HQ wide (v's first HV read); out's columns from HV written as zeros.
template <int HQ, int HV>
__global__ void __launch_bounds__(128 * WgShape<HQ, HV>::NF, HQ == 128 ? 2 : 1)
    att_wg_fwd_k(bf16s *out, float *lse, const bf16s *q, const bf16s *k, const bf16s *v, int T, int H, int KV,
                 float sl, int qa, int qb) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef WgShape<HQ, HV> S;
    constexpr int NTH = 128 * S::NF, BM = 64 * S::NF, KT = S::QB * WG_BLK, VT = S::VB * WG_BLK;
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    uint32_t sQ = (smem_u32(wg_smem) + 1023) & ~1023u, sK = sQ + S::QB * BM * 128, sV = sK + 2 * KT;
    int wg = threadIdx.x >> 7, w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, t = lane & 3;
    AttQBlock blk = att_qblock<HQ, BM, WG_BN>(T, H, KV, qa, qb);
    int b = blk.b, h = blk.h, q0 = blk.q0, ntile = blk.ntile;
    const bf16s *qg = q + blk.qoff, *kg = k + blk.koff, *vg = v + blk.koff;
    stage_sw<BM, NTH, HQ>(sQ, qg, q0, min(BM, qb - q0), (size_t)H * HQ);
    stage_sw<WG_BN, NTH, HQ>(sK, kg, 0, min(WG_BN, qb), (size_t)KV * HQ);
    stage_sw<WG_BN, NTH, HV>(sV, vg, 0, min(WG_BN, qb), (size_t)KV * HQ);
    int wrow = q0 + wg * 64; // this warpgroup's first row
    int r0 = wrow + w * 16 + (lane >> 2), r1 = r0 + 8;
    float o[HV / 2], m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
#pragma unroll
    for (int i = 0; i < HV / 2; i++) o[i] = 0.0f;
    for (int it = 0; it < ntile; it++) {
        int k0 = it * WG_BN, cur = it & 1;
        stage_done(); // tile it (and Q, the first time); every warpgroup is done with tile it - 1
        if (it + 1 < ntile) {
            int k1 = k0 + WG_BN;
            stage_sw<WG_BN, NTH, HQ>(sK + (cur ^ 1) * KT, kg, k1, min(WG_BN, qb - k1), (size_t)KV * HQ);
            stage_sw<WG_BN, NTH, HV>(sV + (cur ^ 1) * VT, vg, k1, min(WG_BN, qb - k1), (size_t)KV * HQ);
        }
        if (k0 > wrow + 63) continue; // warpgroup-uniform: every key follows every row of mine
        float s[32];
        uint32_t qa0 = sQ + wg * 64 * 128, kb0 = sK + cur * KT, vb0 = sV + cur * VT;
        wgmma_fence();
        wg_scores<HQ>(s, qa0, BM, kb0, WG_BN);
        wgmma_commit();
        wgmma_wait<0>();
        softmax_tile<WG_BN / 8, HV / 8>(s, o, m0, m1, l0, l1, k0 + WG_BN > wrow || k0 + WG_BN > qb, k0, r0,
                                        r1, qb, t, sl); // mask: the diagonal or the last keys
        uint32_t pf[4][4]; // P as A fragments
        wg_frags(pf, s);
        wgmma_fence();
        wg_times<HV>(o, pf, vb0);
        wgmma_commit();
        wgmma_wait<0>(); // V's buffer is reloaded two tiles on
    }
    softmax_store<HV / 8, HQ>(out, lse, o, m0, m1, l0, l1, r0, r1, qb, b, T, H, h, t);
    if constexpr (HV < HQ) { // the value padding's columns
#pragma unroll
        for (int n = HV / 8; n < HQ / 8; n++) {
            if (r0 < qb) *(uint32_t *)(out + (((size_t)b * T + r0) * H + h) * HQ + n * 8 + 2 * t) = 0;
            if (r1 < qb) *(uint32_t *)(out + (((size_t)b * T + r1) * H + h) * HQ + n * 8 + 2 * t) = 0;
        }
    }
#endif
}

// dq += sum over keys u <= t of ds_tu k_u (ds = p (dp - D) sc, p = exp2(s sl - lse log2 e),
// dp = dout . v over the first HV columns) for the query rows t in [qa, qb): one warpgroup per 64 queries
// over 64-key tiles. Grid (ceil((qb-qa)/64), H, B), the most keys first.
template <int HQ, int HV>
__global__ void __launch_bounds__(128)
    att_wg_dq_k(float *dq, const bf16s *dout, const float *lse, const float *Dg, const bf16s *q,
                const bf16s *k, const bf16s *v, int T, int H, int KV, float sl, float sc, int qa, int qb,
                int add) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef WgShape<HQ, HV> S;
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    // Q, dout, K, V (64 rows each): one buffer each, so that 3 blocks fit an SM (measured at head dim 128:
    // 396 -> 357 us against double-buffered K and V, 2 blocks); the next V loads during dS K, the next K
    // after it
    uint32_t sQ = (smem_u32(wg_smem) + 1023) & ~1023u, sG = sQ + S::QB * WG_BLK, sK = sG + S::VB * WG_BLK,
             sV = sK + S::QB * WG_BLK;
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    AttQBlock blk = att_qblock<HQ, 64, 64>(T, H, KV, qa, qb);
    int b = blk.b, h = blk.h, q0 = blk.q0, ntile = blk.ntile;
    size_t qoff = blk.qoff;
    const bf16s *kg = k + blk.koff, *vg = v + blk.koff;
    stage_sw<64, 128, HQ>(sQ, q + qoff, q0, min(64, qb - q0), (size_t)H * HQ);
    stage_sw<64, 128, HV>(sG, dout + qoff, q0, min(64, qb - q0), (size_t)H * HQ);
    stage_sw<64, 128, HQ>(sK, kg, 0, min(64, qb), (size_t)KV * HQ);
    stage_sw<64, 128, HV>(sV, vg, 0, min(64, qb), (size_t)KV * HQ);
    int r0 = q0 + w * 16 + (lane >> 2), r1 = r0 + 8;
    size_t lrow = ((size_t)b * H + h) * T;
    float L0 = r0 < qb ? lse[lrow + r0] * WG_LOG2E : 0.0f, L1 = r1 < qb ? lse[lrow + r1] * WG_LOG2E : 0.0f;
    float D0 = r0 < qb ? Dg[lrow + r0] : 0.0f, D1 = r1 < qb ? Dg[lrow + r1] : 0.0f;
    float acc[HQ / 2];
#pragma unroll
    for (int i = 0; i < HQ / 2; i++) acc[i] = 0.0f;
    for (int it = 0; it < ntile; it++) {
        int k0 = it * 64, k1 = k0 + 64;
        stage_done();
        float s[32], dp[32];
        wgmma_fence();
        wg_scores<HQ>(s, sQ, 64, sK, 64);
        wgmma_commit();
        wg_scores<HV>(dp, sG, 64, sV, 64);
        wgmma_commit();
        wgmma_wait<1>(); // S is done: P while dP's MMAs run
        int mask = k0 + 64 > q0 || k0 + 64 > qb; // the diagonal or the last keys
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * t + (e & 1), row = e < 2 ? r0 : r1;
                s[4 * j + e] =
                    !mask || (key <= row && key < qb) ? exp2f(s[4 * j + e] * sl - (e < 2 ? L0 : L1)) : 0.0f;
            }
        wgmma_wait<0>();
        if (it + 1 < ntile) { // V is used up (every warp has waited for its products)
            __syncthreads();
            stage_sw<64, 128, HV>(sV, vg, k1, min(64, qb - k1), (size_t)KV * HQ);
        }
#pragma unroll
        for (int j = 0; j < 32; j++) s[j] = s[j] * (dp[j] - (j & 2 ? D1 : D0)) * sc;
        uint32_t f[4][4];
        wg_frags(f, s);
        wgmma_fence();
        wg_times<HQ>(acc, f, sK);
        wgmma_commit();
        wgmma_wait<0>();
        if (it + 1 < ntile) { // K is used up
            __syncthreads();
            stage_sw<64, 128, HQ>(sK, kg, k1, min(64, qb - k1), (size_t)KV * HQ);
        }
    }
    add_rows<HQ / 8>(dq + qoff, acc, r0, qb, (size_t)H * HQ, t, add);
#endif
}

// The dS scratch (ops.h attention_ds_bytes): for each sequence b and query head h, the query tiles m of
// 64 rows from qa, each followed by its key tiles j = 0 .. a + m (a = ceil(qa / 64)), a 64 x 64 bf16
// tile each holding dS^T (the keys as rows, 64 queries of 128 bytes a row, the 16-byte chunks swizzled
// as stage_sw lays them out, so the dq kernel copies it as it is). nt: the tiles of one (b, h).
__device__ __forceinline__ size_t ds_tile(int b, int h, int H, int m, int j, int a, size_t nt) {
    return ((size_t)b * H + h) * nt + (size_t)m * (a + 1) + (size_t)m * (m - 1) / 2 + j;
}

// dv_u += sum p_tu dout_t, dk_u += sum ds_tu q_t over the query heads of kv head kh and the queries
// t >= u, t in [qa, qb), for the keys u < qb: NK warpgroups of 64 keys each (S^T and dP^T with the keys
// as rows), the query tiles of 64 from qa double-buffered and shared by them. Grid (ceil(qb/(64 NK)), KV,
// B). ds (or NULL; head dim 128 only): each tile's dS^T stored there for att_wg_dqs_k (the layout above;
// a = ceil(qa / 64), nt tiles per head). dv's columns from HV written as zeros (without add).
template <int HQ, int HV>
__global__ void __launch_bounds__(128 * WgShape<HQ, HV>::NK)
    att_wg_dkdv_k(float *dk, float *dv, bf16s *ds, const bf16s *dout, const float *lse, const float *Dg,
                  const bf16s *q, const bf16s *k, const bf16s *v, int T, int H, int KV, float sl, float sc,
                  int qa, int qb, int a, size_t nt, int add) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef WgShape<HQ, HV> S;
    constexpr int NK = S::NK, NTH = 128 * NK, KR = 64 * NK, QT = S::QB * WG_BLK, GT = S::VB * WG_BLK;
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    // K, V (64 NK rows each), then Q and dout: 2 buffers of 64 rows each, then lse and D: 2 x 64 each
    uint32_t sK = (smem_u32(wg_smem) + 1023) & ~1023u, sV = sK + S::QB * KR * 128, sQ = sV + S::VB * KR * 128,
             sG = sQ + 2 * QT;
    uint32_t sL = sG + 2 * GT, sD = sL + 128 * 4;
    const float *Ls = (const float *)(wg_smem + (sL - smem_u32(wg_smem))), *Ds = Ls + 128;
    unsigned char *Ss = (unsigned char *)(Ds + 128); // dS^T's tile on its way out (8 KB; ds only)
    int wg = threadIdx.x >> 7, w = NK > 1 ? (threadIdx.x >> 5) & 3 : threadIdx.x >> 5,
        lane = threadIdx.x & 31, t = lane & 3;
    AttPlace pl = att_place(); // the keys from k0 (the most query tiles first)
    int b = pl.b, kh = pl.head, rep = H / KV;
    int k0 = pl.pos * KR, kw = NK > 1 ? k0 + 64 * wg : k0; // the block's keys, this warpgroup's
    size_t koff = ((size_t)b * T * KV + kh) * HQ;
    stage_sw<KR, NTH, HQ>(sK, k + koff, k0, min(KR, qb - k0), (size_t)KV * HQ);
    stage_sw<KR, NTH, HV>(sV, v + koff, k0, min(KR, qb - k0), (size_t)KV * HQ);
    int u0 = kw + w * 16 + (lane >> 2);
    float dka[HQ / 2], dva[HV / 2];
#pragma unroll
    for (int i = 0; i < HV / 2; i++) dka[i] = dva[i] = 0.0f;
#pragma unroll
    for (int i = HV / 2; i < HQ / 2; i++) dka[i] = 0.0f;
    // the query tiles: for each query head of the group in order, those of [qa, qb) in steps of 64 from the
    // one holding max(k0, qa) (whose tile index is max(0, j - a): a tile ahead of the keys reads nothing)
    int m0 = max(0, k0 / 64 - a), tstart = qa + 64 * m0, per = (qb - tstart + 63) / 64, ntile = rep * per;
    for (int i = -1; i < ntile; i++) {
        if (i >= 0) {
            stage_done(); // tile i and its lse, D; tile i - 1's buffers are used up
        }
        if (i + 1 < ntile) { // tile i + 1 loads while tile i is used
            int n = i + 1, buf = n & 1, hq = kh * rep + n / per, t1 = tstart + (n % per) * 64,
                nq = min(64, qb - t1);
            size_t qoff = ((size_t)b * T * H + hq) * HQ, lrow = ((size_t)b * H + hq) * T;
            stage_sw<64, NTH, HQ>(sQ + buf * QT, q + qoff, t1, nq, (size_t)H * HQ);
            stage_sw<64, NTH, HV>(sG + buf * GT, dout + qoff, t1, nq, (size_t)H * HQ);
            // lse and D through cp.async too (zero-filled past nq): a plain load would stall the warp
            // at its shared-memory store, and with it the warpgroup's next wgmma
            if (NK == 1 || threadIdx.x < 128) { // threads 0-63: lse, 64-127: D
                int j = threadIdx.x & 63, ok = j < nq;
                const float *src = (threadIdx.x < 64 ? lse : Dg) + lrow + t1 + (ok ? j : 0);
                uint32_t dst = (threadIdx.x < 64 ? sL : sD) + (buf * 64 + j) * 4;
                asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                             "r"(ok ? 4 : 0));
            }
            asm volatile("cp.async.commit_group;\n" ::);
        }
        if (i < 0) continue;
        int cur = i & 1, t0 = tstart + (i % per) * 64;
        // warpgroup-uniform: every query of the tile precedes this warpgroup's keys (NK > 1: the block's
        // first tiles are the first warpgroup's)
        if (NK > 1 && t0 + 63 < kw) continue;
        uint32_t qb_ = sQ + cur * QT, gb = sG + cur * GT, kb = sK + (NK > 1 ? wg * 64 * 128 : 0),
                 vb = sV + (NK > 1 ? wg * 64 * 128 : 0);
        const float *Lc = Ls + cur * 64, *Dc = Ds + cur * 64;
        // S^T and dP^T as two MMA groups: P^T from S^T while dP^T's MMAs run (P^T in its own registers:
        // written over S^T, the compiler copied S^T's accumulators between its wgmmas and ptxas then
        // serialised them; issuing dV's MMAs before dS^T measured the same, 0.957 ms)
        float s[32], dp[32], pr[32];
        wgmma_fence();
        wg_scores<HQ>(s, kb, KR, qb_, 64); // s^T: keys x queries
        wgmma_commit();
        wg_scores<HV>(dp, vb, KR, gb, 64); // dp^T
        wgmma_commit();
        wgmma_wait<1>();
        int mask = t0 < kw + 64 || t0 + 64 > qb; // the diagonal or the last queries
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = j * 8 + 2 * t + (e & 1), qt = t0 + c, key = e < 2 ? u0 : u0 + 8;
                pr[4 * j + e] =
                    !mask || (qt >= key && qt < qb) ? exp2f(s[4 * j + e] * sl - Lc[c] * WG_LOG2E) : 0.0f;
            }
        wgmma_wait<0>();
#pragma unroll
        for (int j = 0; j < 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int c = j * 8 + 2 * t + (e & 1);
                dp[4 * j + e] = pr[4 * j + e] * (dp[4 * j + e] - Dc[c]) * sc;
            }
        uint32_t fp[4][4], fd[4][4];
        wg_frags(fp, pr);
        wg_frags(fd, dp);
        wgmma_fence();
        wg_times<HV>(dva, fp, gb);
        wg_times<HQ>(dka, fd, qb_);
        wgmma_commit();
        // dS^T in bf16 (the A fragments' bits: rows u0 - k0 (+ 8), queries 16 kk + 8 (e / 2) + 2 t) into
        // shared memory in the tile's layout (conflict-free: the 8 rows of a warp's store fall in 8 chunks),
        // then out in 16-byte pieces, whole lines (stored from the fragments directly, each warp store wrote
        // 16 bytes in each of 8 lines: the dk/dv kernel took 472 us instead of 336)
        if (NK == 1 && ds) {
            int hq = kh * rep + i / per, r = w * 16 + (lane >> 2);
            uint4 *tile = (uint4 *)(ds + ds_tile(b, hq, H, (t0 - qa) / 64, k0 / 64, a, nt) * 4096);
#pragma unroll
            for (int kk = 0; kk < 4; kk++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int row = r + 8 * (e & 1), c16 = 2 * kk + (e >> 1);
                    *(uint32_t *)(Ss + row * 128 + ((c16 ^ (row & 7)) << 4) + 4 * t) = fd[kk][e];
                }
            __syncthreads(); // (the tile is read again only after the next step's first barrier)
#pragma unroll
            for (int c = threadIdx.x; c < 512; c += 128) tile[c] = *(const uint4 *)(Ss + 16 * c);
        }
        wgmma_wait<0>();
    }
    add_rows<HQ / 8>(dk + koff, dka, u0, qb, (size_t)KV * HQ, t, add);
    add_rows<HV / 8>(dv + koff, dva, u0, qb, (size_t)KV * HQ, t, add);
    if constexpr (HV < HQ) { // the value padding's columns: zeros where written, nothing added
        float zero[(HQ - HV) / 2] = {};
        if (!add) add_rows<(HQ - HV) / 8>(dv + koff + HV, zero, u0, qb, (size_t)KV * HQ, t, 0);
    }
#endif
}

// dq += sum over the key tiles j <= a + m of dS (tile (m, j), from att_wg_dkdv_k) K_j for the query tiles m
// of 64 rows (the query rows [qa, qb)): a block of two warpgroups takes two tiles m, m + 1 of one head,
// which read the same K tiles (staged once for both: from L2 the kernel read dS once and K twice as many
// bytes), dS^T (M-major) and K (N-major) staged as they are stored, double-buffered. Grid
// (ceil((qb - qa) / 128), H, B), the most keys first. Head dim 128.
__global__ void __launch_bounds__(256) att_wg_dqs_k(float *dq, const bf16s *ds, const bf16s *k, int T, int H,
                                                    int KV, int qa, int qb, int a, size_t nt, int add) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    // 2 buffers of (dS^T of each warpgroup's tile: 2 x 8 KB), then 2 of K (16 KB)
    uint32_t sD = (smem_u32(wg_smem) + 1023) & ~1023u, sK = sD + 2 * 16384;
    int wg = threadIdx.x >> 7, w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, t = lane & 3;
    AttQBlock blk = att_qblock<128, 128, 64>(T, H, KV, qa, qb);
    int q0 = blk.q0, ntile = blk.ntile, qw = q0 + 64 * wg; // this warpgroup's rows from qw (none past qb)
    int nw = qw < qb ? (min(qw + 64, qb) + 63) / 64 : 0; // and its key tiles
    const bf16s *kg = k + blk.koff,
                *dg = nw ? ds + ds_tile(blk.b, blk.h, H, (qw - qa) / 64, 0, a, nt) * 4096 : ds;
    // key tile n (K, and each warpgroup's dS^T tile copied as it is stored) into buffer n % 2, one commit
    // group
    auto load = [&](int n) {
        if (n < nw) {
            const char *src = (const char *)(dg + (size_t)n * 4096);
            uint32_t dst = sD + (n & 1) * 16384 + wg * 8192;
            for (int e = threadIdx.x & 127; e < 512; e += 128)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + e * 16),
                             "l"(src + e * 16));
        }
        stage_sw<64, 256>(sK + (n & 1) * 2 * WG_BLK, kg, n * 64, min(64, qb - n * 64), (size_t)KV * 128);
    };
    load(0);
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    for (int it = 0; it < ntile; it++) {
        stage_done(); // tile it; every warp is done with tile it - 1, whose buffers tile it + 1 takes
        if (it + 1 < ntile) load(it + 1);
        if (it >= nw) continue; // warpgroup-uniform: the lower tile has one key tile fewer
        uint32_t d0 = sD + (it & 1) * 16384 + wg * 8192, k0 = sK + (it & 1) * 2 * WG_BLK;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            wgmma_n128_ss_t(acc, desc_sw128(d0 + 2048 * kk, 8192, 1024),
                            desc_sw128(k0 + 2048 * kk, 64 * 128, 1024));
        wgmma_commit();
        wgmma_wait<0>();
    }
    if (nw) add_rows<16>(dq + blk.qoff, acc, qw + w * 16 + (lane >> 2), qb, (size_t)H * 128, t, add);
#endif
}

// Where the kernels here run: head dims (hd, hv) 128 / 128 or 192 / 128, sm_90a code on an sm_90 GPU
// (elsewhere the caller uses its mma.sync or float32 kernels).
extern "C" int cuda_attention_wg_runs(int hd, int hv) {
    return ((hd == 128 && hv == 128) || (hd == 192 && hv == 128)) && backend_cuda_grouped_kernel();
}

template <int HQ, int HV>
static void fwd_run(bf16s *out, float *lse, const bf16s *q, const bf16s *k, const bf16s *v, int B, int T,
                    int H, int KV, int t0, int t1) {
    typedef WgShape<HQ, HV> S;
    static int opted = 0;
    if (!opted) {
        CUDA_CHECK(cudaFuncSetAttribute(att_wg_fwd_k<HQ, HV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        S::SMEM_FWD));
        opted = 1;
    }
    dim3 grid(cdiv_u(t1 - t0, 64 * S::NF), H, B);
    att_wg_fwd_k<HQ, HV><<<grid, 128 * S::NF, S::SMEM_FWD>>>(out, lse, q, k, v, T, H, KV,
                                                             WG_LOG2E / sqrtf((float)HQ), t0, t1);
    KCHECK("attention_fwd (wgmma)");
}

// Forward on the bf16 copies (layouts of ops.h: rows hd wide, v's and out's first hv the values); 0 where
// this path does not run (cuda_attention_wg_runs).
extern "C" int cuda_attention_fwd_wg(unsigned short *out, float *lse, const unsigned short *q,
                                     const unsigned short *k, const unsigned short *v, int B, int T, int H,
                                     int KV, int hd, int hv, int t0, int t1) {
    if (!cuda_attention_wg_runs(hd, hv)) return 0;
    if (hd != 128) fwd_run<192, 128>(out, lse, q, k, v, B, T, H, KV, t0, t1);
    else if (!cuda_attention_fwd_wgf(out, lse, q, k, v, B, T, H, KV, t0, t1)) // MOE_ATTN_FWD_OLD=1: ours
        fwd_run<128, 128>(out, lse, q, k, v, B, T, H, KV, t0, t1);
    return 1;
}

template <int HQ, int HV>
static void bwd_run(float *dq, float *dk, float *dv, bf16s *dsb, const bf16s *dout, const float *lse,
                    const float *D, const bf16s *q, const bf16s *k, const bf16s *v, int B, int T, int H,
                    int KV, int t0, int t1, int flags) {
    typedef WgShape<HQ, HV> S;
    static int opted = 0;
    if (!opted) {
        CUDA_CHECK(cudaFuncSetAttribute(att_wg_dq_k<HQ, HV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        S::SMEM_DQ));
        CUDA_CHECK(cudaFuncSetAttribute(att_wg_dkdv_k<HQ, HV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        S::SMEM_DKDV));
        if (HQ == 128)
            CUDA_CHECK(
                cudaFuncSetAttribute(att_wg_dqs_k, cudaFuncAttributeMaxDynamicSharedMemorySize, WG_SMEM_DQS));
        opted = 1;
    }
    float sc = 1.0f / sqrtf((float)HQ), sl = sc * WG_LOG2E;
    int nq = (int)cdiv_u(t1 - t0, 64), a = (t0 + 63) / 64;
    size_t nt = (size_t)nq * (a + 1) + (size_t)nq * (nq - 1) / 2; // dS tiles per head (ds_tile)
    dim3 gq(nq, H, B), gk(cdiv_u(t1, 64 * S::NK), KV, B);
    if (!dsb) {
        att_wg_dq_k<HQ, HV><<<gq, 128, S::SMEM_DQ>>>(dq, dout, lse, D, q, k, v, T, H, KV, sl, sc, t0, t1,
                                                     flags & ATT_ADD_DQ);
        KCHECK("attention_bwd (wgmma, dq)");
    }
    att_wg_dkdv_k<HQ, HV><<<gk, 128 * S::NK, S::SMEM_DKDV>>>(dk, dv, dsb, dout, lse, D, q, k, v, T, H, KV, sl,
                                                             sc, t0, t1, a, nt, flags & ATT_ADD_DKV);
    KCHECK("attention_bwd (wgmma, dk/dv)");
    if (dsb) {
        dim3 g2(cdiv_u(t1 - t0, 128), H, B);
        att_wg_dqs_k<<<g2, 256, WG_SMEM_DQS>>>(dq, dsb, k, T, H, KV, t0, t1, a, nt, flags & ATT_ADD_DQ);
        KCHECK("attention_bwd (wgmma, dq from dS)");
    }
}

// Backward on the bf16 copies (dout rounded too), D = rowsum(bf16(dout) * out) given; 0 where this
// path does not run. ds: scratch of attention_ds_bytes(B, T, H, hd, t0, t1) bytes, where that is not 0
// (head dim 128: the dk/dv kernel stores dS there, and dq is its product with K: 5 matrix products
// instead of 7), or NULL (the dq kernel computes S, dP and dS again).
extern "C" int cuda_attention_bwd_wg(float *dq, float *dk, float *dv, void *ds, const unsigned short *dout,
                                     const float *lse, const float *D, const unsigned short *q,
                                     const unsigned short *k, const unsigned short *v, int B, int T, int H,
                                     int KV, int hd, int hv, int t0, int t1, int flags) {
    if (!cuda_attention_wg_runs(hd, hv)) return 0;
    if (hd == 128)
        bwd_run<128, 128>(dq, dk, dv, (bf16s *)ds, dout, lse, D, q, k, v, B, T, H, KV, t0, t1, flags);
    else if (!ds) bwd_run<192, 128>(dq, dk, dv, NULL, dout, lse, D, q, k, v, B, T, H, KV, t0, t1, flags);
    else DIE("cuda attention (wgmma): no dS scratch at head dim %d", hd);
    return 1;
}

// ---- latent attention's values (ops.h attention_fwd_v / attention_bwd_v) for backend "cuda"
// The wgmma kernels take the call: a value width under the head width that they have (192 / 128), on a
// shape and row range the tensor-core path takes, on 16-byte-aligned outputs. Otherwise the caller's
// attention_fwd/bwd of cuda_attention_tc.cu over the padded rows (the same function, ops.h).
static int wg_v_takes(int B, int T, int H, int KV, int hd, int hv, int t0, int t1, const void *a,
                      const void *b, const void *c) {
    uintptr_t al = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    return hv < hd && cuda_attention_wg_runs(hd, hv) && B > 0 && B <= 65535 && T > 0 && H > 0 && H <= 65535 &&
        KV > 0 && H % KV == 0 && t0 >= 0 && t0 < t1 && t1 <= T && (al & 15) == 0;
}

extern "C" void cuda_attention_fwd_tcv(void *out, float *lse, const void *q, const void *k, const void *v,
                                       int B, int T, int H, int KV, int hd, int hv, int t0, int t1) {
    if (wg_v_takes(B, T, H, KV, hd, hv, t0, t1, out, out, out))
        cuda_attention_fwd_wg((bf16s *)out, lse, (const bf16s *)q, (const bf16s *)k, (const bf16s *)v, B, T,
                              H, KV, hd, hv, t0, t1);
    else cuda_attention_fwd_tc(out, lse, q, k, v, B, T, H, KV, hd, t0, t1);
}

// The workspace: D (B, H, T) float, then dout's rows in bf16 (rounded by the rowdot kernel), each 256-byte
// aligned; no dS scratch (the dq kernel computes dS again).
extern "C" void cuda_attention_bwd_tcv(float *dq, float *dk, float *dv, const float *dout, const void *out,
                                       const float *lse, const void *q, const void *k, const void *v, int B,
                                       int T, int H, int KV, int hd, int hv, int t0, int t1, int flags) {
    if (!wg_v_takes(B, T, H, KV, hd, hv, t0, t1, dq, dk, dv)) {
        cuda_attention_bwd_tc(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, t0, t1, flags);
        return;
    }
    size_t nd = ((size_t)B * H * T * sizeof(float) + 255) & ~(size_t)255, ng = (size_t)B * T * H * hd;
    char *w = (char *)cuda_workspace(nd + ng * sizeof(bf16s));
    float *D = (float *)w;
    bf16s *g = (bf16s *)(w + nd);
    cuda_attention_rowdot(D, g, dout, out, 1, B, T, H, hd, t0, t1);
    cuda_attention_bwd_wg(dq, dk, dv, NULL, g, lse, D, (const bf16s *)q, (const bf16s *)k, (const bf16s *)v,
                          B, T, H, KV, hd, hv, t0, t1, flags);
}
