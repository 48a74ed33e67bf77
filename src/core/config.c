// config.c — named model presets and validation with messages that name the numbers.
#include "core/config.h"
#include <math.h>
#include <stdio.h>
#include <string.h>

static void base(ModelConfig *c) {
    memset(c, 0, sizeof *c);
    c->rope_theta = 10000.0f;
    c->norm_eps = 1e-5f;
    c->init_std = 0.02f;
    c->renormalize = 1;
    c->jitter = 0.0f;
    c->aux_coef = 0.01f;
    c->z_coef = 0.001f;
    c->dispatch = DISPATCH_DROPLESS;
    c->capacity_factor = 1.25f;
    c->bias_rate = 0.001f; // DeepSeek-V3's bias update speed
}

// Family shapes beyond Mixtral: qk (QkNorm), bias (q/k/v), shared (shared experts x hidden size, gated),
// hd (0: d / H), eps (0: 1e-5).
typedef struct {
    const char *name;
    int V, d, L, H, KV, f, E, k, maxT;
    float theta;
    int renorm;
    int family, qk, bias, n_shared, shared_f, hd;
    float eps;
} Preset;
static const Preset presets[] = {
    // byte-level, trains in minutes on 2 CPU cores
    {"tiny", 256, 96, 2, 4, 2, 192, 4, 2, 256, 10000.0f, 1, FAM_MIXTRAL, 0, 0, 0, 0, 0, 0},
    {"small", 256, 256, 4, 8, 4, 512, 8, 2, 512, 10000.0f, 1, FAM_MIXTRAL, 0, 0, 0, 0, 0, 0},
    // shapes of published models (for `moe info`; far too large for a CPU), from their config.json:
    // mistralai/Mixtral-8x7B-v0.1, Mixtral-8x22B-v0.1, allenai/OLMoE-1B-7B-0924, Qwen/Qwen1.5-MoE-A2.7B,
    // Qwen/Qwen3-30B-A3B, Qwen/Qwen3-235B-A22B
    {"mixtral-8x7b", 32000, 4096, 32, 32, 8, 14336, 8, 2, 32768, 1000000.0f, 1, FAM_MIXTRAL, 0, 0, 0, 0, 0,
     0},
    {"mixtral-8x22b", 32768, 6144, 56, 48, 8, 16384, 8, 2, 65536, 1000000.0f, 1, FAM_MIXTRAL, 0, 0, 0, 0, 0,
     0},
    {"olmoe-1b-7b", 50304, 2048, 16, 16, 16, 1024, 64, 8, 4096, 10000.0f, 0, FAM_OLMOE, QK_NORM_FULL, 0, 0, 0,
     0, 1e-5f},
    {"qwen2-moe-a2.7b", 151936, 2048, 24, 16, 16, 1408, 60, 4, 8192, 1000000.0f, 0, FAM_QWEN2_MOE, 0, 1, 1,
     5632, 0, 1e-6f},
    {"qwen3-moe-30b-a3b", 151936, 2048, 48, 32, 4, 768, 128, 8, 40960, 1000000.0f, 1, FAM_QWEN3_MOE,
     QK_NORM_HEAD, 0, 0, 0, 128, 1e-6f},
    // Qwen/Qwen3-235B-A22B's config.json (hidden 4096, 94 layers, 64 heads, 4 kv heads of 128, 128 experts
    // of moe_intermediate_size 1536, top-8, no mlp_only_layers)
    {"qwen3-235b-a22b", 151936, 4096, 94, 64, 4, 1536, 128, 8, 40960, 1000000.0f, 1, FAM_QWEN3_MOE,
     QK_NORM_HEAD, 0, 0, 0, 128, 1e-6f},
    // the PEERS.md reference model
    {"peers-ref", 32000, 2048, 16, 16, 8, 5632, 8, 2, 2048, 10000.0f, 1, FAM_MIXTRAL, 0, 0, 0, 0, 0, 0},
};
// DeepSeek-V3's family (deepseek_v3), its shape p (hd: qk_rope_head_dim, KV = H) and latent attention
// (q_lora_rank, kv_lora_rank, qk_nope, qk_rope, v head dims), the first dense_k layers dense of dense_f,
// group-limited routing, the routed weights' scale, YaRN (factor, original positions; both mscales 1, the
// betas 32 and 1).
typedef struct {
    Preset p;
    int qr, kvr, dn, dr, dv, dense_k, dense_f, n_group, topk_group;
    float route_scale, yarn_factor;
    int yarn_orig;
} DsPreset;
// (a table: one model a row, its Preset then qr, kvr, dn, dr, dv, dense_k, dense_f, n_group, topk_group,
// route_scale, yarn_factor, yarn_orig)
// clang-format off
static const DsPreset ds_presets[] = {
    // byte-level, for tests and the tutorial: a dense first layer, 8 experts in 4 groups
    {{"deepseek-v3-tiny", 256, 96, 3, 4, 4, 64, 8, 2, 256, 10000.0f, 1, FAM_DEEPSEEK_V3, 0, 0, 1, 64, 8,
      1e-6f},
     48, 32, 16, 8, 16, 1, 192, 4, 2, 2.5f, 0, 0},
    // moonshotai/Moonlight-16B-A3B and deepseek-ai/DeepSeek-V3 (their config.json; without the MTP module)
    {{"moonlight-16b-a3b", 163840, 2048, 27, 16, 16, 1408, 64, 6, 8192, 50000.0f, 1, FAM_DEEPSEEK_V3, 0, 0, 2,
      1408, 64, 1e-5f},
     0, 512, 128, 64, 128, 1, 11264, 1, 1, 2.446f, 0, 0},
    {{"deepseek-v3", 129280, 7168, 61, 128, 128, 2048, 256, 8, 163840, 10000.0f, 1, FAM_DEEPSEEK_V3, 0, 0, 1,
      2048, 64, 1e-6f},
     1536, 512, 128, 64, 128, 3, 18432, 8, 4, 2.5f, 40.0f, 4096},
};
// clang-format on

static void fill(ModelConfig *c, const Preset *p) {
    base(c);
    c->vocab_size = p->V;
    c->d_model = p->d;
    c->n_layers = p->L;
    c->n_heads = p->H;
    c->n_kv_heads = p->KV;
    c->head_dim = p->hd ? p->hd : p->d / p->H;
    c->d_ff = p->f;
    c->n_experts = p->E;
    c->top_k = p->k;
    c->max_seq_len = p->maxT;
    c->rope_theta = p->theta;
    c->renormalize = p->renorm;
    c->family = p->family;
    c->qk_norm = p->qk;
    c->qkv_bias = p->bias;
    c->n_shared_experts = p->n_shared;
    c->shared_d_ff = p->shared_f;
    c->shared_gate = p->n_shared > 0 && p->family == FAM_QWEN2_MOE;
    if (p->eps > 0) c->norm_eps = p->eps;
}

// The DeepSeek-V3 family's options of preset p: latent attention (interleaved rope pairs), its routing
// (sigmoid scores, the aux-free bias, groups, the scale; the sequence-wise aux loss at DeepSeek-V3's 1e-4, no
// z-loss), the first layers dense, YaRN.
static void fill_deepseek(ModelConfig *c, const DsPreset *p) {
    fill(c, &p->p);
    c->q_lora_rank = p->qr;
    c->kv_lora_rank = p->kvr;
    c->qk_nope_head_dim = p->dn;
    c->qk_rope_head_dim = p->dr;
    c->v_head_dim = p->dv;
    c->rope_interleave = 1;
    c->route_sigmoid = 1;
    c->balance = BALANCE_AUX_FREE;
    c->aux_coef = 1e-4f;
    c->aux_scope = AUX_SCOPE_SEQ;
    c->z_coef = 0;
    c->n_group = p->n_group;
    c->topk_group = p->topk_group;
    c->route_scale = p->route_scale;
    for (int l = 0; l < p->dense_k; l++) config_set_dense(c, l);
    c->dense_d_ff = p->dense_f;
    if (p->yarn_factor > 0) {
        c->rope_factor = p->yarn_factor;
        c->rope_orig_max = p->yarn_orig;
        c->yarn_mscale = c->yarn_mscale_all_dim = 1.0f;
        // (the released config's betas, transformers' defaults: what its config.json reads back as)
        c->yarn_beta_fast = 32.0f;
        c->yarn_beta_slow = 1.0f;
    }
}

int config_preset(ModelConfig *c, const char *name) {
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (strcmp(presets[i].name, name) == 0) {
            fill(c, &presets[i]);
            return 0;
        }
    for (size_t i = 0; i < sizeof ds_presets / sizeof ds_presets[0]; i++)
        if (strcmp(ds_presets[i].p.name, name) == 0) {
            fill_deepseek(c, &ds_presets[i]);
            return 0;
        }
    return -1;
}

// The names of the tables above in their order, ", " between them (built once).
const char *config_preset_names(void) {
    static char names[512];
    if (!names[0]) {
        for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, "%s%s", i ? ", " : "", presets[i].name);
        }
        for (size_t i = 0; i < sizeof ds_presets / sizeof ds_presets[0]; i++) {
            size_t l = strlen(names);
            snprintf(names + l, sizeof names - l, ", %s", ds_presets[i].p.name);
        }
    }
    return names;
}

static const char *const fam_names[] = {"mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "deepseek_v3"};
static const char *const fam_archs[] = {"MixtralForCausalLM", "OlmoeForCausalLM", "Qwen2MoeForCausalLM",
                                        "Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM"};
const char *config_family_name(int f) { return f >= 0 && f <= FAM_LAST ? fam_names[f] : "unknown"; }
const char *config_family_arch(int f) { return f >= 0 && f <= FAM_LAST ? fam_archs[f] : "unknown"; }

// The validators' message (one buffer; BAD formats it and returns it).
static char msg[256];
#define BAD(...) \
    do { \
        snprintf(msg, sizeof msg, __VA_ARGS__); \
        return msg; \
    } while (0)

// config_validate's part for the dense layers, DeepSeek-V3's routing and the MTP modules (fam: the family's
// name).
static const char *validate_layers_routing(const ModelConfig *c, const char *fam) {
    if (c->route_sigmoid != 0 && c->route_sigmoid != 1)
        BAD("route_sigmoid must be 0 or 1 (got %d)", c->route_sigmoid);
    if (c->route_sigmoid && c->z_coef != 0)
        BAD("z_coef must be 0 with sigmoid router scores (got %g: the z-loss is a softmax router's)",
            c->z_coef);
    if (!(c->route_scale >= 0 && c->route_scale <= 1000))
        BAD("route_scale must be in [0, 1000] (got %g)", c->route_scale);
    if (c->n_group < 0 || c->n_group > 64 || (c->n_group > 1 && c->n_experts % c->n_group))
        BAD("n_group must be in 0..64 and divide n_experts=%d (got %d)", c->n_experts, c->n_group);
    if (c->n_group > 1 && (c->topk_group < 1 || c->topk_group > c->n_group))
        BAD("topk_group must be in 1..n_group=%d (got %d)", c->n_group, c->topk_group);
    if (c->n_group <= 1 && c->topk_group > 1)
        BAD("topk_group is %d but n_group is %d (no groups)", c->topk_group, c->n_group);
    if (c->n_group > 1 && c->n_experts / c->n_group < 2)
        BAD("n_group=%d leaves %d expert per group (a group's score is its two best)", c->n_group,
            c->n_experts / c->n_group);
    if (c->n_group > 1 && c->top_k > c->topk_group * (c->n_experts / c->n_group))
        BAD("top_k=%d exceeds the experts of topk_group=%d groups (%d)", c->top_k, c->topk_group,
            c->topk_group * (c->n_experts / c->n_group));
    if ((c->route_sigmoid || c->n_group > 1 || (c->route_scale != 0 && c->route_scale != 1)) &&
        c->family != FAM_MIXTRAL && c->family != FAM_DEEPSEEK_V3)
        BAD("family %s routes by softmax over all experts, unscaled (DeepSeek-V3's routing is for our own "
            "mixtral-family configs)",
            fam);
    int nd = 0, last = -1;
    for (int l = 0; l < MOE_MAX_DENSE_LAYERS; l++)
        if (config_layer_dense(c, l)) nd++, last = l;
    if (nd && last >= c->n_layers)
        BAD("dense layer %d does not exist (the model has %d layers: 0..%d)", last, c->n_layers,
            c->n_layers - 1);
    if (nd && nd == c->n_layers)
        BAD("every one of the %d layers is dense: an MoE model needs an MoE layer", nd);
    if (nd && c->dense_d_ff < 1)
        BAD("dense_d_ff must be >= 1 with %d dense layers (got %d)", nd, c->dense_d_ff);
    if (!nd && c->dense_d_ff != 0)
        BAD("dense_d_ff is %d but no layer is dense (dense_layers is empty)", c->dense_d_ff);
    if (c->mtp_depth < 0 || c->mtp_depth > MOE_MAX_MTP)
        BAD("mtp_depth must be in 0..%d (got %d)", MOE_MAX_MTP, c->mtp_depth);
    if (!(c->mtp_weight >= 0 && c->mtp_weight <= 100))
        BAD("mtp_weight must be in [0, 100] (got %g)", c->mtp_weight);
    if (c->mtp_depth && c->aux_form == AUX_HF)
        BAD("mtp_depth %d needs aux_form layer (HF's aux form is one loss over the main layers' statistics)",
            c->mtp_depth);
    return NULL;
}

// config_validate's part for multi-head latent attention and YaRN (fam: the family's name).
static const char *validate_mla(const ModelConfig *c, const char *fam) {
    if (c->kv_lora_rank < 0) BAD("kv_lora_rank must be >= 0 (got %d)", c->kv_lora_rank);
    if (!config_mla(c)) {
        if (c->q_lora_rank || c->qk_nope_head_dim || c->qk_rope_head_dim || c->v_head_dim)
            BAD("q_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim are latent attention's: they "
                "need kv_lora_rank > 0");
        if (c->family == FAM_DEEPSEEK_V3)
            BAD("family deepseek_v3 has latent attention: kv_lora_rank must be > 0");
        if (c->rope_interleave) BAD("rope_interleave is latent attention's: it needs kv_lora_rank > 0");
        if (c->rope_factor != 0)
            BAD("YaRN RoPE scaling (rope_factor %g) is implemented for latent attention "
                "(kv_lora_rank > 0) only",
                c->rope_factor);
        return NULL;
    }
    if (c->family != FAM_MIXTRAL && c->family != FAM_DEEPSEEK_V3)
        BAD("family %s has no latent attention (kv_lora_rank: deepseek_v3 and our own mixtral-family "
            "configs)",
            fam);
    if (c->rope_interleave != 0 && c->rope_interleave != 1)
        BAD("rope_interleave must be 0 or 1 (got %d)", c->rope_interleave);
    if (c->q_lora_rank < 0) BAD("q_lora_rank must be >= 0 (0: q_proj; got %d)", c->q_lora_rank);
    if (c->qk_nope_head_dim < 1) BAD("qk_nope_head_dim must be >= 1 (got %d)", c->qk_nope_head_dim);
    if (c->qk_rope_head_dim < 2 || c->qk_rope_head_dim % 2)
        BAD("qk_rope_head_dim must be even and >= 2 (got %d)", c->qk_rope_head_dim);
    if (c->v_head_dim < 1 || c->v_head_dim > config_qk_head_dim(c))
        BAD("v_head_dim must be in 1..qk_nope_head_dim + qk_rope_head_dim = %d (got %d: the value heads are "
            "padded to the query/key head width)",
            config_qk_head_dim(c), c->v_head_dim);
    if (c->n_kv_heads != c->n_heads)
        BAD("latent attention has n_kv_heads = n_heads = %d (got %d)", c->n_heads, c->n_kv_heads);
    if (c->head_dim != c->qk_rope_head_dim)
        BAD("latent attention has head_dim = qk_rope_head_dim = %d (got %d)", c->qk_rope_head_dim,
            c->head_dim);
    if (c->qk_norm || c->qkv_bias) BAD("latent attention has no QK-norm and no q/k/v biases");
    if (c->family == FAM_DEEPSEEK_V3) {
        int k = 0;
        while (k < c->n_layers && config_layer_dense(c, k)) k++;
        for (int l = k; l < c->n_layers; l++)
            if (config_layer_dense(c, l))
                BAD("family deepseek_v3's dense layers are the first ones (first_k_dense_replace): layer %d "
                    "is "
                    "dense after MoE layer %d",
                    l, k);
        if (!c->route_sigmoid || c->balance != BALANCE_AUX_FREE)
            BAD("family deepseek_v3 routes by sigmoid scores with the aux-free bias (route_sigmoid 1, "
                "balance "
                "aux-free)");
        if (c->n_shared_experts < 1 || c->shared_d_ff != c->d_ff || c->shared_gate)
            BAD("family deepseek_v3 has n_shared_experts >= 1 ungated shared experts of the experts' width "
                "d_ff = %d (got %d of %d)",
                c->d_ff, c->n_shared_experts, c->shared_d_ff);
    }
    if (c->rope_factor == 0) return NULL;
    if (!(c->rope_factor >= 1 && c->rope_factor <= 1e6f))
        BAD("rope_factor (YaRN) must be 0 (none) or in [1, 1e6] (got %g)", c->rope_factor);
    if (c->rope_orig_max < 1)
        BAD("rope_orig_max (YaRN original_max_position_embeddings) must be >= 1 (got %d)", c->rope_orig_max);
    if (!(c->yarn_beta_fast >= 0 && c->yarn_beta_fast <= 1e6f && c->yarn_beta_slow >= 0 &&
          c->yarn_beta_slow <= 1e6f))
        BAD("yarn beta_fast and beta_slow must be in [0, 1e6] (0: 32 and 1; got %g, %g)", c->yarn_beta_fast,
            c->yarn_beta_slow);
    if (!(c->yarn_mscale >= 0 && c->yarn_mscale <= 1e3f && c->yarn_mscale_all_dim >= 0 &&
          c->yarn_mscale_all_dim <= 1e3f))
        BAD("yarn mscale and mscale_all_dim must be in [0, 1000] (got %g, %g)", c->yarn_mscale,
            c->yarn_mscale_all_dim);
    return NULL;
}

const char *config_validate(const ModelConfig *c) {
    if (c->vocab_size < 2) BAD("vocab_size must be >= 2 (got %d)", c->vocab_size);
    if (c->d_model < 1) BAD("d_model must be >= 1 (got %d)", c->d_model);
    if (c->n_layers < 1) BAD("n_layers must be >= 1 (got %d)", c->n_layers);
    if (c->n_heads < 1) BAD("n_heads must be >= 1 (got %d)", c->n_heads);
    if (c->n_kv_heads < 1 || c->n_kv_heads > c->n_heads)
        BAD("n_kv_heads must be in 1..n_heads=%d (got %d)", c->n_heads, c->n_kv_heads);
    if (c->n_heads % c->n_kv_heads)
        BAD("n_heads=%d is not divisible by n_kv_heads=%d", c->n_heads, c->n_kv_heads);
    if (c->d_model % c->n_heads) BAD("d_model=%d is not divisible by n_heads=%d", c->d_model, c->n_heads);
    if (c->head_dim < 2 || c->head_dim % 2) BAD("head_dim must be even and >= 2 (got %d)", c->head_dim);
    if (c->d_ff < 1) BAD("d_ff must be >= 1 (got %d)", c->d_ff);
    if (c->n_experts < 1) BAD("n_experts must be >= 1 (got %d)", c->n_experts);
    if (c->top_k < 1 || c->top_k > c->n_experts)
        BAD("top_k must be in 1..n_experts=%d (got %d)", c->n_experts, c->top_k);
    if (c->max_seq_len < 2 || c->max_seq_len > MOE_MAX_SEQ_LEN)
        BAD("max_seq_len must be in 2..%d (got %d)", MOE_MAX_SEQ_LEN, c->max_seq_len);
    // floats: finite and in range (the negated comparisons also refuse NaN)
    if (!(c->rope_theta > 0 && c->rope_theta <= 1e12f))
        BAD("rope_theta must be in (0, 1e+12] (got %g)", c->rope_theta);
    if (!(c->norm_eps > 0 && c->norm_eps <= 1)) BAD("norm_eps must be in (0, 1] (got %g)", c->norm_eps);
    if (!(c->init_std > 0 && c->init_std <= 10)) BAD("init_std must be in (0, 10] (got %g)", c->init_std);
    if (c->renormalize != 0 && c->renormalize != 1)
        BAD("renormalize must be 0 or 1 (got %d)", c->renormalize);
    if (!(c->jitter >= 0 && c->jitter < 1)) BAD("jitter must be in [0, 1) (got %g)", c->jitter);
    if (!(c->attention_dropout >= 0 && c->attention_dropout < 1))
        BAD("attention_dropout must be in [0, 1) (got %g)", c->attention_dropout);
    if (!(c->aux_coef >= 0 && c->aux_coef <= 100)) BAD("aux_coef must be in [0, 100] (got %g)", c->aux_coef);
    if (!(c->z_coef >= 0 && c->z_coef <= 100)) BAD("z_coef must be in [0, 100] (got %g)", c->z_coef);
    if (c->aux_form != AUX_LAYER && c->aux_form != AUX_HF) BAD("unknown aux form %d", (int)c->aux_form);
    if (c->dispatch != DISPATCH_DROPLESS && c->dispatch != DISPATCH_CAPACITY)
        BAD("unknown dispatch mode %d", (int)c->dispatch);
    // any finite factor: capacity_for caps the slots at the tokens (a factor >= E / k drops nothing)
    if (!isfinite(c->capacity_factor)) BAD("capacity_factor must be finite (got %g)", c->capacity_factor);
    if (c->dispatch == DISPATCH_CAPACITY && !(c->capacity_factor > 0))
        BAD("capacity_factor must be > 0 (got %g)", c->capacity_factor);
    // families: each option only where transformers' architecture has it
    if (c->family < FAM_MIXTRAL || c->family > FAM_LAST) BAD("unknown model family %d", c->family);
    if (c->qk_norm < QK_NORM_NONE || c->qk_norm > QK_NORM_HEAD)
        BAD("qk_norm must be none, full or head (got %d)", c->qk_norm);
    if (c->qkv_bias != 0 && c->qkv_bias != 1) BAD("qkv_bias must be 0 or 1 (got %d)", c->qkv_bias);
    if (c->shared_gate != 0 && c->shared_gate != 1)
        BAD("shared_gate must be 0 or 1 (got %d)", c->shared_gate);
    if (c->n_shared_experts < 0 || c->n_shared_experts > 64)
        BAD("n_shared_experts must be in 0..64 (got %d)", c->n_shared_experts);
    if (c->n_shared_experts > 0 && c->shared_d_ff < 1)
        BAD("shared_d_ff must be >= 1 with %d shared experts (got %d)", c->n_shared_experts, c->shared_d_ff);
    if (c->n_shared_experts == 0 && (c->shared_d_ff != 0 || c->shared_gate))
        BAD("shared_d_ff / shared_gate are set but n_shared_experts is 0");
    const char *fam = config_family_name(c->family);
    static const char *const qkn[] = {"none", "full", "head"};
    int want_qk = c->family == FAM_OLMOE ? QK_NORM_FULL
        : c->family == FAM_QWEN3_MOE     ? QK_NORM_HEAD
                                         : QK_NORM_NONE;
    if (c->qk_norm != want_qk)
        BAD("family %s has qk_norm %s, not %s (OLMoE: full, Qwen3-MoE: head, Mixtral and Qwen2-MoE: none)",
            fam, qkn[want_qk], qkn[c->qk_norm]);
    if (c->qkv_bias && c->family != FAM_QWEN2_MOE)
        BAD("family %s has no q/k/v biases (only qwen2_moe does)", fam);
    // (our own configs, family mixtral: ungated shared experts, DeepSeek-V3's; exported nowhere: io/hf.c)
    if (c->n_shared_experts && c->family != FAM_QWEN2_MOE &&
        ((c->family != FAM_MIXTRAL && c->family != FAM_DEEPSEEK_V3) || c->shared_gate))
        BAD("family %s has no %sshared experts (only qwen2_moe does; ungated ones: our own mixtral-family "
            "configs)",
            fam, c->family == FAM_MIXTRAL ? "gated " : "");
    if (c->family == FAM_QWEN2_MOE && !(c->n_shared_experts == 1 && c->shared_gate))
        BAD("family qwen2_moe has exactly one shared expert with a sigmoid gate (got %d shared experts, gate "
            "%d)",
            c->n_shared_experts, c->shared_gate);
    if ((c->family == FAM_OLMOE || c->family == FAM_QWEN2_MOE) && c->head_dim * c->n_heads != c->d_model)
        BAD("family %s has head_dim = d_model / n_heads = %d (got %d)", fam, c->d_model / c->n_heads,
            c->head_dim);
    if (c->balance != BALANCE_AUX && c->balance != BALANCE_AUX_FREE)
        BAD("unknown balance mode %d", c->balance);
    if (!(c->bias_rate >= 0 && c->bias_rate <= 1)) BAD("bias_rate must be in [0, 1] (got %g)", c->bias_rate);
    if (c->aux_scope < AUX_SCOPE_MICRO || c->aux_scope > AUX_SCOPE_GLOBAL)
        BAD("unknown aux scope %d", c->aux_scope);
    if (c->aux_scope != AUX_SCOPE_MICRO && c->aux_form == AUX_HF)
        BAD("aux_scope %s applies to the per-layer aux loss: it needs aux_form layer (HF's form is one loss "
            "over all "
            "layers' micro-batch statistics)",
            c->aux_scope == AUX_SCOPE_SEQ ? "sequence" : "global");
    const char *bad = validate_layers_routing(c, fam);
    if (!bad) bad = validate_mla(c, fam);
    if (bad) return bad;
    return NULL;
}

int config_moe_layers(const ModelConfig *c) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += !config_layer_dense(c, l);
    return n;
}

int64_t capacity_for(const ModelConfig *c, int64_t n_tokens) {
    double cap = ceil((double)c->capacity_factor * (double)n_tokens * c->top_k / c->n_experts);
    // an expert gets at most one assignment per token: more slots than tokens change nothing (and
    // a huge factor must not wrap the integer)
    if (!(cap < (double)n_tokens)) cap = (double)n_tokens;
    return cap < 1 ? 1 : (int64_t)cap;
}

int64_t config_max_tokens(const ModelConfig *c) {
    int64_t wide = c->n_experts > c->top_k ? c->n_experts : c->top_k;
    return INT32_MAX / (wide > 1 ? wide : 1);
}
