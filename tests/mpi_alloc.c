// mpi_alloc.c — run under mpirun by test_alloc_mesh.sh (not a ctest test of its own): a training step after
// the first allocates nothing on a mesh either (test_alloc.c's check through alloc_steps.h), where the MoE
// exchange plans, gathers and moves rows between ranks: dropless and capacity dispatch, the pipelined
// exchange (r 2), the two-level all-to-all (HIER), gradient accumulation over 2 micro-batches, overlapped
// gradient buckets, ZeRO 1 and 2 (sharded moments and gradients, the buckets' reduce-scatter and gather) and
// the aux-free balance. Every allocation counts, the comm layer's (src/parallel/comm_world.c: its count
// conversions, its requests) included. Every rank checks its own counts.
// usage: mpi_alloc TP EP ETP HIER [staged|ipc] (HIER > 1: the two-level all-to-all over nodes of HIER EP
// ranks; staged: every device collective through the staged transport's pooled buffers, comm_staged.c;
// ipc: the all-to-all-v through shared-memory inboxes, comm_ipc.c)
#include <string.h>
#include "alloc_steps.h"
#include "test_util.h"

static void check(Comm *world, const char *label, ModelConfig c, const TrainOptions *o) {
    AllocSteps a = alloc_steps_run(c, o, backend_cpu(), world);
    int me = comm_rank(world);
    printf("[rank %d] %-34s allocations per step (host / backend):", me, label);
    for (int s = 0; s < ALLOC_STEPS; s++)
        printf(" %llu/%llu", (unsigned long long)a.host[s], (unsigned long long)a.dev[s]);
    printf("\n");
    for (int s = 1; s < ALLOC_STEPS; s++) {
        EXPECT(a.host[s] == 0, "[rank %d] %s: step %d made %llu host allocations", me, label, s + 1,
               (unsigned long long)a.host[s]);
        EXPECT(a.dev[s] == 0, "[rank %d] %s: step %d made %llu backend allocations", me, label, s + 1,
               (unsigned long long)a.dev[s]);
    }
}

int main(int argc, char **argv) {
    Comm *world = comm_world_init(&argc, &argv);
    if (argc != 5 && !(argc == 6 && (!strcmp(argv[5], "staged") || !strcmp(argv[5], "ipc"))))
        DIE("usage: mpi_alloc TP EP ETP HIER [staged|ipc]");
    ModelConfig c;
    config_preset(&c, "tiny");
    c.d_model = 32;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 8;
    c.d_ff = 48;
    c.n_layers = 2;
    TrainOptions o;
    train_options_default(&o);
    o.steps = ALLOC_STEPS;
    o.seq_len = 16;
    o.tp = atoi(argv[1]);
    o.ep = atoi(argv[2]);
    o.etp = atoi(argv[3]);
    o.a2a_hier = atoi(argv[4]);
    if (argc == 6) o.gpu_comm = !strcmp(argv[5], "ipc") ? GPUCOMM_IPC : GPUCOMM_STAGED;
    o.batch = 4 * comm_size(world) / o.tp;
    o.grad_accum = 2;
    check(world, "dropless", c, &o);
    o.a2a_overlap = 2;
    check(world, "dropless, overlap 2", c, &o);
    c.dispatch = DISPATCH_CAPACITY;
    c.capacity_factor = 0.75f;
    check(world, "capacity 0.75, overlap 2", c, &o);
    o.a2a_overlap = 1;
    check(world, "capacity 0.75", c, &o);
    c.dispatch = DISPATCH_DROPLESS;
    o.zero = 1;
    check(world, "dropless, zero 1", c, &o);
    o.zero = 2;
    o.bucket_mb = 0.01f; // buckets of 2,621 elements: several per layer in flight at once
    check(world, "dropless, zero 2, small buckets", c, &o);
    c.balance = BALANCE_AUX_FREE;
    o.overlap = 0;
    check(world, "aux-free, zero 2, no overlap", c, &o);
    int rc = test_done("mpi_alloc");
    comm_world_finalize();
    return rc;
}
