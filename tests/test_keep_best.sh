#!/usr/bin/env bash
# test_keep_best.sh — --keep-best and the run's log:
#   (1) OUT/best is the checkpoint of the step whose val_loss in metrics.jsonl is the lowest (its
#       state.json step), complete (checksums), not pruned by --keep 1, and `moe eval` on it reproduces
#       that val loss; a --resume keeps comparing against it (after the resume, still the argmin over
#       every evaluation of the run);
#   (2) OUT/train.log is a copy of `moe train`'s stdout, appended on resume;
#   (3) --force deletes best/ and train.log with the rest of the run;
#   (4) eval, sample and export of the run directory name the checkpoint they read (the newest) and best/.
set -u
. "$(dirname "$0")/lib.sh"
small_fixture
# a high learning rate so that the validation loss does not just fall (the best is not always the last)
ARGS=("${SMALL[@]}" "${MODEL[@]}" --lr 0.03 --warmup 0 --eval-every 3 --save-every 3 --keep 1 --keep-best)
argmin_step() { grep -o '"step":[0-9]*,"val_loss":[0-9.e+-]*' "$1" | sed 's/"step":\([0-9]*\),"val_loss":\(.*\)/\2 \1/' |
  sort -g | head -1 | cut -d' ' -f2; }
min_loss() { grep -o '"val_loss":[0-9.e+-]*' "$1" | cut -d: -f2 | sort -g | head -1; }
best_step() { grep -o '"step":[^,]*' "$1/best/state.json" | grep -o '[0-9]*'; }

run_ok "train 12 steps with --keep-best --keep 1" "$MOE" train "${ARGS[@]}" --steps 12 --out r || finish
cp "$OUT_FILE" out1.txt
[ -f r/best/checksums.json ] && pass "r/best is a complete checkpoint" || fail "no complete r/best"
n=$(ls -d r/step_* | wc -l)
[ "$n" = 1 ] && pass "--keep 1: one step checkpoint besides best" || fail "--keep 1: $n step checkpoints"
a=$(argmin_step r/metrics.jsonl); b=$(best_step r)
[ -n "$a" ] && [ "$a" = "$b" ] && pass "best is step $b, the lowest val loss of the run" ||
  fail "best is step '$b', the lowest val loss is at step '$a'"
run_ok "moe eval --ckpt r/best" "$MOE" eval --ckpt r/best
ev=$(grep -o '^val loss [0-9.]*' "$OUT_FILE" | cut -d' ' -f3); ml=$(min_loss r/metrics.jsonl)
fcmp "$ev" == "$(printf '%.4f' "$ml")" && pass "eval of best: $ev = the run's lowest val loss $ml" ||
  fail "eval of best gives $ev, the lowest val loss is $ml"
cmp -s out1.txt r/train.log && pass "train.log = the run's stdout" || { fail "train.log differs from stdout"; diff out1.txt r/train.log | head; }

run_ok "resume to 24 steps" "$MOE" train --out r --resume --steps 24 || finish
cp "$OUT_FILE" out2.txt
a=$(argmin_step r/metrics.jsonl); b=$(best_step r)
[ "$a" = "$b" ] && pass "after the resume best is step $b, the lowest val loss of all 8 evaluations" ||
  fail "after the resume best is step '$b', the lowest val loss is at step '$a'"
grep -q "resuming from" r/train.log && [ "$(head -c "$(wc -c < out1.txt)" r/train.log | cmp -s - out1.txt; echo $?)" = 0 ] &&
  grep -qF "$(tail -1 out2.txt)" <(tail -1 r/train.log) && pass "train.log: the first run's output, then the resume's" ||
  fail "train.log does not hold both runs' output"

# (4) eval, sample and export of the run directory say which checkpoint they read and where the best is
b=$(best_step r)
for c in "eval --eval-batches 1" "sample --tokens 4" "export --out hf_r --force"; do
  "$MOE" $c --ckpt r > /dev/null 2> note.txt
  grep -qF "moe: note: reading r/step_00000024, the run's newest checkpoint (step 24); --keep-best kept r/best (step $b," note.txt &&
    pass "${c%% *} --ckpt r names the newest checkpoint and r/best (step $b)" || fail "${c%% *} --ckpt r: $(cat note.txt)"
done
"$MOE" eval --ckpt r/best --eval-batches 1 > /dev/null 2> note.txt
[ ! -s note.txt ] && pass "eval --ckpt r/best: no note" || fail "eval --ckpt r/best: $(cat note.txt)"

run_ok "--force starts over" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 2 --out r --force
[ ! -e r/best ] && pass "--force removed best/" || fail "--force left best/"
[ "$(grep -c 'resuming' r/train.log)" = 0 ] && pass "--force started a new train.log" || fail "--force kept the old train.log"
finish
