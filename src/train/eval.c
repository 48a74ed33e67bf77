// eval.c — validation loss with the per-kind breakdown and expert routing (see eval.h).
#include "train/eval.h"
#include <math.h>
#include <string.h>
#include "core/common.h"

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
            if (ml->dense) continue; // (no routing)
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
