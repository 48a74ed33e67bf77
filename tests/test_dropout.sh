#!/usr/bin/env bash
# test_dropout.sh — --dropout, --attn-dropout and --embed-dropout (the token embeddings, issue 42):
#   (1) --dropout 0 is the run without the flag, bit for bit (metrics' losses and the checkpoint's
#       tensors): no op runs at 0;
#   (2) --dropout 0.2 changes the training losses (the mask is applied) but not the evaluation: the
#       run's final val loss equals `moe eval` on its checkpoint (evaluation never drops);
#   (2a) --embed-dropout 0.2 the same (from step 1), and 1 is refused;
#   (2b) with --recompute full (attention output and expert rows recomputed in backward) the same bits;
#   (3) the masks are functions of (seed, step, micro-batch, layer, site, global token, feature / global
#       head and key), not of the rank or the chunking: runs with --dropout and --attn-dropout on DP, TP
#       (heads split), EP, TP+EP and pipeline meshes, and with AMPipe's row chunks, match one unchunked
#       process at the mesh tolerances (tests/test_mesh.sh says why).
set -u
. "$(dirname "$0")/lib.sh"
small_fixture
BASE=(--steps 6 --quiet --sample-tokens 0 --plots 0 --batch 16 --seq-len 24 --eval-batches 1 --eval-every 0
      --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --n-layers 2 --lr 1e-2 --warmup 2)
losses() { field loss "$1/metrics.jsonl"; }

run_ok "no --dropout" "$MOE" train "${BASE[@]}" --out none || finish
run_ok "--dropout 0 --attn-dropout 0 --embed-dropout 0" "$MOE" train "${BASE[@]}" --out zero --dropout 0 --attn-dropout 0 \
  --embed-dropout 0 || finish
cmp -s <(losses none) <(losses zero) && cmp -s none/step_00000006/model.safetensors zero/step_00000006/model.safetensors &&
  pass "--dropout 0 --attn-dropout 0 --embed-dropout 0 = no dropout, bit for bit (losses and parameters)" ||
  fail "--dropout 0 differs from no dropout"

run_ok "--dropout 0.2" "$MOE" train "${BASE[@]}" --out d --dropout 0.2 --sample-tokens 20 || finish
final=$(grep -o '^val loss [0-9.]*' "$OUT_FILE" | cut -d' ' -f3)
cmp -s <(losses none | tail -5) <(losses d | tail -5) && fail "--dropout 0.2 did not change the losses" ||
  pass "--dropout 0.2 changes the training losses"
run_ok "moe eval of the dropout run" "$MOE" eval --ckpt d
ev=$(grep -o '^val loss [0-9.]*' "$OUT_FILE" | cut -d' ' -f3)
[ -n "$ev" ] && [ "$ev" = "$final" ] && pass "the run's val loss $final = moe eval's (evaluation does not drop)" ||
  fail "the run's val loss '$final' != moe eval's '$ev'"

run_ok "--embed-dropout 0.2" "$MOE" train "${BASE[@]}" --out e --embed-dropout 0.2 || finish
final=$(grep -o '^val loss [0-9.]*' "$OUT_FILE" | cut -d' ' -f3)
cmp -s <(losses none | tail -5) <(losses e | tail -5) && fail "--embed-dropout 0.2 did not change the losses" ||
  pass "--embed-dropout 0.2 changes the training losses"
[ "$(losses none | head -1)" != "$(losses e | head -1)" ] && pass "... from step 1 (the embeddings dropped in the first forward)" ||
  fail "--embed-dropout 0.2: step 1's loss is the undropped one"
run_ok "moe eval of the embedding-dropout run" "$MOE" eval --ckpt e
ev=$(grep -o '^val loss [0-9.]*' "$OUT_FILE" | cut -d' ' -f3)
[ -n "$ev" ] && [ "$ev" = "$final" ] && pass "the run's val loss $final = moe eval's (evaluation does not drop embeddings)" ||
  fail "embed dropout: the run's val loss '$final' != moe eval's '$ev'"
run_fail "--embed-dropout must be in [0, 1) (got 1)" "$MOE" train "${BASE[@]}" --out bad --embed-dropout 1

# --recompute full recomputes the attention output (with its dropout mask: the same hash of the slot's
# seed) and the experts' rows in the backward: the same bits as keeping them
run_ok "dropouts, activations kept" "$MOE" train "${BASE[@]}" --out keep --dropout 0.2 --attn-dropout 0.1 --embed-dropout 0.1 || finish
run_ok "dropouts, --recompute full" "$MOE" train "${BASE[@]}" --out rc --dropout 0.2 --attn-dropout 0.1 --embed-dropout 0.1 \
  --recompute full || finish
cmp -s <(losses keep) <(losses rc) && cmp -s keep/step_00000006/model.safetensors rc/step_00000006/model.safetensors &&
  pass "--recompute full with both dropouts = keeping the activations, bit for bit" ||
  fail "--recompute full with dropout differs from keeping the activations"

mpi_tests
ref="$TMP/ref"
DROP=(--dropout 0.2 --attn-dropout 0.1 --embed-dropout 0.1)
"$MOE" train "${BASE[@]}" --out "$ref" "${DROP[@]}" --grad-accum 2 > /dev/null 2>&1 < /dev/null || { fail "reference run"; finish; }
while IFS='|' read -r np flags label; do
  run="$TMP/run"
  rm -rf "$run"; mkdir -p "$run"
  launch=($MPI -np "$np"); [ "$np" = 1 ] && launch=()
  if "${launch[@]}" "$MOE" train "${BASE[@]}" --out "$run" "${DROP[@]}" --grad-accum 2 $flags --check-replicas \
       > "$run/out.txt" 2>&1 < /dev/null; then
    NO_REPLICA_CHECK=$([ "$np" = 1 ] && echo 1 || echo 0) mesh_close "$ref" "$run" "dropout 0.2 + attention 0.1 + embedding 0.1: $label"
  else
    fail "dropouts: $label: mpirun failed"; tail -5 "$run/out.txt"
  fi
done <<< "2|--tp 1|dp2
2|--tp 2|tp2
4|--tp 2 --ep 2|tp2+dp2+ep2
4|--ep 2 --etp 2|dp4+ep2+etp2
2|--pp 2|pp2 (1f1b)
1|--ampipe 2|AMPipe 2 (one process: the masks over row chunks)
4|--tp 2 --ep 2 --ampipe 4|tp2+dp2+ep2 with AMPipe 4"
finish
