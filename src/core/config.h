// config.h (core: every layer reads it) — the model's shape and MoE options, named presets, validation.
// Must not hold: training options (train/options.h), anything about files or devices, parameter / FLOP /
// memory figures (train/cost.h).
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef enum { DISPATCH_DROPLESS = 0, DISPATCH_CAPACITY = 1 } DispatchMode;
// AUX_LAYER: per layer E * sum_i f_i P_i, averaged over layers (Switch/GShard).
// AUX_HF: HF Mixtral's load_balancing_loss_func: one E * sum_i F_i Pbar_i over all layers' tokens.
typedef enum { AUX_LAYER = 0, AUX_HF = 1 } AuxForm;
// The transformers architecture a model is (its tensor names and config.json keys; params.c,
// config_json.c). Each family has its own options below; config_validate refuses an option the
// family lacks.
typedef enum {
    FAM_MIXTRAL = 0,
    FAM_OLMOE = 1,
    FAM_QWEN2_MOE = 2,
    FAM_QWEN3_MOE = 3,
    FAM_DEEPSEEK_V3 = 4 // latent attention, sigmoid group-limited routing with the aux-free bias, ungated
                        // shared experts, the first layers dense
} ModelFamily;
#define FAM_LAST FAM_DEEPSEEK_V3
// QK-norm: RMSNorm on the q and k projections before RoPE. FULL (OLMoE): over the whole q (H*hd) and
// k (KV*hd) rows, weights (H*hd) and (KV*hd); HEAD (Qwen3-MoE): over each head's hd, weights (hd).
typedef enum { QK_NORM_NONE = 0, QK_NORM_FULL = 1, QK_NORM_HEAD = 2 } QkNorm;
// Load balancing: the aux loss alone, or DeepSeek-V3's aux-loss-free per-expert bias (added to the
// routing scores for the top-k choice only; the aux loss still applies with its coefficient).
typedef enum { BALANCE_AUX = 0, BALANCE_AUX_FREE = 1 } BalanceMode;
// Over which tokens the aux loss's f_i and P_i are taken: each micro-batch (of the stage: every rank's
// tokens of that micro-batch), each sequence (averaged over the sequences), or the whole global batch
// of the step (f_i from every micro-batch's counts).
typedef enum { AUX_SCOPE_MICRO = 0, AUX_SCOPE_SEQ = 1, AUX_SCOPE_GLOBAL = 2 } AuxScope;

// Dense layers can be any of the first MOE_MAX_DENSE_LAYERS layers.
#define MOE_MAX_DENSE_LAYERS 256

typedef struct {
    int vocab_size; // V
    int d_model; // d
    int n_layers; // L
    int n_heads; // H
    int n_kv_heads; // KV (GQA: H % KV == 0)
    int head_dim; // hd (usually d / H)
    int d_ff; // f, per expert
    int n_experts; // E
    int top_k; // k
    int max_seq_len; // longest sequence positions are defined for
    float rope_theta;
    float norm_eps;
    float init_std; // normal(0, init_std) for linear weights; output projections scaled by 1/sqrt(2L)
    // MoE
    int renormalize; // 1: top-k weights renormalised to sum 1 (Mixtral); 0: raw softmax probs (OLMoE)
    float jitter; // multiplicative input jitter on the router input, U(1-j, 1+j); training only
    float aux_coef; // load-balancing loss coefficient (E * sum_i f_i P_i)
    float z_coef; // router z-loss coefficient (mean logsumexp^2)
    AuxForm aux_form;
    DispatchMode dispatch;
    float capacity_factor; // capacity mode: capacity = ceil(cf * tokens * k / E)
    // families beyond Mixtral (zero: Mixtral)
    int family; // ModelFamily
    int qk_norm; // QkNorm
    int qkv_bias; // 1: q, k, v projections have biases (Qwen2-MoE)
    int n_shared_experts; // shared experts every token passes through (one SwiGLU MLP of width n *
                          // shared_d_ff)
    int shared_d_ff; // each shared expert's hidden size
    int shared_gate; // 1: the shared output scaled by sigmoid(x . w_gate) per token (Qwen2-MoE)
    int balance; // BalanceMode
    float bias_rate; // aux-free: the bias moves by bias_rate * sign(mean load - load) per step
    int aux_scope; // AuxScope
    float attention_dropout; // dropout on the attention probabilities in training (HF attention_dropout)
    // Dense FFN layers among the MoE layers (DeepSeek's first_k_dense_replace, Qwen's mlp_only_layers and
    // decoder_sparse_step): bit l of dense_layers set = layer l's FFN is one SwiGLU MLP of width dense_d_ff
    // (no router, no experts); none set: every layer is an MoE layer (dense_d_ff 0).
    uint64_t dense_layers[MOE_MAX_DENSE_LAYERS / 64];
    int dense_d_ff;
    // DeepSeek-V3's routing (our own configs; zero: softmax over all experts, weights unscaled):
    int route_sigmoid; // 1: scores sigmoid(logits) (scoring_func sigmoid), the aux statistics over each
                       // token's scores normalised to sum 1; 0: softmax
    int n_group, topk_group; // n_group > 1: the experts in n_group groups; only the topk_group groups of
                             // highest sum of their two best (biased) scores are chosen from
    float route_scale; // routed_scaling_factor: the routed experts' weights times it (0: 1)
    // Multi-head latent attention (DeepSeek-V2/V3; kv_lora_rank > 0, else GQA): queries through q_a_proj (d
    // -> q_lora_rank), its RMSNorm and q_b_proj (-> H x (qk_nope_head_dim + qk_rope_head_dim)), or q_proj
    // where q_lora_rank is 0; keys and values through kv_a_proj_with_mqa (d -> kv_lora_rank +
    // qk_rope_head_dim): the latent's RMSNorm and kv_b_proj (-> H x (qk_nope_head_dim + v_head_dim)), and one
    // rope key of qk_rope_head_dim shared by the heads; o_proj from H x v_head_dim. n_kv_heads = n_heads,
    // head_dim = qk_rope_head_dim (RoPE's width, as transformers' DeepseekV3Config sets it).
    int q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim;
    int rope_interleave; // 1: RoPE rotates the pairs (2j, 2j+1) of the rope parts (DeepSeek's layout,
                         // transformers' rope_interleave); 0: rotate_half's (j, j + qk_rope_head_dim/2)
    // YaRN RoPE scaling (rope_type yarn; rope_factor 0: none): factor, original_max_position_embeddings,
    // beta_fast, beta_slow (0: 32 and 1, transformers' defaults), mscale and mscale_all_dim (0: absent) as
    // transformers reads them
    float rope_factor;
    int rope_orig_max;
    float yarn_beta_fast, yarn_beta_slow, yarn_mscale, yarn_mscale_all_dim;
    // Multi-token prediction (DeepSeek-V3's MTP; HF num_nextn_predict_layers): mtp_depth modules after the
    // main layers, module k (1..D) at layer index n_layers + k - 1: h_k = shared_head.norm(block(eh_proj
    // [enorm(Emb(t[i+k])); hnorm(h_{k-1})])) from h_0, the final norm's output (the main model's normed last
    // hidden state, what its LM head reads), and a loss of predicting t[i+k+1] from h_k through the main
    // model's LM head; the training objective adds mtp_weight / D times the sum of the modules' mean
    // cross-entropies (0: none)
    int mtp_depth;
    float mtp_weight;
} ModelConfig;
// Multi-head latent attention (kv_lora_rank > 0); its query/key head width.
static inline int config_mla(const ModelConfig *c) { return c->kv_lora_rank > 0; }
static inline int config_qk_head_dim(const ModelConfig *c) {
    return c->qk_nope_head_dim + c->qk_rope_head_dim;
}
// The most MTP modules a model may have; the loss weight modules take unless one is given (DeepSeek-V3's for
// its first 10T tokens; without modules the weight is 0, so configs without MTP read and write as before).
#define MOE_MAX_MTP 8
#define MOE_MTP_WEIGHT 0.3f
// Every layer with activations: the main layers, then the MTP modules' blocks (config mtp_depth).
static inline int config_all_layers(const ModelConfig *c) { return c->n_layers + c->mtp_depth; }
// Layer l's FFN is a dense MLP (config dense_layers); the number of MoE layers (those with a router).
static inline int config_layer_dense(const ModelConfig *c, int l) {
    return l >= 0 && l < MOE_MAX_DENSE_LAYERS && (int)((c->dense_layers[l / 64] >> (l % 64)) & 1);
}
static inline void config_set_dense(ModelConfig *c, int l) {
    c->dense_layers[l / 64] |= (uint64_t)1 << (l % 64);
}
int config_moe_layers(const ModelConfig *c);
const char *config_family_name(int family); // "mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "deepseek_v3"
const char *config_family_arch(int family); // "MixtralForCausalLM", ...

// Fills *c with the named preset; returns 0 on success, -1 if the name is unknown.
int config_preset(ModelConfig *c, const char *name);
const char *config_preset_names(void); // the table's names: "tiny, small, mixtral-8x7b, ..."

// Returns NULL if valid, else a static message naming the offending numbers.
const char *config_validate(const ModelConfig *c);

// Capacity mode: slots per expert for a micro-batch of n_tokens, ceil(cf * n * k / E), at most n.
int64_t capacity_for(const ModelConfig *c, int64_t n_tokens);
// The most tokens one micro-batch of a rank may hold (B x T): the model's int-indexed token
// arrays (N x E router logits, N x k assignments) stay below 2^31.
int64_t config_max_tokens(const ModelConfig *c);
// Longest max_seq_len config_validate accepts (2^24).
#define MOE_MAX_SEQ_LEN (1 << 24)
