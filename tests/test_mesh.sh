#!/usr/bin/env bash
# test_mesh.sh — every parallel layout trains the same model as one process.
# Each layout runs under mpirun (Open MPI, oversubscribed on the 2-core CI machine) and must match
# the single-process run of the same command line:
#   - per-step loss and aux loss within 1e-6 relative, grad norm within 1e-5: the only differences
#     are float32 summation orders (partial sums over TP heads, expert rows arriving in another
#     order, all-reduce trees), seen at 1e-9..4e-8 on the losses; the grad norm amplifies the
#     parameters' drift on a loss spike (seen 1.7e-6 at a step where it jumped from 1.4 to 3.4);
#     a wrong token, scale or missing term shows up at 1e-3 or more;
#   - per-step expert load (global token counts per expert) and dropped counts exactly equal: routing
#     and capacity drops are decided from global statistics, so they must be the same decisions;
#   - final parameters within 1e-3 of each tensor's largest magnitude after 6 AdamW steps (seen up
#     to 1e-4: Adam divides by sqrt(v), so round-off in tiny gradient elements moves their update by
#     up to lr * 1e-4 per step; a wrong gradient moves whole tensors by ~lr = 1e-2 relative);
#   - --check-replicas: router and other replicated tensors bitwise equal on every rank, TP shards
#     equal across DP, expert shards equal across EDP and distinct across EP.
set -u
. "$(dirname "$0")/lib.sh"
mpi_tests   # (each call reads </dev/null: mpirun forwards stdin)

BASE="--steps 6 --quiet --sample-tokens 0 --plots 0 --batch 16 --seq-len 24 --eval-batches 1 --eval-every 0
      --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2"

# layouts: "ranks|flags|label"
LAYOUTS="2|--tp 1|dp2
2|--tp 2|tp2
2|--ep 2|ep2 (=dp2)
4|--ep 2|dp4+ep2 (edp2)
4|--tp 2 --ep 2|tp2+dp2+ep2
4|--tp 2 --etp 2|tp2+dp2+etp2
4|--ep 2 --etp 2|dp4+ep2+etp2
8|--ep 4 --etp 2 --batch 8 --grad-accum 1|ep4+etp2 on 8 ranks
8|--tp 2 --ep 2 --etp 2|tp2+dp4+ep2+etp2
2|--zero 1|dp2 zero1
4|--ep 2 --zero 2 --bucket-mb 0.01|dp4+ep2 zero2 (small buckets)
4|--tp 2 --ep 2 --zero 2 --overlap 0|tp2+dp2+ep2 zero2 no overlap
8|--tp 2 --ep 2 --etp 2 --zero 1 --bucket-mb 0.01|tp2+dp4+ep2+etp2 zero1"

for mode in "dropless" "capacity --capacity-factor 0.8 --jitter 0.05 --grad-accum 2 --aux-form hf"; do
  for extra in ""; do
    ref="$TMP/ref_${mode%% *}"
    "$MOE" train --out "$ref" $BASE --dispatch $mode $extra > /dev/null 2>&1 || { fail "reference run ($mode)"; continue; }
    while IFS='|' read -r np flags label; do
      # the 8-rank ep4 layout needs batch 8 / grad-accum 1 in both runs
      r2="$ref"
      case "$flags" in *"--batch 8"*)
        r2="$TMP/ref8_${mode%% *}"
        [ -d "$r2" ] || "$MOE" train --out "$r2" $BASE --dispatch $mode $flags --tp 1 --ep 1 --etp 1 > /dev/null 2>&1 < /dev/null ;;
      esac
      run="$TMP/run"
      rm -rf "$run"; mkdir -p "$run"
      if $MPI -np "$np" "$MOE" train --out "$run" $BASE --dispatch $mode $flags --check-replicas > "$run/out.txt" 2>&1 < /dev/null; then
        mesh_close "$r2" "$run" "${mode%% *}: $label"
      else
        fail "${mode%% *}: $label: mpirun failed"; tail -5 "$run/out.txt"
      fi
    done <<< "$LAYOUTS"
  done
done

# uneven token slices over TP (25 tokens per sequence, one sequence per DP rank and micro-batch)
U="--seq-len 25 --batch 4 --grad-accum 2"
"$MOE" train --out "$TMP/ru" $BASE $U > /dev/null 2>&1
rm -rf "$TMP/run"; mkdir -p "$TMP/run"
if $MPI -np 4 "$MOE" train --out "$TMP/run" $BASE $U --tp 2 --ep 2 --check-replicas > "$TMP/run/out.txt" 2>&1 < /dev/null; then
  mesh_close "$TMP/ru" "$TMP/run" "uneven TP slices (odd tokens per rank)"
else fail "uneven TP slices: mpirun failed"; fi

# resharding resume: saved on 8 ranks (tp2, ep2, etp2, zero 2), resumed on 2 ranks (ep2, zero 1)
# and on 1 process
R="$BASE --steps 8 --save-every 4 --keep 0"
"$MOE" train --out "$TMP/full" $R > /dev/null 2>&1
# (the lr schedule is a function of --steps, so the 8-rank run is the 8-step run; its step-4
# checkpoint is what a crash after step 4 would have left)
$MPI -np 8 "$MOE" train --out "$TMP/r8" $R --tp 2 --ep 2 --etp 2 --zero 2 > /dev/null 2>&1 < /dev/null
for target in "2|--ep 2 --zero 1" "1|"; do
  np="${target%%|*}"; flags="${target#*|}"
  d="$TMP/resume_$np"; rm -rf "$d"; mkdir -p "$d"
  cp -r "$TMP/r8/step_00000004" "$d/"
  head -n "$(grep -n '"step":4,' "$TMP/r8/metrics.jsonl" | head -1 | cut -d: -f1)" "$TMP/r8/metrics.jsonl" > "$d/metrics.jsonl"
  if [ "$np" = 1 ]; then cmd=("$MOE"); else cmd=($MPI -np "$np" "$MOE"); fi
  if "${cmd[@]}" train --out "$d" $R $flags --resume --check-replicas > "$d/out.txt" 2>&1 < /dev/null; then
    [ "$np" = 1 ] && echo "replica check: ok" >> "$d/out.txt"
    mesh_close "$TMP/full" "$d" "saved on 8 ranks (tp2 ep2 etp2 zero2), resumed on $np ${flags:-process}"
  else fail "resume on $np ranks failed"; tail -5 "$d/out.txt"; fi
done

# the MoE layer alone on a mesh vs one process, in the edge cases: all tokens routed to the same
# experts (whole EP ranks receive zero rows, experts get none), k = 1 on one expert, capacity drops;
# and the experts' hidden rows in bf16 (the GPU's format, tests/hid_bf16.h), also through the pipelined exchange
MPI_MOE="$(dirname "$MOE")/mpi_moe"
for L in "2|1 2 1" "4|2 2 1" "4|1 2 2" "4|1 4 1" "8|2 2 2"; do
  np="${L%%|*}"; args="${L#*|}"
  if $MPI -np "$np" "$MPI_MOE" $args > "$TMP/mm.txt" 2>&1 < /dev/null; then
    pass "MoE layer edge cases on $np ranks (tp ep etp = $args): $(grep -c 'ok=1' "$TMP/mm.txt") cases match one process, $(grep 'ranks receiving no rows' "$TMP/mm.txt" | sed -n 4p | sed 's/.*ranks receiving/ranks receiving/')"
  else fail "MoE layer edge cases on $np ranks (tp ep etp = $args)"; grep -v Epoll "$TMP/mm.txt" | tail -8; fi
done

# impossible meshes: one clear message, non-zero exit, bounded time
mesh_fail() {   # mesh_fail PHRASE NP FLAGS...
  local phrase="$1" np="$2"; shift 2
  local t0; t0=$(date +%s)
  timeout 120 mpirun --oversubscribe -np "$np" "$MOE" train --out "$TMP/bad" $BASE "$@" > "$TMP/bad.txt" 2>&1 < /dev/null
  local rc=$? dt=$(( $(date +%s) - t0 ))
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "moe: error: .*$phrase" "$TMP/bad.txt" && [ $dt -lt 100 ]; then
    pass "impossible mesh refused on $np ranks ($*): '$phrase' in ${dt}s"
  else fail "impossible mesh ($*) on $np ranks: exit $rc after ${dt}s"; tail -3 "$TMP/bad.txt"; fi
}
mesh_fail "world size 3 is not divisible by tp 2" 3 --tp 2
mesh_fail "n_experts 4 is not divisible by ep 3" 3 --ep 3 --batch 12
mesh_fail "n_heads 4 is not divisible by tp 8" 8 --tp 8
mesh_fail "is not divisible by ep 4 x etp 2" 4 --ep 4 --etp 2
mesh_fail "--batch 16 is not divisible by --grad-accum 1 x dp 32" 32 --ep 2
finish
