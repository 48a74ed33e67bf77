#!/usr/bin/env bash
# test_plan.sh — `moe plan` through the command line:
#  - the memory column of its rows equals what `moe info --world N` prints for the same layout, run with
#    the flags of the row's own launch command (the largest per-rank cuda total: one accounting), for every
#    5th row of the small preset on 4 GPUs and the top rows of the reference model on 8;
#  - --explain of a row's layout words gives that row's figures;
#  - --explain --out FILE.png draws the step's timeline: a PNG, and the lanes' idle fractions printed beside
#    it are the simulator's on each stage's own times (1f1b on 2 stages, 4 micro-batches, the last stage
#    slower by the LM head: each lane's idle by hand from the stages' FLOPs; interleaved: their mean is the
#    bubble --explain prints);
#  - a JSON profile with the h200 built-in's numbers gives the built-in's table;
#  - a model that fits nowhere: the smallest count named fits and none below it does (bf16 too; past one
#    node, whole nodes);
#  - --global-batch is --batch;
#  - bad input: one "moe: error:" line naming the problem, no file touched.
set -u
. "$(dirname "$0")/lib.sh"

W="$TMP/w"
mkdir -p "$W" && cd "$W" || exit 1
GUARD="$W"

# The largest byte figure of moe info's per-rank cuda lines ("per rank (cuda, ...): X plus the CUDA
# context", "  stage S per rank (cuda, ...): X plus ..."), as printed.
info_mem() {
  grep -E '^per rank \(cuda|^  stage [0-9]+ per rank \(cuda' | grep -oE '[0-9.]+ [KMGT]?i?B plus the CUDA context$' | sed 's/ plus the CUDA context$//' |
    awk '{u = $2 == "B" ? 1 : $2 == "KiB" ? 2^10 : $2 == "MiB" ? 2^20 : $2 == "GiB" ? 2^30 : 2^40;
          if ($1 * u > best) { best = $1 * u; s = $0 } } END { print s }'
}

# check_rows N STRIDE MODEL...: rows 1, 1+STRIDE, ... of `moe plan --gpus N MODEL...` against moe info
check_rows() {
  local n="$1" stride="$2" bad=0 checked=0; shift 2
  "$MOE" plan --gpus "$n" --top 100000 "$@" >"$TMP/plan.txt" || { fail "moe plan --gpus $n $*"; return; }
  while read -r idx; do
    local row cmd want got
    row=$(grep -E "^ +$idx  tp" "$TMP/plan.txt")
    cmd=$(grep -A1 -E "^ +$idx  tp" "$TMP/plan.txt" | tail -n 1)
    want=$(echo "$row" | awk '{print $13, $14}')
    # the launch command's flags after "train", less --device (moe info has no device)
    args=$(echo "$cmd" | sed 's/.* build\/moe train//; s/ --device cuda//')
    # shellcheck disable=SC2086
    got=$("$MOE" info --world "$n" $args | info_mem)
    checked=$((checked + 1))
    if [ "$want" != "$got" ]; then
      bad=$((bad + 1))
      echo "    row $idx: plan $want, moe info $got: $args"
    fi
  done < <(grep -oE '^ +[0-9]+  tp' "$TMP/plan.txt" | awk -v s="$stride" '($1 - 1) % s == 0 {print $1}')
  if [ "$checked" -gt 3 ] && [ "$bad" = 0 ]; then pass "moe plan --gpus $n $*: $checked rows' memory as moe info prints it"
  else fail "moe plan --gpus $n $*: $bad of $checked rows differ from moe info"; fi
}
check_rows 4 5 --preset small --batch 16 --seq-len 128
check_rows 8 1 --preset peers-ref --batch 32 --seq-len 2048 --top 12
check_rows 8 1 --preset small --batch 16 --seq-len 128 --precision bf16 --top 12
# (the launch commands carry the FP8 options the plan counted: --fp8-save's memory, --fp8-dispatch's bytes)
check_rows 8 1 --preset peers-ref --batch 32 --seq-len 2048 --precision fp8-bf16 --fp8-save 1 --fp8-dispatch 1 --top 6
check_rows 8 1 --preset peers-ref --batch 32 --seq-len 2048 --precision fp8-bf16 --fp8-weight-cache 0 --top 6
# (and --loss-chunks: the logits of a chunk of each micro-batch's rows)
check_rows 8 1 --preset peers-ref --batch 32 --seq-len 2048 --loss-chunks 4 --top 8
# --loss-chunks past a layout's rows a rank: that layout refused (as moe train refuses it), every row kept has the rows
"$MOE" plan --gpus 8 --batch 16 --seq-len 64 --loss-chunks 200 --top 100000 > "$TMP/lc.txt"
short=$(grep -E '^ +[0-9]+  tp' "$TMP/lc.txt" | grep -oE 'dp[0-9]+ zero[0-9] micro[0-9]+' |
  awk '{ dp = substr($1, 3); m = substr($3, 6); if (16 / (dp * m) * 64 < 200) n++ } END { print n + 0 }')
kept=$(grep -cE '^ +[0-9]+  tp' "$TMP/lc.txt")
check "--loss-chunks 200: no row with fewer rows a rank than chunks ($short of $kept)" test "$kept" -gt 0 -a "$short" = 0
# --vocab-parallel on a TP layout (this ranking's top rows are tp1): --explain's memory is what moe info prints
# for the launch command it gives, which carries the option, and lower than without it
ex() { "$MOE" plan --gpus 8 --preset peers-ref --batch 32 --seq-len 2048 --explain "tp2 ep4" "$@"; }
ex_mem() { sed -n -E "s/^memory per GPU: ([0-9.]+ [KMGT]?i?B) \(moe info.*/\1/p"; }
ex --vocab-parallel 1 > "$TMP/ex1.txt"; ex > "$TMP/ex0.txt"
args=$(grep "build/moe train" "$TMP/ex1.txt" | sed 's/.* build\/moe train//; s/ --device cuda//')
# shellcheck disable=SC2086
got=$("$MOE" info --world 8 $args | info_mem)
m1=$(ex_mem < "$TMP/ex1.txt") m0=$(ex_mem < "$TMP/ex0.txt")
check "--explain tp2 ep4 --vocab-parallel 1: its command carries the option" grep -q -- "--vocab-parallel 1" <<< "$args"
check "--explain tp2 ep4 --vocab-parallel 1: memory $m1 as moe info prints it for its command ($got)" test "$m1" = "$got"
check "--explain tp2 ep4: memory lower with --vocab-parallel 1 ($m0 -> $m1)" \
  awk -v a="${m1% *}" -v b="${m0% *}" 'BEGIN { exit !(a + 0 > 0 && a + 0 < b + 0) }'

# Without --vocab-parallel every TP layout is priced both ways (the embedding and head whole, and split: the
# layout word "vocab", whose command alone carries --vocab-parallel 1); with the option given, only its way
# (tiny at V 32000 on 4 GPUs: the split head is the faster, every layout fits)
VP=(--gpus 4 --preset tiny --vocab-size 32000 --batch 8 --seq-len 64 --top 100000)
rows_of() { grep -E '^ *[0-9]+  tp' "$1"; }
"$MOE" plan "${VP[@]}" > "$TMP/vp.txt"
"$MOE" plan "${VP[@]}" --vocab-parallel 0 > "$TMP/vp0.txt"
"$MOE" plan "${VP[@]}" --vocab-parallel 1 > "$TMP/vp1.txt"
nv=$(rows_of "$TMP/vp.txt" | grep -c ' vocab ') nw=$(rows_of "$TMP/vp.txt" | grep -E '^ *[0-9]+  tp[2-9]' | grep -vc ' vocab ')
nc=$(grep -c -- '--vocab-parallel 1' "$TMP/vp.txt")
check "moe plan: every TP layout both ways ($nv rows split, $nw whole), the split ones' commands alone carry the option ($nc)" \
  test "$nv" -gt 0 -a "$nv" = "$nw" -a "$nc" = "$nv"
check "moe plan: a split row's command after its own layout word" \
  awk '/^ *[0-9]+  tp/ { v = / vocab / } /build\/moe train/ { if (v != /--vocab-parallel 1/) bad = 1 } END { exit bad }' "$TMP/vp.txt"
check "moe plan --vocab-parallel 0: no split row, no command carries it" \
  test "$(grep -c ' vocab \|--vocab-parallel 1' "$TMP/vp0.txt")" = 0 -a \
  "$(rows_of "$TMP/vp0.txt" | grep -cE '^ *[0-9]+  tp[2-9]')" = "$nw"
n1=$(rows_of "$TMP/vp1.txt" | grep -E '^ *[0-9]+  tp[2-9]' | grep -c ' vocab ')
check "moe plan --vocab-parallel 1: every TP row split ($n1), each command carries the option once" \
  test "$n1" = "$nv" -a "$(grep 'build/moe train' "$TMP/vp1.txt" | grep -c -- '--vocab-parallel 1 .*--vocab-parallel')" = 0
top=$(rows_of "$TMP/vp.txt" | head -1)
check "moe plan: the split head the faster here (row 1: $(echo "$top" | awk '{print $2, $NF}'))" grep -q ' vocab ' <<< "$top"

# --explain of row 3's words (and of the first split row's: "vocab" read back): the row's tokens/s and memory
"$MOE" plan --gpus 8 --preset small --batch 16 --seq-len 128 >"$TMP/plan.txt"
row=$(grep -E '^ +3  tp' "$TMP/plan.txt")
lay() { awk '{ s = $2; for (i = 3; i <= NF && $i !~ /^[0-9.]+$/; i++) s = s " " $i; print s }'; }
words=$(echo "$top" | lay) tps=$(echo "$top" | awk '{print $(NF-1)}')
check "--explain '$words' gives the row's tokens/s ($tps)" \
  grep -qE "^step: .* $tps tokens/s" <("$MOE" plan "${VP[@]}" --explain "$words")
words=$(echo "$row" | lay)
"$MOE" plan --gpus 8 --preset small --batch 16 --seq-len 128 --explain "$words" >"$TMP/explain.txt"
tps=$(echo "$row" | awk '{print $(NF-1)}')
mem=$(echo "$row" | awk -v n="$(echo "$words" | wc -w)" '{print $(n + 2), $(n + 3)}')
check "--explain '$words' gives the row's tokens/s ($tps)" grep -qE "^step: .* $tps tokens/s" "$TMP/explain.txt"
check "--explain '$words' gives the row's memory ($mem)" grep -qF "= $mem of" "$TMP/explain.txt"
check "--explain names the layout and says it fits" grep -qE "^layout: $words$" "$TMP/explain.txt"
grep -q ': fits$' "$TMP/explain.txt" || fail "--explain: no 'fits'"

# --explain --out: the timeline. 1f1b, 2 stages, 4 micro-batches of the tiny preset (one layer a stage, the
# LM head on the second) on a profile of equal compute rates, the links and HBM so fast that the messages
# and AdamW vanish: a stage's forward is its FLOPs a token (T 64, d 96, 4 heads of 24, 2 kv heads, 4 experts
# of 192, top-2, vocab 256): a = a layer = 2 d hd (2 H + 2 KV) + 2 x 2 H hd T / 2 + 2 d E + k x 2 x 3 d f
# = 55296 + 12288 + 768 + 221184 = 289536 on stage 0, c = a + the head 2 d V = 338688 on stage 1, each
# backward 2x its forward. Stage 0 runs F F B F B F B B, stage 1 F B four times: stage 0's forwards at
# [0, a], [a, 2a]; stage 1's first F + B [a, a + 3c]; from there every F + B of stage 1 waits for nothing
# (c >= a) and stage 0's backwards wait for stage 1's: the span is 3a + 12c, stage 0 busy 12a (idle 12c - 9a),
# stage 1 busy 12c (idle 3a): idle 29.57% and 17.61%, the bubble their mean 23.59% (equal stages: 20%).
png_ok() { [ -s "$1" ] && [ "$(head -c 8 "$1" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ]; }
cat >"$W/eq.json" <<'J'
{"memory_bytes": 1e12, "context_bytes": 1, "peak_tflops": 1, "dense_tflops": 0.001, "grouped_tflops": 0.001,
 "attention_tflops": 0.001, "hbm_gbps": 1e15, "nvlink_gbps": 1e15, "internode_gbps": 1e15, "pcie_gbps": 1}
J
run_ok "--explain 'pp2 micro4' --out tl.png" "$MOE" plan --gpus 2 --gpu "$W/eq.json" --preset tiny --batch 8 --seq-len 64 --explain "pp2 micro4" --out tl.png
cp "$OUT_FILE" tl.txt
check "  tl.png is a PNG" png_ok tl.png
read -r i0 i1 ib < <(awk 'BEGIN { a = 289536; c = 338688; s = 3 * a + 12 * c
  printf "%.2f %.2f %.2f\n", 100 * (12 * c - 9 * a) / s, 100 * 3 * a / s, 100 * (1 - 12 * (a + c) / (2 * s)) }')
check "  stage 0 idles $i0%, stage 1 $i1% (by hand: the last stage slower by the head)" \
  bash -c "grep -qE '^  stage 0: busy [0-9.]+%, idle $i0%$' tl.txt && grep -qE '^  stage 1: busy [0-9.]+%, idle $i1%$' tl.txt"
check "  the lanes' mean idle is the bubble --explain prints ($ib%)" \
  bash -c "grep -q '^pipeline bubble: $(printf %.1f "$ib")%' tl.txt && grep -q '^  mean idle $ib% = the simulated bubble $ib%' tl.txt"
run_ok "--explain 'pp2 vpp2 micro4 ep2' --out tl2.png (interleaved)" "$MOE" plan --gpus 4 --preset small --batch 16 --seq-len 128 \
  --explain "pp2 vpp2 micro4 ep2" --out tl2.png
cp "$OUT_FILE" tl2.txt
check "  tl2.png is a PNG" png_ok tl2.png
lanes=$(grep -E '^  stage [0-9]+: busy' tl2.txt | sed -E 's/.*idle ([0-9.]+)%/\1/' | awk '{s += $1; n++} END {if (n) printf "%.1f", s / n}')
bub=$(sed -n 's/^pipeline bubble: \([0-9.]*\)%.*/\1/p' tl2.txt)
check "  2 lanes; their mean idle $lanes% is the bubble --explain prints ($bub%)" \
  bash -c "[ \"\$(grep -cE '^  stage [0-9]+: busy' tl2.txt)\" = 2 ] && [ -n '$bub' ] && [ '$lanes' = '$bub' ] && [ '$bub' != 0.0 ]"
check "  one lane for one stage, idle 0.00%" bash -c "'$MOE' plan --gpus 1 --preset tiny --batch 8 --seq-len 64 --explain micro2 --out tl3.png | grep -q '^  stage 0: busy 100.00%, idle 0.00%' && [ -s tl3.png ]"

# The host overhead's launch count (plan.c PLAN_OPS_*) against the backend ops `moe train` calls: the
# MOE_PROFILE=1 report's calls of 3 steps and of 5 (the first step is not profiled, the final evaluation
# is in both: their difference is 2 steps' ops), at 1 and 2 micro-batches, and the count --explain prints.
text_bytes 20000 3 >"$W/d.txt"
op_calls() { # STEPS MICRO
  MOE_PROFILE=1 OMP_NUM_THREADS=1 "$MOE" train --device cpu --preset tiny --data "$W/d.txt" --batch $((2 * $2)) \
    --grad-accum "$2" --seq-len 32 --steps "$1" --eval-every 0 --eval-batches 1 --sample-tokens 0 --plots 0 \
    --save-every -1 --force --out "$W/ops" 2>&1 | grep -oE '\([0-9]+ calls\)' | grep -oE '[0-9]+' | awk '{s += $1} END {print s + 0}'
}
for micro in 1 2; do
  got=$(( ($(op_calls 5 $micro) - $(op_calls 3 $micro)) / 2 ))
  want=$("$MOE" plan --gpus 1 --preset tiny --batch $((2 * micro)) --seq-len 32 --explain "micro$micro" |
         sed -n 's/^host overhead: .* (\([0-9]*\) launches.*/\1/p')
  check "micro-batches $micro: the planner's $want launches a step are the $got ops moe train calls" \
    test -n "$got" -a "$got" -gt 20 -a "$got" = "$want"
done

# a JSON profile holding the h200 built-in's numbers (hwprofile.c) gives its table
cat >"$TMP/h200.json" <<'J'
{"name": "h200", "memory_bytes": 149250113536, "context_bytes": 536870912, "peak_tflops": 989,
 "dense_tflops": 448.9, "grouped_tflops": 552.0, "attention_tflops": 213.0, "hbm_gbps": 4012,
 "nvlink_gbps": 126, "internode_gbps": 14, "pcie_gbps": 25}
J
"$MOE" plan --gpus 16 --nodes-of 4 --preset small --batch 32 --seq-len 128 --top 30 >"$TMP/a.txt"
"$MOE" plan --gpus 16 --nodes-of 4 --preset small --batch 32 --seq-len 128 --top 30 --gpu "$TMP/h200.json" >"$TMP/b.txt"
check "a JSON profile of the h200's numbers gives the built-in's table" cmp -s "$TMP/a.txt" "$TMP/b.txt"
# the same profile with the links twice as fast: the best row no slower
sed 's/"nvlink_gbps": 126, "internode_gbps": 14/"nvlink_gbps": 252, "internode_gbps": 28/' "$TMP/h200.json" >"$TMP/fast.json"
"$MOE" plan --gpus 16 --nodes-of 4 --preset small --batch 32 --seq-len 128 --top 1 --gpu "$TMP/fast.json" >"$TMP/c.txt"
a=$(grep -E '^ +1  tp' "$TMP/a.txt" | awk '{print $(NF-1)}')
c=$(grep -E '^ +1  tp' "$TMP/c.txt" | awk '{print $(NF-1)}')
check "twice the link bandwidth: the best layout's tokens/s $a -> $c, not lower" fcmp "$c" ">=" "$a"

# --recompute-layers: a GPU of 94.5 GiB, where the reference model at micro 2 fits recomputing every layer's
# experts (90.65 GiB by test_plan.c's figures) but not keeping them (98.39): the row recomputes the fewest
# first layers that fit (test_plan.c checks it is the fewest), its command and --explain words say how many
sed 's/"memory_bytes": 149250113536/"memory_bytes": 101468602368/' "$TMP/h200.json" >"$TMP/small.json"
"$MOE" plan --gpus 1 --preset peers-ref --batch 8 --seq-len 2048 --top 40 --gpu "$TMP/small.json" >"$TMP/rl.txt"
n=$(grep -oE 'micro2 recompute-moe recompute-layers[0-9]+' "$TMP/rl.txt" | head -1 | grep -oE '[0-9]+$')
check "--recompute-layers: micro2 recompute-moe in the first $n layers (of 16)" test -n "$n" -a "${n:-0}" -ge 1 -a "${n:-16}" -lt 16
check "--recompute-layers: its command" grep -q -- "--recompute moe --recompute-layers $n --grad-accum 2" "$TMP/rl.txt"
run_ok "--explain 'micro2 recompute-moe recompute-layers$n'" "$MOE" plan --gpus 1 --preset peers-ref --batch 8 \
  --seq-len 2048 --gpu "$TMP/small.json" --explain "micro2 recompute-moe recompute-layers$n"

# a model too big for one GPU: the smallest count that fits, and each other policy's (the search skips the
# counts where the weights, gradients and moments alone cannot fit: every count below the one named is
# searched here, so a floor that skipped a count that fits would show)
run_ok "mixtral-8x7b on 1 GPU" "$MOE" plan --gpus 1 --preset mixtral-8x7b --batch 8 --seq-len 4096
g=$(grep -oE 'the smallest GPU count that fits \(in whole nodes of 8 past one\): [0-9]+' "$OUT_FILE" | awk '{print $NF}')
gb=$(grep -oE 'under --precision bf16: [0-9]+' "$OUT_FILE" | awk '{print $NF}')
if [ -n "$g" ] && [ "$g" -gt 1 ] && [ "$g" -le 8 ]; then
  "$MOE" plan --gpus "$g" --preset mixtral-8x7b --batch 8 --seq-len 4096 >"$TMP/g.txt"
  check "the smallest count named ($g) fits" grep -qE '^ +1  tp' "$TMP/g.txt"
  for n in $(seq 2 $((g - 1))); do
    "$MOE" plan --gpus $n --preset mixtral-8x7b --batch 8 --seq-len 4096 >"$TMP/g1.txt"
    check "$n GPUs do not" grep -q "fits nowhere on $n GPU" "$TMP/g1.txt"
  done
else fail "no smallest GPU count of one node named ('$g')"; show_output; fi
if [ -n "$gb" ] && [ "$gb" -gt 1 ] && [ "$gb" -le 8 ]; then
  "$MOE" plan --gpus "$gb" --preset mixtral-8x7b --batch 8 --seq-len 4096 --precision bf16 >"$TMP/g.txt"
  "$MOE" plan --gpus $((gb - 1)) --preset mixtral-8x7b --batch 8 --seq-len 4096 --precision bf16 >"$TMP/g1.txt"
  check "under bf16 the count named ($gb) fits" grep -qE '^ +1  tp' "$TMP/g.txt"
  check "under bf16 $((gb - 1)) GPUs do not" grep -q "fits nowhere on $((gb - 1)) GPU" "$TMP/g1.txt"
else fail "no smallest bf16 GPU count of one node named ('$gb')"; show_output; fi
# past one node the counts are whole nodes: mixtral-8x22b on 4 GPUs of nodes of 8 names a multiple of 8, which
# fits, and the node count below it does not
run_ok "mixtral-8x22b on 4 GPUs" "$MOE" plan --gpus 4 --preset mixtral-8x22b
g=$(grep -oE 'the smallest GPU count that fits \(in whole nodes of 8 past one\): [0-9]+' "$OUT_FILE" | awk '{print $NF}')
if [ -n "$g" ] && [ "$g" -gt 8 ] && [ $((g % 8)) = 0 ]; then
  "$MOE" plan --gpus "$g" --preset mixtral-8x22b >"$TMP/g.txt"
  "$MOE" plan --gpus $((g - 8)) --preset mixtral-8x22b >"$TMP/g1.txt"
  check "the whole-node count named ($g) fits" grep -qE '^ +1  tp' "$TMP/g.txt"
  check "$((g - 8)) GPUs do not" grep -q "fits nowhere on $((g - 8)) GPU" "$TMP/g1.txt"
else fail "no whole-node count named for mixtral-8x22b ('$g')"; show_output; fi

# bad input
cat >"$TMP/missing.json" <<'J'
{"memory_bytes": 1e11, "context_bytes": 5e8, "peak_tflops": 989, "dense_tflops": 400, "grouped_tflops": 500,
 "attention_tflops": 200, "nvlink_gbps": 100, "internode_gbps": 10, "pcie_gbps": 25}
J
sed 's/"pcie_gbps": 25/"pcie_gbps": 25, "hbm": 3000/; s/"memory_bytes"/"hbm_gbps": 3000, "memory_bytes"/' "$TMP/missing.json" >"$TMP/typo.json"
sed 's/"nvlink_gbps": 100/"nvlink_gbps": -1/; s/"memory_bytes"/"hbm_gbps": 3000, "memory_bytes"/' "$TMP/missing.json" >"$TMP/neg.json"
printf '{"memory_bytes": ' >"$TMP/broken.json"
cp "$TMP"/*.json "$W/"
P=("$MOE" plan --preset small --batch 16 --seq-len 128)
run_fail "--gpus N is required" "${P[@]}"
run_fail "--gpus must be in [1, 65536] (got 0)" "${P[@]}" --gpus 0
run_fail "--gpu a100: no such profile (built in: h200, h100" "${P[@]}" --gpus 2 --gpu a100
run_fail '"hbm_gbps" is missing' "${P[@]}" --gpus 2 --gpu missing.json
run_fail 'unknown key "hbm"' "${P[@]}" --gpus 2 --gpu typo.json
run_fail '"nvlink_gbps" must be a positive number' "${P[@]}" --gpus 2 --gpu neg.json
run_fail "not a JSON object" "${P[@]}" --gpus 2 --gpu broken.json
run_fail "cannot read './nope.json'" "${P[@]}" --gpus 2 --gpu ./nope.json
run_fail "impossible layout 'tp3': mesh: world size 4 is not divisible by tp 3" "${P[@]}" --gpus 4 --explain tp3
# --global-batch (Megatron's name, the issue's command) is --batch: the same table
a=$("$MOE" plan --gpus 4 --preset small --batch 16 --seq-len 128 --top 3 2>&1)
b=$("$MOE" plan --gpus 4 --preset small --global-batch 16 --seq-len 128 --top 3 2>&1)
[ -n "$a" ] && [ "$a" = "$b" ] && echo "$a" | grep -q "batch 16 x 128" && pass "--global-batch 16 prints --batch 16's table" ||
  fail "--global-batch 16 printed another table than --batch 16"

run_fail "impossible layout 'pp8': pipeline: n_layers 4 is not divisible by --pp 8" "${P[@]}" --gpus 8 --explain pp8
run_fail "n_experts 8 is not divisible by ep 16" "${P[@]}" --gpus 16 --explain ep16
run_fail "'foo' is not a layout word" "${P[@]}" --gpus 2 --explain "tp2 foo"
run_fail "--imbalance must be in [1, 64] (got 0.5)" "${P[@]}" --gpus 2 --imbalance 0.5
run_fail "--comm-exposed must be in [0, 1] (got 2)" "${P[@]}" --gpus 2 --comm-exposed 2
run_fail "--nodes-of must be >= 1" "${P[@]}" --gpus 2 --nodes-of 0
run_fail "option '--tp' does not apply to this command" "${P[@]}" --gpus 2 --tp 2
run_fail "--out applies to --calibrate (the profile) or --explain" "${P[@]}" --gpus 2 --out x.png
run_fail 'profile h200 has no "fp8_grouped_tflops"' "${P[@]}" --gpus 2 --precision fp8 --gpu h200.json
run_fail "impossible layout 'etp2': mesh: --precision fp8 takes --etp 1 (got 2)" "${P[@]}" --gpus 2 --precision fp8 --explain etp2
run_fail "--out names the profile of --calibrate or the timeline of --explain, not both" "${P[@]}" --gpus 1 \
  --calibrate --explain micro1 --out x.png
run_fail "--out nodir/t.png: no directory 'nodir'" "${P[@]}" --gpus 1 --explain micro1 --out nodir/t.png

finish
