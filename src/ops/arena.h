// arena.h — buffers carved out of a region of backend memory lent for a while, and the backend's
// allocator for what does not fit. model_state.c lends a layer the memory of the previous layer's expert
// gradients for its activations (written only after the last read of those: model_state.h model_share_grads).
// A carved buffer is zeroed when carved (as Backend.alloc's are); freeing it gives nothing back until the
// lender resets the arena to a mark.
#pragma once
#include <stddef.h>
#include "ops/ops.h"

typedef struct {
    char *base; // NULL: nothing lent (every request goes to the backend)
    size_t cap, used; // bytes lent, bytes carved so far
    size_t mark; // arena_reset's point
} Arena;

static inline int arena_owns(const Arena *a, const void *p) {
    return a && a->base && (const char *)p >= a->base && (const char *)p < a->base + a->cap;
}
// n bytes, 256-byte aligned: from the arena where they fit, else from be->alloc.
static inline void *arena_alloc(Arena *a, const Backend *be, size_t n) {
    if (a && a->base) {
        size_t at = (a->used + 255) & ~(size_t)255;
        if (at <= a->cap && n <= a->cap - at) {
            a->used = at + n;
            be->zero(a->base + at, n);
            return a->base + at;
        }
    }
    return be->alloc(n);
}
static inline void arena_free(const Arena *a, const Backend *be, void *p) {
    if (p && !arena_owns(a, p)) be->free(p);
}
// What was carved after the mark is free again (the caller holds no pointer into it).
static inline void arena_reset(Arena *a) {
    if (a) a->used = a->mark;
}
