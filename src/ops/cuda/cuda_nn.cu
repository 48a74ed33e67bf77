// cuda_nn.cu — float32 CUDA kernels of the cuda backend (contracts in ops/ops.h): embedding
// (forward, backward), row gather, the MoE combine (combine_rows) and its backward
// (gather_dot_scale), the router (softmax or sigmoid, group-limited top-k and the sums over rows:
// router_topk; its backward: router_bwd). Dropout, SwiGLU and the elementwise ops are in cuda_elementwise.cu,
// RMSNorm and RoPE in cuda_norm.cu, the cross-entropy in cuda_xent.cu. Attention is in cuda_attention*.cu,
// GEMMs in cuda_gemm.cu and cuda_grouped.cu, the dispatch plan in cuda_plan.cu, the optimizer's sums of
// squares and AdamW in cuda_optim.cu.
//
// Determinism: no float atomics. Every sum that feeds a result has a fixed order: per-row block and
// warp sums (RMSNorm, the router's softmax, gather_dot_scale) use a fixed shuffle
// tree, column sums (rmsnorm dw, the router's sums over rows) a fixed two-pass chunking, the
// embedding backward's scatter-add adds the rows of one destination element in index order, like
// the cpu reference, and combine_rows sums each output row's slots in slot order in one thread's
// registers. This file is built with -fmad=false (see CMakeLists.txt), so the elementwise
// arithmetic rounds exactly like the cpu code's.
// Must not hold: any knowledge of the model or of layers.
#include <math.h>
#include <cuda_bf16.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_swiglu.cuh"

// ---------------------------------------------------------------- rows: gather, embedding backward, combine

// one element of a gathered row: copied (one type), bf16 widened, or float32 rounded to bf16 (nearest even,
// as cuda_f32_to_bf16; a float4 into 4 bf16 in a uint2)
template <typename T> __device__ __forceinline__ void put(T *d, T v) { *d = v; }
__device__ __forceinline__ void put(float *d, __nv_bfloat16 v) { *d = __bfloat162float(v); }
__device__ __forceinline__ void put(__nv_bfloat16 *d, float v) { *d = __float2bfloat16_rn(v); }
__device__ __forceinline__ void put(uint2 *d, float4 v) { store4((__nv_bfloat16 *)d, v.x, v.y, v.z, v.w); }
// one block per row, C elements of TI into TO (copies: T = float4 where the rows allow it, C in units of T)
template <typename TO, typename TI>
__global__ void gather_rows_k(TO *out, const TI *inp, const int32_t *idx, int C) {
    size_t i = blockIdx.x;
    const TI *src = inp + (size_t)idx[i] * C;
    TO *dst = out + i * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) put(dst + c, src[c]);
}
// The embedding's rows: gather_rows_k's, a zero row where the id is outside [0, V) (vocab-parallel: another
// TP rank's row; ops.h)
template <typename TI, typename TO>
__global__ void embed_rows_k(TO *out, const TI *inp, const int32_t *idx, int C, int V) {
    size_t i = blockIdx.x;
    int t = idx[i];
    TO *dst = out + i * C;
    if (t < 0 || t >= V) {
        for (int c = threadIdx.x; c < C; c += blockDim.x) dst[c] = TO{};
        return;
    }
    const TI *src = inp + (size_t)t * C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) put(dst + c, src[c]);
}

// rows of C floats may move as float4: C % 4 == 0 and every pointer 16-byte aligned
static int rows_vec4(int C, const void *a, const void *b) {
    return C % 4 == 0 && ((uintptr_t)a % 16) == 0 && ((uintptr_t)b % 16) == 0;
}

static void gather(float *out, const float *inp, const int32_t *idx, int n, int C) {
    if (rows_vec4(C, out, inp))
        gather_rows_k<<<n, row_threads(C / 4)>>>((float4 *)out, (const float4 *)inp, idx, C / 4);
    else gather_rows_k<<<n, row_threads(C)>>>(out, inp, idx, C);
}

extern "C" void cuda_embedding_fwd(float *out, const int32_t *tokens, const float *table, int N, int C,
                                   int V) {
    if (N <= 0 || C <= 0) return;
    const __nv_bfloat16 *tb = (const __nv_bfloat16 *)cuda_bf16_hole_of(table, (size_t)V * C);
    // (a table in a hole of the bf16 parameters lives in their copy alone: its rows widened, the same values)
    if (tb) embed_rows_k<<<N, row_threads(C)>>>(out, tb, tokens, C, V);
    else if (rows_vec4(C, out, table))
        embed_rows_k<<<N, row_threads(C / 4)>>>((float4 *)out, (const float4 *)table, tokens, C / 4, V);
    else embed_rows_k<<<N, row_threads(C)>>>(out, table, tokens, C, V);
    KCHECK("embedding_fwd");
}

extern "C" void cuda_gather_rows(float *out, const float *inp, const int32_t *idx, int n, int C) {
    if (n <= 0 || C <= 0) return;
    gather(out, inp, idx, n, C);
    KCHECK("gather_rows");
}

// ops.h gather_rows_hid for "cuda" (bf16 hidden rows): from float32 rounded, or bf16 rows copied (as 16-,
// 4- or 2-byte pieces, whichever the row length and the pointers allow)
extern "C" void cuda_gather_rows_hid_bf16(void *out, const void *inp, int from_hid, const int32_t *idx, int n,
                                          int C) {
    if (n <= 0 || C <= 0) return;
    if (!from_hid) {
        if (C % 4 == 0 && (uintptr_t)inp % 16 == 0 && (uintptr_t)out % 8 == 0)
            gather_rows_k<<<n, row_threads(C / 4)>>>((uint2 *)out, (const float4 *)inp, idx, C / 4);
        else gather_rows_k<<<n, row_threads(C)>>>((__nv_bfloat16 *)out, (const float *)inp, idx, C);
    } else if (C % 8 == 0 && (uintptr_t)inp % 16 == 0 && (uintptr_t)out % 16 == 0) {
        gather_rows_k<<<n, row_threads(C / 8)>>>((float4 *)out, (const float4 *)inp, idx, C / 8);
    } else if (C % 2 == 0 && (uintptr_t)inp % 4 == 0 && (uintptr_t)out % 4 == 0) {
        gather_rows_k<<<n, row_threads(C / 2)>>>((float *)out, (const float *)inp, idx, C / 2);
    } else {
        gather_rows_k<<<n, row_threads(C)>>>((uint16_t *)out, (const uint16_t *)inp, idx, C);
    }
    KCHECK("gather_rows_hid");
}

// "cuda-fp32" (float32 hidden rows): a float32 gather either way
extern "C" void cuda_gather_rows_hid_f32(void *out, const void *inp, int from_hid, const int32_t *idx, int n,
                                         int C) {
    (void)from_hid;
    cuda_gather_rows((float *)out, (const float *)inp, idx, n, C);
}

// Embedding backward: dtable[tokens[i]] += dout[i], deterministic without atomics: blockIdx.y picks
// a partition of the destination rows (token % P), blockIdx.x a range of columns; each thread owns
// one column of the destination rows of its partition and walks i = 0..n-1 in order, so every
// destination element receives its rows in index order (as the cpu reference does) and no two
// threads ever touch the same element. Each block stages a tile of indices in shared memory, warp 0
// lists the tile's rows of its partition in order, and the threads take that list SCAT_B rows at a time:
// all their loads issued first, then the adds in order (a row met twice in a batch adds to its own
// sum, not to the value loaded), then the stores in order (a repeated row's last store is its sum).
#define SCAT_TILE 256
#define SCAT_COLS 128
#define SCAT_B 8
__global__ void embedding_bwd_k(float *out, const float *inp, const int32_t *idx, int n, int C, int V) {
    __shared__ int32_t sidx[SCAT_TILE], sj[SCAT_TILE];
    __shared__ int sn;
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned P = gridDim.y, part = blockIdx.y;
    for (int i0 = 0; i0 < n; i0 += SCAT_TILE) {
        int nt = n - i0 < SCAT_TILE ? n - i0 : SCAT_TILE;
        __syncthreads(); // the last tile's list is read
        for (int j = threadIdx.x; j < nt; j += blockDim.x) sidx[j] = idx[i0 + j];
        __syncthreads();
        if (threadIdx.x < 32) { // warp 0: the tile's positions j with sidx[j] % P == part, in order
            int m = 0;
            for (int j0 = 0; j0 < nt; j0 += 32) {
                int j = j0 + threadIdx.x;
                // (an id outside [0, V): another TP rank's row, nothing added; unsigned: -1 is past V)
                bool mine = j < nt && (unsigned)sidx[j] < (unsigned)V && (unsigned)sidx[j] % P == part;
                unsigned b = __ballot_sync(0xffffffffu, mine);
                if (mine) sj[m + __popc(b & ((1u << threadIdx.x) - 1))] = j;
                m += __popc(b);
            }
            if (threadIdx.x == 0) sn = m;
        }
        __syncthreads();
        if (c >= C) continue;
        for (int q = 0; q < sn; q += SCAT_B) {
            int m = sn - q < SCAT_B ? sn - q : SCAT_B;
            unsigned r[SCAT_B];
            float o[SCAT_B], v[SCAT_B];
#pragma unroll
            for (int u = 0; u < SCAT_B; u++)
                if (u < m) {
                    int j = sj[q + u];
                    r[u] = (unsigned)sidx[j];
                    o[u] = out[(size_t)r[u] * C + c];
                    v[u] = inp[(size_t)(i0 + j) * C + c];
                }
#pragma unroll
            for (int u = 0; u < SCAT_B; u++)
                if (u < m) {
                    float base = o[u];
#pragma unroll
                    for (int w = 0; w < u; w++)
                        if (r[w] == r[u]) base = o[w]; // (o[w] holds w's sum by now; the latest w wins)
                    o[u] = base + v[u];
                }
#pragma unroll
            for (int u = 0; u < SCAT_B; u++)
                if (u < m) out[(size_t)r[u] * C + c] = o[u];
        }
    }
}

extern "C" void cuda_embedding_bwd(float *dtable, const float *dout, const int32_t *tokens, int N, int C,
                                   int V) {
    if (N <= 0 || C <= 0) return;
    unsigned cb = cdiv_u(C, SCAT_COLS);
    // enough partitions to fill the GPU (~4 blocks per SM); more only costs index reads
    unsigned P = cb >= 512 ? 1 : 512 / cb;
    if (P > 64) P = 64;
    if ((int)P > N) P = N;
    dim3 grid(cb, P);
    embedding_bwd_k<<<grid, SCAT_COLS>>>(dtable, dout, tokens, N, C, V);
    KCHECK("embedding_bwd");
}

// combine_rows: each thread owns 4 columns (float4 when C % 4 == 0 and the buffers are 16-byte aligned, else
// one column) of an output row and sums the k slots of its row in order j = 0..k-1 in registers, then adds
// res's value last: the cpu reference's arithmetic in the cpu's order (this file has no FMA contraction), so
// both agree bit for bit, and nothing is shared between threads (deterministic without atomics).
// combine_rows_kr<K, RB> (k = K of 1, 2, 4 or 8; float4 rows): a block takes RB = 8 / K output rows, so
// every thread has its 8 slot rows' loads (and the residual's) in flight at once after one read of the slot
// indices; a block a row ran at ~2.3 TB/s (the trace at T 8192: its index load, then 2 row loads, then
// nothing); the combine with the residual now takes about its time alone (docs/PERFORMANCE.md "Kept").
// combine_rows_vec_k (any k, float4): a block a row, the slot loads issued 8 at a time.
#define COMB_U 8
__device__ __forceinline__ float4 comb_term(float4 a, float s, float4 x) {
    return make_float4(a.x + s * x.x, a.y + s * x.y, a.z + s * x.z, a.w + s * x.w);
}
__device__ __forceinline__ float4 comb_res(float4 r, float4 a) {
    return make_float4(r.x + a.x, r.y + a.y, r.z + a.z, r.w + a.w);
}
template <int K, int RB>
__global__ void combine_rows_kr(float4 *out, const float4 *res, const float4 *rows, const int32_t *slot_row,
                                const float *w, int N, int C4, int accumulate) {
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C4) return;
    size_t t0 = (size_t)blockIdx.x * RB;
    int r[RB][K];
    float sc[RB][K];
    float4 x[RB][K], b[RB];
#pragma unroll
    for (int i = 0; i < RB; i++)
#pragma unroll
        for (int j = 0; j < K; j++) {
            size_t q = (t0 + i) * K + j;
            r[i][j] = t0 + i < (size_t)N ? slot_row[q] : -1;
            sc[i][j] = r[i][j] >= 0 && w ? w[q] : 1.0f;
        }
#pragma unroll
    for (int i = 0; i < RB; i++) {
#pragma unroll
        for (int j = 0; j < K; j++)
            x[i][j] = r[i][j] >= 0 ? rows[(size_t)r[i][j] * C4 + c] : make_float4(0.f, 0.f, 0.f, 0.f);
        b[i] = res && t0 + i < (size_t)N ? res[(t0 + i) * C4 + c] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int i = 0; i < RB; i++) {
        size_t t = t0 + i;
        if (t >= (size_t)N) break;
        float4 acc = accumulate ? out[t * C4 + c] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int j = 0; j < K; j++)
            if (r[i][j] >= 0) acc = comb_term(acc, sc[i][j], x[i][j]);
        out[t * C4 + c] = res ? comb_res(b[i], acc) : acc;
    }
}
__global__ void combine_rows_vec_k(float4 *out, const float4 *res, const float4 *rows,
                                   const int32_t *slot_row, const float *w, int k, int C4, int accumulate) {
    size_t t = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C4) return;
    float4 acc = accumulate ? out[t * C4 + c] : make_float4(0.f, 0.f, 0.f, 0.f);
    const int32_t *sr = slot_row + t * k;
    const float *wt = w ? w + t * k : NULL;
    for (int j0 = 0; j0 < k; j0 += COMB_U) {
        float4 x[COMB_U];
        float sc[COMB_U];
        bool ok[COMB_U];
#pragma unroll
        for (int u = 0; u < COMB_U; u++) {
            int j = j0 + u;
            int r = j < k ? sr[j] : -1;
            ok[u] = r >= 0;
            sc[u] = ok[u] && wt ? wt[j] : 1.0f;
            if (ok[u]) x[u] = rows[(size_t)r * C4 + c];
            else x[u] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < COMB_U; u++)
            if (ok[u]) acc = comb_term(acc, sc[u], x[u]);
    }
    out[t * C4 + c] = res ? comb_res(res[t * C4 + c], acc) : acc;
}

__global__ void combine_rows_k(float *out, const float *res, const float *rows, const int32_t *slot_row,
                               const float *w, int k, int C, int accumulate) {
    size_t t = blockIdx.x;
    int c = blockIdx.y * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = accumulate ? ld_f(out + t * C + c) : 0.0f;
    for (int j = 0; j < k; j++) {
        int r = slot_row[t * k + j];
        if (r < 0) continue;
        float sc = w ? w[t * k + j] : 1.0f;
        acc = acc + sc * ld_f(rows + (size_t)r * C + c);
    }
    st_f(out + t * C + c, res ? ld_f(res + t * C + c) + acc : acc);
}

extern "C" void cuda_combine_rows(float *out, const float *res, const float *rows, const int32_t *slot_row,
                                  const float *w, int N, int k, int C, int accumulate) {
    if (N <= 0 || C <= 0) return;
    if (k <= 0 && !res) { // no slots: out = 0, or unchanged when accumulating
        if (!accumulate) CUDA_CHECK(cudaMemset(out, 0, sizeof(float) * (size_t)N * C));
        return;
    }
    int vec = C % 4 == 0 && !(((uintptr_t)out | (uintptr_t)rows | (uintptr_t)res) % 16);
    int n = vec ? C / 4 : C, th = row_threads(n);
    unsigned cy = cdiv_u(n, th);
    const float4 *r4 = (const float4 *)res, *x4 = (const float4 *)rows;
#define COMB_KR(K) \
    combine_rows_kr<K, COMB_U / K> \
        <<<dim3(cdiv_u(N, COMB_U / K), cy), th>>>((float4 *)out, r4, x4, slot_row, w, N, n, accumulate)
    if (vec && k == 1) COMB_KR(1);
    else if (vec && k == 2) COMB_KR(2);
    else if (vec && k == 4) COMB_KR(4);
    else if (vec && k == 8) COMB_KR(8);
    else if (vec)
        combine_rows_vec_k<<<dim3(N, cy), th>>>((float4 *)out, r4, x4, slot_row, w, k, n, accumulate);
    else combine_rows_k<<<dim3(N, cy), th>>>(out, res, rows, slot_row, w, k, C, accumulate);
#undef COMB_KR
    KCHECK("combine_rows");
}

// The combine's backward (ops.h gather_dot_scale): a warp per row; lane l sums the products of
// columns l, l+32, ... in double (with float4 rows, VEC: the 4 columns of float4 l, l+32, ..., in
// column order), then the lanes' sums meet in warp_sum_d's fixed butterfly; each out element is one
// float product.
template <int VEC, typename OT>
__global__ void gather_dot_scale_k(OT *out, float *dot, const float *inp, const int32_t *idx, const float *b,
                                   const float *scale, int n, int C) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= n) return;
    const float *g = inp + (size_t)idx[row] * C, *y = b + (size_t)row * C;
    OT *o = out + (size_t)row * C;
    float sc = scale[row];
    double s = 0;
    if (VEC) {
        for (int c = lane; c < C / 4; c += 32) {
            float4 v = ((const float4 *)g)[c], w = ((const float4 *)y)[c];
            s += (double)v.x * w.x;
            s += (double)v.y * w.y;
            s += (double)v.z * w.z;
            s += (double)v.w * w.w;
            store4(o + 4 * c, v.x * sc, v.y * sc, v.z * sc, v.w * sc);
        }
    } else {
        for (int c = lane; c < C; c += 32) {
            float v = ld_f(g + c);
            s += (double)v * ld_f(y + c);
            store1(o + c, v * sc);
        }
    }
    s = warp_sum_d(s);
    if (lane == 0) dot[row] = (float)s;
}

// out: float32, or bf16 rounded to nearest even from the same float product (hid, "cuda" only)
static void gather_dot_scale(void *out, float *dot, const float *inp, const int32_t *idx, const float *b,
                             const float *scale, int n, int C, int bf) {
    if (n <= 0) return;
    int vec = rows_vec4(C, inp, inp) && rows_vec4(C, b, b) && (uintptr_t)out % (bf ? 8 : 16) == 0;
    unsigned grid = cdiv_u(n, 8);
    if (bf && vec)
        gather_dot_scale_k<1, __nv_bfloat16>
            <<<grid, 256>>>((__nv_bfloat16 *)out, dot, inp, idx, b, scale, n, C);
    else if (bf)
        gather_dot_scale_k<0, __nv_bfloat16>
            <<<grid, 256>>>((__nv_bfloat16 *)out, dot, inp, idx, b, scale, n, C);
    else if (vec) gather_dot_scale_k<1, float><<<grid, 256>>>((float *)out, dot, inp, idx, b, scale, n, C);
    else gather_dot_scale_k<0, float><<<grid, 256>>>((float *)out, dot, inp, idx, b, scale, n, C);
    KCHECK("gather_dot_scale");
}
extern "C" void cuda_gather_dot_scale_bf16(void *out, float *dot, const float *inp, const int32_t *idx,
                                           const float *b, const float *scale, int n, int C, int hid) {
    gather_dot_scale(out, dot, inp, idx, b, scale, n, C, hid);
}
extern "C" void cuda_gather_dot_scale_f32(void *out, float *dot, const float *inp, const int32_t *idx,
                                          const float *b, const float *scale, int n, int C, int hid) {
    (void)hid; // float32 hidden rows
    gather_dot_scale(out, dot, inp, idx, b, scale, n, C, 0);
}

// ---------------------------------------------------------------- router: softmax + top-k, sums, backward
// One warp per row of E logits; lane l holds experts l, l+32, ... (E <= 1024: a 32-bit mask of the
// lane's taken experts). The arithmetic is the cpu reference's (cpu_router.c) operation by
// operation; only the sums over experts run as a fixed shuffle tree instead of serially (in
// double, like the cpu's). Top-k: each lane's best untaken expert (strict >: ties keep the lower
// index), then a butterfly argmax over (p, then lower index), which is a total order, so every
// lane ends with the same winner: the cpu's selection.
#define RT_WARPS 8
__global__ void router_topk_k(float *probs, float *lse, int32_t *idx, float *w, double *rsum,
                              const float *logits, const float *bias, int N, int E, RouteRule r) {
    int row = blockIdx.x * RT_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31, k = r.k;
    if (row >= N) return; // warp-uniform
    const float *x = logits + (size_t)row * E;
    float *p = probs + (size_t)row * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, x[e]);
    mx = warp_max_f(mx);
    double s = 0;
    for (int e = lane; e < E; e += 32) s += exp((double)x[e] - mx);
    s = warp_sum_d(s);
    float l = mx + (float)log(s);
    if (lane == 0) lse[row] = l;
    double ps = 0; // sigmoid: the row's sum of scores (the aux statistics' normaliser)
    for (int e = lane; e < E; e += 32) {
        p[e] = r.sigmoid ? 1.0f / (1.0f + expf(-x[e])) : expf(x[e] - l);
        ps += p[e];
    }
    if (r.sigmoid && rsum) {
        ps = warp_sum_d(ps);
        if (lane == 0) rsum[row] = ps;
    }
    // group-limited choice (n_group <= 64): lane l scores groups l and l + 32 (the sum of their two best
    // biased scores, as the cpu), then topk_group rounds of the argmax below pick the groups
    unsigned long long gm = ~0ull;
    int per = r.n_group > 1 ? E / r.n_group : E;
    if (r.n_group > 1) {
        __syncwarp(); // (every lane's scores written)
        float gs[2];
        for (int h = 0; h < 2; h++) {
            int g = lane + 32 * h;
            float a = -INFINITY, b = -INFINITY;
            for (int e = g * per; g < r.n_group && e < (g + 1) * per; e++) {
                float sc = bias ? __fadd_rn(p[e], bias[e]) : p[e];
                if (sc > a) {
                    b = a;
                    a = sc;
                } else if (sc > b) {
                    b = sc;
                }
            }
            gs[h] = __fadd_rn(a, b);
        }
        unsigned gt = 0;
        gm = 0;
        for (int j = 0; j < r.topk_group; j++) {
            float bs = 0.0f;
            int bg = -1;
            for (int h = 0; h < 2; h++) {
                int g = lane + 32 * h;
                if (g < r.n_group && !(gt >> h & 1u) && (bg < 0 || gs[h] > bs)) {
                    bs = gs[h];
                    bg = g;
                }
            }
            for (int o = 16; o > 0; o >>= 1) {
                float os = __shfl_xor_sync(0xffffffffu, bs, o);
                int og = __shfl_xor_sync(0xffffffffu, bg, o);
                if (og >= 0 && (bg < 0 || os > bs || (os == bs && og < bg))) {
                    bs = os;
                    bg = og;
                }
            }
            if ((bg & 31) == lane) gt |= 1u << (bg >> 5);
            gm |= 1ull << bg;
        }
    }
    unsigned taken = 0;
    double sw = 0;
    int32_t *ix = idx + (size_t)row * k;
    float *wt = w + (size_t)row * k;
    for (int j = 0; j < k; j++) {
        // choose by the score bs = p (+ the aux-free bias: cpu's __fadd_rn order), weigh by p
        float bp = 0.0f, bs = 0.0f;
        int be = -1, i = 0;
        for (int e = lane; e < E; e += 32, i++) {
            if (taken >> i & 1u || !(gm >> (e / per) & 1ull)) continue;
            float v = p[e], sv = bias ? __fadd_rn(v, bias[e]) : v;
            if (be < 0 || sv > bs) {
                bp = v;
                bs = sv;
                be = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            float op = __shfl_xor_sync(0xffffffffu, bp, o), os = __shfl_xor_sync(0xffffffffu, bs, o);
            int oe = __shfl_xor_sync(0xffffffffu, be, o);
            if (oe >= 0 && (be < 0 || os > bs || (os == bs && oe < be))) {
                bp = op;
                bs = os;
                be = oe;
            }
        }
        if ((be & 31) == lane) taken |= 1u << (be >> 5);
        if (lane == 0) {
            ix[j] = be;
            wt[j] = bp;
        }
        sw += bp;
    }
    if (r.renorm && lane == 0)
        for (int j = 0; j < k; j++) wt[j] = (float)(wt[j] / sw);
    if (r.scale != 0 && r.scale != 1 && lane == 0)
        for (int j = 0; j < k; j++) wt[j] *= r.scale;
}

// sums over rows: chunk c of P row ranges, column e (e == E: lse^2); each thread sums rows
// t = t0 + ty, t0 + ty + RS_ROWS, ... in order, the RS_ROWS partials add in order, then the P chunk
// partials add in order (router_sums_fin_k): a fixed order, whatever the launch.
#define RS_ROWS 8
__global__ void router_sums_part_k(double *part, const float *probs, const float *lse, const double *rsum,
                                   int N, int E, int P) {
    __shared__ double sh[RS_ROWS][32];
    int e = blockIdx.x * 32 + threadIdx.x, c = blockIdx.y, ty = threadIdx.y;
    int t0 = (int)((int64_t)N * c / P), t1 = (int)((int64_t)N * (c + 1) / P);
    double s = 0;
    if (e <= E)
        for (int t = t0 + ty; t < t1; t += RS_ROWS)
            s += e == E ? (double)lse[t] * lse[t]
                : rsum  ? probs[(size_t)t * E + e] / rsum[t] // (sigmoid: over the row's sum)
                        : (double)probs[(size_t)t * E + e];
    sh[ty][threadIdx.x] = s;
    __syncthreads();
    if (ty == 0 && e <= E) {
        double a = 0;
        for (int i = 0; i < RS_ROWS; i++) a += sh[i][threadIdx.x];
        part[(size_t)c * (E + 1) + e] = a;
    }
}

__global__ void router_sums_fin_k(double *sums, const double *part, int E, int P) {
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e > E) return;
    double a = 0;
    for (int c = 0; c < P; c++) a += part[(size_t)c * (E + 1) + e];
    sums[e] = a;
}

extern "C" void cuda_router_topk(float *probs, float *lse, int32_t *idx, float *w, double *sums,
                                 const float *logits, const float *bias, int N, int E, RouteRule r) {
    int k = r.k;
    CHECK(E >= 1 && E <= 1024 && k >= 1 && k <= E,
          "router_topk on cuda: E = %d, k = %d (needs 1 <= k <= E <= 1024)", E, k);
    CHECK(r.n_group <= 1 ||
              (r.n_group <= 64 && E % r.n_group == 0 && r.topk_group >= 1 && r.topk_group <= r.n_group),
          "router_topk on cuda: %d groups, %d chosen, E = %d", r.n_group, r.topk_group, E);
    if (N <= 0) {
        if (sums) CUDA_CHECK(cudaMemset(sums, 0, sizeof(double) * (E + 1)));
        return;
    }
    int P = N / 64;
    P = P < 1 ? 1 : P > 256 ? 256 : P;
    // the sums' partials, then (sigmoid) each row's sum of scores
    double *part = sums ? (double *)cuda_workspace(sizeof(double) * ((size_t)P * (E + 1) + (size_t)N)) : NULL;
    double *rsum = sums && r.sigmoid ? part + (size_t)P * (E + 1) : NULL;
    router_topk_k<<<cdiv_u(N, RT_WARPS), 32 * RT_WARPS>>>(probs, lse, idx, w, rsum, logits, bias, N, E, r);
    KCHECK("router_topk");
    if (!sums) return;
    router_sums_part_k<<<dim3(cdiv_u(E + 1, 32), P), dim3(32, RS_ROWS)>>>(part, probs, lse, rsum, N, E, P);
    KCHECK("router_topk (sums)");
    router_sums_fin_k<<<cdiv_u(E + 1, 128), 128>>>(sums, part, E, P);
    KCHECK("router_topk (sums)");
}

// One warp per row; dp (E) in the warp's slice of shared memory; lane 0 adds the k slots'
// terms in slot order (as the cpu), then the lanes finish the row.
__global__ void router_bwd_k(float *dlogits, const float *rowdot, const int32_t *slot_row, const float *probs,
                             const float *lse, const int32_t *idx, const float *w, const float *aux_dp,
                             float z_dl, int N, int E, RouteRule r) {
    extern __shared__ float sdp[];
    int wi = threadIdx.x / 32, lane = threadIdx.x & 31, row = blockIdx.x * RT_WARPS + wi, k = r.k;
    if (row >= N) return; // warp-uniform
    float *dp = sdp + (size_t)wi * E;
    const float *p = probs + (size_t)row * E;
    float sc = r.scale != 0 ? r.scale : 1.0f;
    if (r.sigmoid) { // the aux term on q = p / P: dp_e = (aux_dp_e - sum_m aux_dp_m q_m) / P (as the cpu)
        double P = 0, cq = 0;
        for (int e = lane; e < E; e += 32) P += p[e];
        P = warp_sum_d(P);
        for (int e = lane; e < E; e += 32) cq += (double)aux_dp[e] * (p[e] / P);
        cq = warp_sum_d(cq);
        for (int e = lane; e < E; e += 32) dp[e] = (float)((aux_dp[e] - cq) / P);
    } else {
        for (int e = lane; e < E; e += 32) dp[e] = aux_dp[e];
    }
    __syncwarp();
    if (lane == 0) {
        const int32_t *ix = idx + (size_t)row * k, *sr = slot_row + (size_t)row * k;
        const float *wt = w + (size_t)row * k;
        if (r.renorm) {
            double S = 0, gw = 0;
            for (int j = 0; j < k; j++) {
                float g = sr[j] >= 0 ? rowdot[sr[j]] : 0.0f;
                S += p[ix[j]];
                gw += (double)g * wt[j];
            }
            for (int j = 0; j < k; j++) {
                float g = sr[j] >= 0 ? rowdot[sr[j]] : 0.0f;
                dp[ix[j]] += (float)((g * sc - gw) / S);
            }
        } else {
            for (int j = 0; j < k; j++) dp[ix[j]] += sr[j] >= 0 ? rowdot[sr[j]] * sc : 0.0f;
        }
    }
    __syncwarp();
    float *dl = dlogits + (size_t)row * E;
    if (r.sigmoid) { // dp/dlogit = p (1 - p)
        for (int e = lane; e < E; e += 32) dl[e] = dp[e] * (p[e] * (1.0f - p[e]));
        return;
    }
    double pdp = 0;
    for (int e = lane; e < E; e += 32) pdp += (double)p[e] * dp[e];
    pdp = warp_sum_d(pdp);
    float zc = z_dl * lse[row];
    for (int e = lane; e < E; e += 32) dl[e] = p[e] * (dp[e] - (float)pdp) + zc * p[e];
}

extern "C" void cuda_router_bwd(float *dlogits, const float *rowdot, const int32_t *slot_row,
                                const float *probs, const float *lse, const int32_t *idx, const float *w,
                                const float *aux_dp, float z_dl, int N, int E, RouteRule r) {
    int k = r.k;
    CHECK(E >= 1 && E <= 1024 && k >= 1 && k <= E,
          "router_bwd on cuda: E = %d, k = %d (needs 1 <= k <= E <= 1024)", E, k);
    if (N <= 0) return;
    router_bwd_k<<<cdiv_u(N, RT_WARPS), 32 * RT_WARPS, sizeof(float) * RT_WARPS * E>>>(
        dlogits, rowdot, slot_row, probs, lse, idx, w, aux_dp, z_dl, N, E, r);
    KCHECK("router_bwd");
}
