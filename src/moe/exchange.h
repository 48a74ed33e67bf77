// exchange.h — moving token rows between the ranks that route them and the ranks that own their
// experts: all-to-all-v over the EP group, then all-gather over the ETP group (each expert's f
// dimension is split there), reordered expert-major for the grouped GEMMs; and the way back
// (reorder, reduce-scatter over ETP, reverse all-to-all-v). With EP = ETP = 1 (and the device
// collectives not forced on groups of one: comm_dev_due) it is the identity: `local` is set, the
// expert-major order is the sender's own (off = its per-expert offsets), and dispatch/combine
// return their input instead of copying it.
// Two-level all-to-all (Tutel's 2D hierarchical all-to-all; epn/epx given): the EP ranks form nodes
// of G = size(epn) consecutive ranks; a rank first sends, within its node, to local rank j everything
// bound for local index j on any node (blocks reordered node-major: the "transpose"), then the ranks of
// equal local index exchange between nodes. The same bytes arrive in the same places as the flat
// all-to-all, so results are bitwise equal; it is blocking (the pipelined exchange then overlaps
// nothing across it).
// Must not hold: routing decisions or expert math.
#pragma once
#include <stdint.h>
#include "ops/ops.h"
#include "parallel/comm.h"

// One direction of the two-level all-to-all, in rows: the block copies before phase 1 (my rows into
// node-local order) and between the phases (into node order), and both phases' counts/displacements.
typedef struct {
    size_t *c1, *d1, *r1, *e1; // (G) phase 1 within the node (epn)
    size_t *c2, *d2, *r2, *e2; // (A) phase 2 between nodes (epx)
    int64_t *pre, *mid; // (src row, dst row, rows) triples: npre, nmid of them
    int npre, nmid;
    size_t rows1s, rows1r, rows2s; // staging rows
} HierPlan;

typedef struct {
    const Backend *be;
    const Comm *ep, *etp;
    const Comm *epn, *epx; // two-level all-to-all: my node's EP ranks, my local index's (NULL: flat)
    HierPlan hp[2]; // its plans, dispatch [0] and combine [1]
    void *h_s1, *h_r1, *h_s2; // its staging (device)
    size_t cap_h;
    int EP, ETP, El, d;
    size_t *sc, *sd, *rc, *rd; // (EP) rows sent to / received from each EP peer, and displacements
    int64_t *rcnt; // (EP, El) rows received from EP peer q for local expert le
    int64_t *gcnt; // (ETP, EP, El) the same for every ETP peer (after the gather)
    size_t *gc, *gd; // (ETP) rows held by each ETP peer after the EP exchange
    int local; // EP = ETP = 1 without forced device collectives (set by exchange_plan)
    int M, R, Rg; // rows I send; rows I receive; rows after the ETP gather
    int64_t *off; // (El+1) expert-major offsets over the Rg rows
    int32_t *perm_h; // (Rg) expert-major row i is gathered row perm_h[i] (not local)
    int32_t *perm, *iperm; // device copies of perm and its inverse (not local)
    void *raw_ep, *raw; // (R,d), (Rg,d) staging (device; not local): the hidden format or float32
    size_t cap_R, cap_Rg, cap_idx;
    CommReq *req; // the EP all-to-all in flight (between a _start and its _finish)
} Exchange;

// epn, epx: the two-level all-to-all's groups (both NULL: the flat all-to-all).
void exchange_init(Exchange *x, const Backend *be, const Comm *ep, const Comm *etp, const Comm *epn,
                   const Comm *epx, int El, int d);
void exchange_free(Exchange *x);
// From my kept rows per expert (E = EP*El counts, rows sorted by expert): sizes, counts and the
// expert-major permutation. Collective over ep and etp. Sets `local`.
void exchange_plan(Exchange *x, const int64_t *kept_per_expert);
// rows (M,d) in my expert order -> (Rg,d) expert-major on the owners: written to out (which must
// hold Rg rows) and out returned; when local, nothing is written (out may be NULL) and rows itself
// is returned (Rg = M, the same order). Dispatched rows are in the backend's hidden format (ops.h
// hid_elem: bf16 on "cuda", sent as CT_BF16), combined ones float32.
const void *exchange_dispatch(Exchange *x, const void *rows, void *out);
// partial (Rg,d) expert-major -> (M,d) back in my order, summed over the ETP group: written to rows
// and rows returned; when local, partial itself is returned (rows untouched, may be NULL).
const float *exchange_combine(Exchange *x, const float *partial, float *rows);
// The same in two halves, so that compute runs while the EP all-to-all is in flight (the pipelined
// exchange): _start begins it (non-blocking; the ETP gather / reduce-scatter stay blocking, in
// _finish for the dispatch and in _start for the combine), _finish waits and returns what the whole
// call returns. Between them rows / the staging buffers must not be touched. Every rank of the group
// starts and finishes in the same order.
void exchange_dispatch_start(Exchange *x, const void *rows);
const void *exchange_dispatch_finish(Exchange *x, const void *rows, void *out);
void exchange_combine_start(Exchange *x, const float *partial, float *rows);
const float *exchange_combine_finish(Exchange *x, const float *partial, float *rows);
