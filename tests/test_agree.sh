#!/usr/bin/env bash
# test_agree.sh — ranks of one mpirun job started with different options (issue 18, finding 9: they
# hung forever, or trained different things with exit 0) end every rank within bounded time with
# one "moe: error:" line naming each differing option and both values; so do ranks whose --data
# names files with different contents, and a job where one rank never reaches the start-up check
# (MOE_COMM_TIMEOUT_S). Identical ranks still train.
set -u
. "$(dirname "$0")/lib.sh"
command -v mpirun >/dev/null || { skip "mpirun not installed"; finish; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
cd "$TMP" || exit 1
STALL="$(dirname "$MOE")/mpi_stall"
BASE=(--batch 4 --seq-len 16 --eval-batches 1 --sample-tokens 0 --plots 0 --quiet --d-model 32 --n-heads 2
      --n-kv-heads 1 --d-ff 48 --n-layers 1 --steps 2)
mkdir -p r0 r1
text_bytes 3000 1 >r0/d.txt
text_bytes 3000 2 >r1/d.txt

# per_rank "RANK0 ARGS" "RANK1 ARGS": 2 ranks, each in its own directory r0 / r1 with its own extra
# flags; PASS if the job fails within 60 s, with one "moe: error:" line holding every phrase given
per_rank() {
  local a0="$1" a1="$2"; shift 2
  local t0 rc dt n
  t0=$(date +%s)
  A0="$a0" A1="$a1" timeout 120 mpirun --oversubscribe -x A0 -x A1 -np 2 bash -c \
    'cd "r$OMPI_COMM_WORLD_RANK" && if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then x=$A0; else x=$A1; fi; exec "$@" $x' \
    _ "$MOE" train "${BASE[@]}" --out "$TMP/out" >out.txt 2>&1 </dev/null
  rc=$?
  dt=$(( $(date +%s) - t0 ))
  n=$(grep -c 'moe: error:' out.txt)
  local why="" p
  [ $rc -eq 0 ] && why="exit status 0"
  [ $rc -eq 124 ] && why="hung (killed after 120 s)"
  [ $dt -ge 60 ] && why="${why:+$why; }took ${dt}s"
  [ "$n" -eq 1 ] || why="${why:+$why; }$n 'moe: error:' lines"
  for p in "$@"; do grep 'moe: error:' out.txt | grep -qF -- "$p" || why="${why:+$why; }no '$p'"; done
  if [ -z "$why" ]; then pass "ranks with '$a0' / '$a1': $(grep -o 'moe: error:.*' out.txt | cut -c1-160) (${dt}s)"
  else fail "ranks with '$a0' / '$a1': $why"; grep -v '^ *$' out.txt | tail -5; fi
  rm -rf "$TMP/out"
}

# the control: identical ranks train
if timeout 300 mpirun --oversubscribe -np 2 "$MOE" train "${BASE[@]}" --out "$TMP/ok" >out.txt 2>&1 </dev/null
then pass "control: two identical ranks train"; else fail "control: two identical ranks"; tail -5 out.txt; fi

# hung before: the ranks reached different collectives
per_rank "--dispatch dropless" "--dispatch capacity" "--dispatch (rank 0: dropless, rank 1: capacity)"
per_rank "--grad-accum 1" "--grad-accum 2" "--grad-accum (rank 0: 1, rank 1: 2)"
per_rank "--save-every 1" "--save-every 0" "--save-every (rank 0: 1, rank 1: 0)"
per_rank "--data d.txt" "" "--data (rank 0: 'd.txt', rank 1: '')"
per_rank "--ep 2 --check-replicas" "--ep 1 --check-replicas" "--ep (rank 0: 2, rank 1: 1)"
# trained different things with exit 0 before
per_rank "--seed 1" "--seed 2" "--seed (rank 0: 1, rank 1: 2)"
per_rank "--batch 4" "--batch 8" "--batch (rank 0: 4, rank 1: 8)"
per_rank "--ep 2" "" "--ep (rank 0: 2, rank 1: 1)"
per_rank "--jitter 0.1" "" "--jitter (rank 0: 0.1, rank 1: 0)"
# (issue 42: an enum other than --dispatch was shown as a number, '(rank 0: 1, rank 1: 0)')
per_rank "--aux-form hf" "" "--aux-form (rank 0: hf, rank 1: layer)"
per_rank "--seed 5 --lr 0.01" "--seed 6 --lr 0.02" "--seed (rank 0: 5, rank 1: 6)" "--lr (rank 0: 0.01, rank 1: 0.02)"
# the same flags, different files behind the same name
per_rank "--data d.txt" "--data d.txt" "different data: --data contents"

# a rank that never reaches the check: the job still ends, naming the timeout
t0=$(date +%s)
MOE_COMM_TIMEOUT_S=3 timeout 120 mpirun --oversubscribe -x MOE_COMM_TIMEOUT_S -np 2 bash -c \
  'if [ "$OMPI_COMM_WORLD_RANK" = 1 ]; then exec "$0"; else exec "$@"; fi' "$STALL" "$MOE" train "${BASE[@]}" --out "$TMP/st" \
  >out.txt 2>&1 </dev/null
rc=$?
dt=$(( $(date +%s) - t0 ))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $dt -lt 60 ] && grep -q 'moe: error:.*did not all reach the start-up check' out.txt
then pass "a rank stuck before the start-up check: the job ends in ${dt}s naming the timeout"
else fail "a stuck rank: exit $rc after ${dt}s"; tail -5 out.txt; fi

# every blocking MPI call is watched (comm_world.c): rank 0 waits in a barrier the other rank never
# reaches; with MOE_COMM_TIMEOUT_S=2 the job ends within seconds, naming the barrier
t0=$(date +%s)
MOE_COMM_TIMEOUT_S=2 timeout 60 mpirun --oversubscribe -x MOE_COMM_TIMEOUT_S -np 2 "$STALL" barrier > "$TMP/wd.txt" 2>&1 < /dev/null
rc=$?; dt=$(( $(date +%s) - t0 ))
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $dt -lt 30 ] && grep -q "moe: error: \[rank 0\] MPI barrier on group world did not complete within 2 s (MOE_COMM_TIMEOUT_S)" "$TMP/wd.txt"; then
  pass "a barrier one rank never reaches ends the job in ${dt}s, naming it (MPI watchdog)"
else fail "MPI watchdog: exit $rc after ${dt}s"; tail -3 "$TMP/wd.txt"; fi
finish
