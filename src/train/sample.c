// sample.c — sampling tokens from a model's logits, over a sliding context window (see sample.h).
#include "train/sample.h"
#include <math.h>
#include <stdlib.h>
#include "core/common.h"
#include "core/rng.h"
#include "model/decode.h"

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
        if (so->emit) so->emit(so->emit_arg, ctx[*len - 1]);
        st.tokens++;
    }
    st.seconds = now_seconds() - t0;
    if (cached) kv_free(&kc, m);
    if (stats) *stats = st;
    free(row);
    free(order);
}

void print_tokens(FILE *f, TokStream *s, const int32_t *tok, int n, int vocab) {
    for (int i = 0; i < n && s; i++) {
        size_t len = 3;
        const char *piece = tok[i] < tok_vocab_size(tok_stream_tokenizer(s))
            ? tok_stream_step(s, tok[i], &len)
            : "\xEF\xBF\xBD";
        fwrite(piece, 1, len, f);
    }
    for (int i = 0; i < n && !s; i++) {
        if (vocab > 256) {
            fprintf(f, "%s%d", i ? " " : "", tok[i]);
            continue;
        }
        int ch = tok[i];
        if (ch == '\n' || (ch >= 32 && ch < 127)) fputc(ch, f);
        else fprintf(f, "\\x%02x", ch);
    }
}
