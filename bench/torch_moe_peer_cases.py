# torch_moe_peer_cases.py PEER_SCRIPT [CASES] — the MoE-layer peer (torch._grouped_mm, the shared
# ../shared/bench/torch_moe_peer.py's moe_case, imported from PEER_SCRIPT, not copied) on the shapes
# moe_bench_layer names: CASES is a comma list of mixtral, olmoe, small, ref, qwen2, e256. One JSON
# line per case, as the shared script prints.
import importlib.util, json, sys, torch
spec = importlib.util.spec_from_file_location('peer', sys.argv[1])
peer = importlib.util.module_from_spec(spec); spec.loader.exec_module(peer)
SHAPES = {'mixtral': (16384, 4096, 14336, 8, 2), 'olmoe': (16384, 2048, 1024, 64, 8), 'small': (8192, 1024, 2816, 8, 2),
          'ref': (8192, 2048, 5632, 8, 2), 'qwen2': (16384, 2048, 1408, 60, 4), 'e256': (16384, 2048, 512, 256, 8)}
names = (sys.argv[2] if len(sys.argv) > 2 else 'qwen2,e256').split(',')
print(json.dumps({'torch': torch.__version__, 'gpu': torch.cuda.get_device_name()}), flush=True)
for n in names:
    T, d, f, E, k = SHAPES[n]
    ms, tf = peer.moe_case(T, d, f, E, k, 'grouped_mm')
    print(json.dumps({'case': n, 'impl': 'grouped_mm', 'T': T, 'd': d, 'f': f, 'E': E, 'k': k, 'ms_fwd_bwd': round(ms, 2),
                      'expert_tflops': round(tf, 1)}), flush=True)
    torch.cuda.empty_cache()
