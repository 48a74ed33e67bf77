#!/usr/bin/env bash
# test_zstd.sh — zstd'd text inputs (src/text/infile.c), as test_prep.sh tests the gzip'd ones: `moe
# prep` reads a .jsonl.zst (two zstd frames one after the other) and a .txt.zst of 3 MB (a document over
# several 1 MiB pieces) into the same shards as the plain files, and those hold each document's UTF-8
# bytes then the EOS (tests/data_ref.py's byte-level tokenizer: ids are bytes, so the expected ids need
# no tokenizer); `moe train --tokenizer` on a .jsonl.zst has the losses of the plain .jsonl. A truncated
# or corrupt .zst: one `moe: error:` line, a non-zero exit, nothing at --out. A moe built without
# libzstd must refuse a zstd file by naming the library (then the rest is skipped). On a terminal prep
# shows its progress with an ETA. Needs the zstd
# command to make the fixtures (skipped without it).
set -u
. "$(dirname "$0")/lib.sh"
small_fixture
command -v zstd > /dev/null || { skip "no zstd command to compress the fixtures"; finish; }
REF="$MOE_SRC/tests/data_ref.py"
python3 "$REF" bytetok tok
python3 - <<'PY'
import json, random
r = random.Random(3)
words = "the model expert 数据 مرحبا 😀 naïve e\u0301 x=1; 12345 \t tabs".split(" ")
docs = [" ".join(r.choice(words) for _ in range(r.randrange(1, 30))) for i in range(40)]
with open("a1.jsonl", "w") as f:
    for d in docs[:25]: f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
with open("a2.jsonl", "w") as f:
    for d in docs[25:]: f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
json.dump(docs, open("docs.json", "w"))
PY
text_bytes 3000000 11 > big.txt
cat a1.jsonl a2.jsonl > a.jsonl
zstd -q a1.jsonl -o a1.zst && zstd -q -19 a2.jsonl -o a2.zst && cat a1.zst a2.zst > a.jsonl.zst && zstd -q big.txt -o big.txt.zst ||
  { fail "zstd could not make the fixtures"; finish; }

"$MOE" prep --tokenizer tok --in a.jsonl.zst --out probe > /dev/null 2> probe.err
if grep -q "built without libzstd" probe.err; then
  [ "$(grep -c . probe.err)" = 1 ] && grep -q "^moe: error: prep: 'a.jsonl.zst' is zstd-compressed" probe.err && [ ! -e probe ] &&
    pass "a moe without libzstd refuses a zstd file by naming the library" || fail "without libzstd: $(cat probe.err)"
  skip "this moe was built without libzstd"
  finish
fi
rm -rf probe
run_ok "prep a.jsonl.zst big.txt.zst" "$MOE" prep --tokenizer tok --in a.jsonl.zst big.txt.zst --out z --val-docs 4 --shard-tokens 1000000
run_ok "prep a.jsonl big.txt" "$MOE" prep --tokenizer tok --in a.jsonl big.txt --out p --val-docs 4 --shard-tokens 1000000
[ "$(tree_hash z)" = "$(tree_hash p)" ] && pass "the shards of the .zst inputs are those of the plain files" ||
  fail "the .zst shards differ from the plain ones"
python3 "$REF" shards z val > got_val && python3 "$REF" shards z train > got_train
python3 - <<'PY' > want_train
import json
docs = json.load(open("docs.json"))[4:] + [open("big.txt", encoding="utf-8").read()]
print("\n".join(str(i) for d in docs for i in list(d.encode()) + [256]))
PY
[ "$(tail -n +2 got_train)" = "$(cat want_train)" ] && [ "$(ls z/train_*.bin | wc -l)" -ge 3 ] &&
  pass "train: each document's UTF-8 bytes then the EOS ($(wc -l < want_train) ids, 3 MB document included)" ||
  fail "the train shards are not the documents' bytes + EOS"
[ "$(head -1 got_val)" = "20240520 $(python3 -c 'import json; print(sum(len(d.encode()) + 1 for d in json.load(open("docs.json"))[:4]))')" ] &&
  pass "val: the first 4 documents" || fail "val: $(head -1 got_val)"

R=("$MOE" train "${SMALL[@]}" "${MODEL[@]}" --tokenizer tok --vocab-size 320 --steps 3)
run_ok "train on a.jsonl.zst" "${R[@]}" --data a.jsonl.zst --out rz
run_ok "train on a.jsonl" "${R[@]}" --data a.jsonl --out rp
grep -q '"step":3' rz/metrics.jsonl && [ "$(grep -o '"loss":[^,]*' rz/metrics.jsonl)" = "$(grep -o '"loss":[^,]*' rp/metrics.jsonl)" ] &&
  pass "moe train --data a.jsonl.zst: the losses of a.jsonl" || fail "the losses differ"

# the progress line (on a terminal: `script` gives prep one): documents, tokens, MB/s and an ETA, the first
# after 4096 documents, inside the .zst
python3 -c "
import json
with open('many.jsonl', 'w') as f:
    for i in range(6000): f.write(json.dumps({'text': f'document {i} ' * 20}) + '\\n')"
zstd -q many.jsonl -o many.jsonl.zst
if command -v script > /dev/null; then
  script -qec "$MOE prep --tokenizer tok --in many.jsonl.zst --out tty" /dev/null > tty.log 2>&1
  grep -Eq "prep: 4096 documents, [0-9]+ tokens, [0-9.]+ MB/s, ETA [0-9]+m[0-5][0-9]s" tty.log && grep -q "^prep: 6000 documents" tty.log &&
    pass "the progress line on a terminal: $(grep -Eo 'prep: 4096 documents[^\r]*ETA [0-9ms]*' tty.log | head -1)" ||
    fail "no progress line with an ETA: $(head -c 300 tty.log)"
else skip "no script command (a terminal for the progress line)"; fi

head -c -7 a.jsonl.zst > trunc.jsonl.zst
python3 -c "b = bytearray(open('big.txt.zst', 'rb').read()); b[len(b) // 2] ^= 0xFF; b[len(b) // 2 + 1] ^= 0x55; open('corrupt.txt.zst', 'wb').write(b)"
run_fail "cannot read 'trunc.jsonl.zst' (the zstd stream is truncated)" "$MOE" prep --tokenizer tok --in trunc.jsonl.zst --out bad1
run_fail "cannot read 'corrupt.txt.zst' (zstd: " "$MOE" prep --tokenizer tok --in corrupt.txt.zst --out bad2
run_fail "trunc.jsonl.zst' (the zstd stream is truncated)" "${R[@]}" --data trunc.jsonl.zst --out bad3
left=$(ls -d bad* 2>/dev/null)
[ -z "$left" ] && pass "nothing left by the refusals" || fail "left behind: $left"
finish
