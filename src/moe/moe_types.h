// moe_types.h — the MoE layer's state and operands (see moe/moe.h for what the layer does): its groups,
// weights and gradients, the saved state of a forward (MoeLayer), the backward scratch every layer shares
// (MoeScratch), the shared recomputation buffers. Both halves of the layer include it: moe.c (the
// forward/backward schedule) and moe_experts.c (the expert-side variants it calls), so that the calls run
// one way, moe.c -> moe_experts.c.
// Must not hold: functions of the layer (moe.h, moe_experts.h) beyond moe_dw_flags.
#pragma once
#include <stdint.h>
#include "core/config.h"
#include "moe/exchange.h"
#include "moe/router.h"
#include "ops/arena.h"
#include "ops/ops.h"
#include "parallel/comm.h"

typedef struct {
    const Comm *tp, *ep, *etp, *stage; // NULL = a group of one
    const Comm *epn, *epx; // the two-level all-to-all's groups (NULL: flat; exchange.h)
} MoeComms;

// The pipelined exchange (Tutel's overlap degree r): the rows each rank sends are split into r chunks
// (chunk i: rows [n*i/r, n*(i+1)/r) of each expert's block), and chunk i's expert GEMMs run while
// chunk i+1's dispatch all-to-all and chunk i-1's combine all-to-all are in flight.
#define MOE_MAX_OVERLAP 8

// Where each rank's expert slices are along f (ETP > 1), Tutel's switchable parallelism: `sharded`
// (tokens all-gathered over ETP, each rank computes its f slice for all of them, outputs
// reduce-scattered) or `gathered` (the layer's slices all-gathered into whole experts for the layer,
// each rank computes its own tokens, the weight gradients reduce-scattered back into the slices: no
// parameter moves between steps). The same model either way, to round-off (the f sums are split
// differently). Gathered runs the exchange unchunked (r = 1).
enum { MOE_SHARDED = 0, MOE_GATHERED = 1 };

typedef struct {
    // local blocks: w1 and w3 (El, fl, d), w2 (El, d, fl); El = E/EP experts, fl = f/ETP
    const float *router; // (E, d)
    const float *w1, *w3, *w2;
    // the shared expert (config n_shared_experts > 0): sh_w1, sh_w3 (fs, d), sh_w2 (d, fs); its gate (1, d)
    // when config shared_gate (else NULL). Replicated on every rank; each TP rank runs its token slice.
    const float *sh_w1, *sh_w3, *sh_w2, *sh_gate;
    const float
        *route_bias; // (E) balance aux-free: added to the probabilities for the top-k choice (else NULL)
} MoeWeights;
// fresh: w1, w3, w2 hold no gradient yet this step (not even zeros): the layer's first expert backward
// writes them (ops.h GM_DW_WRITE) and clears fresh; 0: it adds into them. packed: that write is in bf16
// (ops.h GM_DW_BF16: model_set_expert_grads OPTG_PACKED), and an accumulation into them dies. sumsq: a
// write that is the whole step's goes into the gradient ledger (ops.h GM_DW_SUMSQ: model_set_dw_sumsq).
typedef struct {
    float *router, *w1, *w3, *w2, *sh_w1, *sh_w3, *sh_w2, *sh_gate;
    int fresh, packed, sumsq;
} MoeGrads;
// The flags of the experts' weight-gradient writes into g (GM_DW_WRITE / GM_DW_BF16 while fresh, and
// GM_DW_SUMSQ where whole and g->sumsq), first: the first expert backward of the step into them (else an
// accumulation); whole: it writes all of the step's gradient (no chunk of it follows).
int moe_dw_flags(const MoeGrads *g, int first, int whole);

// Activation recomputation (--recompute moe): the experts' SwiGLU rows (h1, h3, act: the largest
// activations, 3 f values per routed token, in the backend's hidden format) are not kept per layer.
// Every layer's forward writes them into these shared buffers and its backward computes them again
// there from what it keeps (the expert input rows, the weights it used): the same kernels on the same
// operands, so the same bits as keeping them. Owned by the caller (one per model); a layer points at
// it (MoeLayer.rc). fp8 1 (--fp8-save, DeepSeek-V3's FP8 storage of the SwiGLU's inputs): a layer keeps its
// h1 and h3 instead as FP8 rows (MoeLayer.hq: 1x128 tiles, ops.h fp8_rows_pack), and its backward unpacks
// them into these buffers and computes act from them (grouped_swiglu_bwd with act NULL): no GEMM again,
// but the backward's SwiGLU rows are the FP8 values of the forward's (the forward unchanged).
typedef struct {
    const Backend *be;
    void *h1, *h3, *act;
    size_t cap;
    int fp8;
} MoeRecompute;

// Saved state of one layer's forward (one per layer: backward needs it).
typedef struct {
    const Backend *be;
    MoeComms cm;
    int layer; // the model's layer index (its reports name it; -1: none given)
    int maxN, d, fl, E, El, k;
    int sigmoid; // the router's scores are sigmoids (config route_sigmoid): statistics over them normalised
    int N, s0, Ns; // tokens of the last forward, my slice [s0, s0+Ns)
    int64_t row0; // the global index of the forward's row 0 (moe_forward's row0)
    // router side (host): copies of the router's device outputs, made by one copy per forward
    // into rt_h (the pointers below point into it, at offsets that depend on Ns): sums_h and the
    // slot counts always; idx_h, logits_h and probs_h only while host_router_out is set
    // (evaluation reads them; training does not: the plan is built on the backend)
    int host_router_out;
    float *logits_h, *probs_h; // (Ns,E) (Ns,E)
    int32_t *idx_h; // (Ns,k)
    double *sums_h; // (E+1) my rows' sums of probs[:,e] and of lse^2
    void *rt_h;
    int32_t *kf_h; // (2,k,E) keep and first of the plan (uploaded to kf_d)
    DispatchPlan plan; // over my slice: off, M and dropped only (the rows: plan_d)
    int64_t *cnt_all; // (S, k, E) + S token counts: every stage rank's slot counts
    // host scratch of a forward (and its backward), allocated by moe_layer_init: sizes fixed by E, k,
    // the stage, TP and maxN
    int64_t *mine_h; // (k E + 1) my slot counts and token count, for the stage's all-gather
    double *ps_h; // (E + 1) the stage's sums of the probabilities and of lse^2
    int64_t *slots_h, *bud_h, *kept_h; // (S, k, E), (k, E), (E): capacity budgets; kept rows per expert
    size_t *tp_cnt; // (2 TP) the TP all-gather's element counts and displacements
    float *noise_h; // (Ns, d) the jitter factors (with jitter)
    int64_t *counts; // (E) global assignments per expert (before drops)
    int64_t Ng; // global tokens of the micro-batch (over the stage)
    int64_t Nl; // tokens the aux and z losses average over: Ng, or with AMPipe
                // chunks the whole micro-batch's (moe_stats_merge)
    int64_t dropped; // global dropped assignments
    double aux, z; // this layer's global losses
    double *psum; // (E) global sum over tokens of the router probabilities
    double *aux_f; // (E) f_i in the aux gradient E * f_i / Ng (default counts_i / Ng)
    // router side (device)
    float *noise, *xj; // (Ns,d) jitter factors and jittered input (NULL without jitter)
    void *rt_d; // one block: sums, idx, w, logits, probs (copied to rt_h), lse
    float *logits, *probs, *lse; // (Ns,E) (Ns,E) (Ns)
    int32_t *idx; // (Ns,k) top-k experts
    double *sums; // (E+1)
    int32_t *cnt, *cnt_h; // (k,E) slot counts of my rows (plan_counts), and the host copy
    void *xs; // (Ns*k,d) my kept rows, in the hidden format (ops.h Backend.hid)
    float *ys; // (Ns*k,d) their expert outputs back (only when the exchange is not
               // local; allocated on first use)
    const float *ysp; // the expert outputs in my row order: ys, or yg when local
    int32_t *rowtok; // (Ns*k) token (in my slice) of each row        } one device block,
    int32_t *slotrow; // (Ns*k) row of assignment (t,j), or -1         } (plan_d)
    float *rowscale; // (Ns*k) combine weight of each row             } written by
    int32_t *rank; // (Ns*k) plan_counts' ranks                     } plan_rows each
    int32_t *kf_d; // (2,k,E) keep and first                        } forward
    void *plan_d; // that block
    float *wdev; // (Ns,k) combine weight of assignment (t,j) (the router's w, in rt_d)
    int Rmax; // Ns*k rows allocated on the token side
    float *yslice; // (Ns,d) my slice of the output (TP > 1)
    // the pipelined exchange: overlap is what the next forward uses (1 <= overlap <= MOE_MAX_OVERLAP,
    // a power of two; set by the caller), r what the last forward used (1 where the exchange is local:
    // nothing to overlap)
    int overlap, r;
    int mode, gathered; // MOE_SHARDED / MOE_GATHERED for the next forward; what the last one did
    const float *xin; // moe_route's input rows (my slice, jittered), for moe_start
    const float *xraw; // ... and un-jittered (the shared expert's input), for moe_finish
    const float *dyb; // moe_backward_start's dy rows (my slice), for _finish
    MoeWeights wu; // the experts the last forward used (whole ones when gathered)
    int chunk_part; // 1: an AMPipe chunk's state (per-sequence statistics: moe_stats_merge)
    int early_dispatch; // 1: moe_start / moe_backward_start leave an unchunked dispatch in
                        // flight (AMPipe)
    int started; // such a dispatch is in flight (until moe_finish / _backward_finish)
    int fp8_dispatch; // 1 (--fp8-dispatch; set by the caller): the experts' input rows FP8 values from
                      // the dispatch on, moved packed (moe.h)
    Exchange *xu; // the last forward's routes: &x, or &xe (gathered: EP only)
    int fu; // its expert width: fl, or f (gathered)
    Exchange xe; // the EP-only routes of the gathered mode
    float *wfull; // gathered: w1, w3 (El, f, d) and w2 (El, d, f) whole, for this layer
    float *wstage; // their all-gather landing (rank-major)
    int32_t *widx; // the gathers' row maps: w1/w3 (El f), w2 (El d ETP), and their inverses
    Exchange xc[MOE_MAX_OVERLAP]; // chunk i's routes (r > 1)
    int64_t cstart[MOE_MAX_OVERLAP + 1]; // chunk i's rows [cstart[i], cstart[i+1]) of the chunk-major order
    int64_t gstart[MOE_MAX_OVERLAP + 1]; // chunk i's expert-side rows in xg, h1, h3, act, yg
    int32_t *cidx, *icidx; // (M) chunk-major position -> my row, and back (device)
    int32_t *cidx_h; // (2 Rmax) their host form
    int64_t *kc_h; // (E) one chunk's kept rows per expert
    size_t *etp_cnt; // (ETP) gathered mode: the gradients' reduce-scatter counts
    void *xsc; // (M,d) my rows, chunk-major (hidden format)
    float *ysc; // (M,d) their outputs, chunk-major
    MoeRecompute *rc; // NULL: h1, h3, act kept per layer; else the shared ones, recomputed
    void *hq; // rc->fp8: h1's then h3's rows_cap FP8 rows (numerics.h fp8_row_bytes(fu) bytes each)
    size_t cap_q;
    Arena *arena; // NULL, or memory lent for the kept rows (xs, ys, xg, yg, h1, h3, act): the
                  // caller's (model.h model_share_grads), which resets it after moe_layer_trim
    // expert side (device, grown to the rows received)
    Exchange x;
    void *xg; // (Rg,d) the rows received (hidden format; only when the exchange is not local)
    float *yg; // (Rg,d) the experts' outputs
    void *h1, *h3, *act; // (Rg,fl) each, in the backend's hidden format (ops.h Backend.hid)
    const void *xgp; // the expert GEMMs' input rows: xg, or xs when local (hidden format)
    size_t cap_d, cap_f, cap_xg, cap_ys;
    size_t rows_cap; // rows the expert-side buffers hold (a2a_rows; kept by moe_layer_trim)
    int regrown; // 1: rows_cap grew again since the last report
    // the shared expert over my slice: y += [sigmoid(x w_gate)] * (silu(x W1^T) * (x W3^T)) W2^T; a dense
    // layer (moe_dense_init) is that MLP alone: y = (silu(x W1^T) * (x W3^T)) W2^T, its weights the sh_* ones
    int dense; // 1: a dense layer (no router, no experts; its statistics zero)
    int fs; // its width (n_shared_experts * shared_d_ff, or a dense layer's dense_d_ff; 0: none)
    void *sh_h1, *sh_h3, *sh_act; // (Ns,fs) each, in the hidden format (ops.h Backend.hid)
    void *sh_x; // (Ns,d) its input rows in the hidden format (as the routed experts')
    int64_t sh_off[2]; // {0, Ns}: the shared expert as one group of the fused expert ops
    float *sh_y, *sh_g; // (Ns,d) its output before the gate; (Ns) the gate, sigmoid applied
    int32_t *ident; // (Ns) 0, 1, 2, ...: the gate as a one-slot combine
    // aux scopes (config.h AuxScope). global: the step's running sums of this layer's counts and tokens
    // (the model's, shared by the layer's slots; zeroed at each step), f_i = their ratio at this forward.
    // sequence: seq_len T set by the caller; seq_f (S,E) each global sequence's counts / T, S sequences
    int aux_scope;
    int64_t *run_counts, *run_tokens;
    int seq_len, nseq;
    double *seq_f; // (nseq, E) host
    double *seq_st; // (nseq, 2E) host scratch: per-sequence counts and probability sums
    float *seq_dp; // (nseq + 2, E) device: the backward's per-segment aux coefficients
    float *seq_dp_h; // (nseq + 2, E) their host form
    int *seq_seg; // (nseq + 3) the backward's segments of my rows (one sequence each)
    int seq_cap;
} MoeLayer;

// Scratch shared by all layers' backward passes.
typedef struct {
    const Backend *be;
    void *dys; // device, token side, hidden format: to the experts
    float *dxs, *dxj, *dlogits, *rowdot; // device, token side (dxs: not local only; dxj: TP > 1)
    float *aux_dp; // device (E): d aux term / d probs[t,e]
    void *dyg; // device, expert side, hidden format (grown; not local)
    float *dxg; // device, expert side (grown)
    void *dh1, *dh3; // ... (Rg,fl), in the hidden format (ops.h)
    void *dysc; // device, token side chunk-major (r > 1), hidden format
    float *dxsc; // ... float32
    float *gfull, *gstage, *gslice; // gathered mode: whole-expert gradients, staging
    size_t cap_g;
    size_t cap_d, cap_f, cap_dyg, cap_dxs, cap_c;
    float *aux_dp_h; // host (E)
    void *sh_dy; // the shared expert's backward (N rows): dy (hidden format),
    float *sh_dg; // ... the gate's gradient
    void *sh_dh1, *sh_dh3; // ... (N,fs) in the hidden format
    // The lean scratch (moe.h moe_scratch_init; moe_bwd_rows names the buffers): lean_rows: dxg is the
    // layer's yg and dxj is allocated at its first use (TP > 1); lean_dh: dh1, dh3 (sh_dh1, sh_dh3) are
    // written over the layer's h1, h3 (sh_h1, sh_h3). maxN, d: dxj's rows and width.
    int lean_rows, lean_dh;
    int maxN, d;
} MoeScratch;
