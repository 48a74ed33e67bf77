// tok_encode.c (text) — encoding: the text cleaned to UTF-8, the added tokens found (those matched on the
// raw text, then, after the normalizer, those matched on normalized text), the normalizer, the
// pre-tokenizer steps (regex Split with its five behaviours, ByteLevel, Digits, Metaspace,
// WhitespaceSplit), then BPE (tok_bpe.c) on each piece.
// Must not hold: tokenizer.json reading (tok_load.c), the merge loop (tok_bpe.c), decoding.
#include <string.h>
#include <utf8proc.h>
#include "core/common.h"
#include "text/tok_impl.h"

typedef struct {
    size_t off, len; // bytes in the pool
    int at0; // the piece starts the original text (Metaspace's prepend_scheme "first")
} Piece;

typedef struct {
    Piece *p;
    size_t n, cap;
} Pieces;

typedef struct {
    size_t s, e;
    int m;
} Span; // a stretch of a piece, matched (m) or not

typedef struct {
    Buf pool, norm;
    Pieces a, b;
    Span *sp;
    size_t nsp, capsp;
    pcre2_match_data *md;
    void (*fn)(void *arg, const char *piece, size_t n); // tok_pretokenize: the pieces go here, not to BPE
    void *arg;
} Work;

static void piece_add(Pieces *l, size_t off, size_t len, int at0) {
    if (!len) return;
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->p = xrealloc(l->p, l->cap * sizeof *l->p);
    }
    l->p[l->n++] = (Piece){off, len, at0};
}

static void span_add(Work *w, size_t s, size_t e, int m) {
    if (w->nsp == w->capsp) {
        w->capsp = w->capsp ? w->capsp * 2 : 64;
        w->sp = xrealloc(w->sp, w->capsp * sizeof *w->sp);
    }
    w->sp[w->nsp++] = (Span){s, e, m};
}

// A match [s, e) of the piece: the gap before it and the match as spans (empty matches are skipped).
static void span_match(Work *w, size_t *prev, size_t s, size_t e) {
    if (s == e) return;
    if (*prev < s) span_add(w, *prev, s, 0);
    span_add(w, s, e, 1);
    *prev = e;
}

// The spans of w->sp turned into pieces of out per Hugging Face's split behaviours.
static void split_spans(Work *w, const Piece *pc, SplitHow how, int invert, Pieces *out) {
    Span *v = w->sp;
    size_t n = w->nsp, k = 0;
    for (size_t i = 0; i < n; i++) v[i].m ^= invert;
    int prevm = 0;
    if (how == SPLIT_NEXT) { // folded from the right: a match joins the piece after it
        for (size_t i = n; i-- > 0;) {
            if (v[i].m && !prevm && k) v[n - k].s = v[i].s; // the newest kept span sits at v[n - k]
            else v[n - ++k] = v[i];
            prevm = v[i].m;
        }
        memmove(v, v + n - k, k * sizeof *v);
    } else {
        for (size_t i = 0; i < n; i++) {
            int join = how == SPLIT_PREV ? v[i].m && !prevm : how == SPLIT_CONTIGUOUS ? v[i].m == prevm : 0;
            if (join && k) v[k - 1].e = v[i].e;
            else v[k++] = v[i];
            prevm = v[i].m;
        }
    }
    for (size_t i = 0; i < k; i++)
        if (!(how == SPLIT_REMOVED && v[i].m))
            piece_add(out, pc->off + v[i].s, v[i].e - v[i].s, pc->at0 && !v[i].s);
}

static void regex_spans(Work *w, const pcre2_code *re, const char *s, size_t n) {
    size_t start = 0, prev = 0;
    w->nsp = 0;
    while (start <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, start, PCRE2_NO_UTF_CHECK, w->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0 && rc != 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            DIE("tokenizer: regex match failed (%s)", (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(w->md);
        span_match(w, &prev, ov[0], ov[1]);
        if (ov[1] > ov[0]) start = ov[1];
        else { // an empty match: go on after the next character
            if (ov[0] >= n) break;
            uint32_t cp;
            start = ov[0] + (size_t)utf8_next((const unsigned char *)s + ov[0], n - ov[0], &cp);
        }
    }
    if (prev < n) span_add(w, prev, n, 0);
}

// Spans of each character that is (pred 1) or is not White_Space, or of each occurrence of lit.
static void char_spans(Work *w, const char *s, size_t n, const char *lit, size_t litn) {
    size_t prev = 0;
    w->nsp = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = (size_t)utf8_next((const unsigned char *)s + i, n - i, &cp);
        if (lit ? (i + litn <= n && !memcmp(s + i, lit, litn)) : is_white_space(cp)) {
            if (lit) k = litn;
            span_match(w, &prev, i, i + k);
        }
        i += k;
    }
    if (prev < n) span_add(w, prev, n, 0);
}

// Metaspace: spaces replaced, the replacement prepended per the scheme; the new text goes to the pool.
static Piece metaspace(Work *w, const Step *st, const Piece *pc) {
    Buf *b = &w->pool;
    size_t off = b->n;
    int starts = pc->len >= st->alen && !memcmp(b->p + pc->off, st->a, st->alen);
    int pre = !starts && (st->prepend == 2 || (st->prepend == 1 && pc->at0));
    // an existing leading space becomes the replacement too, so "starts" is judged after replacement
    if (!starts && pc->len && b->p[pc->off] == ' ') pre = 0;
    if (pre) buf_put(b, st->a, st->alen);
    for (size_t i = 0; i < pc->len; i++) {
        char c = b->p[pc->off + i]; // b->p may move while growing: read before writing
        if (c == ' ') buf_put(b, st->a, st->alen);
        else buf_put(b, &c, 1);
    }
    return (Piece){off, b->n - off, pc->at0};
}

static void pretok_step(Work *w, const Step *st, const Pieces *in, Pieces *out) {
    out->n = 0;
    for (size_t i = 0; i < in->n; i++) {
        Piece pc = in->p[i];
        SplitHow how = st->how;
        if (st->kind == P_METASPACE) {
            pc = metaspace(w, st, &pc);
            if (!st->flag) {
                piece_add(out, pc.off, pc.len, pc.at0);
                continue;
            }
            char_spans(w, w->pool.p + pc.off, pc.len, st->a, st->alen);
            how = SPLIT_NEXT;
        } else if (st->kind == P_WSPLIT) {
            char_spans(w, w->pool.p + pc.off, pc.len, NULL, 0);
            how = SPLIT_REMOVED;
        } else {
            if (st->kind == P_BYTELEVEL && st->flag && w->pool.p[pc.off] != ' ') {
                size_t off = w->pool.n;
                buf_put(&w->pool, " ", 1);
                buf_put(&w->pool, NULL, pc.len); // room first: the copy's source is in the pool
                memcpy(w->pool.p + off + 1, w->pool.p + pc.off, pc.len);
                pc.off = off;
                pc.len++;
            }
            if (!st->re) {
                piece_add(out, pc.off, pc.len, pc.at0);
                continue;
            }
            regex_spans(w, st->re, w->pool.p + pc.off, pc.len);
            if (st->kind == P_BYTELEVEL) how = SPLIT_ISOLATED;
        }
        split_spans(w, &pc, how, st->invert, out);
    }
}

static void normalize(const Tokenizer *t, Buf *b) {
    for (int i = 0; i < t->n_norm; i++) {
        const Step *st = &t->norm[i];
        if (st->kind <= N_NFKD) {
            static const int opt[] = {UTF8PROC_COMPOSE, UTF8PROC_DECOMPOSE,
                                      UTF8PROC_COMPOSE | UTF8PROC_COMPAT,
                                      UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT};
            utf8proc_uint8_t *o = NULL;
            utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)b->p, (utf8proc_ssize_t)b->n, &o,
                                              (utf8proc_option_t)(UTF8PROC_STABLE | opt[st->kind - N_NFC]));
            if (n < 0) DIE("tokenizer: Unicode normalisation failed (%s)", utf8proc_errmsg(n));
            b->n = 0;
            buf_put(b, o, (size_t)n);
            free(o);
        } else if (st->kind == N_PREPEND) {
            if (!b->n) continue;
            Buf c = {0};
            buf_put(&c, st->a, st->alen);
            buf_put(&c, b->p, b->n);
            buf_free(b);
            *b = c;
        } else if (st->kind == N_REPLACE) {
            Buf c = {0};
            buf_put(&c, "", 0);
            for (size_t k = 0; k < b->n;) {
                if (k + st->alen <= b->n && !memcmp(b->p + k, st->a, st->alen)) {
                    buf_put(&c, st->b, st->blen);
                    k += st->alen;
                } else buf_put(&c, b->p + k++, 1);
            }
            buf_free(b);
            *b = c;
        } else { // N_STRIP
            size_t s = 0, e = b->n;
            uint32_t cp;
            while (st->start && s < e &&
                   is_white_space((utf8_next((unsigned char *)b->p + s, e - s, &cp), cp)))
                s += (size_t)utf8_next((unsigned char *)b->p + s, e - s, &cp);
            while (st->stop && e > s) {
                size_t k = e - 1;
                while (k > s && ((unsigned char)b->p[k] & 0xC0) == 0x80) k--;
                utf8_next((unsigned char *)b->p + k, e - k, &cp);
                if (!is_white_space(cp)) break;
                e = k;
            }
            memmove(b->p, b->p + s, e - s);
            b->n = e - s;
            b->p[b->n] = 0;
        }
    }
}

// Leftmost-longest matches of the added tokens whose "normalized" flag is norm, in s[0..n): spans with
// m = the token's index + 1 (lstrip/rstrip take the white space beside a match), gaps with m = 0.
static void added_spans(const Tokenizer *t, Work *w, const char *s, size_t n, int norm) {
    uint8_t first[256] = {0};
    int any = 0;
    for (int k = 0; k < t->n_added; k++)
        if (t->added[k].normalized == norm) first[(unsigned char)t->added[k].s[0]] = any = 1;
    w->nsp = 0;
    size_t prev = 0;
    for (size_t i = 0; any && i < n; i++) {
        if (!first[(unsigned char)s[i]]) continue;
        int best = -1;
        for (int k = 0; k < t->n_added; k++) {
            const Added *a = &t->added[k];
            if (a->normalized == norm && a->n <= n - i && (best < 0 || a->n > t->added[best].n) &&
                !memcmp(s + i, a->s, a->n))
                best = k;
        }
        if (best < 0) continue;
        size_t ms = i, me = i + t->added[best].n;
        uint32_t cp;
        if (t->added[best].lstrip)
            while (ms > prev) {
                size_t k = ms - 1;
                while (k > prev && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
                utf8_next((const unsigned char *)s + k, ms - k, &cp);
                if (!is_white_space(cp)) break;
                ms = k;
            }
        if (t->added[best].rstrip)
            while (me < n) {
                int k = utf8_next((const unsigned char *)s + me, n - me, &cp);
                if (!is_white_space(cp)) break;
                me += (size_t)k;
            }
        if (prev < ms) span_add(w, prev, ms, 0);
        span_add(w, ms, me, best + 1);
        prev = me;
        i = me - 1;
    }
    if (prev < n) span_add(w, prev, n, 0);
}

static void emit(int32_t id, int32_t **ids, size_t *cnt, size_t *cap) {
    if (*cnt == *cap) {
        *cap = *cap * 2 + 64;
        *ids = xrealloc(*ids, *cap * sizeof **ids);
    }
    (*ids)[(*cnt)++] = id;
}

// One stretch of text between raw-matched added tokens: normalized, split on the normalized added
// tokens, pre-tokenized, BPE'd.
static void encode_stretch(const Tokenizer *t, Work *w, const char *s, size_t n, int at0, int32_t **ids,
                           size_t *cnt, size_t *cap) {
    w->norm.n = 0;
    buf_put(&w->norm, s, n);
    normalize(t, &w->norm);
    added_spans(t, w, w->norm.p, w->norm.n, 1);
    size_t nsp = w->nsp;
    Span *sp = xmalloc((nsp + 1) * sizeof *sp);
    if (nsp) memcpy(sp, w->sp, nsp * sizeof *sp);
    for (size_t k = 0; k < nsp; k++) {
        if (sp[k].m) {
            emit(t->added[sp[k].m - 1].id, ids, cnt, cap);
            continue;
        }
        w->pool.n = 0;
        buf_put(&w->pool, w->norm.p + sp[k].s, sp[k].e - sp[k].s);
        w->a.n = 0;
        piece_add(&w->a, 0, w->pool.n, at0 && sp[k].s == 0);
        Pieces *in = &w->a, *out = &w->b;
        for (int i = 0; i < t->n_pre; i++) {
            pretok_step(w, &t->pre[i], in, out);
            Pieces *x = in;
            in = out;
            out = x;
        }
        for (size_t i = 0; i < in->n; i++) {
            if (w->fn) w->fn(w->arg, w->pool.p + in->p[i].off, in->p[i].len);
            else bpe_word(t, w->pool.p + in->p[i].off, in->p[i].len, ids, cnt, cap);
        }
    }
    free(sp);
}

// tok_encode's work, or with fn the pieces handed to it (tok_pretokenize).
static size_t encode(const Tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                     size_t *cap, void (*fn)(void *arg, const char *piece, size_t n), void *arg) {
    Work w = {.fn = fn, .arg = arg};
    Buf clean = {0};
    w.md = pcre2_match_data_create(16, NULL);
    CHECK(w.md, "tokenizer: out of memory for regex match data");
    utf8_clean(&clean, text, len);
    size_t cnt = 0;
    for (int i = 0; add_special && i < t->n_post_pre; i++) emit(t->post_pre[i], ids, &cnt, cap);
    added_spans(t, &w, clean.p, clean.n, 0);
    size_t nsp = w.nsp;
    Span *sp = xmalloc((nsp + 1) * sizeof *sp);
    if (nsp) memcpy(sp, w.sp, nsp * sizeof *sp);
    for (size_t k = 0; k < nsp; k++) {
        if (sp[k].m) emit(t->added[sp[k].m - 1].id, ids, &cnt, cap);
        else encode_stretch(t, &w, clean.p + sp[k].s, sp[k].e - sp[k].s, sp[k].s == 0, ids, &cnt, cap);
    }
    free(sp);
    for (int i = 0; add_special && i < t->n_post_suf; i++) emit(t->post_suf[i], ids, &cnt, cap);
    pcre2_match_data_free(w.md);
    buf_free(&clean);
    buf_free(&w.pool);
    buf_free(&w.norm);
    free(w.a.p);
    free(w.b.p);
    free(w.sp);
    return cnt;
}

size_t tok_encode(const Tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                  size_t *cap) {
    if (add_special && t->post_bad[0])
        DIE("tokenizer '%s': post-processor '%s' is not supported (TemplateProcessing, RobertaProcessing, "
            "BertProcessing, ByteLevel, Sequence are)",
            t->path, t->post_bad);
    return encode(t, text, len, add_special, ids, cap, NULL, NULL);
}

void tok_pretokenize(const Tokenizer *t, const char *text, size_t len,
                     void (*fn)(void *arg, const char *piece, size_t n), void *arg) {
    int32_t *ids = NULL;
    size_t cap = 0;
    encode(t, text, len, 0, &ids, &cap, fn, arg);
    free(ids);
}
