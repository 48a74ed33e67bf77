#!/usr/bin/env bash
# pending/pack.sh SERIES... — the device packages of pending series, for pending/device_run.sh: for each
# SERIES (a branch of that name, made by `git am` of pending/SERIES/ on its base), .gpk/SERIES.src.tar.xz
# (`git archive` of the branch) and .gpk/SERIES.tar.xz (the branch built in build-pack/, a CUDA build folder
# of its own, then scripts/device/pack_libs.sh; with PACK_OLD=REF also pack_variants.sh's old = REF, PROGRAMS
# of it (default moe): the build that recipes such as bits_ab.sh and fp8_gemm_ab.sh compare against, e.g.
# PACK_OLD=main, or the series' base branch; and ../shared/bench/torch_train_peer.py where it is, for the recipes
# that time the peer: steady_ab.sh). Runs in a temporary worktree (/tmp/pack-wt), leaving this
# checkout as it is.
# A CUDA build from nothing takes ~12 minutes on two cores; each later series rebuilds what it changed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
mkdir -p .gpk
WT=/tmp/pack-wt
for s in "$@"; do
  git rev-parse --verify -q "$s^{commit}" > /dev/null || { echo "pack.sh: no branch $s (git am pending/$s/ first)" >&2; exit 2; }
done
git worktree prune
[ -d "$WT" ] || git worktree add -q --detach "$WT" HEAD
for s in "$@"; do
  git archive --format=tar "$s" | xz -T2 > ".gpk/$s.src.tar.xz"
  (cd "$WT" && git checkout -q --detach "$s" &&
    { [ -d build-pack ] || cmake -S . -B build-pack -DCMAKE_BUILD_TYPE=Release > /dev/null; } &&
    cmake --build build-pack -j2 > /tmp/pack-$s.log 2>&1 && rm -rf build .gpu && ln -s build-pack build &&
    bash scripts/device/pack_libs.sh .gpu > /dev/null &&
    { [ ! -f "$ROOT/../shared/bench/torch_train_peer.py" ] || cp "$ROOT/../shared/bench/torch_train_peer.py" .gpu/; } &&
    { [ -z "${PACK_OLD:-}" ] || PROGRAMS="${PROGRAMS:-moe}" bash scripts/device/pack_variants.sh .gpu \
      "old=$PACK_OLD" > /dev/null; } &&
    tar -cJf "$ROOT/.gpk/$s.tar.xz" .gpu && rm -f build)
  echo "$s: .gpk/$s.src.tar.xz $(du -h ".gpk/$s.src.tar.xz" | cut -f1), .gpk/$s.tar.xz $(du -h ".gpk/$s.tar.xz" | cut -f1)"
done
