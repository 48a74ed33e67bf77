// mpi_alloc.c — run under mpirun by test_alloc_mesh.sh (not a ctest test of its own): a training step after
// the first allocates nothing on a mesh either (test_alloc.c's check through alloc_steps.h), where the MoE
// exchange plans, gathers and moves rows between ranks: dropless and capacity dispatch, the pipelined
// exchange (r 2), the two-level all-to-all (HIER), gradient accumulation over 2 micro-batches, overlapped
// gradient buckets. Every rank checks its own counts.
// The comm API's MPI backend (src/parallel/comm_world.c) allocates per call today (its size_t -> int count
// conversions, a request per non-blocking operation), and so does ZeRO's bucket gather (train/dist.c, hence
// ZeRO 0 here): those are counted apart, by a wrapper around the ops of every group of the mesh
// (parallel/comm_impl.h), printed, and left out of the check; everything else a step runs (the model, the
// MoE layer and its exchange, the optimizer, the cpu backend) must allocate nothing.
// usage: mpi_alloc TP EP ETP HIER (HIER > 1: the two-level all-to-all over nodes of HIER EP ranks)
#include <string.h>
#include "alloc_steps.h"
#include "parallel/comm_impl.h"
#include "test_util.h"

// ---- the comm backend's allocations, counted apart
static uint64_t comm_allocs;
static struct {
    const Comm *c;
    const CommOps *real;
} wrapped[32];
static int nwrapped;

static const CommOps *real_ops(const Comm *c) {
    for (int i = 0; i < nwrapped; i++)
        if (wrapped[i].c == c) return wrapped[i].real;
    DIE("mpi_alloc: group '%s' was not wrapped", c->name);
}
#define COUNTED(call) \
    do { \
        uint64_t a0 = alloc_count(); \
        call; \
        comm_allocs += alloc_count() - a0; \
    } while (0)
static void w_allreduce(const Comm *c, void *buf, size_t n, CommType t) {
    COUNTED(real_ops(c)->allreduce(c, buf, n, t));
}
static void w_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t) {
    COUNTED(real_ops(c)->allgather(c, send, recv, n, t));
}
static void w_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                         const size_t *displs, CommType t) {
    COUNTED(real_ops(c)->allgatherv(c, send, n, recv, counts, displs, t));
}
static void w_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    COUNTED(real_ops(c)->reduce_scatter(c, send, recv, counts, t));
}
static void w_alltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                        const size_t *rc, const size_t *rd, CommType t) {
    COUNTED(real_ops(c)->alltoallv(c, send, sc, sd, recv, rc, rd, t));
}
static void w_bcast(const Comm *c, void *buf, size_t n, CommType t, int root) {
    COUNTED(real_ops(c)->bcast(c, buf, n, t, root));
}
static void w_barrier(const Comm *c) { COUNTED(real_ops(c)->barrier(c)); }
static CommReq *w_iallreduce(const Comm *c, void *buf, size_t n, CommType t) {
    CommReq *r;
    COUNTED(r = real_ops(c)->iallreduce(c, buf, n, t));
    return r;
}
static CommReq *w_ireduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts,
                                  CommType t) {
    CommReq *r;
    COUNTED(r = real_ops(c)->ireduce_scatter(c, send, recv, counts, t));
    return r;
}
static CommReq *w_ialltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                             const size_t *rc, const size_t *rd, CommType t) {
    CommReq *r;
    COUNTED(r = real_ops(c)->ialltoallv(c, send, sc, sd, recv, rc, rd, t));
    return r;
}
static CommReq *w_isend(const Comm *c, const void *buf, size_t n, CommType t, int peer, int tag) {
    CommReq *r;
    COUNTED(r = real_ops(c)->isend(c, buf, n, t, peer, tag));
    return r;
}
static CommReq *w_irecv(const Comm *c, void *buf, size_t n, CommType t, int peer, int tag) {
    CommReq *r;
    COUNTED(r = real_ops(c)->irecv(c, buf, n, t, peer, tag));
    return r;
}
// (requests carry the backend's own table: comm_test / comm_wait never come here)
static int w_test(CommReq *r) { DIE("mpi_alloc: a request on the counting table"); }
static void w_wait(CommReq *r) { DIE("mpi_alloc: a request on the counting table"); }
static const CommOps counting = {
    .allreduce = w_allreduce,
    .allgather = w_allgather,
    .allgatherv = w_allgatherv,
    .reduce_scatter = w_reduce_scatter,
    .alltoallv = w_alltoallv,
    .bcast = w_bcast,
    .barrier = w_barrier,
    .iallreduce = w_iallreduce,
    .ireduce_scatter = w_ireduce_scatter,
    .ialltoallv = w_ialltoallv,
    .isend = w_isend,
    .irecv = w_irecv,
    .test = w_test,
    .wait = w_wait,
};

static void wrap(Comm *c) {
    if (!c || c->ops == &counting) return;
    CHECK(nwrapped < (int)(sizeof wrapped / sizeof wrapped[0]), "mpi_alloc: too many groups");
    wrapped[nwrapped].c = c;
    wrapped[nwrapped++].real = c->ops;
    c->ops = &counting;
}

// (not the world: comm_split makes groups of MPI ranks only from the MPI backend's own table)
static void wrap_mesh(Mesh *m) {
    nwrapped = 0; // (the last case's groups are gone)
    Comm *cs[] = {m->tp, m->dp, m->pp, m->ep, m->etp, m->edp, m->stage, m->epn, m->epx};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++) wrap(cs[i]);
}

// ---- the cases
static void check(Comm *world, const char *label, ModelConfig c, const TrainOptions *o) {
    AllocSteps a = alloc_steps_run(c, o, backend_cpu(), world, wrap_mesh, &comm_allocs);
    int me = comm_rank(world);
    printf("[rank %d] %-26s allocations per step (host / backend; the MPI backend's apart):", me, label);
    for (int s = 0; s < ALLOC_STEPS; s++)
        printf(" %llu/%llu", (unsigned long long)a.host[s], (unsigned long long)a.dev[s]);
    printf(";");
    for (int s = 0; s < ALLOC_STEPS; s++) printf(" %llu", (unsigned long long)a.apart[s]);
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
    if (argc != 5) DIE("usage: mpi_alloc TP EP ETP HIER");
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
    int rc = test_done("mpi_alloc");
    comm_world_finalize();
    return rc;
}
