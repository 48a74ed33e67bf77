#!/bin/bash
# Device recipe (kind nvidia-h200): the attention backward of one build against the build before it (a
# kernel change that keeps the bits), in one call from the repository root: `OLD=DIR NEW=DIR bash
# scripts/device/attn_bwd_ab.sh` (each DIR a bin/ of moe, test_cuda_ops, test_cuda_attn_mla and
# moe_bench_attention with its libraries on LD_LIBRARY_PATH, e.g. two mesh_pack.sh packages unpacked; under
# 9 minutes, BUDGET=seconds; progress, counts and the tables in $OUT/attn_bwd_ab.txt). In order of what
# matters most:
#   1. the bits: test_cuda_ops's small shapes (MOE_TEST_SMALL=1, MOE_TEST_ATT_BITS: a hash of each backward
#      result where dS is kept) from both binaries: every result the same bits; test_cuda_attn_mla (new);
#   2. tests/test_cuda_attn_passes.sh (key ranges under a 1 MiB cap against the cpu reference and against one
#      pass's bits) with the new binaries;
#   3. racecheck and memcheck of key-range and passes cases (new);
#   4. causal GQA 16 / 8 heads, head dim 128, T 2048 (B 4) .. 32768 (B 1), and latent attention's 128 heads of
#      192 / 128 at T 4096: moe_bench_attention old and new alternating twice, forward and backward ms;
#   5. ncu: the dk/dv and dq kernels' times and DRAM bytes at T 8192, old and new.
# Ends non-zero when a test or timed program fails, bits differ, or a sanitizer reports in our kernels.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh
recipe_open attn_bwd_ab /tmp/ab 540
OLD=${OLD:?OLD=DIR} NEW=${NEW:?NEW=DIR}

for v in OLD NEW; do
  d=${!v}
  t bits_$v 120 env MOE_TEST_ATT_BITS=$W/bits_$v.txt MOE_TEST_SMALL=1 MOE_TEST_BACKEND=cuda $d/test_cuda_ops
  test_line bits_$v
done
awk 'FNR == 1 { f++ } { k = $1 "#" (++n[f, $1]) } f == 1 { a[k] = $2; next } k in a { c++
       if (a[k] != $2) { bad++; if (bad < 6) print "FAIL: bits differ, new against old:", k } }
     END { printf "bits: %d backward results compared, %d differ\n", c, bad; exit (bad > 0 || c < 30) }' \
  $W/bits_OLD.txt $W/bits_NEW.txt | tee -a $R
[ ${PIPESTATUS[0]} = 0 ] || FAIL=1
t mla 150 env MOE_TEST_BACKEND=cuda $NEW/test_cuda_attn_mla
test_line mla

t passes 150 env MOE_BIN=$NEW/moe bash tests/test_cuda_attn_passes.sh
grep -E "checks, [0-9]+ failed|bit for bit|FAIL" $W/passes.log | head -12 | tee -a $R
grep -q ", 0 differ" $W/passes.log && grep -q "checks, 0 failed" $W/passes.log || FAIL=1

S="--device cuda --hd 128 --iters 1"
t race1 120 env MOE_ATTN_DS_MB=1 compute-sanitizer --tool racecheck $NEW/moe_bench_attention $S --B 1 --T 700 --H 2 --KV 1 &&
  san_line race1
t race2 120 env MOE_ATTN_DS_MB=1 compute-sanitizer --tool racecheck $NEW/moe_bench_attention $S --B 2 --T 600 --H 6 --KV 3 &&
  san_line race2
t mem1 90 env MOE_ATTN_DS_MB=1 compute-sanitizer --tool memcheck $NEW/moe_bench_attention $S --B 2 --T 600 --H 6 --KV 3 &&
  san_line mem1
t mem2 90 compute-sanitizer --tool memcheck $NEW/moe_bench_attention $S --B 2 --T 333 --H 4 --KV 2 && san_line mem2

for c in 4:2048:16:8:128 2:4096:16:8:128 1:8192:16:8:128 1:16384:16:8:128 1:32768:16:8:128 1:4096:128:128:192; do
  IFS=: read -r b T H KV hd <<< "$c"
  A="--device cuda --B $b --T $T --H $H --KV $KV --hd $hd --iters 10"
  [ $hd = 192 ] && A="$A --hv 128"
  for r in a b; do
    timed old${r}_${T}_$hd 40 $OLD/moe_bench_attention $A
    timed new${r}_${T}_$hd 40 $NEW/moe_bench_attention $A
  done
done
python3 - $W <<'PY' | tee -a $R
import sys
sys.path.insert(0, 'scripts/device')
from attn_rows import cell as f, row as row_in
w = sys.argv[1]
print('%6s %4s %-8s %14s %14s' % ('T', 'hd', 'way', 'fwd ms (TF/s)', 'bwd ms (TF/s)'))
for T, hd in ((2048, 128), (4096, 128), (8192, 128), (16384, 128), (32768, 128), (4096, 192)):
    for name in ('olda', 'newa', 'oldb', 'newb'):
        r = row_in(w, '%s_%d_%d' % (name, T, hd))
        if r: print('%6d %4d %-8s %14s %14s' % (T, hd, name[:3], f(r, 'fwd'), f(r, 'bwd')))
PY

for v in OLD NEW; do
  d=${!v}
  t ncu_$v 60 ncu --clock-control none -k regex:'att_wg_dqs|att_wg_dkdv' \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
    --csv $d/moe_bench_attention --device cuda --B 1 --T 8192 --H 16 --KV 8 --hd 128 --iters 1
  python3 - $W/ncu_$v.log $v <<'PY' | tee -a $R
import sys, collections
sys.path.insert(0, 'scripts/device')
from ncu_rows import rows, time_us
val = collections.defaultdict(list) # (times in ns; bytes as ncu's --csv prints them, in bytes)
for k, m, v, u in rows(sys.argv[1]):
    val[(k[:24], m)].append(time_us(v, u) * 1e3 if m == 'gpu__time_duration.sum' else v)
for k in sorted({k for k, _ in val}):
    t, rd, wr = (val.get((k, m), [0]) for m in ('gpu__time_duration.sum', 'dram__bytes_read.sum', 'dram__bytes_write.sum'))
    print('ncu T 8192 %s: %-24s %8.1f us a launch (%d), DRAM read %.2f, write %.2f TB/s' % (sys.argv[2], k,
          sum(t) / len(t) / 1e3, len(t), sum(rd) / sum(t) / 1e3, sum(wr) / sum(t) / 1e3))
if not val: print('ncu %s: no rows' % sys.argv[2])
PY
done
say "$(date -u) done: $([ $FAIL = 0 ] && echo 'every check passed' || echo 'FAILURES above')"
exit $FAIL
