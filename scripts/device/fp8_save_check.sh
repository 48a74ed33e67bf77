#!/bin/bash
# fp8_save_check.sh — --fp8-save on the GPU (ops.h Backend.fp8_save: the cuda FP8 tables' grouped_swiglu_bwd
# with act NULL, cuda_nn.cu cuda_swiglu_act_hid; the rows through fp8dispatch-cuda's kernels) in one call of
# about four minutes:
#   - test_cuda_fp8_ops (its "act NULL" lines: dw2 and dh1 against the cpu's table) and memcheck of it;
#   - training (d 160, d_ff 200: two tiles a SwiGLU row) on cuda and cuda-fp32 at --precision fp8, with and
#     without the option: step 1's loss the same bits (the forward unchanged), its gradient norm not; with
#     --ampipe 2 too (each chunk's rows through the shared buffers); memcheck of the cuda run;
#   - the reference model at --precision fp8-bf16, batch 8 (where the activations outgrow the expert
#     gradients' memory: moe info 70.75 GiB without, 60.82 with), 10 steps each way: nvidia-smi's peak and
#     tokens/s at steps 6-10, against moe info's figures.
# Prepare here: `make build && bash scripts/device/pack_libs.sh .gpu`, tar .gpu into .gpk/gpu.tar.xz; call
# `bash scripts/device/fp8_save_check.sh` with carry [".gpk"]. Output in $OUT/save.txt and the logs.
# Exit 1 on a test failure, a sanitizer report in ours, or a loss that moved.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start save 330
t ops 120 $B/test_cuda_fp8_ops
test_line ops
grep "act NULL" $W/ops.log | tee -a $R
t memops 120 compute-sanitizer --tool memcheck $B/test_cuda_fp8_ops
san_line memops
D="--steps 3 --sample-tokens 0 --plots 0 --batch 16 --seq-len 24 --eval-batches 1 --eval-every 0 --save-every -1
   --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 160 --d-ff 200 --n-experts 4 --lr 1e-2 --warmup 2
   --precision fp8 --force"
for d in cuda cuda-fp32; do
  for a in 1 2; do
    t s0_${d}_$a 60 $B/moe train $D --device $d --ampipe $a --out $W/s0_${d}_$a
    t s1_${d}_$a 60 $B/moe train $D --device $d --ampipe $a --fp8-save 1 --out $W/s1_${d}_$a
    x=$(first loss $W/s0_${d}_$a) y=$(first loss $W/s1_${d}_$a) gx=$(first grad_norm $W/s0_${d}_$a)
    gy=$(first grad_norm $W/s1_${d}_$a)
    say "   $d --ampipe $a: step 1 loss $x without, $y with; grad norm $gx / $gy"
    [ -n "$x" ] && [ "$x" = "$y" ] && [ "$gx" != "$gy" ] || { say "   $d --ampipe $a: FAIL"; FAIL=1; }
  done
  grep -m1 "fp8-save" $W/s1_${d}_1/train.log | tee -a $R
done
t memt 120 compute-sanitizer --tool memcheck $B/moe train $D --device cuda --fp8-save 1 --steps 2 --out $W/memt
san_line memt
[ -f $G/rand_big.bin ] || python3 scripts/device/random_shard.py $G/rand_big.bin 8392704 > /dev/null
P="--preset peers-ref --device cuda --batch 8 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand_big.bin --steps 10 --precision fp8-bf16"
for f in 0 1; do
  say "   moe info: $($B/moe info --preset peers-ref --batch 8 --seq-len 2048 --precision fp8-bf16 --fp8-save $f | grep -o '): [0-9.]* GiB plus' | head -1)"
  mem_start
  t ref_$f 120 stdbuf -oL $B/moe train $P --fp8-save $f --out $W/ref_$f
  say "   --fp8-save $f: peak GPU memory (nvidia-smi) $(mem_peak) MiB; tok/s at steps 6-10: $(grep -oE '^step +([6-9]|10)/10.*' $W/ref_$f.log | grep -oE '[0-9]+ tok/s' | tr '\n' ' ')"
done
say "FAIL=$FAIL $(date)"
exit $FAIL
