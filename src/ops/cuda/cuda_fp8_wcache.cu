// cuda_fp8_wcache.cu — the experts' weights as FP8 operands kept between ops (contracts in
// cuda_fp8_wcache.h): a table of entries keyed by the weight's pointer and shape, each one device allocation
// (both layouts' codes and scales, and the count of non-finite blocks of the version it holds), requantised
// when the bf16 copy's version moved on (AdamW once a step, a refresh, any write into the weights), all freed
// when another buffer is registered. The uses' non-finite counts are kept on the host as (counter, uses)
// pairs per entry and added on the device before the entry is quantised again or the counts are read.
// Must not hold: kernels other than that addition, or any knowledge of layers.
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_fp8.h"
#include "ops/cuda/cuda_fp8_wcache.h"

#define WC_USES 4 // distinct counters one entry's pending uses name (more: added early)
#define WC_MAX 4096 // entries (past it the table starts again: a weight only costs a quantisation)

typedef struct {
    const float *w;
    int G, O, K, valid;
    unsigned long long ver;
    void *mem; // q, qt, s, st, bad
    Fp8Weight op;
    unsigned long long *bad;
    unsigned long long *dst[WC_USES], uses[WC_USES];
    int nd;
} WEntry;

static WEntry *g_e;
static int g_n, g_cap;

// the interleaved pairs (cuda_fp8_weight_pair), each built from its two entries' codes at one version
typedef struct {
    const float *w1, *w3;
    int G, O, K;
    unsigned long long ver;
    void *mem;
    uint8_t *q;
    float *s;
} PEntry;
static PEntry *g_pe;
static int g_np, g_pcap;
static const float *g_base; // the registered buffer the entries belong to

static int wcache_on(void) {
    static int v = -1;
    if (v < 0) {
        const char *e = getenv("MOE_FP8_WCACHE");
        if (e && *e && strcmp(e, "0") && strcmp(e, "1"))
            DIE("MOE_FP8_WCACHE must be 1 (keep the FP8 weights between ops, the default) or 0 (quantise "
                "them "
                "on every use) (got '%s')",
                e);
        v = !(e && !strcmp(e, "0"));
    }
    return v;
}

__global__ void add_uses_k(unsigned long long *d0, unsigned long long u0, unsigned long long *d1,
                           unsigned long long u1, unsigned long long *d2, unsigned long long u2,
                           unsigned long long *d3, unsigned long long u3, const unsigned long long *bad) {
    unsigned long long b = *bad;
    if (!b) return;
    if (d0) *d0 += u0 * b;
    if (d1) *d1 += u1 * b;
    if (d2) *d2 += u2 * b;
    if (d3) *d3 += u3 * b;
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
        CUDA_CHECK(cudaFree(g_e[i].mem)); // (synchronises: no kernel still reads it)
    }
    g_n = 0;
    for (int i = 0; i < g_np; i++) CUDA_CHECK(cudaFree(g_pe[i].mem));
    g_np = 0;
}

static WEntry *entry(const float *w, int G, int O, int K) {
    for (int i = 0; i < g_n; i++)
        if (g_e[i].w == w && g_e[i].G == G && g_e[i].O == O && g_e[i].K == K) return &g_e[i];
    if (g_n == WC_MAX) clear_all();
    if (g_n == g_cap) {
        g_cap = g_cap ? 2 * g_cap : 64;
        g_e = (WEntry *)xrealloc(g_e, sizeof *g_e * g_cap);
    }
    WEntry *e = &g_e[g_n++];
    memset(e, 0, sizeof *e);
    e->w = w, e->G = G, e->O = O, e->K = K;
    size_t n = (size_t)G * O * K, ns = (size_t)G * ((O + 127) / 128) * ((K + 127) / 128);
    size_t aq = (n + 255) & ~(size_t)255, as = (sizeof(float) * ns + 255) & ~(size_t)255;
    cudaError_t err = cudaMalloc(&e->mem, 2 * aq + 2 * as + 256);
    if (err != cudaSuccess) {
        cudaGetLastError();
        g_n--;
        DIE("cudaMalloc of the FP8 copy of a weight (%zu bytes) failed: %s; hint: %s, or MOE_FP8_WCACHE=0 "
            "(the "
            "FP8 weights quantised on every use instead of kept: 2 bytes a routed-expert weight less)",
            2 * aq + 2 * as, cudaGetErrorString(err), cuda_hint(err));
    }
    char *p = (char *)e->mem;
    e->op.q = (uint8_t *)p, e->op.qt = (uint8_t *)(p + aq);
    e->op.s = (float *)(p + 2 * aq), e->op.st = (float *)(p + 2 * aq + as);
    e->bad = (unsigned long long *)(p + 2 * aq + 2 * as);
    return e;
}

extern "C" int cuda_fp8_weight(Fp8Weight *out, const float *w, int G, int O, int K, unsigned long long *bad) {
    if (!wcache_on() || G <= 0 || O <= 0 || K <= 0) return 0;
    const void *src = cuda_bf16_shadow_of(w, (size_t)G * O * K);
    if (!src) return 0; // not in the registered copy, or the copy is not current: no version to key on
    if (cuda_bf16_shadow_base() != g_base) {
        clear_all();
        g_base = cuda_bf16_shadow_base();
    }
    WEntry *e = entry(w, G, O, K);
    unsigned long long v = cuda_bf16_shadow_version();
    if (!e->valid || e->ver != v) {
        add_uses(e); // (the uses of the version before: its count)
        CUDA_CHECK(cudaMemsetAsync(e->bad, 0, sizeof *e->bad));
        cuda_fp8_quant_blocks((uint8_t *)e->op.q, (float *)e->op.s, (uint8_t *)e->op.qt, (float *)e->op.st,
                              src, 1, G, O, K, e->bad);
        e->ver = v;
        e->valid = 1;
    }
    note_use(e, bad);
    *out = e->op;
    return 1;
}

// row n2 of group g (blockIdx x, y) of the interleaved operand: W1's or W3's row, its codes and scales
__global__ void interleave_k(uint8_t *q, float *s, const uint8_t *q1, const float *s1, const uint8_t *q3,
                             const float *s3, int O, int K) {
    int n2 = blockIdx.x, g = blockIdx.y, nkt = (K + 127) / 128, bo = (O + 127) / 128;
    int w = n2 % 128, src = n2 / 128 * 64 + (w & 63);
    const uint8_t *from = (w >= 64 ? q3 : q1) + ((size_t)g * O + src) * K;
    uint8_t *to = q + ((size_t)g * 2 * O + n2) * K;
    for (int k = threadIdx.x * 16; k < K; k += blockDim.x * 16)
        *(uint4 *)(to + k) = *(const uint4 *)(from + k);
    const float *sf = (w >= 64 ? s3 : s1) + ((size_t)g * bo + src / 128) * nkt;
    for (int t = threadIdx.x; t < nkt; t += blockDim.x) s[((size_t)g * 2 * O + n2) * nkt + t] = sf[t];
}

extern "C" int cuda_fp8_weight_pair(const uint8_t **q, const float **s, const float *w1, const float *w3,
                                    int G, int O, int K, unsigned long long *bad1, unsigned long long *bad3) {
    if (O % 64 || K % 16 || G <= 0 || !wcache_on()) return 0;
    const float *b1 = cuda_bf16_shadow_of(w1, (size_t)G * O * K) ? w1 : NULL,
                *b3 = cuda_bf16_shadow_of(w3, (size_t)G * O * K) ? w3 : NULL;
    if (!b1 || !b3) return 0;
    if (g_n >= WC_MAX - 1) clear_all(); // (so that the second entry cannot clear the first)
    Fp8Weight f1, f3;
    if (!cuda_fp8_weight(&f1, w1, G, O, K, bad1) || !cuda_fp8_weight(&f3, w3, G, O, K, bad3))
        DIE("cuda_fp8_weight_pair: a weight in the bf16 copy was not kept"); // (checked above: a bug)
    unsigned long long v = cuda_bf16_shadow_version();
    PEntry *e = NULL;
    for (int i = 0; i < g_np && !e; i++)
        if (g_pe[i].w1 == w1 && g_pe[i].w3 == w3 && g_pe[i].G == G && g_pe[i].O == O && g_pe[i].K == K)
            e = &g_pe[i];
    if (!e) {
        if (g_np == g_pcap) {
            g_pcap = g_pcap ? 2 * g_pcap : 32;
            g_pe = (PEntry *)xrealloc(g_pe, sizeof *g_pe * g_pcap);
        }
        e = &g_pe[g_np];
        size_t n = (size_t)G * 2 * O * K, aq = (n + 255) & ~(size_t)255,
               ns = (size_t)G * 2 * O * ((K + 127) / 128) * sizeof(float);
        cudaError_t err = cudaMalloc(&e->mem, aq + ns);
        if (err != cudaSuccess) {
            cudaGetLastError();
            DIE("cudaMalloc of the FP8 copy of two weights (%zu bytes) failed: %s; hint: %s, or "
                "MOE_FP8_WCACHE=0",
                aq + ns, cudaGetErrorString(err), cuda_hint(err));
        }
        g_np++;
        e->w1 = w1, e->w3 = w3, e->G = G, e->O = O, e->K = K, e->ver = v + 1; // (not built yet)
        e->q = (uint8_t *)e->mem, e->s = (float *)((char *)e->mem + aq);
    }
    if (e->ver != v) {
        interleave_k<<<dim3((unsigned)(2 * O), (unsigned)G), 128>>>(e->q, e->s, f1.q, f1.s, f3.q, f3.s, O, K);
        KCHECK("fp8 weight pair");
        e->ver = v;
    }
    *q = e->q, *s = e->s;
    return 1;
}

extern "C" void cuda_fp8_weight_counts(void) {
    for (int i = 0; i < g_n; i++) add_uses(&g_e[i]);
}
