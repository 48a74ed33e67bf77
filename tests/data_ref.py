"""data_ref.py — independent writers and readers for tests/test_megatron.sh and tests/test_zstd.sh
(Python's standard library only).

`write` writes Megatron-LM indexed datasets as its documented layout says (megatron/core/datasets/
indexed_dataset.py, _IndexWriter): PREFIX.idx = b"MMIDIDX\\x00\\x00", version <Q 1, dtype code <B,
sequence count <Q, document-boundary count <Q, the sequence lengths (int32), their byte offsets in
PREFIX.bin (int64, the running sum of length x item size), the boundaries (int64: 0, then the sequence
count after each document); PREFIX.bin = the tokens. Reads llm.c shards back (header: 256 int32,
magic 20240520 + uint16 or 20240801 + uint32). `bytetok` writes a byte-level BPE tokenizer.json with no
merges, so that the ids of a text are its UTF-8 bytes (vocabulary: byte b is id b, under the character
GPT-2's ByteLevel maps it to), and <|endoftext|> (id 256) its EOS, named in tokenizer_config.json.

  data_ref.py write PREFIX CODE SPEC.json   SPEC: [[seq, seq, ...], ...] documents of sequences of ids
  data_ref.py shards DIR SPLIT              prints "MAGIC N" then the ids of DIR/SPLIT_*.bin, one a line
  data_ref.py bytetok DIR                   DIR/tokenizer.json and DIR/tokenizer_config.json
"""
import glob, json, os, struct, sys

FORMAT = {1: "B", 2: "b", 3: "h", 4: "i", 5: "q", 8: "H"}  # Megatron's DType codes -> struct letters


def write(prefix, code, docs):
    fmt = FORMAT[code]
    item = struct.calcsize(fmt)
    lengths, pointers, bounds, data, at = [], [], [0], b"", 0
    for doc in docs:
        for seq in doc:
            lengths.append(len(seq))
            pointers.append(at)
            data += struct.pack(f"<{len(seq)}{fmt}", *seq)
            at += len(seq) * item
        bounds.append(len(lengths))
    with open(prefix + ".bin", "wb") as f:
        f.write(data)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(lengths), len(bounds)))
        f.write(struct.pack(f"<{len(lengths)}i", *lengths))
        f.write(struct.pack(f"<{len(pointers)}q", *pointers))
        f.write(struct.pack(f"<{len(bounds)}q", *bounds))


def shards(d, split):
    ids, magics = [], set()
    for p in sorted(glob.glob(f"{d}/{split}_*.bin")):
        b = open(p, "rb").read()
        magic, version, n = struct.unpack("<3i", b[:12])
        letter, width = {(20240520, 1): ("H", 2), (20240801, 7): ("I", 4)}[(magic, version)]
        assert len(b) == 1024 + n * width, f"{p}: {len(b)} bytes for {n} tokens"
        ids += struct.unpack(f"<{n}{letter}", b[1024:])
        magics.add(magic)
    print(" ".join(map(str, sorted(magics))) or "none", len(ids))
    for i in ids:
        print(i)


def bytetok(d):
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))  # bytes that print as themselves
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    vocab = {chr(c): b for b, c in zip(bs, cs)}
    vocab["<|endoftext|>"] = 256
    bl = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    eos = {"id": 256, "content": "<|endoftext|>", "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": False, "special": True}
    tok = {"version": "1.0", "truncation": None, "padding": None, "normalizer": None, "post_processor": None,
           "added_tokens": [eos], "pre_tokenizer": bl, "decoder": bl,
           "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                     "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                     "merges": []}}
    os.makedirs(d, exist_ok=True)
    json.dump(tok, open(f"{d}/tokenizer.json", "w"), ensure_ascii=False)
    json.dump({"eos_token": "<|endoftext|>"}, open(f"{d}/tokenizer_config.json", "w"))


if __name__ == "__main__":
    if sys.argv[1] == "write":
        write(sys.argv[2], int(sys.argv[3]), json.load(open(sys.argv[4])))
    elif sys.argv[1] == "bytetok":
        bytetok(sys.argv[2])
    else:
        shards(sys.argv[2], sys.argv[3])
