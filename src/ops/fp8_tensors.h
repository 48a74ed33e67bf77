// fp8_tensors.h — the names of the tensors the FP8 quantisers read (ops.h Backend.fp8_nonfinite names the
// first non-finite one, Backend.fp8_amax records each one's largest scale per layer): the fused expert ops
// know their operands' roles; grouped_matmul_fwd/bwd called directly give the generic three.
// Must not hold: the quantisers (ops/cpu/cpu_fp8.c, ops/cuda/cuda_fp8.cu) or the backend interface.
#pragma once
#include "ops/numerics.h"

enum {
    FP8T_X,
    FP8T_W1,
    FP8T_W3,
    FP8T_ACT,
    FP8T_W2,
    FP8T_DY,
    FP8T_DH1,
    FP8T_DH3,
    FP8T_INP,
    FP8T_W,
    FP8T_DOUT,
    FP8T_AX,
    FP8T_AW,
    FP8T_AD,
    FP8T_N
};
#define FP8_AMAX_NONE (FP8_SCALE_EXP_MIN - 1) // Backend.fp8_amax: no finite group quantised
static inline const char *fp8_tensor_name(int t) {
    static const char *name[FP8T_N] = {"x (the experts' input rows)",
                                       "w1 (the experts' gate weights)",
                                       "w3 (the experts' up weights)",
                                       "act (the SwiGLU output, the down projection's input)",
                                       "w2 (the experts' down weights)",
                                       "dy (the experts' output gradient)",
                                       "dh1 (the gate projection's output gradient)",
                                       "dh3 (the up projection's output gradient)",
                                       "a grouped GEMM's input",
                                       "a grouped GEMM's weight",
                                       "a grouped GEMM's output gradient",
                                       "an attention projection's input rows (--fp8-dense)",
                                       "an attention projection's weight (--fp8-dense)",
                                       "an attention projection's output gradient (--fp8-dense)"};
    return t >= 0 && t < FP8T_N ? name[t] : "an unnamed tensor";
}
