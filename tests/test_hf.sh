#!/usr/bin/env bash
# test_hf.sh — Hugging Face interop through the CLI, without torch: `moe export` writes a directory
# that our own --ckpt loads with identical results (eval, sample, info, --dump); `moe train
# --init-from` starts a run from it (its weights are the run's step 0, byte for byte), with llm.c
# uint32 shards; flags that contradict the HF config, non-Mixtral checkpoints and broken HF
# directories are refused with one "moe: error:" line and nothing in the work directory changes.
# (scripts/verify_hf.py checks the numbers against transformers itself.)
set -u
. "$(dirname "$0")/lib.sh"

W="$TMP/w"
mkdir -p "$W" && cd "$W" || exit 1
MODEL=(--d-model 32 --n-heads 4 --n-kv-heads 2 --d-ff 48 --n-layers 2 --n-experts 4 --top-k 2 --jitter 0)
SMALL=(--batch 4 --seq-len 32 --eval-batches 2 --sample-tokens 0 --plots 0 --quiet)
EVAL=(--batch 4 --seq-len 32 --eval-batches 2)

# llm.c shard from stdin bytes (+ extra token ids as arguments): uint32 form, or uint16 with U16=1
mkshard() {
  perl -e 'binmode STDIN; binmode STDOUT; local $/; my $d = <STDIN>; my @t = (unpack("C*", $d), @ARGV);
           if ($ENV{U16}) { print pack("l<256", 20240520, 1, scalar(@t), (0) x 253), pack("S<*", @t) }
           else           { print pack("l<256", 20240801, 7, scalar(@t), (0) x 253), pack("L<*", @t) }' "$@"
}
# the names in a safetensors header
st_names() {
  local n
  n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
  dd if="$1" bs=1 skip=8 count="$n" status=none | grep -o '"[^"]*":{"dtype"' | cut -d'"' -f2
}
val_loss() { grep -o 'val loss [0-9.]*' "$OUT_FILE"; }

command -v perl >/dev/null || { echo "SKIP: perl is needed to write shards"; exit 77; }
text_bytes 20000 1 | mkshard >text32.bin
text_bytes 20000 1 | U16=1 mkshard >text16.bin

# ---- export
run_ok "train a small run" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 4 --out run
run_ok "export it" "$MOE" export --ckpt run --out hf
check "export holds config.json and model.safetensors only" test "$(ls hf | tr '\n' ' ')" = "config.json model.safetensors "
check "exported model.safetensors is the checkpoint's, byte for byte" cmp -s hf/model.safetensors run/step_00000004/model.safetensors
check "config.json: MixtralForCausalLM, float32, untied, floats as floats" \
  grep -q '"architectures":.*"MixtralForCausalLM"' hf/config.json
check "config.json: torch_dtype float32" grep -q '"torch_dtype":.*"float32"' hf/config.json
check "config.json: router_jitter_noise is a float (0.0)" grep -q '"router_jitter_noise":.*0\.0' hf/config.json
check "config.json: mixtral_compatible true" grep -q '"mixtral_compatible":.*true' hf/config.json

run_ok "eval the checkpoint" "$MOE" eval --ckpt run "${EVAL[@]}" && a=$(val_loss)
run_ok "eval the HF directory" "$MOE" eval --ckpt hf "${EVAL[@]}" && b=$(val_loss)
check "same val loss from the checkpoint and its export ($a)" test -n "$a" -a "$a" = "$b"
run_ok "sample from the HF directory" "$MOE" sample --ckpt hf --prompt "12+34=" --tokens 8 --temperature 0
check "the sample continues the prompt" grep -q '^12+34=' "$OUT_FILE"
run_ok "info on the HF directory" "$MOE" info --ckpt hf
check "info says Hugging Face model" grep -q 'Hugging Face model' "$OUT_FILE"
run_ok "eval --dump --dump-grads" "$MOE" eval --ckpt hf "${EVAL[@]}" --dump dump.safetensors --dump-grads --aux-coef 0 --z-coef 0
names=$(st_names dump.safetensors | tr '\n' ' ')
miss=""
for n in tokens targets logits losses loss aux_loss aux_loss_hf z_loss router_logits.0 router_logits.1 \
         grad.lm_head.weight grad.model.embed_tokens.weight grad.model.layers.1.block_sparse_moe.experts.3.w2.weight; do
  case " $names " in *" $n "*) ;; *) miss="$miss $n" ;; esac
done
check "the dump holds the logits, losses, router logits and every gradient${miss:+ (missing:$miss)}" test -z "$miss"
check "the dump has 41 gradients" test "$(st_names dump.safetensors | grep -c '^grad\.')" = 41

# ---- import
run_ok "train --init-from the HF directory (uint32 shard)" \
  "$MOE" train --init-from hf --data text32.bin "${SMALL[@]}" --steps 3 --out run2
check "its step 0 is the HF model, byte for byte" cmp -s hf/model.safetensors run2/step_00000000/model.safetensors
check "it trained to step 3" test -f run2/step_00000003/checksums.json
run_ok "--resume continues it" "$MOE" train --data text32.bin "${SMALL[@]}" --steps 5 --out run2 --resume
check "to step 5" test -f run2/step_00000005/checksums.json
run_ok "--init-from with a changed training option (--aux-coef) and a uint16 shard" \
  "$MOE" train --init-from hf --data text16.bin "${SMALL[@]}" --steps 2 --out run3 --aux-coef 0.05
check "the run's config has the new router_aux_loss_coef" grep -q '"router_aux_loss_coef":.*0\.05' run3/step_00000002/config.json
run_ok "--init-from with flags equal to the HF config" \
  "$MOE" train --init-from hf "${SMALL[@]}" "${MODEL[@]}" --steps 1 --out run4

# a capacity-mode and an OLMoE-style checkpoint (not Mixtral) for the refusals below
run_ok "train a capacity-dispatch run" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 1 --out cap --dispatch capacity
run_ok "train a run without renormalisation" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 1 --out norenorm --renormalize 0

# broken HF directories (copies of the export)
mkdir -p bad_trunc bad_sw bad_tie bad_shape bad_rope
for d in bad_trunc bad_sw bad_tie bad_shape bad_rope; do cp hf/config.json hf/model.safetensors "$d/"; done
truncate -s 100 bad_trunc/model.safetensors
sed -i 's/"sliding_window":[^,]*/"sliding_window": 16/' bad_sw/config.json
sed -i 's/"tie_word_embeddings":[^,]*/"tie_word_embeddings": true/' bad_tie/config.json
sed -i 's/"intermediate_size":[^,]*/"intermediate_size": 64/' bad_shape/config.json
sed -i 's/"rope_theta":[^,]*/"rope_theta": 10000.0, "rope_scaling": {"type": "linear", "factor": 2.0}/' bad_rope/config.json
text_bytes 20000 1 | mkshard 300 >vocab300.bin

# ---- refusals: one message, nothing in the work directory changes
GUARD="$W"
run_fail "--init-from hf: --d-model 64 contradicts its config.json (32)" \
  "$MOE" train --init-from hf "${SMALL[@]}" --steps 1 --out new --d-model 64
run_fail "--n-experts 8 contradicts" "$MOE" train --init-from hf "${SMALL[@]}" --steps 1 --out new --n-experts 8
run_fail "--renormalize 0 contradicts" "$MOE" train --init-from hf "${SMALL[@]}" --steps 1 --out new --renormalize 0
run_fail "--init-from and --preset" "$MOE" train --init-from hf --preset tiny "${SMALL[@]}" --steps 1 --out new
run_fail "--init-from and --resume" "$MOE" train --init-from hf "${SMALL[@]}" --steps 6 --out run2 --resume
run_fail "'run2' already holds a training run" "$MOE" train --init-from hf "${SMALL[@]}" --steps 1 --out run2
run_fail "'run' is not a Hugging Face model directory" "$MOE" train --init-from run "${SMALL[@]}" --steps 1 --out new
run_fail "has token 300; the model's vocab_size is 256" \
  "$MOE" train --init-from hf --data vocab300.bin "${SMALL[@]}" --steps 1 --out new
run_fail "'hf' already exists; pass --force to replace it" "$MOE" export --ckpt run --out hf
run_fail "'run2' exists and is not a Hugging Face model directory" "$MOE" export --ckpt run --out run2 --force
run_fail "--out DIR is required" "$MOE" export --ckpt run
run_fail "is already a Hugging Face model directory" "$MOE" export --ckpt hf --out new
run_fail "is not a Mixtral model (capacity dispatch drops tokens)" "$MOE" export --ckpt cap --out new
run_fail "is not a Mixtral model (top-k weights are not renormalised)" "$MOE" export --ckpt norenorm --out new
run_fail "bad_trunc/model.safetensors' is corrupt: header length" "$MOE" eval --ckpt bad_trunc "${EVAL[@]}"
run_fail "sliding-window attention is not supported" "$MOE" eval --ckpt bad_sw "${EVAL[@]}"
run_fail "tied embeddings are not supported" "$MOE" sample --ckpt bad_tie --prompt hi --tokens 2
run_fail "RoPE scaling is not supported" "$MOE" train --init-from bad_rope "${SMALL[@]}" --steps 1 --out new
run_fail "tensor model.layers.0.block_sparse_moe.experts.0.w1.weight has shape [48,32], config expects [64,32]" \
  "$MOE" eval --ckpt bad_shape "${EVAL[@]}"
run_fail "--dump-grads needs --dump" "$MOE" eval --ckpt hf "${EVAL[@]}" --dump-grads
GUARD=""

# ---- MTP modules (num_nextn_predict_layers): exported under the released DeepSeek-V3 checkpoints' names; a
# directory in their layout (each module's embed_tokens and shared_head.head stored too) loads, its copies
# checked against the main model's
run_ok "train a run with one MTP module" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 2 --out mtp --mtp 1
run_ok "export it" "$MOE" export --ckpt mtp --out hfm
names=$(st_names hfm/model.safetensors | tr '\n' ' ')
miss=""
for n in model.layers.2.enorm.weight model.layers.2.hnorm.weight model.layers.2.eh_proj.weight \
         model.layers.2.shared_head.norm.weight model.layers.2.self_attn.q_proj.weight \
         model.layers.2.block_sparse_moe.experts.3.w2.weight; do
  case " $names " in *" $n "*) ;; *) miss="$miss $n" ;; esac
done
check "the export holds the module as model.layers.2.*${miss:+ (missing:$miss)}" test -z "$miss"
check "config.json: num_nextn_predict_layers 1" grep -q '"num_nextn_predict_layers":[[:space:]]*1' hfm/config.json
run_ok "train --init-from the MTP export" "$MOE" train --init-from hfm "${SMALL[@]}" --steps 1 --out mtp2
check "its step 0 is the export, byte for byte (the module read by name)" \
  cmp -s hfm/model.safetensors mtp2/step_00000000/model.safetensors
grep -q '"mtp_loss"' mtp2/metrics.jsonl && pass "the run from it trains the module (mtp_loss logged)" ||
  fail "the run from the MTP export logs no mtp_loss"
if command -v python3 >/dev/null; then
  # hfr: the export plus model.layers.2.embed_tokens / shared_head.head (copies; hfx: the head's first value
  # changed)
  python3 - hfm/model.safetensors hfr hfx <<'PY'
import json, os, shutil, struct, sys
src, outs = sys.argv[1], sys.argv[2:]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
hdr, data = json.loads(b[8:8 + n]), b[8 + n:]
for k, out in enumerate(outs):
    h, extra = dict(hdr), b""
    for new, old in (("model.layers.2.embed_tokens.weight", "model.embed_tokens.weight"),
                     ("model.layers.2.shared_head.head.weight", "lm_head.weight")):
        a, e = hdr[old]["data_offsets"]
        t = bytearray(data[a:e])
        if k == 1 and new.endswith("head.weight"):
            t[0:4] = struct.pack("<f", struct.unpack("<f", bytes(t[0:4]))[0] + 1.0)
        h[new] = {"dtype": hdr[old]["dtype"], "shape": hdr[old]["shape"],
                  "data_offsets": [len(data) + len(extra), len(data) + len(extra) + len(t)]}
        extra += bytes(t)
    hj = json.dumps(h).encode()
    hj += b" " * (-len(hj) % 8)
    os.makedirs(out, exist_ok=True)
    shutil.copy(os.path.join(os.path.dirname(src), "config.json"), out)
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(hj)) + hj + data + extra)
PY
  run_ok "train --init-from a directory in the released layout" "$MOE" train --init-from hfr "${SMALL[@]}" --steps 1 --out mtp3
  check "its step 0 equals the export's (the copies shared)" \
    cmp -s hfm/model.safetensors mtp3/step_00000000/model.safetensors
  run_fail "model.layers.2.shared_head.head.weight differs from lm_head.weight" \
    "$MOE" train --init-from hfx "${SMALL[@]}" --steps 1 --out new
else
  skip "python3 not installed (the released-layout directory is written by a python3 helper)"
fi

# --force replaces an earlier export (and only that)
run_ok "export --force over an earlier export" "$MOE" export --ckpt run2 --out hf --force
check "now the export of run2" cmp -s hf/model.safetensors run2/step_00000005/model.safetensors
check "run's checkpoint is intact" cmp -s run/step_00000004/model.safetensors bad_sw/model.safetensors
finish
