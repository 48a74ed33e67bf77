#!/usr/bin/env bash
# test_race_pairs.sh — scripts/device/race_pairs.py (each racecheck report's pair of instructions, for reading
# a failed racecheck) on a SASS listing and racecheck logs written here in the tools' formats (cuobjdump's
# mangled "Function :" headers and "/*offset*/" lines, racecheck's demangled "KERNEL+0xOFF" pairs): every pair
# named by its two instructions and hazard count, across two kernels; an offset the listing lacks shown as "?"
# and exit 1; a log without reports exit 0; an unreadable binary exit 2.
set -u
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
command -v python3 >/dev/null || { echo "SKIP: python3 not installed"; exit 77; }
command -v c++filt >/dev/null || { echo "SKIP: c++filt (binutils) not installed"; exit 77; }
RC="$MOE_SRC/scripts/device/race_pairs.py"
cat > k.sass <<'SASS'

Fatbin elf code:
================
	code for sm_90a
		Function : _Z9gf_kernelILi0EEv14CUtensorMap_stS0_6GFArgs
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED EF_CUDA_64BIT_ADDRESS EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0010*/                   LDS R209, [R150] ;                           /* 0x0000000096d17984 */
        /*0020*/                   LDS R210, [R150+0x20] ;                      /* 0x0000200096d27984 */
        /*0030*/                   LDGSTS.E [R25+0x30000], desc[UR12][R12.64], !P3 ; /* 0x300000000c197fae */
        /*0040*/               @P0 LDGSTS.E.ZFILL [R25+0x30200], desc[UR12][R12.64], P0 ; /* 0x302000000c197fae */
		Function : _Z9gf_kernelILi1EEv14CUtensorMap_stS0_6GFArgs
	.headerflags	@"EF_CUDA_TEXMODE_UNIFIED"
        /*0010*/                   LDS.64 R24, [R208+0x5e0] ;                   /* 0x0005e000d0187984 */
        /*0020*/                   STS [R3+0x30400], R14 ;                      /* 0x0304000e03007388 */
SASS
K0='void gf_kernel<(int)0>(CUtensorMap_st, CUtensorMap_st, GFArgs)'
K1='void gf_kernel<(int)1>(CUtensorMap_st, CUtensorMap_st, GFArgs)'
# race REPORT... — a racecheck log of those reports, each "ACCESS KERNEL+OFF, ACCESS KERNEL+OFF [N], ..." as
# the tool prints one: its first access, then each access it raced with and their hazards
race() {
  echo '========= COMPUTE-SANITIZER'
  for r in "$@"; do
    IFS=';' read -r first rest <<< "$r"
    echo "========= Error: Race reported between $first"
    IFS=';' read -ra others <<< "$rest"
    for o in "${others[@]}"; do echo "=========     and $o"; done
    echo '========='
  done
  echo "========= RACECHECK SUMMARY: $# hazards displayed ($# errors, 0 warnings)"
}
race "Write access at $K0+0x30;Read access at $K0+0x10 [20480 hazards];Read access at $K0+0x20 [20480 hazards]" \
  "Read access at $K0+0x10;Write access at $K0+0x40 [320 hazards]" > known.log
race "Write access at $K0+0x30;Read access at $K0+0x10 [20480 hazards]" \
  "Write access at $K1+0x20;Read access at $K1+0x10 [11 hazards]" > sts.log
sed 's/+0x10 \[20480/+0x70 [20480/' known.log > lost.log
printf '========= COMPUTE-SANITIZER\n========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)\n' > clean.log
run() { python3 "$RC" "$1" k.sass > out.txt 2>&1; }
run known.log && grep -q "3 distinct pairs, 0 with an instruction not found" out.txt &&
  grep -q "LDGSTS.E \[R25+0x30000\].*LDS R209, \[R150\] (1)" out.txt &&
  grep -q "LDS R209, \[R150\] | Write +0x40: @P0 LDGSTS.E.ZFILL \[R25+0x30200\].* (1)" out.txt &&
  pass "each pair named by its two instructions" || fail "known.log: rc $?, $(cat out.txt)"
run sts.log && grep -q "STS \[R3+0x30400\], R14 | Read +0x10: LDS.64 R24, \[R208+0x5e0\]" out.txt &&
  grep -q "2 distinct pairs, 0 with" out.txt && pass "pairs of two kernels, each in its own listing" ||
  fail "sts.log: rc $?, $(cat out.txt)"
run lost.log; rc=$?
[ $rc = 1 ] && grep -q ": ? (1)" out.txt && grep -q "1 with an instruction not found" out.txt &&
  pass "an offset the listing lacks: '?' and exit 1" || fail "lost.log: rc $rc, $(cat out.txt)"
run clean.log && grep -q "0 distinct pairs, 0 with" out.txt && pass "a log without reports: exit 0" ||
  fail "clean.log: rc $?, $(cat out.txt)"
python3 "$RC" known.log missing.bin > out.txt 2>&1; rc=$?
[ $rc = 2 ] && pass "an unreadable binary: exit 2" || fail "missing binary: rc $rc, $(cat out.txt)"
finish
