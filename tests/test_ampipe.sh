#!/usr/bin/env bash
# test_ampipe.sh — AMPipe (--ampipe n: each block from attention on in n chunks of the micro-batch's
# rows, a chunk's exchange in flight while the next chunk's attention runs) trains the same model as
# one process at n = 1. Under mpirun (oversubscribed): n in {2, 4} x {one process, ep2, tp2+ep2,
# dp2+ep2 with zero2, pp2+ep2} x {dropless, capacity (with jitter and drops)}, each against the
# single-process n = 1 run with the mesh tests' tolerances (lib.sh mesh_close: per-step loss, aux and z
# 1e-6 relative, grad norm 1e-5, final parameters 1e-3 of each tensor's largest magnitude; expert load
# and dropped assignments exactly equal — capacity mode's budgets are the whole micro-batch's, so the
# same tokens drop at every n).
# What n changes: the weight gradients' sums over rows are split by chunk (round-off), and on the cpu
# backend OpenBLAS picks its sgemm kernel by the matrix shape, so a chunk's o_proj / router / expert
# GEMM rows are not always the bits of the whole batch's: the step-1 loss is checked against n = 1 on
# the same mesh at 1e-7 relative (seen ~1e-9). The attention itself is the same bits per row
# (test_ops: attention over query ranges). Also: a chunk with no rows for an expert (8 experts, top-1,
# 2-token sequences, n 8), more chunks than rows (a clear error), `auto` (n and r measured together
# per layer, logged), bad values.
set -u
. "$(dirname "$0")/lib.sh"
mpi_tests
export NO_REPLICA_CHECK=1
BASE="--steps 3 --quiet --sample-tokens 0 --plots 0 --batch 8 --seq-len 12 --eval-batches 1 --eval-every 0
      --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2
      --grad-accum 2 --device cpu"

first_loss() { field loss "$1/metrics.jsonl" | head -1; }
run() { local d="$1" np="$2"; shift 2; rm -rf "$d"; mkdir -p "$d"
  if [ "$np" = 1 ]; then "$MOE" train --out "$d" $BASE "$@" > "$d/out.txt" 2>&1 < /dev/null
  else $MPI -np "$np" "$MOE" train --out "$d" $BASE "$@" > "$d/out.txt" 2>&1 < /dev/null; fi; }
step1() {   # step1 N1 RUN LABEL: the step-1 loss against n = 1 on the same layout
  local d; d=$(paste <(first_loss "$1") <(first_loss "$2") | awk '{ d = $1 - $2; if (d < 0) d = -d; printf "%.3e", d / $1 }')
  fcmp "$d" "<=" 1e-7 && pass "$3: step-1 loss equal to n 1 on the same layout ($d relative)" || fail "$3: step-1 loss differs from n 1 by $d"
}

for mode in "dropless" "capacity --capacity-factor 0.8 --jitter 0.05"; do
  m="${mode%% *}"
  run "$TMP/ref_$m" 1 --dispatch $mode || fail "reference ($m)"
  [ "$m" = dropless ] || [ "$(field dropped "$TMP/ref_$m/metrics.jsonl" | head -1)" -gt 0 ] || fail "capacity reference drops nothing: the test would not see drops"
  while IFS='|' read -r np flags label; do
    run "$TMP/n1" "$np" --dispatch $mode $flags || { fail "$m $label n 1: failed"; tail -3 "$TMP/n1/out.txt"; continue; }
    for n in 2 4; do
      [ "$n" = 4 ] && [ "$label" != "tp2+ep2" ] && [ "$label" != "one process" ] && continue   # n 4 on the widest once
      if run "$TMP/run" "$np" --dispatch $mode $flags --ampipe $n; then
        mesh_close "$TMP/ref_$m" "$TMP/run" "$m: $label, n $n"
        step1 "$TMP/n1" "$TMP/run" "$m: $label, n $n"
        grep -q "\"ampipe\":\[$n,$n\]" "$TMP/run/metrics.jsonl" || fail "$m: $label, n $n: metrics.jsonl does not log the chunks"
      else fail "$m: $label, n $n: failed"; tail -4 "$TMP/run/out.txt"; fi
    done
  done <<< "1||one process
2|--ep 2|ep2
4|--tp 2 --ep 2|tp2+ep2
4|--ep 2 --zero 2 --bucket-mb 0.01|dp2+ep2 zero2
4|--pp 2 --ep 2|pp2+ep2"
done

# the model families' options inside the chunks (Qwen2-MoE: q/k/v biases, a gated shared expert beside
# each chunk's combine; Qwen3-MoE: per-head QK-norm; aux-free routing bias): tp2+ep2, n 2, against one
# process at n 1
for fam in "--family qwen2_moe --qkv-bias 1 --n-shared-experts 1 --shared-d-ff 24 --shared-gate 1 --renormalize 0|qwen2-moe" \
           "--family qwen3_moe --qk-norm head --head-dim 12 --balance aux-free --bias-rate 0.01|qwen3-moe, aux-free"; do
  run "$TMP/ref_f" 1 ${fam%%|*} || fail "${fam##*|}: reference"
  if run "$TMP/run" 4 --tp 2 --ep 2 ${fam%%|*} --ampipe 2; then mesh_close "$TMP/ref_f" "$TMP/run" "${fam##*|}: tp2+ep2, n 2"
  else fail "${fam##*|}: n 2 failed"; tail -4 "$TMP/run/out.txt"; fi
done
# the scoped aux losses over the chunks: global (the step's running counts take each micro-batch once)
# and sequence (the chunks cut sequences: their per-sequence statistics are put together again before
# the loss; n 8 makes half-sequence chunks, tp2 cuts them again); a large aux coefficient, so that its
# gradient weighs in the compared gradient norm and parameters
for scope in global sequence; do
  run "$TMP/ref_s" 1 --aux-scope $scope --aux-form layer --aux-coef 0.5 || fail "aux-scope $scope: reference"
  for L in "1||2|one process" "1||8|one process" "4|--tp 2 --ep 2|2|tp2+ep2"; do
    IFS='|' read -r np flags n label <<< "$L"
    if run "$TMP/run" "$np" $flags --aux-scope $scope --aux-form layer --aux-coef 0.5 --ampipe $n; then
      mesh_close "$TMP/ref_s" "$TMP/run" "--aux-scope $scope: $label, n $n"
    else fail "aux-scope $scope $label n $n: failed"; tail -3 "$TMP/run/out.txt"; fi
  done
done

# with the pipelined exchange too (r 2: chunk j's exchange itself in two pieces)
if run "$TMP/run" 2 --ep 2 --ampipe 2 --a2a-overlap 2; then mesh_close "$TMP/ref_dropless" "$TMP/run" "dropless: ep2, n 2 with r 2"
else fail "n 2 r 2: failed"; tail -4 "$TMP/run/out.txt"; fi

# chunks where an expert gets no rows: 2-token sequences, 8 experts top-1, n 8 (chunks of one row)
E="--seq-len 2 --batch 16 --grad-accum 1 --n-experts 8 --top-k 1"
run "$TMP/ref_e" 1 $E
if run "$TMP/run" 4 --ep 4 $E --ampipe 8; then mesh_close "$TMP/ref_e" "$TMP/run" "ep4, n 8 with 1-row chunks and 8 experts (experts with no rows in a chunk)"
else fail "empty experts: failed"; tail -4 "$TMP/run/out.txt"; fi

# memory: a chunked layer's MoE states replace its whole-batch ones (moe_layer_trim), so the process's
# peak memory does not grow with n (a model whose activations dominate: 2 layers, B 8 x T 256, f 512).
# Measured with a fixed mmap threshold (MALLOC_MMAP_THRESHOLD_, glibc): every buffer over 128 KB is its
# own mapping, returned when freed, so the peak RSS is the peak of what is allocated. With glibc's
# default (a threshold that rises to the size of the largest freed mapping) later buffers land on the
# heap and its fragmentation depends on the allocation history: builds of one source measured n 4 at
# 1.005x to 1.071x n 1 (CI once failed at 1.052x); with the fixed threshold 0.91x-0.95x for each build.
if [ -x /usr/bin/time ]; then
  M="--steps 2 --batch 8 --seq-len 256 --grad-accum 1 --n-layers 2 --d-model 128 --n-heads 4 --n-kv-heads 2 --d-ff 512
     --n-experts 8 --vocab-size 256 --save-every -1"
  for n in 1 2 4; do MALLOC_MMAP_THRESHOLD_=131072 /usr/bin/time -f "%M" -o "$TMP/rss$n" "$MOE" train --out "$TMP/m$n" $BASE $M --ampipe $n > /dev/null 2>&1; done
  r2=$(awk -v a="$(cat "$TMP/rss1")" -v b="$(cat "$TMP/rss2")" 'BEGIN { printf "%.3f", b / a }')
  r4=$(awk -v a="$(cat "$TMP/rss1")" -v b="$(cat "$TMP/rss4")" 'BEGIN { printf "%.3f", b / a }')
  fcmp "$r2" "<=" 1.05 && fcmp "$r4" "<=" 1.05 && pass "peak memory at n 2 and n 4 is ${r2}x and ${r4}x n 1's ($(cat "$TMP/rss1") KB)" ||
    fail "peak memory grows with n: n 2 ${r2}x, n 4 ${r4}x n 1's"
else skip "/usr/bin/time not installed: peak memory not measured"; fi

# more chunks than rows: one clear error
if run "$TMP/run" 1 --batch 1 --seq-len 4 --grad-accum 1 --ampipe 8; then fail "8 chunks of a 4-token micro-batch accepted"
elif grep -q "fewer rows than chunks" "$TMP/run/out.txt"; then pass "8 chunks of a 4-token micro-batch: one clear error"
else fail "8 chunks of 4 tokens: unclear error: $(tail -1 "$TMP/run/out.txt")"; fi
for bad in 3 0 16 x; do
  if "$MOE" train --out "$TMP/bad" $BASE --ampipe $bad > "$TMP/bad.txt" 2>&1; then fail "--ampipe $bad accepted"
  elif grep -q -- "--ampipe" "$TMP/bad.txt" && [ ! -e "$TMP/bad/metrics.jsonl" ]; then pass "--ampipe $bad refused, naming the option, nothing written"
  else fail "--ampipe $bad: $(tail -1 "$TMP/bad.txt")"; fi
done

# auto: n 1, 2, 4 measured per layer (a warm-up and two trials each), settled, logged; results as n 1
if run "$TMP/run" 2 --ep 2 --ampipe auto --steps 12; then
  run "$TMP/ref12" 1 --steps 12
  mesh_close "$TMP/ref12" "$TMP/run" "ep2, --ampipe auto"
  seq_n=$(grep -o '"ampipe":\[[0-9]*' "$TMP/run/metrics.jsonl" | cut -d[ -f2 | head -9 | tr '\n' ' ')
  if [ "$seq_n" = "1 1 1 2 2 2 4 4 4 " ] && grep -q '"a2a_tuned":\[{"candidates":\[1,1,1\],"seconds":\[[^]]*\],"modes":\[[^]]*\],"ampipe":\[1,2,4\]' "$TMP/run/metrics.jsonl"; then
    pass "auto tried n 1, 2, 4 (a warm-up and two trials each), settled and logged the seconds and choice"
  else fail "auto: n sequence '$seq_n' or the a2a_tuned record is not as expected"; grep -o '"a2a_tuned".*' "$TMP/run/metrics.jsonl" | head -1; fi
else fail "auto: failed"; tail -4 "$TMP/run/out.txt"; fi
finish
