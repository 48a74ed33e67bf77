#!/usr/bin/env bash
# test_precision.sh — --precision bf16 (bf16 AdamW moments, weights rounded to bf16 values after each
# update; ops.h OPT_BF16_*) on the cpu, and on the mesh against one process:
#   - every weight and AdamW moment in its checkpoints is a bf16 value (low 16 bits of the float32
#     zero; `ckpt_diff --bf16`), for stochastic and nearest rounding; a --precision mixed run's are
#     not (so the check can fail); state.json records "precision": "bf16";
#   - two runs of one command give byte-identical checkpoints (the stochastic rounding is a hash of
#     seed, step and element: no RNG state), and stochastic differs from nearest;
#   - a resume (3 steps, then 3 more) is byte-identical to the uninterrupted 6 steps (moments go to
#     float32 on disk and back to bf16 exactly);
#   - a --precision mixed checkpoint resumes under bf16 (weights and moments rounded once, a note
#     printed; every weight a bf16 value after) and a bf16 one under mixed;
#   - moe info counts the moments at 2 bytes;
#   - dp2 zero2 and tp2+ep2 (mpirun), one step at a time from one process's state: the mesh's step 1 (from
#     the initial weights) and its step 4 resumed (resharded) from the one-process run's step-3 checkpoint
#     give that run's steps 1 and 4: loss, aux and z loss within 1e-6 relative, grad norm 1e-5
#     (test_mesh.sh's bands; measured <= 7.3e-9), expert loads exactly equal, replicas bitwise equal, at most
#     1% of any tensor of 256 or more changed (`ckpt_diff --changed`; measured 2-3 weights of 59,808, one in
#     1,024 of the worst tensor) and the weights within 1e-2 of each tensor's largest magnitude. A mesh
#     sums in another order, so a pre-rounding float32 value can differ in its last bit and flip a
#     stochastic rounding decision, which moves that weight by one bf16 step (up to 2^-7 of it). Whole
#     trajectories are not compared: later steps see those weights, and in this tiny, fast-collapsing
#     model a token near a tie between two experts then routes elsewhere, which changes that expert's
#     whole update: over 6 steps 3-4 of 24 seeds did so (with either stochastic-rounding hash, the
#     64-bit one before 2026-12-02 and the 32-bit one after). A wrong global index in the hash (TP's
#     column blocks hashed by their local index) changes 28-34% of o_proj in one step: caught.
set -u
. "$(dirname "$0")/lib.sh"
CKPT_DIFF="${CKPT_DIFF:-$(dirname "$MOE")/ckpt_diff}"
cd "$TMP" || exit 1

BASE=(--steps 6 --save-every 3 --keep 0 --quiet --sample-tokens 0 --plots 0 --batch 16 --seq-len 24 --eval-batches 1
      --eval-every 0 --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2)
S3=step_00000003
S6=step_00000006

# ---- one process: bf16 values, determinism, rounding modes
run_ok "bf16 stochastic run" "$MOE" train "${BASE[@]}" --precision bf16 --out A < /dev/null
check "bf16 stochastic: every weight and moment at step 3 is a bf16 value" "$CKPT_DIFF" --bf16 A/$S3
check "bf16 stochastic: every weight and moment at step 6 is a bf16 value" "$CKPT_DIFF" --bf16 A/$S6
check "state.json records the precision" grep -q '"precision":.*"bf16"' A/$S6/state.json
run_ok "bf16 stochastic, again" "$MOE" train "${BASE[@]}" --precision bf16 --out A2 < /dev/null
check "two bf16 runs give byte-identical checkpoints" same_ckpt A A2 $S6
run_ok "bf16 nearest run" "$MOE" train "${BASE[@]}" --precision bf16 --bf16-rounding nearest --out N < /dev/null
check "bf16 nearest: every weight and moment is a bf16 value" "$CKPT_DIFF" --bf16 N/$S6
if "$CKPT_DIFF" --changed A N 0.05 > "$TMP/.c"; then fail "stochastic and nearest rounding train the same weights: $(cat "$TMP/.c")"
else pass "stochastic and nearest rounding differ ($(cat "$TMP/.c"))"; fi
run_ok "mixed run" "$MOE" train "${BASE[@]}" --out X < /dev/null
if "$CKPT_DIFF" --bf16 X/$S6 > "$TMP/.c"; then fail "a --precision mixed run's weights are all bf16 values (the check is vacuous)"
else pass "a mixed run's weights are not bf16 values ($(cat "$TMP/.c"))"; fi
grep -q '"precision"' X/$S6/state.json && fail "a mixed checkpoint's state.json names a precision (it must stay as before)"

# ---- --bf16-grads (default 1): the routed experts' gradients bf16 values, in one process written packed (ops.h
# GM_DW_BF16); 0 keeps them float32. Step 1's loss is before any update (the same); its gradient norm is over the
# rounded gradients (another sum, close to the float32 one's: the roundings' errors are unbiased); and the
# weights trained differ. (The mesh runs below, which read the float32 sums rounded, OPTG_BF16, match this
# process's packed ones.)
run_ok "bf16 --bf16-grads 0 run" "$MOE" train "${BASE[@]}" --precision bf16 --bf16-grads 0 --out G0 < /dev/null
bf16_grads_checks A G0 $S6

# ---- --bf16-rounding none: bf16 moments, the weights left float32 (so step 1 is mixed's, bit for bit)
run_ok "bf16 none run" "$MOE" train "${BASE[@]}" --precision bf16 --bf16-rounding none --out NR < /dev/null
"$CKPT_DIFF" --bf16 NR/$S6 > "$TMP/.c"
if grep -q 'not bf16 values: [1-9][0-9]* of [0-9]* weights, 0 of' "$TMP/.c"; then
  pass "bf16 none: every moment is a bf16 value, the weights are not ($(cat "$TMP/.c"))"
else fail "bf16 none: want bf16 moments and float32 weights: $(cat "$TMP/.c")"; fi
check "bf16 none: step 1's loss is the mixed run's, bit for bit (the initial weights are not rounded)" \
  test "$(field loss NR/metrics.jsonl | head -1)" = "$(field loss X/metrics.jsonl | head -1)"
if cmp -s <(field loss NR/metrics.jsonl) <(field loss X/metrics.jsonl); then
  fail "bf16 none trains the mixed run's losses (its moments are not bf16?)"
else pass "bf16 none: later losses differ from mixed (the bf16 moments)"; fi
cp -r NR NR2 && rm -rf NR2/$S6
run_ok "bf16 none: --resume from step 3" "$MOE" train "${BASE[@]}" --precision bf16 --bf16-rounding none --out NR2 --resume < /dev/null
check "bf16 none resume: the step-6 checkpoint is byte-identical to the uninterrupted run's" same_ckpt NR NR2 $S6

# ---- resume: 3 + 3 steps byte-identical to 6
cp -r A B && rm -rf B/$S6
run_ok "bf16: --resume from step 3" "$MOE" train "${BASE[@]}" --precision bf16 --out B --resume < /dev/null
check "bf16 resume: the step-6 checkpoint is byte-identical to the uninterrupted run's" same_ckpt A B $S6
check "bf16 resume: the same losses" cmp -s <(field loss A/metrics.jsonl) <(field loss B/metrics.jsonl)

# ---- resuming across policies (converted, with a note)
cp -r X XB && rm -rf XB/$S6
run_ok "a mixed checkpoint resumed with --precision bf16" "$MOE" train "${BASE[@]}" --precision bf16 --out XB --resume < /dev/null
check "mixed -> bf16: the note says so" grep -q "trained with --precision mixed; continuing with --precision bf16" "$OUT_FILE"
check "mixed -> bf16: every weight and moment at step 6 is a bf16 value" "$CKPT_DIFF" --bf16 XB/$S6
cp -r A AX && rm -rf AX/$S6
run_ok "a bf16 checkpoint resumed with --precision mixed" "$MOE" train "${BASE[@]}" --precision mixed --out AX --resume < /dev/null
check "bf16 -> mixed: the note says so" grep -q "trained with --precision bf16; continuing with --precision mixed" "$OUT_FILE"
if grep -q '"precision"' AX/$S6/state.json; then fail "bf16 -> mixed: state.json still says bf16"
else pass "bf16 -> mixed: state.json is a mixed one"; fi
cp -r A AR && rm -rf AR/$S6
run_ok "--resume without --precision takes the run's (bf16)" "$MOE" train "${BASE[@]}" --out AR --resume < /dev/null
check "--resume without --precision: byte-identical to the uninterrupted bf16 run" same_ckpt A AR $S6

# ---- moe info: the moments at 2 bytes (params + grads + moments: 16 -> 12 bytes a parameter)
mib() { grep -o 'params+grads+adam [0-9.]* MiB' | awk '{ print $2 }'; }
a=$("$MOE" info --precision mixed | mib); b=$("$MOE" info --precision bf16 | mib)
if [ -n "$a" ] && [ -n "$b" ] && fcmp "$(awk -v a="$a" -v b="$b" 'BEGIN { d = b / a - 0.75; print d < 0 ? -d : d }')" "<" 0.005; then
  pass "moe info: params+grads+adam $a MiB (mixed) -> $b MiB (bf16)"
else fail "moe info: params+grads+adam $a MiB (mixed) -> $b MiB (bf16), want 3/4"; fi

# ---- the mesh against one process, one step at a time from the same state
# R (one process) saves every step. Each layout runs 6 steps from the start (M) and, resumed on the mesh
# from R's step-3 checkpoint (resharded), steps 4-6 (MB). Its step 1 (from the initial weights) and step 4
# (from R's step-3 state) start where R's did; those two steps are compared (see the header).
if command -v mpirun > /dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  MPI="timeout 300 mpirun --oversubscribe"
  run_ok "bf16 reference run saving every step" "$MOE" train "${BASE[@]}" --save-every 1 --precision bf16 --out R < /dev/null
  at() { sed -n "$1p"; }   # at LINE: that line of the input
  for lay in "2|--zero 2|dp2 zero2" "4|--tp 2 --ep 2|tp2+dp2+ep2"; do
    IFS='|' read -r np flags label <<< "$lay"
    rm -rf M MB && mkdir MB && cp -r R/$S3 MB/ && head -n 3 R/metrics.jsonl > MB/metrics.jsonl
    if ! OMP_NUM_THREADS=1 $MPI -np "$np" "$MOE" train "${BASE[@]}" --save-every 1 --precision bf16 $flags --check-replicas \
        --out M > M.txt 2>&1 < /dev/null; then fail "bf16 $label: the run failed"; tail -5 M.txt; continue; fi
    if ! OMP_NUM_THREADS=1 $MPI -np "$np" "$MOE" train "${BASE[@]}" --save-every 1 --precision bf16 $flags --check-replicas \
        --out MB --resume > MB.txt 2>&1 < /dev/null; then fail "bf16 $label: the run resumed from R's step 3 failed"; tail -5 MB.txt; continue; fi
    ok=1 worst=""
    for k in loss aux_loss z_loss grad_norm; do
      tol=1e-6; [ "$k" = grad_norm ] && tol=1e-5
      [ "$(field "$k" M/metrics.jsonl | wc -l)" -eq 6 ] && [ "$(field "$k" MB/metrics.jsonl | wc -l)" -eq 6 ] ||
        { fail "bf16 $label: $k: not 6 steps"; ok=0; continue; }
      for st in "1 M" "4 MB"; do
        set -- $st
        field "$k" R/metrics.jsonl | at "$1" > .a; field "$k" "$2/metrics.jsonl" | at "$1" > .b
        r=$(maxrel .a .b)
        fcmp "$r" "<=" "$tol" || { fail "bf16 $label: step $1: $k differs by $r relative (tolerance $tol)"; ok=0; }
        worst="$worst $k@$1 $r"
      done
    done
    for k in expert_load dropped; do
      for st in "1 M" "4 MB"; do
        set -- $st
        cmp -s <(grep -o "\"$k\":[^a-z]*" R/metrics.jsonl | at "$1") <(grep -o "\"$k\":[^a-z]*" "$2/metrics.jsonl" | at "$1") ||
          { fail "bf16 $label: step $1: $k differs"; ok=0; }
      done
    done
    chs=""
    for st in "1 M" "4 MB"; do
      set -- $st
      sd=step_0000000$1
      ch=$("$CKPT_DIFF" --changed "R/$sd" "$2/$sd" 0.01) || { fail "bf16 $label: step $1: too many weights differ: $ch"; ok=0; }
      pd=$("$CKPT_DIFF" "R/$sd" "$2/$sd" 1e-2) || { fail "bf16 $label: step $1: parameters: $pd"; ok=0; }
      chs="$chs; step $1: $ch, params ${pd#max relative difference }"
    done
    "$CKPT_DIFF" --bf16 M/$S6 > /dev/null || { fail "bf16 $label: weights or moments that are not bf16 values"; ok=0; }
    grep -q "replica check: ok" M.txt && grep -q "replica check: ok" MB.txt || { fail "bf16 $label: replica check did not pass"; ok=0; }
    [ $ok = 1 ] && pass "bf16 $label: steps 1 and 4 as one process's from the same state (${worst# }$chs)"
  done
else
  skip "mpirun not installed: the bf16 mesh runs"
fi
finish
