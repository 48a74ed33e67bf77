// config_json.h — ModelConfig <-> the family's Hugging Face config.json (MixtralConfig, OlmoeConfig,
// Qwen2MoeConfig or Qwen3MoeConfig keys, plus ours under "moe_c").
// Must not hold: file IO (the caller reads/writes the text), checkpoint logic.
#pragma once
#include <stddef.h>
#include <cjson/cJSON.h>
#include "core/config.h"

// New cJSON object (caller frees with cJSON_Delete): the family's HF config keys ("architectures",
// "model_type", vocab_size, hidden_size, ..., the family's own: Qwen's moe_intermediate_size,
// Qwen2-MoE's shared expert and qkv_bias, ...; "torch_dtype": "float32") and a "moe_c" object with
// renormalize, jitter, z_coef, dispatch ("dropless"/"capacity"), aux_form, capacity_factor, balance,
// bias_rate, aux_scope and hf_compatible (Mixtral: also mixtral_compatible), false when dispatch is
// capacity, balance is aux-free or (Mixtral) renormalize is 0. Floats are written as the shortest
// decimal that reads back to the same float, so the round trip is exact, and always with a '.' or
// an exponent (transformers' strict config classes refuse an int for a float field).
cJSON *config_to_json(const ModelConfig *c);

// Reads a config written by config_to_json, or a plain HF config.json of the four families: the
// family from "architectures", else "model_type" (both present must agree), else Mixtral; a key of
// another family's options is refused. No "moe_c": the family's semantics (HF's aux loss form, no
// z-loss, dropless). Missing head_dim = hidden_size / num_attention_heads (OLMoE and Qwen2-MoE: it
// must be); missing router_aux_loss_coef, initializer_range, router_jitter_noise, norm_topk_prob
// take HF defaults; RoPE base from "rope_theta" (transformers 4) or "rope_parameters" (5, wins when
// both are present). Refuses what the model cannot represent: tied embeddings, another activation,
// a sliding window shorter than max_position_embeddings (Qwen: only with use_sliding_window), RoPE
// scaling, biases other than Qwen2-MoE's q/k/v, OLMoE's clip_qkv, Qwen layers without experts,
// quantization. Returns 0 on success; -1 with a message naming the key in err (c untouched) on a
// missing required key, a wrong type or a bad value. Does not call config_validate.
int config_from_json(const cJSON *j, ModelConfig *c, char *err, size_t errlen);
