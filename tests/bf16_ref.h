// bf16_ref.h — for the GPU tests: a cpu Backend whose GEMMs compute what the "cuda" backend's
// tensor-core GEMMs compute, so that the two can be compared with float32 bands. The cuda backend
// rounds each float32 operand to bf16 (round to nearest even) and multiplies with fp32
// accumulation; a product of two bf16 values is exact in float32, so its result is the float32
// GEMM of the rounded operands up to the order of the sums. This backend rounds the same operands
// on the host and calls the cpu (CBLAS) GEMM. It follows the same policy (ops.h): every grouped
// GEMM, and a matmul only when O > MOE_GEMM_FP32_MAX_O; every other op is the cpu's.
// Must not hold: tests (those are in test_cuda_ops.c / test_cuda_model.c).
#pragma once
#include <math.h>
#include <stdint.h>
#include <string.h>
#include "core/common.h"
#include "ops/ops.h"
#include "ops/plain.h"
#include "ops/cpu/cpu_ops.h"

// float32 -> bf16 (round to nearest even; NaN stays NaN, overflow goes to inf) -> float32
static inline float bf16_round(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0x7f800000u) {
        if (u & 0x7fffffu) u |= 0x00400000u; // quiet NaN
    } else {
        u += 0x7fffu + ((u >> 16) & 1u);
    }
    u &= 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

// x[0..n) rounded in place (a float array of bf16 values after)
static inline void bf16_round_n(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}

static inline float *bf16_copy(const float *x, size_t n) {
    float *y = xmalloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) y[i] = bf16_round(x[i]);
    return y;
}

static void bfr_matmul_fwd(float *out, const float *inp, const float *w, int N, int K, int O,
                           int accumulate) {
    const Backend *c = backend_cpu();
    if (N <= 0 || K <= 0 || O <= MOE_GEMM_FP32_MAX_O) {
        c->matmul_fwd(out, inp, w, N, K, O, accumulate);
        return;
    }
    float *xr = bf16_copy(inp, (size_t)N * K), *wr = bf16_copy(w, (size_t)O * K);
    c->matmul_fwd(out, xr, wr, N, K, O, accumulate);
    free(xr);
    free(wr);
}

static void bfr_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N,
                           int K, int O, int flags) {
    const Backend *c = backend_cpu();
    if (N <= 0 || K <= 0 || O <= MOE_GEMM_FP32_MAX_O) {
        c->matmul_bwd(dinp, dw, dout, inp, w, N, K, O, flags);
        return;
    }
    float *gr = bf16_copy(dout, (size_t)N * O), *wr = bf16_copy(w, (size_t)O * K),
          *xr = bf16_copy(inp, (size_t)N * K);
    c->matmul_bwd(dinp, dw, gr, xr, wr, N, K, O, flags);
    free(gr);
    free(wr);
    free(xr);
}

static void bfr_grouped_fwd(float *out, const float *inp, const float *w, const int64_t *off, int G, int K,
                            int O) {
    size_t rows = G > 0 ? (size_t)off[G] : 0;
    float *xr = bf16_copy(inp, rows * K), *wr = bf16_copy(w, (size_t)G * O * K);
    backend_cpu()->grouped_matmul_fwd(out, xr, wr, off, G, K, O);
    free(xr);
    free(wr);
}

static void bfr_grouped_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                            const int64_t *off, int G, int K, int O, int flags) {
    size_t rows = G > 0 ? (size_t)off[G] : 0;
    float *gr = bf16_copy(dout, rows * O), *xr = bf16_copy(inp, rows * K),
          *wr = bf16_copy(w, (size_t)G * O * K);
    backend_cpu()->grouped_matmul_bwd(dinp, dw, gr, xr, wr, off, G, K, O, flags);
    free(gr);
    free(xr);
    free(wr);
}

static const Backend *backend_cpu_bf16ref(void);
// The experts' hidden rows as "cuda" keeps them (bf16, ops.h Backend.hid): each value rounded once from
// the float32 the composition computes; here they stay float arrays holding bf16 values.
static inline void bf16_round_rows(float *x, const int64_t *off, int G, int C) {
    if (G > 0) bf16_round_n(x + (size_t)off[0] * C, (size_t)(off[G] - off[0]) * C);
}

static void bfr_grouped_swiglu_fwd(void *h1, void *h3, void *act, const void *inp, const float *w1,
                                   const float *w3, const int64_t *off, int G, int K, int O) {
    backend_grouped_swiglu_fwd_plain(backend_cpu_bf16ref(), h1, h3, act, inp, w1, w3, off, G, K, O);
    bf16_round_rows(h1, off, G, O);
    bf16_round_rows(h3, off, G, O);
    bf16_round_rows(act, off, G, O);
}

static void bfr_grouped_down_fwd(float *out, const void *act, const float *w, const int64_t *off, int G,
                                 int K, int O) {
    backend_grouped_down_fwd_plain(backend_cpu_bf16ref(), out, act, w, off, G, K, O);
}

static void bfr_grouped_swiglu_bwd(void *dh1, void *dh3, float *dw, const void *dout, const void *act,
                                   const void *h1, const void *h3, const float *w, const int64_t *off, int G,
                                   int K, int O, int flags) {
    backend_grouped_swiglu_bwd_plain(backend_cpu_bf16ref(), dh1, dh3, dw, dout, act, h1, h3, w, off, G, K, O,
                                     flags);
    bf16_round_rows(dh1, off, G, K);
    bf16_round_rows(dh3, off, G, K);
}

static void bfr_grouped_bwd2(float *dinp, float *dwa, float *dwb, const void *da, const void *db,
                             const void *inp, const float *wa, const float *wb, const int64_t *off, int G,
                             int K, int O, int flags) {
    backend_grouped_matmul_bwd2_plain(backend_cpu_bf16ref(), dinp, dwa, dwb, da, db, inp, wa, wb, off, G, K,
                                      O, flags);
}

// The rows sent to the experts as "cuda" writes them: bf16 values (rounded from float32 once; rows of
// the hidden format copied as they are).
static void bfr_gather_rows_hid(void *out, const void *inp, int from_hid, const int32_t *idx, int n, int C) {
    backend_cpu()->gather_rows(out, inp, idx, n, C);
    if (!from_hid) bf16_round_n(out, (size_t)n * C);
}
static void bfr_rmsnorm_fwd_hid(void *out, float *rstd, const float *inp, const float *w, int N, int C,
                                float eps) {
    backend_cpu()->rmsnorm_fwd(out, rstd, inp, w, N, C, eps);
    bf16_round_n(out, (size_t)N * C);
}
// the attention's q, k, v: RoPE's values (v's as they are) rounded once, kept as float arrays of bf16 values
// (from_hid: inp holds such values already)
static void bfr_rope_fwd_hid(void *out, const void *inp, int from_hid, int B, int T, int nh, int hd,
                             float theta) {
    backend_cpu()->rope_fwd_hid(out, inp, from_hid, B, T, nh, hd, theta);
    bf16_round_n(out, (size_t)B * T * nh * hd);
}
static void bfr_to_hid(void *out, const float *inp, size_t n) {
    memmove(out, inp, n * sizeof(float));
    bf16_round_n(out, n);
}
// gqa's dq, dk, dv for the q, k, v products (ops.h rope_bwd_hid, to_hid_rows): rounded in place, as floats
static void bfr_rope_bwd_hid(float *dx, int B, int T, int nh, int hd, float theta) {
    backend_cpu()->rope_bwd(dx, B, T, nh, hd, theta);
    bf16_round_n(dx, (size_t)B * T * nh * hd);
}
static void bfr_to_hid_rows(float *x, int N, int C) { bf16_round_n(x, (size_t)N * C); }
// latent attention's head blocks: the cpu's copy, each value written into the hidden format rounded once
static void bfr_copy_strided(void *dst, int dh, const void *src, int sh, Stride3 s, float a, int acc) {
    backend_cpu()->copy_strided(dst, dh, src, sh, s, a, acc);
    if (dh)
        for (int i = 0; i < s.n0; i++)
            for (int j = 0; j < s.n1; j++) bf16_round_n((float *)dst + i * s.d0 + j * s.d1, (size_t)s.cols);
}
static void bfr_gather_dot_scale(void *out, float *dot, const float *inp, const int32_t *idx, const float *b,
                                 const float *scale, int n, int C, int hid) {
    backend_cpu()->gather_dot_scale(out, dot, inp, idx, b, scale, n, C, 0);
    if (hid) bf16_round_n(out, (size_t)n * C);
}

// Attention as the tensor-core kernels of the cuda backend compute it (head dims 32, 64, 128;
// cuda_attention_tc.cu): q, k, v and dout rounded to bf16; scores, softmax, log-sum-exp and sums
// in float32 (double here); the second products take P (forward: exp(s - max), normalised after
// the sum; backward: exp(s - lse)) and dS rounded to bf16. The forward kernels round P against the running
// max of the key tiles seen so far (tiles from key 0; 64 keys, 128 at head dim 128 and latent attention's 192
// / 128 without dropout on Hopper: cuda_attention_wgf.cu, unless MOE_ATTN_FWD_OLD=1) and rescale the sums
// when it moves: so here P = bf16(exp(s - m_j)) exp(m_j - m), m_j the running max after u's tile (the
// rescales in double). Latent attention's
// values (attention_fwd_v, hv < hd): the same where the cuda backend's wgmma kernels take the widths (192 /
// 128). With dropout (attention_drop_fwd/bwd, ops.h; BfrDrop) as those kernels order it: the normaliser and
// lse sum every p, the dropped P are zeroed before the P V product (the kept ones rounded as without dropout)
// and the output is scaled by 1/(1-p) after; backward dS = P (Z dP - D) rounded, Z = 0 or 1/(1-p), and dV
// summed over the kept rounded P and scaled by 1/(1-p) after. Other head dims: the cpu's ops.
static inline int bfr_att_tc(int hd) { return hd == 32 || hd == 64 || hd == 128; }
static inline int bfr_att_tc_v(int hd, int hv) { return hv == hd ? bfr_att_tc(hd) : hd == 192 && hv == 128; }
typedef struct {
    float p; // 0: no dropout
    uint64_t seed;
    int64_t row0;
    int h0;
} BfrDrop;
// 1 if key u of query row t of sequence b, head h is kept (ops.h attention_drop_fwd's mask)
static inline int bfr_kept(const BfrDrop *d, int b, int T, int t, int h, int u) {
    if (!(d->p > 0)) return 1;
    uint64_t hs = dropout_hash(d->seed, -1 - (int64_t)(d->h0 + h), 0);
    return dropout_keep(hs, d->row0 + (int64_t)b * T + t, u, dropout_threshold(d->p));
}
static inline double bfr_drop_sc(const BfrDrop *d) { return d->p > 0 ? 1.0f / (1.0f - d->p) : 1.0; }
static inline double bfr_dot(const float *a, const float *b, int n) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}
// out: each value rounded once, as the GPU stores it (its hidden format; float arrays of bf16 values here)
static void bfr_round_rows(float *out, int B, int T, int H, int hd, int t0, int t1) {
    for (int b = 0; b < B; b++) bf16_round_n(out + ((size_t)b * T + t0) * H * hd, (size_t)(t1 - t0) * H * hd);
}
static void bfr_att_fwd(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                        int H, int KV, int hd, int t0, int t1, const BfrDrop *dr, int tc) {
    if (!tc) {
        if (dr->p > 0)
            backend_cpu()->attention_drop_fwd(out, lse, q, k, v, B, T, H, KV, hd, t0, t1, dr->p, dr->seed,
                                              dr->row0, dr->h0);
        else backend_cpu()->attention_fwd(out, lse, q, k, v, B, T, H, KV, hd, t0, t1);
        return;
    }
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
    float *qr = bf16_copy(q, nq), *kr = bf16_copy(k, nk), *vr = bf16_copy(v, nk);
    double *s = xmalloc(sizeof(double) * T), *acc = xmalloc(sizeof(double) * hd), sc = 1.0 / sqrt((double)hd);
    double zs = bfr_drop_sc(dr);
    const char *old = getenv("MOE_ATTN_FWD_OLD");
    // the kernels' key tiles (hd 192 here: latent attention's values, hv 128; no dropout there)
    int ts = (hd == 128 || hd == 192) && !(dr->p > 0) && !(old && !strcmp(old, "1")) ? 128 : 64;
    double *mj = xmalloc(sizeof(double) * T); // the running max after each key's tile
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = t0; t < t1; t++) {
                const float *qt = qr + (((size_t)b * T + t) * H + h) * hd;
                double m = -INFINITY, l = 0;
                for (int u = 0; u <= t; u++) {
                    s[u] = bfr_dot(qt, kr + (((size_t)b * T + u) * KV + h / (H / KV)) * hd, hd) * sc;
                    if (s[u] > m) m = s[u];
                    if (u == t || u % ts == ts - 1)
                        for (int w = u - u % ts; w <= u; w++) mj[w] = m;
                }
                for (int i = 0; i < hd; i++) acc[i] = 0;
                for (int u = 0; u <= t; u++) {
                    double e = exp(s[u] - m);
                    l += e;
                    if (!bfr_kept(dr, b, T, t, h, u)) continue;
                    double pb = bf16_round((float)exp(s[u] - mj[u])) * exp(mj[u] - m);
                    const float *vu = vr + (((size_t)b * T + u) * KV + h / (H / KV)) * hd;
                    for (int i = 0; i < hd; i++) acc[i] += pb * vu[i];
                }
                for (int i = 0; i < hd; i++)
                    out[(((size_t)b * T + t) * H + h) * hd + i] = (float)(acc[i] * zs / l);
                lse[((size_t)b * H + h) * T + t] = (float)(m + log(l));
            }
    free(s);
    free(mj);
    free(acc);
    free(qr);
    free(kr);
    free(vr);
}
static void bfr_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                              int T, int H, int KV, int hd, int t0, int t1) {
    BfrDrop none = {0, 0, 0, 0};
    bfr_att_fwd(out, lse, q, k, v, B, T, H, KV, hd, t0, t1, &none, bfr_att_tc(hd));
    bfr_round_rows(out, B, T, H, hd, t0, t1);
}
static void bfr_attention_drop_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                                   int T, int H, int KV, int hd, int t0, int t1, float p, uint64_t seed,
                                   int64_t row0, int h0) {
    BfrDrop dr = {p, seed, row0, h0};
    bfr_att_fwd(out, lse, q, k, v, B, T, H, KV, hd, t0, t1, &dr, bfr_att_tc(hd));
    bfr_round_rows(out, B, T, H, hd, t0, t1);
}
static void bfr_attention_fwd_v(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                                int T, int H, int KV, int hd, int hv, int t0, int t1) {
    BfrDrop none = {0, 0, 0, 0};
    bfr_att_fwd(out, lse, q, k, v, B, T, H, KV, hd, t0, t1, &none, bfr_att_tc_v(hd, hv));
    bfr_round_rows(out, B, T, H, hd, t0, t1);
}
static void bfr_att_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out,
                        const float *lse, const float *q, const float *k, const float *v, int B, int T, int H,
                        int KV, int hd, int t0, int t1, int flags, const BfrDrop *dr, int tc) {
    if (!tc) {
        if (dr->p > 0)
            backend_cpu()->attention_drop_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, t0, t1,
                                              dr->p, dr->seed, dr->row0, dr->h0, flags);
        else
            backend_cpu()->attention_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, t0, t1, flags);
        return;
    }
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
    cpu_attention_zero_rows(dq, dk, dv, B, T, H, KV, hd, t0, t1,
                            flags); // the rows written: zeros, then the sums added
    float *gr = bf16_copy(dout, nq), *qr = bf16_copy(q, nq), *kr = bf16_copy(k, nk), *vr = bf16_copy(v, nk);
    double *aq = xcalloc(nq, sizeof(double)), *ak = xcalloc(nk, sizeof(double)),
           *av = xcalloc(nk, sizeof(double));
    double sc = 1.0 / sqrt((double)hd), zs = bfr_drop_sc(dr);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = t0; t < t1; t++) {
                size_t qi = (((size_t)b * T + t) * H + h) * hd;
                double D = bfr_dot(gr + qi, out + qi, hd), L = lse[((size_t)b * H + h) * T + t];
                for (int u = 0; u <= t; u++) {
                    size_t ki = (((size_t)b * T + u) * KV + h / (H / KV)) * hd;
                    int kept = bfr_kept(dr, b, T, t, h, u);
                    double p = exp(bfr_dot(qr + qi, kr + ki, hd) * sc - L);
                    double ds = p * ((kept ? zs : 0.0) * bfr_dot(gr + qi, vr + ki, hd) - D) * sc;
                    double pb = kept ? bf16_round((float)p) : 0.0, dsb = bf16_round((float)ds);
                    for (int i = 0; i < hd; i++) {
                        av[ki + i] += pb * gr[qi + i];
                        aq[qi + i] += dsb * kr[ki + i];
                        ak[ki + i] += dsb * qr[qi + i];
                    }
                }
            }
    for (size_t i = 0; i < nq; i++) dq[i] += (float)aq[i];
    for (size_t i = 0; i < nk; i++) {
        dk[i] += (float)ak[i];
        dv[i] += (float)(av[i] * zs);
    }
    free(aq);
    free(ak);
    free(av);
    free(gr);
    free(qr);
    free(kr);
    free(vr);
}
static void bfr_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out,
                              const float *lse, const void *q, const void *k, const void *v, int B, int T,
                              int H, int KV, int hd, int t0, int t1, int flags) {
    BfrDrop none = {0, 0, 0, 0}; // (this backend's hidden format is float32)
    bfr_att_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, t0, t1, flags, &none, bfr_att_tc(hd));
}
static void bfr_attention_drop_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out,
                                   const float *lse, const void *q, const void *k, const void *v, int B,
                                   int T, int H, int KV, int hd, int t0, int t1, float p, uint64_t seed,
                                   int64_t row0, int h0, int flags) {
    BfrDrop dr = {p, seed, row0, h0};
    bfr_att_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, t0, t1, flags, &dr, bfr_att_tc(hd));
}
static void bfr_attention_bwd_v(float *dq, float *dk, float *dv, const float *dout, const void *out,
                                const float *lse, const void *q, const void *k, const void *v, int B, int T,
                                int H, int KV, int hd, int hv, int t0, int t1, int flags) {
    BfrDrop none = {0, 0, 0, 0};
    bfr_att_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, t0, t1, flags, &none,
                bfr_att_tc_v(hd, hv));
}

// (GM_OUT_HID: each product's values rounded to bf16, as the GEMM's bf16 output rounds its float32 sums)
static void bfr_matmul_fwd_multi(int n, float *const *out, const void *inp, const float *const *w, int N,
                                 int K, const int *O, int flags) {
    backend_matmul_fwd_multi_plain(backend_cpu_bf16ref(), n, out, inp, w, N, K, O, flags);
    for (int i = 0; (flags & GM_OUT_HID) && i < n; i++) bf16_round_n(out[i], (size_t)N * O[i]);
}
static void bfr_matmul_bwd_multi(int n, float *dinp, float *const *dw, const float *const *dout,
                                 const void *inp, const float *const *w, int N, int K, const int *O,
                                 int flags) {
    backend_matmul_bwd_multi_plain(backend_cpu_bf16ref(), n, dinp, dw, dout, inp, w, N, K, O, flags);
}

// The cpu backend with the cuda backend's bf16 GEMMs, bf16 expert hidden and dispatched rows and attention
// q, k, v and output (float arrays of bf16 values) and attention (name "cpu-bf16ref").
static inline const Backend *backend_cpu_bf16ref(void) {
    static Backend b;
    if (!b.name) {
        b = *backend_cpu();
        b.name = "cpu-bf16ref";
        b.matmul_fwd = bfr_matmul_fwd;
        b.matmul_bwd = bfr_matmul_bwd;
        b.matmul_fwd_multi = bfr_matmul_fwd_multi; // the singles above, in order
        b.matmul_bwd_multi = bfr_matmul_bwd_multi;
        b.grouped_matmul_fwd = bfr_grouped_fwd;
        b.grouped_matmul_bwd = bfr_grouped_bwd;
        b.grouped_swiglu_fwd = bfr_grouped_swiglu_fwd;
        b.grouped_swiglu_bwd = bfr_grouped_swiglu_bwd;
        b.grouped_down_fwd = bfr_grouped_down_fwd;
        b.grouped_matmul_bwd2 = bfr_grouped_bwd2;
        b.gather_rows_hid = bfr_gather_rows_hid;
        b.rmsnorm_fwd_hid = bfr_rmsnorm_fwd_hid;
        b.gather_dot_scale = bfr_gather_dot_scale;
        b.attention_fwd = bfr_attention_fwd;
        b.attention_bwd = bfr_attention_bwd;
        b.attention_drop_fwd = bfr_attention_drop_fwd;
        b.attention_drop_bwd = bfr_attention_drop_bwd;
        b.attention_fwd_v = bfr_attention_fwd_v;
        b.attention_bwd_v = bfr_attention_bwd_v;
        b.rope_fwd_hid = bfr_rope_fwd_hid;
        b.to_hid = bfr_to_hid;
        b.rope_bwd_hid = bfr_rope_bwd_hid;
        b.to_hid_rows = bfr_to_hid_rows;
        b.copy_strided = bfr_copy_strided;
    }
    return &b;
}
