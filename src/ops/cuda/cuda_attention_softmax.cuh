// cuda_attention_softmax.cuh — what the tensor-core attention kernels of cuda_attention_tc.cu
// (mma.sync), cuda_attention_wg.cu and cuda_attention_wgf.cu (wgmma) share: the forwards' online softmax
// (its rows' maxima over a quad: quad_row_max), a forward or dq block's place in the grid, the bf16 packing
// of A fragments, and adding accumulators into rows (and reading them back).
// Both hold a thread's share of 16-row score and output fragments in the same layout (mma.sync's C
// fragment, which is also wgmma's accumulator layout per warp): s[4 j + e] is row (e < 2 ? r0 : r1),
// r1 = r0 + 8, column 8 j + 2 t + (e & 1) (t = lane % 4); o[4 n + e] likewise over the head dimension.
// Device code only.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <cuda_bf16.h>

// The place of a forward or dq kernel's block, grid (ceil((qb - qa) / BM), H, B) (att_place): sequence
// b, query head h (K/V head h / (H / KV)), the query rows from q0 (BM per block, the blocks with the
// most keys first), whose keys 0 .. min(q0 + BM, qb) - 1 make ntile tiles
// of BN; qoff, koff: the offsets of row 0 of head h in (B, T, H, HD) and of its K/V head in (B, T, KV, HD).
struct AttQBlock {
    int b, h, q0, ntile;
    size_t qoff, koff;
};
// A block of grid (nblk, heads, B) as (position along the sequence, head, sequence) with the position
// slowest in the order the blocks are dispatched (x fastest, then y, then z): the blocks of one
// position, whose work is alike, run together, and the callers put the longest positions first, so the
// last wave holds the shortest blocks (with the position fastest, blocks of every length were spread
// over the waves and the longest of the last ones ran alone: SMs busy 82% of a dk/dv kernel, ncu).
struct AttPlace {
    int pos, head, b;
};
__device__ __forceinline__ AttPlace att_place(void) {
    int lin = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), nhb = gridDim.y * gridDim.z;
    int rest = lin % nhb;
    return {lin / nhb, rest % (int)gridDim.y, rest / (int)gridDim.y};
}
template <int HD, int BM, int BN>
__device__ __forceinline__ AttQBlock att_qblock(int T, int H, int KV, int qa, int qb) {
    AttPlace pl = att_place();
    int b = pl.b, h = pl.head, kh = h / (H / KV);
    int q0 = qa + ((int)gridDim.x - 1 - pl.pos) * BM;
    return {b,
            h,
            q0,
            (min(q0 + BM, qb) + BN - 1) / BN,
            ((size_t)b * T * H + h) * HD,
            ((size_t)b * T * KV + kh) * HD};
}

// Rows r0, r0 + 8 of a (T, heads, 8 NT) float tensor at base (rows `stride` elements apart; rows from
// `end` on skipped) += the thread's accumulator d (the layout above), a float2 per fragment pair; with
// add 0 written instead (no read).
template <int NT>
__device__ __forceinline__ void add_rows(float *base, const float *d, int r0, int end, size_t stride, int t,
                                         int add = 1) {
    int r1 = r0 + 8;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        if (r0 < end) {
            float2 *p = (float2 *)(base + (size_t)r0 * stride + n * 8 + 2 * t),
                   x = add ? *p : make_float2(0.0f, 0.0f);
            *p = add ? make_float2(x.x + d[4 * n], x.y + d[4 * n + 1]) : make_float2(d[4 * n], d[4 * n + 1]);
        }
        if (r1 < end) {
            float2 *p = (float2 *)(base + (size_t)r1 * stride + n * 8 + 2 * t),
                   x = add ? *p : make_float2(0.0f, 0.0f);
            *p = add ? make_float2(x.x + d[4 * n + 2], x.y + d[4 * n + 3])
                     : make_float2(d[4 * n + 2], d[4 * n + 3]);
        }
    }
}

// The thread's accumulator d (the layout above) = rows r0, r0 + 8 of a (T, heads, 8 NT) float tensor at base
// (rows `stride` elements apart; rows from `end` on read as zeros): a sum that add_rows wrote, continued.
template <int NT>
__device__ __forceinline__ void load_rows(float *d, const float *base, int r0, int end, size_t stride,
                                          int t) {
    int r1 = r0 + 8;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        float2 x = r0 < end ? *(const float2 *)(base + (size_t)r0 * stride + n * 8 + 2 * t)
                            : make_float2(0.0f, 0.0f),
               y = r1 < end ? *(const float2 *)(base + (size_t)r1 * stride + n * 8 + 2 * t)
                            : make_float2(0.0f, 0.0f);
        d[4 * n] = x.x;
        d[4 * n + 1] = x.y;
        d[4 * n + 2] = y.x;
        d[4 * n + 3] = y.y;
    }
}

// The row maxima of a score tile across a quad (the 4 threads t = 0..3 holding a row): mx0, mx1 (in: the
// values to start from) become the max of themselves, of this thread's scores of rows r0, r1 (NJ 8-column
// fragments, the layout above) and of the other three threads' results.
template <int NJ> __device__ __forceinline__ void quad_row_max(const float *s, float &mx0, float &mx1) {
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        mx0 = fmaxf(mx0, fmaxf(s[4 * j], s[4 * j + 1]));
        mx1 = fmaxf(mx1, fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
}

// One key tile (keys k0 + column): scores scaled by sl (base 2), masked to -inf where the key
// follows the row or is past qb (only when mask: the tiles crossing the diagonal or the last key),
// the running maxima m and this thread's row sums l updated, o rescaled; s becomes exp2(s - m), P.
template <int NJ, int NT>
__device__ __forceinline__ void softmax_tile(float *s, float *o, float &m0, float &m1, float &l0, float &l1,
                                             int mask, int k0, int r0, int r1, int qb, int t, float sl) {
    if (mask) {
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = k0 + j * 8 + 2 * t + (e & 1), row = e < 2 ? r0 : r1;
                s[4 * j + e] = key <= row && key < qb ? s[4 * j + e] * sl : -INFINITY;
            }
    } else {
#pragma unroll
        for (int i = 0; i < 4 * NJ; i++) s[i] *= sl;
    }
    float mx0 = m0, mx1 = m1;
    quad_row_max<NJ>(s, mx0, mx1);
    // finite: key 0 <= row is in the first tile, so the running max is finite from then on
    float c0 = exp2f(m0 - mx0), c1 = exp2f(m1 - mx1); // 0 on the first tile
    m0 = mx0;
    m1 = mx1;
    float ps0 = 0.0f, ps1 = 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        s[4 * j] = exp2f(s[4 * j] - mx0);
        s[4 * j + 1] = exp2f(s[4 * j + 1] - mx0);
        s[4 * j + 2] = exp2f(s[4 * j + 2] - mx1);
        s[4 * j + 3] = exp2f(s[4 * j + 3] - mx1);
        ps0 += s[4 * j] + s[4 * j + 1];
        ps1 += s[4 * j + 2] + s[4 * j + 3];
    }
    l0 = l0 * c0 + ps0; // this thread's columns only; the quad's sum is taken at the end
    l1 = l1 * c1 + ps1;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        o[4 * n] *= c0;
        o[4 * n + 1] *= c0;
        o[4 * n + 2] *= c1;
        o[4 * n + 3] *= c1;
    }
}

// The rows r0, r1 (from qb on skipped) of out (B, T, H, HD; bf16) for head h of sequence b: o over the
// quad's row sum into the first 8 NT columns of each head's HD, and lse (B, H, T) = ln of the sum of exp.
template <int NT, int HD = 8 * NT>
__device__ __forceinline__ void softmax_store(unsigned short *out, float *lse, const float *o, float m0,
                                              float m1, float l0, float l1, int r0, int r1, int qb, int b,
                                              int T, int H, int h, int t) {
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    float i0 = 1.0f / l0, i1 = 1.0f / l1;
#pragma unroll
    for (int n = 0; n < NT; n++) {
        if (r0 < qb) // (two bf16 values, each the float32 result rounded once)
            *(uint32_t *)(out + (((size_t)b * T + r0) * H + h) * HD + n * 8 + 2 * t) =
                pack_bf16(o[4 * n] * i0, o[4 * n + 1] * i0);
        if (r1 < qb)
            *(uint32_t *)(out + (((size_t)b * T + r1) * H + h) * HD + n * 8 + 2 * t) =
                pack_bf16(o[4 * n + 2] * i1, o[4 * n + 3] * i1);
    }
    if (t == 0) {
        const float ln2 = 0.6931471805599453f;
        if (r0 < qb) lse[((size_t)b * H + h) * T + r0] = (m0 + log2f(l0)) * ln2;
        if (r1 < qb) lse[((size_t)b * H + h) * T + r1] = (m1 + log2f(l1)) * ln2;
    }
}
