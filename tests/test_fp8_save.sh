#!/usr/bin/env bash
# test_fp8_save.sh — --fp8-save as a training option (moe_types.h MoeRecompute.fp8: every MoE layer keeps its
# routed experts' SwiGLU inputs as FP8 rows and computes act again in the backward; the layer's bits:
# test_fp8_save.c, the cost model's bytes: test_cost.c):
#   - refusals: a value other than 0 or 1, the option without --precision fp8 / fp8-bf16, and with --recompute
#     moe (both take the SwiGLU rows); one "moe: error:" line each, nothing written; moe info's total lower
#     with it (4 layers: three layers' SwiGLU rows fewer, four layers' FP8 rows more);
#   - one process (d_model 160, d_ff 200: two tiles a SwiGLU row, the second short): the header's line with
#     the FP8 row's bytes (200 + 2 against 3 x 800); step 1's loss the same bits as without (the forward is
#     unchanged), its gradient norm not (the backward takes the FP8 values); with --recompute attn (bit for bit
#     with --fp8-save alone: the attention's recomputation keeps every bit) and with --fp8-dispatch (step 1's
#     loss --fp8-dispatch's alone);
#   - AMPipe in one process (--ampipe 2: each chunk's state packs and unpacks its own rows through the shared
#     buffers) against the unchunked run with the option, and ep2 (one rank's rows each) and ep2 with the
#     pipelined exchange (--a2a-overlap 2: the chunks' rows packed together) against one process with the
#     option, and tp2: test_mesh.sh's bands, on test_fp8_train.sh's mesh model (d 32), at a learning rate that
#     leaves the parameters in place (below: why); pipeline stages (--pp 2 interleaved, 4 micro-batches live:
#     each keeps its own FP8 rows) bit for bit one process with the same micro-batches;
#   - a resume (3 + 3 steps) takes the option from run.json and equals the 6 steps run at once.
set -u
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

BASE=(--steps 3 --quiet --sample-tokens 0 --plots 0 --batch 16 --seq-len 24 --eval-batches 1 --eval-every 0
      --save-every -1 --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 160 --d-ff 200 --n-experts 4 --lr 1e-2
      --warmup 2 --precision fp8)
first() { field "$1" "$2/metrics.jsonl" | head -n 1; }
both() { field loss "$1/metrics.jsonl"; field grad_norm "$1/metrics.jsonl"; }

# ---- refusals (the guarded directory: nothing may appear in it)
mkdir G && echo keep > G/keep
GUARD="$TMP/G"
run_fail "--fp8-save must be 0 or 1 (got 2)" "$MOE" train "${BASE[@]}" --fp8-save 2 --out G/R
run_fail "--fp8-save keeps the experts' SwiGLU inputs as --precision fp8's or fp8-bf16's FP8 tiles; this run's precision is bf16" \
  "$MOE" train "${BASE[@]}" --precision bf16 --fp8-save 1 --out G/R
run_fail "--fp8-save and --recompute moe both take the experts' SwiGLU rows out of the layers (FP8 copies or none): pick one" \
  "$MOE" train "${BASE[@]}" --fp8-save 1 --recompute moe --out G/R
GUARD=""

# ---- moe info: the whole model's total with and without (test_cost.c derives the bytes)
tot() { "$MOE" info --precision fp8 --n-layers 4 --grad-memory separate "$@" 2>&1 | sed -n -E 's/^memory, whole model .*, total ([0-9.]+ [KMG]iB)$/\1/p'; }
bytes() { awk -v x="$1" 'BEGIN { split(x, p, " "); u = p[2] == "KiB" ? 1024 : p[2] == "MiB" ? 1048576 : p[2] == "GiB" ? 1073741824 : 0; printf "%.0f", p[1] * u }'; }
T0=$(tot --fp8-save 0) T1=$(tot --fp8-save 1)
check "moe info: the whole model's memory lower with --fp8-save 1 ($T1 against $T0)" \
  awk -v a="$(bytes "$T1")" -v b="$(bytes "$T0")" 'BEGIN { exit !(a + 0 > 0 && a + 0 < b + 0) }'
check "moe info says what it keeps" bash -c "'$MOE' info --precision fp8 --fp8-save 1 | grep -q '^--fp8-save: each MoE layer keeps'"

# ---- one process
run_ok "fp8" "$MOE" train "${BASE[@]}" --out A < /dev/null
run_ok "fp8 --fp8-save 1" "$MOE" train "${BASE[@]}" --fp8-save 1 --out S < /dev/null
check "the header says the FP8 row's bytes" \
  grep -q "fp8: --fp8-save: the experts' SwiGLU inputs kept as FP8 rows, 202 bytes a row each (h1, h3 and act: 2400)" S/train.log
check "without the option no such line" bash -c '! grep -q "fp8-save" A/train.log'
check "step 1's loss: the same bits with and without (the forward unchanged): $(first loss S)" \
  test "$(first loss A)" = "$(first loss S)"
check "step 1's gradient norm differs (the backward from the FP8 SwiGLU inputs): $(first grad_norm A) vs $(first grad_norm S)" \
  test "$(first grad_norm A)" != "$(first grad_norm S)"
run_ok "--fp8-save 1 --recompute attn" "$MOE" train "${BASE[@]}" --fp8-save 1 --recompute attn --out SR < /dev/null
check "--recompute attn: the losses and gradient norms of --fp8-save alone, bit for bit" cmp -s <(both S) <(both SR)
run_ok "--fp8-dispatch 1" "$MOE" train "${BASE[@]}" --fp8-dispatch 1 --out D < /dev/null
run_ok "--fp8-dispatch 1 --fp8-save 1" "$MOE" train "${BASE[@]}" --fp8-dispatch 1 --fp8-save 1 --out DS < /dev/null
check "with --fp8-dispatch: step 1's loss --fp8-dispatch's alone" test "$(first loss D)" = "$(first loss DS)"

# ---- chunks and meshes, on the mesh model (d 32), against one process with the option
# (at lr 1e-9: the parameters stay where they are, so every step's gradients are compared at the same
# parameters. Where they move, a round-off difference in them after step 1 moves some saved input across an
# FP8 rounding boundary (a code's step is 2^-3 of it) and a weight whose gradient is near zero takes another
# Adam step: at lr 1e-3 the losses stay within 2e-8 but a weight of w3 ends 2.8e-3 of its tensor's largest
# apart (plain fp8: 3.7e-4), at test_fp8_train.sh's 1e-2 the losses part by 1.5e-5 by step 6; at 1e-9 the
# gradient norms agree to 1e-8 at every step, as plain fp8's do.)
MB=(--steps 6 --quiet --sample-tokens 0 --plots 0 --batch 16 --seq-len 24 --eval-batches 1 --eval-every 0
    --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-9 --warmup 2 --precision fp8
    --fp8-save 1)
run_ok "the one-process reference (d 32)" "$MOE" train "${MB[@]}" --out M1 < /dev/null
mkdir -p MA
if "$MOE" train "${MB[@]}" --ampipe 2 --out MA > MA/out.txt 2>&1 < /dev/null; then
  NO_REPLICA_CHECK=1 mesh_close M1 MA "--fp8-save --ampipe 2 (one process)"
else fail "--ampipe 2: the run failed"; tail -5 MA/out.txt; fi
if command -v mpirun > /dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  for lay in "--ep 2|ep2" "--ep 2 --a2a-overlap 2|ep2_r2" "--tp 2|tp2"; do
    IFS='|' read -r flags label <<< "$lay"
    mkdir -p "$label"
    if timeout 300 mpirun --oversubscribe -np 2 "$MOE" train "${MB[@]}" $flags --check-replicas --out "$label" \
      > "$label/out.txt" 2>&1 < /dev/null; then
      mesh_close M1 "$label" "--fp8-save $flags against one process"
    else fail "--fp8-save $flags: mpirun failed"; tail -5 "$label/out.txt"; fi
  done
  # pipeline stages: several live micro-batches each keep their own FP8 rows through the one set of shared
  # buffers; stages alone are bit for bit one process with the same micro-batches (mesh_exact), at lr 1e-2
  PB=(--steps 4 --quiet --sample-tokens 0 --plots 0 --batch 16 --seq-len 24 --eval-batches 1 --eval-every 0
      --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --n-layers 4 --lr 1e-2 --warmup 2
      --precision fp8 --fp8-save 1 --grad-clip 0 --grad-accum 4)
  run_ok "the one-process reference (4 micro-batches)" "$MOE" train "${PB[@]}" --out P1 < /dev/null
  mkdir -p P2
  if timeout 300 mpirun --oversubscribe -np 2 "$MOE" train "${PB[@]}" --pp 2 --pp-schedule interleaved --vpp 2 \
    --out P2 > P2/out.txt 2>&1 < /dev/null; then
    mesh_exact P1 P2 "--fp8-save --pp 2 interleaved (vpp 2)"
  else fail "--fp8-save --pp 2: mpirun failed"; tail -5 P2/out.txt; fi
else skip "meshes: mpirun not installed"; fi

# ---- resume: the option from run.json
resume_takes fp8-save 1 "${BASE[@]}"
finish
