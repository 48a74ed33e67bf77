// hf.h — Hugging Face model directories (what transformers' save_pretrained writes and
// from_pretrained reads for MixtralForCausalLM): reading one (config.json + model.safetensors, or
// shards listed in model.safetensors.index.json; F32/BF16/F16 tensors) and exporting one of our
// checkpoints as one. Must not hold: training logic (train/pretrained.c starts a run from one) or
// the safetensors format (io/safetensors.c).
#pragma once
#include "core/config.h"
#include "model/params.h"

// Is dir a Hugging Face model directory: config.json plus model.safetensors or
// model.safetensors.index.json, and not one of our checkpoints (no state.json / checksums.json)?
int hf_is_model_dir(const char *dir);

// Model config from dir/config.json (Mixtral, OLMoE, Qwen2-MoE or Qwen3-MoE: the family from its
// "architectures"; our "moe_c" keys if present). Dies with a
// message naming the directory and the key on anything our model cannot represent (sliding window,
// tied embeddings, RoPE scaling, another activation, another model type, ...).
void hf_load_config(const char *dir, ModelConfig *c);

// --upcycle E: the config of a dense LlamaForCausalLM or MistralForCausalLM directory as the Mixtral
// model whose every MLP becomes E experts, top-k of them per token (renormalised: with identical
// experts the MoE output is the MLP's, to rounding). Refuses other architectures, q/k/v/o or MLP biases.
void hf_load_config_upcycle(const char *dir, int E, int k, ModelConfig *c);

// Every tensor of the table t (built from hf_load_config's config) into the full flat buffer
// `params` (t->total floats, laid out by ParamSpec.offset), converted to float. Reads the single
// model.safetensors or the shards named by model.safetensors.index.json; Mixtral's per-expert
// names (block_sparse_moe.experts.E.w1/w2/w3) or transformers' fused in-memory layout
// (mlp.gate, mlp.experts.gate_up_proj / down_proj). Dies naming the file and the tensor on a
// missing tensor, a tensor the config does not have, a shape mismatch or an unreadable dtype.
// Reads only: no file is modified. upcycle: the experts of layer l are copies of the dense model's
// mlp.gate_proj / up_proj / down_proj, and the routers (absent) keep what `params` held.
void hf_load_params(const char *dir, const ParamTable *t, float *params, int upcycle);

// Writes out_dir as a transformers-loadable directory of the checkpoint's family (MixtralForCausalLM,
// OlmoeForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM) from our checkpoint ckpt_dir (verified
// first): model.safetensors (already the family's HF names, shapes, F32: copied, as a copy-on-write
// clone where the filesystem can; never a hard link) and config.json (the family's config keys +
// "moe_c"). Refuses a checkpoint whose options transformers' class cannot compute (capacity dispatch,
// Mixtral without renormalisation, an aux-free routing bias). An
// existing out_dir is replaced only with force and only if it is empty or an HF model directory.
// Written into a fresh out_dir.tmp.XXXXXX and renamed into place. Returns 1 if model.safetensors
// is a copy-on-write clone, 0 if its bytes were copied.
int hf_export(const char *ckpt_dir, const char *out_dir, int force);
