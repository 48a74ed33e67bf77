// comm.c — the comm API's wrappers and the `self` backend (size-1 groups: copies only).
#include "parallel/comm.h"
#include <string.h>
#include "core/common.h"

size_t comm_type_size(CommType t) {
    switch (t) {
    case CT_F32: case CT_I32: return 4;
    case CT_F64: case CT_I64: return 8;
    default: return 1;
    }
}

static void self_allreduce(const Comm *c, void *buf, size_t n, CommType t) {}
static void self_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t) {
    if (send != recv) memmove(recv, send, n * comm_type_size(t));
}
static void self_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                            const size_t *displs, CommType t) {
    if (send != (char *)recv + displs[0] * comm_type_size(t)) memmove((char *)recv + displs[0] * comm_type_size(t), send, n * comm_type_size(t));
}
static void self_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    if (send != recv) memmove(recv, send, counts[0] * comm_type_size(t));
}
static void self_alltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                           const size_t *rc, const size_t *rd, CommType t) {
    size_t es = comm_type_size(t);
    memmove((char *)recv + rd[0] * es, (const char *)send + sd[0] * es, sc[0] * es);
}
static void self_bcast(const Comm *c, void *buf, size_t n, CommType t, int root) {}
static void self_barrier(const Comm *c) {}
static CommReq *self_iallreduce(const Comm *c, void *buf, size_t n, CommType t) {
    return xcalloc(1, sizeof(CommReq));
}
static CommReq *self_ireduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    self_reduce_scatter(c, send, recv, counts, t);
    return xcalloc(1, sizeof(CommReq));
}
static int self_test(CommReq *r) { return 1; }
static void self_wait(CommReq *r) { free(r); }

const CommOps comm_self_ops = {
    self_allreduce, self_allgather, self_allgatherv, self_reduce_scatter, self_alltoallv, self_bcast, self_barrier,
    self_iallreduce, self_ireduce_scatter, self_test, self_wait,
};

static const Comm self_comm = {0, 1, "self", &comm_self_ops, NULL};
static const Comm *C(const Comm *c) { return c ? c : &self_comm; }

void comm_allreduce(const Comm *c, void *buf, size_t n, CommType t) { C(c)->ops->allreduce(C(c), buf, n, t); }
void comm_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t) {
    C(c)->ops->allgather(C(c), send, recv, n, t);
}
void comm_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                     const size_t *displs, CommType t) {
    C(c)->ops->allgatherv(C(c), send, n, recv, counts, displs, t);
}
void comm_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    C(c)->ops->reduce_scatter(C(c), send, recv, counts, t);
}
void comm_alltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                    const size_t *rc, const size_t *rd, CommType t) {
    C(c)->ops->alltoallv(C(c), send, sc, sd, recv, rc, rd, t);
}
void comm_bcast(const Comm *c, void *buf, size_t n, CommType t, int root) { C(c)->ops->bcast(C(c), buf, n, t, root); }
void comm_barrier(const Comm *c) { C(c)->ops->barrier(C(c)); }
CommReq *comm_iallreduce(const Comm *c, void *buf, size_t n, CommType t) { return C(c)->ops->iallreduce(C(c), buf, n, t); }
CommReq *comm_ireduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    return C(c)->ops->ireduce_scatter(C(c), send, recv, counts, t);
}

int comm_test(CommReq *r) { return r->ops ? ((const CommOps *)r->ops)->test(r) : 1; }
void comm_wait(CommReq *r) {
    if (r->ops) ((const CommOps *)r->ops)->wait(r);
    else free(r);
}
