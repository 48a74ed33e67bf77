#!/bin/bash
# Device recipe (kind nvidia-h200): AMPipe on one GPU. Prepare here (ignored folders, listed in
# .git/info/exclude):  cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu &&
#   (the random token shard is written on the device: scripts/device/random_shard.py needs numpy)
# then run `bash scripts/device/ampipe_check.sh` with carry [".gpu"] (about 6 minutes):
#   1. the GPU suites (test_cuda_ops carries the attention over query ranges: chunks vs one call, and
#      the dropout kernels; test_decode the KV-cached decode on cuda and cuda-fp32);
#   2. a small model on cuda and cuda-fp32 at n = 1, 2, 4 (and n = 2 through NCCL on one GPU:
#      MOE_FORCE_NCCL=1, where the dispatch is left in flight on the comm stream): per-step losses;
#   3. --recompute: full against none on the small model (bitwise), the reference model's peak memory and
#      tokens/s at none and moe;
#   4. the cost of chunking where there is no all-to-all to hide: PEERS.md's reference model
#      (--preset peers-ref, B 4 x T 2048) at n = 1, 2, 4, 1 (tokens/s, the run average of 12 steps).
cd "$(dirname "$0")/../.."
G=$PWD/.gpu; B=$G/bin; W=/tmp/w; mkdir -p $W
. scripts/device/libs.sh && device_libs $G $B/moe
export OMP_NUM_THREADS=16 NCCL_NVLS_ENABLE=0
t() { local name=$1; shift; local t0=$SECONDS; "$@" > $W/$name.log 2>&1; echo "== $name rc=$? $((SECONDS-t0))s"; }
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t ops timeout 250 $B/test_cuda_ops; grep -E "checks" $W/ops.log; grep -m8 FAIL $W/ops.log; grep -i "chunks" $W/ops.log | head -4
t model timeout 150 $B/test_cuda_model; grep -E "checks" $W/model.log; grep -m5 FAIL $W/model.log
t decode timeout 150 $B/test_decode; grep -E "checks" $W/decode.log; grep -m5 FAIL $W/decode.log
S="--steps 4 --batch 8 --seq-len 128 --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 128 --d-ff 256 --n-experts 8
   --top-k 2 --lr 1e-3 --warmup 1 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 --save-every -1 --force"
for dev in cuda cuda-fp32; do
  for n in 1 2 4; do
    $B/moe train --device $dev $S --ampipe $n --out $W/s_${dev}_$n > $W/s.log 2>&1 || tail -3 $W/s.log
    echo "$dev n=$n $(grep -o '"loss":[0-9.e-]*' $W/s_${dev}_$n/metrics.jsonl | cut -d: -f2 | tr '\n' ' ')"
  done
  for mode in dropless "capacity --capacity-factor 0.9"; do
    MOE_FORCE_NCCL=1 $B/moe train --device $dev $S --dispatch $mode --ampipe 2 --out $W/f_$dev > $W/s.log 2>&1 || tail -3 $W/s.log
    MOE_FORCE_NCCL=1 $B/moe train --device $dev $S --dispatch $mode --ampipe 1 --out $W/g_$dev > $W/s.log 2>&1 || tail -3 $W/s.log
    echo "$dev forced NCCL ${mode%% *} n=1 $(grep -o '"loss":[0-9.e-]*' $W/g_$dev/metrics.jsonl | cut -d: -f2 | tr '\n' ' ') dropped $(grep -o '"dropped":[0-9]*' $W/g_$dev/metrics.jsonl | cut -d: -f2 | tr '\n' ' ')"
    echo "$dev forced NCCL ${mode%% *} n=2 $(grep -o '"loss":[0-9.e-]*' $W/f_$dev/metrics.jsonl | cut -d: -f2 | tr '\n' ' ') dropped $(grep -o '"dropped":[0-9]*' $W/f_$dev/metrics.jsonl | cut -d: -f2 | tr '\n' ' ')"
  done
done
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 12"
# --recompute on the GPU: the same bits as keeping the activations (small model), and the reference
# model's memory and speed with the experts' rows recomputed
for dev in cuda cuda-fp32; do
  for rc in none full; do
    $B/moe train --device $dev $S --recompute $rc --out $W/rc_${dev}_$rc > $W/s.log 2>&1 || tail -3 $W/s.log
  done
  cmp -s <(grep -o '"loss":[^,]*,"aux_loss":[^,]*,"z_loss":[^,]*' $W/rc_${dev}_none/metrics.jsonl) \
         <(grep -o '"loss":[^,]*,"aux_loss":[^,]*,"z_loss":[^,]*' $W/rc_${dev}_full/metrics.jsonl) &&
    echo "$dev --recompute full: losses bitwise equal to none" || echo "$dev --recompute full: losses DIFFER from none"
done
for rc in none moe; do
  echo "-- peers-ref, --recompute $rc"
  mem_start
  timeout 150 stdbuf -oL $B/moe train $P --recompute $rc --out $W/run 2>&1 | grep -E "^step 12/|trained"
  echo "   peak GPU memory used (nvidia-smi): $(mem_peak) MiB"
done
for n in 1 2 4 1; do
  echo "-- peers-ref, --ampipe $n"
  timeout 150 stdbuf -oL $B/moe train $P --ampipe $n --out $W/run 2>&1 | grep -E "^step (4|8|12)/|trained"
done
date -u
