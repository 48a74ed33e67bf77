#!/bin/bash
# Device recipe (kind nvidia-h200): the tensor-core attention and the grouped GEMM's fine-grained shapes.
# Prepare here: cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu &&
#   cp build/moe_bench_attention .gpu/bin/ && cp ../shared/bench/torch_moe_peer.py .gpu/
#   (optionally an older build's bench as .gpu/bin/moe_bench_attention_old: timed beside the new one)
# then `bash scripts/device/attn_check.sh` with carry [".gpu"] (about 2 minutes; LAYER=0 leaves out 3.); progress in $OUT/attn.txt:
#   1. test_cuda_ops (the attention kernels against the cpu, chunks against one call; 256 groups);
#   2. attention fwd/bwd on the reference shape: ours (old, new, new) and torch SDPA in the same call;
#      ncu's per-kernel durations (--clock-control none);
#   3. the MoE layer at qwen2 and e256 (ours, ours through cuBLAS, torch._grouped_mm);
#   4. the reference model's full step (tokens/s);
#   5. compute-sanitizer memcheck and racecheck on the op suite (small shapes, cuda).
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start attn 560
t ops 200 $B/test_cuda_ops; grep -E "checks" $W/ops.log | tee -a $R; grep -m12 FAIL $W/ops.log | tee -a $R
grep -E "^ *attention|grouped" $W/ops.log | head -12 | tee -a $R
t model 100 $B/test_cuda_model; grep -E "checks" $W/model.log | tee -a $R; grep -m5 FAIL $W/model.log | tee -a $R
for v in old new old new; do
  b=$B/moe_bench_attention; [ $v = old ] && b=$B/moe_bench_attention_old
  [ -x $b ] && { t att_$v 60 $b --device cuda --iters 20; say "$v: $(cat $W/att_$v.log)"; }
done
t sdpa 90 python3 bench/torch_attention_peer.py; say "sdpa: $(grep impl $W/sdpa.log)"
for v in old new; do
  b=$B/moe_bench_attention; [ $v = old ] && b=$B/moe_bench_attention_old
  [ -x $b ] && t ncu_$v 90 ncu --clock-control none -k regex:'att_|rowdot|bf16' --metrics gpu__time_duration.sum $b --device cuda --iters 1
  [ -f $W/ncu_$v.log ] && say "$v kernels (us): $(grep -E '^  [a-z_]|gpu__time_duration' $W/ncu_$v.log | paste - - | awk '{n=$1; sub(/\(.*/,"",n); print n, $NF}' | tail -9 | tr '\n' ';')"
done
if [ "${LAYER:-1}" = 1 ]; then for mode in auto cublas; do
  MOE_GROUPED_GEMM=$mode t layer_$mode 150 $B/moe_bench_layer --cases qwen2,e256 --iters 10 --warmup 3
  say "layer $mode: $(grep -E '^== |layer fwd' $W/layer_$mode.log | tr '\n' ' ')"
done
t peer 150 python3 bench/torch_moe_peer_cases.py $G/torch_moe_peer.py qwen2,e256; grep case $W/peer.log | tee -a $R
fi
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 12"
t ref 120 stdbuf -oL $B/moe train $P --out $W/run; grep -E "^step 12/|trained" $W/ref.log | tee -a $R
t mem 110 env MOE_TEST_SMALL=1 MOE_TEST_BACKEND=cuda compute-sanitizer --tool memcheck $B/test_cuda_ops
grep -E "ERROR SUMMARY|checks" $W/mem.log | tail -2 | tee -a $R
t race 150 env MOE_TEST_SMALL=1 MOE_TEST_BACKEND=cuda compute-sanitizer --tool racecheck $B/test_cuda_ops
grep -E "RACECHECK SUMMARY|checks" $W/race.log | tail -2 | tee -a $R; grep -m3 -A6 "hazard" $W/race.log | head -20 | tee -a $R
say "$(date -u) done"
