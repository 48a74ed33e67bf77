# random_shard.py OUT [NTOK] [VOCAB] — an llm.c-format token shard (uint16, magic 20240520, version 1) of
# uniform random tokens: the data the full-step peer (../shared/bench/torch_train_peer.py) trains on,
# so that `moe train --data OUT` does the same work (balanced routing at init). Bench helper only.
import sys
import numpy as np
out = sys.argv[1]
n = int(sys.argv[2]) if len(sys.argv) > 2 else 2049 * 4 * 24
vocab = int(sys.argv[3]) if len(sys.argv) > 3 else 32000
assert 0 < vocab <= 65536 and n > 0
h = np.zeros(256, dtype=np.int32)
h[0], h[1], h[2] = 20240520, 1, n
toks = np.random.default_rng(1).integers(0, vocab, size=n, dtype=np.uint16)
with open(out, 'wb') as f:
    f.write(h.tobytes())
    f.write(toks.tobytes())
