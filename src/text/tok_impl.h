// tok_impl.h (text) — the tokenizer's insides, shared by the text/tok_*.c files only: the string table
// (vocabulary), the merge table, the normalizer/pre-tokenizer/decoder steps as loaded, UTF-8 helpers.
// Must not hold: anything a caller outside src/text/ needs (tokenizer.h).
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "text/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

// A growable byte buffer.
typedef struct {
    char *p;
    size_t n, cap;
} Buf;
void buf_put(Buf *b, const void *s, size_t n);
void buf_free(Buf *b);

// UTF-8: the length of the well-formed sequence at s (1..4, *cp its code point), or -k when s starts an
// ill-formed one whose maximal subpart is k bytes. utf8_clean: text with each maximal ill-formed subpart
// replaced by U+FFFD.
int utf8_next(const unsigned char *s, size_t n, uint32_t *cp);
void utf8_clean(Buf *out, const char *s, size_t n);
int utf8_put(char *out, uint32_t cp); // bytes written (1..4)
int is_white_space(uint32_t cp); // Unicode White_Space (Rust's char::is_whitespace)

// String -> id table (open addressing over a pool of the strings).
typedef struct {
    int32_t *slot; // id per slot, -1 empty
    size_t mask;
    char **str; // str[id], len[id]: the token text by id (NULL where no token has that id)
    uint32_t *len;
    int n_ids; // ids 0 .. n_ids-1 addressable
} StrTab;
void strtab_init(StrTab *t, int n_ids);
int strtab_add(StrTab *t, const char *s, size_t n, int id); // 0: the string or the id is already there
int strtab_get(const StrTab *t, const char *s, size_t n); // -1 if absent
void strtab_free(StrTab *t);

// Steps (one array each for the normalizer, the pre-tokenizer and the decoder; a Sequence is flattened).
typedef enum {
    N_NFC,
    N_NFD,
    N_NFKC,
    N_NFKD,
    N_PREPEND,
    N_REPLACE,
    N_STRIP,
    P_SPLIT,
    P_BYTELEVEL,
    P_DIGITS,
    P_METASPACE,
    P_WSPLIT,
    D_BYTELEVEL,
    D_METASPACE,
    D_REPLACE,
    D_BYTEFALLBACK,
    D_FUSE,
    D_STRIP
} StepKind;
typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_PREV, SPLIT_NEXT, SPLIT_CONTIGUOUS } SplitHow;
typedef struct {
    StepKind kind;
    pcre2_code *re; // P_SPLIT / P_BYTELEVEL with use_regex / P_DIGITS / N_REPLACE with a Regex
    char *a, *b; // Prepend: a; Replace: pattern a (String), content b; Metaspace: replacement a; Strip: a
    size_t alen, blen;
    SplitHow how;
    int invert, flag, start, stop; // flag: ByteLevel add_prefix_space, Metaspace split, Strip left
    int prepend; // Metaspace: 0 never, 1 first, 2 always
} Step;

typedef struct {
    char *s;
    size_t n;
    int32_t id;
    int special, normalized, lstrip, rstrip;
} Added;

struct Tokenizer {
    char path[1024];
    StrTab vocab; // the model's
    // merges: (left id, right id) -> rank and merged id
    uint64_t *mkey;
    int32_t *mrank, *mnew;
    size_t mmask;
    int32_t byte_id[256]; // byte-level: the id of each byte's mapped character, -1 if absent
    int32_t fallback_id[256]; // byte_fallback: the id of "<0xXX>", -1 if absent
    int byte_fallback, fuse_unk, ignore_merges, unk_id; // unk_id: -1 none, -2 named but not in the vocab
    char unk_name[64];
    Added *added;
    int n_added;
    int32_t *added_of_id; // id -> index into added, -1
    int vocab_size;
    Step *norm, *pre, *dec;
    int n_norm, n_pre, n_dec;
    int byte_level; // the pre-tokenizer ends in ByteLevel: BPE reads bytes through byte_id
    // the post-processor's ids before and after the text (add_special), or the type it does not support
    int32_t *post_pre, *post_suf;
    int n_post_pre, n_post_suf;
    char post_bad[64];
};

// tok_util.c: GPT-2's byte <-> character table (byte b maps to code point byte_char[b]).
extern uint32_t byte_char[256];
void byte_table_init(void);
int char_byte(uint32_t cp); // the byte a mapped character stands for, or -1

// tok_bpe.c
void merges_build(Tokenizer *t, size_t n);
// BPE of one pre-token (bytes s[0..n), byte-level when t->byte_level) appended to *ids.
void bpe_word(const Tokenizer *t, const char *s, size_t n, int32_t **ids, size_t *cnt, size_t *cap);
