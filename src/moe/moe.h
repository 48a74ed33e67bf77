// moe.h — one MoE FFN layer on a Backend and a mesh: optional jitter, router, top-k, dispatch plan
// (capacity or dropless, with global drop decisions), token exchange to the expert owners (EP, ETP),
// grouped SwiGLU experts, weighted combine, [+ a shared expert, optionally sigmoid-gated]; and its
// backward. Its state and operands are moe/moe_types.h's.
// The input x (N,d) is the same on every TP rank; each TP rank routes its own slice of the N rows,
// so the stage group (TP x DP ranks) covers each token of the micro-batch exactly once, and the
// output is all-gathered over TP. Router statistics (aux, z, capacity) are global over the stage.
// Memory: what a layer's sizes fix is allocated by moe_layer_init / moe_scratch_init; the rows a
// forward routes grow its buffers (by a2a_rows, moe/a2a.h) and stay, so a training step after the first
// allocates nothing; where rows that were allocated grow again (routing less even than so far), the
// layer says so on stderr, one line naming the layer and the new size.
// FP8 dispatch (m->fp8_dispatch, --fp8-dispatch under an FP8 table): the rows bound for the routed experts
// become their 1x128 tiles' FP8 values in every layout: rounded in place where the exchange is local
// (Backend.fp8_rows_round), packed where it moves them (moe/exchange.h; unpacked on arrival: the same
// values), so the experts see the same values in one process and across EP ranks. Their forward GEMMs
// quantise them to the same values again (the FP8 recipe's forward unchanged, bit for bit); their weight
// gradients' transposed tiles are taken from the rounded values (DeepSeek-V3's recipe: the dispatch in FP8;
// the one change to the numerics). The shared expert's input, the backward's rows and the combine stay as
// they are. Must not hold: attention or the residual stream.
#pragma once
#include <stdint.h>
#include "core/config.h"
#include "moe/moe_types.h"
#include "ops/ops.h"

void moe_layer_init(MoeLayer *m, const Backend *be, const ModelConfig *c, int maxN, const MoeComms *cm);
// A dense layer instead (config.h dense_layers): the shared expert's path alone, one SwiGLU MLP of width
// c->dense_d_ff (MoeWeights sh_w1, sh_w3, sh_w2; no gate) over each TP rank's slice of the rows, the output
// all-gathered over TP. moe_forward / moe_backward run it (not the parts: moe_route, _start, _finish);
// its router statistics are zero (aux, z, counts), Ng the stage's tokens.
void moe_dense_init(MoeLayer *m, const Backend *be, const ModelConfig *c, int maxN, const MoeComms *cm);
void moe_layer_free(MoeLayer *m);
// One process's layer (its exchange local): carves now, from its arena, the rows its first training forward
// would (the dispatched rows for its Rmax, then the expert-side buffers at their largest), so that what the
// layer takes of a lent arena is known before any forward (model_share_grads); the forwards then grow
// nothing. A dense layer carves nothing here.
void moe_rows_carve(MoeLayer *m);
// Frees the buffers a forward grows (token rows, expert-side activations; the next forward grows
// them again): a layer whose forwards move to AMPipe chunks (their own states) drops its whole-batch
// ones. Not between a forward and its backward.
void moe_layer_trim(MoeLayer *m);
// Recomputation on (rc: the shared buffers) or off (NULL) for the next forwards; the layer's own rows
// are freed when it turns on. Not between a forward and its backward.
void moe_set_recompute(MoeLayer *m, MoeRecompute *rc);
// The backward's scratch for micro-batches of up to maxN tokens. On a backend with bf16 hidden rows (cuda;
// ops.h Backend.hid), unless the environment sets MOE_ACT_MEM_OLD=1, it is lean: the experts' input
// gradient dxg is written into the layer's expert outputs yg (dead once the combine's backward has read
// them: gather_dot_scale in moe_backward_start; the combine reads ys where the exchange is not local), the
// TP slice's dx (dxj) exists only where TP > 1, and, without an FP8 table (Backend.fp8), dh1 and dh3
// are written over the forward's h1 and h3 (the bf16 kernels read each h1, h3 element before they write
// that element of dh1, dh3: cuda_grouped.cu EPI_SWIGLU_BWD, cuda_nn.cu swiglu_bwd_k; the float32 path of
// ops/plain.h puts dact in dh1 first, so it never runs in place). The same values either way.
void moe_scratch_init(MoeScratch *s, const Backend *be, const ModelConfig *c, int maxN);
void moe_scratch_free(MoeScratch *s);
// MOE_ACT_MEM_OLD=1 in the environment (the scratch's own buffers, for an A/B of the lean scratch's memory):
// 1; unset or 0: 0; any other value dies with a message naming it.
int moe_act_mem_old(void);
// The buffers layer m's expert backward writes its SwiGLU gradients and input gradient into (the scratch's,
// or the layer's own where s is lean), from row 0 of the expert side.
void moe_bwd_rows(const MoeLayer *m, const MoeScratch *s, void **dh1, void **dh3, float **dxg);

// aux = E * sum_i f_i P_i per layer over the scope's tokens (micro-batch: the stage's tokens of this
// micro-batch; sequence: each sequence's, averaged over the micro-batch's sequences; global: f_i over the
// step's micro-batches so far, P_i over this one).
// y (N,d) = MoE(x), or res + MoE(x) where res (N,d rows that do not overlap y) is given: the residual add
// joined to the combine that writes y (TP 1, no shared expert; ops.h combine_rows), else one add after it,
// the same bits either way. noise_seed != 0 and c->jitter > 0: jitter, drawn per token from
// (noise_seed, row0 + row) so it does not depend on the mesh (row0: global index of x's row 0).
// With m->overlap = r > 1 and a non-local exchange, the exchange and the experts are pipelined over r
// chunks: the forward is the same bits as r = 1 (every row's GEMMs are the same), the weight
// gradients differ by round-off (each expert's reduction over its rows is split into r partial sums).
// Every rank of the EP/ETP groups must use the same r.
void moe_forward(MoeLayer *m, float *y, const float *res, const float *x, int N, const MoeWeights *w,
                 const ModelConfig *c, uint64_t noise_seed, int64_t row0);
// The forward in three parts, for a schedule that runs other work between them (AMPipe: the next
// sequence chunk's attention while this chunk's tokens travel): moe_route (jitter, router, top-k,
// the stage's statistics: counts, psum, aux, z), moe_start (the dispatch plan — capacity drops from
// `budget` (k,E), the kept slot-j assignments to e of my slice, when given, else decided over the
// stage as moe_forward does — the permute, and with m->early_dispatch the dispatch all-to-all
// started), moe_finish (the experts, the combine, y (N,d), with res as moe_forward's). x must stay untouched
// until moe_start, and the layer's exchange groups see every rank's calls in the same order.
void moe_route(MoeLayer *m, const float *x, int N, const MoeWeights *w, const ModelConfig *c,
               uint64_t noise_seed, int64_t row0);
void moe_start(MoeLayer *m, const MoeWeights *w, const ModelConfig *c, const int64_t *budget);
void moe_finish(MoeLayer *m, float *y, const float *res, const MoeWeights *w);
// Every stage rank's slot counts of the last moe_route, (S,k,E) in stage-rank order.
void moe_slot_counts(const MoeLayer *m, int64_t *out);
// The router statistics of n parts of one micro-batch (AMPipe's chunks, routed) added up into whole
// (counts, psum, Ng, aux, z, aux_f: as if routed at once — with --aux-scope global, whole's running
// step counts take the micro-batch once; dropped and the per-part values untouched),
// and the parts' loss coefficients set from it (moe_loss_from: aux_f and Nl), so that their backward
// differentiates the whole micro-batch's aux and z.
void moe_stats_merge(MoeLayer *const *part, int n, MoeLayer *whole);
void moe_loss_from(MoeLayer *part, const MoeLayer *whole);
// dx (N,d) = d/dx (written, whatever it held); grads += d/dweights (local shards; the router's is this rank's
// share). The loss this differentiates is <dy, y> + aux_scale * aux + z_scale * z of the last forward.
void moe_backward(MoeLayer *m, MoeScratch *s, float *dx, const float *dy, const float *x, const MoeWeights *w,
                  MoeGrads *g, const ModelConfig *c, float aux_scale, float z_scale);
// The same in two parts (AMPipe's backward: a chunk's dy travels while another chunk's attention
// backward runs): _start (the combine's backward into s, and with m->early_dispatch the dispatch of
// dy started), _finish (the experts, the way back, the router). Nothing may use s in between.
void moe_backward_start(MoeLayer *m, MoeScratch *s, const float *dy);
void moe_backward_finish(MoeLayer *m, MoeScratch *s, float *dx, const float *x, const MoeWeights *w,
                         MoeGrads *g, const ModelConfig *c, float aux_scale, float z_scale);
