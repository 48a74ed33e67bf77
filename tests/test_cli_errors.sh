#!/usr/bin/env bash
# test_cli_errors.sh — every bad input to `moe` gives one clear "moe: error:" line naming the
# problem (a key phrase is checked on stderr), a non-zero exit status that is not a crash, and
# leaves the files already there intact: the whole work directory (a prepared run with two
# checkpoints, corrupted copies of it, data and config files, and the current directory itself)
# is hashed before and after every failing command, so a command that deletes, rewrites or even
# creates a file or directory fails its check. Positive controls show that each fixture is valid
# except for the one fault put into it. Runs in ~10 s: the fixture model has ~40K params.
set -u
. "$(dirname "$0")/lib.sh"

small_fixture

# crc32 of a file as 8 hex digits (the CRC in a gzip trailer is the zlib crc32 checksums.json uses)
crc32() { gzip -c <"$1" | tail -c 8 | od -An -tx4 -N4 | tr -d ' \n'; }
# XOR the byte at offset $2 of file $1 with 0xff
flip_byte() {
  local b
  b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "\\$(printf '%03o' $((b ^ 255)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}
# write_shard FILE MAGIC VERSION N_IN_HEADER N_WRITTEN: an llm.c shard (256 int32 header, then uint16
# tokens, all 65 = 'A')
le32() { local v=$(($1 & 0xffffffff)); printf "\\$(printf '%03o' $((v & 255)))\\$(printf '%03o' $((v >> 8 & 255)))\\$(printf '%03o' $((v >> 16 & 255)))\\$(printf '%03o' $((v >> 24 & 255)))"; }
write_shard() {
  { le32 "$2"; le32 "$3"; le32 "$4"; head -c $((253 * 4)) /dev/zero
    local i; for ((i = 0; i < $5; i++)); do printf '\x41\x00'; done; } >"$1"
}

# ---- help
if "$MOE" --help >"$OUT_FILE" 2>"$ERR_FILE" && grep -q 'train' "$OUT_FILE" && grep -q 'sample' "$OUT_FILE" &&
   grep -q 'eval' "$OUT_FILE" && grep -q 'info' "$OUT_FILE"; then pass "moe --help exits 0 and names the commands"
else fail "moe --help"; show_output; fi
if "$MOE" train --help >"$OUT_FILE" 2>"$ERR_FILE"; then
  miss=""
  for f in --steps --batch --seq-len --lr --out --data --resume --force --dispatch --top-k --n-experts --config --preset; do
    grep -q -- "$f" "$OUT_FILE" || miss="$miss $f"
  done
  if [ -z "$miss" ]; then pass "moe train --help exits 0 and lists the key flags"; else fail "moe train --help lacks:$miss"; fi
else fail "moe train --help exit status"; show_output; fi
for c in sample eval info; do
  if "$MOE" $c --help >"$OUT_FILE" 2>"$ERR_FILE" && grep -q -- '--ckpt' "$OUT_FILE"; then pass "moe $c --help"
  else fail "moe $c --help"; show_output; fi
done
for c in train sample eval; do   # --device names every value ops/backend.c backend_by_name accepts
  line=$("$MOE" $c --help | grep -- '--device ')
  miss=""
  for v in cpu cuda cuda-fp32 auto; do echo "$line" | grep -qw -- "$v" || miss="$miss $v"; done
  if [ -z "$miss" ]; then pass "moe $c --help: --device lists cpu, cuda, cuda-fp32, auto"
  else fail "moe $c --help: --device lacks:$miss"; fi
done
# --preset's help names every preset of the table (core/config.c): its list is the one the binary gives
# for an unknown preset, and each name in it is a preset `moe info` takes
known=$("$MOE" info --preset '?' 2>&1 | sed -n "s/^moe: error: unknown preset '?' (known: \(.*\))\$/\1/p")
for c in train info; do
  listed=$("$MOE" $c --help | sed -n 's/^  --preset S *named model size: \(.*\) (default: tiny)$/\1/p')
  bad=""
  for p in ${listed//,/ }; do "$MOE" info --preset "$p" >/dev/null 2>&1 || bad="$bad $p"; done
  if [ -n "$known" ] && [ "$listed" = "$known" ] && [ -z "$bad" ]; then pass "moe $c --help: --preset lists every preset ($known)"
  else fail "moe $c --help: --preset lists '$listed', the table holds '$known'${bad:+; not presets:$bad}"; fi
done
"$MOE" >"$OUT_FILE" 2>"$ERR_FILE"
rc=$?
if [ $rc -ne 0 ] && [ $rc -lt 126 ] && grep -q 'usage' "$ERR_FILE"; then pass "moe without a command: usage on stderr, exit $rc"
else fail "moe without a command (exit $rc)"; show_output; fi

# ---- fixtures
run_ok "fixture: a run with checkpoints at steps 2 and 4" \
  "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 4 --save-every 2 --keep 0 --out run
[ -f run/step_00000004/model.safetensors ] || { fail "fixture run has no step_00000004"; finish; }
run_ok "control: the fixture checkpoint evaluates" "$MOE" eval --ckpt run "${EVAL[@]}"
cp -r run ctl && run_ok "control: --resume with the fixture's own model flags works" \
  "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 5 --out ctl --resume
rm -rf ctl

: >empty.txt
printf 'hello world\n' >short.txt
head -c 4096 /dev/urandom >garbage.dat                               # random bytes (has NULs)
head -c 20000 /dev/urandom | tr -d '\000-\177' | head -c 4096 >highbytes.dat   # no NUL; mostly malformed UTF-8
write_shard good.bin 20240520 1 2000 2000
write_shard badmagic.bin 12345 1 2000 2000
write_shard trunc.bin 20240520 1 2000 1000
run_ok "control: a well-formed .bin shard trains" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 1 --data good.bin --out ctl
rm -rf ctl
echo 'steps = 3   # not JSON {' >bad.json
echo '{"steps": 1, "bogus_key": 3}' >unknown.json
echo '[1, 2]' >array.json
echo '{"d_model": 96.5}' >float.json
echo '{"d_model": 64, "n_heads": 4}' >good.json
if "$MOE" info --config good.json >"$OUT_FILE" 2>"$ERR_FILE" && grep -q 'model: d 64,' "$OUT_FILE"; then
  pass "control: a valid --config file is read"; else fail "control: valid --config"; show_output; fi

CK=step_00000004
cp -r run flip && flip_byte flip/$CK/model.safetensors 5000
cp -r run flipopt && flip_byte flipopt/$CK/optimizer.safetensors 7000
cp -r run trunc && truncate -s 3000 trunc/$CK/model.safetensors
cp -r run badsums && truncate -s 40 badsums/$CK/checksums.json
# config.json says a different intermediate_size; checksums.json is fixed to match, so only the
# tensor shape check can catch it
cp -r run shape
f=shape/$CK/config.json
old_crc=$(crc32 "$f")
old_size=$(wc -c <"$f")
ff=$(grep -o '"intermediate_size":[^,]*' "$f" | grep -o '[0-9]*$')
sed -i "s/\"intermediate_size\":\([[:space:]]*\)$ff,/\"intermediate_size\":\1$((ff + 16)),/" "$f"
new_crc=$(crc32 "$f")
new_size=$(wc -c <"$f")
sed -i -e "s/\"$old_crc\"/\"$new_crc\"/" -e "s/\"config.json\":\([[:space:]]*\)$old_size\b/\"config.json\":\1$new_size/" \
  shape/$CK/checksums.json
if grep -q "\"intermediate_size\":[[:space:]]*$((ff + 16))," "$f" && grep -q "$new_crc" shape/$CK/checksums.json &&
   [ "$new_crc" != "$old_crc" ]; then pass "fixture: config.json edited and checksums.json fixed"
else fail "fixture: editing config.json/checksums.json"; fi
# a run that crashed before its first checkpoint: only metrics.jsonl
mkdir -p metricsonly && head -n 2 run/metrics.jsonl >metricsonly/metrics.jsonl
mkdir -p emptydir

# From here on every failing command must leave all of $W (fixtures, cwd) byte-for-byte unchanged.
GUARD="$W"
T=("$MOE" train "${SMALL[@]}" --out run)    # the output dir is the prepared run: nothing may touch it

# ---- command line
run_fail "unknown option '--bogus'" "${T[@]}" --bogus
run_fail "unknown option '--stepz'" "${T[@]}" --stepz 3
run_fail "unknown command 'frobnicate'" "$MOE" frobnicate --steps 3
run_fail "does not apply" "$MOE" sample --ckpt run --steps 3
run_fail "unknown preset 'nope'" "${T[@]}" --preset nope
run_fail "unknown preset 'nope'" "$MOE" info --preset nope
run_fail "option '--out' needs a value" "$MOE" train "${SMALL[@]}" --out
run_fail "option '--steps' needs a value" "${T[@]}" --steps
run_fail "option '--preset' needs a value" "${T[@]}" --preset
run_fail "option '--config' needs a value" "${T[@]}" --config
run_fail "'maybe' is not true/false" "${T[@]}" --quiet=maybe
run_fail "'abc' is not an integer" "${T[@]}" --steps abc
run_fail "'1.5' is not an integer" "${T[@]}" --steps 1.5
run_fail "'' is not an integer" "${T[@]}" --steps=
run_fail "'fast' is not a number" "${T[@]}" --lr fast
run_fail "'-1' is not a non-negative integer" "${T[@]}" --seed -1
run_fail "--steps must be >= 1 (got -5)" "${T[@]}" --steps -5
run_fail "--steps must be >= 1 (got 0)" "${T[@]}" --steps 0
run_fail "top_k must be in 1..n_experts=4 (got 5)" "${T[@]}" --top-k 5
run_fail "top_k must be in 1..n_experts=2 (got 3)" "${T[@]}" --n-experts 2 --top-k 3
run_fail "d_model=90 is not divisible by n_heads=4" "${T[@]}" --d-model 90
run_fail "n_heads=4 is not divisible by n_kv_heads=3" "${T[@]}" --n-heads 4 --n-kv-heads 3
run_fail "capacity_factor must be > 0 (got 0)" "${T[@]}" --dispatch capacity --capacity-factor 0
run_fail "capacity_factor must be > 0 (got -1)" "${T[@]}" --dispatch capacity --capacity-factor -1
run_fail "'foo' is not one of dropless, capacity" "${T[@]}" --dispatch foo
run_fail "--precision: 'fp16' is not one of mixed, bf16" "${T[@]}" --precision fp16
run_fail "--bf16-rounding: 'up' is not one of stochastic, nearest" "${T[@]}" --precision bf16 --bf16-rounding up
run_fail "--bf16-rounding rounds the weights of --precision bf16" "${T[@]}" --bf16-rounding nearest
run_fail "--bf16-grads must be 0 or 1 (got 2)" "${T[@]}" --precision bf16 --bf16-grads 2
run_fail "--bf16-grads sets the expert gradients of --precision bf16 and fp8-bf16" "${T[@]}" --bf16-grads 0
run_fail "--seq-len 300 exceeds the model's max_seq_len 256" "${T[@]}" --seq-len 300
run_fail "--seq-len 32 exceeds the model's max_seq_len 16" "${T[@]}" --max-seq-len 16 --seq-len 32
run_fail "--batch 6 is not divisible by --grad-accum 4" "${T[@]}" --batch 6 --grad-accum 4
run_fail "--resume and --force contradict" "${T[@]}" --resume --force

# ---- data files
run_fail "cannot open text file 'nope.txt'" "${T[@]}" --data nope.txt
run_fail "cannot open shard file 'nope.bin'" "${T[@]}" --data nope.bin
run_fail "no file matches the shard pattern 'nope_*.bin'" "${T[@]}" --data 'nope_*.bin'
run_fail "'empty.txt' is empty (0 bytes)" "${T[@]}" --data empty.txt
run_fail "'garbage.dat' looks binary" "${T[@]}" --data garbage.dat
run_fail "short.txt has 12 tokens, too few for T=16" "${T[@]}" --data short.txt
run_fail "'emptydir' is a directory, not a text file" "${T[@]}" --data emptydir
run_fail "'highbytes.dat' looks binary" "${T[@]}" --data highbytes.dat
run_fail "shard 'badmagic.bin' has wrong magic 12345" "${T[@]}" --data badmagic.bin
run_fail "shard 'trunc.bin' is truncated" "${T[@]}" --data trunc.bin
run_fail "'garbage.dat' looks binary" "$MOE" eval --ckpt run "${EVAL[@]}" --data garbage.dat

# ---- config files
run_fail "--config bad.json: not a JSON object" "${T[@]}" --config bad.json
run_fail "unknown key \"bogus_key\"" "${T[@]}" --config unknown.json
run_fail "cannot read 'nope.json'" "${T[@]}" --config nope.json
run_fail "--config array.json: not a JSON object" "${T[@]}" --config array.json
run_fail "\"d_model\" must be an integer (got 96.5)" "${T[@]}" --config float.json
run_fail "--config bad.json: not a JSON object" "$MOE" info --config bad.json

# ---- checkpoints
run_fail "model.safetensors is corrupt (crc32 mismatch)" "$MOE" eval --ckpt flip "${EVAL[@]}"
run_fail "model.safetensors is corrupt (crc32 mismatch)" "$MOE" sample --ckpt flip --tokens 5
run_fail "model.safetensors is corrupt (crc32 mismatch)" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 6 --out flip --resume
run_fail "optimizer.safetensors is corrupt (crc32 mismatch)" "$MOE" train "${SMALL[@]}" --steps 6 --out flipopt --resume
run_fail "model.safetensors is corrupt (3000 bytes" "$MOE" eval --ckpt trunc "${EVAL[@]}"
run_fail "model.safetensors is corrupt (3000 bytes" "$MOE" train "${SMALL[@]}" --steps 6 --out trunc --resume
run_fail "checksums.json is corrupt" "$MOE" eval --ckpt badsums/$CK "${EVAL[@]}"
run_fail "has shape [48,32], config expects [64,32]" "$MOE" eval --ckpt shape "${EVAL[@]}"
run_fail "config expects" "$MOE" train "${SMALL[@]}" --steps 6 --out shape --resume
run_fail "config expects" "$MOE" sample --ckpt shape --tokens 5
run_fail "'nope' is not a directory" "$MOE" eval --ckpt nope "${EVAL[@]}"
run_fail "no complete checkpoint in 'emptydir'" "$MOE" eval --ckpt emptydir "${EVAL[@]}"
run_fail "--ckpt is required" "$MOE" sample --prompt hi
run_fail "--ckpt is required" "$MOE" eval

# ---- output directories
run_fail "'run' already holds a training run" "${T[@]}" "${MODEL[@]}" --steps 8
run_fail "'metricsonly' already holds a training run" "$MOE" train "${SMALL[@]}" --steps 2 --out metricsonly
run_fail "--resume: no complete checkpoint in 'emptydir'" "$MOE" train "${SMALL[@]}" --steps 2 --out emptydir --resume
run_fail "--resume: no complete checkpoint in 'nowhere'" "$MOE" train "${SMALL[@]}" --steps 2 --out nowhere --resume
run_fail "differ from the checkpoint's config" "${T[@]}" "${MODEL[@]}" --d-model 64 --steps 8 --resume
run_fail "differ from the checkpoint's config" "${T[@]}" "${MODEL[@]}" --aux-coef 0.05 --steps 8 --resume
run_fail "differ from the checkpoint's config" "${T[@]}" --preset tiny --steps 8 --resume
run_fail "trained with --seed 1, not 7" "${T[@]}" --seed 7 --steps 8 --resume
# A model that cannot hold the data's bytes is a bad input like a bad data file: it must be refused
# before --force deletes the run it was asked to replace.
run_fail "vocab_size 100" "${T[@]}" --vocab-size 100 --force
# So is a bad value of an environment switch the trainer reads (MOE_BF16_SHADOW: 0 or 1).
run_fail "MOE_BF16_SHADOW must be 0" env MOE_BF16_SHADOW=yes "${T[@]}" --force
run_fail "MOE_GROUPED_GEMM must be auto" env MOE_GROUPED_GEMM=cutlass "${T[@]}" --force
run_fail "MOE_ATTN_DS_MB must be a whole number" env MOE_ATTN_DS_MB=lots "${T[@]}" --force
run_fail "MOE_ATTN_DS_MB must be a whole number" env MOE_ATTN_DS_MB=-1 "$MOE" info --preset peers-ref
# The cuda memory line counts the backend's two scratch buffers apart (cost.c cuda_gemm_scratch,
# cuda_workspace_bytes), peers-ref at batch 4 x 2048 (N = 8192 tokens, d 2048, vocab 32000, 16 heads of 128):
#  - the bf16 GEMM operands (cuda_gemm.cu bf16_scratch_v): N x 2048 bf16 values = 32.00 MiB, the largest
#    need: the LM head's input (forward and backward; its output gradient, N x 32000, is the cross-entropy's
#    bf16 in place: 32000 is a multiple of 8), the o projection's output gradient, the q/k/v projections'
#    largest (q's, 2048 wide); the router's (8 experts) run in float32 without it;
#  - the workspace (cuda_workspace): the attention backward's D (4 x 16 x 2048 floats: 0.5 MiB), the bf16
#    dout (N x 2048: 32 MiB) and the dS scratch (ops.h attention_ds_bytes: 32 query tiles of 64 rows, tile m
#    reading m + 1 key tiles of 64 x 64 bf16, so 4 * 16 * 528 * 8 KiB = 264 MiB): 296.50 MiB; under a cap
#    below 264 the scratch holds one pass over kv heads of one sequence (8 kv heads of 2 query heads: a
#    pair 2 * 528 * 8 KiB = 8.25 MiB): all 8 heads up to a cap of 66 (98.50 MiB), at a cap of 18 two
#    (49.00 MiB); below two pairs over the most tiles a row range of 2048 can take (2 * 32 * 35 / 2 * 8 KiB
#    = 8.75 MiB each: a cap of 17), two kv heads over the key tiles that fit (ops.h attention_ds_range_end:
#    the first range of w key tiles holds 32 w - w (w - 1) / 2 tiles a query head, of 4): at 17 all 32 (528
#    tiles, 16.5 MiB: 49.00 MiB); at 10 w 12 (318 tiles; w 13: 338 > 320), 4 * 318 * 8 KiB = 9.9375 MiB, and
#    at 1 one key tile (32 tiles, 1 MiB), but those ranges are of 2 w dk/dv blocks, under the 256 a range
#    must hold where the call holds 4 x 8 x 32 = 1024 (backend.c ATT_DS_MIN_BLOCKS): dS again, as with
#    MOE_ATTN_DS_MB=0: no dS, 32.50 MiB, still above the router's (8 x 2048 floats x 64 blocks of 128 rows: 4
#    MiB) and the norms' (2048 doubles x 128 blocks of 64 rows: 2 MiB) partial sums. At batch 1 (256 blocks
#    in the call: the rule does not apply) the same ranges are kept: the bf16 GEMM operands 2048 x 2048 bf16
#    = 8.00 MiB, the workspace D 128 KiB + dout 8 MiB + at 10 9.9375 MiB = 18.06 MiB, at
#    1 1 MiB: 9.12 MiB; no dS: 8.12 MiB.
for cap in "" 264 263 66 18 17 10 1 0 b10 b1 b0; do
  want="328.50 MiB (bf16 GEMM operands 32.00 MiB, workspace 296.50 MiB)"
  case "$cap" in
    263|66) want="130.50 MiB (bf16 GEMM operands 32.00 MiB, workspace 98.50 MiB)" ;;
    18|17) want="81.00 MiB (bf16 GEMM operands 32.00 MiB, workspace 49.00 MiB)" ;;
    10|1|0) want="64.50 MiB (bf16 GEMM operands 32.00 MiB, workspace 32.50 MiB)" ;;
    b10) want="26.06 MiB (bf16 GEMM operands 8.00 MiB, workspace 18.06 MiB)" ;;
    b1) want="17.12 MiB (bf16 GEMM operands 8.00 MiB, workspace 9.12 MiB)" ;;
    b0) want="16.12 MiB (bf16 GEMM operands 8.00 MiB, workspace 8.12 MiB)" ;;
  esac
  batch=4
  [[ $cap == b* ]] && batch=1 && cap=${cap#b}
  if env MOE_ATTN_DS_MB=$cap "$MOE" info --preset peers-ref --batch $batch --seq-len 2048 >"$OUT_FILE" 2>"$ERR_FILE" &&
     grep -qF "+ scratch $want" "$OUT_FILE"; then pass "moe info: the cuda scratch, batch $batch, MOE_ATTN_DS_MB='$cap'"
  else fail "moe info: the cuda scratch, batch $batch, MOE_ATTN_DS_MB='$cap' (want $want)"; show_output; fi
done
# Latent attention's workspace (cost.c mla_workspace: cuda_attention_mla.cu's backward at q head width 192,
# value width 128), DeepSeek-V3 at batch 1 x 4096 (128 heads, one kv head each): D 128 x 4096 floats = 2 MiB,
# dout's rows in bf16 4096 x 128 x 192 x 2 B = 192 MiB, and the dS scratch: a (sequence, head) pair holds
# 64 x 65 / 2 tiles of 64 x 64 bf16 = 16.25 MiB, at most 64 x 67 / 2 tiles (17.5625 MiB) are counted for the
# fit, within min(MOE_ATTN_DS_MB 1024 MiB, 8 B a q element = 768 MiB): 43 heads, so 3 passes of 43 heads,
# 698.75 MiB: 892.75 MiB in all (the float32 fallback's 16 B a q element, 1.50 GiB, counted before); with
# MOE_ATTN_DS_MB=0 no scratch: 194.00 MiB.
for cap in "" 0; do
  want="workspace 892.75 MiB)"; [ "$cap" = 0 ] && want="workspace 194.00 MiB)"
  if env MOE_ATTN_DS_MB=$cap "$MOE" info --preset deepseek-v3 --batch 1 --seq-len 4096 >"$OUT_FILE" 2>"$ERR_FILE" &&
     grep -qF "$want" "$OUT_FILE"; then pass "moe info: latent attention's workspace, MOE_ATTN_DS_MB='$cap'"
  else fail "moe info: latent attention's workspace, MOE_ATTN_DS_MB='$cap' (want $want)"; show_output; fi
done
# The lean MoE backward scratch (moe.h moe_scratch_init) on the cuda figure, the same model (16384 routed
# rows, d 2048, f 5632, no shared expert, TP 1): the experts' input gradient dxg in the layer's yg, 16384 x
# 2048 floats = 128 MiB; the TP slice's dx (only where TP > 1) and the forward's MoE output (in dxn), 8192 x
# 2048 floats = 64 MiB each; dh1 and dh3 over h1 and h3, 2 x 16384 x 5632 bf16 = 352 MiB, but under fp8 (the
# FP8 table's fused kernels keep their own buffers): 608.00 MiB (bf16), 256.00 MiB (fp8), none with
# MOE_ACT_MEM_OLD=1. With it, layer 0's activations also live in the embedding's gradient (32000 x 2048
# floats = 250 MiB, less than the layer's 1040.81 MiB below): lent 15 layers' 1040.81 MiB each (below their
# expert gradients' 3 x 8 x 5632 x 2048 floats = 1056 MiB), the logits' 1056 MiB (their 8192 x (2 x 2048 +
# 32000) floats are more) + 250 MiB = 16.52 GiB; 16.28 GiB with MOE_ACT_MEM_OLD=1 (no 250 MiB).
# The layer (cost.c acts_layer, model_state.c slot_alloc), float32 values, N = 8192: the four rows of d a
# token (res_in, xn1, x_mid, xn2) and the two rstd, q, k, v, the attention output (2 x 2048 + 2 x 1024) and
# lse (4 x 16 x 2048): N (4 x 2048 + 6144 + 2) + 131,072; the router's logits and the rows sent (N (8 + 2 x
# 2048)); the 16384 routed rows' yg and h1, h3, act (2048 + 3 x 5632): 461,586,432 floats = 1,846,345,728 B.
# Less the bf16 halves (cost.c acts_hid_saved), 2 of the 4 bytes of h1, h3, act (16384 x 16896) and of xn1,
# q, k, v, out, xs (8192 x (2048 + 2048 + 2 x 1024 + 2048) + 16384 x 2048): 754,974,720 B; 1,091,371,008 B =
# 1040.81 MiB. The MOE_ACT_MEM_OLD=1 total, bytes: params + grads + bf16 moments 12 x 4,761,913,344 =
# 57,142,960,128; activations 16 x 1,846,345,728 + the head's 8192 x 36096 x 4 = 1,182,793,728 + the
# backward's scratch (cost.c acts_scratch: 8192 x 12288 model rows + 8192 x (2048 + 8 + 2) + 16384 x 2 x 2048
# MoE rows as floats, 2 x 16384 x 5632 dh1, dh3: 1,476,722,688) = 32,201,048,064 (29.99 GiB); less the bf16
# rows 16 x 754,974,720 + 436,207,616 (the scratch's dy and dh halves) = 12,515,803,136, plus the bf16
# weights 2 x 4,761,913,344, plus the scratch 344,457,216 (328.50 MiB above), less the lent 15 x 1,091,371,008
# + 1,107,296,256 = 17,477,861,376 and the float32 weights in the copy alone 9049 x 2 MiB (below):
# 50,241,499,136 B = 46.79 GiB; the lean figure 608 + 250 MiB below: 49,341,820,928 B = 45.95 GiB. (Before:
# 5 rows of d a token a layer counted, 1 GiB more activations; the lent layers at 1056 MiB each: 48.30 /
# 47.46 GiB; the head's dlogits in the scratch, 500 MiB more: 47.52 / 46.69 GiB; the embedding's float32
# copy, 250 MiB more: 47.04 / 46.20 GiB.)
for p in bf16:608.00 fp8:256.00 old:; do
  prec=${p%%:*} want=${p#*:} ev= ok=0
  [ $prec = old ] && prec=bf16 ev=1
  if env MOE_ACT_MEM_OLD=$ev "$MOE" info --preset peers-ref --batch 4 --seq-len 2048 --precision $prec \
       >"$OUT_FILE" 2>"$ERR_FILE"; then
    if [ -n "$want" ]; then
      grep -qF "workspace 296.50 MiB) - lean backward scratch $want MiB, 16.52 GiB" "$OUT_FILE" && ok=1
      [ $prec = bf16 ] && ! grep -qF "): 45.95 GiB plus" "$OUT_FILE" && ok=0
    else
      ! grep -q "lean backward" "$OUT_FILE" && grep -qF "16.28 GiB of the activations in the gradients' memory): 46.79 GiB plus" "$OUT_FILE" && ok=1
    fi
  fi
  if [ $ok = 1 ]; then pass "moe info: the lean MoE scratch, $p"
  else fail "moe info: the lean MoE scratch, $p (want '$want')"; show_output; fi
done
run_fail "MOE_ACT_MEM_OLD must be 0" env MOE_ACT_MEM_OLD=yes "${T[@]}" --force
# --precision fp8 adds the FP8 table's two scratch buffers (cuda_fp8_ops.cu), the same model: 16384 routed
# rows over 8 experts (2048 each: padded to 128, P = 16384 columns), d 2048, f 5632:
#  - float32 rows inside a fused op: h1 and h3 of the up projection, 2 x 4 x 16384 x 5632 = 704 MiB (the
#    backward's dact, half that, fits);
#  - the operands' codes (1 byte) and float32 scales of one op, grown to 1.25 x where a need exceeds it:
#    up forward 32 MiB rows + 1 MiB tile scales + 88 MiB weights + 22,528 B block scales = 126,900,224 B; down
#    forward 88 + 2.75 MiB + 88 MiB + 22,528 B = 187,455,488 B; down backward (dout's tiles 32 + 1 MiB, the
#    weights transposed 88 MiB + 22,528 B, dout^T 32 + 1 MiB and act^T 88 + 2.75 MiB over P) 256,661,504 B;
#    up backward 317,216,768 B, below 1.25 x 256,661,504 = 320,826,880 B, which the buffer grew to;
#  704 MiB + 320,826,880 B = 1009.96 MiB (the H200 measured 86,375 - 85,359 = 1016 MiB more than mixed, before
#  the table kept its weights' codes);
# and the expert weights' codes it keeps between ops (cuda_fp8_wcache.cu; every weight starts at a multiple of
# 8 elements here), each weight (8, O, K) with 128 x 128 blocks of 4-byte scales:
#  - per layer, w1, w3 (O 5632, K 2048) and w2 (O 2048, K 5632) each its transposed layout: 8 x 5632 x 2048 =
#    92,274,688 B of codes + 8 x 44 x 16 x 4 = 22,528 B of scales + 256 B (its non-finite count) =
#    92,297,472 B; 3 x 92,297,472 = 276,892,416 B a layer, x 16 layers = 4,430,278,656 B;
#  - once, the forward layouts' two slots, each the largest of its kind: the single weights' (w2's forward
#    layout, 92,274,688 + 22,528 = 92,297,216 B) and the pairs' for the fused up projection (5632 % 64 = 0,
#    2048 % 16 = 0: 2 x 92,274,688 B of codes + a scale per row and 128-wide K-tile, 8 x 2 x 5632 x 16 x 4 =
#    5,767,168 B: 190,316,544 B);
#  4,430,278,656 + 92,297,216 + 190,316,544 = 4,712,892,416 B (4.39 GiB).
#  In all 1,059,024,384 + 4,712,892,416 = 5,771,916,800 B (5.38 GiB).
if "$MOE" info --preset peers-ref --batch 4 --seq-len 2048 --precision fp8 >"$OUT_FILE" 2>"$ERR_FILE" &&
   grep -qF "+ fp8 operands 5.38 GiB (expert weight codes kept 4.39 GiB, operand scratch 1009.96 MiB) + scratch 328.50 MiB" "$OUT_FILE"; then pass "moe info --precision fp8: the FP8 table's kept codes and scratch"
else fail "moe info --precision fp8: the FP8 table's kept codes and scratch (want 5.38 GiB: 4.39 GiB + 1009.96 MiB)"; show_output; fi
# --precision bf16 in one process keeps the weights only bf16 GEMMs read, and the embedding table (its gather
# reads the copy), in the bf16 copy alone (ops.h alloc_bf16_params, params.h params_bf16_ranges): the float32
# buffer's whole 2 MiB pages inside each range are not there. Floats: embedding 32000 x 2048; a layer 302,010,368 = two norms 2 x 2048, q and o 2048^2, k and v
# 1024 x 2048, router 8 x 2048, experts 8 x 3 x 5632 x 2048 (bytes 1,208,041,472: 576 pages and 80 KiB).
# q..o of layer l are one range of 48 MiB (24 pages) from byte 4 x (65,538,048 + l x 302,010,368), 8 KiB +
# l x 80 KiB into a page (never 0 for l < 16): 23 whole pages; the expert block, 1,107,296,256 bytes = 528
# pages, from byte 312,557,568 + l x 1,208,041,472, 80 KiB + l x 80 KiB into a page: 527. The LM head, 125
# pages from byte 19,590,815,744 (1,318,912 into a page): 124. The embedding, 262,144,000 bytes from byte 0:
# 125 whole pages. 16 x (23 + 527) + 124 + 125 = 9049 pages = 17.67 GiB.
# Not in mixed precision, and not across ranks (a collective writes the float32 buffer there).
if "$MOE" info --preset peers-ref --batch 4 --seq-len 2048 --precision bf16 >"$OUT_FILE" 2>"$ERR_FILE" &&
   grep -q "bf16 weights 8.87 GiB - float32 weights in the bf16 copy alone 17.67 GiB + " "$OUT_FILE"; then
  pass "moe info: --precision bf16 without the GEMM weights' float32 copies"
else fail "moe info: --precision bf16 without the GEMM weights' float32 copies (want 17.67 GiB)"; show_output; fi
if "$MOE" info --preset peers-ref --batch 4 --seq-len 2048 >"$OUT_FILE" 2>"$ERR_FILE" &&
   ! grep -q "float32 weights in the bf16 copy alone" "$OUT_FILE" &&
   "$MOE" info --preset peers-ref --batch 4 --seq-len 2048 --precision bf16 --ep 2 >"$OUT_FILE" 2>"$ERR_FILE" &&
   ! grep -q "float32 weights in the bf16 copy alone" "$OUT_FILE"; then
  pass "moe info: the float32 weights kept in mixed precision and across ranks"
else fail "moe info: the float32 weights kept in mixed precision and across ranks"; show_output; fi

finish
