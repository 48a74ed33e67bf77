// test_cuda_attn_drop.c — dropout on the attention probabilities (ops.h attention_drop_fwd/bwd) in the
// "cuda" backend's tensor-core kernels (cuda_attention_tc.cu: head dims 32, 64, 128). Skips (exit 77) without
// a GPU. The same bf16 inputs go to three places:
//   bf16_ref.h's attention with dropout (the cpu; the kernels' roundings: q, k, v, dout, P and dS in bf16,
//     sums in double; the mask of ops.h dropout_keep): BAND_ATT_TC_NORM norm-wise and BAND_BF16_ELEM per
//     element, test_cuda_ops.c's bands for the tensor-core attention (why: there);
//   the float32 cuda kernels ("cuda-fp32"'s attention_drop_*, which ran these calls before) on the same
//     bf16-rounded values: BAND_BF16_NORM norm-wise (forward also BAND_BF16_ELEM per element), what rounding
//     P and dS to bf16 costs (test_cuda_ops.c's bf16 vs float32 bands). This asserts the mask: out - out' =
//     sum_u P_u (Z_u - Z'_u) v_u for two masks Z, Z', whose norm relative to out's is ~sqrt(2p) (v random:
//     E (Z - Z')^2 = 2p/(1-p), E Z^2 = 1/(1-p)) when they are independent, ~sqrt(2 f) when they differ in a
//     fraction f of the (row, key) pairs; the same call with another seed must land over MASK_GAP away (rows
//     of 16 keys and more), or the comparison could not see a mask at all;
//   the kernels without dropout: the lse of a dropout call is the undropped softmax's (ops.h), bit for bit
//     where the call without dropout runs the same mma.sync kernels (the wgmma ones of cuda_attention_wg.cu
//     take head dim 128 on Hopper without dropout: there within BAND_SUM); with p 2e-8, whose threshold
//     rounds to 0 and whose scale 1/(1-p) is 1.0f (every key kept), the dropout kernels give those kernels'
//     bits (out, lse, dq, dk, dv): the mask and scale are the only change; p = 0 is attention_fwd/bwd's
//     call (ops.h), bit for bit, at every head dim.
// Shapes: GQA (2 and 3 query heads a kv head, and one kv head), T not a multiple of the 64-row blocks,
// query rows [t0, t1) with t0 > 0 and chunks (AMPipe) against one call, the mask's global head (h0) and token
// (row0) offsets, most keys dropped (p 0.9), and nanoGPT shakespeare_char's attention (6 heads of 64, T 256).
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "test_util.h"
#include "gpu_util.h"
#include "bf16_ref.h"

#define BAND_SUM 1e-5
#define BAND_BF16_ELEM 5e-2
#define BAND_BF16_NORM 1e-2
#define BAND_ATT_TC_NORM 2e-3
#define MASK_GAP 0.1 // norm-wise: another mask is ~sqrt(2p) away, 0.45 at p 0.1
#define P_KEEP_ALL \
    2e-8f // > 0, but dropout_threshold 0 and 1 / (1 - p) == 1.0f: the kernels' mask path, all kept

static Rng R;
static const Backend *gpu, *f32, *ref;

static float *hnew(size_t n) { return xcalloc(n ? n : 1, sizeof(float)); }
// sd-1 normal values rounded to bf16 (the inputs both paths take exactly)
static float *hrand_bf16(size_t n) {
    float *x = hnew(n);
    for (size_t i = 0; i < n; i++) x[i] = bf16_round(rng_normal(&R));
    return x;
}
// rows [t0, t1) of each of B sequences of T rows of W values (B, T, W), compacted; lse (B, H, T) likewise
static float *rows_of(const float *x, int B, int T, size_t W, int t0, int t1) {
    float *y = hnew((size_t)B * (t1 - t0) * W);
    for (int b = 0; b < B; b++)
        memcpy(y + (size_t)b * (t1 - t0) * W, x + ((size_t)b * T + t0) * W, sizeof(float) * (t1 - t0) * W);
    return y;
}
static float *lse_rows(const float *l, int B, int H, int T, int t0, int t1) {
    return rows_of(l, B * H, T, 1, t0, t1);
}
// the values outside rows [t0, t1) that are not NaN (written where the op must not write)
static size_t written_outside(const float *x, int B, int T, size_t W, int t0, int t1) {
    size_t n = 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (size_t i = 0; i < W && (t < t0 || t >= t1); i++) n += !isnan(x[((size_t)b * T + t) * W + i]);
    return n;
}

// got against ref (host arrays): per element |got - ref| / (|ref| + rms(ref)) <= elem, and norm-wise
// ||got - ref|| / ||ref|| <= norm (0: not checked). Returns the norm-wise error.
static double cmp_n(const char *what, const float *got, const float *ref_, size_t n, double elem,
                    double norm) {
    GpuErr r = gpu_err(got, ref_, n, elem);
    EXPECT(r.bad == 0, "%s: %zu of %zu elements out of band %.0e; first [%zu] got %.9g want %.9g", what,
           r.bad, n, elem, r.first, r.bad ? got[r.first] : 0.0, r.bad ? ref_[r.first] : 0.0);
    if (norm > 0) EXPECT(r.norm <= norm, "%s: norm-wise relative error %.3e > %.0e", what, r.norm, norm);
    printf("  %-66s worst %.2e  norm %.2e\n", what, r.worst, r.norm);
    return r.norm;
}
static void cmp_bits(const char *what, const float *a, const float *b, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp(a + i, b + i, sizeof(float)) != 0;
    EXPECT(bad == 0, "%s: %zu of %zu values not the same bits", what, bad, n);
}

// the no-dropout call runs the mma.sync kernels (not cuda_attention_wg.cu's: head dim 128 on Hopper)
static int plain_is_mma(int hd) { return !(hd == 128 && backend_cuda_grouped_kernel()); }

typedef struct {
    int B, T, H, KV, hd;
    size_t nq, nk, nl;
    float *q, *k, *v, *g; // host, bf16 values
    void *qd, *kd, *vd; // bf16 on the device
    float *qf, *kf, *vf, *gd; // float32 on the device (the same values)
} Inputs;
static Inputs inputs(int B, int T, int H, int KV, int hd) {
    Inputs x = {.B = B, .T = T, .H = H, .KV = KV, .hd = hd};
    x.nq = (size_t)B * T * H * hd;
    x.nk = (size_t)B * T * KV * hd;
    x.nl = (size_t)B * H * T;
    x.q = hrand_bf16(x.nq);
    x.k = hrand_bf16(x.nk);
    x.v = hrand_bf16(x.nk);
    x.g = hnew(x.nq);
    for (size_t i = 0; i < x.nq; i++) x.g[i] = rng_normal(&R);
    x.qd = gpu_hid_put(gpu, x.q, x.nq);
    x.kd = gpu_hid_put(gpu, x.k, x.nk);
    x.vd = gpu_hid_put(gpu, x.v, x.nk);
    x.qf = gpu_putf(gpu, x.q, x.nq);
    x.kf = gpu_putf(gpu, x.k, x.nk);
    x.vf = gpu_putf(gpu, x.v, x.nk);
    x.gd = gpu_putf(gpu, x.g, x.nq);
    return x;
}
static void inputs_free(Inputs *x) {
    void *d[] = {x->qd, x->kd, x->vd, x->qf, x->kf, x->vf, x->gd};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++) gpu->free(d[i]);
    free(x->q);
    free(x->k);
    free(x->v);
    free(x->g);
}

// One forward on the GPU ("cuda", p) over NaN-filled out and lse: host copies of both
typedef struct {
    float *o, *l;
} Fwd;
static Fwd gpu_fwd(const Inputs *x, float p, uint64_t seed, int t0, int t1, int64_t row0, int h0) {
    void *od = gpu_hid_nan(gpu, x->nq);
    float *ld = gpu_nanf(gpu, x->nl);
    gpu->attention_drop_fwd(od, ld, x->qd, x->kd, x->vd, x->B, x->T, x->H, x->KV, x->hd, t0, t1, p, seed,
                            row0, h0);
    Fwd f = {gpu_hid_get(gpu, od, x->nq), gpu_getf(gpu, ld, x->nl)};
    gpu->free(od);
    gpu->free(ld);
    return f;
}
static void fwd_free(Fwd *f) {
    free(f->o);
    free(f->l);
}

// The forward of one call over [t0, t1) against the references; returns the reference's out and lse (the
// backward's inputs, as test_cuda_ops.c takes them).
static Fwd check_fwd(const Inputs *x, float p, uint64_t seed, int t0, int t1, int64_t row0, int h0,
                     const char *tag) {
    int B = x->B, T = x->T, H = x->H, KV = x->KV, hd = x->hd;
    size_t W = (size_t)H * hd, nr = (size_t)B * (t1 - t0) * W, nlr = (size_t)B * H * (t1 - t0);
    char what[160];
    Fwd g = gpu_fwd(x, p, seed, t0, t1, row0, h0);
    EXPECT(written_outside(g.o, B, T, W, t0, t1) == 0 && written_outside(g.l, B * H, T, 1, t0, t1) == 0,
           "%s: out or lse written outside rows [%d, %d)", tag, t0, t1);
    float *go = rows_of(g.o, B, T, W, t0, t1), *gl = lse_rows(g.l, B, H, T, t0, t1);
    Fwd r = {hnew(x->nq), hnew(x->nl)};
    ref->attention_drop_fwd(r.o, r.l, x->q, x->k, x->v, B, T, H, KV, hd, t0, t1, p, seed, row0, h0);
    float *ro = rows_of(r.o, B, T, W, t0, t1), *rl = lse_rows(r.l, B, H, T, t0, t1);
    snprintf(what, sizeof what, "%s out vs bf16_ref", tag);
    cmp_n(what, go, ro, nr, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
    snprintf(what, sizeof what, "%s lse vs bf16_ref", tag);
    cmp_n(what, gl, rl, nlr, BAND_SUM, 0);
    // the float32 kernels on the same values
    float *ofd = gpu_nanf(gpu, x->nq), *lfd = gpu_nanf(gpu, x->nl);
    f32->attention_drop_fwd(ofd, lfd, x->qf, x->kf, x->vf, B, T, H, KV, hd, t0, t1, p, seed, row0, h0);
    float *of = gpu_getf(gpu, ofd, x->nq), *lf = gpu_getf(gpu, lfd, x->nl),
          *fo = rows_of(of, B, T, W, t0, t1);
    snprintf(what, sizeof what, "%s out vs float32 kernels", tag);
    cmp_n(what, go, fo, nr, BAND_BF16_ELEM, BAND_BF16_NORM);
    // another mask is far outside that band
    Fwd s = gpu_fwd(x, p, seed + 1, t0, t1, row0, h0);
    float *so = rows_of(s.o, B, T, W, t0, t1);
    snprintf(what, sizeof what, "%s out, seed + 1 vs float32 (another mask)", tag);
    double gap = cmp_n(what, so, fo, nr, INFINITY, 0);
    if (t1 - t0 >= 16)
        EXPECT(gap > MASK_GAP,
               "%s: another seed's output is only %.3e away (norm-wise): the mask is not seen", tag, gap);
    // lse: the undropped softmax's; and a second run gives the same bits
    void *o0 = gpu_hid_nan(gpu, x->nq);
    float *l0d = gpu_nanf(gpu, x->nl);
    gpu->attention_fwd(o0, l0d, x->qd, x->kd, x->vd, B, T, H, KV, hd, t0, t1);
    float *l0 = gpu_getf(gpu, l0d, x->nl), *l0r = lse_rows(l0, B, H, T, t0, t1);
    snprintf(what, sizeof what, "%s lse == no-dropout lse", tag);
    if (plain_is_mma(hd)) cmp_bits(what, gl, l0r, nlr);
    else cmp_n(what, gl, l0r, nlr, BAND_SUM, 0);
    Fwd g2 = gpu_fwd(x, p, seed, t0, t1, row0, h0);
    snprintf(what, sizeof what, "%s two runs", tag);
    cmp_bits(what, g.o, g2.o, x->nq);
    cmp_bits(what, g.l, g2.l, x->nl);
    gpu->free(ofd);
    gpu->free(lfd);
    gpu->free(o0);
    gpu->free(l0d);
    void *h[] = {go, gl, ro, rl, of, lf, fo, so, l0, l0r};
    for (size_t i = 0; i < sizeof h / sizeof *h; i++) free(h[i]);
    fwd_free(&g);
    fwd_free(&s);
    fwd_free(&g2);
    return r;
}

// One backward on the GPU from out/lse (host), dq added into zeros, dk/dv written over NaN (flags ATT_ADD_DQ)
// or added into zeros (ATT_ADD_DQ | ATT_ADD_DKV): host copies
typedef struct {
    float *dq, *dk, *dv;
} Bwd;
static Bwd gpu_bwd(const Backend *be, const Inputs *x, const float *o, const float *l, float p, uint64_t seed,
                   int t0, int t1, int64_t row0, int h0, int flags) {
    int f32path = be == f32;
    void *od = f32path ? (void *)gpu_putf(gpu, o, x->nq) : gpu_hid_put(gpu, o, x->nq);
    float *ld = gpu_putf(gpu, l, x->nl), *zq = hnew(x->nq), *zk = hnew(x->nk);
    float *dq = gpu_putf(gpu, zq, x->nq),
          *dk = flags & ATT_ADD_DKV ? gpu_putf(gpu, zk, x->nk) : gpu_nanf(gpu, x->nk);
    float *dv = flags & ATT_ADD_DKV ? gpu_putf(gpu, zk, x->nk) : gpu_nanf(gpu, x->nk);
    if (f32path)
        be->attention_drop_bwd(dq, dk, dv, x->gd, od, ld, x->qf, x->kf, x->vf, x->B, x->T, x->H, x->KV, x->hd,
                               t0, t1, p, seed, row0, h0, flags);
    else
        be->attention_drop_bwd(dq, dk, dv, x->gd, od, ld, x->qd, x->kd, x->vd, x->B, x->T, x->H, x->KV, x->hd,
                               t0, t1, p, seed, row0, h0, flags);
    Bwd b = {gpu_getf(gpu, dq, x->nq), gpu_getf(gpu, dk, x->nk), gpu_getf(gpu, dv, x->nk)};
    void *d[] = {od, ld, dq, dk, dv};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++) gpu->free(d[i]);
    free(zq);
    free(zk);
    return b;
}
static void bwd_free(Bwd *b) {
    free(b->dq);
    free(b->dk);
    free(b->dv);
}

static void check_bwd(const Inputs *x, const Fwd *r, float p, uint64_t seed, int t0, int t1, int64_t row0,
                      int h0, const char *tag) {
    int B = x->B, T = x->T, H = x->H, KV = x->KV, hd = x->hd;
    size_t WK = (size_t)KV * hd, nkr = (size_t)B * t1 * WK;
    char what[160];
    Bwd g = gpu_bwd(gpu, x, r->o, r->l, p, seed, t0, t1, row0, h0, ATT_ADD_DQ);
    EXPECT(written_outside(g.dk, B, T, WK, 0, t1) == 0 && written_outside(g.dv, B, T, WK, 0, t1) == 0,
           "%s: dk or dv written past row %d", tag, t1);
    Bwd e = {hnew(x->nq), hnew(x->nk), hnew(x->nk)};
    ref->attention_drop_bwd(e.dq, e.dk, e.dv, x->g, r->o, r->l, x->q, x->k, x->v, B, T, H, KV, hd, t0, t1, p,
                            seed, row0, h0, ATT_ADD_DQ);
    float *gk = rows_of(g.dk, B, T, WK, 0, t1), *gv = rows_of(g.dv, B, T, WK, 0, t1);
    float *ek = rows_of(e.dk, B, T, WK, 0, t1), *ev = rows_of(e.dv, B, T, WK, 0, t1);
    snprintf(what, sizeof what, "%s dq vs bf16_ref", tag);
    cmp_n(what, g.dq, e.dq, x->nq, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
    snprintf(what, sizeof what, "%s dk vs bf16_ref", tag);
    cmp_n(what, gk, ek, nkr, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
    snprintf(what, sizeof what, "%s dv vs bf16_ref", tag);
    cmp_n(what, gv, ev, nkr, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
    if (t1 - t0 >= 16) { // (test_cuda_ops.c: the bf16-vs-float32 band needs many keys a row)
        Bwd f = gpu_bwd(f32, x, r->o, r->l, p, seed, t0, t1, row0, h0, ATT_ADD_DQ);
        float *fk = rows_of(f.dk, B, T, WK, 0, t1), *fv = rows_of(f.dv, B, T, WK, 0, t1);
        snprintf(what, sizeof what, "%s dq vs float32 kernels", tag);
        cmp_n(what, g.dq, f.dq, x->nq, INFINITY, BAND_BF16_NORM);
        snprintf(what, sizeof what, "%s dk vs float32 kernels", tag);
        cmp_n(what, gk, fk, nkr, INFINITY, BAND_BF16_NORM);
        snprintf(what, sizeof what, "%s dv vs float32 kernels", tag);
        cmp_n(what, gv, fv, nkr, INFINITY, BAND_BF16_NORM);
        free(fk);
        free(fv);
        bwd_free(&f);
    }
    // dk/dv written == added into zeros; a second run: the same bits
    Bwd a = gpu_bwd(gpu, x, r->o, r->l, p, seed, t0, t1, row0, h0, ATT_ADD_DQ | ATT_ADD_DKV);
    float *ak = rows_of(a.dk, B, T, WK, 0, t1), *av = rows_of(a.dv, B, T, WK, 0, t1);
    snprintf(what, sizeof what, "%s dk/dv written == added into zeros", tag);
    cmp_bits(what, gk, ak, nkr);
    cmp_bits(what, gv, av, nkr);
    snprintf(what, sizeof what, "%s dq two runs", tag);
    cmp_bits(what, g.dq, a.dq, x->nq);
    free(gk);
    free(gv);
    free(ek);
    free(ev);
    free(ak);
    free(av);
    bwd_free(&g);
    bwd_free(&e);
    bwd_free(&a);
}

// The calls without dropout's bits: p = 0 (any head dim), and p P_KEEP_ALL where they are the mma.sync
// kernels
static void check_plain_bits(const Inputs *x, const Fwd *r, int t0, int t1, int64_t row0, int h0,
                             const char *tag) {
    int B = x->B, T = x->T, H = x->H, KV = x->KV, hd = x->hd;
    char what[160];
    void *od = gpu_hid_nan(gpu, x->nq);
    float *ld = gpu_nanf(gpu, x->nl);
    gpu->attention_fwd(od, ld, x->qd, x->kd, x->vd, B, T, H, KV, hd, t0, t1);
    float *po = gpu_hid_get(gpu, od, x->nq), *pl = gpu_getf(gpu, ld, x->nl);
    Bwd pb = {0};
    {
        void *oc = gpu_hid_put(gpu, r->o, x->nq);
        float *lc = gpu_putf(gpu, r->l, x->nl), *z = hnew(x->nq), *dq = gpu_putf(gpu, z, x->nq),
              *dk = gpu_nanf(gpu, x->nk), *dv = gpu_nanf(gpu, x->nk);
        gpu->attention_bwd(dq, dk, dv, x->gd, oc, lc, x->qd, x->kd, x->vd, B, T, H, KV, hd, t0, t1,
                           ATT_ADD_DQ);
        pb = (Bwd){gpu_getf(gpu, dq, x->nq), gpu_getf(gpu, dk, x->nk), gpu_getf(gpu, dv, x->nk)};
        void *d[] = {oc, lc, dq, dk, dv};
        for (size_t i = 0; i < sizeof d / sizeof *d; i++) gpu->free(d[i]);
        free(z);
    }
    for (int c = 0; c < 2; c++) {
        float p = c ? P_KEEP_ALL : 0.0f;
        if (c && !plain_is_mma(hd)) continue;
        Fwd f = gpu_fwd(x, p, 99, t0, t1, row0, h0);
        Bwd b = gpu_bwd(gpu, x, r->o, r->l, p, 99, t0, t1, row0, h0, ATT_ADD_DQ);
        snprintf(what, sizeof what, "%s p %g == without dropout (out, lse, dq, dk, dv)", tag, p);
        cmp_bits(what, f.o, po, x->nq);
        cmp_bits(what, f.l, pl, x->nl);
        cmp_bits(what, b.dq, pb.dq, x->nq);
        cmp_bits(what, b.dk, pb.dk, x->nk);
        cmp_bits(what, b.dv, pb.dv, x->nk);
        fwd_free(&f);
        bwd_free(&b);
    }
    gpu->free(od);
    gpu->free(ld);
    free(po);
    free(pl);
    bwd_free(&pb);
}

static void drop_case(int B, int T, int H, int KV, int hd, float p, int t0, int t1, int64_t row0, int h0) {
    char tag[96];
    snprintf(tag, sizeof tag, "B%d T%d [%d,%d) H%d KV%d hd%d p%g", B, T, t0, t1, H, KV, hd, p);
    printf("%s (row0 %lld, h0 %d)\n", tag, (long long)row0, h0);
    Inputs x = inputs(B, T, H, KV, hd);
    uint64_t seed = 4242 + (uint64_t)hd;
    Fwd r = check_fwd(&x, p, seed, t0, t1, row0, h0, tag);
    check_bwd(&x, &r, p, seed, t0, t1, row0, h0, tag);
    check_plain_bits(&x, &r, t0, t1, row0, h0, tag);
    fwd_free(&r);
    inputs_free(&x);
}

// The query rows in n chunks (AMPipe; model/attention.c's order): the forward over the chunks is one call's
// bits; the backward over them in reverse (dq written, dk/dv written by the first chunk and added into by the
// others) gives dq's bits of one call, dk/dv within the bands of bf16_ref.h over the same chunks.
static void chunk_case(int B, int T, int H, int KV, int hd, float p, int n, int64_t row0, int h0) {
    char tag[96], what[160];
    snprintf(tag, sizeof tag, "chunks %d: B%d T%d H%d KV%d hd%d p%g", n, B, T, H, KV, hd, p);
    printf("%s\n", tag);
    Inputs x = inputs(B, T, H, KV, hd);
    uint64_t seed = 777;
    Fwd one = gpu_fwd(&x, p, seed, 0, T, row0, h0);
    void *od = gpu_hid_nan(gpu, x.nq);
    float *ld = gpu_nanf(gpu, x.nl);
    for (int j = 0; j < n; j++)
        gpu->attention_drop_fwd(od, ld, x.qd, x.kd, x.vd, B, T, H, KV, hd, T * j / n, T * (j + 1) / n, p,
                                seed, row0, h0);
    float *co = gpu_hid_get(gpu, od, x.nq), *cl = gpu_getf(gpu, ld, x.nl);
    snprintf(what, sizeof what, "%s: forward == one call", tag);
    cmp_bits(what, co, one.o, x.nq);
    cmp_bits(what, cl, one.l, x.nl);
    // backward from the GPU's out and lse
    void *oc = gpu_hid_put(gpu, one.o, x.nq);
    float *lc = gpu_putf(gpu, one.l, x.nl), *dq1 = gpu_nanf(gpu, x.nq), *dk1 = gpu_nanf(gpu, x.nk),
          *dv1 = gpu_nanf(gpu, x.nk);
    float *dqn = gpu_nanf(gpu, x.nq), *dkn = gpu_nanf(gpu, x.nk), *dvn = gpu_nanf(gpu, x.nk);
    float *eq = hnew(x.nq), *ek = hnew(x.nk), *ev = hnew(x.nk);
    gpu->attention_drop_bwd(dq1, dk1, dv1, x.gd, oc, lc, x.qd, x.kd, x.vd, B, T, H, KV, hd, 0, T, p, seed,
                            row0, h0, 0);
    for (int j = n - 1; j >= 0; j--) {
        int t0 = T * j / n, t1 = T * (j + 1) / n, fl = j == n - 1 ? 0 : ATT_ADD_DKV;
        gpu->attention_drop_bwd(dqn, dkn, dvn, x.gd, oc, lc, x.qd, x.kd, x.vd, B, T, H, KV, hd, t0, t1, p,
                                seed, row0, h0, fl);
        ref->attention_drop_bwd(eq, ek, ev, x.g, one.o, one.l, x.q, x.k, x.v, B, T, H, KV, hd, t0, t1, p,
                                seed, row0, h0, fl);
    }
    float *a = gpu_getf(gpu, dq1, x.nq), *bq = gpu_getf(gpu, dqn, x.nq), *bk = gpu_getf(gpu, dkn, x.nk),
          *bv = gpu_getf(gpu, dvn, x.nk);
    snprintf(what, sizeof what, "%s: dq == one call", tag);
    cmp_bits(what, bq, a, x.nq);
    snprintf(what, sizeof what, "%s: dq vs bf16_ref", tag);
    cmp_n(what, bq, eq, x.nq, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
    snprintf(what, sizeof what, "%s: dk vs bf16_ref", tag);
    cmp_n(what, bk, ek, x.nk, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
    snprintf(what, sizeof what, "%s: dv vs bf16_ref", tag);
    cmp_n(what, bv, ev, x.nk, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
    void *d[] = {od, ld, oc, lc, dq1, dk1, dv1, dqn, dkn, dvn};
    for (size_t i = 0; i < sizeof d / sizeof *d; i++) gpu->free(d[i]);
    void *h[] = {co, cl, eq, ek, ev, a, bq, bk, bv};
    for (size_t i = 0; i < sizeof h / sizeof *h; i++) free(h[i]);
    fwd_free(&one);
    inputs_free(&x);
}

int main(void) {
    if (!backend_cuda_available())
        TEST_SKIP("no CUDA GPU (or a build without CUDA): backend_cuda_available() = 0");
    gpu = backend_cuda();
    f32 = backend_cuda_fp32();
    ref = backend_cpu_bf16ref();
    CHECK(gpu->hid == FMT_BF16, "backend \"cuda\" keeps the attention's operands in bf16");
    const char *s = getenv("MOE_TEST_SEED");
    rng_seed(&R, s && *s ? strtoull(s, NULL, 10) : 20261203);
    printf("wgmma attention without dropout at head dim 128: %s\n", plain_is_mma(128) ? "no" : "yes");
    drop_case(2, 130, 4, 2, 64, 0.5f, 0, 130, 1000, 2); // GQA 2; T over two 64-row blocks and a partial third
    drop_case(1, 97, 6, 2, 32, 0.2f, 33, 97, 77, 6); // t0 > 0; 3 query heads a kv head
    drop_case(2, 70, 4, 4, 128, 0.1f, 0, 70, 5000, 0); // head dim 128 (32 query rows a warp forward)
    drop_case(1, 200, 3, 1, 128, 0.3f, 100, 200, 0, 3); // one kv head; t0 > 0
    drop_case(1, 64, 2, 1, 64, 0.9f, 0, 64, 0, 0); // most keys dropped
    drop_case(1, 2, 2, 1, 32, 0.5f, 0, 2, 3, 1); // two rows
    drop_case(1, 256, 6, 6, 64, 0.2f, 0, 256, 256, 0); // nanoGPT shakespeare_char's attention (one sequence)
    chunk_case(2, 130, 4, 2, 64, 0.3f, 3, 100, 4);
    chunk_case(1, 97, 6, 2, 128, 0.2f, 4, 0, 0);
    chunk_case(1, 75, 2, 1, 32, 0.5f, 2, 9, 1);
    return test_done("test_cuda_attn_drop");
}
