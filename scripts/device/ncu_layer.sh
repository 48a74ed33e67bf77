#!/bin/bash
# Device recipe: GPU time per kernel (Nsight Compute, gpu__time_duration) of one MoE-layer forward +
# backward (moe_bench_layer, one warm-up + one timed iteration, halved), per case and per
# MOE_GROUPED_GEMM mode, summed by kernel name. Usage: CASES=olmoe,ref MODES="auto cublas" bash scripts/device/ncu_layer.sh
cd "$(dirname "$0")/../.."
G=$PWD/.gpu; B=$G/bin; W=/tmp/w; mkdir -p $W
. scripts/device/libs.sh && device_libs $G $B/moe
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for c in ${CASES//,/ }; do for m in ${MODES:-auto cublas}; do
  MOE_GROUPED_GEMM=$m timeout 240 $NCU --clock-control none --metrics gpu__time_duration.sum --csv \
    $B/moe_bench_layer --cases $c --iters 1 --warmup 1 --profile 0 --gemm 0 > $W/ncu_${c}_${m}.csv 2>$W/ncu.err
  echo "== $c MOE_GROUPED_GEMM=$m (rc $?; ms per fwd+bwd, by kernel)"
  python3 - $W/ncu_${c}_${m}.csv <<'PY'
import sys, collections
sys.path.insert(0, 'scripts/device')
from ncu_rows import rows, time_us
tot = collections.defaultdict(float); cnt = collections.Counter()
for k, m, v, u in rows(sys.argv[1]):
    n = k[:60]; tot[n] += time_us(v, u) / 1e3 / 2; cnt[n] += 1
for n, v in sorted(tot.items(), key=lambda x: -x[1])[:14]: print("  %8.3f ms %5d  %s" % (v, cnt[n] // 2, n))
print("  %8.3f ms total" % sum(tot.values()))
PY
done; done
