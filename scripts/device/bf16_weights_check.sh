#!/bin/bash
# Device recipe (kind nvidia-h200): --precision bf16 with the GEMMs' weights in the bf16 copy alone
# (ops.h alloc_bf16_params, model_bf16_weights). Prepare here:
#   cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu && cp ../shared/bench/torch_train_peer.py .gpu/
# then run `bash scripts/device/bf16_weights_check.sh` with carry [".gpu"] (about 8 minutes; PARTS selects,
# default "ops same mem ref peer"). Progress in $OUT/bf16w.txt as it is made.
#   ops:  test_cuda_ops (its alloc_bf16_params checks among the rest)
#   same: scripts/same_bits.sh on one process (one, resume, text) with --device cuda --precision bf16, nearest
#         and stochastic rounding, d 128 (q, o and the LM head are holes beside the experts): the binary as it
#         runs (those weights in the copy alone; their float32 memory NaN where it exists) against itself
#         under MOE_BF16_SHADOW=0 (no copy: float32 weights converted per GEMM): every metrics line,
#         checkpoint and report byte for byte
#   mem:  compute-sanitizer memcheck on a small --precision bf16 run (a kernel reading an unbacked page shows)
#   ref:  the reference model under --precision bf16: tokens/s, peak memory (nvidia-smi), the end-of-run memory
#         report; and its first steps under MOE_BF16_SHADOW=0 (the same losses)
#   peer: the pure-bf16 compiled peer (torch_train_peer.py) in the same call, its peak by nvidia-smi too
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start bf16w 570
PARTS=${PARTS:-ops same mem ref peer}
if has ops; then
  t ops 200 $B/test_cuda_ops; grep -E "checks|alloc_bf16_params" $W/ops.log | tee -a $R; grep -m8 FAIL $W/ops.log | tee -a $R
fi
if has same; then
  printf '#!/bin/sh\nMOE_BF16_SHADOW=0 exec %s "$@"\n' "$B/moe" > $W/moe_noshadow; chmod +x $W/moe_noshadow
  for rnd in nearest stochastic; do
    t same_$rnd 150 env SAME_BITS_FLAGS="--device cuda --precision bf16 --bf16-rounding $rnd --d-model 128" \
      bash scripts/same_bits.sh $W/moe_noshadow $B/moe one resume text
    say "   same_bits ($rnd): $(tail -2 $W/same_$rnd.log | tr '\n' ' ')"
  done
fi
if has mem; then
  S="--device cuda --precision bf16 --steps 3 --batch 4 --seq-len 64 --n-layers 2 --n-heads 4 --n-kv-heads 2
     --d-model 128 --d-ff 256 --n-experts 4 --lr 1e-3 --warmup 1 --eval-every 0 --eval-batches 1 --sample-tokens 0
     --plots 0 --save-every 2 --force"
  t memcheck 150 compute-sanitizer --tool memcheck $B/moe train $S --out $W/mc
  grep -E "ERROR SUMMARY|^step 3/" $W/memcheck.log | tee -a $R; grep -m3 -A8 "Invalid\|out of bounds" $W/memcheck.log | head -24 | tee -a $R
fi
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --precision bf16"
if has ref; then
  mem_start; t ref 100 stdbuf -oL $B/moe train $P --steps 12 --out $W/run; peak=$(mem_peak)
  grep -E "^step (1|2|3|4|8|12)/|trained|memory" $W/ref.log | cut -c1-150 | tee -a $R
  say "   peak (nvidia-smi): $peak MiB"
  t ref_ns 80 env MOE_BF16_SHADOW=0 stdbuf -oL $B/moe train $P --steps 3 --out $W/run_ns
  grep -E "^step (1|2|3)/" $W/ref_ns.log | cut -c1-60 | tee -a $R
fi
has peer && peer_step compiled
say "$(date -u) done"
