#!/usr/bin/env bash
# test_plan_published.sh — the published Megatron-Core rows of docs/PLAN.md ("Published runs"): each row's
# command runs, and the parts of its prediction that can be derived by hand are what the planner prints:
#  - the training FLOPs per token `moe info` prints for DeepSeek-V3 (with its MTP module), Qwen3-235B-A22B
#    and Mixtral-8x22B at seq 4096, against the models' published shapes summed here (within 0.5%): the
#    TFLOP/s per GPU of the table is these FLOPs x tokens/s / GPUs, as Megatron's own formula counts them
#    (causal attention halved, every GEMM 3x for forward and backward);
#  - a stage's compute counts cost_flops' FLOPs once each (dense layers, MTP) at equal rates;
#  - the mechanisms, each alone against the same layout without it: --a2a-links split / deepep by hand; --combine bf16 sends 2 + 2 bytes a row
#    value where ours sends 2 out and 4 back (the EP time x 4/6); --internode-gbps 50 against the h100
#    profile's 14 (an EP group across nodes: its time x 14/50); --hide-a2a experts / 1f1b on one stage hides
#    min(all-to-all, the experts' GEMMs / the whole compute), all of it steady (no pipeline warmup);
#    --grouped-rate shape takes the nearest measured shape's rate over the reference's
#    (docs/PERFORMANCE.md's layer table: mixtral 566, qwen2 402, ref 556 TFLOP/s); --hide-a2a 1f1b on two
#    stages hides only the steady phase's share (Megatron's warmup count); --memory-model megatron keeps
#    6 + 12 / DP bytes a parameter where ours keeps 18 (zero 0);
#  - Megatron-Core's overlaps and its split head, each alone on the tiny / small presets at equal rates (every
#    GEMM 0.001 TFLOP/s, AdamW's seconds vanishing; a link fast or slow): --hide-tp gemm hides min(TP, the
#    TP-split GEMMs: 3 x tokens x layers x the projections' 2 d hd (2 H + 2 KV) / TP at the rate); --hide-dp
#    grads min(the reduction, one micro-batch's backward: 2/3 of the compute / m), grads+params also min(ZeRO
#    1's all-gather, a third of the DP bytes, one micro-batch's forward); --hide-pp next (the projections free:
#    equal chunks) every send up to its chunk's forward, all of them on a slow link (3 sends a stage on pp2
#    vpp2: half the stage's compute), none without interleaving; --vocab-parallel 1 (Megatron's vocab-parallel
#    head) the head's 2 d V x tokens x (1 - 1/TP) less compute, and under --memory-model megatron the tables'
#    state split as Megatron's; the published rows run with them;
#  - an overlap's cost: the hidden seconds cost the compute --overlap-sms / 132 of theirs (one mechanism, by
#    hand), and the messages hidden on a stage share its compute as one budget (two mechanisms wanting more
#    than the compute hide exactly the compute);
#  - the mechanisms' defaults change nothing: the same row with each option at its default prints the same;
#  - a bad word or rate: one `moe: error:` line.
set -u
. "$(dirname "$0")/lib.sh"

# DeepSeek-V3's published shapes (config.json): d 7168, 61 layers of which the first 3 dense (MLP 18432),
# 128 heads, q_lora 1536, kv_lora 512, qk_nope 128, qk_rope 64, v 128, 256 routed experts of 2048 top-8 and
# one shared of 2048, vocab 129280; one MTP module. Forward FLOPs per token at T = 4096 (a multiply-add 2):
#   MLA projections: 2 (d qr + qr H (nope + rope) + d (kvr + rope) + kvr H (nope + v) + H v d)
#   attention scores, causal: 2 H ((nope + rope) + v) T / 2
#   an MoE layer: router 2 d E, 9 SwiGLU experts of 2048: 9 x 2 x 3 d f; a dense layer: 2 x 3 d 18432
#   the LM head 2 d V; the MTP module: eh_proj 2 x 2d x d, an MoE layer, the head again
# training = 3 x forward. Qwen3-235B-A22B (GQA, head dim 128): proj 2 d hd (2 H + 2 KV), scores 2 x 2 H hd T/2,
# router 2 d E, 8 experts of 1536; Mixtral-8x22B the same with its shapes.
dsv3=$(awk 'BEGIN { d = 7168; H = 128; qr = 1536; kvr = 512; dn = 128; dr = 64; dv = 128; T = 4096
  E = 256; f = 2048; V = 129280
  proj = 2 * (d * qr + qr * H * (dn + dr) + d * (kvr + dr) + kvr * H * (dn + dv) + H * dv * d)
  att = proj + 2 * H * (dn + dr + dv) * T / 2
  moe = 2 * d * E + 9 * 2 * 3 * d * f; dense = 2 * 3 * d * 18432; head = 2 * d * V
  mtp = 2 * 2 * d * d + att + moe + head
  printf "%.6e\n", 3 * (61 * att + 58 * moe + 3 * dense + head + mtp) }')
gqa() { awk -v d="$1" -v L="$2" -v H="$3" -v KV="$4" -v E="$5" -v k="$6" -v f="$7" -v V="$8" 'BEGIN { hd = 128; T = 4096
  layer = 2 * d * hd * (2 * H + 2 * KV) + 2 * 2 * H * hd * T / 2 + 2 * d * E + k * 2 * 3 * d * f
  printf "%.6e\n", 3 * (L * layer + 2 * d * V) }'; }
qwen3=$(gqa 4096 94 64 4 128 8 1536 151936)
mixtral=$(gqa 6144 56 48 8 8 2 16384 32768)
info_flops() { "$MOE" info "$@" --seq-len 4096 --batch 1 | sed -n 's/^training FLOPs per token at seq 4096: \([0-9.]*\)B.*/\1e9/p'; }
for m in "deepseek-v3 --mtp 1:$dsv3" "qwen3-235b-a22b:$qwen3" "mixtral-8x22b:$mixtral"; do
  args=${m%%:*}; want=${m#*:}
  got=$(info_flops --preset $args)
  if [ -n "$got" ] && awk -v a="$got" -v b="$want" 'BEGIN { r = a / b; exit !(r > 0.995 && r < 1.005) }'; then
    pass "FLOPs per token, --preset $args: moe info $got, by hand $want"
  else fail "FLOPs per token, --preset $args: moe info '$got', by hand $want"; fi
done

# A stage's compute counts every FLOP of cost_flops once, dense layers and MTP modules included: with every
# rate equal (a profile of 0.001 TFLOP/s each, the HBM so fast that AdamW's seconds vanish), one GPU's compute
# x the rate / the tokens is moe info's FLOPs per token (deepseek-v3-tiny: a dense first layer, one MTP module)
cat > "$TMP/eq.json" <<'J'
{"memory_bytes": 1e12, "context_bytes": 1, "peak_tflops": 1, "dense_tflops": 0.001, "grouped_tflops": 0.001,
 "attention_tflops": 0.001, "hbm_gbps": 1e15, "nvlink_gbps": 1, "internode_gbps": 1, "pcie_gbps": 1}
J
comp=$("$MOE" plan --gpus 1 --gpu "$TMP/eq.json" --preset deepseek-v3-tiny --mtp 1 --batch 4 --seq-len 64 --explain micro1 |
  sed -n 's/^compute (the slowest stage): \([0-9.]*\) ms/\1/p')
fl=$("$MOE" info --preset deepseek-v3-tiny --mtp 1 --batch 4 --seq-len 64 | sed -n 's/^training FLOPs per token at seq 64: \([0-9.]*\)M.*/\1e6/p')
awk -v c="$comp" -v f="$fl" 'BEGIN { x = c * 1e-3 * 1e9 / 256; exit !(f > 0 && x / f > 0.995 && x / f < 1.005) }' &&
  pass "deepseek-v3-tiny --mtp 1 at equal rates: compute $comp ms = $fl FLOP a token x 256 tokens" ||
  fail "deepseek-v3-tiny --mtp 1 at equal rates: compute '$comp' ms, want $fl x 256 FLOP at 1e9 FLOP/s"

# The rows (docs/PLAN.md's commands): the published layouts, Megatron's split of the layers over 32 chunks
# (DeepSeek-V3's "Et|(tt|)*30mL" as 1,2 x 29,1,1: no chunk of ours is empty; Qwen3's 96 slots, the embedding
# and the loss counted as layers: 2,3 x 30,2).
L1=1; for i in $(seq 29); do L1="$L1,2"; done; L1="$L1,1,1"
L2=2; for i in $(seq 30); do L2="$L2,3"; done; L2="$L2,2"
MECH=(--combine bf16 --memory-model megatron --internode-gbps 50 --grouped-rate shape)
DS=(--gpus 1024 --gpu h100 --nodes-of 8 --preset deepseek-v3 --mtp 1 --batch 8192 --seq-len 4096 --precision fp8
  --pp-layers "$L1" --explain "tp2 ep64 pp8 vpp4 zero1 micro128")
QW=(--gpus 256 --gpu h100 --nodes-of 8 --preset qwen3-235b-a22b --batch 2048 --seq-len 4096 --precision fp8
  --pp-layers "$L2" --explain "tp2 ep32 pp8 vpp4 zero1 micro128")
MX=(--gpus 128 --gpu h100 --nodes-of 8 --preset mixtral-8x22b --batch 256 --seq-len 4096
  --explain "tp2 ep8 pp8 zero1 micro32")
for r in DS QW MX; do
  eval "args=(\"\${$r[@]}\")"
  extra=(--hide-a2a 1f1b); [ $r = MX ] && extra=()
  run_ok "row $r runs with the mechanisms" "$MOE" plan "${args[@]}" "${MECH[@]}" "${extra[@]}"
  grep -q '^step: [0-9.]* ms, [0-9]* tokens/s' "$OUT_FILE" || fail "row $r: no step line"
  grep -q -- "--pp-layers\|--preset mixtral" "$OUT_FILE" || fail "row $r: the launch command lost --pp-layers"
done

# the explain lines' figures
ms_of() { sed -n "s/^$1 *\([0-9.]*\) ms.*/\1/p"; }
ep_of() { ms_of 'exposed ep all-to-all'; }
plan() { "$MOE" plan "$@"; }
near() { awk -v a="$1" -v b="$2" -v t="$3" 'BEGIN { exit !(b != 0 && a / b > 1 - t && a / b < 1 + t) }'; }

# defaults: each option at its default prints what the row prints without it
a=$(plan "${DS[@]}"); b=$(plan "${DS[@]}" --hide-a2a none --a2a-links flat --combine f32 --grouped-rate profile --memory-model ours --internode-gbps 0 --hide-tp none --hide-pp none --hide-dp none --overlap-sms 20)
[ -n "$a" ] && [ "$a" = "$b" ] && pass "the mechanisms' defaults print today's row" || fail "defaults changed the row"

ONE=(--gpus 16 --gpu h100 --nodes-of 8 --preset qwen3-moe-30b-a3b --batch 16 --seq-len 4096 --explain "ep16 micro1")
# (one stage: the slowest stage is the same one whatever the link; ONE's EP group of 16 spans two nodes)
# --combine bf16: the EP time x (2 + 2) / (2 + 4)
f32=$(plan "${ONE[@]}" | ep_of); b16=$(plan "${ONE[@]}" --combine bf16 | ep_of)
near "$b16" "$(awk -v x="$f32" 'BEGIN { print x * 4 / 6 }')" 1e-4 && pass "--combine bf16: EP $f32 -> $b16 ms (x 4/6)" ||
  fail "--combine bf16: EP $f32 -> $b16 ms, want x 4/6"
# --internode-gbps 50 against the profile's 14: the EP time (across nodes) x 14 / 50
i50=$(plan "${ONE[@]}" --internode-gbps 50 | ep_of)
near "$i50" "$(awk -v x="$f32" 'BEGIN { print x * 14 / 50 }')" 1e-4 && pass "--internode-gbps 50: EP $f32 -> $i50 ms (x 14/50)" ||
  fail "--internode-gbps 50: EP $f32 -> $i50 ms, want x 14/50"

# --a2a-links (ONE: an EP group of 16 on 2 nodes of 8, 7 of a rank's 15 peers on its node; B = the flat
# EP time x 14 GB/s): split max(B 7/15 / 126, B 8/15 / 14); deepep max(B / 126, B r / (8 x 15/16) / 14), r
# the remote node's chance of one of a token's 8 experts, 1 - C(64, 8) / C(128, 8); node-limited routing
# (deepseek-v3-tiny, 4 groups of 2 experts on 4 nodes of 2 GPUs, 2 groups a token): r = 2 x 3/4 of 2 x 7/8 rows
lk=$(plan "${ONE[@]}" --a2a-links split | ep_of); ld=$(plan "${ONE[@]}" --a2a-links deepep | ep_of)
ws=$(awk -v t="$f32" 'BEGIN { B = t * 14; a = B * 7 / 15 / 126; b = B * 8 / 15 / 14; print (a > b ? a : b) }')
wd=$(awk -v t="$f32" 'BEGIN { B = t * 14; m = 1; for (i = 0; i < 8; i++) m *= (64 - i) / (128 - i)
  a = B / 126; b = B * (1 - m) / (8 * 15 / 16) / 14; print (a > b ? a : b) }')
near "$lk" "$ws" 1e-3 && near "$ld" "$wd" 1e-3 && pass "--a2a-links: split $lk ms, deepep $ld ms (flat $f32)" ||
  fail "--a2a-links: split '$lk' (want $ws), deepep '$ld' (want $wd), flat $f32"
DT=(--gpus 8 --gpu h100 --nodes-of 2 --preset deepseek-v3-tiny --batch 64 --seq-len 256 --internode-gbps 1
  --explain "ep8 micro1")
fl=$(plan "${DT[@]}" | ep_of); dd=$(plan "${DT[@]}" --a2a-links deepep | ep_of)
wd=$(awk -v t="$fl" 'BEGIN { B = t * 1; a = B / 126; b = B * 1.5 / 1.75 / 1; print (a > b ? a : b) }')
near "$dd" "$wd" 2e-3 && pass "--a2a-links deepep, node-limited routing: $fl -> $dd ms (x 1.5/1.75)" ||
  fail "--a2a-links deepep, node-limited: '$dd', want $wd (flat $fl)"

# --hide-a2a on one stage (no warmup: every micro-batch steady): hidden = min(EP, compute) for 1f1b; with
# the EP time above the experts' and below the whole compute, experts hides the experts' seconds only
o=$(plan "${ONE[@]}" --internode-gbps 400); ep=$(echo "$o" | ep_of); comp=$(echo "$o" | ms_of 'compute (the slowest stage):')
o1=$(plan "${ONE[@]}" --internode-gbps 400 --hide-a2a 1f1b)
h1=$(echo "$o1" | sed -n 's/^all-to-all hidden behind compute: \([0-9.]*\) ms/\1/p'); e1=$(echo "$o1" | ep_of)
want=$(awk -v a="$ep" -v b="$comp" 'BEGIN { print a < b ? a : b }')
near "$h1" "$want" 1e-4 && awk -v a="$e1" -v b="$ep" -v h="$h1" 'BEGIN { exit !(a + h > b - 0.02 && a + h < b + 0.02) }' &&
  pass "--hide-a2a 1f1b, one stage: hidden $h1 ms = min(EP $ep, compute $comp); exposed $e1 + hidden = EP" ||
  fail "--hide-a2a 1f1b, one stage: hidden '$h1' exposed '$e1', want min($ep, $comp) and their sum $ep"
o2=$(plan "${ONE[@]}" --internode-gbps 400 --hide-a2a experts)
h2=$(echo "$o2" | sed -n 's/^all-to-all hidden behind compute: \([0-9.]*\) ms/\1/p')
# the experts' seconds: 3 x 16 x 4096 tokens x 48 layers x (8 x 2 x 3 x 2048 x 768) FLOPs / 16 ranks at 552
gs=$(awk 'BEGIN { printf "%.4f\n", 3 * 16 * 4096 * 48 * 8 * 2 * 3 * 2048 * 768 / 16 / 552e12 * 1e3 }')
want=$(awk -v a="$ep" -v b="$gs" 'BEGIN { print a < b ? a : b }')
near "$h2" "$want" 1e-3 && pass "--hide-a2a experts, one stage: hidden $h2 ms = min(EP $ep, the experts' $gs)" ||
  fail "--hide-a2a experts: hidden '$h2', want min($ep, $gs)"

# --hide-a2a 1f1b on two stages, the all-to-all far above the compute: the slowest stage is stage 0, whose
# steady phase is all but its warmup: 1F1B warms up pp - 1 = 1 of 4 micro-batches (hidden = 3/4 of its
# compute); interleaved (vpp 2) (pp - 1) x 2 + (vpp - 1) x pp = 4 of 4 x 2 chunks (1/2). (--overlap-sms 0: the
# compute printed is the one hidden behind, no SMs' cost added)
PP=(--gpus 32 --gpu h100 --nodes-of 8 --preset qwen3-moe-30b-a3b --batch 64 --seq-len 4096 --hide-a2a 1f1b --overlap-sms 0)
for c in "ep16 pp2 micro4:0.75" "ep16 pp2 vpp2 micro4:0.5"; do
  o=$(plan "${PP[@]}" --explain "${c%%:*}"); comp=$(echo "$o" | ms_of 'compute (the slowest stage):')
  h=$(echo "$o" | sed -n 's/^all-to-all hidden behind compute: \([0-9.]*\) ms/\1/p')
  near "$h" "$(awk -v c="$comp" -v f="${c#*:}" 'BEGIN { print c * f }')" 1e-4 &&
    pass "--hide-a2a 1f1b, ${c%%:*}: hidden $h ms = ${c#*:} x compute $comp" ||
    fail "--hide-a2a 1f1b, ${c%%:*}: hidden '$h', want ${c#*:} x $comp"
done

# Megatron-Core's overlaps (--hide-tp, --hide-dp, --hide-pp) and its vocab-parallel head (--vocab-parallel 1), each
# on a profile of equal rates (0.001 TFLOP/s: a FLOP a ns) whose links are fast (0.05 GB/s: the messages below
# the compute they overlap) or slow (1e-5 GB/s: above it)
eqp() { # FILE DENSE_TFLOPS LINK_GBPS
  printf '{"memory_bytes": 1e12, "context_bytes": 1, "peak_tflops": 1, "dense_tflops": %s, "grouped_tflops": 0.001,
 "attention_tflops": 0.001, "hbm_gbps": 1e15, "nvlink_gbps": %s, "internode_gbps": %s, "pcie_gbps": 1}\n' "$2" "$3" "$3" > "$1"; }
eqp "$TMP/fast.json" 0.001 0.05; eqp "$TMP/slow.json" 0.001 1e-5
eqp "$TMP/fastfd.json" 1e6 0.05; eqp "$TMP/slowfd.json" 1e6 1e-5
hid_of() { sed -n "s/^$1 hidden behind[^:]*: \([0-9.]*\) ms/\1/p"; }
TINY=(--gpus 2 --preset tiny --batch 4 --seq-len 64)
# --hide-tp gemm, tiny tp2 (d 96, 4 heads of 24, 2 kv heads, 2 layers; 4 x 64 tokens, 3x for the backward):
# the TP-split GEMMs 3 x 256 x 2 x (2 x 96 x 24 x (2 x 4 + 2 x 2)) / 2 FLOP at 1e9 FLOP/s
tg=$(awk 'BEGIN { print 3 * 256 * 2 * (2 * 96 * 24 * 12) / 2 / 1e9 * 1e3 }')
for p in fast slow; do
  o=$(plan "${TINY[@]}" --gpu "$TMP/$p.json" --explain "tp2 micro1"); tp=$(echo "$o" | ms_of 'exposed tp')
  o=$(plan "${TINY[@]}" --gpu "$TMP/$p.json" --explain "tp2 micro1" --hide-tp gemm)
  h=$(echo "$o" | hid_of 'TP collectives'); e=$(echo "$o" | ms_of 'exposed tp')
  want=$(awk -v a="$tp" -v b="$tg" 'BEGIN { print a < b ? a : b }')
  near "$h" "$want" 2e-3 && awk -v e="$e" -v h="$h" -v t="$tp" 'BEGIN { exit !(e + h > t - 0.02 && e + h < t + 0.02) }' &&
    pass "--hide-tp gemm ($p link): hidden $h ms = min(TP $tp, the TP-split GEMMs $tg); exposed $e" ||
    fail "--hide-tp gemm ($p link): hidden '$h' exposed '$e', want min($tp, $tg) and their sum $tp"
done
# --vocab-parallel 1 (Megatron's vocab-parallel output layer): the head's 3 x 256 x 2 d V (d 96, V 256) FLOP,
# half of it on each TP rank
c0=$(plan "${TINY[@]}" --gpu "$TMP/fast.json" --explain "tp2 micro1" | ms_of 'compute (the slowest stage):')
c1=$(plan "${TINY[@]}" --gpu "$TMP/fast.json" --explain "tp2 micro1" --vocab-parallel 1 | ms_of 'compute (the slowest stage):')
want=$(awk 'BEGIN { print 3 * 256 * 2 * 96 * 256 / 2 / 1e9 * 1e3 }')
near "$(awk -v a="$c0" -v b="$c1" 'BEGIN { print a - b }')" "$want" 2e-3 &&
  pass "--vocab-parallel 1: compute $c0 -> $c1 ms, half the head's $want x 2 less" ||
  fail "--vocab-parallel 1: compute $c0 -> $c1 ms, want $want ms less"
# ... and its state under --memory-model megatron: a rank of tp2 x dp2 holds V d / 2 fewer parameters of each
# table (V 128000, d 2048: V d in all), 18 bytes a parameter fewer in ours (mixed: float32 weights, gradients
# and both moments, the bf16 copy), 6 + 12 / DP = 12 in Megatron's; so the saving under megatron's is 6 V d
# bytes (1.465 GiB) less than under ours (the activations' saving the same in both)
BIGV=(--gpus 4 --preset tiny --vocab-size 128000 --d-model 2048 --n-heads 16 --n-kv-heads 8 --d-ff 1024 --n-layers 1
  --batch 2 --seq-len 64 --explain "tp2 micro1")
gib() { plan "${BIGV[@]}" "$@" | sed -n 's/^memory per GPU: \([0-9.]*\) GiB (moe info.*/\1/p'; }
o0=$(gib); o1=$(gib --vocab-parallel 1); g0=$(gib --memory-model megatron); g1=$(gib --memory-model megatron --vocab-parallel 1)
d=$(awk -v a="$o0" -v b="$o1" -v c="$g0" -v e="$g1" 'BEGIN { print (a - b) - (c - e) }')
want=$(awk 'BEGIN { print 6 * 128000 * 2048 / 2^30 }')
awk -v d="$d" -v w="$want" 'BEGIN { exit !(d > w - 0.015 && d < w + 0.015) }' &&
  pass "--vocab-parallel 1 --memory-model megatron: saves $g0 -> $g1 GiB, ours $o0 -> $o1: $d GiB apart (6 V d: $want)" ||
  fail "--vocab-parallel 1 --memory-model megatron: $g0 -> $g1 GiB, ours $o0 -> $o1: $d GiB apart, want 6 V d = $want"
# --hide-dp, tiny dp2 micro2: the reduction (zero 0: all the DP bytes; zero 1: 2 of 3 parts) behind one
# micro-batch's backward (compute x 2/3 / 2), grads+params ZeRO 1's all-gather behind one forward (x 1/3 / 2)
for p in fast slow; do
  for z in 0 1; do
    o=$(plan "${TINY[@]}" --gpu "$TMP/$p.json" --explain "zero$z micro2"); dp=$(echo "$o" | ms_of 'exposed dp gradients')
    comp=$(echo "$o" | ms_of 'compute (the slowest stage):')
    for m in grads grads+params; do
      h=$(plan "${TINY[@]}" --gpu "$TMP/$p.json" --explain "zero$z micro2" --hide-dp $m | hid_of 'DP gradients')
      want=$(awk -v d="$dp" -v c="$comp" -v z=$z -v m=$m 'function mn(a, b) { return a < b ? a : b }
        BEGIN { r = z ? d * 2 / 3 : d; h = mn(r, c * 2 / 3 / 2); if (m != "grads") h += mn(d - r, c / 3 / 2); print h }')
      near "$h" "$want" 2e-3 && pass "--hide-dp $m ($p link, zero $z): hidden $h ms (DP $dp, compute $comp)" ||
        fail "--hide-dp $m ($p link, zero $z): hidden '$h', want $want (DP $dp, compute $comp)"
    done
  done
done
# --hide-pp next, the small preset (4 layers) on pp2, the projections free (every chunk the same compute):
# interleaved (vpp 2) each stage sends 3 times (stage 0: chunk 0 on; chunk 2 on, back), each hidden up to its
# chunk's forward (a third of the chunk's compute): all on a fast link, 3 forwards = half the stage's compute
# on a slow one; 1F1B none
SMP=(--gpus 2 --preset small --batch 16 --seq-len 64)
for p in fastfd slowfd; do
  o=$(plan "${SMP[@]}" --gpu "$TMP/$p.json" --explain "pp2 vpp2 micro4"); pp=$(echo "$o" | ms_of 'exposed pp')
  comp=$(echo "$o" | ms_of 'compute (the slowest stage):')
  h=$(plan "${SMP[@]}" --gpu "$TMP/$p.json" --explain "pp2 vpp2 micro4" --hide-pp next | hid_of 'pipeline sends')
  want=$(awk -v d="$pp" -v c="$comp" 'BEGIN { print d < c / 2 ? d : c / 2 }')
  near "$h" "$want" 2e-3 && pass "--hide-pp next ($p, pp2 vpp2): hidden $h ms = min(PP $pp, half the compute $comp)" ||
    fail "--hide-pp next ($p, pp2 vpp2): hidden '$h', want $want (PP $pp, compute $comp)"
done
h=$(plan "${SMP[@]}" --gpu "$TMP/slowfd.json" --explain "pp2 micro4" --hide-pp next | hid_of 'pipeline sends')
[ "$h" = "0.00" ] && pass "--hide-pp next, 1F1B: nothing hidden (Megatron overlaps the sends only when interleaved)" ||
  fail "--hide-pp next, 1F1B: hidden '$h', want 0.00"
# An overlap's cost. (b) one mechanism, --hide-tp gemm on tiny tp2 over the slow link (every TP-split GEMM's
# second hides TP): the hidden tg ms cost the compute tg x 20/132 (--overlap-sms 20, the default), nothing
# with --overlap-sms 0
c0=$(plan "${TINY[@]}" --gpu "$TMP/slow.json" --explain "tp2 micro1" | ms_of 'compute (the slowest stage):')
o=$(plan "${TINY[@]}" --gpu "$TMP/slow.json" --explain "tp2 micro1" --hide-tp gemm)
h=$(echo "$o" | hid_of 'TP collectives'); c20=$(echo "$o" | ms_of 'compute (the slowest stage):')
cz=$(plan "${TINY[@]}" --gpu "$TMP/slow.json" --explain "tp2 micro1" --hide-tp gemm --overlap-sms 0 | ms_of 'compute (the slowest stage):')
near "$h" "$tg" 2e-3 && near "$c20" "$(awk -v c="$c0" -v t="$tg" 'BEGIN { print c + t * 20 / 132 }')" 1e-3 && [ "$cz" = "$c0" ] &&
  pass "--overlap-sms: hidden $h ms (the TP-split GEMMs $tg) cost the compute $c0 -> $c20 ms (+ x 20/132), $cz at 0" ||
  fail "--overlap-sms: hidden '$h' (want $tg), compute $c0 -> '$c20' (want + $tg x 20/132), '$cz' at 0 (want $c0)"
# (a) one budget: tiny tp2 ep2 (dp 2) on 4 GPUs over the slow link, --hide-a2a 1f1b (one stage: all steady)
# alone hides min(EP, compute) = the compute, --hide-tp gemm tg / 2 more (a DP rank's 2 sequences of the 4):
# together comp + tg / 2 wanted, the compute hidden (each scaled by comp / (comp + tg / 2)); the exposed TP +
# EP the sum less the compute; at 20 SMs the compute comp x (1 + 20/132)
T4=(--gpus 4 --preset tiny --batch 4 --seq-len 64 --gpu "$TMP/slow.json" --explain "tp2 ep2 micro1")
o=$(plan "${T4[@]}"); comp=$(echo "$o" | ms_of 'compute (the slowest stage):')
tp=$(echo "$o" | ms_of 'exposed tp'); ep=$(echo "$o" | ep_of)
o=$(plan "${T4[@]}" --hide-a2a 1f1b --hide-tp gemm --overlap-sms 0)
all=$(echo "$o" | sed -n 's/^hidden in all: \([0-9.]*\) ms of the \([0-9.]*\) ms.*/\1 \2/p')
te=$(echo "$o" | ms_of 'exposed tp'); ee=$(echo "$o" | ep_of); cz=$(echo "$o" | ms_of 'compute (the slowest stage):')
c20=$(plan "${T4[@]}" --hide-a2a 1f1b --hide-tp gemm | ms_of 'compute (the slowest stage):')
near "${all% *}" "$comp" 1e-3 && near "${all#* }" "$(awk -v c="$comp" -v t="$tg" 'BEGIN { print c + t / 2 }')" 2e-3 &&
  near "$(awk -v a="$te" -v b="$ee" 'BEGIN { print a + b }')" "$(awk -v a="$tp" -v b="$ep" -v c="$comp" 'BEGIN { print a + b - c }')" 1e-4 &&
  [ "$cz" = "$comp" ] && near "$c20" "$(awk -v c="$comp" 'BEGIN { print c * (1 + 20 / 132) }')" 1e-3 &&
  pass "one budget: hidden ${all% *} of ${all#* } ms wanted = the compute $comp (+ tg / 2, tg $tg); exposed TP + EP $te + $ee; at 20 SMs $c20 ms" ||
  fail "one budget: hidden '$all' (want $comp of comp + $tg / 2), exposed '$te' + '$ee' (want $tp + $ep - $comp), compute '$cz' / '$c20'"

# the published rows with the overlaps each run enables (docs/PLAN.md)
OV=(--hide-pp next --hide-dp grads+params --vocab-parallel 1)
run_ok "row DS runs with Megatron's overlaps" "$MOE" plan "${DS[@]}" "${MECH[@]}" --hide-a2a 1f1b --a2a-links deepep "${OV[@]}"
grep -q '^pipeline sends hidden behind compute: [0-9.]* ms' "$OUT_FILE" || fail "row DS: no PP hidden line"
run_ok "row QW runs with Megatron's overlaps" "$MOE" plan "${QW[@]}" "${MECH[@]}" --hide-a2a 1f1b "${OV[@]}"
run_ok "row MX runs with Megatron's overlaps" "$MOE" plan "${MX[@]}" "${MECH[@]}" --hide-tp gemm --hide-dp grads+params --vocab-parallel 1
grep -q '^TP collectives hidden behind the TP-split GEMMs: [0-9.]* ms' "$OUT_FILE" || fail "row MX: no TP hidden line"

# the shipped profiles of Megatron's kernels' rates (profiles/, bench/torch_plan_rates.py on the H200): each
# reads as --gpu FILE, and its row runs on it with the overlaps that row's run enables (docs/PLAN.md)
PF="$MOE_SRC/profiles"
run_ok "row DS on Megatron's rates" "$MOE" plan "${DS[@]}" --gpu "$PF/megatron-deepseek-v3-fp8.json" "${MECH[@]}" --hide-a2a 1f1b --a2a-links deepep "${OV[@]}"
grep -q '^plan: 1024 GPUs of profile megatron-deepseek-v3-fp8 ' "$OUT_FILE" || fail "row DS: not on the megatron-deepseek-v3-fp8 profile"
run_ok "row QW on Megatron's rates" "$MOE" plan "${QW[@]}" --gpu "$PF/megatron-qwen3-235b-a22b-fp8.json" "${MECH[@]}" --hide-a2a 1f1b "${OV[@]}"
run_ok "row QW in BF16 on Megatron's rates" "$MOE" plan "${QW[@]}" --precision bf16 --gpu "$PF/megatron-qwen3-235b-a22b.json" "${MECH[@]}" --a2a-links deepep --hide-tp gemm "${OV[@]}"
run_ok "row MX on Megatron's rates" "$MOE" plan "${MX[@]}" --gpu "$PF/megatron-mixtral-8x22b.json" "${MECH[@]}" --hide-tp gemm --hide-dp grads+params --vocab-parallel 1
grep -q '^plan: 128 GPUs of profile megatron-mixtral-8x22b ' "$OUT_FILE" || fail "row MX: not on the megatron-mixtral-8x22b profile"
# the ModelZoo recipe's layout (VPP 7, one layer a chunk), BF16 and FP8, with that run's overlaps
MXV=(--gpus 128 --nodes-of 8 --preset mixtral-8x22b --batch 256 --seq-len 4096 --explain "tp2 ep8 pp8 vpp7 zero1 micro32")
run_ok "row MXV on Megatron's rates" "$MOE" plan "${MXV[@]}" --gpu "$PF/megatron-mixtral-8x22b.json" "${MECH[@]}" --hide-tp gemm "${OV[@]}"
grep -q '^pipeline sends hidden behind compute: [0-9.]* ms' "$OUT_FILE" || fail "row MXV: no PP hidden line"
run_ok "row MXV in FP8 on Megatron's rates" "$MOE" plan "${MXV[@]}" --precision fp8 --gpu "$PF/megatron-mixtral-8x22b-fp8.json" "${MECH[@]}" "${OV[@]}"
grep -q '^plan: 128 GPUs of profile megatron-mixtral-8x22b-fp8 .*fp8' "$OUT_FILE" || fail "row MXV fp8: not on the megatron-mixtral-8x22b-fp8 profile under fp8"

# --memory-model megatron: ours keeps 4 + 4 + 8 + 2 bytes a parameter at zero 0 (float32 weights and
# gradients, two float32 moments, the bf16 copy), Megatron 6 + 12 / DP: on DP 2 it is 6 P below ours, and
# from DP 2 to DP 4 (the same rows a rank) 12 P (1/2 - 1/4) = 3 P lower (P: the small preset's parameters)
mem_of() { sed -n 's/^memory per GPU: \([0-9.]*\) MiB (moe info.*/\1/p'; }
P=$("$MOE" info --preset small | sed -n 's/^parameters: .*(\([0-9]*\) \/ .*/\1/p')
SM=(--preset small --seq-len 256)
o2=$(plan --gpus 2 "${SM[@]}" --batch 8 --explain "dp2 micro1" | mem_of)
m2=$(plan --gpus 2 "${SM[@]}" --batch 8 --explain "dp2 micro1" --memory-model megatron | mem_of)
m4=$(plan --gpus 4 "${SM[@]}" --batch 16 --explain "dp4 micro1" --memory-model megatron | mem_of)
awk -v o="$o2" -v a="$m2" -v b="$m4" -v P="$P" 'BEGIN { M = 1048576; exit !(P > 0 &&
    (o - a) * M > 6 * P - 0.02 * M && (o - a) * M < 6 * P + 0.02 * M && (a - b) * M > 3 * P - 0.02 * M && (a - b) * M < 3 * P + 0.02 * M) }' &&
  pass "--memory-model megatron: ours $o2 MiB, Megatron's $m2 (DP 2) and $m4 (DP 4): 6 P and 3 P less (P = $P)" ||
  fail "--memory-model megatron: ours '$o2', Megatron's '$m2' (DP 2), '$m4' (DP 4); want 6 P and 3 P less (P = '$P')"

# --grouped-rate shape: mixtral-8x22b's nearest measured shape is mixtral's (566 / 556 x 552.0); qwen3-235b's
# qwen2's (402 / 556), under fp8 of the profile's 393.8
r=$(plan "${MX[@]}" --grouped-rate shape | sed -n 's/^experts at \([0-9.]*\) TFLOP\/s.*mixtral.*/\1/p')
[ "$r" = "$(awk 'BEGIN { printf "%.1f", 552.0 * 566 / 556 }')" ] && pass "--grouped-rate shape: mixtral-8x22b at $r TFLOP/s" ||
  fail "--grouped-rate shape: mixtral-8x22b at '$r'"
r=$(plan "${QW[@]}" --grouped-rate shape | sed -n 's/^experts at \([0-9.]*\) TFLOP\/s.*qwen2.*/\1/p')
[ "$r" = "$(awk 'BEGIN { printf "%.1f", 393.8 * 402 / 556 }')" ] && pass "--grouped-rate shape: qwen3-235b-a22b fp8 at $r TFLOP/s" ||
  fail "--grouped-rate shape: qwen3-235b-a22b fp8 at '$r'"

# bad input
run_fail "--hide-a2a 'both': takes none|experts|1f1b" "$MOE" plan "${QW[@]}" --hide-a2a both
run_fail "--a2a-links 'x': takes flat|split|deepep" "$MOE" plan "${QW[@]}" --a2a-links x
run_fail "--combine 'fp8': takes f32|bf16" "$MOE" plan "${QW[@]}" --combine fp8
run_fail "--memory-model 'x': takes ours|megatron" "$MOE" plan "${QW[@]}" --memory-model x
run_fail "--grouped-rate 'x': takes profile|shape" "$MOE" plan "${QW[@]}" --grouped-rate x
run_fail "--hide-tp 'x': takes none|gemm" "$MOE" plan "${QW[@]}" --hide-tp x
run_fail "--hide-pp 'x': takes none|next" "$MOE" plan "${QW[@]}" --hide-pp x
run_fail "--hide-dp 'params': takes none|grads|grads+params" "$MOE" plan "${QW[@]}" --hide-dp params
run_fail "--internode-gbps must be in [0, 100000]" "$MOE" plan "${QW[@]}" --internode-gbps -1
run_fail "--overlap-sms must be in [0, 132)" "$MOE" plan "${QW[@]}" --overlap-sms 132
run_fail "--pp-layers applies to --explain" "$MOE" plan --gpus 8 --preset tiny --batch 8 --seq-len 64 --pp-layers 1,1
run_fail "pipeline: --pp-layers needs --pp > 1" "$MOE" plan --gpus 8 --preset tiny --batch 8 --seq-len 64 --pp-layers 1,1 --explain "ep4"
run_fail "pipeline:" "$MOE" plan --gpus 8 --preset tiny --batch 8 --seq-len 64 --pp-layers 1,2 --explain "pp2"
finish
