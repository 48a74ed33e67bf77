// measure.c — the run's own measurements for checking the models (see measure.h).
#include "train/measure.h"
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "core/common.h"

void measure_base(Measure *m) {
    double peak;
    memset(m, 0, sizeof *m);
    proc_memory(&m->rss_base, &peak);
}

void measure_after_step(Measure *m) {
    double rss, peak;
    proc_memory(&rss, &peak);
    if (rss > m->rss_step) m->rss_step = rss;
}

void measure_open(Measure *m, const char *out, int rank0, int stages) {
    if (!rank0 || stages < 2) return;
    join_path(m->path, sizeof m->path, out, "pipeline.jsonl");
    m->pf = xfopen(m->path, "w");
}

static cJSON *numbers(const double *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

void measure_step(Measure *m, int step, const StepStats *s, ScheduleKind kind, int micro) {
    if (!m->pf) return;
    int P = s->stages, V = s->vpp, S = P * V;
    double *v = xmalloc(sizeof(double) * (4 * (size_t)S + 2 * P));
    double *tf = v, *tb = v + S, *idle = v + 2 * S, *span = idle + P;
    for (int k = 0; k < P; k++) {
        idle[k] = s->stage_idle[2 * k];
        span[k] = s->stage_idle[2 * k + 1];
        for (int c = 0; c < V; c++) { // virtual stage c P + k: chunk c of stage k
            tf[c * P + k] = s->stage_act[(k * V + c) * 2] / micro;
            tb[c * P + k] = s->stage_act[(k * V + c) * 2 + 1] / micro;
        }
    }
    SchedTimes t = {tf, tb};
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "step", step + 1);
    cJSON_AddNumberToObject(j, "bubble_frac", step_bubble(s));
    cJSON_AddNumberToObject(j, "bubble_sim", schedule_simulate_times(kind, P, V, micro, &t, NULL));
    cJSON_AddItemToObject(j, "idle_s", numbers(idle, P));
    cJSON_AddItemToObject(j, "span_s", numbers(span, P));
    cJSON_AddItemToObject(j, "cpu_s", numbers(s->stage_cpu, P));
    cJSON_AddItemToObject(j, "tf_s", numbers(tf, S));
    cJSON_AddItemToObject(j, "tb_s", numbers(tb, S));
    char *txt = cJSON_PrintUnformatted(j);
    xfputs(txt, m->pf, m->path);
    xfputs("\n", m->pf, m->path);
    free(txt);
    cJSON_Delete(j);
    free(v);
}

void measure_memory(const Measure *m, const Comm *world, const char *out) {
    int n = comm_size(world);
    double now, mine[3] = {m->rss_base, m->rss_step, 0}, *all = xmalloc(sizeof(double) * 3 * (size_t)n);
    proc_memory(&now, &mine[2]); // (the peak; the resident set now is not reported)
    comm_allgather(world, mine, all, 3, CT_F64);
    if (comm_rank(world) == 0) {
        static const char *const key[3] = {"rss_base_bytes", "rss_step_bytes", "rss_peak_bytes"};
        double *v = xmalloc(sizeof(double) * (size_t)n);
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "note",
                                "per world rank, bytes: the resident set before the model was built, the "
                                "largest at the end of a step, and its peak (VmHWM) by the end of training");
        for (int k = 0; k < 3; k++) {
            for (int r = 0; r < n; r++) v[r] = all[3 * r + k];
            cJSON_AddItemToObject(j, key[k], numbers(v, n));
        }
        char path[2048];
        join_path(path, sizeof path, out, "memory.json");
        json_write_file(path, j);
        cJSON_Delete(j);
        free(v);
    }
    free(all);
}

void measure_close(Measure *m) {
    if (m->pf) xfclose(m->pf, m->path);
    m->pf = NULL;
}
