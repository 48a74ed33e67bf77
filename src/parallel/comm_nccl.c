// comm_nccl.c — the `nccl` backend of the comm API: the device ops (Comm.dops) of a group, over
// NCCL, for the compute backend's GPU buffers; and when a device collective is due (comm_dev_due,
// MOE_FORCE_NCCL). Compiled to stubs without MOE_HAVE_NCCL.
// The world (comm_world.c) ends this backend (comm_dev_disable, and nccl_shutdown, registered with
// comm_world_at_finalize when the backend starts); this backend asks the world for the node-local rank
// and for the abort of every rank.
//
// Streams: the compute backend enqueues on one stream, the legacy default stream. Every operation
// here runs on one communication stream (non-blocking, high priority), shared by all groups so
// every rank issues its NCCL calls in one order. Before an operation the communication stream
// waits for an event recorded on the compute stream (so it sees the finished inputs); after it, an
// event recorded on the communication stream is what the compute stream waits for (blocking forms
// at once, non-blocking forms at comm_wait).
// No host synchronisation anywhere on that path.
//
// Failures: the communicators are non-blocking (ncclConfig_t.blocking = 0), so no NCCL call can
// hang the host: ncclInProgress is polled with ncclCommGetAsyncError in a bounded wait. A watchdog
// thread polls every communicator's async error and every operation in flight (its completion
// event); an error, or an operation not done MOE_NCCL_TIMEOUT_S seconds (default 300) after it was
// enqueued, ends this rank with one message, ncclCommAbort on every communicator and MPI_Abort,
// which ends every rank: a dead or hung rank never leaves the others waiting for ever.
// Must not hold: MPI calls (comm_world.c), knowledge of what the buffers hold.
#include "parallel/comm.h"
#include <string.h>
#include "core/common.h"
#include "parallel/comm_impl.h"

int comm_nccl_forced(void) {
    static int v = -1;
    if (v >= 0) return v;
    const char *s = getenv("MOE_FORCE_NCCL");
    if (!s || !*s || !strcmp(s, "0")) return v = 0;
    if (strcmp(s, "1")) DIE("MOE_FORCE_NCCL='%s': use 1 (run the NCCL path even on one GPU) or 0", s);
    if (!comm_have_nccl())
        DIE("MOE_FORCE_NCCL=1: this moe was built without the NCCL backend (CMake needs CUDA and NCCL: see "
            "docs/ARCHITECTURE.md, GPU ranks)");
    return v = 1;
}

int comm_dev_due(const Comm *c) { return c && (c->size > 1 || (c->dops && comm_nccl_forced())); }

#ifndef MOE_HAVE_NCCL

int comm_have_nccl(void) { return 0; }
static void no_nccl(void) {
    DIE("this moe was built without the NCCL backend (CMake needs CUDA and NCCL): no device communicators");
}
void comm_dev_enable_world(Comm *world) { no_nccl(); }
void comm_dev_enable_split(const Comm *world, Comm *sub, int color, int key) { no_nccl(); }

#else

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

int comm_have_nccl(void) { return 1; }

typedef struct {
    ncclComm_t nc;
    char name[16];
    int rank, size;
} NcclGroup;
#define NC(c) (((NcclGroup *)(c)->dhandle)->nc)

// An event that marks the end of an operation on the communication stream; shared by the
// watchdog's list and (non-blocking forms) the request, so reference-counted. The request is part of
// it (reused with it from the free list: no allocation per operation).
typedef struct Ev {
    cudaEvent_t e;
    CommReq req; // a non-blocking form's (impl: this event)
    int refs;
    struct Ev *next; // free list / in-flight list
    double t0; // when enqueued
    const char *op;
    char group[16];
} Ev;

static struct {
    int ready, dev, rank; // rank: world rank, for messages
    double timeout;
    cudaStream_t compute, comm;
    cudaEvent_t from_compute; // recorded on compute, waited for by comm (reused)
    pthread_mutex_t mu; // guards the lists and the registry below
    Ev *free_ev, *inflight, *inflight_tail;
    NcclGroup *reg[64]; // live communicators
    int nreg;
    pthread_t watchdog;
    int watchdog_on, stop;
    double stall_s; // MOE_NCCL_TEST_STALL_S: test hook (see stall_fn)
} G = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

static int comms_aborted;
static void *abort_comms(void *arg) {
    for (int i = 0; i < G.nreg; i++)
        if (G.reg[i]) ncclCommAbort(G.reg[i]->nc);
    __atomic_store_n(&comms_aborted, 1, __ATOMIC_RELEASE);
    return NULL;
}

// The end of a rank that cannot go on: one message, every communicator aborted (given at most 5 s:
// ncclCommAbort can wait for work it cannot stop), every rank ended (MPI_Abort). Safe from the
// watchdog thread (never returns; no atexit handlers, which could wait on the GPU).
static void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fatal(const char *fmt, ...) {
    char msg[1024];
    static int dying;
    if (__atomic_exchange_n(&dying, 1, __ATOMIC_ACQ_REL))
        for (;;) pause(); // one message: the first caller's
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fflush(stdout);
    fprintf(stderr, "moe: error: [rank %d] %s\n", G.rank, msg);
    fflush(stderr);
    alarm(30); // if ending itself hangs, SIGALRM ends the process (and the launcher the rest)
    pthread_t th;
    if (pthread_create(&th, NULL, abort_comms, NULL) == 0)
        for (int i = 0; i < 500 && !__atomic_load_n(&comms_aborted, __ATOMIC_ACQUIRE); i++) sleep_s(0.01);
    comm_world_abort();
    _exit(1);
}

#define CUDA_OK(call) \
    do { \
        cudaError_t _e = (call); \
        if (_e != cudaSuccess) \
            fatal("%s failed: %s (%s)", #call, cudaGetErrorName(_e), cudaGetErrorString(_e)); \
    } while (0)

typedef struct {
    ncclComm_t nc;
    ncclResult_t r;
} Pending;
static int poll_comm(void *ctx) {
    Pending *p = ctx;
    ncclResult_t e = ncclCommGetAsyncError(p->nc, &p->r);
    if (e != ncclSuccess) p->r = e;
    return p->r == ncclInProgress ? COMM_POLL_PENDING
        : p->r == ncclSuccess     ? COMM_POLL_DONE
                                  : COMM_POLL_ERROR;
}

// Checks an NCCL call on communicator nc (NULL: none yet): ncclInProgress is waited for, bounded.
static void nccl_ok(ncclResult_t r, ncclComm_t nc, const char *call, const char *group) {
    if (r == ncclInProgress && nc) {
        Pending p = {nc, r};
        int w = comm_poll_until(poll_comm, &p, G.timeout, NULL);
        if (w == COMM_POLL_TIMEOUT)
            fatal(
                "%s on group %s did not finish within %g s (MOE_NCCL_TIMEOUT_S): a rank died, hung or called "
                "other collectives",
                call, group, G.timeout);
        r = p.r;
    }
    if (r != ncclSuccess)
        fatal("%s on group %s failed: %s (%s)", call, group, ncclGetErrorString(r),
              nc && ncclGetLastError(nc)[0] ? ncclGetLastError(nc) : ncclGetLastError(NULL));
}
#define NCCL_OK(c, call) nccl_ok((call), NC(c), #call, (c)->name)

static ncclDataType_t nt(CommType t) {
    switch (t) {
        case CT_F32: return ncclFloat32;
        case CT_F64: return ncclFloat64;
        case CT_I32: return ncclInt32;
        case CT_I64: return ncclInt64;
        case CT_BF16: return ncclBfloat16; // moved only (comm.h)
        default: return ncclUint8;
    }
}

// ---- in-flight operations and the watchdog

static Ev *ev_get(int refs) {
    pthread_mutex_lock(&G.mu);
    Ev *e = G.free_ev;
    if (e) G.free_ev = e->next;
    pthread_mutex_unlock(&G.mu);
    if (!e) {
        e = xcalloc(1, sizeof *e);
        CUDA_OK(cudaEventCreateWithFlags(&e->e, cudaEventDisableTiming));
    }
    e->refs = refs;
    e->next = NULL;
    return e;
}
static void ev_put_locked(Ev *e) {
    if (--e->refs > 0) return;
    e->next = G.free_ev;
    G.free_ev = e;
}
static void ev_put(Ev *e) {
    pthread_mutex_lock(&G.mu);
    ev_put_locked(e);
    pthread_mutex_unlock(&G.mu);
}

static void *watchdog(void *arg) {
    cudaSetDevice(G.dev);
    double tick = G.timeout / 20 < 0.1 ? G.timeout / 20 : 0.1;
    while (!__atomic_load_n(&G.stop, __ATOMIC_ACQUIRE)) {
        sleep_s(tick);
        pthread_mutex_lock(&G.mu);
        double t = now_s();
        // in-flight operations, oldest first (the stream completes them in order)
        while (G.inflight) {
            Ev *e = G.inflight;
            cudaError_t q = cudaEventQuery(e->e);
            if (q == cudaErrorNotReady) {
                if (t - e->t0 > G.timeout)
                    fatal("NCCL %s on group %s did not complete within %g s (MOE_NCCL_TIMEOUT_S): a rank "
                          "died, hung, "
                          "or the ranks disagree on the collectives (a mismatched mesh?); ending every rank",
                          e->op, e->group, G.timeout);
                break;
            }
            if (q != cudaSuccess)
                fatal("NCCL %s on group %s: the GPU reported %s (%s)", e->op, e->group, cudaGetErrorName(q),
                      cudaGetErrorString(q));
            G.inflight = e->next;
            if (!G.inflight) G.inflight_tail = NULL;
            ev_put_locked(e);
        }
        for (int i = 0; i < G.nreg; i++) {
            ncclResult_t r = ncclSuccess;
            if (!G.reg[i]) continue;
            ncclResult_t e = ncclCommGetAsyncError(G.reg[i]->nc, &r);
            if (e != ncclSuccess) r = e;
            if (r != ncclSuccess && r != ncclInProgress)
                fatal("NCCL reported an error on group %s: %s (%s); ending every rank", G.reg[i]->name,
                      ncclGetErrorString(r), ncclGetLastError(G.reg[i]->nc));
        }
        pthread_mutex_unlock(&G.mu);
    }
    return NULL;
}

// Test hook: MOE_NCCL_TEST_STALL_S=N holds the communication stream for N seconds before the first
// operation (a peer that never arrives), so the timeout path can be tested on one GPU.
static double stall_for;
static void CUDART_CB stall_fn(void *arg) { sleep_s(stall_for); }

// Order the communication stream after the compute stream's work so far.
static void begin(void) {
    CUDA_OK(cudaEventRecord(G.from_compute, G.compute));
    CUDA_OK(cudaStreamWaitEvent(G.comm, G.from_compute, 0));
    if (G.stall_s > 0) {
        stall_for = G.stall_s;
        G.stall_s = 0;
        CUDA_OK(cudaLaunchHostFunc(G.comm, stall_fn, NULL));
    }
}
// Mark the end of the operation just enqueued; the watchdog watches it. refs: 1 + holders.
static Ev *end_event(const Comm *c, const char *op, int refs) {
    Ev *e = ev_get(refs + 1);
    e->t0 = now_s();
    e->op = op;
    snprintf(e->group, sizeof e->group, "%s", c->name);
    CUDA_OK(cudaEventRecord(e->e, G.comm));
    pthread_mutex_lock(&G.mu);
    if (G.inflight_tail) G.inflight_tail->next = e;
    else G.inflight = e;
    G.inflight_tail = e;
    pthread_mutex_unlock(&G.mu);
    return e;
}
// The compute stream waits for a finished blocking operation.
static void join(const Comm *c, const char *op) {
    CUDA_OK(cudaStreamWaitEvent(G.compute, end_event(c, op, 0)->e, 0));
}

#define ES(t) comm_type_size(t)
#define AT(p, i, t) ((char *)(p) + (size_t)(i)*ES(t))

// ---- the operations (enqueue only; begin/join order them)

static void q_allreduce(const Comm *c, void *buf, size_t n, CommType t) {
    NCCL_OK(c, ncclAllReduce(buf, buf, n, nt(t), ncclSum, NC(c), G.comm));
}
static void q_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    int eq = 1;
    size_t tot = 0;
    for (int i = 0; i < c->size; i++) {
        eq &= counts[i] == counts[0];
        tot += counts[i];
    }
    if (!tot) return;
    if (eq) {
        NCCL_OK(c, ncclReduceScatter(send, recv, counts[0], nt(t), ncclSum, NC(c), G.comm));
        return;
    }
    // unequal blocks: one reduce per block, rooted at the rank that keeps it, in one group
    size_t off = 0;
    NCCL_OK(c, ncclGroupStart());
    for (int i = 0; i < c->size; i++) {
        if (counts[i])
            NCCL_OK(c, ncclReduce(AT(send, off, t), recv, counts[i], nt(t), ncclSum, i, NC(c), G.comm));
        off += counts[i];
    }
    NCCL_OK(c, ncclGroupEnd());
}

static void n_allreduce(const Comm *c, void *buf, size_t n, CommType t) {
    if (!n) return;
    begin();
    q_allreduce(c, buf, n, t);
    join(c, "allreduce");
}
static void n_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t) {
    if (!n) return;
    begin();
    NCCL_OK(c, ncclAllGather(send, recv, n, nt(t), NC(c), G.comm));
    join(c, "allgather");
}
static void n_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                         const size_t *displs, CommType t) {
    int eq = 1;
    size_t tot = 0;
    for (int i = 0; i < c->size; i++) {
        eq &= counts[i] == counts[0] && displs[i] == (size_t)i * counts[0];
        tot += counts[i];
    }
    if (n != counts[c->rank])
        fatal("allgatherv on group %s: sending %zu elements, counts say %zu", c->name, n, counts[c->rank]);
    if (!tot) return;
    begin();
    if (eq) {
        NCCL_OK(c, ncclAllGather(send, recv, counts[0], nt(t), NC(c), G.comm));
    } else {
        // one broadcast per rank's block, in one group (in place when send is my block of recv)
        NCCL_OK(c, ncclGroupStart());
        for (int i = 0; i < c->size; i++)
            if (counts[i])
                NCCL_OK(c,
                        ncclBroadcast(i == c->rank ? send : AT(recv, displs[i], t), AT(recv, displs[i], t),
                                      counts[i], nt(t), i, NC(c), G.comm));
        NCCL_OK(c, ncclGroupEnd());
    }
    join(c, "allgatherv");
}
static void n_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    begin();
    q_reduce_scatter(c, send, recv, counts, t);
    join(c, "reduce_scatter");
}
static void q_alltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                        const size_t *rc, const size_t *rd, CommType t) {
    // every pair that exchanges rows, self included (NCCL copies to self within the group)
    NCCL_OK(c, ncclGroupStart());
    for (int p = 0; p < c->size; p++) {
        if (sc[p]) NCCL_OK(c, ncclSend(AT(send, sd[p], t), sc[p], nt(t), p, NC(c), G.comm));
        if (rc[p]) NCCL_OK(c, ncclRecv(AT(recv, rd[p], t), rc[p], nt(t), p, NC(c), G.comm));
    }
    NCCL_OK(c, ncclGroupEnd());
}
static void n_alltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                        const size_t *rc, const size_t *rd, CommType t) {
    begin();
    q_alltoallv(c, send, sc, sd, recv, rc, rd, t);
    join(c, "alltoallv");
}
static void n_bcast(const Comm *c, void *buf, size_t n, CommType t, int root) {
    if (!n) return;
    begin();
    NCCL_OK(c, ncclBroadcast(buf, buf, n, nt(t), root, NC(c), G.comm));
    join(c, "bcast");
}

typedef struct {
    cudaEvent_t e;
} EvPoll;
static int poll_event(void *ctx) {
    cudaError_t q = cudaEventQuery(((EvPoll *)ctx)->e);
    return q == cudaErrorNotReady ? COMM_POLL_PENDING : q == cudaSuccess ? COMM_POLL_DONE : COMM_POLL_ERROR;
}
// A barrier is a host wait: a one-element all-reduce, waited for (bounded) on the host.
static void n_barrier(const Comm *c) {
    static float *one;
    if (!one) CUDA_OK(cudaMalloc((void **)&one, sizeof(float)));
    begin();
    q_allreduce(c, one, 1, CT_F32);
    Ev *e = end_event(c, "barrier", 1);
    EvPoll p = {e->e};
    int w = comm_poll_until(poll_event, &p, G.timeout, NULL);
    if (w == COMM_POLL_TIMEOUT)
        fatal("barrier on group %s did not complete within %g s (MOE_NCCL_TIMEOUT_S)", c->name, G.timeout);
    if (w == COMM_POLL_ERROR) CUDA_OK(cudaEventQuery(e->e));
    ev_put(e);
}

static const CommOps nccl_ops;
static void n_detach(Comm *c);
static CommReq *req_of(Ev *e) {
    e->req.ops = &nccl_ops;
    e->req.impl = e;
    return &e->req;
}
static CommReq *n_iallreduce(const Comm *c, void *buf, size_t n, CommType t) {
    begin();
    if (n) q_allreduce(c, buf, n, t);
    return req_of(end_event(c, "iallreduce", 1));
}
static CommReq *n_ireduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts,
                                  CommType t) {
    begin();
    q_reduce_scatter(c, send, recv, counts, t);
    return req_of(end_event(c, "ireduce_scatter", 1));
}
static CommReq *n_ialltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                             const size_t *rc, const size_t *rd, CommType t) {
    begin();
    q_alltoallv(c, send, sc, sd, recv, rc, rd, t);
    return req_of(end_event(c, "ialltoallv", 1));
}
// Pipeline point-to-point over NCCL is not built yet (one stream would serialise a stage's sends
// behind its receives; it needs grouped send/receive pairs, measured on several GPUs).
static CommReq *n_isend(const Comm *c, const void *buf, size_t n, CommType t, int peer, int tag) {
    fatal("point-to-point send on group %s: the nccl backend does not carry pipeline stages yet", c->name);
    return NULL;
}
static CommReq *n_irecv(const Comm *c, void *buf, size_t n, CommType t, int peer, int tag) {
    fatal("point-to-point receive on group %s: the nccl backend does not carry pipeline stages yet", c->name);
    return NULL;
}
static int n_test(CommReq *r) {
    cudaError_t q = cudaEventQuery(((Ev *)r->impl)->e);
    if (q == cudaErrorNotReady) return 0;
    CUDA_OK(q);
    return 1;
}
static void n_wait(CommReq *r) {
    Ev *e = r->impl;
    CUDA_OK(cudaStreamWaitEvent(G.compute, e->e, 0));
    ev_put(e); // (r goes with it)
}

static const CommOps nccl_ops = {
    n_allreduce, n_allgather,  n_allgatherv,      n_reduce_scatter, n_alltoallv, n_bcast,
    n_barrier,   n_iallreduce, n_ireduce_scatter, n_ialltoallv,     n_isend,     n_irecv,
    n_test,      n_wait,       n_detach,
};

// ---- setup

static void nccl_shutdown(void);
static void setup(int world_rank) {
    if (G.ready) return;
    G.rank = world_rank;
    G.timeout = comm_timeout_s();
    // NVLink multicast (NVLS) can take a shared host's GPUs out of service: off unless asked for
    setenv("NCCL_NVLS_ENABLE", "0", 0);
    const char *st = getenv("MOE_NCCL_TEST_STALL_S");
    if (st) G.stall_s = atof(st);
    int n = 0, cur = -1;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n < 1)
        DIE("the NCCL backend needs a CUDA GPU on every rank: %s",
            e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
    const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE") ? getenv("OMPI_COMM_WORLD_LOCAL_SIZE")
                                                          : getenv("MPI_LOCALNRANKS");
    if (ls && atoi(ls) > n)
        DIE("%d processes on this node but %d GPU%s visible: the NCCL backend takes one GPU per process",
            atoi(ls), n, n == 1 ? "" : "s");
    int want = comm_local_rank() % n;
    CUDA_OK(cudaGetDevice(&cur));
    if (cur != want)
        DIE("local rank %d is on GPU %d but must use GPU %d (local rank %% %d GPUs): the CUDA backend has to "
            "call "
            "cudaSetDevice(comm_local_rank() %% ngpus) before it allocates",
            comm_local_rank(), cur, want, n);
    G.dev = cur;
    G.compute = cudaStreamLegacy; // where the cuda backend enqueues
    int lo, hi;
    CUDA_OK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    CUDA_OK(cudaStreamCreateWithPriority(&G.comm, cudaStreamNonBlocking, hi));
    CUDA_OK(cudaEventCreateWithFlags(&G.from_compute, cudaEventDisableTiming));
    G.stop = 0;
    if (pthread_create(&G.watchdog, NULL, watchdog, NULL) != 0) DIE("cannot start the NCCL watchdog thread");
    G.watchdog_on = 1;
    G.ready = 1;
    comm_world_at_finalize(nccl_shutdown); // (before MPI ends)
}

static void attach(Comm *c, ncclComm_t nc, const char *what) {
    Pending p = {nc, ncclInProgress};
    int w = comm_poll_until(poll_comm, &p, G.timeout, NULL);
    if (w == COMM_POLL_TIMEOUT)
        fatal("%s of group %s did not finish within %g s (MOE_NCCL_TIMEOUT_S): a rank died or never joined",
              what, c->name, G.timeout);
    if (w == COMM_POLL_ERROR)
        fatal("%s of group %s failed: %s (%s)", what, c->name, ncclGetErrorString(p.r), ncclGetLastError(nc));
    NcclGroup *g = xcalloc(1, sizeof *g);
    g->nc = nc;
    snprintf(g->name, sizeof g->name, "%s", c->name);
    nccl_ok(ncclCommUserRank(nc, &g->rank), nc, "ncclCommUserRank", c->name);
    nccl_ok(ncclCommCount(nc, &g->size), nc, "ncclCommCount", c->name);
    if (g->rank != c->rank || g->size != c->size)
        fatal("group %s: the NCCL communicator has rank %d of %d, the host group rank %d of %d", c->name,
              g->rank, g->size, c->rank, c->size);
    pthread_mutex_lock(&G.mu);
    int slot = -1;
    for (int i = 0; i < G.nreg && slot < 0; i++)
        if (!G.reg[i]) slot = i;
    if (slot < 0) {
        if (G.nreg == (int)(sizeof G.reg / sizeof G.reg[0])) DIE("too many NCCL communicators");
        slot = G.nreg++;
    }
    G.reg[slot] = g;
    pthread_mutex_unlock(&G.mu);
    c->dhandle = g;
    c->dops = &nccl_ops;
}

static int poll_set(void *ctx) {
    return __atomic_load_n((ncclComm_t *)ctx, __ATOMIC_ACQUIRE) ? COMM_POLL_DONE : COMM_POLL_PENDING;
}

static ncclConfig_t config(void) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; // calls return ncclInProgress instead of blocking: every wait is bounded
    return cfg;
}

void comm_dev_enable_world(Comm *world) {
    if (world->dops) return;
    setup(world->rank);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (world->rank == 0) nccl_ok(ncclGetUniqueId(&id), NULL, "ncclGetUniqueId", world->name);
    comm_bcast(world, &id, sizeof id, CT_U8, 0);
    ncclComm_t nc = NULL;
    ncclConfig_t cfg = config();
    ncclResult_t r = ncclCommInitRankConfig(&nc, world->size, id, world->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        fatal("ncclCommInitRankConfig (%d ranks) failed: %s (%s)", world->size, ncclGetErrorString(r),
              ncclGetLastError(nc));
    attach(world, nc, "ncclCommInitRankConfig");
}

void comm_dev_enable_split(const Comm *world, Comm *sub, int color, int key) {
    if (!world->dops) DIE("comm_dev_enable_split: enable the world's device communicator first");
    if (sub->dops) return;
    ncclComm_t nc = NULL;
    ncclConfig_t cfg = config();
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    // non-blocking: the split runs as a job of the parent, which is polled; the new communicator
    // is written to nc only when the job is done
    nccl_ok(ncclCommSplit(NC(world), color, key, &nc, &cfg), NC(world), "ncclCommSplit", sub->name);
    nccl_ok(ncclInProgress, NC(world), "ncclCommSplit (waiting for the parent)", sub->name);
    if (comm_poll_until(poll_set, &nc, G.timeout, NULL) != COMM_POLL_DONE)
        fatal("ncclCommSplit of group %s finished without a communicator (%s)", sub->name,
              ncclGetLastError(NC(world)));
    attach(sub, nc, "ncclCommSplit");
#else
    // older NCCL: a new communicator per group, its id broadcast over the group's host ops
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (sub->rank == 0) nccl_ok(ncclGetUniqueId(&id), NULL, "ncclGetUniqueId", sub->name);
    comm_bcast(sub, &id, sizeof id, CT_U8, 0);
    ncclResult_t r = ncclCommInitRankConfig(&nc, sub->size, id, sub->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        fatal("ncclCommInitRankConfig of group %s failed: %s", sub->name, ncclGetErrorString(r));
    attach(sub, nc, "ncclCommInitRankConfig");
#endif
}

static void n_detach(Comm *c) {
    NcclGroup *g = c->dhandle;
    pthread_mutex_lock(&G.mu);
    for (int i = 0; i < G.nreg; i++)
        if (G.reg[i] == g) G.reg[i] = NULL;
    pthread_mutex_unlock(&G.mu);
    // finalize flushes what is in flight (bounded), then the communicator's resources go
    nccl_ok(ncclCommFinalize(g->nc), g->nc, "ncclCommFinalize", g->name);
    ncclCommDestroy(g->nc);
    free(g);
}

static void nccl_shutdown(void) {
    if (!G.ready) return;
    for (int i = 0; i < G.nreg; i++) {
        if (!G.reg[i]) continue;
        NcclGroup *g = G.reg[i];
        G.reg[i] = NULL;
        nccl_ok(ncclCommFinalize(g->nc), g->nc, "ncclCommFinalize", g->name);
        ncclCommDestroy(g->nc);
        free(g);
    }
    // what is still in flight must finish (bounded: the watchdog is still running)
    EvPoll p;
    Ev *last = NULL;
    pthread_mutex_lock(&G.mu);
    if (G.inflight_tail) {
        last = G.inflight_tail;
        last->refs++;
    }
    pthread_mutex_unlock(&G.mu);
    if (last) {
        p.e = last->e;
        if (comm_poll_until(poll_event, &p, G.timeout, NULL) == COMM_POLL_TIMEOUT)
            fatal("NCCL operations still in flight at exit after %g s (MOE_NCCL_TIMEOUT_S)", G.timeout);
        ev_put(last);
    }
    __atomic_store_n(&G.stop, 1, __ATOMIC_RELEASE);
    if (G.watchdog_on) pthread_join(G.watchdog, NULL);
    G.watchdog_on = 0;
    while (G.inflight) {
        Ev *e = G.inflight;
        G.inflight = e->next;
        e->refs = 1;
        e->next = NULL;
        ev_put_locked(e);
    }
    G.inflight_tail = NULL;
    while (G.free_ev) {
        Ev *e = G.free_ev;
        G.free_ev = e->next;
        cudaEventDestroy(e->e);
        free(e);
    }
    cudaEventDestroy(G.from_compute);
    cudaStreamDestroy(G.comm);
    G.ready = 0;
}
#endif
