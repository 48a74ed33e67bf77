#!/bin/bash
# plan_check.sh — issue 41's one-GPU validation of `moe plan` (a benchmark, not a test): for the reference
# model (peers-ref, batch 4 x 2048 on uniform random tokens) under mixed and bf16, with and without
# `--recompute moe`, and a small launch-bound model, the planner's predicted memory and step time
# (`moe plan --gpus 1 --explain`) against the measured peak GPU memory (nvidia-smi) and the median tokens/s
# of steps 4-12. Then `moe plan --calibrate --device cuda` on this GPU at the reference model's shapes and
# at the small model's (the 2.5x case), each profile printed, and the reference and small cases predicted
# again with the calibrated profile (--gpu FILE) against the same measurements. Prepare here: `bash
# scripts/device/mesh_pack.sh .gpum` (build/ built with CUDA), then run `bash scripts/device/plan_check.sh`
# with carry [".gpum"]; about 5 minutes (CAL=0: without the calibration). Prints one row per case:
#   case | predicted GiB | measured GiB | ratio | predicted tok/s | measured tok/s | ratio
# (the calibrated rows: case-cal, the measured columns those of the case's row above). The fp8 row: the
# planner's --precision fp8 (the FP8 table's scratch, the experts at fp8_grouped_tflops).
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && mesh_unpack $PWD/${GPUM:-.gpum} /tmp/pc
W=/tmp/pcw; mkdir -p $W; R=${OUT:-$W}/plan_check.txt; : > $R
export OMP_NUM_THREADS=16
[ -f $W/rand32k.bin ] || python3 scripts/device/random_shard.py $W/rand32k.bin
say "$(date -u) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
REF="--preset peers-ref --batch 4 --seq-len 2048"
SMALL="--n-layers 6 --d-model 384 --n-heads 6 --n-kv-heads 6 --d-ff 1024 --n-experts 8 --top-k 2 --batch 64 --seq-len 256 --vocab-size 32000"
one() { # NAME PRECISION RECOMPUTE MODEL...
  local name=$1 prec=$2 rc=$3; shift 3
  $B/moe plan --gpus 1 --gpu h200 "$@" --precision $prec --explain "recompute-$rc" > $W/$name.plan 2>&1
  local pm=$(sed -n 's/^memory per GPU: .* = \([0-9.]*\) GiB of.*/\1/p' $W/$name.plan)
  local pt=$(sed -n 's/^step: .* ms, \([0-9]*\) tokens\/s.*/\1/p' $W/$name.plan)
  mem_start
  timeout 200 stdbuf -oL $B/moe train --device cuda "$@" --precision $prec --recompute $rc --steps 12 --lr 1e-4 \
    --warmup 1 --save-every -1 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 --force \
    --data $W/rand32k.bin --out $W/run > $W/$name.log 2>&1 || { say "$name: train failed"; tail -3 $W/$name.log | tee -a $R; }
  local peak=$(mem_peak)
  local mt=$(grep -E "^step ([4-9]|1[0-2])/" $W/$name.log | sed 's/.*| *\([0-9]*\) tok\/s.*/\1/' | sort -n | awk '{a[NR]=$1} END{print a[int((NR+1)/2)]}')
  echo "$peak $mt" > $W/$name.meas
  row $name $pm $peak $pt $mt
}
row() { # NAME PRED_GIB MEAS_MIB PRED_TOKS MEAS_TOKS
  say "$(awk -v n=$1 -v pm=$2 -v mm=$3 -v pt=$4 -v mt=$5 'BEGIN{g=mm/1024; printf "%-16s mem %6.2f GiB pred, %6.2f GiB meas (%.3fx) | %8d tok/s pred, %8d meas (%.3fx)\n", n, pm, g, pm/g, pt, mt, pt/mt}')"
}
# The prediction of case NAME again on a calibrated profile, against NAME's measurement (one's).
cal() { # NAME PROFILE PRECISION RECOMPUTE MODEL...
  local name=$1 prof=$2 prec=$3 rc=$4; shift 4
  $B/moe plan --gpus 1 --gpu $prof "$@" --precision $prec --explain "recompute-$rc" > $W/$name-cal.plan 2>&1 ||
    { say "$name-cal: plan failed"; tail -2 $W/$name-cal.plan | tee -a $R; return; }
  local pm=$(sed -n 's/^memory per GPU: .* = \([0-9.]*\) GiB of.*/\1/p' $W/$name-cal.plan)
  local pt=$(sed -n 's/^step: .* ms, \([0-9]*\) tokens\/s.*/\1/p' $W/$name-cal.plan)
  local mm mt
  read -r mm mt < $W/$name.meas
  row $name-cal $pm $mm $pt $mt
  grep -E '^(compute|host overhead)' $W/$name-cal.plan | sed 's/^/    /' | tee -a $R
}
one ref-mixed mixed none $REF
one ref-mixed-rc mixed moe $REF
one ref-bf16 bf16 none $REF
one ref-bf16-rc bf16 moe $REF
one small-bf16 bf16 none $SMALL
one ref-fp8 fp8 none $REF
if [ "${CAL:-1}" = 1 ]; then
  for m in ref small; do
    [ $m = ref ] && MODEL=$REF || MODEL=$SMALL
    timeout 300 $B/moe plan --calibrate --device cuda $MODEL --out $W/cal-$m.json > $W/cal-$m.log 2>&1 ||
      { say "calibrate $m failed"; tail -3 $W/cal-$m.log | tee -a $R; }
    say "profile calibrated at the $m model's shapes:"; cat $W/cal-$m.json | tee -a $R
  done
  cal ref-mixed $W/cal-ref.json mixed none $REF
  cal ref-bf16 $W/cal-ref.json bf16 none $REF
  cal ref-bf16-rc $W/cal-ref.json bf16 moe $REF
  cal small-bf16 $W/cal-small.json bf16 none $SMALL
  cal ref-fp8 $W/cal-ref.json fp8 none $REF
fi
say "$(date -u) done"
