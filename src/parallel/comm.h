// comm.h — the communication API: collectives over a process group, with `self` (size-1, no
// library) and `mpi` backends over host buffers, and two device transports over device buffers:
// `nccl` (comm_nccl.c) and `staged` (comm_staged.c: through pinned host memory and the host ops, or
// device pointers handed to a CUDA-aware MPI). Nothing above src/parallel/ calls MPI or NCCL directly:
// the model, the MoE layer and the trainer reach other ranks only through this API.
// Host variants (comm_allreduce, ...) take host pointers. Device variants (comm_dev_*) take the
// compute backend's buffers: with a device transport attached (mesh_enable_device) they run over it,
// ordered against the compute stream on the GPU; otherwise they are the host calls (the cpu backend's
// buffers are host memory).
// Must not hold: knowledge of tensors, experts or the model; the backends' hooks (the ops tables,
// the bounded wait, shutdown and abort: comm_impl.h, for src/parallel/comm*.c and their tests).
#pragma once
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" { // callable from the CUDA backend's .cu files (comm_local_rank)
#endif

// CT_BF16: 2-byte values (the bf16 rows the MoE dispatch sends), moved only: all-to-all, gathers, broadcast,
// send/recv; the reductions refuse it.
typedef enum { CT_F32, CT_F64, CT_I32, CT_I64, CT_U8, CT_BF16 } CommType;

// The bytes of one value of type t.
size_t comm_type_size(CommType t);

typedef struct Comm Comm; // a process group (opaque: comm_size, comm_rank; comm_impl.h)
typedef struct CommOps CommOps; // a backend's collectives (comm_impl.h)
typedef struct CommReq CommReq; // a pending non-blocking operation

// A group's size and this process's rank in it; NULL is a group of one (size 1, rank 0).
int comm_size(const Comm *c);
int comm_rank(const Comm *c);

// Convenience wrappers (a NULL comm acts as a size-1 group).
void comm_allreduce(const Comm *c, void *buf, size_t n, CommType t);
void comm_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t);
void comm_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                     const size_t *displs, CommType t);
void comm_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t);
void comm_alltoallv(const Comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                    const size_t *rcounts, const size_t *rdispls, CommType t);
void comm_bcast(const Comm *c, void *buf, size_t n, CommType t, int root);
void comm_barrier(const Comm *c);
// A non-blocking operation (comm_dev_iallreduce, ...): test polls it (1: done), wait finishes it
// and releases the request (not to be used after: its backend reuses it, so no operation allocates
// once as many as are in flight at a time have been made).
int comm_test(CommReq *r);
void comm_wait(CommReq *r);
// Host non-blocking all-reduce (sum, in place), and a wait bounded in time: 0 when done (the request
// released), -1 after timeout_s seconds (the request still pending: the caller ends the job).
CommReq *comm_iallreduce(const Comm *c, void *buf, size_t n, CommType t);
int comm_wait_for(CommReq *r, double timeout_s);
// How long a host collective that guards the job (the ranks' start-up agreement) may wait for the
// other ranks: MOE_COMM_TIMEOUT_S seconds (default 600; dies on a bad value).
double comm_host_timeout_s(void);
// Point-to-point (pipeline stages): start sending n elements of buf to rank peer of c, or receiving
// them from it; messages between two ranks with the same tag arrive in the order they were sent.
// Finish with comm_wait; buf must not be touched before. Host buffers; a group of one has no peer.
CommReq *comm_isend(const Comm *c, const void *buf, size_t n, CommType t, int peer, int tag);
CommReq *comm_irecv(const Comm *c, void *buf, size_t n, CommType t, int peer, int tag);

// The world: MPI when launched under mpirun/srun with more than one process (and built with MPI),
// else self. comm_world_init may be called with NULL argc/argv. finalize is safe to call always; it
// frees the world (the Comm comm_world_init returned must not be used after it).
Comm *comm_world_init(int *argc, char ***argv);
void comm_world_finalize(void);
// A sub-group of the world: ranks with the same color form a group, ordered by key. comm_free: every
// non-blocking operation on c must have been waited for (it dies naming c otherwise).
Comm *comm_split(const Comm *world, int color, int key, const char *name);
void comm_free(Comm *c);
// This process's rank among the processes on its node (which GPU it takes): from the launcher
// (OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID, SLURM_LOCALID, MV2_COMM_WORLD_LOCAL_RANK,
// PMI_LOCAL_RANK), else from an MPI_COMM_TYPE_SHARED split of the world (collective: every
// rank must call it), else 0. The CUDA backend calls cudaSetDevice(comm_local_rank() % ngpus)
// before it allocates anything.
int comm_local_rank(void);

// ---- device buffers ----
// The same collectives over the compute backend's buffers. With device ops (NCCL) they are
// enqueued on a communication stream that first waits for the work already on the compute stream,
// and the compute stream waits for them: returning means ordered, not done (no host sync).
// Without device ops they are the host calls above.
void comm_dev_allreduce(const Comm *c, void *buf, size_t n, CommType t);
void comm_dev_allgather(const Comm *c, const void *send, void *recv, size_t n, CommType t);
void comm_dev_allgatherv(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                         const size_t *displs, CommType t);
void comm_dev_reduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t);
void comm_dev_alltoallv(const Comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                        void *recv, const size_t *rcounts, const size_t *rdispls, CommType t);
void comm_dev_bcast(const Comm *c, void *buf, size_t n, CommType t, int root);
// Non-blocking: in flight on the communication stream while compute continues. comm_test polls
// the GPU; comm_wait makes the compute stream wait for it (no host sync) and releases the request.
// The buffers must not be touched by compute work enqueued before the wait.
CommReq *comm_dev_iallreduce(const Comm *c, void *buf, size_t n, CommType t);
CommReq *comm_dev_ireduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts,
                                  CommType t);
// Non-blocking all-to-all-v (the MoE layer's pipelined exchange): in flight while compute goes on;
// send and recv must not overlap; the count arrays may be reused at once.
CommReq *comm_dev_ialltoallv(const Comm *c, const void *send, const size_t *scounts, const size_t *sdispls,
                             void *recv, const size_t *rcounts, const size_t *rdispls, CommType t);
// Point-to-point over backend buffers (the host forms above without device ops). The nccl backend
// does not carry them yet (it dies naming this): mesh_enable_device gives the pipeline group the
// staged transport.
CommReq *comm_dev_isend(const Comm *c, const void *buf, size_t n, CommType t, int peer, int tag);
CommReq *comm_dev_irecv(const Comm *c, void *buf, size_t n, CommType t, int peer, int tag);

// ---- the nccl backend (comm_nccl.c) ----
int comm_have_nccl(void); // built with NCCL (and CUDA)
// MOE_FORCE_NCCL=1: build the NCCL communicators even for one process (testing). Dies on a value
// other than 0/1, or on 1 in a build without NCCL.
int comm_nccl_forced(void);
// 1 if a device collective over c must run: c has more than one rank, or c has device ops and
// MOE_FORCE_NCCL=1 (tests then run the NCCL path on one GPU, groups of one included). Groups of
// one are otherwise a backend copy (or nothing) at the caller.
int comm_dev_due(const Comm *c);
// Attach NCCL to world: rank 0's ncclUniqueId is broadcast over world's host ops, then
// ncclCommInitRank. The current CUDA device must be this rank's GPU (comm_local_rank() % ngpus),
// else it dies naming both. Collective over world.
void comm_dev_enable_world(Comm *world);
// Attach NCCL to sub, made by comm_split(world, color, key): ncclCommSplit of world's communicator
// with the same color and key (same ranks, same order). Collective over world, in the same order
// on every rank.
void comm_dev_enable_split(const Comm *world, Comm *sub, int color, int key);
// Detach c's device transport (nccl: its communicator destroyed, collective over c; nothing without
// one); c keeps its host ops.
void comm_dev_disable(Comm *c);

// ---- the staged transport (comm_staged.c)
// Attach the staged device ops to c: every operation copies its device inputs to pinned host buffers
// (after the compute stream's work), runs c's host op on them and copies the results back; non-blocking
// forms copy back at comm_wait. The same MPI calls on the same values as a cpu mesh: the same bits.
// on_gpu 0: the compute backend's buffers are host memory (cpu; memcpy: how CI tests this path).
void comm_dev_enable_staged(Comm *c, int on_gpu);
// Attach the direct form: device pointers handed to c's host (MPI) ops once the compute stream has
// finished; only for an MPI library that reads device memory (comm_mpi_cuda_aware).
void comm_dev_enable_direct(Comm *c, int on_gpu);
// Attach the ipc device ops (comm_ipc.c; every rank of c on this node): the all-to-all-v device to
// device into the peers' inboxes (CUDA IPC; with on_gpu 0 POSIX shared memory), the rest staged.
void comm_dev_enable_ipc(Comm *c, int on_gpu);
// What the MPI library says at run time about reading device pointers (Open MPI's
// MPIX_Query_cuda_support): 1 yes, 0 no, -1 it cannot say (no MPI, or no such query).
int comm_mpi_cuda_aware(void);
// The processes on this node (launcher variables, else an MPI_COMM_TYPE_SHARED split: collective), 1
// without MPI.
int comm_local_size(void);

#ifdef __cplusplus
}
#endif
