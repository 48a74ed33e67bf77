#!/usr/bin/env bash
# test_resume_guard.sh — a --resume that would silently continue on something else than the run it
# continues is refused by name (issue 42, "silent wrong behaviour"), or, where the change is a documented
# one, allowed: the training data (or --val-data) changed since the run was saved (run.json records each
# one's path, token count and hash; --data-changed continues on purpose); a --precision bf16 run resumed
# with --precision mixed (allowed: the run's bf16-only options no longer block it); a resume under
# mpirun that names no mesh option while the run's mesh was not the default (refused with the flags to
# pass; naming a mesh reshards). Each refusal leaves the run byte for byte as it was.
set -u
. "$(dirname "$0")/lib.sh"

small_fixture
text_bytes 6000 1 >a.txt
text_bytes 3000 2 >v.txt
R=("$MOE" train "${SMALL[@]}" "${MODEL[@]}")

echo "-- the data changed between save and resume"
run_ok "fixture: a run on a.txt, checkpoint at step 2" "${R[@]}" --data a.txt --steps 2 --out run
check "run.json records the data's token count" grep -q '"tokens":[[:space:]]*6000' run/run.json
cp -a a.txt a0.txt
GUARD="$W/run"
run_ok "control: the same data resumes" "${R[@]}" --steps 3 --out run --resume
text_bytes 6000 3 >a.txt # the same size, other bytes
run_fail "the training data (--data) changed since the run was saved: $W/a.txt" "${R[@]}" --steps 4 --out run --resume
check "the message gives both fingerprints" grep -q "run.json: 6000 tokens, hash [0-9a-f]*; now 6000 tokens, hash" "$ERR_FILE"
run_fail "pass --data-changed" "${R[@]}" --data a.txt --steps 4 --out run --resume
text_bytes 6001 1 >a.txt # one byte appended
run_fail "now 6001 tokens" "${R[@]}" --steps 4 --out run --resume
GUARD=""
run_ok "--data-changed continues on the new data" "${R[@]}" --steps 4 --out run --resume --data-changed
check "... and run.json records the new data" grep -q '"tokens":[[:space:]]*6001' run/run.json
run_ok "... after which a plain --resume continues" "${R[@]}" --steps 5 --out run --resume
run_ok "another --data named on resume (an override, printed) continues" \
  "${R[@]}" --data a0.txt --steps 6 --out run --resume
check "... printed as an override" grep -q -- "--data $W/a0.txt overrides the run's" "$OUT_FILE"

run_fail "--data-changed: it lets a --resume continue on changed data" "${R[@]}" --steps 2 --out fresh --data-changed

echo "-- --val-data changed"
run_ok "fixture: a run with --val-data" "${R[@]}" --data a0.txt --val-data v.txt --steps 2 --out rv
text_bytes 3000 4 >v.txt
GUARD="$W/rv"
run_fail "the validation data (--val-data) changed since the run was saved: $W/v.txt" \
  "${R[@]}" --steps 3 --out rv --resume
GUARD=""

echo "-- the embedded corpus (no --data) resumes as before"
run_ok "fixture: a run on the embedded corpus" "${R[@]}" --steps 2 --out rs
run_ok "... resumed" "${R[@]}" --steps 3 --out rs --resume

echo "-- a --precision bf16 run resumed with --precision mixed"
run_ok "fixture: a bf16 run (rounding nearest, float32 expert gradients)" \
  "${R[@]}" --precision bf16 --bf16-rounding nearest --bf16-grads 0 --steps 2 --out rb
run_ok "resumed with --precision mixed (the run's --bf16-rounding does not block it)" \
  "${R[@]}" --precision mixed --steps 3 --out rb --resume
check "... the conversion is noted" grep -q "continuing with --precision mixed (its bf16 values as float32)" "$OUT_FILE"
check "... the bf16-only options are not listed as the run's" bash -c "! grep -q -- '--bf16-rounding' $OUT_FILE"
run_ok "resumed with --precision bf16 again" "${R[@]}" --precision bf16 --steps 4 --out rb --resume
check "... takes the run's --bf16-rounding nearest and --bf16-grads 0 back" \
  grep -q -- "the run's options.*--bf16-rounding nearest --bf16-grads 0" "$OUT_FILE"
GUARD="$W/rb"
run_fail "--bf16-rounding rounds the weights of --precision bf16 and fp8-bf16; this run's precision is mixed" \
  "${R[@]}" --precision mixed --bf16-rounding nearest --steps 5 --out rb --resume
GUARD=""

echo "-- a resume under mpirun that names no mesh option"
mpi_tests
# mpi_refuse PHRASE CMD...: a non-zero exit that is no crash or timeout, "moe: error: ...PHRASE" (each
# rank may print it), and every path in $GUARD unchanged
mpi_refuse() {
  local phrase="$1"; shift
  local before; before=$(tree_hash "$GUARD")
  "$@" >"$OUT_FILE" 2>&1 </dev/null
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -lt 124 ] && grep -qF -- "moe: error: " "$OUT_FILE" && grep -qF -- "$phrase" "$OUT_FILE" &&
    [ "$(tree_hash "$GUARD")" = "$before" ]; then
    pass "'$phrase' <- ${*:4}"
  else
    fail "expected '$phrase' (exit $rc; run unchanged: $([ "$(tree_hash "$GUARD")" = "$before" ] && echo yes || echo no)): $*"
    tail -n 5 "$OUT_FILE" | sed 's/^/    | /'
  fi
}
run_ok "fixture: a run on 2 ranks with --ep 2" $MPI -np 2 "${R[@]}" --ep 2 --steps 2 --out rm
GUARD="$W/rm"
mpi_refuse "names no mesh option, so it would train on the default layout (--ep 1), not the run's" \
  $MPI -np 2 "${R[@]}" --steps 3 --out rm --resume
mpi_refuse "pass --ep 2 to continue on the run's mesh" $MPI -np 2 "${R[@]}" --steps 3 --out rm --resume
GUARD=""
run_ok "resumed with the run's mesh (--ep 2)" $MPI -np 2 "${R[@]}" --ep 2 --steps 3 --out rm --resume </dev/null
run_ok "resharded onto a mesh the command names (--zero 1, data parallel)" \
  $MPI -np 2 "${R[@]}" --zero 1 --steps 4 --out rm --resume </dev/null
run_ok "a data-parallel run resumes on 2 ranks without mesh flags" \
  $MPI -np 2 "${R[@]}" --steps 2 --out rd </dev/null
run_ok "... (its layout is the default one)" $MPI -np 2 "${R[@]}" --steps 3 --out rd --resume </dev/null
run_ok "one process resumes a mesh run without mesh flags (its only layout)" \
  "${R[@]}" --steps 5 --out rm --resume

echo "-- run.json without some options (an older moe's, or edited): said by name, the defaults apply"
run_ok "fixture: a run with --warmup 3 --weight-decay 0.05" "${R[@]}" --data a0.txt --warmup 3 --weight-decay 0.05 --steps 2 --out ro
run_ok "control: its run.json resumes without a warning" "${R[@]}" --steps 3 --out ro --resume
check "... (none printed)" sh -c "! grep -q 'records no value' '$ERR_FILE'"
sed -i '/"warmup":/d; /"weight-decay":/d' ro/run.json
run_ok "without its warmup and weight-decay it resumes" "${R[@]}" --steps 4 --out ro --resume
check "... warning by name of both" grep -q -- "records no value for --warmup --weight-decay" "$ERR_FILE"
sed -i '/"warmup":/d; /"weight-decay":/d' ro/run.json
run_ok "naming one of them on resume" "${R[@]}" --warmup 3 --steps 5 --out ro --resume
check "... leaves only the other in the warning" grep -q -- "records no value for --weight-decay (" "$ERR_FILE"

finish
