// evaluate.c — validation loss with per-kind breakdown and expert routing, and sampling.
#include "train/evaluate.h"
#include <math.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"
#include "io/safetensors.h"
#include "model/decode.h"
#include <cjson/cJSON.h>

void evaluate(Pipe *p, const Dataset *ds, int B, int n_batches, int want_kinds, EvalResult *r,
              const Dist *dist) {
    Model *m = p->m;
    memset(r, 0, sizeof *r);
    const Mesh *mesh = dist ? dist->mesh : NULL;
    int DP = mesh ? mesh->s.dp : 1, dp_rank = mesh ? mesh->me.dp : 0;
    int Bl = B / DP;
    int T = ds->T, N = Bl * T, L = m->c.n_layers, E = m->c.n_experts, k = m->c.top_k;
    int32_t *x = xmalloc((size_t)N * 4), *y = xmalloc((size_t)N * 4);
    uint8_t *kinds = xmalloc((size_t)N);
    float *losses = xmalloc((size_t)N * sizeof(float));
    r->n_kinds = want_kinds ? ds->n_kinds : 0;
    // the routing per kind below reads each layer's choices on the host
    for (int l = 0; r->n_kinds && l < L; l++)
        if (model_holds_layer(m, l)) model_moe(m, l, 0)->host_router_out = 1;
    if (r->n_kinds) r->kind_expert = xcalloc((size_t)r->n_kinds * L * E, sizeof(int64_t));
    r->available = eval_batches_available(ds, B);
    r->batches = n_batches <= 0 || n_batches > r->available ? r->available : n_batches;
    double sum = 0;
    for (int b = 0; b < r->batches; b++) {
        data_val_batch(ds, (uint64_t)b * B + (uint64_t)dp_rank * Bl, Bl, x, y, kinds);
        pipe_forward_all(p, x, y, Bl, T);
        pipe_losses(p, losses, N);
        for (int i = 0; i < N; i++) {
            sum += losses[i];
            if (r->n_kinds) {
                r->kind_loss[kinds[i]] += losses[i];
                r->kind_tokens[kinds[i]]++;
            }
        }
        // routing of the tokens of my MoE slice (the expert choice at position i routes input token
        // i; it is counted under the kind of target i, the same line except at line starts)
        for (int l = 0; r->n_kinds && l < L; l++) {
            if (!model_holds_layer(m, l)) continue;
            const MoeLayer *ml = model_moe(m, l, 0);
            for (int i = 0; i < ml->Ns; i++)
                for (int j = 0; j < k; j++)
                    r->kind_expert[((size_t)kinds[ml->s0 + i] * L + l) * E + ml->idx_h[(size_t)i * k + j]]++;
        }
        r->tokens += N;
    }
    if (mesh) {
        double v[2 + 2 * DATA_MAX_KINDS] = {sum, (double)r->tokens};
        for (int kd = 0; kd < DATA_MAX_KINDS; kd++) {
            v[2 + kd] = r->kind_loss[kd];
            v[2 + DATA_MAX_KINDS + kd] = (double)r->kind_tokens[kd];
        }
        comm_allreduce(mesh->dp, v, 2 + 2 * DATA_MAX_KINDS, CT_F64);
        sum = v[0];
        r->tokens = (int64_t)v[1];
        for (int kd = 0; kd < DATA_MAX_KINDS; kd++) {
            r->kind_loss[kd] = v[2 + kd];
            r->kind_tokens[kd] = (int64_t)v[2 + DATA_MAX_KINDS + kd];
        }
        if (r->n_kinds) comm_allreduce(mesh->stage, r->kind_expert, (size_t)r->n_kinds * L * E, CT_I64);
        if (r->n_kinds && mesh->s.pp > 1)
            comm_allreduce(mesh->pp, r->kind_expert, (size_t)r->n_kinds * L * E, CT_I64);
    }
    for (int l = 0; l < L; l++)
        if (model_holds_layer(m, l)) model_moe(m, l, 0)->host_router_out = 0;
    r->loss = r->tokens ? sum / r->tokens : 0;
    for (int kd = 0; kd < r->n_kinds; kd++)
        if (r->kind_tokens[kd]) r->kind_loss[kd] /= r->kind_tokens[kd];
    free(x);
    free(y);
    free(kinds);
    free(losses);
}

void eval_result_free(EvalResult *r) {
    free(r->kind_expert);
    r->kind_expert = NULL;
}

int eval_batches_available(const Dataset *ds, int B) {
    size_t n = B > 0 ? ds->n_val / (size_t)B : 0;
    if (n < 1)
        DIE("the validation set holds %zu windows of %d+1 tokens, fewer than one evaluation batch of %d "
            "sequences; "
            "lower the batch%s",
            ds->n_val, ds->T, B,
            ds->split == DATA_SPLIT_TAIL       ? ", raise --val-frac or pass "
                                                 "--val-data FILE"
                : ds->split == DATA_SPLIT_FILE ? " or pass a longer --val-data file"
                                               : "");
    return n > INT32_MAX ? INT32_MAX : (int)n;
}

void eval_clip_note(char *buf, size_t n, const EvalResult *r, int requested, int B) {
    if (requested <= 0 || r->batches >= requested) {
        if (n) buf[0] = 0;
        return;
    }
    snprintf(buf, n,
             "--eval-batches %d exceeds the validation set (%d whole batches of %d sequences): evaluated %d",
             requested, r->available, B, r->batches);
}

void eval_print(const EvalResult *r, const Dataset *ds, const ModelConfig *c) {
    printf("val loss %.4f (perplexity %.2f) over %lld tokens\n", r->loss, exp(r->loss), (long long)r->tokens);
    if (!r->n_kinds) return;
    int L = c->n_layers, E = c->n_experts;
    printf("per kind of line: loss, and share of each kind's routing to each expert (layer by layer)\n");
    printf("  %-8s %7s %8s", "kind", "loss", "tokens");
    for (int l = 0; l < L; l++) {
        printf("  L%d:", l);
        for (int e = 0; e < E; e++) printf(" e%-3d", e);
    }
    printf("\n");
    for (int kd = 0; kd < r->n_kinds; kd++) {
        printf("  %-8s %7.4f %8lld", ds->kind_names[kd], r->kind_loss[kd], (long long)r->kind_tokens[kd]);
        for (int l = 0; l < L; l++) {
            int64_t tot = 0;
            for (int e = 0; e < E; e++) tot += r->kind_expert[((size_t)kd * L + l) * E + e];
            printf("     ");
            for (int e = 0; e < E; e++)
                printf(" %3.0f%%", tot ? 100.0 * r->kind_expert[((size_t)kd * L + l) * E + e] / tot : 0.0);
        }
        printf("\n");
    }
}

static const float *sort_row;
static int by_weight(const void *a, const void *b) {
    int i = *(const int *)a, j = *(const int *)b;
    return sort_row[i] > sort_row[j] ? -1 : sort_row[i] < sort_row[j] ? 1 : i - j;
}

// The next token from a row of logits (overwritten). Without top-k/top-p: the cumulative draw over the
// vocabulary in id order; with them, over the kept tokens in descending probability (ties: lower id).
static int pick(float *row, int V, const SampleOptions *so, Rng *r, int *order) {
    int next = 0;
    if (so->temperature <= 0) {
        for (int v = 1; v < V; v++)
            if (row[v] > row[next]) next = v;
        return next;
    }
    float mx = row[0];
    for (int v = 1; v < V; v++)
        if (row[v] > mx) mx = row[v];
    double tot = 0;
    for (int v = 0; v < V; v++) tot += (row[v] = expf((row[v] - mx) / so->temperature));
    if ((so->top_k <= 0 || so->top_k >= V) && !(so->top_p < 1)) {
        double u = rng_uniform(r) * tot, acc = 0;
        next = V - 1;
        for (int v = 0; v < V; v++) {
            acc += row[v];
            if (acc > u) {
                next = v;
                break;
            }
        }
        return next;
    }
    // descending by weight, ties to the lower id (a sort for many, insertion into a short kept prefix)
    int kmax = so->top_k > 0 && so->top_k < V ? so->top_k : V, n = 0;
    if (kmax > 64) {
        for (int v = 0; v < V; v++) order[v] = v;
        sort_row = row;
        qsort(order, (size_t)V, sizeof(int), by_weight);
        n = kmax;
    }
    for (int v = 0; v < V && kmax <= 64; v++) {
        if (n == kmax && row[v] <= row[order[n - 1]]) continue;
        int at = n < kmax ? n++ : n - 1;
        while (at > 0 && row[order[at - 1]] < row[v]) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = v;
    }
    double keep = 0;
    int m = 0;
    while (m < n) {
        keep += row[order[m++]];
        if (so->top_p < 1 && keep >= so->top_p * tot) break;
    }
    double u = rng_uniform(r) * keep, acc = 0;
    next = order[m - 1];
    for (int i = 0; i < m; i++) {
        acc += row[order[i]];
        if (acc > u) {
            next = order[i];
            break;
        }
    }
    return next;
}

void sample_tokens(Pipe *p, int32_t *ctx, int *len, int cap, int n, const SampleOptions *so,
                   SampleStats *stats) {
    Model *m = p->m;
    int V = m->c.vocab_size, W = so->window;
    CHECK(W >= 1 && W <= m->maxT, "sampling window %d: the model holds 1..%d positions", W, m->maxT);
    float *row = xmalloc((size_t)V * sizeof(float));
    int *order = xmalloc((size_t)V * sizeof(int));
    Rng r;
    rng_seed(&r, so->seed);
    int cached = so->cache && p->stages == 1 && model_decode_supported(m);
    KvCache kc;
    if (cached) kv_init(&kc, m, W);
    SampleStats st = {0, 0, cached, 0};
    double t0 = now_seconds();
    int s = *len > W ? *len - W : 0, keep = (W + 1) / 2;
    for (int g = 0; g < n && *len < cap; g++) {
        if (*len - s > W) s = *len - keep; // slide: the last ceil(W/2) tokens
        if (!cached) {
            int T = *len - s;
            pipe_forward_all(p, ctx + s, NULL, 1, T);
            pipe_logits_row(p, 0, T - 1, row);
        } else {
            if (kc.len == 0 || s + kc.len != *len - 1) { // (re-)prefill the context
                kc.len = 0;
                model_decode(m, &kc, ctx + s, *len - s, row);
                st.prefills++;
            } else {
                model_decode(m, &kc, ctx + *len - 1, 1, row);
            }
        }
        ctx[(*len)++] = pick(row, V, so, &r, order);
        st.tokens++;
    }
    st.seconds = now_seconds() - t0;
    if (cached) kv_free(&kc, m);
    if (stats) *stats = st;
    free(row);
    free(order);
}

void print_tokens(FILE *f, const int32_t *tok, int n, int vocab) {
    for (int i = 0; i < n; i++) {
        if (vocab > 256) {
            fprintf(f, "%s%d", i ? " " : "", tok[i]);
            continue;
        }
        int ch = tok[i];
        if (ch == '\n' || (ch >= 32 && ch < 127)) fputc(ch, f);
        else fprintf(f, "\\x%02x", ch);
    }
}

double eval_aux_hf(const Model *m) { // after a forward with host_router_out set on every layer
    int L = m->c.n_layers, E = m->c.n_experts, k = m->c.top_k;
    double *cnt = xcalloc((size_t)E, sizeof(double)), *P = xcalloc((size_t)E, sizeof(double));
    double rows = 0;
    for (int l = 0; l < L; l++) {
        const MoeLayer *a = &m->la[l].moe;
        CHECK(a->Ns == a->N, "eval_aux_hf: one process only (this rank routes %d of %d tokens)", a->Ns, a->N);
        for (int t = 0; t < a->Ns; t++) {
            for (int j = 0; j < k; j++) cnt[a->idx_h[(size_t)t * k + j]] += 1;
            for (int e = 0; e < E; e++) P[e] += a->probs_h[(size_t)t * E + e];
        }
        rows += a->Ns;
    }
    double s = 0;
    for (int e = 0; e < E; e++) s += (cnt[e] / rows) * (P[e] / rows);
    free(cnt);
    free(P);
    return rows ? s * E : 0;
}

static void meta_num(cJSON *j, const char *key, double v) {
    char b[40];
    snprintf(b, sizeof b, "%.17g", v);
    cJSON_DeleteItemFromObjectCaseSensitive(j, key);
    cJSON_AddStringToObject(j, key, b);
}

void eval_dump(Model *m, const Dataset *ds, int B, const char *path, int grads, float aux_coef, float z_coef,
               const char *extra_meta) {
    const Backend *be = m->be;
    int T = ds->T, N = B * T, V = m->c.vocab_size, E = m->c.n_experts, L = m->c.n_layers;
    int32_t *x = xmalloc((size_t)N * 4), *y = xmalloc((size_t)N * 4);
    data_val_batch(ds, 0, B, x, y, NULL);
    float *tok = xmalloc((size_t)N * 2 * sizeof(float));
    for (int i = 0; i < N; i++) {
        tok[i] = (float)x[i];
        tok[N + i] = (float)y[i];
    }
    // forward: logits, per-token losses, router logits (and probs, for eval_aux_hf), aux and z
    for (int l = 0; l < L; l++) m->la[l].moe.host_router_out = 1;
    double loss = model_forward(m, x, y, B, T, 0, 0);
    for (int l = 0; l < L; l++) m->la[l].moe.host_router_out = 0;
    double aux = m->aux, aux_hf = eval_aux_hf(m), z = m->z;
    float *logits = xmalloc((size_t)N * V * sizeof(float)), *losses = xmalloc((size_t)N * sizeof(float));
    be->to_host(logits, m->logits, (size_t)N * V * sizeof(float));
    be->to_host(losses, m->losses, (size_t)N * sizeof(float));
    float *rl = xmalloc((size_t)L * N * E * sizeof(float));
    for (int l = 0; l < L; l++)
        memcpy(rl + (size_t)l * N * E, m->la[l].moe.logits_h, (size_t)N * E * sizeof(float));
    float sc[4] = {(float)loss, (float)aux, (float)aux_hf, (float)z};

    int nt = 8 + L + (grads ? m->t.n : 0), n = 0;
    StTensor *ts = xcalloc((size_t)nt, sizeof *ts);
#define TENSOR(NAME, DATA, ND, S0, S1, S2) \
    do { \
        StTensor *q = &ts[n++]; \
        snprintf(q->name, sizeof q->name, "%s", NAME); \
        q->ndim = ND; \
        q->shape[0] = S0; \
        q->shape[1] = S1; \
        q->shape[2] = S2; \
        q->data = DATA; \
    } while (0)
    TENSOR("tokens", tok, 2, B, T, 0);
    TENSOR("targets", tok + N, 2, B, T, 0);
    TENSOR("logits", logits, 3, B, T, V);
    TENSOR("losses", losses, 2, B, T, 0);
    TENSOR("loss", sc, 1, 1, 0, 0);
    TENSOR("aux_loss", sc + 1, 1, 1, 0, 0);
    TENSOR("aux_loss_hf", sc + 2, 1, 1, 0, 0);
    TENSOR("z_loss", sc + 3, 1, 1, 0, 0);
    char nm[128];
    for (int l = 0; l < L; l++) {
        snprintf(nm, sizeof nm, "router_logits.%d", l);
        TENSOR(nm, rl + (size_t)l * N * E, 2, N, E, 0);
    }
    float *g = NULL;
    if (grads) {
        be->zero(m->grads, m->t.ltotal * sizeof(float));
        model_forward(m, x, y, B, T, 1.0f / (float)N, 0);
        model_backward(m, aux_coef, z_coef);
        g = xmalloc(m->t.ltotal * sizeof(float));
        be->to_host(g, m->grads, m->t.ltotal * sizeof(float));
        for (int i = 0; i < m->t.n; i++) {
            const ParamSpec *s = &m->t.p[i];
            CHECK(s->lnumel == s->numel, "eval_dump: gradients of a sliced model are not supported (%s)",
                  s->name);
            int k = snprintf(nm, sizeof nm, "grad.%s", s->name);
            CHECK(k > 0 && (size_t)k < sizeof nm, "eval_dump: tensor name too long: %s", s->name);
            TENSOR(nm, g + s->loffset, s->ndim, s->shape[0], s->ndim > 1 ? s->shape[1] : 0, 0);
        }
    }
#undef TENSOR
    cJSON *meta = extra_meta && extra_meta[0] ? cJSON_Parse(extra_meta) : cJSON_CreateObject();
    CHECK(cJSON_IsObject(meta), "eval_dump: extra metadata is not a JSON object");
    meta_num(meta, "loss", loss);
    meta_num(meta, "aux_loss", aux);
    meta_num(meta, "aux_loss_hf", aux_hf);
    meta_num(meta, "z_loss", z);
    meta_num(meta, "batch", B);
    meta_num(meta, "seq_len", T);
    if (grads) {
        meta_num(meta, "grad_aux_coef", aux_coef);
        meta_num(meta, "grad_z_coef", z_coef);
        cJSON_AddStringToObject(meta, "grad_loss",
                                "mean cross-entropy + grad_aux_coef * aux_loss + grad_z_coef * z_loss");
    }
    char *mj = cJSON_PrintUnformatted(meta);
    cJSON_Delete(meta);
    safetensors_write(path, ts, n, mj);
    cJSON_free(mj);
    free(ts);
    free(g);
    free(rl);
    free(logits);
    free(losses);
    free(tok);
    free(x);
    free(y);
}
