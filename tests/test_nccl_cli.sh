#!/usr/bin/env bash
# test_nccl_cli.sh — the multi-GPU (NCCL) entry points that can be checked without a GPU: a clear
# error, before anything is written, for MOE_FORCE_NCCL on the cpu backend or with a bad value, and
# for several processes on --device cuda on a machine without a GPU (with or without NCCL in the build:
# without it GPU meshes are staged, docs/PARALLEL.md). (The NCCL path itself, the
# bounded waits and the watchdog run on a GPU: tests/test_nccl.c, docs/ARCHITECTURE.md.)
set -u
. "$(dirname "$0")/lib.sh"

W="$TMP/w"
mkdir -p "$W" && cd "$W" || exit 1
SMALL=(--steps 2 --batch 4 --seq-len 16 --eval-batches 1 --sample-tokens 0 --plots 0 --quiet
       --d-model 32 --n-heads 2 --n-kv-heads 1 --d-ff 48 --n-layers 1)
GUARD="$W"
if ldd "$MOE" 2>/dev/null | grep -q libnccl; then HAVE_NCCL=1; else HAVE_NCCL=0; fi

if [ $HAVE_NCCL = 1 ]; then
  MOE_FORCE_NCCL=1 run_fail "MOE_FORCE_NCCL=1 runs the NCCL path on the GPU: it needs --device cuda" \
    "$MOE" train --device cpu --out "$W/r" "${SMALL[@]}"
else
  MOE_FORCE_NCCL=1 run_fail "MOE_FORCE_NCCL=1: this moe was built without the NCCL backend" \
    "$MOE" train --device cpu --out "$W/r" "${SMALL[@]}"
fi
MOE_FORCE_NCCL=yes run_fail "MOE_FORCE_NCCL='yes': use 1" "$MOE" train --device cpu --out "$W/r" "${SMALL[@]}"
# 0 is the default: trains
if MOE_FORCE_NCCL=0 "$MOE" train --device cpu --out "$TMP/ok" "${SMALL[@]}" >"$OUT_FILE" 2>"$ERR_FILE"; then
  pass "MOE_FORCE_NCCL=0 trains on the cpu"
else fail "MOE_FORCE_NCCL=0 on the cpu"; show_output; fi

# several processes on --device cuda: every rank ends with one clear message, no crash
mpi_fail() {   # PHRASE ARGS...: mpirun -np 2 ARGS must fail cleanly, stderr naming PHRASE
  local phrase="$1"; shift
  timeout 120 mpirun --oversubscribe -np 2 "$@" >"$OUT_FILE" 2>"$ERR_FILE" </dev/null
  local rc=$?
  if [ $rc -ne 0 ] && [ $rc -le 125 ] && grep -qF -- "$phrase" "$ERR_FILE" && ! grep -qiE "segmentation|signal [0-9]" "$ERR_FILE" &&
     [ ! -e "$W/r" ]; then
    pass "'$phrase' <- mpirun -np 2 moe ${*:2}"
  else fail "mpirun -np 2 moe ${*:2}: exit $rc, expected '$phrase'"; show_output; fi
}
if ! command -v mpirun >/dev/null || ! ldd "$MOE" | grep -q libmpi; then
  skip "mpirun or the MPI build is missing: multi-process checks"
else
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
  # (a build without NCCL runs GPU meshes through the staged transport: the same message as with it)
  if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
    mpi_fail "no usable CUDA GPU" "$MOE" train --device cuda --out "$W/r" "${SMALL[@]}"
  else
    skip "a GPU is present: the multi-process cuda error path is not reachable here (tests/test_nccl.c runs)"
  fi
fi
finish
