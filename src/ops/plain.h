// plain.h — the fused ops of ops.h (grouped_swiglu_fwd/_bwd, grouped_down_fwd, grouped_matmul_bwd2,
// matmul_fwd_multi/_bwd_multi, add_rmsnorm_fwd) as the plain ops of a Backend that their contracts name, in
// that order: what a backend with nothing to fuse puts in its table (cpu, cuda-fp32: float32 hidden rows,
// Backend.hid FMT_F32, so the `void *` rows are float *) and what the tests' reference backends compose.
// Header only (static inline), so that a backend can use it without linking against the file that picks
// backends (backend.c). Must not hold: anything but these compositions.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "core/common.h"
#include "ops/ops.h"

static inline void backend_grouped_swiglu_fwd_plain(const Backend *be, void *h1v, void *h3v, void *actv,
                                                    const void *inpv, const float *w1, const float *w3,
                                                    const int64_t *off, int G, int K, int O) {
    if (G <= 0) return;
    float *h1 = (float *)h1v, *h3 = (float *)h3v, *act = (float *)actv;
    const float *inp = (const float *)inpv;
    be->grouped_matmul_fwd(h1, inp, w1, off, G, K, O);
    be->grouped_matmul_fwd(h3, inp, w3, off, G, K, O);
    size_t b = (size_t)off[0] * O;
    be->swiglu_fwd(act + b, h1 + b, h3 + b, (size_t)(off[G] - off[0]) * O);
}

// dact goes through dh1 (swiglu_bwd reads each element's dout before it writes that dh1)
static inline void backend_grouped_swiglu_bwd_plain(const Backend *be, void *dh1v, void *dh3v, float *dw,
                                                    const void *dout, const void *act, const void *h1v,
                                                    const void *h3v, const float *w, const int64_t *off,
                                                    int G, int K, int O, int flags) {
    if (G <= 0) return;
    float *dh1 = (float *)dh1v, *dh3 = (float *)dh3v;
    const float *h1 = (const float *)h1v, *h3 = (const float *)h3v;
    be->grouped_matmul_bwd(dh1, dw, (const float *)dout, (const float *)act, w, off, G, K, O,
                           flags & GM_DW_FLAGS);
    size_t b = (size_t)off[0] * K;
    be->swiglu_bwd(dh1 + b, dh3 + b, dh1 + b, h1 + b, h3 + b, (size_t)(off[G] - off[0]) * K, 0);
}

static inline void backend_grouped_down_fwd_plain(const Backend *be, float *out, const void *act,
                                                  const float *w, const int64_t *off, int G, int K, int O) {
    be->grouped_matmul_fwd(out, (const float *)act, w, off, G, K, O);
}

static inline void backend_grouped_matmul_bwd2_plain(const Backend *be, float *dinp, float *dwa, float *dwb,
                                                     const void *douta, const void *doutb, const void *inp,
                                                     const float *wa, const float *wb, const int64_t *off,
                                                     int G, int K, int O, int flags) {
    be->grouped_matmul_bwd(dinp, dwa, (const float *)douta, (const float *)inp, wa, off, G, K, O, flags);
    be->grouped_matmul_bwd(dinp, dwb, (const float *)doutb, (const float *)inp, wb, off, G, K, O,
                           GM_ACC_DINP | (flags & GM_DW_FLAGS));
}

static inline void backend_add_rmsnorm_fwd_plain(const Backend *be, float *x, float *out, float *rstd,
                                                 const float *res, const float *w, int N, int C, float eps) {
    be->axpy(x, res, 1.0f, (size_t)N * C);
    be->rmsnorm_fwd(out, rstd, x, w, N, C, eps);
}

// The one rule on matmul_fwd_multi's flags every backend checks (CHECK(!e, "...: %s", e)): NULL where they
// hold, else what is wrong: GM_OUT_HID is its only flag, and takes only products wider than
// MOE_GEMM_FP32_MAX_O (where the GEMMs are the format's own).
static inline const char *mm_fwd_multi_flags_error(int n, const int *O, int flags) {
    if (flags & ~GM_OUT_HID) return "a flag other than GM_OUT_HID";
    for (int i = 0; (flags & GM_OUT_HID) && i < n; i++)
        if (O[i] <= MOE_GEMM_FP32_MAX_O)
            return "GM_OUT_HID on a product of MOE_GEMM_FP32_MAX_O columns or fewer";
    return NULL;
}

// (GM_OUT_HID: a no-op where the format is float32, the only backends composed so)
static inline void backend_matmul_fwd_multi_plain(const Backend *be, int n, float *const *out,
                                                  const void *inp, const float *const *w, int N, int K,
                                                  const int *O, int flags) {
    const char *e = mm_fwd_multi_flags_error(n, O, flags);
    CHECK(!e, "matmul_fwd_multi (%s): %s", be->name, e);
    CHECK(!(flags & GM_OUT_HID) || be->hid == FMT_F32, "matmul_fwd_multi (%s): GM_OUT_HID composed",
          be->name);
    for (int i = 0; i < n; i++) be->matmul_fwd(out[i], (const float *)inp, w[i], N, K, O[i], 0);
}

static inline void backend_matmul_bwd_multi_plain(const Backend *be, int n, float *dinp, float *const *dw,
                                                  const float *const *dout, const void *inp,
                                                  const float *const *w, int N, int K, const int *O,
                                                  int flags) {
    for (int i = 0; i < n; i++)
        be->matmul_bwd(dinp, dw[i], dout[i], (const float *)inp, w[i], N, K, O[i],
                       i ? GM_ACC_DINP | (flags & (GM_DW_WRITE | GM_DOUT_HID)) : flags);
}
