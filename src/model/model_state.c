// model_state.c — the model's memory and state (model_state.h): parameters and gradients, this rank's
// chunks of layers, the activation slots (each layer's buffers, carved from the previous layer's expert
// gradients where those are lent: model_share_grads), the recompute and AMPipe states of a layer, the
// scratch of the backward, the settings of the next forwards, the gradient buffer's per-step zeroing and
// the formats of its expert gradients; model_init and model_free.
// Must not hold: forward or backward arithmetic (model.c, block.c, attention.c), collectives.
#include "model/model_state.h"
#include <string.h>
#include "core/common.h"
#include "model/attention.h"
#include "model/model_access.h"
#include "model/vocab.h"

#define F sizeof(float)

int model_chunk_end(const Model *m, int chunk) {
    const ModelChunk *ch = &m->chunk[chunk];
    return ch->last ? ch->l1 + m->c.mtp_depth : ch->l1;
}
static int chunk_of(const Model *m, int l) {
    for (int k = 0; k < m->nchunks; k++)
        if (l >= m->chunk[k].l0 && l < model_chunk_end(m, k)) return k;
    return -1;
}
int model_holds_layer(const Model *m, int l) { return chunk_of(m, l) >= 0; }
MoeLayer *model_moe(Model *m, int l, int slot) {
    int k = chunk_of(m, l);
    CHECK(k >= 0 && slot >= 0 && slot < m->nslots[k], "model_moe: layer %d slot %d not held", l, slot);
    return &m->slots[k][slot].la[l].moe;
}

// AMPipe's per-chunk MoE states of one layer's activations: n of them, for chunks of up to
// ceil(maxN / n) rows (none for n = 1).
static void chunk_moes(Model *m, LayerActs *a, int n) {
    for (int i = 0; i < a->nmc; i++) moe_layer_free(&a->mc[i]);
    free(a->mc);
    a->mc = NULL;
    a->nmc = 0;
    if (n <= 1) return;
    MoeComms cm = {m->mesh.tp, m->mesh.ep, m->mesh.etp, m->mesh.stage, m->mesh.epn, m->mesh.epx};
    a->mc = xcalloc(n, sizeof *a->mc);
    for (int i = 0; i < n; i++) {
        moe_layer_init(&a->mc[i], m->be, &m->c, (m->maxN + n - 1) / n, &cm);
        a->mc[i].layer = a->moe.layer;
        if ((model_layer_recompute(m, a->moe.layer) & RECOMPUTE_MOE) || m->rc.fp8)
            moe_set_recompute(&a->mc[i], &m->rc);
        a->mc[i].arena = &a->arena;
    }
    a->nmc = n;
}

// Layer l's activations under its recompute bits (model_layer_recompute): the attention's dropped ones its
// own or the shared ones (the variant's); its MoE states' SwiGLU rows kept or shared (also under --fp8-save,
// m->rc.fp8: every layer's).
static void layer_recompute(Model *m, LayerActs *a, int l) {
    int bits = model_layer_recompute(m, l);
    m->attv->acts_recompute(m, &a->attn, &a->arena, bits);
    MoeRecompute *rc = (bits & RECOMPUTE_MOE) || m->rc.fp8 ? &m->rc : NULL;
    moe_set_recompute(&a->moe, rc);
    for (int i = 0; i < a->nmc; i++) moe_set_recompute(&a->mc[i], rc);
}

void model_set_recompute(Model *m, int mode, int layers) {
    CHECK(mode >= RECOMPUTE_NONE && mode <= RECOMPUTE_FULL && layers >= 0,
          "model_set_recompute: %d, %d layers", mode, layers);
    CHECK(!(mode & RECOMPUTE_MOE) || !m->rc.fp8,
          "--recompute moe with --fp8-save (both take the SwiGLU rows)");
    m->recompute = mode;
    m->recompute_layers = layers;
    for (int k = 0; k < m->nchunks; k++)
        for (int i = 0; i < m->nslots[k]; i++)
            for (int l = m->chunk[k].l0; l < model_chunk_end(m, k); l++)
                layer_recompute(m, &m->slots[k][i].la[l], l);
}

// The bytes of layer l's routed-expert gradients (model_expert_block; its packed half where the rest is a
// hole), 256-aligned, lent to an arena (model_share_grads); none where this rank holds no experts of the
// layer.
static Arena expert_grads_arena(const Model *m, int l) {
    Arena a = {0};
    size_t len, b0 = model_expert_block(m, l, &len);
    if (!len) return a;
    char *b = (char *)(m->grads + b0),
         *e = (char *)(m->grads + b0 + (m->grad_hole && m->grad_hole[l] ? model_packed_len(len) : len));
    char *b2 = (char *)(((uintptr_t)b + 255) & ~(uintptr_t)255);
    if (b2 >= e) return a;
    a.base = b2;
    a.cap = (size_t)(e - b2);
    return a;
}

// The bytes of the embedding's gradient (this rank's rows), 256-aligned, lent to layer 0's activations where
// the MoE scratch is lean (moe.h): written only by the embedding's backward, after layer 0's backward, which
// model_backward zeroes it before.
static Arena embed_grads_arena(const Model *m) {
    Arena a = {0};
    int i = params_index(&m->t, PR_EMBED, -1, -1);
    if (i < 0 || !m->t.p[i].lnumel || !m->ms.lean_rows) return a;
    char *b = (char *)(m->grads + m->t.p[i].loffset), *e = b + m->t.p[i].lnumel * F;
    char *b2 = (char *)(((uintptr_t)b + 255) & ~(uintptr_t)255);
    if (b2 >= e) return a;
    a.base = b2;
    a.cap = (size_t)(e - b2);
    return a;
}

static void slot_alloc(Model *m, ModelSlot *s, int chunk) {
    const ModelChunk *ch = &m->chunk[chunk];
    const Backend *be = m->be;
    const ModelConfig *c = &m->c;
    size_t N = m->maxN, d = c->d_model, V = (size_t)vocab_cols(m, NULL); // (this rank's logits' columns)
    s->la = xcalloc(config_all_layers(c), sizeof *s->la);
    MoeComms cm = {m->mesh.tp, m->mesh.ep, m->mesh.etp, m->mesh.stage, m->mesh.epn, m->mesh.epx};
    for (int l = ch->l0; l < model_chunk_end(m, chunk); l++) {
        LayerActs *a = &s->la[l];
        Arena *A = &a->arena;
        // (the MTP modules' blocks borrow nothing: the last layer's expert gradients hold the logits)
        if (m->share_grads && l > ch->l0 && l < ch->l1) *A = expert_grads_arena(m, l - 1);
        if (m->share_grads && l == 0 && ch->first) {
            *A = embed_grads_arena(m);
            m->embed_lent = A->base ? (size_t)m->t.p[params_index(&m->t, PR_EMBED, -1, -1)].lnumel * F : 0;
        }
        a->res_in = arena_alloc(A, be, N * d * F);
        a->xn1 = arena_alloc(A, be, N * d * hid_size(be));
        a->rstd1 = arena_alloc(A, be, N * F);
        m->attv->acts_alloc(m, &a->attn, A, model_layer_recompute(m, l)); // (shared: layer_recompute below)
        a->x_mid = arena_alloc(A, be, N * d * F);
        a->xn2 = arena_alloc(A, be, N * d * F);
        a->rstd2 = arena_alloc(A, be, N * F);
        if (config_layer_dense(c, l)) moe_dense_init(&a->moe, be, c, m->maxN, &cm);
        else moe_layer_init(&a->moe, be, c, m->maxN, &cm);
        a->moe.layer = l;
        if (model_layer_recompute(m, l) || m->rc.fp8) layer_recompute(m, a, l);
        A->mark = A->used; // the MoE's rows from here (again after each change of AMPipe chunks)
        a->moe.arena = A;
        a->moe.run_counts = m->scope_counts + (size_t)l * c->n_experts; // aux scope global: the step's sums
        a->moe.run_tokens = m->scope_tokens + l;
    }
    Arena *H = &s->head;
    *H = m->share_grads && ch->last ? expert_grads_arena(m, ch->l1 - 1) : (Arena){0};
    // the largest activation, the last stage's only (--loss-chunks: a chunk's rows, and the head's dx)
    size_t Nh = params_chunk_len(N, m->loss_chunks);
    s->logits = ch->last ? arena_alloc(H, be, Nh * V * F) : NULL;
    s->dxh = ch->last && m->loss_chunks > 1 ? arena_alloc(H, be, N * d * F) : NULL;
    s->res_final = arena_alloc(H, be, N * d * F);
    s->xn_f = arena_alloc(H, be, N * d * F);
    s->rstd_f = be->alloc(N * F);
    s->losses = be->alloc(N * F);
    s->tokens = be->alloc(N * sizeof(int32_t));
    s->targets = be->alloc(N * sizeof(int32_t));
    s->mtp = ch->last && c->mtp_depth ? xcalloc(c->mtp_depth, sizeof *s->mtp) : NULL;
    s->mtp_emb = s->mtp && !ch->first ? be->alloc(N * d * F) : NULL;
    for (int k = 0; s->mtp && k < c->mtp_depth; k++) {
        MtpActs *a = &s->mtp[k];
        a->es = be->alloc(N * d * F);
        a->rstd_e = be->alloc(N * F);
        a->rstd_h = be->alloc(N * F);
        a->cat = be->alloc(N * 2 * d * F);
        a->out = be->alloc(N * d * F);
        a->xn = be->alloc(N * d * F);
        a->rstd = be->alloc(N * F);
        a->logits = be->alloc(Nh * V * F);
        a->dxh = m->loss_chunks > 1 ? be->alloc(N * d * F) : NULL;
        a->losses = be->alloc(N * F);
        a->targets = be->alloc(N * sizeof(int32_t));
    }
}

static void slot_free(Model *m, ModelSlot *s, int chunk) {
    const Backend *be = m->be;
    for (int l = m->chunk[chunk].l0; l < model_chunk_end(m, chunk); l++) {
        LayerActs *a = &s->la[l];
        m->attv->acts_free(m, &a->attn, &a->arena);
        void *bufs[] = {a->res_in, a->xn1, a->rstd1, a->x_mid, a->xn2, a->rstd2};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) arena_free(&a->arena, be, bufs[i]);
        moe_layer_free(&a->moe);
        chunk_moes(m, a, 1);
    }
    free(s->la);
    for (int k = 0; s->mtp && k < m->c.mtp_depth; k++) {
        MtpActs *a = &s->mtp[k];
        void *mb[] = {a->es,   a->rstd_e, a->rstd_h, a->cat,     a->out, a->xn,
                      a->rstd, a->logits, a->losses, a->targets, a->dxh};
        for (size_t i = 0; i < sizeof mb / sizeof mb[0]; i++)
            if (mb[i]) be->free(mb[i]);
    }
    free(s->mtp);
    s->mtp = NULL;
    if (s->mtp_emb) be->free(s->mtp_emb);
    s->mtp_emb = NULL;
    void *bufs[] = {s->res_final, s->xn_f, s->rstd_f, s->logits, s->losses, s->tokens, s->targets, s->dxh};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) arena_free(&s->head, be, bufs[i]);
    s->head = (Arena){0};
}

// This rank's chunks: virtual stages k = c * PP + pp_rank of the split (one chunk of every layer
// without one).
static void find_chunks(Model *m) {
    const StageSplit *ps = m->mesh.sl.pp_split;
    int L = m->c.n_layers;
    if (!ps || ps->pp * ps->vpp == 1) {
        m->nchunks = 1;
        m->chunk[0] = (ModelChunk){0, L, 1, 1};
        return;
    }
    int S = ps->pp * ps->vpp;
    CHECK(ps->vpp <= MODEL_MAX_CHUNKS, "--vpp %d: at most %d chunks per rank", ps->vpp, MODEL_MAX_CHUNKS);
    m->nchunks = ps->vpp;
    for (int c = 0; c < ps->vpp; c++) {
        int k = c * ps->pp + m->mesh.sl.pp_rank;
        m->chunk[c] = (ModelChunk){ps->first[k], ps->first[k + 1], k == 0, k == S - 1};
    }
}

// The MTP modules' model-wide scratch (model_types.h MtpScratch) for micro-batches up to maxN rows.
static void mtp_scratch_init(Model *m) {
    const Backend *be = m->be;
    size_t N = m->maxN, d = m->c.d_model, ni = (size_t)m->c.mtp_depth * 2 * N + 4 * N;
    MtpScratch *s = &m->mtps;
    s->split = be->alloc(2 * N * d * F);
    s->dcat = be->alloc(2 * N * d * F);
    s->dh = be->alloc(N * d * F);
    s->demb = be->alloc(N * d * F);
    s->idx = be->alloc(ni * sizeof(int32_t));
    s->idx_h = xmalloc(ni * sizeof(int32_t));
    s->tgt_h = xmalloc(N * sizeof(int32_t));
    s->B = s->T = 0;
}

static void mtp_scratch_free(Model *m) {
    MtpScratch *s = &m->mtps;
    void *bufs[] = {s->split, s->dcat, s->dh, s->demb, s->idx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) m->be->free(bufs[i]);
    free(s->idx_h);
    free(s->tgt_h);
    memset(s, 0, sizeof *s);
}

void model_init(Model *m, const ModelConfig *c, const Backend *be, int maxB, int maxT,
                const ModelMesh *mesh) {
    memset(m, 0, sizeof *m);
    const char *bad = config_validate(c);
    if (bad) DIE("invalid model config: %s", bad);
    CHECK(maxB >= 1 && maxT >= 1 && (int64_t)maxB * maxT <= config_max_tokens(c),
          "a micro-batch of %d x %d tokens exceeds the model's limit of %lld", maxB, maxT,
          (long long)config_max_tokens(c));
    CHECK(maxT <= c->max_seq_len, "sequence length %d exceeds the model's max_seq_len %d", maxT,
          c->max_seq_len);
    m->c = *c;
    m->be = be;
    m->attv = attn_variant(c);
    if (mesh) m->mesh = *mesh;
    else m->mesh.sl = (ParamSlicing){1, 0, 1, 0, 1, 0, NULL, 0, 0};
    const ParamSlicing *sl = &m->mesh.sl;
    params_build_local(&m->t, c, sl);
    find_chunks(m);
    m->Hl = c->n_heads / sl->tp;
    m->KVl = c->n_kv_heads / sl->tp;
    m->El = c->n_experts / sl->ep;
    m->e0 = sl->ep_rank * m->El;
    m->maxB = maxB;
    m->maxT = maxT;
    m->maxN = maxB * maxT;
    size_t N = m->maxN, d = c->d_model;
    m->params = be->alloc(m->t.ltotal * F);
    // (where holes can be made in it later, a buffer of that kind: model_share_grads replaces it)
    m->grads = be->alloc_holes ? be->alloc_holes(m->t.ltotal, NULL, 0) : be->alloc(m->t.ltotal * F);
    size_t La = (size_t)config_all_layers(c);
    m->scope_counts = xcalloc(La * c->n_experts, sizeof(int64_t));
    m->scope_tokens = xcalloc(La, sizeof(int64_t));
    m->loss_chunks = 1;
    for (int k = 0; k < m->nchunks; k++) model_set_slots(m, k, 1);
    m->dres = be->alloc(N * d * F);
    m->dxn = be->alloc(N * d * F);
    m->attv->scratch_init(m);
    moe_scratch_init(&m->ms, be, c, m->maxN);
    // the forward's MoE output in the backward's dxn where the MoE scratch is lean (moe.h): each is written
    // and read inside one block's forward, or one backward, and neither runs inside the other
    m->moe_out = m->ms.lean_rows ? m->dxn : be->alloc(N * d * F);
    m->expert_counts = xcalloc(La * c->n_experts, sizeof(int64_t));
    m->loss_h = xmalloc(N * F);
    m->vocab_ids = xmalloc(N * sizeof(int32_t));
    if (vocab_split(m) && m->chunk[m->nchunks - 1].last) { // (vocab.h: the parts, or one gathered row)
        size_t n = (size_t)(comm_size(m->mesh.tp) + 1) * 3 * N * sizeof(double),
               V = (size_t)c->vocab_size * F;
        m->vocab_parts = be->alloc(n > V ? n : V);
    }
    m->hf_fe = xcalloc((size_t)c->n_experts * 2, sizeof(double));
    m->moe_overlap = xmalloc(sizeof(int) * La);
    m->moe_time = xcalloc(La, sizeof(double));
    m->moe_mode = xcalloc(La, sizeof(int));
    m->rc.be = be;
    m->ampipe = xmalloc(sizeof(int) * La);
    for (size_t l = 0; l < La; l++) m->moe_overlap[l] = m->ampipe[l] = 1;
    m->hf_pe = m->hf_fe + c->n_experts;
    if (c->mtp_depth) mtp_scratch_init(m);
}

// Packed expert gradients (OPTG_PACKED) on a backend with alloc_holes, once: with every layer's MoE rows
// carved (moe_rows_carve: what its forwards would carve), the layers whose lent activations (the next
// layer's; the last layer's, the head's) all lie in the packed half of their expert block keep only that
// half, the rest a hole; the slot is carved again in the same order (the same buffers in the same places:
// what fitted lay in the half).
static void grads_holes(Model *m) {
    const char *v = getenv("MOE_GRAD_HOLES"); // (0: none, the A/B of their memory; the same bits)
    CHECK(!v || !*v || !strcmp(v, "0") || !strcmp(v, "1"),
          "MOE_GRAD_HOLES must be 0 or 1 (the default), not '%s'", v);
    if (m->expert_gbf != OPTG_PACKED || !m->be->alloc_holes || m->grad_hole || (v && !strcmp(v, "0"))) return;
    const ModelChunk *ch = &m->chunk[0];
    ModelSlot *s = &m->slots[0][0];
    int La = config_all_layers(&m->c), nh = 0;
    unsigned char *hole = xcalloc((size_t)La, 1);
    size_t *h = xmalloc(sizeof(size_t) * 2 * (size_t)La);
    for (int l = ch->l0; l < ch->l1; l++) moe_rows_carve(&s->la[l].moe); // (their rows too: carved first)
    for (int l = ch->l0; l < ch->l1; l++) {
        const Arena *A = l + 1 < ch->l1 ? &s->la[l + 1].arena : &s->head;
        size_t len, b0 = model_expert_block(m, l, &len);
        if (!len || !A->base || A->base + A->used > (char *)(m->grads + b0 + model_packed_len(len))) continue;
        if (model_packed_len(len) == len) continue; // (one element: no hole)
        hole[l] = 1;
        h[2 * nh] = b0 + model_packed_len(len);
        h[2 * nh + 1] = b0 + len;
        nh++;
    }
    if (nh) {
        slot_free(m, s, 0);
        m->be->free(m->grads);
        m->grads = m->be->alloc_holes(m->t.ltotal, h, nh);
        m->grad_hole = hole;
        m->embed_lent = 0;
        slot_alloc(m, s, 0);
        for (int l = ch->l0; l < ch->l1; l++) moe_rows_carve(&s->la[l].moe);
    } else {
        free(hole);
    }
    free(h);
}

size_t model_grad_holes(const Model *m, int *layers) {
    size_t bytes = 0;
    *layers = 0;
    for (int l = 0; m->grad_hole && l < config_all_layers(&m->c); l++) {
        size_t len;
        model_expert_block(m, l, &len);
        if (!m->grad_hole[l]) continue;
        ++*layers;
        bytes += (len - model_packed_len(len)) * F;
    }
    return bytes;
}

void model_share_grads(Model *m, int on) {
    CHECK(!on || (m->nchunks == 1 && m->nslots[0] == 1),
          "model_share_grads: %d chunks, %d slots (one of each)", m->nchunks, m->nslots[0]);
    if (m->share_grads == !!on) return;
    slot_free(m, &m->slots[0][0], 0);
    m->share_grads = !!on;
    m->embed_lent = 0; // (slot_alloc sets it where it lends it)
    slot_alloc(m, &m->slots[0][0], 0);
    if (on) grads_holes(m);
    model_use(m, 0, 0);
}

void model_set_expert_grads(Model *m, int gbf) {
    CHECK(gbf == OPTG_F32 || gbf == OPTG_BF16 || gbf == OPTG_PACKED, "model_set_expert_grads: format %d",
          gbf);
    CHECK(!m->grad_hole || gbf == OPTG_PACKED,
          "model_set_expert_grads: format %d, where the packed gradients' blocks keep only their packed half",
          gbf);
    m->expert_gbf = gbf;
}

void model_set_dw_sumsq(Model *m, int on) {
    CHECK(!on || m->be->dw_sumsq_take, "model_set_dw_sumsq: backend %s keeps no gradient ledger",
          m->be->name);
    CHECK(!on || m->expert_gbf != OPTG_BF16,
          "model_set_dw_sumsq: expert gradients read rounded (OPTG_BF16) are not what the ledger sums");
    m->dw_sumsq = !!on;
}

void model_set_fp8_save(Model *m, int on) {
    CHECK(!on || m->be->fp8_save,
          "--fp8-save: backend %s keeps no FP8 rows for the backward (ops.h Backend.fp8_save)", m->be->name);
    CHECK(!on || !(m->recompute & RECOMPUTE_MOE),
          "--fp8-save with --recompute moe (both take the SwiGLU rows)");
    m->rc.fp8 = !!on;
    model_set_recompute(m, m->recompute, m->recompute_layers); // (each layer's rows kept or shared again)
}

void model_set_loss_chunks(Model *m, int n) {
    CHECK(n >= 1 && n <= m->maxN, "--loss-chunks %d: a micro-batch has %d rows", n, m->maxN);
    CHECK(!m->share_grads, "model_set_loss_chunks: after model_share_grads (set it before)");
    if (n == m->loss_chunks) return;
    m->loss_chunks = n;
    for (int k = 0; k < m->nchunks; k++) // (every slot's head buffers sized again)
        for (int i = 0; i < m->nslots[k]; i++) {
            slot_free(m, &m->slots[k][i], k);
            slot_alloc(m, &m->slots[k][i], k);
        }
    model_use(m, 0, 0);
}

void model_set_fp8_dispatch(Model *m, int on) {
    CHECK(!on || (m->be->fp8_rows_round && m->be->fp8_rows_pack && m->be->fp8_rows_unpack),
          "--fp8-dispatch: backend %s has no FP8 rows (ops.h Backend.fp8_rows_*)", m->be->name);
    m->fp8_dispatch = !!on;
}

int model_grad_format(const Model *m, const ParamSpec *s, int64_t *gb) {
    *gb = 0;
    if (!params_routed(s) || m->expert_gbf == OPTG_F32) return OPTG_F32;
    if (m->expert_gbf == OPTG_PACKED) {
        size_t len, b0 = model_expert_block(m, s->layer, &len);
        CHECK(len, "model_grad_format: layer %d holds no expert %d", s->layer, m->e0);
        *gb = (int64_t)b0;
    }
    return m->expert_gbf;
}


int model_bf16_weights(Model *m) {
    if (!m->be->alloc_bf16_params) return 0;
    int La = config_all_layers(&m->c);
    size_t *h = xmalloc(sizeof(size_t) * params_bf16_ranges_max(La));
    int nh = params_bf16_ranges(&m->t, La, m->e0, m->El, MOE_GEMM_FP32_MAX_O, h);
    if (nh) {
        m->be->free(m->params);
        m->params = m->be->alloc_bf16_params(m->t.ltotal, h, nh);
    }
    free(h);
    return nh > 0;
}

void model_set_slots(Model *m, int chunk, int n) {
    CHECK(!m->share_grads || n == 1, "model_set_slots: %d slots with the gradients' memory shared", n);
    CHECK(n >= 1 && chunk >= 0 && chunk < m->nchunks, "model_set_slots: chunk %d, %d slots", chunk, n);
    for (int i = n; i < m->nslots[chunk]; i++) slot_free(m, &m->slots[chunk][i], chunk);
    m->slots[chunk] = xrealloc(m->slots[chunk], sizeof(ModelSlot) * (size_t)n);
    for (int i = m->nslots[chunk]; i < n; i++) slot_alloc(m, &m->slots[chunk][i], chunk);
    m->nslots[chunk] = n;
    model_use(m, 0, 0);
}

void model_use(Model *m, int chunk, int slot) {
    CHECK(chunk >= 0 && chunk < m->nchunks && slot >= 0 && slot < m->nslots[chunk],
          "model_use: chunk %d of %d, slot %d of %d", chunk, m->nchunks, slot,
          m->nslots[chunk < 0 ? 0 : chunk]);
    m->cur = chunk;
    m->cur_slot = slot;
    ModelSlot *s = &m->slots[chunk][slot];
    m->la = s->la;
    m->mtp = s->mtp;
    m->mtp_emb = s->mtp_emb ? s->mtp_emb : s->la[0].res_in; // (one stage: layer 0's input)
    m->res_final = s->res_final;
    m->xn_f = s->xn_f;
    m->rstd_f = s->rstd_f;
    m->logits = s->logits;
    m->dxh = s->dxh;
    m->losses = s->losses;
    m->tokens = s->tokens;
    m->targets = s->targets;
    m->B = s->B;
    m->T = s->T;
}

void model_set_overlap(Model *m, int l, int r) {
    CHECK(l >= 0 && l < m->c.n_layers && r >= 1 && r <= MOE_MAX_OVERLAP, "model_set_overlap: layer %d, r %d",
          l, r);
    m->moe_overlap[l] = r;
}

void model_set_expert_mode(Model *m, int l, int mode) {
    CHECK(l >= 0 && l < m->c.n_layers && (mode == MOE_SHARDED || mode == MOE_GATHERED),
          "model_set_expert_mode: %d %d", l, mode);
    m->moe_mode[l] = mode;
}

void model_set_ampipe(Model *m, int l, int n) {
    CHECK(l >= 0 && l < m->c.n_layers && (n == 1 || n == 2 || n == 4 || n == 8),
          "model_set_ampipe: layer %d, %d chunks (1, 2, 4 or 8)", l, n);
    m->ampipe[l] = n;
}

void model_fit_chunks(Model *m, int l, int n) {
    LayerActs *a = &m->la[l];
    if (n > 1 && a->nmc != n) {
        chunk_moes(m, a, n);
        moe_layer_trim(&a->moe);
        arena_reset(&a->arena);
    } else if (n > 1) {
        moe_layer_trim(&a->moe);
    } else if (a->nmc) {
        chunk_moes(m, a, 1);
        arena_reset(&a->arena);
    }
}

float *model_stage_in(const Model *m) { return m->la[m->chunk[m->cur].l0].res_in; }
float *model_stage_out(const Model *m) { return m->res_final; }

// The dw_fresh bit of a tensor whose first backward of the step writes its gradient (model_types.h
// DW_FRESH_*; the LM head's: head_fresh; the backwards ask model_access.h model_dw_write), 0 for the tensors
// model_zero_grads zeroes (an attention variant's projections that are not GQA's among them).
static int fresh_bit(const ParamSpec *p) {
    switch (p->role) {
        case PR_W1:
        case PR_W3:
        case PR_W2: return DW_FRESH_EXPERTS;
        case PR_WQ:
        case PR_WK:
        case PR_WV: return DW_FRESH_QKV;
        case PR_WO: return DW_FRESH_O;
        case PR_LM_HEAD: return DW_FRESH_HEAD;
        default: return 0;
    }
}
// That tensor's gradient is still unwritten this step.
static int still_fresh(const Model *m, const ParamSpec *p) {
    int b = fresh_bit(p);
    return b && (b == DW_FRESH_HEAD ? m->head_fresh : m->dw_fresh[p->layer] & b);
}
void model_zero_grads(Model *m) {
    const ParamTable *t = &m->t;
    if (!m->dw_fresh) { // once: the ranges of every tensor not written by its first backward, adjacent ones
                        // merged
        m->dw_fresh = xcalloc((size_t)config_all_layers(&m->c), 1);
        m->zr_off = xmalloc(sizeof(size_t) * (t->n + 1));
        m->zr_n = xmalloc(sizeof(size_t) * (t->n + 1));
        for (int i = 0; i < t->n; i++) {
            const ParamSpec *p = &t->p[i];
            if (!p->lnumel || fresh_bit(p)) continue;
            if (m->nzr && m->zr_off[m->nzr - 1] + m->zr_n[m->nzr - 1] == p->loffset) {
                m->zr_n[m->nzr - 1] += p->lnumel;
            } else {
                m->zr_off[m->nzr] = p->loffset;
                m->zr_n[m->nzr++] = p->lnumel;
            }
        }
    }
    for (int i = 0; i < m->nzr; i++) m->be->zero(m->grads + m->zr_off[i], m->zr_n[i] * sizeof(float));
    if (m->dw_sumsq) m->be->dw_sumsq_take(NULL); // (what a backward outside a step wrote there)
    // (a layer this rank does not hold has no tensors to write)
    memset(m->dw_fresh, DW_FRESH_EXPERTS | DW_FRESH_QKV | DW_FRESH_O, (size_t)config_all_layers(&m->c));
    m->head_fresh = DW_FRESH_HEAD;
}

void model_grads_settle(Model *m) {
    if (!m->dw_fresh) return;
    const ParamTable *t = &m->t;
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        if (p->lnumel && still_fresh(m, p)) m->be->zero(m->grads + p->loffset, p->lnumel * sizeof(float));
    }
    memset(m->dw_fresh, 0, (size_t)config_all_layers(&m->c));
    m->head_fresh = 0;
}

void model_free(Model *m) {
    const Backend *be = m->be;
    for (int k = 0; k < m->nchunks; k++) {
        for (int i = 0; i < m->nslots[k]; i++) slot_free(m, &m->slots[k][i], k);
        free(m->slots[k]);
    }
    m->attv->scratch_free(m);
    void *bufs[] = {m->params, m->grads,      m->dres,  m->moe_out == m->dxn ? NULL : m->moe_out,
                    m->dxn,    m->rc.h1,      m->rc.h3, m->rc.act,
                    m->ddrop,  m->vocab_parts};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(bufs[i]);
    moe_scratch_free(&m->ms);
    mtp_scratch_free(m);
    free(m->expert_counts);
    free(m->loss_h);
    free(m->vocab_ids);
    free(m->budget_h);
    free(m->scope_counts);
    free(m->scope_tokens);
    free(m->hf_fe);
    free(m->moe_overlap);
    free(m->ampipe);
    free(m->moe_time);
    free(m->moe_mode);
    free(m->zr_off);
    free(m->zr_n);
    free(m->dw_fresh);
    free(m->grad_hole);
    params_free(&m->t);
    memset(m, 0, sizeof *m);
}

void model_scope_reset(Model *m) {
    size_t La = (size_t)config_all_layers(&m->c);
    memset(m->scope_counts, 0, sizeof(int64_t) * La * m->c.n_experts);
    memset(m->scope_tokens, 0, sizeof(int64_t) * La);
}
