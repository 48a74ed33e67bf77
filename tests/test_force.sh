#!/usr/bin/env bash
# test_force.sh — `moe train --force` deletes the old run only once everything that can refuse the
# new one has passed (issue 42, finding 1): each refusal below, with and without --init-from, is one
# "moe: error:" line naming the problem, a non-zero exit that is not a crash, and the old run byte for
# byte as it was. Then the controls: --force over the old run, plain and --init-from, still trains.
set -u
. "$(dirname "$0")/lib.sh"

small_fixture

run_ok "fixture: a run with a checkpoint at step 2" \
  "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 2 --out run
run_ok "fixture: its export (an --init-from directory)" "$MOE" export --ckpt run --out hf

cp -a run run0
# each case starts from the run as the fixture made it (an old binary's deletion shows in every case)
refuse() { rm -rf run && cp -a run0 run && run_fail "$@"; }
GUARD="$W/run $W/hf"
T=("$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 2 --out run --force)
I=("$MOE" train "${SMALL[@]}" --init-from hf --steps 2 --out run --force)
for mode in plain init-from; do
  if [ $mode = plain ]; then C=("${T[@]}"); else C=("${I[@]}"); fi
  echo "-- $mode"
  refuse "is not divisible by ep 2" "${C[@]}" --ep 2
  refuse "world size 1 is not divisible by tp 1 x pp 2" "${C[@]}" --pp 2 --device cuda
  refuse "--device cuda: no usable CUDA GPU here" "${C[@]}" --device cuda
  MOE_BF16_SHADOW=x refuse "MOE_BF16_SHADOW must be 0" "${C[@]}"
  MOE_GROUPED_GEMM=x refuse "MOE_GROUPED_GEMM must be auto" "${C[@]}"
  MOE_FORCE_NCCL=x refuse "MOE_FORCE_NCCL='x'" "${C[@]}"
  MOE_ATTN_DS_MB=x refuse "MOE_ATTN_DS_MB must be a whole number" "${C[@]}"
  refuse "--ampipe 8: a micro-batch of 4 tokens has fewer rows than chunks" \
    "${C[@]}" --batch 1 --seq-len 4 --ampipe 8
  refuse "cannot open shard file 'missing.bin'" "${C[@]}" --data missing.bin
done
refuse "--init-from: 'nohf' is not a Hugging Face model directory" \
  "$MOE" train "${SMALL[@]}" --init-from nohf --steps 2 --out run --force

GUARD=""
run_ok "control: --force over the run" "${T[@]}"
run_ok "control: --init-from --force over the run" "${I[@]}"
check "the --init-from run starts from the import" grep -q "initialised from hf" "$OUT_FILE"

finish
