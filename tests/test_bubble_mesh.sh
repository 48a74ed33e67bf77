#!/usr/bin/env bash
# test_bubble_mesh.sh — the schedule simulator against the pipeline bubble the CPU mesh measures (issue 41).
# Each case trains a tiny model on pipeline stages (2 ranks of one thread, the bubble_bench model: 4 layers,
# d 128, 4 sequences of 64 tokens a micro-batch) and reads OUT/pipeline.jsonl: per step the measured bubble
# (metrics.jsonl's bubble_frac: 1 - the stages' busy time over stages x the longest span, wall clock) and
# the simulator's (schedule_simulate_times on the step's own mean forward and backward seconds of each
# virtual stage, receive waits excluded, messages instant). The simulator knows the schedule's structure
# (which action waits for which message) and nothing of the run's timing but those means, so agreement says
# the ranks ran the schedule the simulator models; the uniform theory ((p-1)/(m+p-1), printed beside) is off
# by several points here, the stages' times differing (the last stage's LM head and loss, the cores).
#   - 1f1b, pp 2, 8 micro-batches; interleaved, pp 2 x vpp 2, 8 micro-batches; 1f1b pp 4 (needs 4 cores);
#   - the median over the kept steps of measured - simulated within 2 points (the issue's band).
# Measured precondition (the comparison is only posed when it holds): each rank kept its core through the
# step: its process CPU time over the step's span (pipeline.jsonl cpu_s / span_s) >= 0.95 on every stage.
# MPI's receives wait by spinning, so a rank that kept its core spends its whole span on the CPU; one that
# lost it to another process (a loaded machine, ctest -j) both stretches its own actions (which the
# simulator is given) and wakes late for a message that had arrived (which it is not). Steps 1-2 (buffers
# growing) and steps failing the precondition are left out; a run with fewer than 5 kept steps of 8 is
# run again (3 runs, or 20 s, at most; none after a run whose median share was below 0.5: a machine that
# busy stays busy for longer), then the case is skipped naming the CPU share it got. pp 4 is skipped on a
# machine of fewer than 4 cores (4 ranks would share them: never a pipeline of its own).
set -u
. "$(dirname "$0")/lib.sh"
mpi_tests
cd "$TMP" || exit 1
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
MODEL=(--n-layers 4 --d-model 128 --n-heads 4 --n-kv-heads 2 --d-ff 256 --n-experts 4 --seq-len 64)
STEPS=10

# verdict FILE P V M: prints "kept N median_meas median_sim median_diff max_abs_diff theory min_cpu"
verdict() {
  python3 - "$@" <<'P'
import json, sys
f, p, v, m = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rows = [json.loads(l) for l in open(f)]
rows = [r for r in rows if r['step'] >= 3]
share = [min(c / s for c, s in zip(r['cpu_s'], r['span_s'])) for r in rows]
kept = [r for r, c in zip(rows, share) if c >= 0.95]
med = lambda a: sorted(a)[len(a) // 2] if len(a) % 2 else sum(sorted(a)[len(a) // 2 - 1:len(a) // 2 + 1]) / 2
th = (p - 1) / (v * m + p - 1)
if not kept:
    print(0, 0, 0, 0, 0, th, med(share)); sys.exit()
d = [r['bubble_frac'] - r['bubble_sim'] for r in kept]
print(len(kept), med([r['bubble_frac'] for r in kept]), med([r['bubble_sim'] for r in kept]), med(d),
      max(abs(x) for x in d), th, med(share))
P
}

# bubble_case NAME NP V M FLAGS...
bubble_case() {
  local name="$1" np="$2" v="$3" m="$4"; shift 4
  local try out t0=$SECONDS
  for try in 1 2 3; do
    if ! $MPI -np "$np" "$MOE" train --device cpu --out "r_${np}_${v}" --force --quiet --steps $STEPS \
      --sample-tokens 0 --plots 0 --eval-every 0 --eval-batches 1 --save-every -1 "${MODEL[@]}" --pp "$np" "$@" \
      --grad-accum "$m" --batch $((4 * m)) > train.log 2>&1 < /dev/null; then
      fail "$name: training failed"; tail -3 train.log; return
    fi
    out=($(verdict "r_${np}_${v}/pipeline.jsonl" "$np" "$v" "$m"))
    [ "${out[0]}" -ge 5 ] && break
    echo "  ($name, run $try: ${out[0]} of $((STEPS - 2)) steps kept; median CPU share $(printf %.2f "${out[6]}"))"
    # (a machine this busy stays busy for longer than a retry: a few tens of seconds a case at most)
    fcmp "${out[6]}" "<" 0.5 && break
    [ $((SECONDS - t0)) -gt 20 ] && break
  done
  if [ "${out[0]}" -lt 5 ]; then
    skip "$name: the ranks did not keep their cores (median CPU share of the span $(printf %.2f "${out[6]}") < 0.95 in $try runs): the machine is too busy to measure a pipeline"
    return
  fi
  local msg
  msg=$(printf "%s: measured %.1f%%, simulated %.1f%% on the run's own stage times (median of %d steps; difference %+.2f points, at most %.2f; the uniform theory %.1f%%)" \
    "$name" "$(fcmp_pct "${out[1]}")" "$(fcmp_pct "${out[2]}")" "${out[0]}" "$(fcmp_pct "${out[3]}")" \
    "$(fcmp_pct "${out[4]}")" "$(fcmp_pct "${out[5]}")")
  if fcmp "${out[3]}" "<=" 0.02 && fcmp "${out[3]}" ">=" -0.02; then pass "$msg"; else fail "$msg"; fi
}
fcmp_pct() { awk -v x="$1" 'BEGIN { printf "%.4f", 100 * x }'; }

bubble_case "1f1b, pp 2, m 8" 2 1 8 --pp-schedule 1f1b
bubble_case "interleaved, pp 2 x vpp 2, m 8" 2 2 8 --pp-schedule interleaved --vpp 2
if [ "$(nproc --all)" -ge 4 ]; then bubble_case "1f1b, pp 4, m 8" 4 1 8 --pp-schedule 1f1b
else skip "1f1b, pp 4: $(nproc --all) cores for 4 ranks (they would share cores: no rank keeps one, the precondition cannot hold)"; fi

# the file's shape, on the last run: a line a step, every stage's and virtual stage's figures
check "pipeline.jsonl: a line per step with idle_s, span_s, cpu_s (2 stages), tf_s, tb_s (4 virtual stages)" \
  python3 -c "
import json, sys
rows = [json.loads(l) for l in open('r_2_2/pipeline.jsonl')]
assert [r['step'] for r in rows] == list(range(1, $STEPS + 1)), [r['step'] for r in rows]
for r in rows:
    assert len(r['idle_s']) == len(r['span_s']) == len(r['cpu_s']) == 2 and len(r['tf_s']) == len(r['tb_s']) == 4, r
    assert all(x > 0 for x in r['tf_s'] + r['tb_s'] + r['span_s']), r
    assert 0 <= r['bubble_sim'] < 1 and r['bubble_frac'] < 1, r
"
finish
