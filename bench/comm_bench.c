// comm_bench.c — the device transports' bandwidth for the sizes one MoE layer exchanges: an all-to-all-v
// over the world (every rank sends S bytes, split evenly over the ranks, and receives as much) through
// comm_dev_alltoallv on the cuda backend's buffers, and the ceiling of the staged transport on this
// machine: one rank's pinned device-to-host plus host-to-device copy of S bytes. Built as
// `moe_bench_comm` when CUDA is on; run under mpirun (scripts/device/share_bench.sh). Not a test.
//
//   mpirun -np N moe_bench_comm [staged|nccl|ipc] [--iters 20] [--sizes-mb 1,4,16,64,128]
//
// ipc is not a transport of ours: it measures the path a CUDA-IPC transport between the processes of one
// node would take (each rank's receive buffer opened by the others through cudaIpcOpenMemHandle, every
// block copied device to device straight into its place, a barrier before and after), to compare with
// staged.
//
// Per size: 3 untimed exchanges, then --iters timed ones (each ends with the device idle and a barrier:
// the host clock around one exchange; the staged transport returns with the data on the device), the
// median; rank 0 prints one line per size: S, the exchange's time, its bandwidth S / t, and the copy
// ceiling's S / (t_d2h + t_h2d). Values are not checked (tests/test_staged.sh and test_nccl.c do that).
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "ops/ops.h"
#include "parallel/comm.h"
#include "parallel/mesh.h"

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, cmp_d);
    return t[n / 2];
}

#define CK(call) \
    do { \
        cudaError_t _e = (call); \
        if (_e != cudaSuccess) DIE("%s: %s", #call, cudaGetErrorString(_e)); \
    } while (0)

// Every rank's buffer p opened in this process (mine: NULL); collective.
static char **ipc_open(const Comm *world, void *p) {
    int n = comm_size(world), me = comm_rank(world);
    cudaIpcMemHandle_t h, *all = xmalloc(sizeof h * (size_t)n);
    CK(cudaIpcGetMemHandle(&h, p));
    comm_allgather(world, &h, all, sizeof h, CT_U8);
    char **peer = xcalloc((size_t)n, sizeof(char *));
    for (int q = 0; q < n; q++)
        if (q != me) CK(cudaIpcOpenMemHandle((void **)&peer[q], all[q], cudaIpcMemLazyEnablePeerAccess));
    free(all);
    return peer;
}
static void ipc_close(const Comm *world, char **peer) {
    comm_barrier(world); // (nobody writes into a buffer about to be freed)
    for (int q = 0; q < comm_size(world); q++)
        if (peer[q]) CK(cudaIpcCloseMemHandle(peer[q]));
    free(peer);
    comm_barrier(world);
}

int main(int argc, char **argv) {
    Comm *world = comm_world_init(&argc, &argv);
    const char *mode = "staged", *sizes = "1,4,16,64,128";
    int iters = 20;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--iters") && i + 1 < argc) iters = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--sizes-mb") && i + 1 < argc) sizes = argv[++i];
        else if (!strcmp(argv[i], "staged") || !strcmp(argv[i], "nccl") || !strcmp(argv[i], "ipc"))
            mode = argv[i];
        else DIE("usage: moe_bench_comm [staged|nccl|ipc] [--iters N] [--sizes-mb A,B,...]");
    }
    if (iters < 1 || iters > 1000) DIE("--iters %d: 1 to 1000", iters);
    const Backend *be = backend_cuda_fp32();
    int n = comm_size(world), me = comm_rank(world);
    int ipc = !strcmp(mode, "ipc");
    if (!strcmp(mode, "nccl")) comm_dev_enable_world(world);
    else if (!ipc) comm_dev_enable_staged(world, 1);
    size_t *sc = xcalloc((size_t)n * 4, sizeof(size_t)), *sd = sc + n, *rc = sd + n, *rd = rc + n;
    double *t = xmalloc(sizeof(double) * (size_t)iters);
    if (me == 0)
        printf(
            "%d ranks, transport %s: all-to-all-v of S bytes per rank (S/%d to each)\n%10s %12s %12s %14s\n",
            n, mode, n, "S (MiB)", "time (ms)", "GB/s", "copy ceiling");
    char *list = xmalloc(strlen(sizes) + 1);
    memcpy(list, sizes, strlen(sizes) + 1);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        double mb = atof(tok);
        if (mb <= 0 || mb > 4096) DIE("--sizes-mb: '%s' is not in (0, 4096]", tok);
        size_t S = (size_t)(mb * 1048576.0) / 4 / (size_t)n * (size_t)n; // floats, a multiple of n
        for (int p = 0; p < n; p++) {
            sc[p] = rc[p] = S / (size_t)n;
            sd[p] = rd[p] = (size_t)p * (S / (size_t)n);
        }
        float *send = be->alloc(S * 4), *recv = be->alloc(S * 4);
        char **peer = ipc ? ipc_open(world, recv) : NULL;
        for (int it = -3; it < iters; it++) {
            comm_barrier(world);
            CK(cudaDeviceSynchronize());
            double t0 = now_seconds();
            if (ipc) { // my block for q into q's receive buffer at my place there (rd: the same on every
                       // rank)
                comm_barrier(world);
                for (int q = 0; q < n; q++)
                    CK(cudaMemcpyAsync(q == me ? (char *)recv + rd[me] * 4 : peer[q] + rd[me] * 4,
                                       (char *)send + sd[q] * 4, sc[q] * 4, cudaMemcpyDeviceToDevice, 0));
                CK(cudaDeviceSynchronize());
                comm_barrier(world);
            } else comm_dev_alltoallv(world, send, sc, sd, recv, rc, rd, CT_F32);
            CK(cudaDeviceSynchronize());
            if (it >= 0) t[it] = now_seconds() - t0;
        }
        if (ipc) ipc_close(world, peer);
        double tx = median(t, iters);
        comm_allreduce(world, &tx, 1, CT_F64); // the mean over ranks of each rank's median
        tx /= n;
        // the staged path's ceiling: one pinned round trip of S bytes
        void *h;
        CK(cudaHostAlloc(&h, S * 4, cudaHostAllocDefault));
        for (int it = -3; it < iters; it++) {
            double t0 = now_seconds();
            CK(cudaMemcpy(h, send, S * 4, cudaMemcpyDeviceToHost));
            CK(cudaMemcpy(recv, h, S * 4, cudaMemcpyHostToDevice));
            if (it >= 0) t[it] = now_seconds() - t0;
        }
        double tc = median(t, iters);
        CK(cudaFreeHost(h));
        be->free(send);
        be->free(recv);
        if (me == 0)
            printf("%10.1f %12.3f %12.2f %14.2f\n", S * 4 / 1048576.0, tx * 1e3, S * 4 / tx / 1e9,
                   S * 4 / tc / 1e9);
    }
    free(list);
    free(t);
    free(sc);
    if (!ipc) comm_dev_disable(world);
    comm_world_finalize();
    return 0;
}
