#!/usr/bin/env bash
# bubble_bench.sh — the pipeline's measured bubble (metrics.jsonl bubble_frac: the stages' mean idle
# time / step time, mean over steps 3..) against the schedule's theory, on the CPU mesh: 2 ranks with
# one OpenMP thread each (one core each on the 2-core machine), 4 layers, sweeping the micro-batches.
#   bash scripts/bubble_bench.sh [MOE]
set -u
MOE="${1:-build/moe}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
T="$(mktemp -d)"; trap 'rm -rf "$T"' EXIT
M="--n-layers 4 --d-model 128 --n-heads 4 --n-kv-heads 2 --d-ff 256 --n-experts 4 --seq-len 64"
printf "%-26s %4s %10s %10s %12s\n" schedule m measured theory "step (ms)"
for sch in "1f1b|--pp-schedule 1f1b" "interleaved vpp2|--pp-schedule interleaved --vpp 2"; do
  for m in 2 4 8 16; do
    timeout 600 mpirun --oversubscribe -np 2 "$MOE" train --device cpu --out "$T/r" --force --quiet --steps 8 \
      --sample-tokens 0 --plots 0 --eval-every 0 --eval-batches 1 --save-every -1 $M --pp 2 ${sch#*|} \
      --grad-accum $m --batch $((4 * m)) > "$T/out" 2>&1 < /dev/null || { echo "failed: $sch m $m"; tail -2 "$T/out"; continue; }
    python3 - "$T/r/metrics.jsonl" "${sch%%|*}" $m <<'P'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"bubble_frac"' in l][2:]
p, m, v = 2, int(sys.argv[3]), 2 if 'vpp2' in sys.argv[2] else 1
th = (p - 1) / (v * m + p - 1)
b = sum(r['bubble_frac'] for r in rows) / len(rows)
st = 1e3 * sum(r['step_time_s'] for r in rows) / len(rows)
print("%-26s %4d %9.1f%% %9.1f%% %12.1f" % (sys.argv[2], m, 100 * b, 100 * th, st))
P
  done
done
