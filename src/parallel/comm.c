// comm.c — the comm API's wrappers (host and device variants), the `self` backend (size-1
// groups: copies only) and the bounded wait. It calls neither comm_world.c nor comm_nccl.c (see
// comm_impl.h).
// Must not hold: MPI or NCCL calls (the backends' files).
#include "parallel/comm.h"
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include "core/common.h"
#include "parallel/comm_impl.h"

size_t comm_type_size(CommType t) {
    switch (t) {
        case CT_F32:
        case CT_I32: return 4;
        case CT_F64:
        case CT_I64: return 8;
        case CT_BF16: return 2;
        default: return 1;
    }
}

static void self_allreduce(const Comm *c, void *buf, size_t n, CommType t) {}
static void self_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t) {
    if (send != recv) memmove(recv, send, n * comm_type_size(t));
}
static void self_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                            const size_t *displs, CommType t) {
    if (send != (char *)recv + displs[0] * comm_type_size(t))
        memmove((char *)recv + displs[0] * comm_type_size(t), send, n * comm_type_size(t));
}
static void self_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts,
                                CommType t) {
    if (send != recv) memmove(recv, send, counts[0] * comm_type_size(t));
}
static void self_alltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                           const size_t *rc, const size_t *rd, CommType t) {
    size_t es = comm_type_size(t);
    memmove((char *)recv + rd[0] * es, (const char *)send + sd[0] * es, sc[0] * es);
}
static void self_bcast(const Comm *c, void *buf, size_t n, CommType t, int root) {}
static void self_barrier(const Comm *c) {}
// A group of one finishes its non-blocking operations at once: every one returns this request, which
// is complete (ops NULL) and never written, so comm_test / comm_wait have nothing to do or free.
static CommReq self_done;
static CommReq *self_iallreduce(const Comm *c, void *buf, size_t n, CommType t) { return &self_done; }
static CommReq *self_ireduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts,
                                     CommType t) {
    self_reduce_scatter(c, send, recv, counts, t);
    return &self_done;
}
static CommReq *self_ialltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd,
                                void *recv, const size_t *rc, const size_t *rd, CommType t) {
    self_alltoallv(c, send, sc, sd, recv, rc, rd, t);
    return &self_done;
}
static CommReq *self_isend(const Comm *c, const void *buf, size_t n, CommType t, int peer, int tag) {
    DIE("internal error: point-to-point send on the group '%s' of one rank", c->name);
}
static CommReq *self_irecv(const Comm *c, void *buf, size_t n, CommType t, int peer, int tag) {
    DIE("internal error: point-to-point receive on the group '%s' of one rank", c->name);
}
static int self_test(CommReq *r) { return 1; }
static void self_wait(CommReq *r) {}

const CommOps comm_self_ops = {
    self_allreduce,      self_allgather,  self_allgatherv,
    self_reduce_scatter, self_alltoallv,  self_bcast,
    self_barrier,        self_iallreduce, self_ireduce_scatter,
    self_ialltoallv,     self_isend,      self_irecv,
    self_test,           self_wait,       NULL,
};

static const Comm self_comm = {.rank = 0, .size = 1, .name = "self", .ops = &comm_self_ops};
static const Comm *C(const Comm *c) { return c ? c : &self_comm; }

int comm_size(const Comm *c) { return C(c)->size; }
int comm_rank(const Comm *c) { return C(c)->rank; }

// the type of a reduction (CT_BF16 is moved only: comm.h)
static CommType red(CommType t) {
    if (t == CT_BF16) DIE("internal error: a reduction over CT_BF16 values (moved only)");
    return t;
}

void comm_allreduce(const Comm *c, void *buf, size_t n, CommType t) {
    C(c)->ops->allreduce(C(c), buf, n, red(t));
}
void comm_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t) {
    C(c)->ops->allgather(C(c), send, recv, n, t);
}
void comm_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                     const size_t *displs, CommType t) {
    C(c)->ops->allgatherv(C(c), send, n, recv, counts, displs, t);
}
void comm_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    C(c)->ops->reduce_scatter(C(c), send, recv, counts, red(t));
}
void comm_alltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                    const size_t *rc, const size_t *rd, CommType t) {
    C(c)->ops->alltoallv(C(c), send, sc, sd, recv, rc, rd, t);
}
void comm_bcast(const Comm *c, void *buf, size_t n, CommType t, int root) {
    C(c)->ops->bcast(C(c), buf, n, t, root);
}
void comm_barrier(const Comm *c) { C(c)->ops->barrier(C(c)); }

// device variants: the group's device ops when attached, else its host ops
static const CommOps *D(const Comm *c) { return C(c)->dops ? C(c)->dops : C(c)->ops; }
void comm_dev_allreduce(const Comm *c, void *buf, size_t n, CommType t) {
    D(c)->allreduce(C(c), buf, n, red(t));
}
void comm_dev_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t) {
    D(c)->allgather(C(c), send, recv, n, t);
}
void comm_dev_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                         const size_t *displs, CommType t) {
    D(c)->allgatherv(C(c), send, n, recv, counts, displs, t);
}
void comm_dev_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    D(c)->reduce_scatter(C(c), send, recv, counts, red(t));
}
void comm_dev_alltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                        const size_t *rc, const size_t *rd, CommType t) {
    D(c)->alltoallv(C(c), send, sc, sd, recv, rc, rd, t);
}
void comm_dev_bcast(const Comm *c, void *buf, size_t n, CommType t, int root) {
    D(c)->bcast(C(c), buf, n, t, root);
}
CommReq *comm_dev_iallreduce(const Comm *c, void *buf, size_t n, CommType t) {
    return D(c)->iallreduce(C(c), buf, n, red(t));
}
CommReq *comm_dev_ireduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts,
                                  CommType t) {
    return D(c)->ireduce_scatter(C(c), send, recv, counts, red(t));
}

CommReq *comm_dev_ialltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                             const size_t *rc, const size_t *rd, CommType t) {
    return D(c)->ialltoallv(C(c), send, sc, sd, recv, rc, rd, t);
}
CommReq *comm_iallreduce(const Comm *c, void *buf, size_t n, CommType t) {
    return C(c)->ops->iallreduce(C(c), buf, n, red(t));
}

CommReq *comm_isend(const Comm *c, const void *buf, size_t n, CommType t, int peer, int tag) {
    return C(c)->ops->isend(C(c), buf, n, t, peer, tag);
}
CommReq *comm_irecv(const Comm *c, void *buf, size_t n, CommType t, int peer, int tag) {
    return C(c)->ops->irecv(C(c), buf, n, t, peer, tag);
}
CommReq *comm_dev_isend(const Comm *c, const void *buf, size_t n, CommType t, int peer, int tag) {
    return D(c)->isend(C(c), buf, n, t, peer, tag);
}
CommReq *comm_dev_irecv(const Comm *c, void *buf, size_t n, CommType t, int peer, int tag) {
    return D(c)->irecv(C(c), buf, n, t, peer, tag);
}

void comm_dev_disable(Comm *c) {
    if (!c || !c->dops) return;
    if (c->dops->detach) c->dops->detach(c);
    c->dops = NULL;
    c->dhandle = NULL;
}

int comm_test(CommReq *r) { return r->ops ? r->ops->test(r) : 1; }
void comm_wait(CommReq *r) {
    if (r->ops) r->ops->wait(r);
}

// ---- bounded wait
static double real_now(void *ctx) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
static void real_pause(void *ctx, double s) {
    if (s <= 0) {
        sched_yield();
        return;
    }
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

int comm_poll_until(int (*poll)(void *ctx), void *ctx, double timeout_s, const CommClock *clock) {
    static const CommClock real = {real_now, real_pause, NULL};
    if (!clock) clock = &real;
    double t0 = clock->now(clock->ctx);
    for (long i = 0;; i++) {
        int r = poll(ctx);
        if (r != COMM_POLL_PENDING) return r;
        if (clock->now(clock->ctx) - t0 >= timeout_s) return COMM_POLL_TIMEOUT;
        // spin (yield) first: most waits end within microseconds; then 10 us, then 1 ms sleeps
        clock->pause(clock->ctx, i < 200 ? 0.0 : i < 2000 ? 1e-5 : 1e-3);
    }
}

// s parsed as the seconds of environment variable var (default def for the message)
static const char *parse_timeout(const char *var, double def, const char *s, double *out) {
    static char msg[160];
    char *end = NULL;
    double v = s ? strtod(s, &end) : NAN;
    if (!s || !*s || end == s || *end || !isfinite(v) || v <= 0 || v > 1e7) {
        snprintf(msg, sizeof msg, "%s='%.40s': must be a number of seconds > 0 (default %g)", var, s ? s : "",
                 def);
        return msg;
    }
    *out = v;
    return NULL;
}

const char *comm_parse_timeout(const char *s, double *out) {
    return parse_timeout("MOE_NCCL_TIMEOUT_S", 300, s, out);
}

static double env_timeout(const char *var, double def) {
    const char *s = getenv(var);
    double v = def;
    if (!s) return v;
    const char *bad = parse_timeout(var, def, s, &v);
    if (bad) DIE("%s", bad);
    return v;
}

double comm_timeout_s(void) { return env_timeout("MOE_NCCL_TIMEOUT_S", 300); }
double comm_host_timeout_s(void) { return env_timeout("MOE_COMM_TIMEOUT_S", 600); }

static int req_done(void *r) { return comm_test(r) ? COMM_POLL_DONE : COMM_POLL_PENDING; }
int comm_wait_for(CommReq *r, double timeout_s) {
    if (comm_poll_until(req_done, r, timeout_s, NULL) != COMM_POLL_DONE) return -1;
    comm_wait(r);
    return 0;
}
