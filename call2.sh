#!/bin/bash
# (lead's device call, not committed) fp8 quality, then MLA ops under the sanitizer
. scripts/device/libs.sh; mesh_unpack $PWD/.gpum /tmp/x; ln -sfn /tmp/x .gpu; cp .gpum/tinyshakespeare.txt /tmp/x/
export PATH=$PATH:/usr/local/cuda/bin
S0=$SECONDS
timeout 440 bash scripts/device/fp8_quality.sh > /tmp/fp8q.log 2>&1
echo "fp8 study rc=$? $((SECONDS - S0))s"; tail -22 /tmp/fp8q.log
W=/tmp/san; mkdir -p $W
for tool in memcheck racecheck; do
  left=$((560 - SECONDS)); [ $left -lt 20 ] && break
  timeout $left compute-sanitizer --tool $tool /tmp/x/bin/test_decode > $W/$tool.log 2>&1; echo "decode $tool rc=$?"
  grep -E "checks|SUMMARY" $W/$tool.log | tail -2
done
bash scripts/device/sanitize_scan.sh $W/*.log
