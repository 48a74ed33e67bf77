#!/bin/bash
# fp8_dense_check.sh — --fp8-dense on the GPU (issue 38: the attention projections' products in the FP8
# recipe; src/ops/cuda/cuda_fp8_ops.cu's dense tables) in one call of about four minutes:
#   - test_cuda_fp8_ops (its dense cases against the cpu's table: bit for bit with MOE_FP8_GEMM=ref on
#     cuda-fp32, within the kernel's bands otherwise; the program runs itself both ways);
#   - memcheck of a tiny --precision fp8 --fp8-dense train on cuda (GQA), and of deepseek-v3-tiny's (latent
#     attention's products);
#   - the reference model, 12 steps at --precision fp8-bf16 without and with --fp8-dense, one after the
#     other: tokens/s at steps 4 / 8 / 12, peak memory by nvidia-smi against `moe info`'s figure (+ 0.5 GiB
#     of CUDA context), and step 1's losses (the two differ by the projections' quantisation only).
# Prepare here (the fp8dense-gpu build): `make build && bash scripts/device/pack_libs.sh .gpu`, tar it into
# .gpk (docs/PERFORMANCE.md, "Reproduce"); call `bash scripts/device/fp8_dense_check.sh` with carry
# [".gpk"]. Output in $OUT/dense.txt and the logs. Exit 1 on a test failure or a sanitizer report in ours.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start dense 420
t ops 200 $B/test_cuda_fp8_ops
grep -E "dense|checks, [0-9]+ failed" $W/ops.log | tail -40 | tee -a $R
grep -q "^FAIL" $W/ops.log && FAIL=1
grep -qE "^kernel: [0-9]+ checks, 0 failed" $W/ops.log || FAIL=1
grep -qE "^MOE_FP8_GEMM=ref: [0-9]+ checks, 0 failed" $W/ops.log || FAIL=1
TINY="--device cuda --precision fp8 --fp8-dense 1 --steps 2 --batch 2 --seq-len 64 --eval-every 0 --save-every -1
      --plots 0 --sample-tokens 0 --force"
t mem 150 compute-sanitizer --tool memcheck $B/moe train $TINY --out $W/mt; san_line mem
t mem_mla 150 compute-sanitizer --tool memcheck $B/moe train $TINY --preset deepseek-v3-tiny --out $W/mm
san_line mem_mla
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin > /dev/null
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 12 --precision fp8-bf16"
for dn in 0 1; do
  mem_start
  t step_$dn 180 stdbuf -oL $B/moe train $P --fp8-dense $dn --out $W/r$dn
  peak=$(mem_peak)
  grep -E "^step (1|4|8|12)/" $W/step_$dn.log | cut -c1-110 | tee -a $R
  say "   --fp8-dense $dn: peak GPU memory used (nvidia-smi) $peak MiB; moe info: $($B/moe info --preset peers-ref \
--batch 4 --seq-len 2048 --precision fp8-bf16 --fp8-dense $dn 2>&1 | grep -o '): [0-9.]* GiB plus' | head -1)"
done
say "FAIL=$FAIL $(date -u)"
exit $FAIL
