#!/usr/bin/env bash
# test_staged.sh — the device transports of a GPU mesh other than NCCL (src/parallel/comm_staged.c,
# comm_ipc.c), run here over the cpu backend's host memory (--gpu-comm staged | ipc | mpi with --device cpu:
# the same code, the copies memcpy, ipc's inboxes POSIX shared memory), against the host ops a cpu mesh
# uses. The staged transport hands the host (MPI) ops the same values in the same order, and ipc puts every
# row where the flat all-to-all-v puts it, so a run through either is promised to be the SAME BITS as the
# plain mesh run (metrics and the final checkpoint's model and optimizer files); so is the direct form
# (device pointers to MPI). ipc leaves no shared-memory segment behind. Layouts: every kind of collective the trainer makes through the device calls: TP and EP with
# ZeRO 2's bucketed reduce-scatter and gather (non-blocking, overlapped), the pipelined exchange and
# AMPipe (non-blocking all-to-all-v), the two-level all-to-all, expert TP gathered, the pipeline's
# point-to-point messages (interleaved), and the widest composition once (8 ranks). The GPU side of the
# same promise (against one GPU process) is scripts/device/gpu_mesh.sh's matrix on the device.
# Bad input: --gpu-comm nccl on the cpu backend and an unknown transport are refused with one message.
set -u
. "$(dirname "$0")/lib.sh"
mpi_tests

BASE="--steps 4 --quiet --sample-tokens 0 --plots 0 --batch 16 --seq-len 16 --eval-batches 1 --eval-every 0
      --n-layers 4 --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2
      --grad-accum 2 --device cpu"
strip() { sed -E 's/"pp_idle_s":\[[^]]*\],?//; s/"(tokens_per_s|tflops|step_time_s|grad_wait_s|bubble_frac|a2a_tuned)":[^,}]*,?//g' "$1" | grep '"loss"'; }
same() { # same REF RUN LABEL
  local ok=1 f
  [ "$(strip "$1/metrics.jsonl" | wc -l)" -gt 0 ] || ok=0
  cmp -s <(strip "$1/metrics.jsonl") <(strip "$2/metrics.jsonl") || ok=0
  for f in model.safetensors optimizer.safetensors; do
    cmp -s "$1/step_00000004/$f" "$2/step_00000004/$f" || ok=0
  done
  [ $ok = 1 ] && pass "$3: metrics and checkpoint bitwise equal to the host-ops mesh" ||
    { fail "$3: differs from the host-ops mesh"; tail -3 "$2/out.txt"; }
}
run() { # run DIR NP FLAGS...
  local d=$1 np=$2
  shift 2
  rm -rf "$d"
  mkdir -p "$d"
  $MPI -np "$np" "$MOE" train --out "$d" $BASE "$@" > "$d.txt" 2>&1 < /dev/null
}

for L in "4|--tp 2 --ep 2 --zero 2 --bucket-mb 0.01|tp2 ep2 zero2, small buckets" \
         "2|--ep 2 --a2a-overlap 2 --ampipe 2|ep2, pipelined exchange 2, AMPipe 2" \
         "4|--ep 4 --a2a-hier 2 --zero 1|ep4 two-level, zero1" \
         "4|--ep 2 --etp 2 --expert-mode gathered|ep2 etp2 gathered" \
         "2|--pp 2 --pp-schedule interleaved --vpp 2 --grad-accum 4|pp2 vpp2 interleaved" \
         "8|--pp 2 --tp 2 --ep 2 --zero 2 --grad-accum 4 --dispatch capacity --capacity-factor 0.8|pp2 tp2 ep2 zero2 capacity (8 ranks)"; do
  IFS='|' read -r np flags label <<< "$L"
  run "$TMP/host" "$np" $flags || { fail "$label: the host-ops run failed"; tail -3 "$TMP/host.txt"; continue; }
  for gc in staged ipc mpi; do
    [ $gc = mpi ] && [ "$np" != 4 ] && continue # (the direct form: once per width)
    [ $gc = ipc ] && [[ "$flags" != *--ep* ]] && continue # (ipc moves the all-to-all-v only)
    if run "$TMP/$gc" "$np" $flags --gpu-comm $gc; then same "$TMP/host" "$TMP/$gc" "$label, --gpu-comm $gc"
    else fail "$label, --gpu-comm $gc: mpirun failed"; tail -3 "$TMP/$gc.txt"; fi
  done
done
left=$(ls /dev/shm 2>/dev/null | grep -c '^moe-ipc-')
[ "$left" = 0 ] && pass "ipc: no shared-memory segment left in /dev/shm" || fail "ipc: $left segments left in /dev/shm"
n=$(grep -c "^gpu-comm: staged over the cpu backend" "$TMP/staged.txt")
[ "$n" = 1 ] && pass "the transport and its reason printed once" || fail "the transport line printed $n times"

# bad input
out=$($MPI -np 2 "$MOE" train --out "$TMP/bad" $BASE --gpu-comm nccl 2>&1 < /dev/null)
rc=$?
[ $rc != 0 ] && echo "$out" | grep -q "error: .*--gpu-comm nccl moves GPU buffers: it needs --device cuda" && [ ! -e "$TMP/bad" ] &&
  pass "--gpu-comm nccl on the cpu backend refused (exit $rc), nothing written" || fail "--gpu-comm nccl on cpu: rc $rc: $out"
out=$("$MOE" train --out "$TMP/bad" $BASE --gpu-comm shm 2>&1 < /dev/null)
rc=$?
[ $rc != 0 ] && echo "$out" | grep -q "gpu-comm" && echo "$out" | grep -q "auto, nccl, staged, ipc, mpi" && [ ! -e "$TMP/bad" ] &&
  pass "an unknown --gpu-comm refused naming the choices" || fail "--gpu-comm shm: rc $rc: $out"
finish
