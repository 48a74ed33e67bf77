#!/bin/bash
# Device recipe (kind nvidia-h200): --bf16-grads under --precision fp8-bf16 (the FP8 weight-gradient GEMMs write
# the routed experts' gradients packed as bf16 values: ops.h GM_DW_BF16). Prepare as suite_check.sh (.gpk/gpu.tar.xz
# with torch_train_peer.py not needed); run `bash scripts/device/fp8_grads_check.sh` with carry [".gpk"] (about 5
# minutes). Progress in $OUT/fp8_grads.txt.
#   1. test_cuda_fp8_gemm (the kernel's packed output: the float32 output's bits rounded, the rest of the buffer
#      untouched, the ledger's sum that of the packed values) and test_cuda_fp8_ops (the tables' packed dw2 and
#      dw1 against the cpu's: bit for bit through the reference GEMM, within the kernel's bands through ours);
#   2. the PEERS.md reference model at fp8-bf16, 12 steps on random tokens: --bf16-grads 0 (float32 expert
#      gradients, the old way), 1 (the default), 1 with --recompute moe (each layer's packed blocks' unused
#      halves left out: ops.h alloc_holes), and that with --fp8-weight-cache 0 (no kept weight codes): step 1's loss
#      (the same bits for 0 and 1: before any update) and gradient norm, median tokens/s of steps 4-12, peak GPU
#      memory (nvidia-smi) beside `moe info`'s figure; the last three runs' losses and norms the same bits.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start fp8_grads 330
t gemm 90 $B/test_cuda_fp8_gemm; test_line gemm
t ops 90 $B/test_cuda_fp8_ops; test_line ops
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 12 --precision fp8-bf16"
run() { # run NAME ENV INFO_FLAGS FLAGS... (INFO_FLAGS: those moe info takes)
  local name=$1 env=$2 inf=$3; shift 3
  local gib=$($B/moe info --preset peers-ref --batch 4 --seq-len 2048 --precision fp8-bf16 $inf 2>&1 |
              grep -oE '[0-9.]+ GiB plus the CUDA context' | head -1)
  mem_start
  t $name 100 env $env stdbuf -oL $B/moe train $P "$@" --out $W/$name
  local peak=$(mem_peak)
  local tps=$(tps_median $W/$name/metrics.jsonl)
  say "   $name: peak $peak MiB (moe info: ${gib:-?}), tokens/s steps 4-12 median $tps"
  say "     step 1: $(head -1 $W/$name/metrics.jsonl | grep -oE '"(loss|grad_norm)":[^,]*' | tr '\n' ' ')"
}
run grads0 MOE_X=0 "--bf16-grads 0" --bf16-grads 0
run grads1 MOE_X=0 ""
run grads1_rc MOE_X=0 "--recompute moe" --recompute moe
run grads1_rc_nocache MOE_X=0 "--recompute moe --fp8-weight-cache 0" --recompute moe --fp8-weight-cache 0
# the last three train the same losses and gradient norms bit for bit (--recompute and the kept codes change no bit)
bits() { grep -oE '"(loss|grad_norm)":[^,]*' $W/$1/metrics.jsonl; }
for r in grads1_rc grads1_rc_nocache; do
  if [ -n "$(bits $r)" ] && cmp -s <(bits grads1) <(bits $r); then say "   $r: the same losses and norms as grads1 ($(bits $r | wc -l) values)"
  else say "   $r: losses or norms DIFFER from grads1"; FAIL=1; fi
done
say "$(date -u) done"
