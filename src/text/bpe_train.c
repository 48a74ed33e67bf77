// bpe_train.c (text) — the byte-level BPE trainer (see bpe_train.h). The documents are pre-tokenised by
// the tokenizer being written (its ByteLevel pre-tokenizer with GPT-2's regex, through tok_pretokenize)
// and counted as words; then each merge takes the most frequent pair from a max-heap of pair counts and
// rewrites only the words that hold it (each pair keeps the list of words where it occurs), adjusting
// the counts of the pairs those words lose and gain; a popped entry whose count went stale is pushed
// again with its count (lazy deletion). Must not hold: the tokenizer's encoder, reading inputs.
#include "text/bpe_train.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <cjson/cJSON.h>
#include "core/common.h"
#include "text/tok_impl.h"

// ---------------------------------------------------------------------------------------------
// Words: distinct pre-tokens (bytes) with their counts.

typedef struct {
    Buf pool; // the words' bytes
    size_t *off;
    uint32_t *len;
    int64_t *count;
    int32_t *slot; // open addressing: word index or -1
    size_t n, cap, mask;
    uint64_t pieces;
} Words;

static uint64_t bytes_hash(const char *s, size_t n) { return hash_bytes(s, n, 0); }

static void words_grow(Words *w) {
    size_t slots = w->mask ? (w->mask + 1) * 2 : 1 << 16;
    free(w->slot);
    w->slot = xmalloc(slots * sizeof *w->slot);
    memset(w->slot, 0xff, slots * sizeof *w->slot);
    w->mask = slots - 1;
    for (size_t i = 0; i < w->n; i++) {
        size_t h = bytes_hash(w->pool.p + w->off[i], w->len[i]) & w->mask;
        while (w->slot[h] >= 0) h = (h + 1) & w->mask;
        w->slot[h] = (int32_t)i;
    }
}

static void word_add(void *arg, const char *s, size_t n) {
    Words *w = arg;
    w->pieces++;
    if (2 * (w->n + 1) > w->mask + 1) words_grow(w);
    size_t h = bytes_hash(s, n) & w->mask;
    for (; w->slot[h] >= 0; h = (h + 1) & w->mask) {
        int32_t i = w->slot[h];
        if (w->len[i] == n && !memcmp(w->pool.p + w->off[i], s, n)) {
            w->count[i]++;
            return;
        }
    }
    CHECK(w->n < INT32_MAX, "tokenizer train: more than 2^31 distinct words");
    if (w->n == w->cap) {
        w->cap = w->cap ? w->cap * 2 : 1 << 14;
        w->off = xrealloc(w->off, w->cap * sizeof *w->off);
        w->len = xrealloc(w->len, w->cap * sizeof *w->len);
        w->count = xrealloc(w->count, w->cap * sizeof *w->count);
    }
    w->off[w->n] = w->pool.n;
    w->len[w->n] = (uint32_t)n;
    w->count[w->n] = 1;
    buf_put(&w->pool, s, n);
    w->slot[h] = (int32_t)w->n++;
}

typedef struct {
    const Tokenizer *t;
    Words *w;
    uint64_t docs, bytes;
} Feed;

// A long document is pre-tokenised a piece at a time (the memory of one piece, not of the document), cut
// only before an ASCII white space that follows a printable ASCII character: GPT-2's regex has no token
// that runs from such a character into white space, no lookbehind, and its lookahead looks forward only,
// so the words are those of the whole document.
#define FEED_PIECE ((size_t)1 << 20)

static void feed_doc(void *arg, const char *text, size_t len) {
    Feed *f = arg;
    f->docs++;
    f->bytes += len;
    while (len > 2 * FEED_PIECE) {
        size_t cut = FEED_PIECE;
        while (
            cut < len &&
            !(strchr(" \t\n\r\v\f", text[cut]) && text[cut] && text[cut - 1] > ' ' && text[cut - 1] < 0x7f))
            cut++;
        if (cut == len) break;
        tok_pretokenize(f->t, text, cut, word_add, f->w);
        text += cut;
        len -= cut;
    }
    tok_pretokenize(f->t, text, len, word_add, f->w);
}

// ---------------------------------------------------------------------------------------------
// Pairs: (left, right) -> count and the words where the pair was seen (a word may be listed while it no
// longer holds the pair; a merge checks).

typedef struct {
    int64_t count;
    int32_t a, b;
    int32_t *w; // word indices
    uint32_t nw, capw;
    uint32_t touched; // the merge that last added to the pair (its push after the merge)
} Pair;

typedef struct {
    Pair *p;
    size_t n, cap;
    int32_t *slot;
    size_t mask;
} Pairs;

static uint64_t pkey(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
static size_t pslot(uint64_t k) { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20); }

static void pairs_grow(Pairs *t) {
    size_t slots = t->mask ? (t->mask + 1) * 2 : 1 << 16;
    free(t->slot);
    t->slot = xmalloc(slots * sizeof *t->slot);
    memset(t->slot, 0xff, slots * sizeof *t->slot);
    t->mask = slots - 1;
    for (size_t i = 0; i < t->n; i++) {
        size_t h = pslot(pkey(t->p[i].a, t->p[i].b)) & t->mask;
        while (t->slot[h] >= 0) h = (h + 1) & t->mask;
        t->slot[h] = (int32_t)i;
    }
}

// The pair's index, added (count 0) when absent.
static int32_t pair_get(Pairs *t, int32_t a, int32_t b) {
    if (2 * (t->n + 1) > t->mask + 1) pairs_grow(t);
    uint64_t k = pkey(a, b);
    size_t h = pslot(k) & t->mask;
    for (; t->slot[h] >= 0; h = (h + 1) & t->mask) {
        const Pair *p = &t->p[t->slot[h]];
        if (p->a == a && p->b == b) return t->slot[h];
    }
    CHECK(t->n < INT32_MAX, "tokenizer train: more than 2^31 distinct pairs");
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 1 << 16;
        t->p = xrealloc(t->p, t->cap * sizeof *t->p);
    }
    t->p[t->n] = (Pair){.a = a, .b = b, .touched = UINT32_MAX};
    t->slot[h] = (int32_t)t->n;
    return (int32_t)t->n++;
}

static void pair_note_word(Pair *p, int32_t w) {
    if (p->nw && p->w[p->nw - 1] == w) return;
    if (p->nw == p->capw) {
        p->capw = p->capw ? p->capw * 2 : 4;
        p->w = xrealloc(p->w, p->capw * sizeof *p->w);
    }
    p->w[p->nw++] = w;
}

// ---------------------------------------------------------------------------------------------
// The heap of (count, pair): the largest count first, ties to the lowest (left id, right id).

typedef struct {
    int64_t count;
    int32_t a, b;
} Entry;

typedef struct {
    Entry *e;
    size_t n, cap;
} Heap;

static int above(Entry x, Entry y) {
    if (x.count != y.count) return x.count > y.count;
    return x.a != y.a ? x.a < y.a : x.b < y.b;
}

static void heap_push(Heap *h, Entry x) {
    if (h->n == h->cap) {
        h->cap = h->cap ? h->cap * 2 : 1 << 16;
        h->e = xrealloc(h->e, h->cap * sizeof *h->e);
    }
    size_t i = h->n++;
    while (i && above(x, h->e[(i - 1) / 2])) {
        h->e[i] = h->e[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h->e[i] = x;
}

static Entry heap_pop(Heap *h) {
    Entry top = h->e[0], x = h->e[--h->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->n) break;
        if (c + 1 < h->n && above(h->e[c + 1], h->e[c])) c++;
        if (!above(h->e[c], x)) break;
        h->e[i] = h->e[c];
        i = c;
    }
    if (h->n) h->e[i] = x;
    return top;
}

// ---------------------------------------------------------------------------------------------
// The training state: tokens (raw bytes by id), each word's symbols, the pairs and the merges.

typedef struct {
    Words w;
    int32_t *sym; // the words' symbols, word i at sym[w.off[i]..] (a word never grows)
    uint32_t *nsym;
    uint32_t *stamp; // the merge that last rewrote the word
    Pairs pairs;
    Heap heap;
    Buf tok; // the tokens' bytes
    size_t *toff;
    uint32_t *tlen;
    int ntok, vocab;
    StrTab by_bytes; // token bytes -> id (to reuse an id when a merge makes an existing token)
    int32_t (*merge)[2];
    int nmerge;
    int32_t byte_id[256];
} Train;

static void token_add(Train *t, const char *s, size_t n, int32_t id) {
    t->toff[id] = t->tok.n;
    t->tlen[id] = (uint32_t)n;
    buf_put(&t->tok, s, n);
    strtab_add(&t->by_bytes, s, n, id);
}

static int by_char(const void *x, const void *y) {
    uint32_t a = byte_char[*(const uint8_t *)x], b = byte_char[*(const uint8_t *)y];
    return a < b ? -1 : a > b;
}

// The first ids: the special tokens, then the 256 bytes ordered by their ByteLevel characters.
static void alphabet(Train *t, char **special, int nspecial) {
    for (int i = 0; i < nspecial; i++) token_add(t, special[i], strlen(special[i]), i);
    uint8_t order[256];
    for (int b = 0; b < 256; b++) order[b] = (uint8_t)b;
    qsort(order, 256, 1, by_char);
    for (int k = 0; k < 256; k++) {
        char c = (char)order[k];
        t->byte_id[order[k]] = nspecial + k;
        token_add(t, &c, 1, nspecial + k);
    }
    t->ntok = nspecial + 256;
}

static void count_pairs(Train *t) {
    const Words *w = &t->w;
    size_t total = w->pool.n;
    t->sym = xmalloc((total + 1) * sizeof *t->sym);
    t->nsym = xmalloc((w->n + 1) * sizeof *t->nsym);
    t->stamp = xmalloc((w->n + 1) * sizeof *t->stamp);
    for (size_t i = 0; i < w->n; i++) {
        const uint8_t *s = (const uint8_t *)w->pool.p + w->off[i];
        int32_t *y = t->sym + w->off[i];
        t->nsym[i] = w->len[i];
        t->stamp[i] = UINT32_MAX;
        for (uint32_t k = 0; k < w->len[i]; k++) y[k] = t->byte_id[s[k]];
        for (uint32_t k = 0; k + 1 < w->len[i]; k++) {
            int32_t q = pair_get(&t->pairs, y[k], y[k + 1]); // (before p: it may move the pairs)
            Pair *p = &t->pairs.p[q];
            p->count += w->count[i];
            pair_note_word(p, (int32_t)i);
        }
    }
    for (size_t i = 0; i < t->pairs.n; i++)
        heap_push(&t->heap, (Entry){t->pairs.p[i].count, t->pairs.p[i].a, t->pairs.p[i].b});
}

// Word i with the pair (a, b) merged into id x, left to right; the counts of the pairs it had and has
// adjusted; pairs that gain (they hold x) note the word and the merge m, and are listed in *touched.
static void merge_word(Train *t, int32_t i, int32_t a, int32_t b, int32_t x, uint32_t m, int32_t **touched,
                       size_t *nt, size_t *capt) {
    int32_t *y = t->sym + t->w.off[i];
    uint32_t n = t->nsym[i], j = 0, k;
    int64_t c = t->w.count[i];
    for (k = 0; k + 1 < n && !(y[k] == a && y[k + 1] == b); k++) {}
    if (k + 1 >= n) return; // (listed, but the pair went in an earlier merge of the word)
    for (k = 0; k + 1 < n; k++) {
        int32_t q = pair_get(&t->pairs, y[k], y[k + 1]);
        t->pairs.p[q].count -= c;
    }
    for (k = 0; k < n; j++) {
        if (k + 1 < n && y[k] == a && y[k + 1] == b) {
            y[j] = x;
            k += 2;
        } else y[j] = y[k++];
    }
    t->nsym[i] = j;
    for (k = 0; k + 1 < j; k++) {
        int32_t q = pair_get(&t->pairs, y[k], y[k + 1]);
        Pair *p = &t->pairs.p[q];
        p->count += c;
        if (y[k] != x && y[k + 1] != x) continue;
        pair_note_word(p, i);
        if (p->touched == m) continue;
        p->touched = m;
        if (*nt == *capt) *touched = xrealloc(*touched, (*capt = *capt * 2 + 64) * sizeof **touched);
        (*touched)[(*nt)++] = q;
    }
}

static void train_merges(Train *t) {
    int32_t *touched = NULL;
    size_t capt = 0;
    while (t->ntok < t->vocab && t->heap.n) {
        Entry e = heap_pop(&t->heap);
        int32_t q = pair_get(&t->pairs, e.a, e.b);
        Pair *p = &t->pairs.p[q];
        if (p->count != e.count) { // stale: again with its count
            if (p->count > 0) heap_push(&t->heap, (Entry){p->count, e.a, e.b});
            continue;
        }
        if (e.count < 1) break;
        uint32_t m = (uint32_t)t->nmerge;
        size_t la = t->tlen[e.a], lb = t->tlen[e.b];
        char *s = xmalloc(la + lb);
        memcpy(s, t->tok.p + t->toff[e.a], la);
        memcpy(s + la, t->tok.p + t->toff[e.b], lb);
        int32_t x = strtab_get(&t->by_bytes, s, la + lb);
        if (x < 0) token_add(t, s, la + lb, x = t->ntok++);
        free(s);
        t->merge[t->nmerge][0] = e.a;
        t->merge[t->nmerge++][1] = e.b;
        int32_t *list = p->w; // (the list of (a, b) does not grow while its words are merged)
        uint32_t nw = p->nw;
        p->w = NULL;
        p->nw = p->capw = 0;
        size_t nt = 0;
        for (uint32_t k = 0; k < nw; k++) {
            if (t->stamp[list[k]] == m) continue;
            t->stamp[list[k]] = m;
            merge_word(t, list[k], e.a, e.b, x, m, &touched, &nt, &capt);
        }
        free(list);
        for (size_t k = 0; k < nt; k++) {
            const Pair *q = &t->pairs.p[touched[k]];
            if (q->count > 0) heap_push(&t->heap, (Entry){q->count, q->a, q->b});
        }
    }
    free(touched);
}

// ---------------------------------------------------------------------------------------------
// tokenizer.json

// A token's bytes as ByteLevel characters (UTF-8), into out (room for 2 bytes a byte + 1).
static void byte_level(char *out, const char *s, size_t n) {
    size_t o = 0;
    for (size_t i = 0; i < n; i++) o += (size_t)utf8_put(out + o, byte_char[(uint8_t)s[i]]);
    out[o] = 0;
}

static cJSON *byte_level_step(const char *type, int prefix, int trim) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "type", type);
    cJSON_AddBoolToObject(j, "add_prefix_space", prefix);
    cJSON_AddBoolToObject(j, "trim_offsets", trim);
    cJSON_AddBoolToObject(j, "use_regex", 1);
    return j;
}

// The tokenizer.json of the tokens so far (and the merges): Hugging Face's layout for a byte-level BPE.
static cJSON *tokenizer_json(const Train *t, int nspecial) {
    cJSON *j = cJSON_CreateObject(), *added = cJSON_CreateArray(), *model = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "version", "1.0");
    cJSON_AddNullToObject(j, "truncation");
    cJSON_AddNullToObject(j, "padding");
    for (int i = 0; i < nspecial; i++) {
        cJSON *a = cJSON_CreateObject();
        char *s = xmalloc(t->tlen[i] + 1);
        memcpy(s, t->tok.p + t->toff[i], t->tlen[i]);
        s[t->tlen[i]] = 0;
        cJSON_AddNumberToObject(a, "id", i);
        cJSON_AddStringToObject(a, "content", s);
        cJSON_AddBoolToObject(a, "single_word", 0);
        cJSON_AddBoolToObject(a, "lstrip", 0);
        cJSON_AddBoolToObject(a, "rstrip", 0);
        cJSON_AddBoolToObject(a, "normalized", 0);
        cJSON_AddBoolToObject(a, "special", 1);
        cJSON_AddItemToArray(added, a);
        free(s);
    }
    cJSON_AddItemToObject(j, "added_tokens", added);
    cJSON_AddNullToObject(j, "normalizer");
    cJSON_AddItemToObject(j, "pre_tokenizer", byte_level_step("ByteLevel", 0, 1));
    cJSON_AddItemToObject(j, "post_processor", byte_level_step("ByteLevel", 1, 0));
    cJSON_AddItemToObject(j, "decoder", byte_level_step("ByteLevel", 1, 1));
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddNullToObject(model, "continuing_subword_prefix");
    cJSON_AddNullToObject(model, "end_of_word_suffix");
    cJSON_AddBoolToObject(model, "fuse_unk", 0);
    cJSON_AddBoolToObject(model, "byte_fallback", 0);
    cJSON_AddBoolToObject(model, "ignore_merges", 0);
    cJSON *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    size_t longest = 0;
    for (int i = 0; i < t->ntok; i++) longest = t->tlen[i] > longest ? t->tlen[i] : longest;
    char *a = xmalloc(4 * longest + 8), *b = xmalloc(4 * longest + 8), *ab = xmalloc(8 * longest + 16);
    for (int i = 0; i < t->ntok; i++) {
        if (i < nspecial) memcpy(a, t->tok.p + t->toff[i], t->tlen[i]), a[t->tlen[i]] = 0;
        else byte_level(a, t->tok.p + t->toff[i], t->tlen[i]);
        cJSON_AddNumberToObject(vocab, a, i);
    }
    for (int k = 0; k < t->nmerge; k++) { // "left right" (byte-level tokens hold no space)
        byte_level(a, t->tok.p + t->toff[t->merge[k][0]], t->tlen[t->merge[k][0]]);
        byte_level(b, t->tok.p + t->toff[t->merge[k][1]], t->tlen[t->merge[k][1]]);
        snprintf(ab, 8 * longest + 16, "%s %s", a, b);
        cJSON_AddItemToArray(merges, cJSON_CreateString(ab));
    }
    free(a);
    free(b);
    free(ab);
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(j, "model", model);
    return j;
}

// ---------------------------------------------------------------------------------------------

static char tmp_out[2][1200];
static void remove_tmp(void) {
    for (int k = 0; k < 2; k++)
        if (tmp_out[k][0]) remove(tmp_out[k]);
}

// out: a .json file, or a directory with tokenizer.json and tokenizer_config.json; each written under a
// temporary name, then renamed.
static void write_out(const cJSON *tj, const char *eos, const char *out) {
    size_t n = strlen(out);
    int file = n > 5 && !strcmp(out + n - 5, ".json");
    char dst[2][1200];
    if (file) snprintf(dst[0], sizeof dst[0], "%s", out);
    else {
        mkdir_p(out);
        join_path(dst[0], sizeof dst[0], out, "tokenizer.json");
        join_path(dst[1], sizeof dst[1], out, "tokenizer_config.json");
    }
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "eos_token", eos);
    cJSON_AddStringToObject(cfg, "tokenizer_class", "PreTrainedTokenizerFast");
    moe_set_die_cleanup(remove_tmp);
    for (int k = 0; k < (file ? 1 : 2); k++) {
        snprintf(tmp_out[k], sizeof tmp_out[k], "%s.tmp", dst[k]);
        json_write_file(tmp_out[k], k ? cfg : tj);
    }
    for (int k = 0; k < (file ? 1 : 2); k++)
        if (rename(tmp_out[k], dst[k]) != 0)
            DIE("tokenizer train: cannot rename '%s' to '%s' (%s)", tmp_out[k], dst[k], strerror(errno));
    moe_set_die_cleanup(NULL);
    memset(tmp_out, 0, sizeof tmp_out);
    cJSON_Delete(cfg);
}

// The special tokens, comma-separated, into a malloc'd array (*n of them; the strings in one block).
static char **split_specials(const char *specials, int *n) {
    char *s = xstrdup(specials), **v = xmalloc((strlen(specials) + 2) * sizeof *v);
    *n = 0;
    for (;;) {
        char *e = s + strcspn(s, ",");
        int last = *e == 0;
        *e = 0;
        if (!*s) DIE("tokenizer train: --special '%s' has an empty token", specials);
        for (int k = 0; k < *n; k++)
            if (!strcmp(v[k], s)) DIE("tokenizer train: --special names '%s' twice", s);
        v[(*n)++] = s;
        if (last) return v;
        s = e + 1;
    }
}

void bpe_train_run(const PrepOptions *in, int vocab, const char *specials, const char *out) {
    double t0 = now_seconds();
    byte_table_init();
    int nspecial = 0;
    char **special = split_specials(specials, &nspecial);
    if (!nspecial) DIE("tokenizer train: --special names no token (the first is the EOS)");
    if (vocab < nspecial + 256 || vocab > 1 << 24)
        DIE("tokenizer train: --vocab %d: it must hold the %d special token%s and the 256 bytes (at least "
            "%d; at "
            "most %d)",
            vocab, nspecial, nspecial == 1 ? "" : "s", nspecial + 256, 1 << 24);
    Train *t = xcalloc(1, sizeof *t);
    t->vocab = vocab;
    t->toff = xmalloc((size_t)vocab * sizeof *t->toff);
    t->tlen = xmalloc((size_t)vocab * sizeof *t->tlen);
    t->merge = xmalloc((size_t)vocab * sizeof *t->merge);
    strtab_init(&t->by_bytes, vocab);
    alphabet(t, special, nspecial);
    cJSON *boot = tokenizer_json(t, nspecial); // no merges yet: its pre-tokenizer splits the documents
    Tokenizer *pre = tok_from_json(boot, "(the tokenizer being trained)");
    cJSON_Delete(boot);
    Feed f = {pre, &t->w, 0, 0};
    prep_read(in, feed_doc, &f, "tokenizer train");
    tok_free(pre);
    if (!t->w.n) DIE("tokenizer train: the inputs hold no text to learn from");
    double t1 = now_seconds();
    count_pairs(t);
    train_merges(t);
    cJSON *tj = tokenizer_json(t, nspecial);
    write_out(tj, special[0], out);
    cJSON_Delete(tj);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    printf("tokenizer train: %llu documents, %.1f MB, %llu words (%zu distinct) in %.1f s; %d merges, "
           "vocabulary "
           "%d in %.1f s; peak memory %.0f MB -> %s\n",
           (unsigned long long)f.docs, f.bytes / 1e6, (unsigned long long)t->w.pieces, t->w.n, t1 - t0,
           t->nmerge, t->ntok, now_seconds() - t1, ru.ru_maxrss / 1024.0, out);
    if (t->ntok < vocab)
        printf("note: the text holds no more pairs to merge: the vocabulary has %d tokens, not --vocab %d\n",
               t->ntok, vocab);
    for (size_t i = 0; i < t->pairs.n; i++) free(t->pairs.p[i].w);
    free(t->pairs.p);
    free(t->pairs.slot);
    free(t->heap.e);
    buf_free(&t->w.pool);
    free(t->w.off);
    free(t->w.len);
    free(t->w.count);
    free(t->w.slot);
    free(t->sym);
    free(t->nsym);
    free(t->stamp);
    buf_free(&t->tok);
    free(t->toff);
    free(t->tlen);
    free(t->merge);
    strtab_free(&t->by_bytes);
    free(t);
    free(special[0]);
    free(special);
}
