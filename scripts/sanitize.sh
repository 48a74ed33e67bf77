#!/usr/bin/env bash
# sanitize.sh — the CPU test suite's lean part under AddressSanitizer + UndefinedBehaviorSanitizer
# with the leak check on (gcc, in build-asan/, no CUDA, no MPI): every C unit test, and the shell
# tests of bad input, checkpoints, resume, preemption and Hugging Face files (not the mpirun
# matrices or the long training checks). Any memory error, undefined behaviour or leak at a
# successful exit fails the test it happens in.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -DMOE_CUDA=OFF -DMOE_MPI=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" >/dev/null
cmake --build build-asan -j2 >/dev/null
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd build-asan
ctest -j2 --output-on-failure -R '^test_(ops|router|data|checkpoint|hf_files|strict|plot|schedule|gradcheck|nccl_cpu|cli_errors|harden|hf|resume|preempt|decode|keep_best)$'
