// cmd_tokenize.c (cli) — `moe tokenize`: the token ids of a text (one line, space-separated) with a
// Hugging Face tokenizer, or (--decode) the text of ids, whole or through the streaming decoder.
// Must not hold: the tokenizer itself (text/).
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "cli/commands.h"
#include "core/common.h"
#include "text/tokenizer.h"

// The whole input: the file at path, or standard input when path is "".
static char *read_input(const char *path, size_t *len) {
    FILE *f = *path ? fopen(path, "rb") : stdin;
    if (!f) DIE("tokenize: cannot read --in '%s' (%s)", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *s = xmalloc(cap);
    for (size_t got; (got = fread(s + n, 1, cap - n - 1, f)) > 0;) {
        n += got;
        if (n + 1 == cap) s = xrealloc(s, cap *= 2);
    }
    if (ferror(f))
        DIE("tokenize: cannot read %s%s%s (%s)", *path ? "'" : "", *path ? path : "standard input",
            *path ? "'" : "", strerror(errno));
    if (*path) fclose(f);
    s[n] = 0;
    *len = n;
    return s;
}

// Whitespace-separated decimal ids; dies naming the first word that is not one.
static int32_t *parse_ids(const char *s, size_t *n) {
    size_t cap = 256;
    int32_t *ids = xmalloc(cap * sizeof *ids);
    *n = 0;
    for (const char *p = s;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 2147483647L || (*end && !strchr(" \t\r\n", *end)))
            DIE("tokenize --decode: '%.*s' is not a token id", (int)strcspn(p, " \t\r\n"), p);
        if (*n == cap) ids = xrealloc(ids, (cap *= 2) * sizeof *ids);
        ids[(*n)++] = (int32_t)v;
        p = end;
    }
    return ids;
}

int cmd_tokenize(State *s) {
    const CliOptions *o = &s->cli;
    if (!*o->tokenizer) DIE("tokenize: --tokenizer DIR|tokenizer.json is required");
    if ((o->skip_special || o->stream) && !o->decode)
        DIE("tokenize: --skip-special and --stream need --decode");
    if (o->add_special && o->decode) DIE("tokenize: --add-special is for encoding (not with --decode)");
    Tokenizer *t = tok_load(o->tokenizer);
    size_t len;
    char *text = read_input(o->in, &len);
    if (!o->decode) {
        size_t cap = 0;
        int32_t *ids = NULL;
        size_t n = tok_encode(t, text, len, o->add_special, &ids, &cap);
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
        free(ids);
    } else {
        size_t n;
        int32_t *ids = parse_ids(text, &n);
        for (size_t i = 0; i < n; i++)
            if (ids[i] >= tok_vocab_size(t))
                DIE("tokenize --decode: token id %d is outside the vocabulary (0 .. %d)", ids[i],
                    tok_vocab_size(t) - 1);
        if (o->stream) {
            TokStream *st = tok_stream_new(t, o->skip_special);
            for (size_t i = 0; i < n; i++) {
                size_t m;
                const char *piece = tok_stream_step(st, ids[i], &m);
                fwrite(piece, 1, m, stdout);
                fflush(stdout);
            }
            tok_stream_free(st);
        } else {
            size_t m;
            char *out = tok_decode(t, ids, n, o->skip_special, &m);
            fwrite(out, 1, m, stdout);
            free(out);
        }
        free(ids);
    }
    free(text);
    tok_free(t);
    if (fflush(stdout) || ferror(stdout)) DIE("tokenize: cannot write the output (%s)", strerror(errno));
    return 0;
}
