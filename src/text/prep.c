// prep.c (text) — `moe prep`: read documents (plain text, a document per file or per line; JSON lines
// with a text field; either gzip'd or zstd'd: infile.c), tokenise each, append the EOS, and write llm.c
// shards (data_write_shard) into OUT.part, renamed to OUT at the end; the first --val-docs documents go to
// the val shards. A Megatron dataset's documents are copied as they are (already ids, with their own EOD).
// Must not hold: tokenisation (tok_*.c), the shard format (data/data.c), the Megatron format
// (data/megatron.c).
#include "text/prep.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <omp.h>
#include <cjson/cJSON.h>
#include "core/common.h"
#include "data/data.h"
#include "data/megatron.h"
#include "text/infile.h"
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
    long docs, megatron_docs;
    size_t bytes, text_tokens;
    uint64_t in_total, in_done; // the inputs' bytes on disk, and those of the inputs read whole (the ETA)
    double t0, shown;
    // the batch: copies of the documents' text, and their ids once encoded
    char *text[BATCH_DOCS];
    size_t len[BATCH_DOCS], n[BATCH_DOCS], cap[BATCH_DOCS];
    int32_t *ids[BATCH_DOCS];
    int count;
    size_t batch_bytes;
} Prep;

// A document's ids; text (a document tokenised here, of len bytes): then the EOS, and counted in the
// tokens per byte.
static void append_doc(Prep *p, const int32_t *ids, size_t n, size_t len, int text) {
    Split *s = p->docs < p->o->val_docs ? &p->val : &p->train;
    p->docs++;
    s->docs++;
    p->bytes += len;
    p->text_tokens += text ? n : 0;
    for (size_t i = 0; i < n + (text && p->eos >= 0); i++) {
        if (s->n == s->cap) {
            s->cap = s->cap ? s->cap * 2 : 1 << 16;
            s->tok = xrealloc(s->tok, s->cap * sizeof *s->tok);
        }
        s->tok[s->n++] = i < n ? ids[i] : p->eos;
        if (s->n >= (size_t)p->o->shard_tokens) flush(s, p->dir, p->vocab);
    }
}

static const InFile *cur_in; // the text input being read: how far, for the ETA

// The progress line, where someone watches (stderr a terminal), at most once a second; at: the bytes of
// the current input read so far.
static void progress(Prep *p, uint64_t at) {
    double now = now_seconds(), dt = now - p->t0, done = (double)(p->in_done + at);
    if (!isatty(STDERR_FILENO) || now - p->shown <= 1) return;
    p->shown = now;
    char eta[32] = "?";
    if (done > 0 && (double)p->in_total >= done) {
        double left = dt * ((double)p->in_total - done) / done;
        snprintf(eta, sizeof eta, "%dm%02ds", (int)(left / 60), (int)left % 60);
    }
    fprintf(stderr, "\r%s: %ld documents, %zu tokens, %.1f MB/s, ETA %s   ", who, p->docs,
            p->train.total + p->train.n + p->val.total + p->val.n, (double)p->bytes / 1e6 / dt, eta);
}

static void run_batch(Prep *p) {
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < p->count; i++)
        p->n[i] = tok_encode(p->t, p->text[i], p->len[i], p->o->add_special, &p->ids[i], &p->cap[i]);
    for (int i = 0; i < p->count; i++) {
        append_doc(p, p->ids[i], p->n[i], p->len[i], 1);
        free(p->text[i]);
    }
    p->count = 0;
    p->batch_bytes = 0;
    progress(p, cur_in ? infile_consumed(cur_in) : 0);
}

static void add_doc(void *arg, const char *text, size_t len) {
    Prep *p = arg;
    p->text[p->count] = xmalloc(len + 1);
    memcpy(p->text[p->count], text, len);
    p->len[p->count++] = len;
    p->batch_bytes += len;
    if (p->count == BATCH_DOCS || p->batch_bytes >= BATCH_BYTES) run_batch(p);
}

int prep_is_jsonl(const char *path) {
    size_t n = strlen(path) - infile_suffix(path);
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
    InFile *r = infile_open(path, who);
    cur_in = r;
    int json = prep_is_jsonl(path);
    if (!json && !p->o->lines) { // the whole file is one document
        size_t n;
        char *all = infile_all(r, &n);
        if (n) p->doc(p->arg, all, n);
    } else {
        size_t len;
        long line = 0;
        for (char *s; (s = infile_line(r, &len));) {
            line++;
            size_t k = 0;
            while (k < len && (s[k] == ' ' || s[k] == '\t' || s[k] == '\r')) k++;
            if (k == len) continue; // blank lines are no documents
            if (json) json_doc(p, path, line, s, len);
            else p->doc(p->arg, s, len);
        }
    }
    cur_in = NULL;
    infile_close(r);
}

// The next path of a '\n'-separated list at *s into path; 0 at the end.
static int next_input(const char **s, char *path, size_t cap) {
    if (!**s) return 0;
    size_t n = strcspn(*s, "\n");
    snprintf(path, cap, "%.*s", (int)n, *s);
    *s += n + ((*s)[n] == '\n');
    return 1;
}

void prep_read(const PrepOptions *o, void (*doc)(void *arg, const char *text, size_t len), void *arg,
               const char *whom) {
    Sink k = {o, doc, arg};
    who = whom;
    char path[4096], prefix[1100];
    for (const char *s = o->inputs; next_input(&s, path, sizeof path);) {
        if (megatron_path(path, prefix, sizeof prefix))
            DIE("%s: '%s' is a Megatron dataset: token ids, no text to read", who, path);
        read_input(&k, path);
    }
}

// A Megatron dataset's documents, appended as they are after the documents before them (their EOD, if
// Megatron's preprocessing added one, is in the data); each id must fit the vocabulary.
static void megatron_input(Prep *p, const char *prefix, uint64_t size) {
    run_batch(p); // the text documents before it go first
    MegatronSet *m = megatron_open(prefix, who);
    int32_t *ids = NULL;
    for (size_t d = 0; d < megatron_docs(m); d++) {
        uint64_t n = megatron_doc_tokens(m, d);
        ids = xrealloc(ids, (n ? n : 1) * sizeof *ids);
        megatron_read_doc(m, d, ids);
        for (uint64_t i = 0; i < n; i++)
            if (ids[i] >= p->vocab)
                DIE("%s: Megatron dataset '%s': token %d (document %zu) is beyond the tokenizer's vocabulary "
                    "(%d "
                    "ids)",
                    who, prefix, ids[i], d, p->vocab);
        append_doc(p, ids, (size_t)n, 0, 0);
        p->megatron_docs++;
        if (d % 4096 == 4095) progress(p, (uint64_t)((double)size * (double)d / (double)megatron_docs(m)));
    }
    free(ids);
    megatron_close(m);
}

// Without a tokenizer (Megatron inputs only): the largest id of the inputs + 1, read through once.
static int megatron_vocab(const PrepOptions *o) {
    char path[4096], prefix[1100];
    int32_t top = 0, *ids = NULL;
    for (const char *s = o->inputs; next_input(&s, path, sizeof path);) {
        if (!megatron_path(path, prefix, sizeof prefix))
            DIE("%s: '%s' is text: it needs --tokenizer DIR|tokenizer.json", who, path);
        MegatronSet *m = megatron_open(prefix, who);
        for (size_t d = 0; d < megatron_docs(m); d++) {
            uint64_t n = megatron_doc_tokens(m, d);
            ids = xrealloc(ids, (n ? n : 1) * sizeof *ids);
            megatron_read_doc(m, d, ids);
            for (uint64_t i = 0; i < n; i++) top = ids[i] > top ? ids[i] : top;
        }
        megatron_close(m);
    }
    free(ids);
    return top + 1;
}

static void summary(const Prep *p, const char *from, const char *shown) {
    if (p->shown > 0) fprintf(stderr, "\n");
    double dt = now_seconds() - p->t0;
    char eos[200] = "no EOS";
    if (p->eos >= 0) snprintf(eos, sizeof eos, "EOS %d (from %s)", p->eos, from);
    char meg[64] = ""; // how many came from Megatron datasets, where any did
    if (p->megatron_docs) snprintf(meg, sizeof meg, "; %ld from Megatron datasets", p->megatron_docs);
    printf("%s: %ld documents (%ld held out%s), %zu tokens (%zu train in %ld shard%s, %zu val in %ld), "
           "%.4f tokens per byte, %s tokens, %s, %.1f MB/s on %d thread%s -> %s\n",
           who, p->docs, p->val.docs, meg, p->train.total + p->val.total, p->train.total, p->train.shards,
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
    p->vocab = t ? tok_vocab_size(t) : megatron_vocab(o);
    p->t0 = now_seconds();
    Sink k = {o, add_doc, p};
    char path[4096], prefix[1100], bin[1200];
    for (int pass = 0; pass < 2; pass++) // the inputs' sizes, then the inputs
        for (const char *s = o->inputs; next_input(&s, path, sizeof path);) {
            int meg = megatron_path(path, prefix, sizeof prefix);
            if (meg) snprintf(bin, sizeof bin, "%s.bin", prefix);
            struct stat st;
            uint64_t size = stat(meg ? bin : path, &st) == 0 ? (uint64_t)st.st_size : 0;
            if (!pass) p->in_total += size;
            else if (meg) megatron_input(p, prefix, size);
            else read_input(&k, path);
            p->in_done += pass ? size : 0;
        }
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
    char path[4096], prefix[1100], text[4096] = ""; // text: the first input that is text, not Megatron's
    for (const char *s = o->inputs; !text[0] && next_input(&s, path, sizeof path);)
        if (!megatron_path(path, prefix, sizeof prefix)) snprintf(text, sizeof text, "%s", path);
    if (!*o->tokenizer && text[0])
        DIE("prep: --tokenizer DIR|tokenizer.json is required (to read '%s')", text);
    if (!*o->tokenizer && *o->eos)
        DIE("prep: --eos needs --tokenizer (Megatron datasets hold their own EOD)");
    Tokenizer *t = *o->tokenizer ? tok_load(o->tokenizer) : NULL;
    const char *from = "--eos";
    int eos = !t ? -1 : *o->eos ? tok_token_id(t, o->eos) : prep_find_eos(t, o->tokenizer, &from);
    if (*o->eos && eos < 0) DIE("prep: --eos '%s' is not a token of the tokenizer", o->eos);
    if (eos < 0 && text[0])
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
    if (t) tok_free(t);
}
