// test_arena.c — the lent-memory allocator (src/ops/arena.h) and the model's use of it
// (model_share_grads): an arena carves 256-byte-aligned, zeroed buffers from the memory it is lent and
// hands what does not fit to the backend; freeing a carved buffer gives nothing back, arena_reset returns
// to the mark. With the gradients' memory shared, layer l's activations (l > first) lie inside layer l-1's
// routed-expert gradient block and the logits inside the last layer's; the first layer's do not; a forward
// and backward give the same gradients, bit for bit, as separate memory; more than one slot is refused.
// On cpu (the other backends run the same model code; tests/test_grad_memory.sh covers them in training).
#include <stdint.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "model/model.h"
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
    EXPECT(p == lent && q == lent + 256, "carves at 256-byte steps from the base: %p %p (base %p)", (void *)p, (void *)q,
           (void *)lent);
    int zero = 1;
    for (int i = 0; i < 100; i++) zero &= p[i] == 0;
    for (int i = 0; i < 10; i++) zero &= q[i] == 0;
    EXPECT(zero, "carved buffers are zeroed (as Backend.alloc's)");
    EXPECT((unsigned char)lent[100] == 0xAB && (unsigned char)lent[266] == 0xAB, "only the carved bytes are zeroed");
    a.mark = a.used;
    char *big = arena_alloc(&a, be, 4000);   // 266 + 4000 > 4096: the backend's
    EXPECT(!arena_owns(&a, big) && arena_owns(&a, p) && arena_owns(&a, q), "what does not fit comes from the backend");
    char *r = arena_alloc(&a, be, 3000), *s = arena_alloc(&a, be, 1000);
    EXPECT(r == lent + 512 && !arena_owns(&a, s), "the rest is carved while it fits (%p), then the backend (%p)", (void *)r,
           (void *)s);
    arena_free(&a, be, r);   // carved: nothing given back
    char *t = arena_alloc(&a, be, 3000);
    EXPECT(!arena_owns(&a, t), "freeing a carved buffer gives no room back (its size again: the backend's)");
    arena_reset(&a);
    char *u = arena_alloc(&a, be, 16);
    EXPECT(u == lent + 512, "after arena_reset the next buffer is carved at the mark (%p)", (void *)u);
    Arena none = {0};
    char *w = arena_alloc(&none, be, 64);
    EXPECT(w && !arena_owns(&none, w), "an arena lent nothing allocates from the backend");
    arena_free(&a, be, big); arena_free(&a, be, s); arena_free(&a, be, t); arena_free(&none, be, w);
    arena_free(NULL, be, NULL);
    be->free(lent);
}

static int inside(const Model *m, const void *p, int layer) {
    int i = params_index(&m->t, PR_W1, layer, m->e0), j = params_index(&m->t, PR_W2, layer, m->e0 + m->El - 1);
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
            EXPECT(inside(&m, m.la[l].res_in, l - 1) && inside(&m, m.la[l].xn1, l - 1) && inside(&m, m.la[l].q, l - 1),
                   "layer %d's activations lie in layer %d's expert gradients", l, l - 1);
        }
        EXPECT(inside(&m, m.logits, c->n_layers - 1), "the logits lie in the last layer's expert gradients");
    }
    int32_t x[B * T], y[B * T];
    Rng r;
    rng_seed(&r, 7);
    for (int i = 0; i < B * T; i++) { x[i] = (int32_t)rng_below(&r, 64); y[i] = (int32_t)rng_below(&r, 64); }
    for (int step = 0; step < 2; step++) {   // twice: the second forward writes over the first's gradients
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

int main(void) {
    test_carving(backend_cpu());
    ModelConfig c;
    test_tiny_cfg(&c, 3, T);
    Model m;
    model_init(&m, &c, backend_cpu(), B, T, NULL);
    size_t P = m.t.ltotal;
    float *params = xmalloc(P * sizeof(float));
    params_init(&m.t, &c, params, 11);
    model_free(&m);
    float *a = grads(&c, params, 0, 0), *b = grads(&c, params, 1, 1);
    EXPECT(!memcmp(a, b, P * sizeof(float)), "shared gradient memory: the gradients differ from separate memory");
    expect_death_msg("model_share_grads with two slots", two_slots, &c, "model_share_grads", "slots", 0);
    free(a); free(b); free(params);
    return test_done("test_arena");
}
