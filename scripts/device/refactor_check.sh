#!/bin/bash
# (device recipe, run as `bash scripts/device/refactor_check.sh` with carry [".gpu"]: .gpu holds bin/ lib/ from
#  scripts/device/pack_libs.sh .gpu and base/moe, the binary of the commit before the refactor)
# device-side: the GPU suites, and the refactored binary against the base one, byte for byte, on the
# cuda and cuda-fp32 backends (scripts/same_bits.sh, one-process runs: one GPU).
cd "$(dirname "$0")/../.."
G=$PWD/.gpu; B=$G/bin
. scripts/device/libs.sh && device_libs $G $B/moe
export OMP_NUM_THREADS=8 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=/tmp/w; mkdir -p $W
t() { local name=$1; shift; local t0=$SECONDS; "$@" > $W/$name.log 2>&1; echo "== $name rc=$? $((SECONDS-t0))s"; }
t ops $B/test_cuda_ops; tail -1 $W/ops.log; grep -m8 FAIL $W/ops.log
t model $B/test_cuda_model; tail -1 $W/model.log; grep -m8 FAIL $W/model.log
t nccl $B/test_nccl; tail -1 $W/nccl.log
[ -x $B/test_slots ] && { t slots $B/test_slots; tail -2 $W/slots.log; grep -m5 FAIL $W/slots.log; }
for dev in cuda cuda-fp32; do
  t same_$dev env SAME_BITS_FLAGS="--device $dev" bash scripts/same_bits.sh $G/base/moe $B/moe one resume; cat $W/same_$dev.log
done
t force_nccl env MOE_FORCE_NCCL=1 SAME_BITS_FLAGS="--device cuda --zero 1" bash scripts/same_bits.sh $G/base/moe $B/moe one; tail -3 $W/force_nccl.log
