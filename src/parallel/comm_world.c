// comm_world.c — the world group and sub-groups: the `mpi` backend when built with MPI and
// launched with more than one process, otherwise `self`; the process's node-local rank, which it
// hands to the cuda backend (backend_cuda_set_rank) when the world starts. Errors on
// any rank abort every rank (MPI_Abort through the DIE hook, and comm_world_abort for the nccl
// backend), so a failure never leaves the others waiting. The world outlives the device backend it
// was given (mesh_enable_device), so it ends it: comm_free detaches a group's device communicator
// and comm_world_finalize runs the shutdown the backend registered (comm_world_at_finalize) before MPI.
// Every blocking MPI call is watched: one that outlasts MOE_COMM_TIMEOUT_S (a peer died, hangs or
// runs something else) prints one line naming the operation and group and ends this process, and
// with it the job (the launcher ends the others), so no rank waits forever.
// Nothing is allocated per call: each group holds a scratch for the int counts MPI takes and keeps
// the requests of its non-blocking operations (with their counts) for reuse once waited for.
// Must not hold: NCCL or CUDA calls (comm_nccl.c).
#include <limits.h>
#include <pthread.h>
#include <string.h>
#include <unistd.h>
#include "core/common.h"
#include "parallel/comm.h"
#include "ops/ops.h"
#include "parallel/comm_impl.h"

// (comm_impl.h) the device backend's shutdown, run once at comm_world_finalize
static void (*at_finalize)(void);
void comm_world_at_finalize(void (*fn)(void)) { at_finalize = fn; }
static void finalize_hook(void) {
    void (*fn)(void) = at_finalize;
    at_finalize = NULL;
    if (fn) fn();
}

#ifdef MOE_HAVE_MPI
#include <mpi.h>
#if defined(OPEN_MPI) && OPEN_MPI
#include <mpi-ext.h> // MPIX_Query_cuda_support
#endif

#define MPI_CHECK(call) \
    do { \
        int _e = (call); \
        if (_e != MPI_SUCCESS) { \
            char _s[MPI_MAX_ERROR_STRING]; \
            int _l; \
            MPI_Error_string(_e, _s, &_l); \
            DIE("%s failed: %s", #call, _s); \
        } \
    } while (0)

static MPI_Datatype mt(CommType t) {
    switch (t) {
        case CT_F32: return MPI_FLOAT;
        case CT_F64: return MPI_DOUBLE;
        case CT_I32: return MPI_INT32_T;
        case CT_I64: return MPI_INT64_T;
        case CT_BF16: return MPI_UINT16_T; // moved only (comm.h)
        default: return MPI_UINT8_T;
    }
}
static int ci(size_t n) {
    if (n > INT_MAX) DIE("MPI message of %zu elements exceeds INT_MAX", n);
    return (int)n;
}

// ---- a group's MPI state (Comm.handle), made with the group: nothing is allocated per call
// A non-blocking operation's request: what the caller holds, the MPI request and the int counts MPI
// reads until the operation completes. Kept by its group for reuse once waited for.
typedef struct MReq {
    CommReq r; // first: a CommReq * is its MReq *
    MPI_Request q;
    struct MGroup *g; // the group it returns to
    struct MReq *next; // the group's free list
    int counts[]; // 4 x the group's size
} MReq;
typedef struct MGroup {
    MPI_Comm comm;
    int *counts; // 4 x size: a blocking call's counts and displacements as MPI's ints
    MReq *free; // requests waited for, to reuse
    int pending; // requests handed out, not yet waited for
} MGroup;
#define MG(c) ((MGroup *)(c)->handle)
#define MC(c) (MG(c)->comm)

// c's MPI state around communicator h (c->size set)
static void group_make(Comm *c, MPI_Comm h) {
    MGroup *g = xcalloc(1, sizeof *g);
    g->comm = h;
    g->counts = xmalloc(sizeof(int) * 4 * (size_t)c->size);
    c->handle = g;
}
// (MPI still running: the communicator freed too)
static void group_free(Comm *c, int mpi_up) {
    MGroup *g = MG(c);
    if (!g) return;
    if (g->pending)
        DIE("internal error: group %s freed with %d non-blocking operations not waited for", c->name,
            g->pending);
    if (mpi_up) MPI_Comm_free(&g->comm);
    while (g->free) {
        MReq *m = g->free;
        g->free = m->next;
        free(m);
    }
    free(g->counts);
    free(g);
    c->handle = NULL;
}

// ---- the watchdog of blocking calls (one at a time: the ops are called from one thread)
static struct {
    pthread_mutex_t mu;
    int on, rank;
    double limit, deadline; // deadline 0: nothing in flight
    const char *op;
    char group[16];
} W = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void watch_begin(const Comm *c, const char *op) {
    if (!W.on) return;
    pthread_mutex_lock(&W.mu);
    W.deadline = now_seconds() + W.limit;
    W.op = op;
    snprintf(W.group, sizeof W.group, "%s", c->name);
    pthread_mutex_unlock(&W.mu);
}
static void watch_end(void) {
    if (!W.on) return;
    pthread_mutex_lock(&W.mu);
    W.deadline = 0;
    pthread_mutex_unlock(&W.mu);
}
static void *mpi_watchdog(void *arg) {
    (void)arg;
    for (;;) {
        usleep(200000);
        pthread_mutex_lock(&W.mu);
        int late = W.deadline > 0 && now_seconds() > W.deadline;
        char what[64];
        snprintf(what, sizeof what, "%s on group %s", W.op ? W.op : "?", W.group);
        pthread_mutex_unlock(&W.mu);
        if (!late) continue;
        fprintf(stderr,
                "moe: error: [rank %d] MPI %s did not complete within %g s (MOE_COMM_TIMEOUT_S): another "
                "rank died, hangs, or runs something else\n",
                W.rank, what, W.limit);
        fflush(NULL);
        _exit(1); // the launcher then ends every rank
    }
    return NULL;
}
static void watch_start(int rank) {
    W.limit = comm_host_timeout_s();
    W.rank = rank;
    pthread_t th;
    if (pthread_create(&th, NULL, mpi_watchdog, NULL) != 0) DIE("cannot start the MPI watchdog thread");
    pthread_detach(th);
    W.on = 1;
}
#define WATCHED(c, op, call) \
    do { \
        watch_begin(c, op); \
        MPI_CHECK(call); \
        watch_end(); \
    } while (0)

static void m_allreduce(const Comm *c, void *buf, size_t n, CommType t) {
    WATCHED(c, "allreduce", MPI_Allreduce(MPI_IN_PLACE, buf, ci(n), mt(t), MPI_SUM, MC(c)));
}
static void m_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t) {
    WATCHED(c, "allgather", MPI_Allgather(send, ci(n), mt(t), recv, ci(n), mt(t), MC(c)));
}
// a as MPI's ints, into dst (the group's scratch or a request's counts)
static int *ints(int *dst, const size_t *a, int n) {
    for (int i = 0; i < n; i++) dst[i] = ci(a[i]);
    return dst;
}
static void m_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                         const size_t *displs, CommType t) {
    int S = c->size, *rc = ints(MG(c)->counts, counts, S), *rd = ints(rc + S, displs, S);
    int in_place = send == (const char *)recv + displs[c->rank] * comm_type_size(t);
    WATCHED(c, "allgatherv",
            MPI_Allgatherv(in_place ? MPI_IN_PLACE : send, ci(n), mt(t), recv, rc, rd, mt(t), MC(c)));
}
static void m_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    int *rc = ints(MG(c)->counts, counts, c->size);
    WATCHED(c, "reduce_scatter", MPI_Reduce_scatter(send, recv, rc, mt(t), MPI_SUM, MC(c)));
}
static void m_alltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                        const size_t *rc, const size_t *rd, CommType t) {
    int S = c->size, *a = ints(MG(c)->counts, sc, S), *b = ints(a + S, sd, S), *x = ints(b + S, rc, S),
        *y = ints(x + S, rd, S);
    WATCHED(c, "alltoallv", MPI_Alltoallv(send, a, b, mt(t), recv, x, y, mt(t), MC(c)));
}
static void m_bcast(const Comm *c, void *buf, size_t n, CommType t, int root) {
    WATCHED(c, "bcast", MPI_Bcast(buf, ci(n), mt(t), root, MC(c)));
}
static void m_barrier(const Comm *c) { WATCHED(c, "barrier", MPI_Barrier(MC(c))); }
static const CommOps mpi_ops;
// A request of group c: one it has used before, else a new one (the group keeps it after the wait).
static MReq *req_get(const Comm *c) {
    MGroup *g = MG(c);
    MReq *m = g->free;
    if (m) g->free = m->next;
    else m = xmalloc(sizeof *m + sizeof(int) * 4 * (size_t)c->size);
    m->r.ops = &mpi_ops;
    m->r.impl = &m->q;
    m->g = g;
    m->next = NULL;
    g->pending++;
    return m;
}
static CommReq *m_iallreduce(const Comm *c, void *buf, size_t n, CommType t) {
    MReq *m = req_get(c);
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, ci(n), mt(t), MPI_SUM, MC(c), &m->q));
    return &m->r;
}
static CommReq *m_ireduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts,
                                  CommType t) {
    MReq *m = req_get(c);
    int *rc = ints(m->counts, counts, c->size); // must live until the request completes
    MPI_CHECK(MPI_Ireduce_scatter(send, recv, rc, mt(t), MPI_SUM, MC(c), &m->q));
    return &m->r;
}
static CommReq *m_ialltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                             const size_t *rc, const size_t *rd, CommType t) {
    MReq *m = req_get(c);
    int S = c->size; // the counts live until completion
    int *a = ints(m->counts, sc, S), *b = ints(a + S, sd, S), *x = ints(b + S, rc, S),
        *y = ints(x + S, rd, S);
    MPI_CHECK(MPI_Ialltoallv(send, a, b, mt(t), recv, x, y, mt(t), MC(c), &m->q));
    return &m->r;
}
static CommReq *m_isend(const Comm *c, const void *buf, size_t n, CommType t, int peer, int tag) {
    MReq *m = req_get(c);
    MPI_CHECK(MPI_Isend(buf, ci(n), mt(t), peer, tag, MC(c), &m->q));
    return &m->r;
}
static CommReq *m_irecv(const Comm *c, void *buf, size_t n, CommType t, int peer, int tag) {
    MReq *m = req_get(c);
    MPI_CHECK(MPI_Irecv(buf, ci(n), mt(t), peer, tag, MC(c), &m->q));
    return &m->r;
}
static int m_test(CommReq *r) {
    int flag = 0;
    MPI_CHECK(MPI_Test((MPI_Request *)r->impl, &flag, MPI_STATUS_IGNORE));
    return flag;
}
static void m_wait(CommReq *r) {
    static const Comm pending = {.name = "(request)"};
    WATCHED(&pending, "wait", MPI_Wait((MPI_Request *)r->impl, MPI_STATUS_IGNORE));
    MReq *m = (MReq *)r; // back to its group
    m->next = m->g->free;
    m->g->free = m;
    m->g->pending--;
}
static const CommOps mpi_ops = {
    m_allreduce,  m_allgather,       m_allgatherv, m_reduce_scatter, m_alltoallv, m_bcast, m_barrier,
    m_iallreduce, m_ireduce_scatter, m_ialltoallv, m_isend,          m_irecv,     m_test,  m_wait,
    NULL, // (host ops: nothing to detach)
};

static int mpi_started = 0;
static Comm *the_world; // freed by comm_world_finalize
static void abort_all(void) {
    int fin = 0;
    MPI_Finalized(&fin);
    if (mpi_started && !fin) MPI_Abort(MPI_COMM_WORLD, 1);
}

void comm_world_abort(void) { abort_all(); }

static int launched_by_mpi(void) {
    const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MV2_COMM_WORLD_SIZE",
                          "SLURM_NTASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

Comm *comm_world_init(int *argc, char ***argv) {
    Comm *w = the_world = xcalloc(1, sizeof *w);
    snprintf(w->name, sizeof w->name, "world");
    if (!launched_by_mpi()) {
        w->ops = &comm_self_ops;
        w->size = 1;
        return w;
    }
    MPI_CHECK(MPI_Init(argc, argv));
    mpi_started = 1;
    MPI_Comm h;
    MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &h));
    MPI_CHECK(MPI_Comm_set_errhandler(h, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(h, &w->rank));
    MPI_CHECK(MPI_Comm_size(h, &w->size));
    group_make(w, h);
    w->ops = &mpi_ops;
    moe_set_die_hook(abort_all, w->size > 1 ? w->rank : -1);
    if (w->size > 1) watch_start(w->rank);
    backend_cuda_set_rank(comm_local_rank()); // one GPU per process: the node-local rank picks it
    return w;
}

void comm_world_finalize(void) {
    int fin = 0;
    finalize_hook(); // (the device backend's communicators go before MPI)
    comm_staged_free();
    MPI_Finalized(&fin);
    if (the_world) group_free(the_world, !fin);
    free(the_world);
    the_world = NULL;
    if (!mpi_started) return;
    if (!fin) MPI_Finalize();
}

Comm *comm_split(const Comm *world, int color, int key, const char *name) {
    Comm *c = xcalloc(1, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    if (world->ops != &mpi_ops) {
        c->ops = &comm_self_ops;
        c->size = 1;
        return c;
    }
    MPI_Comm h;
    WATCHED(world, "split", MPI_Comm_split(MC(world), color, key, &h));
    MPI_CHECK(MPI_Comm_set_errhandler(h, MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(h, &c->rank));
    MPI_CHECK(MPI_Comm_size(h, &c->size));
    group_make(c, h);
    c->ops = &mpi_ops;
    return c;
}

void comm_free(Comm *c) {
    if (!c) return;
    if (c == the_world) the_world = NULL; // freed here, not again at finalize
    if (c->dops) comm_dev_disable(c);
    group_free(c, 1);
    free(c);
}

static int mpi_running(void) {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}
// this process's rank and the number of processes on its node (-1: MPI not running)
static int node_mpi(int *size) {
    if (!mpi_running()) return -1;
    MPI_Comm node;
    int r = 0;
    MPI_CHECK(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
    MPI_CHECK(MPI_Comm_rank(node, &r));
    if (size) MPI_CHECK(MPI_Comm_size(node, size));
    MPI_Comm_free(&node);
    return r;
}

int comm_mpi_cuda_aware(void) {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
    return mpi_running() ? MPIX_Query_cuda_support() != 0 : -1;
#else
    return -1;
#endif
}

#else // built without MPI: one process

static Comm *the_world; // freed by comm_world_finalize

Comm *comm_world_init(int *argc, char ***argv) {
    const char *s = getenv("OMPI_COMM_WORLD_SIZE");
    if (s && atoi(s) > 1) DIE("this moe was built without MPI; it cannot run as %s processes", s);
    Comm *w = the_world = xcalloc(1, sizeof *w);
    snprintf(w->name, sizeof w->name, "world");
    w->ops = &comm_self_ops;
    w->size = 1;
    return w;
}
void comm_world_finalize(void) {
    finalize_hook();
    comm_staged_free();
    free(the_world);
    the_world = NULL;
}
void comm_world_abort(void) {}
static int node_mpi(int *size) { return -1; }
int comm_mpi_cuda_aware(void) { return -1; }
Comm *comm_split(const Comm *world, int color, int key, const char *name) {
    Comm *c = xcalloc(1, sizeof *c);
    snprintf(c->name, sizeof c->name, "%s", name);
    c->ops = &comm_self_ops;
    c->size = 1;
    return c;
}
void comm_free(Comm *c) {
    if (c && c == the_world) the_world = NULL; // freed here, not again at finalize
    if (c && c->dops) comm_dev_disable(c);
    free(c);
}
#endif

int comm_local_rank(void) {
    static int cached = -1;
    if (cached >= 0) return cached;
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID",
                          "MV2_COMM_WORLD_LOCAL_RANK", "PMI_LOCAL_RANK"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        if (!v || !*v) continue;
        long r = strtol(v, &end, 10);
        if (*end || r < 0 || r > INT_MAX) DIE("%s='%s' is not a local rank (an integer >= 0)", vars[i], v);
        return cached = (int)r;
    }
    int r = node_mpi(NULL);
    if (r >= 0) return cached = r;
    return 0; // not launched by MPI: one process (not cached: MPI may start later)
}

int comm_local_size(void) {
    static int cached = -1;
    if (cached >= 0) return cached;
    const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "MV2_COMM_WORLD_LOCAL_SIZE",
                          "PMI_LOCAL_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        char *end;
        if (!v || !*v) continue;
        long n = strtol(v, &end, 10);
        if (*end || n < 1 || n > INT_MAX)
            DIE("%s='%s' is not a number of processes (an integer >= 1)", vars[i], v);
        return cached = (int)n;
    }
    int n = 1;
    if (node_mpi(&n) >= 0) return cached = n;
    return 1;
}
