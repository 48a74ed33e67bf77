// cpu_nn.c — float32 reference kernels: embedding, RMSNorm (also over rows whose columns are split
// across ranks: partial sums, then the norm given the whole sums), RoPE (also over a row range), causal
// GQA attention (with optional dropout on its probabilities), SwiGLU, row gather and combine,
// cross-entropy, elementwise ops (dropout among them), and the optimizer's runs (sum of squares, AdamW).
// OpenMP over independent rows only; every sum is taken in a fixed order (results do not depend on
// thread count except inside BLAS).
// Must not hold: any knowledge of the model or of layers.
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "ops/cpu/cpu_ops.h"

void *cpu_scratch(size_t bytes) {
    static void *p;
    static size_t cap;
    if (bytes > cap) {
        free(p);
        p = xmalloc(bytes);
        cap = bytes;
    }
    return p;
}

// (an id outside [0, V): another TP rank's row of a vocab-parallel table, ops.h)
void cpu_embedding_fwd(float *out, const int32_t *tokens, const float *table, int N, int C, int V) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++)
        if (tokens[i] >= 0 && tokens[i] < V)
            memcpy(out + (size_t)i * C, table + (size_t)tokens[i] * C, sizeof(float) * C);
        else memset(out + (size_t)i * C, 0, sizeof(float) * C);
}

void cpu_embedding_bwd(float *dtable, const float *dout, const int32_t *tokens, int N, int C, int V) {
    for (int i = 0; i < N; i++) { // serial: rows of the same token must add in order
        if (tokens[i] < 0 || tokens[i] >= V) continue;
        float *d = dtable + (size_t)tokens[i] * C;
        const float *g = dout + (size_t)i * C;
        for (int c = 0; c < C; c++) d[c] += g[c];
    }
}

void cpu_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[c] * x[c];
        float r = (float)(1.0 / sqrt(ss / C + eps));
        rstd[i] = r;
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = x[c] * r * w[c];
    }
}

// dw[c] += sum over the rows, in order, of dout * inp * rstd (in double)
static void rmsnorm_dw(float *dw, const float *dout, const float *inp, const float *rstd, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int c = 0; c < C; c++) {
        double s = 0;
        for (int i = 0; i < N; i++) s += (double)dout[(size_t)i * C + c] * inp[(size_t)i * C + c] * rstd[i];
        dw[c] += (float)s;
    }
}

void cpu_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                     const float *rstd, int N, int C) {
    // y = x r w, r = (mean(x^2) + eps)^-1/2 ; dx = r (g w) - x r^3 mean(g w x)
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *g = dout + (size_t)i * C;
        float r = rstd[i];
        double dot = 0;
        for (int c = 0; c < C; c++) dot += (double)g[c] * w[c] * x[c];
        float k = (float)(dot / C) * r * r * r;
        float *dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) dx[c] += r * g[c] * w[c] - k * x[c];
    }
    if (dw) rmsnorm_dw(dw, dout, inp, rstd, N, C);
}

// The row split over ranks (ops.h): partial row sums, then the forward / backward given the whole sums,
// in rmsnorm_fwd / rmsnorm_bwd's operations (one rank's part: their bits).
void cpu_rmsnorm_part(double *part, const float *a, const float *w, const float *b, int N, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = a + (size_t)i * C, *y = b + (size_t)i * C;
        double s = 0;
        if (w)
            for (int c = 0; c < C; c++) s += (double)x[c] * w[c] * y[c];
        else
            for (int c = 0; c < C; c++) s += (double)x[c] * y[c];
        part[i] = s;
    }
}

void cpu_rmsnorm_fwd_part(float *out, float *rstd, const float *inp, const float *w, const double *ss, int N,
                          int C, int Ctot, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float r = (float)(1.0 / sqrt(ss[i] / Ctot + eps));
        rstd[i] = r;
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = x[c] * r * w[c];
    }
}

void cpu_rmsnorm_bwd_part(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                          const float *rstd, const double *dot, int N, int C, int Ctot) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *g = dout + (size_t)i * C;
        float r = rstd[i];
        float k = (float)(dot[i] / Ctot) * r * r * r;
        float *dx = dinp + (size_t)i * C;
        for (int c = 0; c < C; c++) dx[c] += r * g[c] * w[c] - k * x[c];
    }
    if (dw) rmsnorm_dw(dw, dout, inp, rstd, N, C);
}

// HF rotate_half: pairs (j, j + hd/2), angle = pos * theta^(-2j/hd). dir = +1 forward, -1 inverse.
// x holds the rows t in [t0, t1) of B sequences (row i: position t0 + i % (t1 - t0)).
static void rope(float *x, int B, int t0, int t1, int nh, int hd, float theta, int dir) {
    int half = hd / 2, n = t1 - t0;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * n; bt++) {
        int pos = t0 + bt % n;
        for (int j = 0; j < half; j++) {
            double freq = pow((double)theta, -2.0 * j / hd);
            double ang = pos * freq;
            float c = (float)cos(ang), s = (float)(dir * sin(ang));
            for (int h = 0; h < nh; h++) {
                float *p = x + ((size_t)bt * nh + h) * hd;
                float x1 = p[j], x2 = p[j + half];
                p[j] = x1 * c - x2 * s;
                p[j + half] = x2 * c + x1 * s;
            }
        }
    }
}
void cpu_rope_fwd(float *x, int B, int T, int nh, int hd, float theta) { rope(x, B, 0, T, nh, hd, theta, 1); }
void cpu_rope_bwd(float *dx, int B, int T, int nh, int hd, float theta) {
    rope(dx, B, 0, T, nh, hd, theta, -1);
}
// (the cpu's hidden format is float32: GM_DOUT_HID's rows are the float32 rows)
void cpu_rope_bwd_hid(float *dx, int B, int T, int nh, int hd, float theta) {
    cpu_rope_bwd(dx, B, T, nh, hd, theta);
}
void cpu_to_hid_rows(float *x, int N, int C) { (void)x, (void)N, (void)C; }
void cpu_rope_rows(float *x, int B, int t0, int t1, int nh, int hd, float theta, int inverse) {
    rope(x, B, t0, t1, nh, hd, theta, inverse ? -1 : 1);
}
// RopeYarn's frequency of pair j of hd (ops.h), in double.
static double yarn_freq(RopeYarn r, int j, int hd) {
    double f = pow((double)r.theta, -2.0 * j / hd);
    if (!(r.factor > 1)) return f;
    double hi = r.high == r.low ? r.low + 0.001 : r.high, ramp = (j - r.low) / (hi - r.low);
    double e = 1.0 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
    return f / r.factor * (1.0 - e) + f * e;
}
void cpu_rope_yarn(float *x, int B, int t0, int t1, int nh, int hd, int ld, RopeYarn r, int adjoint) {
    int half = hd / 2, n = t1 - t0;
    float sc = r.scale;
#pragma omp parallel for schedule(static)
    for (int bt = 0; bt < B * n; bt++) {
        int pos = t0 + bt % n;
        for (int j = 0; j < half; j++) {
            double ang = pos * yarn_freq(r, j, hd);
            float c = (float)cos(ang), s = (float)((adjoint ? -1 : 1) * sin(ang));
            for (int h = 0; h < nh; h++) {
                float *p = x + ((size_t)bt * nh + h) * ld;
                float *p1 = p + (r.interleave ? 2 * j : j), *p2 = p + (r.interleave ? 2 * j + 1 : j + half);
                float x1 = *p1, x2 = *p2, y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
                *p1 = sc == 1.0f ? y1 : sc * y1;
                *p2 = sc == 1.0f ? y2 : sc * y2;
            }
        }
    }
}
// (float32 is the cpu's hidden format: both flags name float32 buffers)
void cpu_copy_strided(void *dst, int dst_hid, const void *src, int src_hid, Stride3 s, float alpha, int acc) {
    (void)dst_hid;
    (void)src_hid;
    float *d = dst;
    const float *x = src;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < s.n0; i++)
        for (int j = 0; j < s.n1; j++) {
            float *dr = d + i * s.d0 + j * s.d1;
            const float *sr = x + i * s.s0 + j * s.s1;
            for (int c = 0; c < s.cols; c++) {
                float v = alpha == 1.0f ? sr[c] : alpha * sr[c];
                dr[c] = acc ? dr[c] + v : v;
            }
        }
}
// (float32 is the cpu's hidden format, from_hid or not: a copy, then rope_fwd's rotation on it)
void cpu_rope_fwd_hid(void *out, const void *inp, int from_hid, int B, int T, int nh, int hd, float theta) {
    (void)from_hid;
    if (out != inp) memcpy(out, inp, sizeof(float) * (size_t)B * T * nh * hd);
    rope(out, B, 0, T, nh, hd, theta, 1);
}
void cpu_to_hid(void *out, const float *inp, size_t n) {
    if (out != inp) memcpy(out, inp, sizeof(float) * n);
}

// The attention-probability dropout's mask (attention_drop_fwd in ops.h): query row t of sequence b, head
// h of this rank (global head h0 + h), key u: kept iff dropout_keep(head seed, global token, u).
static inline uint64_t head_seed(uint64_t seed, int h) { return dropout_hash(seed, -1 - (int64_t)h, 0); }

static void attn_fwd(float *out, float *lse, const float *q, const float *k, const float *v, int B, int T,
                     int H, int KV, int hd, int t0, int t1, float pd, uint64_t seed, int64_t row0, int h0) {
    float sc = 1.0f / sqrtf((float)hd);
    int rep = H / KV, drop = pd > 0;
    uint32_t thr = drop ? dropout_threshold(pd) : 0;
    float dsc = drop ? 1.0f / (1.0f - pd) : 1.0f;
    float *scr = cpu_scratch(sizeof(float) * (size_t)(T ? T : 1) * omp_get_max_threads());
#pragma omp parallel
    {
        float *s = scr + (size_t)T * omp_get_thread_num();
#pragma omp for schedule(static) collapse(2)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++) {
                int kh = h / rep;
                for (int t = t0; t < t1; t++) {
                    const float *qt = q + (((size_t)b * T + t) * H + h) * hd;
                    float mx = -INFINITY;
                    for (int u = 0; u <= t; u++) {
                        const float *ku = k + (((size_t)b * T + u) * KV + kh) * hd;
                        float a = 0;
                        for (int i = 0; i < hd; i++) a += qt[i] * ku[i];
                        s[u] = a * sc;
                        if (s[u] > mx) mx = s[u];
                    }
                    double sum = 0;
                    for (int u = 0; u <= t; u++) {
                        s[u] = expf(s[u] - mx);
                        sum += s[u];
                    }
                    float inv = (float)(1.0 / sum);
                    float *o = out + (((size_t)b * T + t) * H + h) * hd;
                    for (int i = 0; i < hd; i++) o[i] = 0;
                    uint64_t hs = drop ? head_seed(seed, h0 + h) : 0;
                    int64_t g = row0 + (int64_t)b * T + t;
                    for (int u = 0; u <= t; u++) {
                        const float *vu = v + (((size_t)b * T + u) * KV + kh) * hd;
                        float p = s[u] * inv;
                        if (drop) p = dropout_keep(hs, g, u, thr) ? p * dsc : 0.0f;
                        for (int i = 0; i < hd; i++) o[i] += p * vu[i];
                    }
                    lse[((size_t)b * H + h) * T + t] = mx + (float)log(sum);
                }
            }
    }
}

void cpu_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                       int H, int KV, int hd, int t0, int t1) {
    attn_fwd(out, lse, q, k, v, B, T, H, KV, hd, t0, t1, 0, 0, 0, 0);
}
void cpu_attention_drop_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                            int H, int KV, int hd, int t0, int t1, float p, uint64_t seed, int64_t row0,
                            int h0) {
    attn_fwd(out, lse, q, k, v, B, T, H, KV, hd, t0, t1, p, seed, row0, h0);
}

// With dropout (pd > 0): out = (P * Z) V, Z the mask scaled by 1/(1-p); dV += (P * Z)^T dout, dP' = Z * (dout
// V^T), dS = P * (dP' - D) with D = rowsum(dout * out) (= sum_u P dP', as without dropout).
void cpu_attention_zero_rows(float *dq, float *dk, float *dv, int B, int T, int H, int KV, int hd, int t0,
                             int t1, int flags) {
    for (int b = 0; b < B; b++) {
        if (!(flags & ATT_ADD_DQ))
            memset(dq + ((size_t)b * T + t0) * H * hd, 0, sizeof(float) * (size_t)(t1 - t0) * H * hd);
        if (!(flags & ATT_ADD_DKV)) {
            memset(dk + (size_t)b * T * KV * hd, 0, sizeof(float) * (size_t)t1 * KV * hd);
            memset(dv + (size_t)b * T * KV * hd, 0, sizeof(float) * (size_t)t1 * KV * hd);
        }
    }
}

static void attn_bwd(float *dq, float *dk, float *dv, const float *dout, const float *out, const float *lse,
                     const float *q, const float *k, const float *v, int B, int T, int H, int KV, int hd,
                     int t0, int t1, float pd, uint64_t seed, int64_t row0, int h0, int flags) {
    float sc = 1.0f / sqrtf((float)hd);
    cpu_attention_zero_rows(dq, dk, dv, B, T, H, KV, hd, t0, t1,
                            flags); // the rows written: zeros, then the sums added
    int rep = H / KV, drop = pd > 0;
    uint32_t thr = drop ? dropout_threshold(pd) : 0;
    float dsc = drop ? 1.0f / (1.0f - pd) : 1.0f;
    // parallel over (b, kv head): the heads sharing a kv head accumulate dk/dv in a fixed order
#pragma omp parallel
    {

#pragma omp for schedule(static) collapse(2)
        for (int b = 0; b < B; b++)
            for (int kh = 0; kh < KV; kh++)
                for (int h = kh * rep; h < (kh + 1) * rep; h++)
                    for (int t = t0; t < t1; t++) {
                        size_t qi = (((size_t)b * T + t) * H + h) * hd;
                        const float *qt = q + qi, *go = dout + qi, *ot = out + qi;
                        float L = lse[((size_t)b * H + h) * T + t];
                        uint64_t hs = drop ? head_seed(seed, h0 + h) : 0;
                        int64_t g = row0 + (int64_t)b * T + t;
                        float D = 0;
                        for (int i = 0; i < hd; i++) D += go[i] * ot[i];
                        float *dqt = dq + qi;
                        for (int u = 0; u <= t; u++) {
                            size_t ki = (((size_t)b * T + u) * KV + kh) * hd;
                            const float *ku = k + ki, *vu = v + ki;
                            float a = 0, dp = 0;
                            for (int i = 0; i < hd; i++) {
                                a += qt[i] * ku[i];
                                dp += go[i] * vu[i];
                            }
                            float pr = expf(a * sc - L), pv = pr;
                            if (drop) {
                                float z = dropout_keep(hs, g, u, thr) ? dsc : 0.0f;
                                dp *= z;
                                pv = pr * z;
                            }
                            float ds = pr * (dp - D) * sc;
                            float *dku = dk + ki, *dvu = dv + ki;
                            for (int i = 0; i < hd; i++) {
                                dqt[i] += ds * ku[i];
                                dku[i] += ds * qt[i];
                                dvu[i] += pv * go[i];
                            }
                        }
                    }
    }
}

void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out, const float *lse,
                       const void *q, const void *k, const void *v, int B, int T, int H, int KV, int hd,
                       int t0, int t1, int flags) {
    attn_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, t0, t1, 0, 0, 0, 0, flags);
}
void cpu_attention_drop_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out,
                            const float *lse, const void *q, const void *k, const void *v, int B, int T,
                            int H, int KV, int hd, int t0, int t1, float p, uint64_t seed, int64_t row0,
                            int h0, int flags) {
    attn_bwd(dq, dk, dv, dout, out, lse, q, k, v, B, T, H, KV, hd, t0, t1, p, seed, row0, h0, flags);
}

void cpu_swiglu_fwd(float *out, const float *h1, const float *h3, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float a = h1[i], sg = 1.0f / (1.0f + expf(-a));
        out[i] = a * sg * h3[i];
    }
}

void cpu_swiglu_bwd(float *dh1, float *dh3, const float *dout, const float *h1, const float *h3, size_t n,
                    int accumulate) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float a = h1[i], sg = 1.0f / (1.0f + expf(-a)), silu = a * sg;
        float g1 = dout[i] * h3[i] * sg * (1.0f + a * (1.0f - sg)), g3 = dout[i] * silu;
        if (accumulate) {
            dh1[i] += g1;
            dh3[i] += g3;
        } else {
            dh1[i] = g1;
            dh3[i] = g3;
        }
    }
}

void cpu_gather_rows(float *out, const float *inp, const int32_t *idx, int n, int C) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) memcpy(out + (size_t)i * C, inp + (size_t)idx[i] * C, sizeof(float) * C);
}

void cpu_combine_rows(float *out, const float *res, const float *rows, const int32_t *slot_row,
                      const float *w, int N, int k, int C, int accumulate) {
    // parallel over output rows; each row sums its slots in order j = 0..k-1 (the cuda kernel
    // does the same arithmetic in the same order, so the two agree bit for bit)
#pragma omp parallel for schedule(static)
    for (int t = 0; t < N; t++) {
        float *o = out + (size_t)t * C;
        if (!accumulate) memset(o, 0, sizeof(float) * C);
        for (int j = 0; j < k; j++) {
            int32_t r = slot_row[(size_t)t * k + j];
            if (r < 0) continue;
            float s = w ? w[(size_t)t * k + j] : 1.0f;
            const float *x = rows + (size_t)r * C;
            for (int c = 0; c < C; c++) o[c] += s * x[c];
        }
        if (res)
            for (int c = 0; c < C; c++) o[c] = res[(size_t)t * C + c] + o[c];
    }
}

// (hid: the cpu's hidden format is float32)
void cpu_gather_dot_scale(void *out, float *dot, const float *inp, const int32_t *idx, const float *b,
                          const float *scale, int n, int C, int hid) {
    (void)hid;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *g = inp + (size_t)idx[i] * C, *y = b + (size_t)i * C;
        float *o = (float *)out + (size_t)i * C;
        double s = 0;
        for (int c = 0; c < C; c++) s += (double)g[c] * y[c];
        dot[i] = (float)s;
        for (int c = 0; c < C; c++) o[c] = g[c] * scale[i];
    }
}

static float row_lse(const float *x, int V) {
    float mx = -INFINITY;
    for (int j = 0; j < V; j++)
        if (x[j] > mx) mx = x[j];
    double s = 0;
    for (int j = 0; j < V; j++) s += exp((double)x[j] - mx);
    return mx + (float)log(s);
}

void cpu_cross_entropy_fwd(float *losses, const float *logits, const int32_t *targets, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        losses[i] = row_lse(x, V) - x[targets[i]];
    }
}

// (the cpu's hidden format is float32: the dlogits stay float32)
void cpu_cross_entropy_fwd_bwd(float *losses, float *logits, const int32_t *targets, int N, int V,
                               float dloss) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        float *x = logits + (size_t)i * V;
        float l = row_lse(x, V);
        losses[i] = l - x[targets[i]];
        for (int j = 0; j < V; j++) x[j] = expf(x[j] - l) * dloss;
        x[targets[i]] -= dloss;
    }
}

// (row_lse's sums: its largest value and its double sum of exponentials, each row's)
void cpu_ce_part(double *part, const float *logits, const int32_t *targets, int N, int V) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = logits + (size_t)i * V;
        float mx = -INFINITY;
        for (int j = 0; j < V; j++)
            if (x[j] > mx) mx = x[j];
        double s = 0;
        for (int j = 0; j < V; j++) s += exp((double)x[j] - mx);
        double *p = part + 3 * (size_t)i;
        p[0] = mx;
        p[1] = s;
        p[2] = targets[i] >= 0 && targets[i] < V ? x[targets[i]] : 0;
    }
}

// (one part: row_lse's bits, mx + (float)log(s); the target's logit a float, the others' zeros)
void cpu_ce_finish(float *losses, float *logits, const double *parts, const int32_t *targets, int N, int V,
                   int n, float dloss) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        double M = -INFINITY, s = 0, tl = 0;
        for (int r = 0; r < n; r++)
            if (parts[((size_t)r * N + i) * 3] > M) M = parts[((size_t)r * N + i) * 3];
        for (int r = 0; r < n; r++) {
            const double *p = parts + ((size_t)r * N + i) * 3;
            s += p[1] * exp(p[0] - M); // (exp(0) = 1: the largest part's s as it is)
            tl += p[2];
        }
        float l = (float)M + (float)log(s);
        losses[i] = l - (float)tl;
        if (dloss == 0) continue;
        float *x = logits + (size_t)i * V;
        for (int j = 0; j < V; j++) x[j] = expf(x[j] - l) * dloss;
        if (targets[i] >= 0 && targets[i] < V) x[targets[i]] -= dloss;
    }
}

void cpu_sigmoid_fwd(float *out, const float *inp, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = 1.0f / (1.0f + expf(-inp[i]));
}

void cpu_sigmoid_bwd(float *dinp, const float *dout, const float *out, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] = dout[i] * (out[i] * (1.0f - out[i]));
}

void cpu_mul(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] * b[i];
}

void cpu_axpy(float *y, const float *x, float a, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) y[i] += a * x[i];
}

void cpu_add(float *out, const float *a, const float *b, size_t n) {
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// The sum of squares of run u's gradient (g: the whole flat buffer; each element as u's format reads it,
// ops.h optrun_g): fixed chunks summed in order, so the result does not depend on the thread count.
static double sumsq(const float *g, const OptRun *u) {
    enum { CHUNK = 1 << 14 };
    size_t n = (size_t)u->n, nc = (n + CHUNK - 1) / CHUNK;
    double *part = cpu_scratch(sizeof(double) * (nc ? nc : 1));
#pragma omp parallel for schedule(static)
    for (size_t c = 0; c < nc; c++) {
        double s = 0;
        size_t e = (c + 1) * CHUNK < n ? (c + 1) * CHUNK : n;
        if (u->gbf == OPTG_F32) {
            const float *x = g + u->off;
            for (size_t i = c * CHUNK; i < e; i++) s += (double)x[i] * x[i];
        } else {
            for (size_t i = c * CHUNK; i < e; i++) {
                double x = optrun_g(g, u->gbf, u->gb, u->off, (int64_t)i);
                s += x * x;
            }
        }
        part[c] = s;
    }
    double s = 0;
    for (size_t c = 0; c < nc; c++) s += part[c];
    return s;
}

// The gradient ledger (ops.h GM_DW_SUMSQ, dw_sumsq_take): each written block's sum, by sumsq as a run of it
// (so the chunks of a tensor's run), with its address; take adds them in ascending address order (the
// norm's run list is in the table's order, which is the gradient buffer's).
typedef struct {
    uintptr_t at;
    double s;
} LedgerRec;
static LedgerRec *g_led;
static int g_led_n, g_led_cap;

void cpu_dw_ledger_add(const float *dw, int G, size_t blk, int packed) {
    for (int g = 0; g < G; g++) {
        OptRun u = {.off = (int64_t)(g * blk), .n = (int64_t)blk, .gbf = packed ? OPTG_PACKED : OPTG_F32};
        if (g_led_n == g_led_cap) {
            g_led_cap = g_led_cap ? 2 * g_led_cap : 256;
            g_led = xrealloc(g_led, sizeof(LedgerRec) * (size_t)g_led_cap);
        }
        g_led[g_led_n++] = (LedgerRec){(uintptr_t)(dw + g * blk), blk ? sumsq(dw, &u) : 0.0};
    }
}

static int led_cmp(const void *a, const void *b) {
    uintptr_t x = ((const LedgerRec *)a)->at, y = ((const LedgerRec *)b)->at;
    return x < y ? -1 : x > y;
}

int cpu_dw_sumsq_take(double *sum) {
    int n = g_led_n;
    if (sum) {
        qsort(g_led, (size_t)n, sizeof(LedgerRec), led_cmp);
        double s = 0;
        for (int i = 0; i < n; i++) s += g_led[i].s;
        *sum = s;
    }
    g_led_n = 0;
    return n;
}

// AdamW on run u's elements (ops.h adamw_f32: the same float operations on every backend); g: the whole flat
// buffer, read as u's format says; p, m, v: at the run's first element.
static void adamw_span(float *p, const float *g, float *m, float *v, const OptRun *u, const AdamwStep *s,
                       float lwd) {
    int64_t n = u->n;
    if (u->gbf == OPTG_F32) { // (the common case as a plain loop)
        const float *gr = g + u->off;
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) p[i] = adamw_f32(p[i], gr[i], &m[i], &v[i], s, lwd);
        return;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        p[i] = adamw_f32(p[i], optrun_g(g, u->gbf, u->gb, u->off, i), &m[i], &v[i], s, lwd);
}

// The run list on the cpu: a plain host copy.
struct OptRuns {
    int n;
    OptRun r[];
};

OptRuns *cpu_runs_create(const OptRun *runs, int n) {
    OptRuns *r = xmalloc(sizeof(OptRuns) + sizeof(OptRun) * (size_t)(n > 0 ? n : 0));
    r->n = n > 0 ? n : 0;
    if (r->n) memcpy(r->r, runs, sizeof(OptRun) * (size_t)r->n);
    return r;
}

void cpu_runs_free(OptRuns *r) { free(r); }

void cpu_sumsq_runs(double *out, int ncls, const float *x, const OptRuns *r) {
    for (int c = 0; c < ncls; c++) out[c] = 0;
    for (int i = 0; i < r->n; i++) {
        const OptRun *u = &r->r[i];
        CHECK(u->cls >= 0 && u->cls < ncls, "sumsq_runs: run %d has class %d, not in [0, %d)", i, (int)u->cls,
              ncls);
        if (u->n > 0) out[u->cls] += sumsq(x, u);
    }
}

// The bf16 policy (ops.h OPT_BF16_*): bf16 moments read to float32, adamw_f32, the moments stored rounded
// to nearest even, the weight rounded to bf16 (nearest or stochastic, hashed on the element's global index).
static void adamw_span_bf16(float *p, const float *g, uint16_t *m, uint16_t *v, const OptRun *u,
                            const AdamwStep *s, float lwd) {
    int64_t n = u->n;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++) {
        float mi = bf16_to_f32(m[i]), vi = bf16_to_f32(v[i]);
        float pi = adamw_f32(p[i], optrun_g(g, u->gbf, u->gb, u->off, i), &mi, &vi, s, lwd);
        m[i] = bf16_rn_bits(mi);
        v[i] = bf16_rn_bits(vi);
        p[i] = bf16_round_weight(pi, s->prec, s->key, optrun_gidx(u->gidx, u->gcols, u->lcols, u->col0, i));
    }
}

void cpu_adamw_runs(float *p, const float *g, void *m, void *v, const OptRuns *r, float gscale, float lr,
                    float b1, float b2, float eps, float wd, int t, int prec, uint64_t seed) {
    AdamwStep s = adamw_step(gscale, lr, b1, b2, eps, wd, t, prec, seed);
    for (int i = 0; i < r->n; i++) {
        const OptRun *u = &r->r[i];
        if (u->n <= 0) continue;
        float lwd = u->decay ? s.lwd : 0.0f;
        if (prec == OPT_MIXED)
            adamw_span(p + u->off, g, (float *)m + u->moff, (float *)v + u->moff, u, &s, lwd);
        else adamw_span_bf16(p + u->off, g, (uint16_t *)m + u->moff, (uint16_t *)v + u->moff, u, &s, lwd);
    }
}

void cpu_dropout(float *x, int B, int T, int t0, int t1, int C, float p, uint64_t seed, int64_t row0) {
    if (p <= 0) return;
    int n = t1 - t0;
    uint32_t thr = dropout_threshold(p);
    float scale = 1.0f / (1.0f - p);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < B * n; i++) {
        int64_t g = row0 + (int64_t)(i / n) * T + t0 + i % n;
        float *r = x + (size_t)i * C;
        for (int c = 0; c < C; c++) r[c] = dropout_keep(seed, g, c, thr) ? r[c] * scale : 0.0f;
    }
}
