// fp8_gemm_bench.c — throughput of the FP8 grouped GEMMs (src/ops/cuda/cuda_grouped_fp8.cu) beside our bf16
// grouped GEMMs (src/ops/cuda/cuda_grouped.cu) on the same shapes, in one process (CUDA builds only; the
// torch peers: scripts/device/fp8_peer.py). Shapes: the mixtral-like expert GEMM (8 groups x 4096 rows,
// K 4096, N 14336), its reverse (K 14336, N 4096), PEERS.md's reference model (8 experts, 16384 rows top-2:
// 2048 a group, d 2048, f 5632) both ways, and the weight gradients dW (G, N, K) of each up-projection.
// Then the up projections with the SwiGLU (issue 38: the fused epilogue alone against what it replaced) on
// the mixtral and ref shapes: the fused GEMM (cuda_fp8_grouped_gemm_swiglu: bf16 h1, h3, act), the same
// followed by act's 1x128 tiles (cuda_fp8_quant_tiles: the forward table's whole up projection), the unfused
// form (two FP8 GEMMs into float32 h1, h3, then cuda_fp8_swiglu_fwd_tiles: MOE_FP8_FUSE=0's), and the pair as
// one plain GEMM (float32 out) with a scale per column and with block scales (the epilogue's and the scales'
// shares apart). MOE_FP8_PAIR_SCALE=0 times the fused GEMM with a scale per column.
// Operands: random e4m3 codes (no NaN) with scales 1, random bf16 values; FLOPs 2 rows N K.
// Then (--quant-only 1: alone) the quantisers on the reference model's shapes, against the bytes each moves.
//   moe_bench_fp8 [--iters N] [--warmup N] [--swiglu-only 1 (the SwiGLU forms alone)] [--quant-only 1]
// Prints one line per shape and form: name, form, ms per call (mean over iters), TFLOP/s (GB/s).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "ops/cuda/cuda_fp8.h"
#include "ops/cuda/cuda_fp8_fused.h"
#include "ops/cuda/cuda_grouped.h"
#include "ops/cuda/cuda_grouped_fp8.h"

#define CK(call) \
    do { \
        cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) DIE("%s failed: %s", #call, cudaGetErrorString(e_)); \
    } while (0)

static int iters = 10, warmup = 3;

// n random bytes on the device: e4m3 codes without NaN (fp8 1) or bf16 values in +-[0.5, 1) (fp8 0)
static void *drand_bytes(size_t n, int fp8, uint64_t seed) {
    uint8_t *h = xmalloc(n);
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i += 8) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        uint64_t v = fp8 ? x & 0xB7B7B7B7B7B7B7B7ull // exponent bit 3 cleared: |code| < 0x7f
                         : (x & 0x807F807F807F807Full) | 0x3F003F003F003F00ull;
        memcpy(h + i, &v, n - i < 8 ? n - i : 8);
    }
    void *d;
    CK(cudaMalloc(&d, n));
    CK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    free(h);
    return d;
}
static float *dones(size_t n) {
    float *h = xmalloc(n * sizeof(float)), *d;
    for (size_t i = 0; i < n; i++) h[i] = 1.0f;
    CK(cudaMalloc((void **)&d, n * sizeof(float)));
    CK(cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice));
    free(h);
    return d;
}

typedef struct {
    int form; // see run()
    void *C, *A, *B;
    float *sa, *sb;
    const int64_t *off;
    int G, K, N;
    void *h1, *h3, *act, *f1, *f3, *q; // the SwiGLU forms' outputs (bf16 h1, h3, act; float32 h1, h3; codes)
    float *sq, *sb1; // act's scales; W1's and W3's block scales (the unfused form)
    void *B3; // W3's codes (the unfused form: B holds W1's)
    Fp8Both b1, b3; // the quantisers' outputs (forms 10-15: C the input, f1 / f3 dh1 / dh3, h1 h3 bf16)
} Call;

static int run(const Call *c) {
    switch (c->form) {
        case 0:
            return cuda_fp8_grouped_gemm(c->C, 0, 0.0f, c->A, c->sa, c->B, c->sb, 1, c->off, c->G, c->K,
                                         c->N);
        case 1:
            return cuda_fp8_grouped_gemm(c->C, 1, 0.0f, c->A, c->sa, c->B, c->sb, 1, c->off, c->G, c->K,
                                         c->N);
        case 2:
            return cuda_grouped_gemm(c->C, c->N, 0.0f, c->A, c->B, NULL, NULL, 0, c->off, c->G, c->K, 0,
                                     c->N);
        case 3:
            return cuda_fp8_grouped_gemm_dw(c->C, 0.0f, 0, 0, c->A, c->sa, c->B, c->sb, c->off, c->G, c->N,
                                            c->K);
        case 4: return cuda_grouped_gemm_dw(c->C, 0.0f, 0, 0, c->A, c->B, c->off, c->G, c->K, c->N);
        case 5: // (N: the pair's 2 O columns)
        case 6: {
            int M = (int)(c->off[c->G] - c->off[0]), O = c->N / 2;
            if (!cuda_fp8_grouped_gemm_swiglu(c->h1, c->h3, c->act, c->A, c->sa, c->B, c->sb, c->off, c->G,
                                              c->K, O))
                return 0;
            if (c->form == 6) cuda_fp8_quant_tiles(c->q, c->sq, c->act, 1, M, O, NULL);
            return 1;
        }
        case 7: {
            int M = (int)(c->off[c->G] - c->off[0]), O = c->N / 2;
            if (!cuda_fp8_grouped_gemm(c->f1, 0, 0.0f, c->A, c->sa, c->B, c->sb1, 1, c->off, c->G, c->K, O) ||
                !cuda_fp8_grouped_gemm(c->f3, 0, 0.0f, c->A, c->sa, c->B3, c->sb1, 1, c->off, c->G, c->K, O))
                return 0;
            cuda_fp8_swiglu_fwd_tiles(c->act, c->h1, c->h3, 1, c->f1, c->f3, M, O, c->q, c->sq, NULL);
            return 1;
        }
        case 10: cuda_fp8_quant_tiles(c->b1.q, c->b1.s, c->C, 1, c->G * c->N, c->K, NULL); return 1;
        case 11: cuda_fp8_quant_tiles_t(c->b1.qt, c->b1.st, c->C, 1, c->off, c->G, c->K, NULL); return 1;
        case 12: cuda_fp8_quant_both(c->b1, c->C, 1, c->off, c->G, c->K, NULL); return 1;
        case 13:
            cuda_fp8_swiglu_bwd_both(c->f1, c->f3, 1, c->C, c->h1, c->h3, c->off, c->G, c->K, c->b1, c->b3,
                                     NULL, NULL);
            return 1;
        case 14:
            cuda_fp8_quant_blocks(c->b1.q, c->b1.s, c->b1.qt, c->b1.st, c->C, 1, c->G, c->N, c->K, NULL);
            return 1;
        case 15:
            cuda_fp8_quant_blocks_pair(c->b1.q, c->b1.s, 1, c->b1.qt, c->b1.st, c->C, 1, c->G, c->N, c->K,
                                       NULL);
            return 1;
        case 8: // the pair as one GEMM, a scale per column (float32 out)
            return cuda_fp8_grouped_gemm(c->C, 0, 0.0f, c->A, c->sa, c->B, c->sb, 0, c->off, c->G, c->K,
                                         c->N);
        default: // the pair as one GEMM with block scales
            return cuda_fp8_grouped_gemm(c->C, 0, 0.0f, c->A, c->sa, c->B, c->sb1, 1, c->off, c->G, c->K,
                                         c->N);
    }
}
static const char *form_name[] = {"fp8 (f32 out)",
                                  "fp8 (bf16 out)",
                                  "bf16 (f32 out)",
                                  "fp8 dW",
                                  "bf16 dW",
                                  "fp8 SwiGLU fused",
                                  "fp8 SwiGLU fused + act tiles",
                                  "fp8 2 GEMMs + SwiGLU/act tiles",
                                  "fp8 pair, column scales",
                                  "fp8 pair, block scales",
                                  "quant tiles",
                                  "quant tiles_t",
                                  "quant both tilings",
                                  "SwiGLU bwd + both tilings x2",
                                  "quant blocks + transposed",
                                  "quant pair half + transposed"};

static void time_call(const char *shape, const Call *c, double flops) {
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int i = 0; i < warmup; i++)
        if (!run(c)) {
            printf("%-14s %-30s not taken by the kernel\n", shape, form_name[c->form]);
            return;
        }
    CK(cudaEventRecord(e0, 0));
    for (int i = 0; i < iters; i++) run(c);
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    ms /= iters;
    if (c->form >= 10) // (flops: the bytes the form must read and write)
        printf("%-14s %-30s %9.3f ms %7.0f GB/s\n", shape, form_name[c->form], ms, flops / (ms * 1e6));
    else printf("%-14s %-30s %9.3f ms %7.1f TFLOP/s\n", shape, form_name[c->form], ms, flops / (ms * 1e9));
    fflush(stdout);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
}

// G groups of m rows each: off[g] = g m (G <= 64)
static void even_offsets(int64_t *off, int G, int m) {
    if (G > 64) DIE("moe_bench_fp8: %d groups (at most 64)", G);
    for (int g = 0; g <= G; g++) off[g] = (int64_t)g * m;
}

// rows-grouped forms (0, 1, 2) on G groups of m rows, reduction K, N columns
static void shape_rows(const char *name, int G, int m, int K, int N) {
    int64_t off[65];
    even_offsets(off, G, m);
    size_t M = (size_t)G * m, TK = (K + 127) / 128, TN = (N + 127) / 128;
    void *A8 = drand_bytes(M * K, 1, 1), *B8 = drand_bytes((size_t)G * N * K, 1, 2);
    void *A16 = drand_bytes(M * K * 2, 0, 3), *B16 = drand_bytes((size_t)G * N * K * 2, 0, 4), *C;
    float *sa = dones(M * TK), *sb = dones((size_t)G * TN * TK);
    CK(cudaMalloc(&C, M * N * sizeof(float)));
    double flops = 2.0 * M * N * K;
    for (int f = 0; f < 3; f++) {
        Call c = {.form = f,
                  .C = C,
                  .A = f == 2 ? A16 : A8,
                  .B = f == 2 ? B16 : B8,
                  .sa = sa,
                  .sb = sb,
                  .off = off,
                  .G = G,
                  .K = K,
                  .N = N};
        time_call(name, &c, flops);
    }
    void *bufs[] = {A8, B8, A16, B16, C, sa, sb};
    for (int i = 0; i < 7; i++) CK(cudaFree(bufs[i]));
}

// the weight gradients dW_g (N, K) = dY_g^T X_g over G groups of m rows (m a multiple of 128)
static void shape_dw(const char *name, int G, int m, int N, int K) {
    int64_t off[65];
    even_offsets(off, G, m);
    size_t M = (size_t)G * m, TM = M / 128;
    void *A8 = drand_bytes((size_t)N * M, 1, 5), *B8 = drand_bytes((size_t)K * M, 1, 6); // dY^T, X^T
    void *A16 = drand_bytes(M * N * 2, 0, 7), *B16 = drand_bytes(M * K * 2, 0, 8), *C; // dY, X (row-major)
    float *sa = dones((size_t)N * TM), *sb = dones((size_t)K * TM);
    CK(cudaMalloc(&C, (size_t)G * N * K * sizeof(float)));
    double flops = 2.0 * M * N * K;
    Call c8 = {.form = 3, .C = C, .A = A8, .B = B8, .sa = sa, .sb = sb, .off = off, .G = G, .K = K, .N = N},
         c16 = {
             .form = 4, .C = C, .A = A16, .B = B16, .sa = sa, .sb = sb, .off = off, .G = G, .K = K, .N = N};
    time_call(name, &c8, flops);
    time_call(name, &c16, flops);
    void *bufs[] = {A8, B8, A16, B16, C, sa, sb};
    for (int i = 0; i < 7; i++) CK(cudaFree(bufs[i]));
}

// the up projections with the SwiGLU over G groups of m rows, reduction K, O columns each of W1 and W3
static void shape_swiglu(const char *name, int G, int m, int K, int O) {
    int64_t off[65];
    even_offsets(off, G, m);
    size_t M = (size_t)G * m, TK = (K + 127) / 128, N = 2 * (size_t)O;
    void *A = drand_bytes(M * K, 1, 9), *B = drand_bytes(G * N * K, 1, 10),
         *B3 = drand_bytes(G * N * K / 2, 1, 11);
    float *sa = dones(M * TK), *sbr = dones(G * N * TK), *sb1 = dones(G * ((N + 127) / 128) * TK);
    void *C, *h1, *h3, *act, *f1, *f3, *q;
    float *sq;
    CK(cudaMalloc(&C, M * N * 4));
    CK(cudaMalloc(&h1, M * O * 2));
    CK(cudaMalloc(&h3, M * O * 2));
    CK(cudaMalloc(&act, M * O * 2));
    CK(cudaMalloc(&f1, M * O * 4));
    CK(cudaMalloc(&f3, M * O * 4));
    CK(cudaMalloc(&q, M * O));
    CK(cudaMalloc((void **)&sq, M * ((O + 127) / 128) * 4));
    double flops = 2.0 * M * N * K;
    for (int f = 5; f <= 9; f++) {
        Call c = {.form = f,
                  .C = C,
                  .A = A,
                  .B = B,
                  .sa = sa,
                  .sb = sbr,
                  .off = off,
                  .G = G,
                  .K = K,
                  .N = (int)N,
                  .h1 = h1,
                  .h3 = h3,
                  .act = act,
                  .f1 = f1,
                  .f3 = f3,
                  .q = q,
                  .sq = sq,
                  .sb1 = sb1,
                  .B3 = B3};
        time_call(name, &c, flops);
    }
    void *bufs[] = {A, B, B3, sa, sbr, sb1, C, h1, h3, act, f1, f3, q, sq};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) CK(cudaFree(bufs[i]));
}

// the quantisers (cuda_fp8.h, cuda_fp8_fused.h) on G groups of m bf16 rows of d columns (tiles, tiles_t,
// both), the SwiGLU backward's f columns (dact float32, h1 h3 bf16), and G (f, d) bf16 weights (blocks), each
// timed against the bytes it must read and write (codes 1 byte, scales 4 a group)
static void shape_quant(const char *name, int G, int m, int d, int f) {
    int64_t off[65];
    even_offsets(off, G, m);
    size_t M = (size_t)G * m, n = M * f > (size_t)G * f * d ? M * f : (size_t)G * f * d, ns = n / 64;
    void *x = drand_bytes(M * d * 2, 0, 12), *dact = drand_bytes(M * f * 4, 0, 13),
         *h1 = drand_bytes(M * f * 2, 0, 14), *h3 = drand_bytes(M * f * 2, 0, 15),
         *w = drand_bytes((size_t)G * f * d * 2, 0, 16), *dh1, *dh3;
    CK(cudaMalloc(&dh1, M * f * 2));
    CK(cudaMalloc(&dh3, M * f * 2));
    Fp8Both b[2];
    for (int i = 0; i < 2; i++) {
        CK(cudaMalloc((void **)&b[i].q, 2 * n)); // (the pair's layout is two weights')
        CK(cudaMalloc((void **)&b[i].qt, n));
        CK(cudaMalloc((void **)&b[i].s, 4 * ns));
        CK(cudaMalloc((void **)&b[i].st, 4 * ns));
    }
    double md = (double)M * d, mf = (double)M * f, w1 = (double)G * f * d;
    Call c = {.C = x, .off = off, .G = G, .K = d, .N = m, .b1 = b[0], .b3 = b[1]};
    for (c.form = 10; c.form <= 12; c.form++)
        time_call(name, &c, md * (c.form == 12 ? 4 : 3) + md / 32 * (c.form == 12 ? 2 : 1));
    Call sw = {.form = 13,
               .C = dact,
               .h1 = h1,
               .h3 = h3,
               .f1 = dh1,
               .f3 = dh3,
               .off = off,
               .G = G,
               .K = f,
               .b1 = b[0],
               .b3 = b[1]};
    time_call(name, &sw, mf * 16 + mf / 32 * 4);
    Call bl = {.C = w, .G = G, .K = d, .N = f, .b1 = b[0]};
    for (bl.form = 14; bl.form <= 15; bl.form++) time_call(name, &bl, w1 * 4);
    void *bufs[] = {x,       dact,   h1,      h3,     w,       dh1,    dh3,    b[0].q,
                    b[0].qt, b[0].s, b[0].st, b[1].q, b[1].qt, b[1].s, b[1].st};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) CK(cudaFree(bufs[i]));
}

int main(int argc, char **argv) {
    int swiglu_only = 0, quant_only = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--swiglu-only")) swiglu_only = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--quant-only")) quant_only = atoi(argv[i + 1]);
        else
            DIE("unknown option '%s' (moe_bench_fp8 [--iters N] [--warmup N] [--swiglu-only 0|1] "
                "[--quant-only 0|1])",
                argv[i]);
    }
    CHECK(iters > 0 && warmup >= 0, "--iters must be > 0 and --warmup >= 0");
    if (!cuda_fp8_grouped_kernel())
        DIE("the fp8 grouped kernel does not run here (needs an sm_90 GPU, sm_90a code)");
    if (quant_only) {
        shape_quant("ref-quant", 8, 2048, 2048, 5632);
        return 0;
    }
    if (!swiglu_only) {
        shape_rows("mixtral-up", 8, 4096, 4096, 14336);
        shape_rows("mixtral-down", 8, 4096, 14336, 4096);
        shape_rows("ref-up", 8, 2048, 2048, 5632);
        shape_rows("ref-down", 8, 2048, 5632, 2048);
        shape_dw("mixtral-dW1", 8, 4096, 14336, 4096);
        shape_dw("ref-dW1", 8, 2048, 5632, 2048);
    }
    shape_swiglu("mixtral-swiglu", 8, 4096, 4096, 14336);
    shape_swiglu("ref-swiglu", 8, 2048, 2048, 5632);
    return 0;
}
