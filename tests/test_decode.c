// test_decode.c — the KV-cached forward (model/decode.h) against the training forward: for a random
// model, the logits model_decode gives at each position (a prompt prefilled in one call, then one token
// per call, the cache's rows beyond the position never read) equal model_forward's logits of the same
// prefix to float round-off (1e-4 of the logits' scale; different GEMM shapes round differently; 2e-2
// on "cuda", whose GEMMs round their operands to bf16), and
// rope_rows over a row range is the same bits as rope_fwd's rows. For Mixtral and the families' options
// (QK-norm, biases, shared expert, routing bias) and latent attention (its cache: the latent and the rope
// key; rope_yarn's properties). On cpu; on cuda and cuda-fp32 where a GPU is present (the lead's device
// check: build/test_decode on the GPU machine), else those skip. Not here: the sampling policy
// (tests/test_sample.sh: cached and uncached sampling, token for token).
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

// rope_yarn (ops.h): without YaRN, rows of ld = hd, half pairs: rope_rows' bits; with YaRN and an attention
// factor, over strided rows: adjoint 1 is the transpose (<R x, y> = <x, R^T y> to float round-off); the
// interleaved pairs are the half pairs of the same values de-interleaved (the rotation of pair j the same).
static void check_rope_yarn(const Backend *be) {
    enum { NB = 2, TT = 7, NH = 3, HD = 8, LD = 13, t0 = 2, t1 = 7, n = t1 - t0 };
    size_t N = (size_t)NB * n * NH * LD, bytes = N * sizeof(float);
    float *x = xmalloc(bytes), *y = xmalloc(bytes), *a = xmalloc(bytes), *b = xmalloc(bytes);
    Rng r;
    rng_seed(&r, 9);
    for (size_t i = 0; i < N; i++)
        x[i] = (float)(rng_uniform(&r) * 2 - 1), y[i] = (float)(rng_uniform(&r) * 2 - 1);
    float *d = be->alloc(bytes);
    // (1) ld = hd, no YaRN: rope_rows' bits
    size_t n1 = (size_t)NB * n * NH * HD;
    RopeYarn plain = {10000.0f, 0, 0, 0, 1, 0};
    be->to_device(d, x, n1 * sizeof(float));
    be->rope_yarn(d, NB, t0, t1, NH, HD, HD, plain, 0);
    be->to_host(a, d, n1 * sizeof(float));
    be->to_device(d, x, n1 * sizeof(float));
    be->rope_rows(d, NB, t0, t1, NH, HD, 10000.0f, 0);
    be->to_host(b, d, n1 * sizeof(float));
    EXPECT(!memcmp(a, b, n1 * sizeof(float)), "%s: rope_yarn without YaRN differs from rope_rows", be->name);
    // (2) the adjoint, strided rows (the columns past hd untouched), YaRN with an attention factor
    for (int il = 0; il < 2; il++) {
        RopeYarn yr = {10000.0f, 4.0f, 0.0f, 2.0f, 0.8f, il};
        be->to_device(d, x, bytes);
        be->rope_yarn(d, NB, t0, t1, NH, HD, LD, yr, 0);
        be->to_host(a, d, bytes);
        be->to_device(d, y, bytes);
        be->rope_yarn(d, NB, t0, t1, NH, HD, LD, yr, 1);
        be->to_host(b, d, bytes);
        double rx = 0, xr = 0, nn = 0;
        int kept = 1;
        for (size_t i = 0; i < N; i++) {
            if (i % LD >= HD) kept &= a[i] == x[i] && b[i] == y[i];
            else rx += (double)a[i] * y[i], xr += (double)x[i] * b[i], nn += fabs((double)a[i] * y[i]);
        }
        EXPECT(kept, "%s: rope_yarn wrote past hd of a strided row", be->name);
        EXPECT(fabs(rx - xr) <= 1e-6 * nn, "%s: rope_yarn interleave %d: <R x, y> %.9g != <x, R^T y> %.9g",
               be->name, il, rx, xr);
    }
    // (3) interleaved pairs (2j, 2j+1) = half pairs (j, j + hd/2) of the de-interleaved values
    RopeYarn yi = {10000.0f, 4.0f, 0.0f, 2.0f, 0.8f, 1}, yh = yi;
    yh.interleave = 0;
    for (size_t row = 0; row < N / LD; row++)
        for (int j = 0; j < HD / 2; j++) {
            b[row * LD + j] = x[row * LD + 2 * j];
            b[row * LD + j + HD / 2] = x[row * LD + 2 * j + 1];
        }
    be->to_device(d, x, bytes);
    be->rope_yarn(d, NB, t0, t1, NH, HD, LD, yi, 0);
    be->to_host(a, d, bytes);
    be->to_device(d, b, bytes);
    be->rope_yarn(d, NB, t0, t1, NH, HD, LD, yh, 0);
    be->to_host(y, d, bytes);
    int same = 1;
    for (size_t row = 0; row < N / LD; row++)
        for (int j = 0; j < HD / 2; j++)
            same &=
                a[row * LD + 2 * j] == y[row * LD + j] && a[row * LD + 2 * j + 1] == y[row * LD + j + HD / 2];
    EXPECT(same, "%s: rope_yarn's interleaved pairs differ from the half pairs of the de-interleaved row",
           be->name);
    be->free(d);
    free(x);
    free(y);
    free(a);
    free(b);
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
    // latent attention: the cache holds the latent and the rope key; q_lora, values narrower than the
    // query/key heads, YaRN with both mscales, the interleaved rope pairs; then q_proj, no YaRN
    check_rope_yarn(be);
    ModelConfig f4 = c;
    f4.n_kv_heads = 4;
    f4.q_lora_rank = 12;
    f4.kv_lora_rank = 10;
    f4.qk_nope_head_dim = 6;
    f4.qk_rope_head_dim = 4;
    f4.v_head_dim = 5;
    f4.head_dim = 4;
    f4.rope_interleave = 1;
    f4.rope_factor = 4;
    f4.rope_orig_max = 8;
    f4.yarn_mscale = 0.9f;
    f4.yarn_mscale_all_dim = 0.7f;
    check_model(be, &f4, "latent attention, q_lora, yarn, interleaved");
    ModelConfig f5 = f4;
    f5.q_lora_rank = 0;
    f5.rope_factor = 0;
    f5.rope_orig_max = 0;
    f5.yarn_mscale = f5.yarn_mscale_all_dim = 0;
    f5.rope_interleave = 0;
    f5.v_head_dim = 10;
    check_model(be, &f5, "latent attention, q_proj");
    // DeepSeek-V3's head widths (qk 128 + 64, v 128): on an sm_90 GPU "cuda"'s wgmma kernels for them (ops.h
    // attention_fwd_v), the cache's query rows [t0, t1) against the training forward's whole sequence
    ModelConfig f6 = f5;
    f6.qk_nope_head_dim = 128;
    f6.qk_rope_head_dim = 64;
    f6.head_dim = 64;
    f6.v_head_dim = 128;
    check_model(be, &f6, "latent attention at DeepSeek-V3's head widths");
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
