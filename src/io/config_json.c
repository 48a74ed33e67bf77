// config_json.c — ModelConfig <-> the family's HF config.json (MixtralConfig, OlmoeConfig, Qwen2MoeConfig,
// Qwen3MoeConfig keys; plus our MoE options under "moe_c").
#include "io/config_json.h"
#include "io/config_deepseek.h"
#include "io/json_keys.h"
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static const char *const scope_names[] = {"micro-batch", "sequence", "global"};

// The dense layers (config.h dense_layers) as a JSON list of layer numbers.
static cJSON *dense_list(const ModelConfig *c) {
    cJSON *a = cJSON_CreateArray();
    for (int l = 0; l < c->n_layers; l++)
        if (config_layer_dense(c, l)) cJSON_AddItemToArray(a, cJSON_CreateNumber(l));
    return a;
}

// The shape and options of the four families' configs (MixtralConfig, OlmoeConfig, Qwen2MoeConfig,
// Qwen3MoeConfig) after hidden_size.
static void family_keys(cJSON *j, const ModelConfig *c) {
    int fam = c->family, mix = fam == FAM_MIXTRAL, qwen = fam == FAM_QWEN2_MOE || fam == FAM_QWEN3_MOE;
    // the experts' hidden size: Mixtral's and OLMoE's intermediate_size; Qwen's moe_intermediate_size (their
    // intermediate_size is the dense MLP of layers that have no experts, which ours do not have)
    int dense = config_moe_layers(c) < c->n_layers;
    if (qwen) {
        json_add_i(j, "moe_intermediate_size", c->d_ff);
        json_add_i(j, "intermediate_size",
                   dense                     ? c->dense_d_ff
                       : c->n_shared_experts ? c->n_shared_experts * c->shared_d_ff
                                             : c->d_ff);
    } else {
        json_add_i(j, "intermediate_size", c->d_ff);
    }
    json_add_i(j, "num_hidden_layers", c->n_layers);
    if (c->mtp_depth) json_add_i(j, "num_nextn_predict_layers", c->mtp_depth); // (DeepseekV3Config's key)
    json_add_i(j, "num_attention_heads", c->n_heads);
    json_add_i(j, "num_key_value_heads", c->n_kv_heads);
    json_add_i(j, "head_dim", c->head_dim);
    json_add_i(j, mix ? "num_local_experts" : "num_experts", c->n_experts);
    json_add_i(j, "num_experts_per_tok", c->top_k);
    json_add_i(j, "max_position_embeddings", c->max_seq_len);
    json_add_f(j, "rope_theta", c->rope_theta);
    json_add_f(j, "rms_norm_eps", c->norm_eps);
    json_add_f(j, "router_aux_loss_coef", c->aux_coef);
    if (mix) json_add_f(j, "router_jitter_noise", c->jitter);
    else cJSON_AddBoolToObject(j, "norm_topk_prob", c->renormalize != 0);
    if (fam == FAM_QWEN2_MOE) {
        json_add_i(j, "shared_expert_intermediate_size", c->n_shared_experts * c->shared_d_ff);
        cJSON_AddBoolToObject(j, "qkv_bias", c->qkv_bias != 0);
    }
    if (qwen) { // the dense layers as a list (every other layer an MoE layer: step 1)
        json_add_i(j, "decoder_sparse_step", 1);
        cJSON_AddItemToObject(j, "mlp_only_layers", dense_list(c));
        cJSON_AddBoolToObject(j, "use_sliding_window", 0);
    }
    if (fam == FAM_OLMOE) cJSON_AddNullToObject(j, "clip_qkv");
    if (!mix && fam != FAM_QWEN2_MOE) cJSON_AddBoolToObject(j, "attention_bias", 0);
}

cJSON *config_to_json(const ModelConfig *c) {
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_CreateArray();
    int fam = c->family, mix = fam == FAM_MIXTRAL, qwen = fam == FAM_QWEN2_MOE || fam == FAM_QWEN3_MOE,
        ds = fam == FAM_DEEPSEEK_V3, dense = config_moe_layers(c) < c->n_layers;
    cJSON_AddItemToArray(arch, cJSON_CreateString(config_family_arch(fam)));
    cJSON_AddItemToObject(j, "architectures", arch);
    cJSON_AddStringToObject(j, "model_type", config_family_name(fam));
    json_add_i(j, "vocab_size", c->vocab_size);
    json_add_i(j, "hidden_size", c->d_model);
    if (ds) ds_config_write(j, c);
    else family_keys(j, c);
    json_add_f(j, "initializer_range", c->init_std);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    if (!ds) cJSON_AddNullToObject(j, "sliding_window");
    json_add_f(j, "attention_dropout", c->attention_dropout);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", 0);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");

    cJSON *m = cJSON_CreateObject();
    cJSON_AddBoolToObject(m, "renormalize", c->renormalize != 0);
    json_add_f(m, "jitter", c->jitter);
    json_add_f(m, "z_coef", c->z_coef);
    cJSON_AddStringToObject(m, "dispatch", c->dispatch == DISPATCH_CAPACITY ? "capacity" : "dropless");
    cJSON_AddStringToObject(m, "aux_form", c->aux_form == AUX_HF ? "hf" : "layer");
    json_add_f(m, "capacity_factor", c->capacity_factor);
    cJSON_AddStringToObject(m, "balance", c->balance == BALANCE_AUX_FREE ? "aux-free" : "aux");
    json_add_f(m, "bias_rate", c->bias_rate);
    cJSON_AddStringToObject(m, "aux_scope",
                            scope_names[c->aux_scope >= 0 && c->aux_scope < 3 ? c->aux_scope : 0]);
    if (!ds && (c->route_sigmoid || c->n_group > 1 || (c->route_scale != 0 && c->route_scale != 1))) {
        // DeepSeek-V3's routing (written only where set: other configs' files stay as they were)
        cJSON_AddBoolToObject(m, "route_sigmoid", c->route_sigmoid != 0);
        json_add_i(m, "n_group", c->n_group);
        json_add_i(m, "topk_group", c->topk_group);
        json_add_f(m, "routed_scaling_factor", c->route_scale != 0 ? c->route_scale : 1.0f);
    }
    if (dense && !qwen && !ds) { // no HF key for them in this family: ours
        cJSON_AddItemToObject(m, "dense_layers", dense_list(c));
        json_add_i(m, "dense_intermediate_size", c->dense_d_ff);
    }
    if (c->n_shared_experts && fam != FAM_QWEN2_MOE && !ds) { // ungated shared experts (ours: DeepSeek-V3's)
        json_add_i(m, "n_shared_experts", c->n_shared_experts);
        json_add_i(m, "shared_intermediate_size", c->shared_d_ff);
    }
    if (c->mtp_depth) json_add_f(m, "mtp_weight", c->mtp_weight);
    if (config_mla(c) && !ds) { // latent attention in our own configs (DeepseekV3Config's key names)
        json_add_i(m, "q_lora_rank", c->q_lora_rank);
        json_add_i(m, "kv_lora_rank", c->kv_lora_rank);
        json_add_i(m, "qk_nope_head_dim", c->qk_nope_head_dim);
        json_add_i(m, "qk_rope_head_dim", c->qk_rope_head_dim);
        json_add_i(m, "v_head_dim", c->v_head_dim);
        cJSON_AddBoolToObject(m, "rope_interleave", c->rope_interleave != 0);
    }
    if (c->rope_factor != 0 && !ds) { // YaRN, as transformers' rope_parameters has it
        cJSON *y = cJSON_CreateObject();
        cJSON_AddStringToObject(y, "rope_type", "yarn");
        json_add_f(y, "factor", c->rope_factor);
        json_add_i(y, "original_max_position_embeddings", c->rope_orig_max);
        json_add_f(y, "beta_fast", c->yarn_beta_fast);
        json_add_f(y, "beta_slow", c->yarn_beta_slow);
        json_add_f(y, "mscale", c->yarn_mscale);
        json_add_f(y, "mscale_all_dim", c->yarn_mscale_all_dim);
        cJSON_AddItemToObject(m, "yarn", y);
    }
    int same = ds ? c->dispatch != DISPATCH_CAPACITY
                  : !config_mla(c) && c->dispatch != DISPATCH_CAPACITY && c->balance == BALANCE_AUX &&
            (!mix || c->renormalize != 0) && (qwen || !dense) && !c->route_sigmoid && c->n_group <= 1 &&
            (c->route_scale == 0 || c->route_scale == 1) && (!c->n_shared_experts || fam == FAM_QWEN2_MOE);
    if (mix) cJSON_AddBoolToObject(m, "mixtral_compatible", same);
    cJSON_AddBoolToObject(m, "hf_compatible", same);
    cJSON_AddItemToObject(j, "moe_c", m);
    return j;
}

// ---- reading ----


// The family: "architectures" (what from_pretrained builds), else "model_type"; both present must agree;
// neither: Mixtral. Keys of another family's options are refused rather than ignored (the model would
// silently differ).
static int read_family(JsonErr *e, const cJSON *j, ModelConfig *c) {
    c->family = -1;
    const cJSON *ar = json_item(j, "architectures");
    if (ar) {
        if (!cJSON_IsArray(ar) || cJSON_GetArraySize(ar) != 1 || !cJSON_IsString(cJSON_GetArrayItem(ar, 0)))
            return json_fail(e, "key \"architectures\" must be a list of one name");
        const char *an = cJSON_GetArrayItem(ar, 0)->valuestring;
        for (int f = FAM_MIXTRAL; f <= FAM_LAST; f++)
            if (!strcmp(an, config_family_arch(f))) c->family = f;
        if (c->family < 0)
            return json_fail(
                e,
                "architecture \"%s\" is not supported (supported: MixtralForCausalLM, OlmoeForCausalLM, "
                "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, DeepseekV3ForCausalLM)",
                an);
    }
    const cJSON *mt = json_item(j, "model_type");
    if (mt) {
        int f = -1;
        for (int k = FAM_MIXTRAL; k <= FAM_LAST; k++)
            if (cJSON_IsString(mt) && !strcmp(mt->valuestring, config_family_name(k))) f = k;
        if (f < 0 || (c->family >= 0 && f != c->family))
            return json_fail(
                e, "key \"model_type\" is %s%s%s, expected \"%s\"%s%s", cJSON_IsString(mt) ? "\"" : "",
                cJSON_IsString(mt) ? mt->valuestring : "not a string", cJSON_IsString(mt) ? "\"" : "",
                config_family_name(c->family >= 0 ? c->family : FAM_MIXTRAL),
                c->family >= 0 ? " (architectures says " : "",
                c->family >= 0 ? config_family_arch(c->family) : "");
        if (c->family < 0) c->family = f;
    }
    if (c->family < 0) c->family = FAM_MIXTRAL; // neither: a Mixtral config (ours before families)
    const char *fam = config_family_name(c->family);
    static const struct {
        const char *key;
        int fams;
    } foreign[] = {
        // fams: bit f = family f has it
        {"shared_expert_intermediate_size", 1 << FAM_QWEN2_MOE},
        {"qkv_bias", 1 << FAM_QWEN2_MOE},
        {"clip_qkv", 1 << FAM_OLMOE},
        {"norm_topk_prob", ~(1 << FAM_MIXTRAL)},
        {"moe_intermediate_size", (1 << FAM_QWEN2_MOE) | (1 << FAM_QWEN3_MOE) | (1 << FAM_DEEPSEEK_V3)},
        {"num_experts", ~(1 << FAM_MIXTRAL)},
        {"n_shared_experts", 1 << FAM_DEEPSEEK_V3},
        {"first_k_dense_replace", 1 << FAM_DEEPSEEK_V3},
        {"q_lora_rank", 1 << FAM_DEEPSEEK_V3},
        {"kv_lora_rank", 1 << FAM_DEEPSEEK_V3}};
    for (size_t q = 0; q < sizeof foreign / sizeof foreign[0]; q++)
        if (json_item(j, foreign[q].key) && !(foreign[q].fams & (1 << c->family)))
            return json_fail(e, "key \"%s\" is not an option of %s (%s has no such option)", foreign[q].key,
                             config_family_arch(c->family), fam);
    return 0;
}

// RoPE: "rope_theta" (transformers 4.x) or "rope_parameters": {"rope_type", "rope_theta"} (5.x,
// which wins when both are present). The default (unscaled) RoPE; DeepseekV3's YaRN ("yarn" in
// rope_parameters, or 4.x's "rope_scaling" with "type": "yarn"; config_read_yarn) for that family.
static int is_yarn(const cJSON *rt) { return rt && cJSON_IsString(rt) && !strcmp(rt->valuestring, "yarn"); }
static int read_rope(JsonErr *e, const cJSON *j, ModelConfig *c) {
    int ds = c->family == FAM_DEEPSEEK_V3, yarn = 0;
    const cJSON *rp = json_item(j, "rope_parameters");
    if (rp) {
        if (!cJSON_IsObject(rp)) return json_fail(e, "key \"rope_parameters\" must be an object");
        const cJSON *rt = json_item(rp, "rope_type");
        yarn = ds && is_yarn(rt);
        if (yarn && config_read_yarn(e, rp, "rope_parameters", c)) return -1;
        if (!yarn && rt && (!cJSON_IsString(rt) || strcmp(rt->valuestring, "default") != 0))
            return json_fail(
                e, "key \"rope_parameters\": rope_type %s%s%s is not supported (only \"default\" RoPE%s)",
                cJSON_IsString(rt) ? "\"" : "", cJSON_IsString(rt) ? rt->valuestring : "(not a string)",
                cJSON_IsString(rt) ? "\"" : "", ds ? " and \"yarn\"" : ", no scaling");
        for (const cJSON *it = rp->child; it && !yarn; it = it->next)
            if (strcmp(it->string, "rope_type") != 0 && strcmp(it->string, "rope_theta") != 0 &&
                !cJSON_IsNull(it))
                return json_fail(
                    e, "key \"rope_parameters\": \"%s\" is not supported (only default RoPE with rope_theta)",
                    it->string);
        e->prefix = "rope_parameters: ";
        if (json_get_float(e, rp, "rope_theta", !json_item(j, "rope_theta"), &c->rope_theta)) return -1;
        e->prefix = "";
        if (!json_item(rp, "rope_theta") && json_get_float(e, j, "rope_theta", 1, &c->rope_theta)) return -1;
    } else if (json_get_float(e, j, "rope_theta", 1, &c->rope_theta)) {
        return -1;
    }
    const cJSON *rs = json_item(j, "rope_scaling");
    if (rs && !yarn) {
        const cJSON *rt = cJSON_IsObject(rs) ? json_item(rs, "rope_type") : NULL;
        if (!rt && cJSON_IsObject(rs)) rt = json_item(rs, "type");
        if (ds && is_yarn(rt)) return config_read_yarn(e, rs, "rope_scaling", c);
        int named = rt && cJSON_IsString(rt); // (the message names the type it refuses)
        if (!(named && strcmp(rt->valuestring, "default") == 0))
            return json_fail(e, "key \"rope_scaling\" is set (type %s%s%s); RoPE scaling is not supported%s",
                             named ? "\"" : "", named ? rt->valuestring : "none", named ? "\"" : "",
                             ds ? " (only \"yarn\")" : "");
    }
    return 0;
}

// The model's shape: the required keys, RoPE, the expert count's second name, head_dim and the HF
// defaults of the optional router and init keys.
static int read_shape(JsonErr *e, const cJSON *j, ModelConfig *c) {
    int mix = c->family == FAM_MIXTRAL, qwen = c->family == FAM_QWEN2_MOE || c->family == FAM_QWEN3_MOE,
        ds = c->family == FAM_DEEPSEEK_V3;
    c->n_kv_heads = -1; // (DeepseekV3Config: absent = num_attention_heads)
    if (json_get_int(e, j, "vocab_size", 1, &c->vocab_size) ||
        json_get_int(e, j, "hidden_size", 1, &c->d_model) ||
        json_get_int(e, j, qwen || ds ? "moe_intermediate_size" : "intermediate_size", 1, &c->d_ff) ||
        json_get_int(e, j, "num_hidden_layers", 1, &c->n_layers) ||
        json_get_int(e, j, "num_attention_heads", 1, &c->n_heads) ||
        json_get_int(e, j, "num_key_value_heads", !ds, &c->n_kv_heads) ||
        json_get_int(e, j,
                     ds                                        ? "n_routed_experts"
                         : mix || !json_item(j, "num_experts") ? "num_local_experts"
                                                               : "num_experts",
                     1, &c->n_experts) ||
        json_get_int(e, j, "num_experts_per_tok", 1, &c->top_k) ||
        json_get_int(e, j, "max_position_embeddings", 1, &c->max_seq_len) ||
        json_get_float(e, j, "rms_norm_eps", 1, &c->norm_eps))
        return -1;
    if (read_rope(e, j, c)) return -1;
    if (c->n_heads <= 0)
        return json_fail(e, "key \"num_attention_heads\" must be positive (got %d)", c->n_heads);
    if (c->n_kv_heads < 0) c->n_kv_heads = c->n_heads;
    // transformers 5 writes Qwen3-MoE's expert count under both names: they must agree
    int nle = c->n_experts;
    if (!mix && !ds && json_get_int(e, j, "num_local_experts", 0, &nle)) return -1;
    if (nle != c->n_experts)
        return json_fail(e, "keys \"num_experts\" (%d) and \"num_local_experts\" (%d) contradict each other",
                         c->n_experts, nle);
    c->head_dim = c->d_model / c->n_heads; // HF default when head_dim is absent or null
    c->aux_coef = c->family == FAM_OLMOE ? 0.01f : 0.001f; // HF config defaults
    c->init_std = 0.02f;
    c->jitter = 0.0f;
    if (json_get_int(e, j, "head_dim", 0, &c->head_dim) ||
        json_get_float(e, j, "router_aux_loss_coef", 0, &c->aux_coef) ||
        json_get_float(e, j, "initializer_range", 0, &c->init_std) ||
        json_get_float(e, j, "router_jitter_noise", 0, &c->jitter))
        return -1;
    // OLMoE and Qwen2-MoE compute head_dim = hidden_size / num_attention_heads whatever the key says
    if ((c->family == FAM_OLMOE || c->family == FAM_QWEN2_MOE) && c->head_dim * c->n_heads != c->d_model)
        return json_fail(
            e, "key \"head_dim\" is %d, but %s's heads are hidden_size / num_attention_heads = %d / %d wide",
            c->head_dim, config_family_arch(c->family), c->d_model, c->n_heads);
    return 0;
}

// A list of layer numbers (key: its name in messages) into c's dense layers.
static int read_dense_list(JsonErr *e, const cJSON *a, const char *key, ModelConfig *c) {
    if (!cJSON_IsArray(a)) return json_fail(e, "key \"%s\" must be a list of layer numbers", key);
    for (const cJSON *it = a->child; it; it = it->next) {
        double d = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!(d == floor(d) && d >= 0 && d < c->n_layers))
            return json_fail(e, "key \"%s\" must list layer numbers in 0..%d (num_hidden_layers %d)", key,
                             c->n_layers - 1, c->n_layers);
        if (d >= MOE_MAX_DENSE_LAYERS)
            return json_fail(e, "key \"%s\" names layer %.0f; dense layers are supported up to layer %d", key,
                             d, MOE_MAX_DENSE_LAYERS - 1);
        config_set_dense(c, (int)d);
    }
    return 0;
}

// The families' options (config.h): fixed by the architecture, or read from their keys.
static int read_family_options(JsonErr *e, const cJSON *j, ModelConfig *c) {
    int mix = c->family == FAM_MIXTRAL, qwen = c->family == FAM_QWEN2_MOE || c->family == FAM_QWEN3_MOE;
    c->renormalize = mix; // norm_topk_prob: HF's default is false in all three
    if (!mix && json_get_bool(e, j, "norm_topk_prob", 0, &c->renormalize)) return -1;
    c->qk_norm = c->family == FAM_OLMOE ? QK_NORM_FULL
        : c->family == FAM_QWEN3_MOE    ? QK_NORM_HEAD
                                        : QK_NORM_NONE;
    if (c->family == FAM_QWEN2_MOE) {
        c->qkv_bias = 1; // transformers 4.x: always; 5.x: "qkv_bias", default true
        c->n_shared_experts = 1;
        c->shared_gate = 1;
        if (json_get_bool(e, j, "qkv_bias", 0, &c->qkv_bias) ||
            json_get_int(e, j, "shared_expert_intermediate_size", 1, &c->shared_d_ff))
            return -1;
        if (c->shared_d_ff < 1)
            return json_fail(e, "key \"shared_expert_intermediate_size\" must be >= 1 (got %d)",
                             c->shared_d_ff);
    }
    if (c->family == FAM_OLMOE && json_item(j, "clip_qkv"))
        return json_fail(e, "key \"clip_qkv\" is set; clipping q, k, v is not supported");
    if (c->family == FAM_DEEPSEEK_V3 && ds_config_read(e, j, c)) return -1;
    if (qwen) { // transformers: layer l is an MoE layer unless in mlp_only_layers or (l + 1) % step != 0
        int step = 1;
        if (json_get_int(e, j, "decoder_sparse_step", 0, &step)) return -1;
        if (step < 1) return json_fail(e, "key \"decoder_sparse_step\" must be >= 1 (got %d)", step);
        const cJSON *mo = json_item(j, "mlp_only_layers");
        if (mo && read_dense_list(e, mo, "mlp_only_layers", c)) return -1;
        for (int l = 0; l < c->n_layers; l++)
            if ((l + 1) % step) {
                if (l >= MOE_MAX_DENSE_LAYERS)
                    return json_fail(
                        e,
                        "key \"decoder_sparse_step\" is %d: layer %d would be dense (dense layers are "
                        "supported up to layer %d)",
                        step, l, MOE_MAX_DENSE_LAYERS - 1);
                config_set_dense(c, l);
            }
        if (config_moe_layers(c) < c->n_layers &&
            json_get_int(e, j, "intermediate_size", 1, &c->dense_d_ff)) // (the dense layers' MLP)
            return -1;
    }
    return 0;
}


// What the model cannot represent is refused (tied embeddings, another activation, sliding windows,
// quantization, biases); attention_dropout is read.
static int read_refusals(JsonErr *e, const cJSON *j, ModelConfig *c) {
    int qwen = c->family == FAM_QWEN2_MOE || c->family == FAM_QWEN3_MOE;
    int tie = 0;
    if (json_get_bool(e, j, "tie_word_embeddings", 0, &tie)) return -1;
    if (tie) return json_fail(e, "key \"tie_word_embeddings\" is true; tied embeddings are not supported");
    const cJSON *act = json_item(j, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0))
        return json_fail(e, "key \"hidden_act\" must be \"silu\"");
    const cJSON *sw = json_item(j, "sliding_window");
    int use_sw = 1; // Qwen: the window applies only with use_sliding_window
    if (qwen && json_get_bool(e, j, "use_sliding_window", 0, &use_sw)) return -1;
    if (qwen && !json_item(j, "use_sliding_window")) use_sw = 0;
    const cJSON *lt = json_item(j, "layer_types");
    for (const cJSON *it = lt && cJSON_IsArray(lt) ? lt->child : NULL; it; it = it->next)
        if (!cJSON_IsString(it) || strcmp(it->valuestring, "full_attention") != 0)
            return json_fail(
                e,
                "key \"layer_types\" names a layer that is not \"full_attention\"; sliding-window "
                "attention is "
                "not supported");
    if (use_sw && sw && (!cJSON_IsNumber(sw) || sw->valuedouble < c->max_seq_len))
        return json_fail(e, "key \"sliding_window\" is set; sliding-window attention is not supported");
    float drop = 0; // (HF's integer 0 is a float here: get_float takes it)
    if (json_get_float(e, j, "attention_dropout", 0, &drop)) return -1;
    if (!(drop >= 0 && drop < 1))
        return json_fail(e, "key \"attention_dropout\" is %g; it must be in [0, 1)", drop);
    c->attention_dropout = drop;
    if (json_item(j, "quantization_config"))
        return json_fail(e, "key \"quantization_config\" is set; quantized models are not supported");
    static const char *const no_bias[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++) {
        int b = 0;
        if (json_get_bool(e, j, no_bias[i], 0, &b)) return -1;
        if (b) return json_fail(e, "key \"%s\" is true; biases are not supported", no_bias[i]);
    }
    return 0;
}

// Latent attention and YaRN in our own configs (under "moe_c": config_to_json's keys).
static int read_moe_c_mla(JsonErr *e, const cJSON *m, ModelConfig *c) {
    if (json_get_int(e, m, "q_lora_rank", 0, &c->q_lora_rank) ||
        json_get_int(e, m, "kv_lora_rank", 0, &c->kv_lora_rank) ||
        json_get_int(e, m, "qk_nope_head_dim", 0, &c->qk_nope_head_dim) ||
        json_get_int(e, m, "qk_rope_head_dim", 0, &c->qk_rope_head_dim) ||
        json_get_int(e, m, "v_head_dim", 0, &c->v_head_dim) ||
        json_get_bool(e, m, "rope_interleave", 0, &c->rope_interleave))
        return -1;
    const cJSON *y = json_item(m, "yarn");
    if (!y) return 0;
    if (!cJSON_IsObject(y)) return json_fail(e, "key \"yarn\" must be an object");
    return json_get_float(e, y, "factor", 1, &c->rope_factor) ||
            json_get_int(e, y, "original_max_position_embeddings", 1, &c->rope_orig_max) ||
            json_get_float(e, y, "beta_fast", 0, &c->yarn_beta_fast) ||
            json_get_float(e, y, "beta_slow", 0, &c->yarn_beta_slow) ||
            json_get_float(e, y, "mscale", 0, &c->yarn_mscale) ||
            json_get_float(e, y, "mscale_all_dim", 0, &c->yarn_mscale_all_dim)
        ? -1
        : 0;
}

// Ours, under "moe_c". Absent (a plain HF config): the family's semantics.
static int read_moe_c(JsonErr *e, const cJSON *j, ModelConfig *c) {
    int mix = c->family == FAM_MIXTRAL;
    int hf_renorm = c->renormalize;
    c->z_coef = 0.0f;
    c->bias_rate = 0.001f;
    c->dispatch = DISPATCH_DROPLESS;
    c->capacity_factor = 1.25f;
    c->aux_form = AUX_HF; // a plain HF config trains with HF's aux loss
    if (json_get_int(e, j, "num_nextn_predict_layers", 0, &c->mtp_depth)) return -1;
    if (c->mtp_depth < 0 || c->mtp_depth > MOE_MAX_MTP)
        return json_fail(e, "key \"num_nextn_predict_layers\" must be in 0..%d (got %d)", MOE_MAX_MTP,
                         c->mtp_depth);
    c->mtp_weight = c->mtp_depth ? MOE_MTP_WEIGHT : 0; // (moe_c's mtp_weight where given)
    if (c->mtp_depth) c->aux_form = AUX_LAYER; // (MTP's router losses are per layer: config.c)
    if (c->family == FAM_DEEPSEEK_V3) { // (DeepSeek-V3's is sequence-wise: aux_loss_alpha, default 0)
        c->aux_form = AUX_LAYER;
        c->aux_scope = AUX_SCOPE_SEQ;
    }
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "moe_c");
    if (m) {
        if (!cJSON_IsObject(m)) return json_fail(e, "key \"moe_c\" must be an object");
        e->prefix = "moe_c: ";
        if (json_get_bool(e, m, "renormalize", 1, &c->renormalize) ||
            json_get_float(e, m, "jitter", 1, &c->jitter) || json_get_float(e, m, "z_coef", 1, &c->z_coef) ||
            json_get_float(e, m, "capacity_factor", 1, &c->capacity_factor))
            return -1;
        const cJSON *d = json_item(m, "dispatch");
        if (!d) return json_fail(e, "missing required key \"dispatch\"");
        if (!cJSON_IsString(d)) return json_fail(e, "key \"dispatch\" must be \"dropless\" or \"capacity\"");
        if (strcmp(d->valuestring, "dropless") == 0) c->dispatch = DISPATCH_DROPLESS;
        else if (strcmp(d->valuestring, "capacity") == 0) c->dispatch = DISPATCH_CAPACITY;
        else
            return json_fail(e, "key \"dispatch\" is \"%s\", expected \"dropless\" or \"capacity\"",
                             d->valuestring);
        if (json_get_float(e, m, "mtp_weight", 0, &c->mtp_weight)) return -1;
        const cJSON *af = json_item(m, "aux_form"); // optional: absent = "layer"
        c->aux_form = AUX_LAYER;
        if (af &&
            !(cJSON_IsString(af) && (!strcmp(af->valuestring, "layer") || !strcmp(af->valuestring, "hf"))))
            return json_fail(e, "key \"aux_form\" must be \"layer\" or \"hf\"");
        if (af && !strcmp(af->valuestring, "hf")) c->aux_form = AUX_HF;
        const cJSON *ba = json_item(m, "balance"); // optional: absent = "aux"
        if (ba &&
            !(cJSON_IsString(ba) &&
              (!strcmp(ba->valuestring, "aux") || !strcmp(ba->valuestring, "aux-free"))))
            return json_fail(e, "key \"balance\" must be \"aux\" or \"aux-free\"");
        c->balance = ba && !strcmp(ba->valuestring, "aux-free") ? BALANCE_AUX_FREE : BALANCE_AUX;
        if (json_get_float(e, m, "bias_rate", 0, &c->bias_rate)) return -1;
        if (json_get_bool(e, m, "route_sigmoid", 0, &c->route_sigmoid) ||
            json_get_int(e, m, "n_group", 0, &c->n_group) ||
            json_get_int(e, m, "topk_group", 0, &c->topk_group) ||
            json_get_float(e, m, "routed_scaling_factor", 0, &c->route_scale))
            return -1;
        if (c->family != FAM_QWEN2_MOE && json_item(m, "n_shared_experts") && // ungated shared experts (ours)
            (json_get_int(e, m, "n_shared_experts", 1, &c->n_shared_experts) ||
             json_get_int(e, m, "shared_intermediate_size", 1, &c->shared_d_ff)))
            return -1;
        const cJSON *dl = json_item(m, "dense_layers"); // (families without an HF key for them)
        if (dl && (c->family == FAM_QWEN2_MOE || c->family == FAM_QWEN3_MOE))
            return json_fail(e,
                             "key \"dense_layers\" is for families without mlp_only_layers; %s has that key",
                             config_family_arch(c->family));
        if (dl &&
            (read_dense_list(e, dl, "dense_layers", c) ||
             json_get_int(e, m, "dense_intermediate_size", 1, &c->dense_d_ff)))
            return -1;
        if (read_moe_c_mla(e, m, c)) return -1;
        const cJSON *sc = json_item(m, "aux_scope"); // optional: absent = "micro-batch"
        c->aux_scope = -1;
        for (int k = 0; k < 3; k++)
            if (!sc || (cJSON_IsString(sc) && !strcmp(sc->valuestring, scope_names[k]))) {
                c->aux_scope = sc ? k : AUX_SCOPE_MICRO;
                break;
            }
        if (c->aux_scope < 0)
            return json_fail(e, "key \"aux_scope\" must be \"micro-batch\", \"sequence\" or \"global\"");
        e->prefix = "";
        if (!mix && json_item(j, "norm_topk_prob") && c->renormalize != hf_renorm)
            return json_fail(
                e, "keys \"norm_topk_prob\" (%s) and \"moe_c\": \"renormalize\" (%s) contradict each other",
                hf_renorm ? "true" : "false", c->renormalize ? "true" : "false");
    }
    return 0;
}

int config_from_json(const cJSON *j, ModelConfig *out, char *errbuf, size_t errlen) {
    JsonErr e = {errbuf, errlen, ""};
    if (errbuf && errlen) errbuf[0] = 0;
    if (!cJSON_IsObject(j)) return json_fail(&e, "config is not a JSON object");
    ModelConfig c;
    memset(&c, 0, sizeof c);
    if (read_family(&e, j, &c) || read_shape(&e, j, &c) || read_family_options(&e, j, &c) ||
        read_refusals(&e, j, &c) || read_moe_c(&e, j, &c))
        return -1;
    *out = c;
    return 0;
}
