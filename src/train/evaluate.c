// evaluate.c — validation loss with per-kind breakdown and expert routing, and sampling.
#include "train/evaluate.h"
#include <math.h>
#include <string.h>
#include "core/common.h"
#include "core/rng.h"

void evaluate(Model *m, const Dataset *ds, int B, int n_batches, int want_kinds, EvalResult *r) {
    memset(r, 0, sizeof *r);
    int T = ds->T, N = B * T, L = m->c.n_layers, E = m->c.n_experts, k = m->c.top_k;
    int32_t *x = xmalloc((size_t)N * 4), *y = xmalloc((size_t)N * 4);
    uint8_t *kinds = xmalloc((size_t)N);
    float *losses = xmalloc((size_t)N * sizeof(float));
    r->n_kinds = want_kinds ? ds->n_kinds : 0;
    if (r->n_kinds) r->kind_expert = xcalloc((size_t)r->n_kinds * L * E, sizeof(int64_t));
    double sum = 0;
    for (int b = 0; b < n_batches; b++) {
        data_val_batch(ds, (uint64_t)b * B, B, x, y, kinds);
        model_forward(m, x, y, B, T, 0, 0);
        m->be->to_host(losses, m->losses, (size_t)N * sizeof(float));
        for (int i = 0; i < N; i++) {
            sum += losses[i];
            if (r->n_kinds) {
                int kd = kinds[i];
                r->kind_loss[kd] += losses[i];
                r->kind_tokens[kd]++;
                // the expert choice at position i routes input token i, whose kind is that of
                // the previous target; use the target's kind (same line except at line starts)
                for (int l = 0; l < L; l++)
                    for (int j = 0; j < k; j++)
                        r->kind_expert[((size_t)kd * L + l) * E + m->la[l].moe.idx_h[(size_t)i * k + j]]++;
            }
        }
        r->tokens += N;
    }
    r->loss = r->tokens ? sum / r->tokens : 0;
    for (int kd = 0; kd < r->n_kinds; kd++)
        if (r->kind_tokens[kd]) r->kind_loss[kd] /= r->kind_tokens[kd];
    free(x); free(y); free(kinds); free(losses);
}

void eval_result_free(EvalResult *r) { free(r->kind_expert); r->kind_expert = NULL; }

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

void sample_tokens(Model *m, int32_t *ctx, int *len, int cap, int n, float temperature, uint64_t seed) {
    int V = m->c.vocab_size;
    float *row = xmalloc((size_t)V * sizeof(float));
    Rng r;
    rng_seed(&r, seed);
    for (int s = 0; s < n && *len < cap; s++) {
        int T = *len < m->maxT ? *len : m->maxT;
        const int32_t *win = ctx + *len - T;
        model_forward(m, win, NULL, 1, T, 0, 0);
        model_logits_row(m, 0, T - 1, row);
        int next = 0;
        if (temperature <= 0) {
            for (int v = 1; v < V; v++) if (row[v] > row[next]) next = v;
        } else {
            float mx = row[0];
            for (int v = 1; v < V; v++) if (row[v] > mx) mx = row[v];
            double tot = 0;
            for (int v = 0; v < V; v++) tot += (row[v] = expf((row[v] - mx) / temperature));
            double u = rng_uniform(&r) * tot, acc = 0;
            next = V - 1;
            for (int v = 0; v < V; v++) { acc += row[v]; if (acc > u) { next = v; break; } }
        }
        ctx[(*len)++] = next;
    }
    free(row);
}

void print_tokens(FILE *f, const int32_t *tok, int n, int vocab) {
    for (int i = 0; i < n; i++) {
        if (vocab > 256) { fprintf(f, "%s%d", i ? " " : "", tok[i]); continue; }
        int ch = tok[i];
        if (ch == '\n' || (ch >= 32 && ch < 127)) fputc(ch, f);
        else fprintf(f, "\\x%02x", ch);
    }
}
