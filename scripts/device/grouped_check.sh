#!/bin/bash
# Device recipe (kind nvidia-h200) for the Hopper grouped GEMM (src/ops/cuda/cuda_grouped.cu): its
# SASS, the op suite on "cuda" (the kernel against the cpu), then the MoE layer with the kernel, with
# cuBLAS (MOE_GROUPED_GEMM=cublas) and torch._grouped_mm, in one call. Prepare as full_step.sh says
# (build, pack_libs.sh .gpu, .bench with the peer scripts); carry [".gpu", ".bench"].
cd "$(dirname "$0")/../.."
G=$PWD/.gpu; B=$G/bin; W=/tmp/w; mkdir -p $W
. scripts/device/libs.sh && device_libs $G $B/moe
export OMP_NUM_THREADS=16 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
date -u; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
OBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
echo "SASS of the grouped kernel: $($OBJ -sass -fun gg_kernel $B/moe 2>/dev/null | grep -c HGMMA) HGMMA, $($OBJ -sass -fun gg_kernel $B/moe 2>/dev/null | grep -cE 'LDL|STL') local-memory ops"
t0=$SECONDS; MOE_TEST_BACKEND=cuda timeout 150 $B/test_cuda_ops > $W/ops.log 2>&1; rc=$?
echo "== test_cuda_ops (cuda) rc=$rc $((SECONDS-t0))s"
grep -E "grouped|checks" $W/ops.log | tail -14; grep -m8 FAIL $W/ops.log
[ $rc -ge 124 ] && { tail -5 $W/ops.log; exit 1; }   # a hang or a crash: the benches would only repeat it
CASES=${CASES:-mixtral,olmoe,small,ref}
for mode in auto cublas auto; do
  echo "-- ours, MOE_GROUPED_GEMM=$mode"
  MOE_GROUPED_GEMM=$mode timeout 200 $B/moe_bench_layer --cases $CASES --iters 10 --warmup 3 --gemm 0 2>&1 | grep -E "^== |layer fwd|^  (expert|host)"
done
echo "-- torch._grouped_mm"; timeout 200 python3 .bench/torch_moe_peer.py 2>&1 | grep -v Warning | grep -E "grouped|case|{" | head -12
date -u
