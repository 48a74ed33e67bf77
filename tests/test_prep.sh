#!/usr/bin/env bash
# test_prep.sh — `moe prep` (src/text/prep.c): JSON lines (gzip'd), plain text (a document per file and
# per line) through a tokenizer trained here with the PyPI `tokenizers` (skipped without it) into llm.c
# shards. Read back independently (Python parses the headers), the shards hold, in order, each
# document's ids from `tokenizers` followed by the EOS that tokenizer_config.json names, the first
# --val-docs documents in val_*.bin, split at --shard-tokens; their decode is the documents each followed
# by the EOS text. A vocabulary beyond 65536 gives the uint32 form (magic 20240801); config.json's
# eos_token_id is found when it is the only one; the encoding threads change no byte. `moe train` runs 2 steps on the shards. Bad input (a
# truncated .gz, a JSON line without the field, no EOS, --out already there): one `moe: error:` line, a
# non-zero exit, and no --out directory.
set -u
. "$(dirname "$0")/lib.sh"
small_fixture
trained_tokenizers
mkdir tok && cp tk/qwen2/tokenizer.json tok/ && echo '{"eos_token": {"content": "<|endoftext|>"}}' > tok/tokenizer_config.json
python3 - <<'PY'
import gzip, json, random
r = random.Random(5)
words = "the model expert 数据 مرحبا 😀 naïve x=1; 12345 \t tabs".split(" ")
docs = [" ".join(r.choice(words) for _ in range(r.randrange(1, 40))) + ("\nsecond line" if i % 3 == 0 else "")
        for i in range(60)]
docs[7] += " <|pad|> inside"
with gzip.open("a.jsonl.gz", "wt", encoding="utf-8") as f:
    for d in docs: f.write(json.dumps({"id": 1, "text": d}, ensure_ascii=False) + "\n\n")
open("b.txt", "w").write("a whole file\n\nis one document\n")
open("c.txt", "w").write("line one\n\n  \nline two\r\nline three")
json.dump(docs + ["a whole file\n\nis one document\n"], open("docs_ab.json", "w"))
PY
run_ok "prep a.jsonl.gz b.txt" "$MOE" prep --tokenizer tok --in a.jsonl.gz b.txt --out s --val-docs 5 --shard-tokens 300
grep -q "prep: 61 documents (5 held out)" "$OUT_FILE" && pass "summary: $(cut -c1-150 "$OUT_FILE")" ||
  fail "summary line: $(cat "$OUT_FILE")"
cat > check.py <<'PY'
import glob, json, struct, sys
from tokenizers import Tokenizer
d, docs_file, eos_text, val_docs, want_magic = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
tok = Tokenizer.from_file(sys.argv[6])
special = len(sys.argv) > 7 and sys.argv[7] == "add_special"
docs = json.load(open(docs_file))
eos = tok.token_to_id(eos_text)
def read(split):
    out, files = [], sorted(glob.glob(f"{d}/{split}_*.bin"))
    for p in files:
        b = open(p, "rb").read()
        magic, version, n = struct.unpack("<3i", b[:12])
        form = {20240520: (1, "H", 2), 20240801: (7, "I", 4)}[magic]
        assert magic == want_magic, f"{p}: magic {magic}, expected {want_magic}"
        assert version == form[0] and len(b) == 1024 + n * form[2], f"{p}: version {version}, {len(b)} bytes for {n}"
        out += struct.unpack(f"<{n}{form[1]}", b[1024:])
    return out, len(files)
ok = True
for split, part in (("val", docs[:val_docs]), ("train", docs[val_docs:])):
    got, nfiles = read(split)
    want = [i for doc in part for i in tok.encode(doc, add_special_tokens=special).ids + [eos]]
    text = tok.decode(got, skip_special_tokens=False)
    joined = "".join(doc + eos_text for doc in part)
    if special: text = joined = "(the template's tokens decode as text: ids compared only)"
    if got != want or text != joined:
        ok = False
        print(f"{split}: {len(got)} tokens vs {len(want)} expected; decode equal: {text == joined}")
    else:
        print(f"{split}: {len(part)} documents, {len(got)} tokens in {nfiles} shard(s), ids and decode as expected")
sys.exit(0 if ok else 1)
PY
run_ok "the shards hold each document's ids then the EOS; decoded = documents + EOS" \
  python3 check.py s docs_ab.json '<|endoftext|>' 5 20240520 tok/tokenizer.json && sed 's/^/    /' "$OUT_FILE"
OMP_NUM_THREADS=1 "$MOE" prep --tokenizer tok --in a.jsonl.gz b.txt --out s1 --val-docs 5 --shard-tokens 300 > /dev/null &&
  OMP_NUM_THREADS=3 "$MOE" prep --tokenizer tok --in a.jsonl.gz b.txt --out s3 --val-docs 5 --shard-tokens 300 > /dev/null
[ "$(tree_hash s1)" = "$(tree_hash s3)" ] && [ "$(tree_hash s1)" = "$(tree_hash s)" ] &&
  pass "the shards are the same on 1 and 3 encoding threads" || fail "the shards depend on the thread count"
n=$(ls s/train_*.bin | wc -l)
[ "$n" -ge 3 ] && pass "--shard-tokens 300: $n train shards" || fail "--shard-tokens 300 gave $n train shards"

# --lines, config.json's eos_token_id, and a vocabulary beyond uint16 (filled up to a special token 70000)
mkdir big && python3 - <<'PY'
import json
j = json.load(open("tok/tokenizer.json"))
v = j["model"]["vocab"]
first = max(list(v.values()) + [a["id"] for a in j["added_tokens"]]) + 1
for i in range(first, 70000): v[f"<extra_{i}>"] = i
v["<|far|>"] = 70000
j["added_tokens"].append({"id": 70000, "content": "<|far|>", "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True})
json.dump(j, open("big/tokenizer.json", "w"))
json.dump({"eos_token_id": [1, 0]}, open("big/config.json", "w"))
json.dump(["line one", "line two\r", "line three <|far|>"], open("docs_c.json", "w"))
PY
echo " <|far|>" >> c.txt
run_ok "prep --lines with a 70001-token vocabulary" "$MOE" prep --tokenizer big/tokenizer.json --in c.txt --lines --out s32
grep -q "uint32 tokens, EOS 1 (from config.json)" "$OUT_FILE" && pass "uint32 form; EOS from config.json's eos_token_id" ||
  fail "uint32/EOS: $(cat "$OUT_FILE")"
run_ok "uint32 shards read back" python3 check.py s32 docs_c.json '<|pad|>' 0 20240801 big/tokenizer.json

# --add-special: each document inside the post-processor's template (a Llama-2-style BOS), then the EOS
run_ok "prep --add-special (a BOS template)" "$MOE" prep --tokenizer tk/spm --eos '<|endoftext|>' --add-special \
  --in a.jsonl.gz b.txt --out sbos
run_ok "--add-special: each document's ids as tokenizers' add_special_tokens=True, then the EOS" \
  python3 check.py sbos docs_ab.json '<|endoftext|>' 0 20240520 tk/spm/tokenizer.json add_special

run_ok "moe train --data on the shards: 2 steps" "$MOE" train "${SMALL[@]}" "${MODEL[@]}" --data 's/train_*.bin' \
  --val-data 's/val_*.bin' --vocab-size 704 --steps 2 --out r
grep -q '^{"step":2,"loss"' r/metrics.jsonl && grep -q '"val_loss"' r/metrics.jsonl &&
  pass "training ran 2 steps on the shards" || fail "no step 2 in the run"

# bad input: nothing at --out afterwards
head -c -40 a.jsonl.gz > t.jsonl.gz
run_fail "cannot read 't.jsonl.gz'" "$MOE" prep --tokenizer tok --in t.jsonl.gz --out bad1
printf '{"text": "ok"}\n{"body": "no text"}\n' > nofield.jsonl
run_fail 'nofield.jsonl:2: no string field "text"' "$MOE" prep --tokenizer tok --in nofield.jsonl --out bad2
printf '{"text": "ok"}\n{"text": \n' > broken.jsonl
run_fail "broken.jsonl:2: not a JSON object" "$MOE" prep --tokenizer tok --in broken.jsonl --out bad3
mkdir noeos && cp tok/tokenizer.json noeos/
run_fail "no EOS token beside the tokenizer" "$MOE" prep --tokenizer noeos --in b.txt --out bad4
run_fail "--eos '<nope>' is not a token" "$MOE" prep --tokenizer noeos --eos '<nope>' --in b.txt --out bad5
GUARD="s"
run_fail "--out 's' already exists" "$MOE" prep --tokenizer tok --in b.txt --out s
GUARD=""
left=$(ls -d bad* 2>/dev/null)
[ -z "$left" ] && pass "no --out directory (or .part) left by a refused prep" || fail "left behind: $left"
finish
