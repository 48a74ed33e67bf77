// config_deepseek.c — transformers' DeepseekV3Config keys <-> ModelConfig (the family deepseek_v3 of
// config_json.c; DeepSeek-V3/R1, Kimi K2 and Moonlight use the class) and YaRN's rope parameters.
// Must not hold: the other families' keys (config_json.c), file IO.
#include "io/config_deepseek.h"
#include <string.h>

int config_read_yarn(JsonErr *e, const cJSON *o, const char *key, ModelConfig *c) {
    static const char *const known[] = {"rope_type",
                                        "type",
                                        "rope_theta",
                                        "factor",
                                        "original_max_position_embeddings",
                                        "beta_fast",
                                        "beta_slow",
                                        "mscale",
                                        "mscale_all_dim",
                                        "truncate",
                                        "partial_rotary_factor"};
    for (const cJSON *it = o->child; it; it = it->next) {
        int k = 0;
        while (k < (int)(sizeof known / sizeof known[0]) && strcmp(it->string, known[k])) k++;
        if (k == (int)(sizeof known / sizeof known[0]) && !cJSON_IsNull(it))
            return json_fail(e, "key \"%s\": \"%s\" is not supported with rope_type \"yarn\"", key,
                             it->string);
    }
    int trunc = 1;
    float prf = 1;
    if (json_get_bool(e, o, "truncate", 0, &trunc) || json_get_float(e, o, "partial_rotary_factor", 0, &prf))
        return -1;
    if (!trunc)
        return json_fail(e, "key \"%s\": truncate false is not supported (YaRN's range is truncated)", key);
    if (prf != 1) return json_fail(e, "key \"%s\": partial_rotary_factor %g is not supported", key, prf);
    c->yarn_beta_fast = c->yarn_beta_slow = c->yarn_mscale = c->yarn_mscale_all_dim = 0;
    if (json_get_float(e, o, "factor", 1, &c->rope_factor) ||
        json_get_int(e, o, "original_max_position_embeddings", 1, &c->rope_orig_max) ||
        json_get_float(e, o, "beta_fast", 0, &c->yarn_beta_fast) ||
        json_get_float(e, o, "beta_slow", 0, &c->yarn_beta_slow) ||
        json_get_float(e, o, "mscale", 0, &c->yarn_mscale) ||
        json_get_float(e, o, "mscale_all_dim", 0, &c->yarn_mscale_all_dim))
        return -1;
    if (!(c->rope_factor >= 1))
        return json_fail(e, "key \"%s\": factor %g is not supported (YaRN scales by a factor >= 1)", key,
                         c->rope_factor);
    return 0;
}

void config_write_rope(cJSON *j, const ModelConfig *c) {
    json_add_f(j, "rope_theta", c->rope_theta);
    if (c->rope_factor == 0) return;
    cJSON *y = cJSON_CreateObject();
    cJSON_AddStringToObject(y, "rope_type", "yarn");
    json_add_f(y, "rope_theta", c->rope_theta);
    json_add_f(y, "factor", c->rope_factor);
    json_add_i(y, "original_max_position_embeddings", c->rope_orig_max);
    json_add_f(y, "beta_fast", c->yarn_beta_fast > 0 ? c->yarn_beta_fast : 32);
    json_add_f(y, "beta_slow", c->yarn_beta_slow > 0 ? c->yarn_beta_slow : 1);
    if (c->yarn_mscale != 0) json_add_f(y, "mscale", c->yarn_mscale);
    if (c->yarn_mscale_all_dim != 0) json_add_f(y, "mscale_all_dim", c->yarn_mscale_all_dim);
    cJSON_AddItemToObject(j, "rope_parameters", y);
}

// A key that must have one value (a method transformers' DeepseekV3 does not choose: the original configs'
// topk_method, scoring_func), when present.
static int only(JsonErr *e, const cJSON *j, const char *key, const char *want) {
    const cJSON *it = json_item(j, key);
    if (it && !(cJSON_IsString(it) && !strcmp(it->valuestring, want)))
        return json_fail(
            e, "key \"%s\" is %s%s%s; only \"%s\" is supported", key, cJSON_IsString(it) ? "\"" : "",
            cJSON_IsString(it) ? it->valuestring : "not a string", cJSON_IsString(it) ? "\"" : "", want);
    return 0;
}

// Latent attention's keys (DeepseekV3Config's defaults where absent; q_lora_rank null: q_proj).
static int read_mla(JsonErr *e, const cJSON *j, ModelConfig *c) {
    c->q_lora_rank = 1536;
    c->kv_lora_rank = 512;
    c->qk_rope_head_dim = 64;
    c->qk_nope_head_dim = 128;
    c->v_head_dim = 128;
    c->rope_interleave = 1;
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(j, "q_lora_rank");
    if (q && cJSON_IsNull(q)) c->q_lora_rank = 0;
    else if (json_get_int(e, j, "q_lora_rank", 0, &c->q_lora_rank)) return -1;
    if (q && !cJSON_IsNull(q) && c->q_lora_rank < 1)
        return json_fail(e, "key \"q_lora_rank\" must be >= 1 or null (got %d)", c->q_lora_rank);
    if (json_get_int(e, j, "kv_lora_rank", 0, &c->kv_lora_rank) ||
        json_get_int(e, j, "qk_rope_head_dim", 0, &c->qk_rope_head_dim) ||
        json_get_int(e, j, "qk_nope_head_dim", 0, &c->qk_nope_head_dim) ||
        json_get_int(e, j, "v_head_dim", 0, &c->v_head_dim) ||
        json_get_bool(e, j, "rope_interleave", 0, &c->rope_interleave))
        return -1;
    if (c->kv_lora_rank < 1)
        return json_fail(e, "key \"kv_lora_rank\" must be >= 1 (got %d)", c->kv_lora_rank);
    c->head_dim = c->qk_rope_head_dim; // (DeepseekV3Config sets it so whatever the key says)
    return 0;
}

int ds_config_read(JsonErr *e, const cJSON *j, ModelConfig *c) {
    if (only(e, j, "topk_method", "noaux_tc") || only(e, j, "scoring_func", "sigmoid")) return -1;
    int freq = 1;
    if (json_get_int(e, j, "moe_layer_freq", 0, &freq)) return -1;
    if (freq != 1) return json_fail(e, "key \"moe_layer_freq\" is %d; only 1 is supported", freq);
    if (read_mla(e, j, c)) return -1;
    c->renormalize = 1;
    c->route_sigmoid = 1;
    c->balance = BALANCE_AUX_FREE;
    c->n_group = 8;
    c->topk_group = 4;
    c->route_scale = 2.5f;
    c->n_shared_experts = 1;
    int k = 3;
    if (json_get_bool(e, j, "norm_topk_prob", 0, &c->renormalize) ||
        json_get_int(e, j, "n_group", 0, &c->n_group) ||
        json_get_int(e, j, "topk_group", 0, &c->topk_group) ||
        json_get_float(e, j, "routed_scaling_factor", 0, &c->route_scale) ||
        json_get_int(e, j, "n_shared_experts", 0, &c->n_shared_experts) ||
        json_get_int(e, j, "first_k_dense_replace", 0, &k))
        return -1;
    c->shared_d_ff = c->d_ff; // (one MLP of n_shared_experts x moe_intermediate_size)
    if (c->n_shared_experts < 1)
        return json_fail(e, "key \"n_shared_experts\" must be >= 1 (got %d)", c->n_shared_experts);
    if (k < 0 || k > c->n_layers || k > MOE_MAX_DENSE_LAYERS)
        return json_fail(e, "key \"first_k_dense_replace\" must be in 0..%d (got %d)",
                         c->n_layers < MOE_MAX_DENSE_LAYERS ? c->n_layers : MOE_MAX_DENSE_LAYERS, k);
    for (int l = 0; l < k; l++) config_set_dense(c, l);
    if (k > 0 && json_get_int(e, j, "intermediate_size", 1, &c->dense_d_ff)) return -1;
    // transformers' DeepseekV3 trains with no auxiliary loss; the original configs' sequence-wise one
    c->aux_coef = 0;
    // (and their seq_aux: true, that sequence-wise loss; false, DeepSeek-V2's batch-wise one, is refused)
    int seq = 1;
    if (json_get_float(e, j, "aux_loss_alpha", 0, &c->aux_coef) || json_get_bool(e, j, "seq_aux", 0, &seq))
        return -1;
    if (!seq && c->aux_coef != 0)
        return json_fail(e,
                         "key \"seq_aux\" is false with aux_loss_alpha %g: the batch-wise aux loss is not "
                         "supported (only seq_aux true, the sequence-wise one)",
                         c->aux_coef);
    return 0;
}

void ds_config_write(cJSON *j, const ModelConfig *c) {
    int k = 0;
    while (k < c->n_layers && config_layer_dense(c, k)) k++;
    json_add_i(j, "intermediate_size", k ? c->dense_d_ff : c->d_ff);
    json_add_i(j, "moe_intermediate_size", c->d_ff);
    json_add_i(j, "num_hidden_layers", c->n_layers);
    json_add_i(j, "num_attention_heads", c->n_heads);
    json_add_i(j, "num_key_value_heads", c->n_kv_heads);
    json_add_i(j, "n_shared_experts", c->n_shared_experts);
    json_add_i(j, "n_routed_experts", c->n_experts);
    json_add_f(j, "routed_scaling_factor", c->route_scale != 0 ? c->route_scale : 1.0f);
    json_add_i(j, "kv_lora_rank", c->kv_lora_rank);
    if (c->q_lora_rank) json_add_i(j, "q_lora_rank", c->q_lora_rank);
    else cJSON_AddNullToObject(j, "q_lora_rank");
    json_add_i(j, "qk_rope_head_dim", c->qk_rope_head_dim);
    json_add_i(j, "v_head_dim", c->v_head_dim);
    json_add_i(j, "qk_nope_head_dim", c->qk_nope_head_dim);
    json_add_i(j, "n_group", c->n_group > 1 ? c->n_group : 1);
    json_add_i(j, "topk_group", c->n_group > 1 ? c->topk_group : 1);
    json_add_i(j, "num_experts_per_tok", c->top_k);
    json_add_i(j, "first_k_dense_replace", k);
    cJSON_AddBoolToObject(j, "norm_topk_prob", c->renormalize != 0);
    json_add_i(j, "max_position_embeddings", c->max_seq_len);
    config_write_rope(j, c);
    cJSON_AddBoolToObject(j, "rope_interleave", c->rope_interleave != 0);
    json_add_f(j, "rms_norm_eps", c->norm_eps);
    // the sequence-wise aux loss's coefficient, under the original configs' name (ds_config_read's key:
    // without it a checkpoint's config would read back with none, and a resumed run train without it)
    json_add_f(j, "aux_loss_alpha", c->aux_coef);
    json_add_i(j, "num_nextn_predict_layers", c->mtp_depth); // (the MTP modules: config.h)
    cJSON_AddBoolToObject(j, "attention_bias", 0);
}
