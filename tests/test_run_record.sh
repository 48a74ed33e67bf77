#!/usr/bin/env bash
# test_run_record.sh — validation that does not flatter, runs that remember their options, help that
# tells:
#   (1) `moe eval` on a checkpoint trained at T=128 uses T=128, the run's batch and the held-out tail
#       by default (from run.json), and reproduces the run's final val loss to the printed digit;
#   (2) --eval-batches beyond the validation set is clipped to its whole batches and says so (the same
#       tokens and loss as --eval-batches all), never wrapped;
#   (3) run.json holds the command line and the resolved options; a --resume without --data continues
#       on the recorded data: its losses equal the uninterrupted run's bit for bit;
#   (4) an override on --resume is printed and logged in run.json; a model option that contradicts the
#       checkpoint is refused naming the option;
#   (5) `moe <command> --help` gives a default for every option of every command.
# Not here: the split itself (tests/test_data.c).
set -u
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1

# a text file of 60000 bytes: the held-out tail is its last 6000
awk 'BEGIN { srand(7); for (i = 0; i < 1500; i++) { s = ""; for (j = 0; j < 39; j++) s = s sprintf("%c", 97 + int(rand() * 8)); print s } }' > text.txt
SMALL=(--d-model 32 --n-heads 2 --n-kv-heads 1 --d-ff 48 --n-layers 1 --sample-tokens 0 --plots 0 --quiet)
loss_lines() { grep '"loss"' "$1/metrics.jsonl" | grep -o '"step":[0-9]*,"loss":[^,]*'; }

# ---------------------------------------------------------------- (1) eval defaults to the run's T, batch, split
run_ok "train at T=128 on a text file" "$MOE" train "${SMALL[@]}" --data text.txt --seq-len 128 --batch 8 \
  --grad-accum 2 --steps 6 --save-every 3 --keep 0 --eval-batches 2 --out a || { finish; }
final_val=$(grep -o '^val loss [0-9.]*' "$OUT_FILE" | cut -d' ' -f3)
run_ok "moe eval --ckpt a (nothing else)" "$MOE" eval --ckpt a
grep -q "^T 128, batch 4, 2 of the" "$OUT_FILE" && pass "eval took T 128 and the run's micro-batch 4 (8 / 2)" ||
  { fail "eval did not take T 128, batch 4 from the run"; show_output; }
grep -q "the held-out tail, the last 10% of the tokens (6000 from token 54000)" "$OUT_FILE" &&
  pass "eval took the held-out tail (the last 6000 of 60000 tokens)" || { fail "eval: not the held-out tail"; show_output; }
ev=$(grep -o '^val loss [0-9.]*' "$OUT_FILE" | cut -d' ' -f3)
[ -n "$ev" ] && [ "$ev" = "$final_val" ] && pass "eval's val loss $ev = the run's final val loss" ||
  fail "eval's val loss '$ev' != the run's final '$final_val'"
run_ok "moe eval --seq-len 64 (an explicit T still wins)" "$MOE" eval --ckpt a --seq-len 64
grep -q "^T 64, batch 4" "$OUT_FILE" && pass "--seq-len 64 given: T 64" || fail "--seq-len 64 ignored"

# ---------------------------------------------------------------- (2) clipped, never wrapped
# 6000 held-out tokens at T=128: (6000-1)/128 = 46 windows = 11 whole batches of 4
run_ok "eval --eval-batches 1000" "$MOE" eval --ckpt a --eval-batches 1000
grep -q "note: --eval-batches 1000 exceeds the validation set (11 whole batches of 4 sequences): evaluated 11" "$OUT_FILE" &&
  pass "a request beyond the set is clipped to 11 batches and says so" || { fail "no clip note"; show_output; }
clip=$(grep '^val loss' "$OUT_FILE")
echo "$clip" | grep -q "over 5632 tokens" && pass "clipped: 5632 tokens (11 x 4 x 128), no more than the set holds" ||
  fail "clipped eval: '$clip' (want 5632 tokens)"
run_ok "eval --eval-batches all" "$MOE" eval --ckpt a --eval-batches all
[ "$(grep '^val loss' "$OUT_FILE")" = "$clip" ] && pass "--eval-batches all = the clipped request" ||
  fail "--eval-batches all differs from the clipped request"
grep -q "^note:" "$OUT_FILE" && fail "--eval-batches all printed a clip note" || pass "--eval-batches all: no note"

# ---------------------------------------------------------------- (3) the record; resume on the recorded data
[ -f a/run.json ] && grep -q '"command_line":.*train .*--data text.txt --seq-len 128' a/run.json &&
  grep -q "\"data\":[[:space:]]*\"$TMP/text.txt\"" a/run.json && grep -q '"seq-len":[[:space:]]*"128"' a/run.json &&
  pass "run.json: the command line and the resolved options (the data as an absolute path)" ||
  { fail "run.json lacks the command line or options"; cat a/run.json | head -20; }
cp -r a b
rm -rf b/step_00000006
awk '{ if (match($0, /"step":[0-9]+/) && substr($0, RSTART + 7, RLENGTH - 7) + 0 <= 3) print }' a/metrics.jsonl > b/metrics.jsonl
run_ok "--resume with nothing but --out (no --data)" "$MOE" train --out b --resume --quiet
grep -- "--resume: the run's options (b/run.json):" "$OUT_FILE" | grep -q -- " --data $TMP/text.txt" &&
  grep -- "--resume: the run's options (b/run.json):" "$OUT_FILE" | grep -q -- " --seq-len 128 " &&
  pass "the resume printed the recorded options it took" || { fail "no line of recorded options"; show_output; }
grep -q "held-out tail" "$OUT_FILE" && pass "the resume trains on text.txt (not the embedded corpus)" ||
  fail "the resume did not use text.txt"
[ "$(loss_lines a)" = "$(loss_lines b)" ] && [ "$(loss_lines b | wc -l)" = 6 ] &&
  pass "losses of steps 1..6 equal the uninterrupted run's bit for bit" ||
  { fail "resumed losses differ"; diff <(loss_lines a) <(loss_lines b) | head; }
cmp -s a/step_00000006/model.safetensors b/step_00000006/model.safetensors &&
  pass "the step-6 checkpoints are byte-identical" || fail "the step-6 checkpoints differ"

# ---------------------------------------------------------------- (4) overrides logged; model options refused
rm -rf b/step_00000006
run_ok "--resume --lr 0.002 (an override)" "$MOE" train --out b --resume --quiet --lr 0.002
grep -q -- "--resume: --lr 0.002 overrides the run's 0.003 (b/run.json)" "$OUT_FILE" &&
  pass "the override is printed" || { fail "the override was not printed"; show_output; }
grep -A8 '"resumes"' b/run.json | grep -q '"lr":' && grep -q '"recorded":[[:space:]]*"0.00300000003"' b/run.json &&
  grep -q '"now":[[:space:]]*"0.00200000009"' b/run.json && pass "the override is logged in run.json (recorded, now)" ||
  { fail "run.json does not log the override"; cat b/run.json | tail -15; }
GUARD="b"
run_fail "--n-layers 2, the checkpoint's 1" "$MOE" train --out b --resume --n-layers 2
GUARD=""

# ---------------------------------------------------------------- (5) --help: a default for every option
for c in train sample eval info export; do
  "$MOE" $c --help > help.txt
  n=$(grep -c '^  --' help.txt)
  miss=$(grep '^  --' help.txt | grep -v '^  --help ' | grep -vc 'default')
  [ "$n" -gt 3 ] && [ "$miss" = 0 ] && pass "moe $c --help: a default for each of its $((n - 1)) options" ||
    { fail "moe $c --help: $miss options without a default"; grep '^  --' help.txt | grep -v default | head -5; }
done
"$MOE" train --help | grep -q -- '--device S .*cuda-fp32' && pass "--device lists cuda-fp32" || fail "--device lacks cuda-fp32"
"$MOE" export --help | grep -q -- '--out S .*Hugging Face' && "$MOE" sample --help | grep -q -- "--seed N .*sampler" &&
  pass "export --out and sample --seed have their own descriptions" || fail "shared descriptions for export --out / sample --seed"
finish
