#!/bin/bash
# bench/device_run.sh DIR — on the device machine, from the repository root: the GPU tests on both
# CUDA backends, then the MoE layer benchmark and the PyTorch peer in the same call (PEERS.md's
# advice: compare ratios from one run), then the tiny default trained on both CUDA backends.
# DIR (an ignored folder, carried) holds bin/ (moe_bench_layer, test_cuda_ops, test_cuda_model,
# moe, built here with CUDA on) and lib/ (the shared libraries the device image lacks: OpenBLAS,
# gomp, gfortran, quadmath, cJSON, Open MPI and its libs, zlib); .bench/ (ignored, carried) holds
# a copy of ../shared/bench/torch_moe_peer.py. docs/PERFORMANCE.md says how to prepare both.
cd "$(dirname "$0")/.."
D=${1:?usage: bench/device_run.sh DIR}; D=$(cd "$D" && pwd); B=$D/bin; W=/tmp/moe_bench; mkdir -p $W
. scripts/device/libs.sh && device_libs $D $B/moe_bench_layer
export OMP_NUM_THREADS=16
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw,power.limit --format=csv,noheader
t() { local name=$1 lim=$2; shift 2; local t0=$SECONDS; timeout $lim "$@" > $W/$name.log 2>&1; echo "== $name rc=$? $((SECONDS-t0))s"; }
t ops 150 $B/test_cuda_ops; grep -E "FAIL|^backend|bf16|checks" $W/ops.log | head -40
t model 120 $B/test_cuda_model; grep -E "loss ref|worst|FAIL|checks" $W/model.log | head -30
t bench 300 $B/moe_bench_layer --iters 10 --warmup 3; grep -v '^{' $W/bench.log
t peer 240 env PYTHONUNBUFFERED=1 python3 .bench/torch_moe_peer.py; cat $W/peer.log
grep '^{' $W/bench.log
t bench_fp32 200 $B/moe_bench_layer --device cuda-fp32 --iters 3 --warmup 1 --gemm 0; grep -E "^==|layer fwd" $W/bench_fp32.log
t train_cuda 90 $B/moe train --device cuda --out $W/tc --steps 300 --plots 0 --sample-tokens 0
grep -E "trained steps|^val loss" $W/train_cuda.log
t train_fp32 90 $B/moe train --device cuda-fp32 --out $W/tf --steps 300 --plots 0 --sample-tokens 0
grep -E "trained steps|^val loss" $W/train_fp32.log
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
[ -n "$OUT" ] && cp $W/*.log $OUT/ 2>/dev/null
exit 0
