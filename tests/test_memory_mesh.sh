#!/usr/bin/env bash
# test_memory_mesh.sh — `moe info`'s per-rank float32 memory (the cost model the planner reads: cost_mesh)
# against what each rank of the CPU mesh holds (issue 41): 2 ranks of a model of ~120 MiB (4 layers, d 192,
# 8 experts of f 384, batch 8 x 32), 3 steps, on pp 2, tp 2 and ep 2 (and tp 2 with the expert gradients'
# memory lent to the activations, --grad-memory shared). Measured per rank (OUT/memory.json): the largest
# resident set at the end of a step less the one before the model was built (the binary, MPI, the
# libraries, the data: the process's baseline). Each within 5% of the figure `moe info --world 2` prints for
# that rank ("per rank ... total", or its stage's "... per rank"); and tp 2 with a vocabulary of 32,000, whole and
# split (--vocab-parallel 1 --loss-chunks 4).
# Measurement conditions, none of them a change to what is counted:
#  - MALLOC_MMAP_THRESHOLD_=65536: each buffer of 64 KiB or more is its own mapping, given back when freed,
#    so the resident set is the buffers alive, not what glibc's heap keeps of freed ones (without it a
#    freed MPI temporary of a collective stays resident: tp 2 measured 1.06-1.11x);
#  - the end of a step, not VmHWM: inside the gradient reduction MPI holds temporary buffers of a bucket's
#    size (tp 2: 6.8 MiB, a layer's expert gradients reduced over the EDP pair), no buffer of ours;
#  - --grad-memory separate in the three layouts (the lending rule is an estimate, cost.c acts_lent; tp 2
#    lends every layer's activations whole and is checked with shared too) and --dispatch capacity
#    --capacity-factor 1 (cost.c counts routing balanced: an EP rank's experts receiving their mean; dropless,
#    ep 2's busier rank receives up to 1.4x of it at this model's random start and holds those rows).
set -u
. "$(dirname "$0")/lib.sh"
mpi_tests
cd "$TMP" || exit 1
export OMP_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=65536
MODEL=(--n-layers 4 --d-model 192 --n-heads 6 --n-kv-heads 2 --d-ff 384 --n-experts 8 --seq-len 32 --batch 8
       --dispatch capacity --capacity-factor 1)

# bytes of a "12.34 MiB" figure
bytes() { awk -v v="$1" -v u="$2" 'BEGIN { m = u == "KiB" ? 1024 : u == "MiB" ? 1048576 : u == "GiB" ? 1073741824 : 1; printf "%.0f", v * m }'; }

# mem_case NAME FLAGS...: moe info's per-rank figures (one per stage with --pp) against each rank's.
mem_case() {
  local name="$1"; shift
  if ! "$MOE" info --world 2 "${MODEL[@]}" "$@" > info.txt 2>&1; then fail "$name: moe info failed"; cat info.txt; return; fi
  # rank r's figure: per stage (rank r is stage r with --pp 2 on 2 ranks), else the one per-rank line
  local pred=()
  while read -r v u; do pred+=("$(bytes "$v" "$u")"); done < <(
    sed -n -E 's/^  stage [0-9]+: .*; ([0-9.]+) ([KMG]iB) per rank$/\1 \2/p; s/^per rank \(zero.*; total ([0-9.]+) ([KMG]iB)$/\1 \2/p' info.txt)
  [ ${#pred[@]} -eq 1 ] && pred+=("${pred[0]}")
  if [ ${#pred[@]} -ne 2 ]; then fail "$name: no per-rank figure in moe info's output"; cat info.txt; return; fi
  if ! $MPI -x MALLOC_MMAP_THRESHOLD_ -np 2 "$MOE" train --device cpu --out run --force --quiet --steps 3 \
    --sample-tokens 0 --plots 0 --eval-every 0 --eval-batches 1 --save-every -1 "${MODEL[@]}" "$@" \
    > train.log 2>&1 < /dev/null; then
    fail "$name: training failed"; tail -3 train.log; return
  fi
  local r line
  for r in 0 1; do
    line=$(python3 - run/memory.json "$r" "${pred[$r]}" <<'P'
import json, sys
j, r, pred = json.load(open(sys.argv[1])), int(sys.argv[2]), float(sys.argv[3])
base, held, peak = j['rss_base_bytes'][r], j['rss_step_bytes'][r], j['rss_peak_bytes'][r]
m = held - base
print("%d rank %d: held %.2f MiB (resident %.2f at a step's end less %.2f before the model; VmHWM %.2f more) "
      "against moe info's %.2f MiB: %.3f" % (abs(m / pred - 1) <= 0.05, r, m / 2**20, held / 2**20, base / 2**20,
      (peak - held) / 2**20, pred / 2**20, m / pred))
P
)
    if [ "${line%% *}" = 1 ]; then pass "$name, ${line#* }"; else fail "$name, ${line#* }"; fi
  done
}

mem_case "pp 2 (1f1b, 2 micro-batches)" --pp 2 --grad-accum 2 --grad-memory separate
mem_case "tp 2" --tp 2 --grad-memory separate
mem_case "ep 2" --ep 2 --grad-memory separate
mem_case "tp 2, --grad-memory shared" --tp 2 --grad-memory shared
# a vocabulary of 32,000 (its two tables ~60% of the model, the logits 31 MiB a micro-batch): whole on each rank,
# then split over TP with the head's rows in 4 chunks (model/vocab.h: each rank's rows, a chunk's logits)
mem_case "tp 2, vocabulary 32000" --tp 2 --vocab-size 32000 --grad-memory separate
mem_case "tp 2, vocabulary 32000, --vocab-parallel 1 --loss-chunks 4" --tp 2 --vocab-size 32000 --vocab-parallel 1 \
  --loss-chunks 4 --grad-memory separate
finish
