// attention_bench.c — times the attention ops of a CUDA backend (attention_fwd, attention_bwd:
// causal GQA, layouts as ops.h) on the PEERS.md reference model's shape, to be run beside
// bench/torch_attention_peer.py (PyTorch SDPA, flash backend) in the same device call; with --hv under
// --hd, latent attention's values (attention_fwd_v / attention_bwd_v: v and dout zero from column hv on,
// as mla.c pads them), beside scripts/device/mla_peer.py. Not a test: values are checked by
// tests/test_cuda_ops.c and tests/test_cuda_attn_mla.c. Built as `moe_bench_attention` when CUDA is on.
//   moe_bench_attention [--device cuda|cuda-fp32] [--B 4] [--T 2048] [--H 16] [--KV 8] [--hd 128]
//                       [--hv hd] [--iters 10] [--drop P]
// --drop P > 0 times attention_drop_fwd/bwd (dropout on the probabilities, p = P) instead (hv = hd only).
// FLOPs: causal, counted as half of the full products: 2*B*H*T^2*(hd + hv) forward (S = Q K^T, P V) and
// 2*B*H*T^2*(3 hd + 2 hv) backward (S again, dP, dV, dK, dQ; 2.5x the forward where hv = hd), as
// FlashAttention's papers count them.
#include <stdlib.h>
#include <string.h>
#include <cuda_runtime.h>
#include "core/common.h"
#include "core/rng.h"
#include "ops/ops.h"

#define CK(call) \
    do { \
        cudaError_t e_ = (call); \
        if (e_ != cudaSuccess) DIE("%s: %s", #call, cudaGetErrorString(e_)); \
    } while (0)

static float *drand(const Backend *be, size_t n, Rng *r) {
    float *h = xmalloc(n * sizeof(float)), *d = be->alloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = rng_normal(r);
    be->to_device(d, h, n * sizeof(float));
    free(h);
    return d;
}

// q, k, v as the model hands them to the attention: in the backend's hidden format (ops.h to_hid)
static void *drand_hid(const Backend *be, size_t n, Rng *r) {
    float *f = drand(be, n, r);
    void *h = be->alloc(n * hid_size(be));
    be->to_hid(h, f, n);
    be->free(f);
    return h;
}

static int cmp_f(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    int B = 4, T = 2048, H = 16, KV = 8, hd = 128, hv = 0, iters = 10;
    float drop = 0;
    const char *dev = "cuda";
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--B")) B = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--T")) T = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--H")) H = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--KV")) KV = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hd")) hd = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--hv")) hv = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--iters")) iters = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--device")) dev = argv[i + 1];
        else if (!strcmp(argv[i], "--drop")) drop = (float)atof(argv[i + 1]);
        else DIE("moe_bench_attention: unknown option %s", argv[i]);
    }
    if (!hv) hv = hd;
    CHECK(B > 0 && T > 0 && H > 0 && KV > 0 && H % KV == 0 && hd > 0 && hv > 0 && hv <= hd && iters > 0 &&
              iters <= 1000,
          "moe_bench_attention: bad shape or --iters");
    CHECK(drop >= 0 && drop < 1 && (drop == 0 || hv == hd),
          "moe_bench_attention: --drop must be in [0, 1), "
          "without --hv");
    const Backend *be = backend_by_name(dev);
    CHECK(be && strncmp(be->name, "cuda", 4) == 0, "moe_bench_attention: --device must be a CUDA backend");
    CHECK(hv == hd || (be->attention_fwd_v && be->attention_bwd_v),
          "moe_bench_attention: --hv under --hd needs attention_fwd_v (backend cuda)");
    Rng r;
    rng_seed(&r, 1);
    size_t nq = (size_t)B * T * H * hd, nk = (size_t)B * T * KV * hd;
    void *q = drand_hid(be, nq, &r), *k = drand_hid(be, nk, &r), *v = drand_hid(be, nk, &r);
    float *g = drand(be, nq, &r);
    if (hv < hd) { // the values' padding: zeros in v and dout (ops.h attention_fwd_v)
        CK(cudaMemset2D((char *)v + hv * hid_size(be), hd * hid_size(be), 0, (hd - hv) * hid_size(be),
                        (size_t)B * T * KV));
        CK(cudaMemset2D(g + hv, hd * sizeof(float), 0, (hd - hv) * sizeof(float), (size_t)B * T * H));
    }
    float *o = be->alloc(nq * 4), *l = be->alloc((size_t)B * H * T * 4);
    float *dq = be->alloc(nq * 4), *dk = be->alloc(nk * 4), *dv = be->alloc(nk * 4);
    cudaEvent_t e0, e1, e2;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    CK(cudaEventCreate(&e2));
    float *tf = xmalloc(sizeof(float) * iters), *tb = xmalloc(sizeof(float) * iters);
    for (int it = -3; it < iters; it++) {
        CK(cudaEventRecord(e0, 0));
        if (drop > 0) be->attention_drop_fwd(o, l, q, k, v, B, T, H, KV, hd, 0, T, drop, 1234, 0, 0);
        else if (hv < hd) be->attention_fwd_v(o, l, q, k, v, B, T, H, KV, hd, hv, 0, T);
        else be->attention_fwd(o, l, q, k, v, B, T, H, KV, hd, 0, T);
        CK(cudaEventRecord(e1, 0));
        if (drop > 0) // (dq, dk, dv written, as the model calls it)
            be->attention_drop_bwd(dq, dk, dv, g, o, l, q, k, v, B, T, H, KV, hd, 0, T, drop, 1234, 0, 0, 0);
        else if (hv < hd) // (written, as the model calls it)
            be->attention_bwd_v(dq, dk, dv, g, o, l, q, k, v, B, T, H, KV, hd, hv, 0, T, 0);
        else be->attention_bwd(dq, dk, dv, g, o, l, q, k, v, B, T, H, KV, hd, 0, T, 0);
        CK(cudaEventRecord(e2, 0));
        CK(cudaEventSynchronize(e2));
        if (it >= 0) {
            CK(cudaEventElapsedTime(&tf[it], e0, e1));
            CK(cudaEventElapsedTime(&tb[it], e1, e2));
        }
    }
    qsort(tf, iters, sizeof(float), cmp_f);
    qsort(tb, iters, sizeof(float), cmp_f);
    double bht = (double)B * H * T * T, ff = bht * (hd + hv), fb = bht * (3 * hd + 2 * hv),
           mf = tf[iters / 2], mb = tb[iters / 2];
    printf("{\"impl\": \"moe.c %s\", \"B\": %d, \"T\": %d, \"H\": %d, \"KV\": %d, \"hd\": %d, \"hv\": %d, "
           "\"drop\": %g, \"fwd_ms\": %.3f, \"bwd_ms\": %.3f, \"fwd_tflops\": %.1f, \"bwd_tflops\": %.1f}\n",
           be->name, B, T, H, KV, hd, hv, drop, mf, mb, ff / mf / 1e9, fb / mb / 1e9);
    be->free(q);
    be->free(k);
    be->free(v);
    be->free(g);
    be->free(o);
    be->free(l);
    be->free(dq);
    be->free(dk);
    be->free(dv);
    free(tf);
    free(tb);
    return 0;
}
