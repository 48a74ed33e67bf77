// stages.c — the layer split into pipeline stages (see stages.h).
#include "parallel/stages.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *stages_split(StageSplit *s, int L, int pp, int vpp, const char *list) {
    static char msg[256];
#define BAD(...) \
    do { \
        snprintf(msg, sizeof msg, __VA_ARGS__); \
        return msg; \
    } while (0)
    memset(s, 0, sizeof *s);
    if (pp < 1) BAD("--pp must be >= 1 (got %d)", pp);
    if (vpp < 1) BAD("--vpp must be >= 1 (got %d)", vpp);
    // the product in 64 bits: --pp x --vpp beyond int range must not wrap (to 0: a division by zero)
    long long S64 = (long long)pp * vpp;
    if (S64 > STAGES_MAX)
        BAD("--pp %d x --vpp %d = %lld virtual stages; at most %d", pp, vpp, S64, STAGES_MAX);
    int S = (int)S64;
    s->pp = pp;
    s->vpp = vpp;
    if (!list || !*list) {
        if (L % S) {
            if (vpp > 1)
                BAD("n_layers %d is not divisible by --pp %d x --vpp %d (give --pp-layers for an uneven "
                    "split)",
                    L, pp, vpp);
            BAD("n_layers %d is not divisible by --pp %d (give --pp-layers for an uneven split)", L, pp);
        }
        for (int k = 0; k <= S; k++) s->first[k] = k * (L / S);
        return NULL;
    }
    const char *p = list;
    int k = 0, sum = 0;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || (*end && *end != ',') || (*p != '-' && (*p < '0' || *p > '9')))
            BAD("--pp-layers '%s' is not a comma-separated list of layer counts", list);
        if (v < 1 || v > L)
            BAD("--pp-layers '%s': every stage needs at least one layer and at most n_layers %d", list, L);
        if (k == S) BAD("--pp-layers '%s' has more than --pp %d x --vpp %d = %d entries", list, pp, vpp, S);
        s->first[k++] = sum;
        sum += (int)v;
        p = *end ? end + 1 : end;
        if (*end == ',' && !*p) BAD("--pp-layers '%s' ends with a comma", list);
    }
    if (k != S)
        BAD("--pp-layers '%s' has %d entries; --pp %d x --vpp %d needs %d (one per stage)", list, k, pp, vpp,
            S);
    if (sum != L) BAD("--pp-layers '%s' sums to %d layers; the model has n_layers %d", list, sum, L);
    s->first[S] = L;
#undef BAD
    return NULL;
}

int stages_of_layer(const StageSplit *s, int l) {
    int k = 0;
    while (k + 1 < s->pp * s->vpp && s->first[k + 1] <= l) k++;
    return k;
}
