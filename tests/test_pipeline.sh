#!/usr/bin/env bash
# test_pipeline.sh — pipeline parallelism (--pp, 1f1b and interleaved) trains the same model as one
# process. Each layout runs under mpirun (oversubscribed) and is compared with the single-process run
# of the same command line. What is promised, and checked:
#   - pipeline stages alone (pp 2, pp 4, uneven --pp-layers, interleaved; no TP/DP/EP), --grad-clip 0:
#     per-step loss, aux loss, z loss, expert load and dropped counts are the SAME BITS as one process,
#     and so are the final checkpoint's model and optimizer files: every layer runs the same kernels on
#     the same inputs, micro-batch gradients accumulate in the same order (1F1B's backwards run in
#     micro-batch order), and the router statistics are carried from stage to stage in layer order.
#     Only the grad norm is summed per stage and then over stages (double round-off, <= 1e-12
#     relative); with clipping on, that can move the clip scale's last bit, hence --grad-clip 0 here.
#   - stages composed with TP / DP / EP / ZeRO: the mesh tests' tolerances (loss and aux 1e-6 relative,
#     grad norm 1e-5, final parameters 1e-3 of each tensor's largest magnitude; expert load and drops
#     exactly equal), since TP/EP change summation orders as they do without stages;
#   - the MegaBlocks regression: the logged aux and z losses and expert load do not depend on the
#     number of stages (pp 1, 2, 4: identical strings in metrics.jsonl);
#   - resharding: a checkpoint saved at pp 2 (with ep 2) resumes at pp 1 and pp 4, one saved at pp 1
#     resumes at pp 2 with tp 2, each continuing as the uninterrupted run;
#   - edge cases: experts with no tokens (few tokens, many experts), every token on one expert
#     (n_experts 1), micro-batches of one sequence;
#   - bad input: one message naming the numbers on every rank, non-zero exit, nothing written;
#   - the bubble: metrics.jsonl carries each stage's idle time and bubble_frac (measured, not asserted).
set -u
. "$(dirname "$0")/lib.sh"
mpi_tests

BASE="--steps 5 --quiet --sample-tokens 0 --plots 0 --batch 16 --seq-len 16 --eval-batches 1 --eval-every 0
      --n-layers 4 --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2
      --grad-accum 4"

one() {   # one DIR FLAGS...: the single-process reference
  local d="$1"; shift
  [ -d "$d" ] || "$MOE" train --out "$d" $BASE "$@" > /dev/null 2>&1 < /dev/null || fail "reference run $*"
}
mesh() {   # mesh DIR NP FLAGS...
  local d="$1" np="$2"; shift 2
  rm -rf "$d"; mkdir -p "$d"
  $MPI -np "$np" "$MOE" train --out "$d" $BASE "$@" > "$d/out.txt" 2>&1 < /dev/null
}

# ---- stages alone: bitwise (both dispatch modes; capacity with jitter and HF's aux form)
for mode in "dropless" "capacity --capacity-factor 0.8 --jitter 0.05 --aux-form hf"; do
  m="${mode%% *}"
  one "$TMP/ref_$m" --dispatch $mode --grad-clip 0
  for L in "2|--pp 2|pp2" "4|--pp 4|pp4" "2|--pp 2 --pp-layers 1,3|pp2 uneven (1,3)" \
           "2|--pp 2 --pp-schedule interleaved --vpp 2|interleaved pp2 vpp2" "2|--pp 2 --overlap 0|pp2 overlap off"; do
    IFS='|' read -r np flags label <<< "$L"
    if mesh "$TMP/run" "$np" --dispatch $mode --grad-clip 0 $flags; then mesh_exact "$TMP/ref_$m" "$TMP/run" "$m: $label"
    else fail "$m: $label: mpirun failed"; tail -4 "$TMP/run/out.txt"; fi
  done
done

# ---- the MegaBlocks regression: logged aux, z and load independent of the number of stages (default clip)
one "$TMP/mb1"
mesh "$TMP/mb2" 2 --pp 2 && mesh "$TMP/mb4" 4 --pp 4
for k in aux_loss z_loss; do field $k "$TMP/mb1/metrics.jsonl" > "$TMP/k1"; field $k "$TMP/mb2/metrics.jsonl" > "$TMP/k2"; field $k "$TMP/mb4/metrics.jsonl" > "$TMP/k4"
  if [ -s "$TMP/k1" ] && cmp -s "$TMP/k1" "$TMP/k2" && cmp -s "$TMP/k1" "$TMP/k4"; then pass "logged $k identical at pp 1, 2, 4"
  else fail "logged $k depends on the number of stages"; paste "$TMP/k1" "$TMP/k2" "$TMP/k4" | head -3; fi
done
grep -o '"expert_load":[^a-z]*' "$TMP/mb1/metrics.jsonl" > "$TMP/l1"; grep -o '"expert_load":[^a-z]*' "$TMP/mb4/metrics.jsonl" > "$TMP/l4"
if [ -s "$TMP/l1" ] && cmp -s "$TMP/l1" "$TMP/l4"; then pass "logged expert load identical at pp 1 and 4"; else fail "expert load depends on the number of stages"; fi
b=$(grep -o '"bubble_frac":[0-9.e-]*' "$TMP/mb2/metrics.jsonl" | tail -1)
[ -n "$b" ] && grep -q '"pp_idle_s":\[' "$TMP/mb2/metrics.jsonl" && pass "metrics.jsonl records each stage's idle time and the bubble ($b at pp 2, 4 micro-batches; theory 0.2)" || fail "no bubble in metrics.jsonl"

# ---- stages composed with the mesh (default clip; the mesh tolerances)
for mode in "dropless" "capacity --capacity-factor 0.8 --jitter 0.05 --aux-form hf"; do
  m="${mode%% *}"
  one "$TMP/refc_$m" --dispatch $mode
  for L in "4|--pp 2 --tp 1|pp2+dp2" "4|--pp 2 --tp 2|pp2+tp2" "4|--pp 2 --ep 2|pp2+dp2+ep2 (ep carved out of dp)" \
           "8|--pp 2 --tp 2 --ep 2 --zero 2 --bucket-mb 0.01|pp2+tp2+dp2+ep2 zero2 (8 ranks)"; do
    IFS='|' read -r np flags label <<< "$L"
    case "$label" in *"8 ranks"*) [ "$m" = capacity ] && continue ;; esac   # the widest layout once
    if mesh "$TMP/run" "$np" --dispatch $mode $flags --check-replicas; then mesh_close "$TMP/refc_$m" "$TMP/run" "$m: $label"
    else fail "$m: $label: mpirun failed"; tail -4 "$TMP/run/out.txt"; fi
  done
done
if mesh "$TMP/run" 4 --pp 2 --ep 2 --a2a-overlap 2 --check-replicas; then
  mesh_close "$TMP/refc_dropless" "$TMP/run" "dropless: pp2+dp2+ep2 with the pipelined exchange (--a2a-overlap 2)"
else fail "pp2 + a2a-overlap: mpirun failed"; tail -4 "$TMP/run/out.txt"; fi
if mesh "$TMP/run" 4 --pp 2 --tp 1 --ep 2 --zero 1 --overlap 0 --pp-schedule interleaved --vpp 2 --check-replicas; then
  mesh_close "$TMP/refc_dropless" "$TMP/run" "dropless: interleaved pp2 vpp2 + dp2 + ep2, zero1, overlap off"
else fail "interleaved + mesh: mpirun failed"; tail -4 "$TMP/run/out.txt"; fi

# ---- resharding: save at pp2+ep2 (4 ranks), resume at pp1 and pp4; save at pp1, resume at pp2+tp2
R="--steps 6 --save-every 3 --keep 0"
one "$TMP/full" $R
mesh "$TMP/s_pp2" 4 $R --pp 2 --ep 2
"$MOE" train --out "$TMP/s_pp1" $BASE $R > /dev/null 2>&1 < /dev/null
resume_from() {   # resume_from SAVED NP FLAGS LABEL
  local saved="$1" np="$2" flags="$3" label="$4" d="$TMP/resume"
  rm -rf "$d"; mkdir -p "$d"
  cp -r "$saved/step_00000003" "$d/"
  head -n "$(grep -n '"step":3,' "$saved/metrics.jsonl" | head -1 | cut -d: -f1)" "$saved/metrics.jsonl" > "$d/metrics.jsonl"
  local ok=0
  if [ "$np" = 1 ]; then "$MOE" train --out "$d" $BASE $R --resume > "$d/out.txt" 2>&1 < /dev/null && ok=1 && echo "replica check: ok" >> "$d/out.txt"
  else $MPI -np "$np" "$MOE" train --out "$d" $BASE $R $flags --resume --check-replicas > "$d/out.txt" 2>&1 < /dev/null && ok=1; fi
  if [ $ok = 1 ]; then mesh_close "$TMP/full" "$d" "$label"; else fail "$label: resume failed"; tail -4 "$d/out.txt"; fi
}
resume_from "$TMP/s_pp2" 1 "" "saved at pp2+ep2, resumed on one process"
resume_from "$TMP/s_pp2" 4 "--pp 4" "saved at pp2+ep2, resumed at pp4"
resume_from "$TMP/s_pp1" 4 "--pp 2 --tp 2" "saved on one process, resumed at pp2+tp2"

# ---- edge cases (bitwise against one process, stages alone)
for E in "--n-experts 8 --top-k 1 --seq-len 2|experts with no tokens (2 tokens per sequence, 8 experts top-1)" \
         "--n-experts 1 --top-k 1|every token on one expert (n_experts 1)" \
         "--batch 4|micro-batches of one sequence"; do
  flags="${E%%|*}"; label="${E#*|}"
  rm -rf "$TMP/edge_ref"; one "$TMP/edge_ref" --grad-clip 0 $flags
  if mesh "$TMP/run" 2 --pp 2 --grad-clip 0 $flags; then mesh_exact "$TMP/edge_ref" "$TMP/run" "pp2: $label"
  else fail "pp2: $label: mpirun failed"; tail -4 "$TMP/run/out.txt"; fi
done

# ---- moe info --pp: each stage's share and the bubble (bytes: the stages' parameters add up to the model's)
if "$MOE" info --pp 2 --grad-accum 4 --n-layers 4 --d-model 32 --d-ff 48 --n-heads 4 --n-kv-heads 2 > "$TMP/info.txt" 2>&1; then
  sum=$("$MOE" info --pp 2 --grad-accum 4 --n-layers 4 --d-model 32 --d-ff 48 --n-heads 4 --n-kv-heads 2 --world 2 | grep -c 'stage [01]: ')
  if grep -q 'bubble (p-1)/(m+p-1) = 20.0% (simulated with backward = 2 x forward: 20.0%)' "$TMP/info.txt" &&
     grep -q 'stage 0: layers 0-1 + embedding: .*(2 live micro-batches)' "$TMP/info.txt" &&
     grep -q 'stage 1: layers 2-3 + final norm, LM head: .*(1 live micro-batches)' "$TMP/info.txt" && [ "$sum" = 2 ]; then
    pass "moe info --pp 2: stages' layers, live micro-batches (2, 1) and the bubble (20.0%, theory and simulation)"
  else fail "moe info --pp 2"; tail -4 "$TMP/info.txt"; fi
else fail "moe info --pp 2 failed"; tail -3 "$TMP/info.txt"; fi

# moe info --world N: a rank's memory, the whole model's apart; one rank holds what the whole model does
w1=$("$MOE" info --world 1 2>&1)
whole=$(echo "$w1" | grep -o 'activations for batch 16 x 64: [0-9.]* [KMG]iB' | awk '{print $(NF-1), $NF}')
rank=$(echo "$w1" | grep -o 'activations [0-9.]* [KMG]iB (a micro-batch of 16 x 64[;)]' | awk '{print $2, $3}')
tp2=$("$MOE" info --world 4 --tp 2 --ep 2 2>&1 | grep -o 'activations [0-9.]* [KMG]iB (a micro-batch of 8 x 64[;)]' | awk '{print $2}')
if [ -n "$whole" ] && [ "$whole" = "$rank" ] && [ -n "$tp2" ] && fcmp "$tp2" "<" "${rank% *}"; then
  pass "moe info --world: one rank's activations equal the whole model's ($rank); at tp2 x dp2 x ep2 a rank holds $tp2 MiB"
else fail "moe info --world per-rank activations: whole '$whole', rank '$rank', tp2 '$tp2'"; fi

# ---- bad input: one clear message on every rank, non-zero exit, bounded time, nothing written
pp_fail() {   # pp_fail PHRASE NP FLAGS...
  local phrase="$1" np="$2"; shift 2
  local t0; t0=$(date +%s)
  rm -rf "$TMP/bad"
  timeout 120 mpirun --oversubscribe -np "$np" "$MOE" train --out "$TMP/bad" $BASE "$@" > "$TMP/bad.txt" 2>&1 < /dev/null
  local rc=$? dt=$(( $(date +%s) - t0 ))
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- "$phrase" "$TMP/bad.txt" && grep -q "moe: error:" "$TMP/bad.txt" && [ ! -e "$TMP/bad" ] && [ $dt -lt 100 ]; then
    pass "refused on $np ranks ($*): '$phrase' in ${dt}s, nothing written"
  else fail "bad pipeline ($*) on $np ranks: exit $rc after ${dt}s, out dir $([ -e "$TMP/bad" ] && echo created || echo absent)"; tail -3 "$TMP/bad.txt"; fi
}
pp_fail "n_layers 4 is not divisible by --pp 3" 3 --pp 3
pp_fail "--pp-layers '1,2' sums to 3 layers; the model has n_layers 4" 2 --pp 2 --pp-layers 1,2
pp_fail "--pp-layers '4' has 1 entries; --pp 2 x --vpp 1 needs 2" 2 --pp 2 --pp-layers 4
pp_fail "--pp-layers ' 1,3' is not a comma-separated list of layer counts" 2 --pp 2 --pp-layers " 1,3"
pp_fail "--pp-layers '1,,3' is not a comma-separated list of layer counts" 2 --pp 2 --pp-layers 1,,3
pp_fail "needs at least as many micro-batches (--grad-accum 2) as pipeline stages (--pp 4)" 4 --pp 4 --grad-accum 2
pp_fail "world size 3 is not divisible by tp 1 x pp 2" 3 --pp 2
pp_fail "micro-batches (--grad-accum 3) to be a multiple of --pp 2" 2 --pp 2 --pp-schedule interleaved --vpp 2 --grad-accum 3 --batch 15
pp_fail "n_layers 4 is not divisible by --pp 2 x --vpp 4" 2 --pp 2 --pp-schedule interleaved --vpp 4
finish
