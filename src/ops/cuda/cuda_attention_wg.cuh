// cuda_attention_wg.cuh — what the Hopper (wgmma, sm_90a) attention kernels share: cuda_attention_wg.cu's
// (the forward and the head-dim-128 backward) and cuda_attention_mla.cu's (latent attention's backward at
// 192 / 128): the wgmma instructions by shape, the staging of tiles into the 128-byte-swizzled layout, the
// products of a 64-row tile, the dS scratch's layout (of a pass over all keys or over a key range), its
// passes over kv heads (host side: what each pass covers), dS^T's fragments gathered for its stores, the
// kernel that multiplies it by K, and the TMA tensor maps of the kernels that load by TMA
// (cuda_attention_wgf.cu). Device code, the kernel template, the passes and the maps only. Must not hold: a
// kernel's launch, or any knowledge of the model.
#pragma once
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <limits.h>
#include <math.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_attention_softmax.cuh"
#include "ops/cuda/cuda_wgmma.cuh"

#define WG_BN 64 // keys per tile
#define WG_LOG2E 1.4426950408889634f
#define WG_BLK (64 * 128) // one 64-column block of a 64-row tile (bytes)

typedef unsigned short bf16s;

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// D (64 x 64: 32 per thread) = [D +] A (64 x 16) B (16 x 64), both from shared memory, K-major
__device__ __forceinline__ void wgmma_n64_ss(float *d, uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_R32
                 ", %32, %33, p, 1, 1, 0, 0;\n}\n"
                 : WG_D32(d, 0)
                 : "l"(da), "l"(db), "r"(scale_d));
}

// D (64 x 128: 64 per thread) += A (64 x 16, from registers: each warp's 16 rows as the
// mma.m16n8k16 A fragment) B (16 x 128, shared memory, N-major)
__device__ __forceinline__ void wgmma_n128_rs(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                              uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_R64
                 ", {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_D64(d)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}

// D (64 x 64) += A (64 x 16, from registers as above) B (16 x 64, shared memory, N-major)
__device__ __forceinline__ void wgmma_n64_rs(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                             uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 " WG_R32
                 ", {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : WG_D32(d, 0)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
}

// D (64 x 128) += A (64 x 16) B (16 x 128), both from shared memory and both M/N-major (transposed):
// A's 16 rows of K hold 64 contiguous M values, B's 16 rows 128 N values (two 64-column blocks)
__device__ __forceinline__ void wgmma_n128_ss_t(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " WG_R64
                 ", %64, %65, p, 1, 1, 1, 1;\n}\n"
                 : WG_D64(d)
                 : "l"(da), "l"(db));
}

// D (64 x 192: 96 per thread) += A (64 x 16) B (16 x 192), both from shared memory, M/N-major as
// wgmma_n128_ss_t (B's 16 rows 192 N values: three 64-column blocks)
__device__ __forceinline__ void wgmma_n192_ss_t(float *d, uint64_t da, uint64_t db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 " WG_R96
                 ", %96, %97, p, 1, 1, 1, 1;\n}\n"
                 : WG_D96(d)
                 : "l"(da), "l"(db));
}

// Stage ROWS rows (row0.., rows `stride` elements apart; rows from nvalid on zero-filled) of their
// first W bf16 (a multiple of 64) into the swizzled tile at dst: column block a (elements 64a..64a+63)
// at dst + a ROWS 128, the 16-byte chunk c of row r at chunk c ^ (r % 8); the block's NTH threads share
// the copies, chunk e = threadIdx.x + NTH i of row e / C (C chunks a row). Completes at stage_done.
// Where NTH is a multiple of 8 rows' chunks (W 128 at 128 or 256 threads), a thread's chunks keep its
// column and its rows' swizzle, so the addresses are computed once and stepped (the kernels issue one
// such call a tile: per-chunk address arithmetic was a third of the dk/dv kernel's instructions).
template <int ROWS, int NTH, int W = 128>
__device__ __forceinline__ void stage_sw(uint32_t dst, const bf16s *g, int row0, int nvalid, size_t stride) {
    constexpr int C = W / 8; // 16-byte chunks a row
    if constexpr (NTH % C == 0 && (NTH / C) % 8 == 0 && ROWS % (NTH / C) == 0) {
        constexpr int RS = NTH / C; // rows a pass
        int r = threadIdx.x / C, c16 = threadIdx.x % C;
        uint32_t d = dst + (c16 >> 3) * ROWS * 128 + r * 128 + (((c16 & 7) ^ (r & 7)) << 4);
        const bf16s *src = g + (size_t)(row0 + r) * stride + c16 * 8;
#pragma unroll
        for (int i = 0; i < ROWS / RS; i++) {
            int ok = r + i * RS < nvalid;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + i * RS * 128),
                         "l"(ok ? src + (size_t)i * RS * stride : g), "r"(ok ? 16 : 0));
        }
    } else if constexpr (W % 64 == 0 && NTH == 128 && ROWS % 16 == 0) {
        // (W 192 at 128 threads: a row's 24 chunks do not divide them) each 64-column block in turn, a
        // thread's chunk c = threadIdx.x % 8 of the rows threadIdx.x / 8 + 16 i: its swizzle the same in
        // every pass (at 256 threads, the dk/dv kernel's old way at 192, this form spilled)
        constexpr int R8 = NTH / 8; // rows a pass over one block
        int r = threadIdx.x / 8, c = threadIdx.x % 8;
        uint32_t d = dst + r * 128 + ((c ^ (r & 7)) << 4);
        const bf16s *src = g + (size_t)(row0 + r) * stride + c * 8;
#pragma unroll
        for (int blk = 0; blk < W / 64; blk++)
#pragma unroll
            for (int i = 0; i < ROWS / R8; i++) {
                int ok = r + i * R8 < nvalid;
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d + blk * ROWS * 128 +
                                                                                     i * R8 * 128),
                             "l"(ok ? src + (size_t)i * R8 * stride + blk * 64 : g), "r"(ok ? 16 : 0));
            }
    } else {
        for (int e = threadIdx.x; e < ROWS * C; e += NTH) {
            int r = e / C, c16 = e % C, blk = c16 >> 3, c = c16 & 7;
            const bf16s *src = r < nvalid ? g + (size_t)(row0 + r) * stride + c16 * 8 : g;
            uint32_t d = dst + blk * ROWS * 128 + r * 128 + ((c ^ (r & 7)) << 4);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                         "r"(r < nvalid ? 16 : 0));
        }
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
// 2^x by the special-function unit alone, results below float32's normal range flushed to 0 (exp2f's exact
// handling of those costs three more float32 ops a score; a P under 2^-126 is then 0 instead of a subnormal,
// next to the row's largest P of 1). The forward (cuda_attention_wgf.cu) and the dk/dv kernel take it.
__device__ __forceinline__ float wg_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
// A fragments (keys or queries 16 kk .. 16 kk + 15 = accumulator columns 2 kk, 2 kk + 1) from a
// 64 x 64 accumulator, rounded to bf16
__device__ __forceinline__ void wg_frags(uint32_t (*f)[4], const float *a) {
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int i = 0; i < 4; i++) f[kk][i] = pack_bf16(a[8 * kk + 2 * i], a[8 * kk + 2 * i + 1]);
}

// Row h (0, 1: rows 16 w + lane / 4 + 8 h of the 64 keys) of dS^T's A fragments f (wg_frags: the thread's
// 4 bytes at 4 t of each 16-byte chunk of 8 queries) gathered within the quad (t = lane % 4) into whole
// chunks: c[G] the chunk 4 G + t, its 4-byte words in order. Two exchanges a 4 x 4 block (chunks x
// threads): across t ^ 2 the chunks 2 (t >> 1) and + 1 are gathered in pairs of pieces, across t ^ 1 chunk
// t in full; piece p of chunk t is then the value of piece p ^ t's place, put in order by selects.
__device__ __forceinline__ void ds_chunks(uint4 *c, const uint32_t (*f)[4], int h, int t) {
    int b0 = t & 1, b1 = t >> 1;
#pragma unroll
    for (int G = 0; G < 2; G++) {
        // piece t of chunks 4 G .. 4 G + 3 (chunk 2 kk + e / 2 of row e % 2 is f[kk][e])
        uint32_t a0 = f[2 * G][h], a1 = f[2 * G][2 + h], a2 = f[2 * G + 1][h], a3 = f[2 * G + 1][2 + h];
        uint32_t k0 = b1 ? a2 : a0, k1 = b1 ? a3 : a1; // pieces t of chunks 2 b1, 2 b1 + 1
        uint32_t r0 = __shfl_xor_sync(0xffffffffu, b1 ? a0 : a2, 2), // pieces t ^ 2 of the same
            r1 = __shfl_xor_sync(0xffffffffu, b1 ? a1 : a3, 2);
        uint32_t m0 = b0 ? k1 : k0, m1 = b0 ? r1 : r0; // pieces t, t ^ 2 of chunk t
        uint32_t y0 = __shfl_xor_sync(0xffffffffu, b0 ? k0 : k1, 1), // pieces t ^ 1, t ^ 3 of chunk t
            y1 = __shfl_xor_sync(0xffffffffu, b0 ? r0 : r1, 1);
        // word p = piece p = (m0, y0, m1, y1)[p ^ t]
        uint32_t u0 = b0 ? y0 : m0, u1 = b0 ? m0 : y0, u2 = b0 ? y1 : m1, u3 = b0 ? m1 : y1;
        c[G] = b1 ? make_uint4(u2, u3, u0, u1) : make_uint4(u0, u1, u2, u3);
    }
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

// A tensor map over rows of `sheads` x ld bf16 (B, T, sheads, ld) at p, of which the first `heads` heads and
// `cols` columns are read, its rows bounded at `rows` (from there on read as zeros): boxes of 64 columns x 1
// head x box_rows rows, 128-byte swizzle (the layout of cuda_wgmma.cuh's descriptors).
static inline void att_tma_map(PFN_cuTensorMapEncodeTiled_v12000 enc, CUtensorMap *m, const bf16s *p, int B,
                               int T, int rows, int heads, int sheads, int cols, int ld, int box_rows,
                               const char *what) {
    const cuuint64_t row = (cuuint64_t)ld * 2; // bytes
    cuuint64_t dims[4] = {(cuuint64_t)cols, (cuuint64_t)heads, (cuuint64_t)rows, (cuuint64_t)B};
    cuuint64_t strides[3] = {row, (cuuint64_t)sheads * row, (cuuint64_t)T * sheads * row};
    cuuint32_t box[4] = {64, 1, (cuuint32_t)box_rows, 1}, es[4] = {1, 1, 1, 1};
    CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)p, dims, strides, box, es,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                     CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        DIE("cuTensorMapEncodeTiled failed (error %d) for attention's %s (B %d, T %d, %d of %d heads, rows < "
            "%d, %d of %d columns) at %p",
            (int)r, what, B, T, heads, sheads, rows, cols, ld, (const void *)p);
}

// One pass of the dS scratch: the kv heads [kh0, kh0 + nkv) of the sequences [b0, b0 + nb), and the
// offsets (elements) of its first sequence and head in q / dout (B, T, H, hd), k / v (B, T, KV, hd) and
// lse / D (B, H, T) that move the whole call's pointers there (the kernels index rows by T, H, KV; the
// scratch's tiles by the pass's own sequences and heads, from its start).
struct AttDsPass {
    int b0, nb, kh0, nkv;
    size_t qo, ko, lo;
};
// run(pass) for each pass: one over everything (whole), else, sequence by sequence, hp kv heads at a time
// (the last pass the rest)
template <typename F>
static inline void att_ds_passes(int B, int T, int H, int KV, int hd, int whole, int hp, F run) {
    int rep = H / KV;
    for (int b = 0; b < (whole ? 1 : B); b++)
        for (int kh = 0; kh < KV; kh += whole ? KV : hp) {
            AttDsPass p = {b, whole ? B : 1, kh, whole ? KV : (KV - kh < hp ? KV - kh : hp), 0, 0, 0};
            p.qo = ((size_t)b * T * H + (size_t)kh * rep) * hd;
            p.ko = ((size_t)b * T * KV + kh) * hd;
            p.lo = ((size_t)b * H + (size_t)kh * rep) * T;
            run(p);
        }
}

// The dS scratch (ops.h attention_ds_bytes): for each sequence b and query head h, the query tiles m of
// 64 rows from qa, each followed by its key tiles j = 0 .. a + m (a = ceil(qa / 64)), a 64 x 64 bf16
// tile each holding dS^T (the keys as rows, 64 queries of 128 bytes a row, the 16-byte chunks swizzled
// as stage_sw lays them out, so the dq kernel copies it as it is). nt: the tiles of one (b, h). A pass over
// the key tiles [j0, j0 + w) only (ops.h attention_ds_range_end) holds the query tiles m >= m0 = max(0,
// j0 - a) that see them, tile m's row its key tiles j0 .. min(j0 + w - 1, a + m): row m - m0 holds min(w,
// c + m - m0 + 1) tiles, c = a + m0 - j0 (growing by one a row, then w each; ops.h attention_ds_range_tiles
// counts them). The whole triangle is the range from j0 = 0 of any w over a + nq (the default).
__device__ __forceinline__ size_t ds_tile(int b, int h, int H, int m, int j, int a, size_t nt, int j0 = 0,
                                          int w = INT_MAX) {
    long long m0 = max(0, j0 - a), mm = m - m0, c = a + m0 - j0, r = w - c > 0 ? w - c : 0;
    long long base =
        mm <= r ? mm * (c + 1) + mm * (mm - 1) / 2 : r * (c + 1) + r * (r - 1) / 2 + (mm - r) * w;
    return ((size_t)b * H + h) * nt + (size_t)base + (size_t)(j - j0);
}


// dq += sum over the key tiles j <= a + m of dS (tile (m, j), from a dk/dv kernel) K_j for the query tiles
// m of 64 rows (the query rows [qa, qb)), over the key tiles [j0, j1) of one pass (the whole triangle: 0,
// INT_MAX; a range: the query tiles from m0 = max(0, j0 - a), the scratch laid out as ds_tile's range): a
// block of NWG warpgroups takes NWG tiles m, m + 1, .. of one head, which read the same K tiles (staged once
// for all: from L2 the kernel read dS once and K twice as many bytes at two), dS^T (M-major) and K (N-major)
// staged as they are stored, in a ring of NS buffers (NS - 1 key tiles loading while one is multiplied: the
// kernel streams the scratch from HBM). Grid (ceil((qb - qa - 64 m0) / ROWS), H, B), ROWS = 64
// NWG rows a block of 128 NWG threads, the most keys first. add: 0 dq written, 1 added into, 2 dq holds the
// sum over the key tiles before j0, which the products continue (reloaded into the accumulators: the bits
// of one pass over all of them, in the same order). Head width HD 128 (att_wg_dkdv_k's scratch) or 192
// (att_mla_dkdv_k's: one m64n192k16 a key step, 96 accumulators a thread; two blocks an SM, at 128 registers
// with 16 bytes spilled outside the loop); dq's rows HD wide. SMEM: the shared memory it takes. (At 128 the
// launch bound names no minimum of blocks: a minimum of 1 changed the kernel's machine code.)
template <int HD> struct DqsShape {
    static constexpr int KT = HD / 64 * WG_BLK; // a K tile
    static constexpr int NWG = HD == 128 ? 4 : 2; // warpgroups (query tiles) a block
    static constexpr int NS = HD == 128 ? 4 : 2; // the ring's buffers (128: one block an SM; 192: two)
    static constexpr int DT = NWG * 8192; // a ring slot's dS^T tiles, one a warpgroup
    static constexpr int ROWS = 64 * NWG, THREADS = 128 * NWG;
    static constexpr int SMEM = NS * DT + NS * KT + 1024; // NS x (dS^T of each warpgroup), NS x K
};
template <int HD>
__global__ void __launch_bounds__(DqsShape<HD>::THREADS, HD == 128 ? 0 : 2)
    att_wg_dqs_k(float *dq, const bf16s *ds, const bf16s *k, int T, int H, int KV, int qa, int qb, int a,
                 size_t nt, int j0, int j1, int add) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    typedef DqsShape<HD> S;
    constexpr int KT = S::KT, NS = S::NS, DT = S::DT;
    extern __shared__ __align__(1024) unsigned char wg_smem[];
    // NS buffers of (dS^T of each warpgroup's tile: NWG x 8 KB), then NS of K
    uint32_t sD = (smem_u32(wg_smem) + 1023) & ~1023u, sK = sD + NS * DT;
    int wg = threadIdx.x >> 7, w = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, t = lane & 3;
    AttQBlock blk = att_qblock<HD, S::ROWS, 64>(T, H, KV, qa + 64 * max(0, j0 - a), qb);
    int q0 = blk.q0, qw = q0 + 64 * wg; // this warpgroup's rows from qw (none past qb)
    int kend = qw < qb ? (min(qw + 64, qb) + 63) / 64 : 0; // and its key tiles (0 .. kend - 1)
    int nw = max(0, min(kend, j1) - j0), ntile = max(0, min(blk.ntile, j1) - j0); // of the pass
    const bf16s *kg = k + blk.koff,
                *dg = nw ? ds + ds_tile(blk.b, blk.h, H, (qw - qa) / 64, j0, a, nt, j0, j1 - j0) * 4096 : ds;
    // key tile j0 + n (K, and each warpgroup's dS^T tile copied as it is stored) into buffer n % NS, one
    // commit group (an empty one past the last tile: every step waits for the same count)
    auto load = [&](int n) {
        if (n >= ntile) {
            asm volatile("cp.async.commit_group;\n" ::);
            return;
        }
        if (n < nw) {
            const char *src = (const char *)(dg + (size_t)n * 4096);
            uint32_t dst = sD + (n % NS) * DT + wg * 8192;
            for (int e = threadIdx.x & 127; e < 512; e += 128)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + e * 16),
                             "l"(src + e * 16));
        }
        int kr = (j0 + n) * 64;
        stage_sw<64, S::THREADS, HD>(sK + (n % NS) * KT, kg, kr, min(64, qb - kr), (size_t)KV * HD);
    };
#pragma unroll
    for (int n = 0; n < NS - 1; n++) load(n);
    float acc[HD / 2];
    int row = qw + w * 16 + (lane >> 2);
    if (add == 2 && nw) load_rows<HD / 8>(acc, dq + blk.qoff, row, qb, (size_t)H * HD, t);
    else {
#pragma unroll
        for (int i = 0; i < HD / 2; i++) acc[i] = 0.0f;
    }
    for (int it = 0; it < ntile; it++) {
        // tile it is in (the NS - 2 groups after it may still load); every warp is done with tile it - 1,
        // whose buffers tile it + NS - 1 takes
        asm volatile("cp.async.wait_group %0;\n" ::"n"(NS - 2) : "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        load(it + NS - 1);
        if (it >= nw) continue; // warpgroup-uniform: the lower tile has one key tile fewer
        uint32_t d0 = sD + (it % NS) * DT + wg * 8192, k0 = sK + (it % NS) * KT;
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
            if constexpr (HD == 128)
                wgmma_n128_ss_t(acc, desc_sw128(d0 + 2048 * kk, 8192, 1024),
                                desc_sw128(k0 + 2048 * kk, 64 * 128, 1024));
            else
                wgmma_n192_ss_t(acc, desc_sw128(d0 + 2048 * kk, 8192, 1024),
                                desc_sw128(k0 + 2048 * kk, 64 * 128, 1024));
        }
        wgmma_commit();
        wgmma_wait<0>();
    }
    if (nw) add_rows<HD / 8>(dq + blk.qoff, acc, row, qb, (size_t)H * HD, t, add == 1);
#endif
    static_assert(HD == 128 || HD == 192, "att_wg_dqs_k: head width 128 or 192");
}
