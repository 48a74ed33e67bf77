#!/bin/bash
# host_gaps.sh — issue 38's CUDA-graph item, its measured ceiling: how much of a step the GPU idles (the
# most a captured, replayed step could give back) on the issue's small model (d 384, 6 layers, 8 experts
# top-2, seq 256, batch 64; CASES="small ref" adds the reference model), under --precision bf16: `moe train`
# with scripts/device/gputrace.c preloaded (CUPTI activity records of every kernel, copy and runtime call),
# then gputrace.py: per step the wall time, the GPU's busy time, the idle gaps with what surrounds them and
# the host calls inside them. Prepare here: `bash scripts/device/mesh_pack.sh .gpum`, and the tracer with
# its libcupti in .gpum/gt (`bash scripts/device/pack_libs.sh /tmp/p && cp /tmp/p/lib/libgputrace.so
# /tmp/p/lib/libcupti.so.* .gpum/gt/`); run with carry [".gpum"] (about 2 minutes a case). Output:
# $OUT/host_gaps.txt.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && mesh_unpack $PWD/${GPUM:-.gpum} /tmp/hg
W=/tmp/hgw; mkdir -p $W; R=${OUT:-$W}/host_gaps.txt; : > $R
export OMP_NUM_THREADS=16
say "$(date -u) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
GT=${GT:-$PWD/.gpum/gt} # libgputrace.so and libcupti, built here by pack_libs.sh's rule (below)
[ -f $GT/libgputrace.so ] || { say "no $GT/libgputrace.so: build it here with scripts/device/pack_libs.sh"; exit 1; }
export LD_LIBRARY_PATH=$GT:${LD_LIBRARY_PATH:-}
[ -f $W/rand32k.bin ] || python3 scripts/device/random_shard.py $W/rand32k.bin
SMALL="--n-layers 6 --d-model 384 --n-heads 6 --n-kv-heads 6 --d-ff 1024 --n-experts 8 --top-k 2 --batch 64
  --seq-len 256 --vocab-size 32000"
REF="--preset peers-ref --batch 4 --seq-len 2048"
FAIL=0
for c in ${CASES:-small}; do
  [ $c = small ] && M=$SMALL || M=$REF
  rm -rf $W/o-$c
  for tr in 0 1; do # untraced (the tokens/s a user sees), then traced
    if [ $tr = 1 ]; then pre="env GPUTRACE_OUT=$W/$c.trace LD_PRELOAD=$GT/libgputrace.so"; else pre=env; fi
    rm -rf $W/o-$c
    timeout 240 $pre $B/moe train --device cuda --precision bf16 $M --lr 1e-4 --warmup 1 --steps 12 \
      --data $W/rand32k.bin --out $W/o-$c > $W/$c-$tr.log 2>&1 || { say "$c (traced $tr): train failed"; tail -3 $W/$c-$tr.log | tee -a $R; FAIL=1; continue; }
    say "$c (traced $tr): $(grep -E '^step (4|8|12)/' $W/$c-$tr.log | awk '{printf "%s ", $0}' | cut -c1-300)"
  done
  [ -f $W/$c.trace ] && python3 scripts/device/gputrace.py $W/$c.trace --skip 3 --top 12 | tee -a $R
done
say "$(date -u) done"
exit $FAIL
