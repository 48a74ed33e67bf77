// exchange.c — token rows to their experts and back (see exchange.h).
#include "moe/exchange.h"
#include <string.h>
#include "core/common.h"

#define F sizeof(float)

void exchange_init(Exchange *x, const Backend *be, const Comm *ep, const Comm *etp, int El, int d) {
    memset(x, 0, sizeof *x);
    x->be = be; x->ep = ep; x->etp = etp;
    x->EP = comm_size(ep);
    x->ETP = comm_size(etp);
    x->El = El; x->d = d;
    x->sc = xcalloc(x->EP, sizeof(size_t)); x->sd = xcalloc(x->EP, sizeof(size_t));
    x->rc = xcalloc(x->EP, sizeof(size_t)); x->rd = xcalloc(x->EP, sizeof(size_t));
    x->rcnt = xcalloc((size_t)x->EP * El, sizeof(int64_t));
    x->gcnt = xcalloc((size_t)x->ETP * x->EP * El, sizeof(int64_t));
    x->gc = xcalloc(x->ETP, sizeof(size_t)); x->gd = xcalloc(x->ETP, sizeof(size_t));
    x->off = xcalloc(El + 1, sizeof(int64_t));
}

void exchange_free(Exchange *x) {
    free(x->sc); free(x->sd); free(x->rc); free(x->rd); free(x->rcnt); free(x->gcnt); free(x->gc); free(x->gd);
    free(x->off); free(x->perm_h);
    if (x->perm) x->be->free(x->perm);
    if (x->iperm) x->be->free(x->iperm);
    if (x->raw_ep) x->be->free(x->raw_ep);
    if (x->raw) x->be->free(x->raw);
    memset(x, 0, sizeof *x);
}

static void grow(const Backend *be, void **p, size_t *cap, size_t need) {
    if (need <= *cap && *p) return;
    if (*p) be->free(*p);
    *cap = need > *cap * 2 ? need : *cap * 2;
    if (*cap == 0) *cap = 1;
    *p = be->alloc(*cap);
}

void exchange_plan(Exchange *x, const int64_t *kept) {
    int EP = x->EP, ETP = x->ETP, El = x->El;
    x->local = EP == 1 && ETP == 1 && !comm_dev_due(x->ep) && !comm_dev_due(x->etp);
    if (x->local) {
        // one group: every row stays here, in the same (expert-sorted) order; no collectives,
        // permutation or staging
        x->off[0] = 0;
        for (int le = 0; le < El; le++) x->off[le + 1] = x->off[le] + kept[le];
        x->M = x->R = x->Rg = (int)x->off[El];
        x->sc[0] = x->rc[0] = x->gc[0] = (size_t)x->M;
        x->sd[0] = x->rd[0] = x->gd[0] = 0;
        memcpy(x->rcnt, kept, sizeof(int64_t) * El);
        memcpy(x->gcnt, kept, sizeof(int64_t) * El);
        return;
    }
    // what I send to each EP peer: the rows of its experts (contiguous: rows are expert-sorted)
    int64_t *sendcnt = (int64_t *)kept;   // (EP*El), peer q owns experts [q*El, (q+1)*El)
    size_t *one = xmalloc(sizeof(size_t) * EP), *disp = xmalloc(sizeof(size_t) * EP);
    x->M = 0;
    for (int q = 0; q < EP; q++) {
        one[q] = El;
        disp[q] = (size_t)q * El;
        x->sd[q] = x->M;
        x->sc[q] = 0;
        for (int le = 0; le < El; le++) x->sc[q] += kept[q * El + le];
        x->M += (int)x->sc[q];
    }
    comm_alltoallv(x->ep, sendcnt, one, disp, x->rcnt, one, disp, CT_I64);
    free(one); free(disp);
    x->R = 0;
    for (int q = 0; q < EP; q++) {
        x->rd[q] = x->R;
        x->rc[q] = 0;
        for (int le = 0; le < El; le++) x->rc[q] += x->rcnt[q * El + le];
        x->R += (int)x->rc[q];
    }
    comm_allgather(x->etp, x->rcnt, x->gcnt, (size_t)EP * El, CT_I64);
    x->Rg = 0;
    for (int p = 0; p < ETP; p++) {
        x->gd[p] = x->Rg;
        x->gc[p] = 0;
        for (int i = 0; i < EP * El; i++) x->gc[p] += x->gcnt[(size_t)p * EP * El + i];
        x->Rg += (int)x->gc[p];
    }
    // gathered layout [p][q][le]; expert-major layout [le][p][q]
    x->perm_h = xrealloc(x->perm_h, sizeof(int32_t) * (x->Rg ? x->Rg : 1));
    int32_t *ip = xmalloc(sizeof(int32_t) * (x->Rg ? x->Rg : 1));
    int64_t pos = 0;
    for (int le = 0; le < El; le++) {
        x->off[le] = pos;
        for (int p = 0; p < ETP; p++) {
            int64_t base = x->gd[p];
            for (int q = 0; q < EP; q++) {
                const int64_t *c = x->gcnt + ((size_t)p * EP + q) * El;
                int64_t start = base;
                for (int e2 = 0; e2 < le; e2++) start += c[e2];
                for (int64_t i = 0; i < c[le]; i++) {
                    x->perm_h[pos] = (int32_t)(start + i);
                    ip[start + i] = (int32_t)pos;
                    pos++;
                }
                for (int e2 = 0; e2 < El; e2++) base += c[e2];
            }
        }
    }
    x->off[El] = pos;
    grow(x->be, (void **)&x->perm, &x->cap_idx, sizeof(int32_t) * (x->Rg ? x->Rg : 1));
    if (x->iperm) x->be->free(x->iperm);
    x->iperm = x->be->alloc(x->cap_idx);
    x->be->to_device(x->perm, x->perm_h, sizeof(int32_t) * x->Rg);
    x->be->to_device(x->iperm, ip, sizeof(int32_t) * x->Rg);
    free(ip);
    grow(x->be, (void **)&x->raw_ep, &x->cap_R, F * (size_t)(x->R ? x->R : 1) * x->d);
    grow(x->be, (void **)&x->raw, &x->cap_Rg, F * (size_t)(x->Rg ? x->Rg : 1) * x->d);
}

static void scale_counts(const size_t *c, size_t *out, int n, size_t by) { for (int i = 0; i < n; i++) out[i] = c[i] * by; }

// The counts of my rows as element counts (x d) into a, b, c, e: send counts, send displacements,
// receive counts, receive displacements of the EP all-to-all (forward direction; swapped back).
static void ep_counts(const Exchange *x, int back, size_t *a, size_t *b, size_t *c, size_t *e) {
    size_t d = x->d;
    scale_counts(back ? x->rc : x->sc, a, x->EP, d); scale_counts(back ? x->rd : x->sd, b, x->EP, d);
    scale_counts(back ? x->sc : x->rc, c, x->EP, d); scale_counts(back ? x->sd : x->rd, e, x->EP, d);
}

void exchange_dispatch_start(Exchange *x, const float *rows) {
    if (x->local) return;
    // rows are backend buffers: the comm API's device variants (NCCL on GPUs); groups of one are
    // a backend copy (unless a test forces the NCCL path: comm_dev_due)
    if (comm_dev_due(x->ep)) {
        size_t *a = xmalloc(sizeof(size_t) * x->EP * 4);
        ep_counts(x, 0, a, a + x->EP, a + 2 * x->EP, a + 3 * x->EP);
        x->req = comm_dev_ialltoallv(x->ep, rows, a, a + x->EP, x->raw_ep, a + 2 * x->EP, a + 3 * x->EP, CT_F32);
        free(a);
    } else {
        x->be->copy(x->raw_ep, rows, sizeof(float) * (size_t)x->M * x->d);
    }
}

const float *exchange_dispatch_finish(Exchange *x, const float *rows, float *out) {
    if (x->local) return rows;
    if (x->req) { comm_wait(x->req); x->req = NULL; }
    int ETP = x->ETP;
    size_t d = x->d;
    if (comm_dev_due(x->etp)) {
        size_t *a = xmalloc(sizeof(size_t) * ETP * 2);
        scale_counts(x->gc, a, ETP, d); scale_counts(x->gd, a + ETP, ETP, d);
        comm_dev_allgatherv(x->etp, x->raw_ep, (size_t)x->R * d, x->raw, a, a + ETP, CT_F32);
        free(a);
    } else {
        x->be->copy(x->raw, x->raw_ep, sizeof(float) * (size_t)x->R * d);
    }
    x->be->gather_rows(out, x->raw, x->perm, x->Rg, x->d);
    return out;
}

const float *exchange_dispatch(Exchange *x, const float *rows, float *out) {
    exchange_dispatch_start(x, rows);
    return exchange_dispatch_finish(x, rows, out);
}

void exchange_combine_start(Exchange *x, const float *partial, float *rows) {
    if (x->local) return;
    int ETP = x->ETP;
    size_t d = x->d;
    x->be->gather_rows(x->raw, partial, x->iperm, x->Rg, x->d);
    if (comm_dev_due(x->etp)) {
        size_t *a = xmalloc(sizeof(size_t) * ETP);
        scale_counts(x->gc, a, ETP, d);
        comm_dev_reduce_scatter(x->etp, x->raw, x->raw_ep, a, CT_F32);
        free(a);
    } else {
        x->be->copy(x->raw_ep, x->raw, sizeof(float) * (size_t)x->R * d);
    }
    if (comm_dev_due(x->ep)) {
        size_t *a = xmalloc(sizeof(size_t) * x->EP * 4);
        ep_counts(x, 1, a, a + x->EP, a + 2 * x->EP, a + 3 * x->EP);
        x->req = comm_dev_ialltoallv(x->ep, x->raw_ep, a, a + x->EP, rows, a + 2 * x->EP, a + 3 * x->EP, CT_F32);
        free(a);
    } else {
        x->be->copy(rows, x->raw_ep, sizeof(float) * (size_t)x->M * d);
    }
}

const float *exchange_combine_finish(Exchange *x, const float *partial, float *rows) {
    if (x->local) return partial;
    if (x->req) { comm_wait(x->req); x->req = NULL; }
    return rows;
}

const float *exchange_combine(Exchange *x, const float *partial, float *rows) {
    exchange_combine_start(x, partial, rows);
    return exchange_combine_finish(x, partial, rows);
}
