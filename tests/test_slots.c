// test_slots.c — the pipeline schedules' activation bookkeeping on every backend: the model's slots
// (model_set_slots / model_use) keep each live micro-batch's activations apart, so running the
// forwards and backwards of several micro-batches in a pipeline order (F0 F1 F2 B0 B1 B2, and
// interleaved orders across slots) gives the same gradients, bit for bit, as the sequential order
// (F0 B0 F1 B1 F2 B2) on the same backend: every op sees the same inputs and the gradient buffer
// accumulates the micro-batches in the same order. Also: a chunked model (two virtual stages on one
// process, run chunk by chunk with the residual stream handed over) equals the whole model, and
// each slot's loss, aux and z are its own micro-batch's. Runs on cpu; on cuda and cuda-fp32 where a
// GPU is present (else those parts skip).
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "model/model.h"
#include "parallel/stages.h"
#include "test_cfg.h"
#include "test_util.h"

enum { B = 2, T = 8, M = 3 };

static void config(ModelConfig *c) { test_tiny_cfg(c, 4, T); }

static void tokens(int32_t *x, int32_t *y, int micro) {
    Rng r;
    rng_seed(&r, 100 + (uint64_t)micro);
    for (int i = 0; i < B * T; i++) {
        x[i] = (int32_t)rng_below(&r, 64);
        y[i] = (int32_t)rng_below(&r, 64);
    }
}

// Gradients (host, P floats) after running the actions "F0 F1 B0 ..." (kind, micro) with slot = micro %
// nslots.
static void run(const Backend *be, const ModelConfig *c, const float *params, const char *order, int nslots,
                float *g, double *loss) {
    Model m;
    model_init(&m, c, be, B, T, NULL);
    model_set_slots(&m, 0, nslots);
    size_t P = m.t.ltotal;
    be->to_device(m.params, params, P * sizeof(float));
    be->zero(m.grads, P * sizeof(float));
    int32_t x[B * T], y[B * T];
    for (const char *p = order; *p; p += 2) {
        int micro = p[1] - '0';
        model_use(&m, 0, micro % nslots);
        if (p[0] == 'F') {
            tokens(x, y, micro);
            loss[micro] = model_forward(&m, x, y, B, T, 1.0f / (B * T * M), 0);
        } else {
            model_backward(&m, c->aux_coef / M, c->z_coef / M);
        }
    }
    be->to_host(g, m.grads, P * sizeof(float));
    model_free(&m);
}

static void check_backend(const Backend *be) {
    ModelConfig c;
    config(&c);
    ParamTable t;
    params_build(&t, &c);
    size_t P = t.total;
    float *params = xmalloc(P * sizeof(float)), *g0 = xmalloc(P * sizeof(float)),
          *g1 = xmalloc(P * sizeof(float));
    params_init(&t, &c, params, 5);
    double l0[M], l1[M];
    run(be, &c, params, "F0B0F1B1F2B2", 1, g0, l0);
    const char *orders[] = {"F0F1F2B0B1B2", "F0F1B0F2B1B2", "F0F1B0B1F2B2"};
    for (int o = 0; o < 3; o++) {
        run(be, &c, params, orders[o], M, g1, l1);
        EXPECT(!memcmp(g0, g1, P * sizeof(float)),
               "%s: order %s in %d slots: gradients differ from the sequential order", be->name, orders[o],
               M);
        for (int i = 0; i < M; i++)
            EXPECT(l0[i] == l1[i], "%s: order %s: micro-batch %d's loss %.17g vs %.17g", be->name, orders[o],
                   i, l1[i], l0[i]);
    }
    // two virtual stages on one process: chunk 0 = layers [0,1) + embedding, chunk 1 = [1,4) + head,
    // the residual stream and the carried statistics handed over as pipe.c does
    StageSplit sp;
    const char *bad = stages_split(&sp, c.n_layers, 1, 2, "1,3");
    EXPECT(bad == NULL, "split: %s", bad ? bad : "");
    ModelMesh mm = {0};
    mm.sl = (ParamSlicing){1, 0, 1, 0, 1, 0, &sp, 0, 0};
    Model m;
    model_init(&m, &c, be, B, T, &mm);
    EXPECT(m.nchunks == 2 && m.chunk[0].first && !m.chunk[0].last && m.chunk[1].last, "two chunks");
    be->to_device(m.params, params, P * sizeof(float));
    be->zero(m.grads, P * sizeof(float));
    size_t nd = (size_t)B * T * c.d_model;
    float *h = xmalloc(nd * sizeof(float));
    int32_t x[B * T], y[B * T];
    for (int micro = 0; micro < M; micro++) {
        tokens(x, y, micro);
        model_use(&m, 0, 0);
        model_forward(&m, x, y, B, T, 1.0f / (B * T * M), 0);
        be->to_host(h, model_stage_out(&m), nd * sizeof(float));
        double carry[3] = {m.aux, m.z, (double)m.dropped};
        model_use(&m, 1, 0);
        be->to_device(model_stage_in(&m), h, nd * sizeof(float));
        m.aux = carry[0];
        m.z = carry[1];
        m.dropped = (int64_t)carry[2];
        double l = model_forward(&m, x, y, B, T, 1.0f / (B * T * M), 0);
        EXPECT(l == l0[micro], "%s: chunked micro-batch %d loss %.17g vs %.17g", be->name, micro, l,
               l0[micro]);
        model_backward(&m, c.aux_coef / M, c.z_coef / M);
        be->to_host(h, m.dres, nd * sizeof(float));
        model_use(&m, 0, 0);
        be->to_device(m.dres, h, nd * sizeof(float));
        model_backward(&m, c.aux_coef / M, c.z_coef / M);
    }
    be->to_host(g1, m.grads, P * sizeof(float));
    EXPECT(!memcmp(g0, g1, P * sizeof(float)),
           "%s: two chunks run stage by stage: gradients differ from the whole model", be->name);
    model_free(&m);
    free(h);
    free(params);
    free(g0);
    free(g1);
    params_free(&t);
}

int main(void) {
    check_backend(backend_cpu());
    if (backend_cuda_available()) {
        check_backend(backend_by_name("cuda"));
        check_backend(backend_by_name("cuda-fp32"));
    } else {
        printf("(cuda, cuda-fp32: no GPU here, checked on cpu only)\n");
    }
    return test_done("test_slots");
}
