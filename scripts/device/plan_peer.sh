#!/bin/bash
# plan_peer.sh — Megatron's kernels' rates for `moe plan`'s published rows (issue 41; kind nvidia-h200): runs
# bench/torch_plan_rates.py (torch only: builds nothing, carries nothing) on this GPU at the per-GPU shapes of
# DeepSeek-V3 (1,024 H100, TP2 PP8 VPP4 EP64), Qwen3-235B-A22B (256 H100, TP2 PP8 VPP4 EP32) and Mixtral-8x22B
# (128 H100, TP2 PP8 EP8): the dense, grouped, fp8 grouped and attention rates, each the median of ITERS timed
# calls after 3 warm-ups. Run `bash scripts/device/plan_peer.sh` (about 1-2 minutes; BUDGET=seconds, default
# 220, bounds the Python; ROWS=a comma list to run fewer rows). Progress, the rates and the table in
# $OUT/plan_peer.txt; the profiles as $OUT/megatron-ROW.json and $OUT/megatron-ROW-fp8.json (dense_tflops
# from the FP8 projections), to be copied to profiles/ and read with `moe plan --gpu profiles/FILE.json`.
# Ends non-zero when the script fails or runs out of time.
cd "$(dirname "$0")/../.."
W=/tmp/planpeer; mkdir -p $W
O=${OUT:-$W}; R=$O/plan_peer.txt; : > $R
BUDGET=${BUDGET:-220}
export PYTHONUNBUFFERED=1
{
  echo "$(date -u) $(nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm --format=csv,noheader 2>/dev/null)"
  echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'); python $(python3 -c 'import torch; print(torch.__version__)' 2>&1)"
} | tee -a $R
rows=${ROWS:+--rows $ROWS}
timeout $BUDGET python3 bench/torch_plan_rates.py --out $O $rows 2>&1 | grep -v -i "warn" | tee -a $R
rc=${PIPESTATUS[0]}
echo "$(date -u) rc=$rc" | tee -a $R
ls $O/megatron-*.json 2>/dev/null | tee -a $R
exit $rc
