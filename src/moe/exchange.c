// exchange.c — token rows to their experts and back (see exchange.h): the counts, the expert-major
// permutation, the ETP gather / reduce-scatter; the EP all-to-all-v through the chosen transport (a2a.h).
// Must not hold: a transport's insides (a2a_flat.c, a2a_hier.c).
#include "moe/exchange.h"
#include <string.h>
#include "core/common.h"

#define F sizeof(float)

void exchange_init(Exchange *x, const Backend *be, const Comm *ep, const Comm *etp, const Comm *epn,
                   const Comm *epx, int El, int d, int rows_max) {
    memset(x, 0, sizeof *x);
    x->be = be;
    x->ep = ep;
    x->etp = etp;
    x->EP = comm_size(ep);
    x->ETP = comm_size(etp);
    x->El = El;
    x->d = d;
    x->rows_max = rows_max > 0 ? rows_max : 1;
    int two_level = epn && epx && comm_size(epn) > 1 && comm_size(epx) >= 1;
    x->tr = two_level ? &a2a_hier : &a2a_flat;
    x->a2a = x->tr->init(be, ep, epn, epx, d, (size_t)x->rows_max);
    size_t EP = (size_t)x->EP, ETP = (size_t)x->ETP;
    x->sc = xcalloc(6 * EP, sizeof(size_t));
    x->sd = x->sc + EP;
    x->rc = x->sd + EP;
    x->rd = x->rc + EP;
    x->one = x->rd + EP;
    x->disp = x->one + EP;
    for (size_t q = 0; q < EP; q++) {
        x->one[q] = (size_t)El;
        x->disp[q] = q * El;
    }
    x->gc = xcalloc(4 * ETP, sizeof(size_t));
    x->gd = x->gc + ETP;
    x->cnt = x->gd + ETP;
    x->rcnt = xcalloc(EP * El, sizeof(int64_t));
    x->gcnt = xcalloc(ETP * EP * El, sizeof(int64_t));
    x->off = xcalloc(El + 1, sizeof(int64_t));
}

void exchange_free(Exchange *x) {
    if (x->a2a) x->tr->free(x->a2a);
    free(x->sc);
    free(x->gc);
    free(x->rcnt);
    free(x->gcnt);
    free(x->off);
    free(x->perm_h);
    void *dev[] = {x->perm, x->iperm, x->raw_ep, x->raw, x->pk};
    for (int i = 0; i < 5; i++)
        if (dev[i]) x->be->free(dev[i]);
    memset(x, 0, sizeof *x);
}

size_t exchange_rows_worst(const Exchange *x) { return (size_t)x->ETP * x->EP * x->rows_max; }
size_t exchange_rows_typical(const Exchange *x) { return (size_t)x->ETP * x->rows_max; }

// The dispatched rows' values: the backend's hidden format (ops.h Backend.hid), sent as CT_BF16 or CT_F32.
static size_t hid_bytes(const Exchange *x) { return hid_size(x->be); }
static CommType hid_type(const Exchange *x) { return x->be->hid == FMT_BF16 ? CT_BF16 : CT_F32; }

// Room for Rg expert-side rows (the permutation both ways, host and device, and the gathered staging)
// and R received ones; grown by a2a_rows, `regrown` set where a buffer that held rows grows again.
static void row_room(Exchange *x) {
    const Backend *be = x->be;
    size_t d = (size_t)x->d;
    if ((size_t)x->Rg > x->cap_Rg || !x->perm) {
        x->regrown |= x->cap_Rg > 0;
        x->cap_Rg = a2a_rows((size_t)x->Rg, x->cap_Rg, exchange_rows_typical(x), exchange_rows_worst(x));
        free(x->perm_h);
        x->perm_h = xmalloc(sizeof(int32_t) * 2 * x->cap_Rg);
        x->iperm_h = x->perm_h + x->cap_Rg;
        void **dev[] = {(void **)&x->perm, (void **)&x->iperm, &x->raw};
        size_t bytes[] = {sizeof(int32_t) * x->cap_Rg, sizeof(int32_t) * x->cap_Rg, F * x->cap_Rg * d};
        for (int i = 0; i < 3; i++) {
            if (*dev[i]) be->free(*dev[i]);
            *dev[i] = be->alloc(bytes[i]);
        }
    }
    if ((size_t)x->R > x->cap_R || !x->raw_ep) {
        x->regrown |= x->cap_R > 0;
        x->cap_R = a2a_rows((size_t)x->R, x->cap_R, (size_t)x->rows_max, (size_t)x->EP * x->rows_max);
        if (x->raw_ep) be->free(x->raw_ep);
        x->raw_ep = be->alloc(F * x->cap_R * d);
    }
}

// The expert-major order of the Rg gathered rows: gathered layout [p][q][le]; expert-major layout
// [le][p][q]. perm_h[i]: the gathered row of expert-major row i; iperm_h: the inverse.
static void expert_major(Exchange *x) {
    int EP = x->EP, ETP = x->ETP, El = x->El;
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
                    x->iperm_h[start + i] = (int32_t)pos;
                    pos++;
                }
                for (int e2 = 0; e2 < El; e2++) base += c[e2];
            }
        }
    }
    x->off[El] = pos;
}

int exchange_local(Exchange *x) {
    x->local = x->EP == 1 && x->ETP == 1 && !comm_dev_due(x->ep) && !comm_dev_due(x->etp);
    return x->local;
}

void exchange_plan(Exchange *x, const int64_t *kept) {
    int EP = x->EP, ETP = x->ETP, El = x->El;
    exchange_local(x);
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
    // what I send to each EP peer: the rows of its experts (contiguous: rows are expert-sorted);
    // peer q owns experts [q*El, (q+1)*El)
    x->M = 0;
    for (int q = 0; q < EP; q++) {
        x->sd[q] = x->M;
        x->sc[q] = 0;
        for (int le = 0; le < El; le++) x->sc[q] += kept[q * El + le];
        x->M += (int)x->sc[q];
    }
    comm_alltoallv(x->ep, kept, x->one, x->disp, x->rcnt, x->one, x->disp, CT_I64);
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
    row_room(x);
    expert_major(x);
    x->be->to_device(x->perm, x->perm_h, sizeof(int32_t) * x->Rg);
    x->be->to_device(x->iperm, x->iperm_h, sizeof(int32_t) * x->Rg);
    A2aCounts c = {x->sc, x->sd, x->rc, x->rd};
    x->regrown |= x->tr->plan(x->a2a, &c);
}

void exchange_dispatch_start(Exchange *x, const void *rows, int fp8) {
    if (x->local) return;
    x->fp8 = fp8;
    // rows are backend buffers: the comm API's device variants (NCCL on GPUs); groups of one are
    // a backend copy (unless a test forces the NCCL path: comm_dev_due)
    if (!fp8) {
        x->tr->start(x->a2a, A2A_DISPATCH, rows, x->raw_ep, hid_type(x), (size_t)x->d);
        return;
    }
    // FP8 rows: packed here, received into raw (Rg >= R rows of d float32 each: room for R packed rows),
    // unpacked by _finish into raw_ep, where the hidden format's rows would have arrived
    const Backend *be = x->be;
    CHECK(be->fp8_rows_pack && be->fp8_rows_unpack,
          "exchange: FP8 rows on backend %s, which cannot pack them", be->name);
    size_t rb = fp8_row_bytes(x->d);
    if (!x->pk) x->pk = be->alloc(rb * (size_t)x->rows_max);
    be->fp8_rows_pack(x->pk, rows, x->M, x->d);
    x->tr->start(x->a2a, A2A_DISPATCH, x->pk, x->raw, CT_U8, rb);
}

const void *exchange_dispatch_finish(Exchange *x, const void *rows, void *out) {
    if (x->local) return rows;
    x->tr->finish(x->a2a, A2A_DISPATCH);
    if (x->fp8) x->be->fp8_rows_unpack(x->raw_ep, x->raw, x->R, x->d);
    x->fp8 = 0;
    int ETP = x->ETP;
    size_t d = x->d;
    if (comm_dev_due(x->etp)) {
        a2a_scale(x->gc, x->cnt, ETP, d);
        a2a_scale(x->gd, x->cnt + ETP, ETP, d);
        comm_dev_allgatherv(x->etp, x->raw_ep, (size_t)x->R * d, x->raw, x->cnt, x->cnt + ETP, hid_type(x));
    } else {
        x->be->copy(x->raw, x->raw_ep, hid_bytes(x) * (size_t)x->R * d);
    }
    x->be->gather_rows_hid(out, x->raw, 1, x->perm, x->Rg, x->d);
    return out;
}

const void *exchange_dispatch(Exchange *x, const void *rows, void *out, int fp8) {
    exchange_dispatch_start(x, rows, fp8);
    return exchange_dispatch_finish(x, rows, out);
}

void exchange_combine_start(Exchange *x, const float *partial, float *rows) {
    if (x->local) return;
    size_t d = x->d;
    x->be->gather_rows((float *)x->raw, partial, x->iperm, x->Rg, x->d);
    if (comm_dev_due(x->etp)) {
        a2a_scale(x->gc, x->cnt, x->ETP, d);
        comm_dev_reduce_scatter(x->etp, x->raw, x->raw_ep, x->cnt, CT_F32);
    } else {
        x->be->copy(x->raw_ep, x->raw, F * (size_t)x->R * d);
    }
    x->tr->start(x->a2a, A2A_COMBINE, x->raw_ep, rows, CT_F32, (size_t)x->d);
}

const float *exchange_combine_finish(Exchange *x, const float *partial, float *rows) {
    if (x->local) return partial;
    x->tr->finish(x->a2a, A2A_COMBINE);
    return rows;
}

const float *exchange_combine(Exchange *x, const float *partial, float *rows) {
    exchange_combine_start(x, partial, rows);
    return exchange_combine_finish(x, partial, rows);
}
