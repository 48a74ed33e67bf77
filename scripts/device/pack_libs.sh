#!/usr/bin/env bash
# pack_libs.sh DIR — for runs on the lent GPU machine: copy build/moe's shared libraries that its
# image lacks (OpenBLAS, cJSON, gomp, gfortran, quadmath, Open MPI and its libs, zlib; not libc,
# CUDA or NCCL, which the machine has) and the test binaries into DIR/lib and DIR/bin, and builds the
# CUPTI step tracer (gputrace.c) into DIR/lib with the toolkit's libcupti beside it (full_step.sh's
# `trace` part). DIR should be an ignored folder (add it to .git/info/exclude) named in the device call's
# `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${1:?usage: scripts/device/pack_libs.sh DIR}
mkdir -p "$D/lib" "$D/bin"
. scripts/device/pack_common.sh
copy_libs "$D/lib"
copy_programs "$D/bin"
CUDA=${CUDA_HOME:-/usr/local/cuda}
if [ -f "$CUDA/include/cupti.h" ]; then
  CUPTI=$(dirname "$(find "$CUDA/" -name 'libcupti.so*' -print -quit 2>/dev/null)")
  gcc -O2 -Wall -shared -fPIC -I"$CUDA/include" scripts/device/gputrace.c -o "$D/lib/libgputrace.so" -L"$CUPTI" -lcupti
  for c in "$CUPTI"/libcupti.so.*; do cp -L "$c" "$D/lib/"; break; done
fi
du -sh "$D"
