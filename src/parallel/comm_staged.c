// comm_staged.c — the `staged` device ops of a group: for GPU ranks that cannot use NCCL (several
// ranks share one GPU, or the build has no NCCL) and for pipeline stages' point-to-point messages.
// Each operation copies the device buffers it reads into pinned host staging buffers (the copy waits
// for the compute stream's work before it), runs the group's host (MPI) operation on them, and copies
// what it received back to the device buffers. The host operations are the same MPI calls, on the same
// values in the same order, as a mesh of cpu ranks makes: a staged mesh gives the bits an MPI mesh
// gives. Blocking forms return with the result in device memory; non-blocking forms copy in at once
// and copy out at comm_wait (the compute stream's later work is enqueued after that copy).
// The direct form (comm_dev_enable_direct: an MPI library that reads device pointers, CUDA-aware) hands
// the device buffers to MPI after the compute stream has finished.
// With the cpu backend the "device" buffers are host memory and the copies memcpy: CI runs every
// layout through this file that way (tests/test_staged.sh).
// Staging buffers and requests are pooled: after the first step nothing is allocated unless a message
// outgrows its buffer (growth with headroom, as the exchange's row buffers).
// Must not hold: NCCL calls (comm_nccl.c), MPI calls (the host ops do them: comm_world.c).
#include <string.h>
#include "core/common.h"
#include "parallel/comm.h"
#include "parallel/comm_impl.h"

// ---- the copies: device (or host) memory to and from the staging buffers
typedef enum { COPY_HOST, COPY_CUDA } CopyKind;
static CopyKind g_kind = COPY_HOST;

// (the D2H copy on the legacy stream waits for every kernel before it; from pinned memory the H2D copy
// returns when done, so the staging buffer may be reused at once)
static void d2h(void *h, const void *d, size_t n) {
    if (!n) return;
#ifdef MOE_HAVE_CUDA
    if (g_kind == COPY_CUDA) {
        COMM_CUDA_OK(cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost));
        return;
    }
#endif
    memcpy(h, d, n);
}
static void h2d(void *d, const void *h, size_t n) {
    if (!n) return;
#ifdef MOE_HAVE_CUDA
    if (g_kind == COPY_CUDA) {
        COMM_CUDA_OK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
        return;
    }
#endif
    memcpy(d, h, n);
}
static void *halloc(size_t n) {
    alloc_note_backend();
#ifdef MOE_HAVE_CUDA
    if (g_kind == COPY_CUDA) {
        void *p = NULL;
        COMM_CUDA_OK(cudaHostAlloc(&p, n, cudaHostAllocDefault));
        return p;
    }
#endif
    return xmalloc(n);
}
static void hfree(void *p) {
    if (!p) return;
#ifdef MOE_HAVE_CUDA
    if (g_kind == COPY_CUDA) {
        COMM_CUDA_OK(cudaFreeHost(p));
        return;
    }
#endif
    free(p);
}
// the direct form: the compute stream's work done before MPI reads or writes device memory
static void device_idle(void) {
#ifdef MOE_HAVE_CUDA
    if (g_kind == COPY_CUDA) COMM_CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));
#endif
}

// ---- staging buffers: a pool, each taken by one operation at a time; as many as operations are in flight
// at once (overlapped gradient buckets: all of a step's, until the optimizer waits), so it grows
typedef struct {
    char *p;
    size_t cap;
    int busy;
} SBuf;
static SBuf **g_buf; // (g_nbuf) stable addresses: requests hold them
static int g_nbuf;

// A free buffer of at least n bytes: the smallest that fits, else the largest free one grown as the
// exchange's row buffers grow (a quarter more than the need, then by half at least; at least
// 64 KiB), else a new one: the rows a step exchanges vary from step to step, and a step after the first
// allocates nothing.
static SBuf *buf_get(size_t n) {
    SBuf *fit = NULL, *any = NULL;
    for (int i = 0; i < g_nbuf; i++) {
        SBuf *b = g_buf[i];
        if (b->busy) continue;
        if (b->cap >= n && (!fit || b->cap < fit->cap)) fit = b;
        if (!any || b->cap > any->cap) any = b;
    }
    if (!fit) {
        if (!any) {
            g_buf = xrealloc(g_buf, sizeof *g_buf * (size_t)(g_nbuf + 1));
            any = g_buf[g_nbuf++] = xcalloc(1, sizeof *any);
        }
        fit = any;
        hfree(fit->p);
        size_t c = !fit->cap                      ? n + n / 4 // (a quarter more than asked)
            : n + n / 4 > fit->cap + fit->cap / 2 ? n + n / 4
                                                  : fit->cap + fit->cap / 2;
        fit->cap = c > 65536 ? c : 65536;
        fit->p = halloc(fit->cap);
    }
    fit->busy = 1;
    return fit;
}
static void buf_put(SBuf *b) {
    if (b) b->busy = 0;
}

// ---- requests
typedef struct SReq {
    CommReq r; // first: a CommReq * is its SReq *
    CommReq *inner; // the host operation on the staging buffers
    SBuf *sb, *rb; // the staging buffers it holds
    char *dst; // where the received bytes go (NULL: nothing comes back)
    size_t es;
    int nrange;
    size_t *off, *len; // (nrange) element ranges of dst and rb to copy back
    int cap; // of off, len
    struct SReq *next; // free list
} SReq;
static SReq *g_free_req;
static int g_ranges = 1; // the largest group the staged ops are attached to
static const CommOps direct_ops;

static SReq *req_get(const CommOps *ops, int ranges) {
    SReq *q = g_free_req;
    if (q) g_free_req = q->next;
    else q = xcalloc(1, sizeof *q);
    if (q->cap < ranges) { // (room for the largest group attached: a reused request never grows)
        if (ranges < g_ranges) ranges = g_ranges;
        q->off = xrealloc(q->off, sizeof(size_t) * (size_t)ranges);
        q->len = xrealloc(q->len, sizeof(size_t) * (size_t)ranges);
        q->cap = ranges;
    }
    q->r.ops = ops;
    q->r.impl = q;
    q->inner = NULL;
    q->sb = q->rb = NULL;
    q->dst = NULL;
    q->nrange = 0;
    q->next = NULL;
    return q;
}
static void req_put(SReq *q) {
    buf_put(q->sb);
    buf_put(q->rb);
    q->next = g_free_req;
    g_free_req = q;
}

#define ES(t) comm_type_size(t)
#define AT(p, i, t) ((char *)(p) + (size_t)(i)*ES(t))

// The elements [0, extent) of a count/displacement table: the largest end.
static size_t extent(int n, const size_t *counts, const size_t *displs) {
    size_t e = 0;
    for (int i = 0; i < n; i++)
        if (counts[i] && displs[i] + counts[i] > e) e = displs[i] + counts[i];
    return e;
}
// Copies back the ranges (counts[i] at displs[i]) of rb into dst, merged where they touch.
static void copy_ranges(char *dst, const char *rb, int n, const size_t *counts, const size_t *displs,
                        size_t es) {
    size_t o = 0, l = 0;
    for (int i = 0; i < n; i++) {
        if (!counts[i]) continue;
        if (l && displs[i] == o + l) {
            l += counts[i];
            continue;
        }
        h2d(dst + o * es, rb + o * es, l * es);
        o = displs[i];
        l = counts[i];
    }
    h2d(dst + o * es, rb + o * es, l * es);
}

// ---- the staged operations (blocking)
static void s_allreduce(const Comm *c, void *buf, size_t n, CommType t) {
    if (!n) return;
    SBuf *b = buf_get(n * ES(t));
    d2h(b->p, buf, n * ES(t));
    c->ops->allreduce(c, b->p, n, t);
    h2d(buf, b->p, n * ES(t));
    buf_put(b);
}
static void s_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t) {
    if (!n) return;
    SBuf *s = buf_get(n * ES(t)), *r = buf_get(n * ES(t) * (size_t)c->size);
    d2h(s->p, send, n * ES(t));
    c->ops->allgather(c, s->p, r->p, n, t);
    h2d(recv, r->p, n * ES(t) * (size_t)c->size);
    buf_put(s);
    buf_put(r);
}
static void s_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                         const size_t *displs, CommType t) {
    size_t e = extent(c->size, counts, displs);
    if (!e) return;
    SBuf *s = buf_get(n * ES(t)), *r = buf_get(e * ES(t));
    d2h(s->p, send, n * ES(t)); // (send may be recv's own block: read before anything is written)
    c->ops->allgatherv(c, s->p, n, r->p, counts, displs, t);
    copy_ranges(recv, r->p, c->size, counts, displs, ES(t));
    buf_put(s);
    buf_put(r);
}
static size_t total(const Comm *c, const size_t *counts) {
    size_t n = 0;
    for (int i = 0; i < c->size; i++) n += counts[i];
    return n;
}
static void s_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    size_t tot = total(c, counts), mine = counts[c->rank];
    if (!tot) return;
    SBuf *s = buf_get(tot * ES(t)), *r = buf_get(mine * ES(t));
    d2h(s->p, send, tot * ES(t));
    c->ops->reduce_scatter(c, s->p, r->p, counts, t);
    h2d(recv, r->p, mine * ES(t));
    buf_put(s);
    buf_put(r);
}
static void s_alltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                        const size_t *rc, const size_t *rd, CommType t) {
    size_t se = extent(c->size, sc, sd), re = extent(c->size, rc, rd);
    SBuf *s = buf_get(se * ES(t)), *r = buf_get(re * ES(t));
    d2h(s->p, send, se * ES(t));
    c->ops->alltoallv(c, s->p, sc, sd, r->p, rc, rd, t);
    copy_ranges(recv, r->p, c->size, rc, rd, ES(t));
    buf_put(s);
    buf_put(r);
}
static void s_bcast(const Comm *c, void *buf, size_t n, CommType t, int root) {
    if (!n) return;
    SBuf *b = buf_get(n * ES(t));
    if (c->rank == root) d2h(b->p, buf, n * ES(t));
    c->ops->bcast(c, b->p, n, t, root);
    if (c->rank != root) h2d(buf, b->p, n * ES(t));
    buf_put(b);
}
static void s_barrier(const Comm *c) { c->ops->barrier(c); }

// ---- non-blocking: copied in now, the host operation in flight, copied out at wait
static CommReq *s_iallreduce(const Comm *c, void *buf, size_t n, CommType t) {
    SReq *q = req_get(&comm_staged_ops, 1);
    q->sb = buf_get(n * ES(t));
    d2h(q->sb->p, buf, n * ES(t));
    q->inner = c->ops->iallreduce(c, q->sb->p, n, t);
    q->dst = buf;
    q->es = ES(t);
    q->nrange = 1;
    q->off[0] = 0;
    q->len[0] = n;
    q->rb = q->sb, q->sb = NULL; // the result is in place
    return &q->r;
}
static CommReq *s_ireduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts,
                                  CommType t) {
    SReq *q = req_get(&comm_staged_ops, 1);
    size_t tot = total(c, counts), mine = counts[c->rank];
    q->sb = buf_get(tot * ES(t));
    q->rb = buf_get(mine * ES(t));
    d2h(q->sb->p, send, tot * ES(t));
    q->inner = c->ops->ireduce_scatter(c, q->sb->p, q->rb->p, counts, t);
    q->dst = recv;
    q->es = ES(t);
    q->nrange = 1;
    q->off[0] = 0;
    q->len[0] = mine;
    return &q->r;
}
static CommReq *s_ialltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                             const size_t *rc, const size_t *rd, CommType t) {
    SReq *q = req_get(&comm_staged_ops, c->size);
    size_t se = extent(c->size, sc, sd), re = extent(c->size, rc, rd);
    q->sb = buf_get(se * ES(t));
    q->rb = buf_get(re * ES(t));
    d2h(q->sb->p, send, se * ES(t));
    q->inner = c->ops->ialltoallv(c, q->sb->p, sc, sd, q->rb->p, rc, rd, t);
    q->dst = recv;
    q->es = ES(t);
    q->nrange = c->size; // (the counts may be reused once this returns: kept)
    memcpy(q->off, rd, sizeof(size_t) * (size_t)c->size);
    memcpy(q->len, rc, sizeof(size_t) * (size_t)c->size);
    return &q->r;
}
static CommReq *s_isend(const Comm *c, const void *buf, size_t n, CommType t, int peer, int tag) {
    SReq *q = req_get(&comm_staged_ops, 0);
    q->sb = buf_get(n * ES(t));
    d2h(q->sb->p, buf, n * ES(t));
    q->inner = c->ops->isend(c, q->sb->p, n, t, peer, tag);
    return &q->r;
}
static CommReq *s_irecv(const Comm *c, void *buf, size_t n, CommType t, int peer, int tag) {
    SReq *q = req_get(&comm_staged_ops, 1);
    q->rb = buf_get(n * ES(t));
    q->inner = c->ops->irecv(c, q->rb->p, n, t, peer, tag);
    q->dst = buf;
    q->es = ES(t);
    q->nrange = 1;
    q->off[0] = 0;
    q->len[0] = n;
    return &q->r;
}
static int s_test(CommReq *r) {
    SReq *q = r->impl;
    return comm_test(q->inner);
}
static void s_wait(CommReq *r) {
    SReq *q = r->impl;
    comm_wait(q->inner);
    if (q->dst) copy_ranges(q->dst, q->rb->p, q->nrange, q->len, q->off, q->es);
    req_put(q);
}
static void s_detach(Comm *c) {}

const CommOps comm_staged_ops = {
    s_allreduce, s_allgather,  s_allgatherv,      s_reduce_scatter, s_alltoallv, s_bcast,
    s_barrier,   s_iallreduce, s_ireduce_scatter, s_ialltoallv,     s_isend,     s_irecv,
    s_test,      s_wait,       s_detach,
};

// ---- direct: the device pointers to MPI once the compute stream is idle (non-blocking forms: the
// host's requests themselves; MPI writes device memory before its wait returns)
static void d_allreduce(const Comm *c, void *buf, size_t n, CommType t) {
    device_idle();
    c->ops->allreduce(c, buf, n, t);
}
static void d_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t) {
    device_idle();
    c->ops->allgather(c, send, recv, n, t);
}
static void d_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                         const size_t *displs, CommType t) {
    device_idle();
    c->ops->allgatherv(c, send, n, recv, counts, displs, t);
}
static void d_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    device_idle();
    c->ops->reduce_scatter(c, send, recv, counts, t);
}
static void d_alltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                        const size_t *rc, const size_t *rd, CommType t) {
    device_idle();
    c->ops->alltoallv(c, send, sc, sd, recv, rc, rd, t);
}
static void d_bcast(const Comm *c, void *buf, size_t n, CommType t, int root) {
    device_idle();
    c->ops->bcast(c, buf, n, t, root);
}
static CommReq *d_iallreduce(const Comm *c, void *buf, size_t n, CommType t) {
    device_idle();
    return c->ops->iallreduce(c, buf, n, t);
}
static CommReq *d_ireduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts,
                                  CommType t) {
    device_idle();
    return c->ops->ireduce_scatter(c, send, recv, counts, t);
}
static CommReq *d_ialltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                             const size_t *rc, const size_t *rd, CommType t) {
    device_idle();
    return c->ops->ialltoallv(c, send, sc, sd, recv, rc, rd, t);
}
static CommReq *d_isend(const Comm *c, const void *buf, size_t n, CommType t, int peer, int tag) {
    device_idle();
    return c->ops->isend(c, buf, n, t, peer, tag);
}
static CommReq *d_irecv(const Comm *c, void *buf, size_t n, CommType t, int peer, int tag) {
    return c->ops->irecv(c, buf, n, t, peer, tag);
}
static const CommOps direct_ops = {
    d_allreduce, d_allgather,  d_allgatherv,      d_reduce_scatter, d_alltoallv, d_bcast,
    s_barrier,   d_iallreduce, d_ireduce_scatter, d_ialltoallv,     d_isend,     d_irecv,
    NULL,        NULL,         s_detach,
};

// ---- attaching
static void set_kind(int on_gpu) {
#ifdef MOE_HAVE_CUDA
    if (on_gpu) {
        g_kind = COPY_CUDA;
        return;
    }
#endif
    if (on_gpu) DIE("the staged transport on GPU buffers needs a build with CUDA");
    g_kind = COPY_HOST;
}

void comm_dev_enable_staged(Comm *c, int on_gpu) {
    if (!c || c->dops) return;
    set_kind(on_gpu);
    if (c->size > g_ranges) g_ranges = c->size;
    c->dops = &comm_staged_ops;
    c->dhandle = NULL;
}

void comm_dev_enable_direct(Comm *c, int on_gpu) {
    if (!c || c->dops) return;
    set_kind(on_gpu);
    c->dops = &direct_ops;
    c->dhandle = NULL;
}

void comm_staged_free(void) {
    for (int i = 0; i < g_nbuf; i++) {
        if (g_buf[i]->busy) DIE("internal error: a staged operation still in flight at exit");
        hfree(g_buf[i]->p);
        free(g_buf[i]);
    }
    free(g_buf);
    g_buf = NULL;
    g_nbuf = 0;
    while (g_free_req) {
        SReq *q = g_free_req;
        g_free_req = q->next;
        free(q->off);
        free(q->len);
        free(q);
    }
}
