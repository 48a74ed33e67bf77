#!/usr/bin/env bash
# test_calibrate.sh — `moe plan --calibrate` on the cpu backend:
#  - it writes a profile holding every number docs/PLAN.md lists, each positive and finite, that
#    `moe plan --gpu FILE` reads (test_plan.c checks the write/read round trip bit for bit);
#  - the step time the planner predicts with it for the tiny model is within a band of the step time
#    `moe train` measures for that model here (the band and its reasons below);
#  - under mpirun (2 ranks) it measures the link (nvlink_gbps: not the base profile's 126) and keeps the
#    one it cannot measure (internode_gbps: the base's 14); one profile, written once;
#  - bad input: one "moe: error:" line, no file touched.
set -u
. "$(dirname "$0")/lib.sh"

W="$TMP/w"
mkdir -p "$W" && cd "$W" || exit 1
export OMP_NUM_THREADS=1 # (calibration and training on the same one thread: their rates compare)
M=(--preset tiny --batch 8 --seq-len 64)
KEYS="memory_bytes context_bytes peak_tflops dense_tflops grouped_tflops attention_tflops hbm_gbps nvlink_gbps
      internode_gbps pcie_gbps launch_us sync_us fp8_grouped_tflops"

# check_profile FILE LABEL: every key once, each a positive finite number
check_profile() {
  local f="$1" label="$2" k v bad=""
  for k in $KEYS; do
    v=$(grep -E "^\s*\"$k\":" "$f" | sed -E 's/.*:\s*//; s/,$//')
    [ "$(grep -cE "^\s*\"$k\":" "$f")" = 1 ] || { bad="$bad $k(missing)"; continue; }
    echo "$v" | grep -qE '^[0-9.]+(e[-+]?[0-9]+)?$' && fcmp "$v" ">" 0 && fcmp "$v" "<" 1e30 || bad="$bad $k=$v"
  done
  if [ -z "$bad" ]; then pass "$label: the 13 numbers present, positive and finite"
  else fail "$label: bad or missing:$bad"; fi
}

run_ok "moe plan --calibrate --device cpu --out" "$MOE" plan --calibrate --device cpu "${M[@]}" --out prof.json
check_profile prof.json "the profile"
check "the profile names its backend and what it measured" grep -qE '"note":.*--device cpu at 8 x 64 tokens' prof.json
check "the links, not measured on one rank, are the base profile's (h200: 126, 14)" \
  grep -qE '^\s*"nvlink_gbps":\s*126,' prof.json
run_ok "moe plan --gpu prof.json reads it" "$MOE" plan --gpus 1 --gpu prof.json "${M[@]}" --explain micro1
cp "$OUT_FILE" explain.txt
check "the plan names the calibrated profile" grep -q "profile calibrated-cpu" explain.txt
check "the calibrated host terms are counted (not 'not calibrated')" \
  bash -c "grep '^host overhead' explain.txt | grep -vq 'not calibrated'"

# Predicted against measured: the planner's step (the --explain line) against the fastest of steps 6-30 of
# moe train (the first ones warm the caches; calibration also keeps its fastest round: on a shared machine
# other processes only add time), the same model, batch and thread. The planner counts the GEMMs, the
# grouped GEMMs, attention and AdamW at the calibrated rates and the other ops (norms, RoPE, routing,
# cross-entropy, copies: 17% of this model's cpu step by MOE_PROFILE=1) as memory-bound passes at 0.8 of the
# calibrated AdamW rate (in the cuda backend's bf16 rows: fewer bytes than the cpu's float32 ones): 0.90-1.26
# in three runs under a load of 6-7 (before they were counted: 1.2-1.3 on a quiet machine). The band:
# predicted tokens/s / measured in [0.75, 2.5]: the noise of a shared 2-core machine either way (the two
# runs meet different moments of a ctest -j2 load), a loaded training step above. A rate off by a unit (1e3), a FLOP count
# off by the backward's 3x, or a profile the planner ignores falls outside it. A load that slows one run for
# the whole second it takes (seen: 2.7x) is not the planner's error: out of the band, the pair is measured
# again, up to 3 times; an error of the model fails all 3.
attempt() { # prints "pred meas ratio"
  "$MOE" plan --calibrate --device cpu "${M[@]}" --out p$1.json >/dev/null 2>&1 &&
    "$MOE" plan --gpus 1 --gpu p$1.json "${M[@]}" --explain micro1 >e$1.txt 2>&1
  "$MOE" train --device cpu "${M[@]}" --steps 30 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 \
    --save-every -1 --force --out run >train$1.txt 2>&1
  local p m
  p=$(sed -n 's/^step: .* ms, \([0-9]*\) tokens\/s.*/\1/p' e$1.txt)
  m=$(grep -E '^step ([6-9]|[12][0-9]|30)/30' train$1.txt | sed -E 's/.*\| *([0-9]+) tok\/s.*/\1/' | sort -n | tail -n 1)
  awk -v p="${p:-0}" -v m="${m:-0}" 'BEGIN {printf "%d %d %.3f\n", p, m, (m > 0 ? p / m : 0)}'
}
in_band() { fcmp "$1" ">=" 0.75 && fcmp "$1" "<=" 2.5; }
tries=""
for a in 1 2 3; do
  read -r pred meas ratio < <(attempt $a)
  tries="$tries ${ratio}x"
  in_band "$ratio" && break
done
check "predicted $pred tokens/s, measured $meas (the fastest of steps 6-30): ratio $ratio in [0.75, 2.5] (tries:$tries)" \
  in_band "$ratio"

# --calibrate with --gpus plans on the profile it measured (the JSON printed first without --out)
run_ok "moe plan --calibrate --gpus 2 prints the profile and plans on it" "$MOE" plan --calibrate --device cpu \
  --gpus 2 "${M[@]}" --top 2
check "  its table is on the calibrated profile" grep -q "profile calibrated-cpu" "$OUT_FILE"
check "  the profile printed before it" grep -qE '^\s*"grouped_tflops":' "$OUT_FILE"

# bad input
GUARD="$W/prof.json"
mkdir -p adir
run_fail "--out nodir/p.json: no directory 'nodir'" "$MOE" plan --calibrate --device cpu "${M[@]}" --out nodir/p.json
run_fail "--out adir is a directory" "$MOE" plan --calibrate --device cpu "${M[@]}" --out adir
run_fail "--out applies to --calibrate" "$MOE" plan --gpus 1 "${M[@]}" --out prof.json
run_fail "--device applies to --calibrate" "$MOE" plan --gpus 1 "${M[@]}" --device cpu
run_fail "--gpu a100: no such profile" "$MOE" plan --calibrate --device cpu "${M[@]}" --gpu a100 --out prof.json
check "no temporary profile left behind" bash -c "! ls prof.json.tmp nodir 2>/dev/null"

# two ranks: the link measured, written once by rank 0
mpi_tests
GUARD=""
run_ok "mpirun -np 2 moe plan --calibrate" $MPI -np 2 "$MOE" plan --calibrate --device cpu "${M[@]}" --out mp.json
check_profile mp.json "the two-rank profile"
check "  its note names the two collectives over 2 ranks" grep -qE 'all-to-all [0-9.e+-]+ and all-reduce [0-9.e+-]+ GB/s over 2 ranks' mp.json
nv=$(sed -nE 's/^\s*"nvlink_gbps":\s*([^,]*),?/\1/p' mp.json)
check "  nvlink_gbps measured ($nv, not the base's 126); internode_gbps the base's" \
  bash -c "[ '$nv' != 126 ] && grep -qE '^\s*\"internode_gbps\":\s*14,' mp.json"
check "  one 'calibrated:' line (rank 0 alone writes)" test "$(grep -c '^calibrated: mp.json' "$OUT_FILE")" = 1

finish
