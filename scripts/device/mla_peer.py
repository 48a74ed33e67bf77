# Peer for moe_bench_attention --hd 192 --hv 128 (latent attention's values, issue 40's speed item): causal
# attention forward + backward in bf16 at DeepSeek-V3's head layout (query/key heads 192 = 128 nope + 64
# rope, value heads 128, one kv head per query head), B 1, H 128 by default, for each T given:
#   sdpa_padded  F.scaled_dot_product_attention with v padded to 192 and the output sliced to 128 (the
#                practical alternative: flash kernels want one head width), pad and slice timed with it;
#   sdpa         the same without the padding (torch picks a backend that takes Ev != E, where one does);
#   hf_eager     transformers' DeepseekV3 attention core (modeling_deepseek_v3.eager_attention_forward:
#                q, k, v given; its additive causal mask, fp32 softmax) under torch.compile.
# Each: median of ITERS after 3 warm-up calls (compile included there), CUDA events around the forward and
# the backward (gradients into q, k, v from a random dout). One JSON line per (impl, T); an impl that fails
# (out of memory at large T for the eager core) prints its error in the line instead of times.
#   python3 mla_peer.py [T ...]   (default 4096; env H, B, ITERS)
import json, math, os, sys, time
import torch
import torch.nn.functional as F

H = int(os.environ.get('H', 128))
B = int(os.environ.get('B', 1))
ITERS = int(os.environ.get('ITERS', 10))
QK, DV = 192, 128
SCALE = 1.0 / math.sqrt(QK)


def sdpa_padded(q, k, v, mask):
    vp = F.pad(v, (0, QK - DV))
    return F.scaled_dot_product_attention(q, k, vp, is_causal=True, scale=SCALE)[..., :DV]


def sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=SCALE)


def hf_core():
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

    class Mod(torch.nn.Module):  # what eager_attention_forward reads of the attention module
        num_key_value_groups = 1

    mod = Mod()

    def core(q, k, v, mask):
        out, _ = m.eager_attention_forward(mod, q, k, v, mask, scaling=SCALE, dropout=0.0)
        return out  # (B, T, H, DV)

    return torch.compile(core, dynamic=False)


def run(name, fn, T, need_mask):
    torch.manual_seed(0)
    dev, bf = 'cuda', torch.bfloat16
    q = torch.randn(B, H, T, QK, device=dev, dtype=bf, requires_grad=True)
    k = torch.randn(B, H, T, QK, device=dev, dtype=bf, requires_grad=True)
    v = torch.randn(B, H, T, DV, device=dev, dtype=bf, requires_grad=True)
    mask = None
    if need_mask:
        mask = torch.full((T, T), torch.finfo(bf).min, device=dev, dtype=bf).triu(1)[None, None]
    tf, tb = [], []
    t_start = time.time()
    for it in range(3 + ITERS):
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        e0.record()
        o = fn(q, k, v, mask)
        e1.record()
        if it == 0:
            g = torch.randn_like(o)
        o.backward(g)
        e2.record()
        torch.cuda.synchronize()
        if it >= 3:
            tf.append(e0.elapsed_time(e1))
            tb.append(e1.elapsed_time(e2))
        q.grad = k.grad = v.grad = None
        del o
    tf.sort()
    tb.sort()
    mf, mb = tf[len(tf) // 2], tb[len(tb) // 2]
    bht = B * H * T * T
    return {'impl': name, 'T': T, 'H': H, 'fwd_ms': round(mf, 3), 'bwd_ms': round(mb, 3),
            'total_ms': round(mf + mb, 3), 'fwd_tflops': round(bht * (QK + DV) / mf / 1e9, 1),
            'bwd_tflops': round(bht * (3 * QK + 2 * DV) / mb / 1e9, 1),
            'wall_s': round(time.time() - t_start, 1)}


def main():
    Ts = [int(a) for a in sys.argv[1:]] or [4096]
    import transformers
    print(json.dumps({'torch': torch.__version__, 'transformers': transformers.__version__,
                      'gpu': torch.cuda.get_device_name()}), flush=True)
    core = hf_core()
    for T in Ts:
        for name, fn, need_mask in (('sdpa_padded', sdpa_padded, False), ('sdpa', sdpa, False),
                                    ('hf_eager_compiled', core, True)):
            try:
                r = run(name, fn, T, need_mask)
            except Exception as e:  # (out of memory, no backend for Ev != E): said, and the others go on
                r = {'impl': name, 'T': T, 'H': H, 'error': (type(e).__name__ + ': ' + str(e))[:200]}
            torch.cuda.empty_cache()
            print(json.dumps(r), flush=True)


if __name__ == '__main__':
    main()
