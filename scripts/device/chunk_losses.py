# chunk_losses.py LABEL REF RUN... — the pipelined exchange's chunks against r 1: for each training
# run directory RUN (r 2, 4, ...), step 1's loss bit for bit against REF's (the forward is exact) and
# the largest relative difference of the later steps' losses (weight gradients summed over r chunks).
import json, sys
def losses(d): return [json.loads(l)['loss'] for l in open(d + '/metrics.jsonl') if '"loss"' in l]
label, ref, runs = sys.argv[1], losses(sys.argv[2]), sys.argv[3:]
for d in runs:
    b = losses(d)
    print('%s %s vs %s: step-1 loss %s (%r vs %r); later steps max rel %.2e' % (label, d, sys.argv[2],
          'bitwise' if ref[0] == b[0] else 'DIFFERS', ref[0], b[0],
          max(abs(x - y) / x for x, y in zip(ref[1:], b[1:]))))
