// a2a.h — the transports of the MoE exchange's all-to-all-v over the EP group (moe/exchange.h): how the
// rows bound for each EP rank get there, and back. A transport is a table of functions over its own
// state; exchange_init picks one for the layer's groups once, and the exchange calls nothing else to move
// rows between EP ranks. Today's: a2a_flat.c (one all-to-all-v through the comm API: MPI on host buffers,
// NCCL on device buffers) and a2a_hier.c (Tutel's two-level all-to-all: within nodes, then between them).
// A new transport (a staged one: device rows copied through pinned host memory and moved by MPI, or CUDA
// IPC between ranks that share a GPU; a fused dispatch kernel) provides the five functions of A2aTransport:
//   init   its state for the EP group ep (with the two-level groups epn, epx where the mesh has them),
//          rows of d values, at most rows_max rows sent by this rank in one direction; everything whose
//          size those fix is allocated here, not per exchange.
//   plan   the counts of the next exchanges (A2aCounts, in rows). Called once per exchange plan by every
//          rank of the group, in the same order; it may communicate (collectives over its groups) and
//          grow row-sized staging (by a2a_rows); it returns 1 where such staging grew again (held rows
//          before and needed more: the layer reports it), else 0.
//   start  begin moving direction dir (A2A_DISPATCH: counts as planned; A2A_COMBINE: the same exchange
//          reversed) from send to recv (backend buffers, rows of w values of type t: d for the hidden format
//          and float32, fp8_row_bytes(d) bytes for FP8 rows; never more bytes than d float32 values).
//          A blocking transport moves everything here.
//   finish wait until recv holds every row. Between start and finish, send and recv are the transport's.
//   free   release its state.
// Every transport moves the bytes of each row unchanged to the place the flat all-to-all-v puts them (the
// sc[q] rows rank p sends to rank q land at q's rd[p], in p's order), so results are bitwise the same
// whichever runs. With an EP group of one (and no forced device collectives: comm_dev_due) the flat one
// is a backend copy.
// Must not hold: the counts' computation, the expert-major order, the ETP gather (moe/exchange.c).
#pragma once
#include <stddef.h>
#include "ops/ops.h"
#include "parallel/comm.h"

enum { A2A_DISPATCH = 0, A2A_COMBINE = 1 };

// One exchange's counts, in rows, as the dispatch sees them: sc[q] rows of mine go to EP rank q from my row
// sd[q]; rc[q] rows come from q to my row rd[q]. (EP) each; they stay valid until the next plan.
typedef struct {
    const size_t *sc, *sd, *rc, *rd;
} A2aCounts;

typedef struct A2a A2a; // a transport's state

typedef struct {
    A2a *(*init)(const Backend *be, const Comm *ep, const Comm *epn, const Comm *epx, int d, size_t rows_max);
    int (*plan)(A2a *t, const A2aCounts *c);
    void (*start)(A2a *t, int dir, const void *send, void *recv, CommType ct, size_t w);
    void (*finish)(A2a *t, int dir);
    void (*free)(A2a *t);
} A2aTransport;

extern const A2aTransport a2a_flat, a2a_hier;

// Row counts (or displacements) c of n ranks as element counts: out[i] = c[i] * by (by: values a row).
static inline void a2a_scale(const size_t *c, size_t *out, int n, size_t by) {
    for (int i = 0; i < n; i++) out[i] = c[i] * by;
}

// The rows a row-sized buffer that holds `have` rows is to hold for `need` (every row-sized buffer of the
// exchange and of the MoE layer's expert side grows by this rule): `have` where that is enough; the first
// time (have 0) twice need, or twice `typical` (an even routing's rows) where more; later need plus a
// quarter, at least half as much again as before (so that growth stays rare); never above `worst` (what
// the mode allows: every routed row on this rank), nor below need, nor below 1.
static inline size_t a2a_rows(size_t need, size_t have, size_t typical, size_t worst) {
    if (need <= have && have) return have;
    size_t r;
    if (!have) {
        r = 2 * (need > typical ? need : typical);
    } else {
        r = need + need / 4;
        if (r < have + have / 2) r = have + have / 2;
    }
    if (r > worst) r = worst;
    if (r < need) r = need;
    return r ? r : 1;
}
