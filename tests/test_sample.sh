#!/usr/bin/env bash
# test_sample.sh — `moe sample` with the KV cache against the uncached sampler (--kv-cache 0: each
# token runs its whole context again): the same text, token for token, for a fixed seed, with
# temperature draws, greedy, top-k/top-p, and a window far shorter than the text (so the context
# slides and the cache is re-prefilled), also of a latent-attention model (its cache of the latent); the
# window defaults to the run's --seq-len (run.json); the
# tokens/s line; bad sampling options refused. Not here: the decode's logits (tests/test_decode.c).
set -u
. "$(dirname "$0")/lib.sh"
small_fixture
awk 'BEGIN { srand(3); for (i = 0; i < 600; i++) { s = ""; for (j = 0; j < 39; j++) s = s sprintf("%c", 97 + int(rand() * 8)); print s } }' > text.txt
run_ok "train a small model at T=24" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --n-layers 2 --seq-len 24 --data text.txt \
  --steps 12 --out r || finish

same() {   # label, then the sample options: the text with and without the cache (of the run CK, default r)
  local label=$1; shift
  run_ok "sample $label (cache)" "$MOE" sample --ckpt "${CK:-r}" --seed 5 "$@" --kv-cache 1 && cp "$OUT_FILE" c.txt && cp "$ERR_FILE" c.err
  run_ok "sample $label (no cache)" "$MOE" sample --ckpt "${CK:-r}" --seed 5 "$@" --kv-cache 0 && cp "$OUT_FILE" u.txt
  if [ -s c.txt ] && cmp -s c.txt u.txt; then pass "$label: cached = uncached, $(wc -c < c.txt) bytes"
  else fail "$label: cached and uncached samples differ"; diff c.txt u.txt | head -5; fi
}
same "temperature 0.8" --prompt 'abc' --tokens 80
grep -q "KV cache, window 24: the run's --seq-len" c.err && pass "window 24 from the run's run.json" ||
  { fail "the window is not the run's --seq-len"; cat c.err; }
grep -Eq "^sampled 80 tokens in [0-9.]+ s \([0-9.]+ tokens/s" c.err && pass "tokens/s printed" ||
  { fail "no tokens/s line"; cat c.err; }
same "greedy" --prompt 'hello' --tokens 60 --temperature 0
same "top-k 4, top-p 0.8, window 7 (slides)" --prompt 'a longer prompt than the window' --tokens 70 --top-k 4 \
  --top-p 0.8 --window 7 --max-new-tokens 70
p=$(grep -o '[0-9]* prefills' c.err | cut -d' ' -f1)
[ -n "$p" ] && [ "$p" -ge 10 ] && pass "window 7 over 70 tokens: $p prefills (the context slid)" ||
  { fail "window 7: expected >= 10 prefills"; cat c.err; }
same "top-p 0.5 alone" --prompt 'x' --tokens 40 --top-p 0.5
# latent attention: the cache holds the latent and the rope key (q_lora, YaRN, DeepSeek's interleaved pairs)
if run_ok "train a small latent-attention model at T=24" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --n-layers 2 \
    --n-kv-heads 2 --kv-lora-rank 12 --q-lora-rank 16 --qk-nope-head-dim 8 --qk-rope-head-dim 4 --v-head-dim 6 \
    --rope-interleave 1 --rope-factor 4 --rope-orig-max 8 --yarn-mscale-all-dim 1 --seq-len 24 --data text.txt \
    --steps 12 --out rm; then
  CK=rm same "latent attention, temperature 0.8, window 9 (slides)" --prompt 'abc' --tokens 60 --window 9
fi
# top-k 1 keeps the most likely token only: temperature draws become the greedy text
run_ok "sample --top-k 1 --temperature 0.8" "$MOE" sample --ckpt r --seed 9 --prompt 'hello' --tokens 60 --top-k 1 &&
  cp "$OUT_FILE" k1.txt
run_ok "sample --temperature 0" "$MOE" sample --ckpt r --prompt 'hello' --tokens 60 --temperature 0 && cp "$OUT_FILE" g.txt
cmp -s k1.txt g.txt && pass "top-k 1 = greedy" || fail "top-k 1 differs from greedy"

# the end-of-run sample on a mesh (TP + EP: the cached decode's TP all-reduce and MoE exchange; pipeline
# stages: the uncached sampler) writes what one process writes
run_ok "one process, end-of-run sample" "$MOE" train "${MODEL[@]}" --n-kv-heads 2 --n-layers 2 --steps 3 --sample-tokens 40 --out m1 --quiet --plots 0 \
  --seq-len 24 --batch 4 && sample_block "$OUT_FILE" > s1.txt
if command -v mpirun > /dev/null; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  for lay in "4|--tp 2 --ep 2|tp2+ep2" "2|--pp 2 --grad-accum 2|pp2"; do
    IFS='|' read -r np flags label <<< "$lay"
    OMP_NUM_THREADS=1 timeout 300 mpirun --oversubscribe -np "$np" "$MOE" train "${MODEL[@]}" --n-kv-heads 2 --n-layers 2 --steps 3 --sample-tokens 40 \
      --out "m$np" --quiet --plots 0 --seq-len 24 --batch 4 $flags > mesh.txt 2>&1 < /dev/null
    sample_block mesh.txt > s2.txt
    [ "$(wc -l < s1.txt)" -ge 3 ] && cmp -s s1.txt s2.txt && pass "$label: the end-of-run sample equals one process's" ||
      { fail "$label: the end-of-run sample differs from one process's"; tail -5 mesh.txt; }
  done
else
  skip "mpirun not installed: the mesh samples"
fi

run_fail "--top-p must be in (0, 1]" "$MOE" sample --ckpt r --top-p 0
run_fail "--top-k must be >= 0" "$MOE" sample --ckpt r --top-k -1
run_fail "--kv-cache must be 0 or 1" "$MOE" sample --ckpt r --kv-cache 2
run_fail "--window must be in 1.." "$MOE" sample --ckpt r --window 100000
finish
