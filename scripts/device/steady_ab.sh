#!/bin/bash
# steady_ab.sh — what a change does to issue 38's bf16 row: the reference model's bf16 step under sustained load
# (40 steps, the mean of 11-40, as full_step.sh's steady rows), the build before the change (.gpu/old/moe:
# pack.sh's PACK_OLD) and after it (.gpu/bin/moe), each twice in turns (new, old, new, old: the card's heat and
# clocks drift over a call), then torch.compile's pure-bf16 peer (.gpu/torch_train_peer.py: pack.sh copies it
# where ../shared/bench has it), in one call of about six minutes. Run from a series' package through
# `bash pending/device_run.sh SERIES:steady_ab.sh:420` with carry [".gpk"]. Output: $OUT/steady_ab.txt: each
# run's tokens/s and ms a step, its peak memory (nvidia-smi) and its clocks and power (the card at its cap
# is the usual state: docs/PERFORMANCE.md, "Power"), the last step's loss, and the peer's line. TURNS="1"
# runs one turn each. SHAPE=B:T (default 4:2048: 8192 tokens a step; 8:2048 for the per-token split of
# docs/PERFORMANCE.md's "Tokens a step") sets both sides' batch and sequence length (the peer's too), PREC
# ours' --precision (default bf16; the peer stays pure bf16); without .gpu/old/moe (a package made with no
# PACK_OLD) only the new build runs: a current row.
# Exit 1 when a run fails.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start steady_ab 420
O=$G/old/moe SIDES="new old"
[ -x $O ] || { say "no $O (no build before): the new build alone"; SIDES=new; }
SB=${SHAPE:-4:2048}; SB_B=${SB%:*} SB_T=${SB#*:}
[ "$SB_B" -ge 1 ] 2>/dev/null && [ "$SB_T" -ge 1 ] 2>/dev/null || { say "SHAPE $SB: not B:T"; exit 1; }
[ -f $G/rand_big.bin ] || python3 scripts/device/random_shard.py $G/rand_big.bin 8392704
P="--preset peers-ref --device cuda --batch $SB_B --seq-len $SB_T --max-seq-len $SB_T --lr 1e-4 --warmup 1
   --save-every -1 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand_big.bin
   --steps 40 --precision ${PREC:-bf16}"
say "B $SB_B x T $SB_T, ours --precision ${PREC:-bf16}"
for i in ${TURNS:-1 2}; do
  for v in $SIDES; do
    bin=$B/moe; [ $v = old ] && bin=$O
    say "-- $v ($i)"
    mem_start; clocks_start
    t steady_${v}_$i 150 stdbuf -oL $bin train $P --out $W/steady_$v || FAIL=1
    say "   peak GPU memory used (nvidia-smi): $(mem_peak) MiB"; clocks_say ${v}_$i
    [ -s $W/steady_$v/metrics.jsonl ] && steady_mean $W/steady_$v/metrics.jsonl 1 $((SB_B * SB_T)) || FAIL=1
  done
done
if [ -f $G/torch_train_peer.py ]; then
  say "-- the peer (pure bf16), 10 warm-up steps, 30 timed"
  PEER_B=$SB_B PEER_T=$SB_T CLOCKS=1 PEER_WARM=10 PEER_STEPS=30 peer_step compiled
else
  say "-- no $G/torch_train_peer.py: the peer not run"
fi
say "$(date -u) done: $([ $FAIL = 0 ] && echo 'every run finished' || echo 'FAILURES above')"
exit $FAIL
