// cuda_wgmma.cuh — the Hopper (sm_90a) PTX pieces shared by our wgmma kernels (cuda_grouped.cu,
// cuda_attention_wg.cu): shared-memory addresses, the wgmma fence / commit / wait, and the
// shared-memory matrix descriptor of 128-byte-swizzled tiles. Device code only.
#pragma once
#include <stdint.h>

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
