#!/usr/bin/env bash
# test_structure.sh — the tree keeps the shape docs/ARCHITECTURE.md describes: every C/CUDA file of
# src/, tests/, bench/ and tools/ is formatted as .clang-format says (clang-format 14; skipped where
# another major version or none is installed, as formatting differs between versions), and
# scripts/structure.awk finds nothing in src/: no file over 700 lines, no host function over 120 lines,
# no #include of a higher layer's header. Also checks that the checker itself catches each breach
# (fixtures written here), so that a quiet run means a clean tree, not a blind checker.
set -u
. "$(dirname "$0")/lib.sh"
cd "$MOE_SRC" || exit 1
AWK="awk -f $MOE_SRC/scripts/structure.awk"

# the checker sees each kind of breach (fixtures in $TMP/src/<folder>/)
mkdir -p "$TMP/src/ops" "$TMP/src/model"
{ echo '#include "train/trainer.h"'; echo 'int f(void) {'; for i in $(seq 1 125); do echo "    x++;"; done; echo '}'; } \
    > "$TMP/src/ops/bad.c"
{ echo '__global__ void k(void) {'; for i in $(seq 1 200); do echo "    x++;"; done; echo '}'; } > "$TMP/src/ops/k.cu"
{ for i in $(seq 1 701); do echo "int v$i;"; done; } > "$TMP/src/model/long.c"
{ echo '#include "ops/ops.h"'; echo 'static const int t[] = {'; for i in $(seq 1 130); do echo "    $i,"; done; echo '};'
  echo 'int g(int a,'; echo '      int b) { return a + b; }'; } > "$TMP/src/model/ok.c"
out=$($AWK "$TMP"/src/ops/bad.c "$TMP"/src/ops/k.cu "$TMP"/src/model/long.c "$TMP"/src/model/ok.c)
case "$out" in *"bad.c:2: function f is 127 lines"*) pass "checker: a 127-line host function is named" ;;
  *) fail "checker: a 127-line host function is named (got: $out)" ;; esac
case "$out" in *"bad.c:1: includes train/trainer.h, a header of a higher layer"*) pass "checker: an upward include is named" ;;
  *) fail "checker: an upward include is named (got: $out)" ;; esac
case "$out" in *"long.c:1: 701 lines"*) pass "checker: a 701-line file is named" ;;
  *) fail "checker: a 701-line file is named (got: $out)" ;; esac
case "$out" in *k.cu*|*ok.c*) fail "checker: a long kernel, a long table and a downward include pass (got: $out)" ;;
  *) pass "checker: a long kernel, a long table and a downward include pass" ;; esac

# the tree
SRC=$(find src -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort)
out=$($AWK $SRC)
if [ -z "$out" ]; then pass "src/: files <= 700 lines, host functions <= 120 lines, includes downward ($(echo $SRC | wc -w) files)"
else fail "src/: structure breaches:"; echo "$out" | head -20; fi

ALL=$(find src tests bench tools scripts -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' | sort)
if ! command -v clang-format > /dev/null; then skip "formatting: clang-format is not installed"
elif ! clang-format --version | grep -q 'version 14\.'; then skip "formatting: clang-format is not version 14 ($(clang-format --version))"
else
  bad=$(for f in $ALL; do clang-format --dry-run --Werror "$f" > /dev/null 2>&1 || echo "$f"; done)
  if [ -z "$bad" ]; then pass "formatting: $(echo $ALL | wc -w) files as .clang-format says"
  else fail "formatting: not as .clang-format says (clang-format -i them):"; echo "$bad" | head -20; fi
fi
finish
