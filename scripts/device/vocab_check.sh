#!/bin/bash
# vocab_check.sh — --vocab-parallel on the GPU (the cuda tables' ce_part / ce_finish, cuda_xent.cu, and the
# embedding's ids outside [0, V), cuda_nn.cu) in one call of about four minutes:
#   - test_cuda_ops at small shapes (its ce_finish / ce_part / embedding lines: the parts, losses and dlogits
#     against the cpu's, one block the table's cross_entropy_fwd_bwd bits, out-of-range ids bit for bit the
#     cpu's), and memcheck of it on both tables;
#   - two ranks sharing the GPU (--gpu-comm staged), tp2 with and without the option against one process, on
#     cuda-fp32 and cuda (6 steps, gpu_mesh.sh's model): step 1's loss with the option the same as without
#     to 1e-12 relative on cuda-fp32 (the forward's combination rounds once, as one rank's does), 1e-7 on cuda
#     (its bf16 head GEMM over a column slice may take other cuBLAS kernels: 3.3e-10 seen on an H100), every
#     step's loss within
#     gpu_mesh.sh's band of one process (1e-5 cuda-fp32, 1e-4 cuda), the end-of-run sample one process's;
#     memcheck of a tp2 run with the option.
# Prepare here: `make build && bash scripts/device/pack_libs.sh .gpu`, tar .gpu into .gpk/gpu.tar.xz (or
# pending/pack.sh vocab-cuda); call `bash scripts/device/vocab_check.sh` with carry [".gpk"]. Output in
# $OUT/vocab.txt and the logs. Exit 1 on a test failure, a sanitizer report in ours, or a loss out of band.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start vocab 260
t ops 120 env MOE_TEST_SMALL=1 $B/test_cuda_ops
test_line ops
grep -E "ce_finish|ce_part|embedding" $W/ops.log | tail -6 | tee -a $R
for be in cuda cuda-fp32; do
  t mem_$be 60 env MOE_TEST_SMALL=1 MOE_TEST_BACKEND=$be compute-sanitizer --tool memcheck $B/test_cuda_ops
  san_line mem_$be
done
MPI="timeout 120 mpirun --allow-run-as-root --oversubscribe -x LD_LIBRARY_PATH -x OMP_NUM_THREADS -x NCCL_NVLS_ENABLE"
S="--steps 6 --batch 8 --seq-len 64 --n-layers 4 --n-heads 4 --n-kv-heads 2 --d-model 128 --head-dim 32 --d-ff 256
   --n-experts 8 --top-k 2 --lr 1e-3 --warmup 1 --eval-every 0 --eval-batches 1 --sample-tokens 16 --plots 0
   --save-every -1 --force"
L() { grep -o "\"loss\":[^,]*" "$1/metrics.jsonl" | cut -d: -f2; }
for d in cuda-fp32 cuda; do
  band=1e-5 first=1e-12; [ $d = cuda ] && band=1e-4 first=1e-7
  t one_$d 60 $B/moe train $S --device $d --out $W/one_$d
  t tp_$d 60 $MPI -np 2 $B/moe train $S --device $d --tp 2 --gpu-comm staged --out $W/tp_$d
  t vp_$d 60 $MPI -np 2 $B/moe train $S --device $d --tp 2 --gpu-comm staged --vocab-parallel 1 --out $W/vp_$d
  a=$(L $W/tp_$d | head -1) b=$(L $W/vp_$d | head -1)
  worst=$(paste <(L $W/one_$d) <(L $W/vp_$d) | awk '{ d = ($2 - $1) / $1; if (d < 0) d = -d; if (d > m) m = d } END { printf "%.2e", m }')
  s1=$(sed -n '/^sample/,/^---$/p' $W/one_$d/train.log | sed -n 3p) s2=$(sed -n '/^sample/,/^---$/p' $W/vp_$d/train.log | sed -n 3p)
  say "   $d: step 1 loss tp2 $a, with --vocab-parallel $b; 6 steps' largest loss difference from one process $worst (band $band); sample $([ "$s1" = "$s2" ] && echo equal || echo DIFFERS)"
  awk -v a="$a" -v b="$b" -v w="$worst" -v band=$band -v f=$first 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(a != "" && d <= f * a && w + 0 <= band + 0) }' ||
    { say "   $d: FAIL"; FAIL=1; }
done
t memvp 120 $MPI -np 2 compute-sanitizer --tool memcheck $B/moe train $S --steps 2 --device cuda --tp 2 --gpu-comm staged \
  --vocab-parallel 1 --out $W/memvp
san_line memvp
say "FAIL=$FAIL $(date)"
exit $FAIL
