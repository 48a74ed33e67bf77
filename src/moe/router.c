// router.c — the router rule of a config, the capacity budgets of a mesh and the plan's release (see
// router.h). Must not hold: the router's math on a Backend (moe.c, ops/), its host reference
// (tests/router_ref.h).
#include "moe/router.h"
#include <stdlib.h>
#include <string.h>

RouteRule router_rule(const ModelConfig *c) {
    return (RouteRule){.k = c->top_k,
                       .renorm = c->renormalize,
                       .sigmoid = c->route_sigmoid,
                       .n_group = c->n_group,
                       .topk_group = c->topk_group,
                       .scale = c->route_scale};
}

void plan_free(DispatchPlan *p) {
    free(p->off);
    free(p->counts);
    free(p->row_tok);
    free(p->row_slot);
    free(p->slot_row);
    memset(p, 0, sizeof *p);
}

void router_budget(const int64_t *all, int S, int me, int E, int k, int64_t capacity, int64_t *budget) {
    for (int e = 0; e < E; e++) {
        int64_t before = 0; // assignments ranked ahead of mine
        for (int j = 0; j < k; j++) {
            int64_t b = before;
            for (int s = 0; s < me; s++) b += all[((size_t)s * k + j) * E + e];
            int64_t mine = all[((size_t)me * k + j) * E + e];
            int64_t left = capacity - b;
            budget[(size_t)j * E + e] = left < 0 ? 0 : left > mine ? mine : left;
            for (int s = 0; s < S; s++) before += all[((size_t)s * k + j) * E + e];
        }
    }
}
