#!/bin/bash
# Device recipe (kind nvidia-h200): --precision fp8-bf16 (the bf16 policy's storage with fp8's expert GEMMs) on
# the GPU. Prepare here (.gpu is an ignored folder):
#   cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu && cp ../shared/bench/torch_train_peer.py .gpu/
# then run `bash scripts/device/fp8_bf16_check.sh` with carry [".gpu"] (about 5 minutes; PARTS selects, default
# "same step"). Progress in $OUT/fp8_bf16.txt as it is made.
#   same: a tiny model (2 layers, d 128, 8 experts top-2) trained 3 steps under --precision bf16 on cuda, its
#         step-3 checkpoint resumed for one step under fp8 and under fp8-bf16: step 4's loss the same bits
#         (tests/test_fp8_bf16.sh's property on the cpu: the same bf16 weights through the same FP8 recipe),
#         the fp8-bf16 checkpoint all bf16 values (ckpt_diff --bf16), the fp8 one not equal to it
#   step: the PEERS.md reference model (12 steps, random tokens as full_step.sh makes them): ours under
#         --precision bf16, fp8-bf16, fp8-bf16 with --fp8-weight-cache 0 (the weights quantised at every use, no
#         kept codes), and the compiled pure-bf16 peer; median tokens/s of steps 4-12 and peak GPU memory
#         (nvidia-smi, polled) for each
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start fp8_bf16 330
PARTS=${PARTS:-same step}
if has same; then
  S=(--device cuda --save-every 1 --keep 0 --quiet --sample-tokens 0 --plots 0 --batch 8 --seq-len 128
     --eval-batches 1 --eval-every 0 --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 128 --d-ff 256
     --n-experts 8 --top-k 2 --lr 1e-3 --warmup 2)
  t h 60 $B/moe train "${S[@]}" --steps 3 --precision bf16 --out $W/h
  for p in fp8 fp8-bf16; do
    rm -rf $W/r_$p && mkdir -p $W/r_$p && cp -r $W/h/step_00000003 $W/r_$p/ && head -n 3 $W/h/metrics.jsonl > $W/r_$p/metrics.jsonl
    t r_$p 60 $B/moe train "${S[@]}" --steps 4 --precision $p --out $W/r_$p --resume
  done
  l1=$(sed -n 4p $W/r_fp8/metrics.jsonl | grep -oE '"loss":[^,]*')
  l2=$(sed -n 4p $W/r_fp8-bf16/metrics.jsonl | grep -oE '"loss":[^,]*')
  say "   step 4 from one bf16 checkpoint: fp8 $l1, fp8-bf16 $l2: $([ -n "$l1" ] && [ "$l1" = "$l2" ] && echo SAME || echo DIFFERENT)"
  say "   fp8-bf16 step 4 all bf16 values: $($B/ckpt_diff --bf16 $W/r_fp8-bf16/step_00000004 2>&1 | tail -1)"
fi
if has step; then
  [ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin
  P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
     --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 12"
  run() { # run NAME ENV FLAGS...
    local name=$1 env=$2; shift 2
    mem_start
    t $name 120 env $env stdbuf -oL $B/moe train $P "$@" --out $W/$name
    local peak=$(mem_peak)
    local tps=$(tps_median $W/$name/metrics.jsonl)
    say "   $name: peak $peak MiB, tokens/s steps 4-12 median $tps"
    grep -E "^step (1|4|12)/" $W/$name.log | cut -c1-110 | tee -a $R
  }
  run bf16 MOE_X=0 --precision bf16
  run fp8bf16 MOE_X=0 --precision fp8-bf16
  run fp8bf16_nocache MOE_X=0 --precision fp8-bf16 --fp8-weight-cache 0
  say "-- peer, pure bf16"; peer_step compiled
fi
say "$(date -u) done"
