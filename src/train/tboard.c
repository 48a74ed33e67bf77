// tboard.c — TensorBoard event files (see tboard.h): the protobuf wire format by hand (varints, 64-bit and
// 32-bit fixed fields, length-delimited fields), TFRecord framing with CRC32C (Castagnoli, reflected
// 0x82F63B78, a byte table) masked as TensorFlow masks it, each record appended whole through the checked
// append (core/common.h). Field numbers: Event {1 wall_time double, 2 step int64, 3 file_version string,
// 5 summary, 7 session_log}; Summary {1 repeated Value}; Value {1 tag string, 2 simple_value float};
// SessionLog {1 status: 1 START}.
// Must not hold: which scalars a run logs (trainer.c).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "train/tboard.h"
#include "core/common.h"
#include <math.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

struct TbWriter {
    FILE *f;
    char path[4200];
    unsigned char *sum, *body, *rec; // the Summary being built; the Event's summary field; one framed record
    size_t nsum, cap_sum, cap_rec;
};

static uint32_t crc_table[256];

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

// CRC32C of n bytes, masked: rotated right by 15 bits plus 0xa282ead8 (TFRecord's rule).
static uint32_t masked_crc(const unsigned char *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    c ^= 0xFFFFFFFFu;
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static size_t put_varint(unsigned char *p, uint64_t v) {
    size_t n = 0;
    while (v >= 0x80) {
        p[n++] = (unsigned char)(v | 0x80);
        v >>= 7;
    }
    p[n++] = (unsigned char)v;
    return n;
}
static size_t put_le(unsigned char *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> (8 * i));
    return (size_t)bytes;
}
// A length-delimited field: its key, the length, the bytes.
static size_t put_bytes(unsigned char *p, int field, const void *b, size_t n) {
    size_t k = put_varint(p, (uint64_t)field << 3 | 2);
    k += put_varint(p + k, n);
    memcpy(p + k, b, n);
    return k + n;
}

static double wall_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

// Frames an Event (wall time, step, then body: its remaining fields, already encoded) as one record and
// appends it.
static void put_event(TbWriter *w, long step, const unsigned char *body, size_t nbody) {
    unsigned char *e = w->rec + 12; // the event, after the record's length and its CRC
    size_t n = 0;
    double t = wall_time();
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);
    e[n++] = 1 << 3 | 1; // wall_time, fixed64
    n += put_le(e + n, bits, 8);
    e[n++] = 2 << 3 | 0; // step, varint
    n += put_varint(e + n, (uint64_t)(step < 0 ? 0 : step));
    CHECK(12 + n + nbody + 4 <= w->cap_rec, "tensorboard: an event of %zu bytes overflows its buffer", nbody);
    memcpy(e + n, body, nbody);
    n += nbody;
    put_le(w->rec, n, 8);
    put_le(w->rec + 8, masked_crc(w->rec, 8), 4);
    put_le(e + n, masked_crc(e, n), 4);
    xfappend_bytes(w->rec, 12 + n + 4, w->f, w->path);
}

TbWriter *tb_open(const char *dir, long first_step, int max_values) {
    crc_init();
    TbWriter *w = xcalloc(1, sizeof *w);
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "localhost");
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    char name[512];
    snprintf(name, sizeof name, "events.out.tfevents.%lld.%s.%d.moe", (long long)time(NULL), host,
             (int)getpid());
    join_path(w->path, sizeof w->path, dir, name);
    w->cap_sum = (size_t)(max_values > 0 ? max_values : 1) * (TB_TAG_MAX + 16) + 64;
    w->cap_rec = w->cap_sum + 64;
    w->sum = xmalloc(w->cap_sum);
    w->body = xmalloc(w->cap_sum + 16);
    w->rec = xmalloc(w->cap_rec);
    w->f = xfopen(w->path, "ab");
    unsigned char body[64];
    size_t n = put_bytes(body, 3, "brain.Event:2", 13); // file_version
    put_event(w, 0, body, n);
    unsigned char start[2] = {1 << 3 | 0, 1}; // SessionLog: status START
    n = put_bytes(body, 7, start, sizeof start);
    put_event(w, first_step + 1, body, n);
    return w;
}

void tb_add(TbWriter *w, const char *tag, double v) {
    if (!isfinite(v)) return;
    size_t tl = strlen(tag);
    CHECK(tl <= TB_TAG_MAX, "tensorboard: the tag '%s' is longer than %d bytes", tag, TB_TAG_MAX);
    unsigned char val[TB_TAG_MAX + 16];
    size_t n = put_bytes(val, 1, tag, tl);
    float f = (float)v;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    val[n++] = 2 << 3 | 5; // simple_value, fixed32
    n += put_le(val + n, bits, 4);
    CHECK(w->nsum + n + 8 <= w->cap_sum, "tensorboard: more scalars in one event than its buffer holds");
    w->nsum += put_bytes(w->sum + w->nsum, 1, val, n);
}

void tb_write(TbWriter *w, long step) {
    if (!w->nsum) return;
    size_t n = put_bytes(w->body, 5, w->sum, w->nsum); // the summary field
    put_event(w, step, w->body, n);
    w->nsum = 0;
}

void tb_close(TbWriter *w) {
    if (!w) return;
    xfclose(w->f, w->path);
    free(w->sum);
    free(w->body);
    free(w->rec);
    free(w);
}
