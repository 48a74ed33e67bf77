#!/usr/bin/env bash
# fuzz.sh [SECONDS] — build the libFuzzer targets of tests/fuzz/ with clang under ASan+UBSan (in
# build-fuzz/, CPU only, no MPI) and run each for SECONDS (default 30) from its seed corpus
# (tests/fuzz/corpus/<name>/; new inputs go to a scratch copy, the repository's is not changed).
# Prints executions per target; exits non-zero on the first crash, leak-free DIE paths aside
# (a refused input is the expected outcome: DIE returns to the target). Skips (exit 0) without clang.
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-30}"
command -v clang >/dev/null || { echo "fuzz: SKIP (no clang; apt-get install clang libclang-rt-14-dev)"; exit 0; }
CC=clang cmake -S . -B build-fuzz -DMOE_CUDA=OFF -DMOE_MPI=OFF -DMOE_FUZZ=ON -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" >/dev/null
targets=(safetensors config shard megatron state checksums tokenize)
cmake --build build-fuzz -j2 --target "${targets[@]/#/fuzz_}" >/dev/null
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# A target runs in rounds of at most FUZZ_ROUND seconds (default 120), each a fresh process on the grown corpus:
# what a refused input's DIE abandons stays allocated until the process ends (a 7-minute run of fuzz_megatron
# held 120 GB of ASan's heap, each refused set's 1 MiB read buffer, and stopped as out of memory).
round="${FUZZ_ROUND:-120}"
for t in "${targets[@]}"; do
  mkdir -p "$work/$t" && cp tests/fuzz/corpus/"$t"/* "$work/$t/"
  left=$secs runs=0
  while [ "$left" -gt 0 ]; do
    r=$((left < round ? left : round))
    # detect_leaks=0: a refused input leaves what DIE abandoned (the leak check is the sanitizer suite's)
    ASAN_OPTIONS=detect_leaks=0 build-fuzz/fuzz_"$t" -max_total_time="$r" -close_fd_mask=2 -rss_limit_mb=4096 \
      -timeout=10 -artifact_prefix="$work/" "$work/$t" >"$work/$t.log" 2>&1 &
    pid=$!
    rc=0
    wait $pid || rc=$?
    # the target's scratch directory (fuzz.h fuzz_dir; removed at its exit, not after a crash)
    rm -rf "/dev/shm/moe_fuzz_$pid" "/tmp/moe_fuzz_$pid"
    if [ $rc -ne 0 ]; then
      echo "fuzz: fuzz_$t FAILED:"; grep -v '^#' "$work/$t.log" | tail -40
      for a in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*; do [ -e "$a" ] && { echo "input: $a"; od -c "$a" | head -8; }; done
      exit 1
    fi
    runs=$((runs + $(grep -o 'Done [0-9]* runs' "$work/$t.log" | tail -1 | grep -o '[0-9]*' || echo 0)))
    left=$((left - r))
  done
  echo "fuzz: fuzz_$t: $runs runs in $secs second(s), corpus $(ls "$work/$t" | wc -l) inputs"
done
