#!/bin/bash
# grad_holes_check.sh — the packed expert gradients' holes on the GPU (pending/gradholes-cuda: cuda_vm.cu's
# alloc_holes, the parameter buffer's virtual memory moved onto it) in one call of about eight minutes:
#   - test_cuda_ops (alloc_holes: reads, writes and a packed weight gradient beside a hole; the bf16 policy's
#     parameter buffer on the moved virtual memory) and test_cuda_model (the packed expert gradients, whose
#     places main moved: whole-layer packing);
#   - the reference model, 12 steps at --precision bf16: plain; --recompute moe --recompute-layers 3 and 4 (the
#     bf16 memory target: ~1,056 and ~1,584 MiB less by moe info); --recompute moe with the holes and with
#     MOE_GRAD_HOLES=0: tokens/s at steps 4 / 8 / 12, peak GPU memory by nvidia-smi against `moe info`'s figure
#     (+ 0.5 GiB of CUDA context; the compiled bf16 peer's peak: 46,915 MiB), and the last two the same bits;
#   - test_grad_memory.sh on cuda (MOE_TEST_DEVICE=cuda: every one-process case bit for bit against separate
#     memory, the holes' cases also against MOE_GRAD_HOLES=0);
#   - memcheck of a tiny --precision bf16 --recompute moe train (holes in every layer: the log's memory line).
# Prepare here (the gradholes-cuda build): `make build && bash scripts/device/pack_libs.sh .gpu`, tar .gpu
# into .gpk (docs/PERFORMANCE.md, "Reproduce"); call `bash scripts/device/grad_holes_check.sh` with carry
# [".gpk"]. Output in $OUT/holes.txt and the logs. Exit 1 on a test failure, a sanitizer report in ours, or
# losses that differ with the holes.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start holes 560
t ops 150 $B/test_cuda_ops
test_line ops
grep -E "alloc_holes" $W/ops.log | head -5 | tee -a $R
t model 150 $B/test_cuda_model
test_line model
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin > /dev/null
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 12 --precision bf16"
bits() { grep -oE '"loss":[^,]*|"grad_norm":[^,]*' "$1/metrics.jsonl"; }
for c in "plain::" "rc3:1:--recompute moe --recompute-layers 3" "rc4:1:--recompute moe --recompute-layers 4" \
         "rc_holes:1:--recompute moe" "rc_whole:0:--recompute moe"; do
  n=${c%%:*}; h=${c#*:}; h=${h%%:*}; f=${c##*:}
  mem_start
  t step_$n 120 env MOE_GRAD_HOLES=${h:-1} stdbuf -oL $B/moe train $P $f --out $W/r_$n
  peak=$(mem_peak)
  grep -E "^step (4|8|12)/|^memory:" $W/step_$n.log | cut -c1-120 | tee -a $R
  say "   $n: peak GPU memory used (nvidia-smi) $peak MiB; moe info: $($B/moe info --preset peers-ref --batch 4 \
--seq-len 2048 --precision bf16 $f 2>&1 | grep -o '): [0-9.]* GiB plus' | head -1)"
done
if cmp -s <(bits $W/r_rc_whole) <(bits $W/r_rc_holes); then say "   rc_holes: losses and gradient norms the bits of rc_whole's"
else say "   rc_holes: losses differ from rc_whole's"; FAIL=1; fi
t gm 200 env MOE_TEST_DEVICE=cuda MOE_BIN=$B/moe bash tests/test_grad_memory.sh
grep -E "^(PASS|FAIL|SKIP)" $W/gm.log | cut -c1-140 | tee -a $R
grep -q "^FAIL" $W/gm.log && FAIL=1
TINY="--device cuda --precision bf16 --recompute moe --steps 2 --batch 2 --seq-len 64 --eval-every 0 --save-every -1
      --plots 0 --sample-tokens 0 --force --d-ff 768"
t mem 150 compute-sanitizer --tool memcheck $B/moe train $TINY --out $W/mt
san_line mem
grep -o "memory: .*" $W/mem.log | tee -a $R
say "FAIL=$FAIL $(date -u)"
exit $FAIL
