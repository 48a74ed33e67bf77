# Peer for bench/attention_bench.c: causal GQA attention forward and backward with PyTorch SDPA
# (bf16, flash backend where available) on the same shape; median of 10 after 3, CUDA events.
# FLOPs counted as attention_bench.c counts them. Run on the device machine beside moe_bench_attention.
# Usage: torch_attention_peer.py [B T H KV hd] (default the full step's shape 4 2048 16 8 128).
import json, sys, torch
import torch.nn.functional as F
B, T, H, KV, hd = (int(a) for a in sys.argv[1:6]) if len(sys.argv) > 5 else (4, 2048, 16, 8, 128)
torch.manual_seed(0)
q = torch.randn(B, H, T, hd, device='cuda', dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(B, KV, T, hd, device='cuda', dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(B, KV, T, hd, device='cuda', dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(B, H, T, hd, device='cuda', dtype=torch.bfloat16)
tf, tb = [], []
for it in range(13):
    e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
    e0.record()
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    e1.record()
    o.backward(g)
    e2.record()
    torch.cuda.synchronize()
    if it >= 3: tf.append(e0.elapsed_time(e1)); tb.append(e1.elapsed_time(e2))
    q.grad = k.grad = v.grad = None
tf.sort(); tb.sort()
ff = 2.0 * B * H * T * T * hd; mf, mb = tf[len(tf) // 2], tb[len(tb) // 2]
print(json.dumps({'impl': 'torch sdpa ' + torch.__version__, 'fwd_ms': round(mf, 3), 'bwd_ms': round(mb, 3),
                  'fwd_tflops': round(ff / mf / 1e9, 1), 'bwd_tflops': round(2.5 * ff / mb / 1e9, 1)}))
