// plain.h — the fused expert ops of ops.h (grouped_swiglu_fwd/_bwd, grouped_matmul_bwd2) as the
// plain ops of a Backend that their contracts name, in that order: what a backend with nothing to
// fuse puts in its table (cpu, cuda-fp32) and what the tests' reference backends compose. Header
// only (static inline), so that a backend can use it without linking against the file that picks
// backends (backend.c). Must not hold: anything but these compositions.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "ops/ops.h"

static inline void backend_grouped_swiglu_fwd_plain(const Backend *be, float *h1, float *h3, float *act,
                                                    const float *inp, const float *w1, const float *w3,
                                                    const int64_t *off, int G, int K, int O) {
    if (G <= 0) return;
    be->grouped_matmul_fwd(h1, inp, w1, off, G, K, O);
    be->grouped_matmul_fwd(h3, inp, w3, off, G, K, O);
    size_t b = (size_t)off[0] * O;
    be->swiglu_fwd(act + b, h1 + b, h3 + b, (size_t)(off[G] - off[0]) * O);
}

// dact goes through dh1 (swiglu_bwd reads each element's dout before it writes that dh1)
static inline void backend_grouped_swiglu_bwd_plain(const Backend *be, float *dh1, float *dh3, float *dw,
                                                    const float *dout, const float *act, const float *h1,
                                                    const float *h3, const float *w, const int64_t *off, int G, int K,
                                                    int O) {
    if (G <= 0) return;
    be->grouped_matmul_bwd(dh1, dw, dout, act, w, off, G, K, O, 0);
    size_t b = (size_t)off[0] * K;
    be->swiglu_bwd(dh1 + b, dh3 + b, dh1 + b, h1 + b, h3 + b, (size_t)(off[G] - off[0]) * K, 0);
}

static inline void backend_grouped_matmul_bwd2_plain(const Backend *be, float *dinp, float *dwa, float *dwb,
                                                     const float *douta, const float *doutb, const float *inp,
                                                     const float *wa, const float *wb, const int64_t *off, int G,
                                                     int K, int O, int accumulate) {
    be->grouped_matmul_bwd(dinp, dwa, douta, inp, wa, off, G, K, O, accumulate);
    be->grouped_matmul_bwd(dinp, dwb, doutb, inp, wb, off, G, K, O, 1);
}
