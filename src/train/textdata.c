// textdata.c (train) — the run's tokenizer and text data (see textdata.h): the tokenizer chosen and
// checked against the model and the run record, the text tokenised into the run's cache by rank 0, the
// record's entries and the run's copy of the tokenizer. Must not hold: tokenisation or the cache's
// format (text/corpus.c), the loader (data/data.c).
#include "train/textdata.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "core/common.h"
#include "io/checkpoint.h"
#include "text/prep.h"

static void hex(char *h, size_t n, uint64_t v) { snprintf(h, n, "%016llx", (unsigned long long)v); }

// The model's vocabulary the tokenizer must fit: c's, or on a resume the checkpoint's.
static int model_vocab(const TrainOptions *o, const ModelConfig *c) {
    char latest[2048];
    if (!o->resume || ckpt_find_latest(o->out, latest, sizeof latest) != 0) return c->vocab_size;
    ModelConfig saved;
    ckpt_load_config(latest, &saved);
    return saved.vocab_size;
}

// The tokenizer a run uses: --tokenizer (or --init-from's, which the cli puts there); on a resume without
// it, the run's copy when the record names one. "" when none. rec: the run record (resume) or NULL.
static void pick(char *path, size_t n, const TrainOptions *o, const cJSON *rec) {
    const cJSON *rt = cJSON_GetObjectItem(rec, "tokenizer");
    snprintf(path, n, "%s", o->tokenizer);
    if (rec && !rt && o->tokenizer[0])
        DIE("--tokenizer %s: the run in '%s' trained without a tokenizer (%s/%s names none): its tokens "
            "would "
            "change meaning; start a new run in another --out",
            o->tokenizer, o->out, o->out, RUN_RECORD);
    if (!rt || o->tokenizer[0]) return;
    join_path(path, n, o->out, RUN_TOKENIZER);
    if (!dir_exists(path))
        DIE("--resume: the run trained with a tokenizer (%s/%s) and its copy %s is missing: pass --tokenizer "
            "with that tokenizer",
            o->out, RUN_RECORD, path);
}

// A resume: the tokenizer must be the one the record names (its bytes and its EOS).
static void check_tokenizer(const TextData *td, const cJSON *rec, const TrainOptions *o) {
    const cJSON *rt = cJSON_GetObjectItem(rec, "tokenizer"), *h = cJSON_GetObjectItem(rt, "hash"),
                *e = cJSON_GetObjectItem(rt, "eos");
    if (!cJSON_IsString(h) || !cJSON_IsNumber(e)) return;
    char now[32];
    hex(now, sizeof now, td->tok_print.hash);
    if (!strcmp(now, h->valuestring) && e->valueint == td->eos) return;
    DIE("--resume: the tokenizer %s is not the one the run trained with (%s/%s: hash %s, EOS %d; now hash "
        "%s, "
        "EOS %d): a model's token ids mean what its tokenizer says; resume without --tokenizer (the run's "
        "copy "
        "in %s/%s) or start a new run",
        td->tok_src, o->out, RUN_RECORD, h->valuestring, e->valueint, now, td->eos, o->out, RUN_TOKENIZER);
}

// A resume: the text of a stream must be what the record says it was (when the path is the recorded one,
// as the token check in resume.c, which would only see it after tokenising).
static void check_text(const cJSON *rec, const char *key, const char *opt, const char *given, const char *out,
                       int changed_ok) {
    const cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(rec, "data"), key),
                *path = cJSON_GetObjectItem(d, "path"), *t = cJSON_GetObjectItem(d, "text");
    const cJSON *b = cJSON_GetObjectItem(t, "bytes"), *h = cJSON_GetObjectItem(t, "hash");
    if (changed_ok || !cJSON_IsString(path) || !cJSON_IsNumber(b) || !cJSON_IsString(h)) return;
    char *abs = realpath(given, NULL);
    int same_path = abs && !strcmp(abs, path->valuestring);
    free(abs);
    if (!same_path) return;
    FilePrint now = file_print(given, opt);
    char hn[32];
    hex(hn, sizeof hn, now.hash);
    if ((uint64_t)b->valuedouble == now.bytes && !strcmp(hn, h->valuestring)) return;
    DIE("--resume: the text of %s changed since the run was saved: %s (%s/%s: %.0f bytes, hash %s; now %llu "
        "bytes, hash %s); restore the file, or pass --data-changed to continue on the new text",
        opt, given, out, RUN_RECORD, b->valuedouble, h->valuestring, (unsigned long long)now.bytes, hn);
}

// What this process wrote into the cache, removed if the run is refused before it starts (textdata_keep
// disarms it): o->out when it made it, else data/ when it made that, else the streams it tokenised.
static char made[3][1200];
static void remove_made(void) {
    for (int k = 0; k < 3; k++)
        if (made[k][0]) rm_rf(made[k]);
}
static void note_made(const char *out, const char *name) {
    char data[1100];
    join_path(data, sizeof data, out, RUN_DATA);
    if (!made[0][0] && !dir_exists(out)) snprintf(made[0], sizeof made[0], "%s", out);
    if (!made[0][0] && !made[1][0] && !dir_exists(data)) snprintf(made[1], sizeof made[1], "%s", data);
    if (!made[0][0] && !made[1][0]) join_path(made[2], sizeof made[2], data, name);
}

void textdata_keep(void) {
    moe_set_die_cleanup(NULL);
    memset(made, 0, sizeof made);
}

// A text stream into its cache (rank 0 builds; every rank then reads the same shards).
static const char *cache(TextData *td, const TrainOptions *o, const char *path, const char *name,
                         const char *opt, char *buf, size_t n, const char **text, FilePrint *print,
                         Comm *world) {
    if (!path || data_is_shards(path)) return path;
    *text = path;
    const char *from;
    int eos = corpus_eos(td->tok, td->tok_src, path, opt, &from);
    char dir[1100];
    join_path(dir, sizeof dir, o->out, RUN_DATA);
    if (comm_rank(world) == 0 &&
        !corpus_shards(td->tok, td->tok_print, eos, from, path, dir, name, 0, opt, buf, n, print)) {
        note_made(o->out, name);
        moe_set_die_cleanup(NULL);
        corpus_shards(td->tok, td->tok_print, eos, from, path, dir, name, 1, opt, buf, n, print);
        moe_set_die_cleanup(remove_made);
    }
    comm_barrier(world);
    if (comm_rank(world) != 0)
        corpus_shards(td->tok, td->tok_print, eos, from, path, dir, name, 0, opt, buf, n, print);
    return buf;
}

void textdata_open(TextData *td, const TrainOptions *o, const ModelConfig *c, Comm *world) {
    memset(td, 0, sizeof *td);
    td->data = o->data[0] ? o->data : NULL;
    td->val_data = o->val_data[0] ? o->val_data : NULL;
    td->eos = -1;
    cJSON *rec = o->resume ? run_record_read(o->out) : NULL;
    char path[1100];
    pick(path, sizeof path, o, rec);
    if (!path[0]) {
        cJSON_Delete(rec);
        return;
    }
    if (!td->data)
        DIE("--tokenizer %s: the embedded corpus (no --data) is bytes, not this tokenizer's tokens; give "
            "--data "
            "a text or its shards",
            path);
    td->tok = tok_load(path);
    char *abs = realpath(tok_file(td->tok), NULL);
    snprintf(td->tok_src, sizeof td->tok_src, "%s", abs ? abs : tok_file(td->tok));
    free(abs);
    td->tok_print = file_print(td->tok_src, "--tokenizer");
    td->eos = prep_find_eos(td->tok, path, &td->eos_from);
    if (rec) check_tokenizer(td, rec, o);
    int V = model_vocab(o, c);
    if (tok_vocab_size(td->tok) > V)
        DIE("--tokenizer %s: its vocabulary (%d ids) does not fit the model's embedding (vocab_size %d)%s",
            path, tok_vocab_size(td->tok), V,
            o->resume ? "" : "; give the model a vocab_size at least that large (--vocab-size)");
    char held[256];
    if (!o->resume && !o->force && ckpt_run_present(o->out, held, sizeof held))
        DIE("'%s' already holds a training run (%s); pass --resume to continue it or --force to start over "
            "(which deletes it)",
            o->out, held);
    if (rec) {
        if (td->data) check_text(rec, "train", "--data", td->data, o->out, o->data_changed);
        if (td->val_data) check_text(rec, "val", "--val-data", td->val_data, o->out, o->data_changed);
    }
    cJSON_Delete(rec);
    td->data = cache(td, o, td->data, "train", "--data", td->data_buf, sizeof td->data_buf, &td->text,
                     &td->text_print, world);
    td->val_data = cache(td, o, td->val_data, "val", "--val-data", td->val_buf, sizeof td->val_buf,
                         &td->val_text, &td->val_print, world);
}

void textdata_name(const TextData *td, Dataset *ds) {
    if (td->text)
        snprintf(ds->source, sizeof ds->source, "text:%s via %s (%s)", td->text, td->tok_src, td->data);
    if (td->val_text)
        snprintf(ds->val_source, sizeof ds->val_source, "text:%s via %s (%s)", td->val_text, td->tok_src,
                 td->val_data);
}

void textdata_check_ids(const TextData *td, const Dataset *ds) {
    if (td->tok && ds->max_token >= tok_vocab_size(td->tok))
        DIE("the data's tokens (up to id %d, from %s%s%s) are beyond the tokenizer %s's vocabulary (%d ids)",
            ds->max_token, ds->source, ds->val_source[0] ? " and " : "", ds->val_source, td->tok_src,
            tok_vocab_size(td->tok));
}

static cJSON *print_json(FilePrint p) {
    cJSON *j = cJSON_CreateObject();
    char h[32];
    hex(h, sizeof h, p.hash);
    cJSON_AddNumberToObject(j, "bytes", (double)p.bytes);
    cJSON_AddStringToObject(j, "hash", h);
    return j;
}

char *textdata_record(char *record, const TextData *td) {
    if (!td->tok) return record;
    cJSON *j = cJSON_Parse(record);
    CHECK(cJSON_IsObject(j), "the run record is not a JSON object");
    free(record);
    cJSON *t = print_json(td->tok_print);
    cJSON_AddStringToObject(t, "path", td->tok_src);
    cJSON_AddNumberToObject(t, "eos", td->eos);
    cJSON_AddItemToObject(j, "tokenizer", t);
    cJSON *d = cJSON_GetObjectItem(j, "data");
    cJSON *tr = cJSON_GetObjectItem(d, "train"), *va = cJSON_GetObjectItem(d, "val");
    if (tr && td->text) cJSON_AddItemToObject(tr, "text", print_json(td->text_print));
    if (va && td->val_text) cJSON_AddItemToObject(va, "text", print_json(td->val_print));
    char *text = cJSON_Print(j);
    CHECK(text, "out of memory printing the run record");
    cJSON_Delete(j);
    return text;
}

void textdata_save(const TextData *td, const char *out) {
    if (!td->tok) return;
    char dir[1100], part[1200], p[1300];
    join_path(dir, sizeof dir, out, RUN_TOKENIZER);
    snprintf(part, sizeof part, "%s.part", dir);
    size_t n;
    char *json = read_file(td->tok_src, &n);
    if (!json) DIE("cannot read the tokenizer '%s' (%s)", td->tok_src, strerror(errno));
    if (dir_exists(part)) rm_rf(part);
    mkdir_p(part);
    join_path(p, sizeof p, part, "tokenizer.json");
    FILE *f = xfopen(p, "wb");
    xfwrite(json, 1, n, f, p);
    xfclose(f, p);
    free(json);
    cJSON *cfg = cJSON_CreateObject(); // the EOS as transformers reads it (and prep_find_eos)
    size_t m;
    char *eos = td->eos >= 0 ? tok_decode(td->tok, &td->eos, 1, 0, &m) : NULL;
    if (eos && tok_token_id(td->tok, eos) == td->eos) cJSON_AddStringToObject(cfg, "eos_token", eos);
    free(eos);
    cJSON_AddStringToObject(cfg, "tokenizer_class", "PreTrainedTokenizerFast");
    join_path(p, sizeof p, part, "tokenizer_config.json");
    json_write_file(p, cfg);
    cJSON_Delete(cfg);
    if (dir_exists(dir) && rm_rf(dir) != 0) DIE("cannot replace '%s'", dir);
    if (rename(part, dir) != 0) DIE("cannot rename '%s' to '%s' (%s)", part, dir, strerror(errno));
    fsync_dir(out);
}

void textdata_close(TextData *td) {
    tok_free(td->tok);
    memset(td, 0, sizeof *td);
}
