#!/bin/bash
# Device recipe (kind nvidia-h200) for the FP8 grouped GEMMs (src/ops/cuda/cuda_grouped_fp8.cu, issue 38), in
# one call: the kernel's SASS (HGMMA forms, local-memory ops), tests/test_cuda_fp8_gemm case by case (each case
# its own process under a time limit, so that a crash or a hang hides nothing), the whole test once in one
# process, the throughput table: bench/fp8_gemm_bench.c (ours: fp8 and the bf16 grouped GEMM) and
# scripts/device/fp8_peer.py (torch: _scaled_grouped_mm, _scaled_mm, _grouped_mm), then compute-sanitizer on
# small cases. Prepare here (.gpu an ignored folder, as full_step.sh says):
#   cmake --build build -j2 && bash scripts/device/pack_libs.sh .gpu
# (it copies test_cuda_fp8_gemm and moe_bench_fp8 too; everything it copies came to 72 MB here, over the 64 MiB a
# call carries: this recipe needs only .gpu/lib without libcupti/libgputrace and those two programs) and call
# with carry [".gpu"] and timeout_s 600. Without
# .gpu/bin/test_cuda_fp8_gemm it builds both here (cmake with CUDA, -j16, into build-dev). About 4 minutes;
# every step is bounded by what is left of BUDGET (default 560 s). Everything it prints also goes to
# $OUT/fp8.txt, the cases' whole logs to $OUT/cases.log.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh
G=$PWD/.gpu; B=$G/bin; W=/tmp/w; mkdir -p $W; R=${OUT:-$W}/fp8.txt; : > $R
BUDGET=${BUDGET:-560}
say() { echo "$*" | tee -a "$R"; }
# lim SECONDS: SECONDS, or what is left of the budget less 10 s (at least 1)
lim() { local l=$((BUDGET - SECONDS - 10)); [ $1 -lt $l ] && l=$1; [ $l -lt 1 ] && l=1; echo $l; }
export OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1
say "$(date -u) $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader)"
if [ ! -x $B/test_cuda_fp8_gemm ] || [ ! -x $B/moe_bench_fp8 ]; then
  say "== building (no .gpu/bin/test_cuda_fp8_gemm)"
  { cmake -S . -B build-dev -DCMAKE_BUILD_TYPE=Release && cmake --build build-dev -j16 --target test_cuda_fp8_gemm moe_bench_fp8; } > $W/build.log 2>&1 ||
    { tail -30 $W/build.log | tee -a $R; exit 1; }
  B=$PWD/build-dev
fi
device_libs $G $B/test_cuda_fp8_gemm
T=$B/test_cuda_fp8_gemm
OBJ=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
$OBJ -sass $T > $W/sass.txt 2>&1
awk '/Function : /{f = /gf_kernel/} f' $W/sass.txt > $W/gf_sass.txt
say "SASS of gf_kernel: $(grep -oE 'HGMMA\.[0-9A-Zx.]+' $W/gf_sass.txt | sort | uniq -c | tr '\n' ' ') ; $(grep -cE 'LDL|STL' $W/gf_sass.txt) local-memory ops"

n=$(MOE_FP8_CASE=count timeout 60 $T 2>&1 | tail -1)
[[ "$n" =~ ^[0-9]+$ ]] || { say "== test_cuda_fp8_gemm does not run its cases: $n"; n=0; }
say "== test_cuda_fp8_gemm: $n cases, one process each"
: > ${OUT:-$W}/cases.log
hung=0
for ((i = 0; i < ${n:-0}; i++)); do
  MOE_FP8_CASE=$i timeout $(lim 40) $T > $W/case$i.log 2>&1; rc=$?
  cat $W/case$i.log >> ${OUT:-$W}/cases.log
  say "-- case $i rc=$rc"; grep -vE "^test_cuda_fp8_gemm:" $W/case$i.log | head -12 | tee -a $R
  [ $rc -ge 124 ] && hung=$((hung + 1))
  [ $hung -ge 2 ] && { say "== two cases hung or were killed: the rest would only repeat it"; exit 1; }
done
timeout $(lim 120) $T > $W/all.log 2>&1; say "== all cases in one process rc=$?: $(tail -1 $W/all.log)"
grep -m5 FAIL $W/all.log | tee -a $R

say "== throughput (ours)"
timeout $(lim 150) $B/moe_bench_fp8 2>&1 | tee -a $R
say "== throughput (torch)"
timeout $(lim 150) python3 scripts/device/fp8_peer.py 2>&1 | grep -v Warning | tee -a $R

CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for c in "memcheck 4" "memcheck 14" "racecheck 0"; do # rows-5 (G 8, K N 144), dw-4 (G 8), rows-1 (one tile)
  set -- $c
  [ $((BUDGET - SECONDS)) -lt 30 ] && { say "== compute-sanitizer $1 case $2 skipped (time)"; continue; }
  MOE_FP8_CASE=$2 timeout $(lim 90) $CS --tool $1 --error-exitcode 9 $T > $W/san_$1_$2.log 2>&1; rc=$?
  say "== compute-sanitizer --tool $1, case $2: rc=$rc"
  grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^=========  *(Invalid|Race|Error|Barrier)|checks" $W/san_$1_$2.log | head -6 | tee -a $R
done
say "$(date -u)"
