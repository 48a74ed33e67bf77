#!/bin/bash
# fp8_quant_check.sh — the FP8 quantisers (src/ops/cuda/cuda_fp8.cu, cuda_fp8_fused.cu; issue 38) in one
# call of about a minute: their bits (test_cuda_fp8_quant against the host reference, test_cuda_fp8_fused
# fused against plain, memcheck and racecheck on the small cases), each timed alone on the reference model's
# shapes against the bytes it must move (`moe_bench_fp8 --quant-only 1`: quant tiles, tiles_t, both tilings,
# the SwiGLU backward with both tilings of dh1 and dh3, the weights' blocks and a pair half with their
# transposed codes), and Nsight Compute on one launch of each (duration, DRAM / L2 / L1 throughput, occupancy,
# warp stalls) where ncu reads the counters. With an old build's bench in .gpu/old/moe_bench_fp8 (built from
# the commit before a change) both are timed and profiled, old first: the A/B of a quantiser change.
# Prepare here: `cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu` (tar it into .gpk as
# docs/PERFORMANCE.md's "Reproduce" says), then call `bash scripts/device/fp8_quant_check.sh` with carry
# [".gpk"] or [".gpu"]. Output in $OUT/quant.txt, ncu's reports in $OUT/ncu_{old,new}.txt. Exit 1 on a test
# failure or a sanitizer report in our kernels.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start quant 240
t quant 90 $B/test_cuda_fp8_quant; test_line quant
t fused 120 $B/test_cuda_fp8_fused
l=$(grep -E "checks, [0-9]+ failed" $W/fused.log | tail -1); say "   fused: ${l:-no result line}"
[[ "$l" == *", 0 failed" ]] || FAIL=1
t mem 90 compute-sanitizer --tool memcheck $B/test_cuda_fp8_fused small; san_line mem
t race 90 compute-sanitizer --tool racecheck $B/test_cuda_fp8_fused small; san_line race
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for v in old new; do
  bin=$B/moe_bench_fp8; [ $v = old ] && bin=$G/old/moe_bench_fp8
  [ -x $bin ] || continue
  say "== $v: $bin --quant-only 1"
  timeout 60 $bin --quant-only 1 --iters 30 --warmup 3 2>&1 | tee -a $R
  timeout 100 $NCU --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section WarpStateStats --section LaunchStats -k regex:"quant|swiglu" \
    --launch-count 6 $bin --quant-only 1 --iters 1 --warmup 0 > ${OUT:-$W}/ncu_$v.txt 2>&1
  say "   ncu rc $?: $(grep -c 'Duration' ${OUT:-$W}/ncu_$v.txt) kernels profiled"
done
say "FAIL=$FAIL $(date -u)"
exit $FAIL
