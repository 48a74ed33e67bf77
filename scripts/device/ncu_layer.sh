#!/bin/bash
# Device recipe: GPU time per kernel (Nsight Compute, gpu__time_duration) of one MoE-layer forward +
# backward (moe_bench_layer, one warm-up + one timed iteration, halved), per case and per
# MOE_GROUPED_GEMM mode, summed by kernel name. Usage: CASES=olmoe,ref MODES="auto cublas" bash scripts/device/ncu_layer.sh
# KREGEX (an ncu kernel-name regex, e.g. gg_kernel) profiles only the kernels it names. Where
# .gpu/old/moe_bench_layer is (pending/pack.sh with PACK_OLD=REF PROGRAMS=moe_bench_layer) each case runs
# on it too, new then old: a kernel change's A/B per layer shape (docs/PERFORMANCE.md "Kept", 4e92cf2).
cd "$(dirname "$0")/../.."
G=$PWD/.gpu; B=$G/bin; W=/tmp/w; mkdir -p $W
. scripts/device/libs.sh && device_libs $G $B/moe
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
SIDES=new; [ -x $G/old/moe_bench_layer ] && SIDES="new old"
KF=(); [ -n "${KREGEX:-}" ] && KF=(--kernel-name "regex:$KREGEX")
for c in ${CASES//,/ }; do for m in ${MODES:-auto cublas}; do for v in $SIDES; do
  bin=$B/moe_bench_layer; [ $v = old ] && bin=$G/old/moe_bench_layer
  MOE_GROUPED_GEMM=$m timeout 240 $NCU --clock-control none "${KF[@]}" --metrics gpu__time_duration.sum --csv \
    $bin --cases $c --iters 1 --warmup 1 --profile 0 --gemm 0 > $W/ncu_${c}_${m}_$v.csv 2>$W/ncu.err
  echo "== $c MOE_GROUPED_GEMM=$m $v (rc $?; ms per fwd+bwd, by kernel)"
  python3 - $W/ncu_${c}_${m}_$v.csv <<'PY'
import sys, collections
sys.path.insert(0, 'scripts/device')
from ncu_rows import rows, time_us
tot = collections.defaultdict(float); cnt = collections.Counter()
for k, m, v, u in rows(sys.argv[1]):
    n = k[:60]; tot[n] += time_us(v, u) / 1e3 / 2; cnt[n] += 1
for n, v in sorted(tot.items(), key=lambda x: -x[1])[:14]: print("  %8.3f ms %5d  %s" % (v, cnt[n] // 2, n))
print("  %8.3f ms total" % sum(tot.values()))
PY
done; done; done
