// plan.c — the planner's enumeration and its model of a layout's memory and step time (plan.h says the
// assumptions), on the cost model's figures (cost.h).
// Must not hold: printing (plan_print.c), the cost arithmetic (cost.c), the profiles (hwprofile.c).
#include "train/plan.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "model/params.h"
#include "model/model.h"
#include "parallel/stages.h"
#include "train/cost.h"
#include "train/cost_acts.h"
#include "train/schedule.h"

const char *const plan_reason_name[PLAN_R_N] = {"mesh", "pipeline", "batch", "schedule", "memory"};

// The train options of layout l (o's others kept; --pp-layers as split: "" the even split): what `moe info
// --world G` and `moe train` take.
static void plan_options(TrainOptions *t, const TrainOptions *o, const PlanLayout *l, const char *split) {
    *t = *o;
    t->tp = l->tp;
    t->ep = l->ep;
    t->etp = l->etp;
    t->pp = l->pp;
    t->vpp = l->vpp;
    t->pp_schedule = l->vpp > 1 ? SCHED_INTERLEAVED : SCHED_1F1B;
    snprintf(t->pp_layers, sizeof t->pp_layers, "%s", split);
    t->zero = l->zero;
    t->recompute = l->recompute;
    t->recompute_layers = l->rc_layers;
    t->grad_accum = l->micro;
    t->vocab_parallel = l->vocab;
}

// Whether some group of kind k (0 tp, 1 dp and edp, 2 ep, 3 etp, 4 pp) holds ranks of two nodes of n:
// each rank against its group's first member (its coordinate in that kind 0; mesh.h's rank order).
static int spans_nodes(const MeshShape *s, int k, int n) {
    int S = s->tp * s->dp;
    for (int r = 0; r < s->world; r++) {
        MeshCoord m = mesh_coord(s, r);
        int base = m.pp * S, lead[2] = {-1, -1};
        if (k == 0) lead[0] = base + s->tp * m.dp;
        if (k == 1) {
            lead[0] = base + m.tp;
            lead[1] = base + m.etp + s->etp * m.ep; // edp
        }
        if (k == 2) lead[0] = base + m.etp + s->etp * s->ep * m.edp;
        if (k == 3) lead[0] = base + s->etp * (m.ep + s->ep * m.edp);
        if (k == 4) lead[0] = m.stage;
        for (int i = 0; i < 2; i++)
            if (lead[i] >= 0 && lead[i] / n != r / n) return 1;
    }
    return 0;
}

// A part of a stage's compute a step (every micro-batch): its seconds (all), of them the forwards' (fwd: a
// third of the FLOPs but the recomputed ones, which run in the backward), the experts' (grouped) at their
// rate (TFLOP/s), and the GEMMs of the TP-split layers (tp_gemm: the attention projections, a dense layer's
// MLP; not the router, not the LM head), which TP communication overlap hides the TP collectives behind.
typedef struct {
    double all, fwd, grouped, rate, tp_gemm, mem; // mem: of all, the memory-bound ops' (cost_bytes)
} PartTimes;

// The compute of layers layers, moe of them MoE layers, on one rank of m, with the LM head and the MTP
// modules (each an MoE block, eh_proj and the LM head again) when last: their share of the step's FLOPs at
// the profile's rates (the experts' under --precision fp8 at its fp8 rate: their quantisation passes
// included; with sp->grouped_shape scaled to the nearest measured expert shape), the recomputed forwards
// (--recompute moe: the experts' w1 and w3 again, 2/9 of their training FLOPs; attn: attention's forward,
// 1/3 of its) in the rcl of the layers and rcm of the MoE layers that recompute (--recompute-layers). A dense
// layer (config dense_layers) runs its MLP at the dense rate and has no router. The LM head runs whole on
// every TP rank, or split over them by vocabulary rows (--vocab-parallel: MeshShape.vocab, as Megatron's
// output layer and its cross-entropy). The memory-bound ops (cost_bytes) at PLAN_MEMOPS_HBM x the HBM rate.
static void part_compute(PartTimes *pt, const CostMesh *m, const ModelConfig *c, const TrainOptions *t,
                         const PlanSpec *sp, int v, int layers, int moe, int rcl, int rcm) {
    const HwProfile *hw = &sp->hw;
    int last = v == m->ms.pp * m->vpp - 1;
    CostFlops f;
    cost_flops(&f, c, t->seq_len);
    double tok = 3.0 * m->micro * m->Bl * t->seq_len, tp = m->ms.tp, D = last ? c->mtp_depth : 0,
           d = c->d_model, mlp = 2 * 3 * d * c->dense_d_ff;
    double grouped = tok * (moe + D) * f.experts / tp, attn = tok * (layers + D) * f.attn_scores / tp;
    double head = m->ms.vocab ? f.head / tp : f.head;
    double dense = tok * (layers * (f.attn_proj + f.router) / tp + (last ? head : 0));
    // (each 0 without dense layers and MTP modules)
    dense += tok *
        ((layers - moe) * (mlp - f.router) / tp + D * ((f.attn_proj + f.router) / tp + head + 4 * d * d));
    double gr = prec_fp8(t->precision) ? hw->fp8_grouped_tflops : hw->grouped_tflops;
    if (sp->grouped_shape) gr *= hwprofile_grouped_shape(c->d_model, c->d_ff, NULL);
    double dr = hw->dense_tflops * 1e12, ar = hw->attention_tflops * 1e12;
    pt->fwd = (grouped / (gr * 1e12) + dense / dr + attn / ar) / 3;
    pt->tp_gemm = tok * ((layers + D) * f.attn_proj + (layers - moe) * mlp) / tp / dr;
    // (--recompute-layers: in rcl of the layers, rcm of the MoE layers; the MTP modules' only in every
    // layer's)
    double Dr = t->recompute_layers ? 0 : D;
    if (t->recompute & RECOMPUTE_MOE && moe + D > 0) grouped *= 1 + 2.0 / 9 * (rcm + Dr) / (moe + D);
    if (t->recompute & RECOMPUTE_ATTN && layers + D > 0) attn *= 1 + 1.0 / 3 * (rcl + Dr) / (layers + D);
    pt->grouped = grouped / (gr * 1e12);
    pt->rate = gr;
    // the memory-bound ops of each micro-batch (cost_ops.c: the cuda backend's rows in bf16) at their rate
    CostBytes b;
    cost_bytes(&b, c, &m->ms, (double)m->Bl * t->seq_len, m->sp.first[v], m->sp.first[v + 1], v == 0, last,
               2);
    // (cost_bytes counts a split head's columns: the logits' columns / TP a rank)
    double bw = hw->hbm_gbps * 1e9 * PLAN_MEMOPS_HBM;
    pt->mem = m->micro * b.total / bw;
    pt->fwd += m->micro * b.fwd / bw;
    pt->all = pt->grouped + dense / dr + attn / ar + pt->mem;
}

// A stage's chunks, walked once: each virtual stage's layers (the trainer's split, m->sp), MoE layers and
// compute; the PP messages each sends (set by stage_pp); the stage's sums.
typedef struct {
    int n; // chunks (vpp); chunk ch is virtual stage ch x pp + s
    int lay[STAGES_MAX], moe[STAGES_MAX], L, E, P; // layers, MoE layers; their sums; P the PP messages
    PartTimes ch[STAGES_MAX];
    double comp, adamw, gnorm; // the chunks' compute; AdamW and the gradient norm over the elements the stage
                               // updates
    double fwd, grouped, rate, tp_gemm, mem; // of comp, the forwards', the experts' (at rate), the TP-split
                                             // GEMMs', the memory-bound ops'
    double on[STAGES_MAX], back[STAGES_MAX]; // each chunk's exposed PP seconds: output on, gradient back
} StageWork;

static void stage_work(StageWork *w, const CostMesh *m, int s, const ModelConfig *c, const TrainOptions *t,
                       const PlanSpec *sp) {
    int S = m->ms.pp * m->vpp;
    memset(w, 0, sizeof *w);
    w->n = m->vpp;
    for (int ch = 0; ch < m->vpp; ch++) {
        int v = ch * m->ms.pp + s;
        w->lay[ch] = m->sp.first[v + 1] - m->sp.first[v];
        int rcl = 0, rcm = 0; // (the layers that recompute: cost_acts.h rc_of, --recompute-layers' rule)
        for (int l = m->sp.first[v]; l < m->sp.first[v + 1]; l++) {
            int rc = rc_of(t, l) != 0;
            w->moe[ch] += !config_layer_dense(c, l);
            rcl += rc;
            rcm += rc && !config_layer_dense(c, l);
        }
        part_compute(&w->ch[ch], m, c, t, sp, v, w->lay[ch], w->moe[ch], rcl, rcm);
        w->L += w->lay[ch];
        w->E += w->moe[ch];
        w->P += (v < S - 1) + (v > 0);
        w->comp += w->ch[ch].all;
        w->fwd += w->ch[ch].fwd;
        w->grouped += w->ch[ch].grouped;
        w->tp_gemm += w->ch[ch].tp_gemm;
        w->mem += w->ch[ch].mem;
        w->rate = w->ch[ch].rate;
    }
    // (bytes an element: the gradient; w, m, v read and written; the bf16 w)
    double mb = prec_bf16_storage(t->precision) ? 2.0 : 4.0, per = 4 + 8 + 4 * mb + 2;
    double elems = m->stage[s].mem.moments / mb / 2;
    w->adamw = elems * per / (sp->hw.hbm_gbps * 1e9);
    w->gnorm = m->stage[s].gnorm / (sp->hw.hbm_gbps * 1e9);
}

static double min2(double a, double b) { return a < b ? a : b; }

// The stage's PP messages, pp seconds a step (cs's pp: the forward's output on from all but the last virtual
// stage, the backward's gradient back from all but the first, an equal share each), into w->on, w->back;
// hide (Megatron's --overlap-p2p-comm, interleaved schedules only): each send behind the compute of the
// action after it, at least a forward of the chunk it leaves (min(send, that forward)), keep of that hidden
// (the stage's hidden messages scaled to its compute: layout_figures). Returns the exposed seconds.
static double stage_pp(StageWork *w, int pp, int s, double pp_s, int hide, double keep) {
    int S = pp * w->n;
    double exposed = 0;
    for (int ch = 0; ch < w->n; ch++) {
        int v = ch * pp + s;
        double on = w->P ? pp_s * (v < S - 1) / w->P : 0, back = w->P ? pp_s * (v > 0) / w->P : 0;
        if (hide && w->n > 1) {
            on -= keep * min2(on, w->ch[ch].fwd);
            back -= keep * min2(back, w->ch[ch].fwd);
        }
        w->on[ch] = on;
        w->back[ch] = back;
        exposed += on + back;
    }
    return exposed;
}

// Stage s's forward and backward times of one micro-batch in p: each of its virtual stages' own compute, the
// messages where they are sent (cs: the stage's exposed seconds a step, tp, ep, etp, dp, pp): TP, EP and ETP
// per layer (the last two per MoE layer), half in the forward, half in the backward; PP as stage_pp placed
// them; the rest of its busy time (rest: compute, AdamW and host overhead, the DP gradients, once a step)
// spread in proportion to the compute.
static void stage_times(PlanPipe *p, const StageWork *w, int s, double rest, const double *cs) {
    double k = rest / w->comp;
    for (int ch = 0; ch < w->n; ch++) {
        int v = ch * p->pp + s;
        double msg = cs[0] * w->lay[ch] / w->L + (w->E ? (cs[1] + cs[2]) * w->moe[ch] / w->E : 0);
        p->tf[v] = (k * w->ch[ch].fwd + msg / 2 + w->on[ch]) / p->micro;
        p->tb[v] = (k * (w->ch[ch].all - w->ch[ch].fwd) + msg / 2 + w->back[ch]) / p->micro;
    }
}

double plan_pipe_simulate(const PlanPipe *p, SchedEvent *ev, double *span) {
    int n = 2 * p->pp * p->vpp * p->micro;
    SchedEvent *e = ev ? ev : xmalloc(sizeof *e * (size_t)n);
    double b = schedule_simulate_times(p->kind, p->pp, p->vpp, p->micro, &(SchedTimes){p->tf, p->tb}, e);
    *span = 0;
    for (int i = 0; i < n; i++)
        if (e[i].t1 > *span) *span = e[i].t1;
    if (!ev) free(e);
    return b;
}

// The fraction of a stage's micro-batches (chunks, with VPP) Megatron-Core's 1F1B schedule runs in its steady
// phase, a forward beside a backward (their all-to-alls behind each other's compute): all but the warmup's,
// (pp - s - 1) x 2 + (vpp - 1) x pp with VPP, pp - s - 1 without (schedules.py's num_warmup_microbatches).
static double steady_fraction(const CostMesh *m, int s) {
    int pp = m->ms.pp, v = m->vpp, n = m->micro * v;
    int warm = v > 1 ? (pp - s - 1) * 2 + (v - 1) * pp : pp - s - 1;
    return warm >= n ? 0 : (double)(n - warm) / n;
}

// Megatron-Core's distributed optimizer's state of a rank's slices lt (its documentation's table: bf16
// parameters and float32 gradients, 6 + 12 / d bytes a parameter, the float32 master weights and both moments
// sharded over the d ranks of the tensor's data-parallel group: DP, the experts' EDP).
static double megatron_state(const ParamTable *lt, const MeshShape *ms) {
    double b = 0;
    for (int i = 0; i < lt->n; i++) {
        const ParamSpec *p = &lt->p[i];
        b += p->lnumel * (6 + 12.0 / (p->reduce == RED_EDP ? ms->edp : ms->dp));
    }
    return b;
}

// What a step costs the host beyond the FLOPs, counted from the code (docs/PLAN.md "Launches and host
// synchronisations"; test_plan.sh checks the count against MOE_PROFILE=1's calls): the backend ops (each one
// CUDA launch or more: a bf16 GEMM converts its operand first) a layer's forward and backward call on one
// micro-batch (forward: 3 matmuls, 2 grouped GEMMs, 2 norms, 2 RoPE, attention, 2 gathers, 3 router ops,
// 1 add (the block's residual add joins the MoE combine: moe.c moe_finish, one process of TP 1), 2 copies;
// backward: 3 + 2 + 2 + 2 + 1 + 2, 1 router op, 3 copies; GQA's without QK-norm and biases whose q, k, v
// products are all bf16 ones one more, to_hid_rows: not counted here), those once per micro-batch
// (embedding, final norm, LM head forward and backward, cross-entropy) and once per step (the gradient norm,
// AdamW over every tensor in one launch, 5 copies and clears); the host synchronisations: the routing's copy
// to the host, once per MoE layer's forward, and the loss and the gradient norm once a step.
#define PLAN_OPS_LAYER 34
#define PLAN_OPS_MICRO 7
#define PLAN_OPS_STEP 7
#define PLAN_SYNCS_STEP 2

// Stage s's host overhead in seconds on top of its compute comp: launches are queued ahead of the GPU,
// so they cost time only where they take longer than the GPU's work; each synchronisation drains the
// queue and costs its round trip (hw->launch_us, hw->sync_us; 0: not counted). *launches, *syncs: the counts.
static double stage_host(const CostMesh *m, int s, const HwProfile *hw, double comp, double *launches,
                         double *syncs) {
    int layers = 0;
    for (int ch = 0; ch < m->vpp; ch++) {
        int v = ch * m->ms.pp + s;
        layers += m->sp.first[v + 1] - m->sp.first[v];
    }
    *launches = (double)m->micro * (layers * PLAN_OPS_LAYER + PLAN_OPS_MICRO) + PLAN_OPS_STEP;
    *syncs = (double)m->micro * layers + PLAN_SYNCS_STEP;
    double queue = *launches * hw->launch_us * 1e-6;
    return (queue > comp ? queue - comp : 0) + *syncs * hw->sync_us * 1e-6;
}

// Rank 0's EP group on nodes of n GPUs: the nodes it spans (*nodes) and its members on rank 0's node
// (*local).
static void ep_geometry(const MeshShape *s, int n, int *nodes, int *local) {
    int S = s->tp * s->dp;
    char *seen = xcalloc((size_t)(S / n + 1), 1);
    MeshCoord m0 = mesh_coord(s, 0);
    int lead0 = m0.etp + s->etp * s->ep * m0.edp;
    *nodes = *local = 0;
    for (int r = 0; r < S; r++) { // (rank 0's stage: its ranks 0 .. S-1)
        MeshCoord m = mesh_coord(s, r);
        if (m.etp + s->etp * s->ep * m.edp != lead0) continue;
        *local += r / n == 0;
        if (!seen[r / n]++) ++*nodes;
    }
    free(seen);
}

// The seconds of an EP all-to-all of B bytes a rank (cost_mesh's: every row bound for another rank of the
// group) whose group spans nodes, as the links carry it (PlanSpec.a2a_links): split: the rows for the ranks
// of the own node over NVLink beside the rest over the inter-node link; deepep: DeepEP's normal kernels, a
// token's rows for the experts of one remote node crossing the network once (then forwarded over NVLink),
// the remote nodes a token reaches the expected count of k experts drawn evenly (node-limited routing,
// n_group groups one a node, topk_group of them: topk_group x (nodes - 1) / nodes), every row over NVLink
// at most once beside it.
static double ep_link_seconds(double B, const MeshShape *ms, const ModelConfig *c, const PlanSpec *sp) {
    int nodes, local, g = ms->ep, k = c->top_k;
    ep_geometry(ms, sp->nodes_of, &nodes, &local);
    double nvl = sp->hw.nvlink_gbps * 1e9, ib = sp->hw.internode_gbps * 1e9, near = (local - 1.0) / (g - 1);
    if (sp->a2a_links == PLAN_LINKS_SPLIT) {
        double a = B * near / nvl, b = B * (1 - near) / ib;
        return a > b ? a : b;
    }
    double remote; // the remote nodes a token's rows reach
    if (c->n_group == nodes && c->topk_group < c->n_group) remote = c->topk_group * (nodes - 1.0) / nodes;
    else {
        double E = c->n_experts, En = E * local / g, miss = 1;
        for (int i = 0; i < k; i++) miss *= (E - En - i) / (E - i);
        remote = (nodes - 1) * (1 - miss);
    }
    double rdma = B * remote / (k * (g - 1.0) / g) / ib, nv = B / nvl;
    return rdma > nv ? rdma : nv;
}

// The seconds of each kind of stage s's communication (cs: exposed a step, tp, ep, etp, dp, pp) the
// PlanSpec's mechanisms hide behind compute (w: the stage's), each min(the messages, the compute they overlap
// with), into hid (pp: stage_pp's): the all-to-all per micro-batch behind the experts' GEMMs of another
// chunk (experts) or behind the compute of the micro-batch 1F1B pairs it with in the steady phase (1f1b); TP
// collectives behind the TP-split layers' GEMMs (TE's userbuffers, --tp-comm-overlap); the gradient reduction
// (zero 0, 1: an all-reduce, 2 of the 3 parts ZeRO 1 sends; zero 2: the reduce-scatter, 1 of 2) behind the
// backward of the last micro-batch, whose buckets it reduces as their gradients are final (our --overlap 1,
// Megatron's --overlap-grad-reduce), with grads+params ZeRO's weight all-gather (the rest) behind the forward
// of the next step's first micro-batch (Megatron's --overlap-param-gather).
static void stage_hidden(double *hid, const double *cs, const StageWork *w, const CostMesh *m, int s,
                         int zero, const PlanSpec *sp) {
    double comp = w->comp + w->adamw + w->gnorm;
    memset(hid, 0, 5 * sizeof *hid);
    // (each micro-batch's share of the all-to-all and of the compute is the same)
    hid[1] = sp->hide_a2a == PLAN_HIDE_EXPERTS ? min2(cs[1], w->grouped)
        : sp->hide_a2a == PLAN_HIDE_1F1B       ? steady_fraction(m, s) * min2(cs[1], comp)
                                               : 0;
    if (sp->hide_tp) hid[0] = min2(cs[0], w->tp_gemm);
    if (sp->hide_dp) {
        double red = zero == 2 ? 1 : 2, parts = red + (zero ? 1 : 0), r = cs[3] * red / parts;
        hid[3] = min2(r, (w->comp - w->fwd) / m->micro);
        if (sp->hide_dp == PLAN_HIDE_DP_PARAMS) hid[3] += min2(cs[3] - r, w->fwd / m->micro);
    }
}

// Layout l's mesh on gpus GPUs (dp and edp unresolved).
static MeshShape plan_shape(const TrainOptions *o, int gpus, const PlanLayout *l) {
    MeshShape ms = {gpus, l->tp, 0, l->pp, l->ep, l->etp, 0, o->a2a_hier > 1 ? o->a2a_hier : 0, 0};
    ms.vocab = l->vocab && l->tp > 1;
    return ms;
}

// The refusals before the cost model: the mesh, the layers' split, the batch, the schedule (known good where
// sched: its pipeline was made).
static const char *layout_rules(MeshShape *ms, const ModelConfig *c, const TrainOptions *o,
                                const PlanSpec *sp, const PlanLayout *l, const char *split, int sched,
                                int *reason) {
    static char msg[320];
    *ms = plan_shape(o, sp->gpus, l);
    const char *bad = mesh_shape_resolve(ms, c);
    *reason = PLAN_R_MESH;
    if (bad) return snprintf(msg, sizeof msg, "mesh: %s", bad), msg;
    if (prec_fp8(o->precision) && l->etp > 1)
        return snprintf(msg, sizeof msg, "mesh: --precision %s takes --etp 1 (got %d)",
                        prec_name(o->precision), l->etp),
               msg;
    if (l->dp && l->dp != ms->dp)
        return snprintf(msg, sizeof msg, "mesh: dp %d, but %d GPUs / (tp %d x pp %d) = dp %d", l->dp,
                        sp->gpus, l->tp, l->pp, ms->dp),
               msg;
    *reason = PLAN_R_PIPELINE;
    if (l->pp == 1 && l->vpp > 1) return "pipeline: --vpp needs --pp > 1";
    if (l->pp == 1 && split[0]) return "pipeline: --pp-layers needs --pp > 1";
    StageSplit ss;
    if (l->pp > 1 && (bad = stages_split(&ss, c->n_layers, l->pp, l->vpp, split)))
        return snprintf(msg, sizeof msg, "pipeline: %s", bad), msg;
    *reason = PLAN_R_BATCH;
    if (l->micro < 1 || o->batch % ((long long)l->micro * ms->dp))
        return snprintf(
                   msg, sizeof msg,
                   "batch: --batch %d is not divisible by --grad-accum %d x dp %d (each DP rank takes an "
                   "equal share of every micro-batch)",
                   o->batch, l->micro, ms->dp),
               msg;
    long long Bl = o->batch / l->micro / ms->dp;
    if (Bl * o->seq_len > config_max_tokens(c))
        return snprintf(msg, sizeof msg,
                        "batch: %lld tokens per micro-batch on a rank; this model takes at most %lld",
                        Bl * o->seq_len, (long long)config_max_tokens(c)),
               msg;
    if (o->loss_chunks > Bl * o->seq_len) // (as moe train refuses it: model_set_loss_chunks)
        return snprintf(msg, sizeof msg,
                        "batch: --loss-chunks %d past the %lld rows of a micro-batch on a rank",
                        o->loss_chunks, Bl * o->seq_len),
               msg;
    *reason = PLAN_R_SCHEDULE;
    if (l->pp > 1 && !sched) {
        Schedule sc;
        bad = schedule_build(&sc, l->vpp > 1 ? SCHED_INTERLEAVED : SCHED_1F1B, l->pp, 0, l->vpp, l->micro);
        if (bad) return snprintf(msg, sizeof msg, "schedule: %s", bad), msg;
        schedule_free(&sc);
    }
    return NULL;
}

// Stage s's state under Megatron's distributed optimizer (megatron_state), on the table lts holds for it
// (NULL: built here from m's mesh and split).
static double stage_megatron(const CostMesh *m, int s, const ModelConfig *c, const CostTable *lts) {
    if (lts) return megatron_state(lts[s].t, &m->ms);
    ParamSlicing sl = {m->ms.tp, 0, m->ms.ep, 0, m->ms.etp, 0, m->ms.pp > 1 ? &m->sp : NULL, s, m->ms.vocab};
    ParamTable t;
    params_build_local(&t, c, &sl);
    double b = megatron_state(&t, &m->ms);
    params_free(&t);
    return b;
}

// plan_layout on the stages' parameter tables of its mesh and split (lts; NULL: built by cost_mesh) and its
// pipeline (cp: cost_pipe of its options; NULL: made by cost_mesh_tables), the layers split as --pp-layers
// split ("": evenly); pipe: room for the pipeline (filled whether or not the caller wants it: the step is
// simulated on it).
static const char *layout_figures(PlanRow *row, const ModelConfig *c, const TrainOptions *o,
                                  const PlanSpec *sp, const PlanLayout *l, int *reason, const CostTable *lts,
                                  const CostPipe *cp, const char *split, PlanPipe *pipe) {
    static char msg[320];
    int why = 0;
    MeshShape ms;
    memset(row, 0, sizeof *row);
    const char *bad = layout_rules(&ms, c, o, sp, l, split, cp != NULL, &why);
    if (reason) *reason = why;
    if (bad) return bad;
    row->l = *l;
    row->l.dp = ms.dp;
    TrainOptions t;
    plan_options(&t, o, &row->l, split);
    CostMesh m;
    if ((bad = cost_mesh_tables(&m, c, &t, &ms, lts, cp))) {
        if (reason) *reason = PLAN_R_PIPELINE;
        return snprintf(msg, sizeof msg, "pipeline: %s", bad), msg;
    }
    const HwProfile *hw = &sp->hw;
    double bw[5];
    for (int k = 0; k < 5; k++) {
        row->inter[k] = spans_nodes(&ms, k == 0 ? 0 : k == 1 ? 2 : k == 2 ? 3 : k == 3 ? 1 : 4, sp->nodes_of);
        bw[k] = (row->inter[k] ? hw->internode_gbps : hw->nvlink_gbps) * 1e9;
    }
    double busy = -1;
    pipe->kind = ms.pp > 1 ? t.pp_schedule : SCHED_SEQUENTIAL;
    pipe->pp = ms.pp;
    pipe->vpp = m.vpp;
    pipe->micro = m.micro;
    for (int s = 0; s < ms.pp; s++) {
        const CostStage *st = &m.stage[s];
        // (the cuda backend's accounting: a plan is for GPUs)
        double mem = st->mem.cuda.total;
        if (sp->megatron_memory) // its weights, gradients, moments and bf16 copy replaced by Megatron's state
            mem += stage_megatron(&m, s, c, lts) - 2 * st->mem.params - st->mem.moments -
                st->mem.cuda.shadow + st->mem.cuda.alone;
        row->mem_info = mem > row->mem_info ? mem : row->mem_info;
        double head = (sp->imbalance - 1) * st->mem.cuda.routed;
        row->mem_headroom = head > row->mem_headroom ? head : row->mem_headroom;
        const CostComm *cm = &st->comm16; // the cuda backend's rows to the experts in bf16
        double ep = cm->ep - (sp->combine_bf16 ? cm->ep_back / 2 : 0);
        double kind[5] = {cm->tp, ep, cm->etp, cm->dp, cm->pp}, comm = 0, cs[5], hid[5];
        for (int k = 0; k < 5; k++) cs[k] = sp->exposed * kind[k] / bw[k];
        if (sp->a2a_links && row->inter[1] && ep > 0) cs[1] = sp->exposed * ep_link_seconds(ep, &ms, c, sp);
        StageWork w;
        stage_work(&w, &m, s, c, &t, sp);
        double comp = w.comp + w.adamw + w.gnorm, launches, syncs;
        stage_hidden(hid, cs, &w, &m, s, t.zero, sp);
        double pp_all = stage_pp(&w, ms.pp, s, cs[4], sp->hide_pp, 1), want = 0, keep = 1, cost;
        hid[4] = cs[4] - pp_all;
        for (int k = 0; k < 5; k++) want += hid[k];
        if (want > comp) { // one compute to hide behind: the hidden messages share it, each scaled alike
            keep = comp / want;
            for (int k = 0; k < 4; k++) hid[k] *= keep;
            pp_all = stage_pp(&w, ms.pp, s, cs[4], sp->hide_pp, keep);
            hid[4] = cs[4] - pp_all;
        }
        for (int k = 0; k < 4; k++) cs[k] -= hid[k];
        cs[4] = pp_all;
        cost = keep * want * sp->overlap_sms / PLAN_GPU_SMS; // (the SMs the hidden messages' kernels hold)
        comp += cost;
        for (int k = 0; k < 5; k++) comm += cs[k];
        double host = stage_host(&m, s, hw, comp, &launches, &syncs);
        pipe->part[s][0] = comp + host;
        pipe->part[s][1] = comm - cs[3];
        pipe->part[s][2] = cs[3];
        stage_times(pipe, &w, s, comp + host + cs[3], cs);
        if (comp + host + comm > busy) {
            busy = comp + host + comm;
            row->compute = comp;
            row->host = host;
            row->launches = launches;
            row->syncs = syncs;
            row->comm = comm;
            row->grouped_tflops = w.rate;
            row->memops = w.mem + w.gnorm;
            row->hide_want = want;
            row->overlap_cost = cost;
            memcpy(row->comm_kind, cs, sizeof cs);
            memcpy(row->hidden, hid, sizeof hid);
        }
    }
    if (sp->grouped_shape) hwprofile_grouped_shape(c->d_model, c->d_ff, &row->shape);
    row->step = busy; // (one stage: its actions back to back)
    if (ms.pp > 1) {
        row->bubble = plan_pipe_simulate(pipe, NULL, &row->step);
        row->bubble_s = row->step - busy;
    }
    row->mem = row->mem_info + row->mem_headroom + hw->context_bytes;
    double tokens = (double)o->batch * o->seq_len;
    row->tokens_s = tokens / row->step;
    row->mfu = cost_flops(NULL, c, o->seq_len) * row->tokens_s / (sp->gpus * hw->peak_tflops * 1e12);
    cost_mesh_free(&m);
    return NULL;
}

const char *plan_layout(PlanRow *row, const ModelConfig *c, const TrainOptions *o, const PlanSpec *sp,
                        const PlanLayout *l, int *reason, PlanPipe *pipe) {
    PlanPipe own;
    return layout_figures(row, c, o, sp, l, reason, NULL, NULL, o->pp_layers, pipe ? pipe : &own);
}

// The divisors of n, ascending (out: room for 2048, more than any int has); returns their count.
static int divisors(int n, int *out) {
    int k = 0, hi[1024], nh = 0;
    for (int d = 1; (long long)d * d <= n; d++)
        if (n % d == 0) {
            out[k++] = d;
            if (d != n / d) hi[nh++] = n / d;
        }
    while (nh) out[k++] = hi[--nh];
    return k;
}

static int by_step(const void *a, const void *b) {
    const PlanRow *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return x->mem < y->mem ? -1 : x->mem > y->mem;
}

static void keep(PlanResult *r, const PlanRow *row) {
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 64;
        r->rows = xrealloc(r->rows, sizeof(PlanRow) * (size_t)r->cap);
    }
    r->rows[r->n++] = *row;
}

// Every (micro-batches, zero, recompute) of one (mesh, vpp) whose stages' tables are lts: returns 1 when
// stop_at_fit found one that fits. ZeRO over groups of one rank (dp_edp_one) is zero 0's layout.
static int enumerate_options(PlanResult *r, const ModelConfig *c, const TrainOptions *o, const PlanSpec *sp,
                             PlanLayout l, int dp_edp_one, const CostTable *lts, int stop_at_fit) {
    static const int rcs[3] = {RECOMPUTE_NONE, RECOMPUTE_MOE, RECOMPUTE_FULL};
    int ms[2048], nm = divisors(o->batch, ms);
    PlanPipe pipe; // (each layout's, simulated and dropped)
    int hit = 0;
    for (int i = 0; i < nm && !hit; i++) {
        // the pipeline of these micro-batches, the same for every zero and recompute (where it fails,
        // layout_figures names the refusal)
        TrainOptions t;
        l.micro = ms[i];
        plan_options(&t, o, &l, "");
        CostPipe cp;
        int have = !cost_pipe(&cp, &t, l.pp, c->n_layers);
        for (int z = 0; z < (dp_edp_one ? 1 : 3) && !hit; z++) {
            int none_fits = 0;
            for (int k = 0; k < 3 && !hit; k++) {
                l.zero = z;
                l.recompute = rcs[k];
                l.rc_layers = 0;
                PlanRow row;
                int why;
                if (layout_figures(&row, c, o, sp, &l, &why, lts, have ? &cp : NULL, "", &pipe)) {
                    r->refused[why]++; // (the batch or the schedule: no zero or recompute changes it)
                    z = k = 3;
                    continue;
                }
                r->candidates++;
                if (row.mem > sp->hw.mem_bytes) {
                    r->refused[PLAN_R_MEMORY]++;
                    continue;
                }
                none_fits |= k == 0;
                // recomputing every layer fits where keeping them does not: in the fewest first layers
                // that fit (--recompute-layers; the kept memory falls as layers are added)
                for (int lo = 1, hi = c->n_layers; !none_fits && lo < hi;) {
                    PlanRow t;
                    l.rc_layers = (lo + hi) / 2;
                    if (layout_figures(&t, c, o, sp, &l, &why, lts, have ? &cp : NULL, "", &pipe)) break;
                    if (t.mem <= sp->hw.mem_bytes) hi = l.rc_layers, row = t;
                    else lo = l.rc_layers + 1;
                }
                keep(r, &row);
                hit = stop_at_fit;
            }
        }
        if (have) cost_pipe_free(&cp);
    }
    return hit;
}

// The model's parameter table and copies of it for the stages of the meshes searched (sliced in place),
// each with the cost model's figures of it (ct).
typedef struct {
    ParamTable full, *stage;
    CostTable *ct;
    int nstage;
} PlanTables;

// Every vpp of one resolved mesh (l: its tp, ep, etp, pp), each split's parameter tables sliced once.
static int enumerate_mesh(PlanResult *r, const ModelConfig *c, const TrainOptions *o, const PlanSpec *sp,
                          PlanLayout l, const MeshShape *ms, PlanTables *pt, int stop_at_fit) {
    int vmax = l.pp > 1 && c->n_layers / l.pp > 1 ? c->n_layers / l.pp : 1, hit = 0;
    for (int v = 1; v <= vmax && !hit; v++) {
        l.vpp = v;
        StageSplit split;
        if (l.pp > 1 && stages_split(&split, c->n_layers, l.pp, v, "")) {
            r->refused[PLAN_R_PIPELINE]++;
            continue;
        }
        if (pt->nstage < l.pp) {
            pt->stage = xrealloc(pt->stage, sizeof *pt->stage * (size_t)l.pp);
            pt->ct = xrealloc(pt->ct, sizeof *pt->ct * (size_t)l.pp);
            memset(pt->stage + pt->nstage, 0, sizeof *pt->stage * (size_t)(l.pp - pt->nstage));
            pt->nstage = l.pp;
        }
        for (int s = 0; s < l.pp; s++) {
            ParamSlicing sl = {l.tp, 0, l.ep, 0, l.etp, 0, l.pp > 1 ? &split : NULL, s, ms->vocab};
            params_localize(&pt->stage[s], &pt->full, c, &sl);
            cost_table_of(&pt->ct[s], c, &pt->stage[s], cost_fp8_tables(o));
        }
        hit = enumerate_options(r, c, o, sp, l, ms->dp == 1 && ms->edp == 1, pt->ct, stop_at_fit);
    }
    return hit;
}

// A floor under the largest rank's state on mesh l of G GPUs (wdense, wexp: the model's dense and expert
// parameters; wb: the bytes of a weight, and of a gradient): a stage's mean of the weights (dense ones split
// at most over TP, experts over EP x ETP, layers over PP; replicas only add), its gradients and moments
// (2 wb) spread over every GPU (ZeRO's most).
static double state_floor(double wdense, double wexp, double wb, const PlanLayout *l, int G) {
    return wb * (wdense / (l->tp * l->pp) + wexp / ((double)l->ep * l->etp * l->pp)) +
        3 * wb * (wdense + wexp) / G;
}

// plan_enumerate on the model's tables pt (built by the caller: one build for a search over GPU counts).
static void enumerate_in(PlanResult *r, const ModelConfig *c, const TrainOptions *o, const PlanSpec *sp,
                         PlanTables *pt, int stop_at_fit) {
    memset(r, 0, sizeof *r);
    int G = sp->gpus, tps[2048], pps[2048], eps[2048], etps[2048], ntp = divisors(G, tps), hit = 0;
    // (stop_at_fit: a mesh whose weights, gradients and moments alone cannot fit is not searched)
    const size_t(*by)[2] = pt->full.lby;
    double wdense = (double)(by[0][0] + by[1][0] + by[2][0]), wexp = (double)(by[0][1] + by[1][1] + by[2][1]),
           wb = prec_bf16_storage(o->precision) ? 2 : 4;
    for (int a = 0; a < ntp && !hit; a++) {
        int npp = divisors(G / tps[a], pps);
        for (int b = 0; b < npp && !hit; b++) {
            int stage = G / pps[b], nep = divisors(stage, eps);
            for (int e = 0; e < nep && !hit; e++) {
                int netp = divisors(stage / eps[e], etps);
                // (with tps[a] > 1 and vocab_search: the embedding and the head whole, then split over TP)
                int nv = sp->vocab_search && tps[a] > 1 ? 2 : 1;
                for (int f = 0; f < netp * nv && !hit; f++) {
                    PlanLayout l = {tps[a], eps[e], etps[f / nv], pps[b], 1, 0, 0, RECOMPUTE_NONE, 1, 0, 0};
                    l.vocab = nv == 2 ? f % 2 : o->vocab_parallel;
                    MeshShape ms = plan_shape(o, G, &l);
                    if (mesh_shape_resolve(&ms, c)) r->refused[PLAN_R_MESH]++;
                    else if (!stop_at_fit || state_floor(wdense, wexp, wb, &l, G) <= sp->hw.mem_bytes)
                        hit = enumerate_mesh(r, c, o, sp, l, &ms, pt, stop_at_fit);
                }
            }
        }
    }
    qsort(r->rows, (size_t)r->n, sizeof *r->rows, by_step);
}
static void tables_free(PlanTables *pt) {
    for (int s = 0; s < pt->nstage; s++) params_free(&pt->stage[s]);
    free(pt->stage);
    free(pt->ct);
    params_free(&pt->full);
}

void plan_enumerate(PlanResult *r, const ModelConfig *c, const TrainOptions *o, const PlanSpec *sp,
                    int stop_at_fit) {
    PlanTables pt = {0};
    params_build(&pt.full, c);
    enumerate_in(r, c, o, sp, &pt, stop_at_fit);
    tables_free(&pt);
}

void plan_result_free(PlanResult *r) {
    free(r->rows);
    memset(r, 0, sizeof *r);
}

int plan_smallest_fit(const ModelConfig *c, const TrainOptions *o, const PlanSpec *sp, int max_gpus) {
    PlanSpec s = *sp;
    PlanTables pt = {0};
    params_build(&pt.full, c); // (once for every count)
    // below the floor not even the weights, gradients and moments fit, spread evenly over every GPU at the
    // fewest bytes the policy keeps a parameter in (mixed: 4 + 4 + 8; bf16 storage: 2 + 2 + 4)
    double per = prec_bf16_storage(o->precision) ? 8.0 : 16.0;
    double lb = ceil((double)pt.full.total * per / sp->hw.mem_bytes);
    int g = lb > max_gpus ? max_gpus + 1 : (int)lb, n8 = sp->nodes_of > 0 ? sp->nodes_of : 1, fit = 0;
    if (g <= sp->gpus) g = sp->gpus + 1;
    for (; g <= max_gpus && !fit; g = g < n8 ? g + 1 : (g / n8 + 1) * n8) {
        if (g > n8 && g % n8) continue; // (past one node: whole nodes)
        s.gpus = g;
        PlanResult r;
        enumerate_in(&r, c, o, &s, &pt, 1);
        if (r.n) fit = g;
        plan_result_free(&r);
    }
    tables_free(&pt);
    return fit;
}
