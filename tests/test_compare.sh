#!/usr/bin/env bash
# test_compare.sh — `moe compare RUN ... [--out FILE.png]`:
#   (1) the table's figures of four runs (different seeds and batches, one resumed, one with a step logged
#       twice, a null loss and its best val loss before its last) against the same figures
#       computed here from each run's metrics.jsonl and run.json by Python's json module: the last step,
#       tokens = logged steps x batch x seq-len, the final training loss, the final and the best validation
#       loss and its step, tokens/s = tokens of the timed steps / their summed step_time_s;
#   (2) --out draws one PNG (its signature and size), leaves no .tmp, and labels repeated directory names by
#       their paths;
#   (3) bad input: each one `moe: error:` line naming the problem, no file written: a missing path, a file,
#       a directory without run.json, a run without metrics.jsonl, one with no training or validation line,
#       --out not a .png / in a missing directory / a directory, an unknown option, no runs, no gnuplot.
set -u
. "$(dirname "$0")/lib.sh"
small_fixture
command -v python3 >/dev/null || { skip "python3 not installed"; finish; }
ARGS=("${SMALL[@]}" "${MODEL[@]}" --eval-every 4)

run_ok "train run a (seed 1)" "$MOE" train "${ARGS[@]}" --steps 12 --out runs/a || finish
run_ok "train run b (seed 2, batch 8)" "$MOE" train "${ARGS[@]}" --seed 2 --batch 8 --eval-every 2 --steps 10 \
  --out runs/b || finish
run_ok "train run c to step 6 (saved at 4)" "$MOE" train "${ARGS[@]}" --seed 3 --steps 6 --save-every 4 --out runs/c || finish
run_ok "resume run c from step 4 to 10" "$MOE" train --out runs/c --resume --steps 10 || finish
# run d: run a's lines, then its last step logged again with another loss (as a resume that re-does a step
# logs it), a step whose loss is null (a non-finite loss), and the last evaluation again, higher (so the best
# validation loss is no longer the last)
mkdir -p runs/d && cp runs/a/run.json runs/d/ && cp runs/a/metrics.jsonl runs/d/
grep '"step":12,"loss"' runs/a/metrics.jsonl | sed 's/"loss":[^,]*/"loss":4.25/' >> runs/d/metrics.jsonl
grep '"step":12,"loss"' runs/a/metrics.jsonl | sed 's/"step":12/"step":13/; s/"loss":[^,]*/"loss":null/' >> runs/d/metrics.jsonl
echo '{"step":12,"val_loss":9.5}' >> runs/d/metrics.jsonl

# The figures of one run, computed independently: one line "steps tokens final_loss final_val best_val
# best_step tokens_s" (- where there is none), a re-logged step counting by its latest line.
expect() {
  python3 - "$1" <<'PY'
import json, sys
d = sys.argv[1]
opt = json.load(open(d + "/run.json"))["options"]
per = int(opt["batch"]) * int(opt["seq-len"])
train, val = {}, {}
for line in open(d + "/metrics.jsonl"):
    r = json.loads(line)
    if "loss" in r: train[r["step"]] = r
    elif "val_loss" in r: val[r["step"]] = r["val_loss"]
steps = sorted(train)
fl = [train[s]["loss"] for s in steps if train[s]["loss"] is not None][-1]
vs = sorted(val)
best = min(vs, key=lambda s: (val[s], s))
t = sum(train[s]["step_time_s"] for s in steps)
print(steps[-1], len(steps) * per, "%.4f" % fl, "%.4f" % val[vs[-1]], "%.4f" % val[best], best,
      "%.0f" % (len(steps) * per / t))
PY
}
run_ok "moe compare runs/a runs/b runs/c runs/d" "$MOE" compare runs/a runs/b runs/c runs/d
cp "$OUT_FILE" table.txt
head -1 table.txt | grep -q '^run  *steps  *tokens  *final loss  *final val  *best val  *at step  *tokens/s$' &&
  pass "the table's header" || fail "the table's header: $(head -1 table.txt)"
for r in a b c d; do
  want=$(expect runs/$r) got=$(awk -v r=$r '$1 == r { $1 = ""; print substr($0, 2) }' table.txt)
  # tokens/s: rounded from a sum of the printed step times: within 0.1%
  if [ "${want% *}" = "${got% *}" ] && fcmp "$(echo "$want $got" | awk '{ d = $7 - $14; print (d < 0 ? -d : d) / $7 }')" "<" 1e-3; then
    pass "run $r: $got"
  else fail "run $r: the table says '$got', metrics.jsonl and run.json say '$want'"; fi
done
set -- $(expect runs/d)
[ "$1" = 13 ] && [ "$3" = 4.2500 ] && [ "$4" = 9.5000 ] && [ "$5" != 9.5000 ] &&
  pass "run d: the re-logged step's latest loss, the null loss skipped, the best val loss not the last" ||
  fail "run d's expected figures ($*) do not test the re-logged step, the null loss and the best"
mkdir -p out
run_ok "moe compare --out out/cmp.png" "$MOE" compare runs/a runs/b runs/c runs/d --out out/cmp.png
if python3 - out/cmp.png <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
assert b[:8] == b"\x89PNG\r\n\x1a\n" and b[12:16] == b"IHDR"
w, h = struct.unpack(">II", b[16:24])
assert 800 <= w <= 2000 and 600 <= h <= 2000, (w, h)
PY
then pass "out/cmp.png is a PNG of a sensible size"; else fail "out/cmp.png is not a sensible PNG"; fi
[ "$(ls out)" = cmp.png ] && pass "nothing else in out/ (no .tmp)" || fail "out/ holds: $(ls out)"
grep -q '^plot: out/cmp.png$' "$OUT_FILE" && pass "it names the PNG" || fail "no 'plot: out/cmp.png' line"
mkdir -p other && cp -r runs/a other/a
run_ok "moe compare runs/a other/a" "$MOE" compare runs/a other/a
awk 'NR > 1 { print $1 }' "$OUT_FILE" | tr '\n' ' ' | grep -qx 'runs/a other/a ' && pass "repeated names: labelled by path" ||
  fail "repeated names: labels $(awk 'NR > 1 { print $1 }' "$OUT_FILE" | tr '\n' ' ')"

mkdir -p notrun nometrics noline && : > afile
cp runs/a/run.json nometrics/ && cp runs/a/run.json noline/ && echo '{"note":"no step"}' > noline/metrics.jsonl
GUARD="runs out"
run_fail "'missing' does not exist" "$MOE" compare runs/a missing --out out/x.png
run_fail "'afile' is not a directory" "$MOE" compare afile --out out/x.png
run_fail "'notrun' is not a run directory (no run.json" "$MOE" compare runs/a notrun --out out/x.png
run_fail "run 'nometrics' has no metrics (no metrics.jsonl" "$MOE" compare nometrics runs/a --out out/x.png
run_fail "run 'noline' has no metrics (its metrics.jsonl holds no training or validation line)" "$MOE" compare noline
run_fail "--out must name a .png file" "$MOE" compare runs/a --out runs/a/metrics.jsonl
run_fail "the directory 'nodir' does not exist" "$MOE" compare runs/a --out nodir/x.png
mkdir -p out/d.png
run_fail "--out 'out/d.png' is a directory" "$MOE" compare runs/a --out out/d.png
rmdir out/d.png
run_fail "unknown option '--steps'" "$MOE" compare runs/a --steps 3
run_fail "give the run directories to compare" "$MOE" compare --out out/x.png
run_fail "gnuplot not found" env PATH=/nonexistent "$MOE" compare runs/a --out out/x.png
[ ! -e out/x.png ] && [ ! -e nodir ] && pass "no PNG written by a refused command" || fail "a refused command wrote a file"
run_ok "moe compare --help" "$MOE" compare --help
grep -q 'usage: moe compare RUN_A' "$OUT_FILE" && pass "--help shows the usage" || fail "--help: no usage"
finish
