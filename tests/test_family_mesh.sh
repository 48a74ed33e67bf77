#!/usr/bin/env bash
# test_family_mesh.sh — the families' options (config.h: q/k/v biases, a sigmoid-gated shared expert,
# QK-norm full-width and per head) and the balancing methods (aux-free routing bias, which the final
# parameters compare as a table tensor; sequence and global aux scopes) train the same model on a mesh as
# in one process, at test_mesh.sh's tolerances (lib.sh mesh_close). Tiny models, 4 steps: the point is
# the new terms' TP slices (biases split with their heads, per-head norm weights and the shared expert
# reduced over the stage) and their EP/DP reductions, not the rest of the mesh matrix (test_mesh.sh). A
# DeepSeek-V3-shaped model (a dense first layer: its MLP on each TP rank's token slice, reduced over the stage,
# no exchange; sigmoid group-limited routing) at tp2+dp2+ep2 and over pp2 (the dense layer on stage 0); with two
# MTP modules (mtp_loss compared as the losses) at tp2, dp2+ep2 and pp2 (the modules on the last stage, the
# first stage's embedding output sent to it and its gradient back). The deepseek-v3-tiny preset whole (latent
# attention, the dense first layer, sigmoid group routing, the shared expert, the sequence aux) with an MTP module
# at tp2, dp2+ep2, tp2+dp2+ep2 and pp2 (bitwise: stages alone), and its tp2+dp2+ep2 checkpoint resumed at pp2
# and in one process (resharding).
# Multi-head latent attention at tp2, and with an MTP module (its block's latent attention split as a
# main layer's) at tp2.
# OLMoE's full-width QK-norm over TP (its row sums all-reduced over the TP ranks, its weight sliced with
# the heads): tp2 (with the end-of-run sample, the KV-cached decode's split norm, equal to one process's),
# tp2+dp2+ep2, dp2+tp2 zero2, and that run's step-2 checkpoint resumed in one process (the sliced norm
# weights and their AdamW moments gathered back) to the same final model.
set -u
. "$(dirname "$0")/lib.sh"
mpi_tests

BASE="--steps 4 --quiet --sample-tokens 0 --plots 0 --batch 8 --seq-len 16 --eval-batches 1 --eval-every 0
      --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2"
Q2="--family qwen2_moe --qkv-bias 1 --n-shared-experts 1 --shared-d-ff 24 --shared-gate 1 --renormalize 0"
Q3="--family qwen3_moe --qk-norm head --head-dim 12"
OL="--family olmoe --qk-norm full --renormalize 0"

# DeepSeek-V3-shaped: a dense first layer before an MoE layer with sigmoid scores, group-limited choice (1 of 2
# groups), the weight scale, an ungated shared expert and the aux-free bias
DN="--dense-layers 0 --dense-d-ff 40 --route-sigmoid 1 --z-coef 0 --n-group 2 --topk-group 1 --route-scale 2.5"
DN="$DN --n-shared-experts 1 --shared-d-ff 24 --balance aux-free --bias-rate 0.01"

# multi-head latent attention (q_lora, a latent, the shared rope key, values narrower than the query/key heads,
# YaRN): q_b and kv_b split over TP by heads, o_proj by its columns, q_a, kv_a and their norms replicated and
# their gradients (each rank's heads' part) reduced over the stage
ML="--n-kv-heads 4 --kv-lora-rank 12 --q-lora-rank 16 --qk-nope-head-dim 8 --qk-rope-head-dim 4 --v-head-dim 6"
ML="$ML --rope-factor 4 --rope-orig-max 8 --yarn-mscale 0.8 --yarn-mscale-all-dim 1"

# "family flags|ranks|mesh flags|label"
CASES="$Q2|4|--tp 2 --ep 2|qwen2_moe (biases, gated shared expert): tp2+dp2+ep2
$Q2 --dispatch capacity --capacity-factor 0.8 --jitter 0.05|2|--tp 2|qwen2_moe capacity+jitter: tp2
$Q3|4|--tp 2 --ep 2 --zero 1|qwen3_moe (per-head qk-norm): tp2+dp2+ep2 zero1
$OL|4|--ep 2 --etp 2|olmoe (full qk-norm): dp4+ep2+etp2
$OL --sample-tokens 24|2|--tp 2|olmoe (full qk-norm split over TP): tp2
$OL|4|--tp 2 --ep 2|olmoe (full qk-norm split over TP): tp2+dp2+ep2
$OL|4|--tp 2 --zero 2 --save-every 2 --keep 0|olmoe (full qk-norm split over TP): dp2+tp2 zero2
--balance aux-free --bias-rate 0.01|4|--tp 2 --ep 2 --zero 2|balance aux-free (routing bias): tp2+dp2+ep2 zero2
--balance aux-free --bias-rate 0.01 --grad-accum 4|2|--pp 2|balance aux-free: pp2 (1f1b)
--aux-scope sequence --seq-len 25 --batch 4 --grad-accum 2|4|--tp 2 --ep 2|aux scope sequence, sequences cut by TP slices: tp2+dp2+ep2
--aux-scope global --grad-accum 2|4|--tp 2 --ep 2 --zero 1|aux scope global (2 micro-batches): tp2+dp2+ep2 zero1
--aux-scope global --grad-accum 4 $Q2|2|--pp 2|aux scope global + qwen2_moe: pp2 (1f1b, 4 micro-batches)
$DN|4|--tp 2 --ep 2|deepseek-shaped (dense layer 0, sigmoid groups): tp2+dp2+ep2
$DN --grad-accum 4|2|--pp 2|deepseek-shaped: pp2 (the dense layer on stage 0)
$DN --mtp 2 --mtp-weight 0.5|2|--tp 2|deepseek-shaped + 2 MTP modules: tp2
$DN --mtp 2 --mtp-weight 0.5|2|--ep 2|deepseek-shaped + 2 MTP modules: dp2+ep2
$DN --mtp 2 --mtp-weight 0.5 --grad-accum 4|2|--pp 2|deepseek-shaped + 2 MTP modules: pp2 (on stage 1, the embedding rows sent)
$ML|2|--tp 2|latent attention (q_lora, YaRN): tp2
$ML --mtp 1|2|--tp 2|latent attention + 1 MTP module: tp2"

i=0
while IFS='|' read -r fam np flags label; do
  i=$((i + 1))
  ref="$TMP/ref$i"
  "$MOE" train --out "$ref" $BASE $fam > "$TMP/ref$i.txt" 2>&1 < /dev/null || { fail "$label: reference run"; tail -3 "$TMP/ref$i.txt"; continue; }
  run="$TMP/run$i"; mkdir -p "$run"
  if $MPI -np "$np" "$MOE" train --out "$run" $BASE $fam $flags --check-replicas > "$run/out.txt" 2>&1 < /dev/null; then
    mesh_close "$ref" "$run" "$label"
  else fail "$label: mpirun failed"; tail -5 "$run/out.txt"; fi
done <<< "$CASES"

# The DeepSeek-V3-shaped model whole: the deepseek-v3-tiny preset as it is (latent attention with q_lora,
# interleaved rope pairs; a dense first layer; sigmoid group-limited routing with the aux-free bias and the
# weight scale; an ungated shared expert; the sequence-wise aux) and one MTP module. One reference serves every
# layout: tp2, dp2+ep2, tp2+dp2+ep2 (mesh_close), pp2 with the dense layer alone on stage 0 and the two MoE
# layers with the MTP module on stage 1 (stages alone: bitwise, lib.sh mesh_exact; hence --grad-clip 0 in all);
# then the tp2+dp2+ep2 run's step-2 checkpoint resumed at pp2 and in one process (resharding) continues as the
# uninterrupted run (mesh_close). lr 1e-3, not BASE's 1e-2: this model's 0.7M parameters at 1e-2 spike (grad
# norm 1.5 -> 7.1 at step 3 for seed 1, the step-4 grad norms then 1.7e-4 apart) and a few elements' gradients
# cancel to near AdamW's eps, their updates moved by a fraction of lr by round-off (seen 3.7e-3 of a tensor's
# scale); at 1e-3 both shrink tenfold (seeds 1-5: loss <= 3.3e-8, grad norm <= 6.1e-7, parameters <= 5.1e-4),
# while a wrong gradient still moves a tensor by ~lr x 4 steps, ~5e-2 of its scale.
DS="--steps 4 --quiet --sample-tokens 0 --plots 0 --batch 8 --seq-len 16 --eval-batches 1 --eval-every 0
    --preset deepseek-v3-tiny --mtp 1 --lr 1e-3 --warmup 2 --grad-accum 2 --grad-clip 0"
PPL="--pp 2 --pp-layers 1,2"
if "$MOE" train --out "$TMP/ds_ref" $DS > "$TMP/ds_ref.txt" 2>&1 < /dev/null; then
  while IFS='|' read -r np flags label; do
    run="$TMP/ds_$np${flags// /}"; mkdir -p "$run"
    if ! $MPI -np "$np" "$MOE" train --out "$run" $DS $flags --check-replicas > "$run/out.txt" 2>&1 < /dev/null; then
      fail "$label: mpirun failed"; tail -5 "$run/out.txt"
    elif [ "$flags" = "$PPL" ]; then mesh_exact "$TMP/ds_ref" "$run" "$label"
    else mesh_close "$TMP/ds_ref" "$run" "$label"; fi
  done <<< "2|--tp 2|deepseek-v3-tiny + MTP: tp2
2|--ep 2|deepseek-v3-tiny + MTP: dp2+ep2
4|--tp 2 --ep 2 --save-every 2 --keep 0|deepseek-v3-tiny + MTP: tp2+dp2+ep2
2|$PPL|deepseek-v3-tiny + MTP: pp2 (the dense layer alone on stage 0, the MTP module on stage 1)"
  saved="$TMP/ds_4--tp2--ep2--save-every2--keep0"
  for target in "2|$PPL" "1|"; do
    np="${target%%|*}"; flags="${target#*|}"
    d="$TMP/ds_resume$np"; mkdir -p "$d"
    cp -r "$saved/step_00000002" "$d/" || { fail "deepseek-v3-tiny tp2+dp2+ep2: no step-2 checkpoint"; continue; }
    head -n "$(grep -n '"step":2,' "$saved/metrics.jsonl" | head -1 | cut -d: -f1)" "$saved/metrics.jsonl" > "$d/metrics.jsonl"
    if [ "$np" = 1 ]; then cmd=("$MOE"); else cmd=($MPI -np "$np" "$MOE"); fi
    if "${cmd[@]}" train --out "$d" $DS $flags --resume --check-replicas > "$d/out.txt" 2>&1 < /dev/null; then
      [ "$np" = 1 ] && echo "replica check: ok" >> "$d/out.txt"   # (one process: nothing to compare)
      mesh_close "$TMP/ds_ref" "$d" "deepseek-v3-tiny + MTP saved at tp2+dp2+ep2 (step 2), resumed ${flags:-in one process}"
    else fail "deepseek-v3-tiny + MTP: resume ${flags:-in one process} failed"; tail -5 "$d/out.txt"; fi
  done
else fail "deepseek-v3-tiny + MTP: reference run"; tail -3 "$TMP/ds_ref.txt"; fi

# the end-of-run sample of OLMoE at tp2 (the cached decode with the norm's TP all-reduce) is one process's
i=$(grep -n -- "--sample-tokens 24|" <<< "$CASES" | cut -d: -f1)
sample_block "$TMP/ref$i.txt" > "$TMP/s1.txt"; sample_block "$TMP/run$i/out.txt" > "$TMP/s2.txt"
if [ "$(wc -l < "$TMP/s1.txt")" -ge 3 ] && cmp -s "$TMP/s1.txt" "$TMP/s2.txt"; then
  pass "olmoe tp2: the end-of-run sample (24 tokens, KV cache) equals one process's"
else fail "olmoe tp2: the end-of-run sample differs from one process's"; diff "$TMP/s1.txt" "$TMP/s2.txt" | head -6; fi

# OLMoE saved at dp2+tp2 zero2 after 2 of 4 steps (q_norm/k_norm sliced with the heads), resumed in one process
z=$(grep -n "zero 2 --save-every" <<< "$CASES" | cut -d: -f1)
d="$TMP/resume1"; rm -rf "$d"; mkdir -p "$d"
if cp -r "$TMP/run$z/step_00000002" "$d/" 2>/dev/null; then
  head -n "$(grep -n '"step":2,' "$TMP/run$z/metrics.jsonl" | head -1 | cut -d: -f1)" "$TMP/run$z/metrics.jsonl" > "$d/metrics.jsonl"
  if "$MOE" train --out "$d" $BASE $OL --resume > "$d/out.txt" 2>&1 < /dev/null; then
    echo "replica check: ok" >> "$d/out.txt"   # (one process: nothing to compare)
    mesh_close "$TMP/ref$z" "$d" "olmoe saved at dp2+tp2 zero2 (step 2), resumed in one process"
  else fail "olmoe: resume in one process failed"; tail -5 "$d/out.txt"; fi
else fail "olmoe dp2+tp2 zero2: no step-2 checkpoint"; fi
finish
