// tok_decode.c (text) — decoding: ids to token strings (added tokens by their content, special ones
// dropped on request), the decoder steps over the list of strings (ByteLevel, Metaspace, Replace,
// ByteFallback, Fuse, Strip; no decoder: joined with spaces, as Hugging Face does), and the streaming
// decoder that returns text only once it is not an incomplete UTF-8 sequence.
// Must not hold: encoding (tok_encode.c).
#include <string.h>
#include "core/common.h"
#include "text/tok_impl.h"

typedef struct {
    Buf b; // the strings' bytes
    size_t *off, *len, n, cap;
} List;

static void list_add(List *l, const char *s, size_t n) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->off = xrealloc(l->off, l->cap * sizeof *l->off);
        l->len = xrealloc(l->len, l->cap * sizeof *l->len);
    }
    l->off[l->n] = l->b.n;
    l->len[l->n++] = n;
    buf_put(&l->b, s, n);
}

static void list_free(List *l) {
    buf_free(&l->b);
    free(l->off);
    free(l->len);
}

// The byte a "<0xXX>" token stands for, or -1.
static int fallback_byte(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = s[k];
        int d = c >= '0' && c <= '9' ? c - '0'
            : c >= 'a' && c <= 'f'   ? c - 'a' + 10
            : c >= 'A' && c <= 'F'   ? c - 'A' + 10
                                     : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static void flush_bytes(List *o, Buf *bytes) {
    if (!bytes->n) return;
    int ok = 1;
    uint32_t cp;
    for (size_t i = 0; i < bytes->n && ok;) {
        int k = utf8_next((unsigned char *)bytes->p + i, bytes->n - i, &cp);
        ok = k > 0;
        i += ok ? (size_t)k : 0;
    }
    if (ok) list_add(o, bytes->p, bytes->n);
    else
        for (size_t i = 0; i < bytes->n; i++) list_add(o, "\xEF\xBF\xBD", 3);
    bytes->n = 0;
}

// Replace every pat in s[0..n) by rep, into o as one string.
static void replace_into(List *o, const char *s, size_t n, const char *pat, size_t pn, const char *rep,
                         size_t rn) {
    size_t at = o->b.n;
    for (size_t k = 0; k < n;) {
        if (k + pn <= n && !memcmp(s + k, pat, pn)) {
            buf_put(&o->b, rep, rn);
            k += pn;
        } else buf_put(&o->b, s + k++, 1);
    }
    size_t len = o->b.n - at;
    o->b.n = at; // list_add copies it back in place
    list_add(o, o->b.p + at, len);
}

// ByteLevel: each token's characters as the bytes they stand for (a token with any other character keeps
// its own bytes), all joined into one string with ill-formed UTF-8 read as U+FFFD.
static void dec_bytelevel(const List *in, List *o) {
    Buf raw = {0}, clean = {0};
    buf_put(&raw, "", 0);
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->b.p + in->off[i];
        size_t n = in->len[i], at = raw.n, k = 0;
        while (k < n) {
            uint32_t cp;
            int len = utf8_next((const unsigned char *)s + k, n - k, &cp), c = char_byte(cp);
            if (c < 0) break;
            char ch = (char)c;
            buf_put(&raw, &ch, 1);
            k += (size_t)len;
        }
        if (k < n) {
            raw.n = at;
            buf_put(&raw, s, n);
        }
    }
    utf8_clean(&clean, raw.p, raw.n);
    list_add(o, clean.p, clean.n);
    buf_free(&raw);
    buf_free(&clean);
}

// ByteFallback: runs of <0xXX> tokens become their bytes when those are UTF-8, else one U+FFFD per byte.
static void dec_bytefallback(const List *in, List *o) {
    Buf bytes = {0};
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->b.p + in->off[i];
        int v = fallback_byte(s, in->len[i]);
        if (v >= 0) {
            char c = (char)v;
            buf_put(&bytes, &c, 1);
            continue;
        }
        flush_bytes(o, &bytes);
        list_add(o, s, in->len[i]);
    }
    flush_bytes(o, &bytes);
    buf_free(&bytes);
}

static void dec_step(const Step *st, const List *in, List *o) {
    if (st->kind == D_BYTELEVEL) return dec_bytelevel(in, o);
    if (st->kind == D_BYTEFALLBACK) return dec_bytefallback(in, o);
    if (st->kind == D_FUSE) {
        Buf all = {0};
        for (size_t i = 0; i < in->n; i++) buf_put(&all, in->b.p + in->off[i], in->len[i]);
        list_add(o, all.p ? all.p : "", all.n);
        buf_free(&all);
        return;
    }
    for (size_t i = 0; i < in->n; i++) {
        const char *s = in->b.p + in->off[i];
        size_t n = in->len[i];
        if (st->kind == D_REPLACE) replace_into(o, s, n, st->a, st->alen, st->b, st->blen);
        else if (st->kind == D_METASPACE) // the first token's replacements vanish unless prepend is never
            replace_into(o, s, n, st->a, st->alen, " ", i == 0 && st->prepend ? 0 : 1);
        else { // D_STRIP: up to start leading and stop trailing content characters
            size_t a = 0, e = n;
            for (int k = 0; k < st->start && a + st->alen <= e && !memcmp(s + a, st->a, st->alen); k++)
                a += st->alen;
            for (int k = 0; k < st->stop && e >= a + st->alen && !memcmp(s + e - st->alen, st->a, st->alen);
                 k++)
                e -= st->alen;
            list_add(o, s + a, e - a);
        }
    }
}

static void decode_into(const Tokenizer *t, const int32_t *ids, size_t n, int skip_special, Buf *out) {
    List a = {0}, b = {0};
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->vocab_size)
            DIE("tokenizer '%s': token id %d is outside the vocabulary (0 .. %d)", t->path, id,
                t->vocab_size - 1);
        int k = t->added_of_id[id];
        if (k >= 0) {
            if (!(skip_special && t->added[k].special)) list_add(&a, t->added[k].s, t->added[k].n);
        } else if (id < t->vocab.n_ids && t->vocab.str[id]) list_add(&a, t->vocab.str[id], t->vocab.len[id]);
    }
    List *in = &a, *o = &b;
    for (int i = 0; i < t->n_dec; i++) {
        o->n = 0;
        o->b.n = 0;
        dec_step(&t->dec[i], in, o);
        List *x = in;
        in = o;
        o = x;
    }
    out->n = 0;
    buf_put(out, "", 0);
    for (size_t i = 0; i < in->n; i++) {
        if (i && !t->n_dec) buf_put(out, " ", 1);
        buf_put(out, in->b.p + in->off[i], in->len[i]);
    }
    list_free(&a);
    list_free(&b);
}

char *tok_decode(const Tokenizer *t, const int32_t *ids, size_t n, int skip_special, size_t *len) {
    Buf out = {0};
    decode_into(t, ids, n, skip_special, &out);
    *len = out.n;
    return out.p;
}

// Hugging Face's DecodeStream: the ids since the last emitted text are decoded with the ids before them
// (so that a decoder's rule for the first token or a space applies as in a whole decode); text is emitted
// once it is longer than the previous decode and does not end in U+FFFD (an incomplete character).
struct TokStream {
    const Tokenizer *t;
    int skip;
    int32_t *ids;
    size_t n, cap, prefix_index;
    Buf prefix, cur, text;
};

TokStream *tok_stream_new(const Tokenizer *t, int skip_special) {
    TokStream *s = xcalloc(1, sizeof *s);
    s->t = t;
    s->skip = skip_special;
    return s;
}

static int ends_in_fffd(const Buf *b) { return b->n >= 3 && !memcmp(b->p + b->n - 3, "\xEF\xBF\xBD", 3); }

const char *tok_stream_step(TokStream *s, int32_t id, size_t *len) {
    if (!s->prefix.n && s->n) {
        decode_into(s->t, s->ids, s->n, s->skip, &s->cur);
        if (!ends_in_fffd(&s->cur)) {
            s->prefix.n = 0;
            buf_put(&s->prefix, s->cur.p, s->cur.n);
            s->prefix_index = s->n;
        }
    }
    if (s->n == s->cap) {
        s->cap = s->cap * 2 + 16;
        s->ids = xrealloc(s->ids, s->cap * sizeof *s->ids);
    }
    s->ids[s->n++] = id;
    decode_into(s->t, s->ids, s->n, s->skip, &s->cur);
    s->text.n = 0;
    buf_put(&s->text, "", 0);
    if (s->cur.n > s->prefix.n && !ends_in_fffd(&s->cur) &&
        (!s->prefix.n || !memcmp(s->cur.p, s->prefix.p, s->prefix.n))) {
        buf_put(&s->text, s->cur.p + s->prefix.n, s->cur.n - s->prefix.n);
        size_t keep = s->n - s->prefix_index;
        memmove(s->ids, s->ids + s->prefix_index, keep * sizeof *s->ids);
        s->n = keep;
        decode_into(s->t, s->ids, s->n, s->skip, &s->prefix);
        s->prefix_index = keep;
    }
    *len = s->text.n;
    return s->text.p;
}

const Tokenizer *tok_stream_tokenizer(const TokStream *s) { return s->t; }

void tok_stream_free(TokStream *s) {
    if (!s) return;
    free(s->ids);
    buf_free(&s->prefix);
    buf_free(&s->cur);
    buf_free(&s->text);
    free(s);
}
