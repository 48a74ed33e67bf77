// fuzz_tokenize.c — libFuzzer target: any bytes through a byte-level BPE tokenizer (Llama-3's Split
// regex, then ByteLevel; a few merges; a special token), written once at the first input. Encoding
// never refuses; the ids decode to valid UTF-8, to the input itself when the input is UTF-8 (byte-level
// BPE loses nothing), and the streaming decoder's pieces add up to that text (less a final U+FFFD, which
// it holds back as tokenizers' DecodeStream does).
#include "fuzz.h"
#include <cjson/cJSON.h>
#include "text/tokenizer.h"

static const char LLAMA3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                             "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

static Tokenizer *make(void) {
    cJSON *j = cJSON_CreateObject(), *m = cJSON_AddObjectToObject(j, "model"),
          *v = cJSON_AddObjectToObject(m, "vocab");
    cJSON_AddStringToObject(m, "type", "BPE");
    for (int b = 0, extra = 0; b < 256; b++) { // GPT-2's byte map: id = byte
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int cp = printable ? b : 256 + extra++;
        char t[3] = {(char)(cp < 0x80 ? cp : 0xC0 | (cp >> 6)), (char)(cp < 0x80 ? 0 : 0x80 | (cp & 0x3F)),
                     0};
        cJSON_AddNumberToObject(v, t, b);
    }
    const char *merged[] = {"he", "ll", "hell", "llo", "\xC4\xA0t", "\xC4\xA0th"};
    const char *merges[] = {"h e", "l l", "he ll", "ll o", "\xC4\xA0 t", "\xC4\xA0t h"};
    cJSON *ml = cJSON_AddArrayToObject(m, "merges");
    for (int k = 0; k < 6; k++) {
        cJSON_AddNumberToObject(v, merged[k], 256 + k);
        cJSON_AddItemToArray(ml, cJSON_CreateString(merges[k]));
    }
    cJSON *pre = cJSON_AddObjectToObject(j, "pre_tokenizer"),
          *seq = cJSON_AddArrayToObject(pre, "pretokenizers");
    cJSON_AddStringToObject(pre, "type", "Sequence");
    cJSON *split = cJSON_CreateObject(), *bl = cJSON_CreateObject();
    cJSON_AddStringToObject(split, "type", "Split");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(split, "pattern"), "Regex", LLAMA3);
    cJSON_AddStringToObject(split, "behavior", "Isolated");
    cJSON_AddStringToObject(bl, "type", "ByteLevel");
    cJSON_AddFalseToObject(bl, "add_prefix_space");
    cJSON_AddFalseToObject(bl, "use_regex");
    cJSON_AddItemToArray(seq, split);
    cJSON_AddItemToArray(seq, bl);
    cJSON_AddStringToObject(cJSON_AddObjectToObject(j, "decoder"), "type", "ByteLevel");
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", 300);
    cJSON_AddStringToObject(a, "content", "<|eot|>");
    cJSON_AddTrueToObject(a, "special");
    cJSON_AddItemToArray(cJSON_AddArrayToObject(j, "added_tokens"), a);
    char *txt = cJSON_PrintUnformatted(j);
    const char *p = fuzz_file("tokenizer.json", (const uint8_t *)txt, strlen(txt));
    cJSON_free(txt);
    cJSON_Delete(j);
    return tok_load(p);
}

// 1 when s[0..n) is well-formed UTF-8 (the Unicode table of well-formed byte sequences).
static int utf8_ok(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i],
                 len = c < 0x80      ? 1
            : c >= 0xC2 && c <= 0xDF ? 2
            : c >= 0xE0 && c <= 0xEF ? 3
            : c >= 0xF0 && c <= 0xF4 ? 4
                                     : 0;
        if (!len || i + len > n) return 0;
        for (unsigned k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && s[i + 1] < 0xA0) || (c == 0xED && s[i + 1] > 0x9F) ||
            (c == 0xF0 && s[i + 1] < 0x90) || (c == 0xF4 && s[i + 1] > 0x8F))
            return 0;
        i += len;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    static Tokenizer *t;
    if (!t) t = make();
    int32_t *ids = NULL;
    size_t cap = 0, len;
    size_t k = tok_encode(t, (const char *)data, n, 0, &ids, &cap);
    for (size_t i = 0; i < k; i++)
        if (ids[i] < 0 || ids[i] >= tok_vocab_size(t)) abort();
    char *text = tok_decode(t, ids, k, 0, &len);
    if (!utf8_ok((const unsigned char *)text, len)) abort();
    if (utf8_ok(data, n)) {
        if (len != n || memcmp(text, data, n)) abort(); // lossless on UTF-8
        TokStream *st = tok_stream_new(t, 0);
        size_t at = 0;
        for (size_t i = 0; i < k; i++) {
            size_t pn;
            const char *piece = tok_stream_step(st, ids[i], &pn);
            if (at + pn > len || memcmp(text + at, piece, pn)) abort();
            at += pn;
        }
        // all of it, unless it ends in U+FFFD, which the stream holds back as an incomplete character
        if (at != len && !(len >= 3 && !memcmp(text + len - 3, "\xEF\xBF\xBD", 3))) abort();
        tok_stream_free(st);
    }
    free(text);
    free(ids);
    return 0;
}
