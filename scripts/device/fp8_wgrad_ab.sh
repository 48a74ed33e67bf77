#!/bin/bash
# fp8_wgrad_ab.sh — the FP8 weight-gradient GEMM's ping-pong (issue 38) against the kernel before it, one call
# under 4 minutes (BUDGET, default 240 s). Prepare here: `cmake --build build -j2 && bash
# scripts/device/mesh_pack.sh .gpum`, then call `bash scripts/device/fp8_wgrad_ab.sh` with carry [".gpum"]
# and timeout_s 290. The switches: MOE_FP8_WGRAD_OLD=1 (the weight gradient's kernel as before: both consumer
# warpgroups in step, tiles rows fastest, no prefetch of C) and MOE_FP8_ROWS_PINGPONG=1 (the forward and
# activation-gradient GEMMs with the ping-pong too; off by default until measured). Steps (each bounded by
# what is left of BUDGET):
#   1. the same bits, all at once: tests/test_cuda_fp8_gemm (against cpu_fp8_gemm; the exact cases bit for
#      bit, the banded tile order and a CTA's second tile among them), test_cuda_fp8_fused and
#      test_cuda_fp8_ops, each with the defaults (the new wgrad), MOE_FP8_WGRAD_OLD=1 (gemm only) and
#      MOE_FP8_ROWS_PINGPONG=1; compute-sanitizer racecheck and memcheck on test_cuda_fp8_fused small and on
#      test_cuda_fp8_gemm's dw-3 (beta 1: the prefetch of C), every kernel the ping-pong one;
#   2. a tiny model 30 steps under --precision fp8: the defaults twice (the control), MOE_FP8_WGRAD_OLD=1 and
#      MOE_FP8_ROWS_PINGPONG=1; losses and the final model and optimizer state byte for byte;
#   3. moe_bench_layer --cases ref,mixtral,olmoe --fp8 1 --fp8-trace 1 with old, new and rows-pp: each GEMM
#      kernel's ms and TFLOP/s and the layer's ms side by side;
#   4. moe_bench_fp8 (its dW shapes: mixtral-dW1, ref-dW1) with old and new;
#   5. where time is left, the mixtral layer with the ping-pong but without the bands (MOE_FP8_WGRAD_BAND=0):
#      what the tile order alone gives.
# Fails (non-zero exit) on any test failure, a differing tiny run or a bench that does not finish. Everything
# also goes to $OUT/fp8_wgrad.txt, the logs to $OUT/logs.tgz.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && mesh_unpack $PWD/${GPUM:-.gpum} /tmp/fw
W=/tmp/fw_w; rm -rf $W; mkdir -p $W; R=${OUT:-$W}/fp8_wgrad.txt; : > $R
export OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1 BUDGET=${BUDGET:-240}
say "$(date -u) $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
FAIL=0 S=()
row() { S+=("$(printf '%-44s %s' "$1" "$2")"); }
st() { grep -oE "^== $1 rc=[0-9]+" $R | tail -1 | sed 's/.*rc=//'; } # NAME's exit status (t's line)
need() { [ "$(st $1)" = 0 ] || { FAIL=$((FAIL + 1)); say "FAILED: $1 (rc $(st $1))"; }; }
OLD=MOE_FP8_WGRAD_OLD=1 RPP=MOE_FP8_ROWS_PINGPONG=1

# 1. the tests, at once (values only)
tests() {
  local l=$((BUDGET - SECONDS - 140)) pids=() n
  [ $l -gt 95 ] && l=95
  [ $l -lt 50 ] && l=50
  run1() { local n=$1; shift; (timeout $l env OMP_NUM_THREADS=2 "$@" > $W/$n.log 2>&1; echo $? > $W/$n.rc) & pids+=($!); }
  local cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  run1 gemm $B/test_cuda_fp8_gemm
  run1 gemm_old env $OLD $B/test_cuda_fp8_gemm
  run1 gemm_rpp env $RPP $B/test_cuda_fp8_gemm
  run1 fused $B/test_cuda_fp8_fused
  run1 fused_rpp env $RPP $B/test_cuda_fp8_fused
  run1 ops $B/test_cuda_fp8_ops
  run1 ops_rpp env $RPP $B/test_cuda_fp8_ops
  run1 racecheck env $RPP $cs --tool racecheck --error-exitcode 9 $B/test_cuda_fp8_fused small
  run1 memcheck env $RPP $cs --tool memcheck --error-exitcode 9 $B/test_cuda_fp8_fused small
  run1 race_dw env MOE_FP8_CASE=13 $cs --tool racecheck --error-exitcode 9 $B/test_cuda_fp8_gemm
  run1 mem_dw env MOE_FP8_CASE=13 $cs --tool memcheck --error-exitcode 9 $B/test_cuda_fp8_gemm
  wait "${pids[@]}"
  for n in gemm gemm_old gemm_rpp fused fused_rpp ops ops_rpp racecheck memcheck race_dw mem_dw; do
    local rc=$(cat $W/$n.rc 2>/dev/null || echo none)
    say "== $n rc=$rc"
    row "test $n" "rc $rc; $(grep -E 'checks' $W/$n.log | tail -1); $(grep -c '^FAIL' $W/$n.log) FAIL lines $(grep -hE 'RACECHECK SUMMARY|ERROR SUMMARY' $W/$n.log | tail -1)"
    [ "$rc" = 0 ] || { FAIL=$((FAIL + 1)); grep -m6 FAIL $W/$n.log | tee -a $R; tail -3 $W/$n.log | tee -a $R; }
  done
  grep -h "band" $W/gemm.log | tee -a $R
}
tests

# 2. the same bits end to end (fp8_layer_check.sh's tiny model)
TINY="--steps 30 --batch 8 --seq-len 128 --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 256 --d-ff 256
  --n-experts 8 --top-k 2 --lr 1e-3 --warmup 5 --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0
  --save-every 0 --force --seed 3"
tiny() { t tiny_$1 40 env $2 $B/moe train --device cuda --precision fp8 $TINY --out $W/tiny_$1; need tiny_$1; }
L() { grep -o '"loss":[^,]*' $W/tiny_$1/metrics.jsonl 2>/dev/null | cut -d: -f2; }
same() { # A B LABEL: B's losses and final state against A's; status 0 where all the same
  local d=$(paste <(L $1) <(L $2) | awk '$1 != $2' | wc -l) n=$(L $2 | wc -l) f r=ok
  for f in model optimizer; do
    cmp -s $W/tiny_$1/step_00000030/$f.safetensors $W/tiny_$2/step_00000030/$f.safetensors || r="$f differs"
  done
  [ "$n" = 30 ] || r="$n losses"
  row "tiny fp8: $3" "$d of $n losses differ; $r"
  [ "$d" = 0 ] && [ "$r" = ok ]
}
tiny new X=1; tiny again X=1; tiny old $OLD; tiny rpp $RPP
same new again "the defaults twice (the control)" || say "the tiny run does not repeat itself"
same old new "new wgrad vs $OLD" || { FAIL=$((FAIL + 1)); say "FAILED: the new wgrad changed the bits"; }
same new rpp "$RPP vs the defaults" || { FAIL=$((FAIL + 1)); say "FAILED: $RPP changed the bits"; }

# 3. the layer, old / new / rows-pp
lay() { t layer_$1 45 env $2 $B/moe_bench_layer --cases ref,mixtral,olmoe --iters 10 --warmup 3 --profile 0 \
  --gemm 0 --fp8 1 --fp8-trace 1; need layer_$1; }
lay new X=1; lay old $OLD; lay rpp $RPP
say "-- the FP8 layer's GEMM kernels (ms summed over a step's calls / TFLOP/s), old | new | rows-pp; layer ms"
python3 - $W/layer_old.log $W/layer_new.log $W/layer_rpp.log <<'PY' | tee -a $R
import json, re, sys
def load(p):
    k, j, case, blk = {}, {}, None, None
    try: lines = open(p).read().splitlines()
    except OSError: return k, j
    for l in lines:
        m = re.match(r'^== (\w+):', l)
        if m: case = m.group(1); continue
        if l.startswith('fp8 kernels, '): blk = 'fwd' if 'forward' in l else 'bwd'; continue
        m = re.match(r'^  (gemm.*?)\s+(\d+)\s+([\d.]+)\s+[\d.]+\s+\d+\s+[\d.]+%\s+([\d.]+)', l)
        if m and case: k.setdefault((case, blk, m.group(1)), (float(m.group(3)), float(m.group(4))))
        if l.startswith('{'):
            try: e = json.loads(l)
            except ValueError: continue
            if 'case' in e: j[e['case']] = e
    return k, j
(ko, jo), (kn, jn), (kr, jr) = (load(p) for p in sys.argv[1:4])
f = lambda v: '%7.3f %6.0f' % v if v else '%14s' % '-'
print('%-8s %-4s %-30s %14s | %14s | %14s' % ('case', '', 'kernel', 'old ms  TF/s', 'new ms  TF/s', 'rows-pp'))
for key in sorted(set(ko) | set(kn), key=lambda x: (x[0], x[1] != 'fwd', x[2])):
    print('%-8s %-4s %-30s %s | %s | %s' % (key[0], key[1], key[2][:30], f(ko.get(key)), f(kn.get(key)), f(kr.get(key))))
g = lambda e, n: '%7.2f' % e[n] if n in e else '%7s' % '-'
print('%-8s %23s | %23s | %23s' % ('layer', 'old fwd+bwd fwd bwd', 'new', 'rows-pp'))
for c in sorted(set(jo) | set(jn)):
    o, n, r = jo.get(c, {}), jn.get(c, {}), jr.get(c, {})
    print('%-8s %s | %s | %s' % (c, ' '.join(g(o, x) for x in ('ms_fwd_bwd', 'ms_fwd', 'ms_bwd')),
          ' '.join(g(n, x) for x in ('ms_fwd_bwd', 'ms_fwd', 'ms_bwd')), ' '.join(g(r, x) for x in ('ms_fwd_bwd', 'ms_fwd', 'ms_bwd'))))
PY
for v in old new rpp; do
  row "layer fp8 $v (case ms_fwd_bwd ms_bwd)" "$(grep -hoE '"case":"[a-z0-9]+"|"ms_fwd_bwd":[0-9.]+|"ms_bwd":[0-9.]+' $W/layer_$v.log | cut -d: -f2 | tr -d '"' | paste -sd' ')"
done

# 4. the GEMMs alone (moe_bench_fp8: its dW shapes and the rows shapes)
gem() { t bench_$1 35 env $2 $B/moe_bench_fp8 --iters 5 --warmup 2; need bench_$1; }
gem new X=1; gem old $OLD
say "-- moe_bench_fp8: old, new"
for v in old new; do grep -hE "fp8" $W/bench_$v.log | grep -v SwiGLU | sed "s/^/$v  /" | tee -a $R; done

# 5. the bands' share (mixtral: 112 tile rows in dW1 and dW3)
t layer_noband 40 env MOE_FP8_WGRAD_BAND=0 $B/moe_bench_layer --cases mixtral --iters 10 --warmup 3 --profile 0 \
  --gemm 0 --fp8 1 --fp8-trace 1 && need layer_noband
say "-- mixtral's wgrad kernel row: new, MOE_FP8_WGRAD_BAND=0 (the ping-pong alone), old"
for v in new noband old; do
  awk -v v=$v '/^== /{c=$2} c == "mixtral:" && /^  gemm wgrad/ && !n++ {print v ": " $0}' $W/layer_$v.log | tee -a $R
done

say ""
say "== summary (fp8_wgrad_ab.sh, $(date -u), ${SECONDS}s, $FAIL failures)"
for r in "${S[@]}"; do say "$r"; done
tar -C $W -czf ${OUT:-$W}/logs.tgz $(cd $W && ls *.log) 2>/dev/null
[ $FAIL = 0 ]
