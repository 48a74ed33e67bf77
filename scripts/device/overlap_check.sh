#!/bin/bash
# (device recipe, run as `bash scripts/device/overlap_check.sh` with carry [".gpu"]: .gpu from
#  scripts/device/pack_libs.sh .gpu, plus base/moe for same_bits.sh)
# device-side, one GPU: the GPU suites; the pipelined exchange through the NCCL backend
# (MOE_FORCE_NCCL=1: EP 1 but every exchange goes through NCCL) with r 2 / 4 against r 1 (the
# forward bitwise: step 1's loss; later steps at bf16 round-off: weight-gradient sums split in r);
# and what chunking costs on one GPU: tokens/s of r 1 vs 4 where there is nothing to overlap
# (the plain path: r is forced to 1) and through NCCL.
cd "$(dirname "$0")/../.."
G=$PWD/.gpu; B=$G/bin
. scripts/device/libs.sh && device_libs $G $B/moe
export OMP_NUM_THREADS=8 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
W=/tmp/w; mkdir -p $W
t() { local name=$1; shift; local t0=$SECONDS; "$@" > $W/$name.log 2>&1; echo "== $name rc=$? $((SECONDS-t0))s"; }
t ops $B/test_cuda_ops; tail -1 $W/ops.log; grep -m8 FAIL $W/ops.log
t model $B/test_cuda_model; tail -1 $W/model.log
t nccl $B/test_nccl; tail -1 $W/nccl.log
t same env SAME_BITS_FLAGS="--device cuda" bash scripts/same_bits.sh $G/base/moe $B/moe one resume; tail -1 $W/same.log
F="--device cuda --steps 6 --force --quiet --sample-tokens 0 --plots 0 --eval-every 0 --eval-batches 1 --save-every -1 --preset small --batch 16 --seq-len 256"
for r in 1 2 4; do t nccl_r$r env MOE_FORCE_NCCL=1 $B/moe train --out $W/n$r $F --a2a-overlap $r; done
python3 scripts/device/chunk_losses.py "MOE_FORCE_NCCL" $W/n1 $W/n2 $W/n4
S="--device cuda --steps 12 --quiet --sample-tokens 0 --plots 0 --eval-every 0 --eval-batches 1 --save-every -1 --force --preset peers-ref --batch 4 --seq-len 2048"
R="${REPS:-2}"
for rep in $(seq $R); do for r in 1 4; do t plain_r${r}_$rep $B/moe train --out $W/p$r $S --a2a-overlap $r; grep "trained steps" $W/plain_r${r}_$rep.log; done; done
for r in 1 4; do t forced_r$r env MOE_FORCE_NCCL=1 $B/moe train --out $W/f$r $S --a2a-overlap $r; grep "trained steps" $W/forced_r$r.log; done
