// cuda_grouped.cu — the expert GEMMs on Hopper (sm_90a): one persistent launch over all groups,
// TMA tile loads into a 4-stage shared-memory ring, wgmma (m64n256k16, bf16 in, fp32 accumulate)
// by two consumer warpgroups, a producer warpgroup issuing the loads, fp32 output (bf16 for the
// experts' hidden rows, ops.h Backend.hid).
//   C_g (rows [off[g], off[g+1]) of C, N columns) = beta * C_g + A_g . op(B_g) [+ A2_g . op(B2_g)]
//   A: the rows of all groups, row-major (rows, K) bf16 (K contiguous);
//   B: per group either (N, K) row-major (K-major: the forward, out = x W^T) or (K, N) row-major
//      (N-major: the backward's dinp = dout W); the optional second pair continues the same
//      reduction (dx = dh1 W1 + dh3 W3 in one pass over dx).
// Tiles are 128 rows x 256 columns of one group (a tile never spans two groups: its rows past the
// group's end are loaded but never stored; rows past the array and K past its end are zero-filled
// by TMA); the reduction of an output element runs in one fixed order (k-steps of 16 in order), so
// results do not depend on the grid, the group sizes around it or the weights' address.
// The weight gradients (cuda_grouped_gemm_dw) run the same pipeline with both operands MN-major and
// the reduction over each group's own rows (and, for the gradient ledger, ops.h GM_DW_SUMSQ, each warp sums
// the squares of the values it stores: gg_sq); the experts' SwiGLU rides in the epilogues
// (cuda_grouped_swiglu_fwd: h1, h3, act; cuda_grouped_swiglu_bwd: dh1, dh3 from dact in registers; both
// write and read those rows in bf16, rounded to nearest even from the float32 they compute; the forward
// stages its rows through shared memory into 16-byte stores, gg_put_rows).
// cuda_grouped_gemm returns 0 where it cannot run (no sm_90a code or GPU, shapes or alignments it
// does not take, MOE_GROUPED_GEMM=cublas); the caller then uses cuBLAS.
// Must not hold: any knowledge of the model.
#include <cuda.h>
#include <cuda_bf16.h>
#include <limits.h>
#include <string.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_stage.cuh"
#include "ops/cuda/cuda_swiglu.cuh"
#include "ops/cuda/cuda_wgmma.cuh"

typedef __nv_bfloat16 bf16;

#define GG_BM 128
#define GG_BN 256
#define GG_BK 64
#define GG_ST 4
// groups per launch: GGArgs (~2.2 KB) and the four tensor maps stay within 4 KB of kernel parameters
#define GG_MAXG 256
#define GG_THREADS 384
#define GG_A_BYTES (GG_BM * GG_BK * 2)
#define GG_B_BYTES (GG_BN * GG_BK * 2)
#define GG_SMEM (GG_ST * (GG_A_BYTES + GG_B_BYTES) + 1024 + 2 * GG_ST * 8)
#define GG_EPI_BYTES 2048 // per consumer warp: EPI_SWIGLU_FWD's staging of 16 rows x 64 columns
// only that kernel's shared memory (the rest keep L1 for themselves: measured, the weight gradients' kernel
// 2% slower)
#define GG_SMEM_STAGED (GG_SMEM + 128 + 8 * GG_EPI_BYTES)
// EPI_SWIGLU_BWD's: two buffers a consumer warp (dh1's and dh3's 64 columns), 230,592 bytes of the 232,448
#define GG_SMEM_STAGED2 (GG_SMEM + 128 + 16 * GG_EPI_BYTES)

struct GGArgs {
    float *C; // output (EPI_PLAIN, EPI_DW)
    bf16 *Cp; // EPI_DW with beta 0: the output as bf16 packed from C (ops.h GM_DW_BF16), else NULL
    double *sq; // EPI_DW with beta 0: each warp's sum of squares of the values it stored (gg_sq), else NULL
    bf16 *O1, *O2, *O3; // outputs, bf16: h1, h3, act (EPI_SWIGLU_FWD); dh1, dh3 (EPI_SWIGLU_BWD)
    const bf16 *H1, *H3; // EPI_SWIGLU_BWD: the forward's h1, h3 (ld ldc)
    int bn; // columns per tile: 256, or 128 of each of two weights (EPI_SWIGLU_FWD)
    int M; // EPI_DW: rows of each group's C (its weight gradient is (M, N))
    int nfast; // EPI_DW: tiles of a group run columns fastest (else rows)
    long long ldc;
    float beta;
    int G, N, K, K2, tiles; // K2 > 0: a second pair (A2, B2) continues the reduction (K-concat)
    int b_rows, b_rows2; // rows of one group's B (B2): N (K-major) or K (K2) (N-major)
    int tstart[GG_MAXG + 1]; // first tile of each group; tstart[G] = tiles
    int rstart[GG_MAXG + 1]; // first row of each group, counted from A's (and C's) first row
};

// ---------------------------------------------------------------- PTX wrappers
template <int TA, int TB>
__device__ __forceinline__ void wgmma_n256(float *d, uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 " WG_R128
                 ", %128, %129, p, 1, 1, %131, %132;\n}\n"
                 : WG_D128(d)
                 : "l"(da), "l"(db), "r"(scale_d), "n"(TA), "n"(TB));
}

// The group that tile t belongs to: the last group whose first tile is <= t (a binary search over
// tstart; empty groups before it, which share their successor's first tile, are skipped).
__device__ __forceinline__ int gg_group_of_tile(const GGArgs &a, int t) {
    int lo = 0, hi = a.G - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (a.tstart[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

// Tile t of the list: group g, its first row m0 (from A's first row), the group's end row and the
// first column n0. Tiles of a group run rows fastest, so CTAs side by side share B's columns.
__device__ __forceinline__ void gg_tile(const GGArgs &a, int t, int &m0, int &mend, int &n0, int &g) {
    g = gg_group_of_tile(a, t);
    int mt = (a.rstart[g + 1] - a.rstart[g] + GG_BM - 1) / GG_BM, local = t - a.tstart[g];
    m0 = a.rstart[g] + (local % mt) * GG_BM;
    mend = a.rstart[g + 1];
    n0 = (local / mt) * a.bn;
}

// Tile t of a weight-gradient launch (EPI_DW): group g, C's first row m0 and column n0, and the
// group's token rows [r0, rend) that the tile sums over.
__device__ __forceinline__ void gg_tile_dw(const GGArgs &a, int t, int &m0, int &n0, int &r0, int &rend,
                                           int &g) {
    g = gg_group_of_tile(a, t);
    int mt = (a.M + GG_BM - 1) / GG_BM, nt = (a.N + GG_BN - 1) / GG_BN, local = t - a.tstart[g];
    m0 = (a.nfast ? local / nt : local % mt) * GG_BM;
    n0 = (a.nfast ? local % nt : local / mt) * GG_BN;
    r0 = a.rstart[g];
    rend = a.rstart[g + 1];
}

// Epilogues. EPI_PLAIN: C = acc + beta C. EPI_SWIGLU_FWD (B = 128 rows of W1 then 128 of W3, so a
// thread holds h1 and h3 of the same elements in acc[j] and acc[j + 64]): h1, h3 and
// act = silu(h1) h3. EPI_SWIGLU_BWD (acc = dact = dout W2): dh1, dh3 from dact and the forward's h1,
// h3. The SwiGLU arithmetic is cuda_swiglu.cuh's, which cuda_elementwise.cu's plain kernels use too, so the
// fused results are the unfused ops' bits.
// EPI_DW: C_g (M, N) += dout_g^T x_g: A is dout (rows, M) read M-major, B is x (rows, N) N-major,
// the reduction runs over the group's own rows (the last step's rows past the group are zeroed in
// shared memory: they belong to the next group).
enum { EPI_PLAIN, EPI_SWIGLU_FWD, EPI_SWIGLU_BWD, EPI_DW };

// EPI_SWIGLU_BWD's operands from the forward: a warp's 16 rows (from rw) x 64 columns (from col0) of h1 and
// h3, 16 bytes a lane and instruction (rows 4i + lane / 8, chunk lane % 8: gg_stage_rows' order; zeros
// outside the group's rows or past N)
__device__ __forceinline__ void gg_load_h16(uint4 (&g1)[4], uint4 (&g3)[4], const GGArgs &a, int rw, int col0,
                                            int mend, int lane) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int row = rw + 4 * i + (lane >> 3), col = col0 + 8 * (lane & 7);
        g1[i] = g3[i] = make_uint4(0, 0, 0, 0);
        if (row >= mend || col >= a.N) continue;
        long long o = (long long)row * a.ldc + col;
        g1[i] = *(const uint4 *)(a.H1 + o);
        g3[i] = *(const uint4 *)(a.H3 + o);
    }
}
// EPI_DW's ledger (ops.h GM_DW_SUMSQ): a warp's sum of squares of the values it stored in the block's tiles,
// q a thread's (per tile float sums of 32 squares each added in double: the packed output's as its 64-column
// groups are stored, the float32 one's from acc after its stores, cuda_wgmma.cuh wg_frag_sumsq; each way
// measured the faster for its output; the tiles in the block's order), summed over the warp by a fixed
// butterfly into sq[8 b + 4 c + wq] (b the block): every warp of every block writes its slot, so all the
// caller's are written.
__device__ __forceinline__ void gg_sq(const GGArgs &a, double q, int b, int c, int wq, int lane) {
    q = warp_sum_d(q);
    if (lane == 0) a.sq[8 * (size_t)b + 4 * c + wq] = q;
}

// NMAJ: B is N-major (K, N) per group (else K-major (N, K)). EPI: the epilogue (above).
template <int NMAJ, int EPI>
__global__ void __launch_bounds__(GG_THREADS, 1)
    gg_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
              const __grid_constant__ CUtensorMap tmA2, const __grid_constant__ CUtensorMap tmB2,
              const __grid_constant__ GGArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    uint32_t base = (smem_u32(smem_raw) + 1023) & ~1023u; // 128B-swizzled tiles: 1024-byte aligned
    uint32_t sA = base, sB = base + GG_ST * GG_A_BYTES, full = sB + GG_ST * GG_B_BYTES,
             empty = full + GG_ST * 8;
    uint32_t epi =
        (empty + GG_ST * 8 + 127) & ~127u; // the consumer warps' staging buffers (GG_EPI_BYTES each)
    int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < GG_ST; s++) {
            mbar_init(full + 8 * s, 1); // the producer's expect_tx; the bytes complete it
            mbar_init(empty + 8 * s, 8); // one arrival per consumer warp
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    const int KT1 = (a.K + GG_BK - 1) / GG_BK, KT = KT1 + (a.K2 + GG_BK - 1) / GG_BK;
    if (wg == 0) { // producer: one thread issues every load
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        if (threadIdx.x != 0) return;
        int s = 0, ph = 0;
        for (int t = blockIdx.x; t < a.tiles; t += gridDim.x) {
            int m0, mend, n0, g, r0 = 0, rend = 0, KTt = KT;
            if (EPI == EPI_DW) {
                gg_tile_dw(a, t, m0, n0, r0, rend, g);
                KTt = (rend - r0 + GG_BK - 1) / GG_BK;
            } else {
                gg_tile(a, t, m0, mend, n0, g);
            }
            for (int kt = 0; kt < KTt; kt++) {
                mbar_wait(empty + 8 * s, ph ^ 1);
                uint32_t fb = full + 8 * s;
                mbar_expect_tx(fb, GG_A_BYTES + GG_B_BYTES);
                if (EPI == EPI_DW) { // A: two 64-wide column blocks of dout; B: four of x; rows r0 + 64 kt
                    int rk = r0 + kt * GG_BK;
                    for (int i = 0; i < GG_BM / 64; i++)
                        tma_2d(sA + s * GG_A_BYTES + i * 8192, &tmA, m0 + 64 * i, rk, fb);
                    for (int j = 0; j < GG_BN / 64; j++)
                        tma_2d(sB + s * GG_B_BYTES + j * 8192, &tmB, n0 + 64 * j, rk, fb);
                    if (++s == GG_ST) {
                        s = 0;
                        ph ^= 1;
                    }
                    continue;
                }
                int second = kt >= KT1, k0 = (second ? kt - KT1 : kt) * GG_BK,
                    br = second ? a.b_rows2 : a.b_rows;
                const CUtensorMap *ma = second ? &tmA2 : &tmA, *mb = second ? &tmB2 : &tmB;
                tma_2d(sA + s * GG_A_BYTES, ma, k0, m0, fb);
                if (NMAJ) {
                    for (int j = 0; j < GG_BN / 64; j++)
                        tma_2d(sB + s * GG_B_BYTES + j * 64 * GG_BK * 2, mb, n0 + 64 * j, g * br + k0, fb);
                } else if (EPI == EPI_SWIGLU_FWD) { // W1's 128 rows, then W3's (same rows)
                    tma_2d(sB + s * GG_B_BYTES, &tmB, k0, g * br + n0, fb);
                    tma_2d(sB + s * GG_B_BYTES + GG_B_BYTES / 2, &tmB2, k0, g * br + n0, fb);
                } else {
                    tma_2d(sB + s * GG_B_BYTES, mb, k0, g * br + n0, fb);
                }
                if (++s == GG_ST) {
                    s = 0;
                    ph ^= 1;
                }
            }
        }
        return;
    }
    // consumers: warpgroup c = wg - 1 owns rows [64c, 64c + 64) of the tile
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1, wq = (threadIdx.x % 128) / 32;
    float acc[128];
    double sq_acc = 0; // (EPI_DW's ledger: this thread's stored squares over the block's tiles)
    int s = 0, ph = 0;
    for (int t = blockIdx.x; t < a.tiles; t += gridDim.x) {
        int m0, mend, n0, g, r0 = 0, rend = 0, KTt = KT;
        float *Cb = a.C;
        bf16 *Cpb = NULL;
        if (EPI == EPI_DW) {
            gg_tile_dw(a, t, m0, n0, r0, rend, g);
            KTt = (rend - r0 + GG_BK - 1) / GG_BK;
            mend = a.M;
            Cb = a.C + (long long)g * a.M * a.N;
            if (a.Cp) Cpb = a.Cp + (long long)g * a.M * a.N;
        } else {
            gg_tile(a, t, m0, mend, n0, g);
        }
        int prev = 0;
        for (int kt = 0; kt < KTt; kt++) {
            mbar_wait(full + 8 * s, ph);
            uint32_t pa = sA + s * GG_A_BYTES + c * 64 * 128, pb = sB + s * GG_B_BYTES;
            if (EPI == EPI_DW) {
                // rows of this step past the group's end belong to the next group: zero them in my
                // half of A (the whole 128-byte row, whatever the swizzle), so they add nothing
                int valid = rend - (r0 + kt * GG_BK);
                if (valid < GG_BK) {
                    for (int i = threadIdx.x % 128; i < (GG_BK - valid) * 8; i += 128)
                        asm volatile(
                            "st.shared.v4.u32 [%0], {%1, %1, %1, %1};\n" ::"r"(pa + valid * 128 + i * 16),
                            "r"(0)
                            : "memory");
                    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                    if (c == 0) asm volatile("bar.sync 1, 128;\n" ::: "memory"); // this warpgroup only
                    else asm volatile("bar.sync 2, 128;\n" ::: "memory");
                }
            }
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < GG_BK / 16; kk++) {
                uint64_t da = EPI == EPI_DW ? desc_sw128(pa + 2048 * kk, 8192, 1024)
                                            : desc_sw128(pa + 32 * kk, 16, 1024);
                uint64_t db = NMAJ ? desc_sw128(pb + 2048 * kk, 64 * GG_BK * 2, 1024)
                                   : desc_sw128(pb + 32 * kk, 16, 1024);
                wgmma_n256<EPI == EPI_DW, NMAJ>(acc, da, db, kt | kk);
            }
            wgmma_commit();
            if (kt > 0) { // the previous stage's MMAs are done: hand it back
                wgmma_wait<1>();
                if (lane == 0) mbar_arrive(empty + 8 * prev);
            }
            prev = s;
            if (++s == GG_ST) {
                s = 0;
                ph ^= 1;
            }
        }
        // accumulator fragment: rows wq*16 + lane/4 (+8), columns 8j + 2*(lane%4) (+1)
        int r = m0 + c * 64 + wq * 16 + lane / 4, cb = n0 + 2 * (lane % 4);
        if (EPI == EPI_SWIGLU_BWD) {
            // dh1, dh3 from dact (acc) and the forward's h1, h3, 64 columns at a time: a group's h1 and h3
            // come in 16-byte loads (8 lanes a 128-byte row; the first group's before the last MMAs are
            // waited for, each next one as the registers are staged), go through the warp's two staging
            // buffers to the fragments' layout (ldmatrix), and dh1, dh3 go back into the same places
            // (stmatrix) and out in 16-byte stores
            const int rw = m0 + c * 64 + wq * 16;
            const uint32_t b1 = epi + (c * 4 + wq) * 2 * GG_EPI_BYTES, b3 = b1 + GG_EPI_BYTES;
            uint4 g1[4], g3[4];
            gg_load_h16(g1, g3, a, rw, n0, mend, lane);
            wgmma_wait<0>();
            if (lane == 0) mbar_arrive(empty + 8 * prev);
#pragma unroll
            for (int jb = 0; jb < GG_BN / 8; jb += 8) {
                gg_stage_rows(b1, g1, lane);
                gg_stage_rows(b3, g3, lane);
                __syncwarp();
                if (jb + 8 < GG_BN / 8) gg_load_h16(g1, g3, a, rw, n0 + 8 * (jb + 8), mend, lane);
#pragma unroll
                for (int jj = 0; jj < 8; jj += 2) {
                    uint32_t e1[4], e3[4], p1[4],
                        p3[4]; // matrices (jj, +0), (jj, +8), (jj + 1, +0), (jj + 1, +8)
                    gg_unstage_pair(b1, jj, e1, lane);
                    gg_unstage_pair(b3, jj, e3, lane);
#pragma unroll
                    for (int m = 0; m < 4; m++) {
                        int e = 4 * (jb + jj + (m >> 1)) + 2 * (m & 1);
                        float2 h1 = bf2_f2(e1[m]), h3 = bf2_f2(e3[m]), d1, d3;
                        swiglu_grad(acc[e], h1.x, h3.x, &d1.x, &d3.x);
                        swiglu_grad(acc[e + 1], h1.y, h3.y, &d1.y, &d3.y);
                        p1[m] = pack_bf16(d1.x, d1.y);
                        p3[m] = pack_bf16(d3.x, d3.y);
                    }
                    gg_stage_pair(b1, jj, p1[0], p1[1], p1[2], p1[3], lane);
                    gg_stage_pair(b3, jj, p3[0], p3[1], p3[2], p3[3], lane);
                }
                int col0 = n0 + 8 * jb, nch = (a.N - col0) / 8;
                long long o = (long long)rw * a.ldc + col0;
                gg_flush_rows(a.O1 + o, a.ldc, mend - rw, nch, b1, lane);
                gg_flush_rows(a.O2 + o, a.ldc, mend - rw, nch, b3, lane);
            }
            continue;
        }
        wgmma_wait<0>();
        if (lane == 0) mbar_arrive(empty + 8 * prev);
        if (EPI == EPI_SWIGLU_FWD) { // act, h1, h3 of 64 columns at a time through the warp's staging buffer
            const int rw = m0 + c * 64 + wq * 16;
            const uint32_t buf = epi + (c * 4 + wq) * GG_EPI_BYTES;
#pragma unroll
            for (int jb = 0; jb < 16; jb += 8) {
                int col0 = n0 + 8 * jb, nch = (a.N - col0) / 8;
                long long o = (long long)rw * a.ldc + col0;
                uint32_t v[8][2];
#pragma unroll
                for (int jj = 0; jj < 8; jj++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        int e = 4 * (jb + jj) + 2 * h;
                        v[jj][h] = pack_bf16(swiglu_silu_mul(acc[e], acc[64 + e]),
                                             swiglu_silu_mul(acc[e + 1], acc[64 + e + 1]));
                    }
                gg_put_rows(a.O3 + o, a.ldc, mend - rw, nch, v, buf, lane);
#pragma unroll
                for (int jj = 0; jj < 8; jj++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        v[jj][h] = pack_bf16(acc[4 * (jb + jj) + 2 * h], acc[4 * (jb + jj) + 2 * h + 1]);
                gg_put_rows(a.O1 + o, a.ldc, mend - rw, nch, v, buf, lane);
#pragma unroll
                for (int jj = 0; jj < 8; jj++)
#pragma unroll
                    for (int h = 0; h < 2; h++)
                        v[jj][h] =
                            pack_bf16(acc[64 + 4 * (jb + jj) + 2 * h], acc[64 + 4 * (jb + jj) + 2 * h + 1]);
                gg_put_rows(a.O2 + o, a.ldc, mend - rw, nch, v, buf, lane);
            }
            continue;
        }
        if (EPI == EPI_DW && Cpb) { // bf16, packed (beta 0): 64 columns at a time through the warp's staging
            // buffer into 16-byte stores (the fragment's own 4-byte stores fill half a sector a row: measured
            // no faster than the float32 ones, 2026-12-02)
            const int rw = m0 + c * 64 + wq * 16;
            const uint32_t buf = epi + (c * 4 + wq) * GG_EPI_BYTES;
            double q = 0;
#pragma unroll
            for (int jb = 0; jb < GG_BN / 8; jb += 8) {
                int col0 = n0 + 8 * jb, nch = (a.N - col0) / 8;
                uint32_t v[8][2];
                float qf = 0.0f;
#pragma unroll
                for (int jj = 0; jj < 8; jj++)
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        v[jj][h] = pack_bf16(acc[4 * (jb + jj) + 2 * h], acc[4 * (jb + jj) + 2 * h + 1]);
                        if (a.sq && r + 8 * h < mend && col0 < a.N && jj < nch) { // (stored: gg_put_rows)
                            float2 f = bf2_f2(v[jj][h]);
                            qf += f.x * f.x + f.y * f.y;
                        }
                    }
                q += qf;
                if (col0 < a.N)
                    gg_put_rows(Cpb + (long long)rw * a.ldc + col0, a.ldc, mend - rw, nch, v, buf, lane);
            }
            sq_acc += q;
            continue;
        }
        // EPI_PLAIN with beta reads C: a few column groups at a time, all loads before the stores (one
        // memory round trip per group instead of one per value; measured: a beta = 1 GEMM loading
        // before each store took 2.6x as long)
        const int CH = 8;
#pragma unroll
        for (int j0 = 0; j0 < GG_BN / 8; j0 += CH) {
            float2 cv[CH][2];
#pragma unroll
            for (int j = 0; j < CH; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int row = r + 8 * h, col = cb + 8 * (j0 + j);
                    cv[j][h] = make_float2(0.0f, 0.0f);
                    if (row < mend && col < a.N && a.beta != 0.0f)
                        cv[j][h] = *(const float2 *)(Cb + (long long)row * a.ldc + col);
                }
#pragma unroll
            for (int j = 0; j < CH; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int row = r + 8 * h, col = cb + 8 * (j0 + j);
                    if (row >= mend || col >= a.N) continue;
                    float2 v = make_float2(acc[4 * (j0 + j) + 2 * h], acc[4 * (j0 + j) + 2 * h + 1]);
                    if (a.beta != 0.0f) {
                        v.x += a.beta * cv[j][h].x;
                        v.y += a.beta * cv[j][h].y;
                    }
                    *(float2 *)(Cb + (long long)row * a.ldc + col) = v;
                }
        }
        if (EPI == EPI_DW && a.sq)
            sq_acc += wg_frag_sumsq<GG_BN / 8>(acc, r, cb, a.M, a.N); // (beta 0: acc stored)
    }
    if (EPI == EPI_DW && a.sq) gg_sq(a, sq_acc, blockIdx.x, c, wq, lane);
#endif
}

// ---------------------------------------------------------------- host
typedef CUresult (*EncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                CUtensorMapFloatOOBfill);
static int g_ready = -1; // -1 not yet asked, 0 cuBLAS, 1 this kernel
static int g_sms;
static EncodeTiled g_encode;

static int gg_init(void) {
    if (g_ready >= 0) return g_ready;
    g_ready = 0;
    // MOE_GROUPED_GEMM: unset or "auto": this kernel where it runs; "cublas": never (the trainer
    // refuses other values before it starts; a bench or test gets the same message here)
    const char *e = getenv("MOE_GROUPED_GEMM");
    if (e && *e && strcmp(e, "auto") && strcmp(e, "cublas"))
        DIE("MOE_GROUPED_GEMM must be auto (the default) or cublas, not '%s'", e);
    if (e && !strcmp(e, "cublas")) return 0;
    void *fn;
    if (!cuda_hopper_tma(&g_sms, &fn)) return 0;
    g_encode = (EncodeTiled)fn;
    CUDA_CHECK(
        cudaFuncSetAttribute(gg_kernel<0, EPI_PLAIN>, cudaFuncAttributeMaxDynamicSharedMemorySize, GG_SMEM));
    CUDA_CHECK(
        cudaFuncSetAttribute(gg_kernel<1, EPI_PLAIN>, cudaFuncAttributeMaxDynamicSharedMemorySize, GG_SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(gg_kernel<0, EPI_SWIGLU_FWD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    GG_SMEM_STAGED));
    CUDA_CHECK(cudaFuncSetAttribute(gg_kernel<1, EPI_SWIGLU_BWD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    GG_SMEM_STAGED2));
    CUDA_CHECK(cudaFuncSetAttribute(gg_kernel<1, EPI_DW>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    GG_SMEM_STAGED));
    g_ready = 1;
    return 1;
}

extern "C" int backend_cuda_grouped_kernel(void) { return gg_init(); }

// A 2-D bf16 tensor map over (rows, cols) row-major at p, boxes of box_rows x 64 columns, 128-byte swizzle.
static void tmap_2d(CUtensorMap *m, const bf16 *p, uint64_t rows, uint64_t cols, uint32_t box_rows) {
    cuuint64_t dims[2] = {cols, rows}, strides[1] = {cols * sizeof(bf16)};
    cuuint32_t box[2] = {64, box_rows}, es[2] = {1, 1};
    CUresult r = g_encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void *)p, dims, strides, box, es,
                          CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        DIE("cuTensorMapEncodeTiled failed (error %d) for a (%llu, %llu) bf16 operand at %p", (int)r,
            (unsigned long long)rows, (unsigned long long)cols, (const void *)p);
}

// The tile list and shape fields of a for one launch, or 0 where the kernel does not take the call
// (then nothing is written). al: the OR of every operand address (16-byte alignment for TMA) and
// output address (8 bytes for float2 stores, 16 for the staged rows of EPI_SWIGLU_FWD and EPI_SWIGLU_BWD,
// and for EPI_SWIGLU_BWD's h1 and h3, read as 16-byte rows). K (K2): the reduction lengths; N: output
// columns; bn: columns per tile; nmajor_b: B is (K, N) per group.
static int gg_setup(GGArgs *a, uintptr_t al, const int64_t *off, int G, int K, int K2, int N, long long ldc,
                    int bn, int nmajor_b) {
    if (!gg_init()) return 0;
    int64_t rows = off[G] - off[0];
    if (G < 1 || G > GG_MAXG || K <= 0 || K2 < 0 || N <= 0 || K % 8 || K2 % 8 || N % 8 || ldc % 2 ||
        rows <= 0 || rows > INT_MAX - GG_BM || (al & 15) ||
        (int64_t)G * (nmajor_b ? (K > K2 ? K : K2) : N) > INT_MAX)
        return 0;
    memset(a, 0, sizeof *a);
    a->ldc = ldc;
    a->G = G;
    a->N = N;
    a->K = K;
    a->K2 = K2;
    a->bn = bn;
    a->b_rows = nmajor_b ? K : N;
    a->b_rows2 = nmajor_b ? K2 : N;
    int nt = (N + bn - 1) / bn;
    long long tiles = 0;
    for (int g = 0; g < G; g++) {
        a->tstart[g] = (int)tiles;
        a->rstart[g] = (int)(off[g] - off[0]);
        tiles += (off[g + 1] - off[g] + GG_BM - 1) / GG_BM * nt;
    }
    if (tiles > INT_MAX) return 0;
    a->tstart[G] = (int)tiles;
    a->rstart[G] = (int)rows;
    a->tiles = (int)tiles;
    return 1;
}

// B's tensor map: per group (rows, cols) = (N, K) K-major with boxes of box_rows rows, or (K, N) N-major
static void tmap_b(CUtensorMap *m, const void *B, int G, int K, int N, int nmajor_b, uint32_t box_rows) {
    if (nmajor_b) tmap_2d(m, (const bf16 *)B, (uint64_t)G * K, (uint64_t)N, 64);
    else tmap_2d(m, (const bf16 *)B, (uint64_t)G * N, (uint64_t)K, box_rows);
}

static GGArgs g_args; // ~1 KB: not on the stack; copied into each launch's parameters

// C rows [0, off[G] - off[0]) (ld ldc) = beta C + A . op(B) [+ A2 . op(B2)] per group, A's rows
// counted from off[0] (see the top of this file). K (K2): the reduction length of A, B (A2, B2; 0
// without them); N: C's columns. Returns 1 when done (queued), 0 when it cannot run here (the
// caller falls back; nothing was written).
extern "C" int cuda_grouped_gemm(float *C, long long ldc, float beta, const void *A, const void *B,
                                 const void *A2, const void *B2, int nmajor_b, const int64_t *off, int G,
                                 int K, int K2, int N) {
    GGArgs *a = &g_args;
    if (K2 > 0 && (!A2 || !B2)) return 0;
    uintptr_t al =
        (uintptr_t)A | (uintptr_t)B | ((uintptr_t)C & 7) | (K2 > 0 ? (uintptr_t)A2 | (uintptr_t)B2 : 0);
    if (!gg_setup(a, al, off, G, K, K2, N, ldc, GG_BN, nmajor_b)) return 0;
    a->C = C;
    a->beta = beta;
    int64_t rows = off[G] - off[0];
    CUtensorMap ta, tb, ta2, tb2;
    tmap_2d(&ta, (const bf16 *)A, (uint64_t)rows, (uint64_t)K, GG_BM);
    tmap_b(&tb, B, G, K, N, nmajor_b, GG_BN);
    ta2 = ta;
    tb2 = tb;
    if (K2 > 0) {
        tmap_2d(&ta2, (const bf16 *)A2, (uint64_t)rows, (uint64_t)K2, GG_BM);
        tmap_b(&tb2, B2, G, K2, N, nmajor_b, GG_BN);
    }
    int grid = a->tiles < g_sms ? a->tiles : g_sms;
    if (nmajor_b) gg_kernel<1, EPI_PLAIN><<<grid, GG_THREADS, GG_SMEM>>>(ta, tb, ta2, tb2, *a);
    else gg_kernel<0, EPI_PLAIN><<<grid, GG_THREADS, GG_SMEM>>>(ta, tb, ta2, tb2, *a);
    KCHECK("grouped_gemm (wgmma)");
    return 1;
}

// The experts' up-projection with SwiGLU in the epilogue: per group h1 = x W1^T, h3 = x W3^T,
// act = silu(h1) h3 (rows of x from off[0]; outputs (rows, O) bf16 from their row off[0]). x (rows, K),
// W1, W3 (G, O, K) bf16. 1 when queued, 0 when not taken (nothing written).
extern "C" int cuda_grouped_swiglu_fwd(void *h1, void *h3, void *act, const void *x, const void *w1,
                                       const void *w3, const int64_t *off, int G, int K, int O) {
    GGArgs *a = &g_args;
    uintptr_t al = (uintptr_t)x | (uintptr_t)w1 | (uintptr_t)w3 | (uintptr_t)h1 | (uintptr_t)h3 |
        (uintptr_t)act; // 16-byte stores
    if (!gg_setup(a, al, off, G, K, 0, O, O, GG_BN / 2, 0)) return 0;
    int64_t base = off[0], rows = off[G] - off[0];
    a->O1 = (bf16 *)h1 + base * O;
    a->O2 = (bf16 *)h3 + base * O;
    a->O3 = (bf16 *)act + base * O;
    CUtensorMap ta, tb, tb2;
    tmap_2d(&ta, (const bf16 *)x, (uint64_t)rows, (uint64_t)K, GG_BM);
    tmap_b(&tb, w1, G, K, O, 0, GG_BN / 2);
    tmap_b(&tb2, w3, G, K, O, 0, GG_BN / 2);
    int grid = a->tiles < g_sms ? a->tiles : g_sms;
    gg_kernel<0, EPI_SWIGLU_FWD><<<grid, GG_THREADS, GG_SMEM_STAGED>>>(ta, tb, ta, tb2, *a);
    KCHECK("grouped_swiglu_fwd (wgmma)");
    return 1;
}

// The down-projection's dinp into the SwiGLU backward: dact = dout W_g (dout (rows, O), W (G, O, K)
// bf16; never stored), then dh1, dh3 (rows, K) = swiglu_bwd(dact, h1, h3), overwritten; h1, h3, dh1,
// dh3 bf16. 1 when queued, 0 when not taken (nothing written).
extern "C" int cuda_grouped_swiglu_bwd(void *dh1, void *dh3, const void *h1, const void *h3, const void *dout,
                                       const void *w, const int64_t *off, int G, int K, int O) {
    GGArgs *a = &g_args;
    uintptr_t al = (uintptr_t)dout | (uintptr_t)w | (uintptr_t)dh1 | (uintptr_t)dh3 | (uintptr_t)h1 |
        (uintptr_t)h3; // (16-byte loads and stores)
    if (!gg_setup(a, al, off, G, O, 0, K, K, GG_BN, 1)) return 0;
    int64_t base = off[0], rows = off[G] - off[0];
    a->O1 = (bf16 *)dh1 + base * K;
    a->O2 = (bf16 *)dh3 + base * K;
    a->H1 = (const bf16 *)h1 + base * K;
    a->H3 = (const bf16 *)h3 + base * K;
    CUtensorMap ta, tb;
    tmap_2d(&ta, (const bf16 *)dout, (uint64_t)rows, (uint64_t)O, GG_BM);
    tmap_b(&tb, w, G, O, K, 1, GG_BN);
    int grid = a->tiles < g_sms ? a->tiles : g_sms;
    gg_kernel<1, EPI_SWIGLU_BWD><<<grid, GG_THREADS, GG_SMEM_STAGED2>>>(ta, tb, ta, tb, *a);
    KCHECK("grouped_swiglu_bwd (wgmma)");
    return 1;
}

// The weight gradients: dw_g (O, K) += dout_g^T x_g over each group's rows (dout (rows, O), x (rows,
// K) bf16, rows from off[0]; dw (G, O, K) float32), or dw_g = ... with beta 0. Groups without rows are not
// touched. 1 when queued, 0 when not taken (nothing written).
extern "C" int cuda_grouped_gemm_dw(float *dw, float beta, int packed, int sumsq, const void *dout,
                                    const void *x, const int64_t *off, int G, int K, int O) {
    GGArgs *a = &g_args;
    if (!gg_init()) return 0;
    CHECK(!packed || beta == 0.0f, "grouped_gemm_dw: a packed bf16 output is written, never accumulated");
    CHECK(!sumsq || beta == 0.0f, "grouped_gemm_dw: the ledger's sums are of a written output (beta 0)");
    int64_t rows = off[G] - off[0];
    uintptr_t al =
        (uintptr_t)dout | (uintptr_t)x | ((uintptr_t)dw & (packed ? 15 : 7)); // (packed: 16-byte stores)
    if (G < 1 || G > GG_MAXG || K <= 0 || O <= 0 || K % 8 || O % 8 || rows <= 0 || rows > INT_MAX - GG_BK ||
        (al & 15))
        return 0;
    memset(a, 0, sizeof *a);
    a->C = dw;
    a->Cp = packed ? (bf16 *)dw : NULL;
    a->ldc = K;
    a->beta = beta;
    a->G = G;
    a->M = O;
    a->N = K;
    a->bn = GG_BN;
    // the tiles side by side on the GPU share a block of the operand that varies slowest and cycle
    // through the other one: make that the smaller (x when K < O), so that it stays in L2 (measured
    // on Mixtral's dW1: dout^T cycled, 117 MB per expert, 19% slower than cuBLAS)
    a->nfast = K < O;
    long long per = (long long)((O + GG_BM - 1) / GG_BM) * ((K + GG_BN - 1) / GG_BN), tiles = 0;
    for (int g = 0; g < G; g++) {
        a->tstart[g] = (int)tiles;
        a->rstart[g] = (int)(off[g] - off[0]);
        if (off[g + 1] > off[g]) tiles += per;
    }
    if (tiles > INT_MAX) return 0;
    a->tstart[G] = (int)tiles;
    a->rstart[G] = (int)rows;
    a->tiles = (int)tiles;
    int grid = a->tiles < g_sms ? a->tiles : g_sms;
    // (a slot per warp of each block; the ledger counts G blocks even where no tile runs: the groups without
    // rows are zeros)
    if (sumsq) a->sq = cuda_dw_ledger_slots((size_t)grid * 8, G);
    if (!tiles) return 1;
    CUtensorMap ta, tb;
    tmap_2d(&ta, (const bf16 *)dout, (uint64_t)rows, (uint64_t)O, GG_BK);
    tmap_2d(&tb, (const bf16 *)x, (uint64_t)rows, (uint64_t)K, GG_BK);
    // (the packed output's staging buffers only where it is packed: the float32 one keeps L1 for itself)
    gg_kernel<1, EPI_DW><<<grid, GG_THREADS, packed ? GG_SMEM_STAGED : GG_SMEM>>>(ta, tb, ta, tb, *a);
    KCHECK("grouped_gemm_dw (wgmma)");
    return 1;
}
