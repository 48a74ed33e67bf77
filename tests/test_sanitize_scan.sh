#!/usr/bin/env bash
# test_sanitize_scan.sh — scripts/device/sanitize_scan.sh (what sanitize_gpu.sh judges compute-sanitizer's
# logs with on the GPU) on logs written here in the tool's report format: hazards only inside a cuBLAS kernel
# pass and are listed by name (issue 42: the GPU run had 8 such, and the script said nothing); one race in our
# attention kernel, an invalid write in ours (the older format: file:line:kernel), a log the tool did not
# finish, and a summary counting reports that cannot be read fail; a clean log passes. The device recipes'
# san_line (scripts/device/libs.sh) on the same logs: cuBLAS's hazards do not fail a recipe, ours do.
set -u
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
command -v perl >/dev/null || { echo "SKIP: perl not installed"; exit 77; }
SCAN="$MOE_SRC/scripts/device/sanitize_scan.sh"
K=sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas
cat > cublas.log <<LOG
========= COMPUTE-SANITIZER
========= Warning: Race reported between Write access at $K+0x1b40
=========     and Read access at $K+0x1c10 [8 hazards]
=========
test_cuda_ops: 412 checks, 0 failed
========= RACECHECK SUMMARY: 8 hazards displayed (0 errors, 8 warnings)
LOG
cat > ours.log <<'LOG'
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at void attention_rowdot_k<float>(float *, __nv_bfloat16 *, const float *, const float *, int, int)+0x2a0 in cuda_attention.cu:140
=========     and Read access at void attention_rowdot_k<float>(float *, __nv_bfloat16 *, const float *, const float *, int, int)+0x310 in cuda_attention.cu:146 [2 hazards]
=========
========= RACECHECK SUMMARY: 1 hazard displayed (1 error, 0 warnings)
LOG
cat > old.log <<'LOG'
========= CUDA-MEMCHECK
========= Invalid __global__ write of size 4
=========     at 0x00000150 in /src/ops/cuda/cuda_nn.cu:88:swiglu_fwd_k(float*, float const *, int)
=========     by thread (3,0,0) in block (0,0,0)
=========     Address 0x7f0000000400 is out of bounds
=========
========= ERROR SUMMARY: 1 error
LOG
printf '========= COMPUTE-SANITIZER\ntest_cuda_ops: 12 checks\n' > cut.log
printf '========= COMPUTE-SANITIZER\n========= something new the scan does not know\n========= ERROR SUMMARY: 3 errors\n' > odd.log
printf '========= COMPUTE-SANITIZER\ntest_cuda_ops: 412 checks, 0 failed\n========= ERROR SUMMARY: 0 errors\n' > clean.log

scan() { bash "$SCAN" "$1" > out.txt 2>&1; }
scan cublas.log && grep -qF "1 report(s): 0 in our kernels, 1 in third-party code ($K)" out.txt &&
  pass "cuBLAS hazards pass, listed by name: $(cut -c1-110 out.txt)" || fail "cublas.log: rc $?, $(cat out.txt)"
scan ours.log; rc=$?
[ $rc = 1 ] && grep -q "1 in our kernels (attention_rowdot_k)" out.txt && pass "a race in attention_rowdot_k fails, named" ||
  fail "ours.log: rc $rc, $(cat out.txt)"
scan old.log; rc=$?
[ $rc = 1 ] && grep -q "1 in our kernels (swiglu_fwd_k)" out.txt && pass "an invalid write in swiglu_fwd_k (older format) fails, named" ||
  fail "old.log: rc $rc, $(cat out.txt)"
scan cut.log; rc=$?
[ $rc = 1 ] && grep -q "summary: NONE" out.txt && pass "a log without its summary fails" || fail "cut.log: rc $rc, $(cat out.txt)"
scan odd.log; rc=$?
[ $rc = 1 ] && pass "a summary counting 3 errors that no report line shows fails" || fail "odd.log: rc $rc, $(cat out.txt)"
scan clean.log && grep -q "0 report(s)" out.txt && pass "a clean log passes" || fail "clean.log: $(cat out.txt)"
bash "$SCAN" cublas.log ours.log > out.txt 2>&1 && fail "two logs, one of ours: exit 0" || pass "two logs, one with our hazard: exit 1"
# the device recipes' san_line (scripts/device/libs.sh) judges by the scan: cuBLAS's hazards leave FAIL 0, with
# the summary line and the scan's line in the progress file; ours, a missing log and a cut one set FAIL=1
san() { ( . "$MOE_SRC/scripts/device/libs.sh"; W=$PWD R=$PWD/r_$1.txt FAIL=0; : > "$R"; san_line "$1" > /dev/null; echo "$FAIL" ); }
[ "$(san cublas)" = 0 ] && grep -qF "cublas: ========= RACECHECK SUMMARY: 8 hazards" r_cublas.txt &&
  grep -qF "1 in third-party code ($K)" r_cublas.txt && pass "san_line: cuBLAS hazards do not fail a recipe, listed" ||
  fail "san_line cublas: $(cat r_cublas.txt)"
[ "$(san ours)" = 1 ] && grep -q "1 in our kernels (attention_rowdot_k)" r_ours.txt &&
  pass "san_line: a race in our kernel fails the recipe" || fail "san_line ours: $(cat r_ours.txt)"
[ "$(san cut)" = 1 ] && [ "$(san missing)" = 1 ] && [ "$(san clean)" = 0 ] &&
  pass "san_line: a cut or missing log fails, a clean one passes" || fail "san_line cut/missing/clean"
finish
