// config_deepseek.h — transformers' DeepseekV3Config keys (config_json.c's family deepseek_v3) and YaRN's
// rope parameters (any family's reader; the model implements YaRN for latent attention only: config.h).
// Must not hold: the other families' keys, file IO.
#pragma once
#include "core/config.h"
#include "io/json_keys.h"

// YaRN from a rope_parameters / rope_scaling object o whose type is "yarn" (key: its name, for messages):
// factor (>= 1) and original_max_position_embeddings required; beta_fast, beta_slow, mscale, mscale_all_dim
// optional (0: absent); truncate false, partial_rotary_factor != 1 and any other key (attention_factor, ...)
// refused, named. 0 or -1 with the message in e.
int config_read_yarn(JsonErr *e, const cJSON *o, const char *key, ModelConfig *c);
// "rope_theta", and "rope_parameters" with YaRN's keys where c has them.
void config_write_rope(cJSON *j, const ModelConfig *c);
// A DeepseekV3Config's options after its shape (config_json.c read_shape): latent attention (q_lora_rank
// null: q_proj), rope_interleave, sigmoid routing with the aux-free bias, n_group, topk_group,
// routed_scaling_factor, norm_topk_prob, n_shared_experts of moe_intermediate_size, first_k_dense_replace
// dense layers of intermediate_size, aux_loss_alpha (default 0: transformers' class has no aux loss);
// DeepseekV3Config's defaults where a key is absent. The original configs' topk_method other than noaux_tc,
// scoring_func other than sigmoid and moe_layer_freq other than 1 are refused.
int ds_config_read(JsonErr *e, const cJSON *j, ModelConfig *c);
// Its keys for config_to_json (after vocab_size and hidden_size; the shared keys are config_to_json's).
void ds_config_write(cJSON *j, const ModelConfig *c);
