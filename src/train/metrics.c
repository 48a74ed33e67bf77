// metrics.c — metrics.jsonl read back (see metrics.h): each line parsed with cJSON, the expert-load
// counts turned into each layer's shares, the records sorted by step with a re-done step's latest kept.
// Must not hold: writing metrics (trainer.c), drawing (plot.c), warnings (the callers say what failed).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "train/metrics.h"
#include "core/common.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <string.h>

static double num_or_nan(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return NAN;
    return v->valuedouble;
}

// Checks expert_load's shape; on the first valid one fixes L x E. Returns the L*E shares appended
// to m->loads (index), or -1 if absent or malformed or of another shape.
static long parse_load(Metrics *m, const cJSON *obj) {
    const cJSON *el = cJSON_GetObjectItemCaseSensitive(obj, "expert_load");
    if (!cJSON_IsArray(el)) return -1;
    int L = cJSON_GetArraySize(el);
    if (L <= 0) return -1;
    int E = cJSON_GetArraySize(cJSON_GetArrayItem(el, 0));
    if (E <= 0) return -1;
    if (m->L && (L != m->L || E != m->E)) return -1;
    size_t rows = (size_t)L * E;
    double *cnt = xmalloc(rows * sizeof *cnt);
    int l = 0, ok = 1;
    for (const cJSON *layer = el->child; layer && ok; layer = layer->next, l++) {
        if (!cJSON_IsArray(layer) || cJSON_GetArraySize(layer) != E) {
            ok = 0;
            break;
        }
        int e = 0;
        for (const cJSON *c = layer->child; c; c = c->next, e++) {
            if (!cJSON_IsNumber(c) || !isfinite(c->valuedouble) || c->valuedouble < 0) {
                ok = 0;
                break;
            }
            cnt[(size_t)l * E + e] = c->valuedouble;
        }
    }
    if (!ok) {
        free(cnt);
        return -1;
    }
    m->L = L;
    m->E = E;
    if (m->nloads == m->caploads) {
        m->caploads = m->caploads ? 2 * m->caploads : 64;
        m->loads = xrealloc(m->loads, m->caploads * rows * sizeof *m->loads);
    }
    float *dst = m->loads + m->nloads * rows;
    for (l = 0; l < L; l++) {
        double sum = 0;
        for (int e = 0; e < E; e++) sum += cnt[(size_t)l * E + e];
        for (int e = 0; e < E; e++)
            dst[(size_t)l * E + e] = sum > 0 ? (float)(cnt[(size_t)l * E + e] / sum) : NAN;
    }
    free(cnt);
    return (long)m->nloads++;
}

static void parse_line(Metrics *m, const char *line, size_t len, long seq) {
    cJSON *obj = cJSON_ParseWithLength(line, len);
    if (!obj) return;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(obj, "step");
    if (cJSON_IsObject(obj) && cJSON_IsNumber(st) && fabs(st->valuedouble) < 1e15) {
        long step = (long)st->valuedouble;
        double loss = num_or_nan(obj, "loss"), val = num_or_nan(obj, "val_loss");
        int is_train = cJSON_GetObjectItemCaseSensitive(obj, "loss") != NULL;
        if (is_train) {
            if (m->ntr == m->captr) {
                m->captr = m->captr ? 2 * m->captr : 256;
                m->tr = xrealloc(m->tr, m->captr * sizeof *m->tr);
            }
            TrainRec *r = &m->tr[m->ntr++];
            r->step = step;
            r->seq = seq;
            r->loss = loss;
            r->aux = num_or_nan(obj, "aux_loss");
            r->z = num_or_nan(obj, "z_loss");
            r->tokens_s = num_or_nan(obj, "tokens_per_s");
            r->step_time = num_or_nan(obj, "step_time_s");
            r->load = parse_load(m, obj);
        }
        if (!isnan(val)) {
            if (m->nva == m->capva) {
                m->capva = m->capva ? 2 * m->capva : 64;
                m->va = xrealloc(m->va, m->capva * sizeof *m->va);
            }
            m->va[m->nva++] = (ValRec){step, seq, val};
        }
    }
    cJSON_Delete(obj);
}

static int cmp_train(const void *a, const void *b) {
    const TrainRec *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}
static int cmp_val(const void *a, const void *b) {
    const ValRec *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}
// Sort by step; a step logged twice (a resumed run re-doing steps) keeps its latest line.
static void metrics_sort(Metrics *m) {
    if (m->ntr) qsort(m->tr, m->ntr, sizeof *m->tr, cmp_train);
    size_t k = 0;
    for (size_t i = 0; i < m->ntr; i++) {
        if (k && m->tr[k - 1].step == m->tr[i].step) m->tr[k - 1] = m->tr[i];
        else m->tr[k++] = m->tr[i];
    }
    m->ntr = k;
    if (m->nva) qsort(m->va, m->nva, sizeof *m->va, cmp_val);
    k = 0;
    for (size_t i = 0; i < m->nva; i++) {
        if (k && m->va[k - 1].step == m->va[i].step) m->va[k - 1] = m->va[i];
        else m->va[k++] = m->va[i];
    }
    m->nva = k;
}

int metrics_read(const char *path, Metrics *m) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long seq = 0;
    errno = 0;
    while ((n = getline(&line, &cap, f)) >= 0) parse_line(m, line, (size_t)n, seq++);
    int err = ferror(f) ? errno : 0;
    free(line);
    fclose(f);
    if (err) {
        errno = err;
        return -1;
    }
    metrics_sort(m);
    return 0;
}

void metrics_free(Metrics *m) {
    free(m->tr);
    free(m->va);
    free(m->loads);
    memset(m, 0, sizeof *m);
}
