#!/usr/bin/env bash
# test_dw_ledger.sh — the gradient norm with the routed experts' sums of squares taken from the GEMMs that
# write their gradients (ops.h GM_DW_SUMSQ, dist_use_ledger; on by default in one process and on ranks that
# reduce no expert gradient) trains the same
# model as reading those gradients again (MOE_DW_SUMSQ=0), bit for bit on the cpu (ops.h dw_sumsq_take:
# the ledger adds each tensor's sum in the order the norm's runs do): metrics.jsonl without its timing
# fields and the final checkpoint byte-identical. Layouts: mixed precision (float32 expert gradients),
# --precision bf16 (packed bf16 ones), a shared expert (read as the other tensors are), MTP modules (their
# experts in the ledger too), --recompute full, --precision fp8 and fp8-bf16 (the FP8 tables' products), and
# under mpirun (below). The run's closing lines say on how many steps the ledger stood for the experts (every
# step here: no layer runs its experts in chunks, which would leave them out of it); with MOE_DW_SUMSQ=0 and
# under --grad-accum 2 (gradients summed over micro-batches) it is not used at all.
set -u
. "$(dirname "$0")/lib.sh"
BASE="--steps 3 --quiet --sample-tokens 0 --plots 0 --batch 8 --seq-len 16 --eval-batches 1 --eval-every 0
      --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 1
      --device ${MOE_TEST_DEVICE:-cpu}"

strip() { sed -E 's/"seconds":\[[^]]*\],?//g; s/"(tokens_per_s|tflops|step_time_s|grad_wait_s|bubble_frac)":[^,}]*,?//g' "$1" | grep '"loss"'; }
run() { local d="$1"; shift; rm -rf "$d"; mkdir -p "$d"; ${NP:+$MPI -np $NP} "$MOE" train --out "$d" $BASE "$@" > "$d/out.txt" 2>&1 < /dev/null; }
used() { grep -o "from the GEMMs that wrote them on [0-9]* of [0-9]* steps" "$1/out.txt" | grep -o "on [0-9]* of [0-9]*"; }

cases() { while IFS='|' read -r flags want label; do
  MOE_DW_SUMSQ=0 run "$TMP/off" $flags || { fail "$label: MOE_DW_SUMSQ=0 failed"; tail -3 "$TMP/off/out.txt"; continue; }
  run "$TMP/on" $flags || { fail "$label: the ledger's run failed"; tail -3 "$TMP/on/out.txt"; continue; }
  ok=1
  if [ "${MOE_TEST_DEVICE:-cpu}" = cpu ]; then
    cmp -s <(strip "$TMP/off/metrics.jsonl") <(strip "$TMP/on/metrics.jsonl") || { ok=0; fail "$label: metrics differ"; diff <(strip "$TMP/off/metrics.jsonl") <(strip "$TMP/on/metrics.jsonl") | head -3; }
    for f in model.safetensors optimizer.safetensors; do
      cmp -s "$TMP/off/step_00000003/$f" "$TMP/on/step_00000003/$f" || { ok=0; fail "$label: $f differs"; }
    done
  else # (a GPU's ledger sums in another order: the first step's norm, before any update, to round-off)
    a=$(field grad_norm "$TMP/off/metrics.jsonl" | head -1); b=$(field grad_norm "$TMP/on/metrics.jsonl" | head -1)
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 4e-6 * a) }' ||
      { ok=0; fail "$label: step 1's grad norm $b against $a"; }
  fi
  [ "$(strip "$TMP/on/metrics.jsonl" | wc -l)" = 3 ] || { ok=0; fail "$label: not 3 steps"; }
  [ "$(used "$TMP/on")" = "$want" ] || { ok=0; fail "$label: the ledger on '$(used "$TMP/on")' steps, not '$want'"; }
  [ -z "$(used "$TMP/off")" ] || { ok=0; fail "$label: MOE_DW_SUMSQ=0 used the ledger"; }
  [ $ok = 1 ] && pass "$label: the same training as without the ledger (used ${want:-on no} steps)"
done; }
cases <<< "|on 3 of 3|mixed precision, float32 expert gradients
--precision bf16|on 3 of 3|bf16, packed expert gradients
--family qwen2_moe --n-shared-experts 1 --shared-d-ff 40 --shared-gate 1|on 3 of 3|a shared expert
--mtp 1|on 3 of 3|an MTP module
--recompute full|on 3 of 3|--recompute full
--precision fp8|on 3 of 3|fp8 (the FP8 weight-gradient GEMMs' sums)
--precision fp8-bf16|on 3 of 3|fp8-bf16"

run "$TMP/acc" --grad-accum 2 && [ -z "$(used "$TMP/acc")" ] && pass "--grad-accum 2: the ledger is not used" ||
  fail "--grad-accum 2: $(used "$TMP/acc") $(tail -1 "$TMP/acc/out.txt")"

# ranks (cpu; mpirun): where no rank's expert gradients are reduced (edp 1: ep over all the data-parallel
# ranks) each rank's ledger stands for its experts in the norm's sums before the reductions; under dp2 (edp 2,
# the expert gradients summed over ranks after their GEMMs) and where they are read rounded (bf16 on ranks)
# it is not used
if [ "${MOE_TEST_DEVICE:-cpu}" != cpu ] || ! command -v mpirun > /dev/null; then
  skip "ranks: no mpirun or not cpu"
else
  mpi_tests
  NP=2 cases <<< "--ep 2|on 3 of 3|2 ranks, ep2 (edp 1)
--ep 2 --precision bf16||2 ranks, ep2, bf16 (its ranks' expert gradients float32 read rounded, OPTG_BF16: no ledger)"
  NP=2 run "$TMP/dp2" && [ -z "$(used "$TMP/dp2")" ] && pass "2 ranks, dp2 (edp 2): the ledger is not used" ||
    fail "dp2: $(used "$TMP/dp2") $(tail -1 "$TMP/dp2/out.txt")"
fi
finish
