#!/bin/bash
# Device recipe (kind nvidia-h200): the parts of a step under sustained load, ours and the peer's, with the SM
# clock and power polled (libs.sh clocks_say): the card's 700 W cap binds ~1 s into a full step of ours and
# then sets its clocks, so a part that draws more power a FLOP runs at lower clocks there than a short
# benchmark shows. Each part runs a few seconds of timed iterations (the layer: 500 ref, 80 mixtral; attention
# 1000) after warm-up ones, back to back:
#   layer: the MoE layer forward + backward (moe_bench_layer; the peer torch._grouped_mm, torch_moe_peer.py's
#          moe_case), CASES (default "ref mixtral")
#   attn:  attention forward + backward on the reference shape (moe_bench_attention; the peer SDPA, flash)
# Prepare as full_step.sh's (.gpu with torch_moe_peer.py); run `bash scripts/device/power_check.sh` with carry
# [".gpu"] (about 3 minutes); PARTS selects (default "layer attn"). Results in $OUT/power.txt.
cd "$(dirname "$0")/../.."
. scripts/device/libs.sh && recipe_start power 500
PARTS=${PARTS:-layer attn}
if has layer; then
  for c in ${CASES:-ref mixtral}; do
    N=500; [ $c = mixtral ] && N=80
    clocks_start
    t ours_$c 120 $B/moe_bench_layer --device cuda --cases $c --iters $N --warmup 50
    grep -E "layer fwd" $W/ours_$c.log | tee -a $R; clocks_say ours_layer_$c
    clocks_start
    t peer_$c 200 python3 -c "
import importlib.util, json, sys
sys.argv = ['x', '$G/torch_moe_peer.py']
spec = importlib.util.spec_from_file_location('peer', '$G/torch_moe_peer.py')
peer = importlib.util.module_from_spec(spec); spec.loader.exec_module(peer)
peer.bench.__defaults__ = (50, $N)
S = {'ref': (8192, 2048, 5632, 8, 2), 'mixtral': (16384, 4096, 14336, 8, 2)}
ms, tf = peer.moe_case(*S['$c'], 'grouped_mm')
print(json.dumps({'case': '$c', 'impl': 'grouped_mm', 'iters': $N, 'ms_fwd_bwd': round(ms, 3), 'expert_tflops': round(tf, 1)}))"
    grep case $W/peer_$c.log | tee -a $R; clocks_say peer_layer_$c
  done
fi
if has attn; then
  N=1000 # (moe_bench_attention takes at most 1000)
  clocks_start
  t ours_att 120 $B/moe_bench_attention --device cuda --iters $N
  say "$(cat $W/ours_att.log)"; clocks_say ours_attention
  clocks_start
  t peer_att 120 python3 -c "
import json, torch
import torch.nn.functional as F
B, T, H, KV, hd = 4, 2048, 16, 8, 128
torch.manual_seed(0)
q = torch.randn(B, H, T, hd, device='cuda', dtype=torch.bfloat16, requires_grad=True)
k = torch.randn(B, KV, T, hd, device='cuda', dtype=torch.bfloat16, requires_grad=True)
v = torch.randn(B, KV, T, hd, device='cuda', dtype=torch.bfloat16, requires_grad=True)
g = torch.randn(B, H, T, hd, device='cuda', dtype=torch.bfloat16)
ts = []
for it in range(50 + $N):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True); o.backward(g); b.record()
    torch.cuda.synchronize()
    if it >= 50: ts.append(a.elapsed_time(b))
ts.sort(); print(json.dumps({'impl': 'sdpa', 'iters': $N, 'ms_fwd_bwd': round(ts[len(ts) // 2], 4)}))"
  say "$(grep impl $W/peer_att.log)"; clocks_say peer_attention
fi
say "$(date -u) done"
