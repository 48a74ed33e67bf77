# libs.sh — sourced by the device recipes (scripts/device/*.sh, bench/device_run.sh):
# `device_libs DIR PROGRAM` puts DIR/lib (the libraries pack_libs.sh copied) and CUDA's on
# LD_LIBRARY_PATH, then finds on the device any CUDA/NCCL library PROGRAM still lacks.
device_libs() {
  local d=$1 prog=$2 n c
  export LD_LIBRARY_PATH=$d/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
  for n in libcublas.so.13 libcublasLt.so.13 libcudart.so.13 libnccl.so.2; do
    ldd "$prog" | grep -q "$n => not found" || continue
    c=$(find / -xdev -name "$n*" 2>/dev/null | grep -v '^/proc/' | head -1)
    [ -n "$c" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$c")
  done
  return 0
}

# The bounded recipes' steps (suite_check.sh, attn_check.sh, full_step.sh): `say TEXT` prints and
# appends to $R (the progress file under $OUT); `t NAME LIMIT CMD...` runs CMD into $W/NAME.log under
# LIMIT seconds and what is left of $BUDGET (counted by $SECONDS), skipped (status 1) when under 20 s
# are left, and says how it ended.
say() { echo "$*" | tee -a "$R"; }
t() {
  local name=$1 lim=$2; shift 2
  local left=$((BUDGET - SECONDS))
  [ $left -lt 20 ] && { say "== $name skipped (time)"; return 1; }
  [ $lim -gt $left ] && lim=$left
  local t0=$SECONDS; timeout $lim "$@" > "$W/$name.log" 2>&1; say "== $name rc=$? $((SECONDS - t0))s"
}

# `test_line NAME`: the test log $W/NAME.log's "N checks, F failed" line and its FAIL lines into $R; FAIL=1
# unless F = 0. `san_line NAME`: a compute-sanitizer log's summary line and sanitize_scan.sh's judgement
# (how many reports, ours and third-party by kernel) into $R; FAIL=1 when a report is in our kernels or the log
# has no summary (the tool did not finish), then the log's first reports too. Third-party reports (cuBLAS's
# nvjet kernels under racecheck) are listed, not failed.
SAN_SCAN=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/sanitize_scan.sh
test_line() {
  local l
  l=$(grep -E "checks, [0-9]+ failed" $W/$1.log | tail -1)
  say "   $1: ${l:-no result line}"
  grep -m8 FAIL $W/$1.log | tee -a $R
  [[ "$l" == *", 0 failed" ]] || FAIL=1
}
san_line() {
  local l j rc
  l=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $W/$1.log 2>/dev/null | tail -1)
  say "   $1: ${l:-no summary}"
  j=$(bash "$SAN_SCAN" $W/$1.log 2>&1); rc=$?
  say "   ${j:-sanitize_scan.sh said nothing}"
  [ $rc = 0 ] && return 0
  FAIL=1
  grep -m3 -B2 -A8 "Invalid\|hazard" $W/$1.log 2>/dev/null | head -30 | tee -a $R
  return 0
}

# The bounded recipes' start (`recipe_start NAME BUDGET_DEFAULT`, from the repository root): .gpu unpacked
# from .gpk/gpu.tar.xz where it is not there yet, the toolkit's bin on PATH (compute-sanitizer), G (.gpu), B
# (its bin), W (/tmp/w), R ($OUT/NAME.txt, emptied), FAIL=0, the libraries (device_libs), the thread, NCCL and
# Python settings, BUDGET (seconds, unless set), and the device's name, driver and power limit as the first line.
recipe_start() {
  [ -f .gpk/gpu.tar.xz ] && [ ! -d .gpu ] && tar -xJf .gpk/gpu.tar.xz
  export PATH=$PATH:/usr/local/cuda/bin
  G=$PWD/.gpu; B=$G/bin; W=/tmp/w; mkdir -p $W; R=${OUT:-$W}/$1.txt; : > $R; FAIL=0
  device_libs $G $B/moe
  export OMP_NUM_THREADS=16 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
  BUDGET=${BUDGET:-$2}
  say "$(date -u) $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader 2>/dev/null)"
}
# `steady_mean METRICS [EXTRA [TOKENS]]`: the mean tokens/s and step time of a run's steps after the tenth
# (TOKENS a step, default 8192: the reference model at B 4 x T 2048), as full_step.sh's and bf16_mem_check.sh's
# steady rows give them; EXTRA 1 adds the last step's loss.
steady_mean() {
  python3 -c "
import json, sys
r = [d for d in map(json.loads, open(sys.argv[1])) if 'step_time_s' in d and d['step'] > 10]
t, n = sum(d['step_time_s'] for d in r), int(sys.argv[3])
print('   steps %d-%d: %.0f tokens/s, %.1f ms a step' % (r[0]['step'], r[-1]['step'], n * len(r) / t, 1e3 * t / len(r))
      + (', loss %.4f' % r[-1]['loss'] if sys.argv[2] == '1' else ''))
" "$1" "${2:-0}" "${3:-8192}" | tee -a $R
}
# `first KEY DIR`: the first training line's value of KEY in DIR/metrics.jsonl (verbatim: compare bits).
first() { grep -o "\"$1\":[^,]*" "$2/metrics.jsonl" | head -n 1 | cut -d: -f2; }
# `run_values DIR`: a run's losses (loss, aux, z) and gradient norms, a line each in step order, verbatim from
# DIR/metrics.jsonl (two runs the same bits: cmp of theirs; bits_ab.sh, norm_ab.sh).
run_values() { grep -o '"loss":[^,]*,"aux_loss":[^,]*,"z_loss":[^,]*\|"grad_norm":[^,]*' $1/metrics.jsonl; }
# `tps_median METRICS`: the median tokens/s of steps 4-12 of a run's metrics.jsonl (the short runs' figure).
tps_median() {
  grep -oE '"step":([4-9]|1[0-2]),.*"tokens_per_s":[0-9.]+' "$1" | grep -oE '"tokens_per_s":[0-9.]+' | cut -d: -f2 |
    sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}
# The same for a recipe that brings its own programs (`recipe_open NAME WORKDIR BUDGET_DEFAULT`): W (WORKDIR,
# emptied), R ($OUT/NAME.txt, emptied), the thread and Python settings, BUDGET, FAIL=0, the device's line.
recipe_open() {
  W=$2; rm -rf $W; mkdir -p $W; R=${OUT:-$W}/$1.txt; : > $R
  export OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1
  BUDGET=${BUDGET:-$3}
  FAIL=0
  say "$(date -u) $(nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader 2>/dev/null)"
}
# `timed NAME LIMIT CMD...`: t for a program that prints one '"impl"' line (moe_bench_attention, the SDPA
# peer); FAIL=1 without it; skipped for time is not a failure.
timed() {
  local n=$1
  t "$@" || return 0
  grep -q '"impl"' $W/$n.log || { FAIL=1; tail -3 $W/$n.log | tee -a $R; }
}

# `mem_start`, then `mem_peak`: the GPU memory in use (nvidia-smi, MiB; the fullest GPU's) sampled every 0.5 s
# into $W/mem.txt between the two; mem_peak stops the sampling and prints the largest sample.
mem_start() {
  ( while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1; sleep 0.5; done ) \
    > $W/mem.txt 2>/dev/null &
  MEM_PID=$!
}
mem_peak() { kill $MEM_PID 2>/dev/null; wait $MEM_PID 2>/dev/null; sort -n $W/mem.txt | tail -1; }

# `has PART`: PART is in $PARTS (the recipes' selection).
has() { [[ " $PARTS " == *" $1 "* ]]; }

# `peer_step KIND` (compiled: pure bf16; amp: mixed precision, autocast with float32 master weights and moments):
# PEERS.md's torch.compile peer of the reference model (.gpu/torch_train_peer.py) as the full-step tables run it,
# its report line and its peak GPU memory by nvidia-smi (ours' basis) appended to $R. PEER_WARM and PEER_STEPS
# (default 3 and 6, the peer's own) set its warm-up and timed steps, PEER_B and PEER_T its batch and sequence
# length (default the script's CFG, B 4 x T 2048); CLOCKS=1 also polls the SM clock and power (clocks_start /
# clocks_say).
peer_step() {
  mem_start; [ "${CLOCKS:-0}" = 1 ] && clocks_start
  t peer_$1 240 python3 -c "
import runpy, torch
m = runpy.run_path('$G/torch_train_peer.py', run_name='peer'); c = m['CFG']; torch.manual_seed(0)
c['B'] = ${PEER_B:-c['B']}; c['T'] = ${PEER_T:-c['T']}
def bf16():
    mod = m['Model'](c).cuda().to(torch.bfloat16)
    return m['time_steps'](torch.compile(mod), torch.optim.AdamW(mod.parameters(), lr=1e-4, fused=True), c, **n)
def amp():
    mod = m['Model'](c).cuda()
    return m['time_steps'](m['AMP'](torch.compile(mod)), torch.optim.AdamW(mod.parameters(), lr=1e-4, fused=True), c, **n)
n = dict(steps=${PEER_STEPS:-6}, warm=${PEER_WARM:-3})
m['report']('torch_grouped_mm_compiled' if '$1' == 'compiled' else 'torch_grouped_mm_compiled_amp', bf16 if '$1' == 'compiled' else amp)"
  local peak=$(mem_peak)
  grep impl $W/peer_$1.log | tee -a $R
  say "   peer's peak GPU memory used (nvidia-smi, as ours): $peak MiB"
  [ "${CLOCKS:-0}" = 1 ] && clocks_say peer_$1
  return 0
}

# `clocks_start`, then `clocks_say NAME`: the SM clock, power draw and the clock-limit reasons nvidia-smi reports
# every 100 ms into $W/clocks.csv between the two; clocks_say stops the polling and says the busy samples' (power
# over 300 W) mean SM clock and power and the share of them power-capped (reason bit 0x4, SW power cap), adding
# the samples to $OUT/clocks.csv, each line led by NAME (one file: the device returns at most 8 from $OUT, and a
# file a run pushed a recipe's own report out of the reply once).
clocks_start() {
  nvidia-smi --query-gpu=clocks.sm,power.draw,clocks_event_reasons.active --format=csv,noheader,nounits -lms 100 \
    > $W/clocks.csv 2>/dev/null &
  CLK_PID=$!
}
clocks_say() {
  kill $CLK_PID 2>/dev/null; wait $CLK_PID 2>/dev/null
  [ -n "${OUT:-}" ] && sed "s/^/$1, /" $W/clocks.csv >> $OUT/clocks.csv
  say "   $1 clocks: $(awk -F', ' '$2 > 300 { n++; c += $1; p += $2; if (int((index("0123456789abcdef", tolower(substr($3, length($3)))) - 1) / 4) % 2) cap++ }
    END { if (n) printf "%d busy samples, mean SM clock %.0f MHz, mean power %.0f W, power-capped %.0f%%", n, c / n, p / n, 100 * cap / n; else print "no busy sample" }' $W/clocks.csv)"
}

# The mesh recipes' start (gpu_mesh.sh, share_bench.sh): `mesh_unpack PKG X` unpacks mesh_pack.sh's
# PKG/pkg.tar.xz into X and sets B (X/bin), the libraries and the relocatable Open MPI's environment, with
# NVLink multicast off and root allowed to run mpirun.
mesh_unpack() {
  local p=$1 x=$2
  mkdir -p "$x"
  tar -C "$x" -xJf "$p/pkg.tar.xz"
  B=$x/bin
  device_libs "$x" "$B/moe"
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
  export OPAL_PREFIX=$x/root/usr PATH=$x/root/usr/bin:$PATH
  export OMPI_MCA_mca_base_component_path=$x/root/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
  export PMIX_MCA_mca_base_component_path=$x/root/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix OMPI_MCA_pml=ob1
  export OMPI_MCA_btl=self,vader OMPI_MCA_mca_base_component_show_load_errors=0
  export PMIX_MCA_pcompress_base_silence_warning=1
}
