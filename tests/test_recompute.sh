#!/usr/bin/env bash
# test_recompute.sh — activation recomputation (--recompute attn|moe|full) trains the same model as
# keeping the activations, bit for bit: the backward computes them again from the kept inputs with the
# same kernels. Each mode against --recompute none on the same layout: metrics.jsonl without its timing
# fields and the final checkpoint (model and optimizer) byte-identical. Layouts: one process (dropless,
# and capacity with jitter), AMPipe n 2, --precision bf16 with one micro-batch (packed expert gradients), and under mpirun tp2+ep2 with the pipelined exchange (r 2),
# tp2+ep2 with AMPipe n 2 (a chunk's moe_start grows the shared rows between the previous chunk's start and
# its GEMMs: the chunks took their pointers at the start until 2026-12-02, a use after free that aborted
# this run), pp2 (several live micro-batches share the recomputed buffers) and ep2+etp2 in the gathered
# expert mode; --recompute-layers 1 (the first layer recomputes, the other keeps its rows) on one process,
# with AMPipe and under pp2 (stage 0 recomputes, stage 1 keeps). Also: peak memory falls (a model whose
# expert rows dominate), with --recompute-layers 2 of 4 between none and all, and bad values are refused.
set -u
. "$(dirname "$0")/lib.sh"
mpi_tests
BASE="--steps 3 --quiet --sample-tokens 0 --plots 0 --batch 8 --seq-len 16 --eval-batches 1 --eval-every 0
      --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2
      --grad-accum 2 --device cpu"

strip() { sed -E 's/"pp_idle_s":\[[^]]*\],?//; s/"(tokens_per_s|tflops|step_time_s|grad_wait_s|bubble_frac)":[^,}]*,?//g' "$1" | grep '"loss"'; }
run() { local d="$1" np="$2"; shift 2; rm -rf "$d"; mkdir -p "$d"
  if [ "$np" = 1 ]; then "$MOE" train --out "$d" $BASE "$@" > "$d/out.txt" 2>&1 < /dev/null
  else $MPI -np "$np" "$MOE" train --out "$d" $BASE "$@" > "$d/out.txt" 2>&1 < /dev/null; fi; }
same() {   # same REF RUN LABEL
  local ok=1 f
  cmp -s <(strip "$1/metrics.jsonl") <(strip "$2/metrics.jsonl") || { ok=0; fail "$3: metrics differ"; diff <(strip "$1/metrics.jsonl") <(strip "$2/metrics.jsonl") | head -3; }
  [ "$(strip "$2/metrics.jsonl" | wc -l)" -gt 0 ] || { ok=0; fail "$3: no steps"; }
  for f in model.safetensors optimizer.safetensors; do
    cmp -s "$1/step_00000003/$f" "$2/step_00000003/$f" || { ok=0; fail "$3: $f differs"; }
  done
  [ $ok = 1 ] && pass "$3: metrics and checkpoint bitwise equal to keeping the activations"
}

while IFS='|' read -r np flags label; do
  run "$TMP/none" "$np" $flags || { fail "$label: --recompute none failed"; tail -3 "$TMP/none/out.txt"; continue; }
  for mode in attn moe full; do
    [ "$mode" = attn ] && [ "$np" != 1 ] && continue   # (attn alone: on one process; full covers it on meshes)
    if run "$TMP/rc" "$np" $flags --recompute $mode; then same "$TMP/none" "$TMP/rc" "$label, --recompute $mode"
    else fail "$label, --recompute $mode: failed"; tail -3 "$TMP/rc/out.txt"; fi
  done
  case "$label" in *"one process"|*"AMPipe n 2"|pp2*) # the first layer alone
    if run "$TMP/rc" "$np" $flags --recompute full --recompute-layers 1; then same "$TMP/none" "$TMP/rc" "$label, --recompute full --recompute-layers 1"
    else fail "$label, --recompute-layers 1: failed"; tail -3 "$TMP/rc/out.txt"; fi ;;
  esac
done <<< "1||one process
1|--dispatch capacity --capacity-factor 0.8 --jitter 0.05|one process, capacity with jitter
1|--ampipe 2|one process, AMPipe n 2
1|--precision bf16 --grad-accum 1|one process, bf16 with packed expert gradients
4|--tp 2 --ep 2 --a2a-overlap 2|tp2+ep2, r 2
4|--tp 2 --ep 2 --ampipe 2|tp2+ep2, AMPipe n 2
2|--pp 2 --grad-accum 4|pp2 (1f1b, 4 micro-batches)
4|--ep 2 --etp 2 --expert-mode gathered|ep2+etp2 gathered"

# memory: the experts' rows of every layer but one are not kept (4 layers, f 1024, B 8 x T 256)
if [ -x /usr/bin/time ]; then
  M="--steps 2 --batch 8 --seq-len 256 --grad-accum 1 --n-layers 4 --d-model 64 --n-heads 4 --n-kv-heads 2 --d-ff 1024
     --n-experts 4 --vocab-size 256 --save-every -1"
  for mode in none moe full; do /usr/bin/time -f "%M" -o "$TMP/rss_$mode" "$MOE" train --out "$TMP/m_$mode" $BASE $M --recompute $mode > /dev/null 2>&1; done
  /usr/bin/time -f "%M" -o "$TMP/rss_two" "$MOE" train --out "$TMP/m_two" $BASE $M --recompute moe --recompute-layers 2 > /dev/null 2>&1
  a=$(cat "$TMP/rss_none"); b=$(cat "$TMP/rss_moe"); c=$(cat "$TMP/rss_full"); h=$(cat "$TMP/rss_two")
  # the experts' SwiGLU rows: 3 x f x 4 bytes per routed token and layer, 3 of the 4 layers dropped
  want=$(( 3 * 1024 * 4 * 8 * 256 * 2 * 3 / 1024 / 2 ))   # KB, half of what is dropped (allocator slack)
  [ $((a - b)) -ge "$want" ] && [ "$c" -le "$b" ] && pass "peak memory: none $a KB, moe $b KB, full $c KB (moe saves at least $want KB)" ||
    fail "peak memory: none $a KB, moe $b KB, full $c KB (expected moe to save at least $want KB, full <= moe)"
  # --recompute-layers 2: 1 of the 4 layers' rows dropped (2 recompute, one shared copy): a third of moe's saving
  want1=$(( want / 3 ))
  [ $((a - h)) -ge "$want1" ] && [ "$h" -gt "$b" ] && pass "peak memory, --recompute moe --recompute-layers 2: $h KB, between moe's $b and none's $a (saves at least $want1 KB)" ||
    fail "peak memory, --recompute-layers 2: $h KB (none $a, moe $b: expected at least $want1 KB less than none, more than moe)"
else skip "/usr/bin/time not installed: peak memory not measured"; fi

for bad in "--recompute moe --recompute-layers -1|must be in" "--recompute moe --recompute-layers 3|must be in" \
           "--recompute-layers 1|without --recompute"; do
  v=${bad%%|*}; msg=${bad#*|}
  if "$MOE" train --out "$TMP/bad" $BASE $v > "$TMP/bad.txt" 2>&1; then fail "'$v' accepted"
  elif grep -q -- "--recompute-layers.*$msg" "$TMP/bad.txt" && [ ! -e "$TMP/bad/metrics.jsonl" ]; then pass "'$v' refused by name ($msg), nothing written"
  else fail "'$v': $(tail -1 "$TMP/bad.txt")"; fi
done
for bad in all 2 ""; do
  if "$MOE" train --out "$TMP/bad" $BASE --recompute "$bad" > "$TMP/bad.txt" 2>&1; then fail "--recompute '$bad' accepted"
  elif grep -q -- "--recompute" "$TMP/bad.txt" && [ ! -e "$TMP/bad/metrics.jsonl" ]; then pass "--recompute '$bad' refused by name, nothing written"
  else fail "--recompute '$bad': $(tail -1 "$TMP/bad.txt")"; fi
done
finish
