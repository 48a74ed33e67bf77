#!/usr/bin/env bash
# test_cuda_attn_passes.sh — the attention backward's dS scratch at head dim 128 in passes (ops.h
# attention_ds_bytes: over MOE_ATTN_DS_MB, kv heads of one sequence a pass, two at least; where not two fit,
# two kv heads (one where KV is 1) over key ranges): test_cuda_ops on "cuda" with a cap of 1 MiB (read once a
# process, hence a run of its own), where its T 500 case (2 sequences, 4 kv heads, 288 KiB a pair) runs in 4
# passes of two pairs, T 600, 700 and 1000 (and chunks of T 600 and 1000) in key ranges (test_cuda_ops.c says
# which), T 4097's computes dS again, and the short ones keep one pass; every check of that program holds as
# it does by default. Then the bits: the program's small shapes (MOE_TEST_SMALL=1, the same random inputs
# in both) with the default cap (one pass at each) and under 1 MiB write a hash of each backward result where
# dS is kept (MOE_TEST_ATT_BITS); every name in both must have the same bits (dq written or added into
# zeros, dk, dv: the key ranges continue dq's sums in the one pass's order), the key-range cases among them.
# Skipped (77) without a CUDA build or GPU (test_cuda_ops's own skip).
set -u
BIN="$(dirname "${MOE_BIN:?}")/test_cuda_ops"
[ -x "$BIN" ] || { echo "SKIP: no $BIN (a build without CUDA)"; exit 77; }
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
MOE_ATTN_DS_MB=1 MOE_TEST_BACKEND=cuda "$BIN"
rc=$?
[ $rc = 77 ] && exit 77 # (test_cuda_ops said why it skips)
[ $rc = 0 ] || { echo "FAIL: test_cuda_ops under MOE_ATTN_DS_MB=1 (rc $rc)"; exit $rc; }
for cap in "" 1; do
  MOE_ATTN_DS_MB=$cap MOE_TEST_ATT_BITS=$W/bits$cap.txt MOE_TEST_SMALL=1 MOE_TEST_BACKEND=cuda "$BIN" \
    > $W/small$cap.log 2>&1 || { tail -30 $W/small$cap.log; echo "FAIL: small shapes, MOE_ATTN_DS_MB='$cap'"; exit 1; }
done
[ -s $W/bits.txt ] || { echo "SKIP: no dS scratch on this GPU (not Hopper): no bits to compare"; exit 77; }
# name -> hash of each run (a repeated name numbered in order), then the names in both: T 600 and 700 in key
# ranges (19 results: 8 for each backward, 3 for the chunks)
awk 'FNR == 1 { f++ } { k = $1 "#" (++n[f, $1]) } f == 1 { a[k] = $2; next } k in a { c++; kr += $1 ~ /_T600_|_T700_/
       if (a[k] != $2) { bad++; print "FAIL: bits differ under the 1 MiB cap:", k } }
     END { printf "%d results compared bit for bit (%d of key-range shapes), %d differ\n", c, kr, bad
       exit (bad > 0 || c < 30 || kr < 19) }' $W/bits.txt $W/bits1.txt
