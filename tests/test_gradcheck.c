// test_gradcheck.c — the hand-written backward of the whole model (cross-entropy + aux + z loss, with MTP
// modules their weighted losses too; every tensor of the parameter table) against central finite differences;
// also with residual dropout (a fixed mask: the seed is the same for every forward).
//
// Method: for each tensor W with analytic gradient g, two directions u (unit norm): u = g/|g| and a
// random u. The central difference (L(p + h u) - L(p - h u)) / 2h, h = 1e-2, must match g.u within
// tol = 1e-2 * |g| + 3e-4. Why: the forward runs in float32, so each L carries rounding noise of
// about 1e-7 * |L| (L ~ 3), i.e. ~3e-5 on the difference quotient at h = 1e-2, and the O(h^2)
// truncation term is ~1e-4 relative; the largest error seen is 9e-3 * |g| (jitter case), 2e-3..7e-3
// elsewhere. A wrong term (a missing factor, sign or scale) moves g.u by O(|g|), far above 1e-2 |g|.
// A routing flip between p+hu and p-hu makes L non-smooth; such a direction is reported and
// skipped (the top-k choice and the drops are compared), and the test fails if more than a tenth
// are skipped.
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "model/model.h"
#include "test_util.h"
#include "test_cfg.h"

// aux scope global: the micro-batch checked is the step's second; the first (g_x0) feeds the running
// counts its aux term's f_i is taken over (model_scope_reset starts each evaluation as a step would).
static const int32_t *g_x0, *g_y0;
static void step_start(Model *m, int B, int T, uint64_t ns) {
    model_scope_reset(m);
    if (m->c.aux_scope == AUX_SCOPE_GLOBAL) model_forward(m, g_x0, g_y0, B, T, 0, ns);
}

static double total_loss(Model *m, const int32_t *x, const int32_t *y, int B, int T, float aux, float zc,
                         uint64_t ns, int32_t *route) {
    step_start(m, B, T, ns);
    double ce = model_forward(m, x, y, B, T, 0, ns);
    if (route) {
        int off = 0;
        for (int l = 0; l < config_all_layers(&m->c); l++) { // (the MTP modules' blocks too)
            int n = B * T * m->c.top_k;
            if (m->la[l].moe.dense) { // (no routing)
                memset(route + off, 0, 2 * n * sizeof(int32_t));
                off += 2 * n;
                continue;
            }
            memcpy(route + off, m->la[l].moe.idx_h, n * sizeof(int32_t));
            off += n;
            memcpy(route + off, m->la[l].moe.slotrow, n * sizeof(int32_t));
            off += n;
        }
    }
    // MTP: its losses at mtp_weight, its blocks' router losses at a main layer's coefficient (model_types.h)
    if (m->c.mtp_depth)
        return ce + m->c.mtp_weight * m->mtp_loss + aux * (m->aux + m->mtp_aux) + zc * (m->z + m->mtp_z);
    return ce + aux * m->aux + zc * m->z;
}

static float g_dropout; // residual dropout of the next check_config (one fixed mask for every forward)
static float g_embed_dropout; // embedding dropout of the next check_config (the same)

static int check_config(const char *label, ModelConfig c, uint64_t noise_seed) {
    int fam = c.family != FAM_MIXTRAL || c.balance != BALANCE_AUX || c.aux_scope != AUX_SCOPE_MICRO ||
        c.dense_d_ff > 0 || c.route_sigmoid || config_mla(&c); // the new options
    const int B = 2, T = 6;
    Model m;
    model_init(&m, &c, backend_cpu(), B, T, NULL);
    m.dropout = g_dropout;
    m.embed_dropout = g_embed_dropout;
    m.drop_seed = g_dropout > 0 || g_embed_dropout > 0 || c.attention_dropout > 0
        ? 781
        : 0; // (a mask under which no perturbation flips routing)
    for (int l = 0; l < config_all_layers(&c); l++) m.la[l].moe.host_router_out = 1; // total_loss reads idx_h
    params_init(&m.t, &c, m.params, 7);
    // larger router weights so routing is decisive and probs are not all ~1/E
    for (int i = 0; i < m.t.n; i++)
        if (m.t.p[i].role == PR_ROUTER)
            for (size_t j = 0; j < m.t.p[i].numel; j++) m.params[m.t.p[i].offset + j] *= 25.0f;
    Rng rb; // the families: norm weights and biases away from 1 and 0 (their init): every term shows
    rng_seed(&rb, 5);
    for (int i = 0; i < m.t.n; i++)
        if (fam && m.t.p[i].ndim == 1)
            for (size_t j = 0; j < m.t.p[i].numel; j++)
                m.params[m.t.p[i].offset + j] += 0.3f * rng_normal(&rb);
    Rng r;
    rng_seed(&r, 11);
    int32_t x[B * T], y[B * T], x0[B * T], y0[B * T];
    for (int i = 0; i < B * T; i++) {
        x[i] = rng_below(&r, c.vocab_size);
        y[i] = rng_below(&r, c.vocab_size);
    }
    for (int i = 0; i < B * T; i++) {
        x0[i] = rng_below(&r, c.vocab_size);
        y0[i] = rng_below(&r, c.vocab_size);
    }
    g_x0 = x0;
    g_y0 = y0;
    if (c.balance == BALANCE_AUX_FREE) {
        // a routing bias as large as the probabilities, its values 0.3 apart (few near-ties between the
        // biased scores): it must change some top-k choices
        size_t nk = (size_t)B * T * c.top_k;
        int32_t *before = xmalloc(sizeof(int32_t) * nk * c.n_layers);
        model_forward(&m, x, y, B, T, 0, 0);
        for (int l = 0; l < c.n_layers; l++)
            if (!m.la[l].moe.dense) memcpy(before + l * nk, m.la[l].moe.idx_h, sizeof(int32_t) * nk);
        for (int i = 0; i < m.t.n; i++)
            if (m.t.p[i].role == PR_ROUTE_BIAS)
                for (size_t j = 0; j < m.t.p[i].numel; j++)
                    m.params[m.t.p[i].offset + j] =
                        0.3f * (float)((j * 3 + (size_t)m.t.p[i].layer) % c.n_experts) - 0.45f;
        model_forward(&m, x, y, B, T, 0, 0);
        int changed = 0;
        for (int l = 0; l < c.n_layers; l++)
            changed |=
                !m.la[l].moe.dense && memcmp(before + l * nk, m.la[l].moe.idx_h, sizeof(int32_t) * nk) != 0;
        EXPECT(changed, "[%s] the routing bias changed no top-k choice", label);
        free(before);
    }
    float aux = 0.3f, zc = 0.05f;
    memset(m.grads, 0, m.t.total * sizeof(float));
    step_start(&m, B, T, noise_seed);
    model_forward(&m, x, y, B, T, 1.0f / (B * T), noise_seed);
    model_backward(&m, aux, zc);
    float *g = xmalloc(m.t.total * sizeof(float));
    memcpy(g, m.grads, m.t.total * sizeof(float));
    size_t rn = (size_t)2 * config_all_layers(&c) * B * T * c.top_k;
    int32_t *r0 = xmalloc(rn * 4), *r1 = xmalloc(rn * 4), *r2 = xmalloc(rn * 4);
    total_loss(&m, x, y, B, T, aux, zc, noise_seed, r0);
    // MTP steps 3e-3 too: the modules' losses on the same hidden states bend the loss more (at 1e-2 the
    // experts' w2 along g reached 7.6e-2 |g|, 7.1e-3 at 3e-3: the h^2 law, not a wrong term) the families'
    // and balancing configs step h = 3e-3: QK-norm puts the attention scores at O(sqrt(hd)) and the norm
    // weights / biases are perturbed, so the loss bends more (at 1e-2 the O(h^2) term reached 1.5e-2 |g| on
    // the embedding), and a routing bias brings choices near ties (at 1e-2 a tenth of the directions flipped
    // one); float32 noise on the quotient is still ~1e-4, below the 3e-4 floor DeepSeek's weight scale (2.5)
    // bends the loss more again: along g at 3e-3 the O(h^2) term reached 7.5e-2 |g| (9e-3 at 1e-3, 2.7e-3 at
    // 3e-4: the h^2 law, not a wrong term); at 5e-4 the float32 noise on the quotient is ~3e-4, at the floor
    const float h = c.route_scale > 1 ? 5e-4f : fam || c.mtp_depth ? 3e-3f : 1e-2f;
    int skipped = 0, checked = 0, fails_before = t_failures;
    double worst = 0;
    for (int i = 0; i < m.t.n; i++) {
        const ParamSpec *s = &m.t.p[i];
        float *p = m.params + s->offset, *gi = g + s->offset;
        double gn = 0;
        for (size_t j = 0; j < s->numel; j++) gn += (double)gi[j] * gi[j];
        gn = sqrt(gn);
        float *u = xmalloc(s->numel * sizeof(float)), *p0 = xmalloc(s->numel * sizeof(float));
        memcpy(p0, p, s->numel * sizeof(float));
        for (int dir = 0; dir < 2; dir++) {
            double un = 0;
            for (size_t j = 0; j < s->numel; j++) {
                u[j] = dir == 0 && gn > 0 ? gi[j] : rng_normal(&r);
                un += (double)u[j] * u[j];
            }
            un = sqrt(un);
            double an = 0;
            for (size_t j = 0; j < s->numel; j++) {
                u[j] /= un;
                an += (double)gi[j] * u[j];
            }
            for (size_t j = 0; j < s->numel; j++) p[j] = p0[j] + h * u[j];
            double lp = total_loss(&m, x, y, B, T, aux, zc, noise_seed, r1);
            for (size_t j = 0; j < s->numel; j++) p[j] = p0[j] - h * u[j];
            double lm = total_loss(&m, x, y, B, T, aux, zc, noise_seed, r2);
            memcpy(p, p0, s->numel * sizeof(float));
            if (memcmp(r1, r0, rn * 4) || memcmp(r2, r0, rn * 4)) {
                skipped++;
                continue;
            }
            double fd = (lp - lm) / (2 * h);
            double tol = 1e-2 * gn + 3e-4;
            double err = fabs(fd - an);
            if (err / (gn + 1e-12) > worst && gn > 1e-3) worst = err / gn;
            checked++;
            EXPECT(err <= tol, "[%s] %s dir %d: finite diff %.6g vs analytic %.6g (|g| %.3g)", label, s->name,
                   dir, fd, an, gn);
        }
        free(u);
        free(p0);
    }
    printf("%-28s %d directions checked, %d skipped (routing flip), worst |fd-an|/|g| = %.2e\n", label,
           checked, skipped, worst);
    EXPECT(skipped <= checked / 10, "[%s] too many routing flips (%d of %d)", label, skipped,
           checked + skipped);
    free(g);
    free(r0);
    free(r1);
    free(r2);
    model_free(&m);
    return t_failures - fails_before;
}

int main(void) {
    ModelConfig c = test_fd_cfg(13);
    check_config("dropless renorm k=2", c, 0);
    ModelConfig c2 = c;
    c2.renormalize = 0;
    check_config("dropless no-renorm k=2", c2, 0);
    ModelConfig c3 = c;
    c3.dispatch = DISPATCH_CAPACITY;
    c3.capacity_factor = 0.6f;
    check_config("capacity cf=0.6 k=2", c3, 0);
    ModelConfig c4 = c;
    c4.top_k = 1;
    c4.n_heads = 4;
    c4.n_kv_heads = 2;
    c4.head_dim = 2;
    check_config("dropless k=1 GQA 4/2", c4, 0);
    ModelConfig c5 = c;
    c5.top_k = 4;
    check_config("dropless k=E", c5, 0);
    ModelConfig c6 = c;
    c6.jitter = 0.1f;
    check_config("jitter 0.1", c6, 12345);
    ModelConfig c7 = c;
    c7.aux_form = AUX_HF;
    check_config("aux form hf (all layers)", c7, 0);
    // the families' options (config.h): QK-norm over the whole q/k rows (OLMoE), per head (Qwen3-MoE, with
    // head_dim != d / H), q/k/v biases and a sigmoid-gated shared expert (Qwen2-MoE)
    ModelConfig f1 = c;
    f1.family = FAM_OLMOE;
    f1.qk_norm = QK_NORM_FULL;
    f1.renormalize = 0;
    check_config("olmoe: qk-norm full", f1, 0);
    ModelConfig f2 = c;
    f2.family = FAM_QWEN3_MOE;
    f2.qk_norm = QK_NORM_HEAD;
    f2.n_heads = 4;
    f2.n_kv_heads = 2;
    f2.head_dim = 6;
    check_config("qwen3_moe: qk-norm per head", f2, 0);
    ModelConfig f3 = c;
    f3.family = FAM_QWEN2_MOE;
    f3.qkv_bias = 1;
    f3.n_shared_experts = 1;
    f3.shared_d_ff = 10;
    f3.shared_gate = 1;
    f3.renormalize = 0;
    check_config("qwen2_moe: bias + gated shared", f3, 0);
    ModelConfig f4 = f3;
    f4.dispatch = DISPATCH_CAPACITY;
    f4.capacity_factor = 0.6f;
    f4.jitter = 0.1f;
    check_config("qwen2_moe: capacity + jitter", f4, 12345);
    // balancing: the aux-free routing bias (a choice-only term: its gradient is 0), and the aux loss over
    // each sequence (B = 2 sequences) and over the step's micro-batches so far (global)
    ModelConfig b1 = c;
    b1.balance = BALANCE_AUX_FREE;
    check_config("balance aux-free", b1, 0);
    ModelConfig b2 = c;
    b2.aux_scope = AUX_SCOPE_SEQ;
    check_config("aux scope sequence", b2, 0);
    ModelConfig b3 = c;
    b3.aux_scope = AUX_SCOPE_GLOBAL;
    check_config("aux scope global (2nd micro)", b3, 0);
    ModelConfig b4 = f3;
    b4.aux_scope = AUX_SCOPE_SEQ;
    b4.balance = BALANCE_AUX_FREE;
    check_config("qwen2_moe: seq scope + aux-free", b4, 0);
    // dense layers among the MoE layers (config dense_layers): layer 0 of 2 an MLP of width 10 (DeepSeek's
    // first dense layer), and with a gated shared expert and HF's aux form (over the MoE layers only) layers
    // 0 and 2 of 3
    ModelConfig d1 = c;
    config_set_dense(&d1, 0);
    d1.dense_d_ff = 10;
    check_config("dense layer 0 of 2", d1, 0);
    ModelConfig d2 = f3;
    d2.n_layers = 3;
    config_set_dense(&d2, 0);
    config_set_dense(&d2, 2);
    d2.dense_d_ff = 14;
    d2.aux_form = AUX_HF;
    check_config("qwen2_moe: dense 0,2 + aux hf", d2, 0);
    // DeepSeek-V3's routing: sigmoid scores, group-limited choice (1 of 2 groups of 2), the weight scale, the
    // aux-free bias, an ungated shared expert, the sequence-wise aux loss over normalised scores, a dense
    // first layer; with 3 layers (two routed)
    ModelConfig ds = c;
    ds.n_layers = 3;
    ds.route_sigmoid = 1;
    ds.z_coef = 0;
    ds.n_group = 2;
    ds.topk_group = 1;
    ds.route_scale = 2.5f;
    ds.n_shared_experts = 1;
    ds.shared_d_ff = 6;
    ds.balance = BALANCE_AUX_FREE;
    ds.aux_scope = AUX_SCOPE_SEQ;
    config_set_dense(&ds, 0);
    ds.dense_d_ff = 10;
    check_config("deepseek routing + dense 0", ds, 0);
    ModelConfig ds2 = ds; // the routed weights not renormalised, no groups, the per-micro-batch aux loss
    ds2.renormalize = 0;
    ds2.n_group = ds2.topk_group = 0;
    ds2.aux_scope = AUX_SCOPE_MICRO;
    ds2.balance = BALANCE_AUX;
    check_config("deepseek sigmoid, no renorm", ds2, 0);
    // multi-token prediction (config.h mtp_depth): one module on the plain model; two chained modules on
    // DeepSeek's routing with its dense first layer (the modules' blocks are MoE layers), with capacity
    // drops on a third
    ModelConfig t1 = c;
    t1.mtp_depth = 1;
    t1.mtp_weight = 0.5f;
    check_config("mtp 1", t1, 0);
    ModelConfig t2 = ds;
    t2.mtp_depth = 2;
    t2.mtp_weight = 0.3f;
    check_config("mtp 2 + deepseek routing", t2, 0);
    ModelConfig t3 = c3;
    t3.mtp_depth = 2;
    t3.mtp_weight = 1.0f;
    check_config("mtp 2 + capacity", t3, 0);
    // multi-head latent attention: the low-rank q path with its norm, the latent with its norm, the rope key
    // shared by the 2 heads, value heads (2) narrower than the query/key heads (3 + 4: padded); then q_proj,
    // value heads as wide as the query/key heads, YaRN (frequencies blended over the 2 pairs, attention
    // factor mscale / mscale_all_dim, the softmax scale times mscale_all_dim's squared) and a dense layer
    ModelConfig ml = c;
    ml.n_kv_heads = 2;
    ml.q_lora_rank = 6;
    ml.kv_lora_rank = 5;
    ml.qk_nope_head_dim = 3;
    ml.qk_rope_head_dim = 4;
    ml.v_head_dim = 2;
    ml.head_dim = 4;
    check_config("mla q_lora, v 2 of 7", ml, 0);
    ModelConfig ml2 = ml;
    ml2.q_lora_rank = 0;
    ml2.v_head_dim = 7;
    ml2.rope_factor = 4;
    ml2.rope_orig_max = 8;
    ml2.yarn_mscale = 0.7f;
    ml2.yarn_mscale_all_dim = 1.3f;
    ml2.n_layers = 3;
    config_set_dense(&ml2, 1);
    ml2.dense_d_ff = 10;
    check_config("mla q_proj, yarn, dense 1", ml2, 0);
    ModelConfig ml3 = ml; // attention dropout through the padded heads
    ml3.attention_dropout = 0.1f;
    check_config("mla attention dropout 0.1", ml3, 0);
    // an MTP module's block on latent attention (its own q_proj, kv_a, kv_b at layer index n_layers + k - 1,
    // YaRN as the main layers'): two chained modules on ml2's model (q_proj, YaRN, a dense layer)
    ModelConfig ml4 = ml2;
    ml4.mtp_depth = 2;
    ml4.mtp_weight = 0.5f;
    check_config("mla + mtp 2 (yarn, dense 1)", ml4, 0);
    g_dropout = 0.3f; // the masked, rescaled branches: the same mask in the backward as in the forward
    check_config("residual dropout 0.3", c, 0);
    g_dropout = 0;
    ModelConfig c8 = c;
    c8.attention_dropout =
        0.1f; // the probabilities' mask (at 0.3 the g direction curves: 6.6e-2 at h 1e-2, 5.9e-3 at h 3e-3)
    check_config("attention dropout 0.1", c8, 0);
    ModelConfig c9 = c4;
    c9.attention_dropout = 0.1f;
    g_dropout = 0.2f;
    check_config("both dropouts, GQA 4/2, k=1", c9, 0);
    g_dropout = 0;
    g_embed_dropout = 0.3f; // the embedding rows' mask: the embedding's gradient through it
    check_config("embedding dropout 0.3", c, 0);
    g_embed_dropout = 0;
    return test_done("test_gradcheck");
}
