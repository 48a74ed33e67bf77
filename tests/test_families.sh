#!/usr/bin/env bash
# test_families.sh — the model families beyond Mixtral (OLMoE, Qwen2-MoE, Qwen3-MoE, DeepSeek-V3) without
# transformers:
#   - `moe info --preset` parameter counts equal the sums over the HF checkpoints' tensor shapes, computed
#     here from each published config.json (independently of src/), and round to the published totals;
#   - each family trains, exports to its own architecture with exactly the tensor names (and the QK-norm
#     shapes) transformers' modeling code defines, evaluates to the same loss from the export, and
#     continues from it with --init-from;
#   - dense layers among the MoE layers (Qwen's mlp_only_layers / decoder_sparse_step; ours under moe_c for
#     Mixtral): transformers' MLP names and config keys in the export, the same loss from it;
#   - bad configs (an unknown architecture, keys that contradict each other, a family option on a family
#     that lacks it, dense layers that do not exist, DeepSeek-V3 methods we lack) give one message, a non-zero
#     exit, and touch nothing.
set -u
. "$(dirname "$0")/lib.sh"
small_fixture

# ---- presets: parameters from the HF config shapes (config.json of each published model)
# count V d L H KV hd f E k shared_f qk(0 none|1 full|2 head) bias  -> "total active"
count() {
  awk -v V="$1" -v d="$2" -v L="$3" -v H="$4" -v KV="$5" -v hd="$6" -v f="$7" -v E="$8" -v k="$9" -v sf="${10}" \
      -v qk="${11}" -v b="${12}" 'BEGIN {
    attn = d * H * hd + 2 * d * KV * hd + H * hd * d + 2 * d          # q k v o, two RMSNorms
    if (qk == 1) attn += (H + KV) * hd; if (qk == 2) attn += 2 * hd     # q_norm, k_norm
    if (b) attn += (H + 2 * KV) * hd                                     # q/k/v biases
    shared = sf ? 3 * d * sf + d : 0                                     # shared expert + its gate
    expert = 3 * d * f
    per = attn + E * d + shared                                          # + the router
    printf "%.0f %.0f\n", 2 * V * d + d + L * (per + E * expert), 2 * V * d + d + L * (per + k * expert) }'
}
preset_counts() { "$MOE" info --preset "$1" | sed -n 's/.*(\([0-9]*\) \/ \([0-9]*\)).*/\1 \2/p'; }
# published: allenai/OLMoE-1B-7B-0924 "6.9B total, 1.3B active" (the paper: 6.92B / 1.28B);
# Qwen/Qwen1.5-MoE-A2.7B "14.3B parameters, 2.7B activated"; Qwen/Qwen3-30B-A3B "30.5B, 3.3B activated";
# Qwen/Qwen3-235B-A22B "235B in total and 22B activated"
while read -r name pub_t pub_a shapes; do
  want=$(count $shapes); got=$(preset_counts "$name")
  t=${got% *}; a=${got#* }
  # the published figure is ours rounded or truncated to its digits (Qwen3-30B-A3B's "3.3B activated" is
  # the shapes' 3.353B truncated)
  agrees() { awk -v x="$1" -v p="$2" 'BEGIN { n = split(p, a, "."); dg = n > 1 ? length(a[2]) : 0; s = 10 ^ dg; x /= 1e9
    r = int(x * s + 0.5) / s; t = int(x * s) / s; exit !(r == p + 0 || t == p + 0) }'; }
  if [ "$got" = "$want" ] && agrees "$t" "$pub_t" && agrees "$a" "$pub_a"; then
    pass "preset $name: $t total / $a active = the HF shapes' sum (published ${pub_t}B / ${pub_a}B)"
  else fail "preset $name: moe info says '$got', the HF shapes give '$want' (published ${pub_t}B / ${pub_a}B)"; fi
done <<'P'
olmoe-1b-7b 6.92 1.28 50304 2048 16 16 16 128 1024 64 8 0 1 0
qwen2-moe-a2.7b 14.3 2.7 151936 2048 24 16 16 128 1408 60 4 5632 0 1
qwen3-moe-30b-a3b 30.5 3.3 151936 2048 48 32 4 128 768 128 8 0 2 0
qwen3-235b-a22b 235 22 151936 4096 94 64 4 128 1536 128 8 0 2 0
P
# DeepSeek-V3's shapes (latent attention, the first kd layers dense of fd, ns shared experts of f): their
# config.json's tensors, the aux-free routing bias (E per MoE layer) left out as moe info leaves it out for
# every aux-free model. Published: deepseek-ai/DeepSeek-V3 "671B total, 37B activated" (the MTP module's 14B
# apart); moonshotai/Moonlight-16B-A3B "16B total, 3B activated" (15.29B / 2.24B without the embeddings)
# dscount V d L H qr kvr dn dr dv f E k ns kd fd -> "total active"
dscount() {
  awk -v V="$1" -v d="$2" -v L="$3" -v H="$4" -v qr="$5" -v kvr="$6" -v dn="$7" -v dr="$8" -v dv="$9" -v f="${10}" \
      -v E="${11}" -v k="${12}" -v ns="${13}" -v kd="${14}" -v fd="${15}" 'BEGIN {
    hq = dn + dr
    q = qr ? d * qr + qr + qr * H * hq : d * H * hq                       # q_a, q_a_layernorm, q_b (or q_proj)
    attn = q + d * (kvr + dr) + kvr + kvr * H * (dn + dv) + H * dv * d    # kv_a, kv_a_layernorm, kv_b, o
    moe = E * d + ns * 3 * d * f + E * 3 * d * f                          # router, shared experts, experts
    printf "%.0f %.0f\n", 2 * V * d + d + L * (attn + 2 * d) + (L - kd) * moe + kd * 3 * d * fd,
      2 * V * d + d + L * (attn + 2 * d) + (L - kd) * (moe - (E - k) * 3 * d * f) + kd * 3 * d * fd }'
}
while read -r name pub_t pub_a shapes; do
  want=$(dscount $shapes); got=$(preset_counts "$name")
  t=${got% *}; a=${got#* }
  if [ "$got" = "$want" ] && agrees "$t" "$pub_t" && agrees "$a" "$pub_a"; then
    pass "preset $name: $t total / $a active = the HF shapes' sum (published ${pub_t}B / ${pub_a}B)"
  else fail "preset $name: moe info says '$got', the HF shapes give '$want' (published ${pub_t}B / ${pub_a}B)"; fi
done <<'P'
deepseek-v3 671 37 129280 7168 61 128 1536 512 128 64 128 2048 256 8 1 3 18432
moonlight-16b-a3b 16 3 163840 2048 27 16 0 512 128 64 128 1408 64 6 2 1 11264
P
run_ok "deepseek-v3-tiny trains" "$MOE" train --preset deepseek-v3-tiny --out "$W/dstiny" "${SMALL[@]}" --steps 2 --device cpu

# ---- each family: train, export, names, eval equality, --init-from
# the tensor names of a safetensors file, sorted
st_names() { local n; n=$(od -An -t u8 -N8 "$1" | tr -d ' '); dd if="$1" bs=1 skip=8 count="$n" 2>/dev/null |
  grep -o '"[a-z_]*\.[a-z0-9_.]*"' | tr -d '"' | sort; }
st_shape() { local n; n=$(od -An -t u8 -N8 "$1" | tr -d ' '); dd if="$1" bs=1 skip=8 count="$n" 2>/dev/null |
  grep -o "\"$2\":{[^}]*}" | grep -o '"shape":\[[0-9,]*\]' | cut -d: -f2; }
# the names transformers' modeling code gives a model of L layers, E experts (family's rules)
hf_names() {   # hf_names FAMILY L E [DENSE]: DENSE the dense layers (Qwen's mlp_only_layers), e.g. " 0 2 "
  local fam="$1" L="$2" E="$3" dense="${4:- }" l e p
  { echo model.embed_tokens.weight; echo model.norm.weight; echo lm_head.weight
  for ((l = 0; l < L; l++)); do
    p="model.layers.$l"
    echo "$p.input_layernorm.weight"; echo "$p.post_attention_layernorm.weight"
    if [ "$fam" = deepseek_v3 ]; then   # DeepseekV3Attention (q_lora_rank set): latent attention's projections
      for x in q_a_proj q_a_layernorm q_b_proj kv_a_proj_with_mqa kv_a_layernorm kv_b_proj o_proj; do
        echo "$p.self_attn.$x.weight"; done
    else for x in q k v o; do echo "$p.self_attn.${x}_proj.weight"; done; fi
    case "$fam" in
      olmoe|qwen3_moe) echo "$p.self_attn.q_norm.weight"; echo "$p.self_attn.k_norm.weight" ;;
      qwen2_moe) for x in q k v; do echo "$p.self_attn.${x}_proj.bias"; done ;;
    esac
    if [[ "$dense" == *" $l "* ]]; then   # Qwen2MoeMLP / Qwen3MoeMLP: mlp.{gate,up,down}_proj
      for x in gate up down; do echo "$p.mlp.${x}_proj.weight"; done; continue
    fi
    echo "$p.mlp.gate.weight"
    if [ "$fam" = deepseek_v3 ]; then   # DeepseekV3TopkRouter's score-correction bias, DeepseekV3MoE's shared MLP
      echo "$p.mlp.gate.e_score_correction_bias"
      for x in gate up down; do echo "$p.mlp.shared_experts.${x}_proj.weight"; done
    fi
    for ((e = 0; e < E; e++)); do for x in gate up down; do echo "$p.mlp.experts.$e.${x}_proj.weight"; done; done
    if [ "$fam" = qwen2_moe ]; then
      for x in gate up down; do echo "$p.mlp.shared_expert.${x}_proj.weight"; done
      echo "$p.mlp.shared_expert_gate.weight"
    fi
  done; } | sort
}
M=(--d-model 32 --n-heads 4 --n-kv-heads 2 --d-ff 24 --n-layers 2 --n-experts 4)
EV=(--batch 4 --seq-len 16 --eval-batches 2 --device cpu)
while IFS='|' read -r fam arch flags qshape; do
  run="$W/r_$fam"; hf="$W/hf_$fam"
  "$MOE" train --out "$run" "${SMALL[@]}" "${M[@]}" --steps 3 --device cpu $flags >"$OUT_FILE" 2>"$ERR_FILE" ||
    { fail "$fam: training"; show_output; continue; }
  run_ok "$fam: export" "$MOE" export --ckpt "$run" --out "$hf" || continue
  check "$fam: config.json says $arch" grep -q "\"architectures\":.*\"$arch\"" "$hf/config.json"
  dense=" "; [ "$fam" = deepseek_v3 ] && dense=" 0 "   # (its first_k_dense_replace 1 below)
  if diff <(st_names "$hf/model.safetensors") <(hf_names "$fam" 2 4 "$dense") > "$TMP/names.diff"; then
    pass "$fam: exported tensors are exactly transformers' names ($(st_names "$hf/model.safetensors" | wc -l))"
  else fail "$fam: tensor names differ from transformers'"; head -8 "$TMP/names.diff"; fi
  [ -n "$qshape" ] && check "$fam: q_norm shape $qshape" [ "$(st_shape "$hf/model.safetensors" model.layers.1.self_attn.q_norm.weight)" = "$qshape" ]
  a=$("$MOE" eval --ckpt "$run" "${EV[@]}" 2>&1 | grep -o 'loss [0-9.]*' | head -1)
  b=$("$MOE" eval --ckpt "$hf" "${EV[@]}" 2>&1 | grep -o 'loss [0-9.]*' | head -1)
  check "$fam: the export evaluates as the checkpoint ($a)" [ -n "$a" ] && [ "$a" = "$b" ]
  run_ok "$fam: --init-from the export trains" "$MOE" train --init-from "$hf" --out "$W/i_$fam" "${SMALL[@]}" --steps 1 --device cpu
done <<'F'
olmoe|OlmoeForCausalLM|--family olmoe --qk-norm full --renormalize 0|[32]
qwen2_moe|Qwen2MoeForCausalLM|--family qwen2_moe --qkv-bias 1 --n-shared-experts 1 --shared-d-ff 40 --shared-gate 1 --renormalize 0|
qwen3_moe|Qwen3MoeForCausalLM|--family qwen3_moe --qk-norm head --head-dim 12|[12]
deepseek_v3|DeepseekV3ForCausalLM|--family deepseek_v3 --n-kv-heads 4 --kv-lora-rank 12 --q-lora-rank 16 --qk-nope-head-dim 8 --qk-rope-head-dim 4 --v-head-dim 6 --rope-interleave 1 --route-sigmoid 1 --z-coef 0 --n-group 2 --topk-group 1 --route-scale 2.5 --balance aux-free --n-shared-experts 1 --shared-d-ff 24 --dense-layers 0 --dense-d-ff 40|
F

# ---- dense layers among the MoE layers: Qwen's Qwen2MoeMLP / Qwen3MoeMLP names, mlp_only_layers and the dense
# intermediate_size in config.json; the export evaluates as the checkpoint; Mixtral's (no HF key) under moe_c
QD=(--family qwen2_moe --qkv-bias 1 --n-shared-experts 1 --shared-d-ff 40 --shared-gate 1 --renormalize 0)
if "$MOE" train --out "$W/r_dense" "${SMALL[@]}" "${M[@]}" --n-layers 3 --steps 3 --device cpu "${QD[@]}" \
    --dense-layers 0,2 --dense-d-ff 36 >"$OUT_FILE" 2>"$ERR_FILE"; then
  run_ok "qwen2_moe with dense layers 0,2: export" "$MOE" export --ckpt "$W/r_dense" --out "$W/hf_dense"
  if diff <(st_names "$W/hf_dense/model.safetensors") <(hf_names qwen2_moe 3 4 " 0 2 ") > "$TMP/names.diff"; then
    pass "qwen2_moe dense 0,2: exported tensors are exactly transformers' names"
  else fail "qwen2_moe dense 0,2: tensor names differ from transformers'"; head -8 "$TMP/names.diff"; fi
  check "qwen2_moe dense 0,2: config.json has mlp_only_layers [0,2], intermediate_size 36" \
    grep -q '"intermediate_size":36,.*"mlp_only_layers":\[0,2\]' <(tr -d ' \n\t' < "$W/hf_dense/config.json")
  check "qwen2_moe dense 0,2: down_proj of layer 2 is (32, 36)" [ "$(st_shape "$W/hf_dense/model.safetensors" model.layers.2.mlp.down_proj.weight)" = "[32,36]" ]
  a=$("$MOE" eval --ckpt "$W/r_dense" "${EV[@]}" 2>&1 | grep -o 'loss [0-9.]*' | head -1)
  b=$("$MOE" eval --ckpt "$W/hf_dense" "${EV[@]}" 2>&1 | grep -o 'loss [0-9.]*' | head -1)
  check "qwen2_moe dense 0,2: the export evaluates as the checkpoint ($a)" [ -n "$a" ] && [ "$a" = "$b" ]
  # decoder_sparse_step 2 on 3 layers makes layers 0 and 2 dense too (transformers: (l + 1) % step != 0)
  rm -rf "$W/hf_dense_step"; cp -r "$W/hf_dense" "$W/hf_dense_step"
  sed -i 's/"decoder_sparse_step":[^,]*/"decoder_sparse_step":2/; s/"mlp_only_layers":[^]]*]/"mlp_only_layers":[]/' \
    "$W/hf_dense_step/config.json"
  c=$("$MOE" eval --ckpt "$W/hf_dense_step" "${EV[@]}" 2>&1 | grep -o 'loss [0-9.]*' | head -1)
  check "qwen2_moe: decoder_sparse_step 2 reads as mlp_only_layers [0,2] ($c)" [ -n "$c" ] && [ "$a" = "$c" ]
  "$MOE" info --ckpt "$W/r_dense" > "$OUT_FILE" 2>&1
  check "moe info names the dense layers" grep -q "dense layers: 2 of 3 (a SwiGLU MLP of f 36 in place of the experts): 0 2" "$OUT_FILE"
else fail "qwen2_moe with dense layers: training"; show_output; fi
if "$MOE" train --out "$W/r_mixd" "${SMALL[@]}" "${M[@]}" --steps 2 --device cpu --dense-layers 1 --dense-d-ff 20 \
    >"$OUT_FILE" 2>"$ERR_FILE"; then
  ck="$(ls -d "$W"/r_mixd/step_* | tail -1)"
  check "mixtral with dense layer 1: moe_c holds dense_layers [1] and dense_intermediate_size 20 (not HF-compatible)" \
    grep -q '"dense_layers":\[1\],"dense_intermediate_size":20,.*"hf_compatible":false' <(tr -d ' \n\t' < "$ck/config.json")
  run_ok "mixtral with a dense layer: --resume reads its checkpoint (config.json's moe_c) and trains on" "$MOE" train --out "$W/r_mixd" \
    "${SMALL[@]}" "${M[@]}" --steps 3 --device cpu --dense-layers 1 --dense-d-ff 20 --resume
else fail "mixtral with a dense layer: training"; show_output; fi

# ---- a config.json as the published models write it (their key sets, no "moe_c"), with our weights:
# the same model (the same loss) as our own config.json says
plain() {   # plain DIR JSON
  rm -rf "$2"; cp -r "$1" "$2"; printf '%s\n' "$3" > "$2/config.json"
}
plain "$W/hf_olmoe" "$W/pl_olmoe" '{"architectures":["OlmoeForCausalLM"],"attention_bias":false,"attention_dropout":0.0,
 "clip_qkv":null,"hidden_act":"silu","hidden_size":32,"initializer_range":0.02,"intermediate_size":24,
 "max_position_embeddings":256,"model_type":"olmoe","norm_topk_prob":false,"num_attention_heads":4,"num_experts":4,
 "num_experts_per_tok":2,"num_hidden_layers":2,"num_key_value_heads":2,"output_router_logits":false,"pad_token_id":1,
 "rms_norm_eps":1e-05,"rope_scaling":null,"rope_theta":10000.0,"router_aux_loss_coef":0.01,"tie_word_embeddings":false,
 "torch_dtype":"bfloat16","use_cache":true,"vocab_size":256}'
plain "$W/hf_qwen3_moe" "$W/pl_qwen3_moe" '{"architectures":["Qwen3MoeForCausalLM"],"attention_bias":false,
 "attention_dropout":0.0,"decoder_sparse_step":1,"head_dim":12,"hidden_act":"silu","hidden_size":32,"initializer_range":0.02,
 "intermediate_size":96,"max_position_embeddings":256,"max_window_layers":2,"mlp_only_layers":[],"model_type":"qwen3_moe",
 "moe_intermediate_size":24,"norm_topk_prob":true,"num_attention_heads":4,"num_experts":4,"num_experts_per_tok":2,
 "num_hidden_layers":2,"num_key_value_heads":2,"output_router_logits":false,"rms_norm_eps":1e-05,"rope_scaling":null,
 "rope_theta":10000.0,"router_aux_loss_coef":0.001,"sliding_window":null,"tie_word_embeddings":false,
 "torch_dtype":"bfloat16","use_cache":true,"use_sliding_window":false,"vocab_size":256}'
plain "$W/hf_qwen2_moe" "$W/pl_qwen2_moe" '{"architectures":["Qwen2MoeForCausalLM"],"attention_dropout":0.0,
 "decoder_sparse_step":1,"hidden_act":"silu","hidden_size":32,"initializer_range":0.02,"intermediate_size":40,
 "max_position_embeddings":256,"max_window_layers":2,"model_type":"qwen2_moe","moe_intermediate_size":24,
 "norm_topk_prob":false,"num_attention_heads":4,"num_experts":4,"num_experts_per_tok":2,"num_hidden_layers":2,
 "num_key_value_heads":2,"output_router_logits":false,"rms_norm_eps":1e-05,"rope_theta":10000.0,
 "router_aux_loss_coef":0.001,"shared_expert_intermediate_size":40,"sliding_window":256,"tie_word_embeddings":false,
 "torch_dtype":"bfloat16","use_cache":true,"use_sliding_window":false,"vocab_size":256}'
# DeepSeek-V3's keys as its published config.json has them (4.x: rope_scaling, topk_method, scoring_func,
# moe_layer_freq), YaRN (factor 1: the correction is the identity, the softmax scale times mscale_all_dim's 1),
# and its num_nextn_predict_layers 1: the weights an export of the same model with one MTP module (the
# released checkpoints' model.layers.{L} names), so its MTP module, on latent attention, reads back too
DSF=$(sed -n 's/^deepseek_v3|[^|]*|\([^|]*\)|.*/\1/p' "$0")
"$MOE" train --out "$W/r_dsmtp" "${SMALL[@]}" "${M[@]}" --steps 3 --device cpu $DSF --mtp 1 >"$OUT_FILE" 2>"$ERR_FILE" ||
  { fail "deepseek_v3 with --mtp 1: training"; show_output; }
run_ok "deepseek_v3 with --mtp 1: export" "$MOE" export --ckpt "$W/r_dsmtp" --out "$W/hf_deepseek_v3_mtp"
check "deepseek_v3 with --mtp 1: the export holds the module as model.layers.2 (eh_proj, its latent attention)" \
  [ "$(st_names "$W/hf_deepseek_v3_mtp/model.safetensors" | grep -c -e '^model\.layers\.2\.eh_proj\.' \
       -e '^model\.layers\.2\.self_attn\.kv_a_proj_with_mqa\.')" = 2 ]
plain "$W/hf_deepseek_v3_mtp" "$W/pl_deepseek_v3" '{"architectures":["DeepseekV3ForCausalLM"],"attention_bias":false,
 "attention_dropout":0.0,"first_k_dense_replace":1,"hidden_act":"silu","hidden_size":32,"initializer_range":0.02,
 "intermediate_size":40,"kv_lora_rank":12,"max_position_embeddings":256,"model_type":"deepseek_v3",
 "moe_intermediate_size":24,"moe_layer_freq":1,"n_group":2,"n_routed_experts":4,"n_shared_experts":1,
 "norm_topk_prob":true,"num_attention_heads":4,"num_experts_per_tok":2,"num_hidden_layers":2,
 "num_key_value_heads":4,"num_nextn_predict_layers":1,"q_lora_rank":16,"qk_nope_head_dim":8,"qk_rope_head_dim":4,
 "rms_norm_eps":1e-05,"rope_scaling":{"beta_fast":32,"beta_slow":1,"factor":1.0,"mscale":1.0,"mscale_all_dim":1.0,
 "original_max_position_embeddings":256,"type":"yarn"},"rope_theta":10000,"routed_scaling_factor":2.5,
 "scoring_func":"sigmoid","topk_group":1,"topk_method":"noaux_tc","tie_word_embeddings":false,
 "torch_dtype":"bfloat16","use_cache":true,"v_head_dim":6,"vocab_size":256}'
for fam in olmoe qwen2_moe qwen3_moe deepseek_v3; do
  hf="$W/hf_$fam"; [ "$fam" = deepseek_v3 ] && hf="$W/hf_deepseek_v3_mtp"
  a=$("$MOE" eval --ckpt "$hf" "${EV[@]}" 2>&1 | grep -o 'loss [0-9.]*' | head -1)
  b=$("$MOE" eval --ckpt "$W/pl_$fam" "${EV[@]}" 2>&1 | grep -o 'loss [0-9.]*' | head -1)
  check "$fam: a published-style config.json (no moe_c) reads as the same model ($b)" [ -n "$a" ] && [ "$a" = "$b" ]
done
# a config.json that gives an MTP module whose files hold none (transformers' save_pretrained drops them):
# the main model alone, said on stderr (the same loss as the directory without the key)
rm -rf "$W/ds_nomtp"; cp -r "$W/hf_deepseek_v3" "$W/ds_nomtp"
sed -i 's/"num_nextn_predict_layers":[[:space:]]*0/"num_nextn_predict_layers": 1/' "$W/ds_nomtp/config.json"
check "deepseek_v3 without MTP files: the edited config gives a module" grep -q '"num_nextn_predict_layers": 1' "$W/ds_nomtp/config.json"
a=$("$MOE" eval --ckpt "$W/hf_deepseek_v3" "${EV[@]}" 2>&1 | grep -o 'loss [0-9.]*' | head -1)
"$MOE" eval --ckpt "$W/ds_nomtp" "${EV[@]}" >"$OUT_FILE" 2>"$ERR_FILE"
b=$(grep -o 'loss [0-9.]*' "$OUT_FILE" "$ERR_FILE" | head -1 | sed 's/^[^:]*://')
check "deepseek_v3: num_nextn_predict_layers 1 without the module's tensors loads the main model ($b)" [ -n "$a" ] && [ "$a" = "$b" ]
check "deepseek_v3: ... and says so" grep -q "MTP module(s) (num_nextn_predict_layers) but its files hold none" "$ERR_FILE"

# ---- aux-free balancing does balance: with the aux loss off, the routing bias alone keeps the busiest
# expert's load nearer the mean than no balancing at all (the same seed, data and steps)
AF=(--steps 60 --quiet --sample-tokens 0 --plots 0 --batch 8 --seq-len 32 --eval-batches 1 --eval-every 0 --aux-coef 0 --device cpu)
"$MOE" train --out "$W/af0" "${AF[@]}" > /dev/null 2>&1; "$MOE" train --out "$W/af1" "${AF[@]}" --balance aux-free --bias-rate 0.01 > /dev/null 2>&1
l0=$(field load_max_over_mean "$W/af0/metrics.jsonl" | mean_last 20); l1=$(field load_max_over_mean "$W/af1/metrics.jsonl" | mean_last 20)
check "aux-free bias balances the load without an aux loss (busiest/mean over the last 20 steps: $l1 vs $l0 unbalanced)" fcmp "$l1" "<" "$(awk -v a="$l0" 'BEGIN { print 1 + (a - 1) * 0.7 }')"
check "aux-free: the routing bias is in the checkpoint" grep -q "e_score_correction_bias" "$(ls -d "$W"/af1/step_* | tail -1)/model.safetensors"
run_fail "aux-free balancing adds a per-expert bias to the routing scores" "$MOE" export --ckpt "$W/af1" --out "$W/af1_hf"

# ---- bad configs: one message, nothing touched
bad() {   # bad NAME SED-EXPR: a copy of the qwen2_moe export with config.json edited
  rm -rf "$W/$1"; cp -r "$W/hf_qwen2_moe" "$W/$1"; sed -i "$2" "$W/$1/config.json"
}
bad unk 's/"Qwen2MoeForCausalLM"/"JambaForCausalLM"/'
bad mt 's/"model_type":[^,]*/"model_type":"olmoe"/'
bad renorm 's/"norm_topk_prob":[^,]*/"norm_topk_prob":true/'
bad hd 's/"head_dim":[^,]*/"head_dim":16/'
bad step 's/"decoder_sparse_step":[^,]*/"decoder_sparse_step":2/'
bad mlo 's/"mlp_only_layers":[^]]*]/"mlp_only_layers":[5]/'
cp -r "$W/hf_olmoe" "$W/olbias"; sed -i 's/"vocab_size"/"qkv_bias":true,"vocab_size"/' "$W/olbias/config.json"
cp -r "$W/hf_qwen3_moe" "$W/q3sh"; sed -i 's/"vocab_size"/"shared_expert_intermediate_size":64,"vocab_size"/' "$W/q3sh/config.json"
# DeepSeek-V3's methods, RoPE types and YaRN options we lack, its batch-wise aux loss: named (key and value)
for b in "tk|s/\"topk_method\":\"noaux_tc\"/\"topk_method\":\"greedy\"/" "sf|s/\"scoring_func\":\"sigmoid\"/\"scoring_func\":\"softmax\"/" \
         "ry|s/\"type\":\"yarn\"/\"type\":\"longrope\"/" "af|s/\"mscale\":1.0,/\"attention_factor\":0.5,/" \
         "lf|s/\"moe_layer_freq\":1/\"moe_layer_freq\":2/" "tr|s/\"mscale\":1.0,/\"truncate\":false,/" \
         "sa|s/\"vocab_size\"/\"aux_loss_alpha\":0.001,\"seq_aux\":false,\"vocab_size\"/" \
         "rp|s/\"vocab_size\"/\"rope_parameters\":{\"rope_type\":\"dynamic\",\"factor\":2.0},\"vocab_size\"/"; do
  rm -rf "$W/ds_${b%%|*}"; cp -r "$W/pl_deepseek_v3" "$W/ds_${b%%|*}"; sed -i "${b#*|}" "$W/ds_${b%%|*}/config.json"
done
GUARD="$W/unk $W/mt $W/renorm $W/hd $W/step $W/mlo $W/olbias $W/q3sh $W/ds_tk $W/ds_sf $W/ds_ry $W/ds_af $W/ds_lf $W/ds_tr $W/ds_sa $W/ds_rp"
run_fail 'key "topk_method" is "greedy"; only "noaux_tc" is supported' "$MOE" eval --ckpt "$W/ds_tk" "${EV[@]}"
run_fail 'key "scoring_func" is "softmax"; only "sigmoid" is supported' "$MOE" train --init-from "$W/ds_sf" --out "$W/new" "${SMALL[@]}"
run_fail 'key "rope_scaling" is set (type "longrope"); RoPE scaling is not supported (only "yarn")' "$MOE" eval --ckpt "$W/ds_ry" "${EV[@]}"
run_fail 'key "rope_scaling": "attention_factor" is not supported with rope_type "yarn"' "$MOE" eval --ckpt "$W/ds_af" "${EV[@]}"
run_fail 'key "moe_layer_freq" is 2; only 1 is supported' "$MOE" eval --ckpt "$W/ds_lf" "${EV[@]}"
run_fail "key \"rope_scaling\": truncate false is not supported (YaRN's range is truncated)" "$MOE" eval --ckpt "$W/ds_tr" "${EV[@]}"
run_fail 'key "seq_aux" is false with aux_loss_alpha 0.001: the batch-wise aux loss is not supported' \
  "$MOE" train --init-from "$W/ds_sa" --out "$W/new" "${SMALL[@]}"
run_fail 'key "rope_parameters": rope_type "dynamic" is not supported (only "default" RoPE and "yarn")' "$MOE" eval --ckpt "$W/ds_rp" "${EV[@]}"
run_fail 'architecture "JambaForCausalLM" is not supported' "$MOE" eval --ckpt "$W/unk" "${EV[@]}"
run_fail 'architecture "JambaForCausalLM" is not supported' "$MOE" train --init-from "$W/unk" --out "$W/new" "${SMALL[@]}"
run_fail 'key "model_type" is "olmoe", expected "qwen2_moe"' "$MOE" eval --ckpt "$W/mt" "${EV[@]}"
run_fail 'keys "norm_topk_prob" (true) and "moe_c": "renormalize" (false) contradict each other' "$MOE" eval --ckpt "$W/renorm" "${EV[@]}"
run_fail "key \"head_dim\" is 16, but Qwen2MoeForCausalLM's heads are hidden_size / num_attention_heads = 32 / 4 wide" \
  "$MOE" eval --ckpt "$W/hd" "${EV[@]}"
run_fail 'tensor model.layers.0.mlp.gate_proj.weight is missing' "$MOE" train --init-from "$W/step" --out "$W/new" "${SMALL[@]}"
run_fail 'key "mlp_only_layers" must list layer numbers in 0..1 (num_hidden_layers 2)' "$MOE" eval --ckpt "$W/mlo" "${EV[@]}"
run_fail 'key "qkv_bias" is not an option of OlmoeForCausalLM' "$MOE" eval --ckpt "$W/olbias" "${EV[@]}"
run_fail 'key "shared_expert_intermediate_size" is not an option of Qwen3MoeForCausalLM' "$MOE" eval --ckpt "$W/q3sh" "${EV[@]}"
check "nothing written for the refused --init-from" [ ! -e "$W/new" ]
GUARD="$W"
run_fail "family mixtral has qk_norm none, not head" "$MOE" train --out "$W/new" "${SMALL[@]}" --qk-norm head
run_fail "family olmoe has no shared experts" "$MOE" train --out "$W/new" "${SMALL[@]}" --family olmoe --qk-norm full --n-shared-experts 1 --shared-d-ff 8
run_fail "family qwen3_moe has no q/k/v biases" "$MOE" info --family qwen3_moe --qk-norm head --qkv-bias 1
run_fail "dense layer 3 does not exist (the model has 2 layers: 0..1)" "$MOE" train --out "$W/new" "${SMALL[@]}" --dense-layers 0,3 --dense-d-ff 8
run_fail "every one of the 2 layers is dense" "$MOE" info --dense-layers 0-1 --dense-d-ff 8
run_fail "dense_d_ff must be >= 1 with 1 dense layers" "$MOE" info --dense-layers 1
run_fail "dense_d_ff is 8 but no layer is dense" "$MOE" info --dense-d-ff 8
run_fail "--dense-layers: '0,x' is not a list of layers" "$MOE" info --dense-layers 0,x
# multi-token prediction's bad input
run_fail "mtp_depth must be in 0..8 (got 9)" "$MOE" info --mtp 9
run_fail "mtp_weight must be in [0, 100] (got -1)" "$MOE" info --mtp 1 --mtp-weight -1
run_fail "mtp_depth 1 needs aux_form layer" "$MOE" train --out "$W/new" "${SMALL[@]}" --mtp 1 --aux-form hf
run_fail "--seq-len 2 leaves --mtp 2 no position to predict" "$MOE" train --out "$W/new" "${SMALL[@]}" --mtp 2 --seq-len 2
finish
