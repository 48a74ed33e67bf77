// cuda_plan.cu — the MoE dispatch plan on the GPU (contracts in ops/ops.h: plan_counts, plan_rows):
// per (slot j, expert e) counts and each assignment's rank in token order, then the rows of the
// kept assignments. Deterministic (no atomics): the tokens are cut into chunks of PC_CHUNK; in a
// chunk, warp j walks its slot's assignments 32 tokens at a time in token order (__match_any_sync
// groups the lanes that chose the same expert), then the chunks' counts are scanned in chunk
// order. Same results as the cpu backend's loops (tests/test_cuda_ops.c checks bit equality).
// Must not hold: capacity decisions (the host makes them from the counts) or any model knowledge.
#include "ops/cuda/cuda_common.h"

#define PC_CHUNK 1024

// Chunk c: rank_local (its assignments' place in the chunk) and the chunk's counts (c, k, E).
__global__ void plan_chunk_k(int32_t *chunk_cnt, int32_t *rank, const int32_t *idx, int N, int E, int k) {
    extern __shared__ int32_t cnt_sh[]; // (k, E)
    int c = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    for (int q = threadIdx.x; q < k * E; q += blockDim.x) cnt_sh[q] = 0;
    __syncthreads();
    int t0 = c * PC_CHUNK, t1 = min(N, t0 + PC_CHUNK);
    for (int j = warp; j < k; j += nw) {
        int32_t *cj = cnt_sh + (size_t)j * E;
        for (int tb = t0; tb < t1; tb += 32) {
            int t = tb + lane, e = t < t1 ? idx[(size_t)t * k + j] : -1;
            unsigned peers = __match_any_sync(0xffffffffu, e);
            int before = __popc(peers & ((1u << lane) - 1)), base = e >= 0 ? cj[e] : 0;
            __syncwarp();
            if (e >= 0) {
                rank[(size_t)t * k + j] = base + before;
                if (before == __popc(peers) - 1) cj[e] = base + before + 1; // the group's last lane
            }
            __syncwarp();
        }
    }
    __syncthreads();
    for (int q = threadIdx.x; q < k * E; q += blockDim.x) chunk_cnt[(size_t)c * k * E + q] = cnt_sh[q];
}

// Per (j, e): the chunks' counts become their exclusive prefix in chunk order; cnt gets the total.
__global__ void plan_scan_k(int32_t *cnt, int32_t *chunk_cnt, int nchunk, int kE) {
    GRID_STRIDE(q, (size_t)kE) {
        int32_t run = 0;
        for (int c = 0; c < nchunk; c++) {
            int32_t v = chunk_cnt[(size_t)c * kE + q];
            chunk_cnt[(size_t)c * kE + q] = run;
            run += v;
        }
        cnt[q] = run;
    }
}

__global__ void plan_rank_k(int32_t *rank, const int32_t *chunk_cnt, const int32_t *idx, int N, int E,
                            int k) {
    GRID_STRIDE(q, (size_t)N * k) {
        int t = (int)(q / k), j = (int)(q % k);
        rank[q] += chunk_cnt[(size_t)(t / PC_CHUNK) * k * E + (size_t)j * E + idx[q]];
    }
}

__global__ void plan_rows_k(int32_t *slot_row, int32_t *row_tok, float *row_scale, const int32_t *rank,
                            const int32_t *idx, const float *w, const int32_t *keep, const int32_t *first,
                            int N, int E, int k) {
    GRID_STRIDE(q, (size_t)N * k) {
        size_t c = (size_t)(q % k) * E + idx[q];
        int32_t r = rank[q];
        if (r < keep[c]) {
            int32_t row = first[c] + r;
            slot_row[q] = row;
            row_tok[row] = (int32_t)(q / k);
            row_scale[row] = w[q];
        } else {
            slot_row[q] = -1;
        }
    }
}

extern "C" void cuda_plan_counts(int32_t *cnt, int32_t *rank, const int32_t *idx, int N, int E, int k) {
    size_t kE = (size_t)k * E, smem = kE * sizeof(int32_t);
    if (N <= 0) {
        CUDA_CHECK(cudaMemset(cnt, 0, smem));
        return;
    }
    if (smem > 200 * 1024)
        DIE("plan_counts: top_k x experts = %zu counters do not fit one block's shared memory (at most %d)",
            kE, 200 * 1024 / 4);
    static size_t smem_set = 48 * 1024;
    if (smem > smem_set) {
        CUDA_CHECK(
            cudaFuncSetAttribute(plan_chunk_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        smem_set = smem;
    }
    int nchunk = (N + PC_CHUNK - 1) / PC_CHUNK, warps = k < 32 ? k : 32;
    int32_t *chunk_cnt = (int32_t *)cuda_workspace((size_t)nchunk * smem);
    plan_chunk_k<<<nchunk, 32 * warps, smem>>>(chunk_cnt, rank, idx, N, E, k);
    KCHECK("plan_chunk");
    plan_scan_k<<<ew_grid(kE, 256), 256>>>(cnt, chunk_cnt, nchunk, (int)kE);
    KCHECK("plan_scan");
    plan_rank_k<<<ew_grid((size_t)N * k, 256), 256>>>(rank, chunk_cnt, idx, N, E, k);
    KCHECK("plan_rank");
}

extern "C" void cuda_plan_rows(int32_t *slot_row, int32_t *row_tok, float *row_scale, const int32_t *rank,
                               const int32_t *idx, const float *w, const int32_t *keep, const int32_t *first,
                               int N, int E, int k) {
    if (N <= 0) return;
    plan_rows_k<<<ew_grid((size_t)N * k, 256), 256>>>(slot_row, row_tok, row_scale, rank, idx, w, keep, first,
                                                      N, E, k);
    KCHECK("plan_rows");
}
