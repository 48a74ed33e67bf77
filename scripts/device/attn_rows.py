# attn_rows.py — imported by the attention recipes' tables (attn_long.sh, attn_keyrange.sh): the one
# '"impl"' JSON line moe_bench_attention and torch_attention_peer.py print, read from DIR/NAME.log, and a
# pass's "ms (TFLOP/s)" cell.
import json
import os


def row(w, name):
    """The JSON row in w/name.log, or None where the run left none (skipped, failed)."""
    try:
        return next(json.loads(l) for l in open(os.path.join(w, name + '.log')) if '"impl"' in l)
    except (OSError, StopIteration):
        return None


def cell(r, k):
    """Pass k ('fwd' or 'bwd') of row r as 'ms (TF/s)', or '-' without a row."""
    return '%7.3f (%3.0f)' % (r[k + '_ms'], r[k + '_tflops']) if r else '%13s' % '-'
