// cuda_attention_wg.cu — causal grouped-query attention on Hopper's warpgroup MMA (wgmma, sm_90a) for
// backend "cuda" (cuda_attention_tc.cu calls it on the bf16 copies it makes, and keeps its mma.sync
// kernels for other head dims and GPUs), at two shapes: head dim 128, and multi-head latent attention's
// query/key width 192 with value width 128 (ops.h attention_fwd_v: v, out and dout keep rows 192 wide,
// their columns from 128 on the caller's zero padding; these kernels read and compute only the first
// 128 and write the padding of out (and of dv where written) as zeros). Kernels are templates on the two
// widths (HQ, HV); WgShape says how many warpgroups a block holds at each. Same contract and the same
// roundings as the mma.sync kernels (ops.h; bf16 operands, P rounded to bf16 for the second product, fp32
// accumulation, softmax and log-sum-exp), computed by wgmma instead of mma.sync.
// Forward (the one that runs with MOE_ATTN_FWD_OLD=1; by default cuda_attention_wgf.cu's 128-key kernel, at
// both shapes): a block of NF warpgroups holds 64 NF query rows (64 each: wgmma's M); per 64-key tile,
// S = Q K^T (m64n64k16, both operands from shared memory) then O += P V (m64n128k16, P from
// registers, V N-major from shared memory). Tiles are staged with cp.async into the 128-byte-
// swizzled layout of cuda_wgmma.cuh (64-column blocks: two per 128-wide row, three per 192-wide), the
// next K/V tile loading while the current one is used; only tiles crossing the diagonal or the last key
// are masked; a warpgroup skips the tiles entirely above its rows.
// Backward (D = rowsum(bf16(dout) out) given; the dS scratch in passes over kv heads where it is over its
// cap, over key ranges of two kv heads where not two whole fit: ops.h attention_ds_bytes): a dk/dv kernel (NK
// warpgroups per block, each 64 keys, over the group's query heads: S^T = K Q^T and dP^T = V dout^T, then dV
// += P^T dout and dK += dS^T Q from registers; products 192 wide as a 128-wide and a 64-wide wgmma) that also
// stores dS (bf16) in a scratch (head dim 128 only; P by wg_exp2, under 2^-126 flushed to 0 as the forward's;
// there its query and dout tiles come by TMA, thread 0's copies onto each buffer's mbarrier, the threads
// copying lse and D), then a dq kernel of one product, dQ = dS K
// (both operands from shared memory: cuda_attention_wg.cuh's att_wg_dqs_k); without the scratch (ops.h
// attention_ds_bytes: over its cap, or width 192) a dq kernel that computes S = Q K^T, dP = dout V^T and dS
// again (one warpgroup per 64 queries, dQ += dS K with dS from registers). At 192 / 128 these backward
// kernels are latent attention's old way (MOE_ATTN_MLA=old) and its dq kernel the "recompute" way's:
// cuda_attention_mla.cu holds the default one and the op's entry points. Each output is written by one thread
// in a fixed order: deterministic, no atomics, as the mma.sync kernels. Fragment layout of a wgmma
// accumulator (as mma.sync's C per warp): warp w of the warpgroup holds rows 16 w + lane / 4 (+ 8), columns 8
// j + 2 (lane % 4) (+ 1) in d[4 j + {0, 1}] ({2, 3} for + 8); a 192-wide accumulator is the 128-wide one's 64
// values then the 64-wide one's 32 (columns 128 on): the same formula. Must not hold: any knowledge of the
// model.
#include "ops/cuda/cuda_attention_wg.cuh"


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
    // the dk/dv kernel's query and dout tiles by TMA (one warpgroup at 128 / 128), else by stage_sw
    static constexpr bool DKDV_TMA = HQ == 128 && HV == 128 && NK == 1;
    // K, V (64 NK rows); Q, dout double-buffered; lse, D; dS^T (head dim 128: the scratch's tile); the two
    // buffers' TMA barriers
    static constexpr int SMEM_DKDV = NK * (QB + VB) * WG_BLK + 2 * (QB + VB) * WG_BLK + 4 * 64 * 4 +
        (HQ == 128 ? 8192 : 0) + (DKDV_TMA ? 16 : 0) + 1024;
};


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


// dv_u += sum p_tu dout_t, dk_u += sum ds_tu q_t over the query heads of kv head kh and the queries
// t >= u, t in [qa, qb), for the keys u < qb from key tile j0 on: NK warpgroups of 64 keys each (S^T and dP^T
// with the keys as rows), the query tiles of 64 from qa double-buffered and shared by them. Grid (the key
// blocks from j0 (ceil(qb/(64 NK)) from 0), KV, B). ds (or NULL; head dim 128 only): each tile's dS^T stored
// there for att_wg_dqs_k (cuda_attention_wg.cuh ds_tile's layout of the key range [j0, j0 + jw); a =
// ceil(qa / 64), nt tiles per head). dv's columns from HV written as zeros (without add).
template <int HQ, int HV>
__global__ void __launch_bounds__(128 * WgShape<HQ, HV>::NK)
    att_wg_dkdv_k(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tg, float *dk,
                  float *dv, bf16s *ds, const bf16s *dout, const float *lse, const float *Dg, const bf16s *q,
                  const bf16s *k, const bf16s *v, int T, int H, int KV, float sl, float sc, int qa, int qb,
                  int a, size_t nt, int j0, int jw, int add) {
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
    // TMA (head dim 128, one warpgroup): thread 0 loads each query and dout tile by tq, tg (rows from qb on
    // read as zeros), completing on its buffer's barrier (after Ss); the threads' own copies are lse and D
    constexpr bool TMA = S::DKDV_TMA;
    const uint32_t bars = sD + 128 * 4 + 8192;
    if (TMA && threadIdx.x == 0) {
        mbar_init(bars, 1);
        mbar_init(bars + 8, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    int wg = threadIdx.x >> 7, w = NK > 1 ? (threadIdx.x >> 5) & 3 : threadIdx.x >> 5,
        lane = threadIdx.x & 31, t = lane & 3;
    AttPlace pl = att_place(); // the keys from k0 (the most query tiles first)
    int b = pl.b, kh = pl.head, rep = H / KV;
    int k0 = j0 * 64 + pl.pos * KR, kw = NK > 1 ? k0 + 64 * wg : k0; // the block's keys, this warpgroup's
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
    // (lh, lp): the next tile to load, its head of the group and its place in the head's tiles; (ch, cp):
    // tile i's (counted on, not divided out of i: the divisions were ~40 instructions a tile)
    int m0 = max(0, k0 / 64 - a), tstart = qa + 64 * m0, per = (qb - tstart + 63) / 64, ntile = rep * per;
    int lh = 0, lp = 0, ch = 0, cp = 0;
    for (int i = -1; i < ntile; i++) {
        if (i >= 0) {
            stage_done(); // tile i and its lse, D; tile i - 1's buffers are used up
        }
        if (i + 1 < ntile) { // tile i + 1 loads while tile i is used
            int n = i + 1, buf = n & 1, hq = kh * rep + lh, t1 = tstart + lp * 64, nq = min(64, qb - t1);
            if (++lp == per) lp = 0, lh++;
            size_t qoff = ((size_t)b * T * H + hq) * HQ, lrow = ((size_t)b * H + hq) * T;
            if constexpr (TMA) {
                if (threadIdx.x == 0) { // (the buffer's last reader, tile i - 1, finished before the barrier)
                    uint32_t fb = bars + 8 * buf;
                    mbar_expect_tx(fb, QT + GT);
#pragma unroll
                    for (int cb = 0; cb < S::QB; cb++) {
                        tma_4d(sQ + buf * QT + cb * WG_BLK, &tq, 64 * cb, hq, t1, b, fb);
                        tma_4d(sG + buf * GT + cb * WG_BLK, &tg, 64 * cb, hq, t1, b, fb);
                    }
                }
            } else {
                stage_sw<64, NTH, HQ>(sQ + buf * QT, q + qoff, t1, nq, (size_t)H * HQ);
                stage_sw<64, NTH, HV>(sG + buf * GT, dout + qoff, t1, nq, (size_t)H * HQ);
            }
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
        if constexpr (TMA) mbar_wait(bars + 8 * (i & 1), (i >> 1) & 1); // tile i's query and dout
        int cur = i & 1, t0 = tstart + cp * 64, hc = kh * rep + ch, mc = m0 + cp; // (mc: (t0 - qa) / 64)
        if (++cp == per) cp = 0, ch++;
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
                    !mask || (qt >= key && qt < qb) ? wg_exp2(s[4 * j + e] * sl - Lc[c] * WG_LOG2E) : 0.0f;
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
            int r = w * 16 + (lane >> 2);
            uint4 *tile = (uint4 *)(ds + ds_tile(b, hc, H, mc, k0 / 64, a, nt, j0, jw) * 4096);
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
    if (cuda_attention_fwd_wgf(out, lse, q, k, v, B, T, H, KV, hd, t0, t1)) return 1; // the 128-key kernel
    if (hd != 128) fwd_run<192, 128>(out, lse, q, k, v, B, T, H, KV, t0, t1); // MOE_ATTN_FWD_OLD=1: ours
    else fwd_run<128, 128>(out, lse, q, k, v, B, T, H, KV, t0, t1);
    return 1;
}

// The dq kernel that computes S, dP and dS again (att_wg_dq_k), adding into dq where add.
template <int HQ, int HV>
static void dq_run(float *dq, const bf16s *dout, const float *lse, const float *D, const bf16s *q,
                   const bf16s *k, const bf16s *v, int B, int T, int H, int KV, int t0, int t1, int add) {
    typedef WgShape<HQ, HV> S;
    static int opted = 0;
    if (!opted) {
        CUDA_CHECK(cudaFuncSetAttribute(att_wg_dq_k<HQ, HV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        S::SMEM_DQ));
        opted = 1;
    }
    float sc = 1.0f / sqrtf((float)HQ), sl = sc * WG_LOG2E;
    dim3 gq(cdiv_u(t1 - t0, 64), H, B);
    att_wg_dq_k<HQ, HV><<<gq, 128, S::SMEM_DQ>>>(dq, dout, lse, D, q, k, v, T, H, KV, sl, sc, t0, t1, add);
    KCHECK("attention_bwd (wgmma, dq)");
}

// cuda_common.h: latent attention's dq kernel alone (cuda_attention_mla.cu's MOE_ATTN_MLA=recompute).
extern "C" void cuda_attention_dq_wg(float *dq, const unsigned short *dout, const float *lse, const float *D,
                                     const unsigned short *q, const unsigned short *k,
                                     const unsigned short *v, int B, int T, int H, int KV, int t0, int t1,
                                     int add) {
    dq_run<192, 128>(dq, dout, lse, D, q, k, v, B, T, H, KV, t0, t1, add);
}

// The dk/dv kernel, then (ds) dq = dS K, over one pass of the scratch (cuda_attention_wg.cuh att_ds_passes;
// every pointer at (sequence 0, head 0) of the whole call, moved by the pass's offsets) and over its key
// tiles [j0, j1) (the whole triangle: 0, INT_MAX; a range: dq continued from the ranges before, added into
// from the first where the flags add); without ds, the dq kernel that computes dS again first (one pass
// of everything).
template <int HQ, int HV>
static void bwd_pass(float *dq, float *dk, float *dv, bf16s *dsb, const bf16s *dout, const float *lse,
                     const float *D, const bf16s *q, const bf16s *k, const bf16s *v, int B, int T, int H,
                     int KV, int t0, int t1, int flags, AttDsPass p, int j0, int j1) {
    typedef WgShape<HQ, HV> S;
    static int opted = 0;
    if (!opted) {
        CUDA_CHECK(cudaFuncSetAttribute(att_wg_dkdv_k<HQ, HV>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        S::SMEM_DKDV));
        if (HQ == 128)
            CUDA_CHECK(cudaFuncSetAttribute(att_wg_dqs_k<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            DqsShape<128>::SMEM));
        opted = 1;
    }
    float sc = 1.0f / sqrtf((float)HQ), sl = sc * WG_LOG2E;
    int a = (t0 + 63) / 64, rep = H / KV, nkb = (int)cdiv_u(t1, 64 * S::NK), range = j1 != INT_MAX;
    size_t nt = attention_ds_range_tiles(t0, t1, j0, j1); // dS tiles per head (ds_tile)
    size_t qo = p.qo, ko = p.ko, lo = p.lo;
    if (!dsb) dq_run<HQ, HV>(dq, dout, lse, D, q, k, v, B, T, H, KV, t0, t1, flags & ATT_ADD_DQ);
    dim3 gk((range ? min(j1, nkb) : nkb) - j0, p.nkv, p.nb);
    CUtensorMap tq = {}, tg = {}; // (head dim 128: the kernel's TMA loads of query and dout tiles)
    if (S::DKDV_TMA) {
        int sms;
        void *fn;
        if (!cuda_hopper_tma(&sms, &fn))
            DIE("attention_bwd (wgmma): no TMA encoder on a GPU that runs wgmma");
        PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)fn;
        att_tma_map(enc, &tq, q + qo, p.nb, T, t1, p.nkv * rep, H, 128, HQ, 64, "q (backward)");
        att_tma_map(enc, &tg, dout + qo, p.nb, T, t1, p.nkv * rep, H, 128, HQ, 64, "dout (backward)");
    }
    att_wg_dkdv_k<HQ, HV><<<gk, 128 * S::NK, S::SMEM_DKDV>>>(
        tq, tg, dk + ko, dv + ko, dsb, dout + qo, lse + lo, D + lo, q + qo, k + ko, v + ko, T, H, KV, sl, sc,
        t0, t1, a, nt, j0, j1 - j0, flags & ATT_ADD_DKV);
    KCHECK("attention_bwd (wgmma, dk/dv)");
    if (dsb) {
        int add = flags & ATT_ADD_DQ ? 1 : 0, qr = t0 + 64 * max(0, j0 - a);
        if (range) add = j0 || add ? 2 : 0;
        typedef DqsShape<128> Q;
        dim3 g2(cdiv_u(t1 - qr, Q::ROWS), p.nkv * rep, p.nb);
        att_wg_dqs_k<128>
            <<<g2, Q::THREADS, Q::SMEM>>>(dq + qo, dsb, k + ko, T, H, KV, t0, t1, a, nt, j0, j1, add);
        KCHECK("attention_bwd (wgmma, dq from dS)");
    }
}

// Backward on the bf16 copies (dout rounded too), D = rowsum(bf16(dout) * out) given; 0 where this
// path does not run. ds: scratch of ds_bytes = attention_ds_bytes(B, T, H, KV, hd, t0, t1) bytes, where that
// is not 0 (head dim 128: the dk/dv kernel stores dS there, and dq is its product with K: 5 matrix products
// instead of 7), or NULL (the dq kernel computes S, dP and dS again). The passes follow from ds_bytes as
// ops.h attention_ds_bytes sized it: the bytes of every (sequence, kv head) pair: one pass; of two pairs or
// more (one where KV is 1): passes of ds_bytes / (a pair's bytes) kv heads of one sequence; under that:
// passes of two kv heads (one) of one sequence over the key ranges that fill ds_bytes (ops.h
// attention_ds_range_end), in order, dq continued range by range. dq's bits do not depend on the passes
// (where dq is written; added into, in key ranges the sum continues from dq's value, not added to it at
// the end: equal to round-off), nor dk's and dv's on the scratch.
extern "C" int cuda_attention_bwd_wg(float *dq, float *dk, float *dv, void *ds, size_t ds_bytes,
                                     const unsigned short *dout, const float *lse, const float *D,
                                     const unsigned short *q, const unsigned short *k,
                                     const unsigned short *v, int B, int T, int H, int KV, int hd, int hv,
                                     int t0, int t1, int flags) {
    if (!cuda_attention_wg_runs(hd, hv)) return 0;
    if (hd != 128) {
        if (ds) DIE("cuda attention (wgmma): no dS scratch at head dim %d", hd);
        att_ds_passes(B, T, H, KV, hd, 1, KV, [&](AttDsPass p) {
            bwd_pass<192, 128>(dq, dk, dv, NULL, dout, lse, D, q, k, v, B, T, H, KV, t0, t1, flags, p, 0,
                               INT_MAX);
        });
        return 1;
    }
    int rep = H / KV, kp = KV < 2 ? 1 : 2, nkt = (t1 + 63) / 64;
    size_t pair = (size_t)rep * attention_ds_range_tiles(t0, t1, 0, INT_MAX) * 8192;
    int whole = !ds || ds_bytes >= (size_t)B * KV * pair, hp = whole ? KV : (int)(ds_bytes / pair);
    int ranges = !whole && hp < kp; // not kp pairs whole: kp over key ranges
    if (ranges) hp = kp;
    if (ranges && attention_ds_range_end(t0, t1, rep, kp, ds_bytes, 0) == 0)
        DIE("cuda attention (wgmma): a dS scratch of %zu bytes, under one key tile's", ds_bytes);
    att_ds_passes(B, T, H, KV, hd, whole, hp, [&](AttDsPass p) {
        if (!ranges) {
            bwd_pass<128, 128>(dq, dk, dv, (bf16s *)ds, dout, lse, D, q, k, v, B, T, H, KV, t0, t1, flags, p,
                               0, INT_MAX);
            return;
        }
        for (int j0 = 0, j1; j0 < nkt; j0 = j1) {
            j1 = attention_ds_range_end(t0, t1, rep, kp, ds_bytes, j0);
            bwd_pass<128, 128>(dq, dk, dv, (bf16s *)ds, dout, lse, D, q, k, v, B, T, H, KV, t0, t1, flags, p,
                               j0, j1);
        }
    });
    return 1;
}
