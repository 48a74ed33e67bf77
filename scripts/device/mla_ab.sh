#!/bin/bash
# Device recipe (kind nvidia-h200): latent attention's kernels (issue 40) in one call: the backward's new
# kernels of cuda_attention_mla.cu against the old ones of cuda_attention_wg.cu (MOE_ATTN_MLA=old), and the
# forward on 128-key tiles (cuda_attention_wgf.cu at 192 / 128) against the 64-key kernel (MOE_ATTN_FWD_OLD=1).
# Builds nothing. Prepare here: cmake --build build (CUDA on), `bash scripts/device/mesh_pack.sh .gpum`; then
# `bash scripts/device/mla_ab.sh` with carry [".gpum"] (about 4 minutes; BUDGET=seconds, default 300, skips
# the steps that would pass it; progress, counts and the table in $OUT/mla_ab.txt). In order of what matters:
#   1. test_cuda_attn_mla: every way of the backward (the default, the dS scratch in one pass and in passes
#      of kv heads, dS again, the old kernels) against bf16_ref.h and the float32 cpu, and the ways that
#      must agree bit for bit, and the forward's edge cases; then the same with MOE_ATTN_FWD_OLD=1 (the
#      64-key forward, bf16_ref.h modelling its tiles);
#   2. moe_bench_attention at B 1, H 128, hd 192 / hv 128, T 4096: new (MOE_ATTN_MLA, MOE_ATTN_FWD_OLD unset),
#      old fwd (MOE_ATTN_FWD_OLD=1), then old (MOE_ATTN_MLA=old: the old backward, the new forward);
#   3. compute-sanitizer racecheck on test_cuda_attn_mla (MOE_TEST_SMALL=1: the new kernels' ways);
#   4. the same bench at T 2048 and 8192 (new, old fwd, old), and at 4096 MOE_ATTN_MLA=recompute (the new dk/dv kernel,
#      dS again); memcheck as 3;
#   5. ncu's per-kernel times at T 4096, new and old; test_cuda_ops (MOE_TEST_SMALL=1: head dim 128 as before).
# The table: fwd / bwd / total ms per T and way, new / old, and the issue's milestones at T 4096 against the
# peers' times of docs/PERFORMANCE.md (SDPA with v padded 8.098 ms, SDPA 5.309 ms; not measured here).
# Ends non-zero when a test or a timed program fails, or a sanitizer reports in our kernels (san_line:
# third-party reports, cuBLAS's, are listed, not failed).
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh
X=/tmp/mlaab
W=/tmp/mlaabw
rm -rf $W
mkdir -p $X $W
mesh_unpack $PWD/${GPUM:-.gpum} $X
R=${OUT:-$W}/mla_ab.txt
: > $R
export OMP_NUM_THREADS=16
BUDGET=${BUDGET:-300}
say "$(date -u) $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader 2>/dev/null)"
FAIL=0
bench() { # bench WAY T: moe_bench_attention under MOE_ATTN_MLA=WAY ("new": unset; "oldfwd": unset with
  # MOE_ATTN_FWD_OLD=1); its JSON line tagged
  local way=$1 T=$2 e=
  [ "$way" != new ] && e="MOE_ATTN_MLA=$way"
  [ "$way" = oldfwd ] && e="MOE_ATTN_FWD_OLD=1"
  t b_${way}_$T 60 env $e $B/moe_bench_attention --device cuda --B 1 --T $T --H 128 --KV 128 --hd 192 --hv 128 \
    --iters 10 || return 0
  grep -q '"impl"' $W/b_${way}_$T.log || { FAIL=1; tail -3 $W/b_${way}_$T.log | tee -a $R; return 0; }
  grep '"impl"' $W/b_${way}_$T.log | sed "s/^{/{\"way\": \"$way\", /" >> $W/rows.jsonl
}

t mla 90 $B/test_cuda_attn_mla && test_line mla
grep -E "^latent|worst per element|old kernels the same bits" $W/mla.log | tee -a $R
t mla_oldfwd 90 env MOE_ATTN_FWD_OLD=1 $B/test_cuda_attn_mla && test_line mla_oldfwd
grep -E "^latent|worst per element" $W/mla_oldfwd.log | tee -a $R
: > $W/rows.jsonl
bench new 4096
bench oldfwd 4096
bench old 4096
t race 100 env MOE_TEST_SMALL=1 compute-sanitizer --tool racecheck $B/test_cuda_attn_mla && san_line race
for T in 2048 8192; do bench new $T; bench oldfwd $T; bench old $T; done
bench recompute 4096
t mem 60 env MOE_TEST_SMALL=1 compute-sanitizer --tool memcheck $B/test_cuda_attn_mla && san_line mem
for way in new old; do
  e=; [ $way = old ] && e="MOE_ATTN_MLA=old"
  t ncu_$way 30 env $e ncu --clock-control none -k regex:'att_|rowdot' --metrics gpu__time_duration.sum \
    $B/moe_bench_attention --device cuda --B 1 --T 4096 --H 128 --KV 128 --hd 192 --hv 128 --iters 1 || continue
  # the timed call's kernels (the last quarter: the bench runs 3 untimed calls first): name, time, unit
  say "   $way kernels at T 4096 (the timed call): $(awk '/att_|rowdot/ && !/gpu__time/ {
    match($0, /[a-z0-9_]*(att_|rowdot)[a-z0-9_]*(<[0-9, ]*>)?/); n = substr($0, RSTART, RLENGTH) }
    /gpu__time_duration/ { k++; nm[k] = n; u[k] = $(NF - 1); v[k] = $NF }
    END { for (i = k - int(k / 4) + 1; i <= k; i++) printf "%s %s %s; ", nm[i], v[i], u[i] }' $W/ncu_$way.log)"
done
t ops 90 env MOE_TEST_SMALL=1 MOE_TEST_BACKEND=cuda $B/test_cuda_ops && test_line ops

python3 - $W/rows.jsonl <<'EOF' | tee -a $R
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r['way'], r['T']): r for r in rows}
print('%-10s %6s %9s %9s %9s %10s' % ('way', 'T', 'fwd ms', 'bwd ms', 'total ms', 'new/old'))
for T in sorted(set(r['T'] for r in rows)):
    old = by.get(('old', T))
    for way in ('new', 'oldfwd', 'recompute', 'old'):
        r = by.get((way, T))
        if not r:
            continue
        tot = r['fwd_ms'] + r['bwd_ms']
        rat = '%.3f' % (tot / (old['fwd_ms'] + old['bwd_ms'])) if old and way != 'old' else '-'
        print('%-10s %6d %9.3f %9.3f %9.3f %10s' % ('old fwd' if way == 'oldfwd' else way, T, r['fwd_ms'],
                                                   r['bwd_ms'], tot, rat))
    n, f = by.get(('new', T)), by.get(('oldfwd', T))
    if n and f:
        print('%-10s %6d the forward on 128-key tiles: %.3f ms against %.3f (%.3fx the time)' %
              ('', T, n['fwd_ms'], f['fwd_ms'], n['fwd_ms'] / f['fwd_ms']))
n = by.get(('new', 4096))
if n:
    tot = n['fwd_ms'] + n['bwd_ms']
    for name, ms in (('SDPA, v padded to 192', 8.098), ('SDPA (Ev != E)', 5.309)):
        print('T 4096 against %s (%.3f ms, docs/PERFORMANCE.md): ours %.3f ms, %s (%.2fx)' %
              (name, ms, tot, 'met' if tot <= ms else 'NOT met', tot / ms))
EOF
say "$(date -u) done: $([ $FAIL = 0 ] && echo 'every check passed' || echo 'FAILURES above')"
exit $FAIL
