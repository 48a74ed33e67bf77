#!/usr/bin/env bash
# sanitize.sh — the CPU test suite's lean part under AddressSanitizer + UndefinedBehaviorSanitizer
# with the leak check on (gcc, in build-asan/, no CUDA, no MPI): every C unit test, and the shell
# tests of bad input, checkpoints, resume, preemption, Hugging Face files and data inputs (not the mpirun
# matrices or the long training checks). Any memory error, undefined behaviour or leak at a
# successful exit fails the test it happens in. Then, where mpirun is installed, `moe` alone built with
# MPI under the same sanitizers (build-asan-mpi/, no leak check: MPI's own allocations) trains a few steps
# on the layouts whose buffers are shared between MoE states or move between a state's start and its
# GEMMs (AMPipe with expert parallelism, --recompute, the pipelined exchange, pipeline stages, the
# gathered expert mode; the vocabulary split over TP: with stages, an MTP module, evaluation and the sample's
# gathered rows, and unevenly under AMPipe): a memory error there fails the script (one, tp2+ep2 --ampipe 2 --recompute moe,
# was a use after free until 2026-12-02; ep2 --ampipe auto --a2a-overlap auto, its 12 candidates
# through a list of 8, a stack overflow until issue 42).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -DMOE_CUDA=OFF -DMOE_MPI=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" >/dev/null
cmake --build build-asan -j2 >/dev/null
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
cd build-asan
ctest -j2 --output-on-failure -R '^test_(ops|router|data|checkpoint|hf_files|strict|plot|schedule|gradcheck|nccl_cpu|cli_errors|harden|hf|resume|preempt|decode|keep_best|alloc|cost|tokenizer|prep|megatron|zstd)$'
cd ..
command -v mpirun >/dev/null || { echo "sanitize.sh: mpirun not installed: the mesh layouts not run"; exit 0; }
cmake -S . -B build-asan-mpi -DMOE_CUDA=OFF -DMOE_MPI=ON -DMOE_NCCL=OFF -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_FLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" >/dev/null
cmake --build build-asan-mpi -j2 --target moe >/dev/null
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
T="$(mktemp -d)"; trap 'rm -rf "$T"' EXIT
B="--steps 3 --sample-tokens 4 --plots 0 --batch 16 --seq-len 24 --eval-batches 1 --eval-every 2 --save-every -1
   --n-layers 2 --n-heads 4 --n-kv-heads 2 --d-model 32 --d-ff 48 --n-experts 4 --lr 1e-2 --warmup 2 --device cpu"
while IFS='|' read -r np flags; do
  if timeout 300 mpirun --oversubscribe -np "$np" build-asan-mpi/moe train --out "$T/r" --force $B $flags > "$T/out" 2>&1 < /dev/null &&
     ! grep -q 'ERROR: AddressSanitizer\|runtime error' "$T/out"; then echo "sanitize.sh: mesh $np ranks $flags: clean"
  else echo "sanitize.sh: mesh $np ranks $flags: FAILED"; grep -m1 -A12 'ERROR: AddressSanitizer\|runtime error' "$T/out" || tail -5 "$T/out"; exit 1; fi
done <<'EOF_L'
2|--ep 2 --ampipe 2 --recompute moe
4|--tp 2 --ep 2 --ampipe 2 --a2a-overlap 2 --recompute full
4|--pp 2 --ep 2 --ampipe 2 --recompute moe --grad-accum 4
4|--ep 2 --etp 2 --expert-mode gathered --zero 2
4|--pp 2 --ep 2 --zero 2 --a2a-overlap 2 --grad-accum 4 --gpu-comm staged
2|--ep 2 --ampipe auto --a2a-overlap auto --steps 36
4|--tp 2 --pp 2 --vocab-parallel 1 --mtp 1 --grad-accum 2
2|--tp 2 --vocab-parallel 1 --vocab-size 125 --ampipe 2
EOF_L
