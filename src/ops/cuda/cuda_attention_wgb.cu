// cuda_attention_wgb.cu — the attention backward's dk/dv kernel at head dim 128 on Hopper (sm_90a) for
// backend "cuda", FlashAttention-3's way (arXiv 2407.08608; our own code) but deterministic: no atomics, dQ
// not accumulated here. cuda_attention_wg.cu's backward calls it per pass of the dS scratch (its own
// att_wg_dkdv_k runs with MOE_ATTN_BWD_OLD=1, read at every call); dq is then dS K (cuda_attention_wg.cuh
// att_wg_dqs_k) from the scratch this kernel fills, or the dq kernel that computes dS again (no scratch).
// Same contract and roundings as att_wg_dkdv_k<128, 128> (ops.h attention_bwd: dk, dv float32, written or
// added (ATT_ADD_DKV), the query rows [qa, qb), GQA, causal; bf16 Q K V dout, P and dS rounded to bf16 for
// their products, float32 accumulation, P = exp2(s sl - lse log2 e) from the saved log-sum-exp): the same
// products in the same order per key row, so the same bits as that kernel for dk, dv and dS (the tiles of
// 64 queries and the order over the group's query heads are the same; only who computes them differs).
// A block: 128 keys of one kv head of one sequence, 3 warpgroups. Warpgroup 0 is the producer (setmaxnreg
// down to 24): its first warp loads K and V once (TMA, 4-D tensor maps over (B, rows, heads, 128), 128-byte
// swizzle, boxes of 64 columns, rows from qb on zero-filled by the map's bounds) and then, for each query
// tile of 64 rows (each query head of the group in turn, from the tile holding max(k0, qa)), Q and dout by
// TMA and lse and D by plain loads (the warp's lanes store them, zeros past qb) into a ring of WB_ST stages,
// each with a full mbarrier (the TMA bytes and the 32 lanes' arrivals) and an empty one (one arrival per
// consumer warp). Warpgroups 1 and 2 (setmaxnreg up to 240) own 64 keys each, so each staged Q / dout tile
// feeds both (half the shared-memory fill a key of the 64-key kernel), and run per tile:
//   issue S^T = K Q^T and dP^T = V dout^T (m64n64k16 x 8 each, both from shared memory); wait for S^T;
//   P^T (masked on the diagonal and past qb) while dP^T's products run; issue dV += P^T dout (P from
//   registers); wait for dP^T; dS^T = P^T (dP^T - D) / sqrt(128) while dV's products run; issue dK += dS^T Q;
//   store dS^T (bf16) to the scratch while dK's products run (cuda_attention_wg.cuh ds_chunks: whole 16-byte
//   chunks, 32-byte sectors a warp store); wait; hand the stage back.
// A tile entirely above a consumer's keys (only the block's first, for the upper warpgroup) is skipped by
// it (nothing to add, no scratch tile). The two consumers are not in lock step: one's elementwise work runs
// under the other's products. Each output written by one thread in a fixed order: deterministic.
// Must not hold: the forward, the dq kernels, any knowledge of the model.
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_attention_wg.cuh"

#define WB_KEYS 128 // keys per block: two consumer warpgroups of 64
#define WB_ST 3 // stages of the Q / dout / lse / D ring
#define WB_THREADS 384
#define WB_KT (2 * 128 * 128) // K (or V): 128 rows of two 64-column blocks (128 x 128 bytes each)
#define WB_QT (2 * WG_BLK) // a stage's Q (or dout): 64 rows of two column blocks
// shared memory: K, V, the stages' Q, dout, then lse and D (64 floats each a stage), the barriers (K/V's,
// then full and empty a stage), +1024 for the base's alignment: 64 KB + 3 x 32 KB + 3 x 512 + 56 + 1024 =
// 166,456 bytes (one block an SM)
#define WB_SMEM (1024 + 2 * WB_KT + WB_ST * 2 * WB_QT + WB_ST * 512 + 8 * (1 + 2 * WB_ST))

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// x as the compiler sees it only after the wgmma wait before this (the asynchronous products write or read
// these registers until then)
template <int N> __device__ __forceinline__ void wb_pin(float *x) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(x[i])::"memory");
}
__device__ __forceinline__ void wb_pin_f(uint32_t (*f)[4]) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("" : "+r"(f[kk][i])::"memory");
}
#endif

// dv_u += sum p_tu dout_t, dk_u += sum ds_tu q_t over the query heads of kv head kh and the queries t >= u,
// t in [qa, qb), for the 128 keys u of the block (u < qb). Grid (ceil(qb / 128), kv heads, sequences), the
// blocks with the most query tiles first (att_place). tq, tg: tensor maps of q and dout (query heads), tk,
// tv: of k and v (kv heads). ds (or NULL): each tile's dS^T (ds_tile's layout, a = ceil(qa / 64), nt tiles a
// head).
__global__ void __launch_bounds__(WB_THREADS, 1)
    att_wgb_k(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tg,
              const __grid_constant__ CUtensorMap tk, const __grid_constant__ CUtensorMap tv, float *dk,
              float *dv, bf16s *ds, const float *lse, const float *Dg, int T, int H, int KV, float sl,
              float sc, int qa, int qb, int a, size_t nt, int add) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char wb_smem[];
    const uint32_t base = (smem_u32(wb_smem) + 1023) & ~1023u, sK = base, sV = sK + WB_KT, sQ = sV + WB_KT,
                   sG = sQ + WB_ST * WB_QT, sL = sG + WB_ST * WB_QT, bkv = sL + WB_ST * 512, bst = bkv + 8;
    float *Ls = (float *)(wb_smem + (sL - smem_u32(wb_smem))); // stage s: lse at Ls[128 s], D at + 64
    const int wg = threadIdx.x >> 7, lane = threadIdx.x & 31, rep = H / KV;
    const AttPlace pl = att_place();
    const int b = pl.b, kh = pl.head, k0 = pl.pos * WB_KEYS;
    // the query tiles: for each query head of the group in order, those of [qa, qb) in steps of 64 from the
    // one holding max(k0, qa) (tile index max(0, k0 / 64 - a))
    const int m0 = max(0, k0 / 64 - a), tstart = qa + 64 * m0, per = (qb - tstart + 63) / 64,
              ntile = rep * per;
    if (threadIdx.x == 0) {
        mbar_init(bkv, 1);
        for (int s = 0; s < WB_ST; s++) {
            mbar_init(bst + 16 * s, 33); // full: the expected bytes' arrival, then each lane's (lse, D)
            mbar_init(bst + 16 * s + 8, 8); // empty: one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
        if (threadIdx.x >= 32) return;
        if (lane == 0) {
            mbar_expect_tx(bkv, 2 * WB_KT);
#pragma unroll
            for (int cb = 0; cb < 2; cb++) {
                tma_4d(sK + cb * (WB_KT / 2), &tk, 64 * cb, kh, k0, b, bkv);
                tma_4d(sV + cb * (WB_KT / 2), &tv, 64 * cb, kh, k0, b, bkv);
            }
        }
        for (int n = 0; n < ntile; n++) {
            const int s = n % WB_ST, ph = (n / WB_ST) & 1, hq = kh * rep + n / per,
                      t1 = tstart + (n % per) * 64;
            const size_t lrow = ((size_t)b * H + hq) * T + t1;
            // lse and D of rows t1 + lane, t1 + lane + 32 (zeros past qb), loaded before the wait
            float l0 = t1 + lane < qb ? lse[lrow + lane] : 0.0f,
                  l1 = t1 + lane + 32 < qb ? lse[lrow + lane + 32] : 0.0f;
            float d0 = t1 + lane < qb ? Dg[lrow + lane] : 0.0f,
                  d1 = t1 + lane + 32 < qb ? Dg[lrow + lane + 32] : 0.0f;
            const uint32_t full = bst + 16 * s;
            mbar_wait(full + 8, ph ^ 1); // (the first pass over the ring: a fresh barrier's previous phase)
            if (lane == 0) {
                mbar_expect_tx(full, 2 * WB_QT);
#pragma unroll
                for (int cb = 0; cb < 2; cb++) {
                    tma_4d(sQ + s * WB_QT + cb * WG_BLK, &tq, 64 * cb, hq, t1, b, full);
                    tma_4d(sG + s * WB_QT + cb * WG_BLK, &tg, 64 * cb, hq, t1, b, full);
                }
            }
            float *L = Ls + 128 * s;
            L[lane] = l0;
            L[lane + 32] = l1;
            L[64 + lane] = d0;
            L[96 + lane] = d1;
            mbar_arrive(full);
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    // consumer c owns the keys kw .. kw + 63; this thread key rows u0, u0 + 8 (the accumulator layout)
    const int c = wg - 1, w = (threadIdx.x >> 5) & 3, t = lane & 3, kw = k0 + 64 * c;
    const int u0 = kw + w * 16 + (lane >> 2);
    const uint32_t kb = sK + c * 64 * 128, vb = sV + c * 64 * 128; // this warpgroup's rows (each block)
    float dka[64], dva[64];
#pragma unroll
    for (int i = 0; i < 64; i++) dka[i] = dva[i] = 0.0f;
    mbar_wait(bkv, 0);
    for (int i = 0; i < ntile; i++) {
        const int s = i % WB_ST, t0 = tstart + (i % per) * 64;
        const uint32_t full = bst + 16 * s, qs = sQ + s * WB_QT, gs = sG + s * WB_QT;
        mbar_wait(full, (i / WB_ST) & 1);
        // warpgroup-uniform: every query of the tile precedes this warpgroup's keys
        if (t0 + 63 >= kw) {
            const float *Lc = Ls + 128 * s, *Dc = Lc + 64;
            float sv[32], dp[32];
            wgmma_fence();
            wg_scores<128>(sv, kb, WB_KEYS, qs, 64); // S^T: keys x queries
            wgmma_commit();
            wg_scores<128>(dp, vb, WB_KEYS, gs, 64); // dP^T
            wgmma_commit();
            wgmma_wait<1>();
            wb_pin<32>(sv);
            const int mask = t0 < kw + 64 || t0 + 64 > qb; // the diagonal or the last queries
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int cq = j * 8 + 2 * t + (e & 1), qt = t0 + cq, key = e < 2 ? u0 : u0 + 8;
                    sv[4 * j + e] = !mask || (qt >= key && qt < qb)
                        ? exp2f(sv[4 * j + e] * sl - Lc[cq] * WG_LOG2E)
                        : 0.0f;
                }
            uint32_t fp[4][4], fd[4][4];
            wg_frags(fp, sv);
            wgmma_fence();
            wg_times<128>(dva, fp, gs); // dV += P^T dout, under dS^T
            wgmma_commit();
            wgmma_wait<1>(); // dP^T is done
            wb_pin<32>(dp);
#pragma unroll
            for (int j = 0; j < 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int cq = j * 8 + 2 * t + (e & 1);
                    dp[4 * j + e] = sv[4 * j + e] * (dp[4 * j + e] - Dc[cq]) * sc;
                }
            wg_frags(fd, dp);
            wgmma_fence();
            wg_times<128>(dka, fd, qs); // dK += dS^T Q
            wgmma_commit();
            if (ds) { // dS^T's tile, rows u0 - kw (+ 8), under dK's products
                uint4 ch[2][2];
                ds_chunks(ch[0], fd, 0, t);
                ds_chunks(ch[1], fd, 1, t);
                const int g = lane >> 2, r = w * 16 + g;
                unsigned char *tile =
                    (unsigned char *)(ds +
                                      ds_tile(b, kh * rep + i / per, H, (t0 - qa) / 64, kw / 64, a, nt) *
                                          4096);
#pragma unroll
                for (int h = 0; h < 2; h++)
#pragma unroll
                    for (int G = 0; G < 2; G++)
                        *(uint4 *)(tile + (r + 8 * h) * 128 + (((4 * G + t) ^ g) << 4)) = ch[h][G];
            }
            wgmma_wait<0>();
            wb_pin<64>(dka);
            wb_pin<64>(dva);
            wb_pin_f(fp);
            wb_pin_f(fd);
        }
        __syncwarp();
        if (lane == 0) mbar_arrive(full + 8); // this warp is done with the stage
    }
    const size_t koff = ((size_t)b * T * KV + kh) * 128;
    add_rows<16>(dk + koff, dka, u0, qb, (size_t)KV * 128, t, add);
    add_rows<16>(dv + koff, dva, u0, qb, (size_t)KV * 128, t, add);
#endif
}

// 1 (the default): the dk/dv kernel at head dim 128 is att_wgb_k; 0 (MOE_ATTN_BWD_OLD=1, the A/B, read at
// every call): cuda_attention_wg.cu's att_wg_dkdv_k
static int wgb_on(void) {
    const char *e = getenv("MOE_ATTN_BWD_OLD");
    if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
        DIE("MOE_ATTN_BWD_OLD must be 0 (the attention backward's dk/dv at head dim 128 on 128-key blocks "
            "with TMA, the default) or 1 (the earlier 64-key kernel) (got '%s')",
            e);
    return !(e && !strcmp(e, "1"));
}

extern "C" int cuda_attention_dkdv_wgb(float *dk, float *dv, unsigned short *ds, const unsigned short *dout,
                                       const float *lse, const float *D, const unsigned short *q,
                                       const unsigned short *k, const unsigned short *v, int nb, int T, int H,
                                       int KV, int nkv, int t0, int t1, int flags) {
    int sms;
    void *fn;
    if (!wgb_on() || !cuda_hopper_tma(&sms, &fn) ||
        (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v | (uintptr_t)dout) & 15))
        return 0;
    PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    static int opted = 0;
    if (!opted) {
        CUDA_CHECK(cudaFuncSetAttribute(att_wgb_k, cudaFuncAttributeMaxDynamicSharedMemorySize, WB_SMEM));
        opted = 1;
    }
    int rep = H / KV, nq = (int)cdiv_u(t1 - t0, 64), a = (t0 + 63) / 64;
    size_t nt = (size_t)nq * (a + 1) + (size_t)nq * (nq - 1) / 2; // dS tiles a head (ds_tile)
    CUtensorMap tq, tg, tk, tv;
    att_tma_map(enc, &tq, q, nb, T, t1, nkv * rep, H, 128, 128, 64, "q");
    att_tma_map(enc, &tg, dout, nb, T, t1, nkv * rep, H, 128, 128, 64, "dout");
    att_tma_map(enc, &tk, k, nb, T, t1, nkv, KV, 128, 128, WB_KEYS, "k");
    att_tma_map(enc, &tv, v, nb, T, t1, nkv, KV, 128, 128, WB_KEYS, "v");
    float sc = 1.0f / sqrtf(128.0f), sl = sc * WG_LOG2E;
    dim3 grid(cdiv_u(t1, WB_KEYS), nkv, nb);
    att_wgb_k<<<grid, WB_THREADS, WB_SMEM>>>(tq, tg, tk, tv, dk, dv, (bf16s *)ds, lse, D, T, H, KV, sl, sc,
                                             t0, t1, a, nt, flags & ATT_ADD_DKV);
    KCHECK("attention_bwd (wgmma, dk/dv on 128-key blocks)");
    return 1;
}
