#!/bin/bash
# fp8_dispatch_check.sh — --fp8-dispatch on the GPU (the cuda FP8 tables' rows: cuda_fp8.h
# cuda_fp8_pack_rows / _round_rows / _unpack_rows) in one call of about three minutes:
#   - test_cuda_fp8_ops (its rows_check lines: both tables' pack, round and unpack bit for bit the cpu's), and
#     memcheck of it;
#   - training (d 160: two tiles a row) on cuda and cuda-fp32 at --precision fp8, with and without the option:
#     step 1's loss the same bits (the experts' forward unchanged), its gradient norm not; and with
#     MOE_FORCE_NCCL=1 (the mesh's exchange on one GPU: the rows packed, moved by NCCL, unpacked) step 1's loss
#     the same bits again; memcheck of the NCCL run;
#   - the reference model at --precision fp8-bf16, 8 steps, with and without the option: tokens/s at steps
#     4-8 (one process: the rounding pass is the whole cost).
# Prepare here: `make build && bash scripts/device/pack_libs.sh .gpu`, tar .gpu into .gpk/gpu.tar.xz; call
# `bash scripts/device/fp8_dispatch_check.sh` with carry [".gpk"]. Output in $OUT/disp.txt and the logs.
# Exit 1 on a test failure, a sanitizer report in ours, or a loss that moved.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start disp 240
t ops 120 $B/test_cuda_fp8_ops
test_line ops
grep "rows " $W/ops.log | tee -a $R
t memops 120 compute-sanitizer --tool memcheck $B/test_cuda_fp8_ops
san_line memops
D="--steps 3 --sample-tokens 0 --plots 0 --batch 16 --seq-len 24 --eval-batches 1 --eval-every 0 --save-every -1
   --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 160 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2
   --precision fp8 --force"
for d in cuda cuda-fp32; do
  t d0_$d 60 $B/moe train $D --device $d --out $W/d0_$d
  t d1_$d 60 $B/moe train $D --device $d --fp8-dispatch 1 --out $W/d1_$d
  t dn_$d 60 env MOE_FORCE_NCCL=1 NCCL_NVLS_ENABLE=0 $B/moe train $D --device $d --fp8-dispatch 1 --out $W/dn_$d
  a=$(first loss $W/d0_$d) b=$(first loss $W/d1_$d) c=$(first loss $W/dn_$d)
  ga=$(first grad_norm $W/d0_$d) gb=$(first grad_norm $W/d1_$d)
  say "   $d: step 1 loss $a without, $b with, $c with through NCCL; grad norm $ga / $gb"
  [ -n "$a" ] && [ "$a" = "$b" ] && [ "$a" = "$c" ] && [ "$ga" != "$gb" ] || { say "   $d: FAIL"; FAIL=1; }
  grep -m1 "fp8-dispatch" $W/d1_$d/train.log | tee -a $R
done
t memn 120 env MOE_FORCE_NCCL=1 NCCL_NVLS_ENABLE=0 compute-sanitizer --tool memcheck $B/moe train $D --device cuda \
  --fp8-dispatch 1 --steps 2 --out $W/memn
san_line memn
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin > /dev/null
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 8 --precision fp8-bf16"
for f in 0 1; do
  t ref_$f 100 stdbuf -oL $B/moe train $P --fp8-dispatch $f --out $W/ref_$f
  say "   --fp8-dispatch $f: tok/s at steps 4-8: $(grep -oE '^step +[4-8]/8.*' $W/ref_$f.log | grep -oE '[0-9]+ tok/s' | tr '\n' ' ')"
done
say "FAIL=$FAIL $(date)"
exit $FAIL
