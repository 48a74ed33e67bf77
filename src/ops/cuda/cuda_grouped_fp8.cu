// cuda_grouped_fp8.cu — the FP8 (e4m3 x e4m3 -> float32) grouped GEMMs on Hopper (sm_90a), with
// DeepSeek-V3's fine-grained scales (contracts in ops/cuda/cuda_grouped_fp8.h, the reference they equal:
// cpu_fp8_gemm in ops/cpu/cpu_fp8.h). One persistent launch over all groups; a producer warpgroup fills a
// GF_ST-stage shared-memory ring (TMA 128-byte-swizzled tiles of 128 rows of A and 256 of B, 128 bytes
// deep, and the stage's scales: one per row of A and one per column of the output; the rows form copies them
// with cp.async onto the stage's barrier, the weight-gradient form loads them a stage ahead: each the faster
// there); two consumer warpgroups each own 64 rows of a 128 x 256 output tile.
// Promotion (the order of cpu_fp8_gemm): each 128-deep K-tile (the scale groups' length) is summed by four
// wgmma m64n128k32 into a fresh float32 register accumulator p, which is then added into the result:
// r += p * (sa_row * sb_col), in float32: the scales are powers of two, so both products are exact and the
// one rounding is the add's (done as one fused multiply-add); K-tiles in increasing order. Only the sum
// inside one K-tile differs from the reference (the tensor cores' order and accumulation precision). The
// tile: a second accumulator (p beside r) is why a consumer warpgroup's MMAs are m64n128 rather than the
// bf16 kernel's m64n256; the tile's 256 columns are two halves, each with its own result (r0, r1) and the one
// p in turn (p, r0, r1: 192 floats a thread). 128 x 256 per CTA (a stage 16 KB of A + 32 KB of B + 1.5 KB of
// scales, 4 stages): 48 KB from L2 for 4M multiply-adds, where 128 x 128 tiles took 32 KB for 2M. Tiles never
// span two groups: rows past a group's end (rows mode) are computed from the next group's rows and never
// stored; rows and K past the arrays' ends are zero-filled by TMA (zeros change neither amax nor the sum).
// Two forms (template RED): rows mode, groups of output rows [off[g], off[g+1]) with B_g per group (the
// forward and activation gradient); RED, groups of the reduction's columns [p[g], p[g+1]) of A = dY^T and B =
// X^T with C_g per group (the weight gradient). Rows mode's epilogues: float32 or bf16 C and the SwiGLU
// forward (h1, h3, act of an up-projection pair). Must not hold: the bf16 kernels (cuda_grouped.cu), the
// quantisers, or any knowledge of the model.
#include <cuda.h>
#include <cuda_bf16.h>
#include <limits.h>
#include <string.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_grouped_fp8.h"
#include "ops/cuda/cuda_swiglu.cuh"
#include "ops/cuda/cuda_wgmma.cuh"

typedef __nv_bfloat16 bf16;

#define GF_BM 128 // output rows per tile (two consumer warpgroups of 64)
#define GF_HN 128 // output columns of a half-tile: one m64n128 sum a warpgroup, promoted into its own result
#define GF_BN (2 * GF_HN) // output columns per tile
#define GF_BK 128 // the K-tile: FP8_TILE, the scale groups' length and the promotion interval
#define GF_ST 4
#define GF_MAXG 256 // groups per launch: GFArgs (~2.1 KB) and two tensor maps within 4 KB of parameters
#define GF_THREADS 384
#define GF_TA (GF_BM * GF_BK) // bytes of A's stage (128 rows)
#define GF_TBB (GF_BN * GF_BK) // bytes of B's stage (256 rows)
#define GF_SS (GF_BM + GF_BN) // scales a stage: A's rows', then the tile's columns'
#define GF_SMEM (1024 + GF_ST * (GF_TA + GF_TBB + 4 * GF_SS) + 2 * GF_ST * 8)

struct GFArgs {
    float *C; // float32 output, or NULL
    bf16 *Cb; // bf16 output (beta 0), or NULL
    bf16 *H1, *H3, *Act; // the SwiGLU epilogue's outputs (rows, N / 2), row stride N / 2 (Act not NULL: on)
    float beta; // 0 or 1
    double *sq; // RED with beta 0: each warp's sum of squares of the values it stored (the gradient ledger,
                // ops.h GM_DW_SUMSQ: cuda_grouped.cu's gg_sq for the float32 output), else NULL
    const float *sa, *sb;
    int sa_ld, sb_ld; // scales per row of sa / sb (rows mode: nkt; RED: Mp / 128)
    int b_blocks; // rows mode: B's scales are 128 x 128 blocks (else 1x128 tiles per row of B)
    int b_uniform; // b_blocks in rows mode: one B scale for all of a tile's columns
    int b_halves; // rows mode, b_blocks 0: B's row scales equal over each 64 rows (the SwiGLU pair's layout):
                  // one scale for the tile's columns [0, 64), one for [64, 128)
    int G, N, K; // rows mode: C (rows, N), reduction K; RED: C_g (N, K), reduction over p
    int nkt; // rows mode: K-tiles (ceil(K / 128))
    long long ldc;
    int tiles;
    int tstart[GF_MAXG + 1]; // first tile of each group; tstart[G] = tiles
    int start[GF_MAXG + 1]; // rows mode: first row of each group (from A's first); RED: first column p[g]
};

// One output tile: group g; output rows [m0, m0 + 128) (stored below mend) and columns [n0, n0 + 128)
// (stored below ncols) at cofs + row ldc + col; A's TMA row m0, B's TMA row brow + n0; K coordinates
// kc0 + 128 kt and scale columns ks0 + kt for kt < nkt.
struct GFTile {
    int g, m0, mend, n0, ncols, brow, kc0, ks0, nkt;
    long long cofs;
};

// ---------------------------------------------------------------- device
// D (64 x 128 float32, the wgmma accumulator fragment) = [D +] A (64 x 32 e4m3) . B (128 x 32 e4m3)^T,
// both K-major from shared-memory descriptors; scale_d 0: D is not read (a fresh sum).
__device__ __forceinline__ void wgmma_e4m3_n128(float *d, uint64_t da, uint64_t db, int scale_d) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 " WG_R64 ", %64, %65, p, 1, 1;\n}\n"
                 : WG_D64(d)
                 : "l"(da), "l"(db), "r"(scale_d));
}

// Tile t of the launch. Groups are found by a binary search over tstart (the last group whose first tile
// is <= t: empty groups, which share their successor's first tile, are skipped); a group's tiles run rows
// fastest, so CTAs side by side share B's columns.
template <int RED> __device__ __forceinline__ GFTile gf_tile(const GFArgs &a, int t) {
    int lo = 0, hi = a.G - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (a.tstart[mid] <= t) lo = mid;
        else hi = mid - 1;
    }
    GFTile T;
    T.g = lo;
    int local = t - a.tstart[lo];
    if (RED) {
        int mt = (a.N + GF_BM - 1) / GF_BM;
        T.m0 = (local % mt) * GF_BM;
        T.n0 = (local / mt) * GF_BN;
        T.mend = a.N;
        T.ncols = a.K;
        T.brow = 0;
        T.kc0 = a.start[lo];
        T.ks0 = a.start[lo] / GF_BK;
        T.nkt = (a.start[lo + 1] - a.start[lo]) / GF_BK;
        T.cofs = (long long)lo * a.N * a.K;
    } else {
        int mt = (a.start[lo + 1] - a.start[lo] + GF_BM - 1) / GF_BM;
        T.m0 = a.start[lo] + (local % mt) * GF_BM;
        T.n0 = (local / mt) * GF_BN;
        T.mend = a.start[lo + 1];
        T.ncols = a.N;
        T.brow = lo * a.N;
        T.kc0 = 0;
        T.ks0 = 0;
        T.nkt = a.nkt;
        T.cofs = 0;
    }
    return T;
}

__device__ __forceinline__ void cp_async4(uint32_t dst, const float *src, int valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0)
                 : "memory");
}
// RED's producer thread i's scales of K-tile kt into registers (the weight-gradient form keeps the loads one
// stage ahead, stored after the slot's wait: measured faster there than the copies, 2026-12-05): row m0 + i
// of A's, columns n0 + i and n0 + 128 + i of the output's (their rows' tile scales); 0 past the stored rows
// and the columns.
__device__ __forceinline__ void gf_scales_red(const GFArgs &a, const GFTile &T, int kt, int i, float *v) {
    int row = T.m0 + i, ks = T.ks0 + kt;
    v[0] = row < T.mend ? a.sa[(long long)row * a.sa_ld + ks] : 0.0f;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int col = T.n0 + GF_HN * h + i;
        v[1 + h] = col < T.ncols ? a.sb[(long long)(T.brow + col) * a.sb_ld + ks] : 0.0f;
    }
}
// The rows form's producer thread i's three scales of K-tile kt copied (cp.async, 4 bytes each) into its
// stage's slots from dst (bytes): A's row m0 + i at float i, the output's columns n0 + i and n0 + 128 + i at
// floats 128 + i and 256 + i (B's block scale, or its row's tile scale); zeros past the stored rows and the
// columns. They complete on the stage's full barrier with the TMA loads, so the producer never waits for a
// scale's load (it used to: loads issued one stage ahead, stored after the slot's wait; with one stage ~0.3
// us of the tensor cores' work, a loaded L2's latency can hold the ring).
__device__ __forceinline__ void gf_scale_copy(const GFArgs &a, const GFTile &T, int kt, int i, uint32_t dst) {
    int row = T.m0 + i, ks = T.ks0 + kt, va = row < T.mend;
    cp_async4(dst + 4 * i, va ? a.sa + (long long)row * a.sa_ld + ks : a.sa, va);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int n0 = T.n0 + GF_HN * h, col = n0 + i, vb = col < T.ncols;
        const float *pb = a.sb;
        if (vb) {
            if (a.b_blocks) // blocks (G, ceil(N / 128), nkt): a half's 128 columns are one block row
                pb = a.sb + ((long long)T.g * ((a.N + GF_HN - 1) / GF_HN) + n0 / GF_HN) * a.sb_ld + ks;
            else if (a.b_halves && (i & 63)) vb = 0; // (only columns 0 and 64 of a half are read)
            else pb = a.sb + (long long)(T.brow + col) * a.sb_ld + ks;
        }
        cp_async4(dst + 4 * (GF_BM + GF_HN * h + i), pb, vb);
    }
}

// Consumer warpgroup c's sum p (64 x 128, fresh) of one K-tile: A's rows at pa, a half's 128 rows of B at pb
// (four m64n128k32), waited for.
__device__ __forceinline__ void gf_mma(float *p, uint32_t pa, uint32_t pb) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < GF_BK / 32; kk++) // k32 steps: 32 bytes along the 128-byte rows
        wgmma_e4m3_n128(p, desc_sw128(pa + 32 * kk, 16, 1024), desc_sw128(pb + 32 * kk, 16, 1024), kk);
    wgmma_commit();
    wgmma_wait<0>();
#pragma unroll
    for (int e = 0; e < 64; e++) // p is read only after the wait (no use moved above it)
        asm volatile("" : "+f"(p[e])::"memory");
}

// r += p * (sa_row * sb_col): sa the stage's row scales, sc the half's 128 column scales. Fragment of p and
// r: element 4j + 2h + e at row rl + 8h, column 8j + cl + e of the warpgroup's 64 x 128. One fused
// multiply-add: p * s is exact (s a power of two), so this is the reference's rounded add of the exact
// product (the product's own rounding would matter only below float32's normal range, |p s| < 2^-126).
// release: the stage's last use, handed back (empty_s): every consumer thread arrives after its own reads of
// the scales. (One arrival a warp after __syncwarp is as ordered by the memory model, but compute-sanitizer's
// racecheck does not follow the other lanes' reads through it and reported every scale slot of both forms;
// with each thread's own arrival it reports none, at the same speed: docs/PERFORMANCE.md "FP8".)
__device__ __forceinline__ void gf_promote(float *r, const float *p, const GFArgs &a, const float *sa,
                                           const float *sc, int rl, int cl, bool release, uint32_t empty_s) {
    const float sa0 = sa[rl], sa1 = sa[rl + 8];
    if (a.b_uniform ||
        a.b_halves) { // one scale for the half's columns, or one for each 64 (e < 32: below 64)
        float s0, s1, s2, s3; // (rows rl, rl + 8) x (columns < 64, >= 64)
        if (a.b_uniform) {
            s0 = s2 = __fmul_rn(sa0, sc[0]);
            s1 = s3 = __fmul_rn(sa1, sc[0]);
        } else {
            s0 = __fmul_rn(sa0, sc[0]);
            s1 = __fmul_rn(sa1, sc[0]);
            s2 = __fmul_rn(sa0, sc[64]);
            s3 = __fmul_rn(sa1, sc[64]);
        }
        if (release) {
            __syncwarp();
            mbar_arrive(empty_s);
        }
#pragma unroll
        for (int e = 0; e < 64; e++)
            r[e] = __fmaf_rn(p[e], e < 32 ? ((e & 2) ? s1 : s0) : ((e & 2) ? s3 : s2), r[e]);
    } else { // a scale per column
#pragma unroll
        for (int j = 0; j < GF_HN / 8; j++) {
            const float2 sb = *(const float2 *)(sc + 8 * j + cl);
            r[4 * j] = __fmaf_rn(p[4 * j], __fmul_rn(sa0, sb.x), r[4 * j]);
            r[4 * j + 1] = __fmaf_rn(p[4 * j + 1], __fmul_rn(sa0, sb.y), r[4 * j + 1]);
            r[4 * j + 2] = __fmaf_rn(p[4 * j + 2], __fmul_rn(sa1, sb.x), r[4 * j + 2]);
            r[4 * j + 3] = __fmaf_rn(p[4 * j + 3], __fmul_rn(sa1, sb.y), r[4 * j + 3]);
        }
        if (release) {
            __syncwarp();
            mbar_arrive(empty_s);
        }
    }
}

// The epilogue of one half (columns [n0, n0 + 128) of the tile, result r): rows below mend and columns below
// ncols (ncols a multiple of 16: a pair is all in or out); RED with a ledger: r's stored squares added to
// *sq.
template <int RED>
__device__ __forceinline__ void gf_store(const GFArgs &a, const GFTile &T, const float *r, int n0, int rl,
                                         int cl, double *sq) {
    if (a.Act) { // SwiGLU: the half's columns [0, 64) are h1's and [64, 128) h3's, of columns n0 / 2 + ...
        const long long ldh = a.N / 2;
#pragma unroll
        for (int j = 0; j < GF_HN / 16; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = T.m0 + rl + 8 * h, col = n0 / 2 + 8 * j + cl;
                if (row >= T.mend || col >= ldh) continue;
                float x0 = r[4 * j + 2 * h], x1 = r[4 * j + 2 * h + 1], y0 = r[4 * j + 32 + 2 * h],
                      y1 = r[4 * j + 32 + 2 * h + 1];
                long long o = row * ldh + col;
                *(uint32_t *)(a.H1 + o) = pack_bf16(x0, x1);
                *(uint32_t *)(a.H3 + o) = pack_bf16(y0, y1);
                *(uint32_t *)(a.Act + o) = pack_bf16(swiglu_silu_mul(x0, y0), swiglu_silu_mul(x1, y1));
            }
        return;
    }
    if (a.Cb) { // (RED: the packed weight gradient, ops.h GM_DW_BF16; its ledger of the bf16 values stored,
                // float sums of 32 squares added in double as wg_frag_sumsq's)
#pragma unroll
        for (int j0 = 0; j0 < GF_HN / 8; j0 += 8) {
            float qf = 0.0f;
#pragma unroll
            for (int j = j0; j < j0 + 8; j++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int row = T.m0 + rl + 8 * h, col = n0 + 8 * j + cl;
                    if (row >= T.mend || col >= T.ncols) continue;
                    uint32_t v = pack_bf16(r[4 * j + 2 * h], r[4 * j + 2 * h + 1]);
                    *(uint32_t *)(a.Cb + T.cofs + row * a.ldc + col) = v;
                    if (RED && a.sq) {
                        float2 f = bf2_f2(v);
                        qf += f.x * f.x + f.y * f.y;
                    }
                }
            if (RED && a.sq) *sq += qf;
        }
        return;
    }
    // beta 1: the loads of half the columns before their stores (two memory round trips: with all 64 values
    // loaded at once, beside r0 and r1, the registers spilled)
#pragma unroll
    for (int j0 = 0; j0 < GF_HN / 8; j0 += GF_HN / 16) {
        float2 old[GF_HN / 16][2];
#pragma unroll
        for (int j = 0; j < GF_HN / 16; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = T.m0 + rl + 8 * h, col = n0 + 8 * (j0 + j) + cl;
                old[j][h] = make_float2(0.0f, 0.0f);
                if (a.beta != 0.0f && row < T.mend && col < T.ncols)
                    old[j][h] = *(const float2 *)(a.C + T.cofs + row * a.ldc + col);
            }
#pragma unroll
        for (int j = 0; j < GF_HN / 16; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = T.m0 + rl + 8 * h, col = n0 + 8 * (j0 + j) + cl;
                if (row >= T.mend || col >= T.ncols) continue;
                float2 v = make_float2(r[4 * (j0 + j) + 2 * h], r[4 * (j0 + j) + 2 * h + 1]);
                if (a.beta != 0.0f) { // beta is 1: C + result, the sum cpu_fp8_gemm's caller would take
                    v.x = __fadd_rn(old[j][h].x, v.x);
                    v.y = __fadd_rn(old[j][h].y, v.y);
                }
                *(float2 *)(a.C + T.cofs + row * a.ldc + col) = v;
            }
    }
    // (the ledger, after the stores: beta 0, so r was stored)
    if (RED && a.sq) *sq += wg_frag_sumsq<GF_HN / 8>(r, T.m0 + rl, n0 + cl, T.mend, T.ncols);
}

template <int RED>
__global__ void __launch_bounds__(GF_THREADS, 1)
    gf_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB,
              const __grid_constant__ GFArgs a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char smem_raw[];
    uint32_t raw = smem_u32(smem_raw), base = (raw + 1023) & ~1023u; // 128B-swizzled tiles: 1024-aligned
    uint32_t sA = base, sB = sA + GF_ST * GF_TA, sS = sB + GF_ST * GF_TBB, full = sS + GF_ST * 4 * GF_SS,
             empty = full + GF_ST * 8;
    float *scl =
        (float *)(smem_raw + (sS - raw)); // stage s: A's row scales at 384 s, the columns' at 384 s + 128
    int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
    if (threadIdx.x == 0) {
        for (int s = 0; s < GF_ST; s++) {
            // every producer thread's scales (rows form: their copies' arrival), and thread 0's expected
            // bytes
            mbar_init(full + 8 * s, RED ? 128 : 129);
            mbar_init(empty + 8 * s, GF_THREADS - 128); // one arrival per consumer thread
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if (wg == 0 && RED) { // weight-gradient producer: thread 0 issues the TMA loads, every thread stores one
                          // row's and two columns' scales, loaded before waiting for the stage's slot
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        const int i = threadIdx.x;
        int s = 0, ph = 0, t = blockIdx.x, kt = 0;
        GFTile T;
        float v[3] = {0.0f, 0.0f, 0.0f};
        if (t < a.tiles) {
            T = gf_tile<RED>(a, t);
            gf_scales_red(a, T, 0, i, v);
        }
        while (t < a.tiles) {
            int t2 = t, kt2 = kt + 1;
            GFTile T2 = T;
            if (kt2 == T.nkt) {
                t2 += gridDim.x;
                kt2 = 0;
                if (t2 < a.tiles) T2 = gf_tile<RED>(a, t2);
            }
            float nv[3] = {0.0f, 0.0f, 0.0f};
            if (t2 < a.tiles) gf_scales_red(a, T2, kt2, i, nv);
            mbar_wait(empty + 8 * s, ph ^ 1);
            scl[GF_SS * s + i] = v[0];
            scl[GF_SS * s + GF_BM + i] = v[1];
            scl[GF_SS * s + GF_BM + GF_HN + i] = v[2];
            uint32_t fb = full + 8 * s;
            if (i == 0) {
                mbar_expect_tx(fb, GF_TA + GF_TBB);
                tma_2d(sA + s * GF_TA, &tmA, T.kc0 + kt * GF_BK, T.m0, fb);
                tma_2d(sB + s * GF_TBB, &tmB, T.kc0 + kt * GF_BK, T.brow + T.n0, fb);
            } else {
                mbar_arrive(fb);
            }
            if (++s == GF_ST) {
                s = 0;
                ph ^= 1;
            }
            t = t2;
            kt = kt2;
            T = T2;
            for (int e = 0; e < 3; e++) v[e] = nv[e];
        }
        return;
    }
    if (wg == 0) { // rows-form producer: thread 0 issues the TMA loads, every thread copies one row's and two
                   // columns' scales (cp.async, arriving on the stage's barrier when they land)
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
        const int i = threadIdx.x;
        int s = 0, ph = 0;
        for (int t = blockIdx.x; t < a.tiles; t += gridDim.x) {
            const GFTile T = gf_tile<RED>(a, t);
            for (int kt = 0; kt < T.nkt; kt++) {
                mbar_wait(empty + 8 * s, ph ^ 1);
                uint32_t fb = full + 8 * s;
                if (i == 0) {
                    mbar_expect_tx(fb, GF_TA + GF_TBB);
                    tma_2d(sA + s * GF_TA, &tmA, T.kc0 + kt * GF_BK, T.m0, fb);
                    tma_2d(sB + s * GF_TBB, &tmB, T.kc0 + kt * GF_BK, T.brow + T.n0, fb);
                }
                gf_scale_copy(a, T, kt, i, sS + 4 * GF_SS * s);
                asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(fb) : "memory");
                if (++s == GF_ST) {
                    s = 0;
                    ph ^= 1;
                }
            }
        }
        return;
    }
    // consumers: warpgroup c = wg - 1 owns rows [64c, 64c + 64) of the tile, each half's sum in turn (the
    // second's only where it has columns to store). Fragment of p, r0, r1: element 4j + 2h + e at row
    // 16 wq + lane / 4 + 8h, column 8j + 2 (lane % 4) + e of the warpgroup's 64 x 128 of the half
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
    const int c = wg - 1, wq = (threadIdx.x % 128) / 32, rl = c * 64 + wq * 16 + lane / 4,
              cl = 2 * (lane % 4);
    float p[64], r0[64], r1[64];
    double sq_acc = 0; // (RED's ledger: this thread's stored squares over the block's tiles)
    int s = 0, ph = 0;
    for (int t = blockIdx.x; t < a.tiles; t += gridDim.x) {
        const GFTile T = gf_tile<RED>(a, t);
        const bool two = T.n0 + GF_HN < T.ncols;
#pragma unroll
        for (int e = 0; e < 64; e++) r0[e] = r1[e] = 0.0f;
        for (int kt = 0; kt < T.nkt; kt++) {
            mbar_wait(full + 8 * s, ph);
            uint32_t pa = sA + s * GF_TA + c * 64 * 128, pb = sB + s * GF_TBB;
            const float *ss = scl + GF_SS * s;
            gf_mma(p, pa, pb);
            gf_promote(r0, p, a, ss, ss + GF_BM, rl, cl, !two, empty + 8 * s);
            if (two) {
                gf_mma(p, pa, pb + GF_HN * 128);
                gf_promote(r1, p, a, ss, ss + GF_BM + GF_HN, rl, cl, true, empty + 8 * s);
            }
            if (++s == GF_ST) {
                s = 0;
                ph ^= 1;
            }
        }
        gf_store<RED>(a, T, r0, T.n0, rl, cl, &sq_acc);
        if (two) gf_store<RED>(a, T, r1, T.n0 + GF_HN, rl, cl, &sq_acc);
    }
    if (RED && a.sq) { // the block's tiles in order, then the warp's butterfly: every warp of every block
        double q = warp_sum_d(sq_acc);
        if (lane == 0) a.sq[8 * (size_t)blockIdx.x + 4 * c + wq] = q;
    }
#endif
}

// ---------------------------------------------------------------- host
typedef CUresult (*GFEncodeTiled)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *, const cuuint64_t *,
                                  const cuuint64_t *, const cuuint32_t *, const cuuint32_t *,
                                  CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                  CUtensorMapFloatOOBfill);
static int gf_ready = -1; // -1 not yet asked, 0 not here, 1 runs
static int gf_sms;
static GFEncodeTiled gf_encode;
static GFArgs gf_args; // ~2 KB: not on the stack; copied into each launch's parameters

static int gf_init(void) {
    if (gf_ready >= 0) return gf_ready;
    gf_ready = 0;
    void *fn;
    if (!cuda_hopper_tma(&gf_sms, &fn)) return 0;
    gf_encode = (GFEncodeTiled)fn;
    CUDA_CHECK(cudaFuncSetAttribute(gf_kernel<0>, cudaFuncAttributeMaxDynamicSharedMemorySize, GF_SMEM));
    CUDA_CHECK(cudaFuncSetAttribute(gf_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, GF_SMEM));
    gf_ready = 1;
    return 1;
}

extern "C" int cuda_fp8_grouped_kernel(void) { return gf_init(); }

// 1: the SwiGLU pair's GEMM reads one B scale per 64 columns (b_halves: its rows' scales are their blocks',
// so the same products, four a K-tile instead of 64); 0 (MOE_FP8_PAIR_SCALE=0, the A/B): each column's
static int gf_pair_scale(void) {
    static int v = -1;
    if (v < 0)
        v = cuda_env_switch("MOE_FP8_PAIR_SCALE", "1", "0",
                            "one weight scale per 64 columns in the fused SwiGLU GEMM", "a scale per column");
    return v;
}

// A 2-D e4m3 tensor map over (rows, cols) row-major bytes at p: boxes of box_rows rows x 128 bytes (one
// K-tile; A's 128 rows, B's 256), 128-byte swizzle, out-of-range elements read as zeros.
static void gf_map(CUtensorMap *m, const uint8_t *p, uint64_t rows, uint64_t cols, int box_rows,
                   const char *what) {
    cuuint64_t dims[2] = {cols, rows}, strides[1] = {cols};
    cuuint32_t box[2] = {GF_BK, (cuuint32_t)box_rows}, es[2] = {1, 1};
    CUresult r = gf_encode(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, (void *)p, dims, strides, box, es,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                           CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        DIE("cuTensorMapEncodeTiled failed (error %d) for the (%llu, %llu) e4m3 operand %s at %p", (int)r,
            (unsigned long long)rows, (unsigned long long)cols, what, (const void *)p);
}

static void gf_launch(int red, const CUtensorMap &ta, const CUtensorMap &tb, const GFArgs *a) {
    int grid = a->tiles < gf_sms ? a->tiles : gf_sms;
    if (red) gf_kernel<1><<<grid, GF_THREADS, GF_SMEM>>>(ta, tb, *a);
    else gf_kernel<0><<<grid, GF_THREADS, GF_SMEM>>>(ta, tb, *a);
    KCHECK(red ? "fp8 grouped_gemm_dw (wgmma)" : "fp8 grouped_gemm (wgmma)");
}

// rows mode's arguments and tensor maps (cuda_fp8_grouped_gemm's checks): 0 where the kernel does not take
// them, 1 with *a filled (all zero where there are no rows: nothing to launch)
static int gf_rows_args(GFArgs *a, const uint8_t *A, const float *sa, const uint8_t *B, const float *sb,
                        int b_blocks, const int64_t *off, int G, int K, int N, CUtensorMap *ta,
                        CUtensorMap *tb) {
    if (G < 1 || G > GF_MAXG || K <= 0 || N <= 0 || K % 16 || N % 16 ||
        (((uintptr_t)A | (uintptr_t)B) & 15) || (int64_t)G * N > INT_MAX)
        return 0;
    int64_t rows = off[G] - off[0];
    if (rows < 0 || rows > INT_MAX - GF_BM) return 0;
    for (int g = 0; g < G; g++)
        if (off[g + 1] < off[g]) return 0;
    memset(a, 0, sizeof *a);
    if (rows == 0) return 1;
    a->sa = sa;
    a->sb = sb;
    a->nkt = a->sa_ld = a->sb_ld = (K + GF_BK - 1) / GF_BK;
    a->b_blocks = a->b_uniform = b_blocks;
    a->G = G;
    a->N = N;
    a->K = K;
    a->ldc = N;
    long long tiles = 0, nt = (N + GF_BN - 1) / GF_BN;
    for (int g = 0; g < G; g++) {
        a->tstart[g] = (int)tiles;
        a->start[g] = (int)(off[g] - off[0]);
        tiles += (off[g + 1] - off[g] + GF_BM - 1) / GF_BM * nt;
    }
    if (tiles > INT_MAX) return 0;
    a->tstart[G] = (int)tiles;
    a->start[G] = (int)rows;
    a->tiles = (int)tiles;
    gf_map(ta, A, (uint64_t)rows, (uint64_t)K, GF_BM, "A");
    gf_map(tb, B, (uint64_t)G * N, (uint64_t)K, GF_BN, "B");
    return 1;
}

extern "C" int cuda_fp8_grouped_gemm(void *C, int c_bf16, float beta, const uint8_t *A, const float *sa,
                                     const uint8_t *B, const float *sb, int b_blocks, const int64_t *off,
                                     int G, int K, int N) {
    CHECK(beta == 0.0f || beta == 1.0f, "fp8 grouped_gemm: beta must be 0 or 1, not %g", beta);
    CHECK(!c_bf16 || beta == 0.0f, "fp8 grouped_gemm: a bf16 output is stored, never accumulated");
    if (!gf_init() || ((uintptr_t)C & (c_bf16 ? 3 : 7))) return 0;
    GFArgs *a = &gf_args;
    CUtensorMap ta, tb;
    int64_t rows = G >= 1 ? off[G] - off[0] : 0;
    if (!gf_rows_args(a, A, sa, B, sb, b_blocks, off, G, K, N, &ta, &tb)) return 0;
    if (rows == 0) return 1; // no rows: nothing to store
    a->C = c_bf16 ? NULL : (float *)C;
    a->Cb = c_bf16 ? (bf16 *)C : NULL;
    a->beta = beta;
    gf_launch(0, ta, tb, a);
    return 1;
}

extern "C" int cuda_fp8_grouped_gemm_swiglu(void *h1, void *h3, void *act, const uint8_t *A, const float *sa,
                                            const uint8_t *B, const float *sb, const int64_t *off, int G,
                                            int K, int O) {
    if (!gf_init() || O % 64 || (((uintptr_t)h1 | (uintptr_t)h3 | (uintptr_t)act) & 3)) return 0;
    GFArgs *a = &gf_args;
    CUtensorMap ta, tb;
    int64_t rows = G >= 1 ? off[G] - off[0] : 0;
    if (!gf_rows_args(a, A, sa, B, sb, 0, off, G, K, 2 * O, &ta, &tb)) return 0;
    if (rows == 0) return 1;
    a->H1 = (bf16 *)h1, a->H3 = (bf16 *)h3, a->Act = (bf16 *)act;
    a->b_halves = gf_pair_scale();
    gf_launch(0, ta, tb, a);
    return 1;
}

extern "C" int cuda_fp8_grouped_gemm_dw(float *C, float beta, int packed, int sumsq, const uint8_t *A,
                                        const float *sa, const uint8_t *B, const float *sb, const int64_t *p,
                                        int G, int N, int K) {
    CHECK(beta == 0.0f || beta == 1.0f, "fp8 grouped_gemm_dw: beta must be 0 or 1, not %g", beta);
    CHECK(!sumsq || beta == 0.0f, "fp8 grouped_gemm_dw: the ledger's sums are of a written output (beta 0)");
    CHECK(!packed || beta == 0.0f,
          "fp8 grouped_gemm_dw: a packed bf16 gradient is written, never accumulated");
    size_t es = packed ? 2 : sizeof(float); // (an output element's bytes)
    if (!gf_init()) return 0;
    if (G < 1 || G > GF_MAXG || K <= 0 || N <= 0 || K % 16 || N % 16 ||
        (((uintptr_t)A | (uintptr_t)B) & 15) || ((uintptr_t)C & 7))
        return 0;
    CHECK(p[0] == 0, "fp8 grouped_gemm_dw: the groups' columns must start at 0, not %lld", (long long)p[0]);
    for (int g = 0; g < G; g++)
        CHECK(p[g + 1] >= p[g] && p[g + 1] % GF_BK == 0,
              "fp8 grouped_gemm_dw: group %d's columns [%lld, %lld) do not start and end on multiples of 128",
              g, (long long)p[g], (long long)p[g + 1]);
    if (p[G] > INT_MAX) return 0;
    GFArgs *a = &gf_args;
    memset(a, 0, sizeof *a);
    a->C = packed ? NULL : C;
    a->Cb =
        packed ? (bf16 *)C : NULL; // (group g's block at element g N K of the bf16 array: ops.h GM_DW_BF16)
    a->beta = beta;
    a->sa = sa;
    a->sb = sb;
    a->sa_ld = a->sb_ld = (int)(p[G] / GF_BK);
    a->G = G;
    a->N = N;
    a->K = K;
    a->ldc = K;
    long long tiles = 0, per = (long long)((N + GF_BM - 1) / GF_BM) * ((K + GF_BN - 1) / GF_BN);
    for (int g = 0; g < G; g++) {
        a->tstart[g] = (int)tiles;
        a->start[g] = (int)p[g];
        if (p[g + 1] > p[g]) tiles += per;
    }
    if (tiles > INT_MAX) return 0;
    for (int g = 0; g < G && beta == 0.0f; g++) // no columns: the product is zero
        if (p[g + 1] == p[g])
            CUDA_CHECK(cudaMemsetAsync((char *)C + (size_t)g * N * K * es, 0, (size_t)N * K * es, 0));
    a->tstart[G] = (int)tiles;
    a->start[G] = (int)p[G];
    a->tiles = (int)tiles;
    // (a slot per warp of each block, gf_launch's grid; G blocks counted: those without columns are zeros)
    if (sumsq) a->sq = cuda_dw_ledger_slots((size_t)(tiles < gf_sms ? tiles : gf_sms) * 8, G);
    if (!tiles) return 1;
    CUtensorMap ta, tb;
    gf_map(&ta, A, (uint64_t)N, (uint64_t)p[G], GF_BM, "A (dY^T)");
    gf_map(&tb, B, (uint64_t)K, (uint64_t)p[G], GF_BN, "B (X^T)");
    gf_launch(1, ta, tb, a);
    return 1;
}
