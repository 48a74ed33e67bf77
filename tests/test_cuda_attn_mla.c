// test_cuda_attn_mla.c — latent attention's values on "cuda" (ops.h attention_fwd_v / attention_bwd_v):
// query/key heads 192 wide (DeepSeek-V3's 128 + 64), values 128 wide in rows padded to 192 with zeros, as
// mla.c lays them out; on an sm_90 GPU the wgmma kernels (cuda_attention_wg.cu, cuda_attention_mla.cu).
// Against bf16_ref.h's attention (the cpu, q, k, v, dout, P and dS rounded as the kernels round them, sums in
// double) and against the float32 cpu, at test_cuda_ops.c's tensor-core attention bands (the reasons
// are there; nothing here is wider):
//   BAND_ATT_TC_NORM 2e-3 norm-wise and BAND_BF16_ELEM 5e-2 per element against bf16_ref.h;
//   BAND_BF16_NORM 1e-2 norm-wise against the float32 cpu (T >= 16: the random-walk argument);
//   lse within BAND_SUM 1e-5 of bf16_ref.h's (the scores are float32 sums of the same bf16 products).
// Exact checks (no band): the padding's columns of out are zeros, of dv zeros where written and
// untouched where added into; forward rows over chunks [t0, t1) (AMPipe) the bits of one call and later
// rows unwritten; the backward's dq over chunks the bits of one call; written == added into zeros; two
// runs the same bits. The backward runs each of its ways (MOE_ATTN_MLA, set here between calls:
// cuda_attention_mla.cu): the dS scratch in one pass and in a pass per kv head and sequence, and (not under
// MOE_TEST_SMALL) dS again in the dq kernel, the default, passes of two kv heads and the old kernels; each
// against the references, and the scratch's passes the same bits as one pass (dq, dk, dv), dk and dv without
// the scratch the same bits as with it. Shapes: T not a multiple of 64, one query head per kv head (MLA) and
// 2 (GQA), one sequence and two. On an sm_90 GPU the wgmma path must be the one taken
// (backend_cuda_grouped_kernel: the same condition as the kernels'). Skips (exit 77) without a GPU or
// elsewhere. MOE_TEST_SMALL=1: small shapes only (compute-sanitizer).
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "test_util.h"
#include "gpu_util.h"
#include "bf16_ref.h"

#define HD 192 // qk_nope 128 + qk_rope 64
#define HV 128 // v_head_dim
#define BAND_SUM 1e-5
#define BAND_BF16_ELEM 5e-2
#define BAND_BF16_NORM 1e-2
#define BAND_ATT_TC_NORM 2e-3

static Rng R;
static const Backend *gpu, *ref, *f32;

// n floats N(0, 1) rounded to bf16, with the columns HV..HD-1 of every head zero where pad
static float *hrand_heads(size_t n, int pad) {
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = pad && i % HD >= HV ? 0.0f : bf16_round(rng_normal(&R));
    return x;
}
static float *hcopy(const float *x, size_t n) {
    float *y = xmalloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}
// got (host) against want: per element |got - want| / (|want| + rms(want)) <= band, norm-wise
// ||got - want|| / ||want|| <= nband (where > 0)
static double g_worst, g_worst_norm;
static void cmp(const char *what, const float *got, const float *want, size_t n, double band, double nband) {
    GpuErr r = gpu_err(got, want, n, band);
    EXPECT(r.bad == 0, "%s: %zu of %zu elements out of band %.0e; first [%zu] cuda %.9g ref %.9g", what,
           r.bad, n, band, r.first, r.bad ? got[r.first] : 0.0, r.bad ? want[r.first] : 0.0);
    if (nband > 0) EXPECT(r.norm <= nband, "%s: norm-wise %.3e > %.0e", what, r.norm, nband);
    if (band < 1 && r.worst > g_worst) g_worst = r.worst;
    if (nband > 0 && nband < BAND_BF16_NORM && r.norm > g_worst_norm) g_worst_norm = r.norm;
    printf("  %-58s worst %.2e  norm-wise %.2e\n", what, r.worst, r.norm);
}
static void same_bits(const char *what, const void *a, const void *b, size_t bytes) {
    EXPECT(memcmp(a, b, bytes) == 0, "%s: not the same bits", what);
}
// the padding's columns of rows [t0, t1) of each sequence: zeros (want_x NULL) or want_x's values
static void pad_check(const char *what, const float *x, const float *want_x, int B, int T, int heads, int t0,
                      int t1) {
    size_t bad = 0;
    for (int b = 0; b < B; b++)
        for (int t = t0; t < t1; t++)
            for (int h = 0; h < heads; h++)
                for (int c = HV; c < HD; c++) {
                    size_t i = (((size_t)b * T + t) * heads + h) * HD + c;
                    float w = want_x ? want_x[i] : 0.0f;
                    bad += memcmp(&x[i], &w, sizeof w) != 0;
                }
    EXPECT(bad == 0, "%s: %zu padding elements not as they should be", what, bad);
}

// The backward's ways (cuda_attention_mla.cu: MOE_ATTN_MLA, read at every call): the dS scratch in one pass
// and in a pass per kv head and sequence (the new kernels and the passes' offsets: every run), then dS again
// in the dq kernel, the default (the scratch within its bound, else dS again), passes of two kv heads (of 3:
// 2 and 1) and the kernels before that file (not under MOE_TEST_SMALL: the sanitizers' runs, whose time goes
// by the launch).
static const char *const WAYS[] = {"65535", "1", "recompute", "", "2", "old"};
enum { W_ONE, W_PER, W_AGAIN, W_DEFAULT, W_TWO, W_OLD, NWAYS = sizeof WAYS / sizeof WAYS[0] };
static int g_ways = NWAYS; // the ways run (W_AGAIN under MOE_TEST_SMALL)
static void set_way(const char *way) {
    if (*way) CHECK(setenv("MOE_ATTN_MLA", way, 1) == 0, "setenv MOE_ATTN_MLA");
    else CHECK(unsetenv("MOE_ATTN_MLA") == 0, "unsetenv MOE_ATTN_MLA");
}

// One shape's backward references (bf16_ref.h; written over zeros and added into pq, pk, pv), the float32
// one, and bf16_ref.h's over chunks in reverse order (dk/dv written by the first, added into by the others)
typedef struct {
    float *dq[2], *dk[2], *dv[2], *eq, *ek, *ev, *cq, *ck, *cv;
} BwdRef;

// One way's backward against the references: over all rows, written over NaN (flags 0) and added into
// pq, pk, pv (dv's padding must keep them), written == added into zeros, two runs the same bits; over the
// n chunks in reverse order as the model calls them, dq the bits of one call. out: the written dq, dk, dv.
static void bwd_way(const char *way, const BwdRef *r, float **out, int B, int T, int H, int KV, int n,
                    const float *pq, const float *pk, const float *pv, const float *gd, const void *oc,
                    const float *lc, const void *qd, const void *kd, const void *vd) {
    size_t nq = (size_t)B * T * H * HD, nk = (size_t)B * T * KV * HD;
    char what[160], sh[96];
    snprintf(sh, sizeof sh, "B%d T%d H%d KV%d, MOE_ATTN_MLA=%s", B, T, H, KV, *way ? way : "(unset)");
    set_way(way);
    for (int p = 0; p < 2; p++) {
        int fl = p ? ATT_ADD_DQ | ATT_ADD_DKV : 0;
        float *dqd = p ? gpu_putf(gpu, pq, nq) : gpu_nanf(gpu, nq),
              *dkd = p ? gpu_putf(gpu, pk, nk) : gpu_nanf(gpu, nk),
              *dvd = p ? gpu_putf(gpu, pv, nk) : gpu_nanf(gpu, nk);
        gpu->attention_bwd_v(dqd, dkd, dvd, gd, oc, lc, qd, kd, vd, B, T, H, KV, HD, HV, 0, T, fl);
        float *hq = gpu_getf(gpu, dqd, nq), *hk = gpu_getf(gpu, dkd, nk), *hv = gpu_getf(gpu, dvd, nk);
        const char *how = p ? "added" : "written";
        snprintf(what, sizeof what, "bwd dq (%s) vs bf16 ref %s", how, sh);
        cmp(what, hq, r->dq[p], nq, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
        snprintf(what, sizeof what, "bwd dk (%s) vs bf16 ref %s", how, sh);
        cmp(what, hk, r->dk[p], nk, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
        snprintf(what, sizeof what, "bwd dv (%s) vs bf16 ref %s", how, sh);
        cmp(what, hv, r->dv[p], nk, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
        pad_check(p ? "bwd dv's padding (added: kept)" : "bwd dv's padding (written)", hv, p ? pv : NULL, B,
                  T, KV, 0, T);
        if (!p && r->eq) { // against the float32 backward from the float32 forward
            snprintf(what, sizeof what, "bwd dq/dk/dv vs float32 %s", sh);
            cmp(what, hq, r->eq, nq, INFINITY, BAND_BF16_NORM);
            cmp(what, hk, r->ek, nk, INFINITY, BAND_BF16_NORM);
            cmp(what, hv, r->ev, nk, INFINITY, BAND_BF16_NORM);
        }
        if (!p) { // written == added into zeros; a second run the same bits
            float *z[3] = {gpu_putf(gpu, hq, nq), gpu_putf(gpu, hk, nk), gpu_putf(gpu, hv, nk)};
            gpu->zero(z[0], nq * sizeof(float));
            gpu->zero(z[1], nk * sizeof(float));
            gpu->zero(z[2], nk * sizeof(float));
            gpu->attention_bwd_v(z[0], z[1], z[2], gd, oc, lc, qd, kd, vd, B, T, H, KV, HD, HV, 0, T,
                                 ATT_ADD_DQ | ATT_ADD_DKV);
            float *zq = gpu_getf(gpu, z[0], nq), *zk = gpu_getf(gpu, z[1], nk), *zv = gpu_getf(gpu, z[2], nk);
            same_bits("bwd dq written == added into zeros", zq, hq, nq * sizeof(float));
            same_bits("bwd dk written == added into zeros", zk, hk, nk * sizeof(float));
            same_bits("bwd dv written == added into zeros", zv, hv, nk * sizeof(float));
            gpu->attention_bwd_v(z[0], z[1], z[2], gd, oc, lc, qd, kd, vd, B, T, H, KV, HD, HV, 0, T, 0);
            float *rq = gpu_getf(gpu, z[0], nq), *rk = gpu_getf(gpu, z[1], nk), *rv = gpu_getf(gpu, z[2], nk);
            same_bits("bwd dq: two runs", rq, hq, nq * sizeof(float));
            same_bits("bwd dk: two runs", rk, hk, nk * sizeof(float));
            same_bits("bwd dv: two runs", rv, hv, nk * sizeof(float));
            float *fr[] = {zq, zk, zv, rq, rk, rv};
            for (int i = 0; i < 6; i++) free(fr[i]);
            for (int i = 0; i < 3; i++) gpu->free(z[i]);
            out[0] = hq;
            out[1] = hk;
            out[2] = hv;
        } else {
            free(hq);
            free(hk);
            free(hv);
        }
        gpu->free(dqd);
        gpu->free(dkd);
        gpu->free(dvd);
    }
    float *dqn = gpu_nanf(gpu, nq), *dkn = gpu_nanf(gpu, nk), *dvn = gpu_nanf(gpu, nk);
    for (int j = n - 1, first = 1; j >= 0; j--) {
        int t0 = T * j / n, t1 = T * (j + 1) / n, fl = first ? 0 : ATT_ADD_DKV;
        if (t0 == t1) continue;
        first = 0;
        gpu->attention_bwd_v(dqn, dkn, dvn, gd, oc, lc, qd, kd, vd, B, T, H, KV, HD, HV, t0, t1, fl);
    }
    float *hq = gpu_getf(gpu, dqn, nq), *hk = gpu_getf(gpu, dkn, nk), *hv = gpu_getf(gpu, dvn, nk);
    snprintf(what, sizeof what, "bwd over %d chunks == one call (dq) %s", n, sh);
    same_bits(what, hq, out[0], nq * sizeof(float));
    snprintf(what, sizeof what, "bwd dk over %d chunks vs bf16 ref %s", n, sh);
    cmp(what, hk, r->ck, nk, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
    snprintf(what, sizeof what, "bwd dv over %d chunks vs bf16 ref %s", n, sh);
    cmp(what, hv, r->cv, nk, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
    pad_check("bwd dv's padding over chunks", hv, NULL, B, T, KV, 0, T);
    free(hq);
    free(hk);
    free(hv);
    gpu->free(dqn);
    gpu->free(dkn);
    gpu->free(dvn);
    set_way("");
}

// One shape: forward over all rows against the references, then over n chunks; the backward's references
// once, then each way against them, and the ways that must agree bit for bit: the scratch in one pass and
// in a pass per kv head (the same dS, dq summed in the same order), and dk, dv with the scratch or without
// (the same kernel; the scratch is written beside them).
static void test_shape(int B, int T, int H, int KV, int n) {
    size_t nq = (size_t)B * T * H * HD, nk = (size_t)B * T * KV * HD, nl = (size_t)B * H * T;
    char what[160], sh[64];
    snprintf(sh, sizeof sh, "B%d T%d H%d KV%d", B, T, H, KV);
    printf("%s (qk %d, v %d)\n", sh, HD, HV);
    float *q = hrand_heads(nq, 0), *k = hrand_heads(nk, 0), *v = hrand_heads(nk, 1), *g = hrand_heads(nq, 1);
    void *qd = gpu_hid_put(gpu, q, nq), *kd = gpu_hid_put(gpu, k, nk), *vd = gpu_hid_put(gpu, v, nk);
    float *gd = gpu_putf(gpu, g, nq);
    // forward: against bf16_ref.h and the float32 cpu; the padding zeros; lse
    float *o = xmalloc(nq * sizeof(float)), *l = xmalloc(nl * sizeof(float));
    float *o32 = xmalloc(nq * sizeof(float)), *l32 = xmalloc(nl * sizeof(float));
    ref->attention_fwd_v(o, l, q, k, v, B, T, H, KV, HD, HV, 0, T);
    f32->attention_fwd(o32, l32, q, k, v, B, T, H, KV, HD, 0, T);
    void *od = gpu_hid_nan(gpu, nq);
    float *ld = gpu_nanf(gpu, nl);
    gpu->attention_fwd_v(od, ld, qd, kd, vd, B, T, H, KV, HD, HV, 0, T);
    float *oh = gpu_hid_get(gpu, od, nq), *lh = gpu_getf(gpu, ld, nl);
    snprintf(what, sizeof what, "fwd out vs bf16 ref %s", sh);
    cmp(what, oh, o, nq, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
    snprintf(what, sizeof what, "fwd lse vs bf16 ref %s", sh);
    cmp(what, lh, l, nl, BAND_SUM, 0);
    snprintf(what, sizeof what, "fwd out vs float32 %s", sh);
    cmp(what, oh, o32, nq, BAND_BF16_ELEM, BAND_BF16_NORM);
    pad_check("fwd out's padding", oh, NULL, B, T, H, 0, T);
    // the forward over chunks of query rows (AMPipe): the bits of one call, later rows unwritten
    void *on = gpu_hid_nan(gpu, nq);
    float *ln = gpu_nanf(gpu, nl);
    for (int j = 0; j < n; j++) {
        int t0 = T * j / n, t1 = T * (j + 1) / n;
        if (t0 == t1) continue;
        gpu->attention_fwd_v(on, ln, qd, kd, vd, B, T, H, KV, HD, HV, t0, t1);
        if (j + 1 < n) {
            float *x = gpu_hid_get(gpu, on, nq), *y = gpu_getf(gpu, ln, nl);
            int bad = 0;
            for (int b = 0; b < B; b++)
                for (int t = t1; t < T; t++)
                    for (int h = 0; h < H; h++)
                        bad += !isnan(x[(((size_t)b * T + t) * H + h) * HD]) +
                            !isnan(x[(((size_t)b * T + t) * H + h) * HD + HV]) +
                            !isnan(y[((size_t)b * H + h) * T + t]);
            EXPECT(bad == 0, "fwd rows [%d, %d) of T %d: %d later values written", t0, t1, T, bad);
            free(x);
            free(y);
        }
    }
    float *xn = gpu_hid_get(gpu, on, nq), *yn = gpu_getf(gpu, ln, nl);
    snprintf(what, sizeof what, "fwd over %d chunks == one call (out) %s", n, sh);
    same_bits(what, xn, oh, nq * sizeof(float));
    snprintf(what, sizeof what, "fwd over %d chunks == one call (lse) %s", n, sh);
    same_bits(what, yn, lh, nl * sizeof(float));
    // the backward from the cpu's out (rounded, as stored) and lse: the references, then each way
    void *oc = gpu_hid_put(gpu, o, nq);
    float *lc = gpu_putf(gpu, l, nl);
    float *pq = hrand_heads(nq, 0), *pk = hrand_heads(nk, 0), *pv = hrand_heads(nk, 0);
    BwdRef r;
    memset(&r, 0, sizeof r);
    for (int p = 0; p < 2; p++) {
        r.dq[p] = p ? hcopy(pq, nq) : xcalloc(nq, sizeof(float));
        r.dk[p] = p ? hcopy(pk, nk) : xcalloc(nk, sizeof(float));
        r.dv[p] = p ? hcopy(pv, nk) : xcalloc(nk, sizeof(float));
        ref->attention_bwd_v(r.dq[p], r.dk[p], r.dv[p], g, o, l, q, k, v, B, T, H, KV, HD, HV, 0, T,
                             p ? ATT_ADD_DQ | ATT_ADD_DKV : 0);
    }
    if (T >= 16) { // the float32 backward from the float32 forward
        r.eq = xcalloc(nq, sizeof(float));
        r.ek = xcalloc(nk, sizeof(float));
        r.ev = xcalloc(nk, sizeof(float));
        f32->attention_bwd(r.eq, r.ek, r.ev, g, o32, l32, q, k, v, B, T, H, KV, HD, 0, T, 0);
    }
    r.cq = xcalloc(nq, sizeof(float));
    r.ck = xcalloc(nk, sizeof(float));
    r.cv = xcalloc(nk, sizeof(float));
    for (int j = n - 1, first = 1; j >= 0; j--) {
        int t0 = T * j / n, t1 = T * (j + 1) / n;
        if (t0 == t1) continue;
        ref->attention_bwd_v(r.cq, r.ck, r.cv, g, o, l, q, k, v, B, T, H, KV, HD, HV, t0, t1,
                             first ? 0 : ATT_ADD_DKV);
        first = 0;
    }
    float *got[NWAYS][3];
    for (int i = 0; i < g_ways; i++)
        bwd_way(WAYS[i], &r, got[i], B, T, H, KV, n, pq, pk, pv, gd, oc, lc, qd, kd, vd);
    for (int i = W_PER; i < g_ways; i += W_TWO - W_PER) // (W_PER, then W_TWO where it ran)
        for (int c = 0; c < 3; c++) {
            snprintf(what, sizeof what, "%s: %s, the scratch in passes of %s kv head(s) == in one pass", sh,
                     c ? c == 1 ? "dk" : "dv" : "dq", WAYS[i]);
            same_bits(what, got[i][c], got[W_ONE][c], (c ? nk : nq) * sizeof(float));
        }
    snprintf(what, sizeof what, "%s: dk, dv, dS again == with the scratch", sh);
    if (g_ways > W_AGAIN) {
        same_bits(what, got[W_AGAIN][1], got[W_ONE][1], nk * sizeof(float));
        same_bits(what, got[W_AGAIN][2], got[W_ONE][2], nk * sizeof(float));
    }
    // (said, not checked: whether the default way gives the old kernels' bits, i.e. whether a training run's
    // losses move with it)
    if (g_ways > W_OLD)
        printf("  %s: the default way and the old kernels the same bits: dq %s, dk %s, dv %s\n", sh,
               memcmp(got[W_DEFAULT][0], got[W_OLD][0], nq * sizeof(float)) ? "no" : "yes",
               memcmp(got[W_DEFAULT][1], got[W_OLD][1], nk * sizeof(float)) ? "no" : "yes",
               memcmp(got[W_DEFAULT][2], got[W_OLD][2], nk * sizeof(float)) ? "no" : "yes");
    for (int i = 0; i < g_ways; i++)
        for (int c = 0; c < 3; c++) free(got[i][c]);
    float *fr[] = {q,       k,       v,       g,    o,    l,    o32,     l32,     oh,
                   lh,      xn,      yn,      pq,   pk,   pv,   r.dq[0], r.dk[0], r.dv[0],
                   r.dq[1], r.dk[1], r.dv[1], r.eq, r.ek, r.ev, r.cq,    r.ck,    r.cv};
    for (size_t i = 0; i < sizeof fr / sizeof fr[0]; i++) free(fr[i]);
    void *dev[] = {qd, kd, vd, gd, od, ld, oc, lc, on, ln};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) gpu->free(dev[i]);
}

// The forward alone over query rows [t0, t1) (the edges of cuda_attention_wgf.cu's 128-row blocks and
// 128-key tiles, as test_cuda_ops.c's head-dim-128 cases): against bf16_ref.h and (T >= 16) the float32 cpu,
// lse, the padding's columns zeros, rows outside [t0, t1) unwritten, two runs the same bits.
static void test_fwd_rows(int B, int T, int H, int KV, int t0, int t1) {
    size_t nq = (size_t)B * T * H * HD, nk = (size_t)B * T * KV * HD, nl = (size_t)B * H * T;
    char what[160], sh[80];
    snprintf(sh, sizeof sh, "B%d T%d H%d KV%d rows [%d, %d)", B, T, H, KV, t0, t1);
    printf("%s (qk %d, v %d), forward\n", sh, HD, HV);
    float *q = hrand_heads(nq, 0), *k = hrand_heads(nk, 0), *v = hrand_heads(nk, 1);
    void *qd = gpu_hid_put(gpu, q, nq), *kd = gpu_hid_put(gpu, k, nk), *vd = gpu_hid_put(gpu, v, nk);
    float *o = xmalloc(nq * sizeof(float)), *l = xmalloc(nl * sizeof(float));
    float *o32 = xmalloc(nq * sizeof(float)), *l32 = xmalloc(nl * sizeof(float));
    ref->attention_fwd_v(o, l, q, k, v, B, T, H, KV, HD, HV, t0, t1);
    f32->attention_fwd(o32, l32, q, k, v, B, T, H, KV, HD, t0, t1);
    void *od = gpu_hid_nan(gpu, nq), *od2 = gpu_hid_nan(gpu, nq);
    float *ld = gpu_nanf(gpu, nl), *ld2 = gpu_nanf(gpu, nl);
    gpu->attention_fwd_v(od, ld, qd, kd, vd, B, T, H, KV, HD, HV, t0, t1);
    gpu->attention_fwd_v(od2, ld2, qd, kd, vd, B, T, H, KV, HD, HV, t0, t1);
    float *oh = gpu_hid_get(gpu, od, nq), *lh = gpu_getf(gpu, ld, nl), *oh2 = gpu_hid_get(gpu, od2, nq),
          *lh2 = gpu_getf(gpu, ld2, nl);
    size_t outside = 0, ro = (size_t)B * (t1 - t0) * H * HD, rl = (size_t)B * H * (t1 - t0), i = 0, j = 0;
    float *og = xmalloc(ro * sizeof(float)), *orf = xmalloc(ro * sizeof(float)),
          *o3 = xmalloc(ro * sizeof(float)), *lg = xmalloc(rl * sizeof(float)),
          *lrf = xmalloc(rl * sizeof(float));
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++) {
                size_t r = (((size_t)b * T + t) * H + h) * HD, rs = ((size_t)b * H + h) * T + t;
                if (t < t0 || t >= t1) {
                    outside += !isnan(oh[r]) + !isnan(oh[r + HV]) + !isnan(lh[rs]);
                    continue;
                }
                memcpy(og + i, oh + r, HD * sizeof(float));
                memcpy(orf + i, o + r, HD * sizeof(float));
                memcpy(o3 + i, o32 + r, HD * sizeof(float));
                i += HD;
                lg[j] = lh[rs];
                lrf[j++] = l[rs];
            }
    EXPECT(outside == 0, "fwd %s: %zu values outside the rows written", sh, outside);
    snprintf(what, sizeof what, "fwd out vs bf16 ref %s", sh);
    cmp(what, og, orf, ro, BAND_BF16_ELEM, BAND_ATT_TC_NORM);
    snprintf(what, sizeof what, "fwd lse vs bf16 ref %s", sh);
    cmp(what, lg, lrf, rl, BAND_SUM, 0);
    if (T >= 16) {
        snprintf(what, sizeof what, "fwd out vs float32 %s", sh);
        cmp(what, og, o3, ro, BAND_BF16_ELEM, BAND_BF16_NORM);
    }
    snprintf(what, sizeof what, "fwd out's padding %s", sh);
    pad_check(what, oh, NULL, B, T, H, t0, t1);
    snprintf(what, sizeof what, "fwd %s: two runs (out)", sh);
    same_bits(what, oh2, oh, nq * sizeof(float));
    snprintf(what, sizeof what, "fwd %s: two runs (lse)", sh);
    same_bits(what, lh2, lh, nl * sizeof(float));
    float *fr[] = {q, k, v, o, l, o32, l32, oh, lh, oh2, lh2, og, orf, o3, lg, lrf};
    for (size_t n = 0; n < sizeof fr / sizeof fr[0]; n++) free(fr[n]);
    void *dev[] = {qd, kd, vd, od, od2, ld, ld2};
    for (size_t n = 0; n < sizeof dev / sizeof dev[0]; n++) gpu->free(dev[n]);
}

// compute capability x10 of the current device (0 if unknown)

int main(void) {
    if (!backend_cuda_available())
        TEST_SKIP("no CUDA GPU (or a build without CUDA): backend_cuda_available() = 0");
    rng_seed(&R, 20261203);
    int big = !gpu_test_small();
    g_ways = big ? NWAYS : W_AGAIN;
    gpu = backend_cuda();
    ref = backend_cpu_bf16ref();
    f32 = backend_cpu();
    CHECK(gpu->attention_fwd_v && gpu->attention_bwd_v && ref->attention_fwd_v,
          "test_cuda_attn_mla: backend \"cuda\" without attention_fwd_v/bwd_v");
    int kern = backend_cuda_grouped_kernel(), cc = cuda_device_cc();
    const char *fo = getenv("MOE_ATTN_FWD_OLD");
    printf("latent attention on \"cuda\": %s (device compute capability %d.%d); the forward on %s\n",
           kern ? "the wgmma kernels (cuda_attention_wg.cu, _wgf.cu, _mla.cu)"
                : "the fallback (float32 kernels)",
           cc / 10, cc % 10,
           fo && !strcmp(fo, "1") ? "64-key tiles (MOE_ATTN_FWD_OLD=1)"
                                  : "128-key tiles (cuda_attention_wgf.cu)");
    if (cc == 90) EXPECT(kern, "sm_90 device but the wgmma kernels do not run");
    if (!kern) { // (elsewhere attention_fwd_v calls attention_fwd: the float32 kernels, test_cuda_ops's)
        if (t_failures) return test_done("test_cuda_attn_mla");
        TEST_SKIP("not an sm_90 GPU with sm_90a code: the wgmma kernels do not run here");
    }
    test_shape(1, 97, 3, 3, 3); // MLA (a kv head per query head), T past one 64-row tile, 3 chunks
    test_shape(2, 130, 4, 2, 2); // two query heads per kv head, two sequences, T over two tiles
    test_shape(1, 2, 2, 2, 2); // two rows (the first one's dq is 0)
    if (big) test_shape(1, 300, 4, 4, 4); // several key tiles per block and chunks not on tile edges
    if (big) test_shape(2, 257, 2, 1, 3);
    // the forward at the edges of the 128-key kernel's tiles (cuda_attention_wgf.cu; with MOE_ATTN_FWD_OLD=1
    // the 64-key one's): one row; T at the 64- and 128-key tiles' edges (the last tile partial or whole, the
    // rows past T of a block's Q zero-filled); B 3; KV 1 (every query head on one K/V head) and KV = H
    test_fwd_rows(1, 1, 2, 1, 0, 1);
    test_fwd_rows(1, 63, 2, 2, 0, 63);
    test_fwd_rows(3, 64, 2, 1, 0, 64);
    test_fwd_rows(1, 65, 4, 4, 0, 65);
    test_fwd_rows(2, 127, 2, 1, 0, 127);
    test_fwd_rows(1, 128, 4, 2, 0, 128);
    test_fwd_rows(3, 129, 2, 2, 0, 129);
    // row ranges: t0 % 128 = 64 (the first consumer warpgroup's last tile is past all its rows, masked
    // whole), off every block (t0 333), one row (decode), and a longer sequence (17 tiles, the last of one
    // key)
    test_fwd_rows(2, 300, 4, 2, 64, 300);
    test_fwd_rows(1, 1000, 4, 1, 333, 666);
    test_fwd_rows(1, 200, 2, 2, 199, 200);
    if (big) test_fwd_rows(1, 2049, 2, 1, 0, 2049);
    printf("worst per element %.2e (band %.0e), worst norm-wise vs bf16 ref %.2e (band %.0e)\n", g_worst,
           BAND_BF16_ELEM, g_worst_norm, BAND_ATT_TC_NORM);
    return test_done("test_cuda_attn_mla");
}
