// tok_bpe.c (text) — the BPE model: the merge table ((left, right) -> rank, merged id) and the merge loop
// of one pre-token. The loop keeps the candidate pairs in a binary heap ordered by (rank, position), as
// Hugging Face's word merge does, so a word of n symbols costs O(n log n), never a rescan per merge.
// Must not hold: pre-tokenisation (tok_encode.c), tokenizer.json reading (tok_load.c).
#include <string.h>
#include "core/common.h"
#include "text/tok_impl.h"

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }
static size_t key_slot(uint64_t k) { return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 17); }

// t->mkey/mrank/mnew hold n merges in order of rank (rank i at index i, keys not yet hashed): rebuild
// them as a hash table. A pair listed twice keeps its first (lowest) rank.
void merges_build(Tokenizer *t, size_t n) {
    size_t cap = 16;
    while (cap < n * 2 + 16) cap *= 2;
    uint64_t *key = xmalloc(cap * sizeof *key);
    int32_t *rank = xmalloc(cap * sizeof *rank), *nw = xmalloc(cap * sizeof *nw);
    for (size_t i = 0; i < cap; i++) rank[i] = -1;
    for (size_t i = 0; i < n; i++) {
        size_t h = key_slot(t->mkey[i]) & (cap - 1);
        while (rank[h] >= 0 && key[h] != t->mkey[i]) h = (h + 1) & (cap - 1);
        if (rank[h] >= 0) continue;
        key[h] = t->mkey[i];
        rank[h] = (int32_t)i;
        nw[h] = t->mnew[i];
    }
    free(t->mkey);
    free(t->mrank);
    free(t->mnew);
    t->mkey = key;
    t->mrank = rank;
    t->mnew = nw;
    t->mmask = cap - 1;
}

static int merge_find(const Tokenizer *t, int32_t a, int32_t b, int32_t *new_id) {
    uint64_t k = pair_key(a, b);
    for (size_t h = key_slot(k) & t->mmask;; h = (h + 1) & t->mmask) {
        if (t->mrank[h] < 0) return -1;
        if (t->mkey[h] == k) {
            *new_id = t->mnew[h];
            return t->mrank[h];
        }
    }
}

typedef struct {
    int32_t rank, pos, new_id;
} Cand;

static int cand_less(Cand a, Cand b) { return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos; }

typedef struct {
    Cand *h;
    size_t n, cap;
} Heap;

static void heap_push(Heap *q, Cand c) {
    if (q->n == q->cap) {
        q->cap = q->cap ? q->cap * 2 : 64;
        q->h = xrealloc(q->h, q->cap * sizeof *q->h);
    }
    size_t i = q->n++;
    while (i > 0 && cand_less(c, q->h[(i - 1) / 2])) {
        q->h[i] = q->h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    q->h[i] = c;
}

static Cand heap_pop(Heap *q) {
    Cand top = q->h[0], last = q->h[--q->n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= q->n) break;
        if (c + 1 < q->n && cand_less(q->h[c + 1], q->h[c])) c++;
        if (!cand_less(q->h[c], last)) break;
        q->h[i] = q->h[c];
        i = c;
    }
    if (q->n) q->h[i] = last;
    return top;
}

// The working word: symbol ids in a doubly linked list (removed symbols have id -1).
typedef struct {
    int32_t *id, *prev, *next;
    size_t n, cap;
} Word;

static void word_add(Word *w, int32_t id) {
    if (w->n == w->cap) {
        w->cap = w->cap ? w->cap * 2 : 64;
        w->id = xrealloc(w->id, w->cap * sizeof *w->id);
        w->prev = xrealloc(w->prev, w->cap * sizeof *w->prev);
        w->next = xrealloc(w->next, w->cap * sizeof *w->next);
    }
    w->id[w->n] = id;
    w->n++;
}

static void push_pair(const Tokenizer *t, Heap *q, const Word *w, int32_t pos) {
    if (pos < 0 || w->next[pos] < 0) return;
    int32_t nid;
    int r = merge_find(t, w->id[pos], w->id[w->next[pos]], &nid);
    if (r >= 0) heap_push(q, (Cand){r, pos, nid});
}

static void unk_flush(const Tokenizer *t, Word *w, int *pending) {
    if (!*pending) return;
    if (t->unk_id < 0) DIE("tokenizer '%s': unk_token '%s' is not in the vocabulary", t->path, t->unk_name);
    word_add(w, t->unk_id);
    *pending = 0;
}

// One character (bytes s[0..n)) as initial symbols: its vocabulary id, else its bytes' <0xXX> ids, else
// unk (consecutive unks fused with fuse_unk), else nothing, as Hugging Face's BPE does (a pending unk is
// added after byte-fallback tokens that follow it, as there).
static void initial_symbol(const Tokenizer *t, Word *w, int32_t id, const char *s, size_t n, int *unk) {
    if (id >= 0) {
        unk_flush(t, w, unk);
        word_add(w, id);
        return;
    }
    if (t->byte_fallback) {
        size_t k = 0;
        while (k < n && t->fallback_id[(unsigned char)s[k]] >= 0) k++;
        if (k == n) {
            for (k = 0; k < n; k++) word_add(w, t->fallback_id[(unsigned char)s[k]]);
            return;
        }
    }
    if (t->unk_id == -1) return;
    if (*unk && !t->fuse_unk) unk_flush(t, w, unk);
    *unk = 1;
}

void bpe_word(const Tokenizer *t, const char *s, size_t n, int32_t **ids, size_t *cnt, size_t *cap) {
    static _Thread_local Word w;
    static _Thread_local Heap q;
    static _Thread_local Buf mapped;
    if (!n) return;
    const char *word = s;
    size_t wn = n;
    if (t->byte_level) { // the mapped characters' text, for vocabulary lookups of whole words and unknowns
        mapped.n = 0;
        for (size_t i = 0; i < n; i++) {
            char c[4];
            buf_put(&mapped, c, (size_t)utf8_put(c, byte_char[(unsigned char)s[i]]));
        }
        word = mapped.p;
        wn = mapped.n;
    }
    int whole = t->ignore_merges ? strtab_get(&t->vocab, word, wn) : -1;
    w.n = 0;
    if (whole >= 0) word_add(&w, whole);
    else {
        int unk = 0;
        for (size_t i = 0; i < wn;) {
            uint32_t cp;
            size_t k = (size_t)utf8_next((const unsigned char *)word + i, wn - i, &cp);
            int32_t id = t->byte_level ? t->byte_id[char_byte(cp)] : strtab_get(&t->vocab, word + i, k);
            initial_symbol(t, &w, id, word + i, k, &unk);
            i += k;
        }
        unk_flush(t, &w, &unk);
    }
    for (size_t i = 0; i < w.n; i++) {
        w.prev[i] = (int32_t)i - 1;
        w.next[i] = i + 1 < w.n ? (int32_t)i + 1 : -1;
    }
    q.n = 0;
    for (size_t i = 0; i + 1 < w.n; i++) push_pair(t, &q, &w, (int32_t)i);
    while (q.n) {
        Cand c = heap_pop(&q);
        int32_t p = c.pos, r = w.next[p];
        if (w.id[p] < 0 || r < 0) continue;
        int32_t nid;
        if (merge_find(t, w.id[p], w.id[r], &nid) < 0 || nid != c.new_id) continue;
        w.id[p] = nid;
        w.id[r] = -1;
        w.next[p] = w.next[r];
        if (w.next[r] >= 0) w.prev[w.next[r]] = p;
        push_pair(t, &q, &w, w.prev[p]);
        push_pair(t, &q, &w, p);
    }
    if (*cnt + w.n > *cap) {
        *cap = (*cnt + w.n) * 2 + 64;
        *ids = xrealloc(*ids, *cap * sizeof **ids);
    }
    for (size_t i = 0; i < w.n; i++)
        if (w.id[i] >= 0) (*ids)[(*cnt)++] = w.id[i];
}
