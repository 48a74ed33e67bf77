// test_cuda_ops.c — every op of the two CUDA backends against backend_cpu() (the float32
// reference) on fresh random inputs: first "cuda-fp32" (every op float32), then "cuda" (bf16
// tensor-core GEMMs, the other ops the same float32 kernels). Skips (exit 77) where
// backend_cuda_available() is 0: builds without CUDA, machines without a GPU (CI).
//
// Method: the same host inputs go to both backends; forward outputs on the GPU are poisoned with
// NaN before every run, so an element the kernel never writes fails. Every *_bwd runs twice per
// backend: on zeroed gradient buffers (checks the gradient itself) and on buffers pre-filled with
// the same random values (checks that it accumulates: += , not =). Those that can overwrite
// (grouped_matmul_bwd's dinp without GM_ACC_DINP, swiglu_bwd with accumulate 0) run a third time so: the
// cpu's buffers pre-filled with random values, the GPU's poisoned with NaN, so a value read back or left
// behind on either side fails the same band.
//
// Error measure, per element: |gpu - cpu| / (|cpu| + rms(cpu)); the rms term keeps elements that
// cancel to ~0 from dividing by ~0. The table at the end prints the worst value per op.
// Bands (why): both sides are float32 (eps 6e-8).
//   BAND_ELEM 1e-6  elementwise ops, copies, gathers, scatter-adds (embedding backward): the same operations
//   in the same
//                   order (cuda_nn.cu is built without FMA contraction); only expf/sqrt/pow may
//                   differ by an ulp or two between glibc and CUDA.
//   BAND_SUM  1e-5  GEMMs (cuBLAS sums in another order and in tiles), attention (online softmax,
//                   tiled sums), RMSNorm/cross-entropy/gather_dot_scale's dot (tree instead of serial sums):
//                   reordering a float32 sum of n terms moves it by <~ sqrt(n) eps relative to
//                   the terms' magnitude, ~1e-6 here; any wrong index, term or factor is O(1).
//   BAND_ATT_BWD 5e-5  attention backward: p = exp(q.k sc - lse) is recomputed from a float32
//                   score of magnitude up to ~10, so one ulp of the score (~1e-6 absolute; the two
//                   sides round the dot product differently) is ~1e-6 relative in p; ds = p (dp - D)
//                   cancels where dp ~ D, and dk/dv sum T * (H/KV) such terms (800 here). Measured
//                   on an H200: 8.6e-6 worst (T 200, 4 query heads per kv head); 5e-5 leaves a margin.
//   sumsq     1e-12 relative: both accumulate in double.
//   BAND_ATT_TC_NORM 2e-3 (norm-wise) and BAND_BF16_ELEM (per element): the tensor-core attention
//                   (cuda_attention_tc.cu) against bf16_ref.h's attention, which rounds what the
//                   kernels round (q, k, v, dout, P, dS) and sums in double. Left: the order of
//                   the sums (~1e-6), which moves a few P/dS values across a bf16 rounding boundary
//                   (2^-8 of that term), and the forward's per-tile rounding of P on rows over 64
//                   keys; norm-wise that is ~1e-4, while P or dS not rounded at all would give
//                   ~1e-3 and a wrong mask, index or scale O(1). Per element the tail is wider, as
//                   for the GEMMs: the first keys' rows of dk/dv (every query sees them, with large
//                   p) are several times the tensor's rms, so one flipped term there is ~1e-2 of it.
// The bf16 GEMMs of "cuda" (every grouped GEMM; matmul when O > MOE_GEMM_FP32_MAX_O, narrower ones
// are float32 and keep BAND_SUM) are checked twice:
//   BAND_BF16_REF 1e-4  against the cpu GEMM of the same operands rounded to bf16 (bf16_ref.h):
//                   the products are exact in fp32 on both sides, so only the summation differs:
//                   order (~sqrt(K) eps ~ 1e-6) and the tensor cores' fp32 accumulation, which
//                   may truncate instead of rounding: at worst ~K eps = 3e-5 at K = 512. A wrong
//                   rounding of the operands (truncation instead of round-to-nearest-even moves
//                   half of them by one bf16 ulp, 2^-7) is ~1e-3 of the output; a wrong index O(1).
//   BAND_BF16_NORM 1e-2 and BAND_BF16_ELEM 5e-2  against the float32 GEMM of the unrounded operands
//                   (||gpu - cpu|| / ||cpu|| over the output, and per element): each operand carries
//                   a relative rounding error of at most 2^-8 (bf16 keeps 8 significant bits), so a
//                   product a*b carries ~2^-8 relative (two roundings, each ~2^-8/sqrt 3 rms); over
//                   K terms the errors add like a random walk, as the terms themselves do, so the
//                   output error is ~2-3e-3 of the output's rms independently of K (not the
//                   2^-8 K worst case, which needs every rounding in one direction). Per element
//                   the tail is wider: a group with more rows than average has a larger scale than
//                   the tensor's rms. Measured on the cpu with a stand-in (bf16 operands, sums in
//                   double): norm-wise 2.4e-3, per element 2.3e-2 (a dw element of a 40-row group
//                   among groups of 0..13 rows). METHOD.md's range for bf16 operands: 1e-3..1e-2.
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "test_util.h"
#include "bf16_ref.h"
#include "test_runs.h"
#include "cpu_oracle.h"
#include "gpu_util.h"

#define BAND_ELEM 1e-6
#define BAND_SUM 1e-5
#define BAND_ATT_BWD 5e-5
#define BAND_SUMSQ 1e-12
#define BAND_BF16_REF 1e-4
#define BAND_BF16_ELEM 5e-2
#define BAND_BF16_NORM 1e-2
#define BAND_ATT_TC_NORM 2e-3

static Rng R;
static const Backend *cpu, *gpu;
static int gpu_bf16; // gpu is "cuda": its bf16 GEMMs are checked against bf16_ref.h and the float32 cpu

// ---------------------------------------------------------------- helpers
static float *hnew(size_t n) { return xcalloc(n ? n : 1, sizeof(float)); }
static float *hrand(size_t n, float sd) {
    float *x = hnew(n);
    for (size_t i = 0; i < n; i++) x[i] = sd * rng_normal(&R);
    return x;
}
static float *hcopy(const float *x, size_t n) {
    float *y = hnew(n);
    memcpy(y, x, n * sizeof(float));
    return y;
}
static int32_t *hidx(size_t n, int below) {
    int32_t *x = xcalloc(n ? n : 1, sizeof(int32_t));
    for (size_t i = 0; i < n; i++) x[i] = (int32_t)rng_below(&R, (uint32_t)below);
    return x;
}

// Results per op, printed as a table at the end.
typedef struct {
    char op[48];
    double worst, band, norm, norm_band;
    int bad;
} OpRow;
static OpRow rows[64];
static int nrows;
static OpRow *row_for(const char *op, double band) {
    for (int i = 0; i < nrows; i++)
        if (!strcmp(rows[i].op, op)) return &rows[i];
    CHECK(nrows < 64, "too many ops");
    OpRow *r = &rows[nrows++];
    snprintf(r->op, sizeof r->op, "%s", op);
    r->band = band;
    return r;
}

// Compares the device array got (n floats) with the host reference; frees nothing. norm_band > 0
// also bounds ||got - ref|| / ||ref|| (the bf16 checks against the float32 reference).
static void cmp_n(const char *op, const char *what, const float *got_d, const float *ref, size_t n,
                  double band, double norm_band) {
    OpRow *r = row_for(op, band);
    float *got = gpu_getf(gpu, got_d, n);
    // An all-zero reference (attention's dq and dk at T 1: one key's softmax has no gradient) has no scale of
    // its own: the result must be zero to the round-off of a cancellation among the unit-scale inputs every
    // test here draws (hrand(n, 1)): |got| <= 1e-5, judged as e <= band.
    GpuErr e = gpu_err_at(got, ref, n, band, 1e-5 / band);
    if (e.worst > r->worst) r->worst = e.worst;
    r->bad += e.bad > 0;
    EXPECT(e.bad == 0, "%s %s: %zu of %zu elements out of band %.0e; first [%zu] cuda %.9g cpu %.9g", op,
           what, e.bad, n, band, e.first, e.bad ? got[e.first] : 0.0, e.bad ? ref[e.first] : 0.0);
    if (norm_band > 0 && n) {
        r->norm_band = norm_band;
        if (!(e.norm <= r->norm)) r->norm = e.norm;
        r->bad += !(e.norm <= norm_band);
        EXPECT(e.norm <= norm_band, "%s %s: norm-wise relative error %.3e > %.0e", op, what, e.norm,
               norm_band);
    }
    free(got);
}
static void cmp(const char *op, const char *what, const float *got_d, const float *ref, size_t n,
                double band) {
    cmp_n(op, what, got_d, ref, n, band, 0);
}
static void cmp_exact_dev(const char *what, const float *a_d, const float *b_d, size_t n) {
    float *a = gpu_getf(gpu, a_d, n), *b = gpu_getf(gpu, b_d, n);
    EXPECT(memcmp(a, b, n * sizeof(float)) == 0, "%s: not the same bits", what);
    free(a);
    free(b);
}
// ops.h GM_DW_BF16 on the device: pk_d (2n floats, NaN before the op) holds in its first 2n bytes the bf16
// (nearest even) of ref_d's n floats (the same op's GM_DW_WRITE result), and its last n floats are NaN still
static void cmp_packed_dev(const char *what, const float *pk_d, const float *ref_d, size_t n) {
    float *pk = gpu_getf(gpu, pk_d, 2 * n), *ref = gpu_getf(gpu, ref_d, n);
    size_t bad = 0, first = n, kept = 1;
    for (size_t j = 0; j < n; j++) {
        uint16_t h;
        memcpy(&h, (const char *)pk + 2 * j, 2);
        if (h != bf16_rn_bits(ref[j]) && bad++ == 0) first = j;
        kept &= isnan(pk[n + j]) != 0;
    }
    EXPECT(bad == 0, "%s: %zu of %zu packed values are not the bf16 of the float32 write; first [%zu]", what,
           bad, n, first);
    EXPECT(kept, "%s: a write past the float32 blocks", what);
    free(pk);
    free(ref);
}
// ops.h GM_DW_SUMSQ: the ledger holds `blocks` blocks since the last take, and their sum of squares is the
// host's double sum over the n values at dw_d as written (float32, or packed bf16), to the kernels' float
// partial sums of 32 squares (each within 31 float roundings: 2e-6 relative, twice that allowed)
static void ledger_check(const char *what, const float *dw_d, size_t n, int packed, int blocks) {
    double led = -1, ref = 0;
    int got = gpu->dw_sumsq_take(&led);
    float *h = gpu_getf(gpu, dw_d, packed ? (n + 1) / 2 : n);
    for (size_t j = 0; j < n; j++) {
        double x;
        if (packed) {
            uint16_t b;
            memcpy(&b, (const char *)h + 2 * j, 2);
            x = bf16_to_f32(b);
        } else {
            x = h[j];
        }
        ref += x * x;
    }
    EXPECT(got == blocks, "%s: the ledger holds %d blocks, %d written", what, got, blocks);
    EXPECT(fabs(led - ref) <= 4e-6 * ref, "%s: the ledger's sum %.17g, the values' %.17g (rel %.2e)", what,
           led, ref, ref > 0 ? fabs(led - ref) / ref : 0.0);
    free(h);
}

// the device array a_d against a host reference, bit for bit
static void cmp_exact_host(const char *what, const float *a_d, const float *ref, size_t n) {
    float *a = gpu_getf(gpu, a_d, n);
    EXPECT(memcmp(a, ref, n * sizeof(float)) == 0, "%s: not the same bits", what);
    free(a);
}

// ---------------------------------------------------------------- memory
static void test_memory(int big) {
    size_t n = (1 << 20) + 7;
    float *d = gpu->alloc(n * sizeof(float)), *h = gpu_getf(gpu, d, n);
    size_t nz = 0;
    for (size_t i = 0; i < n; i++) nz += h[i] != 0.0f;
    EXPECT(nz == 0, "alloc: %zu of %zu elements not zero", nz, n);
    float *x = hrand(n, 1.0f);
    gpu->to_device(d, x, n * sizeof(float));
    float *d2 = gpu_nanf(gpu, n);
    gpu->copy(d2, d, n * sizeof(float));
    float *y = gpu_getf(gpu, d2, n);
    EXPECT(memcmp(x, y, n * sizeof(float)) == 0, "to_device / copy / to_host round trip differs");
    gpu->zero(d2 + 5, 100 * sizeof(float));
    float *z = gpu_getf(gpu, d2, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= (i >= 5 && i < 105) ? z[i] == 0.0f : z[i] == x[i];
    EXPECT(ok, "zero: wrong range cleared");
    // small copies (staged and enqueued on cuda: ops.h to_device): the source is free to change once the
    // call returns, and each copy lands in order with the ops around it. 300 copies of one host word (more
    // than the staging ring's slots), each followed by an op that reads the word (axpy into an accumulator),
    // and a copy of 64 KiB + 4 bytes (the synchronous path) between them; 4 products of 8192^3 first (of
    // 2048^3 under MOE_TEST_SMALL), so that the GPU is still busy while the host stages the copies: without
    // the ring's wait for a slot's last copy the full suite fails here (checked: 87 of 300 words wrong)
    {
        int nc = 300, mn = big ? 8192 : 2048;
        float *acc = gpu->alloc(sizeof(float) * nc), *word = gpu->alloc(sizeof(float) * nc), v = 0;
        float *hb = xcalloc((64 << 10) / 4 + 1, sizeof(float)), *bigd = gpu->alloc((64 << 10) + 4);
        size_t mm = (size_t)mn * mn;
        float *ma = gpu->alloc(mm * sizeof(float)), *mb = gpu->alloc(mm * sizeof(float));
        float *mc = gpu->alloc(mm * sizeof(float));
        for (int r = 0; r < 2; r++) {
            gpu->matmul_fwd(mc, ma, mb, mn, mn, mn, 0);
            gpu->matmul_fwd(ma, mc, mb, mn, mn, mn, 0);
        }
        for (int i = 0; i < nc; i++) {
            v = (float)(i + 1);
            gpu->to_device(word + i, &v, sizeof v);
            v = -1.0f; // (the copy has its own bytes)
            gpu->axpy(acc + i, word + i, 2.0f, 1);
            if (i == nc / 2) gpu->to_device(bigd, hb, (64 << 10) + 4);
        }
        float *got = gpu_getf(gpu, acc, nc);
        int bad = 0;
        for (int i = 0; i < nc; i++) bad += got[i] != 2.0f * (float)(i + 1);
        EXPECT(bad == 0, "to_device of small copies: %d of %d words wrong (a staged copy lost or reordered)",
               bad, nc);
        gpu->free(acc);
        gpu->free(word);
        gpu->free(bigd);
        free(hb);
        free(got);
        gpu->free(ma);
        gpu->free(mb);
        gpu->free(mc);
    }
    gpu->sync();
    void *e = gpu->alloc(0);
    EXPECT(e != NULL, "alloc(0) returned NULL");
    gpu->free(e);
    gpu->free(d);
    gpu->free(d2);
    free(h);
    free(x);
    free(y);
    free(z);
}

// the values x rounded as the hidden format stores them (in place)
static void hid_round(float *x, size_t n) {
    if (gpu->hid != FMT_F32)
        for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}

// q, k, v and out as the attention takes them (ops.h: the hidden format): x rounded in place as stored, then
// put
static void *att_put(float *x, size_t n) {
    hid_round(x, n);
    return gpu_hid_put(gpu, x, n);
}
// the attention's output (hidden format) as a device float32 array, for the comparisons
static float *att_out(const void *d, size_t n) {
    float *h = gpu_hid_get(gpu, d, n), *f = gpu_putf(gpu, h, n);
    free(h);
    return f;
}
// two hidden-format device arrays bit for bit
static void cmp_exact_hid2(const char *what, const void *a_d, const void *b_d, size_t n) {
    float *a = gpu_hid_get(gpu, a_d, n), *b = gpu_hid_get(gpu, b_d, n);
    EXPECT(memcmp(a, b, n * sizeof(float)) == 0, "%s: not the same bits", what);
    free(a);
    free(b);
}
// The attention output's element band: the float32 path's band, or (bf16 out) one rounding on top of it
static double att_out_band(double f32_band) { return gpu->hid == FMT_F32 ? f32_band : BAND_BF16_ELEM; }

// ---------------------------------------------------------------- GEMMs
// On "cuda", a GEMM that runs in bf16 is compared with bf16_ref.h (same rounded operands) in
// BAND_BF16_REF, and with the float32 cpu in the bf16 bands; its table rows say "bf16".
static int gemm_is_bf16(int grouped, int O) { return gpu_bf16 && (grouped || O > MOE_GEMM_FP32_MAX_O); }

// Checks the device result od against the reference backend's (ref_r) and, for bf16, the float32
// cpu's (ref_f) host results.
static void cmp_gemm(const char *op, int bf, const char *what, const float *od, const float *ref_r,
                     const float *ref_f, size_t n) {
    char name[48];
    snprintf(name, sizeof name, "%s%s", op, bf ? " bf16 (vs rounded)" : "");
    cmp(name, what, od, ref_r, n, bf ? BAND_BF16_REF : BAND_SUM);
    if (!bf) return;
    snprintf(name, sizeof name, "%s bf16 (vs fp32)", op);
    cmp_n(name, what, od, ref_f, n, BAND_BF16_ELEM, BAND_BF16_NORM);
}

// A device copy of h (n floats) starting `shift` floats into its allocation (shift 1: not 16-byte
// aligned, the conversion's scalar path); *base gets the pointer to free.
static float *dputf_shift(const float *h, size_t n, int shift, float **base) {
    *base = gpu->alloc((n + shift) * sizeof(float));
    gpu->to_device(*base + shift, h, n * sizeof(float));
    return *base + shift;
}

static void test_matmul(int N, int K, int O, int shift) {
    int bf = gemm_is_bf16(0, O);
    const Backend *ref = bf ? backend_cpu_bf16ref() : cpu;
    float *x = hrand((size_t)N * K, 1.0f), *w = hrand((size_t)O * K, 0.5f), *acc = hrand((size_t)N * O, 1.0f);
    float *xb, *wb;
    float *xd = dputf_shift(x, (size_t)N * K, shift, &xb), *wd = dputf_shift(w, (size_t)O * K, shift, &wb);
    char what[96];
    for (int a = 0; a < 2; a++) {
        float *rr = a ? hcopy(acc, (size_t)N * O) : hnew((size_t)N * O), *rf = hcopy(rr, (size_t)N * O);
        ref->matmul_fwd(rr, x, w, N, K, O, a);
        cpu->matmul_fwd(rf, x, w, N, K, O, a);
        float *od = a ? gpu_putf(gpu, acc, (size_t)N * O) : gpu_nanf(gpu, (size_t)N * O);
        gpu->matmul_fwd(od, xd, wd, N, K, O, a);
        snprintf(what, sizeof what, "%s N%d K%d O%d%s", a ? "accumulate" : "overwrite", N, K, O,
                 shift ? " unaligned" : "");
        cmp_gemm("matmul_fwd", bf, what, od, rr, rf, (size_t)N * O);
        gpu->free(od);
        free(rr);
        free(rf);
    }
    // backward: dinp and dw, each on zeroed and pre-filled buffers (added into), and each alone (other NULL);
    // pre 2: dinp and dw written (flags GM_DW_WRITE) over pre-filled buffers (NaN on the GPU)
    float *dout = hrand((size_t)N * O, 1.0f), *pdx = hrand((size_t)N * K, 1.0f),
          *pdw = hrand((size_t)O * K, 1.0f);
    float *doutd = gpu_putf(gpu, dout, (size_t)N * O);
    for (int pre = 0; pre < 3; pre++)
        for (int which = 0; which < 3; which++) { // 0 both, 1 dinp only, 2 dw only
            int fl = pre == 2 ? GM_DW_WRITE : GM_ACC_DINP;
            float *dx = pre ? hcopy(pdx, (size_t)N * K) : hnew((size_t)N * K);
            float *dw = pre ? hcopy(pdw, (size_t)O * K) : hnew((size_t)O * K);
            float *dxf = hcopy(dx, (size_t)N * K), *dwf = hcopy(dw, (size_t)O * K);
            float *dxd = pre == 2 ? gpu_nanf(gpu, (size_t)N * K) : gpu_putf(gpu, dx, (size_t)N * K);
            float *dwd = pre == 2 ? gpu_nanf(gpu, (size_t)O * K) : gpu_putf(gpu, dw, (size_t)O * K);
            ref->matmul_bwd(which != 2 ? dx : NULL, which != 1 ? dw : NULL, dout, x, w, N, K, O, fl);
            cpu->matmul_bwd(which != 2 ? dxf : NULL, which != 1 ? dwf : NULL, dout, x, w, N, K, O, fl);
            gpu->matmul_bwd(which != 2 ? dxd : NULL, which != 1 ? dwd : NULL, doutd, xd, wd, N, K, O, fl);
            if (pre == 2 && which == 2) { // dinp NULL: nothing to compare for it (dxd holds NaN)
                gpu->free(dxd);
                dxd = gpu_putf(gpu, dx, (size_t)N * K);
            }
            if (pre == 2 && which == 1) { // dw NULL: likewise
                gpu->free(dwd);
                dwd = gpu_putf(gpu, dw, (size_t)O * K);
            }
            snprintf(what, sizeof what, "dinp%s N%d K%d O%d",
                     pre == 2  ? " (written)"
                         : pre ? " (accumulate)"
                               : "",
                     N, K, O);
            cmp_gemm("matmul_bwd", bf, what, dxd, dx, dxf, (size_t)N * K);
            snprintf(what, sizeof what, "dw%s N%d K%d O%d",
                     pre == 2  ? " (written)"
                         : pre ? " (accumulate)"
                               : "",
                     N, K, O);
            cmp_gemm("matmul_bwd", bf, what, dwd, dw, dwf, (size_t)O * K);
            gpu->free(dxd);
            gpu->free(dwd);
            free(dx);
            free(dw);
            free(dxf);
            free(dwf);
        }
    gpu->free(xb);
    gpu->free(wb);
    gpu->free(doutd);
    free(x);
    free(w);
    free(acc);
    free(dout);
    free(pdx);
    free(pdw);
}

// The narrow weight gradient (O <= MOE_GEMM_FP32_MAX_O: the router's; cuda_gemm.cu dw_narrow, both backends)
// bit for bit against a host oracle of its order: per chunk of 128 rows an fmaf chain in row order, the
// chunks' sums added in chunk order, then added to dw (or written over NaN with GM_DW_WRITE).
static void test_dw_narrow(int N, int K, int O) {
    size_t nk = (size_t)N * K, ok = (size_t)O * K;
    float *x = hrand(nk, 1.0f), *dout = hrand((size_t)N * O, 1.0f), *pre = hrand(ok, 1.0f),
          *w = hrand(ok, 0.5f);
    float *ww = hnew(ok), *wa = hnew(ok);
    for (int o = 0; o < O; o++)
        for (int k = 0; k < K; k++) {
            float sum = 0.0f;
            for (int n0 = 0; n0 < N; n0 += 128) {
                float p = 0.0f;
                for (int n = n0; n < N && n < n0 + 128; n++)
                    p = fmaf(dout[(size_t)n * O + o], x[(size_t)n * K + k], p);
                sum = n0 ? sum + p : p;
            }
            ww[(size_t)o * K + k] = sum;
            wa[(size_t)o * K + k] = pre[(size_t)o * K + k] + sum;
        }
    float *xd = gpu_putf(gpu, x, nk), *dd = gpu_putf(gpu, dout, (size_t)N * O), *wd = gpu_putf(gpu, w, ok),
          *dwn = gpu_nanf(gpu, ok), *dwa = gpu_putf(gpu, pre, ok);
    gpu->matmul_bwd(NULL, dwn, dd, xd, wd, N, K, O, GM_DW_WRITE);
    gpu->matmul_bwd(NULL, dwa, dd, xd, wd, N, K, O, 0);
    char what[96];
    snprintf(what, sizeof what, "matmul_bwd narrow dw (written) = the oracle's order N%d K%d O%d", N, K, O);
    cmp_exact_host(what, dwn, ww, ok);
    snprintf(what, sizeof what, "matmul_bwd narrow dw (accumulate) = the oracle's order N%d K%d O%d", N, K,
             O);
    cmp_exact_host(what, dwa, wa, ok);
    gpu->free(xd);
    gpu->free(dd);
    gpu->free(wd);
    gpu->free(dwn);
    gpu->free(dwa);
    free(x);
    free(dout);
    free(pre);
    free(w);
    free(ww);
    free(wa);
}

// matmul_fwd_multi / matmul_bwd_multi: the same bits as the single ops called in order on the input's
// values (the multi ops take it in the hidden format: values it holds exactly here, float32 for the single
// ops), whatever mix of float32 (O <= MOE_GEMM_FP32_MAX_O) and bf16 products.
// GM_DOUT_HID's layout of N rows of O values v (the hidden format's, in place of float32 rows: row i from
// byte 4 O i, the rest of the row NaN), on the host; and back (the layout's values as floats)
static float *hid_layout(const float *v, int N, int O) {
    float *lay = host_nanf((size_t)N * O);
    for (size_t i = 0; i < (size_t)N; i++)
        for (size_t j = 0; j < (size_t)O; j++) {
            if (gpu->hid == FMT_F32) {
                lay[i * O + j] = v[i * O + j];
                continue;
            }
            uint16_t h = bf16_rn_bits(v[i * O + j]);
            memcpy((char *)(lay + i * O) + 2 * j, &h, 2);
        }
    return lay;
}
static float *hid_layout_get(const float *d, int N, int O) {
    float *lay = gpu_getf(gpu, d, (size_t)N * O), *v = hnew((size_t)N * O);
    for (size_t i = 0; i < (size_t)N; i++)
        for (size_t j = 0; j < (size_t)O; j++) {
            if (gpu->hid == FMT_F32) {
                v[i * O + j] = lay[i * O + j];
                continue;
            }
            uint16_t h;
            memcpy(&h, (const char *)(lay + i * O) + 2 * j, 2);
            v[i * O + j] = bf16_to_f32(h);
        }
    free(lay);
    return v;
}

// ops.h GM_DOUT_HID: dout's bf16-representable values in the hidden format in place (row i from where its
// float32 row starts, the rest of the row NaN) give the same bits as matmul_bwd on those values as float32
static void test_matmul_dout_hid(int N, int K, int O) {
    float *x = hrand((size_t)N * K, 1.0f), *w = hrand((size_t)O * K, 0.5f),
          *dout = hrand((size_t)N * O, 1.0f);
    for (size_t i = 0; i < (size_t)N * O; i++) dout[i] = bf16_to_f32(bf16_rn_bits(dout[i]));
    float *lay = hid_layout(dout, N, O);
    float *xd = gpu_putf(gpu, x, (size_t)N * K), *wd = gpu_putf(gpu, w, (size_t)O * K),
          *dd = gpu_putf(gpu, dout, (size_t)N * O), *ld = gpu_putf(gpu, lay, (size_t)N * O);
    for (int fl = 0; fl < 2; fl++) {
        int flags = fl ? GM_ACC_DINP : GM_DW_WRITE;
        float *dx1 = gpu_putf(gpu, x, (size_t)N * K), *dx2 = gpu_putf(gpu, x, (size_t)N * K);
        float *dw1 = gpu_putf(gpu, w, (size_t)O * K), *dw2 = gpu_putf(gpu, w, (size_t)O * K);
        gpu->matmul_bwd(dx1, dw1, dd, xd, wd, N, K, O, flags);
        gpu->matmul_bwd(dx2, dw2, ld, xd, wd, N, K, O, flags | GM_DOUT_HID);
        char what[96];
        snprintf(what, sizeof what, "matmul_bwd GM_DOUT_HID N%d K%d O%d flags %d: dinp", N, K, O, flags);
        cmp_exact_dev(what, dx2, dx1, (size_t)N * K);
        snprintf(what, sizeof what, "matmul_bwd GM_DOUT_HID N%d K%d O%d flags %d: dw", N, K, O, flags);
        cmp_exact_dev(what, dw2, dw1, (size_t)O * K);
        void *b[] = {dx1, dx2, dw1, dw2};
        for (int i = 0; i < 4; i++) gpu->free(b[i]);
    }
    void *b[] = {xd, wd, dd, ld};
    for (int i = 0; i < 4; i++) gpu->free(b[i]);
    free(x);
    free(w);
    free(dout);
    free(lay);
}

// GM_OUT_HID: each product in the hidden format, each value its float32 sum rounded once. The float32 sums
// are the GEMM's up to their order (cuBLAS picks its kernel by the output's type too), so a value may sit
// one bf16 step from the rounded float32 product where that sum lies within float32 round-off of a rounding
// boundary: rarely (at K <= 256, ~2^-13 of the values). Checked: every value within one step, at most 1 in
// 256 off by one; the float32 format the bits of out.
static void test_fwd_multi_out_hid(int N, int K, const int *O, const void *xh, float *const *wd,
                                   float *const *outs) {
    void *oh[3];
    for (int i = 0; i < 3; i++) oh[i] = gpu_hid_nan(gpu, (size_t)N * O[i]);
    gpu->matmul_fwd_multi(3, (float *const *)oh, xh, (const float *const *)wd, N, K, O, GM_OUT_HID);
    for (int i = 0; i < 3; i++) {
        size_t n = (size_t)N * O[i], off = 0;
        float *got = gpu_hid_get(gpu, oh[i], n), *ref = gpu_getf(gpu, outs[i], n);
        int far = 0;
        for (size_t j = 0; j < n; j++) {
            float r = gpu->hid == FMT_F32 ? ref[j] : bf16_round(ref[j]);
            if (memcmp(&got[j], &r, 4) == 0) continue;
            off++;
            float step = gpu->hid == FMT_F32 ? 0.0f : fabsf(r) * 0x1p-7f;
            if (!(fabsf(got[j] - r) <= step)) far++;
        }
        EXPECT(far == 0 && (gpu->hid == FMT_F32 ? off == 0 : off * 256 <= n),
               "matmul_fwd_multi GM_OUT_HID N%d K%d O%d out[%d]: %zu of %zu values not the rounded float32 "
               "product's, %d of them beyond one bf16 step",
               N, K, O[i], i, off, n, far);
        free(got);
        free(ref);
        gpu->free(oh[i]);
    }
}

static void test_matmul_multi(int N, int K, const int *O) {
    float *x = hrand((size_t)N * K, 1.0f);
    hid_round(x, (size_t)N * K);
    float *xd = gpu_putf(gpu, x, (size_t)N * K);
    void *xh = gpu_hid_put(gpu, x, (size_t)N * K);
    float *w[3], *wd[3], *outm[3], *outs[3], *dout[3], *doutd[3], *dwm[3], *dws[3];
    for (int i = 0; i < 3; i++) {
        w[i] = hrand((size_t)O[i] * K, 0.5f);
        wd[i] = gpu_putf(gpu, w[i], (size_t)O[i] * K);
        outm[i] = gpu_nanf(gpu, (size_t)N * O[i]);
        outs[i] = gpu_nanf(gpu, (size_t)N * O[i]);
        dout[i] = hrand((size_t)N * O[i], 1.0f);
        doutd[i] = gpu_putf(gpu, dout[i], (size_t)N * O[i]);
        float *pre = hrand((size_t)O[i] * K, 1.0f);
        dwm[i] = gpu_putf(gpu, pre, (size_t)O[i] * K);
        dws[i] = gpu_putf(gpu, pre, (size_t)O[i] * K);
        free(pre);
    }
    char what[96];
    gpu->matmul_fwd_multi(3, outm, xh, (const float *const *)wd, N, K, O, 0);
    for (int i = 0; i < 3; i++) gpu->matmul_fwd(outs[i], xd, wd[i], N, K, O[i], 0);
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "matmul_fwd_multi out[%d] N%d K%d O%d vs matmul_fwd", i, N, K, O[i]);
        cmp_exact_dev(what, outm[i], outs[i], (size_t)N * O[i]);
    }
    if (O[0] > MOE_GEMM_FP32_MAX_O && O[1] > MOE_GEMM_FP32_MAX_O && O[2] > MOE_GEMM_FP32_MAX_O)
        test_fwd_multi_out_hid(N, K, O, xh, wd, outs);
    float *pdx = hrand((size_t)N * K, 1.0f), *dxm = gpu_putf(gpu, pdx, (size_t)N * K),
          *dxs = gpu_putf(gpu, pdx, (size_t)N * K);
    gpu->matmul_bwd_multi(3, dxm, dwm, (const float *const *)doutd, xh, (const float *const *)wd, N, K, O,
                          GM_ACC_DINP);
    for (int i = 0; i < 3; i++) gpu->matmul_bwd(dxs, dws[i], doutd[i], xd, wd[i], N, K, O[i], GM_ACC_DINP);
    snprintf(what, sizeof what, "matmul_bwd_multi dinp N%d K%d O%d,%d,%d vs matmul_bwd x3", N, K, O[0], O[1],
             O[2]);
    cmp_exact_dev(what, dxm, dxs, (size_t)N * K);
    { // GM_DOUT_HID (every dout[i] in the layout: in place, packed where O % 8, widened where narrow): the
      // bits of the float32 douts holding the same values
        float *dr[3], *drd[3], *dl[3], *p0 = hrand((size_t)N * K, 1.0f);
        float *dxa = gpu_putf(gpu, p0, (size_t)N * K), *dxb = gpu_putf(gpu, p0, (size_t)N * K);
        for (int i = 0; i < 3; i++) {
            dr[i] = hcopy(dout[i], (size_t)N * O[i]);
            hid_round(dr[i], (size_t)N * O[i]);
            drd[i] = gpu_putf(gpu, dr[i], (size_t)N * O[i]);
            float *lay = hid_layout(dr[i], N, O[i]);
            dl[i] = gpu_putf(gpu, lay, (size_t)N * O[i]);
            free(lay);
        }
        gpu->matmul_bwd_multi(3, dxa, dwm, (const float *const *)drd, xh, (const float *const *)wd, N, K, O,
                              GM_ACC_DINP);
        gpu->matmul_bwd_multi(3, dxb, dws, (const float *const *)dl, xh, (const float *const *)wd, N, K, O,
                              GM_ACC_DINP | GM_DOUT_HID);
        snprintf(what, sizeof what, "matmul_bwd_multi GM_DOUT_HID N%d K%d O%d,%d,%d: dinp", N, K, O[0], O[1],
                 O[2]);
        cmp_exact_dev(what, dxb, dxa, (size_t)N * K);
        for (int i = 0; i < 3; i++) {
            snprintf(what, sizeof what,
                     "matmul_bwd_multi GM_DOUT_HID N%d K%d O%d: dw[%d] (after the same sums)", N, K, O[i], i);
            cmp_exact_dev(what, dws[i], dwm[i], (size_t)O[i] * K);
            gpu->free(drd[i]);
            gpu->free(dl[i]);
            free(dr[i]);
        }
        gpu->free(dxa);
        gpu->free(dxb);
        free(p0);
    }
    { // dinp and dw written (GM_DW_WRITE) over NaN: the single ops' bits, dinp's first product written
        float *dxw = gpu_nanf(gpu, (size_t)N * K), *dxw1 = gpu_nanf(gpu, (size_t)N * K);
        float *dwx[3], *dwx1[3];
        for (int i = 0; i < 3; i++) {
            dwx[i] = gpu_nanf(gpu, (size_t)O[i] * K);
            dwx1[i] = gpu_nanf(gpu, (size_t)O[i] * K);
        }
        gpu->matmul_bwd_multi(3, dxw, dwx, (const float *const *)doutd, xh, (const float *const *)wd, N, K, O,
                              GM_DW_WRITE);
        for (int i = 0; i < 3; i++)
            gpu->matmul_bwd(dxw1, dwx1[i], doutd[i], xd, wd[i], N, K, O[i],
                            GM_DW_WRITE | (i ? GM_ACC_DINP : 0));
        snprintf(what, sizeof what, "matmul_bwd_multi dinp, dw written N%d K%d O%d,%d,%d vs matmul_bwd x3", N,
                 K, O[0], O[1], O[2]);
        cmp_exact_dev(what, dxw, dxw1, (size_t)N * K);
        for (int i = 0; i < 3; i++) cmp_exact_dev(what, dwx[i], dwx1[i], (size_t)O[i] * K);
        for (int i = 0; i < 3;
             i++) { // and the bits of adding into zeros (the accumulating run above from pre)
            gpu->zero(dwx1[i], (size_t)O[i] * K * sizeof(float));
            gpu->matmul_bwd(NULL, dwx1[i], doutd[i], xd, wd[i], N, K, O[i], 0);
            cmp_exact_dev("matmul_bwd dw written == added into zeros", dwx[i], dwx1[i], (size_t)O[i] * K);
        }
        gpu->free(dxw);
        gpu->free(dxw1);
        for (int i = 0; i < 3; i++) {
            gpu->free(dwx[i]);
            gpu->free(dwx1[i]);
        }
    }
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "matmul_bwd_multi dw[%d] N%d K%d O%d vs matmul_bwd", i, N, K, O[i]);
        cmp_exact_dev(what, dwm[i], dws[i], (size_t)O[i] * K);
    }
    for (int i = 0; i < 3; i++) {
        gpu->free(wd[i]);
        gpu->free(outm[i]);
        gpu->free(outs[i]);
        gpu->free(doutd[i]);
        gpu->free(dwm[i]);
        gpu->free(dws[i]);
        free(w[i]);
        free(dout[i]);
    }
    gpu->free(xd);
    gpu->free(xh);
    gpu->free(dxm);
    gpu->free(dxs);
    free(x);
    free(pdx);
}

// G groups with the given row counts (zeros anywhere, all zero).
static void test_grouped(int K, int O, int G, const int64_t *cnt) {
    int bf = gemm_is_bf16(1, O);
    const Backend *ref = bf ? backend_cpu_bf16ref() : cpu;
    int64_t *off = xcalloc(G + 1, sizeof(int64_t));
    for (int g = 0; g < G; g++) off[g + 1] = off[g] + cnt[g];
    int n = (int)off[G];
    char what[96];
    float *x = hrand((size_t)n * K, 1.0f), *w = hrand((size_t)G * O * K, 0.5f);
    float *xd = gpu_putf(gpu, x, (size_t)n * K), *wd = gpu_putf(gpu, w, (size_t)G * O * K);
    float *rr = hnew((size_t)n * O), *rf = hnew((size_t)n * O), *od = gpu_nanf(gpu, (size_t)n * O);
    ref->grouped_matmul_fwd(rr, x, w, off, G, K, O);
    cpu->grouped_matmul_fwd(rf, x, w, off, G, K, O);
    gpu->grouped_matmul_fwd(od, xd, wd, off, G, K, O);
    snprintf(what, sizeof what, "out G%d rows %d K%d O%d", G, n, K, O);
    cmp_gemm("grouped_matmul_fwd", bf, what, od, rr, rf, (size_t)n * O);
    float *dout = hrand((size_t)n * O, 1.0f), *doutd = gpu_putf(gpu, dout, (size_t)n * O);
    float *pdx = hrand((size_t)n * K, 1.0f), *pdw = hrand((size_t)G * O * K, 1.0f);
    // mode 0: zeroed buffers, 1: pre-filled (accumulate), 2: accumulate 0 (dinp overwritten: random
    // on the cpu, NaN on the GPU; dw pre-filled and still accumulated). In mode 2 the GPU's groups
    // cover rows [L, L + n) of buffers of L + n + L rows (off[0] = L): the L rows on either side of
    // its dinp must keep their values bitwise.
    enum { L = 2 };
    int64_t *offs = xcalloc(G + 1, sizeof(int64_t));
    for (int g = 0; g <= G; g++) offs[g] = off[g] + L;
    size_t nxs = (size_t)(n + 2 * L) * K, nos = (size_t)(n + 2 * L) * O;
    float *side = hrand(nxs, 1.0f), *xs = hrand(nxs, 1.0f), *douts = hrand(nos, 1.0f);
    memcpy(xs + (size_t)L * K, x, sizeof(float) * n * K);
    memcpy(douts + (size_t)L * O, dout, sizeof(float) * n * O);
    float *xsd = gpu_putf(gpu, xs, nxs), *doutsd = gpu_putf(gpu, douts, nos);
    for (int mode = 0; mode < 3; mode++) {
        int acc = mode < 2;
        float *dx = mode ? hcopy(pdx, (size_t)n * K) : hnew((size_t)n * K);
        float *dw = mode ? hcopy(pdw, (size_t)G * O * K) : hnew((size_t)G * O * K);
        float *dxf = hcopy(dx, (size_t)n * K), *dwf = hcopy(dw, (size_t)G * O * K);
        float *dxs = NULL, *dxd, *dwd = gpu_putf(gpu, dw, (size_t)G * O * K);
        if (mode < 2) {
            dxd = gpu_putf(gpu, dx, (size_t)n * K);
            gpu->grouped_matmul_bwd(dxd, dwd, doutd, xd, wd, off, G, K, O, 1);
        } else {
            dxs = hcopy(side, nxs);
            for (size_t i = 0; i < (size_t)n * K; i++) dxs[(size_t)L * K + i] = NAN;
            dxd = gpu_putf(gpu, dxs, nxs);
            gpu->grouped_matmul_bwd(dxd, dwd, doutsd, xsd, wd, offs, G, K, O, 0);
        }
        ref->grouped_matmul_bwd(dx, dw, dout, x, w, off, G, K, O, acc);
        cpu->grouped_matmul_bwd(dxf, dwf, dout, x, w, off, G, K, O, acc);
        const char *tag = mode == 0 ? "" : mode == 1 ? " (accumulate)" : " (overwrite, off[0] = 2)";
        snprintf(what, sizeof what, "dinp%s G%d rows %d K%d O%d", tag, G, n, K, O);
        cmp_gemm("grouped_matmul_bwd", bf, what, mode < 2 ? dxd : dxd + (size_t)L * K, dx, dxf,
                 (size_t)n * K);
        if (mode == 2) {
            float *got = gpu_getf(gpu, dxd, nxs);
            int kept = memcmp(got, side, sizeof(float) * L * K) == 0 &&
                memcmp(got + (size_t)(L + n) * K, side + (size_t)(L + n) * K, sizeof(float) * L * K) == 0;
            EXPECT(kept, "grouped_matmul_bwd %s: a row outside [off[0], off[G]) changed", what);
            free(got);
        }
        snprintf(what, sizeof what, "dw%s G%d rows %d K%d O%d",
                 mode == 0       ? ""
                     : mode == 1 ? " (accumulate)"
                                 : " (accumulate; dinp overwritten)",
                 G, n, K, O);
        cmp_gemm("grouped_matmul_bwd", bf, what, dwd, dw, dwf, (size_t)G * O * K);
        // the weight blocks of empty groups: exactly what was there
        float *dwg = gpu_getf(gpu, dwd, (size_t)G * O * K);
        int same = 1;
        for (int g = 0; g < G; g++)
            if (!cnt[g])
                same &= memcmp(dwg + (size_t)g * O * K, dw + (size_t)g * O * K, sizeof(float) * O * K) == 0;
        EXPECT(same, "grouped_matmul_bwd %s: an empty group's dw block changed", what);
        free(dwg);
        gpu->free(dxd);
        gpu->free(dwd);
        free(dx);
        free(dw);
        free(dxf);
        free(dwf);
        free(dxs);
    }
    gpu->free(xsd);
    gpu->free(doutsd);
    free(offs);
    free(side);
    free(xs);
    free(douts);
    gpu->free(xd);
    gpu->free(wd);
    gpu->free(od);
    gpu->free(doutd);
    free(x);
    free(w);
    free(rr);
    free(rf);
    free(dout);
    free(pdx);
    free(pdw);
    free(off);
}

// Hidden rows written by the GPU against the reference backend's (ref_r: bf16_ref.h rounds them as
// "cuda" does) and the float32 cpu's (ref_f). float32 rows: cmp_gemm. bf16 rows: both sides round (to
// nearest even) sums that differ only in their order, by BAND_BF16_REF of the element's scale (|ref|
// + the rms, as cmp_n) at most, so a value is the reference's or, where the two sums straddle a
// rounding boundary, one bf16 ulp (2^-8 of its binade) from it; near zero the sums' difference can
// exceed the ulp itself (measured: 2 ulps of a 1.5e-4 value among values of rms ~1). So each value
// must be within one ulp plus BAND_BF16_REF of its scale, and at most BAND_HID_FLIP of the values may
// differ at all: rounding by truncation instead would move about half of them; a wrong row or index
// is O(1). Against float32: the bf16 bands.
#define BAND_HID_FLIP 2e-2
static double bf16_ulp(double v) {
    int ex;
    frexp(v, &ex); // v = m 2^ex, 0.5 <= |m| < 1: 8 significant bits
    return ldexp(1.0, ex - 8);
}
static void cmp_hid(const char *op, int bf, const char *what, const void *got_d, const float *ref_r,
                    const float *ref_f, size_t n) {
    if (gpu->hid == FMT_F32) {
        cmp_gemm(op, bf, what, got_d, ref_r, ref_f, n);
        return;
    }
    char name[48];
    snprintf(name, sizeof name, "%s bf16 rows (flips)", op);
    OpRow *r = row_for(name, BAND_HID_FLIP);
    float *got = gpu_hid_get(gpu, got_d, n);
    double rms = 0;
    for (size_t i = 0; i < n; i++) rms += (double)ref_r[i] * ref_r[i];
    rms = sqrt(rms / (n ? n : 1));
    size_t flips = 0, far = 0, first = 0;
    for (size_t i = 0; i < n; i++) {
        if (f32_bits(got[i]) == f32_bits(ref_r[i])) continue;
        flips++;
        double a = got[i], b = ref_r[i], ulp = bf16_ulp(fmax(fabs(a), fabs(b)));
        double e = (fabs(a - b) - ulp) / (fabs(b) + rms + 1e-30);
        if (!(e <= BAND_BF16_REF) && !far++) first = i;
    }
    double frac = n ? (double)flips / n : 0;
    if (frac > r->worst) r->worst = frac;
    r->bad += far > 0 || frac > BAND_HID_FLIP;
    EXPECT(
        far == 0,
        "%s %s: %zu values more than one bf16 ulp + %.0e from the reference; first [%zu] cuda %.9g ref %.9g",
        op, what, far, BAND_BF16_REF, first, far ? got[first] : 0.0, far ? ref_r[first] : 0.0);
    EXPECT(frac <= BAND_HID_FLIP, "%s %s: %zu of %zu values off the reference (%.3g > %.0e)", op, what, flips,
           n, frac, BAND_HID_FLIP);
    float *gd = gpu_putf(gpu, got, n); // cmp_n reads a float32 device array
    snprintf(name, sizeof name, "%s bf16 (vs fp32)", op);
    cmp_n(name, what, gd, ref_f, n, BAND_BF16_ELEM, BAND_BF16_NORM);
    gpu->free(gd);
    free(got);
}
// hidden rows got_d bit for bit against the float32 device rows f_d rounded as the hidden format stores them
static void cmp_exact_hid(const char *what, const void *got_d, const float *f_d, size_t n) {
    float *a = gpu_hid_get(gpu, got_d, n), *b = gpu_getf(gpu, f_d, n);
    hid_round(b, n);
    EXPECT(memcmp(a, b, n * sizeof(float)) == 0, "%s: not the same bits", what);
    free(a);
    free(b);
}

// The fused expert ops over the groups (the experts' w1/w3 with SwiGLU, w2 forward from the hidden rows,
// w2's backward into the SwiGLU, the w1/w3 backward pair), K = d, O = f. Each output against the
// reference backend's composition of plain ops (ops.h; bf16_ref.h rounds the hidden rows as "cuda"
// stores them), GPU outputs NaN-poisoned; and bit for bit against the GPU backend's own plain ops on
// the same inputs, their float32 results rounded to the hidden format (the fused epilogues do
// cuda_nn.cu's SwiGLU arithmetic on the GEMM's float32 sums; the dinp pair's kernel sums both products
// in one pass, so that one is compared in the bands only).
static void test_grouped_fused(int K, int O, int G, const int64_t *cnt) {
    int bf = gemm_is_bf16(1, O);
    const Backend *ref = bf ? backend_cpu_bf16ref() : cpu;
    int64_t *off = xcalloc(G + 1, sizeof(int64_t));
    for (int g = 0; g < G; g++) off[g + 1] = off[g] + cnt[g];
    size_t n = (size_t)off[G], nx = n * K, nh = n * O, nw = (size_t)G * O * K;
    char what[96];
    // the input rows in the hidden format (ops.h: the rows sent to the experts), values it holds exactly,
    // so that every side reads the same
    float *x = hrand(nx, 1.0f), *w1 = hrand(nw, 0.5f), *w3 = hrand(nw, 0.5f), *w2 = hrand(nw, 0.5f);
    hid_round(x, nx);
    void *xh = gpu_hid_put(gpu, x, nx);
    float *xd = gpu_putf(gpu, x, nx), *w1d = gpu_putf(gpu, w1, nw), *w3d = gpu_putf(gpu, w3, nw),
          *w2d = gpu_putf(gpu, w2, nw);
    // forward: h1, h3, act
    float *r[3], *f[3];
    void *o[3];
    for (int i = 0; i < 3; i++) {
        r[i] = hnew(nh);
        f[i] = hnew(nh);
        o[i] = gpu_hid_nan(gpu, nh);
    }
    ref->grouped_swiglu_fwd(r[0], r[1], r[2], x, w1, w3, off, G, K, O);
    cpu->grouped_swiglu_fwd(f[0], f[1], f[2], x, w1, w3, off, G, K, O);
    gpu->grouped_swiglu_fwd(o[0], o[1], o[2], xh, w1d, w3d, off, G, K, O);
    const char *fn[3] = {"h1", "h3", "act"};
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "%s G%d rows %zu K%d O%d", fn[i], G, n, K, O);
        cmp_hid("grouped_swiglu_fwd", bf, what, o[i], r[i], f[i], nh);
    }
    float *ph1 = gpu_nanf(gpu, nh), *ph3 = gpu_nanf(gpu, nh), *pact = gpu_nanf(gpu, nh);
    gpu->grouped_matmul_fwd(ph1, xd, w1d, off, G, K, O);
    gpu->grouped_matmul_fwd(ph3, xd, w3d, off, G, K, O);
    gpu->swiglu_fwd(pact, ph1, ph3, nh);
    float *pf[3] = {ph1, ph3, pact};
    for (int i = 0; i < 3; i++) {
        snprintf(what, sizeof what, "grouped_swiglu_fwd: %s = plain GEMMs + swiglu_fwd G%d K%d O%d", fn[i], G,
                 K, O);
        cmp_exact_hid(what, o[i], pf[i], nh);
    }
    // w2's forward from the hidden rows: act (rows, O) in, (rows, K) out; the reference's act (on
    // "cuda" bf16 values) on every side, so the plain GEMM on its float32 copy sees the same operand
    void *actd = gpu_hid_put(gpu, r[2], nh);
    float *actf = gpu_putf(gpu, r[2], nh), *yd = gpu_nanf(gpu, nx), *yp = gpu_nanf(gpu, nx), *yr = hnew(nx),
          *yf = hnew(nx);
    gpu->grouped_down_fwd(yd, actd, w2d, off, G, O, K);
    gpu->grouped_matmul_fwd(yp, actf, w2d, off, G, O, K);
    ref->grouped_down_fwd(yr, r[2], w2, off, G, O, K);
    cpu->grouped_down_fwd(yf, r[2], w2, off, G, O, K);
    snprintf(what, sizeof what, "out G%d rows %zu K%d O%d", G, n, O, K);
    cmp_gemm("grouped_down_fwd", bf, what, yd, yr, yf, nx);
    snprintf(what, sizeof what, "grouped_down_fwd = grouped_matmul_fwd G%d K%d O%d", G, O, K);
    cmp_exact_dev(what, yd, yp, nx);
    // w2's backward into the SwiGLU: dout (rows, K), W2 (G, K, O); dh1, dh3 (rows, O); dw2 accumulates.
    // Every side gets the reference's h1, h3, act (the GPU's own differ in the last bits, and act
    // rounded to bf16 for dw would then differ by a bf16 ulp in places: measured 1.1e-4 on one element)
    float *dy = hrand(nx, 1.0f), *pdw = hrand(nw, 1.0f);
    hid_round(dy, nx); // (dout in the hidden format, as x)
    float *dyd = gpu_putf(gpu, dy, nx);
    void *dyh = gpu_hid_put(gpu, dy, nx);
    for (int i = 0; i < 3; i++) {
        gpu->free(o[i]);
        o[i] = gpu_hid_put(gpu, r[i], nh);
    }
    float *d1 = hnew(nh), *d3 = hnew(nh), *d1f = hnew(nh), *d3f = hnew(nh), *dw = hcopy(pdw, nw),
          *dwf = hcopy(pdw, nw);
    float *dwd = gpu_putf(gpu, pdw, nw);
    void *d1d = gpu_hid_nan(gpu, nh), *d3d = gpu_hid_nan(gpu, nh);
    ref->grouped_swiglu_bwd(d1, d3, dw, dy, r[2], r[0], r[1], w2, off, G, O, K, 0);
    cpu->grouped_swiglu_bwd(d1f, d3f, dwf, dy, r[2], r[0], r[1], w2, off, G, O, K, 0);
    gpu->grouped_swiglu_bwd(d1d, d3d, dwd, dyh, o[2], o[0], o[1], w2d, off, G, O, K, 0);
    snprintf(what, sizeof what, "dh1 G%d rows %zu K%d O%d", G, n, O, K);
    cmp_hid("grouped_swiglu_bwd", bf, what, d1d, d1, d1f, nh);
    snprintf(what, sizeof what, "dh3 G%d rows %zu K%d O%d", G, n, O, K);
    cmp_hid("grouped_swiglu_bwd", bf, what, d3d, d3, d3f, nh);
    snprintf(what, sizeof what, "dw (accumulate) G%d rows %zu K%d O%d", G, n, O, K);
    cmp_gemm("grouped_swiglu_bwd", bf, what, dwd, dw, dwf, nw);
    float *h1f = gpu_putf(gpu, r[0], nh), *h3f = gpu_putf(gpu, r[1], nh), *dact = gpu_nanf(gpu, nh),
          *p1 = gpu_nanf(gpu, nh), *p3 = gpu_nanf(gpu, nh);
    gpu->grouped_matmul_bwd(dact, NULL, dyd, actf, w2d, off, G, O, K, 0);
    gpu->swiglu_bwd(p1, p3, dact, h1f, h3f, nh, 0);
    snprintf(what, sizeof what, "grouped_swiglu_bwd: dh1 = plain GEMM + swiglu_bwd G%d K%d O%d", G, O, K);
    cmp_exact_hid(what, d1d, p1, nh);
    snprintf(what, sizeof what, "grouped_swiglu_bwd: dh3 = plain GEMM + swiglu_bwd G%d K%d O%d", G, O, K);
    cmp_exact_hid(what, d3d, p3, nh);
    // GM_DW_WRITE: dw written over NaN = added into zeros, bit for bit (blocks of 0-row groups: zeros)
    float *zw = hnew(nw), *dwz = gpu_putf(gpu, zw, nw), *dwn = gpu_nanf(gpu, nw);
    gpu->grouped_swiglu_bwd(d1d, d3d, dwz, dyh, o[2], o[0], o[1], w2d, off, G, O, K, 0);
    gpu->grouped_swiglu_bwd(d1d, d3d, dwn, dyh, o[2], o[0], o[1], w2d, off, G, O, K, GM_DW_WRITE);
    snprintf(what, sizeof what, "grouped_swiglu_bwd GM_DW_WRITE = into zeros G%d K%d O%d", G, O, K);
    cmp_exact_dev(what, dwn, dwz, nw);
    float *dwp = gpu_nanf(gpu, 2 * nw); // GM_DW_BF16: the same floats rounded, packed
    gpu->grouped_swiglu_bwd(d1d, d3d, dwp, dyh, o[2], o[0], o[1], w2d, off, G, O, K,
                            GM_DW_WRITE | GM_DW_BF16);
    snprintf(what, sizeof what, "grouped_swiglu_bwd GM_DW_BF16 = GM_DW_WRITE's rounded G%d K%d O%d", G, O, K);
    cmp_packed_dev(what, dwp, dwn, nw);
    // GM_DW_SUMSQ: the same writes, and the written blocks' sum of squares in the ledger
    gpu->dw_sumsq_take(NULL);
    float *dws = gpu_nanf(gpu, 2 * nw);
    gpu->grouped_swiglu_bwd(d1d, d3d, dws, dyh, o[2], o[0], o[1], w2d, off, G, O, K,
                            GM_DW_WRITE | GM_DW_SUMSQ);
    snprintf(what, sizeof what, "grouped_swiglu_bwd GM_DW_SUMSQ G%d K%d O%d", G, O, K);
    cmp_exact_dev(what, dws, dwn, nw);
    ledger_check(what, dws, nw, 0, G);
    float *dwsp = gpu_nanf(gpu, 2 * nw); // (as dwp was: NaN past the packed values)
    gpu->grouped_swiglu_bwd(d1d, d3d, dwsp, dyh, o[2], o[0], o[1], w2d, off, G, O, K,
                            GM_DW_WRITE | GM_DW_BF16 | GM_DW_SUMSQ);
    snprintf(what, sizeof what, "grouped_swiglu_bwd GM_DW_SUMSQ, packed G%d K%d O%d", G, O, K);
    cmp_exact_dev(what, dwsp, dwp, 2 * nw);
    ledger_check(what, dwsp, nw, 1, G);
    gpu->free(dws);
    gpu->free(dwsp);
    gpu->free(dwp);
    // the w1/w3 pair's backward: dinp [+]= dh1 W1 + dh3 W3, dw1, dw3 accumulate; dh1, dh3 hidden rows
    // (values the hidden format holds exactly, so every side reads the same)
    float *ga = hrand(nh, 1.0f), *gb = hrand(nh, 1.0f);
    hid_round(ga, nh);
    hid_round(gb, nh);
    void *gad = gpu_hid_put(gpu, ga, nh), *gbd = gpu_hid_put(gpu, gb, nh);
    float *pdx = hrand(nx, 1.0f);
    for (int acc = 1; acc >= 0; acc--) {
        float *dx = hcopy(pdx, nx), *dwa = hcopy(pdw, nw), *dwb = hcopy(pdw, nw);
        float *dxf = hcopy(dx, nx), *dwaf = hcopy(dwa, nw), *dwbf = hcopy(dwb, nw);
        float *dxd = acc ? gpu_putf(gpu, dx, nx) : gpu_nanf(gpu, nx), *dwad = gpu_putf(gpu, dwa, nw),
              *dwbd = gpu_putf(gpu, dwb, nw);
        gpu->grouped_matmul_bwd2(dxd, dwad, dwbd, gad, gbd, xh, w1d, w3d, off, G, K, O, acc);
        ref->grouped_matmul_bwd2(dx, dwa, dwb, ga, gb, x, w1, w3, off, G, K, O, acc);
        cpu->grouped_matmul_bwd2(dxf, dwaf, dwbf, ga, gb, x, w1, w3, off, G, K, O, acc);
        const char *tag = acc ? "accumulate" : "overwrite";
        snprintf(what, sizeof what, "dinp (%s) G%d rows %zu K%d O%d", tag, G, n, K, O);
        cmp_gemm("grouped_matmul_bwd2", bf, what, dxd, dx, dxf, nx);
        snprintf(what, sizeof what, "dwa (%s) G%d rows %zu K%d O%d", tag, G, n, K, O);
        cmp_gemm("grouped_matmul_bwd2", bf, what, dwad, dwa, dwaf, nw);
        snprintf(what, sizeof what, "dwb (%s) G%d rows %zu K%d O%d", tag, G, n, K, O);
        cmp_gemm("grouped_matmul_bwd2", bf, what, dwbd, dwb, dwbf, nw);
        if (!acc) { // GM_DW_WRITE over NaN = added into zeros, bit for bit
            float *za = gpu_putf(gpu, zw, nw), *zb = gpu_putf(gpu, zw, nw), *na = gpu_nanf(gpu, nw),
                  *nb = gpu_nanf(gpu, nw), *xz = gpu_nanf(gpu, nx);
            gpu->grouped_matmul_bwd2(xz, za, zb, gad, gbd, xh, w1d, w3d, off, G, K, O, 0);
            gpu->grouped_matmul_bwd2(xz, na, nb, gad, gbd, xh, w1d, w3d, off, G, K, O, GM_DW_WRITE);
            snprintf(what, sizeof what, "grouped_matmul_bwd2 GM_DW_WRITE = into zeros (dwa) G%d K%d O%d", G,
                     K, O);
            cmp_exact_dev(what, na, za, nw);
            snprintf(what, sizeof what, "grouped_matmul_bwd2 GM_DW_WRITE = into zeros (dwb) G%d K%d O%d", G,
                     K, O);
            cmp_exact_dev(what, nb, zb, nw);
            float *pa = gpu_nanf(gpu, 2 * nw), *pb = gpu_nanf(gpu, 2 * nw);
            gpu->grouped_matmul_bwd2(xz, pa, pb, gad, gbd, xh, w1d, w3d, off, G, K, O,
                                     GM_DW_WRITE | GM_DW_BF16);
            snprintf(what, sizeof what,
                     "grouped_matmul_bwd2 GM_DW_BF16 = GM_DW_WRITE's rounded (dwa) G%d K%d O%d", G, K, O);
            cmp_packed_dev(what, pa, na, nw);
            snprintf(what, sizeof what,
                     "grouped_matmul_bwd2 GM_DW_BF16 = GM_DW_WRITE's rounded (dwb) G%d K%d O%d", G, K, O);
            cmp_packed_dev(what, pb, nb, nw);
            // GM_DW_SUMSQ: both weights' blocks in the ledger, in one sum (packed)
            gpu->dw_sumsq_take(NULL);
            float *sa = gpu_nanf(gpu, 2 * nw), *sb = gpu_nanf(gpu, 2 * nw);
            gpu->grouped_matmul_bwd2(xz, sa, sb, gad, gbd, xh, w1d, w3d, off, G, K, O,
                                     GM_DW_WRITE | GM_DW_BF16 | GM_DW_SUMSQ);
            snprintf(what, sizeof what, "grouped_matmul_bwd2 GM_DW_SUMSQ, packed G%d K%d O%d", G, K, O);
            cmp_exact_dev(what, sa, pa, nw);
            cmp_exact_dev(what, sb, pb, nw);
            {
                double l = -1, ra = 0;
                int got = gpu->dw_sumsq_take(&l);
                float *ha = gpu_getf(gpu, sa, nw), *hb = gpu_getf(gpu, sb, nw);
                for (size_t j = 0; j < nw; j++) {
                    uint16_t u, v;
                    memcpy(&u, (const char *)ha + 2 * j, 2);
                    memcpy(&v, (const char *)hb + 2 * j, 2);
                    ra += (double)bf16_to_f32(u) * bf16_to_f32(u) + (double)bf16_to_f32(v) * bf16_to_f32(v);
                }
                EXPECT(got == 2 * G && fabs(l - ra) <= 4e-6 * ra,
                       "%s: the ledger holds %d blocks (%d written), sum %.17g against %.17g", what, got,
                       2 * G, l, ra);
                free(ha);
                free(hb);
            }
            gpu->free(sa);
            gpu->free(sb);
            gpu->free(pa);
            gpu->free(pb);
            gpu->free(za);
            gpu->free(zb);
            gpu->free(na);
            gpu->free(nb);
            gpu->free(xz);
        }
        gpu->free(dxd);
        gpu->free(dwad);
        gpu->free(dwbd);
        free(dx);
        free(dwa);
        free(dwb);
        free(dxf);
        free(dwaf);
        free(dwbf);
    }
    for (int i = 0; i < 3; i++) {
        free(r[i]);
        free(f[i]);
        gpu->free(o[i]);
    }
    gpu->free(ph1);
    gpu->free(ph3);
    gpu->free(pact);
    gpu->free(actd);
    gpu->free(actf);
    gpu->free(yd);
    gpu->free(yp);
    gpu->free(h1f);
    gpu->free(h3f);
    gpu->free(dact);
    gpu->free(p1);
    gpu->free(p3);
    gpu->free(dwz);
    gpu->free(dwn);
    free(zw);
    gpu->free(xd);
    gpu->free(w1d);
    gpu->free(w3d);
    gpu->free(w2d);
    gpu->free(dyd);
    gpu->free(d1d);
    gpu->free(d3d);
    gpu->free(dwd);
    gpu->free(gad);
    gpu->free(gbd);
    gpu->free(xh);
    gpu->free(dyh);
    free(x);
    free(w1);
    free(w3);
    free(w2);
    free(dy);
    free(pdw);
    free(d1);
    free(d3);
    free(d1f);
    free(d3f);
    free(dw);
    free(dwf);
    free(ga);
    free(gb);
    free(pdx);
    free(off);
    free(yr);
    free(yf);
}

// ---------------------------------------------------------------- embedding, rows
static void test_embedding(int V, int N, int C) {
    float *tab = hrand((size_t)V * C, 1.0f);
    int32_t *tok = hidx(N, V); // N >> V: many repeats, so the backward's sum order matters
    float *tabd = gpu_putf(gpu, tab, (size_t)V * C);
    int32_t *tokd = gpu_put(gpu, tok, N * sizeof(int32_t));
    float *ref = hnew((size_t)N * C), *od = gpu_nanf(gpu, (size_t)N * C);
    cpu->embedding_fwd(ref, tok, tab, N, C, V);
    gpu->embedding_fwd(od, tokd, tabd, N, C, V);
    cmp("embedding_fwd", "out", od, ref, (size_t)N * C, BAND_ELEM);
    float *dout = hrand((size_t)N * C, 1.0f), *doutd = gpu_putf(gpu, dout, (size_t)N * C),
          *pre = hrand((size_t)V * C, 1.0f);
    for (int p = 0; p < 2; p++) {
        float *dt = p ? hcopy(pre, (size_t)V * C) : hnew((size_t)V * C);
        float *dtd = gpu_putf(gpu, dt, (size_t)V * C), *dtd2 = gpu_putf(gpu, dt, (size_t)V * C);
        cpu->embedding_bwd(dt, dout, tok, N, C, V);
        gpu->embedding_bwd(dtd, doutd, tokd, N, C, V);
        gpu->embedding_bwd(dtd2, doutd, tokd, N, C, V);
        // each element's rows added in index order, one float add each, as the cpu adds them: the same bits
        cmp("embedding_bwd", p ? "dtable (accumulate)" : "dtable", dtd, dt, (size_t)V * C, 0.0);
        cmp_exact_dev("embedding_bwd (two runs on the same inputs)", dtd, dtd2, (size_t)V * C);
        gpu->free(dtd);
        gpu->free(dtd2);
        free(dt);
    }
    // ids outside [0, V) (vocab-parallel: another TP rank's rows): a zero row forward, nothing added
    // backward; the same bits as the cpu's
    tok[0] = -1;
    tok[N - 1] = V;
    float *dt = hcopy(pre, (size_t)V * C), *dtd = gpu_putf(gpu, dt, (size_t)V * C);
    gpu->to_device(tokd, tok, N * sizeof(int32_t));
    cpu->embedding_fwd(ref, tok, tab, N, C, V);
    gpu->embedding_fwd(od, tokd, tabd, N, C, V);
    cmp("embedding_fwd", "out (ids -1 and V: zero rows)", od, ref, (size_t)N * C, 0.0);
    cpu->embedding_bwd(dt, dout, tok, N, C, V);
    gpu->embedding_bwd(dtd, doutd, tokd, N, C, V);
    cmp("embedding_bwd", "dtable (ids -1 and V: nothing added)", dtd, dt, (size_t)V * C, 0.0);
    gpu->free(dtd);
    free(dt);
    gpu->free(tabd);
    gpu->free(tokd);
    gpu->free(od);
    gpu->free(doutd);
    free(tab);
    free(tok);
    free(ref);
    free(dout);
    free(pre);
}

// <a, b> over C as gather_dot_scale_k sums it (cuda_nn.cu: one warp per row; lane l adds the
// products of columns l, l+32, ... in double, or where the rows go as float4 (C % 4 == 0: the
// device buffers here are aligned) the 4 columns of float4 l, l+32, ... in column order; then the
// lanes' sums meet in a butterfly, lane l adding lane l^o's for o = 16, 8, 4, 2, 1; lane 0's sum,
// rounded to float). The products of two floats are exact in double, so only this order decides the bits.
static float warp_order_dot(const float *a, const float *b, int C) {
    double v[32], nv[32];
    int w = C % 4 == 0 ? 4 : 1; // columns per lane step
    for (int l = 0; l < 32; l++) {
        v[l] = 0;
        for (int c = l * w; c < C; c += 32 * w)
            for (int j = 0; j < w; j++) v[l] += (double)a[c + j] * b[c + j];
    }
    for (int o = 16; o > 0; o >>= 1) {
        for (int l = 0; l < 32; l++) nv[l] = v[l] + v[l ^ o];
        memcpy(v, nv, sizeof v);
    }
    return (float)v[0];
}

static void test_rows(int nsrc, int n, int C) {
    float *inp = hrand((size_t)nsrc * C, 1.0f), *inpd = gpu_putf(gpu, inp, (size_t)nsrc * C);
    int32_t *idx = hidx(n, nsrc), *idxd = gpu_put(gpu, idx, n * sizeof(int32_t));
    // gather
    float *ref = hnew((size_t)n * C), *od = gpu_nanf(gpu, (size_t)n * C);
    cpu->gather_rows(ref, inp, idx, n, C);
    gpu->gather_rows(od, inpd, idxd, n, C);
    cmp("gather_rows", "out", od, ref, (size_t)n * C, BAND_ELEM);
    // the fused gather + row_dot + scale_rows (the combine's backward): against the cpu's in the
    // bands, and bit for bit against host references of what the kernel computes: out = the
    // gathered rows scaled (cpu_oracle.h scale_rows: one float product each), dot = the gathered
    // row's dot with b in the kernel's order (warp_order_dot)
    float *sc = hrand(n, 1.0f), *scd = gpu_putf(gpu, sc, n);
    float *b = hrand((size_t)n * C, 1.0f), *bd = gpu_putf(gpu, b, (size_t)n * C);
    float *fo = gpu_nanf(gpu, (size_t)n * C), *fdt = gpu_nanf(gpu, n);
    float *ho = hnew((size_t)n * C), *hdt = hnew(n);
    cpu->gather_dot_scale(ho, hdt, inp, idx, b, sc, n, C, 0);
    gpu->gather_dot_scale(fo, fdt, inpd, idxd, bd, scd, n, C, 0);
    cmp("gather_dot_scale", "out", fo, ho, (size_t)n * C, BAND_ELEM);
    cmp("gather_dot_scale", "dot", fdt, hdt, n, BAND_SUM);
    float *xo = hcopy(ref, (size_t)n * C), *xdt = hnew(n);
    oracle_scale_rows(xo, sc, n, C);
    for (int i = 0; i < n; i++) xdt[i] = warp_order_dot(ref + (size_t)i * C, b + (size_t)i * C, C);
    cmp_exact_host("gather_dot_scale out = gather_rows + scale_rows", fo, xo, (size_t)n * C);
    cmp_exact_host("gather_dot_scale dot = gather_rows + the warp-order dot", fdt, xdt, n);
    // into the hidden format (the rows sent to the experts): out = those products rounded once (bf16 on
    // "cuda"), the dot unchanged; gather_rows_hid from float32 = the gathered rows rounded, and from rows
    // of the format (values it holds exactly) = copied; unwritten rows poisoned, bit for bit
    void *hd = gpu_hid_nan(gpu, (size_t)n * C);
    float *hdt2 = gpu_nanf(gpu, n);
    gpu->gather_dot_scale(hd, hdt2, inpd, idxd, bd, scd, n, C, 1);
    float *got = gpu_hid_get(gpu, hd, (size_t)n * C), *want = hcopy(xo, (size_t)n * C);
    hid_round(want, (size_t)n * C);
    EXPECT(memcmp(got, want, sizeof(float) * n * C) == 0,
           "gather_dot_scale (hidden format) C%d: not the rounded products", C);
    cmp_exact_dev("gather_dot_scale (hidden format): dot", hdt2, fdt, n);
    free(got);
    gpu->free(hd);
    hd = gpu_hid_nan(gpu, (size_t)n * C);
    gpu->gather_rows_hid(hd, inpd, 0, idxd, n, C);
    got = gpu_hid_get(gpu, hd, (size_t)n * C);
    memcpy(want, ref, sizeof(float) * n * C);
    hid_round(want, (size_t)n * C);
    EXPECT(memcmp(got, want, sizeof(float) * n * C) == 0,
           "gather_rows_hid (from float32) C%d: not the rounded rows", C);
    free(got);
    float *src = hcopy(inp, (size_t)nsrc * C);
    hid_round(src, (size_t)nsrc * C);
    void *srcd = gpu_hid_put(gpu, src, (size_t)nsrc * C), *hd2 = gpu_hid_nan(gpu, (size_t)n * C);
    gpu->gather_rows_hid(hd2, srcd, 1, idxd, n, C);
    got = gpu_hid_get(gpu, hd2, (size_t)n * C);
    for (int i = 0; i < n; i++) memcpy(want + (size_t)i * C, src + (size_t)idx[i] * C, sizeof(float) * C);
    EXPECT(memcmp(got, want, sizeof(float) * n * C) == 0,
           "gather_rows_hid (hidden rows) C%d: not the rows copied", C);
    free(got);
    free(want);
    free(src);
    gpu->free(hd);
    gpu->free(hd2);
    gpu->free(srcd);
    gpu->free(hdt2);
    gpu->free(fo);
    gpu->free(fdt);
    free(ho);
    free(hdt);
    free(xo);
    free(xdt);
    gpu->free(inpd);
    gpu->free(idxd);
    gpu->free(od);
    gpu->free(scd);
    gpu->free(bd);
    free(inp);
    free(idx);
    free(ref);
    free(sc);
    free(b);
}

// combine_rows (the MoE combine / un-permute): N output rows from M rows through slot_row (N,k),
// slots dropped (-1) at random and every slot of token 1 dropped, rows referenced twice; with and
// without weights, overwrite (output poisoned) and accumulate (pre-filled), and with res (the residual
// added last): the cpu's bits (same operations, same order, no FMA contraction in either), and with res
// the bits of the combine then an add (the residual add it replaces in block.c). shift 1 puts rows and
// out off 16-byte alignment (the scalar kernel); C % 4 != 0 likewise. Run twice: bit-identical.
static void test_combine(int N, int k, int C, int M, int shift) {
    int32_t *sr = xcalloc((size_t)N * k, sizeof(int32_t));
    for (int i = 0; i < N * k; i++) sr[i] = rng_below(&R, 5) == 0 ? -1 : (int32_t)rng_below(&R, (uint32_t)M);
    if (N > 1)
        for (int j = 0; j < k; j++) sr[k + j] = -1;
    float *rows = hrand((size_t)M * C, 1.0f), *w = hrand((size_t)N * k, 1.0f),
          *pre = hrand((size_t)N * C, 1.0f), *res = hrand((size_t)N * C, 1.0f);
    float *rb, *ob, *ob2, *sb;
    float *rowsd = dputf_shift(rows, (size_t)M * C, shift, &rb), *wd = gpu_putf(gpu, w, (size_t)N * k);
    float *resd = dputf_shift(res, (size_t)N * C, shift, &sb);
    int32_t *srd = gpu_put(gpu, sr, (size_t)N * k * sizeof(int32_t));
    float *nanh = hnew((size_t)N * C);
    for (size_t i = 0; i < (size_t)N * C; i++) nanh[i] = NAN;
    char what[80];
    for (int rs = 0; rs < 2; rs++)
        for (int acc = 0; acc < 2; acc++)
            for (int ws = 0; ws < 2; ws++) {
                float *o = acc ? hcopy(pre, (size_t)N * C) : hnew((size_t)N * C);
                float *od = dputf_shift(acc ? pre : nanh, (size_t)N * C, shift, &ob);
                float *od2 = dputf_shift(acc ? pre : nanh, (size_t)N * C, shift, &ob2);
                cpu->combine_rows(o, rs ? res : NULL, rows, sr, ws ? w : NULL, N, k, C, acc);
                gpu->combine_rows(od, rs ? resd : NULL, rowsd, srd, ws ? wd : NULL, N, k, C, acc);
                snprintf(what, sizeof what, "N %d k %d C %d%s, %s, %s%s", N, k, C, shift ? " unaligned" : "",
                         ws ? "w" : "w NULL", acc ? "accumulate" : "overwrite", rs ? ", res" : "");
                cmp("combine_rows", what, od, o, (size_t)N * C, BAND_ELEM);
                cmp_exact_host("combine_rows (the cpu's bits)", od, o, (size_t)N * C);
                if (rs) { // without res, then add: the same bits
                    gpu->combine_rows(od2, NULL, rowsd, srd, ws ? wd : NULL, N, k, C, acc);
                    gpu->add(od2, resd, od2, (size_t)N * C);
                    cmp_exact_dev("combine_rows with res against the combine, then add", od, od2,
                                  (size_t)N * C);
                } else {
                    gpu->combine_rows(od2, NULL, rowsd, srd, ws ? wd : NULL, N, k, C, acc);
                    cmp_exact_dev("combine_rows (two runs on the same inputs)", od, od2, (size_t)N * C);
                }
                gpu->free(ob);
                gpu->free(ob2);
                free(o);
            }
    gpu->free(rb);
    gpu->free(sb);
    gpu->free(wd);
    gpu->free(srd);
    free(sr);
    free(rows);
    free(w);
    free(pre);
    free(res);
    free(nanh);
}

// router_topk / router_bwd against the cpu's. probs, lse, w: the same operations (expf/log may
// differ by an ulp between CUDA and glibc): BAND_ELEM; a top-k choice may differ only where two
// probabilities are within rounding of each other; sums: double sums of positive terms that each
// carry that ulp-level difference, so BAND_ELEM relative too (measured on an H200: 1.4e-7; the
// summation order, tree vs serial, adds only ~1e-16); dlogits (a tree sum over experts on the GPU)
// BAND_SUM. Two runs bit-identical; outputs poisoned.
// The dispatch plan ops against the cpu backend's (ops.h): counts, ranks, and the rows with a keep
// below the counts (drops); integers must be equal, the combine weights copied bit for bit.
// Its own random stream: the suite's shared one feeds the later tests, whose inputs stay as they were
// (when this test first drew from it, attention_fwd's bf16-vs-float32 per-element check met one
// element at 5.1e-2 against its 5e-2 band on the shifted inputs: that band is a measured tail).
static void test_plan(int N, int E, int k) {
    size_t nk = (size_t)N * k, kE = (size_t)k * E;
    Rng pr;
    rng_seed(&pr, 1000003u * (uint64_t)N + (uint64_t)E * 31 + (uint64_t)k);
    int32_t *idx = xcalloc(nk, sizeof(int32_t));
    float *w = hnew(nk);
    for (size_t i = 0; i < nk; i++) {
        idx[i] = (int32_t)(rng_u64(&pr) % (uint64_t)(E > 1 ? E - 1 : 1)); // expert E-1 stays empty
        w[i] = rng_uniform(&pr);
    }
    int32_t *cnt = xcalloc(kE, 4), *rank = xcalloc(nk, 4), *kf = xcalloc(2 * kE, 4);
    cpu->plan_counts(cnt, rank, idx, N, E, k);
    int32_t *idxd = gpu->alloc(nk * 4), *cntd = gpu->alloc(kE * 4), *rankd = gpu->alloc(nk * 4);
    gpu->to_device(idxd, idx, nk * 4);
    gpu->plan_counts(cntd, rankd, idxd, N, E, k);
    int32_t *g = xcalloc(nk > kE ? nk : kE, 4);
    gpu->to_host(g, cntd, kE * 4);
    EXPECT(!memcmp(g, cnt, kE * 4), "plan_counts N %d E %d k %d: counts differ from the cpu's", N, E, k);
    gpu->to_host(g, rankd, nk * 4);
    EXPECT(!memcmp(g, rank, nk * 4), "plan_counts N %d E %d k %d: ranks differ from the cpu's", N, E, k);
    for (size_t q = 0, o = 0; q < kE; q++) { // keep about 3/4 of each (j, e); rows in (j, e) order
        kf[q] = cnt[q] - cnt[q] / 4;
        kf[kE + q] = (int32_t)o;
        o += kf[q];
    }
    int32_t *sr = xcalloc(nk, 4), *rt = xcalloc(nk, 4);
    float *rs = hnew(nk), *rsg = hnew(nk);
    cpu->plan_rows(sr, rt, rs, rank, idx, w, kf, kf + kE, N, E, k);
    int32_t *kfd = gpu->alloc(2 * kE * 4), *srd = gpu->alloc(nk * 4), *rtd = gpu->alloc(nk * 4);
    float *wd = gpu_putf(gpu, w, nk), *rsd = gpu_nanf(gpu, nk);
    gpu->to_device(kfd, kf, 2 * kE * 4);
    gpu->to_device(rtd, rt, nk * 4); // rows past the kept ones: the same (unwritten) values on both
    gpu->to_device(rsd, rs, nk * 4);
    gpu->plan_rows(srd, rtd, rsd, rankd, idxd, wd, kfd, kfd + kE, N, E, k);
    gpu->to_host(g, srd, nk * 4);
    int ok = !memcmp(g, sr, nk * 4);
    gpu->to_host(g, rtd, nk * 4);
    ok &= !memcmp(g, rt, nk * 4);
    gpu->to_host(rsg, rsd, nk * 4);
    ok &= !memcmp(rsg, rs, nk * 4);
    EXPECT(ok, "plan_rows N %d E %d k %d: slot_row, row_tok or row_scale differ from the cpu's", N, E, k);
    gpu->free(idxd);
    gpu->free(cntd);
    gpu->free(rankd);
    gpu->free(kfd);
    gpu->free(srd);
    gpu->free(rtd);
    gpu->free(wd);
    gpu->free(rsd);
    free(idx);
    free(w);
    free(cnt);
    free(rank);
    free(kf);
    free(g);
    free(sr);
    free(rt);
    free(rs);
    free(rsg);
}

static void test_router_r(int N, int E, RouteRule r, int with_bias);
static void test_router_b(int N, int E, int k, int renorm, int with_bias) {
    test_router_r(N, E, (RouteRule){.k = k, .renorm = renorm}, with_bias);
}
static void test_router(int N, int E, int k, int renorm) { test_router_b(N, E, k, renorm, 0); }
// with_bias: the aux-free routing bias (choice only; ops.h), values of the size of the probabilities; r:
// DeepSeek-V3's sigmoid scores, group-limited choice and weight scale too (no z term with sigmoid scores)
static void test_router_r(int N, int E, RouteRule r, int with_bias) {
    int k = r.k, renorm = r.renorm;
    float zl = r.sigmoid ? 0.0f : 0.37f;
    float *lg = hrand((size_t)N * E, 2.0f), *lgd = gpu_putf(gpu, lg, (size_t)N * E);
    float *bias = with_bias ? hrand(E, 0.3f) : NULL, *biasd = with_bias ? gpu_putf(gpu, bias, E) : NULL;
    float *p = hnew((size_t)N * E), *l = hnew(N), *w = hnew((size_t)N * k);
    int32_t *ix = xcalloc((size_t)N * k, sizeof(int32_t)), *ixg = xcalloc((size_t)N * k, sizeof(int32_t));
    double *sm = xcalloc(E + 1, sizeof(double)), *smg = xcalloc(E + 1, sizeof(double)),
           *smg2 = xcalloc(E + 1, sizeof(double));
    cpu->router_topk(p, l, ix, w, sm, lg, bias, N, E, r);
    float *pd = gpu_nanf(gpu, (size_t)N * E), *ld = gpu_nanf(gpu, N), *wd = gpu_nanf(gpu, (size_t)N * k);
    float *pd2 = gpu_nanf(gpu, (size_t)N * E), *ld2 = gpu_nanf(gpu, N), *wd2 = gpu_nanf(gpu, (size_t)N * k);
    int32_t *ixd = gpu->alloc(sizeof(int32_t) * N * k), *ixd2 = gpu->alloc(sizeof(int32_t) * N * k);
    double *smd = gpu->alloc(sizeof(double) * (E + 1)), *smd2 = gpu->alloc(sizeof(double) * (E + 1));
    gpu->router_topk(pd, ld, ixd, wd, smd, lgd, biasd, N, E, r);
    gpu->router_topk(pd2, ld2, ixd2, wd2, smd2, lgd, biasd, N, E, r);
    char what[96];
    snprintf(what, sizeof what, "N %d E %d k %d renorm %d%s%s groups %d/%d scale %g", N, E, k, renorm,
             with_bias ? " bias" : "", r.sigmoid ? " sigmoid" : "", r.topk_group, r.n_group, r.scale);
    cmp("router_topk", what, pd, p, (size_t)N * E, BAND_ELEM);
    cmp("router_topk", what, ld, l, N, BAND_ELEM);
    cmp("router_topk", what, wd, w, (size_t)N * k, BAND_ELEM);
    cmp_exact_dev("router_topk probs (two runs on the same inputs)", pd, pd2, (size_t)N * E);
    cmp_exact_dev("router_topk w (two runs on the same inputs)", wd, wd2, (size_t)N * k);
    gpu->to_host(ixg, ixd, sizeof(int32_t) * N * k);
    // a choice may differ only between two probabilities within rounding of each other (1e-6)
    int diff = 0, far = 0;
    for (int i = 0; i < N * k; i++) {
        if (ixg[i] == ix[i]) continue;
        diff++;
        float a = p[(size_t)(i / k) * E + ix[i]] + (bias ? bias[ix[i]] : 0.0f),
              b = ixg[i] >= 0 && ixg[i] < E ? p[(size_t)(i / k) * E + ixg[i]] + (bias ? bias[ixg[i]] : 0.0f)
                                            : -1.0f;
        far += !(fabsf(a - b) <= 1e-6f * fabsf(a) + (bias ? 1e-6f : 0.0f));
    }
    EXPECT(far == 0, "router_topk %s: %d of %d choices differ from the cpu's (%d of them not near-ties)",
           what, diff, N * k, far);
    if (diff) printf("router_topk %s: %d near-tie choices differ from the cpu's\n", what, diff);
    gpu->to_host(smg, smd, sizeof(double) * (E + 1));
    gpu->to_host(smg2, smd2, sizeof(double) * (E + 1));
    EXPECT(!memcmp(smg, smg2, sizeof(double) * (E + 1)), "router_topk %s: sums differ between two runs",
           what);
    OpRow *row = row_for("router_topk sums", BAND_ELEM);
    for (int e = 0; e <= E; e++) {
        double err = fabs(smg[e] - sm[e]) / (fabs(sm[e]) + 1e-300);
        if (err > row->worst) row->worst = err;
        row->bad += !(err <= BAND_ELEM);
        EXPECT(err <= BAND_ELEM, "router_topk %s: sums[%d] cuda %.17g cpu %.17g", what, e, smg[e], sm[e]);
    }
    // backward (on the cpu's forward outputs, so that both sides see the same inputs)
    int M = N * k;
    int32_t *sr = xcalloc((size_t)N * k, sizeof(int32_t));
    for (int i = 0; i < N * k; i++) sr[i] = rng_below(&R, 5) == 0 ? -1 : (int32_t)rng_below(&R, (uint32_t)M);
    float *rd = hrand(M, 1.0f), *aux = hrand(E, 0.1f), *dl = hnew((size_t)N * E);
    cpu->router_bwd(dl, rd, sr, p, l, ix, w, aux, zl, N, E, r);
    float *pc = gpu_putf(gpu, p, (size_t)N * E), *lc = gpu_putf(gpu, l, N),
          *wc = gpu_putf(gpu, w, (size_t)N * k), *rdd = gpu_putf(gpu, rd, M);
    float *auxd = gpu_putf(gpu, aux, E), *dld = gpu_nanf(gpu, (size_t)N * E),
          *dld2 = gpu_nanf(gpu, (size_t)N * E);
    int32_t *ixc = gpu_put(gpu, ix, sizeof(int32_t) * N * k),
            *srd = gpu_put(gpu, sr, sizeof(int32_t) * N * k);
    gpu->router_bwd(dld, rdd, srd, pc, lc, ixc, wc, auxd, zl, N, E, r);
    gpu->router_bwd(dld2, rdd, srd, pc, lc, ixc, wc, auxd, zl, N, E, r);
    cmp("router_bwd", what, dld, dl, (size_t)N * E, BAND_SUM);
    cmp_exact_dev("router_bwd (two runs on the same inputs)", dld, dld2, (size_t)N * E);
    void *dv[] = {lgd,  pd, ld, wd, pd2, ld2,  wd2, ixd,  ixd2, smd,
                  smd2, pc, lc, wc, rdd, auxd, dld, dld2, ixc,  srd};
    for (size_t i = 0; i < sizeof dv / sizeof dv[0]; i++) gpu->free(dv[i]);
    free(lg);
    free(p);
    free(l);
    free(w);
    free(ix);
    free(ixg);
    free(sm);
    free(smg);
    free(smg2);
    free(sr);
    free(rd);
    free(aux);
    free(dl);
    if (bias) {
        free(bias);
        gpu->free(biasd);
    }
}

// ---------------------------------------------------------------- RMSNorm, RoPE, SwiGLU
static void test_rmsnorm(int N, int C) {
    float *x = hrand((size_t)N * C, 2.0f), *w = hrand(C, 1.0f), eps = 1e-5f;
    float *xd = gpu_putf(gpu, x, (size_t)N * C), *wd = gpu_putf(gpu, w, C);
    float *y = hnew((size_t)N * C), *r = hnew(N), *yd = gpu_nanf(gpu, (size_t)N * C), *rd = gpu_nanf(gpu, N);
    cpu->rmsnorm_fwd(y, r, x, w, N, C, eps);
    gpu->rmsnorm_fwd(yd, rd, xd, wd, N, C, eps);
    cmp("rmsnorm_fwd", "out", yd, y, (size_t)N * C, BAND_SUM);
    cmp("rmsnorm_fwd", "rstd", rd, r, N, BAND_SUM);
    { // into the hidden format: rmsnorm_fwd's values rounded once, the same rstd; unwritten values poisoned
        void *yh = gpu_hid_nan(gpu, (size_t)N * C);
        float *rh = gpu_nanf(gpu, N);
        gpu->rmsnorm_fwd_hid(yh, rh, xd, wd, N, C, eps);
        cmp_exact_hid("rmsnorm_fwd_hid = rmsnorm_fwd rounded", yh, yd, (size_t)N * C);
        cmp_exact_dev("rmsnorm_fwd_hid rstd = rmsnorm_fwd's", rh, rd, N);
        gpu->free(yh);
        gpu->free(rh);
    }
    float *rdc = gpu_putf(gpu, r, N); // both backwards get the cpu rstd
    float *g = hrand((size_t)N * C, 1.0f), *gd = gpu_putf(gpu, g, (size_t)N * C);
    float *pdx = hrand((size_t)N * C, 1.0f), *pdw = hrand(C, 1.0f);
    for (int p = 0; p < 3; p++) { // zeroed, pre-filled, pre-filled with dw = NULL
        float *dx = p ? hcopy(pdx, (size_t)N * C) : hnew((size_t)N * C), *dw = p ? hcopy(pdw, C) : hnew(C);
        float *dxd = gpu_putf(gpu, dx, (size_t)N * C), *dwd = gpu_putf(gpu, dw, C);
        cpu->rmsnorm_bwd(dx, p == 2 ? NULL : dw, g, x, w, r, N, C);
        gpu->rmsnorm_bwd(dxd, p == 2 ? NULL : dwd, gd, xd, wd, rdc, N, C);
        cmp("rmsnorm_bwd", p ? "dinp (accumulate)" : "dinp", dxd, dx, (size_t)N * C, BAND_SUM);
        cmp("rmsnorm_bwd",
            p == 2  ? "dw untouched when NULL"
                : p ? "dw (accumulate)"
                    : "dw",
            dwd, dw, C, BAND_SUM);
        gpu->free(dxd);
        gpu->free(dwd);
        free(dx);
        free(dw);
    }
    gpu->free(xd);
    gpu->free(wd);
    gpu->free(yd);
    gpu->free(rd);
    gpu->free(rdc);
    gpu->free(gd);
    free(x);
    free(w);
    free(y);
    free(r);
    free(g);
    free(pdx);
    free(pdw);
}

// add_rmsnorm_fwd: x += res, out = norm(x): against the cpu within the norm's band, and bit for bit the
// GPU's own axpy then rmsnorm_fwd (ops.h); shift 1 puts res off 16 bytes (the add's scalar path while the
// norm's rows stay float4).
static void test_add_rmsnorm(int N, int C, int shift) {
    size_t n = (size_t)N * C;
    float *x = hrand(n, 2.0f), *res = hrand(n, 1.0f), *w = hrand(C, 1.0f), eps = 1e-5f, *rbase;
    float *xd = gpu_putf(gpu, x, n), *x2d = gpu_putf(gpu, x, n), *resd = dputf_shift(res, n, shift, &rbase),
          *wd = gpu_putf(gpu, w, C);
    float *y = hnew(n), *r = hnew(N), *yd = gpu_nanf(gpu, n), *rd = gpu_nanf(gpu, N), *y2d = gpu_nanf(gpu, n),
          *r2d = gpu_nanf(gpu, N);
    cpu->add_rmsnorm_fwd(x, y, r, res, w, N, C, eps);
    gpu->add_rmsnorm_fwd(xd, yd, rd, resd, wd, N, C, eps);
    cmp("add_rmsnorm_fwd", "x", xd, x, n, BAND_ELEM);
    cmp("add_rmsnorm_fwd", "out", yd, y, n, BAND_SUM);
    cmp("add_rmsnorm_fwd", "rstd", rd, r, N, BAND_SUM);
    gpu->axpy(x2d, resd, 1.0f, n);
    gpu->rmsnorm_fwd(y2d, r2d, x2d, wd, N, C, eps);
    cmp_exact_dev("add_rmsnorm_fwd: axpy's x", xd, x2d, n);
    cmp_exact_dev("add_rmsnorm_fwd: rmsnorm_fwd's out", yd, y2d, n);
    cmp_exact_dev("add_rmsnorm_fwd: rmsnorm_fwd's rstd", rd, r2d, N);
    gpu->free(xd);
    gpu->free(x2d);
    gpu->free(rbase);
    gpu->free(wd);
    gpu->free(yd);
    gpu->free(rd);
    gpu->free(y2d);
    gpu->free(r2d);
    free(x);
    free(res);
    free(w);
    free(y);
    free(r);
}

// The row split by columns over ranks (rmsnorm_part, rmsnorm_fwd_part, rmsnorm_bwd_part): this rank's C of
// Ctot columns, the whole rows' sums made of this part plus a stand-in for the other ranks' (as the TP
// all-reduce adds them). rmsnorm_part against the cpu's in BAND_SUMSQ relative to the sum of |terms| (both
// sum in double, in another order); given the same whole sums, fwd_part's out/rstd and bwd_part's dinp are
// elementwise (BAND_ELEM), bwd_part's dw the column sums of rmsnorm_bwd (BAND_SUM). With C = Ctot the three
// give the GPU's own rmsnorm_fwd / rmsnorm_bwd bits (ops.h): checked exactly.
static void test_rmsnorm_part(int N, int C, int Ctot) {
    float *x = hrand((size_t)N * C, 2.0f), *w = hrand(C, 1.0f), *g = hrand((size_t)N * C, 1.0f), eps = 1e-5f;
    float *xd = gpu_putf(gpu, x, (size_t)N * C), *wd = gpu_putf(gpu, w, C),
          *gd = gpu_putf(gpu, g, (size_t)N * C);
    double *pc = xcalloc(N, sizeof(double)), *pg = xcalloc(N, sizeof(double)),
           *ss = xcalloc(N, sizeof(double)), *dot = xcalloc(N, sizeof(double));
    double *pdd = gpu->alloc(N * sizeof(double));
    OpRow *row = row_for("rmsnorm_part", BAND_SUMSQ);
    for (int pass = 0; pass < 2; pass++) { // the sum of squares, then the backward's dot
        const float *a = pass ? g : x, *ad = pass ? gd : xd, *wp = pass ? w : NULL, *wpd = pass ? wd : NULL;
        cpu->rmsnorm_part(pc, a, wp, x, N, C);
        gpu->rmsnorm_part(pdd, ad, wpd, xd, N, C);
        gpu->to_host(pg, pdd, N * sizeof(double));
        for (int i = 0; i < N; i++) {
            double mag = 0;
            for (int c = 0; c < C; c++)
                mag += fabs((double)a[(size_t)i * C + c] * (wp ? wp[c] : 1) * x[(size_t)i * C + c]);
            double e = fabs(pg[i] - pc[i]) / (mag + 1e-300);
            if (!(e <= row->worst)) row->worst = isnan(e) ? INFINITY : e;
            row->bad += !(e <= BAND_SUMSQ);
            EXPECT(e <= BAND_SUMSQ, "rmsnorm_part (%s) N=%d C=%d row %d: cuda %.17g cpu %.17g",
                   pass ? "dot" : "sumsq", N, C, i, pg[i], pc[i]);
            // the whole row: this part and the other ranks' (Ctot - C columns of the same scale)
            double other = pass ? 0.3 * sqrt((double)(Ctot - C)) * rng_normal(&R)
                                : 4.0 * (Ctot - C) * (1 + 0.1 * rng_normal(&R));
            (pass ? dot : ss)[i] = pc[i] + (Ctot > C ? other : 0);
        }
    }
    double *ssd = gpu_put(gpu, ss, N * sizeof(double)), *dotd = gpu_put(gpu, dot, N * sizeof(double));
    float *y = hnew((size_t)N * C), *r = hnew(N), *yd = gpu_nanf(gpu, (size_t)N * C), *rd = gpu_nanf(gpu, N);
    cpu->rmsnorm_fwd_part(y, r, x, w, ss, N, C, Ctot, eps);
    gpu->rmsnorm_fwd_part(yd, rd, xd, wd, ssd, N, C, Ctot, eps);
    cmp("rmsnorm_fwd_part", "out", yd, y, (size_t)N * C, BAND_ELEM);
    cmp("rmsnorm_fwd_part", "rstd", rd, r, N, BAND_ELEM);
    float *rdc = gpu_putf(gpu, r, N); // both backwards get the cpu rstd
    float *pdx = hrand((size_t)N * C, 1.0f), *pdw = hrand(C, 1.0f);
    for (int p = 0; p < 3; p++) { // zeroed, pre-filled, pre-filled with dw = NULL
        float *dx = p ? hcopy(pdx, (size_t)N * C) : hnew((size_t)N * C), *dw = p ? hcopy(pdw, C) : hnew(C);
        float *dxd = gpu_putf(gpu, dx, (size_t)N * C), *dwd = gpu_putf(gpu, dw, C);
        cpu->rmsnorm_bwd_part(dx, p == 2 ? NULL : dw, g, x, w, r, dot, N, C, Ctot);
        gpu->rmsnorm_bwd_part(dxd, p == 2 ? NULL : dwd, gd, xd, wd, rdc, dotd, N, C, Ctot);
        cmp("rmsnorm_bwd_part", p ? "dinp (accumulate)" : "dinp", dxd, dx, (size_t)N * C, BAND_ELEM);
        cmp("rmsnorm_bwd_part",
            p == 2  ? "dw untouched when NULL"
                : p ? "dw (accumulate)"
                    : "dw",
            dwd, dw, C, BAND_SUM);
        gpu->free(dxd);
        gpu->free(dwd);
        free(dx);
        free(dw);
    }
    if (Ctot == C) { // one part: the GPU's rmsnorm_fwd / rmsnorm_bwd bits
        float *y2 = gpu_nanf(gpu, (size_t)N * C), *r2 = gpu_nanf(gpu, N),
              *dx1 = gpu->alloc((size_t)N * C * sizeof(float)),
              *dx2 = gpu->alloc((size_t)N * C * sizeof(float)), *dw1 = gpu->alloc(C * sizeof(float)),
              *dw2 = gpu->alloc(C * sizeof(float));
        gpu->rmsnorm_part(ssd, xd, NULL, xd, N, C);
        gpu->rmsnorm_fwd_part(yd, rd, xd, wd, ssd, N, C, C, eps);
        gpu->rmsnorm_fwd(y2, r2, xd, wd, N, C, eps);
        cmp_exact_dev("rmsnorm_fwd_part, one part: rmsnorm_fwd's out", yd, y2, (size_t)N * C);
        cmp_exact_dev("rmsnorm_fwd_part, one part: rmsnorm_fwd's rstd", rd, r2, N);
        gpu->rmsnorm_part(dotd, gd, wd, xd, N, C);
        gpu->rmsnorm_bwd_part(dx1, dw1, gd, xd, wd, rd, dotd, N, C, C);
        gpu->rmsnorm_bwd(dx2, dw2, gd, xd, wd, r2, N, C);
        cmp_exact_dev("rmsnorm_bwd_part, one part: rmsnorm_bwd's dinp", dx1, dx2, (size_t)N * C);
        cmp_exact_dev("rmsnorm_bwd_part, one part: rmsnorm_bwd's dw", dw1, dw2, C);
        gpu->free(y2);
        gpu->free(r2);
        gpu->free(dx1);
        gpu->free(dx2);
        gpu->free(dw1);
        gpu->free(dw2);
    }
    gpu->free(xd);
    gpu->free(wd);
    gpu->free(gd);
    gpu->free(pdd);
    gpu->free(ssd);
    gpu->free(dotd);
    gpu->free(yd);
    gpu->free(rd);
    gpu->free(rdc);
    free(x);
    free(w);
    free(g);
    free(pc);
    free(pg);
    free(ss);
    free(dot);
    free(y);
    free(r);
    free(pdx);
    free(pdw);
}

static void test_rope(int B, int T, int nh, int hd, float theta) {
    size_t n = (size_t)B * T * nh * hd;
    float *x = hrand(n, 1.0f), *xd = gpu_putf(gpu, x, n);
    // out of place into the hidden format: rope_fwd's values, each rounded once (the bits of rope_fwd on a
    // copy, then to_hid; to_hid the host's rounding to nearest even); the input untouched
    void *xh = gpu_hid_nan(gpu, n), *xh2 = gpu_hid_nan(gpu, n);
    gpu->rope_fwd_hid(xh, xd, 0, B, T, nh, hd, theta);
    cmp_exact_host("rope_fwd_hid: its input untouched", xd, x, n);
    cpu->rope_fwd(x, B, T, nh, hd, theta);
    gpu->rope_fwd(xd, B, T, nh, hd, theta);
    cmp("rope_fwd", "x", xd, x, n, BAND_ELEM);
    gpu->to_hid(xh2, xd, n);
    float *a = gpu_hid_get(gpu, xh, n), *b = gpu_hid_get(gpu, xh2, n), *r = gpu_getf(gpu, xd, n);
    EXPECT(memcmp(a, b, n * sizeof(float)) == 0, "rope_fwd_hid: not the bits of rope_fwd, then to_hid");
    hid_round(r, n);
    EXPECT(memcmp(b, r, n * sizeof(float)) == 0, "to_hid: not the host's rounding to nearest even");
    gpu->free(xh);
    gpu->free(xh2);
    free(a);
    free(b);
    free(r);
    { // from the hidden format, in place (gqa's q and k under GM_OUT_HID): the bits of the float32 input
      // holding the same values
        float *v = hrand(n, 1.0f);
        hid_round(v, n);
        float *vd = gpu_putf(gpu, v, n);
        void *vi = gpu_hid_put(gpu, v, n), *vo = gpu_hid_nan(gpu, n);
        gpu->rope_fwd_hid(vo, vd, 0, B, T, nh, hd, theta);
        gpu->rope_fwd_hid(vi, vi, 1, B, T, nh, hd, theta);
        cmp_exact_hid2("rope_fwd_hid from the hidden format, in place", vi, vo, n);
        gpu->free(vd);
        gpu->free(vi);
        gpu->free(vo);
        free(v);
    }
    float *g = hrand(n, 1.0f), *g0 = hcopy(g, n), *gd = gpu_putf(gpu, g, n), *gh = gpu_putf(gpu, g, n),
          *gr = gpu_putf(gpu, g, n);
    cpu->rope_bwd(g, B, T, nh, hd, theta);
    gpu->rope_bwd(gd, B, T, nh, hd, theta);
    cmp("rope_bwd", "dx", gd, g, n, BAND_ELEM);
    // in place into GM_DOUT_HID's layout: rope_bwd's values rounded once (rope_bwd_hid); the rows' own
    // (to_hid_rows)
    int R = B * T, C = nh * hd;
    gpu->rope_bwd_hid(gh, B, T, nh, hd, theta);
    gpu->to_hid_rows(gr, R, C);
    float *vh = hid_layout_get(gh, R, C), *vr = hid_layout_get(gr, R, C), *want = gpu_getf(gpu, gd, n);
    hid_round(want, n);
    hid_round(g0, n);
    EXPECT(memcmp(vh, want, n * sizeof(float)) == 0, "rope_bwd_hid: not rope_bwd's bits, rounded once");
    EXPECT(memcmp(vr, g0, n * sizeof(float)) == 0, "to_hid_rows: not the rows rounded once");
    gpu->free(xd);
    gpu->free(gd);
    gpu->free(gh);
    gpu->free(gr);
    free(vh);
    free(vr);
    free(want);
    free(x);
    free(g);
    free(g0);
}

// RoPE's cos / sin table (cuda_norm.cu rope_tab: built for one head width and theta, grown to the positions
// asked): a rotation's bits do not depend on what the table was built for before: rope_fwd and rope_bwd over
// 19 positions, then after the table was rebuilt for another theta, grown to 300 positions and another head
// width and built back, the same bits.
static void test_rope_table(void) {
    int B = 2, T = 19, nh = 3, hd = 24;
    size_t n = (size_t)B * T * nh * hd, n2 = (size_t)300 * 2 * 24;
    float *x = hrand(n, 1.0f), *y = hrand(n2, 1.0f);
    float *a = gpu_putf(gpu, x, n), *b = gpu_putf(gpu, x, n), *yd = gpu_putf(gpu, y, n2);
    gpu->rope_fwd(a, B, T, nh, hd, 10000.0f);
    gpu->rope_bwd(a, B, T, nh, hd, 500000.0f);
    gpu->rope_fwd(yd, 1, 300, 2, 16, 10000.0f); // (another width, then more positions at the first's)
    gpu->rope_fwd(yd, 1, 300, 2, 24, 10000.0f);
    gpu->rope_fwd(b, B, T, nh, hd, 10000.0f);
    gpu->rope_bwd(b, B, T, nh, hd, 500000.0f);
    cmp_exact_dev("rope_fwd, rope_bwd after the table was rebuilt and grown", b, a, n);
    gpu->free(a);
    gpu->free(b);
    gpu->free(yd);
    free(x);
    free(y);
}

// rope_rows (the KV-cached decode's RoPE at a position offset) and dropout (the residual branches' mask:
// the same hash on the GPU, so the same zeros and scale as the cpu)
static void test_rope_rows_dropout(int B, int T, int nh, int hd, float theta, int t0, int t1) {
    size_t n = (size_t)B * (t1 - t0) * nh * hd;
    for (int inv = 0; inv < 2; inv++) {
        float *x = hrand(n, 1.0f), *xd = gpu_putf(gpu, x, n);
        cpu->rope_rows(x, B, t0, t1, nh, hd, theta, inv);
        gpu->rope_rows(xd, B, t0, t1, nh, hd, theta, inv);
        cmp("rope_rows", inv ? "inverse" : "x", xd, x, n, BAND_ELEM);
        gpu->free(xd);
        free(x);
    }
    int C = nh * hd;
    float *x = hrand(n, 1.0f), *xd = gpu_putf(gpu, x, n);
    cpu->dropout(x, B, T, t0, t1, C, 0.3f, 12345, 77);
    gpu->dropout(xd, B, T, t0, t1, C, 0.3f, 12345, 77);
    cmp("dropout", "x", xd, x, n, BAND_ELEM);
    gpu->free(xd);
    free(x);
}

static void test_swiglu(size_t n) {
    float *h1 = hrand(n, 2.0f), *h3 = hrand(n, 1.0f), *h1d = gpu_putf(gpu, h1, n),
          *h3d = gpu_putf(gpu, h3, n);
    float *o = hnew(n), *od = gpu_nanf(gpu, n);
    cpu->swiglu_fwd(o, h1, h3, n);
    gpu->swiglu_fwd(od, h1d, h3d, n);
    cmp("swiglu_fwd", "out", od, o, n, BAND_ELEM);
    float *g = hrand(n, 1.0f), *gd = gpu_putf(gpu, g, n), *p1 = hrand(n, 1.0f), *p3 = hrand(n, 1.0f);
    // p 0: zeroed, 1: pre-filled (accumulate), 2: accumulate 0 (cpu pre-filled, GPU NaN)
    for (int p = 0; p < 3; p++) {
        float *d1 = p ? hcopy(p1, n) : hnew(n), *d3 = p ? hcopy(p3, n) : hnew(n);
        float *d1d = p < 2 ? gpu_putf(gpu, d1, n) : gpu_nanf(gpu, n),
              *d3d = p < 2 ? gpu_putf(gpu, d3, n) : gpu_nanf(gpu, n);
        cpu->swiglu_bwd(d1, d3, g, h1, h3, n, p < 2);
        gpu->swiglu_bwd(d1d, d3d, gd, h1d, h3d, n, p < 2);
        const char *tag = p == 0 ? "" : p == 1 ? " (accumulate)" : " (overwrite)";
        char w1[48], w3[48];
        snprintf(w1, sizeof w1, "dh1%s", tag);
        snprintf(w3, sizeof w3, "dh3%s", tag);
        cmp("swiglu_bwd", w1, d1d, d1, n, BAND_ELEM);
        cmp("swiglu_bwd", w3, d3d, d3, n, BAND_ELEM);
        gpu->free(d1d);
        gpu->free(d3d);
        free(d1);
        free(d3);
    }
    gpu->free(h1d);
    gpu->free(h3d);
    gpu->free(od);
    gpu->free(gd);
    free(h1);
    free(h3);
    free(o);
    free(g);
    free(p1);
    free(p3);
}

// ---------------------------------------------------------------- bf16 copy of the weights
// ops.h bf16_shadow: GEMMs whose weight lies in the registered buffer read the kept bf16 copy; the
// results must be the same bits as converting on each call, the copy must follow adamw_runs, and any
// other write into the buffer (to_device here) must drop it: a stale copy would give other results.
static void gemm_set(float *out[4], const float *wbuf, size_t wo, const float *x, const float *dy, int N,
                     int K, int O, int G, const int64_t *off) {
    size_t nk = (size_t)N * K;
    gpu->matmul_fwd(out[0], x, wbuf + wo, N, K, O, 0);
    gpu->zero(out[1], nk * sizeof(float));
    gpu->matmul_bwd(out[1], NULL, dy, x, wbuf + wo, N, K, O, GM_ACC_DINP);
    gpu->grouped_matmul_fwd(out[2], x, wbuf + wo + (size_t)O * K, off, G, K, O);
    gpu->zero(out[3], nk * sizeof(float));
    gpu->grouped_matmul_bwd(out[3], NULL, dy, x, wbuf + wo + (size_t)O * K, off, G, K, O, 1);
}
// The same four GEMMs with the copy registered (a) and without (b), bit for bit; wo = 8: the weights
// at 16-byte aligned bf16 offsets (the copy is used), wo = 5: misaligned (the GEMMs convert).
static void shadow_pair(const char *when, float *a[4], float *b[4], float *wd, size_t nw, size_t wo,
                        const float *xd, const float *dyd, int N, int K, int O, int G, const int64_t *off,
                        const size_t *sz) {
    const char *nm[4] = {"matmul_fwd", "matmul_bwd dinp", "grouped_fwd", "grouped_bwd dinp"};
    char what[128];
    gpu->bf16_shadow(wd, nw);
    gemm_set(a, wd, wo, xd, dyd, N, K, O, G, off);
    gpu->bf16_shadow(NULL, 0);
    gemm_set(b, wd, wo, xd, dyd, N, K, O, G, off);
    for (int i = 0; i < 4; i++) {
        snprintf(what, sizeof what, "bf16_shadow: %s (weights at +%zu) %s", nm[i], wo, when);
        cmp_exact_dev(what, a[i], b[i], sz[i]);
    }
}
static void test_bf16_shadow(void) {
    const int N = 96, K = 80, O = 72, G = 3;
    const int64_t off[4] = {0, 40, 40, 96};
    size_t nw = 8 + (size_t)O * K * (1 + G) + 3, no = (size_t)N * O, nk = (size_t)N * K;
    float *w = hrand(nw, 0.5f), *x = hrand(nk, 1.0f), *dy = hrand(no, 1.0f);
    float *wd = gpu_putf(gpu, w, nw), *xd = gpu_putf(gpu, x, nk), *dyd = gpu_putf(gpu, dy, no);
    float *a[4], *b[4];
    size_t sz[4] = {no, nk, no, nk};
    for (int i = 0; i < 4; i++) {
        a[i] = gpu_nanf(gpu, sz[i]);
        b[i] = gpu_nanf(gpu, sz[i]);
    }
    shadow_pair("through the copy vs converted", a, b, wd, nw, 8, xd, dyd, N, K, O, G, off, sz);
    shadow_pair("misaligned: converted either way", a, b, wd, nw, 5, xd, dyd, N, K, O, G, off, sz);
    // AdamW over the buffer (one run) with the copy registered: the copy must follow the update
    float *g = hrand(nw, 1.0f), *m0 = hrand(nw, 0.1f), *v0 = hnew(nw);
    float *gd = gpu_putf(gpu, g, nw), *m = gpu_putf(gpu, m0, nw), *v = gpu_putf(gpu, v0, nw);
    OptRun run = {0, 0, (int64_t)nw, 1, 0, 0, 0, 0, 0, OPTG_F32, 0};
    OptRuns *rr = gpu->runs_create(&run, 1);
    gpu->bf16_shadow(wd, nw);
    gpu->adamw_runs(wd, gd, m, v, rr, 1.0f, 0.05f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, OPT_MIXED, 0);
    gemm_set(a, wd, 8, xd, dyd, N, K, O, G, off);
    gpu->bf16_shadow(NULL, 0);
    gemm_set(b, wd, 8, xd, dyd, N, K, O, G, off);
    for (int i = 0; i < 4; i++)
        cmp_exact_dev("bf16_shadow: after adamw_runs, the copy vs converted", a[i], b[i], sz[i]);
    // a write the backend sees (new weights through to_device) drops the copy
    gpu->bf16_shadow(wd, nw);
    float *w2 = hrand(nw, 0.5f);
    gpu->to_device(wd, w2, nw * sizeof(float));
    gemm_set(a, wd, 8, xd, dyd, N, K, O, G, off);
    gpu->bf16_shadow(NULL, 0);
    gemm_set(b, wd, 8, xd, dyd, N, K, O, G, off);
    for (int i = 0; i < 4; i++)
        cmp_exact_dev("bf16_shadow: after to_device into the buffer", a[i], b[i], sz[i]);
    // and the values are the bf16 GEMM's of the new weights: against the cpu on bf16 operands
    float *ref = hnew(no), *wr = bf16_copy(w2 + 8, (size_t)O * K), *xr = bf16_copy(x, nk);
    backend_cpu()->matmul_fwd(ref, xr, wr, N, K, O, 0);
    cmp("bf16_shadow", "matmul_fwd after to_device vs the cpu on bf16 operands", a[0], ref, no,
        BAND_BF16_REF);
    gpu->runs_free(rr);
    for (int i = 0; i < 4; i++) {
        gpu->free(a[i]);
        gpu->free(b[i]);
    }
    gpu->free(wd);
    gpu->free(xd);
    gpu->free(dyd);
    gpu->free(gd);
    gpu->free(m);
    gpu->free(v);
    free(w);
    free(x);
    free(dy);
    free(g);
    free(m0);
    free(v0);
    free(w2);
    free(ref);
    free(wr);
    free(xr);
}

// ops.h alloc_holes (cuda_vm.cu): a buffer whose hole A spans whole 2 MiB pages (not there) and hole B lies
// inside one page (there). What must hold: the bytes outside the holes' whole pages read zeros, take writes
// and give them back (to_device / to_host, zero, and a grouped GEMM's GM_DW_BF16 weight gradient written into
// the packed half before hole A: the bits of the same op on an ordinary buffer), on both sides of each hole,
// also in hole B; free gives it back (a second buffer after it); without holes the buffer is alloc's.
static void test_alloc_holes(void) {
    const size_t M = 1 << 20, N = 6 * M, A0 = M, A1 = 5 * M - 3, B0 = 5 * M + 100,
                 B1 = 5 * M + 400; // (floats)
    const size_t hole[4] = {A0, A1, B0, B1};
    for (int round = 0; round < 2; round++) {
        float *p = gpu->alloc_holes(N, hole, 2);
        size_t at[] = {0, A0 - 200, A1 + 1, B0 - 50, B0 + 10, B1, N - 200}, bad = 0;
        float *v = hrand(200, 1.0f), *z = xcalloc(200, sizeof(float)), *r = xmalloc(200 * sizeof(float));
        for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
            gpu->to_host(r, p + at[i], 200 * sizeof(float));
            bad += memcmp(r, z, 200 * sizeof(float)) != 0;
            gpu->to_device(p + at[i], v, 200 * sizeof(float));
            gpu->to_host(r, p + at[i], 200 * sizeof(float));
            bad += memcmp(r, v, 200 * sizeof(float)) != 0;
            gpu->zero(p + at[i], 200 * sizeof(float));
            gpu->to_host(r, p + at[i], 200 * sizeof(float));
            bad += memcmp(r, z, 200 * sizeof(float)) != 0;
        }
        EXPECT(bad == 0, "alloc_holes (round %d): %zu of %zu reads outside the holes' pages wrong", round,
               bad, 3 * sizeof at / sizeof at[0]);
        // a packed weight gradient (G blocks of O x K, bf16: G O K / 2 floats) ending right at hole A
        const int G = 2, K = 256, O = 512, R = 300;
        const int64_t off[3] = {0, 120, R};
        float *x = hrand((size_t)R * K, 1.0f), *dy = hrand((size_t)R * O, 1.0f),
              *w = hrand((size_t)G * O * K, 0.1f);
        float *xd = gpu_putf(gpu, x, (size_t)R * K), *dyd = gpu_putf(gpu, dy, (size_t)R * O),
              *wd = gpu_putf(gpu, w, (size_t)G * O * K), *plain = gpu->alloc(sizeof(float) * G * O * K);
        size_t half = (size_t)G * O * K / 2;
        float *dw = p + A0 - half;
        gpu->grouped_matmul_bwd(NULL, dw, dyd, xd, wd, off, G, K, O, GM_DW_WRITE | GM_DW_BF16);
        gpu->grouped_matmul_bwd(NULL, plain, dyd, xd, wd, off, G, K, O, GM_DW_WRITE | GM_DW_BF16);
        float *a = gpu_getf(gpu, dw, half), *b = gpu_getf(gpu, plain, half);
        EXPECT(!memcmp(a, b, half * sizeof(float)),
               "alloc_holes: a packed weight gradient before hole A differs from the same op's on alloc's "
               "buffer");
        free(a);
        free(b);
        float *bufs[] = {xd, dyd, wd, plain};
        for (int i = 0; i < 4; i++) gpu->free(bufs[i]);
        free(x);
        free(dy);
        free(w);
        free(v);
        free(z);
        free(r);
        gpu->free(p);
    }
    float *q = gpu->alloc_holes(1000, NULL, 0), *r = gpu_getf(gpu, q, 1000),
          *z = xcalloc(1000, sizeof(float));
    EXPECT(!memcmp(r, z, 1000 * sizeof(float)), "alloc_holes without holes: not zeroed");
    gpu->free(q);
    free(r);
    free(z);
}

// ops.h alloc_bf16_params: a parameter buffer whose holes keep their weights in the bf16 copy alone.
// Hole A spans whole 2 MiB pages (their float32 memory is not there), hole B lies inside one page (its
// float32 memory is there, poisoned). What must hold: to_device then to_host gives back the bf16 values
// bit for bit, across the holes' edges too; adamw_runs (nearest and stochastic) over runs inside and
// outside the holes gives the cpu's weights and moments bit for bit (the holes' read and written in the
// copy alone: their float32 memory is NaN or absent, so an update reading it shows); grouped and plain
// GEMMs taking a weight in a hole give the bits of the same GEMM on an ordinary buffer of the cpu's
// updated weights; bf16_shadow(p, n) after a write outside the holes refreshes that part and leaves the
// holes; the float32 memory at a hole's edge reads NaN (the poison).
static void test_bf16_params(int prec) {
    const size_t N = 2500000, A0 = 300008, A1 = A0 + 1300000, B0 = 2000000, B1 = B0 + 40000;
    const size_t hole[4] = {A0, A1, B0, B1};
    const int K = 64, O = 96, G = 3, Nr = 40, t = 3;
    const int64_t goff[4] = {0, 7, 7, Nr};
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const uint64_t seed = 99;
    float *w = hrand(N, 0.5f);
    for (size_t i = 0; i < N; i++) w[i] = bf16_to_f32(bf16_rn_bits(w[i]));
    float *pd = gpu->alloc_bf16_params(N, hole, 2);
    gpu->to_device(pd, w, N * sizeof(float));
    gpu->bf16_shadow(pd, N);
    float *back = gpu_getf(gpu, pd, N), *part = xmalloc(sizeof(float) * 200);
    gpu->to_host(part, pd + A0 - 100, sizeof(float) * 200);
    EXPECT(memcmp(back, w, N * sizeof(float)) == 0 && memcmp(part, w + A0 - 100, 200 * sizeof(float)) == 0,
           "alloc_bf16_params: to_device then to_host does not give the bf16 values back bit for bit");
    float edge[4]; // hole B's first floats: backed float32 memory the buffer never writes (NaN)
    float *ed = gpu->alloc(sizeof edge);
    gpu->copy(ed, pd + B0, sizeof edge);
    gpu->to_host(edge, ed, sizeof edge);
    EXPECT(isnan(edge[0]) && isnan(edge[3]),
           "alloc_bf16_params: a hole's float32 memory is not poisoned (%g)", edge[0]);
    // runs: pieces before, inside and after each hole (a run never crosses a hole's edge)
    const size_t cut[] = {0, 1000, A0, A0 + 5, A0 + 700003, A1, B0, B0 + 17, B1, N - 3, N};
    enum { NR = sizeof cut / sizeof cut[0] - 1 };
    OptRun runs[NR];
    for (int r = 0; r < NR; r++)
        runs[r] = (OptRun){(int64_t)cut[r],
                           (int64_t)cut[r],
                           (int64_t)(cut[r + 1] - cut[r]),
                           r % 2,
                           0,
                           (int64_t)cut[r] * 3 + 1,
                           0,
                           0,
                           0,
                           OPTG_F32,
                           0};
    float *g = hrand(N, 0.1f), *p = hcopy(w, N);
    uint16_t *m = xmalloc(sizeof(uint16_t) * N), *v = xmalloc(sizeof(uint16_t) * N);
    for (size_t i = 0; i < N; i++) {
        m[i] = bf16_rn_bits(0.01f * (float)rng_normal(&R));
        v[i] = bf16_rn_bits(1e-4f * fabsf((float)rng_normal(&R)));
    }
    float *gd = gpu_putf(gpu, g, N);
    uint16_t *md = gpu->alloc(sizeof(uint16_t) * N), *vd = gpu->alloc(sizeof(uint16_t) * N);
    gpu->to_device(md, m, sizeof(uint16_t) * N);
    gpu->to_device(vd, v, sizeof(uint16_t) * N);
    OptRuns *hc = cpu->runs_create(runs, NR), *hg = gpu->runs_create(runs, NR);
    cpu->adamw_runs(p, g, m, v, hc, 1.0f, lr, b1, b2, eps, wd, t, prec, seed);
    gpu->adamw_runs(pd, gd, md, vd, hg, 1.0f, lr, b1, b2, eps, wd, t, prec, seed);
    float *pg = gpu_getf(gpu, pd, N);
    uint16_t *mg = xmalloc(sizeof(uint16_t) * N), *vg = xmalloc(sizeof(uint16_t) * N);
    gpu->to_host(mg, md, sizeof(uint16_t) * N);
    gpu->to_host(vg, vd, sizeof(uint16_t) * N);
    size_t dp = 0, dm = 0, moved = 0;
    for (size_t i = 0; i < N; i++) {
        dp += f32_bits(pg[i]) != f32_bits(p[i]);
        dm += mg[i] != m[i] || vg[i] != v[i];
        moved += i >= A0 && i < A1 && f32_bits(p[i]) != f32_bits(w[i]);
    }
    const char *pn = prec == OPT_BF16_STOCHASTIC ? "stochastic" : "nearest";
    EXPECT(dp == 0 && dm == 0,
           "alloc_bf16_params: adamw_runs bf16 %s: %zu weights, %zu moments differ bitwise from "
           "the cpu's",
           pn, dp, dm);
    EXPECT(moved > (A1 - A0) / 2, "alloc_bf16_params: only %zu weights in hole A moved", moved);
    // GEMMs on weights in the holes (read from the copy) against the same GEMMs on an ordinary buffer of the
    // cpu's updated weights (converted per call)
    float *x = hrand((size_t)Nr * K, 1.0f), *xd = gpu_putf(gpu, x, (size_t)Nr * K), *qd = gpu_putf(gpu, p, N);
    float *o1 = gpu_nanf(gpu, (size_t)Nr * O), *o2 = gpu_nanf(gpu, (size_t)Nr * O),
          *o3 = gpu_nanf(gpu, (size_t)Nr * O), *o4 = gpu_nanf(gpu, (size_t)Nr * O);
    size_t wa = 600000, wb = B0 + 8; // (wa: in a page of hole A with no float32 memory)
    gpu->grouped_matmul_fwd(o1, xd, pd + wa, goff, G, K, O);
    gpu->grouped_matmul_fwd(o2, xd, qd + wa, goff, G, K, O);
    gpu->matmul_fwd(o3, xd, pd + wb, Nr, K, O, 0);
    gpu->matmul_fwd(o4, xd, qd + wb, Nr, K, O, 0);
    cmp_exact_dev("alloc_bf16_params: grouped_fwd, weights in hole A vs an ordinary buffer", o1, o2,
                  (size_t)Nr * O);
    cmp_exact_dev("alloc_bf16_params: matmul_fwd, weights in hole B vs an ordinary buffer", o3, o4,
                  (size_t)Nr * O);
    // an embedding table in hole A (gathered from the copy) against the same table in an ordinary buffer
    int32_t *tok = hidx(Nr, 50), *tokd = gpu_put(gpu, tok, Nr * sizeof(int32_t));
    gpu->embedding_fwd(o1, tokd, pd + wa, Nr, K, 50);
    gpu->embedding_fwd(o2, tokd, qd + wa, Nr, K, 50);
    cmp_exact_dev("alloc_bf16_params: embedding_fwd, a table in hole A vs an ordinary buffer", o1, o2,
                  (size_t)Nr * K);
    gpu->free(tokd);
    free(tok);
    // a write outside the holes, then bf16_shadow(p, n): that part refreshed, the holes as they were
    float *w2 = hrand(1000, 0.5f);
    gpu->to_device(pd, w2, sizeof(float) * 1000);
    gpu->bf16_shadow(pd, N);
    memcpy(p, w2, sizeof(float) * 1000);
    float *pg2 = gpu_getf(gpu, pd, N);
    EXPECT(memcmp(pg2, p, N * sizeof(float)) == 0,
           "alloc_bf16_params: to_device outside the holes, then bf16_shadow: "
           "the buffer is not the weights written");
    gpu->to_device(qd, p, N * sizeof(float));
    gpu->matmul_fwd(o3, xd, pd, Nr, K, O, 0);
    gpu->matmul_fwd(o4, xd, qd, Nr, K, O, 0);
    cmp_exact_dev("alloc_bf16_params: matmul_fwd outside the holes after bf16_shadow vs an ordinary buffer",
                  o3, o4, (size_t)Nr * O);
    printf("alloc_bf16_params %-10s: to_host/to_device exact, adamw_runs bitwise the cpu's (%zu weights "
           "moved in "
           "hole A), GEMMs in the holes as on an ordinary buffer\n",
           pn, moved);
    cpu->runs_free(hc);
    gpu->runs_free(hg);
    gpu->free(pd);
    gpu->free(gd);
    gpu->free(md);
    gpu->free(vd);
    gpu->free(ed);
    gpu->free(xd);
    gpu->free(qd);
    gpu->free(o1);
    gpu->free(o2);
    gpu->free(o3);
    gpu->free(o4);
    free(w);
    free(back);
    free(part);
    free(g);
    free(p);
    free(m);
    free(v);
    free(pg);
    free(mg);
    free(vg);
    free(x);
    free(w2);
    free(pg2);
}

// ---------------------------------------------------------------- attention
// On "cuda" with head dims 32/64/128 the tensor-core kernels run (cuda_attention_tc.cu). Checked
// against bf16_ref.h's attention (same roundings; BAND_ATT_TC_NORM, BAND_BF16_ELEM) and, norm-wise,
// against the plain float32 cpu (BAND_BF16_NORM: what bf16 costs, as for the GEMMs).

// MOE_TEST_ATT_BITS=FILE (test_cuda_attn_passes.sh): a line "name hash" (FNV-1a 64 of the float32 bits) for
// each head-dim-128 backward result where the cuda backend keeps dS (ops.h attention_ds_bytes not 0 at the
// call's shape): two processes under different MOE_ATTN_DS_MB (one pass, passes over kv heads, over key
// ranges) compare their bits by name. Nothing without the variable, nor where the kernels compute dS again.
static void att_bits(const char *name, const float *dev, size_t n, int B, int T, int H, int KV, int hd) {
    const char *path = getenv("MOE_TEST_ATT_BITS");
    if (!path || !*path || !gpu_bf16 || hd != 128 || !attention_ds_bytes(B, T, H, KV, hd, 0, T)) return;
    float *h = gpu_getf(gpu, dev, n);
    uint64_t x = 1469598103934665603ull;
    const unsigned char *c = (const unsigned char *)h;
    for (size_t i = 0; i < n * sizeof(float); i++) x = (x ^ c[i]) * 1099511628211ull;
    free(h);
    FILE *f = fopen(path, "a");
    if (!f) DIE("MOE_TEST_ATT_BITS: cannot open %s", path);
    fprintf(f, "%s_B%d_T%d_H%d_KV%d %016llx\n", name, B, T, H, KV, (unsigned long long)x);
    if (fclose(f)) DIE("MOE_TEST_ATT_BITS: cannot write %s", path);
}

static void test_attention(int B, int T, int H, int KV, int hd) {
    int tc = gpu_bf16 && (hd == 32 || hd == 64 || hd == 128);
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, nl = (size_t)B * H * T;
    float *q = hrand(nq, 1.0f), *k = hrand(nk, 1.0f), *v = hrand(nk, 1.0f);
    void *qd = att_put(q, nq), *kd = att_put(k, nk), *vd = att_put(v, nk);
    const Backend *ref = tc ? backend_cpu_bf16ref() : cpu; // bf16_ref.h rounds as the kernels do
    float *o = hnew(nq), *l = hnew(nl), *ld = gpu_nanf(gpu, nl);
    void *oh = gpu_hid_nan(gpu, nq);
    ref->attention_fwd(o, l, q, k, v, B, T, H, KV, hd, 0, T);
    gpu->attention_fwd(oh, ld, qd, kd, vd, B, T, H, KV, hd, 0, T);
    float *od = att_out(oh, nq);
    double bf = att_out_band(BAND_SUM), bb = tc ? BAND_BF16_ELEM : BAND_ATT_BWD,
           nb = tc ? BAND_ATT_TC_NORM : 0;
    const char *path = tc ? " [tensor cores]" : "";
    char what[128];
    snprintf(what, sizeof what, "out B%d T%d H%d KV%d hd%d%s", B, T, H, KV, hd, path);
    cmp_n("attention_fwd", what, od, o, nq, bf, nb);
    snprintf(what, sizeof what, "lse B%d T%d H%d KV%d hd%d%s", B, T, H, KV, hd, path);
    cmp("attention_fwd", what, ld, l, nl, BAND_SUM);
    float *o32 = NULL, *l32 = NULL;
    if (tc) { // against the plain float32 forward
        o32 = hnew(nq);
        l32 = hnew(nl);
        cpu->attention_fwd(o32, l32, q, k, v, B, T, H, KV, hd, 0, T);
        snprintf(what, sizeof what, "out vs float32 B%d T%d H%d KV%d hd%d", B, T, H, KV, hd);
        cmp_n("attention_fwd (bf16 vs float32)", what, od, o32, nq, BAND_BF16_ELEM, BAND_BF16_NORM);
    }
    // backward from the cpu's out (as stored: rounded where the format is bf16) and lse on both sides
    void *oc = att_put(o, nq);
    float *lc = gpu_putf(gpu, l, nl), *g = hrand(nq, 1.0f), *gd = gpu_putf(gpu, g, nq);
    float *pq = hrand(nq, 1.0f), *pk = hrand(nk, 1.0f), *pv = hrand(nk, 1.0f);
    // p 0: added into zeros, 1: added into pre-filled buffers, 2: written (flags 0) over them (NaN on the
    // GPU)
    for (int p = 0; p < 3; p++) {
        int fl = p == 2 ? 0 : ATT_ADD_DQ | ATT_ADD_DKV;
        float *dq = p ? hcopy(pq, nq) : hnew(nq), *dk = p ? hcopy(pk, nk) : hnew(nk),
              *dv = p ? hcopy(pv, nk) : hnew(nk);
        float *dqd = p == 2 ? gpu_nanf(gpu, nq) : gpu_putf(gpu, dq, nq),
              *dkd = p == 2 ? gpu_nanf(gpu, nk) : gpu_putf(gpu, dk, nk);
        float *dvd = p == 2 ? gpu_nanf(gpu, nk) : gpu_putf(gpu, dv, nk);
        ref->attention_bwd(dq, dk, dv, g, o, l, q, k, v, B, T, H, KV, hd, 0, T, fl);
        gpu->attention_bwd(dqd, dkd, dvd, gd, oc, lc, qd, kd, vd, B, T, H, KV, hd, 0, T, fl);
        if (p == 2) { // the bits of adding into zeros
            float *zq = gpu_putf(gpu, pq, nq), *zk = gpu_putf(gpu, pk, nk), *zv = gpu_putf(gpu, pv, nk);
            gpu->zero(zq, nq * sizeof(float));
            gpu->zero(zk, nk * sizeof(float));
            gpu->zero(zv, nk * sizeof(float));
            gpu->attention_bwd(zq, zk, zv, gd, oc, lc, qd, kd, vd, B, T, H, KV, hd, 0, T,
                               ATT_ADD_DQ | ATT_ADD_DKV);
            snprintf(what, sizeof what, "attention_bwd written == added into zeros T%d H%d KV%d hd%d%s", T, H,
                     KV, hd, path);
            cmp_exact_dev(what, dqd, zq, nq);
            cmp_exact_dev(what, dkd, zk, nk);
            cmp_exact_dev(what, dvd, zv, nk);
            gpu->free(zq);
            gpu->free(zk);
            gpu->free(zv);
        }
        const char *acc = p == 2 ? " (written)" : p ? " (accumulate)" : "";
        snprintf(what, sizeof what, "dq%s T%d H%d KV%d hd%d%s", acc, T, H, KV, hd, path);
        cmp_n("attention_bwd", what, dqd, dq, nq, bb, nb);
        snprintf(what, sizeof what, "dk%s T%d H%d KV%d hd%d%s", acc, T, H, KV, hd, path);
        cmp_n("attention_bwd", what, dkd, dk, nk, bb, nb);
        snprintf(what, sizeof what, "dv%s T%d H%d KV%d hd%d%s", acc, T, H, KV, hd, path);
        cmp_n("attention_bwd", what, dvd, dv, nk, bb, nb);
        const char *pn[] = {"zeros", "added", "written"};
        char bn[48];
        if (p != 1) { // (added into values: in key ranges the sum continues from them, to round-off)
            snprintf(bn, sizeof bn, "bwd_dq_%s", pn[p]);
            att_bits(bn, dqd, nq, B, T, H, KV, hd);
        }
        snprintf(bn, sizeof bn, "bwd_dk_%s", pn[p]);
        att_bits(bn, dkd, nk, B, T, H, KV, hd);
        snprintf(bn, sizeof bn, "bwd_dv_%s", pn[p]);
        att_bits(bn, dvd, nk, B, T, H, KV, hd);
        // against the plain float32 backward (from the float32 forward). Not at T < 16: BAND_BF16_NORM's
        // random-walk argument needs many keys per row; with two keys ds = p (dp - D) holds
        // p1 p2 (dp1 - dp2), whose bf16 error relative to itself is 2^-8 |dp| / |dp1 - dp2|, as large
        // as the draw makes it (measured 1.7e-2 on one draw). The T 2 case keeps the bf16_ref.h check.
        if (tc && !p && T >= 16) {
            float *eq = hnew(nq), *ek = hnew(nk), *ev = hnew(nk);
            cpu->attention_bwd(eq, ek, ev, g, o32, l32, q, k, v, B, T, H, KV, hd, 0, T, 0);
            snprintf(what, sizeof what, "dq/dk/dv vs float32 T%d H%d KV%d hd%d", T, H, KV, hd);
            cmp_n("attention_bwd (bf16 vs float32)", what, dqd, eq, nq, INFINITY, BAND_BF16_NORM);
            cmp_n("attention_bwd (bf16 vs float32)", what, dkd, ek, nk, INFINITY, BAND_BF16_NORM);
            cmp_n("attention_bwd (bf16 vs float32)", what, dvd, ev, nk, INFINITY, BAND_BF16_NORM);
            free(eq);
            free(ek);
            free(ev);
        }
        gpu->free(dqd);
        gpu->free(dkd);
        gpu->free(dvd);
        free(dq);
        free(dk);
        free(dv);
    }
    if (tc) { // deterministic: a second run gives the same bits
        void *od2 = gpu_hid_nan(gpu, nq);
        float *ld2 = gpu_nanf(gpu, nl);
        gpu->attention_fwd(od2, ld2, qd, kd, vd, B, T, H, KV, hd, 0, T);
        cmp_exact_hid2("attention_fwd (tensor cores; two runs on the same inputs)", oh, od2, nq);
        float *a1 = gpu_putf(gpu, pq, nq), *a2 = gpu_putf(gpu, pq, nq), *b1 = gpu_putf(gpu, pk, nk),
              *b2 = gpu_putf(gpu, pk, nk);
        float *c1 = gpu_putf(gpu, pv, nk), *c2 = gpu_putf(gpu, pv, nk);
        gpu->attention_bwd(a1, b1, c1, gd, oc, lc, qd, kd, vd, B, T, H, KV, hd, 0, T,
                           ATT_ADD_DQ | ATT_ADD_DKV);
        gpu->attention_bwd(a2, b2, c2, gd, oc, lc, qd, kd, vd, B, T, H, KV, hd, 0, T,
                           ATT_ADD_DQ | ATT_ADD_DKV);
        cmp_exact_dev("attention_bwd dq (tensor cores; two runs on the same inputs)", a1, a2, nq);
        cmp_exact_dev("attention_bwd dk (tensor cores; two runs on the same inputs)", b1, b2, nk);
        cmp_exact_dev("attention_bwd dv (tensor cores; two runs on the same inputs)", c1, c2, nk);
        gpu->free(od2);
        gpu->free(ld2);
        gpu->free(a1);
        gpu->free(a2);
        gpu->free(b1);
        gpu->free(b2);
        gpu->free(c1);
        gpu->free(c2);
        free(o32);
        free(l32);
    }
    void *dev[] = {gd, qd, kd, vd, oh, od, ld, oc, lc};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpu->free(dev[i]);
    free(q);
    free(k);
    free(v);
    free(o);
    free(l);
    free(g);
    free(pq);
    free(pk);
    free(pv);
}

// The rows [t0, t1) of nb blocks of `len` floats, each block's range of `per` floats a row (x's rows t0..t1
// of (nb, len / per, per)), gathered into one array
static float *att_rows(const float *x, size_t nb, size_t len, size_t per, int t0, int t1) {
    size_t n = (size_t)(t1 - t0) * per;
    float *r = hnew(nb * n);
    for (size_t i = 0; i < nb; i++) memcpy(r + i * n, x + i * len + t0 * per, n * sizeof(float));
    return r;
}

// The forward alone over the query rows [t0, t1) (as the decode and chunked callers ask) against the
// reference's forward over the same rows (bf16_ref.h on the tensor-core path): out and lse of those rows in
// test_attention's bands, every other row left as it was (NaN), and a second call the same bits. Without the
// backward's cost on the cpu, so that long sequences fit (cuda_attention_wgf.cu's many 128-key tiles).
static void test_attention_fwd_rows(int B, int T, int H, int KV, int hd, int t0, int t1) {
    int tc = gpu_bf16 && (hd == 32 || hd == 64 || hd == 128);
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, nl = (size_t)B * H * T;
    float *q = hrand(nq, 1.0f), *k = hrand(nk, 1.0f), *v = hrand(nk, 1.0f);
    void *qd = att_put(q, nq), *kd = att_put(k, nk), *vd = att_put(v, nk);
    const Backend *ref = tc ? backend_cpu_bf16ref() : cpu;
    float *o = hnew(nq), *l = hnew(nl), *ld = gpu_nanf(gpu, nl), *ld2 = gpu_nanf(gpu, nl);
    void *oh = gpu_hid_nan(gpu, nq), *oh2 = gpu_hid_nan(gpu, nq);
    ref->attention_fwd(o, l, q, k, v, B, T, H, KV, hd, t0, t1);
    gpu->attention_fwd(oh, ld, qd, kd, vd, B, T, H, KV, hd, t0, t1);
    gpu->attention_fwd(oh2, ld2, qd, kd, vd, B, T, H, KV, hd, t0, t1);
    float *og = gpu_hid_get(gpu, oh, nq), *lg = gpu_getf(gpu, ld, nl);
    size_t outside = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            if (t >= t0 && t < t1) continue;
            for (int h = 0; h < H; h++)
                outside +=
                    !isnan(og[(((size_t)b * T + t) * H + h) * hd]) + !isnan(lg[((size_t)b * H + h) * T + t]);
        }
    char what[160];
    const char *path = tc ? " [tensor cores]" : "";
    EXPECT(outside == 0, "attention_fwd rows [%d,%d) of T %d%s: %zu values outside them written", t0, t1, T,
           path, outside);
    size_t ro = (size_t)(t1 - t0) * H * hd * B, rl = (size_t)(t1 - t0) * H * B;
    float *orf = att_rows(o, B, (size_t)T * H * hd, (size_t)H * hd, t0, t1),
          *ogr = att_rows(og, B, (size_t)T * H * hd, (size_t)H * hd, t0, t1);
    float *lrf = att_rows(l, (size_t)B * H, T, 1, t0, t1), *lgr = att_rows(lg, (size_t)B * H, T, 1, t0, t1);
    float *ogd = gpu_putf(gpu, ogr, ro), *lgd = gpu_putf(gpu, lgr, rl);
    snprintf(what, sizeof what, "out rows [%d,%d) B%d T%d H%d KV%d hd%d%s", t0, t1, B, T, H, KV, hd, path);
    cmp_n("attention_fwd", what, ogd, orf, ro, att_out_band(BAND_SUM), tc ? BAND_ATT_TC_NORM : 0);
    snprintf(what, sizeof what, "lse rows [%d,%d) B%d T%d H%d KV%d hd%d%s", t0, t1, B, T, H, KV, hd, path);
    cmp("attention_fwd", what, lgd, lrf, rl, BAND_SUM);
    snprintf(what, sizeof what, "attention_fwd rows [%d,%d) T%d hd%d%s: two runs on the same inputs (out)",
             t0, t1, T, hd, path);
    cmp_exact_hid2(what, oh, oh2, nq);
    snprintf(what, sizeof what, "attention_fwd rows [%d,%d) T%d hd%d%s: two runs on the same inputs (lse)",
             t0, t1, T, hd, path);
    cmp_exact_dev(what, ld, ld2, nl);
    void *dev[] = {qd, kd, vd, ld, ld2, oh, oh2, ogd, lgd};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpu->free(dev[i]);
    float *host[] = {q, k, v, o, l, og, lg, orf, ogr, lrf, lgr};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
}

// ---------------------------------------------------------------- cross-entropy
// Query rows in n chunks [T*j/n, T*(j+1)/n) (AMPipe): the forward over the chunks is the same bits
// as one call and leaves later rows unwritten; the backward over the chunks in reverse (the block
// schedule's order) gives dq's bits of one call and dk/dv within the op's band of the reference run
// over the same chunks.
// Dropout on the attention probabilities in the float32 kernels ("cuda-fp32"; on "cuda" where the tensor
// cores do not run: head dims but 32/64/128, test_cuda_attn_drop.c checks those): the cpu's mask (the same
// hash), the same sums to float32 rounding, forward and backward, over a row range too.
static void test_attention_dropout(int B, int T, int H, int KV, int hd, float p, int t0, int t1) {
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, nl = (size_t)B * H * T;
    float *q = hrand(nq, 1.0f), *k = hrand(nk, 1.0f), *v = hrand(nk, 1.0f), *g = hrand(nq, 1.0f);
    void *qd = att_put(q, nq), *kd = att_put(k, nk), *vd = att_put(v, nk);
    float *gd = gpu_putf(gpu, g, nq);
    float *o = hnew(nq), *l = hnew(nl), *ld = gpu_putf(gpu, l, nl);
    void *oh = gpu_hid_put(gpu, o, nq); // (zeros: the rows outside [t0, t1) stay so on both sides)
    uint64_t seed = 4242;
    cpu->attention_drop_fwd(o, l, q, k, v, B, T, H, KV, hd, t0, t1, p, seed, 1000, 2);
    gpu->attention_drop_fwd(oh, ld, qd, kd, vd, B, T, H, KV, hd, t0, t1, p, seed, 1000, 2);
    char what[128];
    snprintf(what, sizeof what, "out p%g B%d T%d [%d,%d) H%d KV%d hd%d", p, B, T, t0, t1, H, KV, hd);
    float *od = att_out(oh, nq);
    cmp("attention_drop_fwd", what, od, o, nq, att_out_band(BAND_SUM));
    cmp("attention_drop_fwd", "lse", ld, l, nl, BAND_SUM);
    float *dq = hnew(nq), *dk = hnew(nk), *dv = hnew(nk), *dqd = gpu_putf(gpu, dq, nq),
          *dkd = gpu_nanf(gpu, nk), *dvd = gpu_nanf(gpu, nk);
    void *oc = att_put(o, nq);
    float *lc = gpu_putf(gpu, l, nl);
    // dq added into (zeros), dk and dv written (over NaN on the GPU: rows from t1 on are left, both zero
    // here)
    cpu->attention_drop_bwd(dq, dk, dv, g, o, l, q, k, v, B, T, H, KV, hd, t0, t1, p, seed, 1000, 2,
                            ATT_ADD_DQ);
    gpu->attention_drop_bwd(dqd, dkd, dvd, gd, oc, lc, qd, kd, vd, B, T, H, KV, hd, t0, t1, p, seed, 1000, 2,
                            ATT_ADD_DQ);
    if (t1 < T) { // the rows past t1 are not the op's: zero them on the GPU as the host's are
        for (int b = 0; b < B; b++) {
            gpu->zero(dkd + ((size_t)b * T + t1) * KV * hd, (size_t)(T - t1) * KV * hd * sizeof(float));
            gpu->zero(dvd + ((size_t)b * T + t1) * KV * hd, (size_t)(T - t1) * KV * hd * sizeof(float));
        }
    }
    cmp("attention_drop_bwd", "dq", dqd, dq, nq, BAND_ATT_BWD);
    cmp("attention_drop_bwd", "dk", dkd, dk, nk, BAND_ATT_BWD);
    cmp("attention_drop_bwd", "dv", dvd, dv, nk, BAND_ATT_BWD);
    void *ptrs[] = {qd, kd, vd, gd, oh, od, ld, dqd, dkd, dvd, oc, lc};
    for (size_t i = 0; i < sizeof ptrs / sizeof *ptrs; i++) gpu->free(ptrs[i]);
    free(q);
    free(k);
    free(v);
    free(g);
    free(o);
    free(l);
    free(dq);
    free(dk);
    free(dv);
}

static void test_attention_chunks(int B, int T, int H, int KV, int hd, int n) {
    int tc = gpu_bf16 && (hd == 32 || hd == 64 || hd == 128);
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd, nl = (size_t)B * H * T;
    const Backend *ref = tc ? backend_cpu_bf16ref() : cpu;
    float *q = hrand(nq, 1.0f), *k = hrand(nk, 1.0f), *v = hrand(nk, 1.0f), *g = hrand(nq, 1.0f);
    void *qd = att_put(q, nq), *kd = att_put(k, nk), *vd = att_put(v, nk);
    float *gd = gpu_putf(gpu, g, nq);
    void *o1 = gpu_hid_nan(gpu, nq), *on = gpu_hid_nan(gpu, nq);
    float *l1 = gpu_nanf(gpu, nl), *ln = gpu_nanf(gpu, nl);
    gpu->attention_fwd(o1, l1, qd, kd, vd, B, T, H, KV, hd, 0, T);
    char what[160];
    const char *path = tc ? " [tensor cores]" : "";
    for (int j = 0; j < n; j++) {
        int t0 = T * j / n, t1 = T * (j + 1) / n;
        if (t0 == t1) continue;
        gpu->attention_fwd(on, ln, qd, kd, vd, B, T, H, KV, hd, t0, t1);
        if (j + 1 < n) {
            float *oh = gpu_hid_get(gpu, on, nq), *lh = gpu_getf(gpu, ln, nl);
            int bad = 0;
            for (int b = 0; b < B; b++)
                for (int t = t1; t < T; t++)
                    for (int h = 0; h < H; h++)
                        bad += !isnan(oh[(((size_t)b * T + t) * H + h) * hd]) +
                            !isnan(lh[((size_t)b * H + h) * T + t]);
            EXPECT(bad == 0, "attention_fwd rows [%d,%d) of T %d%s: %d later values written", t0, t1, T, path,
                   bad);
            free(oh);
            free(lh);
        }
    }
    snprintf(what, sizeof what, "attention_fwd over %d chunks == one call (out) B%d T%d H%d KV%d hd%d%s", n,
             B, T, H, KV, hd, path);
    cmp_exact_hid2(what, on, o1, nq);
    snprintf(what, sizeof what, "attention_fwd over %d chunks == one call (lse) T%d hd%d%s", n, T, hd, path);
    cmp_exact_dev(what, ln, l1, nl);
    float *o = gpu_hid_get(gpu, o1, nq), *l = gpu_getf(gpu, l1, nl);
    // as the model calls it (model/attention.c attn_bwd_rows): dq written, dk and dv written by the first
    // chunk (the last rows: it reads every key) and added into by the others; over NaN on the GPU
    float *dq = hnew(nq), *dk = hnew(nk), *dv = hnew(nk);
    float *dq1 = gpu_nanf(gpu, nq), *dqn = gpu_nanf(gpu, nq), *dk1 = gpu_nanf(gpu, nk),
          *dkn = gpu_nanf(gpu, nk);
    float *dv1 = gpu_nanf(gpu, nk), *dvn = gpu_nanf(gpu, nk);
    gpu->attention_bwd(dq1, dk1, dv1, gd, o1, l1, qd, kd, vd, B, T, H, KV, hd, 0, T, 0);
    for (int j = n - 1, first = 1; j >= 0; j--) {
        int t0 = T * j / n, t1 = T * (j + 1) / n, fl = first ? 0 : ATT_ADD_DKV;
        if (t0 == t1) continue;
        first = 0;
        gpu->attention_bwd(dqn, dkn, dvn, gd, o1, l1, qd, kd, vd, B, T, H, KV, hd, t0, t1, fl);
        ref->attention_bwd(dq, dk, dv, g, o, l, q, k, v, B, T, H, KV, hd, t0, t1, fl);
    }
    snprintf(what, sizeof what, "attention_bwd over %d chunks == one call (dq) T%d hd%d%s", n, T, hd, path);
    cmp_exact_dev(what, dqn, dq1, nq);
    double bb = tc ? BAND_BF16_ELEM : BAND_ATT_BWD, nb = tc ? BAND_ATT_TC_NORM : 0;
    snprintf(what, sizeof what, "dk over %d chunks T%d H%d KV%d hd%d%s", n, T, H, KV, hd, path);
    cmp_n("attention_bwd (chunks)", what, dkn, dk, nk, bb, nb);
    snprintf(what, sizeof what, "dv over %d chunks T%d H%d KV%d hd%d%s", n, T, H, KV, hd, path);
    cmp_n("attention_bwd (chunks)", what, dvn, dv, nk, bb, nb);
    snprintf(what, sizeof what, "dq over %d chunks T%d H%d KV%d hd%d%s", n, T, H, KV, hd, path);
    cmp_n("attention_bwd (chunks)", what, dqn, dq, nq, bb, nb);
    char bn[32];
    snprintf(bn, sizeof bn, "chunks%d_dq", n);
    att_bits(bn, dqn, nq, B, T, H, KV, hd);
    snprintf(bn, sizeof bn, "chunks%d_dk", n);
    att_bits(bn, dkn, nk, B, T, H, KV, hd);
    snprintf(bn, sizeof bn, "chunks%d_dv", n);
    att_bits(bn, dvn, nk, B, T, H, KV, hd);
    void *dev[] = {qd, kd, vd, gd, o1, l1, on, ln, dq1, dqn, dk1, dkn, dv1, dvn};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpu->free(dev[i]);
    free(q);
    free(k);
    free(v);
    free(g);
    free(o);
    free(l);
    free(dq);
    free(dk);
    free(dv);
}

// The vocab-parallel cross-entropy (ops.h ce_part / ce_finish) over two uneven column blocks [0, a), [a, V)
// against the cpu's: the parts (the max and the target's logit the same bits, the sum within BAND_SUM), the
// losses and cuda-fp32's dlogits (BAND_SUM), "cuda"'s dlogits cuda-fp32's rounded once to bf16 in place; and
// one block (n 1) the table's cross_entropy_fwd_bwd bits (a row under 16385 values: cross_entropy_k's sums).
static void test_ce_parts(int N, int V, float sd) {
    const Backend *f32 = backend_cuda_fp32();
    int b0[3] = {0, V / 3 + 1, V};
    float *x = hrand((size_t)N * V, sd), dloss = 1.0f / N;
    int32_t *t = hidx(N, V);
    t[0] = b0[1] - 1; // (the edges of the blocks)
    t[N - 1] = b0[1];
    double *hp = xcalloc((size_t)6 * N, sizeof(double)), *dp = gpu->alloc((size_t)6 * N * sizeof(double)),
           *gp = xcalloc((size_t)6 * N, sizeof(double));
    float *blk[2], *blkd[2];
    int32_t *tb[2], *tbd[2];
    for (int b = 0; b < 2; b++) {
        int Vb = b0[b + 1] - b0[b];
        blk[b] = hnew((size_t)N * Vb);
        tb[b] = hidx(N, 1);
        for (int i = 0; i < N; i++) {
            memcpy(blk[b] + (size_t)i * Vb, x + (size_t)i * V + b0[b], sizeof(float) * Vb);
            tb[b][i] = t[i] - b0[b];
        }
        blkd[b] = gpu_putf(gpu, blk[b], (size_t)N * Vb);
        tbd[b] = gpu_put(gpu, tb[b], N * sizeof(int32_t));
        cpu->ce_part(hp + (size_t)b * 3 * N, blk[b], tb[b], N, Vb);
        gpu->ce_part(dp + (size_t)b * 3 * N, blkd[b], tbd[b], N, Vb);
    }
    gpu->to_host(gp, dp, (size_t)6 * N * sizeof(double));
    size_t bad = 0;
    for (size_t j = 0; j < (size_t)2 * N; j++)
        bad += gp[3 * j] != hp[3 * j] || gp[3 * j + 2] != hp[3 * j + 2] ||
            !(fabs(gp[3 * j + 1] - hp[3 * j + 1]) <= BAND_SUM * hp[3 * j + 1]);
    EXPECT(bad == 0, "ce_part N%d V%d: %zu of %d rows' parts not the cpu's", N, V, bad, 2 * N);
    for (int b = 0; b < 2; b++) {
        int Vb = b0[b + 1] - b0[b];
        float *loss = hnew(N), *lossd = gpu_nanf(gpu, N), *x32 = gpu_putf(gpu, blk[b], (size_t)N * Vb),
              *xg = gpu_putf(gpu, blk[b], (size_t)N * Vb);
        cpu->ce_finish(loss, blk[b], hp, tb[b], N, Vb, 2, dloss);
        f32->ce_finish(lossd, x32, dp, tbd[b], N, Vb, 2, dloss);
        cmp("ce_finish", "losses", lossd, loss, N, BAND_SUM);
        cmp("ce_finish", "dlogits (cuda-fp32)", x32, blk[b], (size_t)N * Vb, BAND_SUM);
        gpu->ce_finish(lossd, xg, dp, tbd[b], N, Vb, 2, dloss);
        float *a = gpu_getf(gpu, x32, (size_t)N * Vb), *g = gpu_getf(gpu, xg, (size_t)N * Vb);
        size_t off = 0;
        for (size_t i = 0; i < (size_t)N; i++)
            for (size_t j = 0; j < (size_t)Vb; j++) {
                uint16_t h;
                memcpy(&h, (const char *)(g + i * Vb) + (gpu->hid == FMT_F32 ? 4 : 2) * j, 2);
                off += gpu->hid == FMT_F32 ? memcmp(g + i * Vb + j, a + i * Vb + j, 4) != 0
                                           : h != bf16_rn_bits(a[i * Vb + j]);
            }
        EXPECT(off == 0, "ce_finish N%d V%d block %d: %zu dlogits not cuda-fp32's in the table's format", N,
               V, b, off);
        free(a);
        free(g);
        free(loss);
        gpu->free(lossd);
        gpu->free(x32);
        gpu->free(xg);
    }
    // one block: the table's cross-entropy bits
    int32_t *td = gpu_put(gpu, t, N * sizeof(int32_t));
    float *xa = gpu_putf(gpu, x, (size_t)N * V), *xb = gpu_putf(gpu, x, (size_t)N * V),
          *la = gpu_nanf(gpu, N), *lb = gpu_nanf(gpu, N);
    gpu->cross_entropy_fwd_bwd(la, xa, td, N, V, dloss);
    gpu->ce_part(dp, xb, td, N, V);
    gpu->ce_finish(lb, xb, dp, td, N, V, 1, dloss);
    cmp_exact_dev("ce_part + ce_finish of one block: cross_entropy_fwd_bwd's losses", lb, la, N);
    cmp_exact_dev("ce_part + ce_finish of one block: cross_entropy_fwd_bwd's dlogits", xb, xa, (size_t)N * V);
    for (int b = 0; b < 2; b++) {
        free(blk[b]);
        free(tb[b]);
        gpu->free(blkd[b]);
        gpu->free(tbd[b]);
    }
    gpu->free(td);
    gpu->free(xa);
    gpu->free(xb);
    gpu->free(la);
    gpu->free(lb);
    gpu->free(dp);
    free(hp);
    free(gp);
    free(x);
    free(t);
}

static void test_cross_entropy(int N, int V, float sd) {
    float *x = hrand((size_t)N * V, sd), *x0 = hcopy(x, (size_t)N * V);
    int32_t *t = hidx(N, V), *td = gpu_put(gpu, t, N * sizeof(int32_t));
    float *xd = gpu_putf(gpu, x, (size_t)N * V), *loss = hnew(N), *lossd = gpu_nanf(gpu, N);
    cpu->cross_entropy_fwd(loss, x, t, N, V);
    gpu->cross_entropy_fwd(lossd, xd, td, N, V);
    cmp("cross_entropy_fwd", "losses", lossd, loss, N, BAND_SUM);
    cmp("cross_entropy_fwd", "logits untouched", xd, x, (size_t)N * V, 0.0);
    float dloss = 1.0f / N;
    // "cuda-fp32" (float32 hidden format): losses and dlogits against the cpu's. "cuda" (bf16): its losses
    // the same bits as cuda-fp32's, and each row's dlogits cuda-fp32's rounded once to bf16 in place from
    // the row's start (the row's last V / 2 floats left as the logits were): the same kernel arithmetic,
    // only the store differs.
    const Backend *f32 = backend_cuda_fp32();
    float *lossd2 = gpu_nanf(f32, N);
    cpu->cross_entropy_fwd_bwd(loss, x, t, N, V, dloss);
    f32->cross_entropy_fwd_bwd(lossd2, xd, td, N, V, dloss);
    if (gpu == f32) {
        cmp("cross_entropy_fwd_bwd", "losses", lossd2, loss, N, BAND_SUM);
        cmp("cross_entropy_fwd_bwd", "dlogits", xd, x, (size_t)N * V, BAND_SUM);
    }
    float *xh = gpu_getf(gpu, xd, (size_t)N * V), *xhd = gpu_putf(gpu, x0, (size_t)N * V),
          *lossd3 = gpu_nanf(gpu, N);
    gpu->cross_entropy_fwd_bwd(lossd3, xhd, td, N, V, dloss);
    cmp_exact_dev("cross_entropy_fwd_bwd: losses as cuda-fp32's", lossd3, lossd2, N);
    float *got = gpu_getf(gpu, xhd, (size_t)N * V);
    size_t bad = 0, first = 0, kept = 1;
    for (size_t i = 0; i < (size_t)N; i++)
        for (size_t j = 0; j < (size_t)V; j++) {
            const float *row = got + i * V;
            int ok;
            if (gpu->hid == FMT_F32) ok = memcmp(row + j, xh + i * V + j, 4) == 0;
            else {
                uint16_t h;
                memcpy(&h, (const char *)row + 2 * j, 2);
                ok = h == bf16_rn_bits(xh[i * V + j]);
                if (j >= (size_t)(V + 1) / 2) kept &= memcmp(row + j, x0 + i * V + j, 4) == 0;
            }
            if (!ok && bad++ == 0) first = i * V + j;
        }
    EXPECT(bad == 0, "cross_entropy_fwd_bwd N%d V%d: %zu of %zu dlogits not cuda-fp32's rounded; first [%zu]",
           N, V, bad, (size_t)N * V, first);
    EXPECT(kept, "cross_entropy_fwd_bwd N%d V%d: a write past a row's hidden-format values", N, V);
    free(got);
    free(xh);
    gpu->free(xhd);
    gpu->free(lossd3);
    gpu->free(td);
    gpu->free(xd);
    gpu->free(lossd);
    gpu->free(lossd2);
    free(x);
    free(x0);
    free(t);
    free(loss);
}

// ---------------------------------------------------------------- elementwise; sumsq, adamw of one tensor
static void test_elementwise(size_t n) {
    float *a = hrand(n, 1.0f), *b = hrand(n, 1.0f), *ad = gpu_putf(gpu, a, n), *bd = gpu_putf(gpu, b, n);
    float *o = hnew(n), *od = gpu_nanf(gpu, n);
    cpu->mul(o, a, b, n);
    gpu->mul(od, ad, bd, n);
    cmp("mul", "out", od, o, n, BAND_ELEM);
    float *a2 = hcopy(a, n), *a2d = gpu_putf(gpu, a, n); // out aliasing a
    cpu->mul(a2, a2, b, n);
    gpu->mul(a2d, a2d, bd, n);
    cmp("mul", "out == a (in place)", a2d, a2, n, BAND_ELEM);
    float *y = hcopy(b, n), *yd = gpu_putf(gpu, b, n);
    cpu->axpy(y, a, 0.37f, n);
    gpu->axpy(yd, ad, 0.37f, n);
    cmp("axpy", "y", yd, y, n, BAND_ELEM);
    // add: the cpu's sums, bit for bit copy then axpy (ops.h), aligned (float4 and the tail) and not
    for (int s = 0; s < 2; s++) {
        size_t m = n - s;
        float *sd = gpu_nanf(gpu, m), *s2d = gpu_nanf(gpu, m), *sh = hnew(m);
        cpu->add(sh, a + s, b, m);
        gpu->add(sd, ad + s, bd, m);
        cmp("add", s ? "out (unaligned a)" : "out", sd, sh, m, BAND_ELEM);
        gpu->copy(s2d, ad + s, m * sizeof(float));
        gpu->axpy(s2d, bd, 1.0f, m);
        cmp_exact_dev("add: copy then axpy's bits", sd, s2d, m);
        gpu->add(s2d, ad + s, s2d, m); // out aliasing b
        cpu->add(sh, a + s, sh, m);
        cmp("add", "out == b (in place)", s2d, sh, m, BAND_ELEM);
        gpu->free(sd);
        gpu->free(s2d);
        free(sh);
    }
    float *sg = hnew(n), *sgd = gpu_nanf(gpu, n), *ds = hnew(n),
          *dsd = gpu_nanf(gpu, n); // sigmoid and its backward
    cpu->sigmoid_fwd(sg, a, n);
    gpu->sigmoid_fwd(sgd, ad, n);
    cmp("sigmoid_fwd", "out", sgd, sg, n, BAND_ELEM);
    cpu->sigmoid_bwd(ds, b, sg, n);
    float *sgc = gpu_putf(gpu, sg, n);
    gpu->sigmoid_bwd(dsd, bd, sgc, n);
    cmp("sigmoid_bwd", "dinp", dsd, ds, n, BAND_ELEM);
    gpu->free(sgd);
    gpu->free(dsd);
    gpu->free(sgc);
    free(sg);
    free(ds);
    gpu->free(ad);
    gpu->free(bd);
    gpu->free(od);
    gpu->free(a2d);
    gpu->free(yd);
    free(a);
    free(b);
    free(o);
    free(a2);
    free(y);
}

// A run list of one run (0, n) on the gpu: what a single-tensor sumsq / adamw was.
static OptRuns *one_run(size_t n, int decay) {
    OptRun r = {0, 0, (int64_t)n, (int32_t)decay, 0, 0, 0, 0, 0, OPTG_F32, 0};
    return gpu->runs_create(&r, 1);
}

// sumsq_runs over one tensor against the cpu's sum (cpu_oracle.h) within BAND_SUMSQ; two runs alike.
static void test_sumsq(size_t n) {
    float *x = hrand(n, 1.0f), *xd = gpu_putf(gpu, x, n);
    OptRuns *h = one_run(n, 0);
    double r = oracle_sumsq(x, n), g1 = NAN, g2 = NAN;
    gpu->sumsq_runs(&g1, 1, xd, h);
    gpu->sumsq_runs(&g2, 1, xd, h);
    gpu->runs_free(h);
    double e = n ? fabs(g1 - r) / r : fabs(g1);
    OpRow *row = row_for("sumsq", BAND_SUMSQ);
    if (e > row->worst) row->worst = e;
    row->bad += !(e <= BAND_SUMSQ);
    EXPECT(e <= BAND_SUMSQ, "sumsq n=%zu: cuda %.17g cpu %.17g", n, g1, r);
    EXPECT(g1 == g2, "sumsq n=%zu: two runs differ (%.17g vs %.17g)", n, g1, g2);
    gpu->free(xd);
    free(x);
}

// adamw_runs over one tensor (gscale 1) against the cpu's adamw (cpu_oracle.h) within BAND_ELEM.
static void test_adamw(size_t n, float wd, int t) {
    float *p = hrand(n, 1.0f), *g = hrand(n, 0.1f), *m = hrand(n, 0.01f), *v = hnew(n);
    for (size_t i = 0; i < n; i++) v[i] = 1e-4f * fabsf(rng_normal(&R));
    float *pd = gpu_putf(gpu, p, n), *gd = gpu_putf(gpu, g, n), *md = gpu_putf(gpu, m, n),
          *vd = gpu_putf(gpu, v, n);
    OptRuns *h = one_run(n, 1);
    oracle_adamw(p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, wd, t);
    gpu->adamw_runs(pd, gd, md, vd, h, 1.0f, 1e-3f, 0.9f, 0.95f, 1e-8f, wd, t, OPT_MIXED, 0);
    gpu->runs_free(h);
    cmp("adamw", "p", pd, p, n, BAND_ELEM);
    cmp("adamw", "m", md, m, n, BAND_ELEM);
    cmp("adamw", "v", vd, v, n, BAND_ELEM);
    gpu->free(pd);
    gpu->free(gd);
    gpu->free(md);
    gpu->free(vd);
    free(p);
    free(g);
    free(m);
    free(v);
}

// ---------------------------------------------------------------- multi-tensor runs (the optimizer step)
// Run lists: tests/test_runs.h.

// sumsq_runs: per class against the cpu within BAND_SUMSQ (both accumulate in double; only the order
// differs: ~n * 1e-16 relative), and two runs bitwise equal (a fixed order). maxlen small puts many
// runs in one 8192-element tile; N over 8192 * 1024 makes every block take several tiles. shift: x
// one float past a 16-byte boundary (no float4 loads).
static void test_sumsq_runs(size_t N, size_t maxlen, int ncls, int shift) {
    enum { CAP = 16384 };
    OptRun *runs = xmalloc(sizeof(OptRun) * CAP);
    size_t mt;
    int nr = test_gen_runs(&R, runs, CAP, N, maxlen, ncls, 0, &mt);
    float *x = hrand(N, 1.0f), *xb, *xd = dputf_shift(x, N, shift, &xb);
    OptRuns *hc = cpu->runs_create(runs, nr), *hg = gpu->runs_create(runs, nr);
    double r[9], g1[9], g2[9];
    for (int c = 0; c < 9; c++) r[c] = g1[c] = g2[c] = NAN;
    cpu->sumsq_runs(r, ncls, x, hc);
    gpu->sumsq_runs(g1, ncls, xd, hg);
    gpu->sumsq_runs(g2, ncls, xd, hg);
    OpRow *row = row_for("sumsq_runs", BAND_SUMSQ);
    for (int c = 0; c < ncls; c++) {
        double e = r[c] > 0 ? fabs(g1[c] - r[c]) / r[c] : fabs(g1[c]);
        if (!(e <= row->worst)) row->worst = isnan(e) ? INFINITY : e;
        row->bad += !(e <= BAND_SUMSQ);
        EXPECT(e <= BAND_SUMSQ, "sumsq_runs N=%zu (%d runs) class %d: cuda %.17g cpu %.17g", N, nr, c, g1[c],
               r[c]);
        EXPECT(memcmp(&g1[c], &g2[c], sizeof(double)) == 0,
               "sumsq_runs N=%zu class %d: two runs differ (%.17g vs %.17g)", N, c, g1[c], g2[c]);
    }
    cpu->runs_free(hc);
    gpu->runs_free(hg);
    gpu->free(xb);
    free(x);
    free(runs);
}

// adamw_runs: against the cpu's adamw_runs within BAND_ELEM, and bitwise against the unfused
// sequence on the host, scale() on each run's gradient then adamw() per run (cpu_oracle.h: what the
// trainer ran before; the kernel rounds g * gscale alone (__fmul_rn) exactly as scale() stores it,
// then does the same float operations, without contraction, with c1 and c2 computed on the host,
// and sqrt and division are correctly rounded on both sides); elements outside every run and g
// itself bitwise unchanged. mirror: see test_gen_runs; shift: the four buffers one float past a
// 16-byte boundary (the scalar path only).
static void test_adamw_runs(size_t N, size_t maxlen, float gscale, int t, int mirror, int shift) {
    enum { CAP = 16384 };
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    OptRun *runs = xmalloc(sizeof(OptRun) * CAP);
    size_t M;
    int nr = test_gen_runs(&R, runs, CAP, N, maxlen, 1, mirror, &M);
    float *p = hrand(N, 1.0f), *g = hrand(N, 0.1f), *m = hrand(M, 0.01f), *v = hnew(M);
    for (size_t i = 0; i < M; i++) v[i] = 1e-4f * fabsf(rng_normal(&R));
    float *base[4];
    float *pd = dputf_shift(p, N, shift, &base[0]), *gd = dputf_shift(g, N, shift, &base[1]);
    float *md = dputf_shift(m, M, shift, &base[2]), *vd = dputf_shift(v, M, shift, &base[3]);
    float *p2 = hcopy(p, N), *g2 = hcopy(g, N), *m2 = hcopy(m, M), *v2 = hcopy(v, M);
    OptRuns *hc = cpu->runs_create(runs, nr), *hg = gpu->runs_create(runs, nr);
    float *g0 = hcopy(g, N);
    cpu->adamw_runs(p, g, m, v, hc, gscale, lr, b1, b2, eps, wd, t, OPT_MIXED, 0);
    gpu->adamw_runs(pd, gd, md, vd, hg, gscale, lr, b1, b2, eps, wd, t, OPT_MIXED, 0);
    for (int r = 0; r < nr; r++) {
        if (gscale != 1.0f) oracle_scale(g2 + runs[r].off, gscale, (size_t)runs[r].n);
        oracle_adamw(p2 + runs[r].off, g2 + runs[r].off, m2 + runs[r].moff, v2 + runs[r].moff,
                     (size_t)runs[r].n, lr, b1, b2, eps, runs[r].decay ? wd : 0.0f, t);
    }
    cmp("adamw_runs", "p", pd, p, N, BAND_ELEM);
    cmp("adamw_runs", "m", md, m, M, BAND_ELEM);
    cmp("adamw_runs", "v", vd, v, M, BAND_ELEM);
    const float *fused[4] = {pd, md, vd, gd}, *unfused[4] = {p2, m2, v2, NULL};
    const char *nm[4] = {"p", "m", "v", "g"};
    for (int k = 0; k < 4; k++) {
        size_t n = k == 0 || k == 3 ? N : M;
        float *a = gpu_getf(gpu, fused[k], n);
        const float *b = unfused[k] ? unfused[k] : g0;
        EXPECT(memcmp(a, b, n * sizeof(float)) == 0,
               "adamw_runs N=%zu gscale %g mirror %d shift %d: %s differs "
               "bitwise from %s",
               N, gscale, mirror, shift, nm[k],
               k == 3 ? "the input (g must stay unscaled)" : "scale() then adamw() per run (cpu_oracle.h)");
        free(a);
    }
    cpu->runs_free(hc);
    gpu->runs_free(hg);
    for (int k = 0; k < 4; k++) gpu->free(base[k]);
    free(p2);
    free(g2);
    free(m2);
    free(v2);
    free(p);
    free(g);
    free(m);
    free(v);
    free(g0);
    free(runs);
}

// adamw_runs under the bf16 policy (ops.h OPT_BF16_NEAREST / OPT_BF16_STOCHASTIC / OPT_BF16_MOMENTS): bf16
// moments, the weights rounded to bf16 values (but under OPT_BF16_MOMENTS, whose weights leave the grid). The
// float32 arithmetic is the cpu's (-fmad=false, c1/c2 on the host, correctly rounded sqrt and division) and
// the roundings are integer operations of ops.h, so the gpu's p, m and v must equal the cpu backend's BIT FOR
// BIT. The runs carry random global indices (column blocks too: test_gen_global) and the steps t differ, so a
// kernel hashing another index (the position in the tile space, the local offset, i without the run's start)
// or another t or seed gives other stochastic roundings, and one that skips a rounding leaves bits below bf16
// in p, m or v: caught by the bitwise comparison and by the check that every p, m, v is a bf16 value.
// Elements outside the runs and g stay unchanged. Also: the cuda backend's bf16 weight copy (bf16_shadow)
// follows the update. The gradient formats (OptRun gbf, gb; test_runs.h test_gen_formats: float32, bf16 read
// rounded, packed bf16 blocks) on the device: adamw_runs (policy prec) bit for bit the cpu's on the same
// buffer, sumsq_runs the cpu's within 1e-12 (its own order), and far from the unrounded gradients' sums (so
// the formats are seen).
static void test_grad_formats(size_t N, size_t maxlen, int mirror, int shift, int prec) {
    enum { CAP = 16384 };
    OptRun *runs = xmalloc(sizeof(OptRun) * CAP);
    size_t M;
    int nr = test_gen_runs(&R, runs, CAP, N, maxlen, 3, mirror, &M);
    test_gen_global(&R, runs, nr);
    float *gf = hrand(N, 0.1f), *gx = hnew(N), *gr = hnew(N);
    size_t changed = test_gen_formats(&R, runs, nr, gf, gx, gr, N);
    size_t es = prec == OPT_MIXED ? 4 : 2;
    float *p = hrand(N, 1.0f);
    if (prec != OPT_MIXED)
        for (size_t i = 0; i < N; i++) p[i] = bf16_to_f32(bf16_rn_bits(p[i]));
    char *m = xcalloc(M + 1, es), *v = xcalloc(M + 1, es);
    float *base[2];
    float *pd = dputf_shift(p, N, shift, &base[0]), *gd = dputf_shift(gx, N, shift, &base[1]);
    void *md = gpu->alloc(es * (M + 1)), *vd = gpu->alloc(es * (M + 1));
    OptRuns *hc = cpu->runs_create(runs, nr), *hg = gpu->runs_create(runs, nr);
    for (int t = 1; t <= 2; t++) {
        cpu->adamw_runs(p, gx, m, v, hc, 0.5f, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, prec, 77);
        gpu->adamw_runs(pd, gd, md, vd, hg, 0.5f, 1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f, t, prec, 77);
    }
    float *pg = gpu_getf(gpu, pd, N);
    char *mg = xmalloc(es * (M + 1)), *vg = xmalloc(es * (M + 1));
    gpu->to_host(mg, md, es * M);
    gpu->to_host(vg, vd, es * M);
    char lab[160];
    snprintf(lab, sizeof lab, "grad formats N=%zu (%d runs, %zu values rounded) mirror %d shift %d prec %d",
             N, nr, changed, mirror, shift, prec);
    EXPECT(!memcmp(pg, p, sizeof(float) * N) && !memcmp(mg, m, es * M) && !memcmp(vg, v, es * M),
           "%s: adamw_runs differs bitwise from the cpu's", lab);
    double a[3], c[3], u[3];
    gpu->sumsq_runs(a, 3, gd, hg);
    cpu->sumsq_runs(c, 3, gx, hc);
    OptRun *plain = xmalloc(sizeof(OptRun) * CAP);
    for (int i = 0; i < nr; i++) {
        plain[i] = runs[i];
        plain[i].gbf = OPTG_F32;
        plain[i].gb = 0;
    }
    OptRuns *hp = cpu->runs_create(plain, nr);
    cpu->sumsq_runs(u, 3, gf, hp);
    int far = 0;
    for (int k = 0; k < 3; k++) {
        EXPECT(fabs(a[k] - c[k]) <= 1e-12 * c[k], "%s: sumsq_runs class %d: %.17g, the cpu's %.17g", lab, k,
               a[k], c[k]);
        far |= fabs(u[k] - c[k]) > 1e-9 * c[k];
    }
    EXPECT(changed > 0 && far, "%s: the formats change no sum (the test sees nothing)", lab);
    cpu->runs_free(hc);
    cpu->runs_free(hp);
    gpu->runs_free(hg);
    gpu->free(base[0]);
    gpu->free(base[1]);
    gpu->free(md);
    gpu->free(vd);
    free(runs);
    free(plain);
    free(gf);
    free(gx);
    free(gr);
    free(p);
    free(m);
    free(v);
    free(pg);
    free(mg);
    free(vg);
}

static void test_adamw_runs_bf16(size_t N, size_t maxlen, float gscale, int t, int mirror, int shift,
                                 int prec) {
    enum { CAP = 16384 };
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
    const uint64_t seed = 0x1234567ull + (uint64_t)t;
    OptRun *runs = xmalloc(sizeof(OptRun) * CAP);
    size_t M;
    int nr = test_gen_runs(&R, runs, CAP, N, maxlen, 1, mirror, &M);
    test_gen_global(&R, runs, nr);
    float *p = hrand(N, 1.0f), *g = hrand(N, 0.1f);
    uint16_t *m = xmalloc(sizeof(uint16_t) * (M + 1)), *v = xmalloc(sizeof(uint16_t) * (M + 1));
    for (size_t i = 0; i < N; i++)
        p[i] = bf16_to_f32(bf16_rn_bits(p[i])); // the policy's weights: bf16 values
    for (size_t i = 0; i < M; i++) {
        m[i] = bf16_rn_bits(0.01f * (float)rng_normal(&R));
        v[i] = bf16_rn_bits(1e-4f * fabsf((float)rng_normal(&R)));
    }
    float *base[2];
    float *pd = dputf_shift(p, N, shift, &base[0]), *gd = dputf_shift(g, N, shift, &base[1]);
    uint16_t *md = gpu->alloc(sizeof(uint16_t) * (M + 1)), *vd = gpu->alloc(sizeof(uint16_t) * (M + 1));
    gpu->to_device(md, m, sizeof(uint16_t) * M);
    gpu->to_device(vd, v, sizeof(uint16_t) * M);
    float *p0 = hcopy(p, N), *g0 = hcopy(g, N);
    OptRuns *hc = cpu->runs_create(runs, nr), *hg = gpu->runs_create(runs, nr);
    if (!shift) gpu->bf16_shadow(pd, N); // (a no-op on cuda-fp32)
    cpu->adamw_runs(p, g, m, v, hc, gscale, lr, b1, b2, eps, wd, t, prec, seed);
    gpu->adamw_runs(pd, gd, md, vd, hg, gscale, lr, b1, b2, eps, wd, t, prec, seed);
    float *pg = gpu_getf(gpu, pd, N), *gg = gpu_getf(gpu, gd, N);
    uint16_t *mg = xmalloc(sizeof(uint16_t) * (M + 1)), *vg = xmalloc(sizeof(uint16_t) * (M + 1));
    gpu->to_host(mg, md, sizeof(uint16_t) * M);
    gpu->to_host(vg, vd, sizeof(uint16_t) * M);
    const char *pn = prec == OPT_BF16_STOCHASTIC ? "stochastic"
        : prec == OPT_BF16_NEAREST               ? "nearest"
                                                 : "none";
    size_t dp = 0, dm = 0, dv = 0, nb = 0, moved = 0;
    for (size_t i = 0; i < N; i++) {
        dp += f32_bits(pg[i]) != f32_bits(p[i]);
        nb += (f32_bits(pg[i]) & 0xffffu) != 0;
        moved += f32_bits(p[i]) != f32_bits(p0[i]);
    }
    for (size_t i = 0; i < M; i++) {
        dm += mg[i] != m[i];
        dv += vg[i] != v[i];
    }
    EXPECT(dp == 0 && dm == 0 && dv == 0,
           "adamw_runs bf16 %s N=%zu t %d mirror %d shift %d: %zu weights, %zu m, %zu v "
           "differ bitwise from the cpu's",
           pn, N, t, mirror, shift, dp, dm, dv);
    if (prec != OPT_BF16_MOMENTS)
        EXPECT(nb == 0, "adamw_runs bf16 %s N=%zu: %zu weights are not bf16 values", pn, N, nb);
    else EXPECT(nb > 0, "adamw_runs bf16 none N=%zu: every weight is a bf16 value (rounded after all?)", N);
    EXPECT(moved > 0, "adamw_runs bf16 %s N=%zu: no weight moved (the test says nothing)", pn, N);
    EXPECT(memcmp(gg, g0, sizeof(float) * N) == 0, "adamw_runs bf16 %s N=%zu: g changed", pn, N);
    if (!shift) { // the GEMMs' copy of the weights (cuda) followed the update: a GEMM reading it gives the
                  // bits of one converting p (exact: p holds bf16 values)
        int K = 16, O = (int)(N / 16), Nr = 4;
        float *x = hrand((size_t)Nr * K, 1.0f), *xd = gpu_putf(gpu, x, (size_t)Nr * K);
        float *o1 = gpu->alloc(sizeof(float) * (size_t)Nr * O),
              *o2 = gpu->alloc(sizeof(float) * (size_t)Nr * O);
        gpu->matmul_fwd(o1, xd, pd, Nr, K, O, 0);
        gpu->bf16_shadow(NULL, 0);
        gpu->matmul_fwd(o2, xd, pd, Nr, K, O, 0);
        float *a1 = gpu_getf(gpu, o1, (size_t)Nr * O), *a2 = gpu_getf(gpu, o2, (size_t)Nr * O);
        EXPECT(memcmp(a1, a2, sizeof(float) * (size_t)Nr * O) == 0,
               "adamw_runs bf16 %s N=%zu: a GEMM through the bf16 weight copy differs from one converting p",
               pn, N);
        gpu->free(xd);
        gpu->free(o1);
        gpu->free(o2);
        free(x);
        free(a1);
        free(a2);
    }
    printf("adamw_runs bf16 %-10s N=%-7zu t=%d mirror %d shift %d: %zu runs, %zu weights moved, p/m/v "
           "bitwise equal "
           "to the cpu: %s\n",
           pn, N, t, mirror, shift, (size_t)nr, moved, dp + dm + dv ? "NO" : "yes");
    cpu->runs_free(hc);
    gpu->runs_free(hg);
    gpu->free(base[0]);
    gpu->free(base[1]);
    gpu->free(md);
    gpu->free(vd);
    free(p);
    free(g);
    free(m);
    free(v);
    free(p0);
    free(g0);
    free(pg);
    free(gg);
    free(mg);
    free(vg);
    free(runs);
}

// The whole suite on one backend; prints its table.
static void run_suite(const Backend *be, int big) {
    gpu = be;
    gpu_bf16 = be == backend_cuda();
    nrows = 0;
    int fails0 = t_failures;
    test_memory(big);
    test_matmul(37, 70, 45, 0); // O <= MOE_GEMM_FP32_MAX_O: float32 on both backends
    test_matmul(37, 70, 100, 1); // bf16 on "cuda"; operands not 16-byte aligned (scalar conversion)
    if (big) test_matmul(256, 512, 384, 0);
    test_matmul(1, 1, 1, 0);
    test_matmul(3, 5, 65, 0); // the first O in bf16; K and N under a vector width
    test_matmul(1000, 96, 8, 0); // a router's shape: several chunks of the narrow dw
    test_dw_narrow(1000, 300, 8);
    test_dw_narrow(129, 130, 64); // the widest narrow O; a chunk of one row, a partial column block
    test_dw_narrow(203, 130, 13);
    test_dw_narrow(7, 5, 3);
    test_matmul(5, 0, 7, 0); // K = 0: overwrite gives zeros, accumulate leaves out
    test_matmul(5, 0, 70, 0);
    test_matmul_dout_hid(37, 48, 13); // narrow: float32 products on the widened values
    test_matmul_dout_hid(37, 48, 304); // the bf16 GEMMs reading the rows in place (ld 2 O)
    test_matmul_dout_hid(37, 48, 301); // O not a multiple of 8: the rows packed first
    test_matmul_multi(37, 70, (const int[3]){100, 72, 72}); // q, k, v shapes: all bf16 on "cuda"
    test_matmul_multi(29, 40, (const int[3]){96, 16, 80}); // a float32 product between bf16 ones
    if (big) test_matmul_multi(512, 256, (const int[3]){256, 128, 128});
    const int64_t c6[6] = {7, 0, 13, 1, 40, 0}, c4[4] = {0, 0, 0, 0}, c3[3] = {0, 33, 0};
    test_grouped(70, 45, 6, c6); // empty groups, first and last
    if (big) test_grouped(96, 192, 6, c6);
    test_grouped(64, 80, 4, c4); // every group empty: nothing written, nothing changed
    test_grouped(128, 96, 3, c3); // one group
    // shapes the Hopper kernel takes (K, O multiples of 8): K past a 64-wide k-step, O past a
    // 256-wide column tile, groups ending inside a 128-row tile, one row, an empty group
    const int64_t c5[5] = {130, 0, 1, 257, 64};
    test_grouped(200, 264, 5, c5);
    test_grouped_fused(200, 264, 5, c5); // the Hopper kernel's fused epilogues and dinp pair
    test_grouped_fused(70, 45, 6, c6); // shapes the kernel does not take: the cuBLAS loop
    const int64_t c80[1] = {80};
    test_grouped_fused(96, 96, 1, c80); // one group of all rows: a dense layer's MLP (moe_shared_forward)
    test_grouped_fused(96, 48, 1, c80);
    if (big) {
        const int64_t c8[8] = {300, 129, 0, 511, 64, 1, 256, 200};
        test_grouped(512, 768, 8, c8);
        // fine-grained experts: 256 groups (the most one launch of the Hopper kernel takes), ragged
        // and some empty; 260: more than one launch takes, the cuBLAS loop
        int64_t c260[260];
        for (int g = 0; g < 260; g++) c260[g] = (g * 7) % 5;
        test_grouped(24, 16, 256, c260);
        test_grouped_fused(64, 72, 256, c260);
        test_grouped(24, 16, 260, c260);
    }
    test_embedding(50, 300, 96);
    if (big) test_embedding(7, 1000, 300);
    test_embedding(3, 700, 8); // a row met several times in most batches of the scatter's loads
    test_rows(40, 500, 300);
    test_rows(1000, 77, 13);
    test_rows(64, 200, 256); // (bf16 rows of 16-byte pieces)
    test_combine(300, 8, 256, 2400, 0); // the vectorised kernel (C % 4 == 0, aligned), k = one unroll
    test_combine(97, 10, 300, 500, 0); // k over the unroll width
    test_combine(50, 2, 13, 90, 0); // C % 4 != 0: scalar kernel
    test_combine(40, 3, 64, 100, 1); // unaligned buffers: scalar kernel
    test_combine(33, 1, 8, 20, 0);
    // the kernels of k 1, 2, 4 (8 / k rows a block): N not a multiple of the rows a block, C4 over a block
    test_combine(37, 2, 2048, 60, 0);
    test_combine(13, 4, 64, 40, 0);
    test_combine(45, 1, 1028, 30, 0);
    test_combine(19, 6, 128, 50, 0); // k 6: a block a row
    if (big) test_combine(4096, 8, 1024, 8192, 0);
    if (big) test_combine(8191, 2, 2048, 16382, 0); // the reference model's shape, less a row
    test_router(300, 64, 8, 0); // olmoe's E and k
    test_router(257, 8, 2, 1); // mixtral's; N not a multiple of the 8 rows per block
    test_plan(3000, 64, 8); // several 1024-token chunks, olmoe's E and k
    test_plan(257, 8, 2);
    test_plan(5, 3, 3); // fewer tokens than a warp, k = E
    test_router(70, 100, 5, 1); // E over 64: lanes hold 3-4 experts
    test_router(3, 3, 3, 0); // k = E
    test_router(1, 1, 1, 1);
    test_router_b(300, 64, 8, 0, 1); // the aux-free bias (choice only)
    test_router_b(257, 100, 5, 1, 1);
    // DeepSeek-V3's routing: sigmoid scores, 8 groups of 8 (the best 4 chosen from), the bias, scale 2.5
    test_router_r(
        300, 64, (RouteRule){.k = 8, .renorm = 1, .sigmoid = 1, .n_group = 8, .topk_group = 4, .scale = 2.5f},
        1);
    test_router_r(257, 96, (RouteRule){.k = 6, .renorm = 0, .sigmoid = 1, .n_group = 48, .topk_group = 5}, 0);
    test_router_r(70, 64, (RouteRule){.k = 2, .renorm = 1, .n_group = 4, .topk_group = 1},
                  0); // softmax, groups
    if (big) test_router(16384, 64, 8, 1); // the sums over 256 chunks of rows
    test_rmsnorm(37, 96);
    test_add_rmsnorm(37, 96, 0);
    test_add_rmsnorm(37, 96, 1);
    test_add_rmsnorm(9, 33, 0); // rows off 16 bytes: the scalar paths
    if (big) test_rmsnorm(200, 1000);
    if (big) test_add_rmsnorm(200, 2048, 0);
    test_rmsnorm_part(37, 48, 96); // one of two TP ranks' q columns
    test_rmsnorm_part(5, 300, 1200); // C over a block's 256 threads, one of four
    test_rmsnorm_part(37, 96, 96); // one part: rmsnorm_fwd / rmsnorm_bwd's bits
    if (big) test_rmsnorm_part(300, 1024, 2048); // OLMoE's q row (16 x 128) over tp 2
    // rmsnorm_bwd in one kernel (65 chunks of 64 rows, the last of 4: cuda_norm.cu RMS_FUSE_MIN): against the
    // cpu, and its bits against the two kernels' (one part: bwd_part runs them), a float4 a thread a row;
    // then two and three (the FV 4 form)
    test_rmsnorm(4100, 256);
    test_rmsnorm_part(4100, 256, 256);
    if (big) test_rmsnorm_part(4160, 2048, 2048);
    if (big) test_rmsnorm_part(4097, 3072, 3072);
    test_rope(2, 19, 3, 24, 10000.0f);
    test_rope(2, 7, 3, 10, 10000.0f); // hd % 4 = 2: rope_fwd_hid from the hidden format by single values
    test_rope(1, 33, 16, 128, 10000.0f); // the reference model's q rows (rope_bwd_hid: 4 rows' pairs a block)
    test_rope(1, 5, 64, 256, 10000.0f); // a row over 48 KB of shared memory (rope_bwd_hid, to_hid_rows)
    if (big) test_rope(1, 300, 2, 128, 1000000.0f);
    test_rope_rows_dropout(2, 19, 3, 24, 10000.0f, 5, 12);
    test_rope_table();
    test_rope_rows_dropout(1, 40, 2, 32, 10000.0f, 39, 40);
    test_swiglu(10007);
    if (gpu_bf16) test_bf16_shadow();
    test_alloc_holes();
    if (gpu_bf16) test_bf16_params(OPT_BF16_NEAREST);
    if (gpu_bf16) test_bf16_params(OPT_BF16_STOCHASTIC);
    test_attention(2, 70, 4, 2, 24);
    test_attention(1, 33, 3, 3, 64);
    if (big) test_attention(2, 40, 8, 2, 128);
    test_attention(1, 5, 2, 1, 2);
    if (big) test_attention(1, 64, 2, 1, 256);
    if (big) test_attention(1, 200, 4, 1, 40);
    test_attention(1, 2, 2, 1, 32); // tensor-core path: two rows (the first one's dq is 0)
    test_attention(2, 130, 4, 2, 128); // T over two 64-row blocks, a partial third
    test_attention(1, 97, 6, 2, 64); // 3 query heads per kv head
    test_attention_dropout(2, 45, 4, 2, 16, 0.2f, 0, 45);
    test_attention_dropout(1, 70, 6, 2, 48, 0.5f, 33, 70);
    if (big) test_attention(2, 300, 4, 4, 128);
    if (big) test_attention(1, 513, 2, 1, 32);
    test_attention_chunks(2, 130, 4, 2, 128, 2); // chunks not on 64-row blocks
    test_attention_chunks(1, 97, 6, 2, 64, 4); // uneven
    test_attention_chunks(2, 37, 4, 2, 40, 3); // the float32 kernels (hd 40)
    if (big) test_attention_chunks(1, 300, 4, 4, 128, 4);
    // head dim 128's forward on 128-key tiles (cuda_attention_wgf.cu): one row; T at the 64- and 128-key
    // tiles' edges (the last tile partial or whole, the rows past T of a block's Q zero-filled); B 3; KV 1
    // (every query head on one K/V head) and KV = H
    test_attention(1, 1, 2, 1, 128);
    test_attention(1, 63, 2, 2, 128);
    test_attention(3, 64, 2, 1, 128);
    test_attention(1, 65, 4, 4, 128);
    test_attention(2, 127, 2, 1, 128);
    test_attention(1, 128, 4, 2, 128);
    test_attention(3, 129, 2, 2, 128);
    // row ranges: t0 % 128 = 64 (the first consumer warpgroup's last tile is past all its rows, masked
    // whole), off every block (t0 333), one row (decode), and a long sequence (33 tiles, the last of one key)
    test_attention_fwd_rows(2, 300, 4, 2, 128, 64, 300);
    test_attention_fwd_rows(1, 1000, 4, 1, 128, 333, 666);
    test_attention_fwd_rows(1, 200, 2, 2, 128, 199, 200);
    test_attention_chunks(2, 256, 4, 2, 128, 4); // chunks at 64, 128, 192
    // head dim 128's backward: the cases above (T 1 .. 300, B 3, KV 1 and KV = H, chunks off 64- and 128-row
    // boundaries, flags written / added), and longer sequences. Under MOE_ATTN_DS_MB=1
    // (test_cuda_attn_passes.sh) the T 500 case's dS scratch runs in 4 passes of two kv heads of one sequence
    // (288 KiB a pair; 352 KiB at most over any rows of T 500: two fit), T 1000's in key ranges of two kv
    // heads (at most 2 x 152 tiles of 8 KiB a pair: not two in 1 MiB), chunks too, and T 4097's (one kv head
    // of 2 query heads: its first key tile alone, 2 x 65 tiles, is over 1 MiB) computes dS again. Key ranges
    // (under MOE_ATTN_DS_MB=1, where not two pairs fit whole): T 600 of 3 kv heads (2 query heads each, 880
    // KiB a pair; B 2) in passes of two kv heads then one over the key tiles [0, 3), [3, 9), [9, 10) (27
    // tiles a head and range at most: 864 KiB for two pairs), T 700 of one kv head (passes of one pair over
    // [0, 9), [9, 11)), and chunks of T 600 (rows [200, 400): one range [0, 7), its last query tile's row one
    // key tile short of a + m + 1; rows [400, 600): [0, 8), then [8, 10) from the second query tile). By
    // default all of them one pass.
    test_attention(2, 600, 6, 3, 128);
    test_attention(1, 700, 2, 1, 128);
    test_attention_chunks(1, 600, 4, 2, 128, 3);
    if (big) test_attention(1, 1000, 4, 2, 128);
    if (big) test_attention(2, 500, 4, 4, 128);
    if (big && gpu_bf16) test_attention(1, 4097, 2, 1, 128);
    if (big) test_attention_fwd_rows(1, 4097, 2, 1, 128, 0, 4097);
    if (big) test_attention_chunks(1, 1000, 4, 2, 128, 3);
    test_cross_entropy(37, 13, 1.0f);
    test_cross_entropy(20, 5000, 3.0f);
    test_cross_entropy(5, 20000, 3.0f); // (16385-32768 values: the row in registers, threads past its end)
    test_ce_parts(37, 13, 1.0f);
    test_ce_parts(20, 5000, 3.0f); // (float4 rows where the block allows: 1667 and 3333 columns do not)
    test_ce_parts(9, 12000, 10.0f);
    if (big) test_cross_entropy(9, 32000, 10.0f);
    test_elementwise(100003);
    test_sumsq(0);
    test_sumsq(1000);
    if (big) test_sumsq(3000001);
    test_adamw(100003, 0.1f, 1);
    test_adamw(4097, 0.0f, 10);
    test_sumsq_runs(3000, 40, 3, 0); // many runs per tile
    test_sumsq_runs(200000, 30000, 9, 0); // runs across tiles; ZeRO-2's 9 classes
    test_sumsq_runs(20000, 3000, 3, 1); // x not 16-byte aligned: scalar loads only
    if (big) test_sumsq_runs(9000001, 3000000, 3, 0); // several tiles per block
    test_adamw_runs(3000, 40, 0.37f, 1, 0, 0);
    test_adamw_runs(3000, 40, 0.37f, 1, 1, 0); // every run on the float4 path (head, body, tail)
    test_adamw_runs(200000, 30000, 1.0f, 3, 1, 0);
    test_adamw_runs(20000, 3000, 0.5f, 2, 1, 1); // unaligned buffers: the scalar path
    test_adamw_runs_bf16(3000, 40, 0.37f, 1, 0, 0, OPT_BF16_STOCHASTIC);
    test_adamw_runs_bf16(200000, 30000, 1.0f, 7, 1, 0, OPT_BF16_STOCHASTIC);
    test_adamw_runs_bf16(20000, 3000, 0.5f, 2, 1, 1, OPT_BF16_STOCHASTIC); // unaligned buffers
    test_adamw_runs_bf16(20000, 3000, 1.0f, 3, 0, 0, OPT_BF16_NEAREST);
    test_adamw_runs_bf16(20000, 3000, 0.5f, 4, 1, 0, OPT_BF16_MOMENTS);
    test_adamw_runs_bf16(3000, 40, 1.0f, 2, 0, 1, OPT_BF16_MOMENTS); // unaligned buffers
    test_grad_formats(3000, 40, 0, 0, OPT_BF16_STOCHASTIC);
    test_grad_formats(200000, 30000, 1, 0, OPT_BF16_STOCHASTIC); // the 16-byte paths (packed: 8-byte loads)
    test_grad_formats(20000, 3000, 1, 1, OPT_BF16_NEAREST); // unaligned buffers: the scalar path
    test_grad_formats(20000, 3000, 1, 0, OPT_MIXED);
    if (big) test_adamw_runs(9000001, 3000000, 1e-3f, 2, 0, 0);
    if (big) test_adamw_runs(9000001, 3000000, 1e-3f, 2, 1, 0);
    printf("\nbackend %s%s\n%-34s %12s %8s %12s %8s  %s\n", be->name,
           t_failures == fails0 ? "" : " (FAILURES)", "op", "max rel err", "band", "norm-wise", "band",
           "status");
    for (int i = 0; i < nrows; i++) {
        char nb[24] = "", nv[24] = "";
        if (rows[i].norm_band > 0) {
            snprintf(nv, sizeof nv, "%.3e", rows[i].norm);
            snprintf(nb, sizeof nb, "%.0e", rows[i].norm_band);
        }
        printf("%-34s %12.3e %8.0e %12s %8s  %s\n", rows[i].op, rows[i].worst, rows[i].band, nv, nb,
               rows[i].bad ? "FAIL" : "ok");
    }
}

// compute capability x10 of the current device (0 if unknown)

int main(void) {
    if (!backend_cuda_available())
        TEST_SKIP("no CUDA GPU (or a build without CUDA): backend_cuda_available() = 0");
    cpu = backend_cpu();
    const char *seed = getenv("MOE_TEST_SEED"); // other random inputs: MOE_TEST_SEED=n
    rng_seed(&R, seed && *seed ? strtoull(seed, NULL, 10) : 20261129);
    // MOE_TEST_SMALL=1: small shapes only (for compute-sanitizer's racecheck/initcheck, which are slow)
    const char *sm = getenv("MOE_TEST_SMALL");
    int big = !(sm && *sm && strcmp(sm, "0"));
    // MOE_TEST_BACKEND=cuda or cuda-fp32: that backend only (default: both)
    const char *only = getenv("MOE_TEST_BACKEND");
    if (!only || !*only || !strcmp(only, "cuda-fp32")) run_suite(backend_cuda_fp32(), big);
    if (!only || !*only || !strcmp(only, "cuda")) {
        run_suite(backend_cuda(), big);
        // on a Hopper GPU (sm_90) this build's grouped GEMMs must be our kernel, not the fallback:
        // else the checks above passed through cuBLAS and said nothing about it
        int kern = backend_cuda_grouped_kernel(), cc = cuda_device_cc();
        const char *gg = getenv("MOE_GROUPED_GEMM");
        printf("grouped GEMMs on \"cuda\": %s (device compute capability %d.%d)\n",
               kern ? "the Hopper kernel (cuda_grouped.cu)" : "cuBLAS", cc / 10, cc % 10);
        if (cc == 90 && !(gg && !strcmp(gg, "cublas")))
            EXPECT(kern, "sm_90 device but the grouped GEMMs fell back to cuBLAS");
    }
    return test_done("test_cuda_ops");
}
