#!/usr/bin/env bash
# test_limits.sh — issue 42's "accepted and ignored" options and costs out of proportion, each through the CLI:
#   (1) --val-data naming the --data file (the same path, or a link to it) is refused in one line, nothing
#       written (it trained with a validation loss measured on its training tokens);
#   (2) a 10 MB --config whose last key repeats its 700000th is refused naming the key within 60 s (the
#       duplicate-key check compared each key with every later one: 2.5 x 10^11 comparisons here, hours);
#   (3) a model of 16384 experts (5 x 10^4 tensors; --upcycle 65536 has 4x as many) saves, resumes and
#       evaluates within 60 s each (the safetensors writer's duplicate check, its reader's lookup by name and
#       the checkpoint's extra-tensor check each walked every name per tensor: a 16384-expert save still ran
#       after 10 minutes; sorted, 65536 experts take 2.6 s to save and 6.8 s to resume), and the resumed
#       run's losses equal an uninterrupted run's.
# (--upcycle E beside a different --n-experts: test_upcycle.sh.)
set -u
. "$(dirname "$0")/lib.sh"
small_fixture
text_bytes 6000 1 >a.txt
ln -s a.txt link.txt
T=("$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 2 --out new)

# ---- 1: --val-data = --data
GUARD="$W"
run_fail "--val-data is the same file as --data" "${T[@]}" --data a.txt --val-data a.txt
run_fail "--val-data is the same file as --data" "${T[@]}" --data a.txt --val-data link.txt
GUARD=""

# ---- 2: a 10 MB config: the duplicate key named at once
awk 'BEGIN { printf "{"; for (i = 0; i < 700000; i++) printf "\"k%07d\": 0, ", i; print "\"steps\": 2, \"k0699999\": 1}" }' >big.json
sz=$(wc -c <big.json)
check "the config is over 10 MB ($sz bytes)" test "$sz" -gt 10000000
GUARD="$W/big.json"
run_fail 'has the key "k0699999" twice' timeout -k 5 60 "$MOE" train --config big.json --out new
GUARD=""

# ---- 3: 16384 experts
E=(--n-experts 16384 --top-k 2 --d-model 16 --n-heads 2 --n-kv-heads 1 --d-ff 1 --n-layers 1 --batch 2 --seq-len 8
   --eval-batches 1 --eval-every 0 --sample-tokens 0 --plots 0 --quiet --tensorboard 0)
run_ok "16384 experts: one step and its checkpoint within 60 s" timeout -k 5 60 "$MOE" train "${E[@]}" --steps 1 --out x
run_ok "... resumed (the checkpoint read back) within 60 s" timeout -k 5 60 "$MOE" train "${E[@]}" --steps 2 --out x --resume
run_ok "... evaluated within 60 s" timeout -k 5 60 "$MOE" eval --ckpt x --batch 2 --seq-len 8 --eval-batches 1
run_ok "... the uninterrupted run" timeout -k 5 60 "$MOE" train "${E[@]}" --steps 2 --out u
check "... the resumed run's losses equal it" test "$(field loss x/metrics.jsonl)" = "$(field loss u/metrics.jsonl)"
finish
