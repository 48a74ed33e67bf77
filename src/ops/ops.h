// ops.h — the kernel interface: a Backend is a table of functions over device buffers.
// The model and the MoE layer call only these. cpu/ is the float32 reference (CBLAS + OpenMP);
// a cuda/ backend fills the same table. Must not hold: any knowledge of the model or of layers.
//
// Conventions: row-major; a Linear weight W is (out, in) and y = x W^T (HF layout).
// Every *_bwd ACCUMULATES (+=) into its gradient outputs, except where an `accumulate` argument
// (0 = overwrite, 1 = +=: swiglu_bwd) or the grouped ops' `flags` (GM_* below) say otherwise; gradient
// pointers may be NULL where noted.
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include <string.h>
#include "ops/numerics.h"
#include "ops/fp8_tensors.h"

typedef struct Backend Backend;

// RoPE's frequencies (rope_yarn): f_j = theta^(-2j/hd) for the pair j < hd/2; with factor > 1, YaRN's
// (transformers' rope_type yarn): f_j e_j + (f_j / factor) (1 - e_j), e_j = 1 - clamp((j - low) / (high -
// low), 0, 1) (high = low + 0.001 where they are equal), and every rotated value times scale (YaRN's
// attention factor; 1 without it). interleave: the rotated pairs are (2j, 2j + 1) (DeepSeek's layout,
// transformers' rope_interleave, rotated in place), else (j, j + hd/2) (rotate_half).
typedef struct {
    float theta, factor, low, high, scale;
    int interleave;
} RopeYarn;
// A strided block of float32 or hidden-format elements (copy_strided): element (i, j, c), i < n0, j < n1,
// c < cols, at dst[i*d0 + j*d1 + c] and src[i*s0 + j*s1 + c] (strides in elements; s1 = 0 repeats a
// source row over j, d1 = 0 with accumulate sums over j).
typedef struct {
    int n0, n1, cols;
    int64_t d0, d1, s0, s1;
} Stride3;

// Multi-tensor optimizer runs (sumsq_runs, adamw_runs): run i covers elements [off, off+n) of the
// flat parameter/gradient buffers and [moff, moff+n) of the moment buffers; decay: weight decay
// applies to it; cls: the class (0 <= cls < ncls) its sum of squares is added to.
// gidx, gcols, lcols, col0: each element's GLOBAL index (into the one-process full flat buffer), which
// adamw_runs' stochastic rounding hashes, so that every mesh rounds an element alike (optrun_gidx).
// Where the run lies in a column block of a tensor (TP/ETP column splits) its elements are not
// consecutive globally: lcols (> 0) is the local row length, gcols the global one, col0 the column of
// the run's first element in its local row, gidx that element's global index. lcols = 0: gidx + i.
// gbf, the gradient's format (the bf16 policy's routed-expert gradients: optrun_g): OPTG_F32 (0) float32 as
// stored; OPTG_BF16 float32 storage read rounded to bf16 (nearest even); OPTG_PACKED bf16 values packed from
// element gb of the buffer (written so by the grouped ops' GM_DW_BF16): element e at ((uint16_t *)(g + gb))[e
// - gb].
typedef struct {
    int64_t off, moff, n;
    int32_t decay, cls;
    int64_t gidx, gcols;
    int32_t lcols, col0, gbf;
    int64_t gb;
} OptRun;
enum { OPTG_F32 = 0, OPTG_BF16 = 1, OPTG_PACKED = 2 };
static inline MOE_HD int64_t optrun_gidx(int64_t gidx, int64_t gcols, int32_t lcols, int32_t col0,
                                         int64_t i) {
    if (lcols <= 0) return gidx + i;
    int64_t c = col0 + i;
    return gidx - col0 + (c / lcols) * gcols + c % lcols;
}

// The precision policy of adamw_runs (--precision, --bf16-rounding):
//   OPT_MIXED: float32 moments (m, v are float *) and float32 weights (the mixed policy, as always).
//   OPT_BF16_NEAREST, OPT_BF16_STOCHASTIC: m, v are bf16 (uint16_t *, the top half of a float32); the
//   update reads them to float32, computes as OPT_MIXED, stores the moments rounded to nearest even,
//   and the new weight (still in the float32 buffer p) rounded to a bf16 value: to nearest even, or
//   stochastically (bf16_sr_bits with bf16_sr_rand(bf16_sr_key(seed, t), global index): unbiased,
//   deterministic).
//   OPT_BF16_MOMENTS: bf16 moments as above, the new weight left as its float32 value (not rounded).
enum { OPT_MIXED = 0, OPT_BF16_NEAREST = 1, OPT_BF16_STOCHASTIC = 2, OPT_BF16_MOMENTS = 3 };

// The `flags` of the backward ops (grouped_matmul_bwd, grouped_matmul_bwd2, grouped_swiglu_bwd, matmul_bwd,
// matmul_bwd_multi): GM_ACC_DINP adds into dinp (else written); GM_DW_WRITE writes the weight gradient
// blocks (every group's, zeros where a group has no rows) instead of adding into them. GM_DW_BF16 (grouped
// ops, with GM_DW_WRITE only): those blocks written as bf16 values packed from dw (each float32 result
// rounded to nearest even; block g's element j at ((uint16_t *)dw)[g O K + j]; nothing else is written: the
// other half of the float32 blocks' bytes is left as it was, so it may hold other packed blocks or be memory
// that is not there, alloc_holes): half the bytes of a float32 gradient, read back through OptRun's
// OPTG_PACKED. GM_DOUT_HID (matmul_bwd, and matmul_bwd_multi for every dout[i]): dout holds the hidden
// format's values (Backend.hid) in place of its float32 rows, row i's O values starting where float32 row i
// starts (byte 4 O i; cross_entropy_fwd_bwd writes so); the same bits as dout's float32 values rounded once
// to the format. A no-op where the format is float32. GM_OUT_HID (matmul_fwd_multi's one flag): every out[i]
// in the hidden format, each value rounded once from its float32 sum (every O[i] > MOE_GEMM_FP32_MAX_O, not
// --fp8-dense's; a no-op where the format is float32). GM_DW_SUMSQ (grouped ops, with GM_DW_WRITE only; where
// the backend has dw_sumsq_take): the G written blocks' values, as stored (bf16 under GM_DW_BF16), squared
// and summed into the backend's gradient ledger, counted as G blocks (dw_sumsq_take below).
enum { GM_ACC_DINP = 1, GM_DW_WRITE = 2, GM_DW_BF16 = 4, GM_DOUT_HID = 8, GM_DW_SUMSQ = 16, GM_OUT_HID = 32 };
// The flags of a grouped op's weight-gradient write (what a composed op passes on to its plain ones).
#define GM_DW_FLAGS (GM_DW_WRITE | GM_DW_BF16 | GM_DW_SUMSQ)
// The one rule on those flags every backend's grouped backward checks (CHECK(!e, "...: %s", e)): NULL where
// they hold together, else what is wrong. GM_DW_BF16 and GM_DW_SUMSQ come with GM_DW_WRITE only.
static inline const char *gm_dw_flags_error(int flags) {
    if ((flags & GM_DW_BF16) && !(flags & GM_DW_WRITE))
        return "GM_DW_BF16 without GM_DW_WRITE (bf16 weight gradients are written once, never accumulated)";
    if ((flags & GM_DW_SUMSQ) && !(flags & GM_DW_WRITE))
        return "GM_DW_SUMSQ without GM_DW_WRITE (the gradient ledger sums written blocks, not accumulations)";
    return NULL;
}
// The one rule on a buffer's holes (Backend.alloc_holes, alloc_bf16_params): NULL where the nhole element
// ranges [hole[2i], hole[2i+1]) are non-empty, inside n elements, ascending and disjoint; else what is wrong.
static inline const char *holes_error(size_t n, const size_t *hole, int nhole) {
    if (nhole < 0) return "a negative number of holes";
    for (int i = 0; i < nhole; i++)
        if (!(hole[2 * i] < hole[2 * i + 1] && hole[2 * i + 1] <= n &&
              (i == 0 || hole[2 * i] >= hole[2 * i - 1])))
            return "a hole is empty, past the buffer's elements or not after the one before it";
    return NULL;
}

// attention_bwd's flags: add into dq (ATT_ADD_DQ), into dk and dv (ATT_ADD_DKV); else those rows are written.
enum { ATT_ADD_DQ = 1, ATT_ADD_DKV = 2 };

// The router's rule (router_topk, router_bwd; from config.h's routing options): k experts a token; renorm:
// their weights renormalised to sum 1; sigmoid: scores sigmoid(logits) (DeepSeek-V3) instead of softmax;
// n_group > 1 (<= 64): the choice limited to the topk_group groups of highest score; scale: the weights times
// it (0 or 1: unscaled).
typedef struct {
    int k, renorm, sigmoid, n_group, topk_group;
    float scale;
} RouteRule;

// The most products of one input that matmul_fwd_multi / matmul_bwd_multi take (q, k, v).
#define MM_MULTI 3

// Element i (0-based in the run) of run u's gradient, by its format (OptRun.gbf): g is the whole flat buffer.
static inline MOE_HD float optrun_g(const float *g, int32_t gbf, int64_t gb, int64_t off, int64_t i) {
    if (gbf == OPTG_PACKED) return bf16_to_f32(((const uint16_t *)(g + gb))[off + i - gb]);
    return gbf == OPTG_BF16 ? bf16_to_f32(bf16_rn_bits(g[off + i])) : g[off + i];
}
// The weight rounding of the bf16 policy (prec OPT_BF16_*), as a float holding the bf16 value (x itself
// under OPT_BF16_MOMENTS); key: bf16_sr_key of the step.
static inline MOE_HD float bf16_round_weight(float x, int prec, uint64_t key, int64_t gi) {
    if (prec == OPT_BF16_MOMENTS) return x;
    return bf16_to_f32(prec == OPT_BF16_STOCHASTIC ? bf16_sr_bits(x, bf16_sr_rand(key, gi))
                                                   : bf16_rn_bits(x));
}
// One step of adamw_runs (below), its scalars computed once on the host from the call's arguments
// (adamw_step), alike on every backend: step = lr / (1 - b1^t), rs2 = 1 / sqrt(1 - b2^t), lwd = lr wd, each
// from double rounded to float (the bias corrections folded into two scalars, as torch's AdamW does, so an
// element costs one division and one square root); key: the stochastic rounding's (bf16_sr_key).
typedef struct {
    float gs, b1, b2, eps, step, rs2, lwd;
    int prec;
    uint64_t key;
} AdamwStep;
static inline AdamwStep adamw_step(float gs, float lr, float b1, float b2, float eps, float wd, int t,
                                   int prec, uint64_t seed) {
    double c1 = 1.0 - pow((double)b1, (double)t), c2 = 1.0 - pow((double)b2, (double)t);
    AdamwStep s = {gs,
                   b1,
                   b2,
                   eps,
                   (float)(lr / c1),
                   (float)(1.0 / sqrt(c2)),
                   (float)((double)lr * wd),
                   prec,
                   bf16_sr_key(seed, t)};
    return s;
}
// AdamW's float32 arithmetic on one element, every operation rounded and none contracted (the cuda
// backend builds it with -fmad=false), so every backend gives the cpu's bits: the gradient g gs (gs = 1: g
// exactly), the moments m, v (updated in place), the new weight p - (step (m / (sqrt(v) rs2 + eps)) + lwd p)
// (lwd: s->lwd where the run decays, else 0).
static inline MOE_HD float adamw_f32(float p, float g, float *m, float *v, const AdamwStep *s, float lwd) {
    float gi = g * s->gs;
    float mi = s->b1 * *m + (1.0f - s->b1) * gi;
    float vi = s->b2 * *v + (1.0f - s->b2) * gi * gi;
    *m = mi;
    *v = vi;
    return p - (s->step * (mi / (sqrtf(vi) * s->rs2 + s->eps)) + lwd * p);
}
// A backend's own copy of a run list (runs_create), laid out as its kernels want it (on cuda: in
// device memory with a per-tile index). A run list does not change between steps: create it once.
typedef struct OptRuns OptRuns;

struct Backend {
    const char *name;
    // memory (device buffers; on cpu, host memory)
    void *(*alloc)(size_t bytes); // zeroed
    void (*free)(void *p);
    // to_device: src may be reused once it returns; dst holds the bytes for every op called after it (on
    // cuda a small copy is enqueued, not waited for). to_host returns with the bytes, after every op before
    // it.
    void (*to_device)(void *dst, const void *src, size_t bytes);
    void (*to_host)(void *dst, const void *src, size_t bytes);
    void (*copy)(void *dst, const void *src, size_t bytes); // device to device
    void (*zero)(void *p, size_t bytes);
    void (*sync)(void);

    // The format of the experts' hidden rows (h1, h3, act and their gradients dh1, dh3: the `void *`
    // buffers of the fused expert ops below), an ops/numerics.h ElemFormat (hid_size: its bytes): FMT_F32
    // (cpu, cuda-fp32); FMT_BF16 (cuda), rounded to nearest even from the float32 the GEMM epilogue computes:
    // act is the down projection's bf16 operand either way, h1 and h3 are what the SwiGLU backward reads
    // (saved for it: the largest activations of a MoE layer), dh1 and dh3 the w1/w3 backward's operands. The
    // rows sent to the experts are in this format too: the dispatched inputs (the up-projection's operand,
    // saved for its weight gradients) and output gradients (the down-projection backward's operand), written
    // so by gather_rows_hid and gather_dot_scale; the rows coming back (the experts' outputs, the input
    // gradients) are float32. And the attention norm's output, the q/k/v projections' input (rmsnorm_fwd_hid,
    // matmul_*_multi), and the attention's q, k, v after RoPE (rope_fwd_hid, to_hid) and its output
    // (attention_fwd; o_proj's input through matmul_*_multi).
    ElemFormat hid;

    // FP8 training of the experts (--precision fp8): 0 off (every backend's own table); 1 (the cpu's fp8
    // table, backend_fp8) the grouped GEMMs compute every product by DeepSeek-V3's fine-grained recipe, on
    // the values they receive (float32 on cpu), with ops/cpu/cpu_fp8.h's quantisers and GEMM (its operand
    // layouts; their names below). Per group g, rows [off[g], off[g+1]) (n of them):
    //   grouped_matmul_fwd  out_g = gemm(tiles(inp_g), blocks(W_g))           inp 1x128 tiles along K,
    //                                                                         W (O,K) 128x128 blocks
    //   grouped_matmul_bwd  dinp_g (+)= gemm(tiles(dout_g), blocks(W_g)^T)    dout tiles along O; W's codes
    //                                                                         and block scales transposed
    //                       dw_g (+)= gemm(tiles_t(dout_g), tiles_t(inp_g))   (O,K) = dout^T inp: both tiled
    //                                                                         along the group's rows, the
    //                                                                         tiles from its first row
    // gemm: cpu_fp8_gemm (float32 result); tiles/blocks/tiles_t: cpu_fp8_quant_tiles/_blocks/_tiles_t of the
    // group's rows; (+)= the result added into the buffer (one float32 addition per element) or written, as
    // the flags say (GM_DW_WRITE: a group without rows writes zeros, and quantises nothing; GM_DW_BF16: each
    // group's float32 result rounded to nearest even into its packed bf16 block). The quantisation is bit for
    // bit on any backend; a GPU GEMM equals gemm up to the order and precision of the sum inside one K-tile
    // (cpu_fp8.h). The fused expert ops are their plain compositions (ops/plain.h, the same floats): the
    // routed experts' three GEMMs and the shared expert's (it runs through the same ops) in forward,
    // activation- and weight-gradient passes; the SwiGLU, router, combine, norms, attention and LM head stay
    // as they are. A scale group (tile or block) holding a NaN or an infinity has no scale (cpu_fp8.h): the
    // ops count them. fp8_site(layer) names the model layer whose expert ops follow (the MoE layer calls it
    // before its forward and its backward); fp8_nonfinite returns the groups counted since its last call (and
    // resets the count), with the first one's layer and tensor (FP8T_*: fp8_tensor_name): the step reads it
    // once. fp8_amax(k, rows): each (layer, tensor)'s largest scale exponent (numerics.h fp8_scale_exp: log2
    // of its amax / 448, rounded up) over its finite groups quantised since the last call, into k[(layer + 1)
    // FP8T_N + tensor] for layers -1
    // .. rows - 2 (FP8_AMAX_NONE: none), then starts again. NULL where fp8 is 0.
    // fp8_dense (the table of backend_fp8_dense, --fp8-dense; fp8 is 1 too): the attention projections'
    // products as well (matmul_fwd_multi, matmul_bwd_multi: every product of the one input, GQA's q/k/v and
    // o_proj and latent attention's), each as grouped_matmul_fwd / _bwd with one group of N rows
    // (FP8T_AX/AW/AD); their "same bits as n matmul_fwd / matmul_bwd calls" then reads "as n such products".
    // The LM head, router, shared-expert gate, MTP projection and biases (matmul_fwd / matmul_bwd) stay
    // float32 / bf16. The block names its layer (fp8_site) before its attention too.
    int fp8, fp8_dense;
    void (*fp8_site)(int layer);
    int64_t (*fp8_nonfinite)(int *layer, int *tensor);
    void (*fp8_amax)(int *k, int rows);
    // FP8 rows for the MoE dispatch (--fp8-dispatch: moe.h; NULL where fp8 is 0). rows (n, d) in the hidden
    // format; a packed row is ops/cpu/cpu_fp8.h's (fp8_row_bytes(d) bytes: the 1x128 tiles' e4m3 codes, then
    // their scale exponents), bit for bit on every backend. fp8_rows_round: each row replaced by its tiles'
    // FP8 values (pack then unpack, in place); fp8_rows_pack / fp8_rows_unpack: rows -> packed (n *
    // fp8_row_bytes(d) bytes) and back. A tile holding a NaN or an infinity comes back NaN (the experts'
    // quantiser then counts it as their input's).
    void (*fp8_rows_round)(void *rows, int n, int d);
    void (*fp8_rows_pack)(void *packed, const void *rows, int n, int d);
    void (*fp8_rows_unpack)(void *rows, const void *packed, int n, int d);
    // fp8_save 1 (--fp8-save: moe.h): the table's grouped_swiglu_bwd takes act NULL (computed from h1, h3
    // as the forward's epilogue computes it), and it has the FP8 rows above. 0 elsewhere (cuda's, so far).
    int fp8_save;
    // --fp8-weight-cache: on 1 (the default) the table keeps each expert weight's FP8 codes between the ops
    // that read them (once per version of the weights), 0 quantises them at every use and keeps none; the
    // same bits either way. NULL where a table keeps none (the cpu's quantises at every use).
    void (*fp8_keep_weights)(int on);

    // A bf16 copy of the weights for the bf16 GEMMs (backend "cuda"; a no-op elsewhere). bf16_shadow
    // (re)converts [p, p+n) and keeps the copy: a GEMM whose weight lies inside it then reads the
    // copy instead of converting the weight on every call; adamw_runs on p keeps it current. Any
    // other write into the range through this backend (to_device, copy, zero, free) drops it (the
    // GEMMs convert again), and writes it cannot see (device collectives) must be followed by
    // bf16_shadow again. p = NULL drops it. Results are the same with or without it (bit for bit).
    void (*bf16_shadow)(const float *p, size_t n);
    // The parameter buffer of the bf16 policy (every weight a bf16 value: OPT_BF16_NEAREST/STOCHASTIC) with
    // holes (at least one): n floats, zeroed, registered as bf16_shadow(p, n) registers a buffer, whose
    // element ranges [hole[2i], hole[2i+1]) (ascending, disjoint; the weights only the GEMMs and
    // embedding_fwd read) keep their values in the bf16 copy alone. "cuda" leaves the float32 memory of the
    // whole pages inside the holes out (2 bytes a parameter instead of 6; a kernel reading a hole as float32
    // faults, or reads NaN at its edges); adamw_runs on p reads and writes those weights in the copy, to_host
    // widens them from it and to_device rounds them into it (to nearest even: exact for bf16 values),
    // bf16_shadow(p, n) refreshes the rest, free releases it. Any other write into a hole dies, as does a
    // GEMM weight across a hole's edge. One such buffer at a time. NULL where the backend keeps no bf16 copy
    // (cpu, cuda-fp32): use alloc.
    float *(*alloc_bf16_params)(size_t n, const size_t *hole, int nhole);
    // A buffer of n floats, zeroed, whose element ranges [hole[2i], hole[2i+1]) (ascending, disjoint; nhole
    // >= 0) are not there: the pages wholly inside a hole take no memory, and an op reading or writing one is
    // an error (the cpu's fault at once: their pages are mapped without access). What the holes' edge pages
    // hold is the buffer's. free releases it (on the cpu a mapping of its own, so that freeing it leaves
    // the C allocator's thresholds as they were). The bf16 policy's packed expert gradients keep only their
    // packed half this way (model_state.h model_share_grads). NULL where the backend has none (use alloc).
    float *(*alloc_holes)(size_t n, const size_t *hole, int nhole);

    // out (N,O) = inp (N,K) @ W(O,K)^T [+ out if accumulate]
    void (*matmul_fwd)(float *out, const float *inp, const float *w, int N, int K, int O, int accumulate);
    // dinp (N,K) = dout (N,O) @ W, written (flags 0) or added (GM_ACC_DINP); dw (O,K) += dout^T @ inp, or
    // written with GM_DW_WRITE. dinp or dw may be NULL.
    void (*matmul_bwd)(float *dinp, float *dw, const float *dout, const float *inp, const float *w, int N,
                       int K, int O, int flags);
    // Several products of one input (the q/k/v projections; n <= MM_MULTI): out[i] (N,O[i]) = inp @ W[i]^T,
    // overwritten; the same bits as n matmul_fwd calls in order on inp's values (flags 0; GM_OUT_HID: out in
    // the hidden format). inp is in the hidden format (written so by rmsnorm_fwd_hid; the GEMMs' operand).
    void (*matmul_fwd_multi)(int n, float *const *out, const void *inp, const float *const *w, int N, int K,
                             const int *O, int flags);
    // Their backward: for i = 0.. in order, dinp (N,K) = dout[i] @ W[i] (product 0 as `flags` say, the others
    // added) and dw[i] += dout[i]^T @ inp (each written with GM_DW_WRITE); the same bits as n matmul_bwd
    // calls in order (flags, then GM_ACC_DINP | (flags & GM_DW_WRITE); dinp and dw[i] not NULL) on inp's
    // values; inp in the hidden format.
    void (*matmul_bwd_multi)(int n, float *dinp, float *const *dw, const float *const *dout, const void *inp,
                             const float *const *w, int N, int K, const int *O, int flags);
    // Grouped over G groups: group g has rows [off[g], off[g+1]) of inp/out and weight w + g*O*K.
    // off is a HOST array of G+1 entries.
    void (*grouped_matmul_fwd)(float *out, const float *inp, const float *w, const int64_t *off, int G, int K,
                               int O);
    // Its backward: dinp_g = dout_g @ W_g, written (flags 0) or added (GM_ACC_DINP) into dinp;
    // dw_g += dout_g^T @ inp_g (a parameter gradient, summed over micro-batches), or with GM_DW_WRITE
    // written instead: every group's block of dw, zeros for a group without rows (the same bits as
    // adding into zeros; the first write of a step needs no zero fill before it). The groups partition
    // rows [off[0], off[G]), so without GM_ACC_DINP every row of dinp in that range is written (zeros
    // where O = 0) and no row outside it is touched. dinp or dw may be NULL.
    void (*grouped_matmul_bwd)(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                               const int64_t *off, int G, int K, int O, int flags);
    // The experts' up-projection with SwiGLU: h1 = inp W1^T and h3 = inp W3^T (grouped_matmul_fwd
    // each), then act = silu(h1) * h3 (swiglu_fwd) over the groups' rows (O columns). A backend may
    // read inp once and compute act in the GEMMs' epilogue (the same floats as swiglu_fwd).
    // inp, h1, h3, act in the hidden format (Backend.hid).
    void (*grouped_swiglu_fwd)(void *h1, void *h3, void *act, const void *inp, const float *w1,
                               const float *w3, const int64_t *off, int G, int K, int O);
    // The experts' down-projection: out = act W_g^T as grouped_matmul_fwd, act (rows, K) in the hidden
    // format. An FP8 table (Backend.fp8) may take act's FP8 operand from the grouped_swiglu_fwd that wrote
    // act last (the same act and groups, no op of the table between: the MoE layer calls the two in a row):
    // act must not change between them but through this backend's to_device, copy or zero (which drop it).
    void (*grouped_down_fwd)(float *out, const void *act, const float *w, const int64_t *off, int G, int K,
                             int O);
    // The down-projection's backward into the SwiGLU: dact = dout W_g (dout (rows, O), W (G, O, K)), never
    // stored; dw += dout^T act (may be NULL; written as grouped_matmul_bwd's with flags GM_DW_WRITE); dh1,
    // dh3 = swiglu_bwd(dact, h1, h3) written (not added) over the groups' rows (K columns). The same floats
    // as grouped_matmul_bwd(dact, dw, dout, act, w, ..., flags) then swiglu_bwd(dh1, dh3, dact, h1, h3, ., 0)
    // (in the hidden format: dact float32, each dh1, dh3 rounded from that float32 result once). dh1, dh3,
    // dout, act, h1, h3 in the hidden format. act NULL (a table with fp8_save): act = silu(h1) h3 computed
    // from the h1, h3 given (swiglu_fwd's floats, rounded to the hidden format).
    void (*grouped_swiglu_bwd)(void *dh1, void *dh3, float *dw, const void *dout, const void *act,
                               const void *h1, const void *h3, const float *w, const int64_t *off, int G,
                               int K, int O, int flags);
    // Their backward: dinp = douta Wa + doutb Wb, written or added as `flags` say (as grouped_matmul_bwd),
    // dwa += douta^T inp, dwb += doutb^T inp (or written: GM_DW_WRITE). The same sums as
    // grouped_matmul_bwd(dinp, dwa, douta, ..., flags) then (dinp, dwb, doutb, ..., GM_ACC_DINP | (flags &
    // GM_DW_WRITE)); a backend may sum both products in one pass (another order). Any of dinp, dwa, dwb may
    // be NULL. douta, doutb (dh1, dh3) and inp in the hidden format. An FP8 table may take douta's and
    // doutb's FP8 operands from the grouped_swiglu_bwd that wrote them just before (as grouped_down_fwd takes
    // act's, on the same terms).
    void (*grouped_matmul_bwd2)(float *dinp, float *dwa, float *dwb, const void *douta, const void *doutb,
                                const void *inp, const float *wa, const float *wb, const int64_t *off, int G,
                                int K, int O, int flags);

    // The dispatch plan (moe/router.h's order: by expert, then slot j, then token) in two steps
    // around the host's capacity decision, so that only counts cross to the host. plan_counts:
    // cnt (k,E) = the tokens that chose expert e in slot j; rank (N,k) = the place of assignment
    // (t,j) among those of its (j, e), in token order. idx (N,k) from router_topk.
    void (*plan_counts)(int32_t *cnt, int32_t *rank, const int32_t *idx, int N, int E, int k);
    // plan_rows: assignment (t,j) to expert e is kept iff rank < keep[j,e], at row first[j,e] + rank:
    // slot_row[t,j] = that row (-1 if dropped), row_tok[row] = t, row_scale[row] = w[t,j]. keep and
    // first are (k,E) device arrays; rows no kept assignment maps to are not written.
    void (*plan_rows)(int32_t *slot_row, int32_t *row_tok, float *row_scale, const int32_t *rank,
                      const int32_t *idx, const float *w, const int32_t *keep, const int32_t *first, int N,
                      int E, int k);

    // out (N,C) rows = table[tokens[i]] of a (V,C) table (a table in a hole of alloc_bf16_params's buffer
    // read from its bf16 copy: the same values); bwd: dtable[tokens[i]] += dout[i], in i's order. An id
    // outside [0, V) (vocab-parallel: another TP rank's row, model/vocab.h): a zero row, nothing added.
    void (*embedding_fwd)(float *out, const int32_t *tokens, const float *table, int N, int C, int V);
    void (*embedding_bwd)(float *dtable, const float *dout, const int32_t *tokens, int N, int C, int V);

    // out = inp * rstd * w, rstd (N) saved for backward
    void (*rmsnorm_fwd)(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
    // The same with out in the hidden format (Backend.hid): each value rounded once (the q/k/v projections'
    // input).
    void (*rmsnorm_fwd_hid)(void *out, float *rstd, const float *inp, const float *w, int N, int C,
                            float eps);
    // The residual add before a norm in one pass: x += res (N, C), then rmsnorm_fwd(out, rstd, x, w, ...);
    // the same bits as axpy(x, res, 1, N C) then rmsnorm_fwd (a backend may read x once).
    void (*add_rmsnorm_fwd)(float *x, float *out, float *rstd, const float *res, const float *w, int N, int C,
                            float eps);
    void (*rmsnorm_bwd)(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                        const float *rstd, int N, int C);
    // RMSNorm over rows whose Ctot columns lie on several ranks, each holding C of them (OLMoE's
    // full-width QK-norm under tensor parallelism). The row sums are taken in parts, the caller adds
    // the parts over the ranks (an all-reduce), then each rank applies the whole sum to its columns.
    // rmsnorm_part: part (N, double; overwritten) [i] = sum over c < C of a[i,c] * (w ? w[c] : 1) *
    // b[i,c], the products and the sum in double: the forward's sum of squares (a = b = inp, w NULL)
    // or the backward's dot (a = dout, w, b = inp).
    void (*rmsnorm_part)(double *part, const float *a, const float *w, const float *b, int N, int C);
    // Forward given the rows' whole sums of squares ss (N, double): rstd = 1/sqrt(ss/Ctot + eps),
    // out = inp * rstd * w over this rank's C columns.
    void (*rmsnorm_fwd_part)(float *out, float *rstd, const float *inp, const float *w, const double *ss,
                             int N, int C, int Ctot, float eps);
    // Backward given the rows' whole dots dot (N, double) = sum over all Ctot columns of dout*w*inp:
    // dinp += rstd * dout * w - inp * rstd^3 * dot / Ctot; dw (C; may be NULL) += sum over the rows of
    // dout * inp * rstd. With C = Ctot (one rank's part is the whole sum) the three give rmsnorm_fwd /
    // rmsnorm_bwd's bits: the same sums in the same order, the same float operations.
    void (*rmsnorm_bwd_part)(float *dinp, float *dw, const float *dout, const float *inp, const float *w,
                             const float *rstd, const double *dot, int N, int C, int Ctot);

    // In place on x (B*T, nh, hd): HF rotate_half RoPE at positions 0..T-1 of each sequence.
    // bwd applies the inverse rotation to the gradient in place.
    void (*rope_fwd)(float *x, int B, int T, int nh, int hd, float theta);
    void (*rope_bwd)(float *dx, int B, int T, int nh, int hd, float theta);
    // The same over the rows t in [t0, t1) of B sequences: x (B*(t1-t0), nh, hd), row i = b*(t1-t0)
    // + (t - t0) at position t (0 <= t0 < t1); inverse 1 = rope_bwd's rotation. Each row is the same
    // bits as in rope_fwd / rope_bwd over [0, T) (the KV-cached sampler rotates one position at a time).
    void (*rope_rows)(float *x, int B, int t0, int t1, int nh, int hd, float theta, int inverse);
    // Into the hidden format (Backend.hid): out = rope_fwd's values of inp, each rounded once (the
    // attention's q and k, kept for its backward so). inp float32 (from_hid 0; not changed) or in the hidden
    // format (from_hid 1: its values widened; out may be inp).
    void (*rope_fwd_hid)(void *out, const void *inp, int from_hid, int B, int T, int nh, int hd, float theta);
    // n float32 values into the hidden format, each rounded once to nearest even (a copy where it is f32).
    void (*to_hid)(void *out, const float *inp, size_t n);
    // In place into GM_DOUT_HID's layout (row i's C values in the hidden format from byte 4 C i, where its
    // float32 values were; nothing changes where the format is float32): rope_bwd_hid, rope_bwd's values of
    // the rows (B*T, nh, hd); to_hid_rows, the N rows of C values as they are. Each value rounded once: the
    // bits of rope_bwd, then the bf16 GEMMs' own rounding of a float32 dout (gqa's backward: one pass over dq
    // and dk where there were two).
    void (*rope_bwd_hid)(float *dx, int B, int T, int nh, int hd, float theta);
    void (*to_hid_rows)(float *x, int N, int C);
    // RoPE in place on strided rows (multi-head latent attention's rope parts: the last qk_rope_head_dim of
    // each query head, the key rope shared by the heads): element j < hd of head h of row i at
    // x[(i*nh + h)*ld + j], row i (of B*(t1-t0)) at position t0 + i % (t1 - t0); pair j (rotate_half's (j, j
    // + hd/2), or (2j, 2j + 1) with r.interleave) rotated by the angle pos * f_j (RopeYarn, computed in
    // double as rope_fwd's), each result times r.scale.
    // adjoint 1: the transpose (the backward of the gradient in place: the inverse rotation, times scale).
    // With r.factor <= 1 and scale 1, rows of ld = hd are rope_rows' bits.
    void (*rope_yarn)(float *x, int B, int t0, int t1, int nh, int hd, int ld, RopeYarn r, int adjoint);
    // dst = alpha * src (acc 0) or dst += alpha * src (acc 1) over the elements of s (Stride3), each of
    // dst and src float32 (hid 0) or in the hidden format (hid 1: a result rounded once to nearest even,
    // a source widened exactly); acc needs a float32 dst. For each (i, c) the j run in order (d1 = 0 with
    // acc: the sum over j in that order). The product alpha * src is one float operation (alpha = 1: the
    // value itself).
    void (*copy_strided)(void *dst, int dst_hid, const void *src, int src_hid, Stride3 s, float alpha,
                         int acc);

    // Dropout in place on x, the rows t in [t0, t1) of B sequences of length T in (b, t) order (row i =
    // b*(t1-t0) + (t - t0)) of C features: element (g, c) of global token g = row0 + b*T + t is zeroed
    // with probability p, else scaled by 1/(1-p). The mask is a pure function of (seed, g, c)
    // (dropout_keep below: a counter-based hash, no RNG state), so it is the same on any mesh and for any
    // split of the rows. Backward applies the same call to the gradient. 0 <= p < 1.
    void (*dropout)(float *x, int B, int T, int t0, int t1, int C, float p, uint64_t seed, int64_t row0);

    // Causal GQA attention. q (B*T, H, hd), k/v (B*T, KV, hd) in the hidden format (Backend.hid: written so
    // by rope_fwd_hid and to_hid; the tensor cores' operands as they are), out (B*T, H, hd) too (each value
    // the float32 result rounded once: o_proj's operand as it is; the backward's D = rowsum(dout * out) from
    // it). lse (B, H, T): per-row log-sum-exp of the scaled scores, saved for backward. The query rows t in
    // [t0, t1) of every sequence only (0 <= t0 < t1 <= T; AMPipe's sequence chunks): fwd writes those rows of
    // out and lse (the others untouched) and reads keys/values 0..t1-1; each row is the same bits as in the
    // call over [0, T). bwd adds those rows' share: dq rows [t0, t1) and dk/dv rows 0..t1-1 (+=; over chunks
    // the same sums as one call, to round-off: the order of the additions differs). bwd reads out/lse/dout
    // rows [t0, t1) only. bwd's flags (ATT_ADD_* below): without ATT_ADD_DQ the dq rows are written instead
    // of added into, without ATT_ADD_DKV the dk/dv rows 0..t1-1 (the bits of adding into zeros).
    void (*attention_fwd)(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                          int H, int KV, int hd, int t0, int t1);
    void (*attention_bwd)(float *dq, float *dk, float *dv, const float *dout, const void *out,
                          const float *lse, const void *q, const void *k, const void *v, int B, int T, int H,
                          int KV, int hd, int t0, int t1, int flags);
    // Latent attention's values (mla.c pads them to the qk width): attention_fwd/bwd's contract and layouts
    // (rows hd wide) on inputs whose v and dout are zeros in the columns hv..hd-1 of every head (0 < hv <=
    // hd): out's columns there are written as zeros, dv's too without ATT_ADD_DKV (nothing added with it),
    // as attention_fwd/bwd compute them on such inputs. A backend may leave those columns out of its
    // products ("cuda": the wgmma kernels at hd 192, hv 128; other shapes and GPUs its attention_fwd/bwd).
    // Optional: NULL where a backend has none (the callers then use attention_fwd/bwd: the same function).
    void (*attention_fwd_v)(void *out, float *lse, const void *q, const void *k, const void *v, int B, int T,
                            int H, int KV, int hd, int hv, int t0, int t1);
    void (*attention_bwd_v)(float *dq, float *dk, float *dv, const float *dout, const void *out,
                            const float *lse, const void *q, const void *k, const void *v, int B, int T,
                            int H, int KV, int hd, int hv, int t0, int t1, int flags);

    // The same with dropout on the attention probabilities (training; HF Mixtral's attention_dropout):
    // out = (P * Z) V, Z[row, u] = 0 with probability p, else 1/(1-p), for query row t of sequence b of
    // head h (this rank's; global head h0 + h) and key u: kept iff dropout_keep(dropout_hash(seed, -1 -
    // (h0 + h), 0), row0 + b*T + t, u, .) (a function of the global token, head and key: the same on any
    // mesh). lse stays the undropped softmax's; bwd uses the same mask. p = 0 gives attention_fwd/bwd's bits.
    // Optional: NULL where a backend has none (the trainer then refuses attention dropout). cpu; cuda-fp32 in
    // its float32 attention kernels; cuda in its tensor-core ones (head dims 32/64/128: P and dS in bf16 as
    // without dropout), else in the float32 ones.
    void (*attention_drop_fwd)(void *out, float *lse, const void *q, const void *k, const void *v, int B,
                               int T, int H, int KV, int hd, int t0, int t1, float p, uint64_t seed,
                               int64_t row0, int h0);
    void (*attention_drop_bwd)(float *dq, float *dk, float *dv, const float *dout, const void *out,
                               const float *lse, const void *q, const void *k, const void *v, int B, int T,
                               int H, int KV, int hd, int t0, int t1, float p, uint64_t seed, int64_t row0,
                               int h0, int flags);

    // out = silu(h1) * h3, elementwise over n; bwd writes (accumulate 0) or adds (accumulate 1) the
    // gradients into dh1, dh3 (all n elements of both).
    void (*swiglu_fwd)(float *out, const float *h1, const float *h3, size_t n);
    void (*swiglu_bwd)(float *dh1, float *dh3, const float *dout, const float *h1, const float *h3, size_t n,
                       int accumulate);

    // out[i] = inp[idx[i]] (rows of C); bwd: dinp[idx[i]] += dout[i]
    void (*gather_rows)(float *out, const float *inp, const int32_t *idx, int n, int C);
    // The same into rows of the hidden format (Backend.hid): inp float32 (from_hid 0: each value rounded to
    // the format, nearest even) or in the hidden format already (from_hid 1: copied).
    void (*gather_rows_hid)(void *out, const void *inp, int from_hid, const int32_t *idx, int n, int C);
    // The MoE combine / un-permute as a gather (deterministic, one pass, no atomics): for each of N
    // output rows t, S = (accumulate ? out[t] : 0) + sum over j = 0..k-1, in that order, of
    // (w ? w[t*k+j] : 1) * rows[slot_row[t*k+j]], skipping slot_row < 0 (dropped slots); rows of C;
    // out[t] = S, or with res (N,C rows that do not overlap out) res[t] + S: one more rounding, the bits of
    // an add after the combine (the residual add joined to it: block.c). slot_row and w are (N,k) device
    // arrays; a row of `rows` may be referenced by several t.
    void (*combine_rows)(float *out, const float *res, const float *rows, const int32_t *slot_row,
                         const float *w, int N, int k, int C, int accumulate);
    // The MoE router over N rows of E logits (E <= 1024 on cuda) under rule r (RouteRule): probs (N,E) =
    // the scores, softmax(logits) (or with r.sigmoid each sigmoid(logit)), lse (N) = logsumexp (the sum of
    // exponentials in double); idx/w (N,k): the k experts of highest score, descending (ties: the lower
    // expert first), w = their scores, renormalised to sum 1 when r.renorm, times r.scale; sums (E+1,
    // double): sum over the rows of probs[:,e] (sigmoid: of the scores over their row's sum, in double)
    // (e < E) and of lse^2 (e = E), each in a fixed order (deterministic; the cpu sums rows in order). bias
    // (E, device; NULL: none): DeepSeek-V3's aux-free routing bias: the k chosen are those of highest
    // score + bias (ties: the lower expert), w their scores (as above): the bias changes the choice only.
    // r.n_group > 1: only the r.topk_group groups (E / n_group consecutive experts each) whose two best
    // (biased) scores sum highest (ties: the lower group) are chosen from (DeepSeek-V3's group-limited
    // routing; the two added in descending order).
    void (*router_topk)(float *probs, float *lse, int32_t *idx, float *w, double *sums, const float *logits,
                        const float *bias, int N, int E, RouteRule r);
    // Its backward: dlogits (N,E) = d/dlogits of sum_{t,j} dw[t,j] w[t,j] + sum_{t,e} aux_dp[e] q[t,e]
    // + z_dl/2 sum_t lse_t^2, where q = probs (sigmoid: each row's scores over their sum) and dw[t,j] =
    // rowdot[slot_row[t,j]] (0 where slot_row < 0): the gradient reaching each combine weight, read through
    // the dispatch plan. aux_dp (E) is a device array; with r.sigmoid z_dl must be 0 (no z term).
    // OVERWRITES dlogits.
    void (*router_bwd)(float *dlogits, const float *rowdot, const int32_t *slot_row, const float *probs,
                       const float *lse, const int32_t *idx, const float *w, const float *aux_dp, float z_dl,
                       int N, int E, RouteRule r);
    // The MoE backward's combine in one pass, over n rows of C: g = inp[idx[i]]; dot[i] = <g, b[i]>
    // (the products and their sum in double, then rounded to float); out[i] = scale[i] * g (one float
    // product per element), float32 (hid 0) or rounded to the hidden format (hid 1).
    void (*gather_dot_scale)(void *out, float *dot, const float *inp, const int32_t *idx, const float *b,
                             const float *scale, int n, int C, int hid);

    // Cross-entropy over V: losses (N) = logsumexp(logits) - logits[target].
    // Then logits is OVERWRITTEN with dlogits = (softmax - onehot) * dloss (dloss per row, same for all) in
    // the hidden format (Backend.hid): each float32 value rounded once to it in place, row i's V values from
    // where its float32 row starts (matmul_bwd's GM_DOUT_HID reads that layout; the LM head's backward then
    // needs no converted copy of them). In a float32 hidden format the dlogits are the float32 rows.
    void (*cross_entropy_fwd_bwd)(float *losses, float *logits, const int32_t *targets, int N, int V,
                                  float dloss);
    void (*cross_entropy_fwd)(float *losses, const float *logits, const int32_t *targets, int N, int V);
    // The same over n ranks' column blocks of the logits (vocab-parallel: model/vocab.h). ce_part: part (N,3)
    // doubles = each row's largest logit m over its V columns, the sum s of exp(x - m) over them, its
    // target's logit (0 where targets[i] is outside [0, V): another block's). ce_finish, from the n parts in
    // block order (n,N,3): M = the largest m, S = sum_r s_r exp(m_r - M) (double), losses = (M + log S,
    // rounded once as cross_entropy_fwd's) - the targets' logits summed, and with dloss != 0 the logits
    // OVERWRITTEN as cross_entropy_fwd_bwd does (the onehot where targets[i] is in [0, V) only). n = 1:
    // cross_entropy_fwd(_bwd)'s bits (cuda: its one-block-a-row kernel's, not the register kernel's it takes
    // for float4 rows of 16385..32768 values); n > 1: theirs but for the sums' order in S.
    void (*ce_part)(double *part, const float *logits, const int32_t *targets, int N, int V);
    void (*ce_finish)(float *losses, float *logits, const double *parts, const int32_t *targets, int N, int V,
                      int n, float dloss);

    // out = a * b elementwise (out may alias a)
    void (*mul)(float *out, const float *a, const float *b, size_t n);
    // out = 1 / (1 + exp(-inp)) elementwise (out may alias inp); bwd WRITES dinp = dout * out * (1 - out)
    // from the forward's output (Qwen2-MoE's shared-expert gate)
    void (*sigmoid_fwd)(float *out, const float *inp, size_t n);
    void (*sigmoid_bwd)(float *dinp, const float *dout, const float *out, size_t n);
    // y += a * x
    void (*axpy)(float *y, const float *x, float a, size_t n);
    // out = a + b elementwise (out may alias a or b): the same bits as copy(out, a) then axpy(out, b, 1, n)
    void (*add)(float *out, const float *a, const float *b, size_t n);

    // The optimizer step over a run list (one launch per op): the sum of squares of the gradients
    // and AdamW. runs_create copies `n` host runs (runs of n = 0 allowed); runs_free releases the copy.
    OptRuns *(*runs_create)(const OptRun *runs, int n);
    void (*runs_free)(OptRuns *r);
    // out (HOST, ncls doubles; overwritten) [c] = sum over the runs of class c of sum x[off..off+n)^2
    // (each element as its run's gbf reads it: optrun_g), in double. The cpu sums each run in chunks of
    // 2^14 elements (each in order, then the chunks' sums in order) and adds the runs in list order; other
    // backends sum in a fixed order of their own (same inputs, same bits), with one device-to-host copy per
    // call.
    void (*sumsq_runs)(double *out, int ncls, const float *x, const OptRuns *r);
    // The gradient ledger (GM_DW_SUMSQ): returns the blocks written with it since the last call and, where
    // sum is not NULL, writes their sum of squares (HOST; a double sum in a fixed order of the backend's: the
    // cpu sums each block as sumsq_runs sums a run of it and adds the blocks in ascending address order, so
    // its sum over a tensor list's blocks is sumsq_runs' bits over the same tensors' runs in that order; a
    // GPU sums its kernels' partial sums in the order written: one device-to-host copy); empties the ledger.
    // NULL where the backend keeps none: GM_DW_SUMSQ must not be passed then.
    int (*dw_sumsq_take)(double *sum);
    // AdamW on every run: p + off, g + off, m + moff, v + moff, n elements; decoupled weight decay wd
    // where decay is set, else 0; bias-corrected at step t (1-based). Each element is adamw_f32 above with
    // adamw_step(gscale, lr, b1, b2, eps, wd, t, prec, seed) (g is read only, as optrun_g reads it).
    // prec (OPT_* above): OPT_MIXED, m and v are float32; OPT_BF16_*: they are bf16 (uint16_t), read to
    // float32, stored rounded to nearest even, and each new weight is rounded to bf16 (bf16_round_weight
    // with the element's global index, optrun_gidx); OPT_BF16_MOMENTS: not. The float32 arithmetic is the
    // same in every policy, so every backend gives the cpu's bits.
    void (*adamw_runs)(float *p, const float *g, void *m, void *v, const OptRuns *r, float gscale, float lr,
                       float b1, float b2, float eps, float wd, int t, int prec, uint64_t seed);
};

// The bytes of one element of the backend's hidden format (Backend.hid), and element i of a buffer in it: the
// experts' h1, h3, act, dh1, dh3, the rows sent to them, the attention's bf16 operands.
static inline size_t hid_size(const Backend *be) { return fmt_size(be->hid); }
static inline void *hid_at(const Backend *be, void *p, size_t i) { return (char *)p + i * hid_size(be); }

// The dropout mask: element (g, c) is kept iff the top 24 bits of the hash of (seed, g, c) are >= p * 2^24
// (the threshold rounded to nearest). A splitmix64-style mix: every backend computes the same bits.
static inline MOE_HD uint64_t dropout_hash(uint64_t seed, int64_t g, int c) {
    uint64_t z =
        seed ^ ((uint64_t)g * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(uint32_t)c * 0xD1B54A32D192ED03ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static inline MOE_HD uint32_t dropout_threshold(float p) { return (uint32_t)((double)p * 16777216.0 + 0.5); }
static inline MOE_HD int dropout_keep(uint64_t seed, int64_t g, int c, uint32_t thr) {
    return (uint32_t)(dropout_hash(seed, g, c) >> 40) >= thr;
}

const Backend *backend_cpu(void);
// The FP8 variant of a backend (Backend.fp8 = 1; --precision fp8): the cpu's, whose grouped GEMMs are the
// recipe above over ops/cpu/cpu_fp8.c; cuda's and cuda-fp32's (backend_cuda_fp8), the same recipe on the
// GPU (the quantisers equal the cpu's bit for bit; the GEMMs equal cpu_fp8_gemm up to the order of the sum
// inside one 128-deep K-tile, or bit for bit with MOE_FP8_GEMM=ref). A backend that is fp8 already is its
// own.
const Backend *backend_fp8(const Backend *be);
// backend_fp8(be) with the attention projections in FP8 too (Backend.fp8_dense; --fp8-dense): the cpu's (the
// reference), cuda's and cuda-fp32's.
const Backend *backend_fp8_dense(const Backend *be);
// "cpu", "cuda", "cuda-fp32", or "" / "auto" (cuda when a GPU is present, else cpu). Dies naming
// the problem when the named backend cannot run here.
const Backend *backend_by_name(const char *name);
// A Backend timing every op of `inner` (synchronised per op) for MOE_PROFILE=1; the report gives
// milliseconds per step by kernel class.
const Backend *backend_profiled(const Backend *inner);
void backend_profile_reset(void);
void backend_profile_report(FILE *f, int steps);
// The CUDA backends (src/ops/cuda/, float32 buffers on the first GPU; parameters, activations,
// gradients and optimizer state are float32 in both, but for "cuda"'s bf16 expert rows):
//   backend_cuda()      "cuda": GEMMs on tensor cores with bf16 operands and fp32 accumulation
//                       (each float32 operand rounded to bf16, round to nearest even, into scratch
//                       the backend owns; outputs and *_bwd accumulation stay float32). Every
//                       grouped_matmul; matmul only when O > MOE_GEMM_FP32_MAX_O: narrower ones
//                       (the router, O = E) are memory-bound anyway and stay float32. The experts'
//                       hidden rows and the rows sent to them are bf16 (Backend.hid FMT_BF16): the fused
//                       expert ops write and read them so, without conversion passes.
//   backend_cuda_fp32() "cuda-fp32": every op in float32 (cuBLAS SGEMM without TF32), matching the
//                       cpu reference to float32 rounding.
// The other ops are the same float32 kernels in both. backend_cuda*() die with a clear message
// when no GPU is usable; check backend_cuda_available() first: it returns 0 when the build has no
// CUDA (MOE_CUDA=OFF) or no GPU is visible, and never dies.
#define MOE_GEMM_FP32_MAX_O 64
const Backend *backend_cuda(void);
const Backend *backend_cuda_fp32(void);
// The FP8 tables over "cuda" (fp32 0: bf16 hidden rows) and "cuda-fp32" (1): ops.h Backend.fp8's recipe
// (src/ops/cuda/cuda_fp8_ops.cu); dense 1: with the attention projections' products too (Backend.fp8_dense).
// Die as backend_cuda() does.
const Backend *backend_cuda_fp8(int fp32, int dense);
int backend_cuda_available(void);
// The GPU this process uses is local_rank % (visible GPUs), 0 until this is called: the comm layer calls it
// with the process's node-local rank when the world starts (parallel/comm_world.c), before any cuda
// backend is made. Ignored once the cuda backend exists, and in builds without CUDA.
void backend_cuda_set_rank(int local_rank);
// The GPUs this process sees (0 without CUDA or a GPU) and, once the cuda backend exists, its GPU's free
// and total bytes (cudaMemGetInfo; 0 before or without one).
int backend_cuda_gpus(size_t *free_bytes, size_t *total_bytes);
// The name of the GPU the cuda backend uses (cudaDeviceProp.name, e.g. "NVIDIA H200") into name (n bytes,
// truncated): 1 once the cuda backend exists; 0 and "" before it, without CUDA or without a GPU.
int backend_cuda_device_name(char *name, size_t n);
// The fused expert ops as plain ops of a Backend (for backends with nothing to fuse): ops/plain.h.
// 1 when "cuda"'s grouped GEMMs (forward, dinp, dw, the fused SwiGLU ops) run our Hopper kernel
// (src/ops/cuda/cuda_grouped.cu: an sm_90 GPU, a build with sm_90a code, MOE_GROUPED_GEMM not
// 'cublas'), 0 when they go through cuBLAS. Where a group count or shape is outside what the kernel
// takes, that call uses cuBLAS anyway.
int backend_cuda_grouped_kernel(void);
// "cuda"'s attention backward at head dim 128 (Hopper): the bytes of the scratch that carries dS from
// the dk/dv kernel to the dq kernel (bf16, the causal triangle of 64 x 64 tiles of the queries [t0, t1)
// of each sequence and head): all of it where it fits in MOE_ATTN_DS_MB MiB (default 1024), else the
// tiles of one pass over some kv heads of one sequence (attention_ds_pass_heads of them, two at least; the
// kernels run once a pass), else those of one pass over a range of key tiles of two kv heads (one where KV
// is 1) of one sequence (the first range, attention_ds_range_end's from key tile 0, the largest; the kernels
// run once a range, dq continued range by range), or 0 where the dq kernel computes dS again instead: other
// head dims, where not one key tile of those pairs fits (0: always again), or where those ranges would run
// too few blocks to fill the GPU (backend.c says when). The way is decided at the
// most tiles any row range of T can take, so every chunk of rows of one call shape takes the same way. The
// backend and moe info both use it.
size_t attention_ds_bytes(int B, int T, int H, int KV, int hd, int t0, int t1);
// The kv heads of one sequence a pass of that scratch takes when `pair` bytes (one sequence, one kv head)
// each must fit in `budget`: as many as fit, at most KV, the passes as even as they can be; 0 where
// not one fits. (cuda_attention_mla.cu's scratch, of its own size, the same rule.)
int attention_ds_pass_heads(size_t pair, size_t budget, int KV);
// Of that scratch, for one query head: the tiles of the query rows [t0, t1) (64-row tiles from t0) and the
// key tiles [j0, j1) (64 keys each) that those rows see (causal: a tile above the diagonal is not kept).
size_t attention_ds_range_tiles(int t0, int t1, int j0, int j1);
// The end j1 of the key range from key tile j0 whose tiles (attention_ds_range_tiles) of `pairs` (sequence,
// kv head) pairs of rep query heads, 8 KiB each, fit in `budget` bytes: the largest, at most ceil(t1 / 64);
// j0 where not one key tile fits. Each range fills the budget, so the first (seen by the most rows) is the
// largest.
int attention_ds_range_end(int t0, int t1, int rep, int pairs, size_t budget, int j0);
// "cuda"'s latent attention backward on Hopper (cuda_attention_mla.cu, q/k head width hd): the bytes of its
// dS scratch over the queries [t0, t1) of B sequences, in passes of `heads` (sequence, kv head) pairs, or
// (heads 0) of as many as fit at the most tiles any row range of T can take (so every chunk of rows of one
// call shape takes the same way) in the smaller of MOE_ATTN_DS_MB and 8 bytes a q element; 0 where not one
// fits (the dq kernel computes dS again). *whole (may be NULL): 1 where one pass takes every pair; *hp (may
// be NULL): else the kv heads of one sequence a pass takes (attention_ds_pass_heads). The kernel and moe
// info both use it.
size_t attention_mla_ds_bytes(int B, int T, int H, int KV, int hd, int t0, int t1, int heads, int *whole,
                              int *hp);
// That cap in MiB, read from the environment once (a bad value dies naming it: the trainer asks at its
// start).
long long attention_ds_cap_mb(void);
