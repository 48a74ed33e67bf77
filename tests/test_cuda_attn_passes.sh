#!/usr/bin/env bash
# test_cuda_attn_passes.sh — the attention backward's dS scratch at head dim 128 in passes (ops.h
# attention_ds_bytes: over MOE_ATTN_DS_MB, kv heads of one sequence a pass, two at least): test_cuda_ops on
# "cuda" with a cap of 1 MiB (read once a process, hence a run of its own), where its T 500 case (2
# sequences, 4 kv heads, 288 KiB a pair) runs in 4 passes of two pairs, T 1000's (2.4 MiB a pair at most)
# computes dS again, and the short ones keep one pass; every check of that program holds as it does by
# default. Skipped (77) without a CUDA build or GPU (test_cuda_ops's own skip).
set -u
BIN="$(dirname "${MOE_BIN:?}")/test_cuda_ops"
[ -x "$BIN" ] || { echo "SKIP: no $BIN (a build without CUDA)"; exit 77; }
MOE_ATTN_DS_MB=1 MOE_TEST_BACKEND=cuda "$BIN"
