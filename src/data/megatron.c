// megatron.c (data) — reading Megatron-LM's indexed dataset (.idx + .bin, see megatron.h): the index
// read whole and checked before any token is used, the tokens read through a descriptor and widened to
// int32. Must not hold: llm.c shards or the split (data.c), writing this format (nothing writes it).
#include "data/megatron.h"
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/common.h"

#define IDX_HEADER_BYTES 34 // magic 9, version 8, dtype 1, sequence count 8, document count 8
#define MAX_ID ((int64_t)INT32_MAX - 64) // the loader rounds the vocabulary up to 64 in an int

struct MegatronSet {
    char idx[1100], bin[1100];
    const char *who;
    int fd; // PREFIX.bin
    int dtype, item; // Megatron's dtype code, bytes per token
    uint64_t n_seq, n_docs; // n_docs: documents (the index holds n_docs + 1 boundaries)
    int32_t *len; // per sequence
    int64_t *ptr; // per sequence: byte offset in PREFIX.bin
    int64_t *doc; // n_docs + 1 sequence indices
    unsigned char *stage; // a chunk of PREFIX.bin's bytes
};

int megatron_path(const char *path, char *prefix, size_t n) {
    size_t len = strlen(path);
    if (len > 4 && !strcmp(path + len - 4, ".idx")) {
        snprintf(prefix, n, "%.*s", (int)(len - 4), path);
        return 1;
    }
    if (strpbrk(path, "*?[") || file_exists(path) || dir_exists(path)) return 0;
    char idx[1100];
    snprintf(idx, sizeof idx, "%s.idx", path);
    if (!file_exists(idx)) return 0;
    snprintf(prefix, n, "%s", path);
    return 1;
}

// Megatron's DType codes: uint8 1, int8 2, int16 3, int32 4, int64 5, float64 6, float32 7, uint16 8.
static int item_bytes(const MegatronSet *m, int code) {
    static const int bytes[9] = {0, 1, 1, 2, 4, 8, 8, 4, 2};
    if (code == 6 || code == 7)
        DIE("%s: '%s': dtype code %d is %s, not a token type", m->who, m->idx, code,
            code == 6 ? "float64" : "float32");
    if (code < 1 || code > 8)
        DIE("%s: '%s': unknown dtype code %d (Megatron's are 1-8: uint8, int8, int16, int32, int64, float64, "
            "float32, uint16)",
            m->who, m->idx, code);
    return bytes[code];
}

static uint64_t le64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | b[i];
    return v;
}

// The header's fields, and the index's size against what they say it holds.
static void read_header(MegatronSet *m, const unsigned char *h, uint64_t size) {
    if (memcmp(h, "MMIDIDX\0\0", 9) != 0)
        DIE("%s: '%s' is not a Megatron index (its first bytes are not \"MMIDIDX\\0\\0\")", m->who, m->idx);
    uint64_t version = le64(h + 9);
    if (version != 1)
        DIE("%s: '%s' has index version %llu (this reader knows version 1)", m->who, m->idx,
            (unsigned long long)version);
    m->dtype = h[17];
    m->item = item_bytes(m, m->dtype);
    m->n_seq = le64(h + 18);
    uint64_t bounds = le64(h + 26), body = size - IDX_HEADER_BYTES;
    // each sequence takes 12 bytes, each boundary 8: counts beyond what the file could hold are a
    // truncation (and checking them first keeps the products below from overflowing)
    if (m->n_seq > body / 12 || bounds > body / 8 || m->n_seq * 12 + bounds * 8 > body)
        DIE("%s: '%s' is truncated: %llu bytes, fewer than its header's %llu sequences and %llu document "
            "boundaries need",
            m->who, m->idx, (unsigned long long)size, (unsigned long long)m->n_seq,
            (unsigned long long)bounds);
    uint64_t need = IDX_HEADER_BYTES + m->n_seq * 12 + bounds * 8;
    if (size == need + m->n_seq && m->n_seq)
        DIE("%s: '%s' holds sequence modes (a multimodal dataset): not supported", m->who, m->idx);
    if (size != need)
        DIE("%s: '%s' has %llu bytes; its header's %llu sequences and %llu document boundaries make %llu",
            m->who, m->idx, (unsigned long long)size, (unsigned long long)m->n_seq,
            (unsigned long long)bounds, (unsigned long long)need);
    if (bounds < 1)
        DIE("%s: '%s' has no document boundaries (a Megatron index holds at least the first, 0)", m->who,
            m->idx);
    m->n_docs = bounds - 1;
}

// Every sequence inside PREFIX.bin, and the documents a partition of the sequences in order.
static void check_body(const MegatronSet *m, uint64_t bin_size) {
    for (uint64_t i = 0; i < m->n_seq; i++) {
        int64_t p = m->ptr[i], l = m->len[i];
        if (l < 0)
            DIE("%s: '%s': sequence %llu has a negative length %lld", m->who, m->idx, (unsigned long long)i,
                (long long)l);
        if (p < 0 || (uint64_t)p > bin_size || (uint64_t)l > (bin_size - (uint64_t)p) / (uint64_t)m->item)
            DIE("%s: '%s': sequence %llu (%lld tokens at byte %lld) reaches past the end of '%s' (%llu "
                "bytes)",
                m->who, m->idx, (unsigned long long)i, (long long)l, (long long)p, m->bin,
                (unsigned long long)bin_size);
    }
    if (m->doc[0] != 0 || (uint64_t)m->doc[m->n_docs] != m->n_seq)
        DIE("%s: '%s': the document boundaries run from %lld to %lld; they must run from 0 to the sequence "
            "count %llu",
            m->who, m->idx, (long long)m->doc[0], (long long)m->doc[m->n_docs], (unsigned long long)m->n_seq);
    for (uint64_t d = 0; d < m->n_docs; d++)
        if (m->doc[d + 1] < m->doc[d])
            DIE("%s: '%s': document boundary %llu (%lld) is below the one before it (%lld)", m->who, m->idx,
                (unsigned long long)d + 1, (long long)m->doc[d + 1], (long long)m->doc[d]);
}

static int open_regular(const char *path, uint64_t *size, const char *who) {
    struct stat st; // before opening: opening a FIFO would wait for a writer
    if (stat(path, &st) != 0) DIE("%s: cannot read '%s' (%s)", who, path, strerror(errno));
    if (!S_ISREG(st.st_mode)) DIE("%s: '%s' is not a regular file", who, path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) DIE("%s: cannot read '%s' (%s)", who, path, strerror(errno));
    if (fstat(fd, &st) != 0) DIE("%s: cannot read '%s' (%s)", who, path, strerror(errno));
    *size = (uint64_t)st.st_size;
    return fd;
}

MegatronSet *megatron_open(const char *prefix, const char *who) {
    MegatronSet *m = xcalloc(1, sizeof *m);
    m->who = who;
    snprintf(m->idx, sizeof m->idx, "%s.idx", prefix);
    snprintf(m->bin, sizeof m->bin, "%s.bin", prefix);
    uint64_t size, bin_size;
    int fd = open_regular(m->idx, &size, who);
    if (size < IDX_HEADER_BYTES)
        DIE("%s: '%s' is truncated: %llu bytes, the header alone is %d", who, m->idx,
            (unsigned long long)size, IDX_HEADER_BYTES);
    unsigned char h[IDX_HEADER_BYTES];
    xpread(fd, h, sizeof h, 0, m->idx);
    read_header(m, h, size);
    m->len = xmalloc((m->n_seq ? m->n_seq : 1) * sizeof *m->len);
    m->ptr = xmalloc((m->n_seq ? m->n_seq : 1) * sizeof *m->ptr);
    m->doc = xmalloc((m->n_docs + 1) * sizeof *m->doc);
    xpread(fd, m->len, m->n_seq * 4, IDX_HEADER_BYTES, m->idx); // little-endian, as the host (data.c checks)
    xpread(fd, m->ptr, m->n_seq * 8, IDX_HEADER_BYTES + m->n_seq * 4, m->idx);
    xpread(fd, m->doc, (m->n_docs + 1) * 8, IDX_HEADER_BYTES + m->n_seq * 12, m->idx);
    close(fd);
    m->fd = open_regular(m->bin, &bin_size, who);
    check_body(m, bin_size);
    m->stage = xmalloc(1 << 20);
    return m;
}

size_t megatron_docs(const MegatronSet *m) { return (size_t)m->n_docs; }

uint64_t megatron_doc_tokens(const MegatronSet *m, size_t d) {
    uint64_t n = 0;
    for (int64_t s = m->doc[d]; s < m->doc[d + 1]; s++) n += (uint64_t)m->len[s];
    return n;
}

uint64_t megatron_tokens(const MegatronSet *m) {
    uint64_t n = 0;
    for (uint64_t s = 0; s < m->n_seq; s++) n += (uint64_t)m->len[s];
    return n;
}

// One token of Megatron dtype code at b, as a signed 64-bit value.
static int64_t token_at(int code, const unsigned char *b) {
    switch (code) {
        case 1: return b[0];
        case 2: return (int8_t)b[0];
        case 3: return (int16_t)(uint16_t)(b[0] | b[1] << 8);
        case 8: return (uint16_t)(b[0] | b[1] << 8);
        case 4:
            return (int32_t)(uint32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 |
                                       (uint32_t)b[3] << 24);
        default: return (int64_t)le64(b);
    }
}

void megatron_read_doc(MegatronSet *m, size_t d, int32_t *dst) {
    size_t chunk = ((size_t)1 << 20) / (size_t)m->item;
    for (int64_t s = m->doc[d]; s < m->doc[d + 1]; s++) {
        uint64_t off = (uint64_t)m->ptr[s];
        for (size_t done = 0, n = (size_t)m->len[s]; done < n;) {
            size_t k = n - done < chunk ? n - done : chunk;
            xpread(m->fd, m->stage, k * (size_t)m->item, off + done * (uint64_t)m->item, m->bin);
            for (size_t i = 0; i < k; i++) {
                int64_t v = token_at(m->dtype, m->stage + i * (size_t)m->item);
                if (v < 0 || v > MAX_ID)
                    DIE("%s: '%s': token %lld (sequence %lld, position %zu) is %s", m->who, m->bin,
                        (long long)v, (long long)s, done + i,
                        v < 0 ? "negative" : "beyond the ids this loader keeps");
                *dst++ = (int32_t)v;
            }
            done += k;
        }
    }
}

void megatron_close(MegatronSet *m) {
    if (!m) return;
    close(m->fd);
    free(m->len);
    free(m->ptr);
    free(m->doc);
    free(m->stage);
    free(m);
}
