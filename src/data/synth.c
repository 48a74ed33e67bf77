// synth.c — the embedded synthetic corpus: newline-terminated lines of six small tasks
// (add, reverse, sort, copy, count, upper), generated deterministically from a seed, with
// every byte labelled by its line's kind so MoE routing can be checked for specialisation.
//
// Line formats (every line is < 40 bytes including its '\n'):
//   add      "37+45=82"            operands 0..999 (1 to 3 digits each)
//   reverse  "rev:abcde=edcba"     2..10 lowercase letters
//   sort     "sort:3912=1239"      2..10 digits, sorted ascending
//   copy     "copy:xqz=xqz"        2..12 lowercase letters
//   count    "count:abcab/a=2"     3..12 letters from a..e, then a letter a..e and its count
//   upper    "upper:hello=HELLO"   2..12 lowercase letters
#include "data/data.h"
#include "core/common.h"
#include "core/rng.h"
#include <string.h>

enum { K_ADD, K_REVERSE, K_SORT, K_COPY, K_COUNT, K_UPPER, N_SYNTH_KINDS };
static const char *const kind_names[N_SYNTH_KINDS] = {"add", "reverse", "sort", "copy", "count", "upper"};
_Static_assert(N_SYNTH_KINDS <= DATA_MAX_KINDS, "too many synthetic kinds");

#define SYNTH_MAX_LINE 40 // every line, '\n' included, is shorter than this
#define SYNTH_SALT 0x5EED0C0A9E5D17C3ull // decorrelates the corpus from the epoch shuffles

int synth_kind_names(const char **names) {
    for (int k = 0; k < N_SYNTH_KINDS; k++) names[k] = kind_names[k];
    return N_SYNTH_KINDS;
}

static int rand_in(Rng *r, int lo, int hi) { return lo + (int)rng_below(r, (uint32_t)(hi - lo + 1)); }

static void rand_letters(Rng *r, char *out, int n, char first, int span) {
    for (int i = 0; i < n; i++) out[i] = (char)(first + (int)rng_below(r, (uint32_t)span));
}

static int rand_operand(Rng *r) {
    static const int lim[3] = {10, 100, 1000};
    return (int)rng_below(r, (uint32_t)lim[rng_below(r, 3)]);
}

// Writes one line (with '\n') of kind k into buf; returns its length.
static int make_line(Rng *r, int k, char *buf) {
    char s[16];
    int n = 0, len = 0;
    switch (k) {
        case K_ADD: {
            int a = rand_operand(r), b = rand_operand(r);
            len = snprintf(buf, SYNTH_MAX_LINE, "%d+%d=%d\n", a, b, a + b);
            break;
        }
        case K_REVERSE: {
            n = rand_in(r, 2, 10);
            rand_letters(r, s, n, 'a', 26);
            len = snprintf(buf, SYNTH_MAX_LINE, "rev:%.*s=", n, s);
            for (int i = n - 1; i >= 0; i--) buf[len++] = s[i];
            buf[len++] = '\n';
            break;
        }
        case K_SORT: {
            n = rand_in(r, 2, 10);
            rand_letters(r, s, n, '0', 10);
            len = snprintf(buf, SYNTH_MAX_LINE, "sort:%.*s=", n, s);
            int count[10] = {0};
            for (int i = 0; i < n; i++) count[s[i] - '0']++;
            for (int d = 0; d < 10; d++)
                for (int c = 0; c < count[d]; c++) buf[len++] = (char)('0' + d);
            buf[len++] = '\n';
            break;
        }
        case K_COPY: {
            n = rand_in(r, 2, 12);
            rand_letters(r, s, n, 'a', 26);
            len = snprintf(buf, SYNTH_MAX_LINE, "copy:%.*s=%.*s\n", n, s, n, s);
            break;
        }
        case K_COUNT: {
            n = rand_in(r, 3, 12);
            rand_letters(r, s, n, 'a', 5);
            char c = (char)('a' + (int)rng_below(r, 5));
            int cnt = 0;
            for (int i = 0; i < n; i++) cnt += s[i] == c;
            len = snprintf(buf, SYNTH_MAX_LINE, "count:%.*s/%c=%d\n", n, s, c, cnt);
            break;
        }
        case K_UPPER: {
            n = rand_in(r, 2, 12);
            rand_letters(r, s, n, 'a', 26);
            len = snprintf(buf, SYNTH_MAX_LINE, "upper:%.*s=", n, s);
            for (int i = 0; i < n; i++) buf[len++] = (char)(s[i] - 'a' + 'A');
            buf[len++] = '\n';
            break;
        }
        default: DIE("synth: bad kind %d", k);
    }
    CHECK(len > 0 && len < SYNTH_MAX_LINE, "synth: line of kind %s has length %d", kind_names[k], len);
    return len;
}

size_t synth_generate(uint64_t seed, size_t n_bytes, char *text, uint8_t *kinds) {
    Rng r;
    rng_seed(&r, seed ^ SYNTH_SALT);
    size_t pos = 0;
    char line[SYNTH_MAX_LINE + 16];
    for (;;) {
        int k = (int)rng_below(&r, N_SYNTH_KINDS);
        int len = make_line(&r, k, line);
        if (pos + (size_t)len > n_bytes) break;
        memcpy(text + pos, line, (size_t)len);
        if (kinds) memset(kinds + pos, k, (size_t)len);
        pos += (size_t)len;
    }
    return pos;
}
