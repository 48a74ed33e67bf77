// test_nccl_cpu.c — what of the nccl backend runs without a GPU: the bounded wait (with a fake
// clock: done, error, timeout never early nor late), MOE_NCCL_TIMEOUT_S parsing, the local rank from
// the launcher's variables, and the device variants' fallback to the host ops (identical results on
// groups without device ops, which is every group of the cpu backend).
#include <string.h>
#include <time.h>
#include "parallel/comm.h"
#include "parallel/comm_impl.h" // the bounded wait, the ops tables: tested here
#include "test_util.h"

typedef struct {
    double t;
    int pauses, yields;
} FakeClock;
static double fake_now(void *ctx) { return ((FakeClock *)ctx)->t; }
static void fake_pause(void *ctx, double s) {
    FakeClock *f = ctx;
    f->pauses++;
    if (s <= 0) f->yields++;
    f->t += s > 0 ? s : 1e-6; // a yield takes a microsecond
}

typedef struct {
    int calls, done_after, result;
} FakeOp;
static int fake_poll(void *ctx) {
    FakeOp *o = ctx;
    o->calls++;
    return o->calls >= o->done_after ? o->result : COMM_POLL_PENDING;
}

static void test_poll(void) {
    FakeClock fc = {100.0, 0, 0};
    CommClock clk = {fake_now, fake_pause, &fc};
    FakeOp op = {0, 5, COMM_POLL_DONE};
    EXPECT(comm_poll_until(fake_poll, &op, 10, &clk) == COMM_POLL_DONE, "done after 5 polls");
    EXPECT(op.calls == 5, "polled %d times", op.calls);

    op = (FakeOp){0, 3, COMM_POLL_ERROR};
    EXPECT(comm_poll_until(fake_poll, &op, 10, &clk) == COMM_POLL_ERROR, "an error ends the wait at once");
    EXPECT(op.calls == 3, "polled %d times", op.calls);

    // never done: TIMEOUT, not before the deadline and not much after (one pause of at most 1 ms)
    fc = (FakeClock){100.0, 0, 0};
    op = (FakeOp){0, 1 << 30, COMM_POLL_DONE};
    EXPECT(comm_poll_until(fake_poll, &op, 2.5, &clk) == COMM_POLL_TIMEOUT, "a stuck operation times out");
    EXPECT(fc.t - 100.0 >= 2.5, "timed out after %.6f s < 2.5", fc.t - 100.0);
    EXPECT(fc.t - 100.0 <= 2.5 + 1.1e-3, "timed out after %.6f s, later than one pause past 2.5",
           fc.t - 100.0);
    // backs off: it yields first, then sleeps (a 2.5 s wait is not millions of polls)
    EXPECT(fc.yields == 200, "yields %d", fc.yields);
    EXPECT(op.calls < 5000, "%d polls for a 2.5 s wait", op.calls);

    // done on the first poll even with a zero timeout; pending with a zero timeout: one poll
    op = (FakeOp){0, 1, COMM_POLL_DONE};
    EXPECT(comm_poll_until(fake_poll, &op, 0, &clk) == COMM_POLL_DONE && op.calls == 1, "zero timeout, done");
    op = (FakeOp){0, 2, COMM_POLL_DONE};
    EXPECT(comm_poll_until(fake_poll, &op, 0, &clk) == COMM_POLL_TIMEOUT && op.calls == 1,
           "zero timeout, pending");

    // the real clock: a 50 ms timeout ends between 50 ms and a generous bound
    op = (FakeOp){0, 1 << 30, COMM_POLL_DONE};
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    EXPECT(comm_poll_until(fake_poll, &op, 0.05, NULL) == COMM_POLL_TIMEOUT, "real clock timeout");
    clock_gettime(CLOCK_MONOTONIC, &b);
    double el = (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
    EXPECT(el >= 0.05 && el < 2.0, "real 50 ms wait took %.4f s", el);
}

static void test_timeout_parse(void) {
    double v = -1;
    EXPECT(comm_parse_timeout("300", &v) == NULL && v == 300, "300");
    EXPECT(comm_parse_timeout("2.5", &v) == NULL && v == 2.5, "2.5");
    const char *bad[] = {"", "0", "-1", "abc", "10s", "nan", "inf", "1e9"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *m = comm_parse_timeout(bad[i], &v);
        EXPECT(m && strstr(m, "MOE_NCCL_TIMEOUT_S"), "'%s' must be refused naming the variable", bad[i]);
    }
    unsetenv("MOE_NCCL_TIMEOUT_S");
    EXPECT(comm_timeout_s() == 300, "default 300 s");
    setenv("MOE_NCCL_TIMEOUT_S", "7", 1);
    EXPECT(comm_timeout_s() == 7, "from the environment");
    unsetenv("MOE_NCCL_TIMEOUT_S");
}

static void test_local_rank(void) {
    // (this test is not launched by MPI: only the variable decides)
    const char *other[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK"};
    for (int i = 0; i < 3; i++) unsetenv(other[i]);
    setenv("SLURM_LOCALID", "3", 1);
    EXPECT(comm_local_rank() == 3, "SLURM_LOCALID=3 -> %d", comm_local_rank());
}

// device variants on groups without device ops = the host calls (self group: copies)
static void test_fallback(void) {
    Comm *w = comm_world_init(NULL, NULL);
    EXPECT(comm_size(w) == 1 && w->dops == NULL, "a world without device ops");
    EXPECT(!comm_dev_due(w) && !comm_dev_due(NULL), "groups of one need no device collective");
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {0}, c[6] = {0};
    size_t cnt[1] = {4}, dsp[1] = {1}, cnt2[1] = {3}, dsp2[1] = {2};
    comm_allgatherv(w, a, 4, b, cnt, dsp, CT_F32);
    comm_dev_allgatherv(w, a, 4, c, cnt, dsp, CT_F32);
    EXPECT(!memcmp(b, c, sizeof b), "allgatherv");
    memset(b, 0, sizeof b);
    memset(c, 0, sizeof c);
    comm_alltoallv(w, a, cnt2, dsp, b, cnt2, dsp2, CT_F32);
    comm_dev_alltoallv(w, a, cnt2, dsp, c, cnt2, dsp2, CT_F32);
    EXPECT(!memcmp(b, c, sizeof b) && c[2] == 2 && c[4] == 4, "alltoallv");
    memset(b, 0, sizeof b);
    memset(c, 0, sizeof c);
    comm_reduce_scatter(w, a, b, cnt, CT_F32);
    comm_dev_reduce_scatter(w, a, c, cnt, CT_F32);
    EXPECT(!memcmp(b, c, sizeof b), "reduce_scatter");
    comm_dev_allreduce(w, a, 6, CT_F32);
    comm_dev_bcast(w, a, 6, CT_F32, 0);
    comm_dev_allgather(w, a, c, 6, CT_F32);
    EXPECT(!memcmp(a, c, sizeof a) && a[5] == 6, "allreduce / bcast / allgather of one");
    CommReq *r = comm_dev_iallreduce(w, a, 6, CT_F32);
    EXPECT(comm_test(r) == 1, "iallreduce test");
    comm_wait(r);
    memset(c, 0, sizeof c);
    r = comm_dev_ireduce_scatter(w, a, c, cnt, CT_F32);
    comm_wait(r);
    EXPECT(!memcmp(a, c, 4 * sizeof(float)), "ireduce_scatter");
    EXPECT(comm_have_nccl() || comm_nccl_forced() == 0, "MOE_FORCE_NCCL unset");
    comm_free(w);
    comm_world_finalize();
}

int main(void) {
    test_poll();
    test_timeout_parse();
    test_local_rank();
    test_fallback();
    return test_done("test_nccl_cpu");
}
