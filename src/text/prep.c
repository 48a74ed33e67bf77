// prep.c (text) — `moe prep`: read documents (plain text, a document per file or per line; JSON lines
// with a text field; either gzip'd), tokenise each, append the EOS, and write llm.c shards
// (data_write_shard) into OUT.part, renamed to OUT at the end; the first --val-docs documents go to the
// val shards. Must not hold: tokenisation (tok_*.c), the shard format (data/data.c).
#include "text/prep.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <omp.h>
#include <cjson/cJSON.h>
#include <zlib.h>
#include "core/common.h"
#include "data/data.h"
#include "text/tokenizer.h"

static const char *who = "prep"; // what the messages name: the command or option reading the inputs

// An EOS token named in a tokenizer directory's JSON: a string, or {"content": string}.
static int eos_named(const Tokenizer *t, const char *dir, const char *file, const char *key) {
    char p[2048];
    join_path(p, sizeof p, dir, file);
    if (!file_exists(p)) return -2;
    long at;
    cJSON *j = json_read_file("prep", dir, file, &at);
    if (!j) DIE("%s: '%s' is not valid JSON (at byte %ld)", who, p, at);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    if (cJSON_IsObject(v)) v = cJSON_GetObjectItemCaseSensitive(v, "content");
    int id = -2;
    if (cJSON_IsString(v)) {
        id = tok_token_id(t, v->valuestring);
        if (id < 0)
            DIE("%s: %s names %s '%s', which the tokenizer does not have", who, p, key, v->valuestring);
    } else if (cJSON_IsNumber(v) || (cJSON_IsArray(v) && cJSON_IsNumber(cJSON_GetArrayItem(v, 0)))) {
        id = cJSON_IsArray(v) ? cJSON_GetArrayItem(v, 0)->valueint : v->valueint;
        if (id < 0 || id >= tok_vocab_size(t))
            DIE("%s: %s: %s %d is outside the tokenizer's vocabulary (%d)", who, p, key, id,
                tok_vocab_size(t));
    }
    cJSON_Delete(j);
    return id;
}

int prep_find_eos(const Tokenizer *t, const char *path, const char **from) {
    char dir[1024];
    if (dir_exists(path)) snprintf(dir, sizeof dir, "%s", path);
    else path_parent(dir, sizeof dir, path);
    static const char *const files[] = {"tokenizer_config.json", "special_tokens_map.json", "config.json"};
    for (int k = 0; k < 3; k++) {
        int id = eos_named(t, dir, files[k], k < 2 ? "eos_token" : "eos_token_id");
        if (id >= 0) {
            *from = files[k];
            return id;
        }
    }
    return -1;
}

// Shards of one split, filled as documents come.
typedef struct {
    const char *name; // "train" / "val"
    int32_t *tok;
    size_t n, cap;
    long shards, docs;
    size_t total;
} Split;

static char part_dir[1100];
static void remove_part(void) {
    if (part_dir[0]) rm_rf(part_dir);
}

static void flush(Split *s, const char *dir, int vocab) {
    if (!s->n) return;
    char name[64], p[1200];
    snprintf(name, sizeof name, "%s_%06ld.bin", s->name, s->shards++);
    join_path(p, sizeof p, dir, name);
    data_write_shard(p, s->tok, s->n, vocab);
    s->total += s->n;
    s->n = 0;
}

// Documents are encoded in batches, in parallel (OpenMP threads), and appended in input order, so the
// shards do not depend on the thread count.
#define BATCH_DOCS 4096
#define BATCH_BYTES ((size_t)16 << 20)

typedef struct {
    const PrepOptions *o;
    const Tokenizer *t;
    const char *dir; // where the shards go
    int eos, vocab; // eos < 0: none (documents follow each other)
    Split train, val;
    long docs;
    size_t bytes, text_tokens;
    double t0, shown;
    // the batch: copies of the documents' text, and their ids once encoded
    char *text[BATCH_DOCS];
    size_t len[BATCH_DOCS], n[BATCH_DOCS], cap[BATCH_DOCS];
    int32_t *ids[BATCH_DOCS];
    int count;
    size_t batch_bytes;
} Prep;

static void append_doc(Prep *p, const int32_t *ids, size_t n, size_t len) {
    Split *s = p->docs < p->o->val_docs ? &p->val : &p->train;
    p->docs++;
    s->docs++;
    p->bytes += len;
    p->text_tokens += n;
    for (size_t i = 0; i < n + (p->eos >= 0); i++) {
        if (s->n == s->cap) {
            s->cap = s->cap ? s->cap * 2 : 1 << 16;
            s->tok = xrealloc(s->tok, s->cap * sizeof *s->tok);
        }
        s->tok[s->n++] = i < n ? ids[i] : p->eos;
        if (s->n >= (size_t)p->o->shard_tokens) flush(s, p->dir, p->vocab);
    }
}

static void run_batch(Prep *p) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < p->count; i++)
        p->n[i] = tok_encode(p->t, p->text[i], p->len[i], p->o->add_special, &p->ids[i], &p->cap[i]);
    for (int i = 0; i < p->count; i++) {
        append_doc(p, p->ids[i], p->n[i], p->len[i]);
        free(p->text[i]);
    }
    p->count = 0;
    p->batch_bytes = 0;
    double now = now_seconds();
    if (isatty(STDERR_FILENO) && now - p->shown > 1) { // progress, where someone watches
        p->shown = now;
        fprintf(stderr, "\r%s: %ld documents, %zu tokens, %.1f MB/s   ", who, p->docs, p->text_tokens,
                (double)p->bytes / 1e6 / (now - p->t0));
    }
}

static void add_doc(void *arg, const char *text, size_t len) {
    Prep *p = arg;
    p->text[p->count] = xmalloc(len + 1);
    memcpy(p->text[p->count], text, len);
    p->len[p->count++] = len;
    p->batch_bytes += len;
    if (p->count == BATCH_DOCS || p->batch_bytes >= BATCH_BYTES) run_batch(p);
}

// A gzip'd or plain file, read a line at a time (any length) or whole.
typedef struct {
    gzFile f;
    const char *path;
    char *b;
    size_t n, pos, cap;
    int eof;
} Reader;

static void fill(Reader *r) {
    if (r->pos) {
        memmove(r->b, r->b + r->pos, r->n - r->pos);
        r->n -= r->pos;
        r->pos = 0;
    }
    if (r->n + (1 << 20) + 1 > r->cap) r->b = xrealloc(r->b, r->cap = (r->n + (1 << 20) + 1) * 2);
    int got = gzread(r->f, r->b + r->n, 1 << 20);
    int err = Z_OK;
    const char *msg = gzerror(r->f, &err);
    if (got < 0 || (err != Z_OK && err != Z_STREAM_END))
        DIE("%s: cannot read '%s' (%s)", who, r->path, err == Z_ERRNO ? strerror(errno) : msg);
    if (got == 0) r->eof = 1;
    r->n += (size_t)got;
}

// The next line (without its '\n'; NUL-terminated in place), or NULL at the end.
static char *next_line(Reader *r, size_t *len) {
    for (;;) {
        char *nl = r->n > r->pos ? memchr(r->b + r->pos, '\n', r->n - r->pos) : NULL;
        if (nl || (r->eof && r->pos < r->n)) {
            char *s = r->b + r->pos;
            *len = nl ? (size_t)(nl - s) : r->n - r->pos;
            r->pos += *len + (nl != NULL);
            s[*len] = 0;
            return s;
        }
        if (r->eof) return NULL;
        fill(r);
    }
}

int prep_is_jsonl(const char *path) {
    size_t n = strlen(path);
    if (n > 3 && !strcmp(path + n - 3, ".gz")) n -= 3;
    static const char *const ext[] = {".jsonl", ".json", ".ndjson"};
    for (int k = 0; k < 3; k++) {
        size_t e = strlen(ext[k]);
        if (n > e && !strncmp(path + n - e, ext[k], e)) return 1;
    }
    return 0;
}

// Where read_input hands each document.
typedef struct {
    const PrepOptions *o;
    void (*doc)(void *arg, const char *text, size_t len);
    void *arg;
} Sink;

static void json_doc(const Sink *p, const char *path, long line, const char *s, size_t len) {
    cJSON *j = cJSON_ParseWithLength(s, len);
    if (!j) DIE("%s: %s:%ld: not a JSON object", who, path, line);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, p->o->field);
    if (!cJSON_IsObject(j) || !cJSON_IsString(v))
        DIE("%s: %s:%ld: no string field \"%s\" (--field names it)", who, path, line, p->o->field);
    p->doc(p->arg, v->valuestring, strlen(v->valuestring));
    cJSON_Delete(j);
}

static void read_input(const Sink *p, const char *path) {
    if (!file_exists(path))
        DIE("%s: cannot read %s'%s' (no such file)", who, strcmp(who, "prep") ? "" : "--in ", path);
    Reader r = {.path = path};
    r.f = gzopen(path, "rb");
    if (!r.f) DIE("%s: cannot open '%s' (%s)", who, path, strerror(errno));
    int json = prep_is_jsonl(path);
    if (!json && !p->o->lines) { // the whole file is one document
        while (!r.eof) fill(&r);
        if (r.n) p->doc(p->arg, r.b, r.n);
    } else {
        size_t len;
        long line = 0;
        for (char *s; (s = next_line(&r, &len));) {
            line++;
            size_t k = 0;
            while (k < len && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
            if (k == len) continue; // blank lines are no documents
            if (json) json_doc(p, path, line, s, len);
            else p->doc(p->arg, s, len);
        }
    }
    gzclose(r.f);
    free(r.b);
}

void prep_read(const PrepOptions *o, void (*doc)(void *arg, const char *text, size_t len), void *arg,
               const char *whom) {
    Sink k = {o, doc, arg};
    who = whom;
    for (const char *s = o->inputs; *s;) {
        size_t n = strcspn(s, "\n");
        char path[4096];
        snprintf(path, sizeof path, "%.*s", (int)n, s);
        read_input(&k, path);
        s += n + (s[n] == '\n');
    }
}

static void summary(const Prep *p, const char *from, const char *shown) {
    if (p->shown > 0) fprintf(stderr, "\n");
    double dt = now_seconds() - p->t0;
    char eos[200] = "no EOS";
    if (p->eos >= 0) snprintf(eos, sizeof eos, "EOS %d (from %s)", p->eos, from);
    printf("%s: %ld documents (%ld held out), %zu tokens (%zu train in %ld shard%s, %zu val in %ld), "
           "%.4f tokens per byte, %s tokens, %s, %.1f MB/s on %d thread%s -> %s\n",
           who, p->docs, p->val.docs, p->train.total + p->val.total, p->train.total, p->train.shards,
           p->train.shards == 1 ? "" : "s", p->val.total, p->val.shards,
           p->bytes ? (double)p->text_tokens / (double)p->bytes : 0.0, p->vocab > 65536 ? "uint32" : "uint16",
           eos, dt > 0 ? (double)p->bytes / 1e6 / dt : 0.0, omp_get_max_threads(),
           omp_get_max_threads() == 1 ? "" : "s", shown);
}

void prep_write(const PrepOptions *o, const Tokenizer *t, int eos, const char *from, const char *dir,
                const char *whom) {
    who = whom;
    Prep *p = xcalloc(1, sizeof *p);
    *p = (Prep){.o = o, .t = t, .dir = dir, .eos = eos, .train = {.name = "train"}, .val = {.name = "val"}};
    p->vocab = tok_vocab_size(t);
    p->t0 = now_seconds();
    prep_read(o, add_doc, p, whom);
    run_batch(p);
    if (!p->docs) DIE("%s: the inputs hold no document", who);
    if (o->val_docs && p->train.docs == 0)
        DIE("%s: --val-docs %ld leaves no document to train on", who, o->val_docs);
    flush(&p->train, dir, p->vocab);
    flush(&p->val, dir, p->vocab);
    summary(p, from, o->out);
    free(p->train.tok);
    free(p->val.tok);
    for (int i = 0; i < BATCH_DOCS; i++) free(p->ids[i]);
    free(p);
}

void prep_run(const PrepOptions *o) {
    if (dir_exists(o->out) || file_exists(o->out))
        DIE("prep: --out '%s' already exists (choose a new directory)", o->out);
    if (o->val_docs < 0 || o->shard_tokens < 1) DIE("prep: --val-docs must be >= 0 and --shard-tokens >= 1");
    Tokenizer *t = tok_load(o->tokenizer);
    const char *from = "--eos";
    int eos = *o->eos ? tok_token_id(t, o->eos) : prep_find_eos(t, o->tokenizer, &from);
    if (*o->eos && eos < 0) DIE("prep: --eos '%s' is not a token of the tokenizer", o->eos);
    if (eos < 0)
        DIE("prep: no EOS token beside the tokenizer '%s' (tokenizer_config.json, special_tokens_map.json, "
            "config.json); name it with --eos",
            o->tokenizer);
    snprintf(part_dir, sizeof part_dir, "%s.part", o->out);
    if (dir_exists(part_dir)) rm_rf(part_dir); // a previous prep's leftover
    mkdir_p(part_dir);
    moe_set_die_cleanup(remove_part);
    prep_write(o, t, eos, from, part_dir, "prep");
    if (rename(part_dir, o->out) != 0)
        DIE("prep: cannot rename '%s' to '%s' (%s)", part_dir, o->out, strerror(errno));
    moe_set_die_cleanup(NULL);
    part_dir[0] = 0;
    char parent[1024];
    path_parent(parent, sizeof parent, o->out);
    fsync_dir(parent);
    tok_free(t);
}
