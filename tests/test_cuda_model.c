// test_cuda_model.c — the whole model on the CUDA backends against the cpu: "cuda-fp32" against
// backend_cpu(), and "cuda" (bf16 tensor-core GEMMs) against bf16_ref.h's cpu backend, whose GEMMs
// round the same operands to bf16 (so the same function is computed and float32-level bands
// apply), plus a bf16-band check of the loss against the plain float32 cpu. Same config, same
// parameters, same batch. Compares the loss, aux and z losses, the routing (every layer's top-k
// choice and expert counts), the logits of an eval forward, and every gradient tensor of the
// parameter table after a training forward + backward (with MTP modules: their loss too). Also checks
// that the GPU step is deterministic (two runs, bit-identical gradients). Skips (exit 77) without a GPU.
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
// Sigmoid-scored routers (DeepSeek-V3) are scaled 2x, not 20x: at 20x the scores saturate, the router's
// gradient s(1 - s) dy is a difference of nearly equal bf16-rounded values, and the bf16 comparison stops
// being a test of the code: on the cpu, bf16_ref.h's own gradients moved 1.8e-2..6.7e-2 norm-wise (router
// gate, seeds 7..10) when every parameter was perturbed by 1e-6 relative, and up to 0.88 at 3e-6 (a routing
// flip); at 2x they moved 0.9e-2..1.4e-2 with no flip (2026-12-03; the "cuda" run of that model at 20x
// was 9.2e-2 from the reference, which had been read as a fault of the dense layers).
// "cuda" against bf16_ref.h: the same bf16-rounded GEMM operands on both sides, but not the same
// float32 inputs: those differ by ~1e-6 (summation order upstream), and an input that close to a
// bf16 rounding boundary rounds to the other neighbour on the other side (1 bf16 ulp, 2^-7 of the
// element), which the backward chain then amplifies as above (router x20). So the comparison is
// norm-wise per tensor, ||gpu - ref|| / ||ref|| <= MODEL_NORM_BF16 = 2e-2, with a per-element
// outlier bound MODEL_RTOL_BF16 = 0.1 (it catches unwritten, NaN or misplaced elements, which are
// O(1)), losses within 1e-3 and the routing identical. Measured on the cpu with a stand-in for the
// GPU (bf16 operands, GEMMs summed in double, optionally every GEMM output perturbed by 1e-6
// relative to mimic the GPU's other kernels): norm-wise 3.0e-3 (5.2e-3 perturbed), per element
// 2.0e-2 (4.0e-2), losses 3.8e-6 (1.1e-4), routing identical.
// "cuda" against the plain float32 cpu (what bf16 costs): losses within LOSS_RTOL_BF16 = 1e-2
// (METHOD.md's upper end for bf16 operands; the stand-in gave 5e-5..7e-4). The routing differs in
// a few tokens whose top-k gap is under the bf16 error (stand-in: 3 of 320, 2 of 198, 2 of 512),
// so gradients are not compared there, and the routing is reported, not required.
// MOE_TEST_STANDIN=EPS:SEED (no GPU needed; a measurement, not a test): "cuda" replaced by bf16_ref.h's
// backend itself with every parameter moved by EPS relative (uniform, drawn from SEED) after the upload, so
// each config's columns say how far a model this conditioned moves under input differences of that size:
// what a kernel change's new rounding can cost against the bands. Measured 2026-12-06 (EPS 1e-7, seeds 1-4,
// the gradients' per-element worst / norm-wise worst): "dropless renorm" 1.0-5.0e-2 / 1.5-5.5e-3, "dropless
// k=E hd=64" 5.2e-2-0.120 / 5.3-12.7e-3, "mtp" 2.6e-2-0.155, "latent attention at DeepSeek-V3's widths"
// 2.2e-2-0.342 / 3.8e-3-2.7e-2; 1.2e-1..3.4e-1 over all configs in every seed. So inputs 1e-7 apart (the
// GPU's float32 sums differ from bf16_ref.h's by about that) move some elements past MODEL_RTOL_BF16, and
// one case past MODEL_NORM_BF16: these bands hold on the GPU with little margin, and a kernel change that
// adds a rounding can fail them with no fault in the code (read such a failure with this run beside it).
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "model/model.h"
#include "test_util.h"
#include "gpu_util.h"
#include "bf16_ref.h"

#define MODEL_RTOL 5e-4
#define LOSS_RTOL 1e-5
#define MODEL_RTOL_BF16 1e-1
#define MODEL_NORM_BF16 2e-2
#define LOSS_RTOL_BF16 1e-2
#define LOSS_RTOL_BF16REF 1e-3

static double g_rtol = MODEL_RTOL, g_norm = MODEL_RTOL; // per-element and norm-wise tolerances of the pair

static double worst_all;
static double g_standin_eps; // MOE_TEST_STANDIN (above): 0 off
static uint64_t g_standin_seed;

static void standin_perturb(float *p, size_t n) {
    Rng r;
    rng_seed(&r, g_standin_seed);
    for (size_t i = 0; i < n; i++) p[i] *= (float)(1 + g_standin_eps * (2 * (double)rng_uniform(&r) - 1));
}

// gpu against ref (a cpu backend); fp32: when gpu is "cuda", the plain float32 cpu for the loose
// bf16 check of the losses (NULL otherwise).
static void check_config(const char *label, ModelConfig c, int B, int T, uint64_t noise_seed,
                         const Backend *gpu, const Backend *cpu, const Backend *fp32) {
    Model mc, mg;
    model_init(&mc, &c, cpu, B, T, NULL);
    model_init(&mg, &c, gpu, B, T, NULL);
    for (int l = 0; l < config_all_layers(&c); l++) // (the MTP modules' blocks too)
        mc.la[l].moe.host_router_out = mg.la[l].moe.host_router_out = 1; // idx_h
    CHECK(mc.t.ltotal == mg.t.ltotal, "parameter tables differ");
    size_t P = mc.t.ltotal, N = (size_t)B * T, V = c.vocab_size;
    Rng r;
    rng_seed(&r, 99);
    params_init(&mc.t, &c, mc.params, 7); // cpu buffers are host memory
    for (int i = 0; i < mc.t.n; i++) {
        const ParamSpec *s = &mc.t.p[i];
        float *p = mc.params + s->loffset;
        // decisive routing (see the header), and norm weights that are not all 1
        if (s->role == PR_ROUTER)
            for (size_t j = 0; j < s->lnumel; j++) p[j] *= c.route_sigmoid ? 2.0f : 20.0f;
        if (s->ndim == 1)
            for (size_t j = 0; j < s->lnumel; j++) p[j] += 0.2f * rng_normal(&r);
    }
    gpu->to_device(mg.params, mc.params, P * sizeof(float));
    if (g_standin_eps) standin_perturb(mg.params, P); // (a cpu backend's "device" memory is the host's)
    int32_t *x = xmalloc(N * sizeof(int32_t)), *y = xmalloc(N * sizeof(int32_t));
    for (size_t i = 0; i < N; i++) {
        x[i] = rng_below(&r, c.vocab_size);
        y[i] = rng_below(&r, c.vocab_size);
    }
    const float aux = 0.3f, zc = 0.05f, dloss = 1.0f / N;
    int fails0 = t_failures;
    const int bf = fp32 != NULL;
    const double ltol = bf ? LOSS_RTOL_BF16REF : LOSS_RTOL, ztol = bf ? 1e-3 : 1e-4;
    g_rtol = bf ? MODEL_RTOL_BF16 : MODEL_RTOL;
    g_norm = bf ? MODEL_NORM_BF16 : MODEL_RTOL;

    // eval forward: logits and loss
    double lc = model_forward(&mc, x, y, B, T, 0, 0), lg = model_forward(&mg, x, y, B, T, 0, 0);
    EXPECT(fabs(lg - lc) <= ltol * fabs(lc), "[%s] eval loss: cuda %.9g cpu %.9g", label, lg, lc);
    double le = lg;
    float *lgts = xmalloc(N * V * sizeof(float));
    gpu->to_host(lgts, mg.logits, N * V * sizeof(float));
    double worst_norm = 0;
    GpuErr el = gpu_err(lgts, mc.logits, N * V, g_rtol);
    double e_logits = el.worst;
    EXPECT(el.norm <= g_norm, "[%s] logits: norm-wise relative error %.3e > %.0e", label, el.norm, g_norm);
    if (el.norm > worst_norm) worst_norm = el.norm;
    EXPECT(el.bad == 0, "[%s] logits: %zu of %zu out of tolerance; first [%zu] cuda %.9g cpu %.9g", label,
           el.bad, N * V, el.first, el.bad ? lgts[el.first] : 0.0, el.bad ? mc.logits[el.first] : 0.0);

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
    EXPECT(memcmp(g1, g2, P * sizeof(float)) == 0,
           "[%s] two GPU steps on the same inputs gave different gradients", label);
    EXPECT(fabs(lg - lc) <= ltol * fabs(lc), "[%s] train loss: cuda %.9g cpu %.9g", label, lg, lc);
    EXPECT(fabs(mg.aux - mc.aux) <= ltol * fabs(mc.aux) + 1e-9, "[%s] aux: cuda %.9g cpu %.9g", label, mg.aux,
           mc.aux);
    EXPECT(fabs(mg.z - mc.z) <= ztol * fabs(mc.z) + 1e-9, "[%s] z: cuda %.9g cpu %.9g", label, mg.z, mc.z);
    EXPECT(mg.dropped == mc.dropped, "[%s] dropped: cuda %lld cpu %lld", label, (long long)mg.dropped,
           (long long)mc.dropped);
    EXPECT(fabs(mg.mtp_loss - mc.mtp_loss) <= ltol * fabs(mc.mtp_loss), "[%s] mtp loss: cuda %.9g cpu %.9g",
           label, mg.mtp_loss, mc.mtp_loss);
    int route_same = 1;
    for (int l = 0; l < config_all_layers(&c); l++)
        route_same &= mc.la[l].moe.dense || // (a dense layer routes nothing)
            memcmp(mg.la[l].moe.idx_h, mc.la[l].moe.idx_h, N * c.top_k * sizeof(int32_t)) == 0;
    route_same &= memcmp(mg.expert_counts, mc.expert_counts,
                         sizeof(int64_t) * config_all_layers(&c) * c.n_experts) == 0;
    EXPECT(route_same, "[%s] routing differs between cuda and cpu (top-k choice or expert counts)", label);

    // every gradient tensor
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < mc.t.n; i++) {
        const ParamSpec *s = &mc.t.p[i];
        if (!s->lnumel) continue;
        GpuErr e = gpu_err(g1 + s->loffset, mc.grads + s->loffset, s->lnumel, g_rtol);
        if (e.worst > worst) {
            worst = e.worst;
            worst_name = s->name;
        }
        if (e.norm > worst_norm) worst_norm = e.norm;
        EXPECT(e.norm <= g_norm, "[%s] grad %s: norm-wise relative error %.3e > %.0e", label, s->name, e.norm,
               g_norm);
        EXPECT(e.bad == 0, "[%s] grad %s: %zu of %zu out of tolerance; first [%zu] cuda %.9g cpu %.9g", label,
               s->name, e.bad, s->lnumel, e.first, e.bad ? g1[s->loffset + e.first] : 0.0,
               e.bad ? mc.grads[s->loffset + e.first] : 0.0);
    }
    // the bf16 policy's packed expert gradients (model_set_expert_grads OPTG_PACKED, written by a step's
    // first backward): each routed-expert element the bf16 (nearest even) of the float32 gradient of the same
    // GPU step above, bit for bit (the same accumulators, rounded), every other tensor the same bits
    model_set_expert_grads(&mg, OPTG_PACKED);
    model_zero_grads(&mg);
    model_forward(&mg, x, y, B, T, dloss, noise_seed);
    model_backward(&mg, aux, zc);
    model_grads_settle(&mg);
    gpu->to_host(g2, mg.grads, P * sizeof(float));
    size_t pk_bad = 0, pk_n = 0, other_bad = 0;
    for (int i = 0; i < mc.t.n; i++) {
        const ParamSpec *s = &mc.t.p[i];
        int64_t gb;
        if (model_grad_format(&mg, s, &gb) != OPTG_PACKED) {
            other_bad += memcmp(g2 + s->loffset, g1 + s->loffset, s->lnumel * sizeof(float)) != 0;
            continue;
        }
        for (size_t j = 0; j < s->lnumel; j++, pk_n++) {
            uint16_t h;
            memcpy(&h, (const char *)(g2 + gb) + 2 * (s->loffset + j - (size_t)gb), 2);
            pk_bad += h != bf16_rn_bits(g1[s->loffset + j]);
        }
    }
    EXPECT(pk_n > 0 && pk_bad == 0,
           "[%s] packed expert gradients: %zu of %zu are not the bf16 of the float32 step's", label, pk_bad,
           pk_n);
    EXPECT(other_bad == 0, "[%s] packed expert gradients: %zu other tensors changed", label, other_bad);
    if (worst > worst_all) worst_all = worst;
    if (e_logits > worst_all) worst_all = e_logits;
    char vs32[160] = "";
    if (bf) {
        // what bf16 costs: the same step on the plain float32 cpu (eval and train losses)
        Model mf;
        model_init(&mf, &c, fp32, B, T, NULL);
        for (int l = 0; l < config_all_layers(&c); l++) mf.la[l].moe.host_router_out = 1;
        memcpy(mf.params, mc.params, P * sizeof(float));
        double fe = model_forward(&mf, x, y, B, T, 0, 0);
        memset(mf.grads, 0, P * sizeof(float));
        double ft = model_forward(&mf, x, y, B, T, dloss, noise_seed);
        if (getenv("MOE_TEST_VS32")) { // diagnostics: each gradient's distance from the float32 cpu's, both
                                       // sides
            model_backward(&mf, aux, zc);
            for (int i = 0; i < mc.t.n; i++) {
                const ParamSpec *s = &mc.t.p[i];
                if (!s->lnumel) continue;
                double n1 = gpu_err(g1 + s->loffset, mf.grads + s->loffset, s->lnumel, g_rtol).norm,
                       n2 = gpu_err(mc.grads + s->loffset, mf.grads + s->loffset, s->lnumel, g_rtol).norm,
                       n3 = gpu_err(g1 + s->loffset, mc.grads + s->loffset, s->lnumel, g_rtol).norm;
                printf("  vs32 %-52s cuda-f32 %.2e  bf16ref-f32 %.2e  cuda-bf16ref %.2e\n", s->name, n1, n2,
                       n3);
            }
        }
        size_t same = 0, all = 0;
        for (int l = 0; l < c.n_layers; l++)
            for (size_t i = 0; i < N * c.top_k && !mf.la[l].moe.dense; i++, all++)
                same += mg.la[l].moe.idx_h[i] == mf.la[l].moe.idx_h[i];
        double re = fabs(le - fe) / fabs(fe), rt = fabs(lg - ft) / fabs(ft);
        EXPECT(re <= LOSS_RTOL_BF16 && rt <= LOSS_RTOL_BF16,
               "[%s] bf16 vs float32 cpu: eval loss %.9g vs %.9g, train loss %.9g vs %.9g (rel > %.0e)",
               label, le, fe, lg, ft, LOSS_RTOL_BF16);
        snprintf(vs32, sizeof vs32, " | vs fp32 cpu: loss rel %.1e/%.1e, routing %zu/%zu same", re, rt, same,
                 all);
        model_free(&mf);
    }
    printf("%-34s %-9s loss ref %.7f gpu %.7f (rel %.1e) | logits max rel %.2e | grads max rel %.2e (%s) | "
           "norm-wise %.2e%s | %s\n",
           label, gpu->name, lc, lg, fabs(lg - lc) / fabs(lc), e_logits, worst, worst_name, worst_norm, vs32,
           t_failures == fails0 ? "ok" : "FAIL");
    free(x);
    free(y);
    free(lgts);
    free(g1);
    free(g2);
    model_free(&mc);
    model_free(&mg);
}

// --loss-chunks 3 (model_state.h model_set_loss_chunks: each chunk's head backward taken in its forward, a
// chunk's logits at a time; 80 rows in chunks of 27, the last 26) against 1 on the same GPU backend, with an
// MTP module (its head chunked, its rows without a target zeroed per chunk): the training loss and MTP loss
// within LOSS_RTOL (each row's products the same; cuBLAS may take other kernels for other row counts), every
// gradient within the pair's bands (the head's weight gradient sums its rows chunk by chunk).
static void check_loss_chunks(ModelConfig c, int B, int T, const Backend *gpu, int bf) {
    c.mtp_depth = 1;
    Model a, b;
    model_init(&a, &c, gpu, B, T, NULL);
    model_init(&b, &c, gpu, B, T, NULL);
    model_set_loss_chunks(&b, 3);
    size_t P = a.t.ltotal, N = (size_t)B * T;
    float *h = xmalloc(P * sizeof(float)), *ga = xmalloc(P * sizeof(float)), *gb = xmalloc(P * sizeof(float));
    params_init(&a.t, &c, h, 7);
    gpu->to_device(a.params, h, P * sizeof(float));
    gpu->to_device(b.params, h, P * sizeof(float));
    Rng r;
    rng_seed(&r, 5);
    int32_t *x = xmalloc(N * sizeof(int32_t)), *y = xmalloc(N * sizeof(int32_t));
    for (size_t i = 0; i < N; i++) {
        x[i] = rng_below(&r, c.vocab_size);
        y[i] = rng_below(&r, c.vocab_size);
    }
    double l[2], mtp[2];
    Model *ms[2] = {&a, &b};
    for (int k = 0; k < 2; k++) {
        gpu->zero(ms[k]->grads, P * sizeof(float));
        l[k] = model_forward(ms[k], x, y, B, T, 1.0f / N, 0);
        mtp[k] = ms[k]->mtp_loss;
        model_backward(ms[k], 0.3f, 0.05f);
        gpu->to_host(k ? gb : ga, ms[k]->grads, P * sizeof(float));
    }
    EXPECT(fabs(l[1] - l[0]) <= LOSS_RTOL * fabs(l[0]) && fabs(mtp[1] - mtp[0]) <= LOSS_RTOL * fabs(mtp[0]),
           "[%s --loss-chunks 3] loss %.9g mtp %.9g against --loss-chunks 1's %.9g %.9g", gpu->name, l[1],
           mtp[1], l[0], mtp[0]);
    double rt = bf ? MODEL_RTOL_BF16 : MODEL_RTOL, nb = bf ? MODEL_NORM_BF16 : MODEL_RTOL;
    for (int i = 0; i < a.t.n; i++) {
        const ParamSpec *s = &a.t.p[i];
        GpuErr e = gpu_err(gb + s->loffset, ga + s->loffset, s->lnumel, rt);
        EXPECT(e.norm <= nb && e.bad == 0,
               "[%s --loss-chunks 3] grad %s: norm-wise %.3e, %zu elements out of %.0e", gpu->name, s->name,
               e.norm, e.bad, rt);
    }
    model_free(&a);
    model_free(&b);
    free(h);
    free(ga);
    free(gb);
    free(x);
    free(y);
}

int main(void) {
    const char *sti = getenv("MOE_TEST_STANDIN");
    if (sti && *sti) {
        CHECK(sscanf(sti, "%lf:%" SCNu64, &g_standin_eps, &g_standin_seed) == 2 && g_standin_eps > 0,
              "MOE_TEST_STANDIN=%s: EPS:SEED, EPS > 0", sti);
    } else if (!backend_cuda_available()) {
        TEST_SKIP("no CUDA GPU (or a build without CUDA): backend_cuda_available() = 0");
    }
    ModelConfig c;
    config_preset(&c, "tiny");
    c.vocab_size = 300;
    c.d_model = 96;
    c.n_layers = 2;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 24;
    c.d_ff = 64;
    c.n_experts = 4;
    c.top_k = 2;
    c.max_seq_len = 64;
    c.init_std = 0.1f;
    ModelConfig c2 = c;
    c2.dispatch = DISPATCH_CAPACITY;
    c2.capacity_factor = 0.75f;
    c2.renormalize = 0;
    c2.jitter = 0.1f;
    c2.n_kv_heads = 1;
    c2.top_k = 1;
    ModelConfig c3 = c;
    c3.top_k = 4;
    c3.head_dim = 64;
    c3.n_heads = 2;
    c3.n_kv_heads = 2;
    c3.d_model = 128;
    // the families' options and balancing (config.h)
    ModelConfig f1 = c;
    f1.family = FAM_OLMOE;
    f1.qk_norm = QK_NORM_FULL;
    f1.renormalize = 0;
    ModelConfig f2 = c;
    f2.family = FAM_QWEN2_MOE;
    f2.qkv_bias = 1;
    f2.n_shared_experts = 1;
    f2.shared_d_ff = 80;
    f2.shared_gate = 1;
    f2.aux_scope = AUX_SCOPE_SEQ;
    ModelConfig f3 = c;
    f3.family = FAM_QWEN3_MOE;
    f3.qk_norm = QK_NORM_HEAD;
    f3.head_dim = 32;
    f3.balance = BALANCE_AUX_FREE;
    // DeepSeek-V3-shaped (issue 40): a dense first layer, sigmoid scores, 1 of 2 groups, weight scale, an
    // ungated shared expert, the aux-free bias
    ModelConfig f4 = c;
    f4.n_layers = 3;
    config_set_dense(&f4, 0);
    f4.dense_d_ff = 96;
    f4.route_sigmoid = 1;
    f4.z_coef = 0;
    f4.n_group = 2;
    f4.topk_group = 1;
    f4.route_scale = 2.5f;
    f4.n_shared_experts = 1;
    f4.shared_d_ff = 48;
    f4.balance = BALANCE_AUX_FREE;
    // multi-head latent attention (issue 40): q_lora, the latent, the shared rope key, value heads (16)
    // padded to the query/key heads (16 + 8 = 24: the attention op's head width as c's), YaRN's frequencies
    // and scales
    ModelConfig f5 = c;
    f5.n_kv_heads = 4;
    f5.q_lora_rank = 32;
    f5.kv_lora_rank = 24;
    f5.qk_nope_head_dim = 16;
    f5.qk_rope_head_dim = 8;
    f5.v_head_dim = 16;
    f5.head_dim = 8;
    f5.rope_factor = 4;
    f5.rope_orig_max = 16;
    f5.yarn_mscale = 0.8f;
    f5.yarn_mscale_all_dim = 1;
    // latent attention at DeepSeek-V3's head widths (qk 128 + 64, v 128): on an sm_90 GPU "cuda"'s wgmma
    // kernels for them (ops.h attention_fwd_v/bwd_v), forward and backward through the model
    ModelConfig f6 = f5;
    f6.qk_nope_head_dim = 128;
    f6.qk_rope_head_dim = 64;
    f6.head_dim = 64;
    f6.v_head_dim = 128;
    // multi-token prediction (issue 40): two modules after the layers, their loss at weight 0.5
    ModelConfig m1 = c;
    m1.mtp_depth = 2;
    m1.mtp_weight = 0.5f;
    // MOE_TEST_DS: one part of the DeepSeek shape left out (to find which one moves a result): nodense,
    // softmax, nogroup, noscale, noshared, nobias
    const char *ds = getenv("MOE_TEST_DS");
    if (ds && strstr(ds, "nodense")) memset(f4.dense_layers, 0, sizeof f4.dense_layers), f4.dense_d_ff = 0;
    if (ds && strstr(ds, "softmax")) f4.route_sigmoid = 0, f4.n_group = 1, f4.topk_group = 1;
    if (ds && strstr(ds, "nogroup")) f4.n_group = 1, f4.topk_group = 1;
    if (ds && strstr(ds, "noscale")) f4.route_scale = 1.0f;
    if (ds && strstr(ds, "noshared")) f4.n_shared_experts = 0, f4.shared_d_ff = 0;
    if (ds && strstr(ds, "nobias")) f4.balance = BALANCE_AUX;
    // MOE_TEST_DS_DFF: the dense layer's d_ff; MOE_TEST_DS_DLAYER: which layer is dense (the finding's hunt)
    if (getenv("MOE_TEST_DS_DFF")) f4.dense_d_ff = atoi(getenv("MOE_TEST_DS_DFF"));
    if (getenv("MOE_TEST_DS_DLAYER")) {
        memset(f4.dense_layers, 0, sizeof f4.dense_layers);
        config_set_dense(&f4, atoi(getenv("MOE_TEST_DS_DLAYER")));
    }
    // MOE_TEST_BACKEND=cuda or cuda-fp32: that backend only (default: both)
    const char *only = getenv("MOE_TEST_BACKEND");
    for (int bf = 0; bf < 2; bf++) {
        if (only && *only && strcmp(only, bf ? "cuda" : "cuda-fp32")) continue;
        if (g_standin_eps && !bf) continue; // (the stand-in: bf16_ref.h against itself)
        const Backend *gpu = g_standin_eps ? backend_cpu_bf16ref()
            : bf                           ? backend_cuda()
                                           : backend_cuda_fp32();
        const Backend *ref = bf ? backend_cpu_bf16ref() : backend_cpu(), *f32 = bf ? backend_cpu() : NULL;
        worst_all = 0;
        check_config("dropless renorm k=2 GQA 4/2", c, 2, 40, 0, gpu, ref, f32);
        check_config("capacity 0.75 k=1 jitter MQA", c2, 3, 33, 12345, gpu, ref, f32);
        check_config("dropless k=E hd=64", c3, 1, 64, 0, gpu, ref, f32);
        check_config("olmoe: qk-norm full", f1, 2, 40, 0, gpu, ref, f32);
        check_config("qwen2_moe: bias, gated shared, seq aux", f2, 2, 40, 0, gpu, ref, f32);
        check_config("qwen3_moe: qk-norm head, aux-free", f3, 2, 40, 0, gpu, ref, f32);
        check_config("latent attention: q_lora, yarn, v padded", f5, 2, 40, 0, gpu, ref, f32);
        check_config("latent attention at DeepSeek-V3's widths", f6, 2, 40, 0, gpu, ref, f32);
        check_config("deepseek-shaped: dense 0, sigmoid groups", f4, 2, 40, 0, gpu, ref, f32);
        // (on "cuda" measured on the H200 at 4.55e-3 norm-wise, routing identical (2026-12-03). Less well
        // conditioned than c: with every parameter moved by 1e-6 relative, bf16_ref.h's own gradients of this
        // model moved 1.7e-2..1.2e-1 norm-wise with a routing change in 2 of its 4 MoE layers for seeds 7 and
        // 9, against 1.4e-2..5.0e-2 and at most one layer for c alone (seeds 7..10): a failure here on a
        // kernel change that moves roundings is to be read with that in mind)
        check_config("mtp 2 modules, weight 0.5", m1, 2, 40, 0, gpu, ref, f32);
        check_loss_chunks(c, 2, 40, gpu, bf);
        printf("%s vs %s: worst relative difference over all configs %.2e (tolerance %.0e)\n", gpu->name,
               ref->name, worst_all, bf ? MODEL_RTOL_BF16 : MODEL_RTOL);
    }
    return test_done("test_cuda_model");
}
