#!/usr/bin/env bash
# test_loss_chunks.sh — --loss-chunks N (model_state.h model_set_loss_chunks, vocab.h vocab_head_chunks: the LM
# heads run over N chunks of a micro-batch's rows, each chunk's gradient taken in the forward, so that the logits
# of one chunk exist at a time; the cost model's bytes: test_cost.c):
#   - refusals: 0, and more chunks than a micro-batch's rows; one "moe: error:" line each, nothing written;
#   - moe info: the whole model's activations lower with it (the logits a chunk's);
#   - what is exact: each row's logits, loss and input gradient are the unchunked head's (its rows' products do
#     not change), so step 1's loss is the same bits at 3 and 7 chunks (7 does not divide the 384 rows: the
#     last chunk short); only the head's weight gradient sums its rows chunk by chunk (another order), so the
#     later steps are within test_mesh.sh's bands of --loss-chunks 1 (mesh_close), the end-of-run evaluation
#     and sample (the KV cache's one row) the same;
#   - an MTP module (its head chunked too, the positions without a target zeroed in each chunk): step 1's loss
#     and MTP loss the same bits, the run at the bands;
#   - on a mesh: tp2 with --vocab-parallel 1 (each chunk's loss combined over the ranks) and pp2 with two
#     micro-batches (the last stage's forward takes the head's backward; the sample through the stages reads the
#     last chunk's logits) against one process at the bands with --check-replicas;
#   - a resume takes the option from run.json (the head's summation order is the run's).
set -u
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
CKPT_DIFF="${CKPT_DIFF:-$(dirname "$MOE")/ckpt_diff}"

BASE=(--steps 6 --quiet --sample-tokens 12 --plots 0 --batch 16 --seq-len 24 --eval-batches 1 --eval-every 3
      --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2)
first() { field "$1" "$2/metrics.jsonl" | head -n 1; }
vals() { grep "val loss" "$1/train.log"; }

# ---- refusals (the guarded directory: nothing may appear in it)
mkdir G && echo keep > G/keep
GUARD="$TMP/G"
run_fail "--loss-chunks must be in [1, 384] (a micro-batch's rows: --batch / --grad-accum x --seq-len), got 0" \
  "$MOE" train "${BASE[@]}" --loss-chunks 0 --out G/R
run_fail "--loss-chunks must be in [1, 192] (a micro-batch's rows: --batch / --grad-accum x --seq-len), got 193" \
  "$MOE" train "${BASE[@]}" --grad-accum 2 --loss-chunks 193 --out G/R
GUARD=""

# ---- moe info (tiny at 16 x 64: the logits 1,024 x 256 floats; in 4 chunks 256 x 256, and the head's input
# gradient 1,024 x 96 kept)
act() { "$MOE" info --grad-memory separate "$@" | sed -n -E 's/^memory, whole model .*activations for batch [0-9]+ x [0-9]+: ([0-9.]+ [KMG]iB).*/\1/p'; }
A1=$(act --loss-chunks 1) A4=$(act --loss-chunks 4)
check "moe info: the activations lower with --loss-chunks 4 ($A1 -> $A4)" \
  awk -v a="${A4% *}" -v b="${A1% *}" -v u="${A4#* }" -v v="${A1#* }" 'BEGIN { exit !(u == v && a + 0 > 0 && a + 0 < b + 0) }'

check "moe info says what it holds (1,024 rows of 256 logits: 256 rows a chunk; the input gradient 1,024 x 96)" \
  bash -c "'$MOE' info --loss-chunks 4 | grep -qF -- \"--loss-chunks 4: the LM head's logits 256.00 KiB a chunk at a time in place of 1.00 MiB (and its input gradient kept: 384.00 KiB)\""

# ---- one process
run_ok "--loss-chunks 1" "$MOE" train "${BASE[@]}" --out c1 < /dev/null
for n in 3 7; do
  run_ok "--loss-chunks $n" "$MOE" train "${BASE[@]}" --loss-chunks $n --out c$n < /dev/null
  check "--loss-chunks $n: step 1's loss the same bits ($(first loss c$n))" test "$(first loss c1)" = "$(first loss c$n)"
  NO_REPLICA_CHECK=1 mesh_close c1 c$n "--loss-chunks $n against 1"
  check "--loss-chunks $n: the evaluations as --loss-chunks 1's" cmp -s <(vals c1) <(vals c$n)
  check "--loss-chunks $n: the sample as --loss-chunks 1's" cmp -s <(sample_block c1/train.log) <(sample_block c$n/train.log)
done
run_ok "--mtp 1" "$MOE" train "${BASE[@]}" --mtp 1 --out m1 < /dev/null
run_ok "--mtp 1 --loss-chunks 5" "$MOE" train "${BASE[@]}" --mtp 1 --loss-chunks 5 --out m5 < /dev/null
check "--mtp 1 --loss-chunks 5: step 1's loss and MTP loss the same bits" \
  test "$(first loss m1) $(first mtp_loss m1)" = "$(first loss m5) $(first mtp_loss m5)"
NO_REPLICA_CHECK=1 mesh_close m1 m5 "--mtp 1 --loss-chunks 5 against 1"

# ---- meshes
mpi_tests
layout() { # ranks label run ref flags...
  local np="$1" label="$2" run="$3" ref="$4"; shift 4
  mkdir -p "$run"
  if $MPI -np "$np" "$MOE" train "${BASE[@]}" "$@" --check-replicas --out "$run" > "$run/out.txt" 2>&1 < /dev/null; then
    mesh_close "$ref" "$run" "$label"
  else
    fail "$label: mpirun failed"; tail -5 "$run/out.txt"
  fi
}
# (a rank's rows are the bound: 384 a micro-batch, 192 on each of dp 2)
$MPI -np 2 "$MOE" train "${BASE[@]}" --loss-chunks 300 --out dp2x > dp2x.txt 2>&1 < /dev/null
check "dp2 --loss-chunks 300: refused, each rank naming its 192 rows, nothing written" \
  bash -c "! test -e dp2x && grep -q -- '--loss-chunks 300: a micro-batch on a rank has 192 rows' dp2x.txt"
layout 2 "tp2 --vocab-parallel 1 --loss-chunks 3" tpv c1 --tp 2 --vocab-parallel 1 --loss-chunks 3
run_ok "one process, 2 micro-batches" "$MOE" train "${BASE[@]}" --grad-accum 2 --out g2 < /dev/null
layout 2 "pp2, 2 micro-batches, --loss-chunks 4" ppc g2 --pp 2 --grad-accum 2 --loss-chunks 4
check "pp2 --loss-chunks 4: the sample (the last chunk's logits, through the stages) one process's" \
  cmp -s <(sample_block g2/train.log) <(sample_block ppc/train.log)

# ---- resume
resume_takes loss-chunks 3 "${BASE[@]}" --sample-tokens 0 --eval-every 0
finish
