// cuda_optim.cu — the optimizer's kernels of the cuda backend (contracts in ops/ops.h), each over a
// run list in one launch: sum of squares per class (sumsq_runs) and AdamW (adamw_runs, which also
// writes the GEMMs' bf16 copy of the weights, ops.h bf16_shadow; under the bf16 policy, OPT_BF16_*, a
// kernel through the same run loop over bf16 moments that rounds the weights with ops.h's integer
// roundings and hash, so the cpu's bits). Deterministic: double sums in fixed orders; one integer
// counter picks the block that finishes sumsq_runs (no float atomics). Also the gradient ledger (ops.h
// GM_DW_SUMSQ, dw_sumsq_take): the weight-gradient kernels' partial sums of squares, summed in order. Each
// run's gradient is read in its format (ops.h OptRun gbf: float32, rounded, packed bf16); a list of float32
// runs alone takes kernels built without the formats (FMT 0: the registers of before).
// Built with -fmad=false (CMakeLists.txt), so AdamW's arithmetic rounds exactly like the cpu
// reference's.
// Must not hold: any knowledge of the model or of layers.
#include <math.h>
#include <cuda_bf16.h>
#include "ops/cuda/cuda_common.h"

// One AdamW element (adamw_runs' scalar and float4 paths alike): ops.h adamw_f32, the cpu's operations.
__device__ __forceinline__ void adamw_elem(float *p, float g, float *m, float *v, const AdamwStep &s,
                                           float lwd, __nv_bfloat16 *pb) {
    float mi = *m, vi = *v, pi = adamw_f32(*p, g, &mi, &vi, &s, lwd);
    if (pb) *pb = __float2bfloat16_rn(pi); // the bf16 copy of the weights (ops.h bf16_shadow)
    *p = pi;
    *m = mi;
    *v = vi;
}
// Four consecutive elements through 16-byte loads and stores (all four loads issued before any
// store: the compiler cannot move loads of one element above stores of another, which may alias).
// (Streaming loads and stores here, __ldcs/__stcs, measured slower: 35.8 -> 36.9 ms a step, 21:45 UTC;
// two groups of four loaded before either is stored, 80 registers instead of 60: AdamW 35.6 -> 36.1 ms
// mixed, 29.9 -> 32.5 bf16, 2026-12-02: the bf16 kernel is bound by its arithmetic, not by loads in flight.)
__device__ __forceinline__ void adamw_vec4(float4 *p, float4 G, float4 *m, float4 *v, const AdamwStep &s,
                                           float lwd, uint2 *pb) {
    float4 P = *p, M = *m, V = *v;
    P.x = adamw_f32(P.x, G.x, &M.x, &V.x, &s, lwd);
    P.y = adamw_f32(P.y, G.y, &M.y, &V.y, &s, lwd);
    P.z = adamw_f32(P.z, G.z, &M.z, &V.z, &s, lwd);
    P.w = adamw_f32(P.w, G.w, &M.w, &V.w, &s, lwd);
    if (pb) *pb = make_uint2(pack_bf16(P.x, P.y), pack_bf16(P.z, P.w)); // four bf16 of the weights' copy
    *p = P;
    *m = M;
    *v = V;
}

// ---------------------------------------------------------------- multi-tensor runs: sumsq, AdamW
// The runs (non-empty ones, in list order) are laid end to end in one index space [0, total): run r
// covers [pos_r, pos_r + n_r). That space is cut into tiles of RUN_TILE elements; tile_run[t] is the
// run holding tile t's first element, so a block finds its runs with one load (no search). A block
// walks its tiles (grid-stride over tiles), and inside a tile each run piece with the block's threads
// striding over consecutive elements (coalesced). Both tables are built on the host once per run list.
// Where a piece's parameter and moment offsets agree mod 4 and the buffers are 16-byte aligned (ZeRO 0:
// the moments mirror the parameters), its body goes through float4 (a scalar head to the alignment,
// then 4 elements per thread and step, then a scalar tail): 16-byte accesses keep enough bytes in
// flight per thread to stream at the memory's rate; the arithmetic per element is the same.
#define RUN_TILE 8192
#define RUN_THREADS 256
#define RUN_SUM_BLOCKS 1024 // sumsq_runs: fixed, so the summation order depends on the runs only
#define RUN_MAX_CLS 16
// wb: the run's weights live in the bf16 copy alone (a hole of ops.h alloc_bf16_params): AdamW reads and
// writes them there (set by cuda_adamw_runs for the buffer it is called on).
// gbf, gb: the gradient's format (ops.h OptRun, optrun_g).
typedef struct {
    int64_t off, moff, n, pos;
    int32_t decay, cls;
    int64_t gidx, gcols;
    int32_t lcols, col0, wb, gbf;
    int64_t gb;
} DevRun;

// Four packed bf16 values as floats; four floats rounded to bf16 values (nearest even).
__device__ __forceinline__ float4 bf16x4_f4(uint2 b) {
    return make_float4(bf16_to_f32((uint16_t)b.x), bf16_to_f32((uint16_t)(b.x >> 16)),
                       bf16_to_f32((uint16_t)b.y), bf16_to_f32((uint16_t)(b.y >> 16)));
}
__device__ __forceinline__ float4 bf16_round4(float4 G) {
    return make_float4(bf16_to_f32(bf16_rn_bits(G.x)), bf16_to_f32(bf16_rn_bits(G.y)),
                       bf16_to_f32(bf16_rn_bits(G.z)), bf16_to_f32(bf16_rn_bits(G.w)));
}
// Four gradient values from flat element e (a multiple of 4; g 16-byte aligned; packed: gb a multiple of 4)
// as run u's format reads them (ops.h optrun_g): 16 bytes of float32, or 8 of packed bf16.
__device__ __forceinline__ float4 optrun_g4(const float *g, const DevRun &u, int64_t e) {
    if (u.gbf == OPTG_PACKED) return bf16x4_f4(*(const uint2 *)((const uint16_t *)(g + u.gb) + (e - u.gb)));
    float4 G = *(const float4 *)(g + e);
    return u.gbf == OPTG_BF16 ? bf16_round4(G) : G;
}
// A run piece can take the 16-byte paths: parameter and moment offsets agree mod 4, and a packed gradient's
// (gf: its format as the kernel reads it) block starts at a multiple of 4 (its 8-byte loads then align with
// the parameters' 16-byte ones).
__device__ __forceinline__ int run_vec_ok(const DevRun &u, int gf, int64_t po, int64_t mo) {
    return ((po - mo) & 3) == 0 && (gf != OPTG_PACKED || (u.gb & 3) == 0);
}
struct OptRuns {
    DevRun *runs; // device
    DevRun *hruns; // the same on the host (wb set for the buffer of wb_gen)
    unsigned wb_gen; // cuda_bf16_holes_gen of the buffer the wb flags are for (0: none)
    int32_t *tile_run; // device, ntiles
    int nruns, ncls_min; // ncls_min: 1 + the largest class
    int fmt; // some run's gradient is not plain float32 (gbf): the kernels that read formats
    int64_t total, ntiles;
    int64_t end; // 1 + the largest parameter offset a run touches
};

extern "C" OptRuns *cuda_runs_create(const OptRun *runs, int n) {
    OptRuns *r = (OptRuns *)xcalloc(1, sizeof(OptRuns));
    DevRun *h = (DevRun *)xcalloc(n > 0 ? n : 1, sizeof(DevRun));
    int64_t pos = 0;
    for (int i = 0; i < n; i++) {
        CHECK(runs[i].n >= 0 && runs[i].off >= 0 && runs[i].moff >= 0 && runs[i].cls >= 0 &&
                  runs[i].cls < RUN_MAX_CLS,
              "runs_create: run %d is invalid (off %lld, moff %lld, n %lld, cls %d; classes below %d)", i,
              (long long)runs[i].off, (long long)runs[i].moff, (long long)runs[i].n, (int)runs[i].cls,
              RUN_MAX_CLS);
        if (runs[i].cls + 1 > r->ncls_min) r->ncls_min = runs[i].cls + 1;
        if (!runs[i].n) continue;
        if (runs[i].off + runs[i].n > r->end) r->end = runs[i].off + runs[i].n;
        r->fmt |= runs[i].gbf != OPTG_F32;
        DevRun *d = &h[r->nruns++];
        CHECK(runs[i].gbf >= OPTG_F32 && runs[i].gbf <= OPTG_PACKED &&
                  (runs[i].gbf != OPTG_PACKED || (runs[i].gb >= 0 && runs[i].gb <= runs[i].off)),
              "runs_create: run %d's gradient format (%d, block at %lld) "
              "is invalid",
              i, (int)runs[i].gbf, (long long)runs[i].gb);
        *d = (DevRun){runs[i].off,
                      runs[i].moff,
                      runs[i].n,
                      pos,
                      runs[i].decay,
                      runs[i].cls,
                      runs[i].gidx,
                      runs[i].gcols,
                      runs[i].lcols,
                      runs[i].col0,
                      0,
                      runs[i].gbf,
                      runs[i].gbf == OPTG_PACKED ? runs[i].gb : 0};
        pos += runs[i].n;
    }
    r->total = pos;
    r->ntiles = (pos + RUN_TILE - 1) / RUN_TILE;
    int32_t *tr = (int32_t *)xcalloc(r->ntiles ? r->ntiles : 1, sizeof(int32_t));
    for (int64_t t = 0, k = 0; t < r->ntiles; t++) {
        while (h[k].pos + h[k].n <= t * RUN_TILE) k++;
        tr[t] = (int32_t)k;
    }
    CUDA_CHECK(cudaMalloc(&r->runs, sizeof(DevRun) * (r->nruns ? r->nruns : 1)));
    CUDA_CHECK(cudaMalloc(&r->tile_run, sizeof(int32_t) * (r->ntiles ? r->ntiles : 1)));
    if (r->nruns) CUDA_CHECK(cudaMemcpy(r->runs, h, sizeof(DevRun) * r->nruns, cudaMemcpyHostToDevice));
    if (r->ntiles)
        CUDA_CHECK(cudaMemcpy(r->tile_run, tr, sizeof(int32_t) * r->ntiles, cudaMemcpyHostToDevice));
    r->hruns = h;
    free(tr);
    return r;
}

extern "C" void cuda_runs_free(OptRuns *r) {
    if (!r) return;
    CUDA_CHECK(cudaFree(r->runs));
    CUDA_CHECK(cudaFree(r->tile_run));
    free(r->hruns);
    free(r);
}

// AdamW over the run list: the tiles and pieces above, each piece through the vector path (scalar head,
// float4 weights, four gradient values, MV moments, scalar tail) where run_vec_ok and vec says the buffers
// are aligned, else element by element. elem(p, g, m, v, w, u, i, pb) updates element i of run u (g its
// gradient value, as optrun_g reads it), vec4(P, G, M, V, w, u, i, Pb) elements i .. i + 3 (w: lwd, the
// step's lr wd, where the run decays, else 0; pb, Pb: the weights' bf16 copy or NULL). MT is the moments'
// element type (float, or uint16_t holding bf16 bits), MV four of them (float4, uint2).
template <int FMT, typename MT, typename MV, typename Elem, typename Vec4>
__device__ __forceinline__ void adamw_runs_loop(float *p, const float *g, MT *m, MT *v, const DevRun *runs,
                                                const int32_t *tile_run, int64_t total, int64_t ntiles,
                                                int vec, float lwd, __nv_bfloat16 *pb, Elem elem, Vec4 vec4) {
#define ELEM(i) \
    elem(p + po + (i), optrun_g(g, gf, u.gb, po, (i)), m + mo + (i), v + mo + (i), w, u, (i), \
         pb ? pb + (po + (i)) : NULL)
    for (int64_t tl = blockIdx.x; tl < ntiles; tl += gridDim.x) {
        int64_t s = tl * RUN_TILE, e = min(s + (int64_t)RUN_TILE, total);
        for (int r = tile_run[tl]; s < e; r++) {
            DevRun u = runs[r];
            int64_t re = min(e, u.pos + u.n), po = u.off - u.pos, mo = u.moff - u.pos;
            float w = u.decay ? lwd : 0.0f;
            const int gf = FMT ? u.gbf : OPTG_F32;
            if (vec && run_vec_ok(u, gf, po, mo)) {
                int64_t head = min((int64_t)((4 - ((po + s) & 3)) & 3), re - s), vs = s + head,
                        nv = (re - vs) >> 2;
                if (threadIdx.x < head) ELEM(s + threadIdx.x);
                float4 *P = (float4 *)(p + po + vs);
                MV *M = (MV *)(m + mo + vs), *V = (MV *)(v + mo + vs);
                uint2 *Pb = pb ? (uint2 *)(pb + po + vs) : NULL; // p + po + vs is 16-byte aligned: 8 here
                // the gradient: float32 (read rounded under OPTG_BF16), or packed bf16, 8 bytes a step
                const float4 *G = (const float4 *)(g + po + vs);
                const uint2 *Gh = gf == OPTG_PACKED
                    ? (const uint2 *)((const uint16_t *)(g + u.gb) + (po + vs - u.gb))
                    : NULL;
                for (int64_t j = threadIdx.x; j < nv; j += RUN_THREADS)
                    vec4(P + j,
                         Gh                    ? bf16x4_f4(Gh[j])
                             : gf == OPTG_BF16 ? bf16_round4(G[j])
                                               : G[j],
                         M + j, V + j, w, u, vs + 4 * j, Pb ? Pb + j : NULL);
                int64_t ts = vs + 4 * nv;
                if (threadIdx.x < re - ts) ELEM(ts + threadIdx.x);
            } else {
#pragma unroll 4
                for (int64_t i = s + threadIdx.x; i < re; i += RUN_THREADS) ELEM(i);
            }
            s = re;
        }
    }
#undef ELEM
}

template <int FMT>
__global__ void __launch_bounds__(RUN_THREADS)
    adamw_runs_k(float *p, const float *g, float *m, float *v, const DevRun *runs, const int32_t *tile_run,
                 int64_t total, int64_t ntiles, int vec, AdamwStep s, __nv_bfloat16 *pb) {
    adamw_runs_loop<FMT, float, float4>(
        p, g, m, v, runs, tile_run, total, ntiles, vec, s.lwd, pb,
        [=](float *p, float g, float *m, float *v, float w, const DevRun &, int64_t, __nv_bfloat16 *pb) {
            adamw_elem(p, g, m, v, s, w, pb);
        },
        [=](float4 *p, float4 g, float4 *m, float4 *v, float w, const DevRun &, int64_t, uint2 *pb) {
            adamw_vec4(p, g, m, v, s, w, pb);
        });
}

// The bf16 policy (ops.h OPT_BF16_*; PREC, a template argument, is s.prec): bf16 moments, weights rounded to
// bf16 values but under OPT_BF16_MOMENTS (adamw_f32, then ops.h's integer roundings and hash: the cpu's
// bits). gi: the element's global index, which the stochastic rounding hashes (optrun_gidx).
template <int PREC>
__device__ __forceinline__ uint16_t adamw_bf16_reg(float &p, float g, uint16_t &m, uint16_t &v,
                                                   const AdamwStep &s, float lwd, int64_t gi) {
    float mi = bf16_to_f32(m), vi = bf16_to_f32(v);
    p = adamw_f32(p, g, &mi, &vi, &s, lwd);
    m = bf16_rn_bits(mi);
    v = bf16_rn_bits(vi);
    uint16_t pw = PREC == OPT_BF16_STOCHASTIC ? bf16_sr_bits(p, bf16_sr_rand(s.key, gi)) : bf16_rn_bits(p);
    if (PREC != OPT_BF16_MOMENTS) p = bf16_to_f32(pw); // (OPT_BF16_MOMENTS: p stays; pw is its bf16 copy's)
    return pw;
}
// Element i of run u (its position i - u.pos in the run gives the global index).
__device__ __forceinline__ int64_t run_gidx(const DevRun &u, int64_t i) {
    return optrun_gidx(u.gidx, u.gcols, u.lcols, u.col0, i - u.pos);
}
template <int PREC>
__device__ __forceinline__ void adamw_bf16_elem(float *p, float g, uint16_t *m, uint16_t *v,
                                                const AdamwStep &s, float lwd, const DevRun &u, int64_t i,
                                                __nv_bfloat16 *pb) {
    float pi = u.wb ? __bfloat162float(*pb) : *p; // (u.wb: the weight lives in the copy alone)
    uint16_t mi = *m, vi = *v;
    uint16_t pw = adamw_bf16_reg<PREC>(pi, g, mi, vi, s, lwd, run_gidx(u, i));
    if (!u.wb) *p = pi;
    *m = mi;
    *v = vi;
    if (pb) *pb = __ushort_as_bfloat16(pw); // the weights' bf16 copy: the same bits
}
// Four consecutive elements (i .. i + 3 of run u): 16-byte weight and gradient accesses, 8-byte moment
// and bf16-copy accesses, all loads before the stores. u.wb: the weights are read from the copy (8 bytes)
// and written there alone. Their global indices are consecutive unless the run lies in a column block
// (u.lcols > 0), where each is found alone.
template <int PREC>
__device__ __forceinline__ void adamw_bf16_vec4(float4 *p, float4 G, uint2 *m, uint2 *v, const AdamwStep &s,
                                                float lwd, const DevRun &u, int64_t i, uint2 *pb) {
    float4 P;
    if (u.wb) {
        uint2 B = *pb;
        P = make_float4(bf16_to_f32((uint16_t)B.x), bf16_to_f32((uint16_t)(B.x >> 16)),
                        bf16_to_f32((uint16_t)B.y), bf16_to_f32((uint16_t)(B.y >> 16)));
    } else {
        P = *p;
    }
    uint2 M = *m, V = *v;
    uint16_t mh[4] = {(uint16_t)M.x, (uint16_t)(M.x >> 16), (uint16_t)M.y, (uint16_t)(M.y >> 16)};
    uint16_t vh[4] = {(uint16_t)V.x, (uint16_t)(V.x >> 16), (uint16_t)V.y, (uint16_t)(V.y >> 16)};
    int64_t g0 = run_gidx(u, i), g1 = g0 + 1, g2 = g0 + 2, g3 = g0 + 3;
    if (PREC == OPT_BF16_STOCHASTIC && u.lcols > 0) {
        g1 = run_gidx(u, i + 1);
        g2 = run_gidx(u, i + 2);
        g3 = run_gidx(u, i + 3);
    }
    uint16_t w0 = adamw_bf16_reg<PREC>(P.x, G.x, mh[0], vh[0], s, lwd, g0);
    uint16_t w1 = adamw_bf16_reg<PREC>(P.y, G.y, mh[1], vh[1], s, lwd, g1);
    uint16_t w2 = adamw_bf16_reg<PREC>(P.z, G.z, mh[2], vh[2], s, lwd, g2);
    uint16_t w3 = adamw_bf16_reg<PREC>(P.w, G.w, mh[3], vh[3], s, lwd, g3);
    if (!u.wb) *p = P;
    *m = make_uint2(mh[0] | ((uint32_t)mh[1] << 16), mh[2] | ((uint32_t)mh[3] << 16));
    *v = make_uint2(vh[0] | ((uint32_t)vh[1] << 16), vh[2] | ((uint32_t)vh[3] << 16));
    if (pb) *pb = make_uint2(w0 | ((uint32_t)w1 << 16), w2 | ((uint32_t)w3 << 16));
}

// adamw_runs_loop's tiles, pieces and vector path over bf16 moments (aligned: p, g 16 bytes; m, v 8 bytes).
template <int FMT, int PREC>
__global__ void __launch_bounds__(RUN_THREADS)
    adamw_runs_bf16_k(float *p, const float *g, uint16_t *m, uint16_t *v, const DevRun *runs,
                      const int32_t *tile_run, int64_t total, int64_t ntiles, int vec, AdamwStep s,
                      __nv_bfloat16 *pb) {
    adamw_runs_loop<FMT, uint16_t, uint2>(
        p, g, m, v, runs, tile_run, total, ntiles, vec, s.lwd, pb,
        [=](float *p, float g, uint16_t *m, uint16_t *v, float w, const DevRun &u, int64_t i,
            __nv_bfloat16 *pb) { adamw_bf16_elem<PREC>(p, g, m, v, s, w, u, i, pb); },
        [=](float4 *p, float4 g, uint2 *m, uint2 *v, float w, const DevRun &u, int64_t i, uint2 *pb) {
            adamw_bf16_vec4<PREC>(p, g, m, v, s, w, u, i, pb);
        });
}

extern "C" void cuda_adamw_runs(float *p, const float *g, void *m_, void *v_, const OptRuns *r, float gscale,
                                float lr, float b1, float b2, float eps, float wd, int t, int prec,
                                uint64_t seed) {
    if (!r->ntiles) return;
    AdamwStep s = adamw_step(gscale, lr, b1, b2, eps, wd, t, prec, seed); // on the host, as the cpu backend
    float *m = (float *)m_, *v = (float *)v_;
    unsigned grid = r->ntiles < 65535 ? (unsigned)r->ntiles : 65535u;
    int vec = (((uintptr_t)p | (uintptr_t)g | (uintptr_t)m | (uintptr_t)v) & 15) == 0;
    // the weights' bf16 copy (ops.h bf16_shadow), when p is its buffer: written with the update, so it
    // stays current (its version moves on: what was derived from it is stale); any other p that overlaps it
    // drops it
    __nv_bfloat16 *pb = (__nv_bfloat16 *)cuda_bf16_shadow_for(p);
    if (!pb) cuda_bf16_shadow_write(p, (size_t)r->end * sizeof(float));
    else cuda_bf16_shadow_updated();
    // runs in the holes of a buffer from alloc_bf16_params update the copy alone: their flags, for this p
    // (a cache inside the run list: the runs themselves do not change)
    unsigned gen = cuda_bf16_holes_gen(p);
    if (gen != r->wb_gen) {
        OptRuns *w = (OptRuns *)r;
        for (int i = 0; i < w->nruns; i++)
            w->hruns[i].wb = gen ? cuda_bf16_in_hole(p, (size_t)w->hruns[i].off, (size_t)w->hruns[i].n) : 0;
        if (w->nruns)
            CUDA_CHECK(cudaMemcpy(w->runs, w->hruns, sizeof(DevRun) * w->nruns, cudaMemcpyHostToDevice));
        w->wb_gen = gen;
    }
    CHECK(!gen || prec == OPT_BF16_NEAREST || prec == OPT_BF16_STOCHASTIC,
          "adamw_runs: the parameter buffer keeps "
          "weights in their bf16 copy alone (alloc_bf16_params), which only the bf16 policy's rounded "
          "weights allow");
    CHECK(prec >= OPT_MIXED && prec <= OPT_BF16_MOMENTS,
          "adamw_runs: precision policy %d is not one of ops.h's", prec);
    if (prec != OPT_MIXED) {
        int vb = (((uintptr_t)p | (uintptr_t)g) & 15) == 0 && (((uintptr_t)m_ | (uintptr_t)v_) & 7) == 0;
        // the kernel per gradient format (FMT) and rounding (PREC): no per-element branch on either
        typedef void (*BfK)(float *, const float *, uint16_t *, uint16_t *, const DevRun *, const int32_t *,
                            int64_t, int64_t, int, AdamwStep, __nv_bfloat16 *);
        static const BfK ks[2][3] = {
            {adamw_runs_bf16_k<0, OPT_BF16_NEAREST>, adamw_runs_bf16_k<0, OPT_BF16_STOCHASTIC>,
             adamw_runs_bf16_k<0, OPT_BF16_MOMENTS>},
            {adamw_runs_bf16_k<1, OPT_BF16_NEAREST>, adamw_runs_bf16_k<1, OPT_BF16_STOCHASTIC>,
             adamw_runs_bf16_k<1, OPT_BF16_MOMENTS>}};
        BfK k = ks[r->fmt != 0][prec - OPT_BF16_NEAREST];
        k<<<grid, RUN_THREADS>>>(p, g, (uint16_t *)m_, (uint16_t *)v_, r->runs, r->tile_run, r->total,
                                 r->ntiles, vb, s, pb);
        KCHECK("adamw_runs (bf16)");
        return;
    }
    (r->fmt ? adamw_runs_k<1> : adamw_runs_k<0>)<<<grid, RUN_THREADS>>>(p, g, m, v, r->runs, r->tile_run,
                                                                        r->total, r->ntiles, vec, s, pb);
    KCHECK("adamw_runs");
}

// Sum of squares per class in one launch, deterministic: block b (of G, a function of the run list
// only) takes tiles b, b + G, ...; each thread sums its elements of a run piece in double (a fixed
// order: which elements a thread takes depends on the runs and on x's 16-byte alignment, as for
// adamw_runs_k's float4 path) and adds that to its class's accumulator; the block reduces each class by the
// fixed tree into part[c * G + b]. The last block to finish (a counter: which block that is varies, what it
// computes does not) sums every class's G partials in index order by the same tree into out[c] and
// resets the counter. The host then copies out once.
__device__ unsigned int g_sumsq_runs_done;
template <int FMT>
__global__ void __launch_bounds__(RUN_THREADS)
    sumsq_runs_k(double *out, double *part, const float *x, const DevRun *runs, const int32_t *tile_run,
                 int64_t total, int64_t ntiles, int ncls, int vec) {
    double acc[RUN_MAX_CLS];
    for (int c = 0; c < RUN_MAX_CLS; c++) acc[c] = 0;
    int G = gridDim.x;
    for (int64_t t = blockIdx.x; t < ntiles; t += G) {
        int64_t s = t * RUN_TILE, e = min(s + (int64_t)RUN_TILE, total);
        for (int r = tile_run[t]; s < e; r++) {
            DevRun u = runs[r];
            int64_t re = min(e, u.pos + u.n), po = u.off - u.pos;
            double q = 0;
            const int gf = FMT ? u.gbf : OPTG_F32;
            if (vec && gf == OPTG_PACKED && (u.gb & 3) == 0) {
                // packed bf16: 16-byte loads of 8 values (8-byte ones, 4 values, kept the float32 path's time
                // for half its bytes, 2026-12-02), aligned in the block (g + gb is 16-byte aligned here)
                const uint16_t *hb = (const uint16_t *)(x + u.gb);
                int64_t e0 = po + s - u.gb, e1 = po + re - u.gb;
                int64_t head = min((int64_t)((8 - (e0 & 7)) & 7), e1 - e0), vs = e0 + head,
                        nv = (e1 - vs) >> 3;
                if (threadIdx.x < head) {
                    double xv = bf16_to_f32(hb[e0 + threadIdx.x]);
                    q += xv * xv;
                }
                const uint4 *H = (const uint4 *)(hb + vs);
#pragma unroll 4
                for (int64_t j = threadIdx.x; j < nv; j += RUN_THREADS) {
                    uint4 w = __ldcs(H + j);
                    uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        double a = bf16_to_f32((uint16_t)ws[k]), b = bf16_to_f32((uint16_t)(ws[k] >> 16));
                        q += a * a;
                        q += b * b;
                    }
                }
                int64_t ts = vs + 8 * nv;
                if (threadIdx.x < e1 - ts) {
                    double xv = bf16_to_f32(hb[ts + threadIdx.x]);
                    q += xv * xv;
                }
            } else if (vec && run_vec_ok(u, gf, po, po)) { // as adamw_runs_k: scalar head, 16-byte body,
                                                           // scalar tail (a fixed order still)
                int64_t head = min((int64_t)((4 - ((po + s) & 3)) & 3), re - s), vs = s + head,
                        nv = (re - vs) >> 2;
                if (threadIdx.x < head) {
                    double xv = optrun_g(x, gf, u.gb, po, s + threadIdx.x);
                    q += xv * xv;
                }
                const float4 *X = (const float4 *)(x + po + vs);
#pragma unroll 4
                for (int64_t j = threadIdx.x; j < nv; j += RUN_THREADS) {
                    // (streaming, read once: 5.23 -> 4.70 ms a step, 21:45 UTC)
                    float4 f = gf == OPTG_F32 ? __ldcs(X + j) : optrun_g4(x, u, po + vs + 4 * j);
                    double a = f.x, b = f.y, c = f.z, d = f.w;
                    q += a * a;
                    q += b * b;
                    q += c * c;
                    q += d * d;
                }
                int64_t ts = vs + 4 * nv;
                if (threadIdx.x < re - ts) {
                    double xv = optrun_g(x, gf, u.gb, po, ts + threadIdx.x);
                    q += xv * xv;
                }
            } else {
#pragma unroll 4
                for (int64_t i = s + threadIdx.x; i < re; i += RUN_THREADS) {
                    double xv = optrun_g(x, gf, u.gb, po, i);
                    q += xv * xv;
                }
            }
            acc[u.cls] += q;
            s = re;
        }
    }
    for (int c = 0; c < ncls; c++) {
        double b = block_sum_d(acc[c]);
        if (threadIdx.x == 0) part[(size_t)c * G + blockIdx.x] = b;
    }
    __shared__ int last;
    if (threadIdx.x == 0) {
        __threadfence(); // my partials are visible before I count
        last = atomicAdd(&g_sumsq_runs_done, 1u) == (unsigned)G - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int c = 0; c < ncls; c++) {
        double a = 0;
        for (int i = threadIdx.x; i < G; i += RUN_THREADS) a += __ldcg(part + (size_t)c * G + i);
        a = block_sum_d(a);
        if (threadIdx.x == 0) out[c] = a;
    }
    if (threadIdx.x == 0) g_sumsq_runs_done = 0;
}

extern "C" void cuda_sumsq_runs(double *out, int ncls, const float *x, const OptRuns *r) {
    CHECK(ncls >= r->ncls_min && ncls <= RUN_MAX_CLS,
          "sumsq_runs: %d classes, but the runs use %d (at most %d)", ncls, r->ncls_min, RUN_MAX_CLS);
    if (!r->ntiles) {
        for (int c = 0; c < ncls; c++) out[c] = 0;
        return;
    }
    int G = r->ntiles < RUN_SUM_BLOCKS ? (int)r->ntiles : RUN_SUM_BLOCKS;
    double *ws = (double *)cuda_workspace(sizeof(double) * (size_t)ncls * (G + 1));
    int vec = ((uintptr_t)x & 15) == 0;
    if (r->fmt)
        sumsq_runs_k<1>
            <<<G, RUN_THREADS>>>(ws, ws + ncls, x, r->runs, r->tile_run, r->total, r->ntiles, ncls, vec);
    else
        sumsq_runs_k<0>
            <<<G, RUN_THREADS>>>(ws, ws + ncls, x, r->runs, r->tile_run, r->total, r->ntiles, ncls, vec);
    KCHECK("sumsq_runs");
    CUDA_CHECK(cudaMemcpy(out, ws, sizeof(double) * ncls, cudaMemcpyDeviceToHost));
}

// ---------------------------------------------------------------- the gradient ledger (ops.h GM_DW_SUMSQ)
// Partial sums of squares in the order written (the weight-gradient kernels' slots, cuda_grouped.cu gg_sq;
// LEDGER_BLOCKS a block range summed here), the blocks they cover counted; dw_sumsq_take sums them by a fixed
// two-level tree (ledger_take_k). The buffer grows by a stream-ordered copy (what is in it stays).
#define LEDGER_BLOCKS 256
static double *g_led;
static size_t g_led_n, g_led_cap;
static int g_led_blocks;

extern "C" double *cuda_dw_ledger_slots(size_t n, int G) {
    if (g_led_n + n + LEDGER_BLOCKS + 1 > g_led_cap) { // (take's parts and result after them)
        size_t cap = 2 * (g_led_n + n + LEDGER_BLOCKS + 1);
        if (cap < 65536) cap = 65536;
        double *p;
        CUDA_CHECK(cudaMalloc(&p, sizeof(double) * cap));
        if (g_led_n)
            CUDA_CHECK(cudaMemcpyAsync(p, g_led, sizeof(double) * g_led_n, cudaMemcpyDeviceToDevice));
        if (g_led) CUDA_CHECK(cudaFree(g_led));
        g_led = p;
        g_led_cap = cap;
    }
    double *s = g_led + g_led_n;
    g_led_n += n;
    g_led_blocks += G;
    return s;
}

// block b of LEDGER_BLOCKS: elements b, b + LEDGER_BLOCKS * blockDim.x, ... of each thread's stride, in
// double
template <int PACKED> __global__ void ledger_sum_k(double *slot, const void *dw, size_t n) {
    double q = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        double x = PACKED ? (double)bf16_to_f32(((const uint16_t *)dw)[i]) : (double)((const float *)dw)[i];
        q += x * x;
    }
    q = block_sum_d(q);
    if (threadIdx.x == 0) slot[blockIdx.x] = q;
}

extern "C" void cuda_dw_ledger_sum(const void *dw, size_t n, int packed, int G) {
    double *s = cuda_dw_ledger_slots(n ? LEDGER_BLOCKS : 0, G);
    if (!n) return;
    if (packed) ledger_sum_k<1><<<LEDGER_BLOCKS, RUN_THREADS>>>(s, dw, n);
    else ledger_sum_k<0><<<LEDGER_BLOCKS, RUN_THREADS>>>(s, dw, n);
    KCHECK("dw ledger (sum of a block range)");
}

// take: block b of LEDGER_BLOCKS sums its strided values (b's threads i, i + 256 ..., each in index order,
// then the fixed tree) into part[b]; then one block sums the parts by the same tree into *out
__global__ void ledger_take_k(double *part, const double *v, size_t n) {
    double q = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        q += v[i];
    q = block_sum_d(q);
    if (threadIdx.x == 0) part[blockIdx.x] = q;
}
__global__ void ledger_fin_k(double *out, const double *part) {
    double q = block_sum_d(part[threadIdx.x]);
    if (threadIdx.x == 0) *out = q;
}

extern "C" int cuda_dw_sumsq_take(double *sum) {
    int blocks = g_led_blocks;
    if (sum) {
        *sum = 0;
        if (g_led_n) {
            double *part = g_led + g_led_n, *res = part + LEDGER_BLOCKS;
            ledger_take_k<<<LEDGER_BLOCKS, RUN_THREADS>>>(part, g_led, g_led_n);
            ledger_fin_k<<<1, LEDGER_BLOCKS>>>(res, part);
            KCHECK("dw ledger (take)");
            CUDA_CHECK(cudaMemcpy(sum, res, sizeof(double), cudaMemcpyDeviceToHost));
        }
    }
    g_led_n = 0;
    g_led_blocks = 0;
    return blocks;
}
