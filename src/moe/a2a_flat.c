// a2a_flat.c — the flat transport of the MoE exchange (moe/a2a.h): one non-blocking all-to-all-v over the
// EP group through the comm API's device variant (NCCL on GPUs, MPI on the cpu backend's host buffers), in
// flight between start and finish; with a group of one, a backend copy.
// Must not hold: the two-level all-to-all (a2a_hier.c), the counts' computation (exchange.c).
#include <string.h>
#include "core/common.h"
#include "moe/a2a.h"

struct A2a {
    const Backend *be;
    const Comm *ep;
    int EP;
    A2aCounts c; // the plan's counts (rows)
    size_t *a; // (4 EP) element counts and displacements of one call
    CommReq *req; // the all-to-all in flight
};

static A2a *flat_init(const Backend *be, const Comm *ep, const Comm *epn, const Comm *epx, int d,
                      size_t rows_max) {
    A2a *t = xcalloc(1, sizeof *t);
    t->be = be;
    t->ep = ep;
    t->EP = comm_size(ep);
    t->a = xcalloc(4 * (size_t)t->EP, sizeof(size_t));
    return t;
}

static int flat_plan(A2a *t, const A2aCounts *c) {
    t->c = *c;
    return 0;
}

static void flat_start(A2a *t, int dir, const void *send, void *recv, CommType ct, size_t w) {
    const A2aCounts *c = &t->c;
    int EP = t->EP, back = dir == A2A_COMBINE;
    if (!comm_dev_due(t->ep)) { // a group of one: my rows to myself
        t->be->copy(recv, send, comm_type_size(ct) * (back ? c->rc[0] : c->sc[0]) * w);
        return;
    }
    size_t *a = t->a;
    a2a_scale(back ? c->rc : c->sc, a, EP, w);
    a2a_scale(back ? c->rd : c->sd, a + EP, EP, w);
    a2a_scale(back ? c->sc : c->rc, a + 2 * EP, EP, w);
    a2a_scale(back ? c->sd : c->rd, a + 3 * EP, EP, w);
    t->req = comm_dev_ialltoallv(t->ep, send, a, a + EP, recv, a + 2 * EP, a + 3 * EP, ct);
}

static void flat_finish(A2a *t, int dir) {
    if (!t->req) return;
    comm_wait(t->req);
    t->req = NULL;
}

static void flat_free(A2a *t) {
    free(t->a);
    free(t);
}

const A2aTransport a2a_flat = {flat_init, flat_plan, flat_start, flat_finish, flat_free};
