#!/usr/bin/env bash
# test_resume.sh — resuming a run on the CPU is bit-identical to never stopping.
#
# For each variant (plain; --grad-accum 2; --jitter 0.1; --dispatch capacity; --mtp 2; the deepseek-v3-tiny
# preset with an MTP module, and with YaRN given again to the resume):
#   A: moe train --steps 24 --save-every 8 --keep 0, uninterrupted.
#   B: the same run "crashed" after step 13: a copy of A (in the plain variant a second, separate
#      run, which also checks that two runs of one command agree) with the checkpoints of steps 16
#      and 24 removed, metrics.jsonl cut after step 13 (the steps 9..13 it still holds must be
#      dropped by the resume), and a half-written step_00000016.tmp left behind by the "crash";
#      then `moe train --resume` with the same flags (the jitter variant omits the model flags:
#      the checkpoint's config.json must supply them).
#   Checks: B resumes from step 8; B's metrics.jsonl has every step once; the losses of steps 9..24
#   are equal as printed (17 significant digits, so bit-identical doubles), as are all other
#   deterministic fields (aux/z loss, lr, grad norm, expert loads, drops, val loss; only the timing
#   fields are ignored); the checkpoints of steps 16 and 24 are byte-identical (weights, AdamW
#   moments, state, config, checksums). Plus non-vacuity checks: training moves the loss, the jitter
#   changes the run, capacity dispatch drops tokens, and grad accumulation gives the same step-1
#   loss as one micro-batch.
# Uses the default thread count, so the determinism of the OpenMP code is covered too.
set -u
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1

COMMON=(--batch 8 --seq-len 32 --eval-batches 2 --eval-every 8 --sample-tokens 0 --plots 0 --quiet
        --steps 24 --save-every 8 --keep 0)

# metrics.jsonl without the fields that measure time (names ending in _s, as tokens_per_s,
# step_time_s; tflops; mfu): the only ones allowed to differ between runs
stable_metrics() { sed -E 's/"[a-z0-9_]*(_s|tflops|mfu)":[^,}]*,?//g' "$1"; }
# lines of metrics.jsonl whose "step" is <= $2
metrics_upto() { awk -v n="$2" '{ if (match($0, /"step":[0-9]+/) && substr($0, RSTART + 7, RLENGTH - 7) + 0 <= n) print }' "$1"; }
# loss of training step $2 in metrics.jsonl $1
loss_at() { grep "^{\"step\":$2,\"loss\":" "$1" | grep -o '"loss":[^,]*' | cut -d: -f2; }

# resume_case NAME fresh|copy yes|no FLAGS...   (yes: pass FLAGS again to --resume)
resume_case() {
  local name="$1" how="$2" repeat="$3"; shift 3
  local A="$name.A" B="$name.B" d f
  echo "--- $name: ${*:-(defaults)}"
  run_ok "$name: run A (24 steps, checkpoints every 8)" "$MOE" train "${COMMON[@]}" "$@" --out "$A" || return
  if [ "$how" = fresh ]; then
    run_ok "$name: run B, a second identical run" "$MOE" train "${COMMON[@]}" "$@" --out "$B" || return
    if diff <(stable_metrics "$A/metrics.jsonl") <(stable_metrics "$B/metrics.jsonl") >/dev/null; then
      pass "$name: two runs of one command give identical metrics"
    else fail "$name: two runs of one command differ (nondeterminism)"; fi
  else
    cp -r "$A" "$B"
  fi
  # the crash: after step 13, between the checkpoints of steps 8 and 16, during a save
  rm -rf "$B/step_00000016" "$B/step_00000024" "$B"/*.png
  metrics_upto "$B/metrics.jsonl" 13 >"$B/m" && mv "$B/m" "$B/metrics.jsonl"
  mkdir -p "$B/step_00000016.tmp" && head -c 1000 "$A/step_00000016/model.safetensors" >"$B/step_00000016.tmp/model.safetensors"
  local rflags=()
  [ "$repeat" = yes ] && rflags=("$@")   # "no": FLAGS are model options, which the checkpoint holds
  run_ok "$name: --resume B${rflags[*]:+ with ${rflags[*]}}" "$MOE" train "${COMMON[@]}" "${rflags[@]}" --out "$B" --resume || return
  if grep -q "resuming from $B/step_00000008 (step 8)" "$OUT_FILE"; then pass "$name: resumed from step_00000008"
  else fail "$name: did not resume from step_00000008"; show_output; fi
  [ ! -e "$B/step_00000016.tmp" ] && pass "$name: the stale step_00000016.tmp is gone" ||
    fail "$name: the stale step_00000016.tmp is still there"

  local steps_b
  steps_b=$(field step "$B/metrics.jsonl" | tr '\n' ' ')
  [ "$steps_b" = "$(seq 1 24 | tr '\n' ' ')" ] && pass "$name: B's metrics.jsonl has steps 1..24 once each, in order" ||
    fail "$name: B's metrics.jsonl training steps are: $steps_b"
  local la lb
  la=$(field loss "$A/metrics.jsonl" | sed -n '9,24p')
  lb=$(field loss "$B/metrics.jsonl" | sed -n '9,24p')
  if [ "$(echo "$la" | grep -c .)" -eq 16 ] && [ "$la" = "$lb" ]; then pass "$name: losses of steps 9..24 bit-identical"
  else
    fail "$name: losses of steps 9..24 differ"
    paste <(echo "$la") <(echo "$lb") | awk '$1 != $2 { print "    step " NR + 8 ": A " $1 "  B " $2 }' | head -5
  fi
  if diff <(stable_metrics "$A/metrics.jsonl") <(stable_metrics "$B/metrics.jsonl") >"$TMP/d"; then
    pass "$name: every deterministic metrics field (aux, z, lr, grad norm, expert loads, val loss) identical"
  else fail "$name: metrics differ beyond the loss:"; head -6 "$TMP/d" | cut -c1-240 | sed 's/^/    /'; fi
  for d in step_00000016 step_00000024; do
    local bad=""
    for f in model.safetensors optimizer.safetensors state.json config.json checksums.json; do
      cmp -s "$A/$d/$f" "$B/$d/$f" || bad="$bad $f"
    done
    [ -z "$bad" ] && pass "$name: $d byte-identical (model, optimizer, state, config, checksums)" ||
      fail "$name: $d differs in:$bad"
  done
  # non-vacuity: the run trained
  fcmp "$(loss_at "$A/metrics.jsonl" 24)" "<" "$(loss_at "$A/metrics.jsonl" 1)" &&
    pass "$name: loss moved (step 1 $(loss_at "$A/metrics.jsonl" 1), step 24 $(loss_at "$A/metrics.jsonl" 24))" ||
    fail "$name: the loss did not go down in 24 steps"
}

resume_case plain fresh yes
resume_case accum copy yes --grad-accum 2
resume_case jitter copy no --jitter 0.1
resume_case capacity copy yes --dispatch capacity --capacity-factor 0.75
# multi-token prediction: two modules (their routing bias moved by the aux-free balance), the model flags
# from the checkpoint's config.json on resume
resume_case mtp copy no --mtp 2 --mtp-weight 0.5 --balance aux-free
# the DeepSeek-V3 family: its config.json must read back as the model was (once its aux coefficient, the
# preset's 1e-4, did not: resumed without it, a run trained without the aux loss; given its options, refused),
# resumed from the checkpoint's config alone and with the options given again (YaRN's betas, 0 on the command
# line, 32 and 1 in config.json)
resume_case ds copy no --preset deepseek-v3-tiny --mtp 1
resume_case ds_yarn copy yes --preset deepseek-v3-tiny --rope-factor 4 --rope-orig-max 16

# the variants must really exercise what they claim
if [ "$(field loss jitter.A/metrics.jsonl | sed -n 2p)" != "$(field loss plain.A/metrics.jsonl | sed -n 2p)" ]; then
  pass "jitter changes training (step-2 losses differ from the plain run)"
else fail "--jitter 0.1 had no effect on the step-2 loss"; fi
grep -q '"jitter":[[:space:]]*0.1' jitter.B/step_00000024/config.json &&
  pass "jitter: the resumed run kept the checkpoint's jitter 0.1" || fail "jitter: config.json lost the jitter"
drops=$(field dropped capacity.A/metrics.jsonl | awk '{ s += $1 } END { print s + 0 }')
fcmp "$drops" ">" 0 && pass "capacity dispatch dropped $drops token-slots over 24 steps" ||
  fail "capacity dispatch with factor 0.75 dropped nothing"
grep -q '"num_nextn_predict_layers":[[:space:]]*2' mtp.B/step_00000024/config.json &&
  grep -q '"mtp_weight":[[:space:]]*0.5' mtp.B/step_00000024/config.json &&
  pass "mtp: the resumed run kept the checkpoint's 2 MTP modules and weight 0.5" ||
  fail "mtp: config.json lost the MTP modules or their weight"
grep -aq 'model.layers.3.eh_proj.weight' mtp.A/step_00000024/model.safetensors &&
  grep -aq 'model.layers.3.shared_head.norm.weight' mtp.A/step_00000024/model.safetensors &&
  pass "mtp: the checkpoint holds the second module's tensors (model.layers.3.*)" ||
  fail "mtp: the checkpoint lacks model.layers.3.eh_proj / shared_head.norm"
m1=$(field mtp_loss mtp.A/metrics.jsonl | sed -n 1p)
m24=$(field mtp_loss mtp.A/metrics.jsonl | sed -n 24p)
[ -n "$m1" ] && fcmp "$m24" "<" "$m1" && pass "mtp: mtp_loss logged and moved (step 1 $m1, step 24 $m24)" ||
  fail "mtp: mtp_loss missing or not going down ('$m1' -> '$m24')"
[ -z "$(field mtp_loss plain.A/metrics.jsonl | head -1)" ] && pass "plain: no mtp_loss field without --mtp" ||
  fail "plain: an mtp_loss field without --mtp"
l1p=$(loss_at plain.A/metrics.jsonl 1)
l1a=$(loss_at accum.A/metrics.jsonl 1)
if awk -v a="$l1p" -v b="$l1a" 'BEGIN { d = a - b; exit !(d < 1e-4 && d > -1e-4) }'; then
  pass "grad-accum 2: step-1 loss $l1a equals the single-batch $l1p (within 1e-4)"
else fail "grad-accum 2: step-1 loss $l1a vs single-batch $l1p"; fi

finish
