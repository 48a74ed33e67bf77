// config_json.c — ModelConfig <-> the family's HF config.json (MixtralConfig, OlmoeConfig, Qwen2MoeConfig,
// Qwen3MoeConfig keys; plus our MoE options under "moe_c").
#include "io/config_json.h"
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The double closest to the shortest decimal that reads back as exactly x (as a float). cJSON
// prints it with %.15g, which reproduces those few digits, so "1e-05" stays "1e-05" in the file.
static double short_double(float x) {
    if (!isfinite(x)) return (double)x;
    char buf[64];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)x);
        double d = strtod(buf, NULL);
        if ((float)d == x) return d;
    }
    return (double)x; // unreachable: 9 significant digits always round-trip a float
}

// Floats always carry a '.' or an exponent ("0.0", not "0"): transformers' strict config classes
// refuse an integer where a float field is declared (e.g. router_jitter_noise: 0).
static void add_f(cJSON *o, const char *key, float x) {
    double d = short_double(x);
    if (!isfinite(d)) {
        cJSON_AddItemToObject(o, key, cJSON_CreateNumber(d));
        return;
    }
    char buf[64];
    if (d == floor(d) && fabs(d) < 1e15) {
        snprintf(buf, sizeof buf, "%.1f", d); // 10000.0, 0.0
    } else {
        for (int p = 1; p <= 17; p++) { // the shortest text that reads back to d
            snprintf(buf, sizeof buf, "%.*g", p, d);
            if (strtod(buf, NULL) == d) break;
        }
        if (!strpbrk(buf, ".eE")) strncat(buf, ".0", sizeof buf - strlen(buf) - 1);
    }
    cJSON_AddItemToObject(o, key, cJSON_CreateRaw(buf));
}
static void add_i(cJSON *o, const char *key, int x) {
    cJSON_AddItemToObject(o, key, cJSON_CreateNumber((double)x));
}

static const char *const scope_names[] = {"micro-batch", "sequence", "global"};

// The dense layers (config.h dense_layers) as a JSON list of layer numbers.
static cJSON *dense_list(const ModelConfig *c) {
    cJSON *a = cJSON_CreateArray();
    for (int l = 0; l < c->n_layers; l++)
        if (config_layer_dense(c, l)) cJSON_AddItemToArray(a, cJSON_CreateNumber(l));
    return a;
}

cJSON *config_to_json(const ModelConfig *c) {
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_CreateArray();
    int fam = c->family, mix = fam == FAM_MIXTRAL, qwen = fam == FAM_QWEN2_MOE || fam == FAM_QWEN3_MOE;
    cJSON_AddItemToArray(arch, cJSON_CreateString(config_family_arch(fam)));
    cJSON_AddItemToObject(j, "architectures", arch);
    cJSON_AddStringToObject(j, "model_type", config_family_name(fam));
    add_i(j, "vocab_size", c->vocab_size);
    add_i(j, "hidden_size", c->d_model);
    // the experts' hidden size: Mixtral's and OLMoE's intermediate_size; Qwen's moe_intermediate_size (their
    // intermediate_size is the dense MLP of layers that have no experts, which ours do not have)
    int dense = config_moe_layers(c) < c->n_layers;
    if (qwen) {
        add_i(j, "moe_intermediate_size", c->d_ff);
        add_i(j, "intermediate_size",
              dense                     ? c->dense_d_ff
                  : c->n_shared_experts ? c->n_shared_experts * c->shared_d_ff
                                        : c->d_ff);
    } else {
        add_i(j, "intermediate_size", c->d_ff);
    }
    add_i(j, "num_hidden_layers", c->n_layers);
    if (c->mtp_depth) add_i(j, "num_nextn_predict_layers", c->mtp_depth); // (DeepseekV3Config's key)
    add_i(j, "num_attention_heads", c->n_heads);
    add_i(j, "num_key_value_heads", c->n_kv_heads);
    add_i(j, "head_dim", c->head_dim);
    add_i(j, mix ? "num_local_experts" : "num_experts", c->n_experts);
    add_i(j, "num_experts_per_tok", c->top_k);
    add_i(j, "max_position_embeddings", c->max_seq_len);
    add_f(j, "rope_theta", c->rope_theta);
    add_f(j, "rms_norm_eps", c->norm_eps);
    add_f(j, "router_aux_loss_coef", c->aux_coef);
    if (mix) add_f(j, "router_jitter_noise", c->jitter);
    else cJSON_AddBoolToObject(j, "norm_topk_prob", c->renormalize != 0);
    if (fam == FAM_QWEN2_MOE) {
        add_i(j, "shared_expert_intermediate_size", c->n_shared_experts * c->shared_d_ff);
        cJSON_AddBoolToObject(j, "qkv_bias", c->qkv_bias != 0);
    }
    if (qwen) { // the dense layers as a list (every other layer an MoE layer: step 1)
        add_i(j, "decoder_sparse_step", 1);
        cJSON_AddItemToObject(j, "mlp_only_layers", dense_list(c));
        cJSON_AddBoolToObject(j, "use_sliding_window", 0);
    }
    if (fam == FAM_OLMOE) cJSON_AddNullToObject(j, "clip_qkv");
    if (!mix && fam != FAM_QWEN2_MOE) cJSON_AddBoolToObject(j, "attention_bias", 0);
    add_f(j, "initializer_range", c->init_std);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNullToObject(j, "sliding_window");
    add_f(j, "attention_dropout", c->attention_dropout);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", 0);
    cJSON_AddStringToObject(j, "torch_dtype", "float32");

    cJSON *m = cJSON_CreateObject();
    cJSON_AddBoolToObject(m, "renormalize", c->renormalize != 0);
    add_f(m, "jitter", c->jitter);
    add_f(m, "z_coef", c->z_coef);
    cJSON_AddStringToObject(m, "dispatch", c->dispatch == DISPATCH_CAPACITY ? "capacity" : "dropless");
    cJSON_AddStringToObject(m, "aux_form", c->aux_form == AUX_HF ? "hf" : "layer");
    add_f(m, "capacity_factor", c->capacity_factor);
    cJSON_AddStringToObject(m, "balance", c->balance == BALANCE_AUX_FREE ? "aux-free" : "aux");
    add_f(m, "bias_rate", c->bias_rate);
    cJSON_AddStringToObject(m, "aux_scope",
                            scope_names[c->aux_scope >= 0 && c->aux_scope < 3 ? c->aux_scope : 0]);
    if (c->route_sigmoid || c->n_group > 1 || (c->route_scale != 0 && c->route_scale != 1)) {
        // DeepSeek-V3's routing (written only where set: other configs' files stay as they were)
        cJSON_AddBoolToObject(m, "route_sigmoid", c->route_sigmoid != 0);
        add_i(m, "n_group", c->n_group);
        add_i(m, "topk_group", c->topk_group);
        add_f(m, "routed_scaling_factor", c->route_scale != 0 ? c->route_scale : 1.0f);
    }
    if (dense && !qwen) { // no HF key for them in this family: ours
        cJSON_AddItemToObject(m, "dense_layers", dense_list(c));
        add_i(m, "dense_intermediate_size", c->dense_d_ff);
    }
    if (c->n_shared_experts && fam != FAM_QWEN2_MOE) { // ungated shared experts (ours: DeepSeek-V3's)
        add_i(m, "n_shared_experts", c->n_shared_experts);
        add_i(m, "shared_intermediate_size", c->shared_d_ff);
    }
    if (c->mtp_depth) add_f(m, "mtp_weight", c->mtp_weight);
    int same = c->dispatch != DISPATCH_CAPACITY && c->balance == BALANCE_AUX &&
        (!mix || c->renormalize != 0) && (qwen || !dense) && !c->route_sigmoid && c->n_group <= 1 &&
        (c->route_scale == 0 || c->route_scale == 1) && (!c->n_shared_experts || fam == FAM_QWEN2_MOE);
    if (mix) cJSON_AddBoolToObject(m, "mixtral_compatible", same);
    cJSON_AddBoolToObject(m, "hf_compatible", same);
    cJSON_AddItemToObject(j, "moe_c", m);
    return j;
}

// ---- reading ----

typedef struct {
    char *err;
    size_t n;
    const char *prefix;
} Err;

static int fail(Err *e, const char *fmt, ...) {
    if (e->err && e->n) {
        int k = snprintf(e->err, e->n, "%s", e->prefix);
        if (k < 0) k = 0;
        if ((size_t)k < e->n) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(e->err + k, e->n - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

// Item for key, or NULL when absent or JSON null.
static const cJSON *item(const cJSON *o, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    return (it && !cJSON_IsNull(it)) ? it : NULL;
}

// required: missing -> error; else *out keeps its default.
static int get_int(Err *e, const cJSON *o, const char *key, int required, int *out) {
    const cJSON *it = item(o, key);
    if (!it) return required ? fail(e, "missing required key \"%s\"", key) : 0;
    if (!cJSON_IsNumber(it)) return fail(e, "key \"%s\" must be an integer", key);
    double d = it->valuedouble;
    if (!(d == floor(d)) || d < INT_MIN || d > INT_MAX)
        return fail(e, "key \"%s\" must be an integer (got %.17g)", key, d);
    *out = (int)d;
    return 0;
}

static int get_float(Err *e, const cJSON *o, const char *key, int required, float *out) {
    const cJSON *it = item(o, key);
    if (!it) return required ? fail(e, "missing required key \"%s\"", key) : 0;
    if (!cJSON_IsNumber(it)) return fail(e, "key \"%s\" must be a number", key);
    double d = it->valuedouble;
    if (!isfinite(d) || !isfinite((float)d)) return fail(e, "key \"%s\" is out of range (got %.17g)", key, d);
    *out = (float)d;
    return 0;
}

static int get_bool(Err *e, const cJSON *o, const char *key, int required, int *out) {
    const cJSON *it = item(o, key);
    if (!it) return required ? fail(e, "missing required key \"%s\"", key) : 0;
    if (cJSON_IsBool(it)) {
        *out = cJSON_IsTrue(it) ? 1 : 0;
        return 0;
    }
    if (cJSON_IsNumber(it) && (it->valuedouble == 0 || it->valuedouble == 1)) {
        *out = (int)it->valuedouble;
        return 0;
    }
    return fail(e, "key \"%s\" must be true or false", key);
}

// The family: "architectures" (what from_pretrained builds), else "model_type"; both present must agree;
// neither: Mixtral. Keys of another family's options are refused rather than ignored (the model would
// silently differ).
static int read_family(Err *e, const cJSON *j, ModelConfig *c) {
    c->family = -1;
    const cJSON *ar = item(j, "architectures");
    if (ar) {
        if (!cJSON_IsArray(ar) || cJSON_GetArraySize(ar) != 1 || !cJSON_IsString(cJSON_GetArrayItem(ar, 0)))
            return fail(e, "key \"architectures\" must be a list of one name");
        const char *an = cJSON_GetArrayItem(ar, 0)->valuestring;
        for (int f = FAM_MIXTRAL; f <= FAM_QWEN3_MOE; f++)
            if (!strcmp(an, config_family_arch(f))) c->family = f;
        if (c->family < 0)
            return fail(
                e,
                "architecture \"%s\" is not supported (supported: MixtralForCausalLM, OlmoeForCausalLM, "
                "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM)",
                an);
    }
    const cJSON *mt = item(j, "model_type");
    if (mt) {
        int f = -1;
        for (int k = FAM_MIXTRAL; k <= FAM_QWEN3_MOE; k++)
            if (cJSON_IsString(mt) && !strcmp(mt->valuestring, config_family_name(k))) f = k;
        if (f < 0 || (c->family >= 0 && f != c->family))
            return fail(e, "key \"model_type\" is %s%s%s, expected \"%s\"%s%s",
                        cJSON_IsString(mt) ? "\"" : "", cJSON_IsString(mt) ? mt->valuestring : "not a string",
                        cJSON_IsString(mt) ? "\"" : "",
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
    } foreign[] = {// fams: bit f = family f has it
                   {"shared_expert_intermediate_size", 1 << FAM_QWEN2_MOE},
                   {"qkv_bias", 1 << FAM_QWEN2_MOE},
                   {"clip_qkv", 1 << FAM_OLMOE},
                   {"norm_topk_prob", ~(1 << FAM_MIXTRAL)},
                   {"moe_intermediate_size", (1 << FAM_QWEN2_MOE) | (1 << FAM_QWEN3_MOE)},
                   {"num_experts", ~(1 << FAM_MIXTRAL)},
                   {"n_shared_experts", 0},
                   {"first_k_dense_replace", 0},
                   {"q_lora_rank", 0}};
    for (size_t q = 0; q < sizeof foreign / sizeof foreign[0]; q++)
        if (item(j, foreign[q].key) && !(foreign[q].fams & (1 << c->family)))
            return fail(e, "key \"%s\" is not an option of %s (%s has no such option)", foreign[q].key,
                        config_family_arch(c->family), fam);
    return 0;
}

// RoPE: "rope_theta" (transformers 4.x) or "rope_parameters": {"rope_type", "rope_theta"} (5.x,
// which wins when both are present). Only the default (unscaled) RoPE is implemented.
static int read_rope(Err *e, const cJSON *j, ModelConfig *c) {
    const cJSON *rp = item(j, "rope_parameters");
    if (rp) {
        if (!cJSON_IsObject(rp)) return fail(e, "key \"rope_parameters\" must be an object");
        const cJSON *rt = item(rp, "rope_type");
        if (rt && (!cJSON_IsString(rt) || strcmp(rt->valuestring, "default") != 0))
            return fail(e,
                        "key \"rope_parameters\": rope_type %s%s%s is not supported (only \"default\" RoPE, "
                        "no scaling)",
                        cJSON_IsString(rt) ? "\"" : "",
                        cJSON_IsString(rt) ? rt->valuestring : "(not a string)",
                        cJSON_IsString(rt) ? "\"" : "");
        for (const cJSON *it = rp->child; it; it = it->next)
            if (strcmp(it->string, "rope_type") != 0 && strcmp(it->string, "rope_theta") != 0 &&
                !cJSON_IsNull(it))
                return fail(
                    e, "key \"rope_parameters\": \"%s\" is not supported (only default RoPE with rope_theta)",
                    it->string);
        e->prefix = "rope_parameters: ";
        if (get_float(e, rp, "rope_theta", !item(j, "rope_theta"), &c->rope_theta)) return -1;
        e->prefix = "";
        if (!item(rp, "rope_theta") && get_float(e, j, "rope_theta", 1, &c->rope_theta)) return -1;
    } else if (get_float(e, j, "rope_theta", 1, &c->rope_theta)) {
        return -1;
    }
    const cJSON *rs = item(j, "rope_scaling");
    if (rs) {
        const cJSON *rt = cJSON_IsObject(rs) ? item(rs, "rope_type") : NULL;
        if (!rt && cJSON_IsObject(rs)) rt = item(rs, "type");
        if (!(rt && cJSON_IsString(rt) && strcmp(rt->valuestring, "default") == 0))
            return fail(e, "key \"rope_scaling\" is set; RoPE scaling is not supported");
    }
    return 0;
}

// The model's shape: the required keys, RoPE, the expert count's second name, head_dim and the HF
// defaults of the optional router and init keys.
static int read_shape(Err *e, const cJSON *j, ModelConfig *c) {
    int mix = c->family == FAM_MIXTRAL, qwen = c->family == FAM_QWEN2_MOE || c->family == FAM_QWEN3_MOE;
    if (get_int(e, j, "vocab_size", 1, &c->vocab_size) || get_int(e, j, "hidden_size", 1, &c->d_model) ||
        get_int(e, j, qwen ? "moe_intermediate_size" : "intermediate_size", 1, &c->d_ff) ||
        get_int(e, j, "num_hidden_layers", 1, &c->n_layers) ||
        get_int(e, j, "num_attention_heads", 1, &c->n_heads) ||
        get_int(e, j, "num_key_value_heads", 1, &c->n_kv_heads) ||
        get_int(e, j, mix || !item(j, "num_experts") ? "num_local_experts" : "num_experts", 1,
                &c->n_experts) ||
        get_int(e, j, "num_experts_per_tok", 1, &c->top_k) ||
        get_int(e, j, "max_position_embeddings", 1, &c->max_seq_len) ||
        get_float(e, j, "rms_norm_eps", 1, &c->norm_eps))
        return -1;
    if (read_rope(e, j, c)) return -1;
    if (c->n_heads <= 0) return fail(e, "key \"num_attention_heads\" must be positive (got %d)", c->n_heads);
    // transformers 5 writes Qwen3-MoE's expert count under both names: they must agree
    int nle = c->n_experts;
    if (!mix && get_int(e, j, "num_local_experts", 0, &nle)) return -1;
    if (nle != c->n_experts)
        return fail(e, "keys \"num_experts\" (%d) and \"num_local_experts\" (%d) contradict each other",
                    c->n_experts, nle);
    c->head_dim = c->d_model / c->n_heads; // HF default when head_dim is absent or null
    c->aux_coef = c->family == FAM_OLMOE ? 0.01f : 0.001f; // HF config defaults
    c->init_std = 0.02f;
    c->jitter = 0.0f;
    if (get_int(e, j, "head_dim", 0, &c->head_dim) ||
        get_float(e, j, "router_aux_loss_coef", 0, &c->aux_coef) ||
        get_float(e, j, "initializer_range", 0, &c->init_std) ||
        get_float(e, j, "router_jitter_noise", 0, &c->jitter))
        return -1;
    // OLMoE and Qwen2-MoE compute head_dim = hidden_size / num_attention_heads whatever the key says
    if ((c->family == FAM_OLMOE || c->family == FAM_QWEN2_MOE) && c->head_dim * c->n_heads != c->d_model)
        return fail(
            e, "key \"head_dim\" is %d, but %s's heads are hidden_size / num_attention_heads = %d / %d wide",
            c->head_dim, config_family_arch(c->family), c->d_model, c->n_heads);
    return 0;
}

// A list of layer numbers (key: its name in messages) into c's dense layers.
static int read_dense_list(Err *e, const cJSON *a, const char *key, ModelConfig *c) {
    if (!cJSON_IsArray(a)) return fail(e, "key \"%s\" must be a list of layer numbers", key);
    for (const cJSON *it = a->child; it; it = it->next) {
        double d = cJSON_IsNumber(it) ? it->valuedouble : -1;
        if (!(d == floor(d) && d >= 0 && d < c->n_layers))
            return fail(e, "key \"%s\" must list layer numbers in 0..%d (num_hidden_layers %d)", key,
                        c->n_layers - 1, c->n_layers);
        if (d >= MOE_MAX_DENSE_LAYERS)
            return fail(e, "key \"%s\" names layer %.0f; dense layers are supported up to layer %d", key, d,
                        MOE_MAX_DENSE_LAYERS - 1);
        config_set_dense(c, (int)d);
    }
    return 0;
}

// The families' options (config.h): fixed by the architecture, or read from their keys.
static int read_family_options(Err *e, const cJSON *j, ModelConfig *c) {
    int mix = c->family == FAM_MIXTRAL, qwen = c->family == FAM_QWEN2_MOE || c->family == FAM_QWEN3_MOE;
    c->renormalize = mix; // norm_topk_prob: HF's default is false in all three
    if (!mix && get_bool(e, j, "norm_topk_prob", 0, &c->renormalize)) return -1;
    c->qk_norm = c->family == FAM_OLMOE ? QK_NORM_FULL
        : c->family == FAM_QWEN3_MOE    ? QK_NORM_HEAD
                                        : QK_NORM_NONE;
    if (c->family == FAM_QWEN2_MOE) {
        c->qkv_bias = 1; // transformers 4.x: always; 5.x: "qkv_bias", default true
        c->n_shared_experts = 1;
        c->shared_gate = 1;
        if (get_bool(e, j, "qkv_bias", 0, &c->qkv_bias) ||
            get_int(e, j, "shared_expert_intermediate_size", 1, &c->shared_d_ff))
            return -1;
        if (c->shared_d_ff < 1)
            return fail(e, "key \"shared_expert_intermediate_size\" must be >= 1 (got %d)", c->shared_d_ff);
    }
    if (c->family == FAM_OLMOE && item(j, "clip_qkv"))
        return fail(e, "key \"clip_qkv\" is set; clipping q, k, v is not supported");
    if (qwen) { // transformers: layer l is an MoE layer unless in mlp_only_layers or (l + 1) % step != 0
        int step = 1;
        if (get_int(e, j, "decoder_sparse_step", 0, &step)) return -1;
        if (step < 1) return fail(e, "key \"decoder_sparse_step\" must be >= 1 (got %d)", step);
        const cJSON *mo = item(j, "mlp_only_layers");
        if (mo && read_dense_list(e, mo, "mlp_only_layers", c)) return -1;
        for (int l = 0; l < c->n_layers; l++)
            if ((l + 1) % step) {
                if (l >= MOE_MAX_DENSE_LAYERS)
                    return fail(
                        e,
                        "key \"decoder_sparse_step\" is %d: layer %d would be dense (dense layers are "
                        "supported up to layer %d)",
                        step, l, MOE_MAX_DENSE_LAYERS - 1);
                config_set_dense(c, l);
            }
        if (config_moe_layers(c) < c->n_layers &&
            get_int(e, j, "intermediate_size", 1, &c->dense_d_ff)) // (the dense layers' MLP)
            return -1;
    }
    return 0;
}


// What the model cannot represent is refused (tied embeddings, another activation, sliding windows,
// quantization, biases); attention_dropout is read.
static int read_refusals(Err *e, const cJSON *j, ModelConfig *c) {
    int qwen = c->family == FAM_QWEN2_MOE || c->family == FAM_QWEN3_MOE;
    int tie = 0;
    if (get_bool(e, j, "tie_word_embeddings", 0, &tie)) return -1;
    if (tie) return fail(e, "key \"tie_word_embeddings\" is true; tied embeddings are not supported");
    const cJSON *act = item(j, "hidden_act");
    if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu") != 0))
        return fail(e, "key \"hidden_act\" must be \"silu\"");
    const cJSON *sw = item(j, "sliding_window");
    int use_sw = 1; // Qwen: the window applies only with use_sliding_window
    if (qwen && get_bool(e, j, "use_sliding_window", 0, &use_sw)) return -1;
    if (qwen && !item(j, "use_sliding_window")) use_sw = 0;
    const cJSON *lt = item(j, "layer_types");
    for (const cJSON *it = lt && cJSON_IsArray(lt) ? lt->child : NULL; it; it = it->next)
        if (!cJSON_IsString(it) || strcmp(it->valuestring, "full_attention") != 0)
            return fail(e,
                        "key \"layer_types\" names a layer that is not \"full_attention\"; sliding-window "
                        "attention is "
                        "not supported");
    if (use_sw && sw && (!cJSON_IsNumber(sw) || sw->valuedouble < c->max_seq_len))
        return fail(e, "key \"sliding_window\" is set; sliding-window attention is not supported");
    float drop = 0; // (HF's integer 0 is a float here: get_float takes it)
    if (get_float(e, j, "attention_dropout", 0, &drop)) return -1;
    if (!(drop >= 0 && drop < 1))
        return fail(e, "key \"attention_dropout\" is %g; it must be in [0, 1)", drop);
    c->attention_dropout = drop;
    if (item(j, "quantization_config"))
        return fail(e, "key \"quantization_config\" is set; quantized models are not supported");
    static const char *const no_bias[] = {"attention_bias", "mlp_bias"};
    for (int i = 0; i < 2; i++) {
        int b = 0;
        if (get_bool(e, j, no_bias[i], 0, &b)) return -1;
        if (b) return fail(e, "key \"%s\" is true; biases are not supported", no_bias[i]);
    }
    return 0;
}

// Ours, under "moe_c". Absent (a plain HF config): the family's semantics.
static int read_moe_c(Err *e, const cJSON *j, ModelConfig *c) {
    int mix = c->family == FAM_MIXTRAL;
    int hf_renorm = c->renormalize;
    c->z_coef = 0.0f;
    c->bias_rate = 0.001f;
    c->dispatch = DISPATCH_DROPLESS;
    c->capacity_factor = 1.25f;
    c->aux_form = AUX_HF; // a plain HF config trains with HF's aux loss
    if (get_int(e, j, "num_nextn_predict_layers", 0, &c->mtp_depth)) return -1;
    if (c->mtp_depth < 0 || c->mtp_depth > MOE_MAX_MTP)
        return fail(e, "key \"num_nextn_predict_layers\" must be in 0..%d (got %d)", MOE_MAX_MTP,
                    c->mtp_depth);
    c->mtp_weight = c->mtp_depth ? MOE_MTP_WEIGHT : 0; // (moe_c's mtp_weight where given)
    if (c->mtp_depth) c->aux_form = AUX_LAYER; // (MTP's router losses are per layer: config.c)
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(j, "moe_c");
    if (m) {
        if (!cJSON_IsObject(m)) return fail(e, "key \"moe_c\" must be an object");
        e->prefix = "moe_c: ";
        if (get_bool(e, m, "renormalize", 1, &c->renormalize) || get_float(e, m, "jitter", 1, &c->jitter) ||
            get_float(e, m, "z_coef", 1, &c->z_coef) ||
            get_float(e, m, "capacity_factor", 1, &c->capacity_factor))
            return -1;
        const cJSON *d = item(m, "dispatch");
        if (!d) return fail(e, "missing required key \"dispatch\"");
        if (!cJSON_IsString(d)) return fail(e, "key \"dispatch\" must be \"dropless\" or \"capacity\"");
        if (strcmp(d->valuestring, "dropless") == 0) c->dispatch = DISPATCH_DROPLESS;
        else if (strcmp(d->valuestring, "capacity") == 0) c->dispatch = DISPATCH_CAPACITY;
        else
            return fail(e, "key \"dispatch\" is \"%s\", expected \"dropless\" or \"capacity\"",
                        d->valuestring);
        if (get_float(e, m, "mtp_weight", 0, &c->mtp_weight)) return -1;
        const cJSON *af = item(m, "aux_form"); // optional: absent = "layer"
        c->aux_form = AUX_LAYER;
        if (af &&
            !(cJSON_IsString(af) && (!strcmp(af->valuestring, "layer") || !strcmp(af->valuestring, "hf"))))
            return fail(e, "key \"aux_form\" must be \"layer\" or \"hf\"");
        if (af && !strcmp(af->valuestring, "hf")) c->aux_form = AUX_HF;
        const cJSON *ba = item(m, "balance"); // optional: absent = "aux"
        if (ba &&
            !(cJSON_IsString(ba) &&
              (!strcmp(ba->valuestring, "aux") || !strcmp(ba->valuestring, "aux-free"))))
            return fail(e, "key \"balance\" must be \"aux\" or \"aux-free\"");
        c->balance = ba && !strcmp(ba->valuestring, "aux-free") ? BALANCE_AUX_FREE : BALANCE_AUX;
        if (get_float(e, m, "bias_rate", 0, &c->bias_rate)) return -1;
        if (get_bool(e, m, "route_sigmoid", 0, &c->route_sigmoid) ||
            get_int(e, m, "n_group", 0, &c->n_group) || get_int(e, m, "topk_group", 0, &c->topk_group) ||
            get_float(e, m, "routed_scaling_factor", 0, &c->route_scale))
            return -1;
        if (c->family != FAM_QWEN2_MOE && item(m, "n_shared_experts") && // ungated shared experts (ours)
            (get_int(e, m, "n_shared_experts", 1, &c->n_shared_experts) ||
             get_int(e, m, "shared_intermediate_size", 1, &c->shared_d_ff)))
            return -1;
        const cJSON *dl = item(m, "dense_layers"); // (families without an HF key for them)
        if (dl && (c->family == FAM_QWEN2_MOE || c->family == FAM_QWEN3_MOE))
            return fail(e, "key \"dense_layers\" is for families without mlp_only_layers; %s has that key",
                        config_family_arch(c->family));
        if (dl &&
            (read_dense_list(e, dl, "dense_layers", c) ||
             get_int(e, m, "dense_intermediate_size", 1, &c->dense_d_ff)))
            return -1;
        const cJSON *sc = item(m, "aux_scope"); // optional: absent = "micro-batch"
        c->aux_scope = -1;
        for (int k = 0; k < 3; k++)
            if (!sc || (cJSON_IsString(sc) && !strcmp(sc->valuestring, scope_names[k]))) {
                c->aux_scope = sc ? k : AUX_SCOPE_MICRO;
                break;
            }
        if (c->aux_scope < 0)
            return fail(e, "key \"aux_scope\" must be \"micro-batch\", \"sequence\" or \"global\"");
        e->prefix = "";
        if (!mix && item(j, "norm_topk_prob") && c->renormalize != hf_renorm)
            return fail(
                e, "keys \"norm_topk_prob\" (%s) and \"moe_c\": \"renormalize\" (%s) contradict each other",
                hf_renorm ? "true" : "false", c->renormalize ? "true" : "false");
    }
    return 0;
}

int config_from_json(const cJSON *j, ModelConfig *out, char *errbuf, size_t errlen) {
    Err e = {errbuf, errlen, ""};
    if (errbuf && errlen) errbuf[0] = 0;
    if (!cJSON_IsObject(j)) return fail(&e, "config is not a JSON object");
    ModelConfig c;
    memset(&c, 0, sizeof c);
    if (read_family(&e, j, &c) || read_shape(&e, j, &c) || read_family_options(&e, j, &c) ||
        read_refusals(&e, j, &c) || read_moe_c(&e, j, &c))
        return -1;
    *out = c;
    return 0;
}
