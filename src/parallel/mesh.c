// mesh.c — mesh shape validation, rank coordinates, group construction and printing.
#include "parallel/mesh.h"
#include <string.h>
#include "core/common.h"

const char *mesh_shape_resolve(MeshShape *s, const ModelConfig *c) {
    static char msg[256];
#define BAD(...) \
    do { \
        snprintf(msg, sizeof msg, __VA_ARGS__); \
        return msg; \
    } while (0)
    if (s->world < 1) BAD("world size must be >= 1 (got %d)", s->world);
    if (s->tp < 1) BAD("--tp must be >= 1 (got %d)", s->tp);
    if (s->pp < 1) BAD("--pp must be >= 1 (got %d)", s->pp);
    if (s->ep < 1) BAD("--ep must be >= 1 (got %d)", s->ep);
    if (s->etp < 1) BAD("--etp must be >= 1 (got %d)", s->etp);
    // products in 64 bits: a factor up to INT_MAX must not wrap (to 0: a division by zero)
    long long tpp = (long long)s->tp * s->pp, eetp = (long long)s->ep * s->etp;
    if (s->world % tpp) BAD("world size %d is not divisible by tp %d x pp %d", s->world, s->tp, s->pp);
    s->dp = (int)(s->world / tpp);
    int stage = s->tp * s->dp;
    if (stage % eetp)
        BAD("tp %d x dp %d = %d ranks per stage is not divisible by ep %d x etp %d", s->tp, s->dp, stage,
            s->ep, s->etp);
    s->edp = (int)(stage / eetp);
    if (s->hier < 0) BAD("--a2a-hier must be off, auto or >= 1 (got %d)", s->hier);
    if (s->hier > 1 && s->ep % s->hier)
        BAD("--a2a-hier %d: the ep %d ranks do not split into nodes of %d ranks", s->hier, s->ep, s->hier);
    if (c) {
        if (c->n_experts % s->ep) BAD("n_experts %d is not divisible by ep %d", c->n_experts, s->ep);
        if (c->n_heads % s->tp) BAD("n_heads %d is not divisible by tp %d", c->n_heads, s->tp);
        if (c->n_kv_heads % s->tp) BAD("n_kv_heads %d is not divisible by tp %d", c->n_kv_heads, s->tp);
        if (c->d_ff % s->etp) BAD("d_ff %d is not divisible by etp %d", c->d_ff, s->etp);
    }
#undef BAD
    return NULL;
}

MeshCoord mesh_coord(const MeshShape *s, int r) {
    MeshCoord m;
    m.tp = r % s->tp;
    m.dp = (r / s->tp) % s->dp;
    m.pp = r / (s->tp * s->dp);
    m.stage = r % (s->tp * s->dp);
    m.etp = m.stage % s->etp;
    m.ep = (m.stage / s->etp) % s->ep;
    m.edp = m.stage / (s->etp * s->ep);
    return m;
}

// color/key of rank r for each group kind
enum { G_TP, G_DP, G_PP, G_EP, G_ETP, G_EDP, G_STAGE, G_EPN, G_EPX, G_N };
static const char *gname[G_N] = {"tp", "dp", "pp", "ep", "etp", "edp", "stage", "epn", "epx"};
// The two-level all-to-all's groups exist only with hier > 1.
static int group_used(const MeshShape *s, int g) { return (g != G_EPN && g != G_EPX) || s->hier > 1; }
static void group_of(const MeshShape *s, int r, int g, int *color, int *key) {
    MeshCoord m = mesh_coord(s, r);
    int S = s->tp * s->dp;
    switch (g) {
        case G_TP:
            *color = m.pp * s->dp + m.dp;
            *key = m.tp;
            break;
        case G_DP:
            *color = m.pp * s->tp + m.tp;
            *key = m.dp;
            break;
        case G_PP:
            *color = m.stage;
            *key = m.pp;
            break;
        case G_EP:
            *color = m.pp * S + m.edp * s->etp + m.etp;
            *key = m.ep;
            break;
        case G_ETP:
            *color = m.pp * S + m.edp * s->ep + m.ep;
            *key = m.etp;
            break;
        case G_EDP:
            *color = m.pp * S + m.ep * s->etp + m.etp;
            *key = m.edp;
            break;
        case G_EPN:
            *color = (m.pp * S + m.edp * s->etp + m.etp) * s->ep + m.ep / s->hier;
            *key = m.ep % s->hier;
            break;
        case G_EPX:
            *color = (m.pp * S + m.edp * s->etp + m.etp) * s->ep + m.ep % s->hier;
            *key = m.ep / s->hier;
            break;
        default:
            *color = m.pp;
            *key = m.stage;
            break;
    }
}

void mesh_init(Mesh *m, const MeshShape *s, Comm *world) {
    memset(m, 0, sizeof *m);
    CHECK(comm_size(world) == s->world, "mesh for %d ranks, but %d processes were launched", s->world,
          comm_size(world));
    m->s = *s;
    m->rank = comm_rank(world);
    m->me = mesh_coord(s, m->rank);
    m->world = world;
    Comm **slots[G_N] = {&m->tp, &m->dp, &m->pp, &m->ep, &m->etp, &m->edp, &m->stage, &m->epn, &m->epx};
    for (int g = 0; g < G_N; g++) {
        if (!group_used(s, g)) continue;
        int color, key;
        group_of(s, m->rank, g, &color, &key);
        *slots[g] = comm_split(world, color, key, gname[g]);
    }
}

void mesh_enable_device(Mesh *m, MeshDev how, int on_gpu) {
    CHECK(on_gpu || how != MESH_DEV_NCCL, "the NCCL transport needs GPU buffers");
    if (how == MESH_DEV_NCCL) comm_dev_enable_world(m->world);
    else if (how == MESH_DEV_STAGED || how == MESH_DEV_IPC) comm_dev_enable_staged(m->world, on_gpu);
    else comm_dev_enable_direct(m->world, on_gpu);
    Comm **slots[G_N] = {&m->tp, &m->dp, &m->pp, &m->ep, &m->etp, &m->edp, &m->stage, &m->epn, &m->epx};
    for (int g = 0; g < G_N; g++) { // the same order on every rank (ncclCommSplit is collective)
        if (!group_used(&m->s, g)) continue;
        if (how == MESH_DEV_DIRECT) comm_dev_enable_direct(*slots[g], on_gpu);
        else if (how == MESH_DEV_IPC && g != G_PP) comm_dev_enable_ipc(*slots[g], on_gpu);
        else if (how == MESH_DEV_STAGED || g == G_PP) comm_dev_enable_staged(*slots[g], on_gpu);
        else {
            int color, key;
            group_of(&m->s, m->rank, g, &color, &key);
            comm_dev_enable_split(m->world, *slots[g], color, key);
        }
    }
}

void mesh_free(Mesh *m) {
    Comm *cs[] = {m->tp, m->dp, m->pp, m->ep, m->etp, m->edp, m->stage, m->epn, m->epx};
    for (size_t i = 0; i < sizeof cs / sizeof cs[0]; i++)
        if (cs[i]) comm_free(cs[i]);
    if (m->world) comm_dev_disable(m->world); // nothing without a device communicator
    memset(m, 0, sizeof *m);
}

void mesh_print(const MeshShape *s, FILE *f) {
    fprintf(f, "mesh: world %d = pp %d x dp %d x tp %d; experts: ep %d x etp %d x edp %d per stage\n",
            s->world, s->pp, s->dp, s->tp, s->ep, s->etp, s->edp);
    for (int g = 0; g < G_N; g++) {
        if ((g == G_PP && s->pp == 1) || !group_used(s, g)) continue;
        fprintf(f, "  %-5s:", gname[g]);
        int *seen = xcalloc(s->world, sizeof(int));
        int shown = 0;
        for (int r = 0; r < s->world && shown < 16; r++) {
            if (seen[r]) continue;
            int color, key;
            group_of(s, r, g, &color, &key);
            fprintf(f, " {");
            int first = 1;
            for (int q = 0; q < s->world; q++) {
                int c2, k2;
                group_of(s, q, g, &c2, &k2);
                if (c2 != color) continue;
                seen[q] = 1;
                fprintf(f, first ? "%d" : ",%d", q);
                first = 0;
            }
            fprintf(f, "}");
            shown++;
        }
        if (shown == 16) fprintf(f, " ...");
        fprintf(f, "\n");
        free(seen);
    }
    const char *what[G_N] = {s->vocab ? "attention heads and the vocabulary (--vocab-parallel) split; "
                                        "activations all-reduced"
                                      : "attention heads split; activations all-reduced",
                             "dense gradients all-reduced (each DP rank reads its share of the batch)",
                             "pipeline stages",
                             "experts split: tokens exchanged by all-to-all",
                             "each expert's f dimension split",
                             "expert gradients all-reduced (replicas)",
                             "router statistics and router gradients",
                             "two-level all-to-all: the EP ranks of one node (gather and transpose)",
                             "two-level all-to-all: one EP rank per node (between nodes)"};
    for (int g = 0; g < G_N; g++)
        if (g != G_PP && group_used(s, g)) fprintf(f, "  %-5s = %s\n", gname[g], what[g]);
}
