#!/bin/bash
# (device recipe, run as `bash .gpu_fam/family_check.sh` with carry [".gpu_fam"]: the folder holds bin/ lib/
#  (scripts/device/pack_libs.sh .gpu_fam) and src/ (verify_hf.py, verify_hf_families.py, libs.sh, this file))
# device-side: the family options and balancing on the CUDA backends (test_cuda_ops, test_cuda_model), the
# three families against transformers on cpu, cuda-fp32 (1e-4) and cuda (bf16 band 3e-2), and Mixtral's
# verify_hf.py on cpu (the config.json writer changed). Logs into $OUT. --hf-only: the transformers checks alone.
G=$(cd "$(dirname "$0")" && pwd); B=$G/bin
. $G/src/libs.sh && device_libs $G $B/moe
export OMP_NUM_THREADS=8 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
O=${OUT:-/tmp/out}; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
t() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $O/$name.log 2>&1; echo "== $name rc=$? $((SECONDS-t0))s"; }
if [ "${1:-}" != --hf-only ]; then
t ops 60 $B/test_cuda_ops; tail -1 $O/ops.log; grep -m8 -E "FAIL|sigmoid|bias" $O/ops.log
t model 40 $B/test_cuda_model; tail -2 $O/model.log; grep -m8 FAIL $O/model.log
fi
for d in cpu cuda-fp32; do t fam_$d 50 python3 $G/src/verify_hf_families.py $B/moe --moe-device $d; grep -E "^(olmoe|qwen)|passed" $O/fam_$d.log | tail -22; done
t fam_bf16 50 python3 $G/src/verify_hf_families.py $B/moe --moe-device cuda --tol 3e-2; grep -E "FAIL|passed" $O/fam_bf16.log | tail -4
t mixtral 45 python3 $G/src/verify_hf.py $B/moe --moe-device cpu --steps 20; tail -3 $O/mixtral.log
