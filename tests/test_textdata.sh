#!/usr/bin/env bash
# test_textdata.sh — training, sampling and evaluating on text through a Hugging Face tokenizer (issue 39;
# src/train/textdata.c, src/text/corpus.c): `moe train --tokenizer T --data corpus.txt` tokenises the text
# into shards cached in RUN/data/ that hold exactly what `tokenizers` (PyPI; skipped without it) encodes,
# followed by the EOS; the run trains bit for bit as one on `moe prep`'s shards of the same text (an
# independent route); a resume reuses the cache and continues as an uninterrupted run; a changed text or
# tokenizer is refused by name, leaving the run as it was (--data-changed re-tokenises); --init-from takes
# the Hugging Face directory's tokenizer.json; `moe sample` encodes the prompt and prints text (a model
# that learnt a sentence with a 3-byte character split over byte tokens continues it verbatim); `moe
# eval` reads the run's cache (the trainer's own final loss) or tokenises other text (the loss of prep's
# shards of it), leaving no temporary files. Bad input: one `moe: error:` line, nothing written. Under
# mpirun rank 0 tokenises once and both ranks train on the cache.
set -u
. "$(dirname "$0")/lib.sh"
small_fixture
trained_tokenizers
mkdir tok && cp tk/qwen2/tokenizer.json tok/ && echo '{"eos_token": "<|endoftext|>"}' >tok/tokenizer_config.json
python3 - <<'PY'
import random
r = random.Random(3)
w = "the of and to in is was model expert token router layer train data loss 数据 😀 naïve".split()
open("a.txt", "w").write("\n".join(" ".join(r.choice(w) for _ in range(r.randrange(4, 14))) for _ in range(700)))
open("b.txt", "w").write("\n".join(" ".join(r.choice(w) for _ in range(r.randrange(4, 14))) for _ in range(300)))
open("rep.txt", "w").write("the model € expert 数据 layer. " * 300)
PY
V=(--vocab-size 640)
R=("$MOE" train "${SMALL[@]}" "${MODEL[@]}")

echo "-- the cache holds what tokenizers encodes; training on it = training on moe prep's shards"
run_ok "train --tokenizer tok --data a.txt" "${R[@]}" --tokenizer tok --data a.txt --steps 4 --out run
cat >shards.py <<'PY'
import glob, struct, sys
from tokenizers import Tokenizer
tok = Tokenizer.from_file(sys.argv[2])
want = tok.encode(open(sys.argv[3], encoding="utf-8").read(), add_special_tokens=False).ids + [tok.token_to_id("<|endoftext|>")]
got = []
for p in sorted(glob.glob(sys.argv[1])):
    b = open(p, "rb").read()
    magic, version, n = struct.unpack("<3i", b[:12])
    assert (magic, version, len(b)) == (20240520, 1, 1024 + 2 * n), p
    got += struct.unpack(f"<{n}H", b[1024:])
print(f"{len(got)} tokens, {len(want)} expected")
sys.exit(0 if got == want else 1)
PY
run_ok "RUN/data/train holds tokenizers' ids of a.txt, then the EOS" \
  python3 shards.py 'run/data/train/train_*.bin' tok/tokenizer.json a.txt && sed 's/^/    /' "$OUT_FILE"
check "the vocabulary is the tokenizer's rounded up to 64 (no --vocab-size)" grep -q "vocab 576," run/train.log
check "run/tokenizer/ holds the tokenizer and the EOS" cmp -s tok/tokenizer.json run/tokenizer/tokenizer.json
check "... tokenizer_config.json names the EOS" grep -q '"eos_token":.*"<|endoftext|>"' run/tokenizer/tokenizer_config.json
check "run.json records the tokenizer's and the text's hashes" \
  python3 -c "import json,sys; j=json.load(open('run/run.json')); sys.exit(not (j['tokenizer']['hash'] and j['data']['train']['text']['bytes'] == $(stat -c %s a.txt)))"
"$MOE" prep --tokenizer tok --in a.txt --out s >/dev/null
run_ok "the same run on moe prep's shards" "${R[@]}" --data 's/train_*.bin' --vocab-size 576 --steps 4 --out ref
[ "$(field loss run/metrics.jsonl)" = "$(field loss ref/metrics.jsonl)" ] &&
  pass "losses identical to the run on prep's shards" || fail "the losses differ from the run on prep's shards"

echo "-- resume: the cache is reused; a changed text or tokenizer is refused"
run_ok "an uninterrupted run of 6 steps" "${R[@]}" --tokenizer tok --data a.txt --steps 6 --out full
before=$(stat -c %Y.%i run/data/train/train_000000.bin)
run_ok "resume to step 6 (the run's tokenizer copy)" "${R[@]}" --steps 6 --out run --resume
grep -q -- "--data: .* documents" "$OUT_FILE" && fail "the resume tokenised again" ||
  pass "the resume tokenised nothing ($(stat -c %Y.%i run/data/train/train_000000.bin) = $before)"
[ "$(field loss run/metrics.jsonl)" = "$(field loss full/metrics.jsonl)" ] &&
  pass "resumed losses identical to the uninterrupted run" || fail "the resumed run differs"
GUARD="$W/run"
cp a.txt a0.txt && echo " one more line" >>a.txt
run_fail "the text of --data changed since the run was saved" "${R[@]}" --steps 7 --out run --resume
run_fail "is not the one the run trained with" "${R[@]}" --steps 7 --out run --resume --tokenizer tk/llama3 \
  --data a0.txt
run_ok "control: byte-level run" "${R[@]}" --data a0.txt --steps 1 --out bytes
GUARD="$W/bytes"
run_fail "trained without a tokenizer" "${R[@]}" --steps 2 --out bytes --resume --tokenizer tok
GUARD=""
run_ok "--data-changed re-tokenises and continues" "${R[@]}" --steps 7 --out run --resume --data-changed
run_ok "... the new cache holds the new text" python3 shards.py 'run/data/train/train_*.bin' tok/tokenizer.json a.txt
cp a0.txt a.txt

echo "-- --init-from a Hugging Face directory with a tokenizer.json"
run_ok "export the run" "$MOE" export --ckpt full --out hf
check "export copies the run's tokenizer" cmp -s tok/tokenizer.json hf/tokenizer.json
run_ok "train --init-from hf --data b.txt" "${R[@]}" --init-from hf --data b.txt --steps 2 --out ih
check "... tokenised with hf/tokenizer.json" grep -q "via $W/hf/tokenizer.json" ih/train.log
run_ok "... cached as tokenizers encodes b.txt" python3 shards.py 'ih/data/train/train_*.bin' tok/tokenizer.json b.txt

echo "-- sample: the prompt encoded, the tokens printed as text"
run_ok "learn one sentence" "$MOE" train "${MODEL[@]}" --tokenizer tok --data rep.txt --steps 60 --batch 4 \
  --seq-len 32 --lr 1e-2 --eval-batches 1 --plots 0 --quiet --sample-tokens 0 --out rs
check "'€' is 3 byte tokens of this tokenizer (a character split over tokens)" \
  python3 -c "from tokenizers import Tokenizer; import sys; sys.exit(len(Tokenizer.from_file('tok/tokenizer.json').encode('€').ids) != 3)"
run_ok "sample --prompt 'the model' (greedy)" "$MOE" sample --ckpt rs --prompt "the model" --tokens 24 --temperature 0
printf 'the model € expert 数据 layer. the model € expert' >want.txt
head -c "$(stat -c %s want.txt)" "$OUT_FILE" | cmp -s - want.txt && pass "it continues the sentence: $(head -1 "$OUT_FILE")" ||
  fail "the sample: $(head -1 "$OUT_FILE")"
run_ok "sample with an empty prompt (starts from the EOS)" "$MOE" sample --ckpt rs --tokens 8 --temperature 0

echo "-- eval: the run's cache, or other text tokenised on the way"
mkdir etmp
run_ok "eval --ckpt run (its data from run.json)" env TMPDIR="$W/etmp" "$MOE" eval --ckpt full --eval-batches all
got=$(grep -o 'val loss [0-9.]*' "$OUT_FILE")
"$MOE" eval --ckpt full --data 's/train_*.bin' --eval-batches all >e_ref.txt
[ -n "$got" ] && [ "$got" = "$(grep -o 'val loss [0-9.]*' e_ref.txt)" ] && pass "$got, as on prep's shards" ||
  fail "eval on the run's text: '$got' vs prep's shards: $(grep 'val loss' e_ref.txt)"
"$MOE" prep --tokenizer tok --in b.txt --out sb >/dev/null
run_ok "eval --data b.txt (not the run's)" env TMPDIR="$W/etmp" "$MOE" eval --ckpt full --data b.txt --eval-batches all
got=$(grep -o 'val loss [0-9.]*' "$OUT_FILE")
"$MOE" eval --ckpt full --data 'sb/train_*.bin' --eval-batches all >e_ref.txt
[ -n "$got" ] && [ "$got" = "$(grep -o 'val loss [0-9.]*' e_ref.txt)" ] && pass "$got, as on prep's shards of b.txt" ||
  fail "eval on b.txt: '$got' vs prep's shards: $(grep 'val loss' e_ref.txt)"
[ -z "$(ls -A etmp)" ] && pass "no temporary files left" || fail "left in TMPDIR: $(ls etmp)"

echo "-- without a tokenizer, text stays bytes"
run_ok "train --data a.txt" "${R[@]}" --data a.txt --steps 1 --out plain
check "... vocab 256, text:a.txt" grep -q "data: text:a.txt, $(stat -c %s a.txt) tokens" plain/train.log
check "... no tokenizer copy, no cache" test ! -e plain/tokenizer -a ! -e plain/data

echo "-- bad input: one message, nothing written"
gzip -c a.txt >a.txt.gz && head -c 2000 a.txt.gz >trunc.txt.gz
: >empty.txt
echo '{"text": "a b"}' >d.jsonl
GUARD="$W/new"
run_fail "does not fit the model's embedding (vocab_size 256)" "${R[@]}" --tokenizer tok --vocab-size 256 \
  --data a.txt --out new
run_fail "cannot read '$W/trunc.txt.gz'" "${R[@]}" --tokenizer tok --data trunc.txt.gz --out new
run_fail "--data: the inputs hold no document" "${R[@]}" --tokenizer tok --data empty.txt --out new
run_fail "its documents need an EOS token" "${R[@]}" --tokenizer tk/gpt2 --data d.jsonl --out new
run_fail "cannot read 'nope.txt'" "${R[@]}" --tokenizer tok --data nope.txt --out new
printf 'too short' >short.txt
run_fail "too few for T=16" "${R[@]}" --tokenizer tok --data short.txt --out new
GUARD="$W/run"
run_fail "already holds a training run" "${R[@]}" --tokenizer tok --data b.txt --out run
run_fail "has 702 ids; the model's embedding" "$MOE" sample --ckpt run --tokenizer tk/gpt2
GUARD="$W/new"
run_fail "the embedded corpus (no --data) is bytes" "${R[@]}" --tokenizer tok --out new

echo "-- two ranks: rank 0 tokenises, both read the same shards"
mpi_tests # (skips the rest without mpirun)
run_ok "mpirun -np 2 train --tokenizer tok --data b.txt" $MPI -np 2 "${R[@]}" --tokenizer tok --data b.txt \
  --steps 2 --out rm
check "... tokenised once" [ "$(grep -c -- '--data: .* documents' "$OUT_FILE")" = 1 ]
run_ok "... the cache holds tokenizers' ids of b.txt" python3 shards.py 'rm/data/train/train_*.bin' tok/tokenizer.json b.txt
finish
