#!/usr/bin/env bash
# pack_variants.sh DIR NAME=REF ... — the other builds of a device A/B (fp8_gemm_ab.sh, ab_check.sh,
# fp8_quant_check.sh: DIR/old, DIR/var1, ...), made here from git refs without a second build folder: for each
# NAME=REF in turn, the files REF differs in from HEAD are checked out from REF into this work tree, build/'s
# PROGRAMS (default: moe moe_bench_fp8) are rebuilt (only what those files touch), copied into DIR/NAME, and
# HEAD's files put back. Needs a clean work tree (git status shows nothing to commit) and a configured build/;
# leaves HEAD's files in place and build/ holding HEAD's programs again on success or failure. Example:
#   bash scripts/device/pack_libs.sh .gpu        # HEAD's programs and the test programs into .gpu/bin
#   bash scripts/device/pack_variants.sh .gpu old=main~1 var1=fp8scales var2=fp8wide
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${1:?usage: scripts/device/pack_variants.sh DIR NAME=REF ...}
shift
[ $# -ge 1 ] || { echo "pack_variants.sh: name at least one NAME=REF" >&2; exit 2; }
PROGRAMS=${PROGRAMS:-moe moe_bench_fp8}
[ -d build ] || { echo "pack_variants.sh: no build/ here (configure it first: make build)" >&2; exit 2; }
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
  echo "pack_variants.sh: the work tree has uncommitted changes; commit or stash them first" >&2
  exit 2
fi
for nr in "$@"; do
  case "$nr" in *=*) ;; *) echo "pack_variants.sh: '$nr' is not NAME=REF" >&2; exit 2 ;; esac
  git rev-parse --verify -q "${nr#*=}^{commit}" > /dev/null ||
    { echo "pack_variants.sh: '${nr#*=}' names no commit" >&2; exit 2; }
done
CHANGED="" # the files of the variant now in the work tree (put back on any exit)
restore() {
  local f
  for f in $CHANGED; do
    if git cat-file -e "HEAD:$f" 2> /dev/null; then git checkout -q HEAD -- "$f"; else rm -f "$f"; fi
  done
  CHANGED=""
}
trap 'restore; cmake --build build -j "$(nproc)" --target $PROGRAMS > /dev/null 2>&1 || true' EXIT
for nr in "$@"; do
  name=${nr%%=*} ref=${nr#*=}
  CHANGED=$(git diff --name-only HEAD "$ref")
  for f in $CHANGED; do
    if git cat-file -e "$ref:$f" 2> /dev/null; then git checkout -q "$ref" -- "$f"; else rm -f "$f"; fi
  done
  git reset -q # (checkout staged them: the index stays HEAD's)
  echo "== $name ($ref, $(git rev-parse --short "$ref")): $(echo $CHANGED | wc -w) file(s) differ from HEAD"
  cmake --build build -j "$(nproc)" --target $PROGRAMS > /tmp/pack_variants.log 2>&1 ||
    { tail -20 /tmp/pack_variants.log >&2; exit 1; }
  mkdir -p "$D/$name"
  for p in $PROGRAMS; do cp "build/$p" "$D/$name/"; done
  echo "$(git rev-parse "$ref") $ref" > "$D/$name/REF"
  restore
done
