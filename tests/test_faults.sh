#!/usr/bin/env bash
# test_faults.sh — the crashes and silent divergence of issue 42, each through the CLI:
# (3) --pp x --vpp beyond int range is refused with one "moe: error:" line (was SIGFPE / SIGSEGV: the
# product wrapped); (6) a --val-frac that holds out no token is refused (was an endless loop that
# swallowed SIGTERM), and a tiny one with a long window names the tokens it needs at once; (4) a run
# whose loss stays non-finite stops with an error naming the step (was exit 0 with "-nan" in
# metrics.jsonl), every metrics.jsonl line is JSON, and the checkpoint before is untouched and loads;
# (2) the adaptive exchange with AMPipe (--ep 2 --ampipe auto --a2a-overlap auto, 12 candidates:
# a stack overflow of a list of 8) measures every candidate under mpirun and finishes.
set -u
. "$(dirname "$0")/lib.sh"

small_fixture
T=("$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 2 --out new)
GUARD="$W"

# ---- 3: pipeline stages: the product --pp x --vpp in 64 bits, against STAGES_MAX
run_fail "--pp 4 x --vpp 1073741824 = 4294967296 virtual stages; at most 256" \
  timeout -k 5 20 "$MOE" info --world 4 --pp 4 --vpp 1073741824 --pp-schedule interleaved
run_fail "--pp 2 x --vpp 2147483647 = 4294967294 virtual stages; at most 256" \
  timeout -k 5 20 "$MOE" info --world 2 --pp 2 --vpp 2147483647 --pp-schedule interleaved
run_fail "--pp 2 x --vpp 1073741824 = 2147483648 virtual stages; at most 256" \
  timeout -k 5 20 "$MOE" info --world 2 --pp 2 --vpp 1073741824 --pp-schedule interleaved

# ---- 6: --val-frac: below 5e-7 (0 at 6 decimals) refused at once, not a hang (the timeout fails it)
text_bytes 20000 7 >text.txt
for v in 4e-07 1e-12; do
  run_fail "--val-frac $v holds out no token (it is read to 6 decimals): the smallest that works is 1e-06" \
    timeout -k 5 20 "${T[@]}" --data text.txt --val-frac "$v"
done
# the smallest fraction with a long window: the tokens it needs, found without counting up to them
run_fail "too few for T=4096: need at least 4096000001" \
  timeout -k 5 20 "${T[@]}" --data text.txt --val-frac 1e-6 --seq-len 4096 --max-seq-len 4096 --batch 1
GUARD=""

# ---- 4: divergence. A good run saves step 2; resumed with a weight decay that blows the weights up
# (step 3's update), steps 4.. have no finite loss: the run stops at the third skipped step.
jsonl_ok() { # every line of a .jsonl file parses as JSON (perl's JSON::PP, in every perl since 5.14)
  perl -MJSON::PP -ne 'eval { JSON::PP->new->decode($_); 1 } or die "line $.: $@"' "$1"
}
run_ok "fixture: 2 good steps, checkpoint at step 2" \
  "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 2 --save-every 1 --out div
GUARD="$W/div/step_00000002"
run_fail "step 6: the loss or gradient norm was not finite for 3 steps in a row (steps 4..6" \
  timeout -k 5 120 "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 20 --save-every 1 --out div --resume \
  --weight-decay 1e30
GUARD=""
check "diverged: metrics.jsonl is JSON line by line (no NaN)" jsonl_ok div/metrics.jsonl
check "diverged: steps 4..6 are recorded as skipped with a null loss" \
  test "$(grep -c '"loss":null,.*"skipped":true' div/metrics.jsonl)" = 3
check "diverged: no checkpoint after step 3 (the skipped steps write none)" \
  test "$(ls -d div/step_* | tail -n 1)" = "div/step_00000003"
run_ok "diverged: the step-2 checkpoint loads" "$MOE" eval --ckpt div/step_00000002 "${EVAL[@]}"
# a non-finite validation loss is written as null, not -nan (one finite step, then eval at the end)
run_ok "a run ending in a skipped step still ends (a skip below the limit passes)" \
  "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 2 --weight-decay 1e30 --out nanval
check "nan validation loss: metrics.jsonl is JSON line by line" jsonl_ok nanval/metrics.jsonl
check "nan validation loss: written as null" grep -q '"val_loss":null' nanval/metrics.jsonl

# ---- 2: the adaptive exchange's every candidate, under mpirun (ep 2: 3 AMPipe n x r 1, 2, 4, 8)
mpi_tests
cd "$W" || exit 1
if $MPI -np 2 "$MOE" train "${SMALL[@]}" --batch 8 "${MODEL[@]}" --n-experts 4 --ep 2 --ampipe auto \
  --a2a-overlap auto --steps 36 --out auto >auto.txt 2>&1 </dev/null; then
  pass "ep2 --ampipe auto --a2a-overlap auto: the run succeeds"
  # the first 36 steps: each (r, n) a warm-up and two trials, in the tuner's order
  got=$(grep '"loss":' auto/metrics.jsonl | head -n 36 |
    sed 's/.*"a2a_overlap":\[\([0-9]*\)\],"ampipe":\[\([0-9]*\)\].*/\1x\2/' | uniq -c | awk '{ printf "%s:%s ", $2, $1 }')
  want="1x1:3 2x1:3 4x1:3 8x1:3 1x2:3 2x2:3 4x2:3 8x2:3 1x4:3 2x4:3 4x4:3 8x4:3 "
  check "auto tried every candidate (r x n: steps): $got" test "$got" = "$want"
  check "auto logged the 12 candidates and settled" grep -q \
    '"a2a_tuned":\[{"candidates":\[1,2,4,8,1,2,4,8,1,2,4,8\],"seconds":\[[0-9.e-]*\(,[0-9.e-]*\)\{11\}\],"modes":\[[^]]*\],"ampipe":\[1,1,1,1,2,2,2,2,4,4,4,4\]' \
    auto/metrics.jsonl
  check "auto measured each candidate (no -1 among the seconds)" \
    sh -c "! grep -o '\"seconds\":\[[^]]*\]' auto/metrics.jsonl | grep -q -- '[[,]-1[],]'"
else
  fail "ep2 --ampipe auto --a2a-overlap auto: mpirun failed"
  tail -n 5 auto.txt
fi

finish
