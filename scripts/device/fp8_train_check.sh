#!/bin/bash
# fp8_train_check.sh — `--precision fp8` on the GPU (issue 38), one call. Prepare here: `bash
# scripts/device/mesh_pack.sh .gpum` (build/ built with CUDA), then `bash scripts/device/fp8_train_check.sh`
# with carry [".gpum"]; about 3 minutes.
#   1. the GPU ops against the cpu's fp8 table (tests/test_cuda_fp8_ops.c: bit for bit with MOE_FP8_GEMM=ref);
#   2. a tiny model 30 steps: cpu fp8, cuda-fp32 fp8 (reference GEMM and our kernel), cuda fp8, cuda mixed:
#      the per-step losses' largest relative difference from cpu fp8 (the other ops differ in their last
#      bits across devices, so close, not equal) and from cuda mixed (the quantisation's own effect);
#   3. the reference model's step (peers-ref, batch 4 x 2048, 12 steps, random tokens), --precision mixed,
#      bf16 and fp8: median tokens/s of steps 4-12 and the peak GPU memory (nvidia-smi) (REF=0: skipped);
#   4. with PROFILE=1: MOE_PROFILE=1's time per op and step, mixed against fp8.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && mesh_unpack $PWD/${GPUM:-.gpum} /tmp/ft
W=/tmp/ftw; mkdir -p $W; R=${OUT:-$W}/fp8_train.txt; : > $R
export OMP_NUM_THREADS=16 BUDGET=${BUDGET:-400}
say "$(date -u) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
t ops 120 $B/test_cuda_fp8_ops; grep -E "FAIL|checks" $W/ops.log | tee -a $R
TINY="--steps 30 --batch 8 --seq-len 128 --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 256 --d-ff 256
  --n-experts 8 --top-k 2 --lr 1e-3 --warmup 5 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0
  --save-every -1 --force --seed 3"
L() { grep -o '"loss":[^,]*' $1/metrics.jsonl | cut -d: -f2; }
for c in "cpu fp8 -" "cuda-fp32 fp8 ref" "cuda-fp32 fp8 kernel" "cuda fp8 kernel" "cuda mixed -" "cpu mixed -"; do
  set -- $c
  n=$1-$2-$3
  MOE_FP8_GEMM=${3/-/kernel} timeout 120 $B/moe train --device $1 --precision $2 $TINY --out $W/$n > $W/$n.log 2>&1 ||
    { say "$n failed"; tail -3 $W/$n.log | tee -a $R; }
done
rel() { paste <(L $W/$1) <(L $W/$2) | awk -v a=$1 -v b=$2 '{d=($1-$2)/$2; if(d<0)d=-d; if(d>m)m=d} END{printf "%-22s vs %-16s max relative loss difference over %d steps: %.2e\n", a, b, NR, m}' | tee -a $R; }
rel cuda-fp32-fp8-ref cpu-fp8--; rel cuda-fp32-fp8-kernel cpu-fp8--; rel cuda-fp8-kernel cpu-fp8--
rel cpu-fp8-- cpu-mixed--; rel cuda-fp8-kernel cuda-mixed--
say "final losses: $(for n in cpu-fp8-- cpu-mixed-- cuda-fp8-kernel cuda-mixed--; do echo -n "$n $(L $W/$n | tail -1)  "; done)"
[ -f $W/rand32k.bin ] || python3 scripts/device/random_shard.py $W/rand32k.bin
for p in ${REFP-mixed fp8 bf16}; do
  mem_start
  timeout 150 stdbuf -oL $B/moe train --device cuda --preset peers-ref --batch 4 --seq-len 2048 --precision $p --steps 12 \
    --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 --force \
    --data $W/rand32k.bin --out $W/ref > $W/ref_$p.log 2>&1 || { say "ref $p failed"; tail -3 $W/ref_$p.log | tee -a $R; }
  peak=$(mem_peak)
  tps=$(grep -E "^step ([4-9]|1[0-2])/" $W/ref_$p.log | sed 's/.*| *\([0-9]*\) tok\/s.*/\1/' | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
  say "peers-ref --precision $p: median $tps tokens/s (steps 4-12), peak GPU memory $peak MiB"
done
if [ -n "$PROFILE" ]; then # the ops' time per step (MOE_PROFILE=1: each op synchronised), mixed against fp8
  for p in mixed fp8; do
    timeout 120 env MOE_PROFILE=1 stdbuf -oL $B/moe train --device cuda --preset peers-ref --batch 4 --seq-len 2048 \
      --precision $p --steps 4 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0 --eval-batches 1 --sample-tokens 0 \
      --plots 0 --force --data $W/rand32k.bin --out $W/prof > $W/prof_$p.log 2>&1
    say "-- profile, --precision $p"; grep -E "^profile|^  [a-z].*calls" $W/prof_$p.log | head -24 | tee -a $R
  done
fi
say "$(date -u) done"
