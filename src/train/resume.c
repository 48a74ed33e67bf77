// resume.c (train) — what a --resume checks against the run record (run.json) once the data is loaded:
// the fingerprints of the training data and of --val-data (token count and hash, data/data.h
// data_print), which the record keeps for the next resume, and --keep-best's best so far. Must not hold: the
// record's options (the cli builds and applies them: cli/run_record.c), the checkpoint's own checks
// (trainer.c).
#include "train/resume.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "core/common.h"
#include "io/checkpoint.h"

// A data option's path as the record names it: absolute where it names an existing file (as the cli
// records --data), as given otherwise (a shard pattern, or "" for the embedded corpus).
static void data_path(char *buf, size_t n, const char *v) {
    char *abs = v[0] ? realpath(v, NULL) : NULL;
    snprintf(buf, n, "%s", abs ? abs : v);
    free(abs);
}

static cJSON *print_json(const char *path, DataPrint p) {
    cJSON *j = cJSON_CreateObject();
    char h[32];
    snprintf(h, sizeof h, "%016llx", (unsigned long long)p.hash);
    cJSON_AddStringToObject(j, "path", path);
    cJSON_AddNumberToObject(j, "tokens", (double)p.tokens);
    cJSON_AddStringToObject(j, "hash", h);
    return j;
}

// One stream against its record (rec: run.json's "data" entry for it, or NULL). Only when the path is
// the recorded one: another path is an override the user named (the cli prints it).
static void check_one(const cJSON *rec, const char *opt, const char *what, const char *given, DataPrint now,
                      const char *out) {
    const cJSON *path = cJSON_GetObjectItem(rec, "path"), *tokens = cJSON_GetObjectItem(rec, "tokens"),
                *hash = cJSON_GetObjectItem(rec, "hash");
    if (!cJSON_IsString(path) || !cJSON_IsNumber(tokens) || !cJSON_IsString(hash)) return;
    char p[1100], h[32];
    data_path(p, sizeof p, given);
    if (!p[0] || strcmp(p, path->valuestring) != 0) return; // (the embedded corpus: a function of --seed)
    snprintf(h, sizeof h, "%016llx", (unsigned long long)now.hash);
    if ((size_t)tokens->valuedouble == now.tokens && !strcmp(h, hash->valuestring)) return;
    DIE("--resume: the %s (%s) changed since the run was saved: %s (%s/%s: %.0f tokens, hash %s; now %zu "
        "tokens, hash %s); the run would go on in other windows than it trained on: restore the file, or "
        "pass --data-changed to continue on the new data",
        what, opt, p, out, RUN_RECORD, tokens->valuedouble, hash->valuestring, now.tokens, h);
}

void resume_check_data(const Dataset *ds, const TrainOptions *o) {
    if (o->data_changed) return;
    cJSON *prev = run_record_read(o->out);
    const cJSON *d = prev ? cJSON_GetObjectItem(prev, "data") : NULL; // (none: a run of an older moe)
    if (d) {
        check_one(cJSON_GetObjectItem(d, "train"), "--data", "training data", o->data, data_print(ds, 0),
                  o->out);
        if (o->val_data[0])
            check_one(cJSON_GetObjectItem(d, "val"), "--val-data", "validation data", o->val_data,
                      data_print(ds, 1), o->out);
    }
    cJSON_Delete(prev);
}

char *resume_record_data(const char *record, const Dataset *ds, const TrainOptions *o) {
    cJSON *j = cJSON_Parse(record);
    CHECK(cJSON_IsObject(j), "the run record is not a JSON object");
    cJSON *d = cJSON_AddObjectToObject(j, "data");
    char p[1100];
    data_path(p, sizeof p, o->data);
    cJSON_AddItemToObject(d, "train", print_json(p, data_print(ds, 0)));
    if (o->val_data[0]) {
        data_path(p, sizeof p, o->val_data);
        cJSON_AddItemToObject(d, "val", print_json(p, data_print(ds, 1)));
    }
    char *text = cJSON_Print(j);
    CHECK(text, "out of memory printing the run record");
    cJSON_Delete(j);
    return text;
}

double resume_best(const char *out, const char *metrics_path, int64_t step, int64_t *best_step) {
    double best = HUGE_VAL;
    *best_step = -1;
    char dir[2100];
    join_path(dir, sizeof dir, out, RUN_BEST);
    if (!ckpt_is_complete(dir)) return best;
    TrainState st;
    ckpt_load_state(dir, &st);
    size_t len;
    char *buf = read_file(metrics_path, &len);
    if (!buf) return best;
    for (char *line = strtok(buf, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        cJSON *s = j ? cJSON_GetObjectItem(j, "step") : NULL,
              *v = j ? cJSON_GetObjectItem(j, "val_loss") : NULL;
        if (cJSON_IsNumber(s) && cJSON_IsNumber(v) && s->valuedouble == (double)st.step && st.step <= step) {
            best = v->valuedouble;
            *best_step = st.step;
        }
        cJSON_Delete(j);
    }
    free(buf);
    return best;
}
