#!/usr/bin/env bash
# test_tensorboard.sh — `moe train` writes TensorBoard scalar event files in the run directory (our own
# writer, train/tboard.c), read back here by the `tensorboard` Python package (a test dependency; the test is
# skipped, 77, where it is not installed):
#   (1) every record passes the reader's header and data CRC32C checks, the first event is the file version,
#       and a copy with one byte changed fails them (so the checks are real);
#   (2) every scalar against metrics.jsonl read by Python's json module: train/loss, aux_loss, z_loss, lr,
#       grad_norm, perf/tokens_per_s, perf/tflops, load/max_over_mean, and each layer's max/mean computed here
#       from expert_load, at every step, and val/loss at every evaluation (float32 of the same number);
#   (3) a resume from an earlier checkpoint (steps 6-10 done again, to another --steps: another lr) shows in
#       TensorBoard each step once, with the re-done steps' values (the old file's are dropped);
#   (4) a write that fails (a file-size limit the event file reaches first) ends the run with one error
#       naming the event file, and the file keeps whole records only;
#   (5) --tensorboard 0 writes none; 2 is refused;
#   (6) perf/mfu with --mfu-peak (the cpu has no built-in peak: none without it): tflops / peak at each step.
set -u
. "$(dirname "$0")/lib.sh"
small_fixture
python3 -c 'import tensorboard' 2>/dev/null || { echo "SKIP: the tensorboard Python package is not installed"; exit 77; }
ARGS=("${SMALL[@]}" --d-model 32 --n-heads 2 --n-kv-heads 1 --d-ff 48 --n-layers 3 --n-experts 4 --warmup 2)

# check.py RUN [corrupt]: (1) and (2) on RUN's event files and metrics.jsonl; prints one line per check
cat > check.py <<'PY'
import glob, json, math, struct, sys
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New
from tensorboard.compat.tensorflow_stub import errors
from tensorboard.compat.proto import event_pb2
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
run = sys.argv[1]
def records(path):
    r, out = PyRecordReader_New(path), []
    while True:
        try: r.GetNext()
        except errors.OutOfRangeError: return out
        out.append(event_pb2.Event.FromString(r.record()))
files = sorted(glob.glob(run + "/events.out.tfevents.*"))
if sys.argv[2:] == ["corrupt"]:
    b = bytearray(open(files[0], "rb").read()); b[len(b) // 2] ^= 0x10
    open("corrupt.tfevents", "wb").write(b)
    try: records("corrupt.tfevents"); print("FAIL: a changed byte passed the CRC checks")
    except errors.DataLossError as e: print("PASS: a changed byte fails the reader's CRC check (%s)" % str(e).split()[-3:])
    sys.exit()
n = 0
for f in files:
    ev = records(f)
    if ev[0].file_version != "brain.Event:2": print("FAIL: %s: first event %s" % (f, ev[0]))
    n += len(ev)
print("PASS: %d files, %d records, every CRC checked" % (len(files), n))
# metrics.jsonl: the latest line of each step (the file is cut back to the checkpoint on resume anyway)
train, val = {}, {}
for line in open(run + "/metrics.jsonl"):
    r = json.loads(line)
    if "loss" in r: train[r["step"]] = r
    elif "val_loss" in r: val[r["step"]] = r["val_loss"]
want = {k: {s: r[k] for s, r in train.items()} for k in
        ["loss", "aux_loss", "z_loss", "lr", "grad_norm", "tokens_per_s", "tflops", "load_max_over_mean"]}
L = len(next(iter(train.values()))["expert_load"])
for l in range(L):
    want["layer_%02d" % l] = {s: max(r["expert_load"][l]) * len(r["expert_load"][l]) / sum(r["expert_load"][l])
                              for s, r in train.items()}
want["val"] = val
tag = {"loss": "train/loss", "aux_loss": "train/aux_loss", "z_loss": "train/z_loss", "lr": "train/lr",
       "grad_norm": "train/grad_norm", "tokens_per_s": "perf/tokens_per_s", "tflops": "perf/tflops",
       "load_max_over_mean": "load/max_over_mean", "val": "val/loss"}
ea = EventAccumulator(run, size_guidance={"scalars": 0}); ea.Reload()
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
bad = 0
for k, w in want.items():
    t = tag.get(k, "load/%s_max_over_mean" % k)
    got = [(s.step, s.value) for s in ea.Scalars(t)]
    exp = sorted(w.items())
    tol = 1e-6 if k == "val" else 0   # val_loss is printed to 6 decimals in metrics.jsonl
    if [s for s, _ in got] != [s for s, _ in exp] or any(abs(g - f32(e)) > tol * (1 + abs(e)) for (_, g), (_, e) in zip(got, exp)):
        print("FAIL: %s: tensorboard %s, metrics.jsonl %s" % (t, got[:12], exp[:12])); bad = 1
if not bad: print("PASS: %d scalars (%s) at every step equal to metrics.jsonl's" % (len(want), ", ".join(sorted(ea.Tags()["scalars"]))))
PY
py_checks() { python3 check.py "$@" > py.txt 2> py.err || cat py.err >> py.txt; while IFS= read -r l; do case "$l" in PASS:*) pass "${l#PASS: }";; FAIL:*) fail "${l#FAIL: }";; *) fail "check.py: $l";; esac; done < py.txt; }

run_ok "train 10 steps (evaluations at 3, 6, 9, 10; checkpoints at 5 and 10)" "$MOE" train "${ARGS[@]}" --steps 10 \
  --eval-every 3 --save-every 5 --keep 0 --out r || finish
py_checks r
py_checks r corrupt
cp r/metrics.jsonl first.jsonl
rm -r r/step_00000010
sleep 1   # another second: the resumed run's event file sorts after the first
run_ok "resume from step 5 to 12 (steps 6-10 again, on another lr schedule)" "$MOE" train --out r --resume --steps 12 || finish
[ "$(ls r/events.out.tfevents.* | wc -l)" = 2 ] && pass "the resume wrote a second event file" || fail "event files: $(ls r)"
lr_old=$(grep '"step":8,"loss"' first.jsonl | grep -o '"lr":[^,]*') lr_new=$(grep '"step":8,"loss"' r/metrics.jsonl | grep -o '"lr":[^,]*')
[ -n "$lr_old" ] && [ "$lr_old" != "$lr_new" ] && pass "step 8's lr differs between the runs ($lr_old, $lr_new)" ||
  fail "step 8's lr is the same in both runs: the resume's case is not tested"
py_checks r

# (4): 12 layers of 2 experts: an event (12 per-layer tags) grows faster than a metrics.jsonl line, so a
# 6 KiB file-size limit stops the event file first (run.json, 2.6 KB, and the checkpoints, never reached, aside)
mkdir -p f
( ulimit -f 12; exec "$MOE" train "${SMALL[@]}" --d-model 16 --n-heads 2 --n-kv-heads 1 --d-ff 16 --n-layers 12 \
  --n-experts 2 --top-k 1 --steps 40 --eval-every 0 --out f/r ) > "$OUT_FILE" 2> "$ERR_FILE"
rc=$?
if [ $rc -ge 1 ] && [ $rc -le 125 ] && [ "$(grep -c . "$ERR_FILE")" = 1 ] && grep -q "^moe: error: cannot write '.*/events.out.tfevents" "$ERR_FILE"; then
  pass "a failed event write: exit $rc, $(cat "$ERR_FILE")"
else fail "a failed event write: exit $rc, stderr: $(head -3 "$ERR_FILE")"; fi
python3 - f/r/events.out.tfevents.* > py.txt 2>&1 <<'PY'
import sys
from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import PyRecordReader_New
from tensorboard.compat.tensorflow_stub import errors
r, n = PyRecordReader_New(sys.argv[1]), 0
while True:
    try: r.GetNext(); n += 1
    except errors.OutOfRangeError: break
print("PASS: the event file holds %d whole records after the failed write" % n)
PY
py_checks_out() { while IFS= read -r l; do case "$l" in PASS:*) pass "${l#PASS: }";; *) fail "$l";; esac; done < py.txt; }
py_checks_out
run_ok "--mfu-peak 0.002" "$MOE" train "${ARGS[@]}" --steps 3 --eval-every 0 --mfu-peak 0.002 --out mfu
python3 - mfu r > py.txt 2> py.err <<'PY' || cat py.err >> py.txt   # (the reader warns of r's resume on stderr)
import json, struct, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
def scalars(run, tag):
    ea = EventAccumulator(run, size_guidance={"scalars": 0}); ea.Reload()
    return [(s.step, s.value) for s in ea.Scalars(tag)] if tag in ea.Tags()["scalars"] else None
f32 = lambda x: struct.unpack("f", struct.pack("f", x))[0]
want = [(r["step"], f32(r["tflops"] / 0.002)) for r in map(json.loads, open(sys.argv[1] + "/metrics.jsonl")) if "loss" in r]
got = scalars(sys.argv[1], "perf/mfu")
ok = got is not None and [s for s, _ in got] == [s for s, _ in want] and all(abs(g - w) <= 1e-6 * w for (_, g), (_, w) in zip(got, want))
print(("PASS: perf/mfu at every step is tflops / --mfu-peak (%s)" if ok else "FAIL: perf/mfu %s, want tflops / peak") % (got,))
none = scalars(sys.argv[2], "perf/mfu")
print("PASS: no perf/mfu on the cpu without --mfu-peak" if none is None else "FAIL: perf/mfu without a peak: %s" % none[:3])
PY
while IFS= read -r l; do case "$l" in PASS:*) pass "${l#PASS: }";; FAIL:*) fail "${l#FAIL: }";; *) fail "mfu check: $l";; esac; done < py.txt
run_ok "--tensorboard 0" "$MOE" train "${ARGS[@]}" --steps 2 --eval-every 0 --tensorboard 0 --out off
ls off/events.out.tfevents.* > /dev/null 2>&1 && fail "--tensorboard 0 wrote an event file" || pass "--tensorboard 0: no event file"
run_fail "--tensorboard must be 0 or 1 (got 2)" "$MOE" train "${ARGS[@]}" --steps 2 --tensorboard 2 --out bad
finish
