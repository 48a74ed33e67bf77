// comm_ipc.c — the `ipc` device ops of a group whose ranks are the processes of one node (--gpu-comm ipc):
// the all-to-all-v (the MoE exchange, the largest messages of ranks sharing a GPU) moves its rows device
// to device, each rank writing its blocks straight into its peers' inboxes (device buffers opened through
// CUDA IPC handles); everything else is the staged transport's (comm_staged.c).
// One all-to-all-v: (1) the compute stream finishes (my rows are ready, my inbox is free); (2) the ranks
// all-gather, over the group's host ops, each one's inbox handle and where each peer's rows go in it (its
// receive displacements): that is also the barrier that lets the writes start; (3) each rank copies its
// block for q into q's inbox at q's displacement for it (and its own block into its receive buffer); (4)
// the copies finish and a host barrier says every inbox is full; (5) each rank copies its inbox's blocks
// into its receive buffer. The rows land where the flat all-to-all-v puts them: the same bits. The
// non-blocking form runs at once and returns a finished request (no overlap: the host waits anyway).
// Inboxes grow with headroom (moe/a2a.h's rule) and are handed out again when they do (a generation number
// tells the peers to open the new one); a step after the first allocates nothing.
// With the cpu backend (the same code, how CI tests it) an inbox is a POSIX shared-memory segment and the
// copies memcpy.
// Must not hold: MPI or NCCL calls (the host ops: comm_world.c), the staged copies (comm_staged.c).
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "core/common.h"
#include "parallel/comm.h"
#include "parallel/comm_impl.h"

#define HANDLE_BYTES 64 // a cudaIpcMemHandle_t, or a shared-memory segment's name

// One rank's inbox as its peers see it: the handle, its generation and capacity.
typedef struct {
    char handle[HANDLE_BYTES];
    uint64_t gen, cap;
} Inbox;

typedef struct {
    int on_gpu;
    char *box; // my inbox (device memory, or a shared-memory mapping)
    size_t cap;
    Inbox mine;
    char **peer; // (size) each peer's inbox mapped here (mine: NULL)
    uint64_t *peer_gen; // (size) the generation mapped
    size_t *peer_cap; // (size) its bytes (shared memory: the mapping's length)
    char *blob; // my published (Inbox, rd[size]); the all-gathered (size) of them
    char *all;
    size_t *off, *len; // (size) scratch: ranges copied out of the inbox
} IpcGroup;

static size_t blob_bytes(int n) { return sizeof(Inbox) + sizeof(uint64_t) * (size_t)n; }

// ---- inboxes: device memory exported with cudaIpcGetMemHandle, or a named shared-memory segment
static void box_free(IpcGroup *g) {
    if (!g->box) return;
#ifdef MOE_HAVE_CUDA
    if (g->on_gpu) {
        COMM_CUDA_OK(cudaFree(g->box));
        g->box = NULL;
        return;
    }
#endif
    munmap(g->box, g->cap);
    shm_unlink(g->mine.handle); // (already unlinked once the peers mapped it: harmless)
    g->box = NULL;
}

static void box_grow(IpcGroup *g, size_t need) {
    box_free(g);
    size_t cap = need + need / 4; // (the exchange's row buffers' headroom)
    g->cap = cap > 65536 ? cap : 65536;
    g->mine.gen++;
    g->mine.cap = g->cap;
    memset(g->mine.handle, 0, HANDLE_BYTES);
    alloc_note_backend();
#ifdef MOE_HAVE_CUDA
    if (g->on_gpu) {
        COMM_CUDA_OK(cudaMalloc((void **)&g->box, g->cap));
        cudaIpcMemHandle_t h;
        COMM_CUDA_OK(cudaIpcGetMemHandle(&h, g->box));
        _Static_assert(sizeof h <= HANDLE_BYTES, "a cudaIpcMemHandle_t fits the handle field");
        memcpy(g->mine.handle, &h, sizeof h);
        return;
    }
#endif
    snprintf(g->mine.handle, HANDLE_BYTES, "/moe-ipc-%d-%llu", (int)getpid(),
             (unsigned long long)g->mine.gen);
    int fd = shm_open(g->mine.handle, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) DIE("shm_open(%s) failed: %s", g->mine.handle, strerror(errno));
    if (ftruncate(fd, (off_t)g->cap) != 0) DIE("ftruncate(%s) failed: %s", g->mine.handle, strerror(errno));
    g->box = mmap(NULL, g->cap, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (g->box == MAP_FAILED) DIE("mmap(%s) failed: %s", g->mine.handle, strerror(errno));
    close(fd);
}

static void peer_close(IpcGroup *g, int q) {
    if (!g->peer[q]) return;
#ifdef MOE_HAVE_CUDA
    if (g->on_gpu) COMM_CUDA_OK(cudaIpcCloseMemHandle(g->peer[q]));
    else
#endif
        munmap(g->peer[q], g->peer_cap[q]);
    g->peer[q] = NULL;
    g->peer_gen[q] = 0;
}

static void peer_open(IpcGroup *g, int q, const Inbox *b) {
    peer_close(g, q);
#ifdef MOE_HAVE_CUDA
    if (g->on_gpu) {
        cudaIpcMemHandle_t h;
        memcpy(&h, b->handle, sizeof h);
        COMM_CUDA_OK(cudaIpcOpenMemHandle((void **)&g->peer[q], h, cudaIpcMemLazyEnablePeerAccess));
    } else
#endif
    {
        int fd = shm_open(b->handle, O_RDWR, 0600);
        if (fd < 0) DIE("shm_open(%s) of a peer's inbox failed: %s", b->handle, strerror(errno));
        g->peer[q] = mmap(NULL, b->cap, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (g->peer[q] == MAP_FAILED) DIE("mmap(%s) failed: %s", b->handle, strerror(errno));
        close(fd);
    }
    g->peer_gen[q] = b->gen;
    g->peer_cap[q] = b->cap;
}

// ---- copies and waits
static void copy(const IpcGroup *g, void *dst, const void *src, size_t n) {
    if (!n) return;
#ifdef MOE_HAVE_CUDA
    if (g->on_gpu) {
        COMM_CUDA_OK(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, cudaStreamLegacy));
        return;
    }
#endif
    memcpy(dst, src, n);
}
static void idle(const IpcGroup *g) {
#ifdef MOE_HAVE_CUDA
    if (g->on_gpu) COMM_CUDA_OK(cudaStreamSynchronize(cudaStreamLegacy));
#endif
}

// ---- the all-to-all-v
#define ES(t) comm_type_size(t)
static void i_alltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                        const size_t *rc, const size_t *rd, CommType t) {
    IpcGroup *g = c->dhandle;
    int n = c->size, me = c->rank;
    size_t es = ES(t), need = 0;
    for (int p = 0; p < n; p++)
        if (p != me && rc[p] && (rd[p] + rc[p]) * es > need) need = (rd[p] + rc[p]) * es;
    int grew = need > g->cap;
    if (grew) box_grow(g, need);
    idle(g); // (1)
    memcpy(g->blob, &g->mine, sizeof g->mine); // (2)
    for (int p = 0; p < n; p++) ((uint64_t *)(g->blob + sizeof(Inbox)))[p] = rd[p];
    comm_allgather(c, g->blob, g->all, blob_bytes(n), CT_U8);
    for (int q = 0; q < n; q++) { // (3) (every peer's new inbox opened, so its segment can go at (4))
        const char *b = g->all + blob_bytes(n) * (size_t)q;
        Inbox in;
        memcpy(&in, b, sizeof in);
        if (q != me && g->peer_gen[q] != in.gen) peer_open(g, q, &in);
        if (!sc[q]) continue;
        uint64_t at;
        memcpy(&at, b + sizeof(Inbox) + sizeof(uint64_t) * (size_t)me, sizeof at);
        if (q == me) {
            copy(g, (char *)recv + rd[me] * es, (const char *)send + sd[me] * es, sc[me] * es);
            continue;
        }
        if ((at + sc[q]) * es > in.cap)
            DIE("internal error: group %s: %zu rows for rank %d's inbox of %llu bytes at row %llu", c->name,
                sc[q], q, (unsigned long long)in.cap, (unsigned long long)at);
        copy(g, g->peer[q] + at * es, (const char *)send + sd[q] * es, sc[q] * es);
    }
    idle(g); // (4)
    comm_barrier(c);
    if (!g->on_gpu && grew) shm_unlink(g->mine.handle); // every peer has mapped it by now
    int k = 0; // (5) my peers' blocks, merged where they touch
    for (int p = 0; p < n; p++) {
        if (p == me || !rc[p]) continue;
        if (k && g->off[k - 1] + g->len[k - 1] == rd[p]) g->len[k - 1] += rc[p];
        else g->off[k] = rd[p], g->len[k++] = rc[p];
    }
    for (int i = 0; i < k; i++)
        copy(g, (char *)recv + g->off[i] * es, g->box + g->off[i] * es, g->len[i] * es);
}

// The non-blocking form: done before it returns (a finished request: comm_wait has nothing to do).
static CommReq ipc_done;
static CommReq *i_ialltoallv(const Comm *c, const void *send, const size_t *sc, const size_t *sd, void *recv,
                             const size_t *rc, const size_t *rd, CommType t) {
    i_alltoallv(c, send, sc, sd, recv, rc, rd, t);
    return &ipc_done;
}

// ---- everything else: the staged transport's
#define S comm_staged_ops
static void i_allreduce(const Comm *c, void *buf, size_t n, CommType t) { S.allreduce(c, buf, n, t); }
static void i_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t) {
    S.allgather(c, send, recv, n, t);
}
static void i_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                         const size_t *displs, CommType t) {
    S.allgatherv(c, send, n, recv, counts, displs, t);
}
static void i_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t) {
    S.reduce_scatter(c, send, recv, counts, t);
}
static void i_bcast(const Comm *c, void *buf, size_t n, CommType t, int root) { S.bcast(c, buf, n, t, root); }
static void i_barrier(const Comm *c) { S.barrier(c); }
static CommReq *i_iallreduce(const Comm *c, void *buf, size_t n, CommType t) {
    return S.iallreduce(c, buf, n, t);
}
static CommReq *i_ireduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts,
                                  CommType t) {
    return S.ireduce_scatter(c, send, recv, counts, t);
}
static CommReq *i_isend(const Comm *c, const void *buf, size_t n, CommType t, int peer, int tag) {
    return S.isend(c, buf, n, t, peer, tag);
}
static CommReq *i_irecv(const Comm *c, void *buf, size_t n, CommType t, int peer, int tag) {
    return S.irecv(c, buf, n, t, peer, tag);
}
#undef S

static void i_detach(Comm *c) {
    IpcGroup *g = c->dhandle;
    if (!g) return;
    comm_barrier(c); // (no peer writes into an inbox about to go)
    for (int q = 0; q < c->size; q++) peer_close(g, q);
    box_free(g);
    free(g->peer);
    free(g->peer_gen);
    free(g->peer_cap);
    free(g->blob);
    free(g->all);
    free(g->off);
    free(g->len);
    free(g);
}

// (test and wait: the requests are the staged transport's, or finished)
static const CommOps ipc_ops = {
    i_allreduce, i_allgather,  i_allgatherv,      i_reduce_scatter, i_alltoallv, i_bcast,
    i_barrier,   i_iallreduce, i_ireduce_scatter, i_ialltoallv,     i_isend,     i_irecv,
    NULL,        NULL,         i_detach,
};

void comm_dev_enable_ipc(Comm *c, int on_gpu) {
    if (!c || c->dops) return;
    comm_dev_enable_staged(c, on_gpu); // (the staged transport's state: copies, pools)
    IpcGroup *g = xcalloc(1, sizeof *g);
    int n = c->size;
    g->on_gpu = on_gpu;
    g->peer = xcalloc((size_t)n, sizeof *g->peer);
    g->peer_gen = xcalloc((size_t)n, sizeof *g->peer_gen);
    g->peer_cap = xcalloc((size_t)n, sizeof *g->peer_cap);
    g->blob = xmalloc(blob_bytes(n));
    g->all = xmalloc(blob_bytes(n) * (size_t)n);
    g->off = xmalloc(sizeof(size_t) * (size_t)n);
    g->len = xmalloc(sizeof(size_t) * (size_t)n);
    c->dops = &ipc_ops;
    c->dhandle = g;
}
