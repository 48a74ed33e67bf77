#!/bin/bash
# fp8_layer_check.sh — where the FP8 MoE layer's time goes (issue 38), one call under 5 minutes (BUDGET,
# default 285 s). Prepare here: `cmake --build build -j2 && bash scripts/device/mesh_pack.sh .gpum &&
# cp ../shared/bench/torch_moe_peer.py ../shared/bench/torch_moe_fp8_peer.py .gpum/`, then call
# `bash scripts/device/fp8_layer_check.sh` with carry [".gpum"] and timeout_s 330. Steps (each bounded by what
# is left of BUDGET; a step without time is reported skipped):
#   1. the same bits: tests/test_cuda_fp8_quant (the quantisers against the host reference: the shared row
#      tile helper), tests/test_cuda_fp8_fused (fused against unfused, bit for bit, the new epilogue GEMMs among
#      them) as it is, with MOE_FP8_PAIR_SCALE=0 and with MOE_FP8_GEMM=ref, tests/test_cuda_fp8_ops (the
#      tables against the cpu's fp8 table), and compute-sanitizer memcheck on test_cuda_fp8_fused's small
#      cases, all at once (they only check values);
#   2. the MoE layer forward + backward on every moe_bench_layer shape: ours on cuda (bf16) and on its FP8
#      table, the forward and backward apart, and the FP8 table's kernels each timed alone (--fp8-trace: GB/s
#      and TFLOP/s per kernel against 4.8 TB/s and 1,300 TFLOP/s), then the torch peers in the same call
#      (torch._grouped_mm bf16: bench/torch_moe_peer_cases.py; torch._scaled_grouped_mm e4m3:
#      torch_moe_fp8_peer.py), and the table against the issue's targets (fp8 <= 0.65x our bf16 on mixtral and
#      ref; faster than the torch FP8 peer on every shape);
#   3. the same bits of a whole run: a tiny model 30 steps under fp8 with the defaults (twice: the control)
#      and with each switch, its losses and final model and optimizer state byte for byte;
#   4. the fused SwiGLU GEMM alone against the plain FP8 GEMMs + the separate SwiGLU (moe_bench_fp8
#      --swiglu-only 1), with one weight scale per 64 columns (the default) and per column
#      (MOE_FP8_PAIR_SCALE=0);
#   5. the layer A/B on ref and mixtral: MOE_FP8_FUSE=0 (two GEMMs, then the SwiGLU), MOE_FP8_PAIR_SCALE=0;
#   6. Nsight Compute where it is on the device (`which nsys ncu`): the FP8 ref layer's kernels, time and DRAM
#      bytes each.
# Fails (non-zero exit) on any test failure or a bench that does not finish; the targets are reported, not
# enforced. Everything also goes to $OUT/fp8_layer.txt, the logs to $OUT/logs.tgz.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && mesh_unpack $PWD/${GPUM:-.gpum} /tmp/fp8layer
P=$PWD/${GPUM:-.gpum} # (the torch peers, copied beside the package)
W=/tmp/fp8layer_w; rm -rf $W; mkdir -p $W; R=${OUT:-$W}/fp8_layer.txt; : > $R
export OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1 BUDGET=${BUDGET:-285}
say "$(date -u) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
say "profilers: $(which nsys ncu 2>/dev/null | tr '\n' ' ')"
FAIL=0 S=()
row() { S+=("$(printf '%-48s %s' "$1" "$2")"); }
st() { grep -oE "^== $1 rc=[0-9]+" $R | tail -1 | sed 's/.*rc=//'; } # NAME's exit status (t's line)
need() { [ "$(st $1)" = 0 ] || { FAIL=$((FAIL + 1)); say "FAILED: $1 (rc $(st $1))"; }; }
CASES=mixtral,olmoe,small,ref,qwen2,qwen2s,e256

# 1. the tests, at once (values only: they need not run alone); OMP threads shared
tests() {
  local l=$((BUDGET - SECONDS - 170)) pids=() n
  [ $l -gt 110 ] && l=110
  [ $l -lt 60 ] && l=60
  run1() { local n=$1; shift; (timeout $l env OMP_NUM_THREADS=2 "$@" > $W/$n.log 2>&1; echo $? > $W/$n.rc) & pids+=($!); }
  run1 quant $B/test_cuda_fp8_quant
  run1 fused $B/test_cuda_fp8_fused
  run1 fused_cols env MOE_FP8_PAIR_SCALE=0 $B/test_cuda_fp8_fused
  run1 fused_ref env MOE_FP8_GEMM=ref $B/test_cuda_fp8_fused
  run1 ops $B/test_cuda_fp8_ops
  local cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  run1 memcheck $cs --tool memcheck --error-exitcode 9 $B/test_cuda_fp8_fused small
  wait "${pids[@]}"
  for n in quant fused fused_cols fused_ref ops memcheck; do
    local rc=$(cat $W/$n.rc 2>/dev/null || echo none)
    say "== $n rc=$rc"
    row "test $n" "rc $rc; $(grep -E 'checks' $W/$n.log | tail -1); $(grep -c '^FAIL' $W/$n.log) FAIL lines $(grep -hE 'ERROR SUMMARY' $W/$n.log | tail -1)"
    [ "$rc" = 0 ] || { FAIL=$((FAIL + 1)); grep -m6 FAIL $W/$n.log | tee -a $R; tail -3 $W/$n.log | tee -a $R; }
  done
}
tests

# 2. the layer: ours (bf16, fp8 with the per-kernel trace), then the peers
t layer_bf16 60 $B/moe_bench_layer --cases $CASES --iters 10 --warmup 3 --profile 1 --gemm 0; need layer_bf16
t layer_fp8 80 $B/moe_bench_layer --cases $CASES --iters 10 --warmup 3 --profile 1 --gemm 0 --fp8 1 --fp8-trace 1
need layer_fp8
# every case's op and kernel tables into the file; ref's fp8 ones here too
grep -hvE '^\{' $W/layer_bf16.log $W/layer_fp8.log >> $R
awk '/^== /{p = ($2 == "ref:")} p' $W/layer_fp8.log
if [ -f $P/torch_moe_peer.py ] && [ -f $P/torch_moe_fp8_peer.py ]; then
  t peer_bf16 70 python3 bench/torch_moe_peer_cases.py $P/torch_moe_peer.py $CASES; need peer_bf16
  t peer_fp8 90 python3 $P/torch_moe_fp8_peer.py mixtral,olmoe,small,ref,qwen2,e256; need peer_fp8
else
  say "FAILED: the torch peers are not in $P (cp ../shared/bench/torch_moe_peer.py ../shared/bench/torch_moe_fp8_peer.py $P/)"
  FAIL=$((FAIL + 1))
fi
say "-- the MoE layer forward + backward, ms (median of 10; the targets: issue 38)"
python3 - $W/layer_bf16.log $W/layer_fp8.log $W/peer_bf16.log $W/peer_fp8.log <<'PY' | tee -a $R
import json, sys
def load(p, key=None):
    out = {}
    try:
        for l in open(p):
            if l.startswith('{'):
                try: j = json.loads(l)
                except ValueError: continue
                if 'case' in j and 'ms_fwd_bwd' in j: out[j['case']] = j
    except OSError: pass
    return out
ob, of, tb, tf = (load(p) for p in sys.argv[1:5])
f = lambda v: '%8.2f' % v if v else '%8s' % '-'
print('%-8s %8s %8s %8s %8s %8s %8s | %9s %9s %s' % ('case', 'bf16', 'fp8', 'fp8 fwd', 'fp8 bwd', 'torch16', 'torch8',
                                                   'fp8/bf16', 'fp8/t8', 'targets'))
for c in ['mixtral', 'olmoe', 'small', 'ref', 'qwen2', 'qwen2s', 'e256']:
    b = ob.get(c, {}).get('ms_fwd_bwd'); e = of.get(c, {}); x = e.get('ms_fwd_bwd')
    p16 = tb.get(c, {}).get('ms_fwd_bwd'); p8 = tf.get(c, {}).get('ms_fwd_bwd')
    r1 = x / b if x and b else None; r2 = x / p8 if x and p8 else None
    tg = []
    if c in ('mixtral', 'ref') and r1: tg.append('<=0.65x bf16: ' + ('yes' if r1 <= 0.65 else 'NO'))
    if r2: tg.append('< torch fp8: ' + ('yes' if r2 < 1 else 'NO'))
    print('%-8s %s %s %s %s %s %s | %9s %9s %s' % (c, f(b), f(x), f(e.get('ms_fwd')), f(e.get('ms_bwd')), f(p16), f(p8),
          '%.3fx' % r1 if r1 else '-', '%.3fx' % r2 if r2 else '-', ', '.join(tg)))
fw = {c: (ob.get(c, {}).get('ms_fwd'), ob.get(c, {}).get('ms_bwd')) for c in ob}
print('ours bf16 fwd / bwd: ' + ', '.join('%s %.2f / %.2f' % (c, a, b) for c, (a, b) in fw.items() if a))
PY
row "layer: fp8 / bf16 (ref, mixtral)" "$(grep -E '^(ref|mixtral) ' $R | tail -2 | awk '{printf "%s %s  ", $1, $9}')"
row "layer: fp8 / torch fp8 (every shape)" "$(grep -cE '< torch fp8: yes' $R) yes, $(grep -cE '< torch fp8: NO' $R) NO"

# 3. the same bits end to end: a tiny model 30 steps under fp8 (the weights move each step: the kept codes are
# made again), the defaults twice (the control: is a run repeatable?) and each switch; losses and the final
# model and optimizer state byte for byte
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
tiny base MOE_FP8_FUSE=1; tiny again MOE_FP8_FUSE=1
tiny nofuse MOE_FP8_FUSE=0; tiny cols MOE_FP8_PAIR_SCALE=0
if same base again "the defaults twice (the control)"; then
  for v in "nofuse MOE_FP8_FUSE=0" "cols MOE_FP8_PAIR_SCALE=0"; do
    set -- $v
    same base $1 "$2 vs the defaults" || { FAIL=$((FAIL + 1)); say "FAILED: $2 changed the bits of the tiny run"; }
  done
else
  say "the tiny run does not repeat itself: the switches' runs are not judged"
  for v in nofuse cols; do same base $v "$v vs the defaults (not judged)"; done
fi

# 4. the fused SwiGLU GEMM alone against what it replaced
t swiglu 60 $B/moe_bench_fp8 --swiglu-only 1; need swiglu
t swiglu_cols 60 env MOE_FP8_PAIR_SCALE=0 $B/moe_bench_fp8 --swiglu-only 1; need swiglu_cols
say "-- the up projections with the SwiGLU (moe_bench_fp8; the fused rows by MOE_FP8_PAIR_SCALE 1, then 0)"
grep -h swiglu $W/swiglu.log | tee -a $R
grep -h "SwiGLU fused" $W/swiglu_cols.log | sed 's/$/   (a scale per column)/' | tee -a $R
row "ref-swiglu fused / 2 GEMMs + SwiGLU (ms)" "$(awk '/ref-swiglu.*fused \+ act/{a=$(NF-3)} /ref-swiglu.*2 GEMMs/{b=$(NF-3)} END{print a " / " b}' $W/swiglu.log)"

# 5. the layer A/B of the switches
ab() { # NAME ENV: ref and mixtral on the FP8 table under ENV
  t ab_$1 50 env $2 $B/moe_bench_layer --cases ref,mixtral --iters 10 --warmup 3 --profile 0 --gemm 0 --fp8 1 \
    --fp8-trace 1; need ab_$1
  row "layer fp8 $2 (ref, mixtral ms)" "$(grep -oE '"case":"[a-z]+"|"ms_fwd_bwd":[0-9.]+|"ms_fwd":[0-9.]+' $W/ab_$1.log | cut -d: -f2 | tr -d '"' | paste -sd' ')"
}
ab nofuse MOE_FP8_FUSE=0
ab cols MOE_FP8_PAIR_SCALE=0
row "layer fp8 default (ref, mixtral ms)" "$(grep -E '"case":"(ref|mixtral)"' $W/layer_fp8.log | grep -oE '"case":"[a-z]+"|"ms_fwd_bwd":[0-9.]+|"ms_fwd":[0-9.]+' | cut -d: -f2 | tr -d '"' | paste -sd' ')"

# 6. Nsight Compute's view of the FP8 ref layer (one warm-up + one timed iteration), where ncu is here
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null)
if [ -n "$NCU" ] && [ $((BUDGET - SECONDS)) -gt 60 ]; then
  t ncu $((BUDGET - SECONDS - 15)) $NCU --clock-control none --kernel-name regex:'gf_|quant|swiglu' \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
    $B/moe_bench_layer --cases ref --iters 1 --warmup 1 --profile 0 --gemm 0 --fp8 1
  say "-- ncu, the FP8 ref layer (per kernel name: us a call, DRAM GB/s; the warm-up and the timed iteration)"
  python3 - $W/ncu.log <<'PY' | tee -a $R
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1], errors='replace')))
hs = [i for i, r in enumerate(rows) if 'Kernel Name' in r and 'Metric Value' in r]
if not hs: sys.exit(print('  (no ncu rows)'))
h = rows[hs[0]]; rows = [r for r in rows[hs[0]:] if len(r) == len(h)]; ki, mi, vi, ui = h.index('Kernel Name'), h.index('Metric Name'), h.index('Metric Value'), h.index('Metric Unit')
unit = {'ns': 1e-3, 'nsecond': 1e-3, 'us': 1, 'usecond': 1, 'ms': 1e3, 'msecond': 1e3, 'byte': 1, 'Kbyte': 1e3, 'Mbyte': 1e6, 'Gbyte': 1e9}
agg = collections.defaultdict(lambda: collections.defaultdict(float)); cnt = collections.Counter()
for r in rows[1:]:
    try: v = float(r[vi].replace(',', '')) * unit.get(r[ui], 1)
    except ValueError: continue
    n = r[ki].split('(')[0][:48]; agg[n][r[mi]] += v
    if r[mi] == 'gpu__time_duration.sum': cnt[n] += 1
for n, m in sorted(agg.items(), key=lambda x: -x[1]['gpu__time_duration.sum'])[:16]:
    t = m['gpu__time_duration.sum']; b = m['dram__bytes_read.sum'] + m['dram__bytes_write.sum']
    print('  %-48s %5d calls %9.1f us/call %7.0f GB/s' % (n, cnt[n], t / max(cnt[n], 1), b / t / 1e3 if t else 0))
PY
else
  say "== ncu skipped ($([ -n "$NCU" ] && echo time || echo 'not on the device'))"
fi

say ""
say "== summary (fp8_layer_check.sh, $(date -u), ${SECONDS}s, $FAIL failures)"
for r in "${S[@]}"; do say "$r"; done
tar -C $W -czf ${OUT:-$W}/logs.tgz $(cd $W && ls *.log) 2>/dev/null
[ $FAIL = 0 ]
