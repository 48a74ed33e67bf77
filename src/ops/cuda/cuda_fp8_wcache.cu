// cuda_fp8_wcache.cu — the experts' weights as FP8 operands kept between ops (contracts in
// cuda_fp8_wcache.h): a table of entries keyed by the weight's pointer and shape, each with its transposed
// layout made at the bf16 copy's current version (its allocation with the version's count of non-finite
// blocks), made again when the version moved on (AdamW once a step, a refresh, any write into the weights);
// and two forward slots, one for a single weight's forward layout and one for an up-projection pair's (its
// codes written straight into the pair's layout), each holding the one asked for last, made with the
// transposed layout in one read of the weight where that is not made yet. The backward reads only the
// transposed layouts, so a step's forward layouts need not outlive their layer: the slots hold them in turn
// (every layer's forward codes but one layer's less memory), a layer's experts run in chunks (AMPipe, the
// overlapped exchange) find their pair and w2 still there, and a forward asked again at the same version
// after other layers (another micro-batch, a recomputed forward) quantises its weights again. All freed when
// another buffer is registered.
// The uses' non-finite counts (and amax: cuda_fp8.h FP8_CNT) are kept on the host as (counter, uses) pairs
// per entry and added on the device before the entry's count is made again or the counters are read. Must not
// hold: kernels other than that addition, or any knowledge of layers.
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_fp8.h"
#include "ops/cuda/cuda_fp8_trace.h"
#include "ops/cuda/cuda_fp8_wcache.h"

#define WC_USES 4 // distinct counters one entry's pending uses name (more: added early)
#define WC_MAX 4096 // entries (past it the tables start again: a weight only costs a quantisation)

typedef struct {
    const float *w;
    int G, O, K;
    unsigned long long ver; // the version its layouts and count are of
    int have_t, counted; // the transposed layout made at ver; its count made at ver
    void *mt; // qt, st, bad
    Fp8Weight op; // (qt, st)
    unsigned long long *bad;
    unsigned long long *dst[WC_USES], uses[WC_USES];
    int nd;
} WEntry;

// The forward slots (0: a single weight's layout, 1: a pair's): memory (grown to the largest layout asked
// for), where its codes q and scales s lie in it, and whose codes it holds at which version (w3 NULL in slot
// 0; w1 NULL: none yet).
typedef struct {
    void *mem;
    size_t bytes;
    uint8_t *q;
    float *s;
    const float *w1, *w3;
    int G, O, K;
    unsigned long long ver;
} FSlot;
static FSlot g_fs[2];

static WEntry *g_e;
static int g_n, g_cap;
static const float *g_base; // the registered buffer the entries belong to

static int g_keep = 1; // (cuda_fp8_weight_keep)

static void *dev_alloc(size_t bytes, const char *what) {
    void *p = NULL;
    cudaError_t err = cudaMalloc(&p, bytes);
    if (err != cudaSuccess) {
        cudaGetLastError();
        DIE("cudaMalloc of the FP8 copy of %s (%zu bytes) failed: %s; hint: %s, or --fp8-weight-cache 0 (the "
            "FP8 weights quantised on every use instead of kept: about a byte a routed-expert weight less)",
            what, bytes, cudaGetErrorString(err), cuda_hint(err));
    }
    return p;
}
static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

__global__ void add_uses_k(unsigned long long *d0, unsigned long long u0, unsigned long long *d1,
                           unsigned long long u1, unsigned long long *d2, unsigned long long u2,
                           unsigned long long *d3, unsigned long long u3, const unsigned long long *bad) {
    unsigned long long *d[4] = {d0, d1, d2, d3}, u[4] = {u0, u1, u2, u3};
    for (int i = 0; i < 4; i++) { // (the count once a use, the amax raised: cuda_fp8.h FP8_CNT)
        if (!d[i]) continue;
        d[i][0] += u[i] * bad[0];
        if (bad[1] > d[i][1]) d[i][1] = bad[1];
    }
}

// the entry's pending uses added into their counters (one launch), then forgotten
static void add_uses(WEntry *e) {
    if (!e->nd) return;
    unsigned long long *d[WC_USES] = {NULL, NULL, NULL, NULL}, u[WC_USES] = {0, 0, 0, 0};
    for (int i = 0; i < e->nd; i++) d[i] = e->dst[i], u[i] = e->uses[i];
    add_uses_k<<<1, 1>>>(d[0], u[0], d[1], u[1], d[2], u[2], d[3], u[3], e->bad);
    KCHECK("fp8 weight counts");
    e->nd = 0;
}

static void note_use(WEntry *e, unsigned long long *bad) {
    if (!bad) return;
    for (int i = 0; i < e->nd; i++)
        if (e->dst[i] == bad) {
            e->uses[i]++;
            return;
        }
    if (e->nd == WC_USES) add_uses(e);
    e->dst[e->nd] = bad;
    e->uses[e->nd++] = 1;
}

static void clear_all(void) {
    for (int i = 0; i < g_n; i++) {
        add_uses(&g_e[i]);
        CUDA_CHECK(cudaFree(g_e[i].mt)); // (synchronises: no kernel still reads it)
    }
    for (int i = 0; i < 2; i++)
        if (g_fs[i].mem) CUDA_CHECK(cudaFree(g_fs[i].mem));
    memset(g_fs, 0, sizeof g_fs);
    g_n = 0;
}

// The entry of w at the copy's current version (its layouts dropped, its pending uses added, where the
// version moved on), or NULL where w is not kept (*src: its bf16 values).
static WEntry *entry(const float *w, int G, int O, int K, const void **src) {
    if (!g_keep || G <= 0 || O <= 0 || K <= 0) return NULL;
    *src = cuda_bf16_shadow_of(w, (size_t)G * O * K);
    if (!*src) return NULL; // not in the registered copy, or the copy is not current: no version to key on
    if (cuda_bf16_shadow_base() != g_base) {
        clear_all();
        g_base = cuda_bf16_shadow_base();
    }
    WEntry *e = NULL;
    for (int i = 0; i < g_n && !e; i++)
        if (g_e[i].w == w && g_e[i].G == G && g_e[i].O == O && g_e[i].K == K) e = &g_e[i];
    if (!e) {
        if (g_n == WC_MAX) clear_all();
        if (g_n == g_cap) {
            g_cap = g_cap ? 2 * g_cap : 64;
            g_e = (WEntry *)xrealloc(g_e, sizeof *g_e * g_cap);
        }
        e = &g_e[g_n];
        memset(e, 0, sizeof *e);
        size_t n = (size_t)G * O * K, ns = sizeof(float) * G * ((O + 127) / 128) * ((K + 127) / 128);
        char *p = (char *)dev_alloc(al256(n) + al256(ns) + 256, "a weight");
        g_n++;
        e->w = w, e->G = G, e->O = O, e->K = K, e->mt = p;
        e->op.qt = (uint8_t *)p, e->op.st = (float *)(p + al256(n));
        e->bad = (unsigned long long *)(p + al256(n) + al256(ns));
        e->ver = cuda_bf16_shadow_version() + 1; // (nothing made yet)
    }
    unsigned long long v = cuda_bf16_shadow_version();
    if (e->ver != v) {
        add_uses(e); // (the uses of the version before: its count)
        e->ver = v;
        e->have_t = e->counted = 0;
    }
    return e;
}

// the counter a quantisation of e at its version adds into: e's own, the first time (zeroed), else none
static unsigned long long *count_once(WEntry *e) {
    if (e->counted) return NULL;
    CUDA_CHECK(cudaMemsetAsync(e->bad, 0, sizeof *e->bad * FP8_CNT));
    e->counted = 1;
    return e->bad;
}

// Whether (w1, w3)'s slot (w3 NULL: w1 alone, slot 0; else the pair's, slot 1) holds their forward codes of
// shape (G, O, K) at the current version.
static int slot_holds(const float *w1, const float *w3, int G, int O, int K) {
    const FSlot *f = &g_fs[w3 != NULL];
    return f->w1 && f->w1 == w1 && f->w3 == w3 && f->G == G && f->O == O && f->K == K &&
        f->ver == cuda_bf16_shadow_version();
}
// (w1, w3)'s slot taken for their forward codes: codes then scales (the codes' bytes rounded up to 256) at
// its q, s, the memory grown where smaller (cudaFree synchronises: no kernel still reads the old). The caller
// writes the codes next, in stream order after every GEMM that read the slot's previous ones.
static FSlot *slot_take(const float *w1, const float *w3, int G, int O, int K, size_t codes, size_t scales) {
    FSlot *f = &g_fs[w3 != NULL];
    size_t need = al256(codes) + scales;
    if (need > f->bytes) {
        if (f->mem) CUDA_CHECK(cudaFree(f->mem));
        f->mem = dev_alloc(need, w3 ? "the up-projection pairs' forward slot" : "the forward layouts' slot");
        f->bytes = need;
    }
    f->w1 = w1, f->w3 = w3, f->G = G, f->O = O, f->K = K;
    f->ver = cuda_bf16_shadow_version();
    f->q = (uint8_t *)f->mem, f->s = (float *)((char *)f->mem + al256(codes));
    return f;
}

extern "C" int cuda_fp8_weight(Fp8Weight *out, const float *w, int G, int O, int K, int need,
                               unsigned long long *bad) {
    const void *src;
    WEntry *e = entry(w, G, O, K, &src);
    if (!e) return 0;
    // (a forward layout made brings the transposed one in the same read where that is not made yet: the
    // backward asks for it next, and its memory is the entry's already)
    int f = (need & FP8W_FWD) && !slot_holds(w, NULL, G, O, K), t = !e->have_t && (f || (need & FP8W_T));
    size_t n = (size_t)G * O * K, ns = sizeof(float) * G * ((O + 127) / 128) * ((K + 127) / 128);
    FSlot *fs = f ? slot_take(w, NULL, G, O, K, n, ns) : NULL;
    if (f || t) {
        cuda_fp8_trace_begin();
        cuda_fp8_quant_blocks(fs ? fs->q : NULL, fs ? fs->s : NULL, t ? (uint8_t *)e->op.qt : NULL,
                              t ? (float *)e->op.st : NULL, src, 1, G, O, K, count_once(e));
        cuda_fp8_trace_end(f && t  ? "kept weight: blocks + _t"
                               : f ? "kept weight: blocks"
                                   : "kept weight: blocks_t",
                           (double)n * (2 + (f ? 1 : 0) + (t ? 1 : 0)), 0);
        e->have_t |= t;
    }
    note_use(e, bad);
    *out = e->op;
    if (need & FP8W_FWD) out->q = g_fs[0].q, out->s = g_fs[0].s;
    return 1;
}

extern "C" int cuda_fp8_weight_pair(const uint8_t **q, const float **s, const float *w1, const float *w3,
                                    int G, int O, int K, unsigned long long *bad1, unsigned long long *bad3) {
    if (O % 64 || K % 16) return 0;
    if (g_n >= WC_MAX - 1) clear_all(); // (so that the second entry cannot clear the first)
    const void *src1, *src3;
    WEntry *e1 = entry(w1, G, O, K, &src1);
    WEntry *e3 = e1 ? entry(w3, G, O, K, &src3) : NULL;
    if (!e1 || !e3) return 0;
    e1 = entry(w1, G, O, K, &src1); // (w3's new entry may have moved the table; the same version: no change)
    size_t n = (size_t)G * 2 * O * K;
    if (!slot_holds(w1, w3, G, O, K)) { // each half with its weight's transposed layout where not made yet
        FSlot *fs = slot_take(w1, w3, G, O, K, n, sizeof(float) * G * 2 * O * ((K + 127) / 128));
        WEntry *e[2] = {e1, e3};
        const void *src[2] = {src1, src3};
        for (int h = 0; h < 2; h++) {
            int t = !e[h]->have_t;
            cuda_fp8_trace_begin();
            cuda_fp8_quant_blocks_pair(fs->q, fs->s, h, t ? (uint8_t *)e[h]->op.qt : NULL,
                                       t ? (float *)e[h]->op.st : NULL, src[h], 1, G, O, K, count_once(e[h]));
            cuda_fp8_trace_end(t ? "kept weight: pair half + _t" : "kept weight: pair half",
                               (double)G * O * K * (3 + (t ? 1 : 0)) + 4.0 * G * O * ((K + 127) / 128), 0);
            e[h]->have_t = 1;
        }
    }
    note_use(e1, bad1);
    note_use(e3, bad3);
    *q = g_fs[1].q, *s = g_fs[1].s;
    return 1;
}

extern "C" void cuda_fp8_weight_counts(void) {
    for (int i = 0; i < g_n; i++) add_uses(&g_e[i]);
}

extern "C" void cuda_fp8_weight_keep(int on) {
    if (!on && g_keep) clear_all(); // (the pending counts added first)
    g_keep = on != 0;
}
