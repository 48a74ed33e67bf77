#!/bin/bash
# fp8_gemm_ab.sh — the A/B of a change to the FP8 grouped GEMM kernel (src/ops/cuda/cuda_grouped_fp8.cu;
# issue 38) in one call of about three minutes. Each build is a folder of programs: .gpu/old (the commit
# before the change: moe and moe_bench_fp8), .gpu/bin (the change, with the test programs; pack_libs.sh's)
# and any .gpu/var*/ (variants: moe and moe_bench_fp8). For each build, in this order and alone on the GPU:
#   - `moe_bench_fp8` (every GEMM shape and form, mean of 20 calls), the rows side by side, one column a build;
#   - 8 steps of the reference model under `--precision fp8-bf16` on random tokens, whose losses and gradient
#     norms must be the same bits as old's (a kernel change that keeps the promotion order keeps every bit);
# then the change's kernel tests: test_cuda_fp8_gemm (also each variant's own, where packed), test_cuda_fp8_ops,
# test_cuda_fp8_fused, memcheck and racecheck of test_cuda_fp8_gemm (racecheck also of each variant's own).
# Prepare here, on the change's commit:
# `make build && bash scripts/device/pack_libs.sh .gpu`, then `PROGRAMS="moe moe_bench_fp8 test_cuda_fp8_gemm"
# bash scripts/device/pack_variants.sh .gpu old=REF var1=REF ...`, tar .gpu into .gpk (docs/PERFORMANCE.md,
# "Reproduce"), and call `bash scripts/device/fp8_gemm_ab.sh` with carry [".gpk"]. Output in $OUT/gemm_ab.txt
# and the logs.
# VARS ("var2 var4") picks the variants to run, AB_STEPS (8) the steps a build trains, NORMS_MAY_DIFFER=1 trains
# without clipping and asks the losses alone to be the same bits (the norms' largest difference printed).
# Exit 1 when a build's losses differ from old's, a test fails, or a sanitizer reports in our kernels (a
# racecheck report comes with its pairs' instructions: scripts/device/race_pairs.py).
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start gemm_ab 420
BUILDS="old new"
for d in $G/var*/; do [ -x "$d/moe" ] && BUILDS="$BUILDS $(basename "$d")"; done
[ -n "${VARS:-}" ] && BUILDS="old new $VARS" # (VARS="var2 var4": those variants of the package only)
dir() { [ "$1" = new ] && echo $B || echo $G/$1; }
for v in $BUILDS; do t bench_$v 100 $(dir $v)/moe_bench_fp8 --iters 20 --warmup 3; done
say "== ms a call: shape, form, then one column a build ($BUILDS)"
cols=""
for v in $BUILDS; do
  awk '{ printf "%s\n", $(NF-3) }' $W/bench_$v.log > $W/col_$v.txt
  cols="$cols $W/col_$v.txt"
done
paste <(awk '{ n = NF - 4; s = $1; for (i = 2; i <= n; i++) s = s " " $i; print s }' $W/bench_old.log) $cols | tee -a $R
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin > /dev/null
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps ${AB_STEPS:-8} --precision fp8-bf16"
# NORMS_MAY_DIFFER=1 (a kernel whose gradient ledger groups its squares otherwise: the norms' last bits move):
# the runs without clipping, so the norm feeds no update; then the losses alone must be the same bits
[ -n "${NORMS_MAY_DIFFER:-}" ] && P="$P --grad-clip 0"
BITS='"loss":[^,]*,"aux_loss":[^,]*,"z_loss":[^,]*'
[ -n "${NORMS_MAY_DIFFER:-}" ] || BITS="$BITS"'|"grad_norm":[^,]*'
bits() { grep -oE "$BITS" "$1/metrics.jsonl"; }
for v in $BUILDS; do
  t step_$v 150 $(dir $v)/moe train $P --out $W/run_$v
  grep -E "^step" $W/step_$v.log | tail -4 | cut -c1-100 | tee -a $R
  [ $v = old ] && continue
  if [ -s $W/run_$v/metrics.jsonl ] && cmp -s <(bits $W/run_old) <(bits $W/run_$v); then
    say "   $v: losses${NORMS_MAY_DIFFER:- and gradient norms} the same bits as old's ($(grep -c loss $W/run_$v/metrics.jsonl) steps)"
    [ -n "${NORMS_MAY_DIFFER:-}" ] && paste <(grep -o '"grad_norm":[^,]*' $W/run_old/metrics.jsonl | cut -d: -f2) \
      <(grep -o '"grad_norm":[^,]*' $W/run_$v/metrics.jsonl | cut -d: -f2) |
      awk '{ d = $1 - $2; d = d < 0 ? -d : d; if (d / $1 > m) m = d / $1 } END { printf "   gradient norms: largest relative difference %.2e\n", m }' | tee -a $R
  else
    say "   $v: losses or gradient norms DIFFER from old's"
    FAIL=1
  fi
done
t gemm 90 $B/test_cuda_fp8_gemm; test_line gemm
for v in $BUILDS; do # (a variant packed with its own kernel test: PROGRAMS of pack_variants.sh)
  [ $v = old ] || [ $v = new ] || [ ! -x $G/$v/test_cuda_fp8_gemm ] && continue
  t gemm_$v 90 $G/$v/test_cuda_fp8_gemm; test_line gemm_$v
done
t fops 120 $B/test_cuda_fp8_ops; test_line fops
t fused 120 $B/test_cuda_fp8_fused
l=$(grep -E "checks, [0-9]+ failed" $W/fused.log | tail -1); say "   fused: ${l:-no result line}"
[[ "$l" == *", 0 failed" ]] || FAIL=1
t mem 120 compute-sanitizer --tool memcheck $B/test_cuda_fp8_gemm; san_line mem
# racecheck (any report in our kernels fails, san_line), then each reported pair's two instructions
# (race_pairs.py) to read it by
race() { # NAME BINARY
  t $1 150 compute-sanitizer --tool racecheck $2 || return 0
  san_line $1
  python3 scripts/device/race_pairs.py $W/$1.log $2 > $W/$1_pairs.txt 2>&1
  tail -1 $W/$1_pairs.txt | tee -a $R
  head -4 $W/$1_pairs.txt | grep -v "^race_pairs:" | tee -a $R
}
race race $B/test_cuda_fp8_gemm
for v in $BUILDS; do # each variant's own kernel under racecheck too
  [ $v = old ] || [ $v = new ] || [ ! -x $G/$v/test_cuda_fp8_gemm ] && continue
  race race_$v $G/$v/test_cuda_fp8_gemm
done
(cd $W && tar -czf "${OUT:-$W}/gemm_ab_logs.tgz" *.log) 2>/dev/null # (one file: a call returns at most 8)
say "FAIL=$FAIL $(date -u)"
exit $FAIL
