// exchange.c — token rows to their experts and back (see exchange.h).
#include "moe/exchange.h"
#include <string.h>
#include "core/common.h"

#define F sizeof(float)

void exchange_init(Exchange *x, const Backend *be, const Comm *ep, const Comm *etp, const Comm *epn,
                   const Comm *epx, int El, int d) {
    memset(x, 0, sizeof *x);
    x->be = be;
    x->ep = ep;
    x->etp = etp;
    if (epn && epx && comm_size(epn) > 1 && comm_size(epx) >= 1) {
        x->epn = epn;
        x->epx = epx;
    }
    x->EP = comm_size(ep);
    x->ETP = comm_size(etp);
    x->El = El;
    x->d = d;
    x->sc = xcalloc(x->EP, sizeof(size_t));
    x->sd = xcalloc(x->EP, sizeof(size_t));
    x->rc = xcalloc(x->EP, sizeof(size_t));
    x->rd = xcalloc(x->EP, sizeof(size_t));
    x->rcnt = xcalloc((size_t)x->EP * El, sizeof(int64_t));
    x->gcnt = xcalloc((size_t)x->ETP * x->EP * El, sizeof(int64_t));
    x->gc = xcalloc(x->ETP, sizeof(size_t));
    x->gd = xcalloc(x->ETP, sizeof(size_t));
    x->off = xcalloc(El + 1, sizeof(int64_t));
}

void exchange_free(Exchange *x) {
    free(x->sc);
    free(x->sd);
    free(x->rc);
    free(x->rd);
    free(x->rcnt);
    free(x->gcnt);
    free(x->gc);
    free(x->gd);
    free(x->off);
    free(x->perm_h);
    for (int k = 0; k < 2; k++) {
        free(x->hp[k].c1);
        free(x->hp[k].pre);
    }
    void *hs[] = {x->h_s1, x->h_r1, x->h_s2};
    for (int i = 0; i < 3; i++)
        if (hs[i]) x->be->free(hs[i]);
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

// The dispatched rows' values: the backend's hidden format (ops.h hid_elem), sent as CT_BF16 or CT_F32.
static size_t hid_bytes(const Exchange *x) { return x->be->hid_elem; }
static CommType hid_type(const Exchange *x) { return x->be->hid_elem == 2 ? CT_BF16 : CT_F32; }

static void scale_counts(const size_t *c, size_t *out, int n, size_t by) {
    for (int i = 0; i < n; i++) out[i] = c[i] * by;
}

// The two-level plan of one direction: S[q] rows of mine go to EP rank q from row SD[q]; R[q] rows
// come from q to row RD[q]; CN[i][q] = what my node's local rank i sends to q (S all-gathered over epn).
static void hier_plan(HierPlan *h, int n, int G, int me, const size_t *S, const size_t *SD, const size_t *R,
                      const size_t *RD, const int64_t *CN) {
    int A = n / G, loc = me % G;
    free(h->c1);
    free(h->pre);
    h->c1 = xcalloc((size_t)(4 * G + 4 * A), sizeof(size_t));
    h->d1 = h->c1 + G;
    h->r1 = h->d1 + G;
    h->e1 = h->r1 + G;
    h->c2 = h->e1 + G;
    h->d2 = h->c2 + A;
    h->r2 = h->d2 + A;
    h->e2 = h->r2 + A;
    h->pre = xmalloc(sizeof(int64_t) * 3 * (size_t)n * 2);
    h->mid = h->pre + 3 * (size_t)n;
    h->npre = h->nmid = 0;
    size_t pos = 0;
    for (int j = 0; j < G; j++) { // phase 1: to local rank j, what goes to (b, j) for every node b
        h->d1[j] = pos;
        for (int b = 0; b < A; b++) {
            int q = b * G + j;
            int64_t *t = h->pre + 3 * h->npre++;
            t[0] = (int64_t)SD[q];
            t[1] = (int64_t)pos;
            t[2] = (int64_t)S[q];
            pos += S[q];
        }
        h->c1[j] = pos - h->d1[j];
    }
    h->rows1s = pos;
    pos = 0;
    for (int i = 0; i < G; i++) { // from local rank i: its blocks for (b, loc), node by node
        h->e1[i] = pos;
        for (int b = 0; b < A; b++) pos += (size_t)CN[(size_t)i * n + b * G + loc];
        h->r1[i] = pos - h->e1[i];
    }
    h->rows1r = pos;
    pos = 0;
    for (int B = 0; B < A; B++) { // phase 2: to node B (its rank of my local index), from each local i
        h->d2[B] = pos;
        for (int i = 0; i < G; i++) {
            size_t src = h->e1[i];
            for (int b = 0; b < B; b++) src += (size_t)CN[(size_t)i * n + b * G + loc];
            int64_t *t = h->mid + 3 * h->nmid++;
            t[0] = (int64_t)src;
            t[1] = (int64_t)pos;
            t[2] = CN[(size_t)i * n + B * G + loc];
            pos += (size_t)t[2];
        }
        h->c2[B] = pos - h->d2[B];
    }
    h->rows2s = pos;
    for (int a = 0; a < A; a++) { // from node a: its local ranks' rows for me, in source-rank order
        h->r2[a] = 0;
        for (int i = 0; i < G; i++) h->r2[a] += R[a * G + i];
        h->e2[a] = RD[a * G];
    }
}

// Both directions' plans (counts all-gathered within the node), and the staging they need.
static void hier_plans(Exchange *x) {
    int n = x->EP, G = comm_size(x->epn), me = comm_rank(x->ep);
    int64_t *mine = xmalloc(sizeof(int64_t) * n * 2), *cn = xmalloc(sizeof(int64_t) * (size_t)n * G * 2);
    for (int q = 0; q < n; q++) {
        mine[q] = (int64_t)x->sc[q];
        mine[n + q] = (int64_t)x->rc[q];
    }
    comm_allgather(x->epn, mine, cn, (size_t)n * 2, CT_I64);
    int64_t *cs = xmalloc(sizeof(int64_t) * (size_t)n * G * 2), *cr = cs + (size_t)n * G;
    for (int i = 0; i < G; i++)
        for (int q = 0; q < n; q++) {
            cs[(size_t)i * n + q] = cn[(size_t)i * 2 * n + q];
            cr[(size_t)i * n + q] = cn[(size_t)i * 2 * n + n + q];
        }
    hier_plan(&x->hp[0], n, G, me, x->sc, x->sd, x->rc, x->rd, cs);
    hier_plan(&x->hp[1], n, G, me, x->rc, x->rd, x->sc, x->sd, cr);
    size_t need = 0;
    for (int k = 0; k < 2; k++) {
        size_t m = x->hp[k].rows1s > x->hp[k].rows1r ? x->hp[k].rows1s : x->hp[k].rows1r;
        if (x->hp[k].rows2s > m) m = x->hp[k].rows2s;
        if (m > need) need = m;
    }
    need = (need ? need : 1) * x->d * sizeof(float);
    if (need > x->cap_h) {
        void **hs[] = {&x->h_s1, &x->h_r1, &x->h_s2};
        for (int i = 0; i < 3; i++) {
            if (*hs[i]) x->be->free(*hs[i]);
            *hs[i] = x->be->alloc(need);
        }
        x->cap_h = need;
    }
    free(mine);
    free(cn);
    free(cs);
}

// The two-level all-to-all of direction k (0: dispatch, rows in the hidden format; 1: combine, float32):
// send -> recv, as the flat one.
static void hier_a2a(Exchange *x, int k, const void *send, void *recv) {
    const HierPlan *h = &x->hp[k];
    const Backend *be = x->be;
    size_t d = x->d, G = (size_t)comm_size(x->epn), A = (size_t)comm_size(x->epx);
    size_t row = d * (k ? F : hid_bytes(x));
    CommType ct = k ? CT_F32 : hid_type(x);
    for (int i = 0; i < h->npre; i++) {
        const int64_t *t = h->pre + 3 * i;
        if (t[2]) be->copy((char *)x->h_s1 + t[1] * row, (const char *)send + t[0] * row, row * t[2]);
    }
    size_t *a = xmalloc(sizeof(size_t) * 4 * (G > A ? G : A));
    scale_counts(h->c1, a, (int)G, d);
    scale_counts(h->d1, a + G, (int)G, d);
    scale_counts(h->r1, a + 2 * G, (int)G, d);
    scale_counts(h->e1, a + 3 * G, (int)G, d);
    comm_dev_alltoallv(x->epn, x->h_s1, a, a + G, x->h_r1, a + 2 * G, a + 3 * G, ct);
    for (int i = 0; i < h->nmid; i++) {
        const int64_t *t = h->mid + 3 * i;
        if (t[2]) be->copy((char *)x->h_s2 + t[1] * row, (const char *)x->h_r1 + t[0] * row, row * t[2]);
    }
    scale_counts(h->c2, a, (int)A, d);
    scale_counts(h->d2, a + A, (int)A, d);
    scale_counts(h->r2, a + 2 * A, (int)A, d);
    scale_counts(h->e2, a + 3 * A, (int)A, d);
    comm_dev_alltoallv(x->epx, x->h_s2, a, a + A, recv, a + 2 * A, a + 3 * A, ct);
    free(a);
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
    int64_t *sendcnt = (int64_t *)kept; // (EP*El), peer q owns experts [q*El, (q+1)*El)
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
    free(one);
    free(disp);
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
    if (x->epn) hier_plans(x);
    grow(x->be, (void **)&x->raw_ep, &x->cap_R, F * (size_t)(x->R ? x->R : 1) * x->d);
    grow(x->be, (void **)&x->raw, &x->cap_Rg, F * (size_t)(x->Rg ? x->Rg : 1) * x->d);
}


// The counts of my rows as element counts (x d) into a, b, c, e: send counts, send displacements,
// receive counts, receive displacements of the EP all-to-all (forward direction; swapped back).
static void ep_counts(const Exchange *x, int back, size_t *a, size_t *b, size_t *c, size_t *e) {
    size_t d = x->d;
    scale_counts(back ? x->rc : x->sc, a, x->EP, d);
    scale_counts(back ? x->rd : x->sd, b, x->EP, d);
    scale_counts(back ? x->sc : x->rc, c, x->EP, d);
    scale_counts(back ? x->sd : x->rd, e, x->EP, d);
}

void exchange_dispatch_start(Exchange *x, const void *rows) {
    if (x->local) return;
    // rows are backend buffers: the comm API's device variants (NCCL on GPUs); groups of one are
    // a backend copy (unless a test forces the NCCL path: comm_dev_due)
    if (x->epn) {
        hier_a2a(x, 0, rows, x->raw_ep);
    } else if (comm_dev_due(x->ep)) {
        size_t *a = xmalloc(sizeof(size_t) * x->EP * 4);
        ep_counts(x, 0, a, a + x->EP, a + 2 * x->EP, a + 3 * x->EP);
        x->req = comm_dev_ialltoallv(x->ep, rows, a, a + x->EP, x->raw_ep, a + 2 * x->EP, a + 3 * x->EP,
                                     hid_type(x));
        free(a);
    } else {
        x->be->copy(x->raw_ep, rows, hid_bytes(x) * (size_t)x->M * x->d);
    }
}

const void *exchange_dispatch_finish(Exchange *x, const void *rows, void *out) {
    if (x->local) return rows;
    if (x->req) {
        comm_wait(x->req);
        x->req = NULL;
    }
    int ETP = x->ETP;
    size_t d = x->d;
    if (comm_dev_due(x->etp)) {
        size_t *a = xmalloc(sizeof(size_t) * ETP * 2);
        scale_counts(x->gc, a, ETP, d);
        scale_counts(x->gd, a + ETP, ETP, d);
        comm_dev_allgatherv(x->etp, x->raw_ep, (size_t)x->R * d, x->raw, a, a + ETP, hid_type(x));
        free(a);
    } else {
        x->be->copy(x->raw, x->raw_ep, hid_bytes(x) * (size_t)x->R * d);
    }
    x->be->gather_rows_hid(out, x->raw, 1, x->perm, x->Rg, x->d);
    return out;
}

const void *exchange_dispatch(Exchange *x, const void *rows, void *out) {
    exchange_dispatch_start(x, rows);
    return exchange_dispatch_finish(x, rows, out);
}

void exchange_combine_start(Exchange *x, const float *partial, float *rows) {
    if (x->local) return;
    int ETP = x->ETP;
    size_t d = x->d;
    x->be->gather_rows((float *)x->raw, partial, x->iperm, x->Rg, x->d);
    if (comm_dev_due(x->etp)) {
        size_t *a = xmalloc(sizeof(size_t) * ETP);
        scale_counts(x->gc, a, ETP, d);
        comm_dev_reduce_scatter(x->etp, x->raw, x->raw_ep, a, CT_F32);
        free(a);
    } else {
        x->be->copy(x->raw_ep, x->raw, sizeof(float) * (size_t)x->R * d);
    }
    if (x->epn) {
        hier_a2a(x, 1, x->raw_ep, rows);
    } else if (comm_dev_due(x->ep)) {
        size_t *a = xmalloc(sizeof(size_t) * x->EP * 4);
        ep_counts(x, 1, a, a + x->EP, a + 2 * x->EP, a + 3 * x->EP);
        x->req =
            comm_dev_ialltoallv(x->ep, x->raw_ep, a, a + x->EP, rows, a + 2 * x->EP, a + 3 * x->EP, CT_F32);
        free(a);
    } else {
        x->be->copy(rows, x->raw_ep, sizeof(float) * (size_t)x->M * d);
    }
}

const float *exchange_combine_finish(Exchange *x, const float *partial, float *rows) {
    if (x->local) return partial;
    if (x->req) {
        comm_wait(x->req);
        x->req = NULL;
    }
    return rows;
}

const float *exchange_combine(Exchange *x, const float *partial, float *rows) {
    exchange_combine_start(x, partial, rows);
    return exchange_combine_finish(x, partial, rows);
}
