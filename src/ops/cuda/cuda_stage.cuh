// cuda_stage.cuh — a warp's staging buffer between its wgmma fragments and 16-byte global rows (the grouped
// GEMM's bf16 epilogues, cuda_grouped.cu): 16 rows x 64 bf16 columns, 2,048 bytes, 16-byte chunks swizzled.
// Must not hold: any kernel, or anything of a GEMM's arguments.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

// A warp's 16 rows x 64 columns of a bf16 output (v[jj][h]: the bf16 pairs of its fragment's column
// groups jj and rows +8h) stored through its staging buffer (2,048 bytes): stmatrix into 16-byte chunks
// (chunk ch of row r at ch ^ (r % 8), so that neither the stmatrix rows nor the 16-byte reads meet bank
// conflicts), then 16-byte global stores, 8 lanes per 128-byte row (measured: the fragment's own 4-byte
// stores, 8 rows per instruction, held the epilogue at the registers they read: SwiGLU forward 1.30 ->
// 1.15 ms on the reference layer). out: the warp's first row and the block's first column; rows < nrow
// and 8-column chunks < nch are stored. gg_put_rows is the two steps below in turn, gg_stage_pair per two
// column groups and gg_flush_rows; the SwiGLU backward calls them apart (two buffers, filled as computed).
// Column groups jj and jj + 1 of a warp's fragment (their bf16 pairs at rows +0 and +8: a0, a1 and b0, b1)
// into its staging buffer by stmatrix (gg_put_rows' layout).
__device__ __forceinline__ void gg_stage_pair(uint32_t buf, int jj, uint32_t a0, uint32_t a1, uint32_t b0,
                                              uint32_t b1, int lane) {
    // matrices (jj, rows 0-7), (jj, 8-15), (jj + 1, 0-7), (jj + 1, 8-15)
    int m = lane >> 3, row = 8 * (m & 1) + (lane & 7), ch = jj + (m >> 1);
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                     buf + row * 128 + ((ch ^ (row & 7)) << 4)),
                 "r"(a0), "r"(a1), "r"(b0), "r"(b1)
                 : "memory");
}
// gg_stage_pair's inverse: column groups jj and jj + 1 of the staged rows in the fragments' layout (ldmatrix)
__device__ __forceinline__ void gg_unstage_pair(uint32_t buf, int jj, uint32_t (&v)[4], int lane) {
    int m = lane >> 3, row = 8 * (m & 1) + (lane & 7), ch = jj + (m >> 1);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(buf + row * 128 + ((ch ^ (row & 7)) << 4))
                 : "memory");
}
// 16 rows x 64 columns read from global memory as 16-byte chunks (g[i]: row 4i + lane / 8, chunk lane % 8:
// gg_flush_rows' order) into the staging buffer's layout
__device__ __forceinline__ void gg_stage_rows(uint32_t buf, const uint4 (&g)[4], int lane) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int row = 4 * i + (lane >> 3), ch = lane & 7;
        asm volatile(
            "st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(buf + row * 128 + ((ch ^ (row & 7)) << 4)),
            "r"(g[i].x), "r"(g[i].y), "r"(g[i].z), "r"(g[i].w)
            : "memory");
    }
}
// A staging buffer's 16 rows x 64 columns out in 16-byte stores, 8 lanes a 128-byte row.
__device__ __forceinline__ void gg_flush_rows(__nv_bfloat16 *out, long long ldc, int nrow, int nch,
                                              uint32_t buf, int lane) {
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 4; i++) { // rows 4i .. 4i + 3, a row per 8 lanes
        int row = 4 * i + (lane >> 3), ch = lane & 7;
        uint32_t d0, d1, d2, d3;
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)
                     : "r"(buf + row * 128 + ((ch ^ (row & 7)) << 4))
                     : "memory");
        if (row < nrow && ch < nch) *(uint4 *)(out + row * ldc + 8 * ch) = make_uint4(d0, d1, d2, d3);
    }
    __syncwarp(); // the buffer is free for the next call
}
__device__ __forceinline__ void gg_put_rows(__nv_bfloat16 *out, long long ldc, int nrow, int nch,
                                            const uint32_t (&v)[8][2], uint32_t buf, int lane) {
#pragma unroll
    for (int jj = 0; jj < 8; jj += 2)
        gg_stage_pair(buf, jj, v[jj][0], v[jj][1], v[jj + 1][0], v[jj + 1][1], lane);
    gg_flush_rows(out, ldc, nrow, nch, buf, lane);
}
