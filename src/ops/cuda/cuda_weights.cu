// cuda_weights.cu — the bf16 copy of the weights that the "cuda" backend's GEMMs read (ops.h bf16_shadow),
// and the parameter buffer whose weights in its holes live in that copy alone (ops.h alloc_bf16_params:
// virtual memory with the whole pages inside the holes left unbacked, cuda_vm.h, 4 bytes a parameter less
// under the bf16 policy). AdamW's writes of the copy are cuda_optim.cu's; the conversion kernel is
// cuda_gemm.cu's. Must not hold: kernels or any knowledge of the model.
#include <cuda.h>
#include <cuda_bf16.h>
#include <stdlib.h>
#include <string.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_vm.h"

typedef __nv_bfloat16 bf16;

#define MAX_HOLES 4096

// (ops.h bf16_shadow) The trainer registers its whole parameter buffer; the bf16 GEMMs then take a
// weight's bf16 values from the copy instead of converting it on each call (each weight is used by
// a forward and a backward GEMM per micro-batch), and adamw_runs writes the copy with the update.
// `valid` drops on any write into the range the backend sees (cuda_bf16_shadow_write) and when the
// buffer is freed; the GEMMs then convert as without the copy. Same bf16 values either way (round
// to nearest even of the same floats), so results do not change. In the holes of a buffer from
// alloc_bf16_params the copy is the only storage: always current, whatever `valid` says.
static struct {
    const float *base;
    size_t n, cap;
    bf16 *mirror;
    int valid;
    int nh; // holes: element ranges [h[2i], h[2i+1]), ascending and disjoint
    size_t h[2 * MAX_HOLES];
    unsigned gen; // which buffer with holes (adamw_runs' per-run flags are for one)
    unsigned long long ver; // the copy's version: bumped by every change of what it holds or covers
    VmBuf vm; // the virtual memory of a buffer with holes: the reserved range and its backed pieces
} g_sh;

static void mirror_alloc(size_t n) {
    if (n <= g_sh.cap) return;
    if (g_sh.mirror) CUDA_CHECK(cudaFree(g_sh.mirror));
    g_sh.mirror = NULL;
    g_sh.cap = 0;
    cudaError_t e = cudaMalloc(&g_sh.mirror, n * sizeof(bf16));
    if (e != cudaSuccess) {
        cudaGetLastError();
        size_t fr = 0, tot = 0;
        cudaMemGetInfo(&fr, &tot);
        char a[32], b[32];
        fmt_bytes(a, sizeof a, (double)n * sizeof(bf16));
        fmt_bytes(b, sizeof b, (double)fr);
        DIE("%s:%d: cudaMalloc of the bf16 copy of the weights (%s) failed: %s; %s free on the GPU; hint: %s "
            "(or use --device cuda-fp32, which keeps none)",
            __FILE__, __LINE__, a, cudaGetErrorString(e), b, cuda_hint(e));
    }
    g_sh.cap = n;
}

// Calls fn(e0, e1, hole) for the pieces of elements [e0, e1) of the registered buffer, in order, each
// wholly inside a hole (hole 1) or outside every hole (0).
template <typename F> static void by_holes(size_t e0, size_t e1, F fn) {
    for (int i = 0; i < g_sh.nh && e0 < e1; i++) {
        size_t a = g_sh.h[2 * i], b = g_sh.h[2 * i + 1];
        if (b <= e0) continue;
        if (a >= e1) break;
        if (a > e0) fn(e0, a, 0);
        size_t s = a > e0 ? a : e0, t = b < e1 ? b : e1;
        fn(s, t, 1);
        e0 = t;
    }
    if (e0 < e1) fn(e0, e1, 0);
}

extern "C" void cuda_bf16_shadow(const float *p, size_t n) {
    g_sh.ver++;
    if (g_sh.nh) { // a buffer with holes: its copy holds weights nothing else does; refresh the rest only
        CHECK(p == g_sh.base && n == g_sh.n,
              "bf16_shadow: the registered parameter buffer keeps weights in its "
              "bf16 copy alone (alloc_bf16_params): it can be refreshed (the same p and n), not replaced");
        by_holes(0, n, [](size_t a, size_t b, int hole) {
            if (!hole) cuda_f32_to_bf16(g_sh.mirror + a, g_sh.base + a, b - a);
        });
        g_sh.valid = 1;
        return;
    }
    g_sh.valid = 0;
    g_sh.base = n ? p : NULL;
    g_sh.n = p ? n : 0;
    if (!g_sh.base) return;
    mirror_alloc(n);
    cuda_f32_to_bf16(g_sh.mirror, p, n);
    g_sh.valid = 1;
}

// The copy of the whole registered buffer when p is its start and it is current (or p has holes, whose
// copy always is: adamw_runs writes it), else NULL.
extern "C" void *cuda_bf16_shadow_for(const float *p) {
    return p && p == g_sh.base && (g_sh.valid || g_sh.nh) ? g_sh.mirror : NULL;
}

// Where elements [off, off + n) of the buffer p lie: 1 inside one hole of a buffer from alloc_bf16_params,
// 0 outside every hole (or p is no such buffer); a range across a hole's edge dies (a tensor is either
// stored in the copy alone or not).
extern "C" int cuda_bf16_in_hole(const float *p, size_t off, size_t n) {
    if (!g_sh.nh || p != g_sh.base || !n) return 0;
    int in = 0, out = 0;
    by_holes(off, off + n, [&](size_t, size_t, int hole) { (hole ? in : out) = 1; });
    CHECK(!(in && out),
          "elements [%zu, %zu) of the parameter buffer lie partly in a hole (weights stored in bf16 "
          "alone) and partly not",
          off, off + n);
    return in;
}

extern "C" unsigned cuda_bf16_holes_gen(const float *p) { return g_sh.nh && p == g_sh.base ? g_sh.gen : 0; }

// A write of `bytes` at ptr by the backend: drops the copy if it overlaps the registered range; a write
// into a hole has nothing to write to (dies: to_device writes holes through cuda_bf16_params_to_device).
extern "C" void cuda_bf16_shadow_write(const void *ptr, size_t bytes) {
    if (!g_sh.base || !bytes) return;
    uintptr_t a = (uintptr_t)ptr, b0 = (uintptr_t)g_sh.base, b1 = b0 + g_sh.n * sizeof(float);
    if (a >= b1 || a + bytes <= b0) return;
    g_sh.ver++;
    if (g_sh.nh) {
        size_t e0 = a > b0 ? (a - b0) / sizeof(float) : 0,
               e1 = (a + bytes - b0 + sizeof(float) - 1) / sizeof(float);
        by_holes(e0, e1 < g_sh.n ? e1 : g_sh.n, [](size_t s, size_t t, int hole) {
            CHECK(!hole,
                  "a write into parameters [%zu, %zu), which live in the bf16 copy alone (alloc_bf16_params)",
                  s, t);
        });
    }
    g_sh.valid = 0;
}

// (cuda_common.h) The copy's version, the buffer it covers (NULL: none), and adamw_runs' note that it wrote
// new weights into the copy.
extern "C" unsigned long long cuda_bf16_shadow_version(void) { return g_sh.ver; }
extern "C" const float *cuda_bf16_shadow_base(void) { return g_sh.base; }
extern "C" void cuda_bf16_shadow_updated(void) { g_sh.ver++; }

// Where [w, w + count) lies in the copy's buffer: 1 inside, at element *off; 2 inside but not at a whole
// element (*off the element it starts in); 0 outside (or no copy).
static int in_copy(const float *w, size_t count, size_t *off) {
    uintptr_t a = (uintptr_t)w, b0 = (uintptr_t)g_sh.base;
    if (!g_sh.base || a < b0 || count > g_sh.n || (a - b0) / sizeof(float) > g_sh.n - count) return 0;
    *off = (a - b0) / sizeof(float);
    return (a - b0) % sizeof(float) ? 2 : 1;
}

// The copy's values of [w, w + count) where those elements live in a hole (the copy alone), else NULL.
extern "C" const void *cuda_bf16_hole_of(const float *w, size_t count) {
    size_t off;
    if (!g_sh.nh || in_copy(w, count, &off) != 1) return NULL;
    return cuda_bf16_in_hole(g_sh.base, off, count) ? g_sh.mirror + off : NULL;
}

// bf16 values of the weight [w, w + count) from the copy, or NULL (then the caller converts). Only
// for weights at a multiple of 8 elements from the buffer's start, so that the bf16 pointer is 16-byte
// aligned like the scratch the conversion would write: cuBLAS picks its kernel by alignment, and
// another kernel would sum in another order (and a misaligned one runs slower). A weight in a hole has
// no float32 values to convert: it is always taken from the copy (and must be aligned so).
extern "C" const void *cuda_bf16_shadow_of(const float *w, size_t count) {
    size_t off;
    int where = in_copy(w, count, &off);
    if (!where) return NULL;
    int hole = where == 1 && cuda_bf16_in_hole(g_sh.base, off, count);
    if (off % 8 || where == 2) {
        CHECK(!hole,
              "a GEMM weight at element %zu of the parameter buffer lies in a hole (bf16 alone) but not at a "
              "multiple of 8 elements",
              off);
        return NULL;
    }
    return hole || g_sh.valid ? g_sh.mirror + off : NULL;
}

// ---------------------------------------------------------------- the parameter buffer with holes
extern "C" float *cuda_alloc_bf16_params(size_t n, const size_t *hole, int nh) {
    CHECK(!g_sh.nh, "alloc_bf16_params: a parameter buffer with holes exists already (one at a time)");
    CHECK(nh >= 1, "alloc_bf16_params: no holes (none: alloc)");
    vm_holes_check(n, hole, nh, MAX_HOLES, "alloc_bf16_params");
    if (g_sh.base) cuda_bf16_shadow(NULL, 0); // (a copy of another buffer: dropped, as registering anew does)
    vm_map(&g_sh.vm, n, hole, nh);
    g_sh.base = (const float *)g_sh.vm.va;
    g_sh.n = n;
    g_sh.nh = nh;
    memcpy(g_sh.h, hole, sizeof(size_t) * 2 * nh);
    g_sh.gen++;
    g_sh.ver++;
    // the float32 memory of a hole that is backed (its pages at the edges) is never read: poison it (NaN),
    // so that an op reading a stored weight as float32 shows at once rather than reading zeros
    for (int i = 0; i < g_sh.vm.npc; i++) {
        size_t ps = g_sh.vm.pc[i].off / sizeof(float),
               pe = (g_sh.vm.pc[i].off + g_sh.vm.pc[i].bytes) / sizeof(float);
        by_holes(ps, pe < n ? pe : n, [](size_t a, size_t b, int hole) {
            if (hole) CUDA_CHECK(cudaMemset((void *)(g_sh.base + a), 0xff, (b - a) * sizeof(float)));
        });
    }
    mirror_alloc(n);
    CUDA_CHECK(cudaMemset(g_sh.mirror, 0, n * sizeof(bf16))); // the copy of the zeroed buffer
    g_sh.valid = 1;
    return (float *)g_sh.vm.va;
}

// cuda_free of p: 1 if p was the buffer with holes (now released with its copy), else 0.
extern "C" int cuda_bf16_params_free(const void *p) {
    if (!g_sh.vm.va || !p || p != (const void *)g_sh.vm.va) return 0;
    vm_unmap(&g_sh.vm); // (synchronises: no kernel still uses it)
    g_sh.nh = 0;
    cuda_bf16_shadow_freed(p);
    return 1;
}

// The buffer at p is freed: forget it (and free the copy) if it is the registered one.
extern "C" void cuda_bf16_shadow_freed(const void *p) {
    if (!p || p != (const void *)g_sh.base) return;
    CHECK(!g_sh.nh, "the parameter buffer with holes is freed through cuda_bf16_params_free");
    g_sh.ver++;
    g_sh.valid = 0;
    g_sh.base = NULL;
    g_sh.n = g_sh.cap = 0;
    if (g_sh.mirror) CUDA_CHECK(cudaFree(g_sh.mirror));
    g_sh.mirror = NULL;
}

// to_host / to_device over a range that meets a hole: piece by piece, the holes' values widened from the
// copy (exact) or rounded into it (to nearest even; exact for the bf16 values the policy keeps). 1 when
// the range met a hole (and was copied), 0 otherwise (the caller copies as usual).
#define STAGE_ELEMS ((size_t)1 << 24)
static int meets_hole(const void *ptr, size_t bytes, size_t *e0, size_t *e1) {
    if (!g_sh.nh || !bytes) return 0;
    uintptr_t a = (uintptr_t)ptr, b0 = (uintptr_t)g_sh.base, b1 = b0 + g_sh.n * sizeof(float);
    if (a >= b1 || a + bytes <= b0) return 0;
    CHECK(a >= b0 && a + bytes <= b1 && (a - b0) % sizeof(float) == 0 && bytes % sizeof(float) == 0,
          "a copy of %zu bytes at byte %lld of the parameter buffer with holes: only whole floats inside it",
          bytes, (long long)(a - b0));
    *e0 = (a - b0) / sizeof(float);
    *e1 = *e0 + bytes / sizeof(float);
    int any = 0;
    by_holes(*e0, *e1, [&](size_t, size_t, int hole) { any |= hole; });
    return any;
}

extern "C" int cuda_bf16_params_to_host(void *dst, const void *src, size_t bytes) {
    size_t e0, e1;
    if (!meets_hole(src, bytes, &e0, &e1)) return 0;
    float *out = (float *)dst - e0;
    uint16_t *st = (uint16_t *)xmalloc(sizeof(uint16_t) * STAGE_ELEMS);
    by_holes(e0, e1, [&](size_t a, size_t b, int hole) {
        if (!hole) {
            CUDA_CHECK(cudaMemcpy(out + a, g_sh.base + a, (b - a) * sizeof(float), cudaMemcpyDeviceToHost));
            return;
        }
        for (size_t s = a; s < b; s += STAGE_ELEMS) {
            size_t k = b - s < STAGE_ELEMS ? b - s : STAGE_ELEMS;
            CUDA_CHECK(cudaMemcpy(st, g_sh.mirror + s, k * sizeof(uint16_t), cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < k; i++) out[s + i] = bf16_to_f32(st[i]);
        }
    });
    free(st);
    return 1;
}

extern "C" int cuda_bf16_params_to_device(void *dst, const void *src, size_t bytes) {
    size_t e0, e1;
    if (!meets_hole(dst, bytes, &e0, &e1)) return 0;
    const float *in = (const float *)src - e0;
    g_sh.ver++;
    uint16_t *st = (uint16_t *)xmalloc(sizeof(uint16_t) * STAGE_ELEMS);
    by_holes(e0, e1, [&](size_t a, size_t b, int hole) {
        if (!hole) {
            g_sh.valid = 0; // (as any write outside the holes: bf16_shadow makes the copy again)
            CUDA_CHECK(
                cudaMemcpy((void *)(g_sh.base + a), in + a, (b - a) * sizeof(float), cudaMemcpyHostToDevice));
            return;
        }
        for (size_t s = a; s < b; s += STAGE_ELEMS) {
            size_t k = b - s < STAGE_ELEMS ? b - s : STAGE_ELEMS;
            for (size_t i = 0; i < k; i++) st[i] = bf16_rn_bits(in[s + i]);
            CUDA_CHECK(cudaMemcpy(g_sh.mirror + s, st, k * sizeof(uint16_t), cudaMemcpyHostToDevice));
        }
    });
    free(st);
    return 1;
}
