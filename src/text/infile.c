// infile.c (text) — reading an input file of text in 1 MiB pieces, decompressed on the way: zlib's gzread
// for plain and gzip'd files (it passes plain bytes through), libzstd's streaming decoder for a file that
// starts with the zstd frame magic. Must not hold: documents or JSON (prep.c), writing files.
#include "text/infile.h"
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <zlib.h>
#include "core/common.h"
#ifdef MOE_HAVE_ZSTD
#include <zstd.h>
#endif

#define PIECE ((size_t)1 << 20)

struct InFile {
    const char *path, *who;
    gzFile gz; // plain or gzip
    FILE *raw; // zstd: the compressed bytes
#ifdef MOE_HAVE_ZSTD
    ZSTD_DStream *zs;
    ZSTD_inBuffer in;
    size_t zlast; // the decoder's last hint: 0 when a frame ended there
#endif
    char *zin; // zstd: the compressed bytes' buffer
    char *b; // decompressed text: b[pos, n) not yet handed out
    size_t n, pos, cap;
    int eof;
};

size_t infile_suffix(const char *path) {
    size_t n = strlen(path);
    if (n > 3 && !strcmp(path + n - 3, ".gz")) return 3;
    if (n > 4 && !strcmp(path + n - 4, ".zst")) return 4;
    return 0;
}

static int is_zstd(const char *path, const char *who) {
    static const unsigned char magic[4] = {0x28, 0xB5, 0x2F, 0xFD}; // a zstd frame, little-endian 0xFD2FB528
    unsigned char head[4];
    FILE *f = fopen(path, "rb");
    if (!f) DIE("%s: cannot open '%s' (%s)", who, path, strerror(errno));
    size_t got = fread(head, 1, 4, f);
    int err = ferror(f);
    fclose(f);
    if (err) DIE("%s: cannot read '%s' (%s)", who, path, strerror(errno));
    return got == 4 && !memcmp(head, magic, 4);
}

InFile *infile_open(const char *path, const char *who) {
    InFile *f = xcalloc(1, sizeof *f);
    f->path = path;
    f->who = who;
    if (!is_zstd(path, who)) {
        f->gz = gzopen(path, "rb");
        if (!f->gz) DIE("%s: cannot open '%s' (%s)", who, path, strerror(errno));
        return f;
    }
#ifdef MOE_HAVE_ZSTD
    f->raw = fopen(path, "rb");
    if (!f->raw) DIE("%s: cannot read '%s' (%s)", who, path, strerror(errno));
    f->zs = ZSTD_createDStream();
    if (!f->zs) DIE("%s: cannot start a zstd decoder for '%s' (out of memory)", who, path);
    f->zin = xmalloc(ZSTD_DStreamInSize());
    f->in = (ZSTD_inBuffer){f->zin, 0, 0};
    return f;
#else
    DIE("%s: '%s' is zstd-compressed, and this moe was built without libzstd (install libzstd-dev and run "
        "cmake "
        "again, or decompress it: zstd -d)",
        who, path);
#endif
}

#ifdef MOE_HAVE_ZSTD
// Up to cap decompressed bytes into out; 0 at the end of the file (a frame cut short dies).
static size_t zstd_read(InFile *f, char *out, size_t cap) {
    ZSTD_outBuffer o = {out, cap, 0};
    while (o.pos == 0) {
        if (f->in.pos == f->in.size) {
            f->in.size = fread(f->zin, 1, ZSTD_DStreamInSize(), f->raw);
            f->in.pos = 0;
            if (ferror(f->raw)) DIE("%s: cannot read '%s' (%s)", f->who, f->path, strerror(errno));
            if (f->in.size == 0) {
                if (f->zlast != 0)
                    DIE("%s: cannot read '%s' (the zstd stream is truncated)", f->who, f->path);
                return 0;
            }
        }
        f->zlast = ZSTD_decompressStream(f->zs, &o, &f->in);
        if (ZSTD_isError(f->zlast))
            DIE("%s: cannot read '%s' (zstd: %s)", f->who, f->path, ZSTD_getErrorName(f->zlast));
    }
    return o.pos;
}
#endif

// One more piece of text after b[pos, n) (moved to the front).
static void fill(InFile *f) {
    if (f->pos) {
        memmove(f->b, f->b + f->pos, f->n - f->pos);
        f->n -= f->pos;
        f->pos = 0;
    }
    if (f->n + PIECE + 1 > f->cap) f->b = xrealloc(f->b, f->cap = (f->n + PIECE + 1) * 2);
    size_t got;
    if (f->gz) {
        int k = gzread(f->gz, f->b + f->n, (unsigned)PIECE), err = Z_OK;
        const char *msg = gzerror(f->gz, &err);
        if (k < 0 || (err != Z_OK && err != Z_STREAM_END))
            DIE("%s: cannot read '%s' (%s)", f->who, f->path, err == Z_ERRNO ? strerror(errno) : msg);
        got = (size_t)k;
    } else {
#ifdef MOE_HAVE_ZSTD
        got = zstd_read(f, f->b + f->n, PIECE);
#else
        got = 0; // infile_open refused it
#endif
    }
    if (got == 0) f->eof = 1;
    f->n += got;
}

char *infile_line(InFile *f, size_t *len) {
    for (;;) {
        char *nl = f->n > f->pos ? memchr(f->b + f->pos, '\n', f->n - f->pos) : NULL;
        if (nl || (f->eof && f->pos < f->n)) {
            char *s = f->b + f->pos;
            *len = nl ? (size_t)(nl - s) : f->n - f->pos;
            f->pos += *len + (nl != NULL);
            s[*len] = 0;
            return s;
        }
        if (f->eof) return NULL;
        fill(f);
    }
}

char *infile_all(InFile *f, size_t *len) {
    while (!f->eof) fill(f);
    if (!f->b) f->b = xmalloc(f->cap = 1);
    f->b[f->n] = 0;
    *len = f->n - f->pos;
    return f->b + f->pos;
}

unsigned long long infile_consumed(const InFile *f) {
    if (f->gz) return (unsigned long long)gzoffset(f->gz);
    long at = ftell(f->raw);
#ifdef MOE_HAVE_ZSTD
    at -= (long)(f->in.size - f->in.pos); // read from the file, not yet decoded
#endif
    return at > 0 ? (unsigned long long)at : 0;
}

void infile_close(InFile *f) {
    if (f->gz) gzclose(f->gz);
    if (f->raw) fclose(f->raw);
#ifdef MOE_HAVE_ZSTD
    if (f->zs) ZSTD_freeDStream(f->zs);
#endif
    free(f->zin);
    free(f->b);
    free(f);
}
