#!/usr/bin/env bash
# test_megatron.sh — Megatron-LM indexed datasets (src/data/megatron.c) as input to `moe prep` and to
# `moe train --data PREFIX` (and `moe eval`). The fixtures come from an independent writer (tests/data_ref.py, Python
# struct following Megatron's documented layout): uint16, int32 and int16 tokens, documents of several
# sequences. Prep copies each document's ids as they are (no EOS added: Megatron's data carries its own
# EOD), holds out the first --val-docs documents, picks uint32 shards for ids beyond 65535, and among
# text inputs keeps the input order (the text tokenised by data_ref.py's byte-level tokenizer, whose ids
# are the UTF-8 bytes, then its EOS). Training on PREFIX gives the losses of training on prep's shards of it.
# Bad input (truncated, short or missing files, wrong magic, version, dtype, a sequence past the .bin,
# bad document boundaries, a negative id; an id beyond the tokenizer's vocabulary in prep and in train,
# or beyond the model's embedding, in a Megatron dataset and in llm.c shards): one `moe: error:` line, a non-zero
# exit, nothing left at --out.
set -u
. "$(dirname "$0")/lib.sh"
small_fixture
REF="$MOE_SRC/tests/data_ref.py"
python3 - <<'PY'
import json, random
r = random.Random(7)
def doc(nseq, top): return [[r.randrange(top) for _ in range(r.randrange(0 if k else 1, 300))] for k in range(nseq)]
json.dump([doc(1 + i % 3, 700) for i in range(12)], open("a.json", "w"))         # uint16, ids < 700
json.dump([doc(2, 70001) + [[70000]] for i in range(3)], open("b.json", "w"))   # int32, ids to 70000
json.dump([[[104, 105, 256]], [[33, 256]]], open("c.json", "w"))                # int16, ids < 257
json.dump([[[5, -3]]], open("neg.json", "w"))                                  # int32, a negative id
open("t1.txt", "w").write("héllo, 世界\n")
open("t2.jsonl", "w").write('{"text": "one"}\n{"text": "two 😀"}\n')
PY
python3 "$REF" bytetok tok && python3 "$REF" write ma 8 a.json && python3 "$REF" write mb 4 b.json && python3 "$REF" write mc 3 c.json &&
  python3 "$REF" write mneg 4 neg.json && pass "fixtures written (Megatron layout, Python struct)" ||
  { fail "writing the fixtures"; finish; }

# expected: the concatenated ids of documents [lo, hi) of a spec
ids_of() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))[int(sys.argv[2]):int(sys.argv[3])]
print("\n".join(str(i) for doc in d for seq in doc for i in seq))' "$@"; }
run_ok "prep a uint16 dataset (no tokenizer)" "$MOE" prep --in ma --out sa --val-docs 3 --shard-tokens 500
grep -q "prep: 12 documents (3 held out; 12 from Megatron datasets)" "$OUT_FILE" && grep -q "uint16 tokens, no EOS" "$OUT_FILE" &&
  pass "summary: $(cut -c1-120 "$OUT_FILE")" || fail "summary: $(cat "$OUT_FILE")"
python3 "$REF" shards sa val > got_val && python3 "$REF" shards sa train > got_train
[ "$(head -1 got_val)" = "20240520 $(ids_of a.json 0 3 | wc -l)" ] && [ "$(tail -n +2 got_val)" = "$(ids_of a.json 0 3)" ] &&
  pass "val shards: the first 3 documents' ids, verbatim" || fail "val shards differ ($(head -1 got_val))"
[ "$(tail -n +2 got_train)" = "$(ids_of a.json 3 12)" ] && [ "$(ls sa/train_*.bin | wc -l)" -ge 3 ] &&
  pass "train shards: the other 9 documents' ids in $(ls sa/train_*.bin | wc -l) shards of <= 500" || fail "train shards differ"

run_ok "prep an int32 dataset named by its .idx" "$MOE" prep --in mb.idx --out sb
python3 "$REF" shards sb train > got_b
[ "$(head -1 got_b)" = "20240801 $(ids_of b.json 0 3 | wc -l)" ] && [ "$(tail -n +2 got_b)" = "$(ids_of b.json 0 3)" ] &&
  pass "ids to 70000: uint32 shards (magic 20240801), the ids verbatim" || fail "int32 dataset: $(head -1 got_b)"

run_ok "prep text, a Megatron dataset and JSON lines, with a tokenizer" "$MOE" prep --tokenizer tok --in t1.txt mc t2.jsonl \
  --out sm --val-docs 1
python3 "$REF" shards sm val > got_mv && python3 "$REF" shards sm train > got_mt
want_v=$(python3 -c 'print("\n".join(map(str, list("héllo, 世界\n".encode()) + [256])))')
want_t=$(python3 -c 'print("\n".join(map(str, [104, 105, 256, 33, 256] + list(b"one") + [256] + list("two 😀".encode()) + [256])))')
[ "$(tail -n +2 got_mv)" = "$want_v" ] && [ "$(tail -n +2 got_mt)" = "$want_t" ] &&
  pass "input order kept: the text's bytes + EOS, the Megatron ids as they are, the JSON lines + EOS" ||
  fail "mixed inputs: val $(tail -n +2 got_mv | tr '\n' ' '), train $(tail -n +2 got_mt | tr '\n' ' ')"

# training on the dataset directly equals training on prep's shards of it (the same stream of tokens)
run_ok "prep ma, no held-out documents" "$MOE" prep --in ma --out sa0
run_ok "moe train --data ma (the prefix)" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --data ma --vocab-size 704 --steps 3 --out ra
run_ok "moe train --data 'sa0/train_*.bin'" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --data 'sa0/train_*.bin' --vocab-size 704 \
  --steps 3 --out rs
grep -q '"step":3' ra/metrics.jsonl && grep -q '"val_loss"' ra/metrics.jsonl && [ "$(grep -o '"loss":[^,]*\|"val_loss":[^,]*' ra/metrics.jsonl)" = \
  "$(grep -o '"loss":[^,]*\|"val_loss":[^,]*' rs/metrics.jsonl)" ] &&
  pass "losses on the Megatron prefix = losses on prep's shards ($(grep -c '"loss"' ra/metrics.jsonl) records)" ||
  fail "the losses differ"
run_ok "moe eval --data ma" "$MOE" eval --ckpt ra --data ma "${EVAL[@]}"
grep -q "megatron:ma" "$OUT_FILE" && pass "moe eval reads the Megatron prefix" || fail "eval: $(head -c 400 "$OUT_FILE")"
# ids beyond the vocabulary: the model's embedding (a Megatron dataset, llm.c shards), a tokenizer's
run_fail "do not fit the model's vocab_size 256" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --data ma --vocab-size 256 --steps 1 --out bad20
run_fail "do not fit the model's vocab_size 512" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --data 'sa0/train_*.bin' --vocab-size 512 \
  --steps 1 --out bad21
run_fail "(up to id $(ids_of a.json 0 12 | sort -n | tail -1), from megatron:ma (12 documents)) are beyond the tokenizer" \
  "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --tokenizer tok --data ma --vocab-size 704 --steps 1 --out bad22
grep -q "tokenizer.json's vocabulary (257 ids)" "$ERR_FILE" && pass "the message names the tokenizer's 257 ids" || fail "$(cat "$ERR_FILE")"

# bad input: each refused with one message, nothing at --out
mk() { # mk NAME PYTHON: a copy of ma's .idx (b: its bytes) edited by PYTHON, beside a copy of ma.bin
  cp ma.bin "$1.bin" && python3 -c "import struct; b = bytearray(open('ma.idx', 'rb').read()); $2; open('$1.idx', 'wb').write(b)"; }
S=$(python3 -c "import json; print(sum(len(d) for d in json.load(open('a.json'))))")   # sequences in ma
mk trunc "b = b[:-5]"
mk short "b = b[:20]"
mk magic "b[0:7] = b'NOTIDX!'"
mk vers "b[9:17] = struct.pack('<Q', 2)"
mk float "b[17] = 7"
mk code "b[17] = 9"
mk past "o = 34 + 4 * $S + 8 * ($S - 1); b[o:o + 8] = struct.pack('<q', struct.unpack('<q', b[o:o + 8])[0] + 2)"
mk bounds "b[-8:] = struct.pack('<q', $S - 1)"
mk count "b[18:26] = struct.pack('<Q', 1 << 60)"
cp ma.idx nobin.idx
run_fail "'trunc.idx' is truncated: $(($(stat -c %s ma.idx) - 5)) bytes" "$MOE" prep --in trunc --out bad1
run_fail "'short.idx' is truncated: 20 bytes, the header alone is 34" "$MOE" prep --in short --out bad2
run_fail "'magic.idx' is not a Megatron index" "$MOE" prep --in magic --out bad3
run_fail "'vers.idx' has index version 2" "$MOE" prep --in vers --out bad4
run_fail "dtype code 7 is float32, not a token type" "$MOE" prep --in float --out bad5
run_fail "unknown dtype code 9" "$MOE" prep --in code --out bad6
run_fail "reaches past the end of 'past.bin'" "$MOE" prep --in past --out bad7
run_fail "the document boundaries run from 0 to $((S - 1))" "$MOE" prep --in bounds --out bad8
run_fail "'count.idx' is truncated" "$MOE" prep --in count --out bad9
run_fail "cannot read 'nobin.bin'" "$MOE" prep --in nobin --out bad10
run_fail "token -3 (sequence 0, position 1) is negative" "$MOE" prep --in mneg --out bad11
big=$(python3 -c "import json; print([i for s in json.load(open('a.json'))[0] for i in s if i >= 257][0])")
run_fail "'ma': token $big (document 0) is beyond the tokenizer's vocabulary (257 ids)" "$MOE" prep --tokenizer tok \
  --in t1.txt ma --out bad12
run_fail "--tokenizer DIR|tokenizer.json is required (to read 't1.txt')" "$MOE" prep --in ma t1.txt --out bad13
run_fail "'past.bin' has wrong magic" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --data past.bin --steps 1 --out bad14
grep -q "a Megatron dataset is named by its prefix" "$ERR_FILE" && pass "a Megatron .bin given as a shard: the message says how to name it" ||
  fail "no hint for a Megatron .bin: $(cat "$ERR_FILE")"
run_fail "reaches past the end of 'past.bin'" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --data past --steps 1 --out bad15
run_fail "'ma' is a Megatron dataset: token ids, no text to read" "$MOE" tokenizer train --vocab 300 --data ma --out bad16.json
left=$(ls -d bad* 2>/dev/null)
[ -z "$left" ] && pass "nothing left by the refusals" || fail "left behind: $left"
finish
