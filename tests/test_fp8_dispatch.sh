#!/usr/bin/env bash
# test_fp8_dispatch.sh — --fp8-dispatch as a training option (moe.h m->fp8_dispatch: the experts' input rows
# rounded to FP8 where they are gathered, moved packed between EP ranks; the rows' format and the layer's
# bits: test_fp8_dispatch.c, the layer on a mesh: mpi_moe.c):
#   - refusals: a value other than 0 or 1, and the option without --precision fp8 / fp8-bf16; one
#     "moe: error:" line each, nothing written; moe info's EP all-to-all bytes lower with it;
#   - one process (d_model 160: two tiles a row, the second short): the header's line with the packed row's
#     bytes (160 + 2 against 640); step 1's loss the same bits as without the option (the experts' forward is
#     unchanged) and its gradient norm not (their gate and up weight gradients take the rounded rows);
#   - ep2 (the rows cross ranks packed) against ep2 without the option: step 1's loss the same bits again, so
#     the packed rows arrive as the values one process rounds them to; against one process with the option:
#     test_mesh.sh's bands (on test_fp8_train.sh's mesh model, as its fp8 ep2);
#   - ep2 with the pipelined exchange (--a2a-overlap 2) and AMPipe (--ampipe 2): step 1's loss the same bits
#     with and without; one process with --recompute moe bit for bit;
#   - ep4 through the two-level all-to-all (--a2a-hier 2: the packed rows through its staging) against the
#     flat one: metrics byte-identical;
#   - a resume (3 + 3 steps) takes the option from run.json and equals the 6 steps run at once.
set -u
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

BASE=(--steps 3 --quiet --sample-tokens 0 --plots 0 --batch 16 --seq-len 24 --eval-batches 1 --eval-every 0
      --save-every -1 --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 160 --d-ff 48 --n-experts 4 --lr 1e-2
      --warmup 2 --precision fp8)
first() { field "$1" "$2/metrics.jsonl" | head -n 1; }

# ---- refusals (the guarded directory: nothing may appear in it)
mkdir G && echo keep > G/keep
GUARD="$TMP/G"
run_fail "--fp8-dispatch must be 0 or 1 (got 2)" "$MOE" train "${BASE[@]}" --fp8-dispatch 2 --out G/R
run_fail "--fp8-dispatch sends the experts' input rows as --precision fp8's or fp8-bf16's FP8 operands; this run's precision is mixed" \
  "$MOE" train "${BASE[@]}" --precision mixed --fp8-dispatch 1 --out G/R
GUARD=""

# ---- moe info: the EP all-to-all's bytes with the packed rows (test_cost.c derives them) below those without
a2a() { "$MOE" info --precision fp8 --ep 2 --world 2 "$@" 2>&1 | grep -o 'ep all-to-all [0-9.]* [KMG]iB' | head -n 1; }
I0=$(a2a --fp8-dispatch 0) I1=$(a2a --fp8-dispatch 1)
bytes() { awk -v x="${1#ep all-to-all }" 'BEGIN { split(x, p, " "); u = p[2] == "KiB" ? 1024 : p[2] == "MiB" ? 1048576 : p[2] == "GiB" ? 1073741824 : 0; printf "%.0f", p[1] * u }'; }
check "moe info: the EP all-to-all sends less with --fp8-dispatch 1 ($I1 against $I0)" \
  awk -v a="$(bytes "$I1")" -v b="$(bytes "$I0")" 'BEGIN { exit !(a + 0 > 0 && a + 0 < b + 0) }'

# ---- one process
run_ok "fp8" "$MOE" train "${BASE[@]}" --out A < /dev/null
run_ok "fp8 --fp8-dispatch 1" "$MOE" train "${BASE[@]}" --fp8-dispatch 1 --out D < /dev/null
check "the header says the packed row's bytes" \
  grep -q "fp8: --fp8-dispatch: .* between ranks 162 bytes a row (640 unpacked)" D/train.log
check "without the option no such line" bash -c '! grep -q "fp8-dispatch" A/train.log'
check "step 1's loss: the same bits with and without (the experts' forward unchanged): $(first loss D)" \
  test "$(first loss A)" = "$(first loss D)"
check "step 1's gradient norm differs (the gate and up weight gradients from the rounded rows): $(first grad_norm A) vs $(first grad_norm D)" \
  test "$(first grad_norm A)" != "$(first grad_norm D)"
run_ok "fp8 --fp8-dispatch 1 --recompute moe" "$MOE" train "${BASE[@]}" --fp8-dispatch 1 --recompute moe --out DR < /dev/null
check "--recompute moe: the losses and gradient norms bit for bit (the experts' forward again from the rounded rows)" \
  cmp -s <(field loss D/metrics.jsonl; field grad_norm D/metrics.jsonl) <(field loss DR/metrics.jsonl; field grad_norm DR/metrics.jsonl)

# ---- meshes
if command -v mpirun > /dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  MPI="timeout 300 mpirun --oversubscribe"
  mpi_run() { # mpi_run LABEL NP DIR FLAGS...
    local label="$1" np="$2" dir="$3"; shift 3
    mkdir -p "$dir"
    if $MPI -np "$np" "$MOE" train "${BASE[@]}" "$@" --out "$dir" > "$dir/out.txt" 2>&1 < /dev/null; then return 0; fi
    fail "$label: mpirun failed"; tail -5 "$dir/out.txt"; return 1
  }
  if mpi_run "ep2" 2 E2 --ep 2 && mpi_run "ep2 --fp8-dispatch 1" 2 E2D --ep 2 --fp8-dispatch 1; then
    check "ep2: step 1's loss the same bits with and without --fp8-dispatch (the packed rows lose nothing)" \
      test "$(first loss E2)" = "$(first loss E2D)"
    check "ep2: step 1's gradient norm differs with it" test "$(first grad_norm E2)" != "$(first grad_norm E2D)"
  fi
  # against one process with the option, at test_mesh.sh's bands: on test_fp8_train.sh's mesh model (d 32),
  # where plain fp8's ep2 holds them (at d 160 it does not either: the weight gradients' 128-row tiles
  # differ with the rows' order, 3e-5 of the loss by step 6, with or without the option)
  MB=(--steps 6 --quiet --sample-tokens 0 --plots 0 --batch 16 --seq-len 24 --eval-batches 1 --eval-every 0
      --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2 --precision fp8
      --fp8-dispatch 1)
  run_ok "the one-process reference (d 32)" "$MOE" train "${MB[@]}" --out M1 < /dev/null
  mkdir -p M2
  if $MPI -np 2 "$MOE" train "${MB[@]}" --ep 2 --check-replicas --out M2 > M2/out.txt 2>&1 < /dev/null; then
    mesh_close M1 M2 "fp8-dispatch ep2 against one process"
  else fail "fp8-dispatch ep2 (d 32): mpirun failed"; tail -5 M2/out.txt; fi
  # the exchange's other schedules on ep2: the pipelined exchange (its chunks packed one by one) and AMPipe
  # (its chunks' dispatches left in flight): step 1's loss the same bits as without the option again
  for sch in "--a2a-overlap 2|r2" "--ampipe 2|ampipe"; do
    IFS='|' read -r flags label <<< "$sch"
    if mpi_run "ep2 $label" 2 "S0_$label" --ep 2 $flags && mpi_run "ep2 $label --fp8-dispatch 1" 2 "S1_$label" --ep 2 $flags --fp8-dispatch 1; then
      check "ep2 $flags: step 1's loss the same bits with and without --fp8-dispatch" \
        test "$(first loss "S0_$label")" = "$(first loss "S1_$label")"
    fi
  done
  if mpi_run "ep4" 4 E4D --ep 4 --fp8-dispatch 1 && mpi_run "ep4 --a2a-hier 2" 4 E4H --ep 4 --a2a-hier 2 --fp8-dispatch 1; then
    check "ep4 --fp8-dispatch 1: the two-level all-to-all's metrics byte-identical to the flat one's" \
      cmp -s <(field loss E4D/metrics.jsonl; field grad_norm E4D/metrics.jsonl) \
      <(field loss E4H/metrics.jsonl; field grad_norm E4H/metrics.jsonl)
  fi
else skip "meshes: mpirun not installed"; fi

# ---- resume: the option from run.json
resume_takes fp8-dispatch 1 "${BASE[@]}"
finish
