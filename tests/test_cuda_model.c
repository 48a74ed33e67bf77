// test_cuda_model.c — the whole model on backend_cuda() against backend_cpu(): same config, same
// parameters, same batch. Compares the loss, aux and z losses, the routing (every layer's top-k
// choice and expert counts), the logits of an eval forward, and every gradient tensor of the
// parameter table after a training forward + backward. Also checks that the GPU step is
// deterministic (two runs, bit-identical gradients). Skips (exit 77) without a GPU.
//
// Tolerance: per element |gpu - cpu| / (|cpu| + rms(cpu tensor)) <= MODEL_RTOL = 5e-4, and
// |loss_gpu - loss_cpu| <= 1e-5 |loss_cpu|. Why: each op agrees to ~1e-6 relative (float32 with a
// different summation order; see test_cuda_ops.c). The router weights are scaled up 20x (so that
// the top-k choice is decisive and identical on both sides), which makes router logits ~20 in
// size: their ~1e-6 relative rounding difference is ~2e-5 absolute, i.e. ~2e-5 relative in the
// router probabilities and the combine weights, and it grows along the backward chain. Measured
// on an H200: logits 4e-5, worst gradient 1.25e-4 (the embedding, at the end of the backward
// chain), loss 3e-8; 5e-4 leaves a 4x margin, while a wrong or missing term in any op moves its
// tensor by O(1). The routing must match exactly (a flip would be reported as such).
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "model/model.h"
#include "test_util.h"

#define MODEL_RTOL 5e-4
#define LOSS_RTOL 1e-5

static double worst_all;

// Worst per-element error of got against ref (n floats), relative to |ref| + rms(ref).
static double rel_err(const float *got, const float *ref, size_t n, size_t *bad_out, size_t *first) {
    double rms = 0;
    for (size_t i = 0; i < n; i++) rms += (double)ref[i] * ref[i];
    rms = sqrt(rms / (n ? n : 1));
    double worst = 0;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - ref[i]) / (fabs(ref[i]) + rms + 1e-30);
        if (!(e <= MODEL_RTOL)) { if (!bad) *first = i; bad++; }
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    *bad_out = bad;
    return worst;
}

static void check_config(const char *label, ModelConfig c, int B, int T, uint64_t noise_seed) {
    const Backend *cpu = backend_cpu(), *gpu = backend_cuda();
    Model mc, mg;
    model_init(&mc, &c, cpu, B, T, NULL);
    model_init(&mg, &c, gpu, B, T, NULL);
    CHECK(mc.t.ltotal == mg.t.ltotal, "parameter tables differ");
    size_t P = mc.t.ltotal, N = (size_t)B * T, V = c.vocab_size;
    Rng r;
    rng_seed(&r, 99);
    params_init(&mc.t, &c, mc.params, 7);   // cpu buffers are host memory
    for (int i = 0; i < mc.t.n; i++) {
        const ParamSpec *s = &mc.t.p[i];
        float *p = mc.params + s->loffset;
        // decisive routing (see the header), and norm weights that are not all 1
        if (s->role == PR_ROUTER) for (size_t j = 0; j < s->lnumel; j++) p[j] *= 20.0f;
        if (s->ndim == 1) for (size_t j = 0; j < s->lnumel; j++) p[j] += 0.2f * rng_normal(&r);
    }
    gpu->to_device(mg.params, mc.params, P * sizeof(float));
    int32_t *x = xmalloc(N * sizeof(int32_t)), *y = xmalloc(N * sizeof(int32_t));
    for (size_t i = 0; i < N; i++) { x[i] = rng_below(&r, c.vocab_size); y[i] = rng_below(&r, c.vocab_size); }
    const float aux = 0.3f, zc = 0.05f, dloss = 1.0f / N;
    int fails0 = t_failures;

    // eval forward: logits and loss
    double lc = model_forward(&mc, x, y, B, T, 0, 0), lg = model_forward(&mg, x, y, B, T, 0, 0);
    EXPECT(fabs(lg - lc) <= LOSS_RTOL * fabs(lc), "[%s] eval loss: cuda %.9g cpu %.9g", label, lg, lc);
    float *lgts = xmalloc(N * V * sizeof(float));
    gpu->to_host(lgts, mg.logits, N * V * sizeof(float));
    size_t bad, first = 0;
    double e_logits = rel_err(lgts, mc.logits, N * V, &bad, &first);
    EXPECT(bad == 0, "[%s] logits: %zu of %zu out of tolerance; first [%zu] cuda %.9g cpu %.9g", label, bad, N * V,
           first, bad ? lgts[first] : 0.0, bad ? mc.logits[first] : 0.0);

    // training forward + backward, twice on the GPU (determinism)
    gpu->zero(mg.grads, P * sizeof(float));
    memset(mc.grads, 0, P * sizeof(float));
    lc = model_forward(&mc, x, y, B, T, dloss, noise_seed);
    model_backward(&mc, aux, zc);
    float *g1 = xmalloc(P * sizeof(float)), *g2 = xmalloc(P * sizeof(float));
    for (int run = 0; run < 2; run++) {
        gpu->zero(mg.grads, P * sizeof(float));
        lg = model_forward(&mg, x, y, B, T, dloss, noise_seed);
        model_backward(&mg, aux, zc);
        gpu->to_host(run ? g2 : g1, mg.grads, P * sizeof(float));
    }
    EXPECT(memcmp(g1, g2, P * sizeof(float)) == 0, "[%s] two GPU steps on the same inputs gave different gradients",
           label);
    EXPECT(fabs(lg - lc) <= LOSS_RTOL * fabs(lc), "[%s] train loss: cuda %.9g cpu %.9g", label, lg, lc);
    EXPECT(fabs(mg.aux - mc.aux) <= LOSS_RTOL * fabs(mc.aux) + 1e-9, "[%s] aux: cuda %.9g cpu %.9g", label, mg.aux, mc.aux);
    EXPECT(fabs(mg.z - mc.z) <= 1e-4 * fabs(mc.z) + 1e-9, "[%s] z: cuda %.9g cpu %.9g", label, mg.z, mc.z);
    EXPECT(mg.dropped == mc.dropped, "[%s] dropped: cuda %lld cpu %lld", label, (long long)mg.dropped,
           (long long)mc.dropped);
    int route_same = 1;
    for (int l = 0; l < c.n_layers; l++)
        route_same &= memcmp(mg.la[l].moe.idx_h, mc.la[l].moe.idx_h, N * c.top_k * sizeof(int32_t)) == 0;
    route_same &= memcmp(mg.expert_counts, mc.expert_counts, sizeof(int64_t) * c.n_layers * c.n_experts) == 0;
    EXPECT(route_same, "[%s] routing differs between cuda and cpu (top-k choice or expert counts)", label);

    // every gradient tensor
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < mc.t.n; i++) {
        const ParamSpec *s = &mc.t.p[i];
        if (!s->lnumel) continue;
        double e = rel_err(g1 + s->loffset, mc.grads + s->loffset, s->lnumel, &bad, &first);
        if (e > worst) { worst = e; worst_name = s->name; }
        EXPECT(bad == 0, "[%s] grad %s: %zu of %zu out of tolerance; first [%zu] cuda %.9g cpu %.9g", label, s->name,
               bad, s->lnumel, first, bad ? g1[s->loffset + first] : 0.0, bad ? mc.grads[s->loffset + first] : 0.0);
    }
    if (worst > worst_all) worst_all = worst;
    if (e_logits > worst_all) worst_all = e_logits;
    printf("%-34s loss cpu %.7f cuda %.7f (rel %.1e) | logits max rel %.2e | grads max rel %.2e (%s) | %s\n", label,
           lc, lg, fabs(lg - lc) / fabs(lc), e_logits, worst, worst_name, t_failures == fails0 ? "ok" : "FAIL");
    free(x); free(y); free(lgts); free(g1); free(g2);
    model_free(&mc);
    model_free(&mg);
}

int main(void) {
    if (!backend_cuda_available()) TEST_SKIP("no CUDA GPU (or a build without CUDA): backend_cuda_available() = 0");
    ModelConfig c;
    config_preset(&c, "tiny");
    c.vocab_size = 300; c.d_model = 96; c.n_layers = 2; c.n_heads = 4; c.n_kv_heads = 2; c.head_dim = 24;
    c.d_ff = 64; c.n_experts = 4; c.top_k = 2; c.max_seq_len = 64; c.init_std = 0.1f;
    check_config("dropless renorm k=2 GQA 4/2", c, 2, 40, 0);
    ModelConfig c2 = c;
    c2.dispatch = DISPATCH_CAPACITY; c2.capacity_factor = 0.75f; c2.renormalize = 0; c2.jitter = 0.1f;
    c2.n_kv_heads = 1; c2.top_k = 1;
    check_config("capacity 0.75 k=1 jitter MQA", c2, 3, 33, 12345);
    ModelConfig c3 = c;
    c3.top_k = 4; c3.head_dim = 64; c3.n_heads = 2; c3.n_kv_heads = 2; c3.d_model = 128;
    check_config("dropless k=E hd=64", c3, 1, 64, 0);
    printf("worst relative difference over all configs: %.2e (tolerance %.0e)\n", worst_all, MODEL_RTOL);
    return test_done("test_cuda_model");
}
