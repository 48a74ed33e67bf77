#!/usr/bin/env bash
# test_preempt.sh — lost work (issue 18): SIGTERM or SIGINT mid-run finishes the step, writes a
# complete checkpoint and exits with status 75, and --resume then continues bit-exactly (every
# step's loss equal, as printed, to an uninterrupted run's; the final weights byte-identical);
# kill -9 at random moments of a run that saves every step always leaves a newest complete
# checkpoint that loads, and resuming from it is bit-exact too; a file-size limit hit during a
# save (RLIMIT_FSIZE, as a full disk) gives one clear error and leaves the previous checkpoint
# byte-identical and loadable.
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
run_ok "after the kills: --resume runs to the end" "$MOE" train "${F[@]}" --save-every 1 --out $K --resume
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
finish
