// hid_bf16.h — for the cpu tests: the cpu backend with the experts' hidden rows in bf16 (ops.h Backend.hid
// FMT_BF16), as the "cuda" backend keeps them, so that src/moe's handling of that format (buffer sizes, the
// per-chunk offsets of ops.h hid_at, the shared expert's rows, the dispatched rows through the exchange as
// CT_BF16) runs in CI without a GPU. The fused expert ops widen their bf16 inputs to float32, run the
// cpu's plain composition (plain.h) and round each hidden output once to nearest even, as the GPU's
// epilogues do; gather_rows_hid, gather_dot_scale, rmsnorm_fwd_hid, rope_fwd_hid and to_hid round into bf16
// rows (and the attention its output), the q/k/v and o products and the attention widen theirs; every other
// op is the cpu's.
// Must not hold: tests (those are in mpi_moe.c).
#pragma once
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "ops/ops.h"
#include "ops/plain.h"

// n float32 values rounded to bf16 (nearest even) into out
static inline void hb_round_n(void *out, const float *f, size_t n) {
    for (size_t i = 0; i < n; i++) ((uint16_t *)out)[i] = bf16_rn_bits(f[i]);
}
// rows [off[0], off[G]) of C values: bf16 -> a float32 array of off[G] rows (the rows before off[0] zero)
static inline float *hb_widen(const void *h, const int64_t *off, int G, int C) {
    size_t n = G > 0 ? (size_t)off[G] * C : 0;
    float *f = xcalloc(n ? n : 1, sizeof(float));
    for (size_t i = G > 0 ? (size_t)off[0] * C : 0; i < n; i++) f[i] = bf16_to_f32(((const uint16_t *)h)[i]);
    return f;
}
static inline float *hb_new(const int64_t *off, int G, int C) {
    return xcalloc(G > 0 && off[G] ? (size_t)off[G] * C : 1, sizeof(float));
}
static inline void hb_round(void *h, const float *f, const int64_t *off, int G, int C) {
    if (G <= 0) return;
    size_t a = (size_t)off[0] * C;
    hb_round_n((uint16_t *)h + a, f + a, (size_t)off[G] * C - a);
}

static void hb_swiglu_fwd(void *h1, void *h3, void *act, const void *inp, const float *w1, const float *w3,
                          const int64_t *off, int G, int K, int O) {
    float *a = hb_new(off, G, O), *b = hb_new(off, G, O), *c = hb_new(off, G, O),
          *x = hb_widen(inp, off, G, K);
    backend_grouped_swiglu_fwd_plain(backend_cpu(), a, b, c, x, w1, w3, off, G, K, O);
    hb_round(h1, a, off, G, O);
    hb_round(h3, b, off, G, O);
    hb_round(act, c, off, G, O);
    free(a);
    free(b);
    free(c);
    free(x);
}
static void hb_down_fwd(float *out, const void *act, const float *w, const int64_t *off, int G, int K,
                        int O) {
    float *a = hb_widen(act, off, G, K);
    backend_cpu()->grouped_matmul_fwd(out, a, w, off, G, K, O);
    free(a);
}
static void hb_swiglu_bwd(void *dh1, void *dh3, float *dw, const void *dout, const void *act, const void *h1,
                          const void *h3, const float *w, const int64_t *off, int G, int K, int O,
                          int flags) {
    float *a = hb_widen(act, off, G, K), *b = hb_widen(h1, off, G, K), *c = hb_widen(h3, off, G, K);
    float *d1 = hb_new(off, G, K), *d3 = hb_new(off, G, K), *g = hb_widen(dout, off, G, O);
    backend_grouped_swiglu_bwd_plain(backend_cpu(), d1, d3, dw, g, a, b, c, w, off, G, K, O, flags);
    hb_round(dh1, d1, off, G, K);
    hb_round(dh3, d3, off, G, K);
    free(a);
    free(b);
    free(c);
    free(d1);
    free(d3);
    free(g);
}
static void hb_bwd2(float *dinp, float *dwa, float *dwb, const void *da, const void *db, const void *inp,
                    const float *wa, const float *wb, const int64_t *off, int G, int K, int O, int flags) {
    float *a = hb_widen(da, off, G, O), *b = hb_widen(db, off, G, O), *x = hb_widen(inp, off, G, K);
    backend_grouped_matmul_bwd2_plain(backend_cpu(), dinp, dwa, dwb, a, b, x, wa, wb, off, G, K, O, flags);
    free(a);
    free(b);
    free(x);
}
// the attention norm's output, rounded; the q/k/v products on its widened values
static void hb_rmsnorm_fwd_hid(void *out, float *rstd, const float *inp, const float *w, int N, int C,
                               float eps) {
    float *f = xmalloc(sizeof(float) * (N > 0 && C > 0 ? (size_t)N * C : 1));
    backend_cpu()->rmsnorm_fwd(f, rstd, inp, w, N, C, eps);
    hb_round_n(out, f, (size_t)N * C);
    free(f);
}
static float *hb_widen_n(const void *h, size_t n) {
    float *f = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) f[i] = bf16_to_f32(((const uint16_t *)h)[i]);
    return f;
}
// (GM_OUT_HID: each product's float32 values rounded into out[i])
static void hb_mm_fwd_multi(int n, float *const *out, const void *inp, const float *const *w, int N, int K,
                            const int *O, int flags) {
    float *x = hb_widen_n(inp, N > 0 && K > 0 ? (size_t)N * K : 0);
    if (!(flags & GM_OUT_HID)) backend_matmul_fwd_multi_plain(backend_cpu(), n, out, x, w, N, K, O, flags);
    for (int i = 0; (flags & GM_OUT_HID) && i < n; i++) {
        size_t c = (size_t)N * O[i];
        float *f = xmalloc(sizeof(float) * (c ? c : 1));
        backend_matmul_fwd_multi_plain(backend_cpu(), 1, &f, x, &w[i], N, K, &O[i], flags);
        hb_round_n(out[i], f, c);
        free(f);
    }
    free(x);
}
static void hb_mm_bwd_multi(int n, float *dinp, float *const *dw, const float *const *dout, const void *inp,
                            const float *const *w, int N, int K, const int *O, int flags) {
    float *x = hb_widen_n(inp, N > 0 && K > 0 ? (size_t)N * K : 0);
    backend_matmul_bwd_multi_plain(backend_cpu(), n, dinp, dw, dout, x, w, N, K, O, flags);
    free(x);
}
// the rows sent to the experts: rounded from float32, or bf16 rows copied
static void hb_gather_rows_hid(void *out, const void *inp, int from_hid, const int32_t *idx, int n, int C) {
    uint16_t *o = out;
    for (int i = 0; i < n; i++)
        for (int c = 0; c < C; c++) {
            size_t src = (size_t)idx[i] * C + c, dst = (size_t)i * C + c;
            o[dst] = from_hid ? ((const uint16_t *)inp)[src] : bf16_rn_bits(((const float *)inp)[src]);
        }
}
static void hb_gather_dot_scale(void *out, float *dot, const float *inp, const int32_t *idx, const float *b,
                                const float *scale, int n, int C, int hid) {
    if (!hid) {
        backend_cpu()->gather_dot_scale(out, dot, inp, idx, b, scale, n, C, 0);
        return;
    }
    float *f = xmalloc(sizeof(float) * (n > 0 && C > 0 ? (size_t)n * C : 1));
    backend_cpu()->gather_dot_scale(f, dot, inp, idx, b, scale, n, C, 0);
    hb_round_n(out, f, (size_t)n * C);
    free(f);
}

// the attention's q, k, v in bf16: RoPE's values (and v's) rounded once; the attention ops widen them
static void hb_rope_fwd_hid(void *out, const void *inp, int from_hid, int B, int T, int nh, int hd,
                            float theta) {
    size_t n = (size_t)B * T * nh * hd;
    float *f = from_hid ? hb_widen_n(inp, n) : xmalloc(sizeof(float) * (n ? n : 1));
    if (!from_hid) memcpy(f, inp, sizeof(float) * n);
    backend_cpu()->rope_fwd(f, B, T, nh, hd, theta);
    hb_round_n(out, f, n);
    free(f);
}
static void hb_to_hid(void *out, const float *inp, size_t n) { hb_round_n(out, inp, n); }
typedef struct {
    float *q, *k, *v;
} HbQkv;
static HbQkv hb_qkv(const void *q, const void *k, const void *v, int B, int T, int H, int KV, int hd) {
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
    HbQkv w = {hb_widen_n(q, nq), hb_widen_n(k, nk), hb_widen_n(v, nk)};
    return w;
}
static void hb_qkv_free(HbQkv *w) {
    free(w->q);
    free(w->k);
    free(w->v);
}
// the output: the float32 result's rows [t0, t1) of each sequence rounded into out (the others untouched)
static void hb_out_rows(void *out, const float *f, int B, int T, int H, int hd, int t0, int t1) {
    for (int b = 0; b < B; b++) {
        size_t a = ((size_t)b * T + t0) * H * hd;
        hb_round_n((uint16_t *)out + a, f + a, (size_t)(t1 - t0) * H * hd);
    }
}
static void hb_att_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                       int H, int KV, int hd, int t0, int t1) {
    HbQkv w = hb_qkv(q, k, v, B, T, H, KV, hd);
    float *o = xcalloc((size_t)B * T * H * hd + 1, sizeof(float));
    backend_cpu()->attention_fwd(o, lse, w.q, w.k, w.v, B, T, H, KV, hd, t0, t1);
    hb_out_rows(out, o, B, T, H, hd, t0, t1);
    free(o);
    hb_qkv_free(&w);
}
static void hb_att_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out, const float *lse,
                       const void *q, const void *k, const void *v, int B, int T, int H, int KV, int hd,
                       int t0, int t1, int flags) {
    HbQkv w = hb_qkv(q, k, v, B, T, H, KV, hd);
    float *o = hb_widen_n(out, (size_t)B * T * H * hd);
    backend_cpu()->attention_bwd(dq, dk, dv, dout, o, lse, w.q, w.k, w.v, B, T, H, KV, hd, t0, t1, flags);
    free(o);
    hb_qkv_free(&w);
}
static void hb_att_drop_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                            int H, int KV, int hd, int t0, int t1, float p, uint64_t seed, int64_t row0,
                            int h0) {
    HbQkv w = hb_qkv(q, k, v, B, T, H, KV, hd);
    float *o = xcalloc((size_t)B * T * H * hd + 1, sizeof(float));
    backend_cpu()->attention_drop_fwd(o, lse, w.q, w.k, w.v, B, T, H, KV, hd, t0, t1, p, seed, row0, h0);
    hb_out_rows(out, o, B, T, H, hd, t0, t1);
    free(o);
    hb_qkv_free(&w);
}
static void hb_att_drop_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out,
                            const float *lse, const void *q, const void *k, const void *v, int B, int T,
                            int H, int KV, int hd, int t0, int t1, float p, uint64_t seed, int64_t row0,
                            int h0, int flags) {
    HbQkv w = hb_qkv(q, k, v, B, T, H, KV, hd);
    float *o = hb_widen_n(out, (size_t)B * T * H * hd);
    backend_cpu()->attention_drop_bwd(dq, dk, dv, dout, o, lse, w.q, w.k, w.v, B, T, H, KV, hd, t0, t1, p,
                                      seed, row0, h0, flags);
    free(o);
    hb_qkv_free(&w);
}

static inline const Backend *backend_cpu_hid_bf16(void) {
    static Backend b;
    if (!b.name) {
        b = *backend_cpu();
        b.name = "cpu-hid-bf16";
        b.hid = FMT_BF16;
        b.grouped_swiglu_fwd = hb_swiglu_fwd;
        b.grouped_down_fwd = hb_down_fwd;
        b.grouped_swiglu_bwd = hb_swiglu_bwd;
        b.grouped_matmul_bwd2 = hb_bwd2;
        b.gather_rows_hid = hb_gather_rows_hid;
        b.rmsnorm_fwd_hid = hb_rmsnorm_fwd_hid;
        b.matmul_fwd_multi = hb_mm_fwd_multi;
        b.matmul_bwd_multi = hb_mm_bwd_multi;
        b.gather_dot_scale = hb_gather_dot_scale;
        b.rope_fwd_hid = hb_rope_fwd_hid;
        b.to_hid = hb_to_hid;
        b.attention_fwd = hb_att_fwd;
        b.attention_bwd = hb_att_bwd;
        b.attention_drop_fwd = hb_att_drop_fwd;
        b.attention_drop_bwd = hb_att_drop_bwd;
    }
    return &b;
}
