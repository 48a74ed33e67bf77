# lib.sh — helpers shared by the tests/test_*.sh scripts (sourced, never run on its own).
#
# Each script does:   set -u; . "$(dirname "$0")/lib.sh"; ...checks...; finish
# and gets:
#   $MOE      the moe binary ($MOE_BIN, default $MOE_SRC/build/moe; MOE_SRC defaults to the repo root)
#   $MOE_SRC  the source tree
#   $TMP      a private scratch directory, removed on exit (KEEP_TMP=1 keeps it for debugging); also TMPDIR
#   pass/fail/skip MSG          count and print one PASS/FAIL/SKIP line
#   check MSG CMD...            PASS if CMD exits 0, else FAIL
#   run_ok MSG CMD...           run CMD, stdout -> $OUT_FILE, stderr -> $ERR_FILE; PASS if it exits 0
#   run_fail PHRASE CMD...      CMD must fail cleanly: exit status 1..125 (not a signal / crash), stderr
#                               exactly one line "moe: error: ..." containing PHRASE (fixed string), and
#                               every path in $GUARD (space-separated) byte-for-byte unchanged
#   tree_list PATH / tree_hash PATH   names, types and sha256s of everything under PATH / one hash of that
#   same_ckpt A B STEP          the checkpoint files of STEP in runs A and B byte-identical
#   field KEY FILE              the values of "KEY": on the training lines (those with a "loss") of a
#                               metrics.jsonl, one per line, as printed (strings, for exact comparison)
#   mean / mean_last N / mean_first N   arithmetic mean of numbers on stdin (all, last N, first N)
#   fcmp A OP B                 float comparison with awk (OP one of < <= > >= ==); exit status 0 if true
#   small_fixture               cd to $W; SMALL, MODEL, EVAL option arrays for small, fast runs
#   mpi_tests                   the mpirun tests' environment (MPI, CKPT_DIFF); skips without mpirun
#   maxrel A B                  largest relative difference between two files of numbers
#   mesh_close REF RUN LABEL    a mesh run against the one-process reference, at the mesh tolerances
#   mesh_exact REF RUN LABEL    pipeline stages alone against one process: bitwise (test_pipeline.sh says why)
#   resume_takes NAME VALUE ARGS...   `moe train ARGS --NAME VALUE` for 6 steps at once, and for 3 then resumed
#                               for 3 without naming --NAME: the resume takes it from run.json, and the
#                               losses and gradient norms are byte-identical (runs RT6, RT3 in the cwd)
#   sample_block FILE           the end-of-run sample in a run's output: the text between the two "---"
#                               lines under "sample (...)", with the "---" lines
#   text_bytes N SEED           N bytes of English-like text (lines of words drawn by an LCG from SEED), the
#                               same on every machine: data for tests that need text but no particular text
#   finish                      print "<script>: N passed, N failed, N skipped (Ts)"; exit 1 on any FAIL
# Output of a failing command is shown (trimmed) under its FAIL line.

: "${MOE_SRC:=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
: "${MOE_BIN:=$MOE_SRC/build/moe}"
case "$MOE_BIN" in /*) ;; *) MOE_BIN="$(cd "$MOE_SRC" && cd "$(dirname "$MOE_BIN")" && pwd)/$(basename "$MOE_BIN")" ;; esac
MOE="$MOE_BIN"
export LC_ALL=C
# OpenMP threads that spin while waiting (the GNU default) make moe 5-6x slower, burning the CPU
# time, when other processes share the cores (ctest -j, a busy CI box): measured 33.7 s vs 5.7 s
# wall for 30 steps of the tiny preset at load 7 on 2 cores. Passive waiting changes no result.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"

T_NAME="$(basename "$0" .sh)"
T_PASS=0
T_FAIL=0
T_SKIP=0
T_START=$(date +%s)
GUARD=""

if [ ! -x "$MOE" ]; then
  echo "FAIL: moe binary '$MOE' is missing or not executable (build it first, or set MOE_BIN)"
  echo "$T_NAME: 0 passed, 1 failed, 0 skipped (0s)"
  exit 1
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/moe_${T_NAME}.XXXXXX")" || { echo "FAIL: cannot create a temp dir"; exit 1; }
OUT_FILE="$TMP/.stdout"
ERR_FILE="$TMP/.stderr"
# Every process the test starts keeps its temporary files in the test's own directory (mpirun's session
# directory, mktemp's): tests run at once (ctest -j) cannot collide on Open MPI's session directory (a
# test_overlap start-up failure under load), and nothing outlives the test.
export TMPDIR="$TMP"
t_cleanup() {
  if [ "${KEEP_TMP:-0}" = 1 ]; then echo "(kept $TMP)"; else rm -rf "$TMP"; fi
}
trap t_cleanup EXIT
trap 'echo "interrupted"; exit 130' INT TERM

pass() { T_PASS=$((T_PASS + 1)); echo "PASS: $*"; }
fail() { T_FAIL=$((T_FAIL + 1)); echo "FAIL: $*"; }
skip() { T_SKIP=$((T_SKIP + 1)); echo "SKIP: $*"; }

# Show the captured output of the last command (indented, at most 15 lines each).
show_output() {
  if [ -s "$OUT_FILE" ]; then echo "    stdout:"; tail -n 15 "$OUT_FILE" | sed 's/^/    | /'; fi
  if [ -s "$ERR_FILE" ]; then echo "    stderr:"; tail -n 15 "$ERR_FILE" | sed 's/^/    | /'; fi
}

check() {
  local msg="$1"; shift
  if "$@"; then pass "$msg"; else fail "$msg"; fi
}

run_ok() {
  local msg="$1"; shift
  "$@" >"$OUT_FILE" 2>"$ERR_FILE"
  local rc=$?
  if [ $rc -eq 0 ]; then pass "$msg"; return 0; fi
  fail "$msg (exit status $rc): $*"
  show_output
  return 1
}

# Every name under PATH with its type, then the sha256 of every file (sorted; two processes in all).
tree_list() {
  local p="$1"
  if [ ! -e "$p" ]; then echo "absent"; return; fi
  if [ ! -d "$p" ]; then sha256sum <"$p"; return; fi
  (
    cd "$p" || exit
    find . -printf '%y %p\n' | sort
    find . -type f -print0 | sort -z | xargs -0 -r sha256sum | cut -c1-16,65-
  )
}
# same_ckpt A B STEP: the checkpoint files of run A's and run B's STEP directory byte-identical
same_ckpt() {
  local f
  for f in model.safetensors optimizer.safetensors state.json config.json; do
    cmp -s "$1/$3/$f" "$2/$3/$f" || return 1
  done
}
tree_hash() { tree_list "$1" | sha256sum | cut -d' ' -f1; }

# run_fail PHRASE CMD... (see the header)
run_fail() {
  local phrase="$1"; shift
  local g i=0
  for g in $GUARD; do tree_list "$g" >"$TMP/.guard_$i"; i=$((i + 1)); done
  "$@" >"$OUT_FILE" 2>"$ERR_FILE"
  local rc=$? why="" changes=""
  local nlines
  nlines=$(grep -c . "$ERR_FILE")
  if [ $rc -eq 0 ]; then why="exit status 0 (expected failure)"
  elif [ $rc -gt 125 ]; then why="exit status $rc (could not run, or killed by a signal)"
  elif ! grep -qF -- "$phrase" "$ERR_FILE"; then why="stderr lacks '$phrase'"
  elif [ "$nlines" -ne 1 ]; then why="stderr has $nlines lines, expected one message"
  elif ! grep -q '^moe: error: ' "$ERR_FILE"; then why="stderr is not a 'moe: error:' line"
  fi
  i=0
  for g in $GUARD; do
    if ! tree_list "$g" | diff "$TMP/.guard_$i" - >"$TMP/.guard_diff"; then
      why="${why:+$why; }changed files under $g"
      changes="$changes$(grep '^[<>]' "$TMP/.guard_diff" | head -n 8 | sed 's/^</    was: /; s/^>/    now: /')
"
    fi
    i=$((i + 1))
  done
  if [ -z "$why" ]; then
    pass "'$phrase' <- moe ${*:2}"
    return 0
  fi
  fail "$why: $*"
  printf '%s' "$changes"
  show_output
  return 1
}

# Values of "KEY": on the training lines of metrics.jsonl FILE, one per line, verbatim.
field() {
  grep '"loss":' "$2" | grep -o "\"$1\":[^,}]*" | cut -d: -f2
}

# val_within RUN NAME REF REFNAME CORPUS: a quantised run's final validation loss (RUN/metrics.jsonl) within
# 1% of its unquantised twin's (REF), and not equal to it (no quantisation at all)
# bf16_grads_checks A G0 STEP: run A (the routed experts' gradients bf16 values, --bf16-grads 1) against G0 (the same
# run with --bf16-grads 0, float32 gradients), in the current directory: step 1's loss the same (before any update),
# its gradient norm over the rounded gradients within a rounding's worth of float32's and not the same bits, and
# the weights at checkpoint STEP different. Needs CKPT_DIFF.
bf16_grads_checks() {
  local a=$1 g=$2 st=$3 r
  check "bf16-grads: step 1's loss the same with float32 gradients" \
    test "$(field loss $g/metrics.jsonl | head -1)" = "$(field loss $a/metrics.jsonl | head -1)"
  field grad_norm $g/metrics.jsonl | head -1 > .g0; field grad_norm $a/metrics.jsonl | head -1 > .g1
  r=$(maxrel .g0 .g1)
  if cmp -s .g0 .g1; then fail "bf16-grads: step 1's gradient norm is float32 gradients' bit for bit (not rounded?)"
  elif fcmp "$r" "<=" 1e-3; then pass "bf16-grads: step 1's gradient norm of the rounded gradients within $r of float32's"
  else fail "bf16-grads: step 1's gradient norm differs by $r relative from float32's (want a rounding's worth)"; fi
  if "$CKPT_DIFF" --changed $a/$st $g/$st 0.0001 > .c; then fail "bf16-grads 0 trains the same weights as 1: $(cat .c)"
  else pass "bf16-grads 0 and 1 train different weights ($(cat .c))"; fi
}

val_within() {
  local vr vf rel
  vr=$(grep -o '"val_loss":[0-9.]*' "$3/metrics.jsonl" | tail -n 1 | cut -d: -f2)
  vf=$(grep -o '"val_loss":[0-9.]*' "$1/metrics.jsonl" | tail -n 1 | cut -d: -f2)
  rel=$(awk -v a="$vf" -v b="$vr" 'BEGIN { if (b != 0) printf "%.5f", (a - b) / b }')
  if [ -z "$vr" ] || [ -z "$vf" ]; then fail "quality: no validation loss ($4 '$vr', $2 '$vf')"
  elif [ "$vr" = "$vf" ]; then fail "quality: $2's validation loss is $4's exactly ($vr): no quantisation?"
  elif fcmp "$rel" "<=" 0.01 && fcmp "$rel" ">=" -0.01; then
    pass "quality: $2 validation loss $vf, $4 $vr ($rel relative; band 1%) on $5"
  else fail "quality: $2 validation loss $vf against $4's $vr: $rel relative, outside the 1% band"; fi
}

mean() { awk '{ s += $1; n++ } END { if (n) printf "%.6f\n", s / n; else print "nan" }'; }
mean_last() { tail -n "$1" | mean; }
mean_first() { head -n "$1" | mean; }
fcmp() { awk -v a="$1" -v b="$3" -v op="$2" 'BEGIN {
  if (a == "" || b == "" || a == "nan" || b == "nan") exit 1
  a += 0; b += 0
  r = (op == "<") ? a < b : (op == "<=") ? a <= b : (op == ">") ? a > b : (op == ">=") ? a >= b : (op == "==") ? a == b : 0
  exit !r }'; }

# small_fixture: the bad-input tests' setting: work in $W (under $TMP), and the option sets of a small,
# fast run: SMALL (training), MODEL (a tiny model), EVAL (eval's batch).
text_bytes() {
  awk -v n="$1" -v seed="$2" 'BEGIN {
    nw = split("the of and to a in that is was he for it with as his on be at by had not are but from or have an " \
               "they which one you were her all she there would their we him been has when who will more no if out " \
               "so said what up its about into than them can only other new some could time these two may then do " \
               "first any my now such like our over man me even most made after also did many before must through", w, " ")
    x = seed; out = 0; line = ""
    while (out < n) {
      x = (x * 1103515245 + 12345) % 2147483648
      line = line (line == "" ? "" : " ") w[int(x / 65536) % nw + 1]
      if (length(line) > 60 || x % 11 == 0) { s = line ".\n"; printf "%s", substr(s, 1, n - out); out += length(s); line = "" }
    }
  }'
}

small_fixture() {
  W="$TMP/w"
  mkdir -p "$W" && cd "$W" || exit 1
  SMALL=(--batch 4 --seq-len 16 --eval-batches 1 --sample-tokens 0 --plots 0 --quiet)
  MODEL=(--d-model 32 --n-heads 2 --n-kv-heads 1 --d-ff 48 --n-layers 1)
  EVAL=(--batch 4 --seq-len 16 --eval-batches 1)
}

# trained_tokenizers: tests/tokenizer_ref.py (REF) trains its tokenizers with the PyPI `tokenizers` into tk/;
# the script is skipped without that library and fails where the training does.
trained_tokenizers() {
  REF="$MOE_SRC/tests/tokenizer_ref.py"
  python3 "$REF" train tk > train.log 2>&1
  local rc=$?
  if [ $rc -eq 77 ]; then skip "the PyPI tokenizers library is not installed ($(tail -1 train.log))"; finish; fi
  [ $rc -eq 0 ] || { fail "training the tokenizers (tokenizer_ref.py train)"; cat train.log; finish; }
}

# mpi_tests: the setting of the mpirun tests (skips the script where mpirun is missing): root allowed,
# one OpenMP thread per rank, ranks oversubscribed on the 2-core machine, MPI (the launcher, bounded
# in time) and CKPT_DIFF.
mpi_tests() {
  command -v mpirun >/dev/null || { skip "mpirun not installed"; finish; }
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
  export OMPI_MCA_rmaps_base_oversubscribe=1
  CKPT_DIFF="${CKPT_DIFF:-$(dirname "$MOE")/ckpt_diff}"
  MPI="timeout 300 mpirun --oversubscribe"
}

# Largest relative difference between two columns of numbers (files A and B).
maxrel() { paste "$1" "$2" | awk '{ d = $1 - $2; if (d < 0) d = -d; a = $1 < 0 ? -$1 : $1; r = d / (a > 1e-12 ? a : 1e-12);
  if (r > m) m = r } END { printf "%.3e\n", m + 0 }'; }

# mesh_close REF RUN LABEL: the run (a mesh layout) trained the same model as the reference (one
# process), with the mesh tolerances (tests/test_mesh.sh says why): per-step loss, aux and z loss (and MTP's)
# 1e-6 relative, grad norm 1e-5; expert load and drops exactly equal; final parameters 1e-3 of each
# tensor's largest magnitude (CKPT_DIFF); and, unless NO_REPLICA_CHECK=1, "replica check: ok" in
# RUN/out.txt. One PASS line with the largest differences, or FAIL lines naming what differs.
mesh_close() {
  local ref="$1" run="$2" label="$3" k ok=1 worst=""
  local mtp=""; grep -q '"mtp_loss"' "$ref/metrics.jsonl" && mtp=mtp_loss # (MTP modules: their loss too)
  for k in loss aux_loss z_loss grad_norm $mtp; do
    field "$k" "$ref/metrics.jsonl" > "$TMP/.a"; field "$k" "$run/metrics.jsonl" > "$TMP/.b"
    local n; n=$(wc -l < "$TMP/.b")
    [ "$n" -eq "$(wc -l < "$TMP/.a")" ] && [ "$n" -gt 0 ] || { fail "$label: $k: $n steps vs $(wc -l < "$TMP/.a")"; ok=0; continue; }
    local r tol=1e-6; r=$(maxrel "$TMP/.a" "$TMP/.b")
    [ "$k" = grad_norm ] && tol=1e-5
    fcmp "$r" "<=" "$tol" || { fail "$label: $k differs by $r relative (tolerance $tol)"; ok=0; }
    worst="$worst $k $r"
  done
  for k in expert_load dropped; do
    grep -o "\"$k\":[^a-z]*" "$ref/metrics.jsonl" > "$TMP/.a"; grep -o "\"$k\":[^a-z]*" "$run/metrics.jsonl" > "$TMP/.b"
    cmp -s "$TMP/.a" "$TMP/.b" || { fail "$label: $k differs"; ok=0; }
  done
  local pd; pd=$("$CKPT_DIFF" "$ref" "$run" 1e-3) || { fail "$label: final parameters: $pd"; ok=0; }
  [ "${NO_REPLICA_CHECK:-0}" = 1 ] || grep -q "replica check: ok" "$run/out.txt" || { fail "$label: replica check did not pass"; ok=0; }
  [ $ok = 1 ] && pass "$label matches one process (${worst# }; params ${pd#max relative difference })"
  return 0
}

# The training lines of metrics.jsonl FILE without the timings and the grad norm (what mesh_exact compares).
strip_timing() { sed -E 's/"pp_idle_s":\[[^]]*\],?//; s/"(tokens_per_s|tflops|step_time_s|grad_wait_s|bubble_frac|grad_norm)":[^,}]*,?//g' "$1" | grep '"loss"'; }

# mesh_exact REF RUN LABEL: the promise of pipeline stages alone (no TP/DP/EP, --grad-clip 0): metrics.jsonl
# (losses, aux, z, MTP, load, drops; not the timings) byte for byte, the newest checkpoint's model and optimizer
# files byte-identical, the grad norm (summed per stage, then over the stages) within 1e-12 relative.
mesh_exact() {
  local ref="$1" run="$2" label="$3" ok=1 f st
  cmp -s <(strip_timing "$ref/metrics.jsonl") <(strip_timing "$run/metrics.jsonl") || { fail "$label: metrics differ from one process"; diff <(strip_timing "$ref/metrics.jsonl") <(strip_timing "$run/metrics.jsonl") | head -4; ok=0; }
  [ "$(grep -c '"loss"' "$run/metrics.jsonl")" -gt 0 ] || { fail "$label: no steps logged"; ok=0; }
  st=$(cd "$ref" && ls -d step_* 2>/dev/null | tail -n 1)
  [ -n "$st" ] || { fail "$label: the reference has no checkpoint"; ok=0; }
  for f in model.safetensors optimizer.safetensors; do
    cmp -s "$ref/$st/$f" "$run/$st/$f" || { fail "$label: $st/$f differs from one process"; ok=0; }
  done
  field grad_norm "$ref/metrics.jsonl" > "$TMP/.a"; field grad_norm "$run/metrics.jsonl" > "$TMP/.b"
  local r; r=$(maxrel "$TMP/.a" "$TMP/.b")
  fcmp "$r" "<=" 1e-12 || { fail "$label: grad norm differs by $r relative (round-off allows 1e-12)"; ok=0; }
  [ $ok = 1 ] && pass "$label: losses, aux, z, load and checkpoints bitwise equal to one process (grad norm $r relative)"
  return 0
}

resume_takes() {
  local name="$1" val="$2"; shift 2
  local S=(--save-every 3 --keep 0)
  run_ok "6 steps at once (--$name $val)" "$MOE" train "$@" "${S[@]}" --steps 6 --"$name" "$val" --out RT6 < /dev/null
  run_ok "3 steps" "$MOE" train "$@" "${S[@]}" --steps 3 --"$name" "$val" --out RT3 < /dev/null
  run_ok "resumed for 3 more without naming the option" "$MOE" train "$@" "${S[@]}" --steps 6 --out RT3 --resume < /dev/null
  check "the resume applied --$name $val from run.json" grep -q -- "--$name $val" "$OUT_FILE"
  check "the resumed run's metrics byte-identical to the 6 steps'" \
    cmp -s <(field loss RT6/metrics.jsonl; field grad_norm RT6/metrics.jsonl) <(field loss RT3/metrics.jsonl; field grad_norm RT3/metrics.jsonl)
}

sample_block() { awk '/^sample \(/ { f = 1; next } f { print; if ($0 == "---" && ++n == 2) exit }' "$1"; }

finish() {
  local dt=$(($(date +%s) - T_START))
  echo "$T_NAME: $T_PASS passed, $T_FAIL failed, $T_SKIP skipped (${dt}s)"
  [ "$T_FAIL" -eq 0 ] || exit 1
  exit 0
}
