#!/usr/bin/env bash
# test_fp8_cuda_ref.sh — builds and runs tests/fp8_cuda_ref.cu: ops/numerics.h's e4m3 encoder and decoder
# against NVIDIA's (cuda_fp8.h) on the host (every 7th float32 bit pattern; FP8_STRIDE=1: all 2^32, ~40 s),
# and, where a GPU is present, against the cvt.rn.satfinite.e4m3x2.f32 instruction on all 2^32 patterns.
# Skipped (77) where nvcc is missing.
set -u
: "${MOE_SRC:=$(cd "$(dirname "$0")/.." && pwd)}"
NVCC="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)"
[ -x "$NVCC" ] || { echo "SKIP: nvcc not found"; exit 77; }
TMP="$(mktemp -d "${TMPDIR:-/tmp}/fp8_cuda_ref.XXXXXX")" || exit 1
trap 'rm -rf "$TMP"' EXIT
"$NVCC" -O2 -arch=sm_90 -I"$MOE_SRC/src" "$MOE_SRC/tests/fp8_cuda_ref.cu" -o "$TMP/fp8_cuda_ref" ||
  { echo "FAIL: nvcc could not build fp8_cuda_ref.cu"; exit 1; }
"$TMP/fp8_cuda_ref" "${FP8_STRIDE:-7}"
