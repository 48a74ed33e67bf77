// tok_util.c (text) — the tokenizer's small pieces: byte buffers, UTF-8 reading and cleaning, Unicode
// White_Space, the string -> id table, and GPT-2's byte <-> character map.
// Must not hold: tokenizer.json reading (tok_load.c), the BPE merge loop (tok_bpe.c).
#include <string.h>
#include "core/common.h"
#include "text/tok_impl.h"

void buf_put(Buf *b, const void *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        b->p = xrealloc(b->p, c);
        b->cap = c;
    }
    if (n && s) memcpy(b->p + b->n, s, n); // s NULL: room for n bytes, filled by the caller
    b->n += n;
    b->p[b->n] = 0;
}

void buf_free(Buf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

int utf8_next(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    int len;
    unsigned lo = 0x80, hi = 0xBF; // the allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return -1;
    uint32_t v = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
    for (int k = 1; k < len; k++) {
        if ((size_t)k >= n) return -k;
        unsigned b = s[k];
        if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return -k;
        v = (v << 6) | (b & 0x3F);
    }
    *cp = v;
    return len;
}

int utf8_put(char *out, uint32_t cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

void utf8_clean(Buf *out, const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; // run: the start of the well-formed bytes not yet copied
    out->n = 0;
    buf_put(out, "", 0);
    while (i < n) {
        uint32_t cp;
        int k = utf8_next(u + i, n - i, &cp);
        if (k > 0) {
            i += (size_t)k;
            continue;
        }
        buf_put(out, s + run, i - run);
        buf_put(out, "\xEF\xBF\xBD", 3);
        i += (size_t)-k;
        run = i;
    }
    buf_put(out, s + run, n - run);
}

int is_white_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
        (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
        c == 0x3000;
}

static uint64_t str_hash(const char *s, size_t n) { return hash_bytes(s, n, 0x5bd1e995u); }

void strtab_init(StrTab *t, int n_ids) {
    size_t cap = 16;
    while (cap < (size_t)n_ids * 2 + 16) cap *= 2;
    t->slot = xmalloc(cap * sizeof *t->slot);
    memset(t->slot, 0xFF, cap * sizeof *t->slot);
    t->mask = cap - 1;
    t->n_ids = n_ids;
    t->str = xcalloc((size_t)n_ids + 1, sizeof *t->str);
    t->len = xcalloc((size_t)n_ids + 1, sizeof *t->len);
}

int strtab_get(const StrTab *t, const char *s, size_t n) {
    for (size_t h = str_hash(s, n) & t->mask;; h = (h + 1) & t->mask) {
        int32_t id = t->slot[h];
        if (id < 0) return -1;
        if (t->len[id] == n && !memcmp(t->str[id], s, n)) return id;
    }
}

int strtab_add(StrTab *t, const char *s, size_t n, int id) {
    if (id < 0 || id >= t->n_ids || t->str[id]) return 0;
    size_t h = str_hash(s, n) & t->mask;
    for (; t->slot[h] >= 0; h = (h + 1) & t->mask) {
        int32_t o = t->slot[h];
        if (t->len[o] == n && !memcmp(t->str[o], s, n)) return 0;
    }
    t->slot[h] = id;
    t->str[id] = xmalloc(n + 1);
    memcpy(t->str[id], s, n);
    t->str[id][n] = 0;
    t->len[id] = (uint32_t)n;
    return 1;
}

void strtab_free(StrTab *t) {
    for (int i = 0; i < t->n_ids; i++) free(t->str[i]);
    free(t->str);
    free(t->len);
    free(t->slot);
    memset(t, 0, sizeof *t);
}

uint32_t byte_char[256];
static int16_t char_byte_tab[512]; // mapped code points are all below 324

void byte_table_init(void) {
    if (byte_char['!']) return;
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        byte_char[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
    for (int c = 0; c < 512; c++) char_byte_tab[c] = -1;
    for (int b = 0; b < 256; b++) char_byte_tab[byte_char[b]] = (int16_t)b;
}

int char_byte(uint32_t cp) { return cp < 512 ? char_byte_tab[cp] : -1; }
