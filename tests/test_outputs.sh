#!/usr/bin/env bash
# test_outputs.sh — a command's output that cannot be written is an error (issue 42):
#   (1) eval, sample, info, plan and compare with stdout on /dev/full: exit 1 and one
#       "moe: error: cannot write to standard output" line (each exited 0 before, its report lost);
#   (2) eval --dump to a FIFO is refused at once, naming it (it blocked forever in the open, after the whole
#       evaluation), and so are a directory and a path whose directory is missing; the FIFO and the run are
#       untouched.
set -u
. "$(dirname "$0")/lib.sh"
small_fixture
run_ok "train a small run" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 2 --out r || finish
GUARD="r"
run_fail "cannot write to standard output (No space left on device)" sh -c '"$0" eval --ckpt r --eval-batches 1 > /dev/full' "$MOE"
# sample reports its speed on stderr: its last line is the error
"$MOE" sample --ckpt r --tokens 20 > /dev/full 2> "$ERR_FILE"; rc=$?
[ $rc = 1 ] && tail -1 "$ERR_FILE" | grep -q '^moe: error: cannot write to standard output' && [ "$(grep -c 'moe: error' "$ERR_FILE")" = 1 ] &&
  pass "sample > /dev/full: exit 1, $(tail -1 "$ERR_FILE")" || fail "sample > /dev/full: exit $rc, $(cat "$ERR_FILE")"
run_fail "cannot write to standard output" sh -c '"$0" info --ckpt r > /dev/full' "$MOE"
run_fail "cannot write to standard output" sh -c '"$0" plan --gpus 8 > /dev/full' "$MOE"
run_fail "cannot write to standard output" sh -c '"$0" compare r > /dev/full' "$MOE"
mkfifo fifo   # (not in GUARD: reading it to hash it would block)
run_fail "--dump 'fifo' is not a regular file (a FIFO)" timeout 60 "$MOE" eval --ckpt r --eval-batches 1 --dump fifo
[ -p fifo ] && pass "fifo is still a FIFO" || fail "fifo was replaced"
mkdir d
run_fail "--dump 'd' is not a regular file (a directory)" "$MOE" eval --ckpt r --eval-batches 1 --dump d
run_fail "--dump: the directory 'nodir' does not exist" "$MOE" eval --ckpt r --eval-batches 1 --dump nodir/x.safetensors
run_ok "eval --dump to a new file still works" "$MOE" eval --ckpt r --eval-batches 1 --dump x.safetensors
[ -s x.safetensors ] && pass "x.safetensors written" || fail "no x.safetensors"
finish
