#!/usr/bin/env bash
# test_vocab_parallel.sh — --vocab-parallel 1 (model/vocab.h: under TP each rank holds its rows of the
# embedding and the LM head, the loss combined over the ranks; the ops: test_ops.c, the cost model's bytes:
# test_cost.c):
#   - refusals: a value other than 0 or 1, a TP size past the vocabulary; one "moe: error:" line each,
#     nothing written;
#   - moe info: each TP rank's parameters fewer with it, the mesh's line says so;
#   - against one process at test_mesh.sh's bands (mesh_close: losses 1e-6, grad norm 1e-5, load exact,
#     parameters 1e-3, --check-replicas: each rank's rows equal across DP): tp2; tp2 x dp2 with ZeRO 2; tp2 x
#     pp2 (1F1B, 2 micro-batches: the head on the last stage, the embedding on the first); tp2 with an MTP
#     module (its head split too); tp2 with a vocabulary of 125, split unevenly (62 and 63 rows);
#   - what the run writes is the whole model's: the checkpoint's tensors full size (a one-process resume of
#     3 + 3 steps equals the 6 steps at the bands, and a tp2 resume of a one-process run too: resharding);
#     the sample at the end (the KV cache's logits gathered over TP; through the stages with pp2) is one
#     process's text.
set -u
. "$(dirname "$0")/lib.sh"
mpi_tests
cd "$TMP" || exit 1

BASE=(--steps 6 --quiet --sample-tokens 12 --plots 0 --batch 16 --seq-len 24 --eval-batches 1 --eval-every 0
      --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2)
VP=(--vocab-parallel 1 --check-replicas)

# ---- refusals (the guarded directory: nothing may appear in it)
mkdir G && echo keep > G/keep
GUARD="$TMP/G"
run_fail "--vocab-parallel must be 0 or 1 (got 2)" "$MOE" train "${BASE[@]}" --vocab-parallel 2 --out G/R
run_fail "--vocab-parallel with --tp 4: a vocabulary of 2 rows leaves a TP rank none" \
  "$MOE" train "${BASE[@]}" --n-kv-heads 4 --tp 4 --vocab-size 2 --vocab-parallel 1 --out G/R
GUARD=""

# ---- moe info: a TP rank's parameters (tiny: 2 x 256 x 96 of them in the two tables; half on each rank)
par() { "$MOE" info --tp 2 "$@" | sed -n -E 's/^per rank \(zero 0, float32\): params ([0-9.]+) MiB.*/\1/p'; }
P0=$(par --vocab-parallel 0) P1=$(par --vocab-parallel 1)
check "moe info: a TP rank's parameters 2 x 128 x 96 floats fewer ($P0 -> $P1 MiB)" \
  awk -v a="$P0" -v b="$P1" 'BEGIN { d = (a - b) * 1048576; exit !(d > 98304 - 11000 && d < 98304 + 11000) }'
check "moe info's mesh line names the split vocabulary" \
  bash -c "'$MOE' info --tp 2 --vocab-parallel 1 | grep -q 'attention heads and the vocabulary (--vocab-parallel) split'"

# ---- the layouts against one process
run_ok "one process" "$MOE" train "${BASE[@]}" --out ref < /dev/null
layout() { # ranks label run ref flags...
  local np="$1" label="$2" run="$3" ref="$4"; shift 4
  mkdir -p "$run"
  if $MPI -np "$np" "$MOE" train "${BASE[@]}" "$@" --out "$run" > "$run/out.txt" 2>&1 < /dev/null; then
    mesh_close "$ref" "$run" "$label"
  else
    fail "$label: mpirun failed"; tail -5 "$run/out.txt"
  fi
}
layout 2 "tp2 --vocab-parallel 1" tp2 ref --tp 2 "${VP[@]}"
check "tp2: the mesh line names the split vocabulary" grep -q "attention heads and the vocabulary" tp2/out.txt
check "tp2: the sample is one process's text" cmp -s <(sample_block ref/train.log) <(sample_block tp2/train.log)
layout 4 "tp2 x dp2, ZeRO 2 --vocab-parallel 1" tpdp tp2 --tp 2 --zero 2 "${VP[@]}"
run_ok "one process, 2 micro-batches" "$MOE" train "${BASE[@]}" --grad-accum 2 --out ref2 < /dev/null
layout 4 "tp2 x pp2 (1F1B, 2 micro-batches) --vocab-parallel 1" tppp ref2 --tp 2 --pp 2 --grad-accum 2 "${VP[@]}"
check "tp2 x pp2: the sample (through the stages) is one process's text" \
  cmp -s <(sample_block ref2/train.log) <(sample_block tppp/train.log)
# An MTP module: its head split too. The forward is the whole head's: step 1's losses (main and MTP) those of
# tp2 without the option to 1e-12 (seen: the same bits). The backward sums each head's input gradient over the
# TP ranks' vocabulary halves, a partial sum one process does not take: at --lr 1e-2 this model amplifies
# round-off step by step (tp2 without the option: grad norm 1.7e-6 from one process by step 6; with it
# 1.2e-5, past the band), at 3e-3 both stay near 1e-7 (2.7e-8 and 2.2e-7), so the run compares there.
M1=(--steps 1 --mtp 1 --sample-tokens 0)
mkdir -p m1w m1v
$MPI -np 2 "$MOE" train "${BASE[@]}" "${M1[@]}" --tp 2 --out m1w > m1w/out.txt 2>&1 < /dev/null || fail "tp2 --mtp 1, 1 step"
$MPI -np 2 "$MOE" train "${BASE[@]}" "${M1[@]}" --tp 2 --vocab-parallel 1 --out m1v > m1v/out.txt 2>&1 < /dev/null ||
  fail "tp2 --mtp 1 --vocab-parallel 1, 1 step"
for k in loss mtp_loss; do
  a=$(field "$k" m1w/metrics.jsonl) b=$(field "$k" m1v/metrics.jsonl)
  check "--mtp 1, step 1's $k: the whole head's over tp2 ($a against $b)" \
    awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= 1e-12 * a) }'
done
run_ok "one process, --mtp 1 at lr 3e-3" "$MOE" train "${BASE[@]}" --mtp 1 --lr 3e-3 --out refm < /dev/null
layout 2 "tp2 --mtp 1 --vocab-parallel 1 (lr 3e-3)" tpm refm --tp 2 --mtp 1 --lr 3e-3 "${VP[@]}"
run_ok "one process, vocabulary 125" "$MOE" train "${BASE[@]}" --vocab-size 125 --out refu < /dev/null
layout 2 "tp2, vocabulary 125 (62 + 63 rows) --vocab-parallel 1" tpu refu --tp 2 --vocab-size 125 "${VP[@]}"

# ---- the checkpoint holds the whole model: resumed on another layout
check "the checkpoint's tables are full size (tp2's embedding as one process's)" \
  bash -c "'$CKPT_DIFF' ref tp2 1e-3 > /dev/null"
S=(--save-every 3 --keep 0)
mkdir -p half && $MPI -np 2 "$MOE" train "${BASE[@]}" "${S[@]}" --steps 3 --tp 2 --vocab-parallel 1 --out half \
  > half/out.txt 2>&1 < /dev/null || fail "tp2, 3 steps: mpirun failed"
run_ok "resumed in one process for 3 more" "$MOE" train "${BASE[@]}" "${S[@]}" --out half --resume < /dev/null
NO_REPLICA_CHECK=1 mesh_close ref half "saved by tp2 --vocab-parallel 1 at step 3, resumed in one process"
run_ok "one process, 3 steps" "$MOE" train "${BASE[@]}" "${S[@]}" --steps 3 --out back < /dev/null
mkdir -p back && $MPI -np 2 "$MOE" train "${BASE[@]}" "${S[@]}" --tp 2 --vocab-parallel 1 --out back --resume \
  > back/out.txt 2>&1 < /dev/null || fail "tp2 resume: mpirun failed"
NO_REPLICA_CHECK=1 mesh_close ref back "saved by one process at step 3, resumed by tp2 --vocab-parallel 1"
finish
