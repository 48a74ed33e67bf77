// exchange.h — moving token rows between the ranks that route them and the ranks that own their
// experts: all-to-all-v over the EP group, then all-gather over the ETP group (each expert's f
// dimension is split there), reordered expert-major for the grouped GEMMs; and the way back
// (reorder, reduce-scatter over ETP, reverse all-to-all-v). With EP = ETP = 1 it is a copy.
// Must not hold: routing decisions or expert math.
#pragma once
#include <stdint.h>
#include "ops/ops.h"
#include "parallel/comm.h"

typedef struct {
    const Backend *be;
    const Comm *ep, *etp;
    int EP, ETP, El, d;
    size_t *sc, *sd, *rc, *rd;   // (EP) rows sent to / received from each EP peer, and displacements
    int64_t *rcnt;               // (EP, El) rows received from EP peer q for local expert le
    int64_t *gcnt;               // (ETP, EP, El) the same for every ETP peer (after the gather)
    size_t *gc, *gd;             // (ETP) rows held by each ETP peer after the EP exchange
    int M, R, Rg;                // rows I send; rows I receive; rows after the ETP gather
    int64_t *off;                // (El+1) expert-major offsets over the Rg rows
    int32_t *perm_h;             // (Rg) expert-major row i is gathered row perm_h[i]
    int32_t *perm, *iperm;       // device copies of perm and its inverse
    float *raw_ep, *raw;         // (R,d), (Rg,d) staging (device)
    size_t cap_R, cap_Rg, cap_idx;
} Exchange;

void exchange_init(Exchange *x, const Backend *be, const Comm *ep, const Comm *etp, int El, int d);
void exchange_free(Exchange *x);
// From my kept rows per expert (E = EP*El counts, rows sorted by expert): sizes, counts and the
// expert-major permutation. Collective over ep and etp.
void exchange_plan(Exchange *x, const int64_t *kept_per_expert);
// rows (M,d) in my expert order -> out (Rg,d) expert-major on the owners. out must hold Rg rows.
void exchange_dispatch(Exchange *x, const float *rows, float *out);
// partial (Rg,d) expert-major -> rows (M,d) back in my order, summed over the ETP group.
void exchange_combine(Exchange *x, const float *partial, float *rows);
