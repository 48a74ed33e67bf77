#!/bin/bash
# Device recipe (kind nvidia-h200): a candidate kernel change against the binaries before it, in one call, the
# runs alternating (old, new, old, new) so that the card's clock drift falls on both. Prepare here:
#   git worktree add /tmp/old <base> && cmake -S /tmp/old -B /tmp/old/b && cmake --build /tmp/old/b -j2 \
#     --target moe moe_bench_layer && mkdir -p .gpu/old && cp /tmp/old/b/{moe,moe_bench_layer} .gpu/old/
#   cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu       (the candidate, into .gpu/bin)
#   rm -f .gpu/bin/{test_nccl,test_slots,test_decode,ckpt_diff}   (the carry holds 64 MiB; .gpu/lib takes ~46)
# then run `bash scripts/device/ab_check.sh` with carry [".gpu"] (about 4 minutes with the defaults).
# PARTS picks (default "suites layer step"): suites: the candidate's test_cuda_ops and test_cuda_model (a
# failure stops the recipe); layer: moe_bench_layer on CASES (default ref,mixtral,olmoe), twice each; step:
# the reference model, 12 steps, for each of POLICIES (default "mixed bf16"): tokens/s at steps 4, 8, 12,
# peak GPU memory, and whether the losses of steps 1-3 are the same as the old binary's. Progress goes to
# $OUT/ab.txt as it is made.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start ab 560
O=$G/old
PARTS=${PARTS:-suites layer step}
for b in $O/moe $O/moe_bench_layer $B/moe $B/moe_bench_layer; do
  [ -x "$b" ] || { say "ab_check: $b is missing (see the top of this script)"; exit 2; }
done
if has suites; then
  t ops 150 $B/test_cuda_ops; grep -E "checks" $W/ops.log | tee -a $R; grep -m8 FAIL $W/ops.log | tee -a $R
  t model 60 $B/test_cuda_model; grep -E "checks" $W/model.log | tee -a $R; grep -m5 FAIL $W/model.log | tee -a $R
  grep -q ' 0 failed' $W/ops.log && grep -q ' 0 failed' $W/model.log || { say "ab_check: a GPU suite failed: stop"; exit 1; }
fi
if has layer; then   # per case: the layer's median, then the expert GEMMs' forward and backward of the profiled iteration
  for i in 1 2; do
    for v in old new; do
      d=$B; [ $v = old ] && d=$O
      t layer_${v}_$i 100 $d/moe_bench_layer --cases ${CASES:-ref,mixtral,olmoe} --iters 10 --warmup 3 --profile 1
      say "layer $v $i: $(awk '/^== /{printf "%s", $2} /^layer fwd\+bwd: median/{printf " %s", $4}
        /expert GEMMs fwd \(/{printf " fwd %s", $(NF-2)} /expert GEMMs bwd \(/{printf " bwd %s |", $(NF-2)}' $W/layer_${v}_$i.log)"
    done
  done
fi
if has step; then
  [ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin
  P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
     --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 12"
  for pol in ${POLICIES:-mixed bf16}; do
    for v in new old; do
      d=$B; [ $v = old ] && d=$O
      mem_start
      t step_${pol}_$v 90 stdbuf -oL $d/moe train $P --precision $pol --out $W/run_${pol}_$v
      say "step $pol $v: $(grep -E '^step +(4|8|12)/' $W/step_${pol}_$v.log | grep -o '[0-9]* tok/s' | tr '\n' ' ')| peak $(mem_peak) MiB"
    done
    L() { grep -E '^step +(1|2|3)/' $W/step_${pol}_$1.log | cut -d'|' -f2-4; }
    if [ -n "$(L new)" ] && cmp -s <(L new) <(L old); then say "step $pol: losses of steps 1-3 the same as the old binary's"
    else say "step $pol: losses of steps 1-3 DIFFER from the old binary's"; paste <(L old) <(L new) | tee -a $R; fi
  done
fi
say "$(date -u) done"
