#!/bin/bash
# (device recipe, run as `bash scripts/device/sanitize_gpu.sh` with carry [".gpu"] from pack_libs.sh)
# compute-sanitizer memcheck and racecheck over the op suite (small shapes) on both CUDA backends,
# and memcheck over the model and slot tests: every kernel the tests reach.
cd "$(dirname "$0")/../.."
G=$PWD/.gpu; B=$G/bin
. scripts/device/libs.sh && device_libs $G $B/moe
W=/tmp/w; mkdir -p $W
t() { local name=$1; shift; local t0=$SECONDS; timeout 500 "$@" > $W/$name.log 2>&1; echo "== $name rc=$? $((SECONDS-t0))s"; }
for be in cuda cuda-fp32; do
  t mem_$be env MOE_TEST_SMALL=1 MOE_TEST_BACKEND=$be compute-sanitizer --tool memcheck $B/test_cuda_ops
  grep -E "ERROR SUMMARY|checks" $W/mem_$be.log | tail -2
  t race_$be env MOE_TEST_SMALL=1 MOE_TEST_BACKEND=$be compute-sanitizer --tool racecheck $B/test_cuda_ops
  grep -E "RACECHECK SUMMARY|ERROR SUMMARY|checks" $W/race_$be.log | tail -2
done
t mem_model compute-sanitizer --tool memcheck $B/test_cuda_model; grep -E "ERROR SUMMARY|checks" $W/mem_model.log | tail -2
t mem_slots compute-sanitizer --tool memcheck $B/test_slots; grep -E "ERROR SUMMARY|checks" $W/mem_slots.log | tail -2
