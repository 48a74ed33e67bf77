// comm.h — the communication API: collectives over a process group, with `self` (size-1, no
// library) and `mpi` backends (an `nccl` backend fills the same table later). Nothing above
// src/parallel/ calls MPI directly. Buffers are host pointers for self/mpi.
// Must not hold: knowledge of tensors, experts or the model.
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { CT_F32, CT_F64, CT_I32, CT_I64, CT_U8 } CommType;
size_t comm_type_size(CommType t);

typedef struct Comm Comm;
typedef struct CommReq CommReq;

typedef struct {
    void (*allreduce)(const Comm *c, void *buf, size_t n, CommType t);                 // sum, in place
    void (*allgather)(const Comm *c, const void *send, void *recv, size_t n, CommType t); // recv: size*n
    // recv gets counts[i] elements from rank i at displs[i]; send may be recv + displs[rank] (in place)
    void (*allgatherv)(const Comm *c, const void *send, size_t n, void *recv, const size_t *counts,
                       const size_t *displs, CommType t);
    // sum over ranks of send (sum(counts) elements); rank i keeps its counts[i] block
    void (*reduce_scatter)(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t);
    void (*alltoallv)(const Comm *c, const void *send, const size_t *scounts, const size_t *sdispls, void *recv,
                      const size_t *rcounts, const size_t *rdispls, CommType t);
    void (*bcast)(const Comm *c, void *buf, size_t n, CommType t, int root);
    void (*barrier)(const Comm *c);
    // non-blocking allreduce (sum, in place); progress with test, finish with wait (frees req)
    CommReq *(*iallreduce)(const Comm *c, void *buf, size_t n, CommType t);
    // non-blocking reduce_scatter (send and recv must not overlap)
    CommReq *(*ireduce_scatter)(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t);
    int (*test)(CommReq *r);
    void (*wait)(CommReq *r);
} CommOps;

// A pending non-blocking operation: ops == NULL means already complete.
struct CommReq {
    const void *ops;               // the backend's CommOps
    void *impl;                    // backend request (MPI_Request*)
};

struct Comm {
    int rank, size;
    char name[16];            // "world", "tp", "dp", "ep", "etp", "edp", "stage"
    const CommOps *ops;
    void *handle;             // backend's group handle (MPI_Comm*), NULL for self
};

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
CommReq *comm_iallreduce(const Comm *c, void *buf, size_t n, CommType t);
CommReq *comm_ireduce_scatter(const Comm *c, const void *send, void *recv, const size_t *counts, CommType t);
int comm_test(CommReq *r);
void comm_wait(CommReq *r);

// The world: MPI when launched under mpirun/srun with more than one process (and built with MPI),
// else self. comm_world_init may be called with NULL argc/argv. finalize is safe to call always.
Comm *comm_world_init(int *argc, char ***argv);
void comm_world_finalize(void);
// A sub-group of the world: ranks with the same color form a group, ordered by key.
Comm *comm_split(const Comm *world, int color, int key, const char *name);
void comm_free(Comm *c);
int comm_have_mpi(void);      // built with MPI
