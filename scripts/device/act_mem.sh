#!/bin/bash
# Device recipe (kind nvidia-h200): the lean MoE backward scratch (moe.h moe_scratch_init: dxg in the layer's
# yg, dh1 and dh3 over h1 and h3, the MoE output in dxn, dxj only where TP > 1) against the scratch's own
# buffers (MOE_ACT_MEM_OLD=1) in one binary. Prepare here (.gpu is an ignored folder):
#   cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu
# then run `bash scripts/device/act_mem.sh` with carry [".gpu"] (about 4 minutes; PARTS selects, default
# "tests step same"). Progress in $OUT/act_mem.txt as it is made.
#   tests: test_cuda_model (cuda bf16 against the bf16 reference: its loss band)
#   step:  the PEERS.md reference model under --precision bf16 (12 steps, random tokens as full_step.sh makes
#          them), new then old: tokens/s of steps 4-12 (median), peak GPU memory (nvidia-smi, polled), the
#          metrics lines compared without their timing fields (the wgmma SwiGLU backward in place), and moe
#          info's prediction for each
#   same:  scripts/same_bits.sh's one-process runs (one; resume: --grad-memory shared, layer 0 in the
#          embedding's gradient), old (MOE_ACT_MEM_OLD=1) against new, byte for byte, on cuda under --precision
#          bf16 (a vocabulary of 2048: the embedding's gradient holds most of layer 0) and mixed, and bf16 with a
#          shared expert, --recompute moe and AMPipe chunks (the small shapes take the unfused SwiGLU
#          backward: swiglu_bwd_k in place)
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start act_mem 290
PARTS=${PARTS:-tests step same}
printf '#!/bin/sh\nMOE_ACT_MEM_OLD=1 exec %s "$@"\n' "$B/moe" > $W/moe_old; chmod +x $W/moe_old
if has tests; then
  t model 120 $B/test_cuda_model; test_line model
fi
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 12 --precision bf16"
# `run NAME BIN`: the step's run, its peak, the median tokens/s of steps 4-12, moe info's figure
run() {
  mem_start
  t $1 120 stdbuf -oL $2 train $P --out $W/$1
  local peak=$(mem_peak)
  local tps=$(tps_median $W/$1/metrics.jsonl)
  say "   $1: peak $peak MiB, tokens/s steps 4-12 median $tps"
  $2 info --preset peers-ref --batch 4 --seq-len 2048 --precision bf16 | tail -1 | grep -oE '[0-9.]+ GiB plus' |
    sed "s/^/   $1: moe info /" | tee -a $R
  grep -E "^step (1|4|12)/" $W/$1.log | cut -c1-110 | tee -a $R
}
strip() { sed -E 's/"pp_idle_s":\[[^]]*\],?//; s/"(tokens_per_s|tflops|step_time_s|grad_wait_s|bubble_frac)":[^,}]*,?//g' "$1"; }
if has step; then
  run new $B/moe
  run old $W/moe_old
  if [ -s $W/new/metrics.jsonl ] && cmp -s <(strip $W/new/metrics.jsonl) <(strip $W/old/metrics.jsonl); then
    say "   metrics: new and old the same bits ($(wc -l < $W/new/metrics.jsonl) lines)"
  else say "   metrics: new and old DIFFER"; diff <(strip $W/new/metrics.jsonl) <(strip $W/old/metrics.jsonl) | head -6 | tee -a $R; fi
fi
if has same; then
  for f in "--precision bf16 --vocab-size 2048" "--precision mixed" \
           "--precision bf16 --n-shared-experts 1 --shared-d-ff 32 --recompute moe --ampipe 2"; do
    t same 90 env SAME_BITS_FLAGS="--device cuda $f" bash scripts/same_bits.sh $W/moe_old $B/moe one resume
    say "   same_bits ($f): $(tail -1 $W/same.log)"
  done
fi
say "$(date -u) done"
