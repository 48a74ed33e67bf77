// exchange.h — moving token rows between the ranks that route them and the ranks that own their
// experts: all-to-all-v over the EP group, then all-gather over the ETP group (each expert's f
// dimension is split there), reordered expert-major for the grouped GEMMs; and the way back
// (reorder, reduce-scatter over ETP, reverse all-to-all-v). With EP = ETP = 1 (and the device
// collectives not forced on groups of one: comm_dev_due) it is the identity: `local` is set, the
// expert-major order is the sender's own (off = its per-expert offsets), and dispatch/combine
// return their input instead of copying it.
// The all-to-all-v itself is a transport's (moe/a2a.h), chosen once by exchange_init: the flat one, or
// the two-level one where the mesh gives the groups for it (epn/epx: Tutel's 2D hierarchical
// all-to-all). The arrays whose size EP, ETP and El fix are allocated by exchange_init; the row-sized
// ones (the expert-major permutation, the staging rows) grow by a2a_rows and stay, so that an exchange
// plan allocates nothing once the routing has been seen (`regrown` tells the layer when one grew again).
// Must not hold: routing decisions or expert math.
#pragma once
#include <stdint.h>
#include "moe/a2a.h"
#include "ops/ops.h"
#include "parallel/comm.h"

typedef struct {
    const Backend *be;
    const Comm *ep, *etp;
    const A2aTransport *tr; // the EP all-to-all-v's transport (flat or two-level) and its state
    A2a *a2a;
    int EP, ETP, El, d;
    int rows_max; // rows I send at most (each of them bound for one expert of the EP group)
    size_t *sc, *sd, *rc, *rd; // (EP) rows sent to / received from each EP peer, and displacements
    size_t *one, *disp; // (EP) the count exchange's layout: El counts to and from every peer
    int64_t *rcnt; // (EP, El) rows received from EP peer q for local expert le
    int64_t *gcnt; // (ETP, EP, El) the same for every ETP peer (after the gather)
    size_t *gc, *gd; // (ETP) rows held by each ETP peer after the EP exchange
    size_t *cnt; // (2 ETP) the ETP gather's / reduce-scatter's element counts and displacements
    int local; // EP = ETP = 1 without forced device collectives (set by exchange_local, exchange_plan)
    int M, R, Rg; // rows I send; rows I receive; rows after the ETP gather
    int64_t *off; // (El+1) expert-major offsets over the Rg rows
    int32_t *perm_h, *iperm_h; // (cap_Rg) expert-major row i is gathered row perm_h[i], and back (not local)
    int32_t *perm, *iperm; // their device copies (not local)
    void *raw_ep, *raw; // (cap_R,d), (cap_Rg,d) staging (device; not local): the hidden format or float32
    size_t cap_R, cap_Rg; // rows
    int regrown; // 1: the last plan grew a row-sized buffer that held rows before (the caller clears it)
    void
        *pk; // (rows_max, fp8_row_bytes(d)) bytes: the FP8 rows sent (device; made by the first FP8 dispatch)
    int fp8; // the dispatch in flight moves FP8 rows
} Exchange;

// epn, epx: the two-level all-to-all's groups (both NULL: the flat all-to-all). rows_max: the rows this
// rank sends at most in one exchange.
void exchange_init(Exchange *x, const Backend *be, const Comm *ep, const Comm *etp, const Comm *epn,
                   const Comm *epx, int El, int d, int rows_max);
void exchange_free(Exchange *x);
// The most rows the expert side can receive (every routed row of the EP group on this rank's experts,
// gathered over ETP), and as many as an even routing gives it.
size_t exchange_rows_worst(const Exchange *x);
size_t exchange_rows_typical(const Exchange *x);
// Whether every row stays on this rank (EP = ETP = 1 without forced device collectives): sets `local` and
// returns it (exchange_plan sets it too).
int exchange_local(Exchange *x);
// From my kept rows per expert (E = EP*El counts, rows sorted by expert): sizes, counts and the
// expert-major permutation. Collective over ep and etp. Sets `local`.
void exchange_plan(Exchange *x, const int64_t *kept_per_expert);
// rows (M,d) in my expert order -> (Rg,d) expert-major on the owners: written to out (which must
// hold Rg rows) and out returned; when local, nothing is written (out may be NULL) and rows itself
// is returned (Rg = M, the same order). Dispatched rows are in the backend's hidden format (ops.h
// Backend.hid: bf16 on "cuda", sent as CT_BF16), combined ones float32. fp8 1 (--fp8-dispatch's
// forward): the EP all-to-all moves them packed (Backend.fp8_rows_pack: fp8_row_bytes(d) bytes a row, d +
// d/128 against the hidden format's 2d or 4d) and the owner unpacks them: their tiles' FP8 values arrive
// (what Backend.fp8_rows_round makes of them where the exchange is local).
const void *exchange_dispatch(Exchange *x, const void *rows, void *out, int fp8);
// partial (Rg,d) expert-major -> (M,d) back in my order, summed over the ETP group: written to rows
// and rows returned; when local, partial itself is returned (rows untouched, may be NULL).
const float *exchange_combine(Exchange *x, const float *partial, float *rows);
// The same in two halves, so that compute runs while the EP all-to-all is in flight (the pipelined
// exchange): _start begins it (non-blocking where the transport is; the ETP gather / reduce-scatter stay
// blocking, in _finish for the dispatch and in _start for the combine), _finish waits and returns what
// the whole call returns. Between them rows / the staging buffers must not be touched. Every rank of the
// group starts and finishes in the same order.
void exchange_dispatch_start(Exchange *x, const void *rows, int fp8);
const void *exchange_dispatch_finish(Exchange *x, const void *rows, void *out);
void exchange_combine_start(Exchange *x, const float *partial, float *rows);
const float *exchange_combine_finish(Exchange *x, const float *partial, float *rows);
