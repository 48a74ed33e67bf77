#!/usr/bin/env bash
# test_grad_memory.sh — --grad-memory shared (the default with --grad-accum 1 and no --pp: each layer's
# expert gradients written into the memory of the next layer's activations, the last layer's into the
# logits') trains the same model as --grad-memory separate, bit for bit: metrics.jsonl without its timing
# fields and the final checkpoint (model and optimizer) byte-identical. Layouts: one process (dropless;
# capacity with jitter, dropout and attention dropout; --ampipe 2 with evaluations between its steps,
# which move each layer between chunked and unchunked MoE states and so carve its rows again; --recompute
# full; Qwen2-MoE's shared expert and q/k/v biases; OLMoE's QK-norm), and under mpirun dp2 with ZeRO-2 and
# overlapped gradient buckets (the reductions read the shared memory while the backward goes on), tp2+ep2
# with the pipelined exchange (r 2) and ep2+etp2 gathered; and --precision bf16, whose expert gradients are
# written packed in bf16 into the lent memory (options.h train_expert_grads); where the activations lent to a
# layer's expert block all fit in its packed half, the rest of the block is a hole (model_share_grads; on the
# cpu its pages are mapped without access, so any op touching them would end the run): with d_ff 192 a
# block is 3 x 4 x 192 x 32 floats, its hole 36,864 floats (0.14 MiB); at 2 x 16 tokens the next layer's
# activations take ~190 KB with their SwiGLU rows (64 x 3 x 192 floats, 147 KB alone), more than the packed
# half's 144 KB, and ~46 KB without them (--recompute moe), and the head's (32 x 256 logits and two rows of
# d) ~40 KB (test_cost.c check_holes counts them): so 1 of 3 layers without recompute, 3 of 3 with it, 2 of 3
# with --recompute-layers 2 (layer 2 keeps its rows in block 1) (the memory they save is the GPU's: on the cpu
# an untouched page takes none either way). Also: peak memory falls by about the lent gradients (a model
# whose expert gradients are large), and a bad value is refused.
set -u
. "$(dirname "$0")/lib.sh"
mpi_tests
BASE="--steps 4 --quiet --sample-tokens 0 --plots 0 --batch 8 --seq-len 16 --eval-batches 1 --eval-every 2
      --n-layers 3 --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2
      --grad-accum 1 --device ${MOE_TEST_DEVICE:-cpu}"   # (the one-process layouts on the device: MOE_TEST_DEVICE=cuda)

strip() { sed -E 's/"seconds":\[[^]]*\],?//g; s/"(tokens_per_s|tflops|step_time_s|grad_wait_s|bubble_frac)":[^,}]*,?//g' "$1" | grep '"loss"'; }
run() { local d="$1" np="$2"; shift 2; rm -rf "$d"; mkdir -p "$d"
  if [ "$np" = 1 ]; then "$MOE" train --out "$d" $BASE "$@" > "$d/out.txt" 2>&1 < /dev/null
  else $MPI -np "$np" "$MOE" train --out "$d" $BASE "$@" > "$d/out.txt" 2>&1 < /dev/null; fi; }

while IFS='|' read -r np flags label holes; do
  [ "$np" != 1 ] && [ -z "${MPI:-}" -o "${MOE_TEST_DEVICE:-cpu}" != cpu ] && { skip "$label: no mpirun or not cpu"; continue; }
  run "$TMP/sep" "$np" $flags --grad-memory separate || { fail "$label: separate failed"; tail -3 "$TMP/sep/out.txt"; continue; }
  run "$TMP/sh" "$np" $flags || { fail "$label: shared failed"; tail -3 "$TMP/sh/out.txt"; continue; }
  ok=1
  cmp -s <(strip "$TMP/sep/metrics.jsonl") <(strip "$TMP/sh/metrics.jsonl") || { ok=0; fail "$label: metrics differ"; diff <(strip "$TMP/sep/metrics.jsonl") <(strip "$TMP/sh/metrics.jsonl") | head -3; }
  [ "$(strip "$TMP/sh/metrics.jsonl" | wc -l)" = 4 ] || { ok=0; fail "$label: not 4 steps"; }
  for f in model.safetensors optimizer.safetensors; do
    cmp -s "$TMP/sep/step_00000004/$f" "$TMP/sh/step_00000004/$f" || { ok=0; fail "$label: $f differs"; }
  done
  [ $ok = 1 ] && pass "$label: metrics and checkpoint bitwise equal to separate gradient memory"
  if [ -n "$holes" ]; then # the expert blocks that keep only their packed half: the line says how many and their bytes
    got=$(grep -oE "packed half in [0-9]+ of [0-9]+ layers \([0-9.]+ MiB" "$TMP/sh/out.txt")
    if [ "${MOE_TEST_DEVICE:-cpu}" != cpu ]; then skip "$label: the count is the cpu's (float32 rows); here '$got'"
    else [ "$got" = "packed half in $holes MiB" ] && pass "$label: $got" || fail "$label: '$got', expected 'packed half in $holes MiB'"; fi
    MOE_GRAD_HOLES=0 run "$TMP/nh" 1 $flags # (the A/B switch: whole blocks, the same bits)
    cmp -s <(strip "$TMP/nh/metrics.jsonl") <(strip "$TMP/sh/metrics.jsonl") && ! grep -q "packed half" "$TMP/nh/out.txt" &&
      cmp -s "$TMP/nh/step_00000004/model.safetensors" "$TMP/sh/step_00000004/model.safetensors" &&
      pass "$label: MOE_GRAD_HOLES=0 keeps the blocks whole, the same bits" || fail "$label: MOE_GRAD_HOLES=0 differs"
  fi
done <<< "1||one process
1|--dispatch capacity --capacity-factor 0.8 --jitter 0.05 --dropout 0.1 --attn-dropout 0.1|capacity, jitter, dropout
1|--ampipe 2|AMPipe n 2 (evaluations between: unchunked forwards, the rows carved again)
1|--recompute full|--recompute full
1|--family qwen2_moe --qkv-bias 1 --n-shared-experts 1 --shared-d-ff 40 --shared-gate 1|Qwen2-MoE: shared expert, q/k/v biases
1|--family olmoe --qk-norm full --renormalize 0|OLMoE: QK-norm
1|--precision bf16|bf16 with packed expert gradients (written into the lent memory's first half)
1|--precision bf16 --recompute full --family qwen2_moe --n-shared-experts 1 --shared-d-ff 40 --shared-gate 1|bf16 packed, recompute full, a shared expert
1|--precision bf16 --d-ff 192 --batch 2 --recompute moe|bf16 packed, --recompute moe: every block keeps its packed half|3 of 3 layers (0.42
1|--precision bf16 --d-ff 192 --batch 2|bf16 packed: only the last layer's block (the head's) keeps its packed half|1 of 3 layers (0.14
1|--precision bf16 --d-ff 192 --batch 2 --recompute moe --recompute-layers 2|bf16 packed, --recompute-layers 2: the blocks of layer 1's rows and the head's|2 of 3 layers (0.28
2|--zero 2 --overlap 1 --bucket-mb 0.01|dp2, ZeRO-2, overlapped buckets
4|--tp 2 --ep 2 --a2a-overlap 2|tp2+ep2, r 2
4|--ep 2 --etp 2 --expert-mode gathered|ep2+etp2 gathered"

# memory: 4 layers whose expert gradients (3 x 4 x 1024 x 64 floats = 3 MiB each) are smaller than their
# activations (B 8 x T 256): layers 0-2's lent to layers 1-3, layer 3's to the logits and final norm
if [ "${MOE_TEST_DEVICE:-cpu}" != cpu ]; then skip "peak memory: measured as the host's (cpu) only"
elif [ -x /usr/bin/time ]; then
  M="--steps 2 --batch 8 --seq-len 256 --n-layers 4 --d-model 64 --n-heads 4 --n-kv-heads 2 --d-ff 1024
     --n-experts 4 --vocab-size 256 --save-every -1 --eval-every 0"
  for gm in separate shared; do
    /usr/bin/time -f "%M" -o "$TMP/rss_$gm" "$MOE" train --out "$TMP/m_$gm" $BASE $M --grad-memory $gm > "$TMP/m_$gm.txt" 2>&1 ||
      fail "memory run, --grad-memory $gm: $(tail -1 "$TMP/m_$gm.txt")"
  done
  a=$(cat "$TMP/rss_separate"); b=$(cat "$TMP/rss_shared")
  want=$(( 4 * 3 * 4 * 1024 * 64 * 4 / 1024 / 2 ))   # KB: half of the 4 layers' lent gradients (allocator slack)
  [ $((a - b)) -ge "$want" ] && pass "peak memory: separate $a KB, shared $b KB (at least $want KB less)" ||
    fail "peak memory: separate $a KB, shared $b KB (expected at least $want KB less)"
else skip "/usr/bin/time not installed: peak memory not measured"; fi

for bad in both 1 ""; do
  if "$MOE" train --out "$TMP/bad" $BASE --grad-memory "$bad" > "$TMP/bad.txt" 2>&1; then fail "--grad-memory '$bad' accepted"
  elif grep -q -- "--grad-memory" "$TMP/bad.txt" && [ ! -e "$TMP/bad/metrics.jsonl" ]; then pass "--grad-memory '$bad' refused by name, nothing written"
  else fail "--grad-memory '$bad': $(tail -1 "$TMP/bad.txt")"; fi
done
finish
