// safetensors.c — the safetensors format (an 8-byte little-endian header length, a JSON header of
// dtype / shape / data_offsets per tensor plus "__metadata__", then the raw data): writing F32
// files (whole, or as a sized skeleton that others fill with pwrite) and reading F32/BF16/F16
// tensors by name into float. Must not hold: what the tensors mean (parameter tables, checkpoint
// directories, Hugging Face names).
#include "io/safetensors.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/common.h"

#define ST_MAX_HEADER (100ull << 20) // the format's own limit
#define MAX_EXACT_INT 9007199254740992.0 // 2^53: integers above this do not survive a JSON double

static void check_little_endian(void) {
    uint32_t x = 1;
    unsigned char b;
    memcpy(&b, &x, 1);
    if (b != 1) DIE("safetensors IO needs a little-endian host");
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%lld", i ? "," : "", (long long)shape[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
}

// ---------------------------------------------------------------------------------------------
// writing

typedef struct {
    const char *name;
    int at;
} NameAt;
static int name_at_cmp(const void *a, const void *b) {
    const NameAt *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->at > y->at) - (x->at < y->at);
}

// The first tensor (in order) whose name an earlier one has, or -1. Sorted once: a model of 65536
// experts has 2 x 10^5 tensors, and comparing each name with every earlier one took minutes.
static int st_first_duplicate(const StTensor *ts, int n) {
    NameAt *k = xmalloc((size_t)(n ? n : 1) * sizeof *k);
    for (int i = 0; i < n; i++) k[i] = (NameAt){ts[i].name, i};
    qsort(k, (size_t)n, sizeof *k, name_at_cmp);
    int dup = -1;
    for (int i = 1; i < n; i++)
        if (!strcmp(k[i].name, k[i - 1].name) && (dup < 0 || k[i].at < dup)) dup = k[i].at;
    free(k);
    return dup;
}

// skeleton: write the header and size the file (zeros) without data; *data_start gets where the
// data section begins (tensors follow in order, 4 bytes per element).
static void st_write(const char *path, const StTensor *ts, int n, const char *metadata_json, int skeleton,
                     uint64_t *data_start) {
    check_little_endian();
    cJSON *h = cJSON_CreateObject();
    uint64_t off = 0;
    int dup = st_first_duplicate(ts, n);
    for (int i = 0; i < n; i++) {
        const StTensor *t = &ts[i];
        if (!t->name[0] || strcmp(t->name, "__metadata__") == 0)
            DIE("safetensors_write '%s': bad tensor name '%s'", path, t->name);
        if (i == dup) DIE("safetensors_write '%s': duplicate tensor %s", path, t->name);
        if (t->ndim < 0 || t->ndim > 4)
            DIE("safetensors_write '%s': tensor %s has %d dims (0..4 supported)", path, t->name, t->ndim);
        uint64_t numel = 1;
        cJSON *shape = cJSON_CreateArray();
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0) DIE("safetensors_write '%s': tensor %s has a negative dim", path, t->name);
            numel *= (uint64_t)t->shape[d];
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t->shape[d]));
        }
        if (numel && !t->data && !skeleton)
            DIE("safetensors_write '%s': tensor %s has no data", path, t->name);
        uint64_t end = off + 4 * numel;
        if ((double)end > MAX_EXACT_INT) DIE("safetensors_write '%s': file too large", path);
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "dtype", "F32");
        cJSON_AddItemToObject(e, "shape", shape);
        cJSON *offs = cJSON_CreateArray();
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)end));
        cJSON_AddItemToObject(e, "data_offsets", offs);
        cJSON_AddItemToObject(h, t->name, e);
        off = end;
    }
    cJSON *meta = NULL;
    if (metadata_json && metadata_json[0]) {
        meta = cJSON_Parse(metadata_json);
        if (!cJSON_IsObject(meta)) DIE("safetensors_write '%s': metadata is not a JSON object", path);
        for (const cJSON *it = meta->child; it; it = it->next)
            if (!cJSON_IsString(it))
                DIE("safetensors_write '%s': metadata value \"%s\" must be a string", path, it->string);
    } else {
        meta = cJSON_CreateObject();
    }
    // transformers refuses safetensors metadata without a known "format".
    if (!cJSON_GetObjectItemCaseSensitive(meta, "format")) cJSON_AddStringToObject(meta, "format", "pt");
    cJSON_AddItemToObject(h, "__metadata__", meta);

    char *js = cJSON_PrintUnformatted(h);
    if (!js) DIE("out of memory formatting the header of '%s'", path);
    cJSON_Delete(h);
    size_t len = strlen(js);
    size_t pad = (8 - (8 + len) % 8) % 8; // data starts 8-byte aligned
    uint64_t N = len + pad;
    unsigned char le[8];
    for (int b = 0; b < 8; b++) le[b] = (unsigned char)(N >> (8 * b));

    FILE *f = xfopen(path, "wb");
    xfwrite(le, 1, 8, f, path);
    xfwrite(js, 1, len, f, path);
    xfwrite("        ", 1, pad, f, path);
    cJSON_free(js);
    if (data_start) *data_start = 8 + N;
    if (skeleton) {
        xfflush(f, path);
        if (ftruncate(fileno(f), (off_t)(8 + N + off)) != 0) die_io("size", path, errno);
    } else {
        for (int i = 0; i < n; i++) {
            size_t numel = 1;
            for (int d = 0; d < ts[i].ndim; d++) numel *= (size_t)ts[i].shape[d];
            xfwrite(ts[i].data, sizeof(float), numel, f, path);
        }
    }
    xfclose(f, path);
}

void safetensors_write(const char *path, const StTensor *ts, int n, const char *metadata_json) {
    st_write(path, ts, n, metadata_json, 0, NULL);
}

uint64_t safetensors_write_skeleton(const char *path, const StTensor *ts, int n, const char *metadata_json) {
    uint64_t data_start;
    st_write(path, ts, n, metadata_json, 1, &data_start);
    return data_start;
}

// ---------------------------------------------------------------------------------------------
// reading

struct StFile {
    char *path;
    int fd;
    uint64_t size, data_start, data_size;
    cJSON *hdr;
    int n; // tensors (the __metadata__ entry excluded)
    const char **names; // theirs, in header order (owned by hdr)
    const cJSON **sorted; // their header entries by name (a lookup is a binary search, not a walk)
};

typedef struct {
    const char *name, *dtype;
    int ndim;
    int64_t shape[8];
    uint64_t numel, begin, end;
} StEntry;

static int dtype_size(const char *dt) {
    static const struct {
        const char *n;
        int s;
    } t[] = {{"F64", 8},  {"F32", 4},     {"F16", 2},     {"BF16", 2},   {"I64", 8}, {"I32", 4},
             {"I16", 2},  {"I8", 1},      {"U64", 8},     {"U32", 4},    {"U16", 2}, {"U8", 1},
             {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"F8_E8M0", 1}};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (strcmp(t[i].n, dt) == 0) return t[i].s;
    return 0;
}

static int json_uint(const cJSON *it, uint64_t *out) {
    if (!cJSON_IsNumber(it)) return -1;
    double d = it->valuedouble;
    if (!(d >= 0) || d != floor(d) || d > MAX_EXACT_INT) return -1;
    *out = (uint64_t)d;
    return 0;
}

static void st_entry(const StFile *r, const cJSON *it, StEntry *e) {
    const char *nm = it->string;
    memset(e, 0, sizeof *e);
    e->name = nm;
    if (!cJSON_IsObject(it)) DIE("'%s' is corrupt: header entry for tensor %s is not an object", r->path, nm);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(it, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(it, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(it, "data_offsets");
    if (!cJSON_IsString(dt)) DIE("'%s' is corrupt: tensor %s has no dtype", r->path, nm);
    if (!cJSON_IsArray(sh)) DIE("'%s' is corrupt: tensor %s has no shape", r->path, nm);
    if (!cJSON_IsArray(of) || cJSON_GetArraySize(of) != 2)
        DIE("'%s' is corrupt: tensor %s has no data_offsets pair", r->path, nm);
    e->dtype = dt->valuestring;
    e->ndim = cJSON_GetArraySize(sh);
    if (e->ndim > 8) DIE("'%s': tensor %s has %d dims", r->path, nm, e->ndim);
    e->numel = 1;
    int d = 0;
    for (const cJSON *x = sh->child; x; x = x->next, d++) {
        uint64_t v;
        if (json_uint(x, &v)) DIE("'%s' is corrupt: tensor %s has a bad shape", r->path, nm);
        e->shape[d] = (int64_t)v;
        if (v && e->numel > UINT64_MAX / v) DIE("'%s' is corrupt: tensor %s has a bad shape", r->path, nm);
        e->numel *= v;
    }
    if (json_uint(of->child, &e->begin) || json_uint(of->child->next, &e->end) || e->begin > e->end ||
        e->end > r->data_size)
        DIE("'%s' is corrupt: tensor %s has data_offsets outside the data section (%llu bytes)", r->path, nm,
            (unsigned long long)r->data_size);
    int sz = dtype_size(e->dtype);
    if (!sz) DIE("'%s' is corrupt: tensor %s has an unknown dtype \"%s\"", r->path, nm, e->dtype);
    if ((e->numel > UINT64_MAX / (uint64_t)sz || e->numel * (uint64_t)sz != e->end - e->begin))
        DIE("'%s' is corrupt: tensor %s has %llu bytes of data; %s with that shape needs %llu", r->path, nm,
            (unsigned long long)(e->end - e->begin), e->dtype, (unsigned long long)(e->numel * (uint64_t)sz));
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const StEntry *)a)->name, ((const StEntry *)b)->name);
}
static int item_by_name(const void *a, const void *b) {
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}
static int by_offset(const void *a, const void *b) {
    const StEntry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

// The format's layout rules: every name once; the tensors' byte ranges, in offset order, start at 0,
// follow each other without gap or overlap, and end exactly where the file does. (Sorts es.)
static void st_check_layout(const StFile *r, StEntry *es, int n) {
    qsort(es, (size_t)n, sizeof *es, by_name);
    for (int i = 1; i < n; i++)
        if (strcmp(es[i].name, es[i - 1].name) == 0)
            DIE("'%s' is corrupt: tensor %s is in its header twice", r->path, es[i].name);
    qsort(es, (size_t)n, sizeof *es, by_offset);
    uint64_t at = 0;
    for (int i = 0; i < n; i++) {
        if (es[i].begin < at)
            DIE("'%s' is corrupt: tensors %s and %s overlap in the data section", r->path, es[i - 1].name,
                es[i].name);
        if (es[i].begin > at)
            DIE("'%s' is corrupt: a gap of %llu bytes before tensor %s in the data section", r->path,
                (unsigned long long)(es[i].begin - at), es[i].name);
        at = es[i].end;
    }
    if (at != r->data_size)
        DIE("'%s' is corrupt: its tensors cover %llu bytes of the %llu-byte data section (header length or "
            "file size "
            "wrong)",
            r->path, (unsigned long long)at, (unsigned long long)r->data_size);
}

StFile *safetensors_open(const char *path_in) {
    check_little_endian();
    StFile *r = xcalloc(1, sizeof *r);
    r->path = xstrdup(path_in);
    const char *path = r->path;
    r->fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); // a FIFO must not block the open
    if (r->fd < 0) DIE("cannot open '%s' (%s)", path, strerror(errno));
    struct stat st;
    if (fstat(r->fd, &st) != 0) DIE("cannot stat '%s' (%s)", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) DIE("'%s' is not a regular file", path);
    r->size = (uint64_t)st.st_size;
    if (r->size < 8)
        DIE("'%s' is not a safetensors file (only %llu bytes)", path, (unsigned long long)r->size);
    unsigned char le[8];
    xpread(r->fd, le, 8, 0, path);
    uint64_t N = 0;
    for (int b = 0; b < 8; b++) N |= (uint64_t)le[b] << (8 * b);
    if (N < 2 || N > r->size - 8)
        DIE("'%s' is corrupt: header length %llu does not fit in the file (%llu bytes)", path,
            (unsigned long long)N, (unsigned long long)r->size);
    if (N > ST_MAX_HEADER)
        DIE("'%s' is corrupt: header length %llu exceeds the 100 MiB limit", path, (unsigned long long)N);
    char *hb = xmalloc((size_t)N);
    xpread(r->fd, hb, (size_t)N, 8, path);
    const char *jend = NULL;
    r->hdr = cJSON_ParseWithLengthOpts(hb, (size_t)N, &jend, 0);
    if (!cJSON_IsObject(r->hdr)) DIE("'%s' is corrupt: its header is not a JSON object", path);
    for (; jend < hb + N; jend++) // the format pads the header with spaces, and nothing else
        if (*jend != ' ') DIE("'%s' is corrupt: its header has bytes after its JSON object", path);
    free(hb);
    r->data_start = 8 + N;
    r->data_size = r->size - r->data_start;
    int cap = cJSON_GetArraySize(r->hdr);
    StEntry *es = xcalloc((size_t)cap + 1, sizeof *es);
    for (const cJSON *it = r->hdr->child; it; it = it->next) {
        if (!it->string) DIE("'%s' is corrupt: header entry without a name", path);
        if (strcmp(it->string, "__metadata__") == 0) {
            int ok = cJSON_IsObject(it);
            for (const cJSON *m = ok ? it->child : NULL; m; m = m->next) ok &= cJSON_IsString(m);
            if (!ok) DIE("'%s' is corrupt: __metadata__ is not an object of strings", path);
            continue;
        }
        st_entry(r, it, &es[r->n++]);
    }
    st_check_layout(r, es, r->n);
    free(es);
    r->names = xcalloc((size_t)r->n + 1, sizeof *r->names);
    r->sorted = xcalloc((size_t)r->n + 1, sizeof *r->sorted);
    int i = 0;
    for (const cJSON *it = r->hdr->child; it; it = it->next)
        if (strcmp(it->string, "__metadata__") != 0) {
            r->sorted[i] = it;
            r->names[i++] = it->string;
        }
    qsort(r->sorted, (size_t)r->n, sizeof *r->sorted, item_by_name);
    return r;
}

void safetensors_close(StFile *r) {
    if (!r) return;
    cJSON_Delete(r->hdr);
    close(r->fd);
    free(r->names);
    free(r->sorted);
    free(r->path);
    free(r);
}

int safetensors_count(const StFile *r) { return r->n; }

const char *safetensors_name(const StFile *r, int i) { return i >= 0 && i < r->n ? r->names[i] : NULL; }

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, ex = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (ex == 0) {
        float f = ldexpf((float)man, -24); // zero or subnormal
        return sign ? -f : f;
    }
    if (ex == 31) bits = sign | 0x7f800000u | (man << 13);
    else bits = sign | ((ex - 15 + 127) << 23) | (man << 13);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
static float bf16_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

void safetensors_read(const StFile *r, const char *name, int ndim, const int64_t *shape, float *dst) {
    const cJSON key = {.string = (char *)name}, *kp = &key;
    const cJSON *const *at = bsearch(&kp, r->sorted, (size_t)r->n, sizeof *r->sorted, item_by_name);
    const cJSON *it = at ? *at : NULL;
    if (!it) DIE("'%s': missing tensor %s", r->path, name);
    StEntry e;
    st_entry(r, it, &e);
    int kind = strcmp(e.dtype, "F32") == 0 ? 0
        : strcmp(e.dtype, "BF16") == 0     ? 1
        : strcmp(e.dtype, "F16") == 0      ? 2
                                           : -1;
    if (kind < 0)
        DIE("'%s': tensor %s has dtype %s; only F32, BF16 and F16 can be read", r->path, name, e.dtype);
    int same = e.ndim == ndim;
    for (int d = 0; same && d < ndim; d++) same = e.shape[d] == shape[d];
    if (!same) {
        char a[160], b[160];
        fmt_shape(a, sizeof a, e.ndim, e.shape);
        fmt_shape(b, sizeof b, ndim, shape);
        DIE("'%s': tensor %s has shape %s, config expects %s", r->path, name, a, b);
    }
    uint64_t off = r->data_start + e.begin;
    if (kind == 0) {
        xpread(r->fd, dst, (size_t)e.numel * sizeof(float), off, r->path);
        return;
    }
    enum { CH = 1 << 16 };
    uint16_t *tmp = xmalloc(CH * sizeof *tmp);
    for (uint64_t i = 0; i < e.numel; i += CH) {
        size_t c = (size_t)(e.numel - i < CH ? e.numel - i : CH);
        xpread(r->fd, tmp, c * 2, off + 2 * i, r->path);
        for (size_t j = 0; j < c; j++) dst[i + j] = kind == 1 ? bf16_to_float(tmp[j]) : half_to_float(tmp[j]);
    }
    free(tmp);
}
