// agree.c — the ranks' start-up agreement (see agree.h): bounded non-blocking all-reduces of every
// rank's item count, hashes and, on a mismatch, the shown values of the differing items.
// Must not hold: MPI calls (the comm API only) or knowledge of what the items are.
#define _POSIX_C_SOURCE 200809L
#include "parallel/agree.h"
#include <string.h>
#include <time.h>
#include "core/common.h"

// sum-allreduce of buf (each rank filled only its own slots), bounded in time
static void gather(const Comm *w, void *buf, size_t n, CommType t, const char *what, double timeout) {
    CommReq *r = comm_iallreduce(w, buf, n, t);
    if (comm_wait_for(r, timeout) != 0)
        DIE("the ranks did not all reach the start-up check of %s within %g s (a rank is stuck, dead or was "
            "started "
            "differently; MOE_COMM_TIMEOUT_S sets the limit)",
            what, timeout);
}

void comm_agree(const Comm *world, const char *what, const AgreeItem *items, int n) {
    int R = comm_size(world), me = comm_rank(world);
    if (R == 1) return;
    double timeout = comm_host_timeout_s();
    int64_t *counts = xcalloc((size_t)R, sizeof *counts);
    counts[me] = n;
    gather(world, counts, (size_t)R, CT_I64, what, timeout);
    for (int r = 1; r < R; r++)
        if (counts[r] != counts[0])
            DIE("rank %d compares %lld items of %s, rank 0 %lld: the ranks run different moe binaries", r,
                (long long)counts[r], what, (long long)counts[0]);
    free(counts);
    int64_t *h = xcalloc((size_t)R * n + 1, sizeof *h);
    for (int i = 0; i < n; i++) memcpy(&h[(size_t)me * n + i], &items[i].hash, sizeof(uint64_t));
    gather(world, h, (size_t)R * n, CT_I64, what, timeout);
    // the differing items and the first rank that differs in each: the same on every rank
    int *bad_rank = xcalloc((size_t)n + 1, sizeof *bad_rank), nbad = 0;
    for (int i = 0; i < n; i++) {
        for (int r = 1; r < R && !bad_rank[i]; r++)
            if (h[(size_t)r * n + i] != h[i]) bad_rank[i] = r;
        nbad += bad_rank[i] != 0;
    }
    free(h);
    if (!nbad) {
        free(bad_rank);
        return;
    }
    // every rank's shown value of each differing item, then rank 0 names them
    enum { W = sizeof items[0].shown };
    char *shown = xcalloc((size_t)R * nbad * W + 1, 1);
    for (int i = 0, k = 0; i < n; i++)
        if (bad_rank[i]) memcpy(shown + ((size_t)me * nbad + k++) * W, items[i].shown, W - 1);
    gather(world, shown, (size_t)R * nbad * W, CT_U8, what, timeout);
    if (me == 0) {
        char msg[2048];
        size_t len = 0;
        for (int i = 0, k = 0; i < n && len < sizeof msg; i++) {
            if (!bad_rank[i]) continue;
            const char *a = shown + (size_t)k * W, *b = shown + ((size_t)bad_rank[i] * nbad + k) * W;
            len += (size_t)snprintf(msg + len, sizeof msg - len, "%s%s (rank 0: %.*s, rank %d: %.*s)",
                                    k ? ", " : "", items[i].name, W, a, bad_rank[i], W, b);
            k++;
        }
        DIE("the ranks were started with different %s: %s; every rank must get the same ones", what, msg);
    }
    // rank 0 ends the job (MPI_Abort through the DIE hook); should that not come, end this rank
    struct timespec ts = {1, 0};
    for (double waited = 0; waited < timeout; waited += 1) nanosleep(&ts, NULL);
    DIE("the ranks were started with different %s (rank 0 reports which)", what);
}
