#!/usr/bin/env bash
# bubble_bench.sh — the pipeline's measured bubble against the schedule simulator and the theory, on the CPU
# mesh: 2 ranks with one OpenMP thread each (one core each on the 2-core machine), 4 layers, sweeping the
# micro-batches. From OUT/pipeline.jsonl (train/measure.h), medians over steps 3..12 of those where every
# rank kept its core (process CPU time >= 0.95 of the step's span): measured = metrics.jsonl's bubble_frac;
# simulated = schedule_simulate_times on that step's own mean forward / backward seconds of each virtual
# stage; theory = (p-1)/(v m+p-1) (every stage equally fast). Also each stage's mean forward + backward.
#   bash scripts/bubble_bench.sh [MOE]
set -u
MOE="${1:-build/moe}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
T="$(mktemp -d)"; trap 'rm -rf "$T"' EXIT
M="--n-layers 4 --d-model 128 --n-heads 4 --n-kv-heads 2 --d-ff 256 --n-experts 4 --seq-len 64"
printf "%-18s %4s %9s %9s %9s %6s %22s %10s\n" schedule m measured simulated theory kept "F+B ms, stage 0 / 1" "step (ms)"
for sch in "1f1b|--pp-schedule 1f1b" "interleaved vpp2|--pp-schedule interleaved --vpp 2"; do
  for m in 2 4 8 16; do
    timeout 600 mpirun --oversubscribe -np 2 "$MOE" train --device cpu --out "$T/r" --force --quiet --steps 12 \
      --sample-tokens 0 --plots 0 --eval-every 0 --eval-batches 1 --save-every -1 $M --pp 2 ${sch#*|} \
      --grad-accum $m --batch $((4 * m)) > "$T/out" 2>&1 < /dev/null || { echo "failed: $sch m $m"; tail -2 "$T/out"; continue; }
    python3 - "$T/r" "${sch%%|*}" $m <<'P'
import json, sys
d, name, m = sys.argv[1], sys.argv[2], int(sys.argv[3])
p, v = 2, 2 if 'vpp2' in name else 1
rows = [json.loads(l) for l in open(d + '/pipeline.jsonl')][2:]
keep = [r for r in rows if min(c / s for c, s in zip(r['cpu_s'], r['span_s'])) >= 0.95]
med = lambda a: sorted(a)[len(a) // 2]
th = (p - 1) / (v * m + p - 1)
steps = {json.loads(l)['step']: json.loads(l)['step_time_s'] for l in open(d + '/metrics.jsonl') if '"loss"' in l}
if not keep:
    print("%-18s %4d  no step where both ranks kept their cores" % (name, m)); sys.exit()
# a stage's forward + backward of one micro-batch, all its chunks
fb = [med([sum(r['tf_s'][c * p + s] + r['tb_s'][c * p + s] for c in range(v)) for r in keep]) for s in range(p)]
print("%-18s %4d %8.1f%% %8.1f%% %8.1f%% %3d/%-2d %10.1f / %-9.1f %10.1f" % (name, m,
      100 * med([r['bubble_frac'] for r in keep]), 100 * med([r['bubble_sim'] for r in keep]), 100 * th,
      len(keep), len(rows), 1e3 * fb[0], 1e3 * fb[1], 1e3 * med([steps[r['step']] for r in keep])))
P
  done
done
