#!/bin/bash
# Device recipe (kind nvidia-h200): the experts' bf16 hidden rows (ops.h hid_elem) where one GPU can check
# them, in one call. Prepare here: cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu (and
# cp ../shared/bench/torch_train_peer.py .gpu/ for the step part); run with carry [".gpu"] (~7 minutes).
# Progress in $OUT/hidden.txt as it is made.
#   1. test_cuda_ops, test_cuda_model; compute-sanitizer memcheck on the op suite (small shapes)
#   2. the pipelined exchange's chunks on cuda (MOE_FORCE_NCCL=1: EP 1 through NCCL, so r > 1 runs and
#      the hidden rows are addressed per chunk): r 2 / 4 against r 1, step 1's loss bitwise (the forward),
#      later steps at round-off (the weight gradients summed over r chunks)
#   3. verify_hf_families.py against transformers on cuda-fp32 (1e-4) and cuda (the bf16 band, 3e-2)
#   4. the reference model's step under both policies and MOE_PROFILE=1 of each, with the compiled peers
#      (full_step.sh PARTS="step profile" EXTRA="--precision bf16")
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start hidden 300
t ops 200 $B/test_cuda_ops; grep -E "checks" $W/ops.log | tee -a $R; grep -m8 FAIL $W/ops.log | tee -a $R
t model 120 $B/test_cuda_model; grep -E "checks" $W/model.log | tee -a $R; grep -m5 FAIL $W/model.log | tee -a $R
t mem 110 env MOE_TEST_SMALL=1 MOE_TEST_BACKEND=cuda compute-sanitizer --tool memcheck $B/test_cuda_ops
grep -E "ERROR SUMMARY|checks" $W/mem.log | tail -2 | tee -a $R
F="--device cuda --steps 6 --force --quiet --sample-tokens 0 --plots 0 --eval-every 0 --eval-batches 1 --save-every -1
   --preset small --batch 16 --seq-len 256"
for r in 1 2 4; do t nccl_r$r 60 env MOE_FORCE_NCCL=1 $B/moe train --out $W/n$r $F --a2a-overlap $r; done
python3 scripts/device/chunk_losses.py "cuda, MOE_FORCE_NCCL, --a2a-overlap" $W/n1 $W/n2 $W/n4 | tee -a $R
for d in cuda-fp32 cuda; do
  tol=1e-4; [ $d = cuda ] && tol=3e-2
  t fam_$d 70 python3 scripts/verify_hf_families.py $B/moe --moe-device $d --tol $tol
  grep -E "top-k|grad, max|FAIL|passed" $W/fam_$d.log | tee -a $R
done
grep -A48 "^qwen3_moe: per-tensor" $W/fam_cuda.log | grep flipped | tee -a $R
say "$(date -u) parts 1-3 done"
