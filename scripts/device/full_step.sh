#!/bin/bash
# Device recipe (kind nvidia-h200): what docs/PERFORMANCE.md's full-step tables come from, ours and the
# peers in one call. Prepare here (.gpu is an ignored folder, listed in .git/info/exclude):
#   cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu && cp build/moe_bench_attention .gpu/bin/ &&
#   cp ../shared/bench/torch_{moe,train}_peer.py .gpu/
# then run `bash scripts/device/full_step.sh` with carry [".gpu"] (about 8 minutes; PARTS selects, default
# "tests attn layer step profile"). Progress in $OUT/step.txt as it is made (a call that runs past its
# limit still returns it).
#   tests:   test_cuda_ops, test_cuda_model
#   attn:    attention fwd/bwd on the reference shape, ours and torch SDPA (flash)
#   layer:   the MoE layer on PEERS.md's shapes and the families' (qwen2, qwen2s: with its shared expert, e256),
#            ours and torch._grouped_mm
#   step:    the reference model's full step on uniform random tokens: ours, the compiled peer in mixed
#            precision (autocast, float32 master weights and moments), the compiled peer in pure bf16, ours
#            again; tokens/s and peak memory (nvidia-smi for both; the peer's report adds torch's allocator peak)
#   profile: MOE_PROFILE=1 (ops serialised and timed alone; with EXTRA also a run with those flags)
#   steady:  both under sustained load, the card power-capped (its 700 W limit binds ~1 s into a run of ours;
#            the clocks fall from 1.98 GHz to ~1.6): ours 40 steps on 4096 random sequences (the mean of steps
#            11-40), the peer 10 warm-up and 30 timed steps (PEER_WARM, PEER_STEPS); SM clock and power polled
#            for each (libs.sh clocks_say); STEADY_PREC the policies (default "bf16 mixed"; the peer torch.compile
#            AMP for mixed, torch.compile pure bf16 for the others: the fp8 targets are against it)
#   trace:   7 steps under the CUPTI tracer (pack_libs.sh builds it): each step's wall, GPU busy and idle
#            time, the idle gaps and the kernel time by name (scripts/device/gputrace.py; not by default);
#            TRACE_PREC the policies, a trace each (default mixed; "bf16 fp8-bf16" for "Where a step's time
#            goes"), each gaps_POLICY.txt under $OUT
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start step 570
PARTS=${PARTS:-tests attn layer step profile}
if has tests; then
  t ops 200 $B/test_cuda_ops; grep -E "checks" $W/ops.log | tee -a $R; grep -m5 FAIL $W/ops.log | tee -a $R
  t model 120 $B/test_cuda_model; grep -E "checks" $W/model.log | tee -a $R; grep -m5 FAIL $W/model.log | tee -a $R
fi
if has attn; then
  t att 60 $B/moe_bench_attention --device cuda --iters 20; say "ours: $(cat $W/att.log)"
  t sdpa 90 python3 bench/torch_attention_peer.py; say "sdpa: $(grep impl $W/sdpa.log)"
fi
if has layer; then
  t layer 200 $B/moe_bench_layer --cases mixtral,olmoe,small,ref,qwen2,qwen2s,e256 --iters 10 --warmup 3
  grep -E "^== |layer fwd" $W/layer.log | tee -a $R
  t peer_layer 200 python3 bench/torch_moe_peer_cases.py $G/torch_moe_peer.py mixtral,olmoe,small,ref,qwen2,qwen2s,e256
  grep case $W/peer_layer.log | tee -a $R
fi
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 12"
ours() {
  mem_start
  t ours$1 150 stdbuf -oL $B/moe train $P $2 --out $W/run
  local peak=$(mem_peak)
  grep -E "^step (4|8|12)/|trained" $W/ours$1.log | tee -a $R
  say "   peak GPU memory used (nvidia-smi): $peak MiB"
}
if has step; then
  say "-- ours"; ours 1
  say "-- peer, mixed precision"; peer_step amp
  say "-- peer, pure bf16"; peer_step compiled
  say "-- ours again"; ours 2
  [ -n "$EXTRA" ] && { say "-- ours $EXTRA"; ours 3 "$EXTRA"; }
fi
if has steady; then
  [ -f $G/rand_big.bin ] || python3 scripts/device/random_shard.py $G/rand_big.bin 8392704
  for pr in ${STEADY_PREC:-bf16 mixed}; do
    say "-- steady state, --precision $pr: ours (mean of steps 11-40)"
    mem_start; clocks_start
    q=${P/--steps 12/--steps 40}
    t steady_$pr 150 stdbuf -oL $B/moe train ${q/rand32k.bin/rand_big.bin} --precision $pr \
      --out $W/steady
    say "   peak GPU memory used (nvidia-smi): $(mem_peak) MiB"; clocks_say ours_$pr
    steady_mean $W/steady/metrics.jsonl
    say "-- steady state, the peer ($pr), 10 warm-up steps, 30 timed"
    CLOCKS=1 PEER_WARM=10 PEER_STEPS=30 peer_step $([ $pr = mixed ] && echo amp || echo compiled)
  done
fi
if has profile; then
  t prof 150 env MOE_PROFILE=1 stdbuf -oL $B/moe train ${P/--steps 12/--steps 4} --out $W/prof
  grep -E "^profile|^  [a-z].*calls" $W/prof.log | tee -a $R
  if [ -n "$EXTRA" ]; then
    say "-- profile, ours $EXTRA"
    t prof3 150 env MOE_PROFILE=1 stdbuf -oL $B/moe train ${P/--steps 12/--steps 4} $EXTRA --out $W/prof
    grep -E "^profile|^  [a-z].*calls" $W/prof3.log | tee -a $R
  fi
fi
if has trace; then
  for pr in ${TRACE_PREC:-mixed}; do
    t trace_$pr 150 env GPUTRACE_OUT=$W/trace_$pr.txt LD_PRELOAD=$G/lib/libgputrace.so $B/moe train \
      ${P/--steps 12/--steps 7} --precision $pr --out $W/trace_$pr
    python3 scripts/device/gputrace.py $W/trace_$pr.txt --skip 3 --top 60 > $W/gaps_$pr.txt 2>&1
    cp $W/gaps_$pr.txt ${OUT:-$W}/; head -12 $W/gaps_$pr.txt | tee -a $R
  done
fi
say "$(date -u) done"
