#!/bin/bash
# Device recipe (kind nvidia-h200): issue 38's attention backward at 16k-32k tokens with the dS scratch in
# passes over key ranges (ops.h attention_ds_bytes / attention_ds_range_end: two kv heads over the key tiles
# that fit MOE_ATTN_DS_MB, where not two whole pairs fit), in one call from the repository root:
# `bash scripts/device/attn_keyrange.sh` (no carry: it builds; or B=DIR of programs packed by mesh_pack.sh and
# unpacked by libs.sh mesh_unpack; under 8 minutes, BUDGET=seconds to change;
# progress, counts and the tables in $OUT/attn_keyrange.txt). In order of what matters most:
#   1. cmake with CUDA for sm_90a into build-kr (test_cuda_ops, moe_bench_attention);
#   2. tests/test_cuda_attn_passes.sh: test_cuda_ops under MOE_ATTN_DS_MB=1 (key ranges at T 600, 700, 1000
#      and chunks; passes over kv heads at T 500; dS again at T 4097) against the cpu reference, and its
#      backward results' bits against the default cap's one pass (MOE_TEST_ATT_BITS);
#   3. causal GQA 16 / 8 heads, head dim 128, B 1, T 8192, 16384, 32768: moe_bench_attention (key ranges at
#      16k and 32k), the same with MOE_ATTN_DS_MB=0 (dS computed again: the path those lengths took before)
#      and torch_attention_peer.py (SDPA); at 16k and 32k also caps of 2048 and 4096 MiB (fewer, wider
#      passes); one table of forward and backward ms (TFLOP/s), forward + backward against SDPA's;
#   4. compute-sanitizer memcheck on two forced key-range cases (moe_bench_attention, MOE_ATTN_DS_MB=1: T 600
#      of 3 kv heads, B 2; T 700 of one kv head);
#   5. test_cuda_ops on "cuda" with the default cap (the attention lines printed);
#   6. ncu: each attention kernel's time at T 16384 (summed over the call's 4 iterations: 3 warm-up, 1 timed).
# Ends non-zero when a build, test or timed program fails, or memcheck reports in our kernels.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh
recipe_open attn_keyrange /tmp/kr 460
say "tree: $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)') $(git status --short 2>/dev/null | wc -l) changed"
B=${B:-$PWD/build-kr} # B=DIR: programs built here and packed (mesh_pack.sh, mesh_unpack): no build
[ -x $B/test_cuda_ops ] && [ -x $B/moe_bench_attention ] ||
  t build 300 bash -c "cmake -S . -B $B -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a &&
    cmake --build $B -j16 --target moe test_cuda_ops moe_bench_attention" ||
  true
[ -x $B/test_cuda_ops ] && [ -x $B/moe_bench_attention ] || { tail -30 $W/build.log | tee -a $R; exit 1; }
device_libs $B $B/test_cuda_ops

t passes 150 env MOE_BIN=$B/moe bash tests/test_cuda_attn_passes.sh
grep -E "checks, [0-9]+ failed|bit for bit|FAIL" $W/passes.log | head -12 | tee -a $R
grep -q "differ$" $W/passes.log && grep -q ", 0 differ" $W/passes.log && grep -q "checks, 0 failed" $W/passes.log ||
  FAIL=1

A="--device cuda --B 1 --H 16 --KV 8 --hd 128 --iters 10"
for T in 8192 16384 32768; do
  timed kr_$T 40 $B/moe_bench_attention $A --T $T
  timed re_$T 40 env MOE_ATTN_DS_MB=0 $B/moe_bench_attention $A --T $T
  timed sdpa_$T 60 python3 bench/torch_attention_peer.py 1 $T 16 8 128
done
for T in 16384 32768; do
  for cap in 2048 4096; do timed c${cap}_$T 40 env MOE_ATTN_DS_MB=$cap $B/moe_bench_attention $A --T $T; done
done
python3 - $W <<'PY' | tee -a $R
import sys
sys.path.insert(0, 'scripts/device')
from attn_rows import cell as f, row as row_in
w = sys.argv[1]
row = lambda name: row_in(w, name)
print('%6s %-22s %14s %14s %10s' % ('T', 'way', 'fwd ms (TF/s)', 'bwd ms (TF/s)', 'total/SDPA'))
for T in (8192, 16384, 32768):
    s = row('sdpa_%d' % T)
    for name, way in (('kr', 'ours (default cap)'), ('re', 'ours, dS again (cap 0)'), ('c2048', 'ours, cap 2048'),
                      ('c4096', 'ours, cap 4096'), ('sdpa', 'SDPA')):
        r = row('%s_%d' % (name, T))
        if not r: continue
        tot = '%10.3f' % ((r['fwd_ms'] + r['bwd_ms']) / (s['fwd_ms'] + s['bwd_ms'])) if s else '%10s' % '-'
        print('%6d %-22s %14s %14s %s' % (T, way, f(r, 'fwd'), f(r, 'bwd'), tot))
print('(total/SDPA: forward + backward over SDPA\'s; issue 38\'s target <= 0.9)')
PY

S="--device cuda --hd 128 --iters 1"
t mem1 90 env MOE_ATTN_DS_MB=1 compute-sanitizer --tool memcheck $B/moe_bench_attention $S --B 2 --T 600 --H 6 --KV 3 &&
  san_line mem1
t mem2 90 env MOE_ATTN_DS_MB=1 compute-sanitizer --tool memcheck $B/moe_bench_attention $S --B 1 --T 700 --H 2 --KV 1 &&
  san_line mem2

t ops 150 env MOE_TEST_BACKEND=cuda $B/test_cuda_ops
test_line ops
grep -E "^attention" $W/ops.log | tee -a $R

t ncu 100 ncu --clock-control none -k regex:'att_|rowdot' --metrics gpu__time_duration.sum --csv \
  $B/moe_bench_attention --device cuda --B 1 --T 16384 --H 16 --KV 8 --hd 128 --iters 1
python3 - $W/ncu.log <<'PY' | tee -a $R
import sys, collections
sys.path.insert(0, 'scripts/device')
from ncu_rows import rows, time_us
tot, cnt = collections.OrderedDict(), collections.Counter()
for k, m, v, u in rows(sys.argv[1]):
    tot[k] = tot.get(k, 0.0) + time_us(v, u); cnt[k] += 1
for n, v in tot.items():
    print('ncu T 16384: %-40s %4d launches, %10.1f us in all, %9.1f us an iteration' % (n[:40], cnt[n], v, v / 4))
if not tot: print('ncu: no kernel rows')
PY
say "$(date -u) done: $([ $FAIL = 0 ] && echo 'every check passed' || echo 'FAILURES above')"
exit $FAIL
