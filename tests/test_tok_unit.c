// test_tok_unit.c — the tokenizer (src/text/) on a tokenizer.json written here by hand, where every
// expected id follows from the BPE rules by hand: a byte-level vocabulary (GPT-2's byte map, id = byte)
// with four merges whose ranks decide between two segmentations of "hello", the ByteLevel
// pre-tokenizer's split before a space, a special added token matched inside a word and dropped by
// skip_special, and the streaming decoder holding back the bytes of an incomplete UTF-8 character
// (an emoji over four ids) and a lone invalid byte until text follows it.
#include <string.h>
#include <unistd.h>
#include <cjson/cJSON.h>
#include "core/common.h"
#include "text/tokenizer.h"
#include "test_util.h"

// GPT-2's byte -> character map, written out again here: printable Latin-1 maps to itself, the other
// bytes to 256, 257, ... in byte order.
static void byte_token(int b, char *out) {
    int n = 0, cp = b;
    int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (!printable) {
        cp = 256;
        for (int k = 0; k < b; k++)
            if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE && k <= 0xFF))) cp++;
    }
    if (cp < 0x80) out[n++] = (char)cp;
    else {
        out[n++] = (char)(0xC0 | (cp >> 6));
        out[n++] = (char)(0x80 | (cp & 0x3F));
    }
    out[n] = 0;
}

static const char *write_tokenizer(const char *dir) {
    cJSON *j = cJSON_CreateObject(), *m = cJSON_AddObjectToObject(j, "model"),
          *v = cJSON_AddObjectToObject(m, "vocab");
    cJSON_AddStringToObject(m, "type", "BPE");
    char t[8];
    for (int b = 0; b < 256; b++) {
        byte_token(b, t);
        cJSON_AddNumberToObject(v, t, b);
    }
    const char *merged[] = {"he", "ll", "hell", "llo"}, *merges[] = {"h e", "l l", "he ll", "ll o"};
    cJSON *ml = cJSON_AddArrayToObject(m, "merges");
    for (int k = 0; k < 4; k++) {
        cJSON_AddNumberToObject(v, merged[k], 256 + k);
        cJSON_AddItemToArray(ml, cJSON_CreateString(merges[k]));
    }
    cJSON *pre = cJSON_AddObjectToObject(j, "pre_tokenizer"), *dec = cJSON_AddObjectToObject(j, "decoder");
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddFalseToObject(pre, "add_prefix_space");
    cJSON_AddTrueToObject(pre, "use_regex");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON *added = cJSON_AddArrayToObject(j, "added_tokens"), *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", 300);
    cJSON_AddStringToObject(a, "content", "<|eot|>");
    cJSON_AddTrueToObject(a, "special");
    cJSON_AddItemToArray(added, a);
    static char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    json_write_file(path, j);
    cJSON_Delete(j);
    return path;
}

static int encode_is(const Tokenizer *t, const char *text, const int32_t *want, size_t n_want) {
    int32_t *ids = NULL;
    size_t cap = 0, n = tok_encode(t, text, strlen(text), 0, &ids, &cap);
    int ok = n == n_want && (!n || !memcmp(ids, want, n * sizeof *ids));
    if (!ok) {
        fprintf(stderr, "encode '%s':", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    free(ids);
    return ok;
}

int main(void) {
    char dir[] = "/tmp/moe_tok_unitXXXXXX";
    CHECK(mkdtemp(dir), "mkdtemp");
    Tokenizer *t = tok_load(write_tokenizer(dir));
    EXPECT(tok_vocab_size(t) == 301, "vocab %d (ids 0..260 and the added 300)", tok_vocab_size(t));
    // h e l l o: (h,e) rank 0, then (l,l) rank 1, then (he,ll) rank 2 beats (ll,o) rank 3: hell + o
    EXPECT(encode_is(t, "hello", (int32_t[]){258, 'o'}, 2), "hello = hell o");
    // "llo" alone: (l,l) first, then (ll,o): one token
    EXPECT(encode_is(t, "llo", (int32_t[]){259}, 1), "llo = llo");
    // GPT-2's regex puts the space before a word into it; a space maps to id 32 (its byte)
    EXPECT(encode_is(t, "hello hello", (int32_t[]){258, 'o', ' ', 258, 'o'}, 5), "hello hello");
    EXPECT(encode_is(t, "he<|eot|>llo", (int32_t[]){256, 300, 259}, 3), "the special token splits the word");
    EXPECT(encode_is(t, "", NULL, 0), "empty text: no ids");
    int32_t ids[] = {256, 300, 259};
    size_t n;
    char *s = tok_decode(t, ids, 3, 0, &n);
    EXPECT(n == 12 && !strcmp(s, "he<|eot|>llo"), "decode: '%s'", s);
    free(s);
    s = tok_decode(t, ids, 3, 1, &n);
    EXPECT(!strcmp(s, "hello"), "decode skipping special: '%s'", s);
    free(s);

    // the stream: an emoji's four bytes come out whole at the fourth id, none before
    int32_t emoji[] = {'a', 0xF0, 0x9F, 0x98, 0x80, 'b'};
    const char *want[] = {"a", "", "", "", "\xF0\x9F\x98\x80", "b"};
    TokStream *st = tok_stream_new(t, 0);
    for (int i = 0; i < 6; i++) {
        size_t m;
        const char *got = tok_stream_step(st, emoji[i], &m);
        EXPECT(m == strlen(want[i]) && !strcmp(got, want[i]), "stream step %d: '%s', expected '%s'", i, got,
               want[i]);
    }
    tok_stream_free(st);
    // a lone invalid byte: held back (it decodes to U+FFFD) until a character follows, then both
    st = tok_stream_new(t, 0);
    size_t m;
    EXPECT(!strcmp(tok_stream_step(st, 0xFF, &m), "") && m == 0, "stream: the invalid byte alone is held");
    const char *got = tok_stream_step(st, 'h', &m);
    EXPECT(!strcmp(got, "\xEF\xBF\xBDh"), "stream: U+FFFD then h, got '%s'", got);
    tok_stream_free(st);
    s = tok_decode(t, (int32_t[]){0xF0, 0x9F, 'x'}, 3, 0, &n);
    EXPECT(!strcmp(s, "\xEF\xBF\xBDx"), "decode: an incomplete sequence is one U+FFFD: '%s'", s);
    free(s);
    tok_free(t);
    char p[300];
    snprintf(p, sizeof p, "%s/tokenizer.json", dir);
    unlink(p);
    rmdir(dir);
    return test_done("test_tok_unit");
}
