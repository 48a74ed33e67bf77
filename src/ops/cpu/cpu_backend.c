// cpu_backend.c — the float32 reference Backend: memory, GEMMs through CBLAS (OpenBLAS),
// and the table that gathers every cpu op. Elementwise and attention ops are in cpu_nn.c.
// Sums that feed results are done in a fixed order so runs are bit-reproducible for a given
// thread count.
#include <cblas.h>
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "core/common.h"
#include "ops/cpu/cpu_ops.h"
#include "ops/plain.h"

static void *cpu_alloc(size_t bytes) {
    alloc_note_backend();
    return xcalloc(1, bytes);
}

// alloc_holes' buffers (ops.h): one mapping each, its hole pages without access (PROT_NONE) and given back
// (MADV_DONTNEED), kept in a list that cpu_free looks in first
typedef struct HoleMap {
    void *p;
    size_t bytes;
    struct HoleMap *next;
} HoleMap;
static HoleMap *g_holes;

static float *cpu_alloc_holes(size_t n, const size_t *hole, int nh) {
    const char *he = holes_error(n, hole, nh);
    CHECK(!he, "alloc_holes: %s (%d holes in %zu elements)", he, nh, n);
    alloc_note_backend();
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), bytes = n * sizeof(float);
    if (!bytes) bytes = pg;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); // (zeroed)
    CHECK(p != MAP_FAILED, "alloc_holes: mmap of %zu bytes: %s", bytes, strerror(errno));
    for (int i = 0; i < nh; i++) { // the pages wholly inside the hole's bytes
        size_t s = (hole[2 * i] * sizeof(float) + pg - 1) / pg * pg,
               e = hole[2 * i + 1] * sizeof(float) / pg * pg;
        if (s >= e) continue;
        CHECK(!madvise((char *)p + s, e - s, MADV_DONTNEED) && !mprotect((char *)p + s, e - s, PROT_NONE),
              "alloc_holes: giving back [%zu, %zu): %s", s, e, strerror(errno));
    }
    HoleMap *h = xmalloc(sizeof *h);
    *h = (HoleMap){p, bytes, g_holes};
    g_holes = h;
    return p;
}

static void cpu_free(void *p) {
    for (HoleMap **h = &g_holes; *h; h = &(*h)->next)
        if ((*h)->p == p) {
            HoleMap *f = *h;
            CHECK(!munmap(f->p, f->bytes), "alloc_holes: munmap: %s", strerror(errno));
            *h = f->next;
            free(f);
            return;
        }
    free(p);
}
static void cpu_copy(void *dst, const void *src, size_t bytes) {
    if (bytes) memmove(dst, src, bytes);
}
static void cpu_zero(void *p, size_t bytes) {
    if (bytes) memset(p, 0, bytes);
}
static void cpu_bf16_shadow(const float *p, size_t n) {
    (void)p;
    (void)n;
} // float32 GEMMs: nothing to keep
static void cpu_sync(void) {}

void cpu_matmul_fwd(float *out, const float *inp, const float *w, int N, int K, int O, int accumulate) {
    if (N <= 0 || O <= 0) return;
    if (K <= 0) {
        if (!accumulate) memset(out, 0, sizeof(float) * (size_t)N * O);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, O, K, 1.0f, inp, K, w, K,
                accumulate ? 1.0f : 0.0f, out, O);
}

// dinp (N,K) = dout @ W [+ dinp with GM_ACC_DINP]; dw += dout^T @ inp. With O = 0 the overwritten dinp
// is zeros (an empty sum), as cpu_matmul_fwd with K = 0.
// flags (ops.h): GM_ACC_DINP adds into dinp, GM_DW_WRITE writes dw (zeros without rows)
static void mm_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N, int K,
                   int O, int flags) {
    if (K <= 0 || O <= 0) { // dw has no elements; dinp's sums are empty
        if (dinp && N > 0 && K > 0 && !(flags & GM_ACC_DINP)) memset(dinp, 0, sizeof(float) * (size_t)N * K);
        return;
    }
    if (N <= 0) {
        if (dw && (flags & GM_DW_WRITE)) memset(dw, 0, sizeof(float) * (size_t)O * K);
        return;
    }
    if (dinp)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, K, O, 1.0f, dout, O, w, K,
                    flags & GM_ACC_DINP ? 1.0f : 0.0f, dinp, K);
    if (dw)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, O, K, N, 1.0f, dout, O, inp, K,
                    flags & GM_DW_WRITE ? 0.0f : 1.0f, dw, K);
}

void cpu_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N, int K,
                    int O, int flags) {
    mm_bwd(dinp, dw, dout, inp, w, N, K, O, flags & (GM_ACC_DINP | GM_DW_WRITE));
}

static void cpu_grouped_matmul_fwd(float *out, const float *inp, const float *w, const int64_t *off, int G,
                                   int K, int O) {
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g], n = off[g + 1] - off[g];
        cpu_matmul_fwd(out + r0 * O, inp + r0 * K, w + (size_t)g * O * K, (int)n, K, O, 0);
    }
}

// flags as mm_bwd's, and GM_DW_BF16 (ops.h): each group's float32 block computed in a buffer of its own,
// then packed into its bf16 block at dw (nothing else of dw's float32 bytes written)
static void cpu_grouped_matmul_bwd(float *dinp, float *dw, const float *dout, const float *inp,
                                   const float *w, const int64_t *off, int G, int K, int O, int flags) {
    const char *fe = gm_dw_flags_error(flags);
    CHECK(!fe, "grouped_matmul_bwd: %s", fe);
    size_t blk = (size_t)O * K;
    int packed = dw && (flags & GM_DW_BF16) && blk > 0;
    float *b = packed ? xmalloc(sizeof(float) * blk) : NULL;
    for (int g = 0; g < G; g++) {
        int64_t r0 = off[g], n = off[g + 1] - off[g];
        float *dg = !dw ? NULL : packed ? b : dw + g * blk;
        mm_bwd(dinp ? dinp + r0 * K : NULL, dg, dout + r0 * O, inp + r0 * K, w + g * blk, (int)n, K, O,
               flags & (GM_ACC_DINP | GM_DW_WRITE));
        if (!packed) continue;
        uint16_t *p = (uint16_t *)dw + g * blk;
        for (size_t j = 0; j < blk; j++) p[j] = bf16_rn_bits(b[j]);
    }
    free(b);
    if (dw && (flags & GM_DW_SUMSQ) && G > 0 && K > 0 && O > 0)
        cpu_dw_ledger_add(dw, G, (size_t)O * K, (flags & GM_DW_BF16) != 0);
}

static void cpu_grouped_swiglu_fwd(void *h1, void *h3, void *act, const void *inp, const float *w1,
                                   const float *w3, const int64_t *off, int G, int K, int O) {
    backend_grouped_swiglu_fwd_plain(backend_cpu(), h1, h3, act, inp, w1, w3, off, G, K, O);
}

static void cpu_grouped_swiglu_bwd(void *dh1, void *dh3, float *dw, const void *dout, const void *act,
                                   const void *h1, const void *h3, const float *w, const int64_t *off, int G,
                                   int K, int O, int flags) {
    backend_grouped_swiglu_bwd_plain(backend_cpu(), dh1, dh3, dw, dout, act, h1, h3, w, off, G, K, O, flags);
}

static void cpu_grouped_down_fwd(float *out, const void *act, const float *w, const int64_t *off, int G,
                                 int K, int O) {
    backend_grouped_down_fwd_plain(backend_cpu(), out, act, w, off, G, K, O);
}

static void cpu_grouped_matmul_bwd2(float *dinp, float *dwa, float *dwb, const void *douta, const void *doutb,
                                    const void *inp, const float *wa, const float *wb, const int64_t *off,
                                    int G, int K, int O, int flags) {
    backend_grouped_matmul_bwd2_plain(backend_cpu(), dinp, dwa, dwb, douta, doutb, inp, wa, wb, off, G, K, O,
                                      flags);
}

// The ops into or from the hidden format: the cpu's is float32 (from_hid changes nothing)
static void cpu_rmsnorm_fwd_hid(void *out, float *rstd, const float *inp, const float *w, int N, int C,
                                float eps) {
    cpu_rmsnorm_fwd((float *)out, rstd, inp, w, N, C, eps);
}
static void cpu_gather_rows_hid(void *out, const void *inp, int from_hid, const int32_t *idx, int n, int C) {
    (void)from_hid;
    cpu_gather_rows((float *)out, (const float *)inp, idx, n, C);
}

static void cpu_add_rmsnorm_fwd(float *x, float *out, float *rstd, const float *res, const float *w, int N,
                                int C, float eps) {
    backend_add_rmsnorm_fwd_plain(backend_cpu(), x, out, rstd, res, w, N, C, eps);
}

static void cpu_matmul_fwd_multi(int n, float *const *out, const void *inp, const float *const *w, int N,
                                 int K, const int *O, int flags) {
    backend_matmul_fwd_multi_plain(backend_cpu(), n, out, inp, w, N, K, O, flags);
}

static void cpu_matmul_bwd_multi(int n, float *dinp, float *const *dw, const float *const *dout,
                                 const void *inp, const float *const *w, int N, int K, const int *O,
                                 int flags) {
    backend_matmul_bwd_multi_plain(backend_cpu(), n, dinp, dw, dout, inp, w, N, K, O, flags);
}

const Backend *backend_cpu(void) {
    static const Backend be = {
        .name = "cpu",
        .alloc = cpu_alloc,
        .free = cpu_free,
        .alloc_holes = cpu_alloc_holes,
        .to_device = cpu_copy,
        .to_host = cpu_copy,
        .copy = cpu_copy,
        .zero = cpu_zero,
        .sync = cpu_sync,
        .matmul_fwd = cpu_matmul_fwd,
        .matmul_bwd = cpu_matmul_bwd,
        .matmul_fwd_multi = cpu_matmul_fwd_multi,
        .matmul_bwd_multi = cpu_matmul_bwd_multi,
        .grouped_matmul_fwd = cpu_grouped_matmul_fwd,
        .grouped_matmul_bwd = cpu_grouped_matmul_bwd,
        .hid = FMT_F32,
        .grouped_swiglu_fwd = cpu_grouped_swiglu_fwd,
        .grouped_down_fwd = cpu_grouped_down_fwd,
        .grouped_swiglu_bwd = cpu_grouped_swiglu_bwd,
        .grouped_matmul_bwd2 = cpu_grouped_matmul_bwd2,
        .embedding_fwd = cpu_embedding_fwd,
        .embedding_bwd = cpu_embedding_bwd,
        .rmsnorm_fwd = cpu_rmsnorm_fwd,
        .rmsnorm_fwd_hid = cpu_rmsnorm_fwd_hid,
        .rmsnorm_bwd = cpu_rmsnorm_bwd,
        .add_rmsnorm_fwd = cpu_add_rmsnorm_fwd,
        .rmsnorm_part = cpu_rmsnorm_part,
        .rmsnorm_fwd_part = cpu_rmsnorm_fwd_part,
        .rmsnorm_bwd_part = cpu_rmsnorm_bwd_part,
        .rope_fwd = cpu_rope_fwd,
        .rope_bwd = cpu_rope_bwd,
        .rope_rows = cpu_rope_rows,
        .rope_fwd_hid = cpu_rope_fwd_hid,
        .to_hid = cpu_to_hid,
        .rope_bwd_hid = cpu_rope_bwd_hid,
        .to_hid_rows = cpu_to_hid_rows,
        .rope_yarn = cpu_rope_yarn,
        .copy_strided = cpu_copy_strided,
        .dropout = cpu_dropout,
        .attention_fwd = cpu_attention_fwd,
        .attention_bwd = cpu_attention_bwd,
        .attention_drop_fwd = cpu_attention_drop_fwd,
        .attention_drop_bwd = cpu_attention_drop_bwd,
        .swiglu_fwd = cpu_swiglu_fwd,
        .swiglu_bwd = cpu_swiglu_bwd,
        .gather_rows = cpu_gather_rows,
        .gather_rows_hid = cpu_gather_rows_hid,
        .gather_dot_scale = cpu_gather_dot_scale,
        .combine_rows = cpu_combine_rows,
        .router_topk = cpu_router_topk,
        .plan_counts = cpu_plan_counts,
        .plan_rows = cpu_plan_rows,
        .router_bwd = cpu_router_bwd,
        .cross_entropy_fwd_bwd = cpu_cross_entropy_fwd_bwd,
        .cross_entropy_fwd = cpu_cross_entropy_fwd,
        .ce_part = cpu_ce_part,
        .ce_finish = cpu_ce_finish,
        .mul = cpu_mul,
        .axpy = cpu_axpy,
        .add = cpu_add,
        .sigmoid_fwd = cpu_sigmoid_fwd,
        .sigmoid_bwd = cpu_sigmoid_bwd,
        .runs_create = cpu_runs_create,
        .runs_free = cpu_runs_free,
        .sumsq_runs = cpu_sumsq_runs,
        .dw_sumsq_take = cpu_dw_sumsq_take,
        .adamw_runs = cpu_adamw_runs,
        .bf16_shadow = cpu_bf16_shadow,
    };
    return &be;
}
