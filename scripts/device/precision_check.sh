#!/bin/bash
# Device recipe (kind nvidia-h200): --precision mixed vs bf16 (stochastic, nearest, none) on one GPU, not CI.
# Prepare here: cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu (an ignored folder),
# then run `bash scripts/device/precision_check.sh` with carry [".gpu"] (about 3 x 2-3 minutes).
# Each setting trains the small preset (d 256, 4 layers, 8 experts top-2) for STEPS (default 2000)
# steps on tinyshakespeare (../shared/data, shared/data or .gpu/; else the embedded corpus), the same seed and
# data order, and evaluates every 250 steps. Progress and a table (final train loss as the mean of
# the last 50 steps, val loss at each evaluation, tokens/s) go to $OUT/precision.txt and stdout; each
# run's metrics.jsonl is copied to $OUT. Also: a bf16 run's final checkpoint must hold bf16 values only
# (ckpt_diff --bf16), and the cuda test cases of the policy (test_cuda_ops' adamw_runs bf16 lines).
# What to look for: bf16 stochastic within a few hundredths of mixed in val loss; nearest possibly
# worse late in training (updates below half a bf16 step are lost once lr decays).
cd "$(dirname "$0")/../.."
G=$PWD/.gpu; B=$G/bin; W=/tmp/w; mkdir -p $W
OUT=${OUT:-$W/out}; mkdir -p $OUT
. scripts/device/libs.sh && device_libs $G $B/moe
export OMP_NUM_THREADS=16
STEPS=${STEPS:-2000}
D=""
for f in ../shared/data/tinyshakespeare.txt shared/data/tinyshakespeare.txt $G/tinyshakespeare.txt; do [ -f $f ] && D="--data $f --vocab-size 256" && break; done
R=$OUT/precision.txt
log() { echo "$*" | tee -a $R; }
log "$(date -u) $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) steps $STEPS data ${D:-embedded}"
if [ "${OPS:-1}" = 1 ]; then   # OPS=0: the op suite ran in this call already
  $B/test_cuda_ops > $W/ops.log 2>&1; log "test_cuda_ops rc=$? $(grep -E 'checks' $W/ops.log)"
  grep -E 'adamw_runs bf16' $W/ops.log | tee -a $R; grep -m8 FAIL $W/ops.log | tee -a $R
fi
S="--preset small --steps $STEPS --batch 16 --seq-len 256 --lr 1e-3 --warmup 100 --eval-every 250 --eval-batches 16
   --sample-tokens 0 --plots 0 --save-every 0 --keep 1 --quiet --device cuda --force $D"
for p in "mixed" "bf16 --bf16-rounding stochastic" "bf16 --bf16-rounding nearest" "bf16 --bf16-rounding none"; do
  name=$(echo $p | awk '{ print $1 ($3 ? "_" $3 : "") }')
  t0=$SECONDS
  timeout ${RUN_LIMIT:-200} $B/moe train $S --precision $p --out $W/$name > $W/$name.log 2>&1; rc=$?
  cp $W/$name/metrics.jsonl $OUT/$name.metrics.jsonl 2>/dev/null
  tl=$(grep -o '"loss":[0-9.e-]*' $W/$name/metrics.jsonl | tail -50 | cut -d: -f2 | awk '{ s += $1 } END { if (NR) printf "%.4f", s / NR }')
  vl=$(grep -o '"val_loss":[0-9.e-]*' $W/$name/metrics.jsonl | cut -d: -f2 | tr '\n' ' ')
  tps=$(grep -o '"tokens_per_s":[0-9.e+]*' $W/$name/metrics.jsonl | tail -50 | cut -d: -f2 | awk '{ s += $1 } END { if (NR) printf "%.0f", s / NR }')
  log "$name rc=$rc $((SECONDS - t0))s: train loss (last 50) $tl | val $vl | tokens/s $tps"
  [ $rc = 0 ] || tail -5 $W/$name.log | tee -a $R
  case $name in bf16_none) ;; bf16*) log "  $($B/ckpt_diff --bf16 $W/$name)";; esac
done
grep -h "memory" $W/mixed.log $W/bf16_stochastic.log 2>/dev/null | head -4 | tee -a $R
