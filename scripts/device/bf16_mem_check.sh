#!/bin/bash
# Device recipe (kind nvidia-h200): issue 38's bf16 memory target, ours against the compiled pure-bf16 peer
# in one call, under sustained load as full_step.sh's steady part: the reference model (PEERS.md), B 4 x T
# 2048, --precision bf16, ours plain and with --recompute moe --recompute-layers N for each N in RC (default "3 4"),
# then each run of RUNS ("NAME:FLAGS|NAME:FLAGS", e.g. "lc8:--loss-chunks 8|lc8rc2:--loss-chunks 8 --recompute moe
# --recompute-layers 2"; moe info's figure for each printed beside it), the mean tokens/s of steps 11-40 and
# nvidia-smi's peak; then the peer (torch.compile, pure bf16), 10 warm-up
# and 30 timed steps, its peak by the same poll. Needs .gpu (pack_libs.sh) and .gpu/torch_train_peer.py
# (../shared/bench/). Progress in $OUT/bf16mem.txt.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start bf16mem 480
[ -f $G/rand_big.bin ] || python3 scripts/device/random_shard.py $G/rand_big.bin 8392704
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand_big.bin --steps 40 --precision bf16"
steady() { # NAME FLAGS
  mem_start; clocks_start
  t $1 150 stdbuf -oL $B/moe train $P $2 --out $W/$1
  say "-- ours $1 ($2): peak GPU memory used (nvidia-smi) $(mem_peak) MiB"; clocks_say $1
  grep -m1 "^memory:" $W/$1.log | cut -c1-160 | tee -a $R
  steady_mean $W/$1/metrics.jsonl 1
}
steady plain ""
for n in ${RC-3 4}; do steady rc$n "--recompute moe --recompute-layers $n"; done
IFS='|' read -ra RUN <<< "${RUNS:-}"
for r in "${RUN[@]}"; do
  say "-- moe info (${r#*:}): $($B/moe info --preset peers-ref --batch 4 --seq-len 2048 --precision bf16 ${r#*:} | grep -o '): [0-9.]* GiB plus' | head -1)"
  steady "${r%%:*}" "${r#*:}"
done
say "-- the peer (pure bf16, torch.compile), 10 warm-up steps, 30 timed"
CLOCKS=1 PEER_WARM=10 PEER_STEPS=30 peer_step compiled
steady plain2 ""
say "done $(date -u)"
