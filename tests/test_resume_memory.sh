#!/usr/bin/env bash
# test_resume_memory.sh — a resume reads its checkpoint a tensor at a time into the model and the optimizer
# (issue 42, limits: it held three full host copies, weights and both moments, 12 bytes a parameter, before
# handing them over). A 25M-parameter model's resume, one step and a save, against the same model's first
# step and save from scratch (which holds one host copy of the initial weights, 4 bytes a parameter): the
# resume's peak RSS must stay below the fresh run's plus 2 bytes a parameter (measured here: fresh 448 MiB,
# resume with the copies 623 MiB, streamed 449 MiB). The resumed run's losses equal an uninterrupted run's.
set -u
. "$(dirname "$0")/lib.sh"
small_fixture
command -v python3 >/dev/null || { skip "python3 not installed"; finish; }
F=(--d-model 256 --n-layers 4 --n-heads 4 --n-kv-heads 4 --n-experts 8 --d-ff 1024 --batch 1 --seq-len 16
   --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 --quiet --keep 0)
# peak RSS (KiB) of the command, by the kernel's account of the finished child
peak() { python3 -c 'import resource, subprocess, sys
rc = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode
print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss if rc == 0 else -1)' "$@"; }
P=$("$MOE" info "${F[@]:0:12}" | grep -o '([0-9]* /' | tr -dc 0-9)
[ -n "$P" ] && [ "$P" -gt 20000000 ] && pass "the model has $P parameters" || fail "parameters: '$P'"
fresh=$(peak "$MOE" train "${F[@]}" --steps 1 --out r)
resume=$(peak "$MOE" train --out r --resume --steps 2)
limit=$((fresh + P * 2 / 1024))
[ "$fresh" -gt 0 ] && [ "$resume" -gt 0 ] && [ "$resume" -lt "$limit" ] &&
  pass "resume's peak RSS $((resume / 1024)) MiB < the fresh run's $((fresh / 1024)) MiB + 2 bytes a parameter" ||
  fail "resume's peak RSS $((resume / 1024)) MiB, the fresh run's $((fresh / 1024)) MiB (limit $((limit / 1024)) MiB)"
"$MOE" train "${F[@]}" --steps 2 --out u > /dev/null 2>&1 || fail "the uninterrupted run"
cmp -s <(field loss r/metrics.jsonl) <(field loss u/metrics.jsonl) && same_ckpt r u step_00000002 &&
  pass "the resumed run = the uninterrupted run (losses, checkpoint)" || fail "the resumed run differs from the uninterrupted one"
finish
