#!/bin/bash
# Device recipe (kind nvidia-h200): where the bf16 step's gap to the compiled peer grows with the sequence
# length (issue 38: 0.99x the peer's tokens/s at T 2048, 0.92x at T 8192, same tokens a step). For each shape
# in SHAPES (B:T, default "1:8192 4:2048"): our reference-model step at --precision bf16 under the CUPTI tracer
# (7 steps, the last 4 read: gputrace.py's wall, busy and idle time and kernel time by name) and the compiled
# pure-bf16 peer's step under torch.profiler (scripts/device/peer_profile.py, PEER_B / PEER_T). Prepare as
# suite_check.sh (.gpk/gpu.tar.xz with .gpu/torch_train_peer.py); run `bash scripts/device/long_trace.sh` with
# carry [".gpk"] (about 6 minutes). Output: $OUT/trace.txt (progress and the heads), $OUT/ours_T.txt and
# $OUT/peer_T.txt (the kernel tables) for each T.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start trace 560
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin
for s in ${SHAPES:-1:8192 4:2048}; do
  b=${s%:*} T=${s#*:}
  say "-- B $b T $T, ours (--precision bf16, CUPTI trace of 7 steps)"
  t ours_$T 150 env GPUTRACE_OUT=$W/trace_$T.txt LD_PRELOAD=$G/lib/libgputrace.so $B/moe train --preset peers-ref \
    --device cuda --batch $b --seq-len $T --max-seq-len $T --precision bf16 --lr 1e-4 --warmup 1 --save-every -1 \
    --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 7 --out $W/run
  grep -E "^step 7/" $W/ours_$T.log | tee -a $R
  python3 scripts/device/gputrace.py $W/trace_$T.txt --skip 3 --top 45 > ${OUT:-$W}/ours_$T.txt 2>&1
  head -12 ${OUT:-$W}/ours_$T.txt | tee -a $R
  say "-- B $b T $T, the compiled bf16 peer (torch.profiler, 5 steps after 12)"
  t peer_$T 200 env PEER_B=$b PEER_T=$T python3 scripts/device/peer_profile.py $G/torch_train_peer.py
  cp $W/peer_$T.log ${OUT:-$W}/peer_$T.txt; head -25 $W/peer_$T.log | tee -a $R
done
say "$(date -u) done"
