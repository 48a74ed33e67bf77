#!/usr/bin/env bash
# same_bits.sh — does a refactor keep every result bit for bit? Runs the same training runs with two
# moe binaries and compares, byte for byte: each metrics.jsonl line without its timing fields
# (tokens_per_s, tflops, step_time_s, grad_wait_s, pp_idle_s, bubble_frac), every checkpoint's model.safetensors,
# optimizer.safetensors, config.json and state.json, and the end-of-run report without its timing
# line. Exit 0 when everything is identical.
#
#   bash scripts/same_bits.sh OLD_MOE NEW_MOE [RUNS...]
#
# RUNS (default: all): one (one process: capacity dispatch, jitter, grad-accum 2, clipping),
# mesh4 (4 ranks: tp2 x dp2 x ep2, zero2, small buckets), mesh8 (8 ranks: tp2 x dp4 x ep2 x etp2,
# zero1, no overlap), resume (one process, HF aux form, saved at step 3 and resumed to 6), text (one process on
# ../shared/data/tinyshakespeare.txt, where present: byte tokens, the sample from a validation window), wide
# (one process at d 256 with 4 heads of 64: the others are 32 wide, under the 64 columns where cuda's products
# turn bf16, so only this one takes the bf16 products and their hidden-format paths on a GPU).
# Extra flags for every run (e.g. --device cuda) come from SAME_BITS_FLAGS.
set -u
OLD="$1" NEW="$2"; shift 2
TEXT="$(cd "$(dirname "$0")/.." && pwd)/../shared/data/tinyshakespeare.txt"
RUNS="${*:-one mesh4 mesh8 resume text wide}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive LC_ALL=C
TMP="$(mktemp -d "${TMPDIR:-/tmp}/same_bits.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
BASE="--steps 6 --sample-tokens 8 --plots 0 --batch 16 --seq-len 24 --eval-batches 2 --eval-every 3 --save-every 3
      --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2 --keep 0
      ${SAME_BITS_FLAGS:-}"
MPI="timeout 600 mpirun --oversubscribe"
bad=0

run() {   # run BIN DIR NP FLAGS...
  local bin="$1" dir="$2" np="$3"; shift 3
  mkdir -p "$dir"
  if [ "$np" = 1 ]; then "$bin" train --out "$dir" --force $BASE "$@" > "$dir/out.txt" 2>&1 < /dev/null
  else $MPI -np "$np" "$bin" train --out "$dir" --force $BASE "$@" > "$dir/out.txt" 2>&1 < /dev/null; fi
}

strip_metrics() {   # metrics.jsonl without the fields that time things
  sed -E 's/"pp_idle_s":\[[^]]*\],?//; s/"(tokens_per_s|tflops|step_time_s|grad_wait_s|bubble_frac)":[^,}]*,?//g' "$1"
}

report() { grep -vE 'trained steps|tok/s|tokens/s' "$1/out.txt" | sed "s|$1|RUN|g"; }   # out.txt less timings and its path

compare() {   # compare NAME A B
  local name="$1" a="$2" b="$3" ok=1 f
  cmp -s <(strip_metrics "$a/metrics.jsonl") <(strip_metrics "$b/metrics.jsonl") || { echo "  $name: metrics.jsonl differs"; ok=0; }
  cmp -s <(report "$a") <(report "$b") || { echo "  $name: the report differs:"; diff <(report "$a") <(report "$b") | head -8; ok=0; }
  local na nb; na=$(cd "$a" && ls -d step_* 2>/dev/null | sort); nb=$(cd "$b" && ls -d step_* 2>/dev/null | sort)
  [ -n "$na" ] && [ "$na" = "$nb" ] || { echo "  $name: checkpoints differ: [$na] vs [$nb]"; ok=0; }
  for s in $na; do
    for f in model.safetensors optimizer.safetensors config.json state.json checksums.json; do
      cmp -s "$a/$s/$f" "$b/$s/$f" || { echo "  $name: $s/$f differs"; ok=0; }
    done
  done
  if [ $ok = 1 ]; then echo "same: $name ($(echo $na | wc -w) checkpoints, $(grep -c '"loss"' "$a/metrics.jsonl") steps)"
  else echo "DIFFERENT: $name"; bad=1; fi
}

for r in $RUNS; do
  case "$r" in
    one) F="--dispatch capacity --capacity-factor 0.8 --jitter 0.05 --grad-accum 2 --grad-clip 0.5"; NP=1 ;;
    mesh4) F="--tp 2 --ep 2 --zero 2 --bucket-mb 0.01 --check-replicas"; NP=4 ;;
    mesh8) F="--tp 2 --ep 2 --etp 2 --zero 1 --overlap 0 --grad-accum 2 --check-replicas"; NP=8 ;;
    resume) F="--dispatch capacity --jitter 0.05 --aux-form hf"; NP=1 ;;
    wide) F="--d-model 256 --n-heads 4 --n-kv-heads 2 --d-ff 128 --grad-clip 0.5"; NP=1 ;;
    text) [ -f "$TEXT" ] || { echo "skip: text ($TEXT absent)"; continue; }
          F="--data $TEXT --vocab-size 256"; NP=1 ;;
    *) echo "unknown run '$r'"; exit 2 ;;
  esac
  for side in old new; do
    bin="$OLD"; [ $side = new ] && bin="$NEW"
    if [ "$r" = resume ]; then
      run "$bin" "$TMP/$r.$side" 1 $F --steps 3 || { echo "  $r ($side) failed: $(tail -3 "$TMP/$r.$side/out.txt")"; bad=1; }
      "$bin" train --out "$TMP/$r.$side" --resume $BASE $F >> "$TMP/$r.$side/out.txt" 2>&1 < /dev/null ||
        { echo "  $r ($side) resume failed"; bad=1; }
    else
      run "$bin" "$TMP/$r.$side" "$NP" $F || { echo "  $r ($side) failed: $(tail -3 "$TMP/$r.$side/out.txt")"; bad=1; }
    fi
  done
  compare "$r" "$TMP/$r.old" "$TMP/$r.new"
done
[ $bad = 0 ] && echo "same_bits: every result identical" || echo "same_bits: DIFFERENCES FOUND"
exit $bad
