#!/bin/bash
# Device recipe (kind nvidia-h200): the whole tree's GPU tests in one call. Prepare here:
#   cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu
# then run `bash scripts/device/suite_check.sh` with carry [".gpu"] (about 9 minutes). Progress goes to
# $OUT/suite.txt as it is made (a call that runs past its limit still returns it):
#   1. the GPU suites: test_cuda_ops, test_cuda_model, test_decode, test_slots;
#   2. --recompute full against none on a small model, cuda and cuda-fp32 (losses bitwise equal);
#      the reference model's peak memory and tokens/s at --recompute none and moe;
#   3. compute-sanitizer: memcheck on the op suite (both CUDA backends, small shapes) and on test_decode,
#      racecheck on the op suite (cuda); each bounded, skipped when the call's time is spent, and judged by
#      sanitize_scan.sh (a report in our kernels fails, cuBLAS's are listed).
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start suite 560
t ops 200 $B/test_cuda_ops;     grep -E "checks" $W/ops.log | tee -a $R; grep -m8 FAIL $W/ops.log | tee -a $R
t model 120 $B/test_cuda_model; grep -E "checks" $W/model.log | tee -a $R; grep -m5 FAIL $W/model.log | tee -a $R
t decode 90 $B/test_decode;     grep -E "checks" $W/decode.log | tee -a $R; grep -m5 FAIL $W/decode.log | tee -a $R
t slots 90 $B/test_slots;       grep -E "checks" $W/slots.log | tee -a $R; grep -m5 FAIL $W/slots.log | tee -a $R
S="--steps 4 --batch 8 --seq-len 128 --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 128 --d-ff 256 --n-experts 8
   --top-k 2 --lr 1e-3 --warmup 1 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 --save-every -1 --force"
for dev in cuda cuda-fp32; do
  for rc in none full; do
    $B/moe train --device $dev $S --recompute $rc --out $W/rc_${dev}_$rc > $W/s.log 2>&1 || tail -3 $W/s.log | tee -a $R
  done
  L() { grep -o '"loss":[^,]*,"aux_loss":[^,]*,"z_loss":[^,]*' $1/metrics.jsonl; }
  cmp -s <(L $W/rc_${dev}_none) <(L $W/rc_${dev}_full) && say "$dev --recompute full: losses bitwise equal to none ($(L $W/rc_${dev}_full | wc -l) steps)" \
    || { say "$dev --recompute full: losses DIFFER from none"; paste <(L $W/rc_${dev}_none) <(L $W/rc_${dev}_full) | tee -a $R; }
done
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 12"
for rc in ${REF-none moe}; do   # REF="": no reference-model runs
  mem_start
  t ref_$rc 120 stdbuf -oL $B/moe train $P --recompute $rc --out $W/run
  peak=$(mem_peak); grep -E "^step 12/|trained|memory" $W/ref_$rc.log | tee -a $R
  say "   peers-ref --recompute $rc: peak GPU memory used (nvidia-smi) $peak MiB"
done
# (san_line: the summary and sanitize_scan.sh's judgement, each report ours or third-party by kernel)
for be in cuda cuda-fp32; do
  t mem_$be 110 env MOE_TEST_SMALL=1 MOE_TEST_BACKEND=$be compute-sanitizer --tool memcheck $B/test_cuda_ops && san_line mem_$be
done
t mem_decode 80 compute-sanitizer --tool memcheck $B/test_decode && san_line mem_decode
t race_cuda 150 env MOE_TEST_SMALL=1 MOE_TEST_BACKEND=cuda compute-sanitizer --tool racecheck $B/test_cuda_ops && san_line race_cuda
say "$(date -u) done"
