// ckpt_dist.c — slice-wise checkpoint writes and reads over a mesh (see ckpt_dist.h).
#include "io/ckpt_dist.h"
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
#include "core/common.h"
#include "io/safetensors.h"

typedef struct {
    int fd;
    const char *path;
    const float *win; // local elements [lo, hi) of the source
    size_t lo, hi;
    uint64_t base;
} WriteCtx;

// One run of a tensor's slice (full: its index in the full layout; local: in this rank's), clipped to the
// window in hand.
static void write_run(size_t full, size_t local, size_t n, void *p) {
    WriteCtx *w = p;
    size_t a = local > w->lo ? local : w->lo, b = local + n < w->hi ? local + n : w->hi;
    if (a >= b) return;
    const char *src = (const char *)(w->win + (a - w->lo));
    size_t left = (b - a) * sizeof(float);
    off_t off = (off_t)(w->base + 4 * (uint64_t)(full + (a - local)));
    while (left) {
        ssize_t k = pwrite(w->fd, src, left, off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) die_io("write", w->path, k < 0 ? errno : ENOSPC); // (0 bytes written: no room)
        src += k;
        off += k;
        left -= (size_t)k;
    }
}

// The source's windows, each written where it falls in this rank's slices of the tensors it owns.
static void write_slices(const char *path, const ParamTable *t, const unsigned char *own,
                         const CkptSource *src, uint64_t base, float *buf) {
    int fd = open(path, O_WRONLY);
    if (fd < 0) die_io("open", path, errno);
    for (int k = 0; k < src->nwin; k++) {
        size_t lo = 0, n = 0;
        src->get(src->ctx, k, &lo, &n, buf);
        WriteCtx w = {fd, path, buf, lo, lo + n, base};
        for (int i = 0; i < t->n; i++) {
            const ParamSpec *s = &t->p[i];
            if (own[i] && s->lnumel && s->loffset < lo + n && s->loffset + s->lnumel > lo)
                params_slice_runs(s, write_run, &w);
        }
    }
    if (fsync(fd) != 0 || close(fd) != 0) die_io("write", path, errno);
}

void ckpt_save_dist(const char *dir, const ModelConfig *c, const ParamTable *t, const CkptSource *params,
                    const CkptSource *m, const CkptSource *v, const unsigned char *own, const TrainState *st,
                    const Comm *world) {
    uint64_t starts[2] = {0, 0};
    if (comm_rank(world) == 0) ckpt_begin(dir, t, m != NULL, &starts[0], &starts[1]);
    comm_bcast(world, starts, 2, CT_I64, 0);
    size_t max = params->max;
    if (m && m->max > max) max = m->max;
    if (v && v->max > max) max = v->max;
    float *buf = xmalloc(max * sizeof(float) + 1); // one window at a time
    char p[4200];
    ckpt_begin_path(p, sizeof p, dir, "model.safetensors");
    write_slices(p, t, own, params, starts[0], buf);
    if (m) {
        ckpt_begin_path(p, sizeof p, dir, "optimizer.safetensors");
        write_slices(p, t, own, m, starts[1], buf);
        write_slices(p, t, own, v, starts[1] + 4 * (uint64_t)t->total, buf);
    }
    free(buf);
    comm_barrier(world); // every slice is on disk (each rank fsynced its writes)
    if (comm_rank(world) == 0) ckpt_commit(dir, c, st);
    comm_barrier(world);
}

typedef struct {
    float *dst; // the tensor's local slice
    const float *tensor;
    size_t base, lbase;
} ReadCtx;
static void read_run(size_t full, size_t local, size_t n, void *p) {
    ReadCtx *r =
        p; // full indexes the full flat layout (the tensor starts at base), local this rank's (lbase)
    memcpy(r->dst + (local - r->lbase), r->tensor + (full - r->base), n * sizeof(float));
}

// Each tensor this rank holds, read whole, its slice gathered and handed to the sink.
static void read_slices(const StFile *f, const ParamTable *t, const char *suffix, const CkptSink *sink,
                        int which) {
    float *buf = NULL, *slice = NULL;
    size_t cap = 0;
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *s = &t->p[i];
        if (!s->lnumel) continue; // not held here: not read
        if (s->numel > cap) {
            cap = s->numel;
            buf = xrealloc(buf, cap * sizeof(float));
            slice = xrealloc(slice, cap * sizeof(float));
        }
        char name[160];
        snprintf(name, sizeof name, "%s%s", s->name, suffix);
        safetensors_read(f, name, s->ndim, s->shape, buf);
        ReadCtx r = {slice, buf, s->offset, s->loffset};
        params_slice_runs(s, read_run, &r);
        sink->put(sink->ctx, which, s->loffset, s->lnumel, slice);
    }
    free(buf);
    free(slice);
}

void ckpt_load_dist(const char *dir, const ParamTable *t, const CkptSink *sink, int with_opt, TrainState *st,
                    const Comm *world) {
    char p[4200];
    if (comm_rank(world) == 0) { // what ckpt_load checks, once: checksums, state, no tensor but the table's
        ckpt_verify(dir);
        TrainState check;
        ckpt_load_state(dir, &check);
        for (int k = 0; k < 1 + (with_opt != 0); k++) {
            join_path(p, sizeof p, dir, k ? "optimizer.safetensors" : "model.safetensors");
            if (k && !file_exists(p))
                DIE("checkpoint %s has no optimizer state (optimizer.safetensors); it was saved without it",
                    dir);
            StFile *f = safetensors_open(p);
            ckpt_check_tensors(dir, f, p, t, k);
            safetensors_close(f);
        }
    }
    comm_barrier(world);
    join_path(p, sizeof p, dir, "model.safetensors");
    StFile *f = safetensors_open(p);
    read_slices(f, t, "", sink, 0);
    safetensors_close(f);
    if (with_opt) {
        join_path(p, sizeof p, dir, "optimizer.safetensors");
        f = safetensors_open(p);
        read_slices(f, t, ".exp_avg", sink, 1);
        read_slices(f, t, ".exp_avg_sq", sink, 2);
        safetensors_close(f);
    }
    if (st) ckpt_load_state(dir, st);
}
