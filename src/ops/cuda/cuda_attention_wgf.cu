// cuda_attention_wgf.cu — the causal grouped-query attention forward on Hopper (sm_90a) for backend "cuda",
// FlashAttention-3's way (arXiv 2407.08608; our own code), at head dim 128 and at multi-head latent
// attention's query/key width 192 with value width 128 (ops.h attention_fwd_v: v's and out's rows 192 wide,
// their columns from 128 on the caller's zero padding; v's first 128 read, out's padding written as zeros):
// cuda_attention_wg.cu's cuda_attention_fwd_wg calls it at both (its own att_wg_fwd_k runs with
// MOE_ATTN_FWD_OLD=1). Same contract and roundings as that kernel (ops.h attention_fwd: out bf16, lse
// float32, query rows [qa, qb), GQA, causal; bf16 Q K V, P rounded to bf16 for the second product, float32
// softmax and accumulation, the scale 1 / sqrt(HQ)). The differences: 128-key tiles, so the online softmax's
// running max (and with it the rounding of each P to bf16) moves per 128 keys instead of 64; each exponent
// is exp2(s sl - m) with one rounding (a fused multiply-add) where the old kernel rounds s sl first; P under
// 2^-126 flushed to 0 (wg_exp2). Other bits than the old kernel's, within the same bands; the same bits
// over any split of the query rows (the key tiles start at key 0 whatever the rows) and from run to run (no
// atomics; each output written by one thread).
// A block: 128 query rows of one head, 3 warpgroups. Warpgroup 0 is the producer (setmaxnreg down to 40;
// one thread issues every load): TMA (cuda_attention_wg.cuh att_tma_map: 4-D tensor maps over (B, rows,
// heads, width), 128-byte swizzle, boxes of 64 columns, rows from qb on zero-filled by the map's bounds, so
// rows past the call's range are never read) loads Q once and K, V tiles of 128 keys into a 2-stage ring,
// each with a full and an empty mbarrier per stage (K and V apart: a K stage is handed back when S is done, a
// V stage when P V is). Q and K tiles are HQ / 64 column blocks (2 or 3), V's 2 (its first 128 columns).
// Warpgroups 1 and 2 (setmaxnreg up to 232) own 64 query rows each and run, per key tile j:
//   issue S_j = Q K_j^T (m64n128k16 x HQ / 16, both from shared memory) and O += P_{j-1} V_{j-1}
//   (m64n128k16 x 8, P from registers); wait for S_j; softmax_j (running max, row sums) while P V runs; wait
//   for P V; O *= the rescale; P_j = bf16(exp2(S_j - max)).
// (intra-warpgroup overlap: the tensor cores run P V under the softmax), and the two warpgroups take turns
// issuing their products (named barriers 1 and 2: one's softmax runs under the other's products). Both
// consumer warpgroups go over the block's every tile (a tile past all of a warpgroup's rows, only where the
// row range starts off a 128-row boundary, is masked whole: P 0, the same bits), so their turns pair up.
// The accumulators are the same at both widths (S and O 64 a thread); the kernel is a template on HQ, whose
// instance at 128 is the machine code it had before the 192 one.
// Must not hold: the 64-key or backward kernels (cuda_attention_wg.cu, _mla.cu), any knowledge of the model.
#include <cuda_bf16.h>
#include <math.h>
#include <string.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_attention_softmax.cuh" // att_qblock, quad_row_max, softmax_store
#include "ops/cuda/cuda_attention_wg.cuh" // wgmma_n128_rs (P V), wg_frags

#define AF_BM 128 // query rows per block: two consumer warpgroups of 64
#define AF_BN 128 // keys per tile
#define AF_ST 2 // stages of the K and V rings
#define AF_CB (128 * 128) // bytes of one 64-column block of a 128-row bf16 tile
#define AF_TILE (2 * AF_CB) // a 128-row tile of 128 columns (V's): two column blocks
#define AF_THREADS 384
// At query/key width HQ (128 or 192; values 128): a Q or K tile of QB column blocks, and the shared memory:
// Q, the K ring, the V ring, then the mbarriers (Q's, then 4 a stage); +1024 for the base's alignment. At
// 192: 48 + 2 x 48 + 2 x 32 KB + 1096 bytes = 214,088 of the 232,448 a block may take.
template <int HQ> struct AfShape {
    static constexpr int QB = HQ / 64, QT = QB * AF_CB;
    static constexpr int SMEM = 1024 + (1 + AF_ST) * QT + AF_ST * AF_TILE + 8 * (1 + 4 * AF_ST);
    static_assert(HQ == 128 || HQ == 192, "att_wgf_k: query/key width 128 or 192");
    static_assert(SMEM <= 232448, "att_wgf_k: over an SM's shared memory for one block");
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// S (64 x 128 float32: 64 a thread) = [S +] A (64 x 16) B (128 x 16)^T, both from shared memory, K-major
__device__ __forceinline__ void wgf_qk(float *d, uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_R64
                 ", %64, %65, p, 1, 1, 0, 0;\n}\n"
                 : WG_D64(d)
                 : "l"(da), "l"(db), "r"(scale_d));
}
// the consumer warpgroups' turns: wait for named barrier id (both warpgroups, 256 threads), or pass it
__device__ __forceinline__ void wgf_turn_wait(int id) {
    asm volatile("bar.sync %0, 256;\n" ::"r"(id) : "memory");
}
__device__ __forceinline__ void wgf_turn_pass(int id) {
    asm volatile("bar.arrive %0, 256;\n" ::"r"(id) : "memory");
}
// x as the compiler sees it only after the wgmma wait before this (the asynchronous products write or
// read these registers until then)
template <int N> __device__ __forceinline__ void wgf_pin(float *x) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(x[i])::"memory");
}
__device__ __forceinline__ void wgf_pin_p(uint32_t (*p)[4]) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) asm volatile("" : "+r"(p[kk][i])::"memory");
}
// S_j = Q K^T over the HQ columns (HQ / 16 k16 steps): Q's 64 rows at sq (column blocks AF_CB apart), the
// 128 keys at sk
template <int HQ> __device__ __forceinline__ void wgf_scores(float *s, uint32_t sq, uint32_t sk) {
#pragma unroll
    for (int kk = 0; kk < HQ / 16; kk++)
        wgf_qk(s, desc_sw128(sq + (kk >> 2) * AF_CB + 32 * (kk & 3), 16, 1024),
               desc_sw128(sk + (kk >> 2) * AF_CB + 32 * (kk & 3), 16, 1024), kk);
}
// O += P V: P as A fragments (keys 16 kk ..), V's 128 rows at sv read N-major (16 keys = 2048 bytes a step)
__device__ __forceinline__ void wgf_times(float *o, uint32_t (*p)[4], uint32_t sv) {
#pragma unroll
    for (int kk = 0; kk < 8; kk++)
        wgmma_n128_rs(o, p[kk][0], p[kk][1], p[kk][2], p[kk][3], desc_sw128(sv + 2048 * kk, AF_CB, 1024));
}
// P (64 x 128 accumulator) as A fragments rounded to bf16 (keys 16 kk .. 16 kk + 15: fragment columns 2 kk,
// 2 kk + 1): wg_frags' 64 keys twice (the accumulator's columns 64 .. 127 start at element 32)
__device__ __forceinline__ void wgf_frags(uint32_t (*p)[4], const float *s) {
    wg_frags(p, s);
    wg_frags(p + 4, s + 32);
}
// The online softmax of one 128-key tile, as cuda_attention_softmax.cuh's softmax_tile but with the scale
// folded into the exponent (one fused multiply-add a score: the max is taken over the raw scores, and
// max(s) sl is the max of the scaled ones, sl > 0; wg_exp2's flush): scores masked to -inf where the key
// follows the row or is past qb (only when mask), the running maxima m (scaled, base 2) and this thread's row
// sums l updated, s becomes exp2(s sl - m), and c0, c1 the factors O is to be rescaled by (0 on the first
// tile).
__device__ __forceinline__ void wgf_softmax(float *s, float &m0, float &m1, float &l0, float &l1, float &c0,
                                            float &c1, int mask, int k0, int r0, int r1, int qb, int t,
                                            float sl) {
    if (mask) {
#pragma unroll
        for (int j = 0; j < 16; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * t + (e & 1), row = e < 2 ? r0 : r1;
                if (!(key <= row && key < qb)) s[4 * j + e] = -INFINITY;
            }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY; // (of the raw scores)
    quad_row_max<16>(s, mx0, mx1);
    // finite: key 0 <= row is in the first tile, so the running max is finite from then on
    mx0 = fmaxf(m0, mx0 * sl);
    mx1 = fmaxf(m1, mx1 * sl);
    c0 = exp2f(m0 - mx0);
    c1 = exp2f(m1 - mx1);
    m0 = mx0;
    m1 = mx1;
    float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        s[4 * j] = wg_exp2(fmaf(s[4 * j], sl, -mx0));
        s[4 * j + 1] = wg_exp2(fmaf(s[4 * j + 1], sl, -mx0));
        s[4 * j + 2] = wg_exp2(fmaf(s[4 * j + 2], sl, -mx1));
        s[4 * j + 3] = wg_exp2(fmaf(s[4 * j + 3], sl, -mx1));
        ps0 += s[4 * j] + s[4 * j + 1];
        ps1 += s[4 * j + 2] + s[4 * j + 3];
    }
    l0 = l0 * c0 + ps0; // this thread's columns only; the quad's sum is taken at the end (softmax_store)
    l1 = l1 * c1 + ps1;
}
// a consumer warp is done with a stage: one arrival a warp on its empty barrier (count 8)
__device__ __forceinline__ void wgf_release(uint32_t bar) {
    __syncwarp();
    if ((threadIdx.x & 31) == 0) mbar_arrive(bar);
}
#endif

// Query rows [qa, qb) of each sequence against keys 0..qb-1; grid (ceil((qb-qa)/128), H, B), the blocks with
// the most keys first (att_qblock). tq, tk, tv: af_map's tensor maps of q (H heads), k and v (KV heads; v's
// first 128 columns). out's rows HQ wide: its columns from 128 on (HQ 192: the value padding) written as
// zeros.
template <int HQ>
__global__ void __launch_bounds__(AF_THREADS, 1)
    att_wgf_k(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
              const __grid_constant__ CUtensorMap tv, bf16s *out, float *lse, int T, int H, int KV, float sl,
              int qa, int qb) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ __align__(1024) unsigned char af_smem[];
    // Q, K stages, V stages; barriers: Q's at bq, then stage s's K full, V full, K empty, V empty at bs + 32
    // s
    constexpr int QB = AfShape<HQ>::QB, QT = AfShape<HQ>::QT;
    const uint32_t sQ = (smem_u32(af_smem) + 1023) & ~1023u, sK = sQ + QT, sV = sK + AF_ST * QT,
                   bq = sV + AF_ST * AF_TILE, bs = bq + 8;
    const AttQBlock blk = att_qblock<HQ, AF_BM, AF_BN>(T, H, KV, qa, qb);
    const int wg = threadIdx.x >> 7, ntile = blk.ntile;
    if (threadIdx.x == 0) {
        mbar_init(bq, 1);
        for (int s = 0; s < AF_ST; s++) {
            mbar_init(bs + 32 * s, 1); // full: the producer's arrival with the expected bytes
            mbar_init(bs + 32 * s + 8, 1);
            mbar_init(bs + 32 * s + 16, 8); // empty: one arrival per consumer warp
            mbar_init(bs + 32 * s + 24, 8);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x == 0) {
            const int kh = blk.h / (H / KV);
            mbar_expect_tx(bq, QT);
#pragma unroll
            for (int cb = 0; cb < QB; cb++) tma_4d(sQ + cb * AF_CB, &tq, 64 * cb, blk.h, blk.q0, blk.b, bq);
            for (int j = 0; j < ntile; j++) {
                const int s = j % AF_ST, ph = (j / AF_ST) & 1;
                const uint32_t kf = bs + 32 * s, vf = kf + 8, ke = kf + 16, ve = kf + 24;
                mbar_wait(ke, ph ^ 1); // (the first pass over the ring: a fresh barrier's previous phase)
                mbar_expect_tx(kf, QT);
#pragma unroll
                for (int cb = 0; cb < QB; cb++)
                    tma_4d(sK + s * QT + cb * AF_CB, &tk, 64 * cb, kh, j * AF_BN, blk.b, kf);
                mbar_wait(ve, ph ^ 1);
                mbar_expect_tx(vf, AF_TILE);
                tma_4d(sV + s * AF_TILE, &tv, 0, kh, j * AF_BN, blk.b, vf);
                tma_4d(sV + s * AF_TILE + AF_CB, &tv, 64, kh, j * AF_BN, blk.b, vf);
            }
        }
        return;
    }
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    // consumer c owns rows wrow .. wrow + 63; this thread rows r0, r1 (the accumulator layout of
    // cuda_attention_softmax.cuh), Q's rows at sq in each column block
    const int c = wg - 1, w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, t = lane & 3;
    const int wrow = blk.q0 + 64 * c, r0 = wrow + 16 * w + (lane >> 2), r1 = r0 + 8;
    const uint32_t sq = sQ + c * 64 * 128, me = 1 + c, other = 2 - c;
    float o[64], s[64], m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
    uint32_t p[8][4];
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = 0.0f;
    if (c == 1) wgf_turn_pass(1); // the first turn is consumer 0's
    mbar_wait(bq, 0);
    // tile 0: S_0 alone (O is 0: no rescale)
    wgf_turn_wait(me);
    mbar_wait(bs, 0);
    wgmma_fence();
    wgf_scores<HQ>(s, sq, sK);
    wgmma_commit();
    wgf_turn_pass(other);
    wgmma_wait<0>();
    wgf_pin<64>(s);
    wgf_release(bs + 16);
    float c0, c1;
    wgf_softmax(s, m0, m1, l0, l1, c0, c1, AF_BN > wrow || AF_BN > qb, 0, r0, r1, qb, t, sl);
    wgf_frags(p, s);
    for (int j = 1; j < ntile; j++) {
        const int sj = j % AF_ST, pj = (j - 1) % AF_ST, k0 = j * AF_BN;
        const uint32_t kf = bs + 32 * sj, vf = bs + 32 * pj + 8;
        wgf_turn_wait(me);
        mbar_wait(kf, (j / AF_ST) & 1);
        mbar_wait(vf, ((j - 1) / AF_ST) & 1);
        wgmma_fence();
        wgf_scores<HQ>(s, sq, sK + sj * QT);
        wgmma_commit();
        wgf_times(o, p, sV + pj * AF_TILE);
        wgmma_commit();
        wgf_turn_pass(other);
        wgmma_wait<1>(); // S_j is done; P_{j-1} V_{j-1} runs under the softmax
        wgf_pin<64>(s);
        wgf_release(kf + 16);
        wgf_softmax(s, m0, m1, l0, l1, c0, c1, k0 + AF_BN > wrow || k0 + AF_BN > qb, k0, r0, r1, qb, t,
                    sl); // mask: the diagonal or the last keys
        wgmma_wait<0>();
        wgf_pin<64>(o);
        wgf_pin_p(p);
        wgf_release(vf + 16);
#pragma unroll
        for (int n = 0; n < 16; n++) {
            o[4 * n] *= c0;
            o[4 * n + 1] *= c0;
            o[4 * n + 2] *= c1;
            o[4 * n + 3] *= c1;
        }
        wgf_frags(p, s);
    }
    // the last tile's P V
    const int pl = (ntile - 1) % AF_ST;
    wgf_turn_wait(me);
    mbar_wait(bs + 32 * pl + 8, ((ntile - 1) / AF_ST) & 1);
    wgmma_fence();
    wgf_times(o, p, sV + pl * AF_TILE);
    wgmma_commit();
    if (c == 0) wgf_turn_pass(other); // (consumer 1's last pass would have no taker)
    wgmma_wait<0>();
    wgf_pin<64>(o);
    softmax_store<16, HQ>(out, lse, o, m0, m1, l0, l1, r0, r1, qb, blk.b, T, H, blk.h, t);
    if constexpr (HQ > 128) { // the value padding's columns
        bf16s *o0 = out + (((size_t)blk.b * T + r0) * H + blk.h) * HQ, *o1 = o0 + (size_t)8 * H * HQ;
#pragma unroll
        for (int n = 16; n < HQ / 8; n++) {
            if (r0 < qb) *(uint32_t *)(o0 + n * 8 + 2 * t) = 0;
            if (r1 < qb) *(uint32_t *)(o1 + n * 8 + 2 * t) = 0;
        }
    }
#endif
}

// 1 (the default): the forward at 128 / 128 and 192 / 128 is att_wgf_k; 0 (MOE_ATTN_FWD_OLD=1, the A/B):
// att_wg_fwd_k
static int wgf_on(void) {
    static int v = -1;
    if (v < 0)
        v = cuda_env_switch(
            "MOE_ATTN_FWD_OLD", "0", "1",
            "the attention forward at head dim 128 and latent attention's 192 / 128 on 128-key "
            "tiles with TMA",
            "the earlier 64-key kernel");
    return v;
}

// att_wgf_k<HQ> on q, k (rows HQ wide) and v (rows HQ wide, the first 128 the values); the scale as
// att_wg_fwd_k's (1 / sqrt(HQ), base 2)
template <int HQ>
static void wgf_run(PFN_cuTensorMapEncodeTiled_v12000 enc, bf16s *out, float *lse, const bf16s *q,
                    const bf16s *k, const bf16s *v, int B, int T, int H, int KV, int t0, int t1) {
    static int opted = 0;
    if (!opted) {
        CUDA_CHECK(cudaFuncSetAttribute(att_wgf_k<HQ>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        AfShape<HQ>::SMEM));
        opted = 1;
    }
    CUtensorMap tq, tk, tv;
    att_tma_map(enc, &tq, q, B, T, t1, H, H, HQ, HQ, AF_BN, "q");
    att_tma_map(enc, &tk, k, B, T, t1, KV, KV, HQ, HQ, AF_BN, "k");
    att_tma_map(enc, &tv, v, B, T, t1, KV, KV, 128, HQ, AF_BN, "v");
    dim3 grid(cdiv_u(t1 - t0, AF_BM), H, B);
    att_wgf_k<HQ><<<grid, AF_THREADS, AfShape<HQ>::SMEM>>>(tq, tk, tv, out, lse, T, H, KV,
                                                           WG_LOG2E / sqrtf((float)HQ), t0, t1);
    KCHECK("attention_fwd (wgmma, 128-key tiles)");
}

extern "C" int cuda_attention_fwd_wgf(bf16s *out, float *lse, const bf16s *q, const bf16s *k, const bf16s *v,
                                      int B, int T, int H, int KV, int hd, int t0, int t1) {
    int sms;
    void *fn;
    if ((hd != 128 && hd != 192) || !wgf_on() || !cuda_hopper_tma(&sms, &fn) ||
        (((uintptr_t)q | (uintptr_t)k | (uintptr_t)v) & 15))
        return 0;
    PFN_cuTensorMapEncodeTiled_v12000 enc = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    if (hd == 128) wgf_run<128>(enc, out, lse, q, k, v, B, T, H, KV, t0, t1);
    else wgf_run<192>(enc, out, lse, q, k, v, B, T, H, KV, t0, t1);
    return 1;
}
