#!/bin/bash
# fp8_fuse_check.sh — the FP8 tables' byte savers (issue 38: kept weights, fused quantisers, the SwiGLU in the
# up projection's epilogue) on the GPU, one call, under 6 minutes (BUDGET, default 330 s). Prepare here:
# `cmake --build build -j2 && bash scripts/device/mesh_pack.sh .gpum` (build/ with CUDA), then call
# `bash scripts/device/fp8_fuse_check.sh` with carry [".gpum"] and timeout_s 420. Steps, most wanted first
# (each bounded by what is left of BUDGET; a step without time is reported skipped):
#   1. tests/test_cuda_fp8_fused.c (the new kernels and the tables' kept/stashed operands bit for bit against
#      the unfused compositions) in both MOE_FP8_GEMM modes, and tests/test_cuda_fp8_ops.c (the tables against
#      the cpu's fp8 table: bit for bit with the reference GEMM, its kernel half within its bands);
#   2. compute-sanitizer memcheck on test_cuda_fp8_fused's small cases (one of each kernel and table op);
#   3. a tiny model 30 steps, cuda fp8 against cuda mixed (the loss curves stay close) and against fp8 with
#      --fp8-weight-cache 0 (no kept weights, so no fused up projection: the same losses);
#   4. the reference model's step (peers-ref, batch 4 x 2048, 12 steps, random tokens): --precision mixed,
#      fp8, bf16, median tokens/s of steps 4-12 and peak GPU memory (nvidia-smi), in this call;
#   5. MOE_PROFILE=1's grouped-op times a step under fp8 (and mixed, last);
#   6. fp8 with --fp8-weight-cache 0 (the weights quantised on every use: what the kept copy buys, and its memory);
#   7. compute-sanitizer racecheck on the small cases, and tests/test_cuda_fp8_gemm (the GEMM's host side).
# Prints one summary table at the end; everything also goes to $OUT/fp8_fuse.txt, the logs to $OUT/logs.tgz.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && mesh_unpack $PWD/${GPUM:-.gpum} /tmp/fp8fuse
W=/tmp/fp8fuse_w; mkdir -p $W; R=${OUT:-$W}/fp8_fuse.txt; : > $R
export OMP_NUM_THREADS=16 BUDGET=${BUDGET:-330}
say "$(date -u) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
S=() # the summary's rows
row() { S+=("$(printf '%-44s %s' "$1" "$2")"); }
res() { # NAME: the step's exit status, the test log's last count line and its FAIL lines
  local l=$W/$1.log
  [ -f $l ] || { echo "skipped (time)"; return; }
  echo "$(grep -oE "^== $1 rc=[0-9]+" $R | tail -1 | cut -d' ' -f3); $(grep -E 'checks' $l | tail -1); $(grep -c '^FAIL' $l) FAIL lines"
}
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)

t fused 90 $B/test_cuda_fp8_fused; row "test_cuda_fp8_fused (kernel GEMM)" "$(res fused)"
t fused_ref 90 env MOE_FP8_GEMM=ref $B/test_cuda_fp8_fused; row "test_cuda_fp8_fused (MOE_FP8_GEMM=ref)" "$(res fused_ref)"
grep -m8 FAIL $W/fused.log $W/fused_ref.log 2>/dev/null | tee -a $R
t ops 150 $B/test_cuda_fp8_ops; row "test_cuda_fp8_ops (both modes)" "$(res ops)"
grep -m8 FAIL $W/ops.log 2>/dev/null | tee -a $R
t memcheck 90 $CS --tool memcheck --error-exitcode 9 $B/test_cuda_fp8_fused small
row "compute-sanitizer memcheck (small)" "$(res memcheck | cut -d';' -f1); $(grep -hE 'ERROR SUMMARY' $W/memcheck.log 2>/dev/null | tail -1)"
grep -m6 -E "^=========  *(Invalid|Error)" $W/memcheck.log 2>/dev/null | tee -a $R

TINY="--steps 30 --batch 8 --seq-len 128 --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 256 --d-ff 256
  --n-experts 8 --top-k 2 --lr 1e-3 --warmup 5 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0
  --save-every -1 --force --seed 3"
L() { grep -o '"loss":[^,]*' $1/metrics.jsonl | cut -d: -f2; }
for p in fp8 mixed; do t tiny_$p 60 $B/moe train --device cuda --precision $p $TINY --out $W/tiny_$p; done
t tiny_nocache 60 $B/moe train --device cuda --precision fp8 --fp8-weight-cache 0 $TINY --out $W/tiny_nocache
cmpl() { # A B: the largest relative difference of their per-step losses
  if [ -f $W/$1/metrics.jsonl ] && [ -f $W/$2/metrics.jsonl ]; then
    paste <(L $W/$1) <(L $W/$2) | awk '{d=($1-$2)/$2; if(d<0)d=-d; if(d>m)m=d; if($1!=$2)n++} END{printf "max rel. loss diff %.2e, %d of %d steps differ", m, n, NR}'
  else echo "not run"; fi
}
row "tiny 30 steps: cuda fp8 vs cuda mixed" "$(cmpl tiny_fp8 tiny_mixed)"
# (without the kept weights the fused up projection does not run either: the unfused path, which must give
# the same bits, so the same losses to the printed digit)
row "tiny: fp8 vs fp8 --fp8-weight-cache 0 (want 0 differ)" "$(cmpl tiny_fp8 tiny_nocache)"

[ -f $W/rand32k.bin ] || python3 scripts/device/random_shard.py $W/rand32k.bin
REF="--device cuda --preset peers-ref --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
  --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $W/rand32k.bin --out $W/ref"
step() { # NAME PRECISION [ENV...]: 12 steps, the median tokens/s of steps 4-12 and the peak memory
  local n=$1 p=$2; shift 2
  mem_start
  t ref_$n 100 env "$@" stdbuf -oL $B/moe train $REF --precision $p --steps 12
  local peak=$(mem_peak)
  local tps=$(grep -E "^step ([4-9]|1[0-2])/" $W/ref_$n.log 2>/dev/null | sed 's/.*| *\([0-9]*\) tok\/s.*/\1/' | sort -n |
    awk '{a[NR]=$1} END{if (NR) print a[int((NR+1)/2)]}')
  eval "TPS_$n=${tps:-0}"
  row "peers-ref --precision $p ${*:-}" "${tps:-?} tokens/s, peak ${peak:-?} MiB"
  say "peers-ref $n: median ${tps:-?} tokens/s (steps 4-12), peak GPU memory ${peak:-?} MiB"
  [ -n "$tps" ] || tail -3 $W/ref_$n.log 2>/dev/null | tee -a $R
}
step mixed mixed; step fp8 fp8; step bf16 bf16
[ "${TPS_mixed:-0}" -gt 0 ] && row "fp8 / mixed, fp8 / bf16 (tokens/s)" \
  "$(awk -v a=$TPS_fp8 -v b=$TPS_mixed -v c=$TPS_bf16 'BEGIN{printf "%.3fx, %.3fx", a/b, (c>0?a/c:0)}')"

prof() { # PRECISION: MOE_PROFILE=1's grouped ops a step
  t prof_$1 80 env MOE_PROFILE=1 stdbuf -oL $B/moe train $REF --precision $1 --steps 4 || return
  say "-- profile, --precision $1"; grep -E "^profile|^  [a-z].*calls" $W/prof_$1.log | head -24 | tee -a $R
  row "profile $1: grouped ops, ms/step" "$(grep -E '^  grouped' $W/prof_$1.log |
    awk '{printf "%s %s, ", $3, $(NF-4)}')of $(grep -E '^profile' $W/prof_$1.log | grep -oE '[0-9.]+ ms of ops')"
}
prof fp8

step nocache "fp8 --fp8-weight-cache 0"
prof mixed
t racecheck 90 $CS --tool racecheck --error-exitcode 9 $B/test_cuda_fp8_fused small
row "compute-sanitizer racecheck (small)" "$(res racecheck | cut -d';' -f1); $(grep -hE 'RACECHECK SUMMARY|ERROR SUMMARY' $W/racecheck.log 2>/dev/null | tail -1)"
t gemm 90 $B/test_cuda_fp8_gemm; row "test_cuda_fp8_gemm" "$(res gemm | cut -d';' -f1); $(tail -1 $W/gemm.log 2>/dev/null)"

say ""
say "== summary (fp8_fuse_check.sh, $(date -u), ${SECONDS}s)"
for r in "${S[@]}"; do say "$r"; done
tar -C $W -czf ${OUT:-$W}/logs.tgz --exclude='*.bin' --exclude=ref --exclude='tiny_*' $(cd $W && ls *.log) 2>/dev/null
true
