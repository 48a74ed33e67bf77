// test_alloc.c — a training step after the first allocates nothing: neither host memory (core/common.h
// alloc_count: every xmalloc / xcalloc / xrealloc) nor backend buffers (alloc_count_backend), in
// one process, with MoE configs that run the dispatch dropless and with capacity drops, gradient
// accumulation over 2 micro-batches, the router jitter, the (gated) shared expert, the aux-loss scopes,
// recomputation, AMPipe chunks, the aux-free balance (its routing bias updated after each step), MTP and
// --fp8-save's FP8 rows (on the FP8 table, with AMPipe), the LM heads in row chunks (--loss-chunks). The
// mesh cases (EP 2: the exchange's plans; ZeRO, which one process does not run) are mpi_alloc.c's
// (test_alloc_mesh.sh). The cpu backend, or MOE_TEST_BACKEND=cuda / cuda-fp32 (skips, exit 77, without
// a GPU).
#include <string.h>
#include "alloc_steps.h"
#include "test_util.h"

static void small_run(ModelConfig *c, TrainOptions *o) {
    config_preset(c, "tiny");
    c->d_model = 32;
    c->n_heads = 4;
    c->n_kv_heads = 2;
    c->head_dim = 8;
    c->d_ff = 48;
    c->n_layers = 2;
    train_options_default(o);
    o->steps = ALLOC_STEPS;
    o->batch = 4;
    o->grad_accum = 2;
    o->seq_len = 16;
}

static void check(const char *label, ModelConfig c, const TrainOptions *o, const Backend *be, Comm *world) {
    AllocSteps a = alloc_steps_run(c, o, be, world);
    printf("%-34s allocations per step (host / backend):", label);
    for (int s = 0; s < ALLOC_STEPS; s++)
        printf(" %llu/%llu", (unsigned long long)a.host[s], (unsigned long long)a.dev[s]);
    printf("  loss %.6f\n", a.loss[ALLOC_STEPS - 1]);
    for (int s = 1; s < ALLOC_STEPS; s++) {
        EXPECT(a.host[s] == 0, "%s: step %d made %llu host allocations", label, s + 1,
               (unsigned long long)a.host[s]);
        EXPECT(a.dev[s] == 0, "%s: step %d made %llu backend allocations", label, s + 1,
               (unsigned long long)a.dev[s]);
    }
}

int main(void) {
    const char *name = getenv("MOE_TEST_BACKEND");
    const Backend *be = backend_cpu();
    if (name && *name && strcmp(name, "cpu")) {
        if (!backend_cuda_available())
            TEST_SKIP("no CUDA GPU (or a build without CUDA): backend_cuda_available() = 0");
        be = backend_by_name(name);
    }
    Comm *world = comm_world_init(NULL, NULL);
    ModelConfig c;
    TrainOptions o;

    small_run(&c, &o);
    c.jitter = 0.01f;
    c.family = FAM_QWEN2_MOE;
    c.n_shared_experts = 1;
    c.shared_d_ff = 24;
    c.shared_gate = 1;
    check("dropless, jitter, shared expert", c, &o, be, world);

    small_run(&c, &o);
    c.dispatch = DISPATCH_CAPACITY;
    c.capacity_factor = 0.75f;
    check("capacity 0.75", c, &o, be, world);

    small_run(&c, &o);
    c.aux_scope = AUX_SCOPE_SEQ;
    check("aux scope sequence", c, &o, be, world);

    small_run(&c, &o);
    c.aux_scope = AUX_SCOPE_GLOBAL;
    c.dispatch = DISPATCH_CAPACITY;
    o.recompute = RECOMPUTE_FULL;
    check("aux scope global, recompute full", c, &o, be, world);

    small_run(&c, &o);
    o.ampipe = 2;
    check("ampipe 2", c, &o, be, world);

    small_run(&c, &o);
    c.dispatch = DISPATCH_CAPACITY;
    o.ampipe = 4;
    o.grad_accum = 1;
    check("ampipe 4, capacity, one micro-batch", c, &o, be, world);

    small_run(&c, &o);
    c.balance = BALANCE_AUX_FREE;
    o.zero = 2; // as `moe train --zero 2` runs in one process: nothing to shard (dist_init), no comm
    check("aux-free balance, zero 2", c, &o, be, world);

    small_run(&c, &o); // the MTP modules: their row maps made once, their scratch at init
    c.mtp_depth = 2;
    c.balance = BALANCE_AUX_FREE;
    o.recompute = RECOMPUTE_MOE;
    check("2 MTP modules, aux-free, recompute moe", c, &o, be, world);

    small_run(&c, &o); // the LM heads over 3 chunks of the rows (and an MTP module's)
    c.mtp_depth = 1;
    o.loss_chunks = 3;
    check("loss chunks 3, an MTP module", c, &o, be, world);
    o.loss_chunks = 1;

    const Backend *fp8 = backend_fp8(be); // (--fp8-save: where the FP8 table keeps FP8 rows)
    if (fp8->fp8_save) {
        small_run(&c, &o);
        o.precision = PREC_FP8;
        o.fp8_save = 1;
        o.ampipe = 2;
        check("fp8, fp8-save, ampipe 2", c, &o, fp8, world);
    }

    comm_world_finalize();
    return test_done("test_alloc");
}
