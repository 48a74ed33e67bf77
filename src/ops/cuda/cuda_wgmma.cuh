// cuda_wgmma.cuh — the Hopper (sm_90a) PTX pieces shared by our wgmma kernels (cuda_grouped.cu,
// cuda_grouped_fp8.cu, the attention kernels): shared-memory addresses, the wgmma fence / commit / wait,
// the shared-memory matrix descriptor of 128-byte-swizzled tiles, and the mbarrier and TMA tile-load
// wrappers (2-D and 4-D boxes), the operand lists of the wgmma wrappers' accumulators (WG_D*, WG_R*), and the
// sum of squares of an accumulator fragment's stored values (the gradient ledger's, wg_frag_sumsq). Device
// code only.
#pragma once
#include <cuda.h>
#include <stdint.h>

// The accumulator operands of a wgmma (m64nN: N / 2 floats a thread, d[0..N/2)), as asm outputs ("+f"), and
// the PTX register list that names them ({%0, ..., %(N/2 - 1)}): the other operands take the numbers after.
#define WG_D8(d, i) \
    "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
        "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_D32(d, i) WG_D8(d, i), WG_D8(d, i + 8), WG_D8(d, i + 16), WG_D8(d, i + 24)
#define WG_D64(d) WG_D32(d, 0), WG_D32(d, 32)
#define WG_D96(d) WG_D64(d), WG_D32(d, 64)
#define WG_D128(d) WG_D96(d), WG_D32(d, 96)
#define WG_L0 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, " \
    "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_L1 \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, " \
    "%52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define WG_L2 \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, " \
    "%84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define WG_L3 \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, " \
    "%113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_R32 "{" WG_L0 "}"
#define WG_R64 "{" WG_L0 ", " WG_L1 "}"
#define WG_R96 "{" WG_L0 ", " WG_L1 ", " WG_L2 "}"
#define WG_R128 "{" WG_L0 ", " WG_L1 ", " WG_L2 ", " WG_L3 "}"

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void wgmma_fence(void) {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit(void) {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wgmma_wait(void) {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Shared-memory matrix descriptor, 128-byte swizzle: start address, leading and stride byte offsets
// (PTX ISA, "Matrix Descriptor Format"; K-major: lbo unused, sbo = 1024 between 8-row groups;
// N-major: lbo = between 64-column blocks, sbo = 1024 between 8-row groups along K). A tile in this
// layout: 64-element (128-byte) column blocks, each rows x 128 bytes, 1024-byte aligned; the 16-byte
// chunk c of row r stored at chunk c ^ (r % 8) of that row (what TMA's 128-byte swizzle writes).
__device__ __forceinline__ uint64_t desc_sw128(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
    return (uint64_t)((saddr & 0x3FFFF) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
        (1ull << 62);
}

// mbarriers (shared::cta, 64-bit) and the TMA 2D tile load completing on one.
__device__ __forceinline__ void mbar_init(uint32_t bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, int parity) {
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred P;\nmbarrier.try_wait.parity.shared::cta.b64 P, [%1], %2;\nselp.u32 %0, "
                     "1, 0, P;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
// TMA: the box at element coordinates (c0 innermost, c1) of the tensor map into shared memory,
// completing on bar.
__device__ __forceinline__ void tma_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1, uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
                 "{%2, %3}], [%4];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
                 : "memory");
}
// the same for a 4-D tensor map (coordinates c0 innermost .. c3)
__device__ __forceinline__ void tma_4d(uint32_t dst, const CUtensorMap *map, int c0, int c1, int c2, int c3,
                                       uint32_t bar) {
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, "
                 "{%2, %3, %4, %5}], [%6];\n" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
                 : "memory");
}

// The sum of squares of the values a thread of a wgmma accumulator stored: NJ column groups of 8, element 4 j
// + 2 h + e at row r + 8 h and column c + 8 j + e (h, e in 0..1), those at rows below M and columns below N
// (N even: a pair is all in or out); float sums of 8 groups' squares (32 values) added in double, in index
// order.
template <int NJ>
__device__ __forceinline__ double wg_frag_sumsq(const float *acc, int r, int c, int M, int N) {
    double q = 0;
#pragma unroll
    for (int j0 = 0; j0 < NJ; j0 += 8) {
        float qf = 0.0f;
#pragma unroll
        for (int j = j0; j < j0 + 8; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float x = acc[4 * j + 2 * h], y = acc[4 * j + 2 * h + 1];
                if (r + 8 * h < M && c + 8 * j < N) qf += x * x + y * y;
            }
        q += qf;
    }
    return q;
}
