#!/usr/bin/env bash
# test_tokenizer_train.sh — `moe tokenizer train` (src/text/bpe_train.c), a byte-level BPE trainer.
# Its tokenizer.json loads in the PyPI `tokenizers` (and transformers' PreTrainedTokenizerFast where
# transformers is installed) and encodes and decodes every fixture text of tests/tokenizer_ref.py
# (English, code, CJK, Arabic, emoji, combining marks, runs of spaces and digits, invalid UTF-8, the
# special token inside text) exactly as `moe tokenize` does. Its merges are BPE's, checked by a
# reimplementation from the definition: the documents pre-tokenised by `tokenizers`' own ByteLevel
# pre-tokenizer and counted, every merge must be the pair with the highest count of adjacent
# occurrences at its turn, ties to the lowest (left id, right id), with the vocabulary's ids. Training
# twice gives the same bytes (a document of several MB, pre-tokenised a piece at a time, has the words
# of the whole); a directory --out gets tokenizer_config.json, whose EOS `moe prep` finds.
# Bad input: one `moe: error:` line, a non-zero exit, and the output untouched. Skipped without tokenizers.
set -u
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
trained_tokenizers
python3 - "$REF" <<'PY'
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("ref", sys.argv[1]); ref = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ref)
lines = ref.corpus(seed=7, n_lines=600)
open("a.txt", "w", encoding="utf-8").write("\n".join(lines[:300]) + "\n")
with open("b.jsonl", "w", encoding="utf-8") as f:
    for i in range(300, 600, 3): f.write(json.dumps({"text": "\n".join(lines[i:i + 3])}, ensure_ascii=False) + "\n")
PY

run_ok "tokenizer train --vocab 700 --data a.txt b.jsonl" \
  "$MOE" tokenizer train --vocab 700 --data a.txt b.jsonl --out tok.json
sed 's/^/    /' "$OUT_FILE"
cat >same.py <<'PY'
import glob, subprocess, sys
from tokenizers import Tokenizer
moe, path = sys.argv[1], sys.argv[2]
tok = Tokenizer.from_file(path)
fast = None
try:
    from transformers import PreTrainedTokenizerFast
    fast = PreTrainedTokenizerFast(tokenizer_file=path)
except ImportError:
    print("    (transformers is not installed: PreTrainedTokenizerFast not checked)")
bad = 0
files = sorted(glob.glob("tk/fixture*.txt"))
for p in files:
    raw = open(p, "rb").read()
    text = raw.decode("utf-8", errors="replace")
    want = tok.encode(text, add_special_tokens=False).ids
    got = [int(x) for x in subprocess.run([moe, "tokenize", "--tokenizer", path, "--in", p], capture_output=True,
                                          check=True).stdout.split()]
    dec = subprocess.run([moe, "tokenize", "--tokenizer", path, "--decode"], input=" ".join(map(str, want)).encode(),
                         capture_output=True, check=True).stdout.decode()
    ok = got == want and dec == tok.decode(want, skip_special_tokens=False)
    if fast is not None: ok = ok and fast(text, add_special_tokens=False)["input_ids"] == want
    if not ok:
        bad += 1
        print(f"    {p}: ids equal {got == want}, decode equal {dec == tok.decode(want, skip_special_tokens=False)}")
print(f"    {len(files) - bad} of {len(files)} fixtures identical")
sys.exit(1 if bad or not files else 0)
PY
run_ok "tokenizers loads it and encodes/decodes every fixture as moe tokenize" python3 same.py "$MOE" tok.json &&
  tail -1 "$OUT_FILE"

cat >replay.py <<'PY'
import json, re, sys
from collections import Counter
from tokenizers import pre_tokenizers
j = json.load(open(sys.argv[1]))
vocab, merges = j["model"]["vocab"], [m.split(" ") for m in j["model"]["merges"]]
want_vocab = int(sys.argv[2])
docs = []
for p in sys.argv[3:]:
    if p.endswith(".jsonl"): docs += [json.loads(l)["text"] for l in open(p, encoding="utf-8")]
    else: docs.append(open(p, encoding="utf-8").read())
# as the tokenizers trainer: the special tokens taken out of the text, the rest pre-tokenised
special = re.compile("|".join(re.escape(a["content"]) for a in j["added_tokens"]))
pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
words = Counter(w for d in docs for part in special.split(d) for w, _ in pre.pre_tokenize_str(part))
assert vocab["<|endoftext|>"] == 0 and len(vocab) == want_vocab, (len(vocab), want_vocab)
syms = {w: [vocab[c] for c in w] for w in words}  # the byte-level characters are the alphabet
for k, (a, b) in enumerate(merges):
    counts = Counter()
    for w, s in syms.items():
        for x, y in zip(s, s[1:]): counts[(x, y)] += words[w]
    best = min(counts, key=lambda p: (-counts[p], p))
    if best != (vocab[a], vocab[b]):
        sys.exit(f"merge {k}: {a} {b} (count {counts[(vocab[a], vocab[b])]}), but {best} has {counts[best]}")
    new = vocab[a + b]
    for w, s in syms.items():
        out, i = [], 0
        while i < len(s):
            if i + 1 < len(s) and (s[i], s[i + 1]) == best: out.append(new); i += 2
            else: out.append(s[i]); i += 1
        syms[w] = out
print(f"    {len(merges)} merges, each the most frequent pair at its turn; vocabulary {len(vocab)}")
PY
run_ok "each merge is the most frequent pair (ties: lowest ids), replayed from tokenizers' pre-tokenisation" \
  python3 replay.py tok.json 700 a.txt b.jsonl && tail -1 "$OUT_FILE"

text_bytes 2600000 5 >big.txt # one document over 2 MB: pre-tokenised a MB at a time (bpe_train.c feed_doc)
run_ok "a 2.6 MB document" "$MOE" tokenizer train --vocab 400 --data big.txt --out big.json
run_ok "... its merges replayed from the whole document's words" python3 replay.py big.json 400 big.txt &&
  tail -1 "$OUT_FILE"
"$MOE" tokenizer train --vocab 700 --data a.txt b.jsonl --out tok2.json >/dev/null
check "training twice gives the same file" cmp -s tok.json tok2.json
run_ok "--out DIR: tokenizer.json and tokenizer_config.json" "$MOE" tokenizer train --vocab 500 --data a.txt \
  --out tdir --special '<|endoftext|>,<|pad|>'
check "... tokenizer_config.json names the first special token as the EOS" \
  grep -q '"eos_token":.*"<|endoftext|>"' tdir/tokenizer_config.json
if python3 -c "import transformers" 2>/dev/null; then
  run_ok "... transformers' AutoTokenizer loads the directory, EOS <|endoftext|> (id 0)" python3 -c "
import sys; from transformers import AutoTokenizer
t = AutoTokenizer.from_pretrained('tdir'); sys.exit(t.eos_token != '<|endoftext|>' or t.eos_token_id != 0)"
else skip "transformers is not installed: AutoTokenizer not checked"; fi
run_ok "... moe prep finds that EOS" "$MOE" prep --tokenizer tdir --in b.jsonl --out shards
check "... EOS 0 (from tokenizer_config.json)" grep -q "EOS 0 (from tokenizer_config.json)" "$OUT_FILE"
run_ok "... its merges replayed too" python3 replay.py tdir/tokenizer.json 500 a.txt
check "... the second special token is id 1" python3 -c "import json,sys; sys.exit(json.load(open('tdir/tokenizer.json'))['model']['vocab']['<|pad|>'] != 1)"

echo "-- bad input"
: >empty.txt
echo garbage | gzip >g.txt.gz && head -c 12 g.txt.gz >trunc.txt.gz
cp tok.json keep.json
GUARD="$TMP/keep.json $TMP/none.json"
run_fail "--vocab 200: it must hold the 1 special token and the 256 bytes" \
  "$MOE" tokenizer train --vocab 200 --data a.txt --out keep.json
run_fail "the inputs hold no text" "$MOE" tokenizer train --vocab 300 --data empty.txt --out none.json
run_fail "cannot read 'trunc.txt.gz' (trunc.txt.gz: unexpected end of file)" "$MOE" tokenizer train --vocab 300 --data trunc.txt.gz --out keep.json
run_fail "cannot read 'nope.txt' (no such file)" "$MOE" tokenizer train --vocab 300 --data nope.txt --out none.json
run_fail "--special names '<a>' twice" "$MOE" tokenizer train --vocab 300 --data a.txt --out none.json --special '<a>,<a>'
run_fail "expected 'moe tokenizer train'" "$MOE" tokenizer fit --vocab 300
finish
