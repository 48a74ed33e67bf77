#!/bin/bash
# (carry [".gpu", ".bench"]; .gpu from scripts/device/pack_libs.sh .gpu, .bench holds a copy of ../shared/bench/torch_train_peer.py; run as bash .gpu/step.sh from a copy there)
# device: full training step of the PEERS.md reference model, ours and the torch peers in one call
cd "$(dirname "$0")/.."
G=$PWD/.gpu; B=$G/bin
export LD_LIBRARY_PATH=$G/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
for n in libcublas.so.13 libcudart.so.13 libnccl.so.2; do ldd $B/moe | grep -q "$n => not found" && { c=$(find / -xdev -name "$n*" 2>/dev/null | head -1); export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname $c); }; done
export OMP_NUM_THREADS=16 NCCL_NVLS_ENABLE=0
date -u; nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.5; done ) > /tmp/mem.txt 2>/dev/null &
MP=$!
timeout 240 $B/moe train --preset peers-ref --device cuda --batch 4 --seq-len 2048 --steps 6 --warmup 1 --save-every -1 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 --out /tmp/pr 2>&1 | grep -E "^model|^step|trained"
kill $MP; echo "ours: peak GPU memory used (nvidia-smi) $(sort -n /tmp/mem.txt | tail -1) MiB"
PYTHONUNBUFFERED=1 timeout 300 python3 .bench/torch_train_peer.py 2>&1 | grep -v Warning | tail -6
