#!/bin/bash
# norm_ab.sh — RMSNorm's backward in one kernel (cuda_norm.cu rmsnorm_bwd_fused_k: dx and dw's first pass from
# one read of g, x and dinp, a block per chunk of 64 rows) against the two kernels it replaces where it runs
# (MOE_NORM_FUSED=0, the same binary), in one call of about two minutes. Prepare as suite_check.sh
# (.gpk/gpu.tar.xz with this build); run `bash scripts/device/norm_ab.sh` with carry [".gpk"]. Output:
# $OUT/norm_ab.txt. In order of what matters:
#   1. the kernels by name and time (ncu, --clock-control none) over two steps of the reference model, fused and
#      not;
#   2. test_cuda_ops on cuda (the fused shapes against the cpu, and its bits against the two kernels' through
#      rmsnorm_bwd_part's one-part case: exact);
#   3. 4 bf16 steps fused and not: the losses and gradient norms the same bits;
#   4. memcheck of the op suite's small shapes (cuda; they include the fused kernel's 4100 rows).
# Exit 1 when a test fails, the fused kernel does not run, the losses differ, or memcheck reports in ours.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start norm_ab 150
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --precision bf16"
for f in 1 0; do
  t ncu_$f 50 env MOE_NORM_FUSED=$f ncu --clock-control none -k regex:rmsnorm_bwd -c 40 \
    --metrics gpu__time_duration.sum --csv $B/moe train $P --steps 2 --out $W/ncu
  say "   MOE_NORM_FUSED=$f, us a launch by kernel (launches):"
  python3 scripts/device/ncu_rows.py $W/ncu_$f.log | tee -a $R
done
grep -q "rmsnorm_bwd_fused" $W/ncu_1.log || { say "   the fused kernel did not run"; FAIL=1; }
t ops 110 env MOE_TEST_BACKEND=cuda $B/test_cuda_ops; test_line ops
grep -E "^rmsnorm_bwd" $W/ops.log | head -4 | tee -a $R
for f in 1 0; do
  t step_$f 60 env MOE_NORM_FUSED=$f $B/moe train $P --steps 4 --out $W/run_$f
done
if [ -s $W/run_1/metrics.jsonl ] && cmp -s <(run_values $W/run_1) <(run_values $W/run_0); then
  say "   fused: losses and gradient norms the same bits as the two kernels' ($(run_values $W/run_1 | wc -l) values)"
else
  say "   fused: losses or gradient norms DIFFER from the two kernels'"; FAIL=1
  paste <(run_values $W/run_0) <(run_values $W/run_1) | head -8 | tee -a $R
fi
t mem 60 env MOE_TEST_SMALL=1 MOE_TEST_BACKEND=cuda compute-sanitizer --tool memcheck \
  $B/test_cuda_ops && san_line mem
say "$(date -u) done: $([ $FAIL = 0 ] && echo 'every check passed' || echo 'FAILURES above')"
exit $FAIL
