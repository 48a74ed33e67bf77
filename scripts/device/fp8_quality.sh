#!/bin/bash
# Device recipe (kind nvidia-h200; issue 38's quality study, docs/PERFORMANCE.md "FP8 quality"): --precision
# fp8 against bf16 (and mixed, fp8's own storage policy) on a model whose experts hold most of its weights and
# FLOPs (d 512, 8 layers of 8 heads, 8 experts top-2 of f 1024: 109M parameters, 92% in the experts; KINDS
# may add mixed=--precision,mixed,... : fp8 keeps mixed's storage), three
# seeds x STEPS (3000) steps of 32 x 256 tokens, on a real corpus that 3,000 steps do not repeat: the Python
# source of the device's transformers package (every .py file in sorted order, ~50 MB, byte-level; the last
# 10% held out, 64 validation batches every 500 steps). The per-seed lines give fp8 minus bf16 in nats and
# percent (the issue's bar: the final held-out loss within 0.5% of bf16 on every seed). Every run of a seed
# at once on the GPU through MPS (PAR 6: all). Prepare as quality_study.sh (carry [".gpu"]).
cd "$(dirname "$0")/../.."
CORPUS=/tmp/pysrc.txt
if [ ! -s $CORPUS ]; then
  TF=$(python3 -c 'import os, transformers; print(os.path.dirname(transformers.__file__))') || exit 1
  find "$TF" -name '*.py' | LC_ALL=C sort | xargs cat > $CORPUS
fi
echo "corpus: $(wc -c < $CORPUS) bytes of transformers $(python3 -c 'import transformers; print(transformers.__version__)') source"
E="--n-experts,8,--top-k,2,--d-ff,1024"
SHAPE="--d-model 512 --n-layers 8 --n-heads 8 --n-kv-heads 8 --seq-len 256 --max-seq-len 256 --batch 32" \
  KINDS=${KINDS:-"fp8=--precision,fp8,$E bf16=--precision,bf16,$E"} \
  TEXT=$CORPUS TAG=fp8_quality PAR=${PAR:-6} MPS=${MPS:-on} STEPS=${STEPS:-3000} EVERY=${EVERY:-500} EVAL="--eval-batches 64" \
  RUN_LIMIT=${RUN_LIMIT:-480} bash scripts/device/quality_study.sh
