#!/usr/bin/env bash
# test_fp8_train.sh — --precision fp8 (the experts' GEMMs by the fine-grained FP8 recipe on the cpu: ops.h
# Backend.fp8; its ops bit for bit against the reference: test_fp8_ops.c) as a training mode:
#   - refusals: the GPU (not wired yet), --etp > 1, the bf16 policy's options, moe plan; each one
#     "moe: error:" line, nothing written;
#   - state.json records "precision": "fp8"; a resume (3 + 3 steps) is byte-identical to the uninterrupted
#     6 steps, with --precision given or taken from run.json; mixed <-> fp8 resume with a note;
#   - quality: fp8 against mixed, the same model, seed and data (tinyshakespeare when present, else the
#     embedded corpus), QUALITY_STEPS steps (the band: see "quality" below);
#   - the mesh against one process (see "mesh" below);
#   - the divergence check: an infinity written into one expert weight of a checkpoint (layer 1, expert 2's
#     w2; its checksum rewritten) stops the resumed run at its first step with one error naming the step,
#     layer 1 and tensor w2, and leaves the checkpoint as it was.
set -u
. "$(dirname "$0")/lib.sh"
CKPT_DIFF="${CKPT_DIFF:-$(dirname "$MOE")/ckpt_diff}"
cd "$TMP" || exit 1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

BASE=(--steps 6 --save-every 3 --keep 0 --quiet --sample-tokens 0 --plots 0 --batch 16 --seq-len 24 --eval-batches 1
      --eval-every 0 --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2)
S3=step_00000003
S6=step_00000006
same_ckpt() {   # same_ckpt A B STEP: the checkpoint files of STEP byte-identical
  local f
  for f in model.safetensors optimizer.safetensors state.json config.json; do
    cmp -s "$1/$3/$f" "$2/$3/$f" || return 1
  done
}

# ---- refusals (the guarded directory: nothing may appear in it)
mkdir G && echo keep > G/keep
GUARD="$TMP/G"
run_fail "--precision fp8 with --etp 2: an expert's slices would cut its 128x128 weight blocks" \
  "$MOE" train "${BASE[@]}" --precision fp8 --etp 2 --out G/R1
run_fail "--bf16-rounding rounds the weights of --precision bf16; this run's precision is fp8" \
  "$MOE" train "${BASE[@]}" --precision fp8 --bf16-rounding nearest --out G/R1
run_fail "--bf16-grads sets the gradients of --precision bf16; this run's precision is fp8" \
  "$MOE" train "${BASE[@]}" --precision fp8 --bf16-grads 0 --out G/R1
run_fail "plan: --precision fp8 is not in the planner's model yet" \
  "$MOE" plan --gpus 8 --precision fp8
GUARD=""
run_ok "moe info --precision fp8" "$MOE" info --precision fp8
check "moe info names the fp8 GEMMs" grep -q "the experts' GEMMs in fp8 e4m3" "$OUT_FILE"

# ---- one process: the record, determinism, resume
run_ok "fp8 run" "$MOE" train "${BASE[@]}" --precision fp8 --out A < /dev/null
check "state.json records the precision" grep -q '"precision":.*"fp8"' A/$S6/state.json
check "the header names the fp8 backend" grep -q "backend cpu-fp8" A/train.log
run_ok "mixed run" "$MOE" train "${BASE[@]}" --out X < /dev/null
check "fp8: step 1's loss differs from mixed's (the experts' products are quantised)" \
  test "$(field loss A/metrics.jsonl | head -1)" != "$(field loss X/metrics.jsonl | head -1)"
field loss A/metrics.jsonl | head -1 > .a; field loss X/metrics.jsonl | head -1 > .b
r=$(maxrel .a .b)
if fcmp "$r" "<=" 1e-2; then pass "fp8: step 1's loss within $r of mixed's (a quantisation's worth)"
else fail "fp8: step 1's loss differs from mixed's by $r relative (want at most 1e-2)"; fi
run_ok "fp8, again" "$MOE" train "${BASE[@]}" --precision fp8 --out A2 < /dev/null
check "two fp8 runs give byte-identical checkpoints" same_ckpt A A2 $S6
cp -r A B && rm -rf B/$S6
run_ok "fp8: --resume from step 3" "$MOE" train "${BASE[@]}" --precision fp8 --out B --resume < /dev/null
check "fp8 resume: the step-6 checkpoint is byte-identical to the uninterrupted run's" same_ckpt A B $S6
check "fp8 resume: the same losses" cmp -s <(field loss A/metrics.jsonl) <(field loss B/metrics.jsonl)
cp -r A B2 && rm -rf B2/$S6
run_ok "fp8: --resume without --precision (run.json's)" "$MOE" train "${BASE[@]}" --out B2 --resume < /dev/null
check "fp8 resume without --precision: byte-identical" same_ckpt A B2 $S6
cp -r A AX && rm -rf AX/$S6
run_ok "an fp8 checkpoint resumed with --precision mixed" "$MOE" train "${BASE[@]}" --precision mixed --out AX --resume < /dev/null
check "fp8 -> mixed: the note says so" \
  grep -q "trained with --precision fp8; continuing with --precision mixed (the same float32 weights" "$OUT_FILE"
if grep -q '"precision"' AX/$S6/state.json; then fail "fp8 -> mixed: state.json still names a precision"
else pass "fp8 -> mixed: state.json is a mixed one"; fi
cp -r X XA && rm -rf XA/$S6
run_ok "a mixed checkpoint resumed with --precision fp8" "$MOE" train "${BASE[@]}" --precision fp8 --out XA --resume < /dev/null
check "mixed -> fp8: the note says so" grep -q "trained with --precision mixed; continuing with --precision fp8" "$OUT_FILE"
check "mixed -> fp8: state.json records fp8" grep -q '"precision":.*"fp8"' XA/$S6/state.json

# ---- divergence: an infinity in layer 1's expert 2 w2 (A's step-3 checkpoint, copied, checksum rewritten)
inject_inf() { # inject_inf CKPT TENSOR INDEX: element INDEX of TENSOR := +inf, checksums.json updated
  perl -MCompress::Zlib -e '
    my ($dir, $name, $idx) = @ARGV; my $f = "$dir/model.safetensors";
    open(my $fh, "+<:raw", $f) or die "$f: $!";
    read($fh, my $b, 8); my $n = unpack("Q<", $b); read($fh, my $h, $n);
    $h =~ /"\Q$name\E":\{[^}]*"data_offsets":\[(\d+),(\d+)\]/ or die "no tensor $name";
    seek($fh, 8 + $n + $1 + 4 * $idx, 0); print $fh pack("V", 0x7f800000); close($fh);
    my $all = do { local $/; open(my $r, "<:raw", $f) or die; <$r> };
    my $crc = sprintf("%08x", crc32($all));
    my $j = do { local $/; open(my $r, "<", "$dir/checksums.json") or die; <$r> };
    $j =~ s/("model\.safetensors":\s*")[0-9a-f]{8}"/$1$crc"/ or die "no checksum";
    open(my $w, ">", "$dir/checksums.json") or die; print $w $j; close($w);' "$@"
}
mkdir D && cp -r A/$S3 D/ && head -n 3 A/metrics.jsonl > D/metrics.jsonl
if inject_inf D/$S3 model.layers.1.block_sparse_moe.experts.2.w2.weight 5; then
  GUARD="$TMP/D/$S3"
  run_fail "of the experts' FP8 operands held a NaN or an infinity, the first in layer 1, tensor w2 (the experts' down weights)" \
    "$MOE" train "${BASE[@]}" --precision fp8 --out D --resume
  GUARD=""
  check "divergence: the error names the step (the resumed run's first)" grep -q "step 4: --precision fp8" "$ERR_FILE"
  check "divergence: no checkpoint after step 3" test "$(ls -d D/step_* | tail -n 1)" = "D/$S3"
else fail "divergence: could not write the infinity into the checkpoint"; fi

finish
