// cuda_attention_mla.cu — multi-head latent attention's op for backend "cuda" (ops.h attention_fwd_v /
// attention_bwd_v: query/key heads 192 wide, values 128 wide in rows padded to 192) and its backward on
// Hopper's wgmma. The forward is cuda_attention_wg.cu's entry (192 / 128: cuda_attention_wgf.cu's 128-key
// kernel, the 64-key one with MOE_ATTN_FWD_OLD=1); elsewhere both go to cuda_attention_tc.cu's
// attention_fwd/bwd over the padded rows.
// The backward's ways (MOE_ATTN_MLA, read at every call; each the contract and roundings of ops.h):
//   unset: att_mla_dkdv_k, one warpgroup a block of 64 keys and two blocks an SM (the old kernel's pair of
//     warpgroups ran in step, 255 registers and spills), which stores dS (bf16) in a scratch, then dQ = dS K
//     (att_wg_dqs_k<192>): 5 matrix products instead of 7. The scratch holds the dS of as many (sequence, kv
//     head) pairs as fit in MOE_ATTN_DS_MB and in 8 bytes per element of q (the two kernels run once per
//     such batch of kv heads); where not one pair fits, as "recompute";
//   "recompute": att_mla_dkdv_k without the scratch, then cuda_attention_wg.cu's dq kernel that computes S,
//     dP and dS again;
//   a number N: the scratch in passes of N kv heads of one sequence (N >= every kv head of every sequence:
//     one pass), whatever its size (for tests and measurements);
//   "old": cuda_attention_wg.cu's kernels as before this file (a pair of warpgroups of 64 keys a block; dq
//     computes dS again).
// dq's bits do not depend on the passes, nor dk's and dv's on the scratch (the same kernel writes them).
// Must not hold: any knowledge of the model.
#include <stdlib.h>
#include <string.h>
#include "ops/cuda/cuda_attention_wg.cuh"

#define MLA_HQ 192 // query/key width
#define MLA_HV 128 // value width
#define MLA_QT (3 * WG_BLK) // a 64-row tile 192 wide
#define MLA_GT (2 * WG_BLK) // 128 wide
// att_mla_dkdv_k's shared memory: K, V, Q, dout (one buffer each), lse and D, dK's rope columns' stash (a
// thread's 32 accumulators), the base's alignment. 98 KB: two blocks an SM.
#define MLA_SMEM_DKDV (MLA_QT + MLA_GT + MLA_QT + MLA_GT + 2 * 64 * 4 + 128 * 32 * 4 + 1024)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// the staged tiles of every commit group but the last N are complete and visible to wgmma (the async
// proxy) and to every thread
template <int N> __device__ __forceinline__ void stage_done_but(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
}
#endif

// dv_u += sum p_tu dout_t, dk_u += sum ds_tu q_t over the query heads of kv head kh and the queries t >= u,
// t in [qa, qb), for the 64 keys u of the block (u < qb): one warpgroup, S^T and dP^T with the keys as rows,
// the query tiles of 64 from qa (of each query head of the group in turn). Grid (ceil(qb / 64), kv heads,
// sequences). ds (or NULL): each tile's dS^T stored there for att_wg_dqs_k<192> (ds_tile's layout, with a =
// ceil(qa / 64) and nt tiles a head: the 16-byte chunks as stage_sw swizzles them, each warp store whole
// 32-byte sectors). dv's columns from 128 written as zeros (without add). The products and roundings are
// att_wg_dkdv_k<192, 128>'s in the same order. Registers: dK's first 128 columns (64 accumulators a thread)
// and dV's (64) stay in registers; dK's last 64 (the rope key's: 32) wait in shared memory while S^T and dP^T
// (32 each) are computed, back in registers for their products: 192 accumulators at most (ptxas -v: 255
// registers, 4 bytes spilled, one value reloaded a tile; with all 224 in registers it spilled 100-130 bytes
// inside the loop or serialised every wgmma).
// A tile's steps: S^T as soon as Q is in (dout still loading), dP^T, P and dS, dK's products, dV's; Q's
// next tile loads during dV's products, dout's during the next S^T's.
__global__ void __launch_bounds__(128, 2)
    att_mla_dkdv_k(float *dk, float *dv, bf16s *ds, const bf16s *dout, const float *lse, const float *Dg,
                   const bf16s *q, const bf16s *k, const bf16s *v, int T, int H, int KV, float sl, float sc,
                   int qa, int qb, int a, size_t nt, int add) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    constexpr int HQ = MLA_HQ, HV = MLA_HV, QT = MLA_QT, GT = MLA_GT;
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    uint32_t sK = (smem_u32(wg_smem) + 1023) & ~1023u, sV = sK + QT, sQ = sV + GT, sG = sQ + QT, sL = sG + GT,
             sD = sL + 64 * 4;
    const float *Ls = (const float *)(wg_smem + (sL - smem_u32(wg_smem))), *Ds = Ls + 64;
    float4 *Rs = (float4 *)(Ds + 64) + threadIdx.x; // this thread's stash: float4 j at Rs[128 j]
    int w = threadIdx.x >> 5, lane = threadIdx.x & 31, t = lane & 3;
    AttPlace pl = att_place(); // the keys from k0 (the most query tiles first)
    int b = pl.b, kh = pl.head, rep = H / KV, k0 = pl.pos * 64;
    size_t koff = ((size_t)b * T * KV + kh) * HQ;
    stage_sw<64, 128, HQ>(sK, k + koff, k0, min(64, qb - k0), (size_t)KV * HQ);
    stage_sw<64, 128, HV>(sV, v + koff, k0, min(64, qb - k0), (size_t)KV * HQ);
    int u0 = k0 + w * 16 + (lane >> 2);
    float dka[64], dva[64], dkr[32]; // dK's columns 0-127, dV's, dK's 128-191 (in the stash between)
#pragma unroll
    for (int i = 0; i < 64; i++) dka[i] = dva[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) Rs[128 * j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    // the query tiles: for each query head of the group in order, those of [qa, qb) in steps of 64 from the
    // one holding max(k0, qa) (whose tile index is max(0, k0 / 64 - a): a tile ahead of the keys reads
    // nothing)
    int m0 = max(0, k0 / 64 - a), tstart = qa + 64 * m0, per = (qb - tstart + 63) / 64, ntile = rep * per;
    // tile n's Q rows: one commit group
    // (hp, pp): a tile's head of the group and its place in the head's tiles, counted (not divided out of n)
    auto load_q = [&](int hp, int pp) {
        int hq = kh * rep + hp, t1 = tstart + pp * 64;
        stage_sw<64, 128, HQ>(sQ, q + ((size_t)b * T * H + hq) * HQ, t1, min(64, qb - t1), (size_t)H * HQ);
    };
    // tile n's dout rows, lse and D (lse and D through cp.async too, zero-filled past the last query: a plain
    // load would stall the warp at its shared-memory store): one commit group
    auto load_g = [&](int hp, int pp) {
        int hq = kh * rep + hp, t1 = tstart + pp * 64, nq = min(64, qb - t1);
        size_t lrow = ((size_t)b * H + hq) * T;
        int j = threadIdx.x & 63, ok = j < nq; // threads 0-63: lse, 64-127: D
        const float *src = (threadIdx.x < 64 ? lse : Dg) + lrow + t1 + (ok ? j : 0);
        uint32_t dst = (threadIdx.x < 64 ? sL : sD) + j * 4;
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 4 : 0));
        stage_sw<64, 128, HV>(sG, dout + ((size_t)b * T * H + hq) * HQ, t1, nq, (size_t)H * HQ);
    };
    // in flight at each tile's start: its Q, then its dout (K and V before them at the first)
    load_q(0, 0);
    load_g(0, 0);
    int th = 0, tp = 0; // tile i's
    for (int i = 0; i < ntile; i++) {
        int t0 = tstart + tp * 64, nh = tp + 1 == per ? th + 1 : th, np = tp + 1 == per ? 0 : tp + 1;
        float s[32], dp[32];
        stage_done_but<1>(); // Q (and K, V)
        wgmma_fence();
        wg_scores<HQ>(s, sK, 64, sQ, 64); // S^T: keys x queries
        wgmma_commit();
        stage_done_but<0>(); // dout, lse, D (while S^T's products run)
        wgmma_fence();
        wg_scores<HV>(dp, sV, 64, sG, 64); // dP^T
        wgmma_commit();
        wgmma_wait<0>();
        // P and dS, straight into their bf16 A fragments (wg_frags' order: a fragment's pair as soon as its
        // values are known, so that S^T's and dP^T's accumulators die as the fragments fill)
        int mask = t0 < k0 + 64 || t0 + 64 > qb; // the diagonal or the last queries
        uint32_t fp[4][4], fd[4][4];
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
#pragma unroll
            for (int i2 = 0; i2 < 4; i2++) {
                float pv[2], dv2[2];
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    int n = 8 * kk + 2 * i2 + x, c = (n >> 2) * 8 + 2 * t + (n & 1), qt = t0 + c,
                        key = (n & 2) ? u0 + 8 : u0;
                    pv[x] = !mask || (qt >= key && qt < qb) ? wg_exp2(s[n] * sl - Ls[c] * WG_LOG2E) : 0.0f;
                    dv2[x] = pv[x] * (dp[n] - Ds[c]) * sc;
                }
                fp[kk][i2] = pack_bf16(pv[0], pv[1]);
                fd[kk][i2] = pack_bf16(dv2[0], dv2[1]);
            }
        uint4 ch[2][2]; // dS^T's chunks for the scratch (rows u0 - k0, + 8; chunks 4 G + t)
        if (ds) {
            ds_chunks(ch[0], fd, 0, t);
            ds_chunks(ch[1], fd, 1, t);
        }
#pragma unroll
        for (int j = 0; j < 8; j++) *(float4 *)(dkr + 4 * j) = Rs[128 * j];
        wgmma_fence(); // dK += dS^T Q (wg_times<192>'s products, the last 64 columns into dkr), Q's last use
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            wgmma_n128_rs(dka, fd[kk][0], fd[kk][1], fd[kk][2], fd[kk][3],
                          desc_sw128(sQ + 2048 * kk, WG_BLK, 1024));
#pragma unroll
        for (int kk = 0; kk < 4; kk++)
            wgmma_n64_rs(dkr, fd[kk][0], fd[kk][1], fd[kk][2], fd[kk][3],
                         desc_sw128(sQ + 2 * WG_BLK + 2048 * kk, WG_BLK, 1024));
        wgmma_commit();
        wg_times<HV>(dva, fp, sG); // dV += P^T dout
        wgmma_commit();
        wgmma_wait<1>(); // dK's products are done
#pragma unroll
        for (int j = 0; j < 8; j++) Rs[128 * j] = *(const float4 *)(dkr + 4 * j);
        __syncthreads(); // ... in every warp: Q's buffer is free
        if (i + 1 < ntile) load_q(nh, np); // while dV's products run
        if (ds) {
            int g = lane >> 2, r = w * 16 + g;
            unsigned char *tile =
                (unsigned char *)(ds + ds_tile(b, kh * rep + th, H, m0 + tp, k0 / 64, a, nt) * 4096);
#pragma unroll
            for (int h = 0; h < 2; h++)
#pragma unroll
                for (int G = 0; G < 2; G++)
                    *(uint4 *)(tile + (r + 8 * h) * 128 + (((4 * G + t) ^ g) << 4)) = ch[h][G];
        }
        wgmma_wait<0>();
        __syncthreads(); // dV's products are done in every warp: dout's buffer (and lse's, D's) is free
        if (i + 1 < ntile) load_g(nh, np); // while the next tile's S^T runs
        th = nh, tp = np;
    }
#pragma unroll
    for (int j = 0; j < 8; j++) *(float4 *)(dkr + 4 * j) = Rs[128 * j];
    add_rows<16>(dk + koff, dka, u0, qb, (size_t)KV * HQ, t, add);
    add_rows<8>(dk + koff + 128, dkr, u0, qb, (size_t)KV * HQ, t, add);
    add_rows<16>(dv + koff, dva, u0, qb, (size_t)KV * HQ, t, add);
    float zero[32] = {}; // the value padding's columns: zeros where written, nothing added
    if (!add) add_rows<8>(dv + koff + HV, zero, u0, qb, (size_t)KV * HQ, t, 0);
#endif
}

// ---- the backward's plan

enum { MLA_DEFAULT, MLA_OLD, MLA_RECOMPUTE, MLA_PASS };

// MOE_ATTN_MLA (the file's comment): the way, and for a number the kv heads a pass.
static int mla_way(int *heads) {
    const char *e = getenv("MOE_ATTN_MLA");
    *heads = 0;
    if (!e || !*e) return MLA_DEFAULT;
    if (!strcmp(e, "old")) return MLA_OLD;
    if (!strcmp(e, "recompute")) return MLA_RECOMPUTE;
    char *end = NULL;
    long n = strtol(e, &end, 10);
    if (e[0] < '0' || e[0] > '9' || *end || n < 1 || n > 65535)
        DIE("MOE_ATTN_MLA must be 'old', 'recompute' or a number of kv heads (1-65535) a pass of the dS "
            "scratch (unset: the scratch within MOE_ATTN_DS_MB), not '%s'",
            e);
    *heads = (int)n;
    return MLA_PASS;
}

// The dk/dv kernel, then (ds) dq = dS K, over one pass (cuda_attention_wg.cuh att_ds_passes; every pointer
// at (sequence 0, head 0) of the whole call, moved by the pass's offsets).
static void mla_pass(float *dq, float *dk, float *dv, bf16s *ds, const bf16s *g, const float *lse,
                     const float *D, const bf16s *q, const bf16s *k, const bf16s *v, int T, int H, int KV,
                     int t0, int t1, int flags, AttDsPass p) {
    static int opted = 0;
    if (!opted) {
        CUDA_CHECK(
            cudaFuncSetAttribute(att_mla_dkdv_k, cudaFuncAttributeMaxDynamicSharedMemorySize, MLA_SMEM_DKDV));
        CUDA_CHECK(cudaFuncSetAttribute(att_wg_dqs_k<192>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        DqsShape<192>::SMEM));
        opted = 1;
    }
    int rep = H / KV, nq = (int)cdiv_u(t1 - t0, 64), a = (t0 + 63) / 64;
    size_t nt = (size_t)nq * (a + 1) + (size_t)nq * (nq - 1) / 2; // dS tiles a head (ds_tile)
    size_t qo = p.qo, ko = p.ko, lo = p.lo;
    float sc = 1.0f / sqrtf((float)MLA_HQ), sl = sc * WG_LOG2E;
    dim3 gk(cdiv_u(t1, 64), p.nkv, p.nb);
    att_mla_dkdv_k<<<gk, 128, MLA_SMEM_DKDV>>>(dk + ko, dv + ko, ds, g + qo, lse + lo, D + lo, q + qo, k + ko,
                                               v + ko, T, H, KV, sl, sc, t0, t1, a, nt, flags & ATT_ADD_DKV);
    KCHECK("attention_bwd_v (wgmma, dk/dv)");
    if (!ds) return;
    dim3 g2(cdiv_u(t1 - t0, DqsShape<192>::ROWS), p.nkv * rep, p.nb);
    att_wg_dqs_k<192><<<g2, DqsShape<192>::THREADS, DqsShape<192>::SMEM>>>(
        dq + qo, ds, k + ko, T, H, KV, t0, t1, a, nt, 0, INT_MAX,
        flags & ATT_ADD_DQ ? 1 : 0); // the whole triangle
    KCHECK("attention_bwd_v (wgmma, dq from dS)");
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

// The workspace: D (B, H, T) float, then dout's rows in bf16 (rounded by the rowdot kernel), then the dS
// scratch of one pass, each 256-byte aligned. The scratch's size is ops.h attention_mla_ds_bytes (its bound
// besides MOE_ATTN_DS_MB, 8 bytes per element of q), which the cost model (src/train/cost.c mla_workspace)
// also calls for the default way's bytes.
extern "C" void cuda_attention_bwd_tcv(float *dq, float *dk, float *dv, const float *dout, const void *out,
                                       const float *lse, const void *q, const void *k, const void *v, int B,
                                       int T, int H, int KV, int hd, int hv, int t0, int t1, int flags) {
    if (!wg_v_takes(B, T, H, KV, hd, hv, t0, t1, dq, dk, dv)) {
        cuda_attention_bwd_tc(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, t0, t1, flags);
        return;
    }
    // the (sequence, kv head) pairs of the default way: as many as fit (none: dS again), or MOE_ATTN_MLA's;
    // one pass over every pair, or per sequence hp kv heads at a time (ops.h attention_mla_ds_bytes)
    int heads, way = mla_way(&heads), whole = 0, hp = KV;
    size_t nds = way == MLA_DEFAULT || way == MLA_PASS
        ? attention_mla_ds_bytes(B, T, H, KV, hd, t0, t1, heads, &whole, &hp)
        : 0;
    if (way == MLA_DEFAULT) way = nds ? MLA_PASS : MLA_RECOMPUTE;
    size_t nd = ((size_t)B * H * T * sizeof(float) + 255) & ~(size_t)255, ng = (size_t)B * T * H * hd;
    size_t ngb = (ng * sizeof(bf16s) + 255) & ~(size_t)255;
    char *w =
        (char *)cuda_workspace(nds ? nd + ngb + nds : nd + ng * sizeof(bf16s)); // (no scratch: as before)
    float *D = (float *)w;
    bf16s *g = (bf16s *)(w + nd), *ds = nds ? (bf16s *)(w + nd + ngb) : NULL;
    const bf16s *qb = (const bf16s *)q, *kb = (const bf16s *)k, *vb = (const bf16s *)v;
    cuda_attention_rowdot(D, g, dout, out, 1, B, T, H, hd, t0, t1);
    if (way == MLA_OLD) {
        cuda_attention_bwd_wg(dq, dk, dv, NULL, 0, g, lse, D, qb, kb, vb, B, T, H, KV, hd, hv, t0, t1, flags);
    } else if (way == MLA_RECOMPUTE) {
        att_ds_passes(B, T, H, KV, MLA_HQ, 1, KV, [&](AttDsPass p) {
            mla_pass(dq, dk, dv, NULL, g, lse, D, qb, kb, vb, T, H, KV, t0, t1, flags, p);
        });
        cuda_attention_dq_wg(dq, g, lse, D, qb, kb, vb, B, T, H, KV, t0, t1, flags & ATT_ADD_DQ);
    } else {
        att_ds_passes(B, T, H, KV, MLA_HQ, whole, hp, [&](AttDsPass p) {
            mla_pass(dq, dk, dv, ds, g, lse, D, qb, kb, vb, T, H, KV, t0, t1, flags, p);
        });
    }
}
