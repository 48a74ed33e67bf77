// corpus.c (text) — a text file tokenised into a cache of llm.c shards (see corpus.h): the file's print,
// the EOS rule for a corpus, and the cache directory with its source.json. Must not hold: tokenisation
// or shard writing (prep.c does both), a run's records (train/).
#include "text/corpus.h"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "core/common.h"
#include "text/prep.h"

FilePrint file_print(const char *path, const char *who) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) DIE("%s: cannot read '%s' (%s)", who, path, strerror(errno));
    enum { CHUNK = 1 << 20 };
    char *b = xmalloc(CHUNK);
    FilePrint p = {0, 0};
    for (;;) {
        ssize_t got = read(fd, b, CHUNK);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) DIE("%s: cannot read '%s' (%s)", who, path, strerror(errno));
        if (got == 0) break;
        p.hash = hash_bytes(b, (size_t)got, p.hash);
        p.bytes += (uint64_t)got;
    }
    free(b);
    close(fd);
    return p;
}

int corpus_eos(const Tokenizer *t, const char *tok_path, const char *text, const char *who,
               const char **from) {
    *from = "";
    if (!file_exists(text)) DIE("%s: cannot read '%s' (no such file)", who, text);
    int eos = prep_find_eos(t, tok_path, from);
    if (eos < 0 && prep_is_jsonl(text))
        DIE("%s %s: its documents need an EOS token between them, and none is named beside the tokenizer "
            "'%s' (tokenizer_config.json's eos_token, special_tokens_map.json, config.json's eos_token_id)",
            who, text, tok_path);
    return eos;
}

// The cache's record of what it holds.
static cJSON *source_json(const char *text, FilePrint tp, FilePrint tok, int eos) {
    char h[32];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "text", text);
    cJSON_AddNumberToObject(j, "bytes", (double)tp.bytes);
    snprintf(h, sizeof h, "%016llx", (unsigned long long)tp.hash);
    cJSON_AddStringToObject(j, "hash", h);
    snprintf(h, sizeof h, "%016llx", (unsigned long long)tok.hash);
    cJSON_AddStringToObject(j, "tokenizer", h);
    cJSON_AddNumberToObject(j, "eos", eos);
    return j;
}

// A cache directory being written, removed if the process dies first (moe_set_die_cleanup); with it the
// directories above it that this made (made: the topmost).
static char part[2200], made[2200];
static void remove_part(void) {
    if (part[0]) rm_rf(part);
    if (made[0]) rm_rf(made);
}

int corpus_shards(const Tokenizer *t, FilePrint tok, int eos, const char *eos_from, const char *text,
                  const char *dir, const char *name, int build, const char *who, char *pattern, size_t n,
                  FilePrint *print) {
    char sub[2100], src[2200];
    join_path(sub, sizeof sub, dir, name);
    join_path(src, sizeof src, sub, "source.json");
    snprintf(pattern, n, "%s/train_*.bin", sub);
    char *abs = realpath(text, NULL);
    if (!abs) DIE("%s: cannot read '%s' (%s)", who, text, strerror(errno));
    FilePrint tp = file_print(abs, who);
    if (print) *print = tp;
    cJSON *want = source_json(abs, tp, tok, eos);
    long at;
    cJSON *have = file_exists(src) ? json_read_file(who, NULL, src, &at) : NULL;
    int same = have && cJSON_Compare(want, have, 1);
    cJSON_Delete(have);
    if (same || !build) {
        cJSON_Delete(want);
        free(abs);
        return same;
    }
    made[0] = 0; // the topmost of dir and the directories above it that do not exist yet
    char cur[2200], up[2200];
    snprintf(cur, sizeof cur, "%s", dir);
    while (!dir_exists(cur)) {
        snprintf(made, sizeof made, "%s", cur);
        path_parent(up, sizeof up, cur);
        if (!strcmp(up, cur)) break;
        snprintf(cur, sizeof cur, "%s", up);
    }
    mkdir_p(dir);
    snprintf(part, sizeof part, "%s.part", sub);
    if (dir_exists(part)) rm_rf(part); // an earlier attempt's leftover
    mkdir_p(part);
    moe_set_die_cleanup(remove_part);
    PrepOptions o = {.inputs = abs, .out = sub, .field = "text", .shard_tokens = 100000000};
    prep_write(&o, t, eos, eos_from, part, who);
    char tmp[2300];
    join_path(tmp, sizeof tmp, part, "source.json");
    json_write_file(tmp, want);
    if (dir_exists(sub) && rm_rf(sub) != 0) DIE("%s: cannot remove the old cache '%s'", who, sub);
    if (rename(part, sub) != 0) DIE("%s: cannot rename '%s' to '%s' (%s)", who, part, sub, strerror(errno));
    fsync_dir(dir);
    moe_set_die_cleanup(NULL);
    part[0] = made[0] = 0;
    cJSON_Delete(want);
    free(abs);
    return 1;
}
