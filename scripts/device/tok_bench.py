#!/usr/bin/env python3
"""tok_bench.py — the Hugging Face side of scripts/device/tok_bench.sh (a benchmark, not a test).

  tok_bench.py setup DIR TEXT MB    DIR/multi.txt (a multilingual text, ~1 MB), DIR/tok/ (a byte-level BPE of
                                    32k trained here by `tokenizers` on TEXT + multi.txt, GPT-2's regex), and
                                    DIR/docs.jsonl (their paragraphs as JSON lines, repeated to about MB MB)
  tok_bench.py encode DIR FILE MOE  HF's single-thread encode of FILE in one call (the best of 3, MB/s), and
                                    whether `MOE tokenize` gives the same ids; HF's encode_batch (one thread)
                                    of FILE's paragraphs, also written as FILE.paras.jsonl for moe prep; prints
                                    "hf_mbs N ids_equal B tokens N hf_para_mbs N paragraphs N"
  tok_bench.py train FILE           HF's BpeTrainer (32k) on FILE: prints "hf_train_s N"
"""
import json, os, random, subprocess, sys, time

os.environ["TOKENIZERS_PARALLELISM"] = "false"
os.environ["RAYON_NUM_THREADS"] = "1"  # one thread for encode (a single encode call is one thread anyway)
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PIECES = ["The quick brown fox jumps over the lazy dog.", "It's we're I'll they've 'S 'T shouting'LL",
          "def train(model, data):\n    for step in range(100):\n        loss = model(data[step])",
          "数据并行和专家并行。日本語のテキストも。한국어 문장입니다.", "مرحبا بالعالم، هذا اختبار للترميز.",
          "Привет мир, это проверка.", "emoji 😀🚀👍🏽 family 👨‍👩‍👧 flags 🇫🇷", "combining e\u0301 a\u0308 n\u0303 é ä ñ",
          "digits 1234567890 3.14159 1,000,000 2024-05-20", "spaces:      tabs\t\t\tand", "naïve café résumé Ωμέγα"]


def multilingual(n_bytes, seed=1):
    r, out, size = random.Random(seed), [], 0
    while size < n_bytes:
        line = " ".join(r.choice(PIECES) for _ in range(r.randrange(1, 6)))
        out.append(line)
        size += len(line.encode()) + 1
        if r.random() < 0.15:
            out.append("")
    return "\n".join(out) + "\n"


def setup(d, text_path, mb):
    text = open(text_path, encoding="utf-8").read()
    multi = multilingual(1 << 20)
    open(f"{d}/multi.txt", "w", encoding="utf-8").write(multi)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=32000, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text, multi], trainer)
    os.makedirs(f"{d}/tok", exist_ok=True)
    tok.save(f"{d}/tok/tokenizer.json")
    json.dump({"eos_token": "<|endoftext|>"}, open(f"{d}/tok/tokenizer_config.json", "w"))
    paras = [p for p in (text + "\n\n" + multi).split("\n\n") if p.strip()]
    lines = [json.dumps({"text": p}, ensure_ascii=False) for p in paras]
    size = sum(len(l.encode()) + 1 for l in lines)
    with open(f"{d}/docs.jsonl", "w", encoding="utf-8") as f:
        for _ in range(max(1, round(mb * 1e6 / size))):
            f.write("\n".join(lines) + "\n")
    print(f"vocabulary {tok.get_vocab_size()}, {len(paras)} paragraphs")


def encode(d, path, moe):
    tok = Tokenizer.from_file(f"{d}/tok/tokenizer.json")
    raw = open(path, "rb").read()
    text = raw.decode("utf-8")
    paras = [p for p in text.split("\n\n") if p.strip()]
    with open(f"{path}.paras.jsonl", "w", encoding="utf-8") as f:  # the same paragraphs for moe prep
        f.writelines(json.dumps({"text": p}, ensure_ascii=False) + "\n" for p in paras)
    para_bytes = sum(len(p.encode()) for p in paras)
    best, best_p, ids = 0.0, 0.0, None
    for _ in range(3):
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False).ids
        best = max(best, len(raw) / 1e6 / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        tok.encode_batch(paras, add_special_tokens=False)
        best_p = max(best_p, para_bytes / 1e6 / (time.perf_counter() - t0))
    ours = subprocess.run([moe, "tokenize", "--tokenizer", f"{d}/tok", "--in", path], capture_output=True,
                          text=True, check=True).stdout.split()
    print(f"hf_mbs {best:.2f} ids_equal {'yes' if list(map(int, ours)) == ids else 'NO'} tokens {len(ids)} "
          f"hf_para_mbs {best_p:.2f} paragraphs {len(paras)}")


def train(path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    trainer = trainers.BpeTrainer(vocab_size=32000, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t0 = time.perf_counter()
    tok.train([path], trainer)
    print(f"hf_train_s {time.perf_counter() - t0:.1f}")


if __name__ == "__main__":
    {"setup": lambda a: setup(a[0], a[1], float(a[2])), "encode": lambda a: encode(*a),
     "train": lambda a: train(a[0])}[sys.argv[1]](sys.argv[2:])
