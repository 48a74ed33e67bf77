// test_nccl.c — every device op of the nccl backend against the host ops (MPI, or self for one
// process) on the same data: integer-valued floats, so any reduction order gives the same bits and
// the results must be bitwise equal. Groups: the world, a split by rank parity and a split in
// reverse rank order (ncclCommSplit must match MPI_Comm_split's ranks). Also: the ordering
// against the compute stream with no host sync (a kernel writes, the collective reads, the next
// kernel reads the result), non-blocking forms overlapping compute, the device barrier.
//   build/test_nccl                      one GPU, one rank (what ctest runs; skipped without a GPU)
//   mpirun -np N build/test_nccl         N ranks, one GPU each
//   MOE_NCCL_TEST_STALL_S=60 MOE_NCCL_TIMEOUT_S=2 build/test_nccl stall
//                                        must end (exit 1) within a few seconds, naming the timeout
#include <string.h>
#include "core/common.h"
#include "ops/ops.h"
#include "parallel/comm.h"
#include "parallel/comm_impl.h" // a group's device ops, called directly (the barrier)
#include "test_util.h"

static const Backend *be;
static int R; // world rank, for messages

static void *dev_from(const void *h, size_t bytes) {
    void *d = be->alloc(bytes ? bytes : 4);
    if (bytes) be->to_device(d, h, bytes);
    return d;
}
static void *host_of(const void *d, size_t bytes) {
    void *h = xmalloc(bytes ? bytes : 4);
    if (bytes) be->to_host(h, d, bytes);
    return h;
}
static float *pattern(size_t n, int rank, int salt) {
    float *a = xmalloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) a[i] = (float)((rank + 1) * 1000 + (int)(i % 997) * (salt + 1));
    return a;
}
#define SAME(h, d, bytes, what) \
    do { \
        void *_g = host_of(d, bytes); \
        EXPECT(!memcmp(h, _g, bytes), "[rank %d] group %s: %s differs from the host ops", R, c->name, what); \
        free(_g); \
    } while (0)

static void ops_on(const Comm *c) {
    int S = comm_size(c), me = comm_rank(c);
    // allreduce, three types
    {
        size_t n = 1000;
        float *h = pattern(n, me, 0);
        float *d = dev_from(h, n * 4);
        comm_allreduce(c, h, n, CT_F32);
        comm_dev_allreduce(c, d, n, CT_F32);
        SAME(h, d, n * 4, "allreduce f32");
        double hd[3] = {me + 0.5, -me, 1e10 * me};
        int64_t hi[3] = {me, (int64_t)1 << 40, -7 * me};
        void *dd = dev_from(hd, sizeof hd), *di = dev_from(hi, sizeof hi);
        comm_allreduce(c, hd, 3, CT_F64);
        comm_dev_allreduce(c, dd, 3, CT_F64);
        comm_allreduce(c, hi, 3, CT_I64);
        comm_dev_allreduce(c, di, 3, CT_I64);
        SAME(hd, dd, sizeof hd, "allreduce f64");
        SAME(hi, di, sizeof hi, "allreduce i64");
        free(h);
        be->free(d);
        be->free(dd);
        be->free(di);
    }
    // allgather
    {
        size_t n = 37;
        float *s = pattern(n, me, 1), *h = xcalloc(n * S, 4);
        float *ds = dev_from(s, n * 4), *dr = be->alloc(n * S * 4);
        comm_allgather(c, s, h, n, CT_F32);
        comm_dev_allgather(c, ds, dr, n, CT_F32);
        SAME(h, dr, n * S * 4, "allgather");
        free(s);
        free(h);
        be->free(ds);
        be->free(dr);
    }
    // allgatherv: unequal blocks (broadcasts), equal blocks (allgather), in place
    for (int kind = 0; kind < 3; kind++) {
        size_t *cnt = xmalloc(sizeof(size_t) * S * 2), *dsp = cnt + S, tot = 0;
        for (int i = 0; i < S; i++) {
            cnt[i] = kind == 0 ? 5 + 3 * (size_t)i : 64;
            dsp[i] = tot;
            tot += cnt[i];
        }
        if (kind == 0 && S > 1) cnt[S - 1] = 0, tot -= 5 + 3 * (size_t)(S - 1); // a rank with nothing
        float *s = pattern(cnt[me], me, 2), *h = xcalloc(tot + 1, 4);
        float *dr = be->alloc((tot + 1) * 4), *ds;
        if (kind == 2) { // send is my block of recv
            memcpy(h + dsp[me], s, cnt[me] * 4);
            be->to_device(dr + dsp[me], s, cnt[me] * 4);
            comm_allgatherv(c, h + dsp[me], cnt[me], h, cnt, dsp, CT_F32);
            comm_dev_allgatherv(c, dr + dsp[me], cnt[me], dr, cnt, dsp, CT_F32);
        } else {
            ds = dev_from(s, cnt[me] * 4);
            comm_allgatherv(c, s, cnt[me], h, cnt, dsp, CT_F32);
            comm_dev_allgatherv(c, ds, cnt[me], dr, cnt, dsp, CT_F32);
            be->free(ds);
        }
        SAME(h, dr, tot * 4,
             kind == 0       ? "allgatherv (unequal)"
                 : kind == 1 ? "allgatherv (equal)"
                             : "allgatherv (in place)");
        free(cnt);
        free(s);
        free(h);
        be->free(dr);
    }
    // reduce_scatter and ireduce_scatter: unequal blocks (grouped reduces) and equal blocks
    for (int kind = 0; kind < 4; kind++) {
        size_t *cnt = xmalloc(sizeof(size_t) * S), tot = 0;
        for (int i = 0; i < S; i++) {
            cnt[i] = kind % 2 == 0 ? 3 + 7 * (size_t)i : 50;
            tot += cnt[i];
        }
        float *s = pattern(tot, me, 3), *h = xcalloc(cnt[me] + 1, 4);
        float *ds = dev_from(s, tot * 4), *dr = be->alloc((cnt[me] + 1) * 4);
        comm_reduce_scatter(c, s, h, cnt, CT_F32);
        if (kind < 2) {
            comm_dev_reduce_scatter(c, ds, dr, cnt, CT_F32);
        } else {
            CommReq *q = comm_dev_ireduce_scatter(c, ds, dr, cnt, CT_F32);
            while (!comm_test(q)) {}
            comm_wait(q);
        }
        SAME(h, dr, cnt[me] * 4, kind < 2 ? "reduce_scatter" : "ireduce_scatter");
        free(cnt);
        free(s);
        free(h);
        be->free(ds);
        be->free(dr);
    }
    // alltoallv: some pairs exchange nothing; self included
    {
        size_t *sc = xmalloc(sizeof(size_t) * S * 4), *sd = sc + S, *rc = sd + S, *rd = rc + S, st = 0,
               rt = 0;
        for (int p = 0; p < S; p++) {
            sc[p] = (size_t)((me + 2 * p) % 5) * 11;
            rc[p] = (size_t)((p + 2 * me) % 5) * 11;
            sd[p] = st;
            st += sc[p];
            rd[p] = rt;
            rt += rc[p];
        }
        float *s = pattern(st, me, 4), *h = xcalloc(rt + 1, 4);
        float *ds = dev_from(s, st * 4), *dr = be->alloc((rt + 1) * 4);
        comm_alltoallv(c, s, sc, sd, h, rc, rd, CT_F32);
        comm_dev_alltoallv(c, ds, sc, sd, dr, rc, rd, CT_F32);
        SAME(h, dr, rt * 4, "alltoallv");
        free(sc);
        free(s);
        free(h);
        be->free(ds);
        be->free(dr);
    }
    // bcast from the last rank
    {
        size_t n = 333;
        float *h = pattern(n, me, 5), *d = dev_from(h, n * 4);
        comm_bcast(c, h, n, CT_F32, S - 1);
        comm_dev_bcast(c, d, n, CT_F32, S - 1);
        SAME(h, d, n * 4, "bcast");
        free(h);
        be->free(d);
    }
    // ordering with no host sync: kernel writes -> allreduce -> kernel reads; and an iallreduce
    // in flight while compute runs on another buffer
    {
        size_t n = (size_t)8 << 20; // 32 MiB
        float *x = be->alloc(n * 4), *y = be->alloc(n * 4), *ones = xmalloc(n * 4);
        for (size_t i = 0; i < n; i++) ones[i] = 1.0f;
        be->to_device(y, ones, n * 4);
        be->zero(x, n * 4);
        be->axpy(x, y, 3.0f, n); // x = 3
        comm_dev_allreduce(c, x, n, CT_F32); // x = 3 S
        be->axpy(x, x, -0.5f, n); // x = 1.5 S
        CommReq *q = comm_dev_iallreduce(c, x, n, CT_F32); // x = 1.5 S^2, while y is worked on
        for (int k = 0; k < 20; k++) be->axpy(y, y, 1.0f, n); // y = 2^20
        comm_wait(q);
        be->axpy(x, y, 1.0f, n); // x = 1.5 S^2 + 2^20
        float *hx = host_of(x, n * 4);
        float want = 1.5f * S * S + (float)(1 << 20);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += hx[i] != want;
        EXPECT(bad == 0, "[rank %d] group %s: stream ordering: %zu of %zu elements wrong (e.g. %g, want %g)",
               R, c->name, bad, n, hx[0], want);
        free(hx);
        free(ones);
        be->free(x);
        be->free(y);
    }
    c->dops->barrier(c);
}

int main(int argc, char **argv) {
    Comm *w = comm_world_init(&argc, &argv);
    R = comm_rank(w);
    if (!comm_have_nccl()) {
        if (R == 0) printf("SKIP: built without NCCL\n");
        comm_world_finalize();
        return 77;
    }
    if (!backend_cuda_available()) {
        if (R == 0) printf("SKIP: no CUDA GPU\n");
        comm_world_finalize();
        return 77;
    }
    be = backend_cuda();
    double t0 = now_seconds();
    comm_dev_enable_world(w);
    EXPECT(w->dops != NULL, "world has device ops");
    if (argc > 1 && !strcmp(argv[1], "stall")) {
        // MOE_NCCL_TEST_STALL_S holds the communication stream: the host blocks in to_host, and the
        // watchdog must end the process after MOE_NCCL_TIMEOUT_S
        float *d = be->alloc(4096), h[1];
        comm_dev_allreduce(w, d, 1024, CT_F32);
        be->to_host(h, d, sizeof h);
        printf("stall: the collective completed (MOE_NCCL_TEST_STALL_S unset?)\n");
        return 2;
    }
    Comm *par = comm_split(w, comm_rank(w) % 2, comm_rank(w), "parity");
    comm_dev_enable_split(w, par, comm_rank(w) % 2, comm_rank(w));
    Comm *rev = comm_split(w, 0, comm_size(w) - comm_rank(w), "reverse");
    comm_dev_enable_split(w, rev, 0, comm_size(w) - comm_rank(w));
    EXPECT(comm_rank(rev) == comm_size(w) - 1 - comm_rank(w), "reverse group rank %d", comm_rank(rev));
    double t1 = now_seconds();
    const Comm *groups[] = {w, par, rev};
    for (int g = 0; g < 3; g++) ops_on(groups[g]);
    double t2 = now_seconds();
    comm_free(par);
    comm_free(rev);
    comm_dev_disable(w);
    EXPECT(w->dops == NULL, "world's device ops detached");
    if (R == 0)
        printf("test_nccl: %d ranks, local rank %d, NCCL setup %.2f s, ops on 3 groups %.2f s\n",
               comm_size(w), comm_local_rank(), t1 - t0, t2 - t1);
    int64_t f = t_failures;
    comm_allreduce(w, &f, 1, CT_I64);
    t_failures = (int)f;
    comm_world_finalize();
    return test_done("test_nccl");
}
