#!/bin/bash
# pending/device_run.sh SERIES:RECIPE[:SECONDS] ... — several pending series' device checks in one device
# call, each on its own tree and build: .gpk/SERIES.src.tar.xz (`git archive` of the series' branch) and
# .gpk/SERIES.tar.xz (its .gpu package: pack_libs.sh, and pack_variants.sh where its recipe A/Bs builds),
# both made here by pending/pack.sh. Each series is unpacked into /tmp/s/SERIES and its recipe
# (scripts/device/RECIPE) run there with BUDGET=SECONDS (the recipe's own default where left out), its
# output under $OUT/SERIES/RECIPE/ (RECIPE without .sh: the recipe's progress file and run.log; one package
# may serve several recipes). One line a recipe says how it ended.
# Carry the packages it names (carry [".gpk"], or the files themselves: up to 8 paths) and keep the sum of
# the budgets under the call's limit. Example, about eight minutes:
#   bash pending/device_run.sh fp8amax-cuda:fp8_amax_check.sh:250 fp8scales:fp8_gemm_ab.sh:200
# Exit 1 when a package is missing or a recipe failed.
set -u
cd "$(dirname "$0")/.."
ROOT=$PWD
O=${OUT:-/tmp/out}
RC=0
for spec in "$@"; do
  IFS=: read -r s recipe secs <<< "$spec"
  d=/tmp/s/$s o="$O/$s/${recipe%.sh}"
  rm -rf "$d" && mkdir -p "$d" "$o"
  if ! tar -xJf "$ROOT/.gpk/$s.src.tar.xz" -C "$d" || ! tar -xJf "$ROOT/.gpk/$s.tar.xz" -C "$d"; then
    echo "$s: .gpk/$s.src.tar.xz or .gpk/$s.tar.xz missing or unreadable" | tee -a "$O/device_run.txt"
    RC=1
    continue
  fi
  t0=$SECONDS
  (cd "$d" && OUT="$o" BUDGET="${secs:-}" bash "scripts/device/$recipe") > "$o/run.log" 2>&1
  r=$?
  echo "$s $recipe: exit $r in $((SECONDS - t0)) s" | tee -a "$O/device_run.txt"
  [ $r = 0 ] || RC=1
done
exit $RC
