#!/bin/bash
# (lead's device call, not committed) studies + sanitizer
. scripts/device/libs.sh; mesh_unpack $PWD/.gpum /tmp/x; ln -sfn /tmp/x .gpu; cp .gpum/tinyshakespeare.txt /tmp/x/
export PATH=$PATH:/usr/local/cuda/bin
mkdir -p $OUT/cross $OUT/fp8q $OUT/san
(OUT=$OUT/cross timeout 400 bash scripts/device/crossover.sh > $OUT/cross.log 2>&1) &
(OUT=$OUT/fp8q timeout 520 bash scripts/device/fp8_quality.sh > $OUT/fp8q.log 2>&1) &
(OUT=$OUT/san SAN_BIN=/tmp/x/bin SAN_BUDGET=330 timeout 360 bash scripts/device/sanitize_gpu.sh > $OUT/san.log 2>&1) &
wait
echo "=== san"; cat $OUT/san.log | tail -30
echo "=== cross"; cat $OUT/cross.log
echo "=== fp8q"; tail -25 $OUT/fp8q.log
