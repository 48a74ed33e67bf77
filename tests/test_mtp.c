// test_mtp.c — multi-token prediction (model/mtp.h) on the cpu, beyond the finite differences of
// test_gradcheck.c (which hold the backward to the forward's objective):
// 1. The modules' loss against a reference composed in this file from the model's pieces: the shifted
//    tokens' embeddings (zero past a sequence's end), enorm and hnorm, eh_proj over [enorm(emb) | hnorm(h)],
//    the module's block (block.c's forward on a one-layer model holding the module's block tensors), its
//    shared_head.norm, the main model's LM head, and the cross-entropy against the token k+1 ahead of the
//    token stream, averaged over the positions that have it; then over the modules. Host arithmetic in
//    double; the targets come from the stream, not from the model's targets array.
// 2. With mtp_weight 0 (and no router losses) the main model's gradients equal those of the same model
//    without MTP (float equality, element by element: the modules add exact zeros), and the modules' own
//    gradients are zero; with mtp_weight > 0 they differ (so 2 can fail).
// 3. The table: without MTP the parameter table is a prefix of the MTP model's (same names, offsets and
//    initial values), the modules' tensors named model.layers.{L + k - 1}.* as the released checkpoints.
// 4. Embedding dropout (--embed-dropout) with a module: the module reads the embedding rows after the
//    mask, so its share of their gradient goes back through the same mask: a token that occurs once, at a
//    position module 1 reads, has a zero embedding gradient exactly where its row's elements were dropped
//    (the mask recomputed here from ops.h's dropout_keep), and a nonzero one elsewhere.
#include <math.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "model/block.h"
#include "model/model.h"
#include "ops/ops.h"
#include "test_util.h"
#include "test_cfg.h"

enum { B = 2, T = 7 };

static ModelConfig small_config(void) { return test_fd_cfg(17); }

static void rmsnorm_ref(double *out, const double *x, const float *w, int d, float eps) {
    double ss = 0;
    for (int j = 0; j < d; j++) ss += x[j] * x[j];
    double r = 1.0 / sqrt(ss / d + eps);
    for (int j = 0; j < d; j++) out[j] = x[j] * r * w[j];
}

static const float *tensor(const Model *m, const char *name) {
    int i = params_find(&m->t, name);
    CHECK(i >= 0, "test: no tensor %s", name);
    return m->params + m->t.p[i].offset;
}

// The reference loss of module k's predictions from h (B*T rows of d, the module's input h_{k-1}),
// leaving h_k in h. stream: B sequences of T + 1 tokens (inputs t[0..T), targets t[1..T]).
static double module_ref(const Model *m, Model *one, int k, const int32_t *stream, double *h) {
    const ModelConfig *c = &m->c;
    int d = c->d_model, V = c->vocab_size, N = B * T, l = c->n_layers + k - 1;
    char nm[96];
#define W(...) (snprintf(nm, sizeof nm, __VA_ARGS__), tensor(m, nm))
    const float *emb = W("model.embed_tokens.weight"), *head = W("lm_head.weight");
    const float *enorm = W("model.layers.%d.enorm.weight", l), *hnorm = W("model.layers.%d.hnorm.weight", l);
    const float *eh = W("model.layers.%d.eh_proj.weight", l),
                *fn = W("model.layers.%d.shared_head.norm.weight", l);
#undef W
    double cat[2 * 64], e[64], x;
    float *xin = one->la[0].res_in, *out = xmalloc(sizeof(float) * N * d);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++) {
            int r = b * T + i;
            for (int j = 0; j < d; j++)
                e[j] = i + k < T ? emb[(size_t)stream[b * (T + 1) + i + k] * d + j] : 0;
            rmsnorm_ref(cat, e, enorm, d, c->norm_eps);
            rmsnorm_ref(cat + d, h + (size_t)r * d, hnorm, d, c->norm_eps);
            for (int o = 0; o < d; o++) {
                x = 0;
                for (int j = 0; j < 2 * d; j++) x += (double)eh[(size_t)o * 2 * d + j] * cat[j];
                xin[(size_t)r * d + o] = (float)x;
            }
        }
    one->B = B;
    one->T = T;
    block_forward(one, 0, out, B, T, 1, 0);
    double loss = 0, lg[64];
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++) {
            int r = b * T + i;
            double o[64];
            for (int j = 0; j < d; j++) o[j] = out[(size_t)r * d + j];
            rmsnorm_ref(h + (size_t)r * d, o, fn, d, c->norm_eps);
            if (i + k + 1 > T) continue; // no token k+1 ahead in the stream
            double mx = -1e300, s = 0;
            for (int v = 0; v < V; v++) {
                lg[v] = 0;
                for (int j = 0; j < d; j++) lg[v] += (double)head[(size_t)v * d + j] * h[(size_t)r * d + j];
                if (lg[v] > mx) mx = lg[v];
            }
            for (int v = 0; v < V; v++) s += exp(lg[v] - mx);
            loss += mx + log(s) - lg[stream[b * (T + 1) + i + k + 1]];
        }
    free(out);
    return loss / ((double)B * (T - k));
}

// 1: the modules' loss against the reference
static void check_loss(ModelConfig c, const char *label) {
    Model m, one;
    model_init(&m, &c, backend_cpu(), B, T, NULL);
    params_init(&m.t, &c, m.params, 3);
    ModelConfig c1 = c; // one layer: the module's block, its tensors copied from the module's
    c1.n_layers = 1;
    c1.mtp_depth = 0;
    memset(c1.dense_layers, 0, sizeof c1.dense_layers);
    c1.dense_d_ff = 0;
    model_init(&one, &c1, backend_cpu(), B, T, NULL);
    int32_t stream[B * (T + 1)], x[B * T], y[B * T];
    Rng r;
    rng_seed(&r, 5);
    for (int i = 0; i < B * (T + 1); i++) stream[i] = rng_below(&r, c.vocab_size);
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++) {
            x[b * T + i] = stream[b * (T + 1) + i];
            y[b * T + i] = stream[b * (T + 1) + i + 1];
        }
    double main_loss = model_forward(&m, x, y, B, T, 0, 0);
    int d = c.d_model, N = B * T;
    double *h = xmalloc(sizeof(double) * N * d), ref = 0;
    for (int i = 0; i < N * d; i++) h[i] = m.xn_f[i]; // h_0: the final norm's output
    for (int k = 1; k <= c.mtp_depth; k++) {
        char pre[32];
        snprintf(pre, sizeof pre, "model.layers.%d.", c.n_layers + k - 1);
        int copied = 0;
        for (int i = 0; i < one.t.n; i++) {
            const char *nm = one.t.p[i].name;
            if (strncmp(nm, "model.layers.0.", 15)) continue;
            char full[128];
            snprintf(full, sizeof full, "%s%s", pre, nm + 15);
            const float *src = tensor(&m, full);
            memcpy(one.params + one.t.p[i].offset, src, sizeof(float) * one.t.p[i].numel);
            copied++;
        }
        EXPECT(copied > 8, "[%s] module %d: %d block tensors copied", label, k, copied);
        ref += module_ref(&m, &one, k, stream, h) / c.mtp_depth;
    }
    printf("%-24s main %.6f  mtp %.9f  reference %.9f\n", label, main_loss, m.mtp_loss, ref);
    EXPECT_NEAR(m.mtp_loss, ref, 2e-5 * fabs(ref), label);
    EXPECT(fabs(m.mtp_loss - main_loss) > 1e-3, "[%s] the MTP loss equals the main loss", label);
    free(h);
    model_free(&one);
    model_free(&m);
}

// forward + backward of one micro-batch into m->grads (zeroed first)
static void grads_of(Model *m, const int32_t *x, const int32_t *y) {
    memset(m->grads, 0, sizeof(float) * m->t.total);
    model_forward(m, x, y, B, T, 1.0f / (B * T), 0);
    model_backward(m, m->c.aux_coef, m->c.z_coef);
}

// 2 and 3
static void check_zero_weight(void) {
    ModelConfig c = small_config(), cm = c;
    c.aux_coef = c.z_coef = 0;
    cm = c;
    cm.mtp_depth = 2;
    cm.mtp_weight = 0;
    Model a, m;
    model_init(&a, &c, backend_cpu(), B, T, NULL);
    model_init(&m, &cm, backend_cpu(), B, T, NULL);
    params_init(&a.t, &c, a.params, 9);
    params_init(&m.t, &cm, m.params, 9);
    int prefix = 1;
    for (int i = 0; i < a.t.n; i++)
        prefix &= !strcmp(a.t.p[i].name, m.t.p[i].name) && a.t.p[i].offset == m.t.p[i].offset;
    EXPECT(prefix && !memcmp(a.params, m.params, sizeof(float) * a.t.total),
           "the table without MTP is not a prefix of the MTP model's (names, offsets, initial values)");
    EXPECT(params_find(&m.t, "model.layers.2.eh_proj.weight") >= 0 &&
               params_find(&m.t, "model.layers.3.shared_head.norm.weight") >= 0 &&
               params_find(&m.t, "model.layers.3.mlp.experts.0.w1.weight") < 0 &&
               params_find(&m.t, "model.layers.3.block_sparse_moe.experts.3.w2.weight") >= 0,
           "the modules' tensors are not named model.layers.{2,3}.* as expected");
    int32_t x[B * T], y[B * T];
    Rng r;
    rng_seed(&r, 8);
    for (int i = 0; i < B * T; i++) {
        x[i] = rng_below(&r, c.vocab_size);
        y[i] = rng_below(&r, c.vocab_size);
    }
    grads_of(&a, x, y);
    grads_of(&m, x, y);
    size_t diff = 0, nonzero = 0;
    for (size_t i = 0; i < a.t.total; i++) diff += a.grads[i] != m.grads[i];
    for (size_t i = a.t.total; i < m.t.total; i++) nonzero += m.grads[i] != 0;
    EXPECT(diff == 0, "mtp_weight 0: %zu of the main model's %zu gradients differ from the model without MTP",
           diff, a.t.total);
    EXPECT(nonzero == 0, "mtp_weight 0: %zu of the modules' gradients are not zero", nonzero);
    EXPECT(m.mtp_loss > 0, "mtp_weight 0: the MTP loss is still computed (got %g)", m.mtp_loss);
    m.c.mtp_weight = 0.5f;
    grads_of(&m, x, y);
    diff = nonzero = 0;
    for (size_t i = 0; i < a.t.total; i++) diff += a.grads[i] != m.grads[i];
    for (size_t i = a.t.total; i < m.t.total; i++) nonzero += m.grads[i] != 0;
    EXPECT(diff > a.t.total / 2 && nonzero > (m.t.total - a.t.total) / 2,
           "mtp_weight 0.5: only %zu main and %zu module gradients moved", diff, nonzero);
    printf("mtp_weight 0: main gradients equal to no MTP (%zu values); 0.5: %zu main values differ\n",
           a.t.total, diff);
    model_free(&a);
    model_free(&m);
}

static void check_embed_dropout(void) {
    ModelConfig c = small_config();
    c.aux_coef = c.z_coef = 0;
    c.mtp_depth = 1;
    c.mtp_weight = 0.5f;
    Model m;
    model_init(&m, &c, backend_cpu(), B, T, NULL);
    params_init(&m.t, &c, m.params, 4);
    const float p = 0.3f;
    m.embed_dropout = p;
    m.drop_seed = 781;
    int32_t x[B * T], y[B * T];
    Rng r;
    rng_seed(&r, 6);
    const int uniq = c.vocab_size - 1, g = 3; // the one token the others never are, at row 3 (b 0, i 3)
    for (int i = 0; i < B * T; i++) {
        x[i] = i == g ? uniq : (int32_t)rng_below(&r, uniq);
        y[i] = rng_below(&r, c.vocab_size);
    }
    grads_of(&m, x, y);
    int d = c.d_model, dropped = 0, zero_kept = 0, nonzero_dropped = 0;
    const float *ge =
        m.grads + m.t.p[params_find(&m.t, "model.embed_tokens.weight")].offset + (size_t)uniq * d;
    uint64_t seed = dropout_hash(781, -1, 3); // (one process: the row's global index is g)
    for (int j = 0; j < d; j++) {
        int keep = dropout_keep(seed, g, j, dropout_threshold(p));
        dropped += !keep;
        nonzero_dropped += !keep && ge[j] != 0;
        zero_kept += keep && ge[j] == 0;
    }
    printf("embedding dropout %.1f + mtp 1: token %d's row, %d of %d elements dropped\n", p, uniq, dropped,
           d);
    EXPECT(dropped > 0 && dropped < d, "the fixture drops %d of the row's %d elements (needs some of each)",
           dropped, d);
    EXPECT(nonzero_dropped == 0, "%d dropped elements of the row have an embedding gradient",
           nonzero_dropped);
    EXPECT(zero_kept == 0, "%d kept elements of the row have no embedding gradient", zero_kept);
    model_free(&m);
}

int main(void) {
    ModelConfig c = small_config();
    c.mtp_depth = 1;
    check_loss(c, "mtp 1");
    c.mtp_depth = 3;
    c.dispatch = DISPATCH_CAPACITY;
    c.capacity_factor = 0.75f;
    check_loss(c, "mtp 3, capacity");
    ModelConfig q = small_config(); // a family's attention (QK-norm per head) in the modules' blocks, a dense
    q.family = FAM_QWEN3_MOE; // first layer among the main ones
    q.qk_norm = QK_NORM_HEAD;
    q.mtp_depth = 2;
    config_set_dense(&q, 0);
    q.dense_d_ff = 10;
    check_loss(q, "mtp 2, qwen3 + dense 0");
    check_zero_weight();
    check_embed_dropout();
    return test_done("test_mtp");
}
