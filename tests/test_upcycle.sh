#!/usr/bin/env bash
# test_upcycle.sh — `moe train --init-from DENSE --upcycle E`: a dense LlamaForCausalLM directory's every
# MLP copied into E experts (routers initialised as new, top-k renormalised), so that at step 0 the MoE
# model computes the dense one. The dense reference is independent of the upcycling code: a Mixtral
# model with one expert and top-1 routing (softmax over one expert is exactly 1: a dense SwiGLU MLP),
# exported, and the same weights rewritten as a Llama directory (tests/mixtral1_to_llama.py). The step-1
# training loss (the loss before the first update) of the upcycled model equals the dense model's on
# the same batch to 1e-6 relative (the k combine weights sum to 1 up to rounding), for E 4 top-2 and
# E 8 top-1. Bad input: --upcycle without --init-from, on a non-dense architecture, E < 2, top-k > E,
# --n-experts other than E, a dense model with biases: one message each, nothing written.
set -u
. "$(dirname "$0")/lib.sh"
command -v python3 > /dev/null || { skip "python3 not installed (the dense directory is written by a python3 helper)"; finish; }
B="--quiet --sample-tokens 0 --plots 0 --batch 8 --seq-len 32 --eval-batches 1 --eval-every 0 --device cpu"
M="--n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48"
"$MOE" train --out "$TMP/r1" $B $M --n-experts 1 --top-k 1 --steps 5 --lr 1e-2 --warmup 1 > /dev/null 2>&1 || fail "the 1-expert run"
"$MOE" export --ckpt "$TMP/r1" --out "$TMP/mix1" > /dev/null 2>&1 || fail "export of the 1-expert run"
python3 "$(dirname "$0")/mixtral1_to_llama.py" "$TMP/mix1" "$TMP/llama" || fail "writing the dense directory"
S="--steps 1 --lr 1e-30 --warmup 0"
"$MOE" train --init-from "$TMP/mix1" --out "$TMP/dense" $B $S > /dev/null 2>&1 || fail "the dense reference run"
ref=$(field loss "$TMP/dense/metrics.jsonl" | head -1)
for ek in "4 2" "8 1"; do
  set -- $ek
  rm -rf "$TMP/up"
  if "$MOE" train --init-from "$TMP/llama" --upcycle $1 --top-k $2 --out "$TMP/up" $B $S > "$TMP/up.txt" 2>&1; then
    got=$(field loss "$TMP/up/metrics.jsonl" | head -1)
    d=$(awk -v a="$ref" -v b="$got" 'BEGIN { d = a - b; if (d < 0) d = -d; printf "%.3e", d / a }')
    fcmp "$d" "<=" 1e-6 && pass "upcycled to $1 experts top-$2: step-1 loss $got, the dense model's $ref ($d relative)" ||
      fail "upcycled to $1 experts top-$2: loss $got vs the dense model's $ref ($d relative)"
    grep -Eq '"num_local_experts":[[:space:]]*'"$1," "$TMP/up/step_00000001/config.json" || fail "upcycled run's config does not record $1 experts"
  else fail "upcycle $1/$2 failed: $(tail -1 "$TMP/up.txt")"; fi
done
# bad input
bad() {   # bad LABEL PATTERN ARGS...
  local label="$1" pat="$2"; shift 2
  rm -rf "$TMP/badrun"
  if "$MOE" train --out "$TMP/badrun" $B $S "$@" > "$TMP/bad.txt" 2>&1; then fail "$label accepted"
  elif grep -q -- "$pat" "$TMP/bad.txt" && [ ! -e "$TMP/badrun" ]; then pass "$label: refused ($(tail -1 "$TMP/bad.txt" | cut -c1-90)...), nothing written"
  else fail "$label: $(tail -1 "$TMP/bad.txt")"; fi
}
bad "--upcycle without --init-from" "--init-from" $M --upcycle 4
bad "--upcycle of a Mixtral directory" "MixtralForCausalLM" --init-from "$TMP/mix1" --upcycle 4
bad "--upcycle 1" "--upcycle" --init-from "$TMP/llama" --upcycle 1
bad "--upcycle 4 --top-k 5" "top-k" --init-from "$TMP/llama" --upcycle 4 --top-k 5
# (issue 42: --n-experts was overwritten by --upcycle's E without a word)
bad "--upcycle 4 --n-experts 8" "--upcycle 4 and --n-experts 8: --upcycle gives the experts per layer" \
  --init-from "$TMP/llama" --upcycle 4 --n-experts 8
cp -r "$TMP/llama" "$TMP/llama_b"
sed -i 's/"attention_bias": false/"attention_bias": true/' "$TMP/llama_b/config.json"
bad "--upcycle of a model with attention biases" "attention_bias" --init-from "$TMP/llama_b" --upcycle 4
finish
