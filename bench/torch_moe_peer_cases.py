# torch_moe_peer_cases.py PEER_SCRIPT [CASES] — the MoE-layer peer (torch._grouped_mm, the shared
# ../shared/bench/torch_moe_peer.py's moe_case, imported from PEER_SCRIPT, not copied) on the shapes
# moe_bench_layer names: CASES is a comma list of mixtral, olmoe, small, ref, qwen2, qwen2s, e256. One
# JSON line per case, as the shared script prints. qwen2s adds Qwen2-MoE's gated shared expert (width
# 5632): PyTorch's dense bf16 matmuls (cuBLAS), y = sigmoid(x wg) * (silu(x W1) * (x W3)) W2, fwd + bwd
# timed with the shared script's bench() and added to the routed experts' time (the peer runs both on
# one stream, one after the other, as a model would).
import importlib.util, json, sys, torch
import torch.nn.functional as F
spec = importlib.util.spec_from_file_location('peer', sys.argv[1])
peer = importlib.util.module_from_spec(spec); spec.loader.exec_module(peer)
SHAPES = {'mixtral': (16384, 4096, 14336, 8, 2, 0), 'olmoe': (16384, 2048, 1024, 64, 8, 0),
          'small': (8192, 1024, 2816, 8, 2, 0), 'ref': (8192, 2048, 5632, 8, 2, 0), 'qwen2': (16384, 2048, 1408, 60, 4, 0),
          'qwen2s': (16384, 2048, 1408, 60, 4, 5632), 'e256': (16384, 2048, 512, 256, 8, 0)}

def shared_case(T, d, fs):
    torch.manual_seed(1)
    x = torch.randn(T, d, device='cuda', dtype=torch.bfloat16, requires_grad=True)
    w1 = (torch.randn(d, fs, device='cuda', dtype=torch.bfloat16) * 0.02).requires_grad_()
    w3 = (torch.randn(d, fs, device='cuda', dtype=torch.bfloat16) * 0.02).requires_grad_()
    w2 = (torch.randn(fs, d, device='cuda', dtype=torch.bfloat16) * 0.02).requires_grad_()
    wg = (torch.randn(d, 1, device='cuda', dtype=torch.bfloat16) * 0.02).requires_grad_()
    def fwd_bwd():
        y = torch.sigmoid(x @ wg) * ((F.silu(x @ w1) * (x @ w3)) @ w2)
        y.float().square().mean().backward()
    return peer.bench(fwd_bwd)

names = (sys.argv[2] if len(sys.argv) > 2 else 'qwen2,e256').split(',')
print(json.dumps({'torch': torch.__version__, 'gpu': torch.cuda.get_device_name()}), flush=True)
for n in names:
    T, d, f, E, k, fs = SHAPES[n]
    ms, tf = peer.moe_case(T, d, f, E, k, 'grouped_mm')
    line = {'case': n, 'impl': 'grouped_mm', 'T': T, 'd': d, 'f': f, 'E': E, 'k': k}
    if fs:
        torch.cuda.empty_cache()
        sms = shared_case(T, d, fs)
        flops = 3 * 2 * T * k * 3 * d * f + 3 * 2 * T * 3 * d * fs
        line.update({'fs': fs, 'routed_ms': round(ms, 2), 'shared_ms': round(sms, 2)})
        ms, tf = ms + sms, flops / (ms + sms) / 1e9
    line.update({'ms_fwd_bwd': round(ms, 2), 'expert_tflops': round(tf, 1)})
    print(json.dumps(line), flush=True)
    torch.cuda.empty_cache()
