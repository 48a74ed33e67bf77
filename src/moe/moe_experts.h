// moe_experts.h — inside src/moe only: the MoE layer's expert-side variants (moe_experts.c), which moe.c
// (the layer's forward/backward schedule) calls, and the buffer helpers both use. Must not be included
// outside src/moe; must not hold the layer's API (moe.h).
#pragma once
#include "moe/moe_types.h"

#define F sizeof(float)

// p, or p reallocated to hold `need` bytes where it does not (contents are not kept): p = moe_grown(...);
// from the arena a where one is lent (ops/arena.h; NULL: the backend's).
static inline void *moe_grown(const Backend *be, Arena *a, void *p, size_t *cap, size_t need) {
    if (p && need <= *cap) return p;
    arena_free(a, be, p);
    *cap = need;
    return arena_alloc(a, be, need);
}
// The same for n buffers *p[i] of one size that grow together (one capacity).
static inline void moe_grown_n(const Backend *be, Arena *a, void **const *p, int n, size_t *cap,
                               size_t need) {
    if (need <= *cap) return;
    for (int i = 0; i < n; i++) {
        arena_free(a, be, *p[i]);
        *p[i] = arena_alloc(a, be, need);
    }
    *cap = need;
}

// The bytes of one of the layer's SwiGLU row blocks (h1, h3 or act: its expert-side rows x fu, hidden
// format).
static inline size_t moe_rows_bytes(const MoeLayer *m) { return m->rows_cap * m->fu * hid_size(m->be); }
// --recompute moe: point the layer's h1, h3, act at the shared buffers, grown to nf bytes each; and
// fill them again before the backward (the forward's SwiGLU GEMMs on the kept inputs, wu: the experts
// the forward used).
// (moe_finish points the layer at them again before its GEMMs: between its moe_start and moe_finish another
// state's moe_start, AMPipe's next chunk, may have grown them.)
void moe_rc_rows(MoeLayer *m, size_t nf);
void moe_rc_recompute(MoeLayer *m, const MoeWeights *wu);
// --fp8-save (rc->fp8): after the forward's experts, its h1 and h3 rows packed into hq (else nothing); and
// the act the backward reads from element i on: NULL under rc->fp8 (grouped_swiglu_bwd computes it).
void moe_rc_keep(MoeLayer *m);
static inline const void *moe_act_kept(const MoeLayer *m, size_t i) {
    return m->rc && m->rc->fp8 ? NULL : hid_at(m->be, m->act, i);
}
// The shared expert on my slice x (Ns,d), added into y; its backward (dx += , its gradients +=).
void moe_shared_forward(MoeLayer *m, float *y, const float *x, const MoeWeights *w);
void moe_shared_backward(MoeLayer *m, MoeScratch *s, float *dx, const float *dy, const float *x,
                         const MoeWeights *w, MoeGrads *g);
// --aux-scope sequence: the per-sequence statistics of the last route (rows by m->row0 + m->s0 + i);
// in parts: room for S sequences (seq_f, seq_st, seq_dp; nseq = S), my rows' counts and probability
// sums added into st (S, 2E) by global sequence (row / T), and st (m->seq_st) summed over the stage
// into seq_f and the aux loss.
void moe_seq_stats(MoeLayer *m);
void moe_seq_alloc(MoeLayer *m, int S);
void moe_seq_add(const MoeLayer *m, int T, double *st);
void moe_seq_finish(MoeLayer *m, int T);
// The gathered expert mode: row maps and routes (once), the layer's whole experts into *wf, whole-
// expert gradient buffers (zeroed) into *gf, and their sum over ETP added into each rank's slices g.
void moe_gathered_setup(MoeLayer *m);
void moe_gather_experts(MoeLayer *m, const MoeWeights *w, MoeWeights *wf);
void moe_gathered_grads(MoeLayer *m, MoeScratch *s, MoeGrads *gf);
void moe_scatter_grads(MoeLayer *m, MoeScratch *s, const MoeGrads *gf, MoeGrads *g);
// The pipelined exchange (r = m->r > 1): the chunks' routes and row maps from the kept rows per
// expert; the experts forward over the chunks (xs -> ys); their backward (s->dys -> the returned dxs).
void moe_plan_chunks(MoeLayer *m, const int64_t *kept);
void moe_experts_chunked(MoeLayer *m, const MoeWeights *w);
const float *moe_experts_bwd_chunked(MoeLayer *m, MoeScratch *s, const MoeWeights *w, MoeGrads *gw);
// The gradient of my slice of the MoE input where TP > 1 (s->dxj: allocated at the first use where the
// scratch is lean, moe.h moe_scratch_init).
float *moe_tp_dx(MoeScratch *s);
