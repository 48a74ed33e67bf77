// agree.h — the ranks' agreement at start-up: every rank hashes what it was asked to do (named
// items: options, data identity) and the ranks compare, so a job whose ranks were started with
// different options ends at once with one message instead of hanging in a collective or silently
// training different things. Bounded in time (MOE_COMM_TIMEOUT_S): a rank that never arrives ends
// the job too. Must not hold: what the items mean (the callers name and hash them).
#pragma once
#include <stdint.h>
#include "parallel/comm.h"

typedef struct {
    const char *name; // "--seed", "data contents", ...
    uint64_t hash; // of the value
    char shown[48]; // the value as the message shows it (cut to fit)
} AgreeItem;

// Collective over world (every rank passes the same names in the same order). Returns when every
// rank's hashes equal rank 0's; otherwise rank 0 dies with one message naming every differing item
// with its value on rank 0 and on the first rank that differs ("what": what was compared), and the
// other ranks wait for that abort. Dies (every rank ends) when the other ranks do not arrive within
// comm_host_timeout_s(). A group of one returns at once.
void comm_agree(const Comm *world, const char *what, const AgreeItem *items, int n);
