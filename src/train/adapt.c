// adapt.c — the MoE exchange's run-time choices (see adapt.h).
#include "train/adapt.h"
#include <string.h>
#include <unistd.h>
#include "core/common.h"

// A tuner candidate: r + 16 x expert mode + 256 x AMPipe chunks (only when > 1).
static int cand_r(int c) { return c % 16; }
static int cand_mode(int c) { return c / 16 % 16; }
static int cand_n(int c) { return c >= 256 ? c / 256 : 1; }
// The most candidates adapt_init lists: AMPipe's 3 chunk counts x (the gathered mode + r = 1, 2, 4, 8).
enum { ADAPT_CANDS = 3 * (1 + 4) };
_Static_assert(ADAPT_CANDS <= TUNE_MAX, "a tuner must hold every candidate of the adaptive exchange");

void adapt_init(Adapt *a, const TrainOptions *o, const MeshShape *shape, int meshed, Model *m) {
    memset(a, 0, sizeof *a);
    for (int l = 0; l < m->c.n_layers; l++) {
        if (o->a2a_overlap > 0) model_set_overlap(m, l, o->a2a_overlap);
        if (o->expert_mode > 0) model_set_expert_mode(m, l, MOE_GATHERED);
        if (o->ampipe > 0) model_set_ampipe(m, l, o->ampipe);
    }
    // auto: measure, per layer, r = 1, 2, 4, 8 where there is an exchange to overlap (sharded; the
    // gathered mode runs unchunked), the gathered mode where the experts are sliced (ETP > 1), and
    // AMPipe's n = 1, 2, 4 where there is an exchange for the attention to hide (with each r)
    int exch = meshed && (shape->ep > 1 || shape->etp > 1 || comm_nccl_forced());
    int ns[3] = {o->ampipe > 0 ? o->ampipe : 1, 2, 4}, nn = o->ampipe == 0 && exch ? 3 : 1;
    if (o->a2a_overlap == 0 || o->expert_mode < 0 || nn > 1) {
        int cand[ADAPT_CANDS], n = 0;
        int modes = o->expert_mode < 0 && shape->etp > 1 ? 2 : 1,
            mode0 = o->expert_mode > 0 ? MOE_GATHERED : MOE_SHARDED;
        for (int in = 0; in < nn; in++) {
            int np = ns[in] > 1 ? 256 * ns[in] : 0;
            for (int md = 0; md < modes; md++) {
                int mode = modes == 2 ? md : mode0;
                if (mode == MOE_GATHERED) {
                    cand[n++] = 1 + 16 * mode + np;
                    continue;
                }
                if (o->a2a_overlap > 0) cand[n++] = o->a2a_overlap + np;
                else
                    for (int rr = 1; rr <= (exch ? 8 : 1); rr *= 2) cand[n++] = rr + np;
            }
        }
        a->tune = xmalloc(sizeof(Tuner) * (size_t)m->c.n_layers);
        for (int l = 0; l < m->c.n_layers; l++) tuner_init(&a->tune[l], cand, n, 2, 0.05, o->a2a_retune);
    }
    a->log_overlap = a->tune || o->a2a_overlap > 1;
    a->log_mode = shape->etp > 1 && o->expert_mode != 0;
    a->log_ampipe = nn > 1 || o->ampipe > 1;
}

void adapt_free(Adapt *a) {
    free(a->tune);
    a->tune = NULL;
}

// --a2a-overlap auto, before a step: each layer's overlap degree from its tuner, timing while any tunes.
void adapt_before(Adapt *a, Model *m) {
    if (!a->tune) return;
    m->moe_timing = 0;
    for (int l = 0; l < m->c.n_layers; l++) {
        int cand = tuner_current(&a->tune[l]);
        model_set_overlap(m, l, cand_r(cand));
        model_set_expert_mode(m, l, cand_mode(cand));
        model_set_ampipe(m, l, cand_n(cand));
        m->moe_timing |= a->tune[l].tuning;
    }
}

// After a step: each layer's MoE time (the slowest rank's: every rank then feeds its tuners the same
// numbers and makes the same choice) and load. Returns 1 when some layer's tuner settled.
int adapt_after(Adapt *a, Model *m, const int64_t *counts, const Comm *world) {
    if (!a->tune) return 0;
    int L = m->c.n_layers, E = m->c.n_experts, settled = 0;
    double *t = m->moe_time;
    if (m->moe_timing) { // the max over ranks (the comm API reduces by sum: gather, then take it)
        int n = comm_size(world);
        double *all = xmalloc(sizeof(double) * (size_t)L * n);
        comm_allgather(world, t, all, (size_t)L, CT_F64);
        for (int l = 0; l < L; l++)
            for (int q = 0; q < n; q++)
                if (all[(size_t)q * L + l] > t[l]) t[l] = all[(size_t)q * L + l];
        free(all);
    }
    for (int l = 0; l < L; l++) {
        int64_t mx = 0, tot = 0;
        for (int e = 0; e < E; e++) {
            tot += counts[l * E + e];
            if (counts[l * E + e] > mx) mx = counts[l * E + e];
        }
        settled |= tuner_observe(&a->tune[l], m->moe_timing ? t[l] : -1, tot ? (double)mx * E / tot : 1);
        t[l] = 0;
    }
    return settled;
}

void adapt_record(const Adapt *a, const Model *m, cJSON *line, int tuned) {
    int L = m->c.n_layers;
    if (a->log_overlap) { // the pipelined exchange: each layer's overlap degree
        cJSON *ov = cJSON_AddArrayToObject(line, "a2a_overlap");
        for (int l = 0; l < L; l++) cJSON_AddItemToArray(ov, cJSON_CreateNumber(m->moe_overlap[l]));
    }
    if (a->log_mode) { // sharded or gathered experts, per layer
        cJSON *em = cJSON_AddArrayToObject(line, "expert_mode");
        for (int l = 0; l < L; l++)
            cJSON_AddItemToArray(em,
                                 cJSON_CreateString(m->moe_mode[l] == MOE_GATHERED ? "gathered" : "sharded"));
    }
    if (a->log_ampipe) { // AMPipe's chunks, per layer
        cJSON *ap = cJSON_AddArrayToObject(line, "ampipe");
        for (int l = 0; l < L; l++) cJSON_AddItemToArray(ap, cJSON_CreateNumber(m->ampipe[l]));
    }
    if (tuned) { // a tuning ended: what each candidate took (per layer; -1: not measured) and the choice
        cJSON *tt = cJSON_AddArrayToObject(line, "a2a_tuned");
        for (int l = 0; l < L; l++) {
            const Tuner *t = &a->tune[l];
            cJSON *row = cJSON_CreateObject();
            cJSON *cs = cJSON_AddArrayToObject(row, "candidates");
            cJSON *ts = cJSON_AddArrayToObject(row, "seconds");
            cJSON *ms = cJSON_AddArrayToObject(row, "modes");
            cJSON *as = a->log_ampipe ? cJSON_AddArrayToObject(row, "ampipe") : NULL;
            for (int i = 0; i < t->n; i++) {
                cJSON_AddItemToArray(cs, cJSON_CreateNumber(cand_r(t->cand[i])));
                cJSON_AddItemToArray(ms, cJSON_CreateString(cand_mode(t->cand[i]) ? "gathered" : "sharded"));
                if (as) cJSON_AddItemToArray(as, cJSON_CreateNumber(cand_n(t->cand[i])));
                cJSON_AddItemToArray(ts, cJSON_CreateNumber(t->mean[i]));
            }
            cJSON_AddNumberToObject(row, "choice", cand_r(tuner_current(t)));
            cJSON_AddStringToObject(row, "choice_mode", cand_mode(tuner_current(t)) ? "gathered" : "sharded");
            if (as) cJSON_AddNumberToObject(row, "choice_ampipe", cand_n(tuner_current(t)));
            cJSON_AddNumberToObject(row, "tunings", t->tunings);
            cJSON_AddItemToArray(tt, row);
        }
    }
}

void adapt_progress(const Adapt *a, const Model *m, char *buf, size_t n) {
    int L = m->c.n_layers;
    if (a->tune && L <= 8) {
        snprintf(buf + strlen(buf), n - strlen(buf), " | a2a r");
        for (int l = 0; l < L; l++)
            snprintf(buf + strlen(buf), n - strlen(buf), "%s%d%s", l ? "," : " ", m->moe_overlap[l],
                     m->moe_mode[l] == MOE_GATHERED ? "g" : "");
        if (a->log_ampipe)
            for (int l = 0; l < L; l++)
                snprintf(buf + strlen(buf), n - strlen(buf), "%s%d", l ? "," : " n ", m->ampipe[l]);
    }
}

int adapt_hier(const Comm *world, const MeshShape *ms) {
    int n = comm_size(world), me = comm_rank(world);
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "?");
    uint64_t h = 1469598103934665603ull;
    for (const char *p = host; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    int64_t mine = (int64_t)(h >> 1), *node = xmalloc(sizeof(int64_t) * n), *g = xmalloc(sizeof(int64_t) * n);
    comm_allgather(world, &mine, node, 1, CT_I64);
    // my EP group's members in ep order
    MeshCoord c = mesh_coord(ms, me);
    int *mem = xmalloc(sizeof(int) * ms->ep), cnt = 0;
    for (int q = 0; q < n; q++) {
        MeshCoord d = mesh_coord(ms, q);
        if (d.pp == c.pp && d.edp == c.edp && d.etp == c.etp) mem[d.ep] = q, cnt++;
    }
    int G = 1;
    while (G < ms->ep && node[mem[G]] == node[mem[0]]) G++;
    int ok = cnt == ms->ep && G < ms->ep && ms->ep % G == 0;
    for (int q = 0; ok && q < ms->ep; q++)
        ok = node[mem[q]] == node[mem[(q / G) * G]] && (q % G || q == 0 || node[mem[q]] != node[mem[q - 1]]);
    int64_t want = ok ? G : 0;
    comm_allgather(world, &want, g, 1, CT_I64);
    for (int q = 1; q < n; q++)
        if (g[q] != g[0]) want = 0;
    int res = (int)(want == g[0] ? g[0] : 0);
    free(node);
    free(g);
    free(mem);
    return res;
}
