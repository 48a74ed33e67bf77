#!/bin/bash
# (device recipe, run as `bash scripts/device/sanitize_gpu.sh` with carry [".gpu"] from pack_libs.sh; gpu_mesh.sh
# runs it too, with SAN_BIN set to its unpacked programs)
# compute-sanitizer memcheck and racecheck over the op suite (small shapes) on both CUDA backends,
# and memcheck over the model and slot tests: every kernel the tests reach. Each log is judged by
# sanitize_scan.sh: any report in our kernels (src/ops/cuda) fails the script (exit 1), reports in third-party
# code (cuBLAS) are listed by kernel name; a run cut short (no summary) fails too. SAN_BUDGET (seconds, default
# 1500) bounds the whole; runs left out or cut for time are said and not judged. Logs: $OUT/sanitize_logs.tgz.
cd "$(dirname "$0")/../.."
if [ -n "${SAN_BIN:-}" ]; then B=$SAN_BIN; else
  G=$PWD/.gpu; B=$G/bin
  . scripts/device/libs.sh && device_libs $G $B/moe
fi
export PATH=$PATH:/usr/local/cuda/bin
W=/tmp/w_san; rm -rf $W; mkdir -p $W
BUDGET=${SAN_BUDGET:-1500}
LOGS=()
t() {
  local name=$1 left=$((BUDGET - SECONDS)); shift
  [ $left -lt 30 ] && { echo "== $name skipped (time)"; return; }
  [ $left -gt 500 ] && left=500
  local t0=$SECONDS; timeout $left "$@" > $W/$name.log 2>&1; local rc=$?
  if [ $rc = 124 ]; then echo "== $name cut at ${left}s (time): not judged"; return; fi
  echo "== $name rc=$rc $((SECONDS-t0))s"
  grep -E "checks" $W/$name.log | tail -1
  LOGS+=($W/$name.log)
}
for be in cuda cuda-fp32; do
  t mem_$be env MOE_TEST_SMALL=1 MOE_TEST_BACKEND=$be compute-sanitizer --tool memcheck $B/test_cuda_ops
  t race_$be env MOE_TEST_SMALL=1 MOE_TEST_BACKEND=$be compute-sanitizer --tool racecheck $B/test_cuda_ops
done
t mem_model compute-sanitizer --tool memcheck $B/test_cuda_model
t mem_slots compute-sanitizer --tool memcheck $B/test_slots
t mem_decode compute-sanitizer --tool memcheck $B/test_decode # MLA: rope_yarn, copy_strided, the latent cache
t race_decode compute-sanitizer --tool racecheck $B/test_decode
[ -n "${OUT:-}" ] && (cd $W && tar czf $OUT/sanitize_logs.tgz *.log)
[ ${#LOGS[@]} -gt 0 ] || { echo "sanitize: nothing ran"; exit 1; }
bash scripts/device/sanitize_scan.sh "${LOGS[@]}"; rc=$?
[ $rc = 0 ] && echo "sanitize: PASS (no report in our kernels)" || echo "sanitize: FAIL (see the lines above)"
exit $rc
