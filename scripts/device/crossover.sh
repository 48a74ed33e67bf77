#!/bin/bash
# Device recipe (kind nvidia-h200; docs/QUALITY.md "Where the MoE starts to win"): quality_study.sh's MoE
# against dense pair (same active parameters, same tokens, seeds 1-3) at model sizes below its d 384 one, to
# find the smallest size at which the MoE's best held-out loss beats the dense model's on tinyshakespeare.
# Sizes (SIZES, entries d:layers:heads:expert_f; the dense FFN is 2 x f, top-2 of 8 experts for the MoE):
# 64:2:1:96 128:4:2:160 192:4:3:256 256:6:4:352 (the d 384 size is quality_study.sh's own, 6 layers f 512).
# STEPS (1500, as docs/QUALITY.md's study), every run of a size at once on the GPU (PAR 6). Prepare as
# quality_study.sh (carry [".gpu"] with the programs and tinyshakespeare.txt). Out: one quality_dD.txt each.
cd "$(dirname "$0")/../.."
for z in ${SIZES:-64:2:1:96 128:4:2:160 192:4:3:256 256:6:4:352}; do
  IFS=: read d l h f <<< "$z"
  SHAPE="--d-model $d --n-layers $l --n-heads $h --n-kv-heads $h --seq-len 256 --max-seq-len 256 --batch 64" \
    KINDS="moe=--n-experts,8,--top-k,2,--d-ff,$f dense=--n-experts,1,--top-k,1,--d-ff,$((2 * f))" \
    TAG=quality_d$d PAR=${PAR:-6} STEPS=${STEPS:-1500} RUN_LIMIT=${RUN_LIMIT:-200} \
    bash scripts/device/quality_study.sh | grep -E "seeds:|^seed|rc=[^0]|parameters"
done
