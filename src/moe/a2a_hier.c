// a2a_hier.c — the two-level transport of the MoE exchange (moe/a2a.h; Tutel's 2D hierarchical
// all-to-all): the EP ranks form nodes of G = size(epn) consecutive ranks; a rank first sends, within its
// node, to local rank j everything bound for local index j on any node (blocks reordered node-major: the
// "transpose"), then the ranks of equal local index exchange between nodes (epx, A = EP / G nodes). The
// same bytes arrive in the same places as the flat all-to-all, so results are bitwise equal. Blocking:
// start moves everything (the pipelined exchange then overlaps nothing across it).
// Must not hold: the flat all-to-all (a2a_flat.c), the counts' computation (exchange.c).
#include <string.h>
#include "core/common.h"
#include "moe/a2a.h"

// One direction, in rows: the block copies before phase 1 (my rows into node-local order) and between the
// phases (into node order), and both phases' counts/displacements.
typedef struct {
    size_t *c1, *d1, *r1, *e1; // (G) phase 1 within the node (epn)
    size_t *c2, *d2, *r2, *e2; // (A) phase 2 between nodes (epx)
    int64_t *pre, *mid; // (src row, dst row, rows) triples: npre, nmid of them (n each at most)
    int npre, nmid;
    size_t rows1s, rows1r, rows2s; // staging rows
} HierPlan;

struct A2a {
    const Backend *be;
    const Comm *ep, *epn, *epx;
    int n, G, A, me;
    size_t d, rows_max;
    HierPlan hp[2]; // dispatch [0], combine [1]
    int64_t *mine, *cn, *cs, *cr; // (2n), (2nG), (nG), (nG): the node's counts
    size_t *a; // (4 max(G, A)) element counts of one phase
    void *s1, *r1, *s2; // staging (device), `rows` rows of d float32 each
    size_t rows;
};

static void plan_alloc(HierPlan *h, int n, int G, int A) {
    h->c1 = xcalloc((size_t)(4 * G + 4 * A), sizeof(size_t));
    h->d1 = h->c1 + G;
    h->r1 = h->d1 + G;
    h->e1 = h->r1 + G;
    h->c2 = h->e1 + G;
    h->d2 = h->c2 + A;
    h->r2 = h->d2 + A;
    h->e2 = h->r2 + A;
    h->pre = xcalloc(3 * (size_t)n * 2, sizeof(int64_t));
    h->mid = h->pre + 3 * (size_t)n;
}

static A2a *hier_init(const Backend *be, const Comm *ep, const Comm *epn, const Comm *epx, int d,
                      size_t rows_max) {
    A2a *t = xcalloc(1, sizeof *t);
    t->be = be;
    t->ep = ep;
    t->epn = epn;
    t->epx = epx;
    t->n = comm_size(ep);
    t->G = comm_size(epn);
    t->A = comm_size(epx);
    t->me = comm_rank(ep);
    t->d = (size_t)d;
    t->rows_max = rows_max;
    for (int k = 0; k < 2; k++) plan_alloc(&t->hp[k], t->n, t->G, t->A);
    size_t n = (size_t)t->n, G = (size_t)t->G;
    t->mine = xcalloc(2 * n + 4 * n * G, sizeof(int64_t));
    t->cn = t->mine + 2 * n;
    t->cs = t->cn + 2 * n * G;
    t->cr = t->cs + n * G;
    t->a = xcalloc(4 * (size_t)(t->G > t->A ? t->G : t->A), sizeof(size_t));
    return t;
}

// The plan of one direction: S[q] rows of mine go to EP rank q from row SD[q]; R[q] rows come from q to
// row RD[q]; CN[i][q] = what my node's local rank i sends to q (S all-gathered over epn).
static void hier_plan(HierPlan *h, int n, int G, int me, const size_t *S, const size_t *SD, const size_t *R,
                      const size_t *RD, const int64_t *CN) {
    int A = n / G, loc = me % G;
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
static int hier_plans(A2a *t, const A2aCounts *c) {
    int n = t->n, G = t->G;
    for (int q = 0; q < n; q++) {
        t->mine[q] = (int64_t)c->sc[q];
        t->mine[n + q] = (int64_t)c->rc[q];
    }
    comm_allgather(t->epn, t->mine, t->cn, (size_t)n * 2, CT_I64);
    for (int i = 0; i < G; i++)
        for (int q = 0; q < n; q++) {
            t->cs[(size_t)i * n + q] = t->cn[(size_t)i * 2 * n + q];
            t->cr[(size_t)i * n + q] = t->cn[(size_t)i * 2 * n + n + q];
        }
    hier_plan(&t->hp[0], n, G, t->me, c->sc, c->sd, c->rc, c->rd, t->cs);
    hier_plan(&t->hp[1], n, G, t->me, c->rc, c->rd, c->sc, c->sd, t->cr);
    size_t need = 0;
    for (int k = 0; k < 2; k++) {
        size_t m = t->hp[k].rows1s > t->hp[k].rows1r ? t->hp[k].rows1s : t->hp[k].rows1r;
        if (t->hp[k].rows2s > m) m = t->hp[k].rows2s;
        if (m > need) need = m;
    }
    if (need <= t->rows && t->s1) return 0;
    int again = t->rows > 0;
    t->rows = a2a_rows(need, t->rows, t->rows_max, (size_t)n * t->rows_max);
    void **hs[] = {&t->s1, &t->r1, &t->s2};
    for (int i = 0; i < 3; i++) {
        if (*hs[i]) t->be->free(*hs[i]);
        *hs[i] = t->be->alloc(t->rows * t->d * sizeof(float));
    }
    return again;
}

// Direction k: send -> recv, as the flat all-to-all-v.
static void hier_start(A2a *t, int k, const void *send, void *recv, CommType ct, size_t w) {
    const HierPlan *h = &t->hp[k];
    const Backend *be = t->be;
    size_t G = (size_t)t->G, A = (size_t)t->A, row = w * comm_type_size(ct), *a = t->a;
    CHECK(row <= t->d * sizeof(float), "a2a_hier: rows of %zu bytes, staging for %zu", row,
          t->d * sizeof(float));
    for (int i = 0; i < h->npre; i++) {
        const int64_t *q = h->pre + 3 * i;
        if (q[2]) be->copy((char *)t->s1 + q[1] * row, (const char *)send + q[0] * row, row * q[2]);
    }
    a2a_scale(h->c1, a, (int)G, w);
    a2a_scale(h->d1, a + G, (int)G, w);
    a2a_scale(h->r1, a + 2 * G, (int)G, w);
    a2a_scale(h->e1, a + 3 * G, (int)G, w);
    comm_dev_alltoallv(t->epn, t->s1, a, a + G, t->r1, a + 2 * G, a + 3 * G, ct);
    for (int i = 0; i < h->nmid; i++) {
        const int64_t *q = h->mid + 3 * i;
        if (q[2]) be->copy((char *)t->s2 + q[1] * row, (const char *)t->r1 + q[0] * row, row * q[2]);
    }
    a2a_scale(h->c2, a, (int)A, w);
    a2a_scale(h->d2, a + A, (int)A, w);
    a2a_scale(h->r2, a + 2 * A, (int)A, w);
    a2a_scale(h->e2, a + 3 * A, (int)A, w);
    comm_dev_alltoallv(t->epx, t->s2, a, a + A, recv, a + 2 * A, a + 3 * A, ct);
}

static void hier_finish(A2a *t, int k) {}

static void hier_free(A2a *t) {
    for (int k = 0; k < 2; k++) {
        free(t->hp[k].c1);
        free(t->hp[k].pre);
    }
    free(t->mine);
    free(t->a);
    void *hs[] = {t->s1, t->r1, t->s2};
    for (int i = 0; i < 3; i++)
        if (hs[i]) t->be->free(hs[i]);
    free(t);
}

const A2aTransport a2a_hier = {hier_init, hier_plans, hier_start, hier_finish, hier_free};
