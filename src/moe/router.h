// router.h — the dispatch plan's order and host form, and the capacity budgets of a mesh: what the
// MoE layer (moe.c) needs on the host. The router's math itself (softmax/top-k, the plan's rows,
// the aux/z gradients) runs on the backend (ops.h); its host reference is tests/router_ref.h.
// Must not hold: calls to a Backend; the host reference (tests/).
#pragma once
#include <stdint.h>
#include "core/config.h"
#include "ops/ops.h"

// Dispatch plan. Assignments (token t, slot j) are ordered by expert, and within an expert by
// priority: slot 0 of every token (in token order), then slot 1, ... (GShard/DeepSpeed: first
// choices win). In capacity mode each expert keeps its first `capacity` assignments in that
// order and drops the rest (the token still gets its other experts; a token whose every choice
// dropped passes through the residual only). The MoE layer fills off, M and dropped (its rows are
// on the backend: ops.h plan_counts / plan_rows); the host reference fills every field.
typedef struct {
    int N, E, k;
    int64_t *off; // (E+1) row offsets of kept assignments per expert
    int64_t *counts; // (E) assignments routed to each expert, before drops (for stats/aux)
    int32_t *row_tok; // (M) token of each kept row
    int32_t *row_slot; // (M) slot j of each kept row
    int32_t *slot_row; // (N*k) row of assignment (t,j), or -1 if dropped
    int M; // kept rows
    int dropped; // dropped assignments
} DispatchPlan;

// The router's rule (ops.h RouteRule) of config c: top-k, renormalisation, DeepSeek-V3's sigmoid scores,
// group-limited choice and weight scale.
RouteRule router_rule(const ModelConfig *c);
// Frees the plan's arrays (any of them may be NULL) and zeroes it.
void plan_free(DispatchPlan *p);
// all (S, k, E): every rank's slot counts (this process's slot-j assignments to expert e) in
// global token order (rank s holds earlier tokens than s+1). For rank `me`: budget (k, E) = how
// many of its slot-j assignments to e are kept (the first ones in token order):
// budget[j][e] = clamp(capacity - (all slot<j assignments to e) - (slot-j assignments to e on ranks
// before me), 0, mine). One process: S = 1, me = 0.
void router_budget(const int64_t *all, int S, int me, int E, int k, int64_t capacity, int64_t *budget);
