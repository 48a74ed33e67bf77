#!/bin/bash
# Device recipe (kind nvidia-h200-x2): the first runs across a GPU boundary. Prepare here:
#   bash scripts/device/mesh_pack.sh .gpum (binaries, libraries and a relocatable Open MPI; build/ built with
#   CUDA and test_nccl), then run `bash scripts/device/multi_gpu.sh` with carry [".gpum"]; the GPU matrix on
#   the same machine: `GPU_COMM=nccl MAXNP=2 bash scripts/device/gpu_mesh.sh`. NVLink multicast stays off
#   (NCCL_NVLS_ENABLE=0) in every command.
#   1. test_nccl on 2 ranks (every op against the host's);
#   2. a small model on the cuda backend: one GPU vs dp2 vs ep2 (per-step losses, bf16 tolerance);
#   3. the reference model's shape at ep2 (dp2 x ep2 over 2 GPUs): tokens/s for --a2a-overlap 1/2/auto and
#      --ampipe 1/2, the same call.
cd "$(dirname "$0")/../.."; R=$PWD; W=/tmp/w; mkdir -p $W
. scripts/device/libs.sh && mesh_unpack $R/.gpum /tmp/gm
export OMP_NUM_THREADS=8
MPI="timeout 200 mpirun -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x OMP_NUM_THREADS"
t() { local name=$1; shift; local t0=$SECONDS; "$@" > $W/$name.log 2>&1; echo "== $name rc=$? $((SECONDS-t0))s"; }
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; nvidia-smi topo -m | head -4
if [ "${DIAG:-0}" = 1 ]; then
  S="--device cuda --steps 6 --batch 16 --seq-len 128 --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 128 --d-ff 256 --n-experts 8 --top-k 2 --lr 1e-3 --warmup 2 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 --save-every -1 --force"
  for f in "--ampipe 2" "--ampipe 2 --a2a-overlap 2" "--ampipe 2 --overlap 0"; do
    MOE_NCCL_TIMEOUT_S=20 MOE_COMM_TIMEOUT_S=20 timeout 60 mpirun -np 2 -x NCCL_NVLS_ENABLE -x LD_LIBRARY_PATH -x OMP_NUM_THREADS -x MOE_NCCL_TIMEOUT_S -x MOE_COMM_TIMEOUT_S $B/moe train $S --ep 2 $f --out $W/d > ${OUT:-$W}/diag_${f// /_}.log 2>&1; echo "== $f rc=$?"; tail -3 ${OUT:-$W}/diag_${f// /_}.log
  done
  exit 0
fi
[ "${PERF_ONLY:-0}" = 1 ] || {
t nccl2 $MPI $B/test_nccl; grep -v "^ *$" $W/nccl2.log | tail -4
S="--device cuda --steps 20 --batch 16 --seq-len 128 --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 128 --d-ff 256
   --n-experts 8 --top-k 2 --lr 1e-3 --warmup 2 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 --save-every -1 --force"
t one $B/moe train $S --out $W/one
t dp2 $MPI $B/moe train $S --out $W/dp2 --check-replicas; tail -2 $W/dp2.log
t ep2 $MPI $B/moe train $S --out $W/ep2 --ep 2 --check-replicas; tail -2 $W/ep2.log
t ep2a $MPI $B/moe train $S --out $W/ep2a --ep 2 --ampipe 2 --a2a-overlap 2; tail -1 $W/ep2a.log
python3 - <<'P'
import json
def L(p): return [json.loads(l)['loss'] for l in open('/tmp/w/'+p+'/metrics.jsonl') if '"loss"' in l]
a = L('one')
for p in ('dp2', 'ep2', 'ep2a'):
    try:
        b = L(p); r = max(abs(x - y) / abs(x) for x, y in zip(a, b))
        print(f"{p}: {len(b)} steps, max relative loss difference vs one GPU {r:.2e}; step 1 {abs(a[0]-b[0])/a[0]:.2e}")
    except Exception as e: print(p, 'no metrics', e)
P
}
python3 scripts/device/random_shard.py $W/rand.bin
P="--data $W/rand.bin --preset peers-ref --device cuda --batch 8 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --steps 8 --ep 2"
for f in "--a2a-overlap 1 --ampipe 1" "--a2a-overlap 2 --ampipe 1" "--a2a-overlap 4 --ampipe 1" "--a2a-overlap 1 --ampipe 2" \
         "--a2a-overlap 2 --ampipe 2" "--a2a-overlap 1 --ampipe 4" "--a2a-overlap 2 --ampipe auto --steps 16"; do
  echo "-- peers-ref dp2 x ep2 on 2 GPUs (global batch 8 x 2048): $f"
  mem_start
  $MPI stdbuf -oL $B/moe train $P $f --out $W/p 2>&1 | grep -E "^step (8|16)/|trained|rror" | head -4
  echo "   peak GPU memory (the larger GPU, nvidia-smi): $(mem_peak) MiB"
done
grep -o '"a2a_tuned".*' $W/p/metrics.jsonl | head -1 | cut -c1-600
date -u
