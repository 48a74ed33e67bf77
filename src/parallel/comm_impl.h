// comm_impl.h — what the comm API's backends share among themselves and nobody above them needs:
// the ops table a group points to, the request behind CommReq, the `self` ops, element sizes,
// the bounded wait and its timeout, the world's abort and the nccl backend's shutdown. Included by
// src/parallel/comm*.c and by the tests that check these pieces; callers use comm.h only.
// How the three files call each other: comm.c (wrappers, `self`, bounded wait) calls neither of
// the others. comm_world.c owns the process (MPI_Init .. MPI_Finalize, MPI_Abort, the node-local
// rank) and ends what it outlives: comm_dev_disable in comm_free, and at comm_world_finalize the
// shutdown a device backend registered when it started (comm_world_at_finalize), so it names no
// backend; comm_nccl.c asks the world for the node-local rank (its GPU), the abort that ends every
// rank, and that registration. The calls run one way: the nccl backend to the world.
// Must not hold: anything a caller of the comm API uses (that is comm.h).
#pragma once
#include "parallel/comm.h"

struct CommOps {
    void (*allreduce)(const Comm *c, void *buf, size_t n, CommType t); // sum, in place
    void (*allgather)(const Comm *c, const void *send, void *recv, size_t n, CommType t); // recv: size*n
    // recv gets counts[i] elements from rank i at displs[i]; send may be recv + displs[rank] (in place)
    void (*allgatherv)(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                       const size_t *displs, CommType t);
    // sum over ranks of send (sum(counts) elements); rank i keeps its counts[i] block
    void (*reduce_scatter)(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t);
    void (*alltoallv)(const Comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                      void *recv, const size_t *rcounts, const size_t *rdispls, CommType t);
    void (*bcast)(const Comm *c, void *buf, size_t n, CommType t, int root);
    void (*barrier)(const Comm *c);
    // non-blocking allreduce (sum, in place); progress with test, finish with wait (releases req)
    CommReq *(*iallreduce)(const Comm *c, void *buf, size_t n, CommType t);
    // non-blocking reduce_scatter (send and recv must not overlap)
    CommReq *(*ireduce_scatter)(const Comm *c, const void *send, void *recv, const size_t *counts,
                                CommType t);
    // non-blocking alltoallv (send and recv must not overlap; the count arrays may be freed at once)
    CommReq *(*ialltoallv)(const Comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                           void *recv, const size_t *rcounts, const size_t *rdispls, CommType t);
    // point-to-point: n elements to / from rank peer of the group, matched by (peer, tag) in order
    CommReq *(*isend)(const Comm *c, const void *buf, size_t n, CommType t, int peer, int tag);
    CommReq *(*irecv)(const Comm *c, void *buf, size_t n, CommType t, int peer, int tag);
    int (*test)(CommReq *r);
    void (*wait)(CommReq *r);
    // device ops only: release what the group's device backend holds (comm_dev_disable calls it)
    void (*detach)(Comm *c);
};

// A process group: its ranks, the host ops and, once a device backend is attached, the device ops.
struct Comm {
    int rank, size;
    char name[16]; // "world", "tp", "dp", "ep", "etp", "edp", "stage"
    const CommOps *ops;
    void *handle; // backend's group state (comm_world.c: the MPI communicator, count scratch, requests), NULL
                  // for self
    const CommOps *dops; // device-buffer ops (nccl), NULL: the comm_dev_* calls use ops
    void *dhandle; // their group handle (the NCCL communicator)
};

// A pending non-blocking operation: ops == NULL means already complete. A backend keeps its requests
// for reuse (MPI: each group's; nccl: in its events), so an operation allocates nothing once as many
// requests as it needs at a time have been made.
struct CommReq {
    const CommOps *ops; // the backend's
    void *impl; // backend request (MPI_Request*, the nccl backend's event)
};

// Groups of one: copies only (comm.c).
extern const CommOps comm_self_ops;

// MPI_Abort every rank when MPI is running (the DIE hook's action); returns otherwise (comm_world.c).
void comm_world_abort(void);
#ifdef MOE_HAVE_CUDA
#include <cuda_runtime_api.h>
// A CUDA runtime call of the transports that stage through the host or open IPC handles (comm_staged.c,
// comm_ipc.c), checked: dies naming it (callers include core/common.h).
#define COMM_CUDA_OK(call) \
    do { \
        cudaError_t _e = (call); \
        if (_e != cudaSuccess) \
            DIE("%s failed: %s (%s)", #call, cudaGetErrorName(_e), cudaGetErrorString(_e)); \
    } while (0)
#endif

// Free the staged transport's pooled staging buffers and requests (comm_world_finalize; comm_staged.c).
void comm_staged_free(void);
// The staged device ops (comm_staged.c): the ipc transport's for everything but the all-to-all-v.
extern const CommOps comm_staged_ops;
// fn runs at comm_world_finalize before MPI ends (comm_world.c; one function, the last registered): the
// nccl backend registers the destruction of what is left of it (communicators, streams, the watchdog)
// when it starts.
void comm_world_at_finalize(void (*fn)(void));

// ---- bounded waits (every host wait of the nccl backend; unit-tested with a fake clock) ----
enum { COMM_POLL_DONE = 0, COMM_POLL_PENDING = 1, COMM_POLL_ERROR = 2, COMM_POLL_TIMEOUT = 3 };
typedef struct {
    double (*now)(void *ctx); // seconds
    void (*pause)(void *ctx, double seconds); // 0: yield
    void *ctx;
} CommClock;
// Calls poll(ctx) until it returns DONE or ERROR (returned), or until timeout_s has passed since
// the first call (TIMEOUT); poll is always called at least once. Backs off from yielding to 1 ms
// sleeps. clock NULL: the real clock.
int comm_poll_until(int (*poll)(void *ctx), void *ctx, double timeout_s, const CommClock *clock);
// MOE_NCCL_TIMEOUT_S parsed: NULL and *out set, or a static message naming the problem.
const char *comm_parse_timeout(const char *s, double *out);
// How long any NCCL operation may take before every rank is ended: MOE_NCCL_TIMEOUT_S seconds
// (default 300; dies on a bad value).
double comm_timeout_s(void);
