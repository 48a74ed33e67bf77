#!/bin/bash
# Device recipe (kind nvidia-h200): everything docs/PERFORMANCE.md's tables come from, ours and the
# peers in one call. Prepare here (ignored folders, listed in .git/info/exclude):
#   cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu && cp build/moe_bench_attention .gpu/bin/
#   mkdir -p .gpu/src && cp scripts/verify_hf.py .gpu/src/ && python3 scripts/device/random_shard.py .gpu/rand32k.bin
#   mkdir -p .bench && cp ../shared/bench/torch_{moe,train}_peer.py bench/torch_attention_peer.py .bench/
# then run `bash scripts/device/full_step.sh` with carry [".gpu", ".bench"] (about 5 minutes).
cd "$(dirname "$0")/../.."
G=$PWD/.gpu; B=$G/bin; W=/tmp/w; mkdir -p $W
. scripts/device/libs.sh && device_libs $G $B/moe
export OMP_NUM_THREADS=16 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
t() { local name=$1; shift; local t0=$SECONDS; "$@" > $W/$name.log 2>&1; echo "== $name rc=$? $((SECONDS-t0))s"; }
date -u; nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
# correctness first: both CUDA backends against the cpu reference
t ops timeout 200 $B/test_cuda_ops; grep -E "checks" $W/ops.log; grep -m5 FAIL $W/ops.log
t model timeout 120 $B/test_cuda_model; grep -E "worst|checks" $W/model.log; grep -m5 FAIL $W/model.log
t hf timeout 200 python3 $G/src/verify_hf.py $B/moe --moe-device cuda --tol 3e-2; grep -E "PASS|FAIL|worst|passed" $W/hf.log | tail -4
# attention: ours and SDPA (flash), the reference model's shape
$B/moe_bench_attention; python3 .bench/torch_attention_peer.py 2>&1 | grep impl
# the MoE layer: ours and torch._grouped_mm on PEERS.md's shapes, plus the reference model's layer
t layer timeout 200 $B/moe_bench_layer --cases mixtral,olmoe,small,ref --iters 10 --warmup 3 --gemm 0
grep -E "^== |layer fwd|^  (expert|SwiGLU|zero|host)" $W/layer.log
timeout 200 python3 .bench/torch_moe_peer.py 2>&1 | grep -v Warning | grep -E "grouped|case|{" | head -12
# the full step of the PEERS.md model on uniform random tokens (as the peer), ours twice around the peer
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 12"
ours() {
  ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.5; done ) > $W/mem.txt 2>/dev/null &
  local mp=$!
  env MOE_BF16_SHADOW=${1:-1} timeout 150 stdbuf -oL $B/moe train $P --out $W/run 2>&1 | grep -E "^step (4|8|12)/|trained"
  kill $mp; echo "   peak GPU memory used (nvidia-smi): $(sort -n $W/mem.txt | tail -1) MiB"
}
echo "-- ours"; ours
echo "-- peer (torch.compile)"; timeout 300 python3 -c "
import runpy, torch
m = runpy.run_path('.bench/torch_train_peer.py', run_name='peer'); c = m['CFG']; torch.manual_seed(0)
def run():
    mod = m['Model'](c).cuda().to(torch.bfloat16)
    return m['time_steps'](torch.compile(mod), torch.optim.AdamW(mod.parameters(), lr=1e-4, fused=True), c)
m['report']('torch_grouped_mm_compiled', run)" 2>&1 | grep impl
echo "-- ours, MOE_BF16_SHADOW=0 (weights converted per GEMM)"; ours 0
echo "-- ours again"; ours
echo "-- where the time goes (MOE_PROFILE=1: ops serialised, 3 steps after the first + the final eval's forward)"
MOE_PROFILE=1 timeout 150 stdbuf -oL $B/moe train ${P/--steps 12/--steps 4} --out $W/prof 2>&1 | grep -E "^profile|^  [a-z].*calls"
date -u
