#!/bin/bash
# attn_stalls.sh — why the attention backward's dk/dv kernel runs its products at ~40% of the tensor pipe
# (issue 38; docs/PERFORMANCE.md "What limits us", Attention): Nsight Compute's speed-of-light, compute
# (pipe utilisation), memory (shared memory, L2) and warp-state (stall reasons) sections of our dk/dv and
# dq kernels and of SDPA's cuDNN backward on the same shape (B 1, T 8192, 16 / 8 heads, head dim 128), one
# launch each, clocks not locked. Prepare as suite_check.sh (.gpk/gpu.tar.xz with main's build and
# bench/torch_attention_peer.py in the tree); about two minutes. Output: $OUT/attn_stalls.txt (the rows
# picked by ncu_stalls.py) and the raw --csv logs under $OUT.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start attn_stalls 200
SEC="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
     --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats"
SHAPE=${SHAPE:-"1 8192 16 8 128"}
set -- $SHAPE
t ours 60 ncu -c 4 --clock-control none -k regex:'att_wg_dqs|att_wg_dkdv' $SEC --page raw --csv \
  $B/moe_bench_attention --device cuda --B $1 --T $2 --H $3 --KV $4 --hd $5 --iters 1
t peer 85 ncu --clock-control none --target-processes all -k regex:'bprop' -c 2 $SEC --page raw --csv \
  python3 bench/torch_attention_peer.py $SHAPE
cp $W/ours.log $W/peer.log ${OUT:-$W}/ 2>/dev/null
python3 scripts/device/ncu_stalls.py $W/ours.log $W/peer.log | tee -a $R
say "$(date -u) done"
