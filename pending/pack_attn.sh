#!/usr/bin/env bash
# pending/pack_attn.sh SERIES... — the packages of scripts/device/attn_variants.sh: .gpk/gpu.tar.xz (this
# checkout's build, `make build` first: the base and the libraries) and, for each pending attention SERIES (git
# am of pending/SERIES/ on this checkout's HEAD, built in pack.sh's worktree and build-pack/),
# .gpk/attn_SERIES.tar.xz holding .gpa/SERIES/ with its moe_bench_attention, test_cuda_ops and
# test_cuda_attn_mla (~2 MB each). Leaves this checkout as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD WT=/tmp/pack-wt # (pack.sh's worktree and build folder: one CUDA build from nothing, ~12 minutes)
[ -x build/moe_bench_attention ] || { echo "pack_attn.sh: build this checkout first (make build)" >&2; exit 2; }
mkdir -p .gpk
rm -rf .gpu && bash scripts/device/pack_libs.sh .gpu > /dev/null && tar -cJf .gpk/gpu.tar.xz .gpu
git worktree prune
[ -d "$WT" ] || git worktree add -q --detach "$WT" HEAD
for s in "$@"; do
  [ -d "pending/$s" ] || { echo "pack_attn.sh: no pending/$s" >&2; exit 2; }
  (cd "$WT" && git checkout -q --detach "$(git -C "$ROOT" rev-parse HEAD)" && git am -q "$ROOT"/pending/$s/*.patch &&
    { [ -d build-pack ] || cmake -S . -B build-pack -DCMAKE_BUILD_TYPE=Release > /dev/null; } &&
    cmake --build build-pack -j2 --target moe_bench_attention test_cuda_ops test_cuda_attn_mla > /tmp/pack-attn-$s.log 2>&1 &&
    rm -rf .gpa && mkdir -p .gpa/$s &&
    cp build-pack/moe_bench_attention build-pack/test_cuda_ops build-pack/test_cuda_attn_mla .gpa/$s/ &&
    tar -cJf "$ROOT/.gpk/attn_$s.tar.xz" .gpa)
  echo "$s: .gpk/attn_$s.tar.xz $(du -h ".gpk/attn_$s.tar.xz" | cut -f1)"
done
