// profile.c — a Backend that wraps another and times every op (synchronising before and after
// each, so the time is that op's alone), for `MOE_PROFILE=1 moe train ...`: where a step's time goes
// per kernel class. Profiling changes no result; it only serialises the device.
#include <string.h>
#include "core/common.h"
#include "ops/ops.h"

enum {
    P_MATMUL_F,
    P_MATMUL_B,
    P_GMM_F,
    P_GMM_B,
    P_EMB,
    P_NORM,
    P_ROPE,
    P_ATT_F,
    P_ATT_B,
    P_SWIGLU,
    P_ROWS,
    P_ROUTER,
    P_CE,
    P_ELEM,
    P_SUMSQ,
    P_ADAMW,
    P_COPY,
    P_N
};
static const char *pname[P_N] = {"matmul fwd",
                                 "matmul bwd",
                                 "grouped matmul fwd",
                                 "grouped matmul bwd",
                                 "embedding",
                                 "rmsnorm",
                                 "rope",
                                 "attention fwd",
                                 "attention bwd",
                                 "swiglu",
                                 "gather/combine/rows",
                                 "router",
                                 "cross-entropy",
                                 "elementwise",
                                 "sumsq",
                                 "adamw",
                                 "copies (host<->device, zero)"};
static double ptime[P_N];
static long pcalls[P_N];
static const Backend *in;
static Backend pb;

#define T0 \
    in->sync(); \
    double t0_ = now_seconds()
#define T1(k) \
    in->sync(); \
    ptime[k] += now_seconds() - t0_; \
    pcalls[k]++

static void w_to_device(void *d, const void *s, size_t n) {
    T0;
    in->to_device(d, s, n);
    T1(P_COPY);
}
static void w_to_host(void *d, const void *s, size_t n) {
    T0;
    in->to_host(d, s, n);
    T1(P_COPY);
}
static void w_copy(void *d, const void *s, size_t n) {
    T0;
    in->copy(d, s, n);
    T1(P_COPY);
}
static void w_zero(void *p, size_t n) {
    T0;
    in->zero(p, n);
    T1(P_COPY);
}
static void w_mm_f(float *o, const float *i, const float *w, int N, int K, int O, int a) {
    T0;
    in->matmul_fwd(o, i, w, N, K, O, a);
    T1(P_MATMUL_F);
}
static void w_mm_b(float *di, float *dw, const float *d, const float *i, const float *w, int N, int K, int O,
                   int f) {
    T0;
    in->matmul_bwd(di, dw, d, i, w, N, K, O, f);
    T1(P_MATMUL_B);
}
static void w_mm_fm(int n, float *const *o, const void *i, const float *const *w, int N, int K, const int *O,
                    int f) {
    T0;
    in->matmul_fwd_multi(n, o, i, w, N, K, O, f);
    T1(P_MATMUL_F);
}
static void w_mm_bm(int n, float *di, float *const *dw, const float *const *d, const void *i,
                    const float *const *w, int N, int K, const int *O, int f) {
    T0;
    in->matmul_bwd_multi(n, di, dw, d, i, w, N, K, O, f);
    T1(P_MATMUL_B);
}
static void w_gmm_f(float *o, const float *i, const float *w, const int64_t *off, int G, int K, int O) {
    T0;
    in->grouped_matmul_fwd(o, i, w, off, G, K, O);
    T1(P_GMM_F);
}
static void w_gmm_b(float *di, float *dw, const float *d, const float *i, const float *w, const int64_t *off,
                    int G, int K, int O, int a) {
    T0;
    in->grouped_matmul_bwd(di, dw, d, i, w, off, G, K, O, a);
    T1(P_GMM_B);
}
static void w_gsw_f(void *h1, void *h3, void *a, const void *i, const float *w1, const float *w3,
                    const int64_t *off, int G, int K, int O) {
    T0;
    in->grouped_swiglu_fwd(h1, h3, a, i, w1, w3, off, G, K, O);
    T1(P_GMM_F);
}
static void w_gsw_b(void *d1, void *d3, float *dw, const void *d, const void *a, const void *h1,
                    const void *h3, const float *w, const int64_t *off, int G, int K, int O, int fl) {
    T0;
    in->grouped_swiglu_bwd(d1, d3, dw, d, a, h1, h3, w, off, G, K, O, fl);
    T1(P_GMM_B);
}
static void w_gdown(float *o, const void *a, const float *w, const int64_t *off, int G, int K, int O) {
    T0;
    in->grouped_down_fwd(o, a, w, off, G, K, O);
    T1(P_GMM_F);
}
static void w_gmm_b2(float *di, float *dwa, float *dwb, const void *da, const void *db, const void *i,
                     const float *wa, const float *wb, const int64_t *off, int G, int K, int O, int a) {
    T0;
    in->grouped_matmul_bwd2(di, dwa, dwb, da, db, i, wa, wb, off, G, K, O, a);
    T1(P_GMM_B);
}
static void w_emb_f(float *o, const int32_t *t, const float *tb, int N, int C, int V) {
    T0;
    in->embedding_fwd(o, t, tb, N, C, V);
    T1(P_EMB);
}
static void w_emb_b(float *d, const float *o, const int32_t *t, int N, int C, int V) {
    T0;
    in->embedding_bwd(d, o, t, N, C, V);
    T1(P_EMB);
}
static void w_rms_f(float *o, float *r, const float *i, const float *w, int N, int C, float e) {
    T0;
    in->rmsnorm_fwd(o, r, i, w, N, C, e);
    T1(P_NORM);
}
static void w_rms_fh(void *o, float *r, const float *i, const float *w, int N, int C, float e) {
    T0;
    in->rmsnorm_fwd_hid(o, r, i, w, N, C, e);
    T1(P_NORM);
}
static void w_arms_f(float *x, float *o, float *r, const float *res, const float *w, int N, int C, float e) {
    T0;
    in->add_rmsnorm_fwd(x, o, r, res, w, N, C, e);
    T1(P_NORM);
}
static void w_rms_b(float *di, float *dw, const float *d, const float *i, const float *w, const float *r,
                    int N, int C) {
    T0;
    in->rmsnorm_bwd(di, dw, d, i, w, r, N, C);
    T1(P_NORM);
}
static void w_rms_p(double *p, const float *a, const float *w, const float *b, int N, int C) {
    T0;
    in->rmsnorm_part(p, a, w, b, N, C);
    T1(P_NORM);
}
static void w_rms_fp(float *o, float *r, const float *i, const float *w, const double *s, int N, int C,
                     int Ct, float e) {
    T0;
    in->rmsnorm_fwd_part(o, r, i, w, s, N, C, Ct, e);
    T1(P_NORM);
}
static void w_rms_bp(float *di, float *dw, const float *d, const float *i, const float *w, const float *r,
                     const double *dt, int N, int C, int Ct) {
    T0;
    in->rmsnorm_bwd_part(di, dw, d, i, w, r, dt, N, C, Ct);
    T1(P_NORM);
}
static void w_rope_f(float *x, int B, int T, int nh, int hd, float th) {
    T0;
    in->rope_fwd(x, B, T, nh, hd, th);
    T1(P_ROPE);
}
static void w_rope_b(float *x, int B, int T, int nh, int hd, float th) {
    T0;
    in->rope_bwd(x, B, T, nh, hd, th);
    T1(P_ROPE);
}
static void w_rope_r(float *x, int B, int t0, int t1, int nh, int hd, float th, int inv) {
    T0;
    in->rope_rows(x, B, t0, t1, nh, hd, th, inv);
    T1(P_ROPE);
}
static void w_drop(float *x, int B, int T, int t0, int t1, int C, float p, uint64_t s, int64_t r0) {
    T0;
    in->dropout(x, B, T, t0, t1, C, p, s, r0);
    T1(P_ELEM);
}
static void w_rope_fh(void *o, const void *x, int fh, int B, int T, int nh, int hd, float th) {
    T0;
    in->rope_fwd_hid(o, x, fh, B, T, nh, hd, th);
    T1(P_ROPE);
}
static void w_to_hid(void *o, const float *x, size_t n) {
    T0;
    in->to_hid(o, x, n);
    T1(P_ELEM);
}
static void w_rope_bh(float *x, int B, int T, int nh, int hd, float th) {
    T0;
    in->rope_bwd_hid(x, B, T, nh, hd, th);
    T1(P_ROPE);
}
static void w_to_hid_rows(float *x, int N, int C) {
    T0;
    in->to_hid_rows(x, N, C);
    T1(P_ELEM);
}
static void w_rope_y(float *x, int B, int t0, int t1, int nh, int hd, int ld, RopeYarn r, int adj) {
    T0;
    in->rope_yarn(x, B, t0, t1, nh, hd, ld, r, adj);
    T1(P_ROPE);
}
static void w_copy_s(void *d, int dh, const void *x, int sh, Stride3 s, float a, int acc) {
    T0;
    in->copy_strided(d, dh, x, sh, s, a, acc);
    T1(P_ELEM);
}
static void w_att_f(void *o, float *l, const void *q, const void *k, const void *v, int B, int T, int H,
                    int KV, int hd, int t0, int t1) {
    T0;
    in->attention_fwd(o, l, q, k, v, B, T, H, KV, hd, t0, t1);
    T1(P_ATT_F);
}
static void w_att_b(float *dq, float *dk, float *dv, const float *d, const void *o, const float *l,
                    const void *q, const void *k, const void *v, int B, int T, int H, int KV, int hd, int t0,
                    int t1, int f) {
    T0;
    in->attention_bwd(dq, dk, dv, d, o, l, q, k, v, B, T, H, KV, hd, t0, t1, f);
    T1(P_ATT_B);
}
static void w_att_fv(void *o, float *l, const void *q, const void *k, const void *v, int B, int T, int H,
                     int KV, int hd, int hv, int t0, int t1) {
    T0;
    in->attention_fwd_v(o, l, q, k, v, B, T, H, KV, hd, hv, t0, t1);
    T1(P_ATT_F);
}
static void w_att_bv(float *dq, float *dk, float *dv, const float *d, const void *o, const float *l,
                     const void *q, const void *k, const void *v, int B, int T, int H, int KV, int hd, int hv,
                     int t0, int t1, int f) {
    T0;
    in->attention_bwd_v(dq, dk, dv, d, o, l, q, k, v, B, T, H, KV, hd, hv, t0, t1, f);
    T1(P_ATT_B);
}
static void w_sw_f(float *o, const float *a, const float *b, size_t n) {
    T0;
    in->swiglu_fwd(o, a, b, n);
    T1(P_SWIGLU);
}
static void w_sw_b(float *da, float *db, const float *d, const float *a, const float *b, size_t n, int ac) {
    T0;
    in->swiglu_bwd(da, db, d, a, b, n, ac);
    T1(P_SWIGLU);
}
static void w_gather(float *o, const float *i, const int32_t *x, int n, int C) {
    T0;
    in->gather_rows(o, i, x, n, C);
    T1(P_ROWS);
}
static void w_gather_h(void *o, const void *i, int h, const int32_t *x, int n, int C) {
    T0;
    in->gather_rows_hid(o, i, h, x, n, C);
    T1(P_ROWS);
}
static void w_f8_round(void *r, int n, int d) {
    T0;
    in->fp8_rows_round(r, n, d);
    T1(P_ROWS);
}
static void w_f8_pack(void *p, const void *r, int n, int d) {
    T0;
    in->fp8_rows_pack(p, r, n, d);
    T1(P_ROWS);
}
static void w_f8_unpack(void *r, const void *p, int n, int d) {
    T0;
    in->fp8_rows_unpack(r, p, n, d);
    T1(P_ROWS);
}
static void w_combine(float *o, const float *res, const float *r, const int32_t *s, const float *w, int N,
                      int k, int C, int a) {
    T0;
    in->combine_rows(o, res, r, s, w, N, k, C, a);
    T1(P_ROWS);
}
static void w_rtopk(float *p, float *l, int32_t *i, float *w, double *s, const float *lg, const float *b,
                    int N, int E, RouteRule r) {
    T0;
    in->router_topk(p, l, i, w, s, lg, b, N, E, r);
    T1(P_ROUTER);
}
static void w_rbwd(float *dl, const float *rd, const int32_t *sr, const float *p, const float *l,
                   const int32_t *i, const float *w, const float *a, float z, int N, int E, RouteRule r) {
    T0;
    in->router_bwd(dl, rd, sr, p, l, i, w, a, z, N, E, r);
    T1(P_ROUTER);
}
static void w_ce_fb(float *l, float *lg, const int32_t *t, int N, int V, float d) {
    T0;
    in->cross_entropy_fwd_bwd(l, lg, t, N, V, d);
    T1(P_CE);
}
static void w_ce_f(float *l, const float *lg, const int32_t *t, int N, int V) {
    T0;
    in->cross_entropy_fwd(l, lg, t, N, V);
    T1(P_CE);
}
static void w_ce_p(double *p, const float *lg, const int32_t *t, int N, int V) {
    T0;
    in->ce_part(p, lg, t, N, V);
    T1(P_CE);
}
static void w_ce_fin(float *l, float *lg, const double *p, const int32_t *t, int N, int V, int n, float d) {
    T0;
    in->ce_finish(l, lg, p, t, N, V, n, d);
    T1(P_CE);
}
static void w_mul(float *o, const float *a, const float *b, size_t n) {
    T0;
    in->mul(o, a, b, n);
    T1(P_ELEM);
}
static void w_axpy(float *y, const float *x, float a, size_t n) {
    T0;
    in->axpy(y, x, a, n);
    T1(P_ELEM);
}
static void w_add(float *o, const float *a, const float *b, size_t n) {
    T0;
    in->add(o, a, b, n);
    T1(P_ELEM);
}
static void w_sig_f(float *o, const float *x, size_t n) {
    T0;
    in->sigmoid_fwd(o, x, n);
    T1(P_ELEM);
}
static void w_sig_b(float *d, const float *g, const float *o, size_t n) {
    T0;
    in->sigmoid_bwd(d, g, o, n);
    T1(P_ELEM);
}
static void w_pcnt(int32_t *c, int32_t *r, const int32_t *i, int N, int E, int k) {
    T0;
    in->plan_counts(c, r, i, N, E, k);
    T1(P_ROUTER);
}
static void w_prows(int32_t *s, int32_t *t, float *sc, const int32_t *r, const int32_t *i, const float *w,
                    const int32_t *kp, const int32_t *f, int N, int E, int k) {
    T0;
    in->plan_rows(s, t, sc, r, i, w, kp, f, N, E, k);
    T1(P_ROUTER);
}
static void w_gds(void *o, float *d, const float *i, const int32_t *x, const float *b, const float *s, int n,
                  int C, int h) {
    T0;
    in->gather_dot_scale(o, d, i, x, b, s, n, C, h);
    T1(P_ROWS);
}
static void w_sumsq_runs(double *o, int nc, const float *x, const OptRuns *r) {
    T0;
    in->sumsq_runs(o, nc, x, r);
    T1(P_SUMSQ);
}
static void w_adamw_runs(float *p, const float *g, void *m, void *v, const OptRuns *r, float gs, float lr,
                         float b1, float b2, float e, float wd, int t, int prec, uint64_t seed) {
    T0;
    in->adamw_runs(p, g, m, v, r, gs, lr, b1, b2, e, wd, t, prec, seed);
    T1(P_ADAMW);
}

const Backend *backend_profiled(const Backend *inner) {
    in = inner;
    pb = *inner; // setup (alloc, free, sync, runs_create/free), dw_sumsq_take and the name pass through
    pb.to_device = w_to_device;
    pb.to_host = w_to_host;
    pb.copy = w_copy;
    pb.zero = w_zero;
    pb.matmul_fwd = w_mm_f;
    pb.matmul_bwd = w_mm_b;
    pb.matmul_fwd_multi = w_mm_fm;
    pb.matmul_bwd_multi = w_mm_bm;
    pb.grouped_matmul_fwd = w_gmm_f;
    pb.grouped_matmul_bwd = w_gmm_b;
    pb.grouped_swiglu_fwd = w_gsw_f;
    pb.grouped_swiglu_bwd = w_gsw_b;
    pb.grouped_matmul_bwd2 = w_gmm_b2;
    pb.grouped_down_fwd = w_gdown;
    pb.embedding_fwd = w_emb_f;
    pb.embedding_bwd = w_emb_b;
    pb.rmsnorm_fwd = w_rms_f;
    pb.rmsnorm_fwd_hid = w_rms_fh;
    pb.rmsnorm_bwd = w_rms_b;
    pb.add_rmsnorm_fwd = w_arms_f;
    pb.rmsnorm_part = w_rms_p;
    pb.rmsnorm_fwd_part = w_rms_fp;
    pb.rmsnorm_bwd_part = w_rms_bp;
    pb.rope_fwd = w_rope_f;
    pb.rope_bwd = w_rope_b;
    pb.rope_rows = w_rope_r;
    pb.rope_fwd_hid = w_rope_fh;
    pb.to_hid = w_to_hid;
    pb.rope_bwd_hid = w_rope_bh;
    pb.to_hid_rows = w_to_hid_rows;
    pb.rope_yarn = w_rope_y;
    pb.copy_strided = w_copy_s;
    pb.dropout = w_drop;
    pb.attention_fwd = w_att_f;
    pb.attention_bwd = w_att_b;
    pb.attention_fwd_v = inner->attention_fwd_v ? w_att_fv : NULL;
    pb.attention_bwd_v = inner->attention_bwd_v ? w_att_bv : NULL;
    pb.swiglu_fwd = w_sw_f;
    pb.swiglu_bwd = w_sw_b;
    pb.gather_rows = w_gather;
    pb.gather_rows_hid = w_gather_h;
    if (inner->fp8_rows_round) { // (--fp8-dispatch's rows: the FP8 tables that have them)
        pb.fp8_rows_round = w_f8_round;
        pb.fp8_rows_pack = w_f8_pack;
        pb.fp8_rows_unpack = w_f8_unpack;
    }
    pb.combine_rows = w_combine;
    pb.router_topk = w_rtopk;
    pb.router_bwd = w_rbwd;
    pb.plan_counts = w_pcnt;
    pb.gather_dot_scale = w_gds;
    pb.plan_rows = w_prows;
    pb.cross_entropy_fwd_bwd = w_ce_fb;
    pb.cross_entropy_fwd = w_ce_f;
    pb.ce_part = w_ce_p;
    pb.ce_finish = w_ce_fin;
    pb.mul = w_mul;
    pb.axpy = w_axpy;
    pb.add = w_add;
    pb.sigmoid_fwd = w_sig_f;
    pb.sigmoid_bwd = w_sig_b;
    pb.sumsq_runs = w_sumsq_runs;
    pb.adamw_runs = w_adamw_runs;
    return &pb;
}

void backend_profile_reset(void) {
    memset(ptime, 0, sizeof ptime);
    memset(pcalls, 0, sizeof pcalls);
}

void backend_profile_report(FILE *f, int steps) {
    double tot = 0;
    for (int k = 0; k < P_N; k++) tot += ptime[k];
    fprintf(f, "profile (%s backend, ops serialised; %d steps): %.1f ms of ops per step\n",
            in ? in->name : "?", steps, steps ? 1e3 * tot / steps : 0.0);
    for (int k = 0; k < P_N; k++)
        if (pcalls[k])
            fprintf(f, "  %-30s %9.2f ms/step %5.1f%%  (%ld calls)\n", pname[k],
                    steps ? 1e3 * ptime[k] / steps : 0.0, tot > 0 ? 100 * ptime[k] / tot : 0.0, pcalls[k]);
}
