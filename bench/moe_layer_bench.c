// moe_layer_bench.c — times one MoE layer's forward + backward through the MoeLayer API
// (moe_forward + moe_backward, src/moe/moe.c) on a CUDA backend, on the shapes of
// ../shared/docs/PEERS.md and issue 17's (qwen2: Qwen2-MoE's routed experts; qwen2s: with its gated shared
// expert of 5632; e256: 256 experts top-8),
// so that it can be run beside ../shared/bench/torch_moe_peer.py (bench/torch_moe_peer_cases.py for
// the other shapes) in the same device call. Built as `moe_bench_layer` when CUDA is on. Not a test.
//
// Per case: random inputs (x ~ N(0,1), router ~ N(0, 0.02^2) as the peer: roughly balanced
// routing; expert weights ~ N(0, 0.02^2); dy ~ N(0,1)), dropless top-k with renormalisation, no
// jitter; `--warmup` untimed iterations, then `--iters` iterations each timed with CUDA events
// (synchronised after each, as the peer), median reported; TFLOP/s with the PEERS.md count
// (3 passes x 2 x T*k x 3*d*f: the expert GEMMs only; + 3 x 2 x T x 3*d*fs with a shared expert).
// Then (--profile 1) one more iteration through a timing wrapper of the Backend that records
// events around every op and synchronises after each: device time per class of op, and the host
// time between them (slot counts, the dispatch plan and its staging, launch overheads: what moe.c
// still does on the host) as wall time minus device time.
// With --fp8 1 the layer runs on the backend's FP8 table (ops.h backend_fp8: --precision fp8's experts) and
// --fp8-trace 1 adds one more iteration with every kernel of that table timed alone (cuda_fp8_trace.h: each
// launch between a cudaEvent pair, synchronised; bytes and FLOPs per kernel as GB/s and TFLOP/s against the
// H200's 4.8 TB/s and ~1,300 dense e4m3 TFLOP/s), the forward and the backward apart, then once more after
// the weights' bf16 copy is refreshed (as after each optimizer step: the kept FP8 weights made again). Then
// (--gemm 1) the expert GEMMs alone (the 9 GEMM sets of a forward + backward: h1, h3, y; dact/dw2, dxg/dw1,
// dxg/dw3, over the same groups) straight through cuBLAS, in variants that say what the backend's GEMM time
// is made of: the backend's own expert ops on the layer's buffers (conversion + GEMMs, as moe.c calls them);
// bf16 operands already converted (fp32 output, as the backend; timed before and after the backend, for
// drift; bf16 output; 4 streams); and fp32 operands with CUBLAS_COMPUTE_32F_FAST_16BF (cuBLAS converts
// internally).
//
//   moe_bench_layer [--cases mixtral,olmoe,small,ref,qwen2,qwen2s,e256] [--iters 10] [--warmup 3] [--device
//   cuda]
//                   [--profile 1] [--gemm 1] [--router-std 0.02 (sharper routing: larger)] [--fp8 0|1]
//                   [--fp8-trace 0|1]
//                   [--shadow 1 (the GEMMs read the weights' bf16 copy, as in moe train; 0: convert per
//                   call)]
// Values are not checked here (tests/test_cuda_ops.c and test_cuda_model.c do that).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "core/config.h"
#include "moe/moe.h"
#include "ops/ops.h"
#include "ops/cuda/cuda_fp8_trace.h"

#define CK(call) \
    do { \
        cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) DIE("%s: %s", #call, cudaGetErrorString(e_)); \
    } while (0)
#define CB(call) \
    do { \
        cublasStatus_t s_ = (call); \
        if (s_ != CUBLAS_STATUS_SUCCESS) DIE("%s: cublas status %d", #call, (int)s_); \
    } while (0)

// ---------------------------------------------------------------- random data
#define POOL ((size_t)1 << 24)
static float *g_pool; // N(0,1) values
static uint16_t *g_pool_bf; // the same as bf16 bits

static void pool_init(void) {
    Rng r;
    rng_seed(&r, 20261129);
    g_pool = xmalloc(POOL * sizeof(float));
    g_pool_bf = xmalloc(POOL * sizeof(uint16_t));
    for (size_t i = 0; i < POOL; i++) {
        g_pool[i] = rng_normal(&r);
        uint32_t u;
        memcpy(&u, &g_pool[i], 4);
        u += 0x7fffu + ((u >> 16) & 1u);
        g_pool_bf[i] = (uint16_t)(u >> 16);
    }
}

// Fills n device floats (or bf16 when bf) with scale * pool values: chunks of 4M values, each
// starting at another offset of the pool, so rows do not repeat with a short period.
static void fill(void *dst, size_t n, float scale, int bf, uint64_t seed) {
    const size_t CH = (size_t)1 << 22;
    size_t es = bf ? 2 : 4;
    void *st = xmalloc(CH * es);
    Rng r;
    rng_seed(&r, seed);
    for (size_t i0 = 0; i0 < n; i0 += CH) {
        size_t m = n - i0 < CH ? n - i0 : CH, o = (size_t)(rng_uniform(&r) * (POOL - CH));
        if (bf) {
            memcpy(st, g_pool_bf + o, m * 2); // scale ignored for bf16 (timing only)
        } else {
            float *s = st;
            for (size_t j = 0; j < m; j++) s[j] = scale * g_pool[o + j];
        }
        CK(cudaMemcpy((char *)dst + i0 * es, st, m * es, cudaMemcpyHostToDevice));
    }
    free(st);
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// ---------------------------------------------------------------- the timing wrapper
enum {
    C_ROUTER,
    C_XFER,
    C_GATHER,
    C_COPY,
    C_GEMM_F,
    C_GEMM_B,
    C_SWIGLU,
    C_COMBINE,
    C_ZERO,
    C_OTHER,
    C_UNPERM,
    C_RKERN,
    NC
};
static const char *cname[NC] = {"router GEMM fwd+bwd (fp32, O=E)",
                                "host<->device copies (router out, plan, aux)",
                                "permute: gather rows",
                                "exchange copies (EP>1 or ETP>1 only)",
                                "expert GEMMs fwd (3, incl. bf16 conversion)",
                                "expert GEMMs bwd (6, incl. conversion)",
                                "SwiGLU fwd+bwd",
                                "combine backward: gather_dot_scale",
                                "zero fills",
                                "axpy / mul",
                                "combine + un-permute: combine_rows",
                                "router softmax/top-k/sums + router bwd"};
static const Backend *RB; // the real backend
static Backend PB; // the wrapper
static int g_prof;
static double g_ms[NC];
static int g_calls[NC];
static cudaEvent_t g_e0, g_e1;

static void pre(void) {
    if (g_prof) CK(cudaEventRecord(g_e0, 0));
}
static void post(int c) {
    if (!g_prof) return;
    CK(cudaEventRecord(g_e1, 0));
    CK(cudaEventSynchronize(g_e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, g_e0, g_e1));
    g_ms[c] += ms;
    g_calls[c]++;
}
#define WRAP(c, call) \
    do { \
        pre(); \
        call; \
        post(c); \
    } while (0)
static void w_to_device(void *d, const void *s, size_t b) { WRAP(C_XFER, RB->to_device(d, s, b)); }
static void w_to_host(void *d, const void *s, size_t b) { WRAP(C_XFER, RB->to_host(d, s, b)); }
static void w_copy(void *d, const void *s, size_t b) { WRAP(C_COPY, RB->copy(d, s, b)); }
static void w_zero(void *p, size_t b) { WRAP(C_ZERO, RB->zero(p, b)); }
static void w_mf(float *o, const float *i, const float *w, int N, int K, int O, int a) {
    WRAP(C_ROUTER, RB->matmul_fwd(o, i, w, N, K, O, a));
}
static void w_mb(float *di, float *dw, const float *g, const float *i, const float *w, int N, int K, int O,
                 int f) {
    WRAP(C_ROUTER, RB->matmul_bwd(di, dw, g, i, w, N, K, O, f));
}
static void w_gf(float *o, const float *i, const float *w, const int64_t *off, int G, int K, int O) {
    WRAP(C_GEMM_F, RB->grouped_matmul_fwd(o, i, w, off, G, K, O));
}
static void w_gb(float *di, float *dw, const float *g, const float *i, const float *w, const int64_t *off,
                 int G, int K, int O, int a) {
    WRAP(C_GEMM_B, RB->grouped_matmul_bwd(di, dw, g, i, w, off, G, K, O, a));
}
static void w_gsf(void *h1, void *h3, void *a, const void *i, const float *w1, const float *w3,
                  const int64_t *off, int G, int K, int O) {
    WRAP(C_GEMM_F, RB->grouped_swiglu_fwd(h1, h3, a, i, w1, w3, off, G, K, O));
}
static void w_gsb(void *d1, void *d3, float *dw, const void *g, const void *a, const void *h1, const void *h3,
                  const float *w, const int64_t *off, int G, int K, int O, int fl) {
    WRAP(C_GEMM_B, RB->grouped_swiglu_bwd(d1, d3, dw, g, a, h1, h3, w, off, G, K, O, fl));
}
static void w_gdown(float *o, const void *a, const float *w, const int64_t *off, int G, int K, int O) {
    WRAP(C_GEMM_F, RB->grouped_down_fwd(o, a, w, off, G, K, O));
}
static void w_gb2(float *di, float *dwa, float *dwb, const void *ga, const void *gb, const void *i,
                  const float *wa, const float *wb, const int64_t *off, int G, int K, int O, int a) {
    WRAP(C_GEMM_B, RB->grouped_matmul_bwd2(di, dwa, dwb, ga, gb, i, wa, wb, off, G, K, O, a));
}
static void w_sf(float *o, const float *a, const float *b, size_t n) {
    WRAP(C_SWIGLU, RB->swiglu_fwd(o, a, b, n));
}
static void w_sb(float *d1, float *d3, const float *g, const float *a, const float *b, size_t n, int ac) {
    WRAP(C_SWIGLU, RB->swiglu_bwd(d1, d3, g, a, b, n, ac));
}
static void w_gather(float *o, const float *i, const int32_t *idx, int n, int C) {
    WRAP(C_GATHER, RB->gather_rows(o, i, idx, n, C));
}
static void w_combine_rows(float *o, const float *res, const float *r, const int32_t *sr, const float *w,
                           int N, int k, int C, int a) {
    WRAP(C_UNPERM, RB->combine_rows(o, res, r, sr, w, N, k, C, a));
}
static void w_router_topk(float *p, float *l, int32_t *ix, float *w, double *sm, const float *lg,
                          const float *b, int N, int E, RouteRule r) {
    WRAP(C_RKERN, RB->router_topk(p, l, ix, w, sm, lg, b, N, E, r));
}
static void w_router_bwd(float *dl, const float *rd, const int32_t *sr, const float *p, const float *l,
                         const int32_t *ix, const float *w, const float *ad, float zd, int N, int E,
                         RouteRule r) {
    WRAP(C_RKERN, RB->router_bwd(dl, rd, sr, p, l, ix, w, ad, zd, N, E, r));
}
static void w_gds(void *o, float *d, const float *i, const int32_t *x, const float *b, const float *s, int n,
                  int C, int h) {
    WRAP(C_COMBINE, RB->gather_dot_scale(o, d, i, x, b, s, n, C, h));
}
static void w_gather_h(void *o, const void *i, int h, const int32_t *idx, int n, int C) {
    WRAP(C_GATHER, RB->gather_rows_hid(o, i, h, idx, n, C));
}
static void w_plan_counts(int32_t *c, int32_t *r, const int32_t *i, int N, int E, int k) {
    WRAP(C_RKERN, RB->plan_counts(c, r, i, N, E, k));
}
static void w_plan_rows(int32_t *s, int32_t *t, float *sc, const int32_t *r, const int32_t *i, const float *w,
                        const int32_t *kp, const int32_t *f, int N, int E, int k) {
    WRAP(C_RKERN, RB->plan_rows(s, t, sc, r, i, w, kp, f, N, E, k));
}
static void w_mul(float *o, const float *a, const float *b, size_t n) { WRAP(C_OTHER, RB->mul(o, a, b, n)); }
static void w_axpy(float *y, const float *x, float a, size_t n) { WRAP(C_OTHER, RB->axpy(y, x, a, n)); }

static const Backend *wrap_backend(const Backend *real) {
    RB = real;
    PB = *real;
    PB.to_device = w_to_device;
    PB.to_host = w_to_host;
    PB.copy = w_copy;
    PB.zero = w_zero;
    PB.matmul_fwd = w_mf;
    PB.matmul_bwd = w_mb;
    PB.grouped_matmul_fwd = w_gf;
    PB.grouped_matmul_bwd = w_gb;
    PB.grouped_swiglu_fwd = w_gsf;
    PB.grouped_swiglu_bwd = w_gsb;
    PB.grouped_matmul_bwd2 = w_gb2;
    PB.grouped_down_fwd = w_gdown;
    PB.swiglu_fwd = w_sf;
    PB.swiglu_bwd = w_sb;
    PB.gather_rows = w_gather;
    PB.gather_rows_hid = w_gather_h;
    PB.mul = w_mul;
    PB.axpy = w_axpy;
    PB.combine_rows = w_combine_rows;
    PB.router_topk = w_router_topk;
    PB.router_bwd = w_router_bwd;
    PB.plan_counts = w_plan_counts;
    PB.gather_dot_scale = w_gds;
    PB.plan_rows = w_plan_rows;
    CK(cudaEventCreate(&g_e0));
    CK(cudaEventCreate(&g_e1));
    return &PB;
}

// ---------------------------------------------------------------- expert GEMMs alone
typedef struct {
    int ns;
    cublasHandle_t h[4];
    cudaStream_t s[4];
    cudaEvent_t fork, join[4];
} Gctx;

typedef struct {
    const void *X, *W1, *W2, *H, *dY; // inputs: (R,d) (E,f,d) (E,d,f) (R,f) (R,d)
    void *OF, *OD, *OW; // outputs: (R,f) (R,d) (E,f,d) (reused: timing only)
    cudaDataType_t ti, to;
    cublasComputeType_t ct;
} Gbufs;

static void gemm(Gctx *c, int i, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                 const void *A, int lda, const void *B, int ldb, float beta, void *C, int ldc, const Gbufs *b,
                 size_t ea, size_t eb, size_t ec, size_t oa, size_t ob, size_t oc) {
    const float one = 1.0f;
    CB(cublasGemmEx(c->h[i % c->ns], ta, tb, m, n, k, &one, (const char *)A + oa * ea, b->ti, lda,
                    (const char *)B + ob * eb, b->ti, ldb, &beta, (char *)C + oc * ec, b->to, ldc, b->ct,
                    CUBLAS_GEMM_DEFAULT));
}

// The 9 GEMM sets of one forward + backward over the groups off[0..E].
static void expert_gemms(Gctx *c, const Gbufs *b, const int64_t *off, int E, int d, int f) {
    size_t ei = b->ti == CUDA_R_16BF ? 2 : 4, eo = b->to == CUDA_R_16BF ? 2 : 4;
    if (c->ns > 1) {
        CK(cudaEventRecord(c->fork, 0));
        for (int i = 0; i < c->ns; i++) CK(cudaStreamWaitEvent(c->s[i], c->fork, 0));
    }
    const cublasOperation_t T = CUBLAS_OP_T, N = CUBLAS_OP_N;
    for (int pass = 0; pass < 9; pass++)
        for (int g = 0; g < E; g++) {
            int64_t r0 = off[g], n = off[g + 1] - off[g];
            if (n <= 0) continue;
            size_t wfd = (size_t)g * f * d;
            switch (pass) {
                case 0:
                case 1: // h1, h3 (R,f) = X W1^T
                    gemm(c, g, T, N, f, n, d, b->W1, d, b->X, d, 0, b->OF, f, b, ei, ei, eo, wfd, r0 * d,
                         r0 * f);
                    break;
                case 2: // y (R,d) = H W2^T
                    gemm(c, g, T, N, d, n, f, b->W2, f, b->H, f, 0, b->OD, d, b, ei, ei, eo, wfd, r0 * f,
                         r0 * d);
                    break;
                case 3: // dact (R,f) = dY W2 (overwritten, as moe.c)
                    gemm(c, g, N, N, f, n, d, b->W2, f, b->dY, d, 0, b->OF, f, b, ei, ei, eo, wfd, r0 * d,
                         r0 * f);
                    break;
                case 4: // dW2 (d,f) += dY^T H
                    gemm(c, g, N, T, f, d, n, b->H, f, b->dY, d, 1, b->OW, f, b, ei, ei, eo, r0 * f, r0 * d,
                         wfd);
                    break;
                case 5:
                case 7: // dxg (R,d) = dH1 W1, then += dH3 W3 (as moe.c)
                    gemm(c, g, N, N, d, n, f, b->W1, d, b->H, f, pass == 7, b->OD, d, b, ei, ei, eo, wfd,
                         r0 * f, r0 * d);
                    break;
                case 6:
                case 8: // dW1 (f,d) += dH^T X
                    gemm(c, g, N, T, d, f, n, b->X, d, b->H, f, 1, b->OW, d, b, ei, ei, eo, r0 * d, r0 * f,
                         wfd);
                    break;
            }
        }
    if (c->ns > 1)
        for (int i = 0; i < c->ns; i++) {
            CK(cudaEventRecord(c->join[i], c->s[i]));
            CK(cudaStreamWaitEvent(0, c->join[i], 0));
        }
}

// The same 9 sets through the backend's expert ops on the layer's buffers, as moe.c calls them (on
// "cuda": the dispatched rows and hidden rows in bf16, our grouped kernel).
typedef struct {
    MoeLayer *m;
    MoeScratch *s;
    const MoeWeights *w;
    MoeGrads *g;
} Lctx;
static void backend_gemms(const Lctx *l) {
    MoeLayer *m = l->m;
    MoeScratch *s = l->s;
    int d = m->d, f = m->fl, El = m->El;
    const int64_t *off = m->x.off;
    const void *dyg = m->x.local ? s->dys : s->dyg; // the local exchange passes rows through
    RB->grouped_swiglu_fwd(m->h1, m->h3, m->act, m->xgp, l->w->w1, l->w->w3, off, El, d, f);
    RB->grouped_down_fwd(m->yg, m->act, l->w->w2, off, El, f, d);
    void *dh1, *dh3;
    float *dxg;
    moe_bwd_rows(m, s, &dh1, &dh3, &dxg); // (the scratch's, or where the lean scratch writes them)
    RB->grouped_swiglu_bwd(dh1, dh3, l->g->w2, dyg, m->act, m->h1, m->h3, l->w->w2, off, El, f, d, 0);
    RB->grouped_matmul_bwd2(dxg, l->g->w1, l->g->w3, dh1, dh3, m->xgp, l->w->w1, l->w->w3, off, El, d, f, 0);
}

static double time_gemms(Gctx *c, const Gbufs *b, const int64_t *off, int E, int d, int f, int warm,
                         int iters, const Lctx *l) {
    cudaEvent_t a, z;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&z));
    double *t = xmalloc(sizeof(double) * iters);
    for (int i = 0; i < warm; i++) l ? backend_gemms(l) : expert_gemms(c, b, off, E, d, f);
    CK(cudaDeviceSynchronize());
    for (int i = 0; i < iters; i++) {
        CK(cudaEventRecord(a, 0));
        l ? backend_gemms(l) : expert_gemms(c, b, off, E, d, f);
        CK(cudaEventRecord(z, 0));
        CK(cudaEventSynchronize(z));
        float ms;
        CK(cudaEventElapsedTime(&ms, a, z));
        t[i] = ms;
    }
    double m = median(t, iters);
    free(t);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(z));
    return m;
}

// ---------------------------------------------------------------- one case
typedef struct {
    const char *name;
    int T, d, f, E, k, fs;
} Case; // fs: a gated shared expert's width (0: none)

static float g_router_std = 0.02f; // --router-std: larger values give sharper, less balanced routing
static int g_shadow = 1; // --shadow: the weights' bf16 copy (ops.h bf16_shadow), as moe train keeps it
static int g_trace; // --fp8-trace: the FP8 table's kernels timed alone in one more iteration

// --fp8-trace: one forward and one backward with the FP8 table's kernels timed alone (a table each), then
// both again after the weights' bf16 copy is refreshed (the kept FP8 weights made again, as each step does).
static void trace_iteration(MoeLayer *m, MoeScratch *s, float *y, const float *x, float *dx, const float *dy,
                            const MoeWeights *w, MoeGrads *g, const ModelConfig *c, int T, const float *wall,
                            size_t nall, const Backend *be) {
    const double bw = 4800, mma = 1300; // the H200's HBM GB/s, its dense e4m3 TFLOP/s as measured (issue 38)
    for (int pass = 0; pass < 2; pass++) {
        if (pass && !g_shadow) break;
        if (pass) be->bf16_shadow(wall, nall); // (a new version of the copy: the kept codes are made again)
        CK(cudaDeviceSynchronize());
        cuda_fp8_trace_arm(1);
        moe_forward(m, y, NULL, x, T, w, c, 0, 0);
        CK(cudaDeviceSynchronize());
        printf(
            "fp8 kernels, forward%s (each launch alone, synchronised; %% of %.0f GB/s and %.0f TFLOP/s):\n",
            pass ? ", the weights' codes made again" : "", bw, mma);
        cuda_fp8_trace_print(stdout, bw, mma);
        cuda_fp8_trace_arm(1);
        moe_backward(m, s, dx, dy, x, w, g, c, 0.01f, 0.001f);
        CK(cudaDeviceSynchronize());
        printf("fp8 kernels, backward%s:\n", pass ? ", the weights' codes made again" : "");
        cuda_fp8_trace_print(stdout, bw, mma);
        cuda_fp8_trace_arm(0);
    }
}

static void run_case(const Case *cs, const Backend *real, int warm, int iters, int prof, int gemms) {
    int T = cs->T, d = cs->d, f = cs->f, E = cs->E, k = cs->k, fs = cs->fs;
    ModelConfig c;
    config_preset(&c, "tiny");
    c.d_model = d;
    c.d_ff = f;
    c.n_experts = E;
    c.top_k = k;
    c.renormalize = 1;
    c.jitter = 0;
    c.dispatch = DISPATCH_DROPLESS;
    c.n_shared_experts = fs > 0;
    c.shared_d_ff = fs;
    const Backend *be = wrap_backend(real);
    double rflops = 3.0 * 2.0 * T * k * 3.0 * d * f, flops = rflops + 3.0 * 2.0 * T * 3.0 * d * fs;
    size_t F = sizeof(float), Nd = (size_t)T * d, W = (size_t)E * f * d, Ws = (size_t)fs * d;
    float *x = be->alloc(Nd * F), *dy = be->alloc(Nd * F), *y = be->alloc(Nd * F), *dx = be->alloc(Nd * F);
    // the router, the three expert weights and the shared expert's (with its gate) in one buffer, as in
    // the trainer's parameter buffer, so that --shadow 1 (the default, as `moe train`) gives the GEMMs
    // the bf16 copy AdamW keeps there
    size_t nall = (size_t)E * d + 3 * W + 3 * Ws + (fs ? d : 0);
    float *wall = be->alloc(nall * F), *wr = wall, *w1 = wr + (size_t)E * d, *w3 = w1 + W, *w2 = w3 + W;
    float *s1 = w2 + W, *s3 = s1 + Ws, *s2 = s3 + Ws, *sg = s2 + Ws;
    float *gr = be->alloc((size_t)E * d * F), *g1 = be->alloc(W * F), *g3 = be->alloc(W * F),
          *g2 = be->alloc(W * F);
    float *gs = be->alloc((3 * Ws + d) * F);
    fill(x, Nd, 1.0f, 0, 1);
    fill(dy, Nd, 1.0f, 0, 2);
    fill(wr, (size_t)E * d, g_router_std, 0, 3);
    fill(w1, W, 0.02f, 0, 4);
    fill(w3, W, 0.02f, 0, 5);
    fill(w2, W, 0.02f, 0, 6);
    if (fs) fill(s1, 3 * Ws + d, 0.02f, 0, 7);
    if (g_shadow) be->bf16_shadow(wall, nall);
    MoeLayer m;
    MoeScratch s;
    moe_layer_init(&m, be, &c, T, NULL);
    moe_scratch_init(&s, be, &c, T);
    MoeWeights w = {.router = wr, .w1 = w1, .w3 = w3, .w2 = w2};
    MoeGrads g = {.router = gr, .w1 = g1, .w3 = g3, .w2 = g2};
    if (fs) {
        w.sh_w1 = s1;
        w.sh_w3 = s3;
        w.sh_w2 = s2;
        w.sh_gate = sg;
        g.sh_w1 = gs;
        g.sh_w3 = gs + Ws;
        g.sh_w2 = gs + 2 * Ws;
        g.sh_gate = gs + 3 * Ws;
    }
    cudaEvent_t a, z, mid;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&z));
    CK(cudaEventCreate(&mid));
    double *t = xmalloc(sizeof(double) * (iters > 0 ? iters : 1)), *tf = xmalloc(sizeof(double) * iters),
           *tb = xmalloc(sizeof(double) * iters);
    double t0 = now_seconds();
    for (int i = 0; i < warm; i++) {
        moe_forward(&m, y, NULL, x, T, &w, &c, 0, 0);
        moe_backward(&m, &s, dx, dy, x, &w, &g, &c, 0.01f, 0.001f);
    }
    CK(cudaDeviceSynchronize());
    double twarm = now_seconds() - t0;
    for (int i = 0; i < iters; i++) {
        CK(cudaEventRecord(a, 0));
        moe_forward(&m, y, NULL, x, T, &w, &c, 0, 0);
        CK(cudaEventRecord(mid, 0));
        moe_backward(&m, &s, dx, dy, x, &w, &g, &c, 0.01f, 0.001f);
        CK(cudaEventRecord(z, 0));
        CK(cudaEventSynchronize(z));
        float ms, mf;
        CK(cudaEventElapsedTime(&ms, a, z));
        CK(cudaEventElapsedTime(&mf, a, mid));
        t[i] = ms, tf[i] = mf, tb[i] = ms - mf;
    }
    double tmin = 1e30, tmax = 0;
    for (int i = 0; i < iters; i++) {
        if (t[i] < tmin) tmin = t[i];
        if (t[i] > tmax) tmax = t[i];
    }
    double ms = iters > 0 ? median(t, iters) : 0;
    int64_t cmax = 0;
    for (int e = 0; e < E; e++)
        if (m.counts[e] > cmax) cmax = m.counts[e];
    double load = (double)cmax / ((double)T * k / E);
    size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot));
    printf("\n== %s: T %d d %d f %d E %d k %d shared %d, backend %s | load max/mean %.3f | GPU memory in use "
           "%.1f GiB\n",
           cs->name, T, d, f, E, k, fs, real->name, load, (double)(tot - fr) / (1 << 30));
    printf("layer fwd+bwd: median %.2f ms (min %.2f, max %.2f, %d iters after %d warm-up in %.1f s) = %.1f "
           "TFLOP/s "
           "(%.1f%% of 775)\n",
           ms, tmin, tmax, iters, warm, twarm, flops / ms / 1e9, flops / ms / 1e9 / 7.75);
    double msf = median(tf, iters), msb = median(tb, iters);
    printf("layer fwd %.2f ms, bwd %.2f ms (medians over the same iterations)\n", msf, msb);
    if (g_trace && real->fp8) trace_iteration(&m, &s, y, x, dx, dy, &w, &g, &c, T, wall, nall, be);

    double pms[NC] = {0}, pdev = 0, pwall = 0;
    if (prof) {
        memset(g_ms, 0, sizeof g_ms);
        memset(g_calls, 0, sizeof g_calls);
        CK(cudaDeviceSynchronize());
        g_prof = 1;
        double w0 = now_seconds();
        moe_forward(&m, y, NULL, x, T, &w, &c, 0, 0);
        moe_backward(&m, &s, dx, dy, x, &w, &g, &c, 0.01f, 0.001f);
        CK(cudaDeviceSynchronize());
        pwall = (now_seconds() - w0) * 1e3;
        g_prof = 0;
        for (int i = 0; i < NC; i++) {
            pms[i] = g_ms[i];
            pdev += g_ms[i];
        }
        printf("breakdown (one iteration, synchronised after every op: %.2f ms wall):\n", pwall);
        printf("  %-48s %9s %6s %6s\n", "piece", "ms", "%", "calls");
        for (int i = 0; i < NC; i++)
            if (g_calls[i])
                printf("  %-48s %9.3f %5.1f%% %6d\n", cname[i], pms[i], 100 * pms[i] / pwall, g_calls[i]);
        printf("  %-48s %9.3f %5.1f%%\n", "host: counts, plan, launches", pwall - pdev,
               100 * (pwall - pdev) / pwall);
        if (pms[C_GEMM_F] + pms[C_GEMM_B] > 0)
            printf("  expert GEMMs fwd+bwd: %.2f ms = %.1f TFLOP/s\n", pms[C_GEMM_F] + pms[C_GEMM_B],
                   flops / (pms[C_GEMM_F] + pms[C_GEMM_B]) / 1e9);
    }

    // expert GEMMs alone, through cuBLAS, over the groups of the last forward
    enum { NV = 7 };
    double gv[NV] = {0};
    const char *gname[NV] = {"bf16 in, fp32 out, 1 stream (= backend minus conversion)",
                             "bf16 in, bf16 out, 1 stream",
                             "bf16 in, fp32 out, 4 streams",
                             "fp32 in, COMPUTE_32F_FAST_16BF, fp32 out",
                             "bf16 in, bf16 out, 4 streams",
                             "the backend's expert ops (as moe.c calls them)",
                             "bf16 in, fp32 out, 1 stream, again (drift)"};
    if (gemms) {
        be->bf16_shadow(NULL, 0); // the GEMM variants below time the conversions they name
        size_t R = (size_t)m.x.Rg;
        Gctx gc;
        memset(&gc, 0, sizeof gc);
        gc.ns = 4;
        for (int i = 0; i < 4; i++) {
            CK(cudaStreamCreateWithFlags(&gc.s[i], cudaStreamNonBlocking));
            CB(cublasCreate(&gc.h[i]));
            CB(cublasSetStream(gc.h[i], gc.s[i]));
            CK(cudaEventCreateWithFlags(&gc.join[i], cudaEventDisableTiming));
        }
        CK(cudaEventCreateWithFlags(&gc.fork, cudaEventDisableTiming));
        cublasHandle_t h0;
        CB(cublasCreate(&h0));
        void *X, *W1, *W2, *H, *dY, *OF, *OD, *OW;
        CK(cudaMalloc(&X, R * d * 2));
        CK(cudaMalloc(&W1, W * 2));
        CK(cudaMalloc(&W2, W * 2));
        CK(cudaMalloc(&H, R * f * 2));
        CK(cudaMalloc(&dY, R * d * 2));
        CK(cudaMalloc(&OF, R * f * 4));
        CK(cudaMalloc(&OD, R * d * 4));
        CK(cudaMalloc(&OW, W * 4));
        fill(X, R * d, 1, 1, 11);
        fill(W1, W, 1, 1, 12);
        fill(W2, W, 1, 1, 13);
        fill(H, R * f, 1, 1, 14);
        fill(dY, R * d, 1, 1, 15);
        CK(cudaMemset(OF, 0, R * f * 4));
        CK(cudaMemset(OD, 0, R * d * 4));
        CK(cudaMemset(OW, 0, W * 4));
        Gbufs bb = {X, W1, W2, H, dY, OF, OD, OW, CUDA_R_16BF, CUDA_R_32F, CUBLAS_COMPUTE_32F};
        Gctx one = gc;
        one.ns = 1;
        one.h[0] = h0; // on the legacy default stream, like the backend
        int gw = 1, gi = iters < 5 ? iters : 5;
        if (gi < 1) gi = 1;
        Lctx lc = {&m, &s, &w, &g};
        gv[0] = time_gemms(&one, &bb, m.x.off, m.El, d, f, gw, gi, NULL);
        gv[5] = time_gemms(NULL, NULL, NULL, 0, 0, 0, gw, gi, &lc);
        gv[6] = time_gemms(&one, &bb, m.x.off, m.El, d, f, gw, gi, NULL);
        Gbufs b16 = bb;
        b16.to = CUDA_R_16BF;
        gv[1] = time_gemms(&one, &b16, m.x.off, m.El, d, f, gw, gi, NULL);
        gv[2] = time_gemms(&gc, &bb, m.x.off, m.El, d, f, gw, gi, NULL);
        gv[4] = time_gemms(&gc, &b16, m.x.off, m.El, d, f, gw, gi, NULL);
        // fp32 operands: float32 stand-ins for the dispatched and hidden rows (the layer keeps those in the
        // hidden format, bf16 on "cuda"), the layer's float32 weights
        void *H32, *X32, *D32;
        CK(cudaMalloc(&H32, R * f * 4));
        CK(cudaMalloc(&X32, R * d * 4));
        CK(cudaMalloc(&D32, R * d * 4));
        fill(H32, R * f, 1, 0, 16);
        fill(X32, R * d, 1, 0, 17);
        fill(D32, R * d, 1, 0, 18);
        Gbufs b32 = {
            X32, w1, w2, H32, D32, OF, m.yg, g1, CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_16BF};
        gv[3] = time_gemms(&one, &b32, m.x.off, m.El, d, f, gw, gi, NULL);
        cudaFree(H32);
        cudaFree(X32);
        cudaFree(D32);
        printf("expert GEMMs alone (9 grouped sets of fwd+bwd, cuBLAS loop over %d groups, median of %d):\n",
               m.El, gi);
        int order[NV] = {0, 5, 6, 1, 2, 4, 3};
        for (int j = 0; j < NV; j++)
            printf("  %-58s %8.2f ms %7.1f TFLOP/s\n", gname[order[j]], gv[order[j]],
                   rflops / gv[order[j]] / 1e9);
        cudaFree(X);
        cudaFree(W1);
        cudaFree(W2);
        cudaFree(H);
        cudaFree(dY);
        cudaFree(OF);
        cudaFree(OD);
        cudaFree(OW);
        for (int i = 0; i < 4; i++) {
            cublasDestroy(gc.h[i]);
            cudaStreamDestroy(gc.s[i]);
            cudaEventDestroy(gc.join[i]);
        }
        cudaEventDestroy(gc.fork);
        cublasDestroy(h0);
    }
    // one JSON line per case (for docs/PERFORMANCE.md)
    printf("{\"case\":\"%s\",\"impl\":\"moe.c %s\",\"T\":%d,\"d\":%d,\"f\":%d,\"E\":%d,\"k\":%d,\"fs\":%d,"
           "\"ms_fwd_bwd\":%.2f,\"ms_fwd\":%.2f,\"ms_bwd\":%.2f,\"expert_tflops\":%.1f,"
           "\"load_max_over_mean\":%.3f",
           cs->name, real->name, T, d, f, E, k, fs, ms, msf, msb, flops / ms / 1e9, load);
    if (prof) {
        printf(",\"profile_wall_ms\":%.2f,\"host_ms\":%.2f", pwall, pwall - pdev);
        const char *key[NC] = {"router_gemm", "xfer",    "gather", "copy",  "gemm_fwd",     "gemm_bwd",
                               "swiglu",      "combine", "zero",   "other", "combine_rows", "router_kernels"};
        for (int i = 0; i < NC; i++) printf(",\"%s_ms\":%.3f", key[i], pms[i]);
    }
    if (gemms)
        printf(",\"gemm_bf16_f32out_ms\":%.2f,\"gemm_bf16_bf16out_ms\":%.2f,\"gemm_bf16_4streams_ms\":%.2f,"
               "\"gemm_fast16bf_ms\":%.2f,\"gemm_bf16_bf16out_4streams_ms\":%.2f,\"gemm_backend_ms\":%.2f,"
               "\"gemm_bf16_f32out_again_ms\":%.2f",
               gv[0], gv[1], gv[2], gv[3], gv[4], gv[5], gv[6]);
    printf("}\n");
    fflush(stdout);
    free(t);
    free(tf);
    free(tb);
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(z));
    CK(cudaEventDestroy(mid));
    CK(cudaEventDestroy(g_e0));
    CK(cudaEventDestroy(g_e1));
    moe_scratch_free(&s);
    moe_layer_free(&m);
    void *bufs[] = {x, dy, y, dx, wall, gr, g1, g3, g2, gs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(bufs[i]);
}

int main(int argc, char **argv) {
    const char *cases = "mixtral,olmoe,small", *dev = "cuda";
    int iters = 10, warm = 3, prof = 1, gemms = 1, fp8 = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            printf("moe_bench_layer [--cases mixtral,olmoe,small,ref,qwen2,qwen2s,e256] [--iters 10] "
                   "[--warmup 3] [--device cuda|cuda-fp32] "
                   "[--profile 0|1] [--gemm 0|1] [--router-std 0.02] [--shadow 1|0] [--fp8 0|1] "
                   "[--fp8-trace 0|1]\n");
            return 0;
        }
        CHECK(v, "%s needs a value (--help lists the options)", a);
        if (!strcmp(a, "--cases")) cases = v;
        else if (!strcmp(a, "--iters")) iters = atoi(v);
        else if (!strcmp(a, "--warmup")) warm = atoi(v);
        else if (!strcmp(a, "--device")) dev = v;
        else if (!strcmp(a, "--profile")) prof = atoi(v);
        else if (!strcmp(a, "--gemm")) gemms = atoi(v);
        else if (!strcmp(a, "--router-std")) g_router_std = (float)atof(v);
        else if (!strcmp(a, "--shadow")) g_shadow = atoi(v);
        else if (!strcmp(a, "--fp8")) fp8 = atoi(v);
        else if (!strcmp(a, "--fp8-trace")) g_trace = atoi(v);
        else DIE("unknown option %s (--help lists them)", a);
        i++;
    }
    CHECK(iters >= 1 && warm >= 0, "--iters must be >= 1 and --warmup >= 0");
    if (!backend_cuda_available()) DIE("moe_bench_layer needs a CUDA GPU");
    const Backend *real = backend_by_name(dev);
    CHECK(real != backend_cpu(), "moe_bench_layer times a CUDA backend (--device cuda or cuda-fp32)");
    if (fp8) real = backend_fp8(real);
    CHECK(!g_trace || fp8, "--fp8-trace 1 times the FP8 table's kernels: it needs --fp8 1");
    const Case all[] = {
        {"mixtral", 16384, 4096, 14336, 8, 2, 0},
        {"olmoe", 16384, 2048, 1024, 64, 8, 0},
        {"small", 8192, 1024, 2816, 8, 2, 0},
        {"ref", 8192, 2048, 5632, 8, 2, 0}, // the PEERS.md full-step model's MoE layer (batch 4 x 2048)
        {"qwen2", 16384, 2048, 1408, 60, 4, 0}, // Qwen2-MoE's routed experts (issue 17; no shared expert)
        {"qwen2s", 16384, 2048, 1408, 60, 4, 5632}, // ... and its gated shared expert
        {"e256", 16384, 2048, 512, 256, 8, 0}}; // fine-grained: 256 experts, top-8
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("moe_bench_layer: %s, %d SMs, backend %s; FLOPs = 3 x 2 x T*k x 3*d*f (PEERS.md) [+ 3 x 2 x T x "
           "3*d*fs]\n",
           p.name, p.multiProcessorCount, real->name);
    pool_init();
    int ran = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        size_t L = strlen(all[i].name);
        int named = 0; // a whole item of the comma list
        for (const char *q = cases; !named && (q = strstr(q, all[i].name)); q++)
            named = (q == cases || q[-1] == ',') && (!q[L] || q[L] == ',');
        if (!named) continue;
        run_case(&all[i], real, warm, iters, prof, gemms);
        ran++;
    }
    CHECK(ran > 0, "--cases %s: none of mixtral, olmoe, small, ref, qwen2, qwen2s, e256", cases);
    free(g_pool);
    free(g_pool_bf);
    return 0;
}
