// test_plan.c — the layout planner (train/plan.h):
//  - the enumeration of the tiny preset on 4 GPUs (batch 4) is complete: its layouts and refusals counted
//    by hand below, rule by rule;
//  - every layout it keeps has the memory cost_mesh gives the train options of that layout, built here
//    from the layout's flags (the cuda figures `moe info --world G` prints; test_plan.sh checks the CLI's),
//    plus the headroom and the context, and the ranking is sorted by step time;
//  - one GPU: the memory is the one process's cuda figure (cost_whole) of its micro-batch, lending under
//    `moe train`'s --grad-memory rule (shared with --grad-accum 1, no --pp);
//  - the host overhead: none with the built-in profiles; launches hidden behind the compute, or the step
//    the host's when they take longer;
//  - an impossible layout is refused naming its rule (mesh, pipeline, batch, schedule);
//  - doubling the links' bandwidth never makes a layout slower, and makes one that communicates faster;
//  - a model too big for one GPU: the smallest count that fits does fit, the count below it does not;
//  - --precision fp8: the experts at the profile's fp8 rate (equal rates: mixed's step; half the rate: the
//    experts' FLOPs again), --etp > 1 refused as moe train refuses it;
//  - a profile written (hwprofile_write, what --calibrate writes) reads back (hwprofile_load, --gpu) to the
//    same numbers, bit for bit, fractions, tiny and huge ones included;
//  - the pipeline: equal stages give exactly the uniform simulation's bubble, a slower last stage a larger
//    one; the planner's stage times from each virtual stage's FLOPs (the LM head on the last), the bubble of
//    the tiny preset on 2 stages by hand, the step the simulated span, every row's columns adding up to it;
//  - the memory-bound ops: the tiny preset's bytes by hand (cost_bytes, the gradient norm's), the planner's
//    seconds those bytes at a chosen HBM rate, none for none, twice for twice the tokens;
//  - --recompute-layers: the fewest first layers that fit where only recomputing fits.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "model/model.h"
#include "train/cost.h"
#include "train/plan.h"
#include "test_util.h"

// The setup of every check: the preset's model, default train options at batch x seq_len.
static void setup(ModelConfig *c, TrainOptions *o, const char *preset, int batch, int seq_len) {
    if (config_preset(c, preset)) {
        fprintf(stderr, "FAIL: no preset %s\n", preset);
        exit(1);
    }
    train_options_default(o);
    o->batch = batch;
    o->seq_len = seq_len;
}

static PlanSpec spec(int gpus) {
    PlanSpec sp;
    memset(&sp, 0, sizeof sp);
    sp.gpus = gpus;
    sp.nodes_of = 8;
    sp.imbalance = 1.25;
    sp.exposed = 1;
    sp.hw = *hwprofile_builtin("h200");
    return sp;
}

// The tiny preset (4 heads, 2 kv heads, 4 experts, f 192, 2 layers) on 4 GPUs, batch 4, by hand:
// (tp, pp) with tp | 4, pp | 4/tp: (1,1) (1,2) (1,4) (2,1) (2,2) (4,1); (ep, etp) with ep x etp | 4/pp:
// 6 pairs for a stage of 4 ranks, 3 for 2, 1 for 1: 6+3+1+6+3+6 = 25 meshes. Mesh refusals: tp 4 (2 kv
// heads), 6. Pipeline: pp 4 over 2 layers, 1 (pp 2: one layer a stage, vpp 1 only). Left: (1,1) x 6
// (dp 4), (1,2) x 3 (dp 2), (2,1) x 6 (dp 2), (2,2) x 3 (dp 1). Micro-batches m | 4 with 4 % (m dp) == 0:
// dp 4 m 1 (2 refused each: 12); dp 2 m 1, 2 (1 refused each: 3 + 6); dp 1 all. Schedule: 1f1b needs
// m >= pp 2: m 1 refused on the 3 + 3 pipelined meshes (6). ZeRO 0, 1, 2 unless dp and edp are 1 (zero 0
// only): of (2,2) the (ep,etp) = (1,2) and (2,1) meshes. Recompute none, moe, full: x 3. Kept:
// (1,1) 6 x 1 m x 3 x 3 = 54; (1,2) 3 x 1 x 9 = 27; (2,1) 6 x 2 x 9 = 108; (2,2) (1,1) 2 x 9 = 18 and
// 2 x 2 x 3 = 12: 219, all fitting in an H200.
static void check_count(void) {
    ModelConfig c;
    TrainOptions o;
    setup(&c, &o, "tiny", 4, 64);
    PlanSpec sp = spec(4);
    PlanResult r;
    plan_enumerate(&r, &c, &o, &sp, 0);
    EXPECT(r.candidates == 219 && r.n == 219, "%d candidates, %d kept; want 219 of each", r.candidates, r.n);
    int want[PLAN_R_N] = {6, 1, 21, 6, 0};
    for (int k = 0; k < PLAN_R_N; k++)
        EXPECT(r.refused[k] == want[k], "refused for %s: %d, want %d", plan_reason_name[k], r.refused[k],
               want[k]);
    // no layout twice
    for (int i = 0; i < r.n; i++)
        for (int j = 0; j < i; j++)
            EXPECT(memcmp(&r.rows[i].l, &r.rows[j].l, sizeof(PlanLayout)), "rows %d and %d hold one layout",
                   i, j);
    plan_result_free(&r);
}

// Every kept layout of the small preset on 8 GPUs: its memory is cost_mesh's for the train options of
// its flags, and the rows run fastest first.
static void check_memory(void) {
    ModelConfig c;
    TrainOptions o;
    setup(&c, &o, "small", 16, 128);
    PlanSpec sp = spec(8);
    PlanResult r;
    plan_enumerate(&r, &c, &o, &sp, 0);
    EXPECT(r.n > 100, "only %d layouts kept", r.n);
    int bad = 0, routed = 0;
    for (int i = 0; i < r.n; i++) {
        const PlanRow *w = &r.rows[i];
        const PlanLayout *l = &w->l;
        TrainOptions t = o; // the flags of the row's launch command
        t.tp = l->tp, t.ep = l->ep, t.etp = l->etp, t.pp = l->pp, t.vpp = l->vpp, t.zero = l->zero;
        t.recompute = l->recompute, t.grad_accum = l->micro;
        t.pp_schedule = l->vpp > 1 ? SCHED_INTERLEAVED : SCHED_1F1B;
        MeshShape ms = {8, l->tp, 0, l->pp, l->ep, l->etp, 0, 0, 0};
        EXPECT(!mesh_shape_resolve(&ms, &c) && ms.dp == l->dp, "row %d: dp %d", i, l->dp);
        CostMesh m;
        EXPECT(!cost_mesh(&m, &c, &t, &ms), "row %d: cost_mesh refused a kept layout", i);
        double top = 0, head = 0;
        for (int s = 0; s < ms.pp; s++) {
            const CostCuda *k = &m.stage[s].mem.cuda;
            if (k->total > top) top = k->total;
            if (0.25 * k->routed > head) head = 0.25 * k->routed;
        }
        routed += head > 0;
        bad += top != w->mem_info || head != w->mem_headroom || w->mem != top + head + sp.hw.context_bytes ||
            (ms.ep * ms.etp == 1) != (head == 0);
        if (i) bad += w->step < r.rows[i - 1].step;
        cost_mesh_free(&m);
    }
    EXPECT(!bad, "%d rows' memory or order differ from cost_mesh's", bad);
    EXPECT(routed > 10, "only %d layouts with a routing headroom", routed);
    plan_result_free(&r);
}

// One GPU: the plan's memory is the one process's cuda figure (cost_whole, as `moe info` prints it) of the
// micro-batch it runs, under the --grad-memory rule of `moe train` (the expert gradients lend their memory
// with --grad-accum 1 and no --pp): micro1 with shared gradients is the whole batch's figure, lending;
// micro2 is half the batch's, lending nothing (cost_whole at --grad-accum 2).
static void check_one_gpu(void) {
    PlanSpec sp = spec(1);
    for (int v = 0; v < 8; v++) {
        ModelConfig c;
        TrainOptions o;
        setup(&c, &o, "peers-ref", 4, 512);
        o.precision = v & 1 ? PREC_BF16 : PREC_MIXED;
        o.grad_memory = v & 2 ? GRADMEM_SEPARATE : GRADMEM_SHARED;
        int micro = v & 4 ? 2 : 1;
        PlanLayout l = {1, 1, 1, 1, 1, 0, 0, RECOMPUTE_NONE, micro, 0, 0};
        PlanRow row;
        EXPECT(!plan_layout(&row, &c, &o, &sp, &l, NULL, NULL), "case %d: refused", v);
        TrainOptions w1 = o;
        w1.batch = o.batch / micro;
        w1.grad_accum = micro;
        CostWhole w;
        cost_whole(&w, &c, &w1, 0);
        EXPECT(row.mem_info == w.cuda.total && row.mem_headroom == 0 &&
                   row.mem == w.cuda.total + sp.hw.context_bytes,
               "case %d: plan %.17g, moe info's cuda figure %.17g", v, row.mem_info, w.cuda.total);
        EXPECT((w.cuda.lent > 0) == (micro == 1 && o.grad_memory == GRADMEM_SHARED),
               "case %d: lent %.0f with micro %d", v, w.cuda.lent, micro);
    }
}

// The host overhead: the built-in profiles count none (not calibrated); launches queue behind the GPU's
// work, so where they take less than the compute only the synchronisations cost, and where they take more
// the step is the host's: launches x launch_us + synchronisations x sync_us.
static void check_host(void) {
    ModelConfig c;
    TrainOptions o;
    setup(&c, &o, "peers-ref", 4, 2048);
    PlanSpec sp = spec(1);
    PlanLayout l = {1, 1, 1, 1, 1, 0, 0, RECOMPUTE_NONE, 1, 0, 0};
    PlanRow a, b, h;
    EXPECT(!plan_layout(&a, &c, &o, &sp, &l, NULL, NULL) && a.host == 0, "built-in h200: host %g s", a.host);
    sp.hw.launch_us = 5, sp.hw.sync_us = 10;
    EXPECT(!plan_layout(&b, &c, &o, &sp, &l, NULL, NULL), "h200 + launches");
    EXPECT(b.launches * 5e-6 < b.compute && fabs(b.host - b.syncs * 10e-6) < 1e-15 &&
               b.step == b.compute + b.host && b.compute == a.compute && b.syncs >= c.n_layers,
           "hidden launches: host %g s, %g syncs", b.host, b.syncs);
    sp.hw.launch_us = 1e4; // a host slower than the GPU
    EXPECT(!plan_layout(&h, &c, &o, &sp, &l, NULL, NULL), "h200 + slow launches");
    double want = h.launches * 1e-2 + h.syncs * 10e-6;
    EXPECT(h.launches == b.launches && h.launches * 1e-2 > h.compute && fabs(h.step - want) <= 1e-12 * want,
           "host-bound: step %.9g s, launches x launch_us + syncs x sync_us %.9g s", h.step, want);
}

static void refuses(const char *text, int gpus, const char *phrase, int reason) {
    ModelConfig c;
    TrainOptions o;
    setup(&c, &o, "tiny", 8, 64);
    PlanSpec sp = spec(gpus);
    PlanLayout l;
    const char *bad = plan_parse_layout(&l, text, &o);
    PlanRow row;
    int why = -1;
    if (!bad) bad = plan_layout(&row, &c, &o, &sp, &l, &why, NULL);
    EXPECT(bad && strstr(bad, phrase) && (reason < 0 || why == reason),
           "'%s' on %d: %s (reason %d), want '%s'", text, gpus, bad ? bad : "accepted", why, phrase);
}

static void check_refusals(void) {
    refuses("tp3", 4, "mesh: world size 4 is not divisible by tp 3", PLAN_R_MESH);
    refuses("ep8", 8, "n_experts 4 is not divisible by ep 8", PLAN_R_MESH);
    refuses("tp4", 4, "n_kv_heads 2 is not divisible by tp 4", PLAN_R_MESH);
    refuses("tp2 dp4", 4, "mesh: dp 4, but 4 GPUs / (tp 2 x pp 1) = dp 2", PLAN_R_MESH);
    refuses("pp4", 4, "n_layers 2 is not divisible by --pp 4", PLAN_R_PIPELINE);
    refuses("pp2 vpp2 micro2", 2, "n_layers 2 is not divisible by --pp 2 x --vpp 2", PLAN_R_PIPELINE);
    refuses("vpp2", 2, "--vpp needs --pp > 1", PLAN_R_PIPELINE);
    refuses("micro3", 2, "--batch 8 is not divisible by --grad-accum 3 x dp 2", PLAN_R_BATCH);
    refuses("pp2 micro1", 2, "at least as many micro-batches (--grad-accum 1) as pipeline stages (--pp 2)",
            PLAN_R_SCHEDULE);
    refuses("tp2 ep", 2, "'ep' is not a layout word", -1);
    refuses("zero3", 2, "'zero3' is not a layout word", -1);
    refuses("recompute-some", 2, "recompute-none|attn|moe|full", -1);
}

// Every layout of the small preset on 16 GPUs in nodes of 4, with the links twice as fast.
static void check_monotone(void) {
    ModelConfig c;
    TrainOptions o;
    setup(&c, &o, "small", 32, 128);
    PlanSpec sp = spec(16), fast = sp;
    sp.nodes_of = fast.nodes_of = 4;
    fast.hw.nvlink_gbps *= 2;
    fast.hw.internode_gbps *= 2;
    PlanResult r;
    plan_enumerate(&r, &c, &o, &sp, 0);
    int slower = 0, comm = 0, inter = 0;
    for (int i = 0; i < r.n; i++) {
        PlanRow w;
        plan_layout(&w, &c, &o, &fast, &r.rows[i].l, NULL, NULL);
        slower += w.step > r.rows[i].step;
        if (r.rows[i].comm > 0) {
            comm++;
            slower += !(w.step < r.rows[i].step); // it communicates: strictly faster
        }
        for (int k = 0; k < 5; k++) inter += r.rows[i].inter[k];
    }
    EXPECT(!slower && comm > 100 && inter > 0,
           "%d of %d layouts not faster with faster links (%d communicate)", slower, r.n, comm);
    plan_result_free(&r);
}

// The small preset on GPUs of a third of its one-GPU layouts' least memory.
static void check_smallest(void) {
    ModelConfig c;
    TrainOptions o;
    setup(&c, &o, "small", 16, 128);
    PlanSpec sp = spec(1);
    sp.hw.context_bytes = 0;
    PlanResult r;
    plan_enumerate(&r, &c, &o, &sp, 0);
    double least = 1e300;
    for (int i = 0; i < r.n; i++) least = r.rows[i].mem < least ? r.rows[i].mem : least;
    plan_result_free(&r);
    sp.hw.mem_bytes = least / 3;
    plan_enumerate(&r, &c, &o, &sp, 0);
    EXPECT(r.n == 0 && r.refused[PLAN_R_MEMORY] == r.candidates, "1 GPU: %d fit", r.n);
    plan_result_free(&r);
    int g = plan_smallest_fit(&c, &o, &sp, 64);
    EXPECT(g > 2, "the smallest count that fits: %d", g);
    for (int k = g - 1; k <= g; k++) {
        sp.gpus = k;
        plan_enumerate(&r, &c, &o, &sp, 0);
        EXPECT((r.n > 0) == (k == g), "%d GPUs: %d layouts fit (smallest fit found: %d)", k, r.n, g);
        plan_result_free(&r);
    }
}

// A profile of numbers no decimal rounding of 15 digits keeps (thirds, powers of ten far from 1, a
// denormal-free tiny one), written to a file and read back: every field the same double.
static void check_roundtrip(void) {
    HwProfile p;
    memset(&p, 0, sizeof p);
    snprintf(p.name, sizeof p.name, "round \"trip\"");
    double v[13] = {1.0 / 3,  2.0 / 7 * 1e9, 1e15 / 3,       1e-7 / 3, 123456.789012345678, M_PI,   M_E * 1e3,
                    5e-3 / 9, 7e300 / 3,     1.0 / 9 * 1e-3, 2.5,      0.1 + 0.2,           1e3 / 7};
    double *f[13] = {&p.mem_bytes,         &p.context_bytes,    &p.peak_tflops, &p.dense_tflops,
                     &p.grouped_tflops,    &p.attention_tflops, &p.hbm_gbps,    &p.nvlink_gbps,
                     &p.internode_gbps,    &p.pcie_gbps,        &p.launch_us,   &p.sync_us,
                     &p.fp8_grouped_tflops};
    for (int i = 0; i < 13; i++) *f[i] = v[i];
    p.mem_bytes = 1e15, p.context_bytes = 1.0 / 3; // (the reader wants the context below the memory)
    char path[256];
    snprintf(path, sizeof path, "%s/test_plan_%d.json", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
             (int)getpid());
    hwprofile_write(&p, "a note, read past", path);
    HwProfile q;
    hwprofile_load(&q, path);
    remove(path);
    int same = !strcmp(p.name, q.name);
    for (int i = 0; i < 13; i++) {
        double a = *f[i], b = *(double *)((char *)&q + ((char *)f[i] - (char *)&p));
        same &= a == b;
    }
    EXPECT(same, "a written profile reads back to other numbers");
}

// --precision fp8 on one GPU: only the experts' rate differs from mixed's (the same FLOPs).
static void check_fp8(void) {
    ModelConfig c;
    TrainOptions o;
    setup(&c, &o, "peers-ref", 4, 2048);
    PlanSpec sp = spec(1);
    PlanLayout l = {1, 1, 1, 1, 1, 0, 0, RECOMPUTE_NONE, 1, 0, 0};
    PlanRow mixed, same, half;
    EXPECT(!plan_layout(&mixed, &c, &o, &sp, &l, NULL, NULL), "mixed");
    o.precision = PREC_FP8;
    sp.hw.fp8_grouped_tflops = sp.hw.grouped_tflops;
    EXPECT(!plan_layout(&same, &c, &o, &sp, &l, NULL, NULL) && same.compute == mixed.compute,
           "fp8 at mixed's rate: compute %.9g s, mixed %.9g s", same.compute, mixed.compute);
    sp.hw.fp8_grouped_tflops = sp.hw.grouped_tflops / 2;
    CostFlops f;
    cost_flops(&f, &c, o.seq_len);
    double want = 3.0 * o.batch * o.seq_len * c.n_layers * f.experts / (sp.hw.grouped_tflops * 1e12);
    EXPECT(!plan_layout(&half, &c, &o, &sp, &l, NULL, NULL) &&
               fabs(half.compute - same.compute - want) < 1e-9 * want,
           "fp8 at half the rate: %.9g s more, the experts' FLOPs at the rate %.9g s",
           half.compute - same.compute, want);
    EXPECT(same.mem_info > mixed.mem_info, "fp8 keeps its operands' scratch: %.0f, mixed %.0f", same.mem_info,
           mixed.mem_info);
    sp = spec(2);
    l.etp = 2;
    const char *bad = plan_layout(&half, &c, &o, &sp, &l, NULL, NULL);
    EXPECT(bad && strstr(bad, "mesh: --precision fp8 takes --etp 1"), "fp8 etp2: %s", bad ? bad : "accepted");
}

// The simulated pipeline (plan_pipe_simulate, the one simulation of the planner and its timeline): every
// virtual stage's forward 0.25 s and backward 0.5 s gives exactly schedule_simulate's equal-stage bubble (the
// uniform model the planner had before), and a span of the stages' busy time / (1 - that bubble); a last
// stage slower than the others gets a larger bubble.
static void check_pipe_equal(void) {
    static const int cases[][4] = {{SCHED_SEQUENTIAL, 1, 1, 3},  {SCHED_1F1B, 2, 1, 4},
                                   {SCHED_1F1B, 4, 1, 8},        {SCHED_1F1B, 8, 1, 32},
                                   {SCHED_INTERLEAVED, 2, 2, 4}, {SCHED_INTERLEAVED, 4, 3, 8}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        PlanPipe p;
        p.kind = (ScheduleKind)cases[i][0];
        p.pp = cases[i][1], p.vpp = cases[i][2], p.micro = cases[i][3];
        for (int v = 0; v < p.pp * p.vpp; v++) p.tf[v] = 0.25, p.tb[v] = 0.5;
        double span, old = schedule_simulate(p.kind, p.pp, p.vpp, p.micro, 1, 2, NULL);
        double b = plan_pipe_simulate(&p, NULL, &span), busy = 0.75 * p.vpp * p.micro;
        EXPECT(b == old && fabs(span - busy / (1 - old)) <= 1e-12 * span,
               "case %zu: equal stages: bubble %.17g, schedule_simulate's %.17g; span %.17g, busy / (1 - b) "
               "%.17g",
               i, b, old, span, busy / (1 - old));
        if (p.pp == 1) continue;
        p.tf[p.pp * p.vpp - 1] *= 1.2, p.tb[p.pp * p.vpp - 1] *= 1.2;
        EXPECT(plan_pipe_simulate(&p, NULL, &span) > old,
               "case %zu: a slower last stage: bubble %.9g, equal %.9g", i,
               plan_pipe_simulate(&p, NULL, &span), old);
    }
}

// The planner's pipeline from each virtual stage's own compute. A profile of equal compute rates (links and
// HBM so fast that the messages and AdamW vanish) makes a stage's time its FLOPs: the tiny preset on pp2
// holds one layer a stage and the LM head on the last, forward per token (T 64, d 96, 4 heads of 24, 2 kv
// heads, 4 experts of 192, top-2, vocab 256): a layer 2 d hd (2 H + 2 KV) + 2 x 2 H hd T / 2 + 2 d E + k 2 x
// 3 d f = 55296 + 12288 + 768 + 221184 = 289536, the head 2 d V = 49152. So stage 1's forward is 338688 /
// 289536 of stage 0's, each backward twice its forward, and 1F1B on 2 stages of 4 micro-batches (stage 0: F F
// B F B F B B, stage 1: F B four times) with forward a on stage 0 and c >= a on stage 1 runs a span of 3a +
// 12c: the bubble 1 - 12 (a + c) / (2 (3a + 12c)) (a = c: 1/5). The step is that span, the bubble's seconds
// the slowest stage's idle (the columns add up). With the head's FLOPs at a rate 10^9 times the others (the
// dense rate: projections, router, head), the stages are equal: the bubble is the uniform 1/5 (and
// interleaved's).
static void check_pipe_planner(void) {
    ModelConfig c, sm;
    TrainOptions o, os;
    setup(&c, &o, "tiny", 8, 64);
    PlanSpec sp = spec(2);
    sp.hw.dense_tflops = sp.hw.grouped_tflops = sp.hw.attention_tflops = 0.001;
    sp.hw.hbm_gbps = sp.hw.nvlink_gbps = sp.hw.internode_gbps = 1e15;
    PlanLayout l = {1, 1, 1, 2, 1, 0, 0, RECOMPUTE_NONE, 4, 0, 0};
    PlanRow w;
    PlanPipe p;
    EXPECT(!plan_layout(&w, &c, &o, &sp, &l, NULL, &p), "tiny pp2 micro4");
    double a = 289536, cc = 338688, want = 1 - 12 * (a + cc) / (2 * (3 * a + 12 * cc));
    EXPECT(p.kind == SCHED_1F1B && p.pp == 2 && p.vpp == 1 && p.micro == 4, "the pipe's shape");
    EXPECT_NEAR(p.tf[1] / p.tf[0], cc / a, 1e-9, "stage 1's forward over stage 0's: (layer + head) / layer");
    EXPECT_NEAR(p.tb[0] / p.tf[0], 2, 1e-12, "stage 0: backward = 2 x forward");
    EXPECT_NEAR(p.tb[1] / p.tf[1], 2, 1e-12, "stage 1: backward = 2 x forward");
    EXPECT_NEAR(w.bubble, want, 1e-9, "the bubble of a last stage (layer + head) / layer slower, by hand");
    EXPECT(w.bubble > 0.2 + 1e-3, "the heavier last stage idles the pipeline more than equal stages' 1/5");
    double span;
    EXPECT(plan_pipe_simulate(&p, NULL, &span) == w.bubble && span == w.step,
           "the row is the pipe's simulation");
    double busy = w.compute + w.host + w.comm;
    EXPECT(w.bubble_s > 0 && fabs(busy + w.bubble_s - w.step) <= 1e-12 * w.step,
           "the columns add up: %.9g + %.9g = step %.9g", busy, w.bubble_s, w.step);
    EXPECT_NEAR(w.step / (w.compute / (12 * cc) * (3 * a + 12 * cc)), 1, 1e-9,
                "the step: the span 3a + 12c, the slowest stage's compute 4 x 3c");
    // a heavier head: a larger bubble
    ModelConfig big = c;
    big.vocab_size = 1024;
    PlanRow wb;
    EXPECT(!plan_layout(&wb, &big, &o, &sp, &l, NULL, NULL) && wb.bubble > w.bubble + 1e-3,
           "vocab 1024: bubble %.6f, vocab 256: %.6f", wb.bubble, w.bubble);
    // interleaved, the small preset (4 layers, d 256, 8 heads of 32, 4 kv heads, 8 experts of 512, top-2,
    // vocab 256) on 2 x 2 chunks: the head on virtual stage 3 (stage 1's second chunk) alone; a layer 2 x 256
    // x 32 x 24 + 2 x 2 x 8 x 32 x 32 + 2 x 256 x 8 + 2 x 2 x 3 x 256 x 512 = 2002944, the head 131072
    setup(&sm, &os, "small", 16, 64);
    PlanLayout li = {1, 1, 1, 2, 2, 0, 0, RECOMPUTE_NONE, 4, 0, 0};
    EXPECT(!plan_layout(&w, &sm, &os, &sp, &li, NULL, &p) && p.kind == SCHED_INTERLEAVED && p.vpp == 2,
           "small pp2 vpp2 micro4");
    EXPECT(fabs(p.tf[1] / p.tf[0] - 1) < 1e-9 && fabs(p.tf[2] / p.tf[0] - 1) < 1e-9 &&
               fabs(p.tf[3] / p.tf[0] - 2134016.0 / 2002944) < 1e-9,
           "the chunks' forwards %.9g %.9g %.9g %.9g: the head on virtual stage 3 alone", p.tf[0], p.tf[1],
           p.tf[2], p.tf[3]);
    // equal stages: the head (and the projections and router) at 10^9 times the rate
    sp.hw.dense_tflops = 1e6;
    EXPECT(!plan_layout(&w, &c, &o, &sp, &l, NULL, NULL), "tiny pp2 micro4, a free head");
    EXPECT_NEAR(w.bubble, schedule_bubble(SCHED_1F1B, 2, 1, 4, 1, 2), 1e-8,
                "equal stages: the uniform 1f1b bubble");
    EXPECT(!plan_layout(&w, &sm, &os, &sp, &li, NULL, NULL), "small pp2 vpp2 micro4");
    EXPECT_NEAR(w.bubble, schedule_bubble(SCHED_INTERLEAVED, 2, 2, 4, 1, 2), 1e-8,
                "equal stages: the uniform interleaved bubble");
}

// Every layout of the small preset on 8 GPUs: the step is the slowest stage's compute, host overhead and
// exposed comm plus its idle (the columns add up), that idle never negative; a pipeline idles (bubble > 0),
// one stage does not.
static void check_pipe_columns(void) {
    ModelConfig c;
    TrainOptions o;
    setup(&c, &o, "small", 32, 128);
    PlanSpec sp = spec(8);
    PlanResult r;
    plan_enumerate(&r, &c, &o, &sp, 0);
    int bad = 0, piped = 0;
    for (int i = 0; i < r.n; i++) {
        const PlanRow *w = &r.rows[i];
        double busy = w->compute + w->host + w->comm;
        piped += w->l.pp > 1;
        bad += !(fabs(busy + w->bubble_s - w->step) <= 1e-12 * w->step && w->bubble_s >= 0 &&
                 (w->l.pp > 1 ? w->bubble > 0 && w->bubble_s > 0 : w->bubble == 0 && w->bubble_s == 0));
    }
    EXPECT(!bad && piped > 100, "%d of %d rows' columns do not add up (%d pipelined)", bad, r.n, piped);
    plan_result_free(&r);
}

// The memory-bound ops (cost_ops.c) of the tiny preset on one GPU, by hand: d 96, 4 heads and 2 kv heads of
// 24 (q width 96, k and v 48), 4 experts top-2, vocab 256, 2 layers; N tokens, M = 2N rows to the experts,
// f = 4 bytes a float32 value, h = 2 a bf16 one (the cuda rows). A layer, bytes per token (N d = 96 N):
//  norms: forward N d (f + h) + 4 N d f = 22 N d, backward 2 x 6 N d f = 48 N d;
//  RoPE: q, k, v read in f, written in h: (96 + 2 x 48) x 6 = 1152; backward dq, dk read and written:
//        2 x 4 x (96 + 48) = 1152;
//  the residual add, joined to the combine (TP 1, no shared expert): x_mid read, N d f = 4 N d;
//  gathers and combines: forward M d (f + h) + (M + N) d f = 12 + 12 = 24 N d, backward M d (2f + h) +
//        (M + N) d f = 20 + 12 = 32 N d;
//  router: 2 N E f + 2 N k 4 + 3 M 4 + 2 N E f = 32 + 16 + 24 + 32 = 104;
// = 130 x 96 + 2304 + 104 = 14888 a token, two layers 29776; the embedding 5 N d f = 1920; the last
// stage's final norm 8 N d f = 3072, the clear of dres N d f = 384, cross-entropy 4 N V f = 4096: 39248 a
// token. Forward: a layer (22 + 4 + 24) N d + 1152 + 52 (half the router's) = 6004, two 12008, the
// embedding's 768, the final norm's 768, cross-entropy 4096: 17640. The gradient norm reads every gradient
// in float32 (mixed): the parameters 2 V d + d + 2 (2 d + 2 d H hd + 2 d KV hd + E d + 3 E d f) = 49152 + 96
// + 2 x 249408 = 548064 (the preset's 548K), 4 bytes each, but for the routed experts' 2 x 3 E d f = 442368
// where one micro-batch makes the gradient ledger stand for them (options.h train_dw_ledger).
static void check_memops(void) {
    ModelConfig c;
    TrainOptions o;
    setup(&c, &o, "tiny", 2, 64);
    double N = 128, tok = 39248, fwd = 17640, P = 548064, X = 442368;
    CostBytes b;
    cost_bytes(&b, &c, NULL, N, 0, c.n_layers, 1, 1, 2);
    EXPECT(b.total == tok * N && b.fwd == fwd * N, "tiny: %.17g bytes (forward %.17g), by hand %.17g (%.17g)",
           b.total, b.fwd, tok * N, fwd * N);
    // 4096 rows: each norm's backward in one kernel (4 N d f for 6: two layers' two norms 2 x 16 x 96 less,
    // the final norm's 2 x 4 x 96), the forward the same; on float32 rows (h 4) not
    cost_bytes(&b, &c, NULL, 4096, 0, c.n_layers, 1, 1, 2);
    EXPECT(b.total == (tok - 2 * 16 * 96 - 2 * 4 * 96) * 4096 && b.fwd == fwd * 4096,
           "tiny, 4096 rows: %.17g bytes (forward %.17g)", b.total, b.fwd);
    cost_bytes(&b, &c, NULL, 4096, 0, c.n_layers, 1, 1, 4);
    CostBytes b2;
    cost_bytes(&b2, &c, NULL, 128, 0, c.n_layers, 1, 1, 4);
    EXPECT(b.norm == b2.norm * 32, "tiny, float32 rows: the norms' bytes not in proportion to the rows");
    // RoPE with 4 kv heads (k and v 96 wide, past MOE_GEMM_FP32_MAX_O as q is: attention.c qkv_hid), by hand
    // a layer and token: in h, the forward's q and k rotated in place, 2 h (96 + 96) = 768, the backward's
    // dq, dk, dv read in f and written in h, (96 + 2 x 96) (f + h) = 1728; in float32 rows (h 4) as before,
    // q, k, v read and written once, (96 + 192) x 8 = 2304, and dq, dk rotated in place, 2 x 4 x 192 = 1536
    c.n_kv_heads = 4;
    cost_bytes(&b, &c, NULL, 128, 0, c.n_layers, 1, 1, 2);
    cost_bytes(&b2, &c, NULL, 128, 0, c.n_layers, 1, 1, 4);
    EXPECT(b.rope == 2 * (768 + 1728) * 128.0 && b2.rope == 2 * (2304 + 1536) * 128.0,
           "tiny, 4 kv heads: RoPE %.17g bytes in bf16 rows (by hand %.17g), %.17g in float32 (%.17g)",
           b.rope, 2 * (768 + 1728) * 128.0, b2.rope, 2 * (2304 + 1536) * 128.0);
    c.n_kv_heads = 2;
    ParamTable t;
    params_build(&t, &c);
    EXPECT(cost_gnorm_bytes(&t, NULL, &o) == 4 * (P - X), "gradient norm: %.17g bytes, by hand %.17g",
           cost_gnorm_bytes(&t, NULL, &o), 4 * (P - X));
    o.grad_accum = 2; // (two micro-batches: no ledger, every gradient read)
    EXPECT(cost_gnorm_bytes(&t, NULL, &o) == 4 * P,
           "gradient norm, 2 micro-batches: %.17g bytes, by hand %.17g", cost_gnorm_bytes(&t, NULL, &o),
           4 * P);
    o.grad_accum = 1;
    // zero tokens, zero bytes; no gradients, nothing to read
    cost_bytes(&b, &c, NULL, 0, 0, c.n_layers, 1, 1, 2);
    ParamTable none = {0}; // (no tensors, so no sums: params.h ParamTable.lby)
    EXPECT(b.total == 0 && b.fwd == 0 && cost_gnorm_bytes(&none, NULL, &o) == 0, "zero: %g bytes", b.total);
    params_free(&t);
    // EP 2 (an exchange that is not local): each layer's arrived rows permuted and the outputs back, forward
    // and backward, Rg = M = 2N rows each read and written in h and f: 4 Rg d (h + f) = 48 N d more a layer
    MeshShape ms = {2, 1, 0, 1, 2, 1, 0, 0, 0};
    EXPECT(!mesh_shape_resolve(&ms, &c), "tiny ep2");
    CostBytes be;
    cost_bytes(&be, &c, &ms, N, 0, c.n_layers, 1, 1, 2);
    EXPECT(be.total == (tok + 2 * 48 * 96) * N, "tiny ep2: %.17g bytes, by hand %.17g", be.total,
           (tok + 2 * 48 * 96) * N);
    // the planner at hbm_gbps 100 (GB/s), the GEMMs and attention free: the memory-bound ops are those
    // bytes at PLAN_MEMOPS_HBM x 100 GB/s and the gradient norm's at 100 GB/s; the compute adds AdamW's
    // 30 bytes an element
    PlanSpec sp = spec(1);
    sp.hw.dense_tflops = sp.hw.grouped_tflops = sp.hw.attention_tflops = 1e15;
    sp.hw.hbm_gbps = 100;
    double bw = 100e9, want = tok * N / (PLAN_MEMOPS_HBM * bw) + 4 * (P - X) / bw;
    PlanLayout l = {1, 1, 1, 1, 1, 0, 0, RECOMPUTE_NONE, 1, 0, 0};
    PlanRow w, w2, w4;
    EXPECT(!plan_layout(&w, &c, &o, &sp, &l, NULL, NULL), "tiny, one GPU");
    EXPECT(fabs(w.memops - want) <= 1e-12 * want && fabs(w.compute - want - 30 * P / bw) <= 1e-9 * want,
           "tiny at 100 GB/s: memory-bound ops %.12g s, by hand %.12g s; compute %.12g s", w.memops, want,
           w.compute);
    // zero bytes cost zero seconds: the step's time is their bytes over the rate, nothing fixed per op
    sp.hw.hbm_gbps = 1e15;
    EXPECT(!plan_layout(&w2, &c, &o, &sp, &l, NULL, NULL) && w2.memops < 1e-6 * want,
           "a free HBM: %g s of memory-bound ops", w2.memops);
    // twice the tokens (batch 4: one micro-batch of 256, or two of 128): twice the passes' seconds, the
    // gradient norm's once a step (with two micro-batches every gradient read: no ledger)
    sp.hw.hbm_gbps = 100;
    o.batch = 4;
    double g = 4 * (P - X) / bw, g2 = 4 * P / bw;
    EXPECT(!plan_layout(&w2, &c, &o, &sp, &l, NULL, NULL), "tiny batch 4");
    l.micro = 2;
    EXPECT(!plan_layout(&w4, &c, &o, &sp, &l, NULL, NULL), "tiny batch 4, micro 2");
    EXPECT(fabs((w2.memops - g) / (w.memops - g) - 2) < 1e-12 &&
               fabs((w4.memops - g2) / (w.memops - g) - 2) < 1e-12,
           "batch 4: %.12g s, micro 2: %.12g s, batch 2: %.12g s (gradient norm %.12g s, %.12g s)", w2.memops,
           w4.memops, w.memops, g, g2);
}

// --recompute-layers: where recomputing every layer fits and keeping them does not, the plan keeps the
// fewest first layers that fit. The reference model on one GPU at micro 2 (--grad-accum 2: no gradient
// memory lent, so recomputing frees memory), the GPU's memory set halfway between keeping every layer's
// activations and recomputing every layer's experts: the moe row recomputes N of the L layers, 1 <= N < L,
// fits, N - 1 layers (none at N = 1) do not, and it computes less than every layer recomputing and more than
// none; its --explain words carry N and read back, and recompute-layersN needs a mode.
static void check_recompute_layers(void) {
    ModelConfig c;
    TrainOptions o;
    setup(&c, &o, "peers-ref", 8, 2048);
    PlanSpec sp = spec(1);
    PlanLayout none = {1, 1, 1, 1, 1, 0, 0, RECOMPUTE_NONE, 2, 0, 0}, all = none;
    all.recompute = RECOMPUTE_MOE;
    PlanRow a, b;
    EXPECT(!plan_layout(&a, &c, &o, &sp, &none, NULL, NULL) &&
               !plan_layout(&b, &c, &o, &sp, &all, NULL, NULL) && b.mem < a.mem,
           "micro2: keeping %.4g GiB, recomputing the experts everywhere %.4g", a.mem / 1073741824.0,
           b.mem / 1073741824.0);
    sp.hw.mem_bytes = (a.mem + b.mem) / 2;
    PlanResult r;
    plan_enumerate(&r, &c, &o, &sp, 0);
    const PlanRow *w = NULL;
    for (int i = 0; i < r.n; i++)
        if (r.rows[i].l.micro == 2 && r.rows[i].l.recompute == RECOMPUTE_MOE) w = &r.rows[i];
    int L = c.n_layers, N = w ? w->l.rc_layers : -1;
    EXPECT(w && N >= 1 && N < L && w->mem <= sp.hw.mem_bytes, "micro2 recompute-moe: %d first layers of %d",
           N, L);
    if (w && N >= 1) {
        PlanLayout fewer = all;
        fewer.rc_layers = N - 1;
        PlanRow f;
        const PlanLayout *lf = N > 1 ? &fewer : &none;
        EXPECT(!plan_layout(&f, &c, &o, &sp, lf, NULL, NULL) && f.mem > sp.hw.mem_bytes,
               "%d layers recomputing: %.4g GiB, over the GPU's %.4g", N - 1, f.mem / 1073741824.0,
               sp.hw.mem_bytes / 1073741824.0);
        EXPECT(w->compute < b.compute && w->compute > a.compute,
               "%d layers recomputing: compute %.6g s, between none's %.6g and every layer's %.6g", N,
               w->compute, a.compute, b.compute);
        char words[256];
        snprintf(words, sizeof words, "micro2 recompute-moe recompute-layers%d", N);
        PlanLayout back;
        EXPECT(!plan_parse_layout(&back, words, &o) && back.rc_layers == N && back.recompute == RECOMPUTE_MOE,
               "'%s' read back", words);
    }
    plan_result_free(&r);
    refuses("recompute-layers2", 1, "recompute-layersN limits recompute-attn|moe|full", -1);
    refuses("recompute-moe recompute-layers0", 1, "'recompute-layers0': recompute-layersN, N >= 1", -1);
}

int main(void) {
    check_count();
    check_memory();
    check_one_gpu();
    check_host();
    check_refusals();
    check_monotone();
    check_smallest();
    check_roundtrip();
    check_fp8();
    check_pipe_equal();
    check_pipe_planner();
    check_pipe_columns();
    check_memops();
    check_recompute_layers();
    return test_done("test_plan");
}
