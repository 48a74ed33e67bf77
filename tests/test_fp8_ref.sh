#!/usr/bin/env bash
# test_fp8_ref.sh — runs tests/fp8_ref.py: our e4m3 encoder against ml_dtypes.float8_e4m3fn on ~150k
# random and edge floats, through test_fp8 --encode (the test binary beside $MOE_BIN). Skipped (77) where
# python3 or ml_dtypes is missing: CI does not install it (pip install ml_dtypes to run it).
set -u
: "${MOE_SRC:=$(cd "$(dirname "$0")/.." && pwd)}"
: "${MOE_BIN:=$MOE_SRC/build/moe}"
T="$(dirname "$MOE_BIN")/test_fp8"
command -v python3 > /dev/null || { echo "SKIP: python3 not installed"; exit 77; }
[ -x "$T" ] || { echo "FAIL: $T not built"; exit 1; }
python3 "$MOE_SRC/tests/fp8_ref.py" "$T"
