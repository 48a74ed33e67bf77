#!/usr/bin/env bash
# test_family_mesh.sh — the families' options (config.h: q/k/v biases, a sigmoid-gated shared expert,
# QK-norm full-width and per head) and the balancing methods (aux-free routing bias, which the final
# parameters compare as a table tensor; sequence and global aux scopes) train the same model on a mesh as
# in one process, at test_mesh.sh's
# tolerances (lib.sh mesh_close), and the one form that cannot be split (OLMoE's full-width QK-norm over
# TP) is refused with one message. Tiny models, 4 steps: the point is the new terms' TP slices (biases
# split with their heads, per-head norm weights and the shared expert reduced over the stage) and their
# EP/DP reductions, not the rest of the mesh matrix (test_mesh.sh).
set -u
. "$(dirname "$0")/lib.sh"
mpi_tests

BASE="--steps 4 --quiet --sample-tokens 0 --plots 0 --batch 8 --seq-len 16 --eval-batches 1 --eval-every 0
      --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2"
Q2="--family qwen2_moe --qkv-bias 1 --n-shared-experts 1 --shared-d-ff 24 --shared-gate 1 --renormalize 0"
Q3="--family qwen3_moe --qk-norm head --head-dim 12"
OL="--family olmoe --qk-norm full --renormalize 0"

# "family flags|ranks|mesh flags|label"
CASES="$Q2|4|--tp 2 --ep 2|qwen2_moe (biases, gated shared expert): tp2+dp2+ep2
$Q2 --dispatch capacity --capacity-factor 0.8 --jitter 0.05|2|--tp 2|qwen2_moe capacity+jitter: tp2
$Q3|4|--tp 2 --ep 2 --zero 1|qwen3_moe (per-head qk-norm): tp2+dp2+ep2 zero1
$OL|4|--ep 2 --etp 2|olmoe (full qk-norm): dp4+ep2+etp2
--balance aux-free --bias-rate 0.01|4|--tp 2 --ep 2 --zero 2|balance aux-free (routing bias): tp2+dp2+ep2 zero2
--balance aux-free --bias-rate 0.01 --grad-accum 4|2|--pp 2|balance aux-free: pp2 (1f1b)
--aux-scope sequence --seq-len 25 --batch 4 --grad-accum 2|4|--tp 2 --ep 2|aux scope sequence, sequences cut by TP slices: tp2+dp2+ep2
--aux-scope global --grad-accum 2|4|--tp 2 --ep 2 --zero 1|aux scope global (2 micro-batches): tp2+dp2+ep2 zero1
--aux-scope global --grad-accum 4 $Q2|2|--pp 2|aux scope global + qwen2_moe: pp2 (1f1b, 4 micro-batches)"

i=0
while IFS='|' read -r fam np flags label; do
  i=$((i + 1))
  ref="$TMP/ref$i"
  "$MOE" train --out "$ref" $BASE $fam > "$TMP/ref$i.txt" 2>&1 < /dev/null || { fail "$label: reference run"; tail -3 "$TMP/ref$i.txt"; continue; }
  run="$TMP/run$i"; mkdir -p "$run"
  if $MPI -np "$np" "$MOE" train --out "$run" $BASE $fam $flags --check-replicas > "$run/out.txt" 2>&1 < /dev/null; then
    mesh_close "$ref" "$run" "$label"
  else fail "$label: mpirun failed"; tail -5 "$run/out.txt"; fi
done <<< "$CASES"

# OLMoE's full-width QK-norm over TP: refused before anything starts
rm -rf "$TMP/bad"
timeout 120 mpirun --oversubscribe -np 2 "$MOE" train --out "$TMP/bad" $BASE $OL --tp 2 > "$TMP/bad.txt" 2>&1 < /dev/null
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "moe: error: .*qk_norm full .* tp must be 1 (got 2)" "$TMP/bad.txt" && [ ! -e "$TMP/bad" ]; then
  pass "olmoe qk-norm full with --tp 2 refused, nothing written"
else fail "olmoe qk-norm full with --tp 2: exit $rc"; tail -3 "$TMP/bad.txt"; fi
finish
