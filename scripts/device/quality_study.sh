#!/bin/bash
# Device recipe (kind nvidia-h200; docs/QUALITY.md): an MoE model against its dense counterpart with the same
# ACTIVE parameters, on the same tokens in the same order, three seeds each, on tinyshakespeare (byte-level),
# then `moe compare` over the six runs. Prepare here:
#   cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu
# then run `bash scripts/device/quality_study.sh` with carry [".gpu"] (about 4 minutes on one H200). The text
# is looked for at shared/data/tinyshakespeare.txt (the repository copy's shared/, where the lead carries it),
# ../shared/data/ and .gpu/; without it the script stops (the study is about that text).
#   MoE:   d 384, 6 layers, 6 heads, 8 experts top-2, expert f 512 (32.1M parameters, 10.84M active a token)
#   dense: the same with 1 expert top-1 of f 1024 = 2 x 512 (10.82M; the router's 384 weights a layer remain
#          and route every token to that expert with weight 1: the aux loss is constant, its gradient 0)
#   both:  seq 256, batch 64 (16,384 tokens a step), STEPS (600) steps, lr 1e-3 cosine to 1e-4 after STEPS/10
#          warm-up steps, dropout DROPOUT (0), the whole held-out tail (the last 10%) evaluated every EVERY
#          (100) steps, seeds 1 2 3 (a seed draws the initial weights and the data order: an MoE run and the
#          dense run of its seed read the same batches), --device cuda (DEVICE), mixed precision.
# Out ($OUT): quality.txt (progress, each run's time, `moe info` of both models, the compare table, the means
# and the per-seed differences), quality.png (moe compare --out), each run's metrics.jsonl and run.json.
# Settings (env) that make it a study of another pair: SHAPE (the shared flags), KINDS (space-separated
# LABEL=FLAGS entries, FLAGS with commas for spaces; default moe=MOE_FFN dense=DENSE_FFN; the per-seed difference
# is the first label's minus the second's), TEXT (a corpus file in place of tinyshakespeare), PAR (runs of a seed
# at once on the one GPU: 1; the study's losses do not depend on it; MPS=on shares the GPU through an MPS
# daemon of the script's own, stopped at the end), TAG (the out files' stem: quality).
# Used by crossover.sh (MoE against dense at several sizes) and fp8_quality.sh (--precision fp8 against bf16).
# QUICK=1: a tiny setting on the cpu (build-cpu/moe or build/moe; d 64, 2 layers, 40 steps of 8 x 64,
# 4 validation batches) to try the script itself: `QUICK=1 bash scripts/device/quality_study.sh`.
cd "$(dirname "$0")/../.."
if [ "${QUICK:-0}" = 1 ]; then
  MOE=${MOE:-$( [ -x build-cpu/moe ] && echo build-cpu/moe || echo build/moe )}
  W=$(mktemp -d "${TMPDIR:-/tmp}/quality.XXXXXX"); OUT=${OUT:-$W/out}; mkdir -p "$OUT"; R=$OUT/quality.txt; : > "$R"
  say() { echo "$*" | tee -a "$R"; }
  DEVICE=${DEVICE:-cpu}; STEPS=${STEPS:-40}; EVERY=${EVERY:-10}; EVAL="--eval-batches 4"; RUN_LIMIT=${RUN_LIMIT:-120}
  SHAPE="--d-model 64 --n-layers 2 --n-heads 4 --n-kv-heads 4 --seq-len 64 --max-seq-len 64 --batch 8"
  MOE_FFN="--n-experts 4 --top-k 2 --d-ff 64"; DENSE_FFN="--n-experts 1 --top-k 1 --d-ff 128"
else
  . scripts/device/libs.sh && recipe_start ${TAG:-quality} 540
  W=$W/${TAG:-quality}; mkdir -p $W
  [ "${PAR:-1}" -gt 1 ] && export OMP_NUM_THREADS=$((16 / PAR > 1 ? 16 / PAR : 1)) # the runs share 16 cores
  MOE=$B/moe
  DEVICE=${DEVICE:-cuda}; STEPS=${STEPS:-600}; EVERY=${EVERY:-100}; EVAL=${EVAL:-"--eval-batches all"}; RUN_LIMIT=${RUN_LIMIT:-100}
  SHAPE=${SHAPE:-"--d-model 384 --n-layers 6 --n-heads 6 --n-kv-heads 6 --seq-len 256 --max-seq-len 256 --batch 64"}
  MOE_FFN="--n-experts 8 --top-k 2 --d-ff 512"; DENSE_FFN="--n-experts 1 --top-k 1 --d-ff 1024"
fi
KINDS=${KINDS:-"moe=${MOE_FFN// /,} dense=${DENSE_FFN// /,}"}
PAR=${PAR:-1}
TEXT=${TEXT:-}
[ -z "$TEXT" ] && for f in shared/data/tinyshakespeare.txt ../shared/data/tinyshakespeare.txt .gpu/tinyshakespeare.txt; do
  [ -f "$f" ] && TEXT=$f && break
done
[ -n "$TEXT" ] || { say "no tinyshakespeare.txt in shared/data, ../shared/data or .gpu: nothing run"; exit 1; }
SEEDS=${SEEDS:-1 2 3}
C="--data $TEXT --vocab-size 256 $SHAPE --steps $STEPS --lr 1e-3 --min-lr-frac 0.1 --warmup $((STEPS / 10))
   --eval-every $EVERY $EVAL --dropout ${DROPOUT:-0} --device $DEVICE --sample-tokens 0 --plots 0 --quiet --force"
say "$(date -u) quality study: $DEVICE, $STEPS steps, seeds $SEEDS, data $TEXT ($(wc -c < "$TEXT") bytes)"
LABELS=(); for k in $KINDS; do LABELS+=("${k%%=*}"); done
flags() { for k in $KINDS; do [ "${k%%=*}" = "$1" ] && echo "${k#*=}" | tr , ' '; done; }
for kind in "${LABELS[@]}"; do
  say "$kind: $(flags $kind): $("$MOE" info --vocab-size 256 $SHAPE $(flags $kind) 2>&1 | grep -m1 '^parameters')"
done
# one run: its metrics kept where they are whole
one_run() {
  local kind=$1 s=$2 t0=$SECONDS rc
  timeout "$RUN_LIMIT" "$MOE" train $C $(flags $kind) --seed "$s" --out "$W/${kind}_s$s" > "$W/${kind}_s$s.log" 2>&1
  rc=$?
  say "${kind}_s$s rc=$rc $((SECONDS - t0))s"
  [ $rc = 0 ] || tail -3 "$W/${kind}_s$s.log" | tee -a "$R"
}
if [ "${MPS:-off}" = on ]; then
  export CUDA_MPS_PIPE_DIRECTORY=$W/mps CUDA_MPS_LOG_DIRECTORY=$W/mpslog
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d && say "MPS on" || { say "MPS did not start: runs share the GPU without it"; MPS=off; }
fi
n=0
for s in $SEEDS; do   # the pairs interleaved: a call cut short still holds whole pairs
  for kind in "${LABELS[@]}"; do
    one_run $kind $s &
    n=$((n + 1)); [ $((n % PAR)) = 0 ] && wait
  done
done
wait
[ "${MPS:-off}" = on ] && echo quit | nvidia-cuda-mps-control
RUNS=()
for s in $SEEDS; do for kind in "${LABELS[@]}"; do
  [ -s "$W/${kind}_s$s/metrics.jsonl" ] && RUNS+=("$W/${kind}_s$s")
done; done
[ ${#RUNS[@]} -gt 0 ] || { say "no run produced metrics"; exit 1; }
# (without gnuplot, as on the device image: the table only; draw the PNG where gnuplot is, from runs.tgz:
# `moe compare DIR/* --out quality.png` after unpacking it)
PNG=(); command -v gnuplot >/dev/null && PNG=(--out "$OUT/${TAG:-quality}.png")
"$MOE" compare "${RUNS[@]}" "${PNG[@]}" > "$W/compare.txt" 2>&1
say "compare rc=$?"
tee -a "$R" < "$W/compare.txt"
# the means (and sample standard deviations) of each kind's final and best validation loss, and per seed
# MoE minus dense (negative: the MoE is better)
awk -v A="${LABELS[0]}" -v Z="${LABELS[1]}" '$1 ~ /_s[0-9]+$/ && $5 != "-" {
       k = substr($1, 1, index($1, "_") - 1); s = substr($1, index($1, "_s") + 2)
       n[k]++; f[k] += $5; f2[k] += $5 * $5; b[k] += $6; b2[k] += $6 * $6; fin[k, s] = $5; best[k, s] = $6; seeds[s] = 1 }
     function sd(sum, sq, m) { return m > 1 ? sqrt((sq - sum * sum / m) / (m - 1)) : 0 }
     END {
       for (k in n) printf "%-5s %d seeds: final val %.4f +- %.4f, best val %.4f +- %.4f\n", k, n[k],
         f[k] / n[k], sd(f[k], f2[k], n[k]), b[k] / n[k], sd(b[k], b2[k], n[k])
       for (s in seeds) if (((A, s) in fin) && ((Z, s) in fin))
         printf "seed %s: %s - %s: final val %+.4f (%+.2f%%), best val %+.4f\n", s, A, Z, fin[A, s] - fin[Z, s],
           100 * (fin[A, s] - fin[Z, s]) / fin[Z, s], best[A, s] - best[Z, s] }' "$W/compare.txt" | sort | tee -a "$R"
# each run's metrics.jsonl and run.json in one archive (a device call returns few files)
tar czf "$OUT/runs.tgz" -C "$W" $(for r in "${RUNS[@]}"; do b=$(basename "$r"); echo "$b/metrics.jsonl $b/run.json"; done)
say "$(date -u) done; runs in $W, their metrics in runs.tgz"
