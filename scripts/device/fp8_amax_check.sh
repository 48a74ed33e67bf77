#!/bin/bash
# fp8_amax_check.sh — the amax record of the cuda FP8 tables (pending/fp8amax-cuda: every quantiser raises
# its counter's second word to 1 + the largest finite group's amax bits, ops.h Backend.fp8_amax reads them)
# in one call of about four minutes:
#   - test_cuda_fp8_quant (each quantiser's amax word against the host reference's scales, awkward sizes, NaN
#     and infinity), test_cuda_fp8_fused (the fused kernels' words the plain ones' bits), test_cuda_fp8_ops
#     (both tables' exponents per tensor the cpu table's; bitwise and kernel halves); memcheck of the quantiser
#     test;
#   - training (test_fp8_train.sh's amax model, 3 steps at --lr 10, --grad-accum 2) on cpu, cuda-fp32 and
#     cuda under --precision fp8: one warning at step 2 on each, its count metrics.jsonl's (the cpu's and the
#     GPU's count compared: equal where the operands' exponents are), and the healthy tiny default at fp8 for
#     30 steps with no jump;
#   - the cost: the reference model at --precision fp8-bf16, 8 steps, old (.gpu/old: main's moe, by
#     pack_variants.sh) and new alternating twice: tokens/s at steps 4-8, losses and gradient norms the same
#     bits (the codes and scales are unchanged; only the counters' second word is new).
# Prepare here (the fp8amax-cuda build): `make build && bash scripts/device/pack_libs.sh .gpu &&
# PROGRAMS=moe bash scripts/device/pack_variants.sh .gpu old=main`, tar .gpu into .gpk (docs/PERFORMANCE.md,
# "Reproduce"); call `bash scripts/device/fp8_amax_check.sh` with carry [".gpk"]. Output in $OUT/amax.txt and
# the logs. Exit 1 on a test failure, a sanitizer report in ours, a missing warning, or other losses.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start amax 280
for n in quant fused ops; do
  t $n 90 $B/test_cuda_fp8_$n
  test_line $n
  grep -m4 "amax" $W/$n.log | tee -a $R
done
t memq 90 compute-sanitizer --tool memcheck $B/test_cuda_fp8_quant
san_line memq
AJ="--steps 3 --sample-tokens 0 --plots 0 --batch 8 --seq-len 32 --eval-batches 1 --eval-every 0 --save-every -1
    --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --warmup 0 --lr 10
    --grad-accum 2 --precision fp8 --force"
jumps() { grep -o '"fp8_amax_jumps":[0-9]*' "$1/metrics.jsonl" | cut -d: -f2 | tr '\n' ' '; }
for d in cpu cuda-fp32 cuda; do
  t aj_$d 60 $B/moe train $AJ --device $d --out $W/aj_$d
  w=$(grep "^warning: step" $W/aj_$d/train.log)
  say "   $d: jumps per step '$(jumps $W/aj_$d)'; ${w:0:200}"
  read -r j1 j2 j3 <<< "$(jumps $W/aj_$d)"
  [ "$j1" = 0 ] && [ "${j2:-0}" -ge 2 ] && [[ "$w" == "warning: step 2: --precision fp8: $j2 FP8 operands"* ]] ||
    { say "   $d: FAIL (want 0, >= 2, one warning at step 2 with that count)"; FAIL=1; }
  [ "$d" = cpu ] || [ "$j2" = "$(jumps $W/aj_cpu | cut -d' ' -f2)" ] || say "   $d: step 2's count is not the cpu's (exponents at a boundary?)"
done
t healthy 90 $B/moe train --device cuda --precision fp8 --steps 30 --eval-every 0 --save-every -1 --plots 0 \
  --sample-tokens 0 --force --out $W/healthy
h=$(jumps $W/healthy)
say "   healthy tiny default, 30 steps: jumps '${h:0:80}'"
[ -n "$h" ] && [ -z "$(echo $h | tr -d '0 ')" ] || { say "   healthy: FAIL (want 30 zeros)"; FAIL=1; }
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin > /dev/null
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 8 --precision fp8-bf16"
bits() { grep -oE '"loss":[^,]*|"grad_norm":[^,]*' "$1/metrics.jsonl"; }
for i in 1 2; do
  for v in old new; do
    m=$B/moe; [ $v = old ] && m=$G/old/moe
    t ref_${v}_$i 100 stdbuf -oL $m train $P --out $W/ref_${v}_$i
    say "   $v ($i): tok/s at steps 4-8: $(grep -oE '^step +[4-8]/8.*' $W/ref_${v}_$i.log | grep -oE '[0-9]+ tok/s' | tr '\n' ' ')"
  done
  if cmp -s <(bits $W/ref_old_$i) <(bits $W/ref_new_$i); then say "   new ($i): losses and norms the bits of old's"
  else say "   new ($i): FAIL losses differ from old's"; FAIL=1; fi
done
say "FAIL=$FAIL $(date -u)"
exit $FAIL
