// test_arena.c — the lent-memory allocator (src/ops/arena.h) and the model's use of it
// (model_share_grads): an arena carves 256-byte-aligned, zeroed buffers from the memory it is lent and
// hands what does not fit to the backend; freeing a carved buffer gives nothing back, arena_reset returns
// to the mark. With the gradients' memory shared, layer l's activations (l > first) lie inside layer l-1's
// routed-expert gradient block and the logits inside the last layer's; the first layer's do not; a forward
// and backward give the same gradients, bit for bit, as separate memory; more than one slot is refused.
// On cpu (the other backends run the same model code; tests/test_grad_memory.sh covers them in training).
// Also params_bf16_ranges (the holes of the bf16 policy's parameter buffer, ops.h alloc_bf16_params): every
// tensor lies wholly inside a range iff it is one of this rank's routed experts' w1, w3, w2 in a layer whose
// three start at multiples of 8 elements, or q, k, v, o or the LM head with more than MOE_GEMM_FP32_MAX_O
// rows at a multiple of 8, or the embedding table at a multiple of 8 (embedding_fwd reads it from the copy);
// any other tensor overlaps none (a norm, router, bias or shared expert inside one
// would lose its float32 memory on cuda); the ranges ascend, neither touch nor overlap (adjacent ones merged)
// and hold nothing else.
#include <stdint.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/params.h"
#include "ops/arena.h"
#include "test_cfg.h"
#include "test_death.h"
#include "test_util.h"

enum { B = 2, T = 8 };

static void test_carving(const Backend *be) {
    char *lent = be->alloc(4096);
    memset(lent, 0xAB, 4096);
    Arena a = {lent, 4096, 0, 0};
    char *p = arena_alloc(&a, be, 100), *q = arena_alloc(&a, be, 10);
    EXPECT(p == lent && q == lent + 256, "carves at 256-byte steps from the base: %p %p (base %p)", (void *)p,
           (void *)q, (void *)lent);
    int zero = 1;
    for (int i = 0; i < 100; i++) zero &= p[i] == 0;
    for (int i = 0; i < 10; i++) zero &= q[i] == 0;
    EXPECT(zero, "carved buffers are zeroed (as Backend.alloc's)");
    EXPECT((unsigned char)lent[100] == 0xAB && (unsigned char)lent[266] == 0xAB,
           "only the carved bytes are zeroed");
    a.mark = a.used;
    char *big = arena_alloc(&a, be, 4000); // 266 + 4000 > 4096: the backend's
    EXPECT(!arena_owns(&a, big) && arena_owns(&a, p) && arena_owns(&a, q),
           "what does not fit comes from the backend");
    char *r = arena_alloc(&a, be, 3000), *s = arena_alloc(&a, be, 1000);
    EXPECT(r == lent + 512 && !arena_owns(&a, s),
           "the rest is carved while it fits (%p), then the backend (%p)", (void *)r, (void *)s);
    arena_free(&a, be, r); // carved: nothing given back
    char *t = arena_alloc(&a, be, 3000);
    EXPECT(!arena_owns(&a, t), "freeing a carved buffer gives no room back (its size again: the backend's)");
    arena_reset(&a);
    char *u = arena_alloc(&a, be, 16);
    EXPECT(u == lent + 512, "after arena_reset the next buffer is carved at the mark (%p)", (void *)u);
    Arena none = {0};
    char *w = arena_alloc(&none, be, 64);
    EXPECT(w && !arena_owns(&none, w), "an arena lent nothing allocates from the backend");
    arena_free(&a, be, big);
    arena_free(&a, be, s);
    arena_free(&a, be, t);
    arena_free(&none, be, w);
    arena_free(NULL, be, NULL);
    be->free(lent);
}

static int inside(const Model *m, const void *p, int layer) {
    int i = params_index(&m->t, PR_W1, layer, m->e0),
        j = params_index(&m->t, PR_W2, layer, m->e0 + m->El - 1);
    const char *b = (const char *)(m->grads + m->t.p[i].loffset);
    const char *e = (const char *)(m->grads + m->t.p[j].loffset + m->t.p[j].lnumel);
    return (const char *)p >= b && (const char *)p < e;
}

// gradients (host) of one forward and backward on fixed tokens, the gradients' memory shared or not
static float *grads(const ModelConfig *c, const float *params, int share, int check_placement) {
    const Backend *be = backend_cpu();
    Model m;
    model_init(&m, c, be, B, T, NULL);
    model_share_grads(&m, share);
    size_t P = m.t.ltotal;
    be->to_device(m.params, params, P * sizeof(float));
    if (check_placement) {
        EXPECT(!inside(&m, m.la[0].res_in, 0), "the first layer's activations are its own");
        for (int l = 1; l < c->n_layers; l++) {
            EXPECT(inside(&m, m.la[l].res_in, l - 1) && inside(&m, m.la[l].xn1, l - 1) &&
                       inside(&m, m.la[l].attn.q, l - 1),
                   "layer %d's activations lie in layer %d's expert gradients", l, l - 1);
        }
        EXPECT(inside(&m, m.logits, c->n_layers - 1), "the logits lie in the last layer's expert gradients");
    }
    int32_t x[B * T], y[B * T];
    Rng r;
    rng_seed(&r, 7);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int32_t)rng_below(&r, 64);
        y[i] = (int32_t)rng_below(&r, 64);
    }
    for (int step = 0; step < 2; step++) { // twice: the second forward writes over the first's gradients
        model_zero_grads(&m);
        model_forward(&m, x, y, B, T, 1.0f / (B * T), 0);
        model_backward(&m, c->aux_coef, c->z_coef);
        model_grads_settle(&m);
    }
    float *g = xmalloc(P * sizeof(float));
    be->to_host(g, m.grads, P * sizeof(float));
    model_free(&m);
    return g;
}

static void two_slots(void *arg) {
    Model m;
    model_init(&m, arg, backend_cpu(), B, T, NULL);
    model_set_slots(&m, 0, 2);
    model_share_grads(&m, 1);
}

static void check_ranges(const char *what, const ModelConfig *c, const ParamSlicing *sl, int want_layers) {
    ParamTable t;
    params_build_local(&t, c, sl);
    int El = c->n_experts / sl->ep, e0 = sl->ep_rank * El, layers = 0;
    size_t *h = xmalloc(sizeof(size_t) * params_bf16_ranges_max(c->n_layers));
    int nh = params_bf16_ranges(&t, c->n_layers, e0, El, MOE_GEMM_FP32_MAX_O, h), bad = 0, dense = 0,
        narrow = 0;
    for (int r = 0; r < nh; r++) bad += h[2 * r] >= h[2 * r + 1] || (r && h[2 * r] <= h[2 * r - 1]);
    size_t *inside = xcalloc((size_t)nh + 1, sizeof(size_t));
    for (int l = -1; l < c->n_layers; l++) { // (-1: the tensors outside the layers)
        int ok = l >= 0; // the layer's experts start at multiples of 8 (from the table)
        for (int i = 0; i < t.n; i++) {
            const ParamSpec *p = &t.p[i];
            if (p->layer == l && p->expert == e0 &&
                (p->role == PR_W1 || p->role == PR_W3 || p->role == PR_W2))
                ok &= p->loffset % 8 == 0;
        }
        for (int i = 0; i < t.n; i++) {
            const ParamSpec *p = &t.p[i];
            if (!p->lnumel || p->layer != l) continue;
            int routed = p->expert >= e0 && p->expert < e0 + El &&
                (p->role == PR_W1 || p->role == PR_W3 || p->role == PR_W2);
            int proj = p->role == PR_WQ || p->role == PR_WK || p->role == PR_WV || p->role == PR_WO ||
                p->role == PR_LM_HEAD;
            int want = (routed && ok) ||
                (proj && p->lshape[0] > MOE_GEMM_FP32_MAX_O && p->loffset % 8 == 0) ||
                (p->role == PR_EMBED && p->loffset % 8 == 0);
            dense += proj && want;
            narrow += proj && !want;
            int in = -1, touch = 0;
            for (int r = 0; r < nh; r++) {
                if (p->loffset >= h[2 * r] && p->loffset + p->lnumel <= h[2 * r + 1]) in = r;
                touch += p->loffset < h[2 * r + 1] && h[2 * r] < p->loffset + p->lnumel;
            }
            bad += (in >= 0) != want || (in < 0 && touch);
            if (in >= 0) inside[in] += p->lnumel;
        }
        layers += ok;
    }
    for (int r = 0; r < nh; r++) bad += inside[r] != h[2 * r + 1] - h[2 * r]; // nothing else in a range
    EXPECT(layers == want_layers && !bad && dense > 0,
           "params_bf16_ranges, %s: %d ranges, %d layers' experts among them (want %d), %d dense "
           "projections; %d "
           "misplaced tensors or ranges",
           what, nh, layers, want_layers, dense, bad);
    printf("params_bf16_ranges, %s: %d ranges, %d layers' experts, %d projections inside, %d outside\n", what,
           nh, layers, dense, narrow);
    free(h);
    free(inside);
    params_free(&t);
}

static void test_bf16_ranges(void) {
    ModelConfig c;
    ParamSlicing one = {1, 0, 1, 0, 1, 0, NULL, 0, 0}, ep1 = {1, 0, 2, 1, 1, 0, NULL, 0, 0};
    test_tiny_cfg(&c, 3, T);
    c.head_dim = 24; // q 96 rows (inside), k and v 48 and o 32 (too narrow: float32 products)
    c.vocab_size = 100; // the LM head inside
    check_ranges("tiny, 3 layers", &c, &one, 3);
    check_ranges("tiny, expert-parallel rank 1 of 2", &c, &ep1, 3);
    c.n_shared_experts = 1; // Qwen2-MoE's shared expert and its gate, and q/k/v biases: outside the ranges
    c.shared_d_ff = 40;
    c.shared_gate = 1;
    c.qkv_bias = 1;
    check_ranges("tiny with a gated shared expert and q/k/v biases", &c, &one, 3);
    test_tiny_cfg(&c, 3, T); // q, k, v, o all wide: adjacent tensors, one range (a touching pair shows)
    c.d_model = 72;
    c.head_dim = 40;
    c.vocab_size = 100;
    check_ranges("tiny with q, k, v, o all wide", &c, &one, 3);
    test_tiny_cfg(&c, 3,
                  T); // d 12, 3 experts: the layers' offsets move by amounts that are not multiples of 8
    c.d_model = 12;
    c.n_heads = 3;
    c.n_kv_heads = 3;
    c.head_dim = 4;
    c.d_ff = 20;
    c.vocab_size = 10;
    c.n_experts = 3;
    ParamTable t;
    params_build(&t, &c);
    int want = 0;
    for (int l = 0; l < 3; l++)
        want += t.p[params_index(&t, PR_W1, l, 0)].loffset % 8 == 0 &&
            t.p[params_index(&t, PR_W3, l, 0)].loffset % 8 == 0 &&
            t.p[params_index(&t, PR_W2, l, 0)].loffset % 8 == 0;
    params_free(&t);
    EXPECT(want < 3, "d 12: every layer's experts still start at a multiple of 8 (the case says nothing)");
    c.vocab_size = 100; // (the LM head, 100 rows, the only projection wide enough)
    check_ranges("d 12 (some layers off the GEMMs' alignment)", &c, &one, want);
}

int main(void) {
    test_carving(backend_cpu());
    test_bf16_ranges();
    ModelConfig c;
    test_tiny_cfg(&c, 3, T);
    Model m;
    model_init(&m, &c, backend_cpu(), B, T, NULL);
    size_t P = m.t.ltotal;
    float *params = xmalloc(P * sizeof(float));
    params_init(&m.t, &c, params, 11);
    model_free(&m);
    float *a = grads(&c, params, 0, 0), *b = grads(&c, params, 1, 1);
    EXPECT(!memcmp(a, b, P * sizeof(float)),
           "shared gradient memory: the gradients differ from separate memory");
    expect_death_msg("model_share_grads with two slots", two_slots, &c, "model_share_grads", "slots", 0);
    free(a);
    free(b);
    free(params);
    return test_done("test_arena");
}
