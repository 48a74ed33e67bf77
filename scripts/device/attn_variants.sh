#!/bin/bash
# Device recipe: several attention-backward variants against one base build in one call (attn_bwd_ab.sh
# does one variant in depth; this one screens several, for the scarce device time). Prepare here with
# `bash pending/pack_attn.sh SERIES...` (main's build and each pending series' programs in .gpk), then call
# `bash scripts/device/attn_variants.sh` with carry [".gpk"] (about a minute a variant; BUDGET seconds).
# For the base (main's build, .gpu/bin) and each variant (.gpa/SERIES/):
#   1. test_cuda_ops's small shapes with MOE_TEST_ATT_BITS (a hash of each backward result): the checks and
#      every result's bits against the base's; test_cuda_attn_mla where the variant touches latent attention;
#   2. moe_bench_attention's backward at T 2048 (B 4), 8192 and 16384 (B 1), 16 / 8 heads of 128, and latent
#      attention's 128 heads of 192 / 128 at T 4096: base and variants in turn, twice, ms;
#   3. memcheck (the dS scratch forced into key ranges) and racecheck of two small shapes.
# Output: $OUT/attn_variants.txt. Exit 1 when a test fails, bits differ, or a sanitizer reports in our kernels.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start attn_variants 540
for f in .gpk/attn_*.tar.xz; do [ -f "$f" ] && tar -xJf "$f"; done
VARS=$(ls -d .gpa/*/ 2>/dev/null | xargs -n1 basename)
[ -n "$VARS" ] || { say "no variants in .gpa (pending/pack_attn.sh)"; exit 1; }
dir() { [ "$1" = base ] && echo $B || echo $PWD/.gpa/$1; }
say "variants: $VARS"
for v in base $VARS; do
  t bits_$v 60 env MOE_TEST_ATT_BITS=$W/bits_$v.txt MOE_TEST_SMALL=1 MOE_TEST_BACKEND=cuda $(dir $v)/test_cuda_ops
  test_line bits_$v
  [ $v = base ] && continue
  if cmp -s $W/bits_base.txt $W/bits_$v.txt && [ -s $W/bits_$v.txt ]; then
    say "   $v: $(wc -l < $W/bits_$v.txt) backward results the same bits as base's"
  else
    say "   $v: backward results DIFFER from base's ($(diff $W/bits_base.txt $W/bits_$v.txt | grep -c '^>') of $(wc -l < $W/bits_base.txt))"
    FAIL=1
  fi
  if [ -x $(dir $v)/test_cuda_attn_mla ]; then
    t mla_$v 90 env MOE_TEST_BACKEND=cuda $(dir $v)/test_cuda_attn_mla; test_line mla_$v
  fi
done
for c in 4:2048:16:8:128 1:8192:16:8:128 1:16384:16:8:128 1:4096:128:128:192; do
  IFS=: read -r b T H KV hd <<< "$c"
  A="--device cuda --B $b --T $T --H $H --KV $KV --hd $hd --iters 10"
  [ $hd = 192 ] && A="$A --hv 128"
  line="T $T hd $hd bwd ms:"
  for r in 1 2; do
    for v in base $VARS; do
      ms=$(timeout 40 $(dir $v)/moe_bench_attention $A 2>/dev/null | grep -o '"bwd_ms": [0-9.]*' | cut -d' ' -f2)
      line="$line $v ${ms:-?}"
    done
  done
  say "$line"
done
S="--device cuda --hd 128 --iters 1"
for v in $VARS; do
  t mem_$v 60 env MOE_ATTN_DS_MB=1 compute-sanitizer --tool memcheck $(dir $v)/moe_bench_attention $S --B 2 --T 600 --H 6 --KV 3 &&
    san_line mem_$v
  t race_$v 60 compute-sanitizer --tool racecheck $(dir $v)/moe_bench_attention $S --B 1 --T 700 --H 2 --KV 1 &&
    san_line race_$v
done
say "$(date -u) done: $([ $FAIL = 0 ] && echo 'every check passed' || echo 'FAILURES above')"
exit $FAIL
