// config_json.h — ModelConfig <-> config.json (HF MixtralConfig keys, plus ours under "moe_c").
// Must not hold: file IO (the caller reads/writes the text), checkpoint logic.
#pragma once
#include <stddef.h>
#include <cjson/cJSON.h>
#include "core/config.h"

// New cJSON object (caller frees with cJSON_Delete): HF MixtralConfig keys ("architectures",
// "model_type": "mixtral", vocab_size, hidden_size, ..., "torch_dtype": "float32") and a "moe_c"
// object with renormalize, jitter, z_coef, dispatch ("dropless"/"capacity"), capacity_factor and
// mixtral_compatible (false when dispatch is capacity or renormalize is 0). Floats are written as
// the shortest decimal that reads back to the same float, so the round trip is exact, and always
// with a '.' or an exponent (transformers' strict config classes refuse an int for a float field).
cJSON *config_to_json(const ModelConfig *c);

// Reads a config written by config_to_json, or a plain HF Mixtral config.json (no "moe_c": Mixtral
// semantics; missing head_dim = hidden_size / num_attention_heads; missing router_aux_loss_coef,
// initializer_range, router_jitter_noise take HF defaults; RoPE base from "rope_theta" (transformers
// 4) or "rope_parameters" (5, wins when both are present)). Refuses what the model cannot represent:
// tied embeddings, another activation, a sliding window shorter than max_position_embeddings, RoPE
// scaling, attention dropout, biases, quantization. Returns 0 on success; -1 with a message naming
// the key in err (c untouched) on a missing required key, a wrong type or a bad value.
// Does not call config_validate.
int config_from_json(const cJSON *j, ModelConfig *c, char *err, size_t errlen);
