// test_cost.c — the cost model (train/cost.h) against arithmetic done independently here:
//  - parameters: the count from the config equals the sum of the parameter table's tensor sizes
//    (model/params.h; less the aux-free routing bias, which has no gradient) for every preset and the
//    families' options; the active count equals the table less the routed experts k .. E-1;
//  - FLOPs per token: 6 x the matmul weights one token passes through (q, k, v, o, the router, k routed
//    experts, the shared experts, the LM head; not the embedding lookup or the norms) + the attention
//    term 6 x L x H x hd x T (Q K^T and P V, 2 H hd T/2 each in the forward at the causal mean of T/2
//    positions, 3 x for forward and backward), written out for the tiny preset at T 64;
//  - bytes sent per step on simple meshes of two ranks (TP, EP, ETP sharded and gathered, DP with ZeRO
//    1, a pipeline of two stages, interleaved), counted by hand;
//  - memory: a mesh of one rank holds what the whole model does in one process; one layer's activations,
//    counted by hand from the buffers the model allocates a layer (tiny);
//  - the FP8 table's kept weight codes (cuda_fp8_wcache.cu), counted by hand for the tiny preset (and with
//    --fp8-dense's projections, GQA's and latent attention's): the whole
//    model, two pipeline stages, two EP ranks, a shared expert (with and without the fused pair), a dense
//    layer, and weights off a multiple of 8 elements (not kept);
//  - dense layers (config dense_layers): the parameters and FLOPs of their MLP in place of the MoE layer's.
#include <string.h>
#include "model/params.h"
#include "train/cost.h"
#include "test_util.h"

static ModelConfig preset(const char *name) {
    ModelConfig c;
    if (config_preset(&c, name) != 0) {
        fprintf(stderr, "no preset %s\n", name);
        exit(1);
    }
    return c;
}

static void check_params(const ModelConfig *c, const char *what) {
    CostParams p;
    cost_params(&p, c);
    ParamTable t;
    params_build(&t, c);
    size_t sum = 0, unrouted = 0; // the table less the routing bias; less also experts k .. E-1
    double dense = 0, expert = 0;
    for (int i = 0; i < t.n; i++) {
        const ParamSpec *s = &t.p[i];
        *(s->expert >= 0 ? &expert : &dense) += (double)s->numel;
        if (s->role == PR_ROUTE_BIAS) continue;
        sum += s->numel;
        if (s->expert < c->top_k) unrouted += s->numel;
    }
    EXPECT(p.total == sum, "%s: %zu parameters, the table holds %zu", what, p.total, sum);
    EXPECT(p.active == unrouted, "%s: %zu active, the table's k experts: %zu", what, p.active, unrouted);
    EXPECT(p.tensors == t.n && p.dense == dense && p.expert == expert, "%s: %d tensors %g + %g vs %d %g + %g",
           what, p.tensors, p.dense, p.expert, t.n, dense, expert);
    params_free(&t);
}

static void check_flops(void) {
    ModelConfig c =
        preset("tiny"); // d 96, 2 layers, 4 heads (2 kv, head dim 24), 4 experts top-2, f 192, V 256
    EXPECT(c.d_model == 96 && c.n_layers == 2 && c.n_heads == 4 && c.n_kv_heads == 2 && c.head_dim == 24 &&
               c.d_ff == 192 && c.n_experts == 4 && c.top_k == 2 && c.vocab_size == 256,
           "the tiny preset changed: rewrite the numbers below");
    double q = 96.0 * 96, kv = 96.0 * 48, o = 96.0 * 96, router = 96.0 * 4, experts = 2 * 3 * 96.0 * 192;
    double weights = 2 * (q + 2 * kv + o + router + experts) + 256.0 * 96;
    double want = 6 * weights + 6 * 2 * 4 * 24 * 64.0;
    CostFlops f;
    double got = cost_flops(&f, &c, 64);
    EXPECT(got == want && f.train == want, "tiny at T 64: %.17g FLOPs per token, want %.17g", got, want);
    EXPECT(f.attn_proj == 2 * (q + 2 * kv + o) && f.router == 2 * router && f.experts == 2 * experts &&
               f.head == 2 * 256.0 * 96 && f.attn_scores == 2 * 4 * 24 * 64.0,
           "tiny: the forward's parts %g %g %g %g %g", f.attn_proj, f.attn_scores, f.router, f.experts,
           f.head);
    EXPECT(cost_flops(NULL, &c, 64) == want, "cost_flops without the parts");
    // a shared expert of width 64 adds its three matrices
    c.n_shared_experts = 1;
    c.shared_d_ff = 64;
    want += 6 * 2 * 3 * 96.0 * 64;
    EXPECT(cost_flops(NULL, &c, 64) == want, "tiny + a shared expert: %.17g, want %.17g",
           cost_flops(NULL, &c, 64), want);
    // layer 0 dense (an MLP of width 128): its router, routed and shared experts give way to the MLP
    config_set_dense(&c, 0);
    c.dense_d_ff = 128;
    want -= 6 * (router + experts + 3 * 96.0 * 64); // (one layer's: the sums above are over both layers)
    want += 6 * 3 * 96.0 * 128;
    EXPECT(cost_flops(NULL, &c, 64) == want, "tiny + a shared expert, layer 0 dense: %.17g, want %.17g",
           cost_flops(NULL, &c, 64), want);
    // two MTP modules: each its eh_proj (2d -> d), an MoE layer's weights (with the shared expert) and the LM
    // head again, and an attention term
    c.mtp_depth = 2;
    want += 2 *
        (6 * (2 * 96.0 * 96 + q + 2 * kv + o + router + experts + 3 * 96.0 * 64 + 256.0 * 96) +
         6 * 4 * 24 * 64.0);
    EXPECT(cost_flops(NULL, &c, 64) == want, "... + 2 MTP modules: %.17g, want %.17g",
           cost_flops(NULL, &c, 64), want);
}

// The default options at batch x seq tokens (the hand derivations' runs).
static TrainOptions run_of(int batch, int seq) {
    TrainOptions o;
    train_options_default(&o);
    o.batch = batch;
    o.seq_len = seq;
    return o;
}

// The mesh of world ranks with tp, ep, etp, pp for the tiny preset (n_layers L) at batch 16, T 64 (o's
// --vocab-parallel taken).
static const char *mesh_of(CostMesh *m, TrainOptions *o, int L, int world, int tp, int ep, int etp, int pp) {
    static ModelConfig c;
    c = preset("tiny");
    c.n_layers = L;
    MeshShape ms = {world, tp, 0, pp, ep, etp, 0, 0, o->vocab_parallel && tp > 1};
    const char *bad = mesh_shape_resolve(&ms, &c);
    EXPECT(bad == NULL, "mesh: %s", bad);
    return cost_mesh(m, &c, o, &ms);
}

static void expect_comm(const CostComm *a, double tp, double ep, double etp, double dp, double pp,
                        const char *what) {
    EXPECT(
        a->tp == tp && a->ep == ep && a->etp == etp && a->dp == dp && a->pp == pp &&
            a->total == tp + ep + etp + dp + pp,
        "%s: tp %.17g ep %.17g etp %.17g dp %.17g pp %.17g total %.17g; want %.17g %.17g %.17g %.17g %.17g",
        what, a->tp, a->ep, a->etp, a->dp, a->pp, a->total, tp, ep, etp, dp, pp);
}

// --vocab-parallel on tp 2 (model/vocab.h), by hand for tiny (V 256, d 96) at 16 x 64 tokens a rank (N
// 1,024): each rank holds 128 of the embedding's and the LM head's 256 rows, 2 x 128 x 96 = 24,576 floats
// fewer parameters (and as many gradients; the moments two each): 98,304 bytes a buffer; of the activations,
// 1,024 x 128 fewer logits (524,288 bytes) and the cross-entropy's parts, 3 doubles a row, this rank's and
// both ranks': 8 x 3 x 3 x 1,024 = 73,728 bytes; over TP the embedding's rows summed and the head's input
// gradient (N x d floats each, as an all-reduce half of them sent twice: 393,216 bytes each) and the parts
// gathered (3N doubles from each of the 2 ranks, half of the 2 x 24,576 bytes sent: 24,576).
static void check_vocab_parallel(void) {
    TrainOptions o = run_of(16, 64);
    CostMesh a, b;
    EXPECT(mesh_of(&a, &o, 2, 2, 2, 1, 1, 1) == NULL, "tp 2");
    o.vocab_parallel = 1;
    EXPECT(mesh_of(&b, &o, 2, 2, 2, 1, 1, 1) == NULL, "tp 2, --vocab-parallel 1");
    const CostMemory *x = &a.stage[0].mem, *y = &b.stage[0].mem;
    EXPECT(x->params - y->params == 98304 && x->acts - y->acts == 524288 - 73728,
           "--vocab-parallel, tp 2: params %.0f bytes fewer (want 98304), activations %.0f (want 450560)",
           x->params - y->params, x->acts - y->acts);
    // (params, grads and the two float32 moments; the expert gradients lend as much either way: the head's
    // activations take more than a layer's block even split)
    EXPECT(x->lent == y->lent && x->total - y->total == 4 * 98304 + 450560,
           "--vocab-parallel, tp 2: total %.0f bytes fewer (want 843776), lent %.0f and %.0f",
           x->total - y->total, x->lent, y->lent);
    EXPECT(b.stage[0].comm.tp - a.stage[0].comm.tp == 2 * 393216 + 24576,
           "--vocab-parallel, tp 2: TP bytes %.0f more (want 811008)",
           b.stage[0].comm.tp - a.stage[0].comm.tp);
    cost_mesh_free(&a);
    cost_mesh_free(&b);
}

// --loss-chunks 4 (model_set_loss_chunks), by hand for tiny (V 256, d 96) at 2 x 64 tokens, one process: the
// logits of 32 rows at a time instead of 128, 96 x 256 floats fewer (98,304 bytes), and the head's input
// gradient kept, 128 x 96 floats (49,152 bytes): 49,152 bytes fewer activations; with one MTP module its head
// as much again.
static void check_loss_chunks(void) {
    ModelConfig c = preset("tiny");
    TrainOptions o = run_of(2, 64);
    o.grad_memory = GRADMEM_SEPARATE;
    for (int D = 0; D <= 1; D++) {
        c.mtp_depth = D;
        CostWhole a, b;
        o.loss_chunks = 1;
        cost_whole(&a, &c, &o, 0);
        o.loss_chunks = 4;
        cost_whole(&b, &c, &o, 0);
        EXPECT(a.acts - b.acts == 49152.0 * (1 + D) && a.total - b.total == 49152.0 * (1 + D),
               "--loss-chunks 4, %d MTP modules: activations %.0f bytes fewer (total %.0f), want %.0f", D,
               a.acts - b.acts, a.total - b.total, 49152.0 * (1 + D));
    }
}

static void check_comm(void) {
    TrainOptions o = run_of(16, 64);
    CostMesh m;
    double d = 96, dense = 2 * 256 * 96 + 96 + 2 * (2 * 96 + 96 * 96 + 2 * 96 * 48 + 96 * 96 + 4 * 96);
    double router = 2 * 4 * 96, experts = 2 * 3 * 4 * 192 * 96;
    // tp 2 (dp 1, edp 2): each layer all-reduces o_proj's sums and the q/k/v input gradient (N x d floats:
    // half of them sent twice) and all-gathers the MoE output and dx (its half sent); the router's and the
    // experts' gradients are all-reduced over two ranks (half sent twice)
    EXPECT(mesh_of(&m, &o, 2, 2, 2, 1, 1, 1) == NULL, "tp 2");
    double N = 16 * 64;
    expect_comm(&m.stage[0].comm, 2 * 2 * (N * d * 4 + N / 2 * d * 4), 0, 0, 4 * (router + experts), 0,
                "tp 2");
    cost_mesh_free(&m);
    o.zero = 1; // + the weights all-gathered: half of them sent once
    EXPECT(mesh_of(&m, &o, 2, 2, 2, 1, 1, 1) == NULL, "tp 2, zero 1");
    expect_comm(&m.stage[0].comm, 2 * 2 * (N * d * 4 + N / 2 * d * 4), 0, 0, 1.5 * 4 * (router + experts), 0,
                "tp 2, zero 1");
    cost_mesh_free(&m);
    o.zero = 0;
    // ep 2 (dp 2, edp 1): a micro-batch of 8 sequences, 2 x 512 rows routed; half go to the other rank, the
    // forward's x there and the outputs back, the backward's dy there and dx back; dense and router
    // gradients all-reduced over two ranks; the experts have one replica
    EXPECT(mesh_of(&m, &o, 2, 2, 1, 2, 1, 1) == NULL, "ep 2");
    N = 8 * 64;
    expect_comm(&m.stage[0].comm, 0, 2 * 2 * N * d * (4 + 4), 0, 4 * dense, 0, "ep 2");
    expect_comm(&m.stage[0].comm16, 0, 2 * 2 * N * d * (2 + 4), 0, 4 * dense, 0, "ep 2, bf16 rows");
    cost_mesh_free(&m);
    // --fp8-dispatch: the forward's rows out as packed FP8 rows, 96 codes and one exponent byte each
    o.precision = PREC_FP8;
    o.fp8_dispatch = 1;
    EXPECT(mesh_of(&m, &o, 2, 2, 1, 2, 1, 1) == NULL, "ep 2, fp8 dispatch");
    expect_comm(&m.stage[0].comm, 0, 2 * N * (97 + d * (4 + 4 + 4)), 0, 4 * dense, 0, "ep 2, fp8 dispatch");
    expect_comm(&m.stage[0].comm16, 0, 2 * N * (97 + d * (2 + 4 + 4)), 0, 4 * dense, 0,
                "ep 2, fp8 dispatch, bf16 rows");
    o.precision = PREC_MIXED;
    o.fp8_dispatch = 0;
    EXPECT(m.stage[0].mem.params == 4 * (dense + experts / 2), "ep 2: %g bytes of weights",
           m.stage[0].mem.params);
    cost_mesh_free(&m);
    // etp 2 (dp 2, edp 1), sharded: each rank's 1024 rows gathered to the other, the partial outputs
    // reduce-scattered (1024 rows sent), forward and backward; gathered: each rank's slices of w1, w3, w2
    // (4 experts x 96 x 96) sent in the forward, the gradients' other half in the backward
    EXPECT(mesh_of(&m, &o, 2, 2, 1, 1, 2, 1) == NULL, "etp 2");
    expect_comm(&m.stage[0].comm, 0, 0, 2 * 2 * 2 * N * d * (4 + 4), 4 * dense, 0, "etp 2");
    cost_mesh_free(&m);
    o.expert_mode = 1;
    EXPECT(mesh_of(&m, &o, 2, 2, 1, 1, 2, 1) == NULL, "etp 2 gathered");
    expect_comm(&m.stage[0].comm, 0, 0, 2 * 2 * 3 * 4 * 96 * 96 * 4.0, 4 * dense, 0, "etp 2 gathered");
    cost_mesh_free(&m);
    o.expert_mode = 0;
    // pp 2, two micro-batches of 8 sequences: stage 0 sends each one's output on, stage 1 its gradient back
    o.grad_accum = 2;
    EXPECT(mesh_of(&m, &o, 2, 2, 1, 1, 1, 2) == NULL, "pp 2");
    N = 8 * 64;
    for (int s = 0; s < 2; s++) expect_comm(&m.stage[s].comm, 0, 0, 0, 0, 2 * N * d * 4, "pp 2");
    cost_mesh_free(&m);
    // interleaved, 4 layers on virtual stages 0 1 2 3 (rank 0: 0 and 2): rank 0 sends on from 0 and 2 and
    // back from 2, rank 1 on from 1 and back from 1 and 3
    o.pp_schedule = SCHED_INTERLEAVED;
    o.vpp = 2;
    EXPECT(mesh_of(&m, &o, 4, 2, 1, 1, 1, 2) == NULL, "interleaved");
    for (int s = 0; s < 2; s++) expect_comm(&m.stage[s].comm, 0, 0, 0, 0, 3 * 2 * N * d * 4, "interleaved");
    cost_mesh_free(&m);
    o.grad_accum = 1; // (1f1b needs a micro-batch per stage at least)
    EXPECT(mesh_of(&m, &o, 4, 2, 1, 1, 1, 2) != NULL && m.stage == NULL, "one micro-batch on two stages");
}

static int same_cuda(const CostCuda *a, const CostCuda *b) {
    return a->hid == b->hid && a->shadow == b->shadow && a->scratch == b->scratch && a->gemm == b->gemm &&
        a->fp8 == b->fp8 && a->kept == b->kept && a->workspace == b->workspace && a->alone == b->alone &&
        a->lent == b->lent && a->lean == b->lean && a->total == b->total && a->routed == b->routed;
}

// A mesh of one rank holds what one process does, on the cpu and (every delta, exactly) on the cuda backend.
static void check_memory(const char *name) {
    ModelConfig c = preset(name);
    TrainOptions o;
    train_options_default(&o);
    o.batch = 2;
    o.seq_len = c.max_seq_len < 256 ? c.max_seq_len : 256;
    for (int v = 0; v < 24; v++) {
        o.recompute = v & 3;
        o.precision = (v >> 2) % 3 == 2 ? PREC_FP8 : (v >> 2) % 3 == 1 ? PREC_BF16 : PREC_MIXED;
        o.grad_memory = v < 12 ? GRADMEM_SEPARATE : GRADMEM_SHARED;
        int rc = o.recompute;
        CostWhole w;
        cost_whole(&w, &c, &o, 0);
        MeshShape ms = {1, 1, 0, 1, 1, 1, 0, 0, 0};
        EXPECT(mesh_shape_resolve(&ms, &c) == NULL, "one rank");
        CostMesh m;
        EXPECT(cost_mesh(&m, &c, &o, &ms) == NULL, "one rank");
        const CostMemory *r = &m.stage[0].mem;
        EXPECT(r->acts == w.acts && r->lent == w.lent && r->total == w.total &&
                   2 * r->params + r->moments == w.state && m.stage[0].comm.total == 0,
               "%s, case %d: one rank %.17g %.17g %.17g, one process %.17g %.17g %.17g", name, v, r->acts,
               r->lent, r->total, w.acts, w.lent, w.total);
        EXPECT(same_cuda(&r->cuda, &w.cuda), "%s, case %d: one rank's cuda total %.17g, one process's %.17g",
               name, v, r->cuda.total, w.cuda.total);
        // the cuda figure is the float32 one with the deltas: bf16 halves rows, adds a bf16 weight copy, and
        // leaves out the holes its bf16 rows allow (more than the float32 rows')
        double np = r->params / 4;
        EXPECT(w.cuda.shadow == 2 * np && w.cuda.hid > 0 && w.cuda.gemm >= 1048576 &&
                   w.cuda.workspace >= 1048576 && w.cuda.scratch == w.cuda.gemm + w.cuda.workspace &&
                   w.cuda.total ==
                       w.total + w.lent + w.holes - w.cuda.hid + w.cuda.shadow + w.cuda.scratch + w.cuda.fp8 -
                           w.cuda.lent - w.cuda.alone - w.cuda.lean - w.cuda.holes &&
                   w.cuda.holes >= w.holes,
               "%s, case %d: cuda deltas", name, v);
        // the lean MoE scratch (moe.h moe_scratch_init) on one process: dxg (N k rows of d float32), dxj and
        // the MoE output (N rows of d float32 each) and, but under fp8, dh1 and dh3 (N k rows of f, bf16)
        // and the shared expert's (N rows of 2 fs, bf16)
        double N = (double)o.batch * o.seq_len, d = c.d_model,
               fs = (double)c.n_shared_experts * c.shared_d_ff,
               lean = 4 * N * c.top_k * d + 2 * 4 * N * d +
            (o.precision == PREC_FP8 ? 0 : 2 * 2 * N * c.top_k * c.d_ff + 2 * N * 2 * fs);
        EXPECT(w.cuda.lean == lean, "%s, case %d: lean scratch %.0f, want %.0f", name, v, w.cuda.lean, lean);
        EXPECT(o.precision == PREC_BF16 ? w.cuda.alone > 0 || strcmp(name, "peers-ref") : w.cuda.alone == 0,
               "%s, case %d: float32 GEMM weights dropped %.0f", name, v, w.cuda.alone);
        EXPECT(o.precision == PREC_FP8 ? w.cuda.kept > 0 && w.cuda.fp8 > w.cuda.kept
                                       : w.cuda.fp8 == 0 && w.cuda.kept == 0,
               "%s, case %d: fp8 %.0f, of it kept %.0f", name, v, w.cuda.fp8, w.cuda.kept);
        // (the cuda figure's lent memory: the float32 figure's rows in bf16, and layer 0's in the embedding's
        // gradient besides: the lean MoE scratch, model_state.c)
        EXPECT((w.cuda.lent > 0) == (o.grad_memory == GRADMEM_SHARED) &&
                   w.cuda.lent <= w.lent + (o.grad_memory == GRADMEM_SHARED) * 4.0 * c.vocab_size * c.d_model,
               "%s, case %d (recompute %d): lent %.0f of %.0f", name, v, rc, w.cuda.lent, w.lent);
        cost_mesh_free(&m);
    }
}

// One layer's activations (cost.c acts_layer): the whole model's with two layers less that with one (the
// head's and the backward's scratch do not depend on the layers), tiny at batch 2 x 64 (N 128 tokens) in one
// process, no --recompute, float32 values, counted by hand from what the model allocates a layer
// (model_state.c slot_alloc, attention.c gqa_acts_alloc, moe.c moe_layer_init and the arena's rows):
//   res_in, xn1, x_mid, xn2: 4 x 128 x 96 = 49,152; rstd1, rstd2: 2 x 128 = 256;
//   q and the attention output 2 x 128 x 96, k and v 2 x 128 x 48, lse 2 x 4 heads x 64 = 37,376;
//   the router's logits 128 x 4 experts = 512; the dispatched rows xs 256 (k 2 a token) x 96 = 24,576;
//   the experts' outputs yg 256 x 96 = 24,576 and h1, h3, act 3 x 256 x 192 = 147,456;
// 283,904 floats = 1,135,616 bytes. (The MoE output is the model's one buffer: not a layer's.)
static void check_layer_acts(void) {
    ModelConfig c = preset("tiny"); // d 96, 4 heads (2 kv, head dim 24), 4 experts top-2, f 192
    EXPECT(!c.qk_norm && !c.n_shared_experts && c.jitter == 0,
           "the tiny preset changed: rewrite the numbers");
    TrainOptions o = run_of(2, 64);
    CostWhole w1, w2;
    c.n_layers = 1;
    cost_whole(&w1, &c, &o, 0);
    c.n_layers = 2;
    cost_whole(&w2, &c, &o, 0);
    double want = 4.0 * (49152 + 256 + 37376 + 512 + 24576 + 24576 + 147456);
    EXPECT(w2.acts - w1.acts == want, "tiny, one layer's activations: %.17g bytes, want %.17g",
           w2.acts - w1.acts, want);
}

// --fp8-save's activations (cost_acts.c acts_fp8_change), by hand from what the layers allocate: tiny (d 96,
// f 192, 4 experts top-2) at 2 x 64 tokens in one process, --precision fp8: each MoE layer keeps its h1 and
// h3 as FP8 rows (moe.c expert_buffers: rows_cap 256 = 128 tokens x 2, of 2 x (192 + 2) bytes: 99,328 bytes)
// and no SwiGLU rows of its own; the shared buffers hold one layer's (3 x 256 x 192 floats, 589,824 bytes) as
// --recompute moe's do. So with 2 layers 589,824 - 2 x 99,328 = 391,168 bytes less than without, with 1 layer
// 99,328 more (its rows are the shared copy's). The total with 2 layers falls by less: under --grad-memory
// shared layer 1's activations live in layer 0's expert gradients (3 x 4 x 192 x 96 floats, 884,736 bytes),
// which held 884,736 of its 1,135,616 (check_layer_acts) and now hold all its 645,120: 239,616 fewer lent.
static void check_fp8_save(void) {
    ModelConfig c = preset("tiny");
    TrainOptions o = run_of(2, 64);
    o.precision = PREC_FP8;
    double want[3] = {0, 99328, -391168};
    for (int L = 1; L <= 2; L++) {
        CostWhole a, b;
        c.n_layers = L;
        o.fp8_save = 0;
        cost_whole(&a, &c, &o, 0);
        o.fp8_save = 1;
        cost_whole(&b, &c, &o, 0);
        EXPECT(b.acts - a.acts == want[L] && b.total - a.total == want[L] + (L == 2 ? 239616 : 0),
               "--fp8-save, %d layers: activations %.0f bytes more (total %.0f), want %.0f", L,
               b.acts - a.acts, b.total - a.total, want[L]);
    }
}

// The packed expert gradients' holes (model_share_grads; cost_acts.c acts_holes), by hand: d 32, 4 heads of 8
// (2 kv), 4 experts of f 192, 3 layers, --precision bf16 at 2 x 16 tokens, one process: a layer's block is 3
// x 4 x 192 x 32 = 73,728 floats, its hole the float32 bytes past the packed half, 36,864 floats = 147,456
// bytes. The next layer's activations (float32, the cpu's: 32 tokens x (4 d + 2 x 32 + 2 x 16 + 2) = 7,232,
// the router's 32 x (4 + 2 x 32) = 2,176, the expert rows 64 x (32 + 3 x 192) = 38,912, lse 2 x 4 x 16 =
// 128: 48,448 floats) take 193,792 bytes with their SwiGLU rows, more than 147,456, and 46,336 without them
// (--recompute moe); the head's 32 x (2 x 32 + 256) floats 40,960. So 1 hole (the last layer's) without
// recompute, 3 with it; none under mixed (nothing packed) or --grad-memory separate (nothing lent).
static void check_holes(void) {
    ModelConfig c = preset("tiny");
    c.d_model = 32;
    c.n_heads = 4;
    c.n_kv_heads = 2;
    c.head_dim = 8;
    c.d_ff = 192;
    c.n_layers = 3;
    TrainOptions o;
    train_options_default(&o);
    o.batch = 2;
    o.seq_len = 16;
    o.precision = PREC_BF16;
    o.grad_memory = GRADMEM_SHARED;
    double want[2] = {147456, 3 * 147456.0};
    for (int rc = 0; rc < 2; rc++) {
        o.recompute = rc ? 2 : 0; // (model_types.h RECOMPUTE_MOE, RECOMPUTE_NONE)
        CostWhole w;
        cost_whole(&w, &c, &o, 0);
        EXPECT(w.holes == want[rc] && w.total == w.state + w.acts - w.lent - w.holes,
               "holes, recompute %d: %.0f bytes, want %.0f", rc, w.holes, want[rc]);
    }
    // --recompute-layers 2: layers 0 and 1 recompute, layer 2 keeps its rows: block 0 (layer 1's) and the
    // last (the head's) have holes, block 1 (layer 2's 193,792 bytes) not
    o.recompute = 2;
    o.recompute_layers = 2;
    CostWhole w, w0;
    cost_whole(&w, &c, &o, 0);
    EXPECT(w.holes == 2 * 147456.0, "holes, --recompute-layers 2: %.0f bytes, want %.0f", w.holes,
           2 * 147456.0);
    // the activations: 2 recompute, one shared copy of their rows stands for both, so one layer's SwiGLU rows
    // (64 x 3 x 192 floats) less than without recompute; with 1 layer, none less (its rows are the copy)
    o.recompute = 0;
    o.recompute_layers = 0;
    cost_whole(&w0, &c, &o, 0);
    EXPECT(w0.acts - w.acts == 4.0 * 64 * 3 * 192, "--recompute-layers 2: activations %.0f less, want %.0f",
           w0.acts - w.acts, 4.0 * 64 * 3 * 192);
    o.recompute = 2;
    o.recompute_layers = 1;
    cost_whole(&w, &c, &o, 0);
    EXPECT(w.acts == w0.acts && w.cuda.total > 0,
           "--recompute-layers 1: activations %.0f, without recompute %.0f", w.acts, w0.acts);
    o.recompute_layers = 0;
    o.grad_memory = GRADMEM_SEPARATE;
    cost_whole(&w, &c, &o, 0);
    EXPECT(w.holes == 0, "holes under --grad-memory separate: %.0f", w.holes);
    o.grad_memory = GRADMEM_SHARED;
    o.precision = PREC_MIXED;
    cost_whole(&w, &c, &o, 0);
    EXPECT(w.holes == 0, "holes under mixed: %.0f", w.holes);
}

static double kept_whole(const ModelConfig *c, const TrainOptions *o) {
    CostWhole w;
    cost_whole(&w, c, o, 0);
    return w.cuda.kept;
}

// The FP8 table's kept codes (cuda_fp8_wcache.cu), bytes, by its allocations: a weight (G, O, K) that starts
// at a multiple of 8 elements keeps its transposed layout (G O K bytes of codes, 4-byte scales of its 128 x
// 128 blocks, each rounded up to 256 bytes, + 256 for its non-finite count); the forward layouts share two
// slots, each the size of the largest it holds: one for single weights (w2's, and w1's and w3's where not
// paired: codes rounded, scales not) and one for the pairs of w1 and w3 (2 G O K bytes + a scale per row and
// 128-wide K-tile) where O % 64 == 0 and K % 16 == 0.
static void check_fp8_kept(void) {
    TrainOptions o = run_of(16, 64);
    o.precision = PREC_FP8;
    ModelConfig c = preset("tiny"); // d 96, 2 layers, 4 experts, f 192 (check_flops checks these)
    // routed (4, 192, 96) and (4, 96, 192): 73,728 B of codes, 4 x 2 x 1 blocks of 4 B = 32 B of scales
    double t = 73728 + 256 + 256, f2 = 73728 + 32, pair = 2 * 73728 + 4 * 192 * 1 * 2 * 4.0;
    double layer = 3 * t + f2 + pair; // one layer alone: 450,080
    EXPECT(kept_whole(&c, &o) == 2 * 3 * t + f2 + pair, "tiny fp8: %.0f kept, want %.0f", kept_whole(&c, &o),
           2 * 3 * t + f2 + pair);
    o.precision = PREC_MIXED;
    EXPECT(kept_whole(&c, &o) == 0, "tiny mixed: %.0f kept", kept_whole(&c, &o));
    o.precision = PREC_FP8;
    // two pipeline stages (two micro-batches): a layer each
    CostMesh m;
    o.grad_accum = 2;
    EXPECT(mesh_of(&m, &o, 2, 2, 1, 1, 1, 2) == NULL, "fp8 pp 2");
    for (int s = 0; s < 2; s++)
        EXPECT(m.stage[s].mem.cuda.kept == layer, "fp8 pp 2, stage %d: %.0f kept, want %.0f", s,
               m.stage[s].mem.cuda.kept, layer);
    cost_mesh_free(&m);
    o.grad_accum = 1;
    // two EP ranks: 2 experts each, (2, 192, 96): 36,864 B of codes, 16 B of scales
    double t2 = 36864 + 256 + 256, ep2 = 2 * 3 * t2 + (36864 + 16) + (2 * 36864 + 2 * 192 * 2 * 4.0);
    EXPECT(mesh_of(&m, &o, 2, 2, 1, 2, 1, 1) == NULL, "fp8 ep 2");
    EXPECT(m.stage[0].mem.cuda.kept == ep2, "fp8 ep 2: %.0f kept, want %.0f", m.stage[0].mem.cuda.kept, ep2);
    cost_mesh_free(&m);
    // a shared expert of width 64 (1, 64, 96): 6,144 B of codes, one block's scale (4 B); paired, and each of
    // its forward layouts smaller than the routed ones (the slots as above)
    c.n_shared_experts = 1;
    c.shared_d_ff = 64;
    double tsh = 6144 + 256 + 256;
    EXPECT(kept_whole(&c, &o) == 2 * 3 * (t + tsh) + f2 + pair, "tiny + shared 64: %.0f kept, want %.0f",
           kept_whole(&c, &o), 2 * 3 * (t + tsh) + f2 + pair);
    // width 40: no pair (40 % 64), its w1 and w3 through the single slot: 3,840 B of codes, one block
    c.shared_d_ff = 40;
    double t40 = 3840 + 256 + 256;
    EXPECT(kept_whole(&c, &o) == 2 * 3 * (t + t40) + f2 + pair, "tiny + shared 40: %.0f kept, want %.0f",
           kept_whole(&c, &o), 2 * 3 * (t + t40) + f2 + pair);
    // layer 0 dense, an MLP of width 128 (1, 128, 96): 12,288 B of codes, one block; layer 1 as above
    c.shared_d_ff = 64;
    config_set_dense(&c, 0);
    c.dense_d_ff = 128;
    double td = 12288 + 256 + 256;
    EXPECT(kept_whole(&c, &o) == 3 * td + 3 * (t + tsh) + f2 + pair,
           "tiny, layer 0 dense: %.0f kept, want %.0f", kept_whole(&c, &o),
           3 * td + 3 * (t + tsh) + f2 + pair);
    // a model of one dense layer (the slots the dense MLP's: 12,292 B single, 2 x 12,288 + 128 x 2 x 4 pair)
    c.n_layers = 1;
    EXPECT(kept_whole(&c, &o) == 3 * td + (12288 + 4) + (2 * 12288 + 128 * 2 * 4.0),
           "one dense layer: %.0f kept, want %.0f", kept_whole(&c, &o),
           3 * td + (12288 + 4) + (2 * 12288 + 128 * 2 * 4.0));
    // --fp8-dense: each layer's attention projections kept too (transposed layouts; their forward layouts
    // smaller than w2's, so the slots as above). GQA, head dim 24: q and o (96, 96): 9,216 B of codes, one
    // block (256 + 256); k and v (48, 96): 4,608 B: 29,696 B a layer. The scratch is the experts' (their
    // backward's needs are the largest: unchanged)
    c = preset("tiny");
    CostWhole w0, w1;
    cost_whole(&w0, &c, &o, 0);
    o.fp8_dense = 1;
    cost_whole(&w1, &c, &o, 0);
    EXPECT(w1.cuda.kept == w0.cuda.kept + 2 * 29696.0, "tiny --fp8-dense: %.0f kept, want %.0f", w1.cuda.kept,
           w0.cuda.kept + 2 * 29696.0);
    EXPECT(w1.cuda.fp8 - w1.cuda.kept == w0.cuda.fp8 - w0.cuda.kept,
           "tiny --fp8-dense: scratch %.0f, want %.0f", w1.cuda.fp8 - w1.cuda.kept,
           w0.cuda.fp8 - w0.cuda.kept);
    // latent attention (deepseek-v3-tiny, 3 layers): q_a (48, 96) and q_b (96, 48): 4,608 B each (5,120);
    // kv_a (40, 96) as its two products, the latent rows (32, 96): 3,072 B (3,584) and the rope rows (8, 96):
    // 768 B (1,280); kv_b (128, 32): 4,096 B (4,608); o (96, 64): 6,144 B (6,656): 26,368 B a layer
    c = preset("deepseek-v3-tiny");
    o.fp8_dense = 0;
    cost_whole(&w0, &c, &o, 0);
    o.fp8_dense = 1;
    cost_whole(&w1, &c, &o, 0);
    EXPECT(w1.cuda.kept == w0.cuda.kept + 3 * 26368.0, "deepseek-v3-tiny --fp8-dense: %.0f kept, want %.0f",
           w1.cuda.kept, w0.cuda.kept + 3 * 26368.0);
    o.fp8_dense = 0;
    // aux-free: each layer's routing bias (4 floats) comes before its experts, so layer 0's start 4 elements
    // off a multiple of 8 (no bf16 copy to key on: none kept) and layer 1's, 8 off, on one
    c = preset("tiny");
    c.balance = BALANCE_AUX_FREE;
    EXPECT(kept_whole(&c, &o) == layer, "tiny aux-free: %.0f kept, want %.0f (layer 1's)", kept_whole(&c, &o),
           layer);
}

int main(void) {
    check_vocab_parallel();
    check_loss_chunks();
    char names[512];
    snprintf(names, sizeof names, "%s", config_preset_names());
    for (char *save = NULL, *n = strtok_r(names, ", ", &save); n; n = strtok_r(NULL, ", ", &save)) {
        ModelConfig c = preset(n);
        check_params(&c, n);
    }
    ModelConfig c = preset("tiny");
    c.balance = BALANCE_AUX_FREE;
    check_params(&c, "tiny, aux-free");
    c.qk_norm = QK_NORM_FULL;
    check_params(&c, "tiny, full QK-norm");
    c.qk_norm = QK_NORM_HEAD;
    check_params(&c, "tiny, per-head QK-norm");
    c.qk_norm = QK_NORM_NONE;
    c.qkv_bias = 1;
    c.n_shared_experts = 2;
    c.shared_d_ff = 40;
    c.shared_gate = 1;
    check_params(&c, "tiny, biases and gated shared experts");
    ModelConfig dq = preset("qwen2-moe-a2.7b"); // dense layers 0 and 5-7 (Qwen's mlp_only_layers)
    config_set_dense(&dq, 0);
    for (int l = 5; l <= 7; l++) config_set_dense(&dq, l);
    dq.dense_d_ff = 5632;
    EXPECT(config_validate(&dq) == NULL, "qwen2 with dense layers: %s", config_validate(&dq));
    check_params(&dq, "qwen2-moe-a2.7b, 4 dense layers");
    ModelConfig mt = preset("tiny"); // one MTP module, and two on a DeepSeek-like layout
    mt.mtp_depth = 1;
    check_params(&mt, "tiny, 1 MTP module");
    dq.mtp_depth = 2;
    dq.aux_form = AUX_LAYER;
    check_params(&dq, "qwen2-moe-a2.7b, 4 dense layers, 2 MTP modules");
    check_flops();
    check_comm();
    check_memory("small");
    check_memory("peers-ref");
    check_layer_acts();
    check_fp8_save();
    check_holes();
    check_fp8_kept();
    return test_done("test_cost");
}
