#!/usr/bin/env bash
# test_preempt.sh — lost work (issue 18): SIGTERM or SIGINT mid-run finishes the step, writes a
# complete checkpoint and exits with status 75, and --resume then continues bit-exactly (every
# step's loss equal, as printed, to an uninterrupted run's; the final weights byte-identical);
# kill -9 at random moments of a run that saves every step always leaves a newest complete
# checkpoint that loads, and resuming from it is bit-exact too; a file-size limit hit during a
# save (RLIMIT_FSIZE, as a full disk) gives one clear error and leaves the previous checkpoint
# byte-identical and loadable. Outside the training loop nothing waits for a check (issue 42): SIGTERM
# during start-up or during the final sample ends the process at once (killed by it: 143; was a run that
# went on, training a step after start-up or sampling to the end). On a mesh under mpirun (issue 42): SIGTERM
# to mpirun made the job exit 1 (mpirun's own status on SIGTERM, whatever the ranks return) and the ranks
# were killed a second later; SIGUSR1, which mpirun forwards, gives the ranks' 75 and a checkpoint that
# --resume continues bit-exactly, and scripts/mpirun_preempt.sh turns a SIGTERM into it.
set -u
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
F=(--batch 8 --seq-len 64 --eval-batches 1 --eval-every 0 --sample-tokens 0 --plots 0 --quiet --steps 60)
losses() { field loss "$1/metrics.jsonl" | tr '\n' ' '; }
# wait_lines RUN N: until RUN/metrics.jsonl has N training lines (at most 60 s)
wait_lines() { local i; for ((i = 0; i < 600; i++)); do [ "$(grep -c '"loss"' "$1/metrics.jsonl" 2>/dev/null)" -ge "$2" ] 2>/dev/null && return 0; sleep 0.1; done; return 1; }

run_ok "uninterrupted run A (60 steps)" "$MOE" train "${F[@]}" --out A
want=$(losses A)

for sig in TERM INT; do
  B="B$sig"
  set -m   # job control: the background job does not ignore SIGINT (as a non-interactive shell's would)
  "$MOE" train "${F[@]}" --out "$B" >"$B.out" 2>"$B.err" &
  pid=$!
  set +m
  wait_lines "$B" 8 && kill -"$sig" $pid
  wait $pid
  rc=$?
  latest=$(ls -d "$B"/step_* 2>/dev/null | grep -v '\.tmp$' | tail -n 1)
  if [ $rc -eq 75 ] && grep -q "^moe: preempted by SIG$sig after step [0-9]*: checkpoint .* written; continue with .*--resume" "$B.err" &&
     [ -n "$latest" ] && [ -f "$latest/checksums.json" ] && [ "$latest" != "$B/step_00000060" ]; then
    pass "SIG$sig mid-run: exit 75, checkpoint $(basename "$latest"), one line saying so"
  else fail "SIG$sig mid-run: exit $rc, latest '$latest'"; cat "$B.err" | tail -3; fi
  run_ok "SIG$sig: --resume continues" "$MOE" train "${F[@]}" --out "$B" --resume
  check "SIG$sig: every loss equal to the uninterrupted run's" test "$(losses "$B")" = "$want"
  check "SIG$sig: final weights byte-identical" cmp -s A/step_00000060/model.safetensors "$B/step_00000060/model.safetensors"
done

# kill -9 at random moments of a run that saves every step
K=K
rm -rf $K
kept=0
for t in 1 2 3 4 5 6; do
  if ls $K/step_*[0-9]/checksums.json >/dev/null 2>&1; then how=--resume; else how=--force; fi
  "$MOE" train "${F[@]}" --save-every 1 --out $K $how >/dev/null 2>&1 &
  pid=$!
  sleep "0.$((RANDOM % 9 + 1))"
  kill -9 $pid 2>/dev/null
  wait $pid 2>/dev/null
  ls -d $K/step_*.tmp >/dev/null 2>&1 && kept=$((kept + 1))
  # (a kill during the first save leaves only a .tmp: no complete checkpoint to load yet)
  if [ -d $K ] && ls -d $K/step_*[0-9]/checksums.json >/dev/null 2>&1; then
    if ! "$MOE" eval --ckpt $K --batch 8 --seq-len 64 --eval-batches 1 >/dev/null 2>"$K.err"; then
      fail "kill -9 #$t: the newest complete checkpoint does not load"; cat "$K.err"; break
    fi
  fi
done
pass "kill -9 six times during a run saving every step ($kept left a half-written .tmp): the newest complete checkpoint always loaded"
# (on a machine busy enough every kill can land before the first save completes: then there is nothing
# to resume, and the run starts over, as the loop's next start would)
if ls $K/step_*[0-9]/checksums.json >/dev/null 2>&1; then how=--resume; else how=--force; fi
run_ok "after the kills: $how runs to the end" "$MOE" train "${F[@]}" --save-every 1 --out $K $how
check "after the kills: every loss equal to the uninterrupted run's" test "$(losses $K)" = "$want"

# a full disk during a save: RLIMIT_FSIZE (512 KiB; the checkpoint's files are ~2.2 MB)
run_ok "a run with a checkpoint at step 4" "$MOE" train "${F[@]}" --steps 4 --out D
before=$(tree_hash D/step_00000004)
( ulimit -f 512; exec "$MOE" train "${F[@]}" --steps 8 --out D --resume ) >"$OUT_FILE" 2>"$ERR_FILE"
rc=$?
if [ $rc -ge 1 ] && [ $rc -le 125 ] && [ "$(grep -c . "$ERR_FILE")" -eq 1 ] && grep -q '^moe: error: .*step_00000008.*(File too large)' "$ERR_FILE"
then pass "a file-size limit during the save: exit $rc, $(cat "$ERR_FILE")"
else fail "a file-size limit during the save: exit $rc"; show_output; fi
check "the previous checkpoint is byte-identical" test "$(tree_hash D/step_00000004)" = "$before"
run_ok "the previous checkpoint loads" "$MOE" eval --ckpt D --batch 8 --seq-len 64 --eval-batches 1
check "... and is the newest" grep -q 'step 4)' "$OUT_FILE"
run_ok "without the limit, --resume saves" "$MOE" train "${F[@]}" --steps 8 --out D --resume

# wait_gone PID S: PID exited within S seconds (then its status is in $rc), else it is killed and 1
wait_gone() { local i; for ((i = 0; i < $2 * 10; i++)); do kill -0 "$1" 2>/dev/null || { wait "$1"; rc=$?; return 0; }; sleep 0.1; done
  kill -9 "$1" 2>/dev/null; wait "$1" 2>/dev/null; rc=killed; return 1; }
# SIGTERM during the final sample (a million tokens: minutes) ends the run at once
"$MOE" train "${F[@]}" --steps 4 --sample-tokens 1000000 --out S >S.out 2>S.err &
pid=$!
for ((i = 0; i < 600; i++)); do [ -f S/step_00000004/checksums.json ] && break; sleep 0.1; done
sleep 1 # (the final evaluation, then the sample)
kill -TERM $pid
wait_gone $pid 10
check "SIGTERM during the final sample: the process ends at once, killed by it (status $rc)" test "$rc" = 143
check "... the last checkpoint complete" test -f S/step_00000004/checksums.json
# SIGTERM during start-up ends the process before any step (MOE_FAULT=startup:wait holds the run at the end
# of its start-up for 30 s; the run's header line says it got there)
MOE_FAULT=startup:wait "$MOE" train "${F[@]}" --steps 4 --out U >U.out 2>U.err &
pid=$!
for ((i = 0; i < 300; i++)); do grep -qs "^model:" U.out && break; sleep 0.1; done
sleep 0.5
kill -TERM $pid
wait_gone $pid 20
check "SIGTERM during start-up: the process ends at once, killed by it (status $rc)" test "$rc" = 143
check "... before any step or checkpoint" test -z "$(grep -s '"loss"' U/metrics.jsonl)" -a -z "$(ls -d U/step_* 2>/dev/null)"

# mpirun: SIGUSR1 (forwarded) and SIGTERM through scripts/mpirun_preempt.sh
if ! command -v mpirun >/dev/null; then skip "mpirun not installed: the mesh's preemption"; finish; fi
if ! ldd "$MOE" 2>/dev/null | grep -q libmpi; then skip "this moe is built without MPI (scripts/sanitize.sh's build): the mesh's preemption"; finish; fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
MP=(--oversubscribe -np 2 "$MOE" train "${F[@]}" --steps 30)
run_ok "mpirun -np 2: uninterrupted run (30 steps)" timeout 300 mpirun "${MP[@]}" --out MA
want=$(losses MA)
for how in usr1 script; do
  if [ $how = usr1 ]; then timeout 300 mpirun "${MP[@]}" --out "M$how" >"M$how.out" 2>"M$how.err" &
  else timeout 300 "$MOE_SRC/scripts/mpirun_preempt.sh" "${MP[@]}" --out "M$how" >"M$how.out" 2>"M$how.err" & fi
  pid=$!
  wait_lines "M$how" 4
  if [ $how = usr1 ]; then kill -USR1 "$(pgrep -P $pid mpirun || echo $pid)"; else kill -TERM "$(pgrep -P $pid -f mpirun_preempt || echo $pid)"; fi
  wait $pid
  rc=$?
  label="mpirun -np 2, SIGUSR1 to mpirun"
  [ $how = script ] && label="scripts/mpirun_preempt.sh -np 2, SIGTERM to it"
  if [ $rc -eq 75 ] && grep -q "^moe: preempted by SIGUSR1 after step [0-9]*: checkpoint .* written" "M$how.err"; then
    pass "$label: exit 75, a checkpoint, one line saying so"
  else fail "$label: exit $rc"; tail -3 "M$how.err"; fi
  run_ok "$label: --resume continues" timeout 300 mpirun "${MP[@]}" --out "M$how" --resume
  check "$label: every loss equal to the uninterrupted run's" test "$(losses "M$how")" = "$want"
done
finish
