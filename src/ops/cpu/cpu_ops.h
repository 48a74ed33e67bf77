// cpu_ops.h — the float32 cpu kernels behind backend_cpu() (see ops/ops.h for each contract).
#pragma once
#include "ops/ops.h"

// Host scratch of at least `bytes` that the cpu ops share (one op at a time; an op divides it among its
// threads): grown when an op needs more, never shrunk, kept for the process, so that an op allocates
// nothing once it has run at its sizes (a training step after the first: tests/test_alloc.c).
void *cpu_scratch(size_t bytes);
// The cpu table with Backend.fp8 = 1 (cpu_fp8_ops.c): backend_cpu()'s ops, the grouped GEMMs by the FP8
// recipe (ops.h). backend.c's backend_fp8 hands it out; backend_cpu_fp8_dense (backend_fp8_dense's) has the
// attention projections' products in FP8 too (Backend.fp8_dense).
const Backend *backend_cpu_fp8(void);
const Backend *backend_cpu_fp8_dense(void);

void cpu_matmul_fwd(float *out, const float *inp, const float *w, int N, int K, int O, int accumulate);
void cpu_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N, int K,
                    int O, int flags);
void cpu_embedding_fwd(float *out, const int32_t *tokens, const float *table, int N, int C, int V);
void cpu_embedding_bwd(float *dtable, const float *dout, const int32_t *tokens, int N, int C, int V);
void cpu_rmsnorm_fwd(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
void cpu_rmsnorm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                     const float *rstd, int N, int C);
void cpu_rmsnorm_part(double *part, const float *a, const float *w, const float *b, int N, int C);
void cpu_rmsnorm_fwd_part(float *out, float *rstd, const float *inp, const float *w, const double *ss, int N,
                          int C, int Ctot, float eps);
void cpu_rmsnorm_bwd_part(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                          const float *rstd, const double *dot, int N, int C, int Ctot);
void cpu_rope_fwd(float *x, int B, int T, int nh, int hd, float theta);
void cpu_rope_bwd(float *dx, int B, int T, int nh, int hd, float theta);
void cpu_rope_bwd_hid(float *dx, int B, int T, int nh, int hd, float theta);
void cpu_to_hid_rows(float *x, int N, int C);
void cpu_rope_rows(float *x, int B, int t0, int t1, int nh, int hd, float theta, int inverse);
void cpu_rope_fwd_hid(void *out, const void *inp, int from_hid, int B, int T, int nh, int hd, float theta);
void cpu_to_hid(void *out, const float *inp, size_t n);
void cpu_rope_yarn(float *x, int B, int t0, int t1, int nh, int hd, int ld, RopeYarn r, int adjoint);
void cpu_copy_strided(void *dst, int dst_hid, const void *src, int src_hid, Stride3 s, float alpha, int acc);
void cpu_dropout(float *x, int B, int T, int t0, int t1, int C, float p, uint64_t seed, int64_t row0);
void cpu_attention_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                       int H, int KV, int hd, int t0, int t1);
// The rows attention_bwd writes under `flags` (ops.h ATT_ADD_*) set to zeros (host memory).
void cpu_attention_zero_rows(float *dq, float *dk, float *dv, int B, int T, int H, int KV, int hd, int t0,
                             int t1, int flags);
void cpu_attention_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out, const float *lse,
                       const void *q, const void *k, const void *v, int B, int T, int H, int KV, int hd,
                       int t0, int t1, int flags);
void cpu_attention_drop_fwd(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                            int H, int KV, int hd, int t0, int t1, float p, uint64_t seed, int64_t row0,
                            int h0);
void cpu_attention_drop_bwd(float *dq, float *dk, float *dv, const float *dout, const void *out,
                            const float *lse, const void *q, const void *k, const void *v, int B, int T,
                            int H, int KV, int hd, int t0, int t1, float p, uint64_t seed, int64_t row0,
                            int h0, int flags);
void cpu_swiglu_fwd(float *out, const float *h1, const float *h3, size_t n);
void cpu_swiglu_bwd(float *dh1, float *dh3, const float *dout, const float *h1, const float *h3, size_t n,
                    int accumulate);
void cpu_gather_rows(float *out, const float *inp, const int32_t *idx, int n, int C);
void cpu_combine_rows(float *out, const float *res, const float *rows, const int32_t *slot_row,
                      const float *w, int N, int k, int C, int accumulate);
void cpu_router_topk(float *probs, float *lse, int32_t *idx, float *w, double *sums, const float *logits,
                     const float *bias, int N, int E, RouteRule r);
void cpu_plan_counts(int32_t *cnt, int32_t *rank, const int32_t *idx, int N, int E, int k);
void cpu_plan_rows(int32_t *slot_row, int32_t *row_tok, float *row_scale, const int32_t *rank,
                   const int32_t *idx, const float *w, const int32_t *keep, const int32_t *first, int N,
                   int E, int k);
void cpu_gather_dot_scale(void *out, float *dot, const float *inp, const int32_t *idx, const float *b,
                          const float *scale, int n, int C, int hid);
void cpu_router_bwd(float *dlogits, const float *rowdot, const int32_t *slot_row, const float *probs,
                    const float *lse, const int32_t *idx, const float *w, const float *aux_dp, float z_dl,
                    int N, int E, RouteRule r);
void cpu_cross_entropy_fwd_bwd(float *losses, float *logits, const int32_t *targets, int N, int V,
                               float dloss);
void cpu_cross_entropy_fwd(float *losses, const float *logits, const int32_t *targets, int N, int V);
void cpu_ce_part(double *part, const float *logits, const int32_t *targets, int N, int V);
void cpu_ce_finish(float *losses, float *logits, const double *parts, const int32_t *targets, int N, int V,
                   int n, float dloss);
void cpu_mul(float *out, const float *a, const float *b, size_t n);
void cpu_sigmoid_fwd(float *out, const float *inp, size_t n);
void cpu_sigmoid_bwd(float *dinp, const float *dout, const float *out, size_t n);
void cpu_axpy(float *y, const float *x, float a, size_t n);
void cpu_add(float *out, const float *a, const float *b, size_t n);
OptRuns *cpu_runs_create(const OptRun *runs, int n);
void cpu_runs_free(OptRuns *r);
void cpu_sumsq_runs(double *out, int ncls, const float *x, const OptRuns *r);
// the gradient ledger (ops.h GM_DW_SUMSQ): G written blocks of blk values at dw (float32, or packed bf16)
void cpu_dw_ledger_add(const float *dw, int G, size_t blk, int packed);
int cpu_dw_sumsq_take(double *sum);
void cpu_adamw_runs(float *p, const float *g, void *m, void *v, const OptRuns *r, float gscale, float lr,
                    float b1, float b2, float eps, float wd, int t, int prec, uint64_t seed);
