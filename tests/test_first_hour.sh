#!/usr/bin/env bash
# test_first_hour.sh — what a new user meets in the first hour must say what it does (issue 42, "first
# hour", "messages that mislead", "limits"): `moe eval` of a model with no run record and no --data says
# on stderr that it evaluates the embedded synthetic corpus; `moe export --out a/b` creates a/ (and
# still never replaces a directory without --force); enum-valued options are named by their words in
# messages, not numbers; a --resume of a directory that does not exist says so; --sample-tokens has a
# named bound; `moe info` with a huge vocabulary shows finite, positive figures. OpenMP on a shared machine:
# with no wait policy set, moe runs with OMP_WAIT_POLICY=passive (its own environment says so while it
# trains: the OpenMP runtime reads it at load, so moe runs itself again with it) and train prints the
# choice once; a policy the user set is kept and nothing is printed (the figures: docs/USAGE.md).
set -u
. "$(dirname "$0")/lib.sh"

small_fixture
text_bytes 6000 1 >a.txt
R=("$MOE" train "${SMALL[@]}" "${MODEL[@]}")
run_ok "fixture: a run on a.txt" "${R[@]}" --data a.txt --steps 2 --out run
run_ok "fixture: its export" "$MOE" export --ckpt run --out hf

echo "-- moe eval without --data"
run_ok "eval of a Hugging Face directory without --data" "$MOE" eval --ckpt hf "${EVAL[@]}"
check "... says on stderr that it evaluates the embedded synthetic corpus" \
  grep -q "no --data: evaluating on the embedded synthetic corpus" "$ERR_FILE"
run_ok "eval of it with --data" "$MOE" eval --ckpt hf "${EVAL[@]}" --data a.txt
check "... has no such note" bash -c "! grep -q 'embedded synthetic corpus' $ERR_FILE"
run_ok "eval of the run (its run.json names the data)" "$MOE" eval --ckpt run "${EVAL[@]}"
check "... has no such note" bash -c "! grep -q 'embedded synthetic corpus' $ERR_FILE"

echo "-- moe export --out into a directory that does not exist yet"
run_ok "export --out new/deeper/x creates new/ and new/deeper/" "$MOE" export --ckpt run --out new/deeper/x
check "... a Hugging Face directory there" test -f new/deeper/x/model.safetensors -a -f new/deeper/x/config.json
check "... and nothing else beside it" test "$(ls new/deeper)" = x
GUARD="$W/new"
run_fail "--out: 'new/deeper/x' already exists; pass --force to replace it" "$MOE" export --ckpt run --out new/deeper/x
GUARD=""
echo notadir >file
GUARD="$W/file"
run_fail "'file' exists and is not a directory" "$MOE" export --ckpt run --out file/x
GUARD=""
run_ok "control: --force replaces the export" "$MOE" export --ckpt run --out new/deeper/x --force

echo "-- messages name enum values by their words"
GUARD="$W/run"
run_fail "--aux-form hf, the checkpoint's layer; drop --aux-form" \
  "${R[@]}" --steps 3 --out run --resume --aux-form hf
run_fail "--balance aux-free, the checkpoint's aux; drop --balance" \
  "${R[@]}" --steps 3 --out run --resume --balance aux-free
GUARD="$W/hf"
run_fail "--init-from hf: --family olmoe contradicts its config.json (mixtral)" \
  "${R[@]}" --init-from hf --family olmoe --steps 1 --out fromhf
GUARD=""

echo "-- --resume of a directory that holds no run"
run_fail "--resume: no complete checkpoint in 'nothere': it does not exist (there is no run to continue" "${R[@]}" --steps 2 --out nothere --resume
check "... no talk of an older moe" bash -c "! grep -q 'older moe' $OUT_FILE"
check "... and nothing created" test ! -e nothere
mkdir empty
run_fail "--resume: no complete checkpoint in 'empty'" "${R[@]}" --steps 2 --out empty --resume
check "... no talk of an older moe" bash -c "! grep -q 'older moe' $OUT_FILE"

echo "-- limits"
GUARD="$W/run"
run_fail "--sample-tokens must be in 0..1048576 (SAMPLE_MAX_TOKENS; got 2147483647)" \
  "${R[@]}" --sample-tokens 2147483647 --steps 3 --out run --resume
# (control, without sampling a million tokens: the bound passes validation; the data is refused next)
run_fail "cannot open shard file 'missing.bin'" "${R[@]}" --sample-tokens 1048576 --data missing.bin --steps 3 --out run --resume
GUARD=""
# moe info with the largest vocabulary: the LM head's activations alone are 4 bytes x 1024 tokens x
# (2 x 4096 + 2147483647) = 8.0 TiB, so the activations shown must be at least that, and no figure negative
run_ok "moe info --vocab-size 2147483647" "$MOE" info --vocab-size 2147483647 --d-model 4096
check "... no negative figure" bash -c "! grep -qE '(^|[ (:])-[0-9]' $OUT_FILE"
acts=$(sed -n 's/.*activations for batch 16 x 64: \([0-9.]*\) TiB.*/\1/p' "$OUT_FILE")
check "... activations $acts TiB >= 8.0 TiB (the LM head's)" fcmp "${acts:-0}" ">=" 8.0

echo "-- the OpenMP wait policy"
env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "${R[@]}" --data a.txt --steps 400 --out omp --force >omp.out 2>&1 &
pid=$!
for ((i = 0; i < 300; i++)); do grep -q '"loss"' omp/metrics.jsonl 2>/dev/null && break; sleep 0.1; done
envs=$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null)
kill $pid 2>/dev/null; wait $pid 2>/dev/null
check "unset: moe trains with OMP_WAIT_POLICY=passive in its environment" grep -qx OMP_WAIT_POLICY=passive <<<"$envs"
check "... and says so once" test "$(grep -c "^threads: [0-9]* OpenMP threads* (every core), waiting passive (moe's default where OMP_WAIT_POLICY is unset)$" omp.out)" = 1
OMP_WAIT_POLICY=active run_ok "OMP_WAIT_POLICY=active: kept" "${R[@]}" --data a.txt --steps 1 --out omp2
check "... and no threads line" bash -c "! grep -q '^threads:' $OUT_FILE"

finish
