#!/bin/bash
# tok_bench.sh — the tokenizer's speed (issue 39; a benchmark, not a test), as a markdown table:
#   1. single-thread encode MB/s, one call on a whole file, ours (`moe prep` on one thread: the file is one
#      document; its summary's MB/s, which also counts reading the file and writing the shard) against
#      Hugging Face `tokenizers` (encode(), one thread), the same tokenizer on both sides: a byte-level BPE
#      of 32k trained here by `tokenizers` (GPT-2's regex) on the text; on tinyshakespeare and on a
#      multilingual text (CJK, Arabic, Cyrillic, emoji, combining marks, code); the ids of both compared;
#      and the same per paragraph (HF encode_batch on one thread; moe prep of the paragraphs as JSON lines);
#   2. `moe prep` scaling: JSON lines of the paragraphs (about PREP_MB MB) on 1, 2, 4, 8, 16 threads (those
#      up to the cores here), MB/s and the speed-up;
#   3. the BPE trainer, 32k, on the text repeated to about TRAIN_MB MB: seconds and peak memory (its
#      summary), and `tokenizers`' BpeTrainer on the same file.
# Needs python3 with `tokenizers`. MOE: the binary (default build/moe, else build-cpu/moe); TEXT (default
# shared/data/tinyshakespeare.txt or ../shared/data/...); PARTS (default 123); PREP_MB (default 64),
# TRAIN_MB (default 100): smaller for a quick check (e.g. PREP_MB=4 TRAIN_MB=5 on 2 cores). The table
# goes to stdout and $OUT/tok_bench.md.
set -eu
cd "$(dirname "$0")/../.."
MOE=${MOE:-$( [ -x build/moe ] && echo build/moe || echo build-cpu/moe)}
MOE=$(realpath "$MOE")
TEXT=${TEXT:-$( [ -f shared/data/tinyshakespeare.txt ] && echo shared/data/tinyshakespeare.txt || echo ../shared/data/tinyshakespeare.txt)}
PARTS=${PARTS:-123}
W=${TMPDIR:-/tmp}/tok_bench
O=${OUT:-$W}
PY="python3 scripts/device/tok_bench.py"
rm -rf "$W" && mkdir -p "$W" "$O"
T=$O/tok_bench.md
: > "$T"
say() { echo "$*" | tee -a "$T"; }
mbs() { grep -o '[0-9.]* MB/s' "$1" | tail -1 | cut -d' ' -f1; }
NCPU=$(nproc)
say "# tokenizer speed ($(date -u +%F), $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $NCPU cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), tokenizers $(python3 -c 'import tokenizers; print(tokenizers.__version__)'))"
$PY setup "$W" "$TEXT" "${PREP_MB:-64}" | sed 's/^/    /'

if [[ $PARTS == *1* ]]; then
  say ""
  say "| text | MB | tokens | ids equal | one call: HF MB/s | moe MB/s | moe / HF | per paragraph: HF MB/s | moe MB/s | moe / HF |"
  say "|---|---|---|---|---|---|---|---|---|---|"
  best_of3() { # best_of3 INPUT: the best MB/s of three single-thread preps
    local best=0 i
    for i in 1 2 3; do
      rm -rf "$W/s"
      OMP_NUM_THREADS=1 "$MOE" prep --tokenizer "$W/tok" --in "$1" --out "$W/s" > "$W/prep1.log"
      best=$(python3 -c "print(max($best, $(mbs "$W/prep1.log")))")
    done
    echo "$best"
  }
  ratio() { python3 -c "print(f'{$1 / $2:.2f}x')"; }
  for f in "$TEXT" "$W/multi.txt"; do
    [ "$(dirname "$f")" = "$W" ] || { cp "$f" "$W/" && f="$W/$(basename "$f")"; } # its .paras.jsonl goes beside it
    read -r _ hf _ eq _ n _ hfp _ _ < <($PY encode "$W" "$f" "$MOE")
    one=$(best_of3 "$f")
    para=$(best_of3 "$f.paras.jsonl")
    say "| $(basename "$f") | $(python3 -c "print(f'{$(stat -c %s "$f") / 1e6:.2f}')") | $n | $eq | $hf | $one | $(ratio "$one" "$hf") | $hfp | $para | $(ratio "$para" "$hfp") |"
  done
  say ""
  say "one call: the whole file encoded at once (HF encode(); moe prep of the file as one document); per"
  say "paragraph: its paragraphs (split at blank lines) as documents (HF encode_batch; moe prep of them"
  say "as JSON lines, each followed by the EOS); all on one thread. moe's MB/s count reading and writing too."
fi

if [[ $PARTS == *2* ]]; then
  say ""
  say "| moe prep, threads | MB/s | speed-up |"
  say "|---|---|---|"
  one=""
  for th in 1 2 4 8 16; do
    [ "$th" -le "$NCPU" ] || continue
    rm -rf "$W/s"
    OMP_NUM_THREADS=$th "$MOE" prep --tokenizer "$W/tok" --in "$W/docs.jsonl" --out "$W/s" > "$W/prep_$th.log"
    r=$(mbs "$W/prep_$th.log")
    one=${one:-$r}
    say "| $th | $r | $(python3 -c "print(f'{$r / $one:.2f}x')") |"
  done
  say ""
  say "prep input: $(python3 -c "print(f'{$(stat -c %s "$W/docs.jsonl") / 1e6:.1f}')") MB of JSON lines, $(grep -o '[0-9]* documents' "$W/prep_1.log" | head -1)"
fi

if [[ $PARTS == *3* ]]; then
  reps=$(python3 -c "print(max(1, round(${TRAIN_MB:-100} * 1e6 / $(stat -c %s "$TEXT"))))")
  for _ in $(seq "$reps"); do cat "$TEXT"; done > "$W/train.txt"
  t0=$(date +%s.%N)
  "$MOE" tokenizer train --vocab 32000 --data "$W/train.txt" --out "$W/trained.json" > "$W/train.log"
  wall=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")
  read -r _ hfs < <($PY train "$W/train.txt")
  say ""
  say "| BPE trainer, 32k, $(python3 -c "print(f'{$(stat -c %s "$W/train.txt") / 1e6:.0f}')") MB (the text x $reps) | seconds (wall) | peak memory |"
  say "|---|---|---|"
  say "| moe tokenizer train | $wall | $(grep -o 'peak memory [0-9]* MB' "$W/train.log" | cut -d' ' -f3-) |"
  say "| tokenizers BpeTrainer | $hfs | |"
  say ""
  say "moe: $(cat "$W/train.log")"
fi
