#!/usr/bin/env bash
# mpirun_preempt.sh — mpirun for a preemptible `moe train` on a mesh: `scripts/mpirun_preempt.sh -np 4
# build/moe train ...` runs `mpirun -np 4 build/moe train ...`, and a SIGTERM or SIGINT to this script (what
# a scheduler sends before it kills a job) reaches the ranks as SIGUSR1, so the job's exit status is the
# ranks' 75 (checkpoint written: continue with --resume).
# Why: Open MPI's mpirun (4.x) treats SIGTERM and SIGINT as an abort: it sets its own exit status to 1,
# forwards SIGTERM to the ranks and kills them with SIGKILL a second later (odls_base_sigkill_timeout),
# which may cut a large checkpoint short. SIGUSR1 and SIGUSR2 it forwards as they are, waits for the
# ranks, and exits with their status; moe train handles them as it handles SIGTERM.
# MPIRUN names the launcher (default: mpirun on PATH). Exit status: mpirun's.
set -u
"${MPIRUN:-mpirun}" "$@" &
pid=$!
trap 'kill -USR1 $pid 2>/dev/null' TERM INT
while :; do
  wait $pid
  rc=$?
  kill -0 $pid 2>/dev/null || break # (wait returns early when a trapped signal arrives)
done
exit $rc
