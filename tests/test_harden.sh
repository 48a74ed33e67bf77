#!/usr/bin/env bash
# test_harden.sh — the bad inputs of issue 18 through the CLI, each refused with one "moe: error:"
# line naming the problem, a non-zero exit that is not a crash, and no file in the work directory
# changed: integer overflows in mesh / batch / sample / bucket figures (1), a capacity factor too
# large for an int (2, must drop nothing), non-finite float options (3), a checkpoint with an extra
# tensor on --resume (5), loose parsing (7), deletions before validation in --init-from and export
# (8), a FIFO as --data (9, must not hang). (state.json ranges, the strict safetensors reader and
# the exit leak are C tests: test_strict.c.)
set -u
. "$(dirname "$0")/lib.sh"

small_fixture

run_ok "fixture: a run with checkpoints at steps 2 and 4" \
  "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 4 --save-every 2 --keep 0 --out run
run_ok "fixture: its export" "$MOE" export --ckpt run --out hf
echo '{"steps": 2, "seed": 3}' >good.json
run_ok "control: a config file with integers" "$MOE" info --config good.json

GUARD="$W"
T=("$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 2 --out new)

# ---- 1: integer overflows (were SIGFPE, a negative world, or wrapped sizes)
run_fail "ranks per stage is not divisible by ep 65536 x etp 65536" "$MOE" info --world 4 --ep 65536 --etp 65536
run_fail "ranks per stage is not divisible by ep 65536 x etp 65536" "${T[@]}" --ep 65536 --etp 65536
run_fail "tp 2 x ep 1073741824" "$MOE" info --tp 2 --ep 1073741824
run_fail "max_seq_len must be in 2..16777216" "$MOE" info --seq-len 2147483647 --max-seq-len 2147483647 --dispatch capacity
run_fail "max_seq_len must be in 2..16777216" "${T[@]}" --seq-len 2147483647 --max-seq-len 2147483647 --dispatch capacity
run_fail "tokens per micro-batch" "$MOE" eval --ckpt run --batch 2147483647 --seq-len 16
run_fail "tokens per micro-batch" "${T[@]}" --batch 1073741824 --seq-len 16
run_fail "--tokens must be in 0..1048576" "$MOE" sample --ckpt run --tokens 2147483647
run_fail "--bucket-mb must be in (0, 1048576]" "${T[@]}" --bucket-mb 1e30
echo '{"steps": 1e300}' >steps.json
run_fail "\"steps\" must be an integer" "$MOE" train --config steps.json --out new
echo '{"seed": 1e20}' >seed.json
run_fail "\"seed\" must be an integer" "$MOE" train --config seed.json --out new
echo '{"seed": -3}' >seedneg.json
run_fail "'-3' is not a non-negative integer" "$MOE" train --config seedneg.json --out new

# ---- 2: a capacity factor beyond int range drops nothing (it drops every token when it wraps)
GUARD=""
run_ok "capacity factor 1e8 trains" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 2 --out cap --dispatch capacity --capacity-factor 1e8
d=$(field dropped cap/metrics.jsonl | sort -u | tr '\n' ' ')
check "capacity factor 1e8: no token dropped (dropped: $d)" test "$d" = "0 "
rm -rf cap
GUARD="$W"

# ---- 3: every float option finite and in its range
for o in rope-theta norm-eps z-coef aux-coef init-std lr jitter capacity-factor min-lr-frac weight-decay beta1 \
         beta2 adam-eps grad-clip bucket-mb; do
  run_fail "--$o: 'inf' is not a finite number" "${T[@]}" --dispatch capacity --$o inf
done
run_fail "--lr: 'nan' is not a finite number" "${T[@]}" --lr nan
echo '{"lr": 1e999}' >lr.json
run_fail "\"lr\" is not a finite number" "$MOE" train "${SMALL[@]}" --config lr.json --out new
run_fail "--lr must be in (0, 10]" "${T[@]}" --lr 1e30
run_fail "rope_theta must be in (0, 1e+12]" "${T[@]}" --rope-theta 1e30
run_fail "norm_eps must be in (0, 1]" "${T[@]}" --norm-eps 5
run_fail "init_std must be in (0, 10]" "${T[@]}" --init-std 1e20
run_fail "aux_coef must be in [0, 100]" "${T[@]}" --aux-coef 1e20
run_fail "z_coef must be in [0, 100]" "${T[@]}" --z-coef 1e20
run_fail "--temperature: 'inf' is not a finite number" "$MOE" sample --ckpt run --tokens 2 --temperature inf

# ---- 5: --resume checks the tensors as eval does (an extra tensor is refused by both)
cp -r run extra
GUARD=""
f=extra/step_00000004/model.safetensors
perl -e 'open(my $h, "<:raw", $ARGV[0]) or die; local $/; my $d = <$h>; close $h;
  my $n = unpack("Q<", substr($d, 0, 8)); my $j = substr($d, 8, $n); my $data = substr($d, 8 + $n);
  $j =~ s/\s+$//; my $len = length($data);
  $j =~ s/^\{/{"extra.weight":{"dtype":"F32","shape":[1],"data_offsets":[$len,@{[$len + 4]}]},/;
  $j .= " " x ((8 - (8 + length($j)) % 8) % 8);
  open(my $o, ">:raw", $ARGV[0]) or die; print $o pack("Q<", length($j)), $j, $data, pack("f<", 1.5); close $o' "$f"
crc32() { gzip -c <"$1" | tail -c 8 | od -An -tx4 -N4 | tr -d ' \n'; }
size=$(wc -c <"$f")
perl -i -pe "s/\"model.safetensors\":\s*\"[0-9a-f]{8}\"/\"model.safetensors\": \"$(crc32 "$f")\"/; s/\"model.safetensors\":\s*[0-9]+/\"model.safetensors\": $size/" extra/step_00000004/checksums.json
GUARD="$W"
run_fail "has tensor extra.weight, which the model config does not have" "$MOE" eval --ckpt extra "${EVAL[@]}"
run_fail "has tensor extra.weight, which the model config does not have" \
  "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --steps 6 --out extra --resume

# ---- 7: loose parsing
printf '{"steps": 2} {"steps": 3}\n' >trail.json
run_fail "--config trail.json: not a JSON object" "$MOE" train --config trail.json --out new
printf '{"steps": 2, "steps": 3}\n' >dup.json
run_fail "has the key \"steps\" twice" "$MOE" train --config dup.json --out new
printf '{"steps": true}\n' >bool.json
run_fail "\"steps\" must be an integer" "$MOE" train --config bool.json --out new
run_fail "renormalize must be 0 or 1 (got 2)" "${T[@]}" --renormalize 2
run_fail "' 5' is not an integer" "${T[@]}" --steps " 5"
run_fail "' 0.1' is not a number" "${T[@]}" --lr " 0.1"
run_fail "--data: the path is empty" "${T[@]}" --data ""
run_fail "--world must be >= 1 (got -1)" "$MOE" info --world -1
run_fail "--zero must be 0, 1 or 2 (got 5)" "$MOE" info --zero 5
run_fail "--seq-len must be >= 1 (got -5)" "$MOE" info --seq-len -5
run_fail "--batch must be >= 1 (got -5)" "$MOE" info --batch -5

# ---- 8: validate before deleting
mkdir -p badhf && cp hf/config.json badhf/ && head -c 100 hf/model.safetensors >badhf/model.safetensors
cp -r run victim
run_fail "is corrupt" "$MOE" train --init-from badhf "${SMALL[@]}" --steps 2 --out victim --force
run_fail "is corrupt" "$MOE" train --init-from badhf "${SMALL[@]}" --steps 2 --out fresh
GUARD=""
rm -rf victim
mkdir -p out.tmp && echo precious >out.tmp/keep.txt
run_ok "export next to an unrelated out.tmp" "$MOE" export --ckpt run --out out
check "export left the unrelated out.tmp alone" test "$(cat out.tmp/keep.txt 2>/dev/null)" = precious
before=$(sha256sum <run/step_00000004/model.safetensors)
printf 'XXXX' | dd of=out/model.safetensors bs=1 seek=100 conv=notrunc status=none
check "rewriting the exported file leaves the checkpoint intact" \
  test "$(sha256sum <run/step_00000004/model.safetensors)" = "$before"
run_ok "the checkpoint still evaluates" "$MOE" eval --ckpt run "${EVAL[@]}"
rm -rf out out.tmp
GUARD="$W"

# ---- 9: a FIFO (or any non-regular file) is refused at once, not read forever
mkfifo fifo
run_fail "'fifo' is not a regular file" timeout 20 "${T[@]}" --data fifo
run_fail "'fifo' is not a regular file" timeout 20 "${T[@]}" --data fifo.bin --data fifo
ln -s fifo fifo.bin
run_fail "'fifo.bin' is not a regular file" timeout 20 "${T[@]}" --data fifo.bin
run_fail "'fifo' is not a regular file" timeout 20 "$MOE" train --config fifo --out new
run_fail "'fifo' is not a regular file" timeout 20 "$MOE" eval --ckpt run "${EVAL[@]}" --data fifo

finish
