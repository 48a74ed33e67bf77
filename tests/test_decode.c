// test_decode.c — the KV-cached forward (model/decode.h) against the training forward: for a random
// model, the logits model_decode gives at each position (a prompt prefilled in one call, then one token
// per call, the cache's rows beyond the position never read) equal model_forward's logits of the same
// prefix to float round-off (1e-4 of the logits' scale; different GEMM shapes round differently; 2e-2
// on "cuda", whose GEMMs round their operands to bf16), and
// rope_rows over a row range is the same bits as rope_fwd's rows. For Mixtral and the families' options
// (QK-norm, biases, shared expert, routing bias). On cpu; on cuda and cuda-fp32 where a
// GPU is present (the lead's device check: build/test_decode on the GPU machine), else those skip.
// Not here: the sampling policy (tests/test_sample.sh: cached and uncached sampling, token for token).
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "model/decode.h"
#include "test_cfg.h"
#include "test_util.h"

enum { T = 24, PROMPT = 5, V = 64 };

static void config(ModelConfig *c) {
    _Static_assert(V == 64, "V is test_tiny_cfg's vocabulary");
    test_tiny_cfg(c, 2, 32);
    c->dispatch = DISPATCH_DROPLESS;
}

static void check_rope(const Backend *be) {
    int B = 2, TT = 10, nh = 3, hd = 8, t0 = 4, t1 = 9, n = t1 - t0;
    size_t row = (size_t)nh * hd;
    float *x = xmalloc(B * TT * row * sizeof(float)), *y = xmalloc(B * n * row * sizeof(float));
    float *xh = xmalloc(B * TT * row * sizeof(float)), *yh = xmalloc(B * n * row * sizeof(float));
    Rng r;
    rng_seed(&r, 3);
    for (size_t i = 0; i < B * TT * row; i++) xh[i] = (float)(rng_uniform(&r) * 2 - 1);
    for (int b = 0; b < B; b++)
        memcpy(yh + (size_t)b * n * row, xh + ((size_t)b * TT + t0) * row, n * row * sizeof(float));
    float *xd = be->alloc(B * TT * row * sizeof(float)), *yd = be->alloc(B * n * row * sizeof(float));
    be->to_device(xd, xh, B * TT * row * sizeof(float));
    be->to_device(yd, yh, B * n * row * sizeof(float));
    for (int inv = 0; inv < 2; inv++) {
        (inv ? be->rope_bwd : be->rope_fwd)(xd, B, TT, nh, hd, 10000.0f);
        be->rope_rows(yd, B, t0, t1, nh, hd, 10000.0f, inv);
        be->to_host(x, xd, B * TT * row * sizeof(float));
        be->to_host(y, yd, B * n * row * sizeof(float));
        int same = 1;
        for (int b = 0; b < B; b++)
            same &=
                !memcmp(y + (size_t)b * n * row, x + ((size_t)b * TT + t0) * row, n * row * sizeof(float));
        EXPECT(same, "%s: rope_rows(inverse %d) over rows [%d, %d) differs from rope over [0, %d)", be->name,
               inv, t0, t1, TT);
    }
    be->free(xd);
    be->free(yd);
    free(x);
    free(y);
    free(xh);
    free(yh);
}

static void check_model(const Backend *be, const ModelConfig *cfg, const char *label) {
    ModelConfig c = *cfg;
    Model m;
    model_init(&m, &c, be, 1, T, NULL);
    float *params = xmalloc(m.t.ltotal * sizeof(float));
    params_init(&m.t, &c, params, 11);
    Rng pr; // every tensor moved off its init (biases 0, norms 1, routing bias 0 would hide a missing term)
    rng_seed(&pr, 13);
    for (size_t i = 0; i < m.t.ltotal; i++) params[i] += 0.05f * (float)rng_normal(&pr);
    be->to_device(m.params, params, m.t.ltotal * sizeof(float));
    int32_t tok[T];
    Rng r;
    rng_seed(&r, 5);
    for (int i = 0; i < T; i++) tok[i] = (int32_t)rng_below(&r, V);
    // the reference: the training forward over each prefix, its last row
    float *ref = xmalloc((size_t)T * V * sizeof(float)), *got = xmalloc((size_t)V * sizeof(float));
    double scale = 0;
    for (int t = PROMPT - 1; t < T; t++) {
        model_forward(&m, tok, NULL, 1, t + 1, 0, 0);
        model_logits_row(&m, 0, t, ref + (size_t)t * V);
        for (int v = 0; v < V; v++)
            if (fabs(ref[(size_t)t * V + v]) > scale) scale = fabs(ref[(size_t)t * V + v]);
    }
    EXPECT(model_decode_supported(&m), "%s: a one-chunk model must decode with a cache", be->name);
    KvCache kc;
    kv_init(&kc, &m, T);
    double worst = 0;
    for (int t = PROMPT - 1; t < T; t++) {
        if (t == PROMPT - 1) model_decode(&m, &kc, tok, PROMPT, got); // the prompt in one call
        else model_decode(&m, &kc, tok + t, 1, got);
        EXPECT(kc.len == t + 1, "%s: cache holds %d positions after position %d", be->name, kc.len, t);
        for (int v = 0; v < V; v++) {
            double d = fabs(got[v] - ref[(size_t)t * V + v]);
            if (d > worst) worst = d;
        }
    }
    // bf16 GEMM operands ("cuda"): a round-off upstream can move a bf16 rounding, so a looser band
    double tol = (strcmp(be->name, "cuda") ? 1e-4 : 2e-2) * scale;
    EXPECT(worst <= tol, "%s, %s: cached logits differ from the training forward's by %.3g (scale %.3g)",
           be->name, label, worst, scale);
    printf("%s, %s: cached vs uncached logits: max |diff| %.3g (logit scale %.3g)\n", be->name, label, worst,
           scale);
    // a cache restarted at 0 gives the same logits again (the sampler's re-prefill after a slide)
    kc.len = 0;
    model_decode(&m, &kc, tok, T, got);
    double w2 = 0;
    for (int v = 0; v < V; v++) {
        double d = fabs(got[v] - ref[(size_t)(T - 1) * V + v]);
        if (d > w2) w2 = d;
    }
    EXPECT(w2 <= tol, "%s: a re-prefill of %d positions differs by %.3g", be->name, T, w2);
    kv_free(&kc, &m);
    free(ref);
    free(got);
    free(params);
    model_free(&m);
}

// Mixtral, and the families' options the decode repeats (QK-norm full and per head, q/k/v biases with
// a gated shared expert, the aux-free routing bias).
static void check_backend(const Backend *be) {
    check_rope(be);
    ModelConfig c;
    config(&c);
    check_model(be, &c, "mixtral");
    ModelConfig f1 = c;
    f1.family = FAM_OLMOE;
    f1.qk_norm = QK_NORM_FULL;
    f1.renormalize = 0;
    check_model(be, &f1, "olmoe qk-norm full");
    ModelConfig f2 = c;
    f2.family = FAM_QWEN3_MOE;
    f2.qk_norm = QK_NORM_HEAD;
    f2.head_dim = 6;
    check_model(be, &f2, "qwen3_moe qk-norm per head, hd 6");
    ModelConfig f3 = c;
    f3.family = FAM_QWEN2_MOE;
    f3.qkv_bias = 1;
    f3.n_shared_experts = 1;
    f3.shared_d_ff = 40;
    f3.shared_gate = 1;
    f3.renormalize = 0;
    f3.balance = BALANCE_AUX_FREE;
    check_model(be, &f3, "qwen2_moe biases, gated shared expert, aux-free bias");
}

int main(void) {
    check_backend(backend_cpu());
    if (backend_cuda_available()) {
        check_backend(backend_cuda_fp32());
        check_backend(backend_cuda());
    } else {
        printf("no GPU: cuda and cuda-fp32 not checked\n");
    }
    return test_done("test_decode");
}
