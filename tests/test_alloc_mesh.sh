#!/usr/bin/env bash
# test_alloc_mesh.sh — a training step after the first allocates nothing on a mesh (tests/mpi_alloc.c under
# mpirun: host allocations and backend buffers counted per step on every rank, dropless and capacity, the
# pipelined exchange r 2, gradient accumulation 2, ZeRO 1 and 2, the aux-free balance): EP 2 (the exchange's
# plans only move rows between ranks there), EP 2 x ETP 2 (the gather over ETP), TP 2 x EP 2, and EP 4 over
# the two-level all-to-all (nodes of 2), and TP 2 x EP 2 with every device collective staged (the staged
# transport's pooled buffers and requests), and EP 2 through ipc (its inboxes). The comm layer's allocations
# count like any other.
set -u
. "$(dirname "$0")/lib.sh"
mpi_tests

MPI_ALLOC="$(dirname "$MOE")/mpi_alloc"
for L in "2|1 2 1 0|ep2" "4|1 2 2 0|ep2+etp2" "4|2 2 1 0|tp2+ep2" "4|1 4 1 2|ep4, two-level (nodes of 2)" \
         "4|2 2 1 0 staged|tp2+ep2 through the staged transport" "4|1 2 1 0 ipc|ep2 (4 ranks) through ipc"; do
  IFS='|' read -r np args label <<< "$L"
  if $MPI -np "$np" "$MPI_ALLOC" $args > "$TMP/ma.txt" 2>&1 < /dev/null; then
    pass "$label: no allocation after the first step ($(grep -c 'allocations per step' "$TMP/ma.txt") rank-cases; rank 0: $(grep '^\[rank 0\] dropless  ' "$TMP/ma.txt" | sed 's/.*: //'))"
  else
    fail "$label ($np ranks: mpi_alloc $args)"
    grep -E 'FAIL|error' "$TMP/ma.txt" | head -8
  fi
done
finish
