// tok_load.c (text) — reading a tokenizer.json (Hugging Face tokenizers' serialisation) into a Tokenizer:
// the BPE model (vocabulary, merges, unk/byte-fallback/ignore_merges), the added tokens, and the
// normalizer, pre-tokenizer and decoder steps, each checked; anything else is refused by name.
// Must not hold: encoding or decoding (tok_encode.c, tok_decode.c).
#include <string.h>
#include <cjson/cJSON.h>
#include "core/common.h"
#include "text/tok_impl.h"

#define MAX_ID (1 << 24) // ids above this are a corrupt file, not a vocabulary (the tables are by id)
#define BAD(t, fmt, ...) DIE("tokenizer '%s': " fmt, (t)->path, ##__VA_ARGS__)

static const char *jstr(const Tokenizer *t, const cJSON *o, const char *key, const char *who) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v)) BAD(t, "%s: \"%s\" must be a string", who, key);
    return v->valuestring;
}

static int jbool(const Tokenizer *t, const cJSON *o, const char *key, int dflt, const char *who) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return dflt;
    if (!cJSON_IsBool(v)) BAD(t, "%s: \"%s\" must be true or false", who, key);
    return cJSON_IsTrue(v);
}

static const char *jtype(const Tokenizer *t, const cJSON *o, const char *who) {
    if (!cJSON_IsObject(o)) BAD(t, "the %s must be an object", who);
    return jstr(t, o, "type", who);
}

static pcre2_code *regex_compile(const Tokenizer *t, const char *pattern, const char *who) {
    int err;
    PCRE2_SIZE at;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(err, msg, sizeof msg);
        BAD(t, "%s: regex /%s/ does not compile at offset %zu (%s)", who, pattern, (size_t)at, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); // without JIT (unsupported here) the interpreter runs it
    return re;
}

static Step *add_step(Step **steps, int *n, StepKind k) {
    *steps = xrealloc(*steps, (size_t)(*n + 1) * sizeof **steps);
    Step *s = &(*steps)[(*n)++];
    memset(s, 0, sizeof *s);
    s->kind = k;
    return s;
}

static void set_str(char **dst, size_t *len, const char *s) {
    *dst = xstrdup(s);
    *len = strlen(s);
}

// A {"String": s} pattern (Replace): its text; a Regex pattern is refused.
static const char *string_pattern(const Tokenizer *t, const cJSON *o, const char *who) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    if (cJSON_GetObjectItemCaseSensitive(p, "Regex"))
        BAD(t, "%s with a Regex pattern is not supported (a String pattern is)", who);
    return jstr(t, p, "String", who);
}

static void load_normalizer(Tokenizer *t, const cJSON *o) {
    if (!o || cJSON_IsNull(o)) return;
    const char *ty = jtype(t, o, "normalizer");
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e, *list = cJSON_GetObjectItemCaseSensitive(o, "normalizers");
        if (!cJSON_IsArray(list)) BAD(t, "normalizer Sequence: \"normalizers\" must be a list");
        cJSON_ArrayForEach(e, list) load_normalizer(t, e);
        return;
    }
    static const char *const nf[] = {"NFC", "NFD", "NFKC", "NFKD"};
    for (int k = 0; k < 4; k++)
        if (!strcmp(ty, nf[k])) {
            add_step(&t->norm, &t->n_norm, (StepKind)(N_NFC + k));
            return;
        }
    if (!strcmp(ty, "Prepend")) {
        Step *s = add_step(&t->norm, &t->n_norm, N_PREPEND);
        set_str(&s->a, &s->alen, jstr(t, o, "prepend", "normalizer Prepend"));
    } else if (!strcmp(ty, "Replace")) {
        Step *s = add_step(&t->norm, &t->n_norm, N_REPLACE);
        set_str(&s->a, &s->alen, string_pattern(t, o, "normalizer Replace"));
        set_str(&s->b, &s->blen, jstr(t, o, "content", "normalizer Replace"));
        if (!s->alen) BAD(t, "normalizer Replace: the pattern is empty");
    } else if (!strcmp(ty, "Strip")) {
        Step *s = add_step(&t->norm, &t->n_norm, N_STRIP);
        s->start = jbool(t, o, "strip_left", 1, "normalizer Strip");
        s->stop = jbool(t, o, "strip_right", 1, "normalizer Strip");
    } else
        BAD(t,
            "normalizer '%s' is not supported (NFC, NFD, NFKC, NFKD, Prepend, Replace, Strip, Sequence are)",
            ty);
}

static SplitHow split_how(const Tokenizer *t, const char *b) {
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext",
                                        "Contiguous"};
    for (int k = 0; k < 5; k++)
        if (!strcmp(b, names[k])) return (SplitHow)k;
    BAD(t, "pre-tokenizer Split: unknown behavior '%s'", b);
}

static int prepend_scheme(const Tokenizer *t, const cJSON *o, const char *who) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prepend_scheme");
    if (!p || cJSON_IsNull(p)) return jbool(t, o, "add_prefix_space", 1, who) ? 2 : 0;
    const char *v = jstr(t, o, "prepend_scheme", who);
    if (!strcmp(v, "never")) return 0;
    if (!strcmp(v, "first")) return 1;
    if (!strcmp(v, "always")) return 2;
    BAD(t, "%s: unknown prepend_scheme '%s'", who, v);
}

// GPT-2's pre-tokenisation pattern, which ByteLevel applies with use_regex.
static const char GPT2_RE[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static void load_split(Tokenizer *t, const cJSON *o) {
    Step *s = add_step(&t->pre, &t->n_pre, P_SPLIT);
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "pattern");
    if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(p, "Regex")))
        s->re = regex_compile(t, jstr(t, p, "Regex", "pre-tokenizer Split"), "pre-tokenizer Split");
    else {
        const char *lit = jstr(t, p, "String", "pre-tokenizer Split pattern");
        if (!*lit) BAD(t, "pre-tokenizer Split: the pattern is empty");
        Buf q = {0}; // the literal as a regex: \Q...\E cannot hold "\E", so quote byte by byte
        for (const char *c = lit; *c; c++) {
            if (strchr("\\^$.|?*+()[]{}", *c)) buf_put(&q, "\\", 1);
            buf_put(&q, c, 1);
        }
        s->re = regex_compile(t, q.p, "pre-tokenizer Split");
        buf_free(&q);
    }
    s->how = split_how(t, jstr(t, o, "behavior", "pre-tokenizer Split"));
    s->invert = jbool(t, o, "invert", 0, "pre-tokenizer Split");
}

static void load_pretok(Tokenizer *t, const cJSON *o) {
    if (!o || cJSON_IsNull(o)) return;
    const char *ty = jtype(t, o, "pre_tokenizer");
    if (t->byte_level) BAD(t, "pre-tokenizer '%s' after ByteLevel is not supported", ty);
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e, *list = cJSON_GetObjectItemCaseSensitive(o, "pretokenizers");
        if (!cJSON_IsArray(list)) BAD(t, "pre-tokenizer Sequence: \"pretokenizers\" must be a list");
        cJSON_ArrayForEach(e, list) load_pretok(t, e);
    } else if (!strcmp(ty, "Split")) {
        load_split(t, o);
    } else if (!strcmp(ty, "ByteLevel")) {
        Step *s = add_step(&t->pre, &t->n_pre, P_BYTELEVEL);
        s->flag = jbool(t, o, "add_prefix_space", 1, "pre-tokenizer ByteLevel");
        if (jbool(t, o, "use_regex", 1, "pre-tokenizer ByteLevel"))
            s->re = regex_compile(t, GPT2_RE, "ByteLevel");
        t->byte_level = 1;
    } else if (!strcmp(ty, "Digits")) {
        Step *s = add_step(&t->pre, &t->n_pre, P_DIGITS);
        s->re = regex_compile(t, "\\p{N}", "Digits");
        s->how =
            jbool(t, o, "individual_digits", 0, "pre-tokenizer Digits") ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
    } else if (!strcmp(ty, "Metaspace")) {
        Step *s = add_step(&t->pre, &t->n_pre, P_METASPACE);
        set_str(&s->a, &s->alen, jstr(t, o, "replacement", "pre-tokenizer Metaspace"));
        s->prepend = prepend_scheme(t, o, "pre-tokenizer Metaspace");
        s->flag = jbool(t, o, "split", 1, "pre-tokenizer Metaspace");
    } else if (!strcmp(ty, "WhitespaceSplit")) {
        add_step(&t->pre, &t->n_pre, P_WSPLIT);
    } else
        BAD(t,
            "pre-tokenizer '%s' is not supported (ByteLevel, Split, Digits, Metaspace, WhitespaceSplit, "
            "Sequence are)",
            ty);
}

static void load_decoder(Tokenizer *t, const cJSON *o) {
    if (!o || cJSON_IsNull(o)) return;
    const char *ty = jtype(t, o, "decoder");
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e, *list = cJSON_GetObjectItemCaseSensitive(o, "decoders");
        if (!cJSON_IsArray(list)) BAD(t, "decoder Sequence: \"decoders\" must be a list");
        cJSON_ArrayForEach(e, list) load_decoder(t, e);
    } else if (!strcmp(ty, "ByteLevel")) {
        add_step(&t->dec, &t->n_dec, D_BYTELEVEL);
    } else if (!strcmp(ty, "Metaspace")) {
        Step *s = add_step(&t->dec, &t->n_dec, D_METASPACE);
        set_str(&s->a, &s->alen, jstr(t, o, "replacement", "decoder Metaspace"));
        s->prepend = prepend_scheme(t, o, "decoder Metaspace");
    } else if (!strcmp(ty, "Replace")) {
        Step *s = add_step(&t->dec, &t->n_dec, D_REPLACE);
        set_str(&s->a, &s->alen, string_pattern(t, o, "decoder Replace"));
        set_str(&s->b, &s->blen, jstr(t, o, "content", "decoder Replace"));
        if (!s->alen) BAD(t, "decoder Replace: the pattern is empty");
    } else if (!strcmp(ty, "ByteFallback")) {
        add_step(&t->dec, &t->n_dec, D_BYTEFALLBACK);
    } else if (!strcmp(ty, "Fuse")) {
        add_step(&t->dec, &t->n_dec, D_FUSE);
    } else if (!strcmp(ty, "Strip")) {
        Step *s = add_step(&t->dec, &t->n_dec, D_STRIP);
        set_str(&s->a, &s->alen, jstr(t, o, "content", "decoder Strip"));
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "start"),
                    *b = cJSON_GetObjectItemCaseSensitive(o, "stop");
        if (!cJSON_IsNumber(a) || !cJSON_IsNumber(b) || a->valueint < 0 || b->valueint < 0)
            BAD(t, "decoder Strip: \"start\" and \"stop\" must be counts");
        s->start = a->valueint;
        s->stop = b->valueint;
        uint32_t cp;
        if (utf8_next((const unsigned char *)s->a, s->alen, &cp) != (int)s->alen || !s->alen)
            BAD(t, "decoder Strip: \"content\" must be one character");
    } else
        BAD(t,
            "decoder '%s' is not supported (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, "
            "Sequence are)",
            ty);
}

static void ids_add(int32_t **v, int *n, int32_t id) {
    *v = xrealloc(*v, (size_t)(*n + 1) * sizeof **v);
    (*v)[(*n)++] = id;
}

static void check_post_id(const Tokenizer *t, const cJSON *id, const char *who) {
    if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= t->vocab_size ||
        id->valuedouble != id->valueint)
        BAD(t, "post-processor %s: a token id outside the vocabulary", who);
}

// TemplateProcessing's single template: the special tokens' ids before and after $A, into pre / suf.
static void load_template(Tokenizer *t, const cJSON *o, int32_t **pre, int *npre, int32_t **suf, int *nsuf) {
    const cJSON *single = cJSON_GetObjectItemCaseSensitive(o, "single"), *e;
    const cJSON *specials = cJSON_GetObjectItemCaseSensitive(o, "special_tokens");
    if (!cJSON_IsArray(single)) BAD(t, "post-processor TemplateProcessing: \"single\" must be a list");
    int after = 0;
    cJSON_ArrayForEach(e, single) {
        if (cJSON_GetObjectItemCaseSensitive(e, "Sequence")) {
            if (after) BAD(t, "post-processor TemplateProcessing: the single template holds $A twice");
            after = 1;
            continue;
        }
        const char *name =
            jstr(t, cJSON_GetObjectItemCaseSensitive(e, "SpecialToken"), "id", "TemplateProcessing");
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(specials, name),
                                                            "ids"),
                    *id;
        if (!cJSON_IsArray(ids))
            BAD(t, "post-processor TemplateProcessing: no ids for the special token '%s'", name);
        cJSON_ArrayForEach(id, ids) {
            check_post_id(t, id, "TemplateProcessing");
            if (after) ids_add(suf, nsuf, id->valueint);
            else ids_add(pre, npre, id->valueint);
        }
    }
    if (!after) BAD(t, "post-processor TemplateProcessing: the single template has no $A");
}

// The post-processor (applied only with add_special): t->post_pre / post_suf, or the name of one that is
// not supported in t->post_bad. A Sequence applies its processors in order, each around the last's result.
static void load_post(Tokenizer *t, const cJSON *o) {
    if (!o || cJSON_IsNull(o)) return;
    const char *ty = jtype(t, o, "post_processor");
    int32_t *pre = NULL, *suf = NULL;
    int npre = 0, nsuf = 0;
    if (!strcmp(ty, "Sequence")) {
        const cJSON *e, *list = cJSON_GetObjectItemCaseSensitive(o, "processors");
        if (!cJSON_IsArray(list)) BAD(t, "post-processor Sequence: \"processors\" must be a list");
        cJSON_ArrayForEach(e, list) load_post(t, e);
        return;
    } else if (!strcmp(ty, "ByteLevel")) {
        return; // offsets only
    } else if (!strcmp(ty, "TemplateProcessing")) {
        load_template(t, o, &pre, &npre, &suf, &nsuf);
    } else if (!strcmp(ty, "RobertaProcessing") || !strcmp(ty, "BertProcessing")) {
        const cJSON *cls = cJSON_GetObjectItemCaseSensitive(o, "cls"),
                    *sep = cJSON_GetObjectItemCaseSensitive(o, "sep");
        if (!cJSON_IsArray(cls) || !cJSON_IsArray(sep))
            BAD(t, "post-processor %s: \"cls\" and \"sep\" must be [token, id]", ty);
        check_post_id(t, cJSON_GetArrayItem(cls, 1), ty);
        check_post_id(t, cJSON_GetArrayItem(sep, 1), ty);
        ids_add(&pre, &npre, cJSON_GetArrayItem(cls, 1)->valueint);
        ids_add(&suf, &nsuf, cJSON_GetArrayItem(sep, 1)->valueint);
    } else {
        snprintf(t->post_bad, sizeof t->post_bad, "%s", ty);
        return;
    }
    for (int i = 0; i < t->n_post_pre; i++) ids_add(&pre, &npre, t->post_pre[i]); // this one's go outside
    for (int i = 0; i < nsuf; i++) ids_add(&t->post_suf, &t->n_post_suf, suf[i]);
    free(t->post_pre);
    t->post_pre = pre;
    t->n_post_pre = npre;
    free(suf);
}

// Vocabulary: {"token": id, ...}; ids unique and non-negative.
static void load_vocab(Tokenizer *t, const cJSON *vocab) {
    if (!cJSON_IsObject(vocab)) BAD(t, "model: \"vocab\" must be an object of token -> id");
    int max_id = -1;
    const cJSON *e;
    cJSON_ArrayForEach(e, vocab) {
        if (!cJSON_IsNumber(e) || e->valuedouble < 0 || e->valuedouble >= MAX_ID ||
            e->valuedouble != e->valueint)
            BAD(t, "model vocab: token '%s' has no valid id (an integer in 0 .. %d)", e->string, MAX_ID - 1);
        if (e->valueint > max_id) max_id = e->valueint;
    }
    if (max_id < 0) BAD(t, "model: the vocabulary is empty");
    strtab_init(&t->vocab, max_id + 1);
    cJSON_ArrayForEach(e, vocab) {
        if (!strtab_add(&t->vocab, e->string, strlen(e->string), e->valueint))
            BAD(t, "model vocab: id %d or token '%s' appears twice", e->valueint, e->string);
    }
    t->vocab_size = max_id + 1;
}

static int vocab_id(const Tokenizer *t, const char *s, size_t n, size_t rank) {
    int id = strtab_get(&t->vocab, s, n);
    if (id < 0) BAD(t, "model: merge %zu names '%.*s', which is not in the vocabulary", rank, (int)n, s);
    return id;
}

// Merges: "a b" strings or ["a", "b"] pairs, by rank; a, b and ab must all be in the vocabulary.
static void load_merges(Tokenizer *t, const cJSON *merges) {
    if (!cJSON_IsArray(merges)) BAD(t, "model: \"merges\" must be a list");
    size_t n = (size_t)cJSON_GetArraySize(merges), i = 0;
    t->mkey = xmalloc((n + 1) * sizeof *t->mkey);
    t->mrank = xmalloc((n + 1) * sizeof *t->mrank);
    t->mnew = xmalloc((n + 1) * sizeof *t->mnew);
    Buf ab = {0};
    const cJSON *e;
    cJSON_ArrayForEach(e, merges) {
        const char *a, *b;
        size_t an, bn;
        if (cJSON_IsString(e)) {
            a = e->valuestring;
            const char *sp = strchr(a, ' ');
            if (!sp || strchr(sp + 1, ' ')) BAD(t, "model: merge %zu '%s' is not two tokens \"a b\"", i, a);
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = strlen(b);
        } else if (cJSON_IsArray(e) && cJSON_GetArraySize(e) == 2 &&
                   cJSON_IsString(cJSON_GetArrayItem(e, 0)) && cJSON_IsString(cJSON_GetArrayItem(e, 1))) {
            a = cJSON_GetArrayItem(e, 0)->valuestring;
            b = cJSON_GetArrayItem(e, 1)->valuestring;
            an = strlen(a);
            bn = strlen(b);
        } else BAD(t, "model: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", i);
        int ia = vocab_id(t, a, an, i), ib = vocab_id(t, b, bn, i);
        ab.n = 0;
        buf_put(&ab, a, an);
        buf_put(&ab, b, bn);
        t->mkey[i] = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        t->mnew[i] = vocab_id(t, ab.p, ab.n, i);
        i++;
    }
    buf_free(&ab);
    merges_build(t, n);
}

static void load_model(Tokenizer *t, const cJSON *m) {
    if (!cJSON_IsObject(m)) BAD(t, "no \"model\" object");
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(m, "type");
    if (ty && !cJSON_IsString(ty)) BAD(t, "model: \"type\" must be a string");
    if (ty ? strcmp(ty->valuestring, "BPE") != 0 : !cJSON_GetObjectItemCaseSensitive(m, "merges"))
        BAD(t, "model type '%s' is not supported (BPE is)", ty ? ty->valuestring : "(none)");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(m, "dropout");
    if (d && !cJSON_IsNull(d) && !(cJSON_IsNumber(d) && d->valuedouble == 0))
        BAD(t, "model: BPE dropout is not supported (encoding would be random)");
    static const char *const no[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, no[k]);
        if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !*v->valuestring))
            BAD(t, "model: BPE %s is not supported", no[k]);
    }
    load_vocab(t, cJSON_GetObjectItemCaseSensitive(m, "vocab"));
    load_merges(t, cJSON_GetObjectItemCaseSensitive(m, "merges"));
    t->byte_fallback = jbool(t, m, "byte_fallback", 0, "model");
    t->fuse_unk = jbool(t, m, "fuse_unk", 0, "model");
    t->ignore_merges = jbool(t, m, "ignore_merges", 0, "model");
    const cJSON *u = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
    t->unk_id = -1;
    if (u && !cJSON_IsNull(u)) {
        const char *un = jstr(t, m, "unk_token", "model");
        snprintf(t->unk_name, sizeof t->unk_name, "%s", un);
        t->unk_id = strtab_get(&t->vocab, un, strlen(un));
        if (t->unk_id < 0) t->unk_id = -2; // refused when first needed, as Hugging Face does
    }
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        t->fallback_id[b] = strtab_get(&t->vocab, s, strlen(s));
        int n = utf8_put(s, byte_char[b]);
        t->byte_id[b] = strtab_get(&t->vocab, s, (size_t)n);
    }
}

static void load_added(Tokenizer *t, const cJSON *list) {
    if (!list || cJSON_IsNull(list)) list = NULL;
    else if (!cJSON_IsArray(list)) BAD(t, "\"added_tokens\" must be a list");
    t->n_added = list ? cJSON_GetArraySize(list) : 0;
    t->added = xcalloc((size_t)t->n_added + 1, sizeof *t->added);
    int i = 0;
    const cJSON *e;
    cJSON_ArrayForEach(e, list) {
        Added *a = &t->added[i++];
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(e, "id");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= MAX_ID ||
            id->valuedouble != id->valueint)
            BAD(t, "added token %d has no valid \"id\" (an integer in 0 .. %d)", i - 1, MAX_ID - 1);
        a->id = id->valueint;
        const char *c = jstr(t, e, "content", "added token");
        if (!*c) BAD(t, "added token %d is empty", a->id);
        a->s = xstrdup(c);
        a->n = strlen(c);
        a->special = jbool(t, e, "special", 0, "added token");
        a->normalized = jbool(t, e, "normalized", !a->special, "added token");
        a->lstrip = jbool(t, e, "lstrip", 0, "added token");
        a->rstrip = jbool(t, e, "rstrip", 0, "added token");
        if (jbool(t, e, "single_word", 0, "added token"))
            BAD(t, "added token '%s': single_word is not supported", c);
        if (a->id + 1 > t->vocab_size) t->vocab_size = a->id + 1;
    }
    t->added_of_id = xmalloc((size_t)t->vocab_size * sizeof *t->added_of_id);
    for (int k = 0; k < t->vocab_size; k++) t->added_of_id[k] = -1;
    for (int k = 0; k < t->n_added; k++) t->added_of_id[t->added[k].id] = k;
}

const char *tok_file(const Tokenizer *t) { return t->path; }

static void load_json(Tokenizer *t, const cJSON *j) {
    byte_table_init();
    if (!cJSON_IsObject(j)) BAD(t, "not a JSON object");
    load_model(t, cJSON_GetObjectItemCaseSensitive(j, "model"));
    load_added(t, cJSON_GetObjectItemCaseSensitive(j, "added_tokens"));
    load_normalizer(t, cJSON_GetObjectItemCaseSensitive(j, "normalizer"));
    load_pretok(t, cJSON_GetObjectItemCaseSensitive(j, "pre_tokenizer"));
    load_decoder(t, cJSON_GetObjectItemCaseSensitive(j, "decoder"));
    load_post(t, cJSON_GetObjectItemCaseSensitive(j, "post_processor"));
}

Tokenizer *tok_load(const char *path) {
    Tokenizer *t = xcalloc(1, sizeof *t);
    if (dir_exists(path)) join_path(t->path, sizeof t->path, path, "tokenizer.json");
    else snprintf(t->path, sizeof t->path, "%s", path);
    if (!file_exists(t->path)) DIE("tokenizer: no file '%s'", t->path);
    long at = 0;
    cJSON *j = json_read_file("tokenizer", NULL, t->path, &at);
    if (!j) BAD(t, "not valid JSON (at byte %ld)", at);
    load_json(t, j);
    cJSON_Delete(j);
    return t;
}

Tokenizer *tok_from_json(const cJSON *j, const char *name) {
    Tokenizer *t = xcalloc(1, sizeof *t);
    snprintf(t->path, sizeof t->path, "%s", name);
    load_json(t, j);
    return t;
}

static void free_steps(Step *s, int n) {
    for (int i = 0; i < n; i++) {
        if (s[i].re) pcre2_code_free(s[i].re);
        free(s[i].a);
        free(s[i].b);
    }
    free(s);
}

void tok_free(Tokenizer *t) {
    if (!t) return;
    strtab_free(&t->vocab);
    free(t->mkey);
    free(t->mrank);
    free(t->mnew);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].s);
    free(t->added);
    free(t->added_of_id);
    free(t->post_pre);
    free(t->post_suf);
    free_steps(t->norm, t->n_norm);
    free_steps(t->pre, t->n_pre);
    free_steps(t->dec, t->n_dec);
    free(t);
}

int tok_vocab_size(const Tokenizer *t) { return t->vocab_size; }

int tok_token_id(const Tokenizer *t, const char *content) {
    size_t n = strlen(content);
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].n == n && !memcmp(t->added[i].s, content, n)) return t->added[i].id;
    return strtab_get(&t->vocab, content, n);
}
