#!/bin/bash
# share_bench.sh — what sharing one GPU between ranks costs (issue 37's speed part; a benchmark, not a
# test). Prepare as gpu_mesh.sh (`bash scripts/device/mesh_pack.sh .gpum`, carry [".gpum"]).
#   1. the staged transport's bandwidth (moe_bench_comm, 2 ranks on the GPU): an all-to-all-v of the sizes
#      one MoE layer of the reference shape exchanges (a micro-batch of 4 x 1024 tokens, top-2, d 2048:
#      16 MiB of bf16 rows out, 32 MiB of float32 rows back), against the copy ceiling of the path (one
#      pinned device-to-host plus host-to-device round trip), and the path a CUDA-IPC transport would take;
#   2. one training step of the reference model's shape cut to 4 layers (peers-ref, batch 16 x 1024, 4
#      micro-batches, --device cuda) in one process, and as dp2, ep2 and pp2 sharing the GPU (staged), with
#      and without MPS: tokens/s (median over steps 3-8) and the GPU's peak memory (nvidia-smi).
# PARTS (default 123) picks the parts, MPS (default "off on") the MPS settings, ROWS part 2's rows (default
# "one dp2 ep2 ep2ipc pp2").
cd "$(dirname "$0")/../.."
R=$PWD
X=/tmp/sb
W=/tmp/sbw
rm -rf $W
mkdir -p $W
. scripts/device/libs.sh && mesh_unpack $R/${GPUM:-.gpum} $X
export OMP_NUM_THREADS=4
MPI="timeout 300 mpirun --oversubscribe -x LD_LIBRARY_PATH -x OMP_NUM_THREADS -x NCCL_NVLS_ENABLE"
T=${OUT:-$W}/share_bench.txt
: > $T
say() { echo "$*" | tee -a $T; }
date -u
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a $T
PARTS=${PARTS:-123} # which parts run
if [[ $PARTS == *1* ]]; then
say "== 1. the staged transport, 2 ranks on one GPU"
$MPI -np 2 $B/moe_bench_comm staged --sizes-mb 1,4,16,32,64,128 2>&1 | tee -a $T
say "   the path a CUDA-IPC transport would take (device to device into the peer's buffer), for comparison"
$MPI -np 2 $B/moe_bench_comm ipc --sizes-mb 1,4,16,32,64,128 2>&1 | tee -a $T
fi

python3 scripts/device/random_shard.py $W/rand.bin 2> /dev/null
S="--data $W/rand.bin --preset peers-ref --n-layers 4 --device cuda --batch 16 --seq-len 1024 --grad-accum 4
   --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 --steps 8"
peak() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1; }
tps() { python3 -c "
import json, statistics, sys
v = [json.loads(l).get('tokens_per_s') for l in open(sys.argv[1]) if '\"loss\"' in l][2:]
v = [x for x in v if x]
print(f'{statistics.median(v):.0f}' if v else 'none')" "$1/metrics.jsonl" 2> /dev/null; }
step() { # step LABEL NP FLAGS...
  local label=$1 np=$2
  shift 2
  local d=$W/run_$RANDOM
  (while true; do peak; sleep 0.3; done) > $d.mem 2> /dev/null &
  local mp=$!
  if [ $np = 1 ]; then timeout 300 $B/moe train --out $d $S "$@" > $d.log 2>&1
  else $MPI -np $np $B/moe train --out $d $S --gpu-comm staged "$@" > $d.log 2>&1; fi
  local rc=$?
  kill $mp 2> /dev/null
  printf "%-34s rc %-3s tokens/s %-8s peak GPU memory %6s MiB\n" "$label" $rc "$(tps $d)" "$(sort -n $d.mem | tail -1)" | tee -a $T
  [ $rc = 0 ] || grep -m2 -E "rror" $d.log | tee -a $T
}
ROWS=${ROWS:-one dp2 ep2 ep2ipc pp2} # part 2's rows
row() { [[ " $ROWS " == *" $1 "* ]]; }
for mps in ${MPS:-off on}; do
  [[ $PARTS == *2* ]] || break
  if [ $mps = on ]; then
    export CUDA_MPS_PIPE_DIRECTORY=$W/mps CUDA_MPS_LOG_DIRECTORY=$W/mpslog
    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
    nvidia-cuda-mps-control -d || { say "MPS did not start"; break; }
    MPI="$MPI -x CUDA_MPS_PIPE_DIRECTORY -x CUDA_MPS_LOG_DIRECTORY"
  fi
  say "== 2. one step, sharing the GPU (MPS $mps)"
  row one && step "one process" 1
  row dp2 && step "dp2 (2 ranks, staged)" 2
  row ep2 && step "ep2 (2 ranks, staged)" 2 --ep 2
  row ep2ipc && step "ep2 (2 ranks, ipc)" 2 --ep 2 --gpu-comm ipc
  row pp2 && step "pp2 (2 ranks, staged)" 2 --pp 2
  [ $mps = on ] && echo quit | nvidia-cuda-mps-control
done

[[ $PARTS == *3* ]] || exit 0
say "== 3. pipeline stages' memory on the GPU against moe info's prediction (pp2, MPS off)"
(while true; do nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits; sleep 0.3; done) > $W/apps.txt 2> /dev/null &
mp=$!
$MPI -np 2 $B/moe train --out $W/pp2mem $S --pp 2 --gpu-comm staged > $W/pp2mem.log 2>&1
kill $mp
for pid in $(cut -d, -f1 $W/apps.txt | sort -u); do
  say "  process $pid: peak $(grep "^$pid," $W/apps.txt | cut -d, -f2 | sort -n | tail -1) MiB (CUDA context included)"
done
$B/moe info --preset peers-ref --n-layers 4 --batch 16 --seq-len 1024 --grad-accum 4 --world 2 --pp 2 2>&1 | grep -E "^  stage [0-9]:|memory \(cuda" | tee -a $T
date -u
