#!/usr/bin/env python3
"""peer_profile.py PEER_SCRIPT [OUT] — where the compiled bf16 peer's step goes (a measurement script, not part of
moe): PEERS.md's torch.compile model (torch_train_peer.py's Model, pure bf16, fused AdamW) trained 12 steps on
its random tokens, then 5 steps under torch.profiler; each CUDA kernel's time a step (ms) and launches a step,
largest first, summed by name, to stdout (and OUT as JSON lines). Compare with our step's kernels from the CUPTI
tracer (full_step.sh PARTS=trace, scripts/device/gputrace.py). PEER_B / PEER_T in the environment change the
batch and sequence length (default the model's B 4, T 2048)."""
import json, os, runpy, sys, collections, torch
from torch.profiler import profile, ProfilerActivity
m = runpy.run_path(sys.argv[1], run_name='peer'); c = m['CFG']; torch.manual_seed(0)
c['B'] = int(os.environ.get('PEER_B', c['B'])); c['T'] = int(os.environ.get('PEER_T', c['T']))
mod = m['Model'](c).cuda().to(torch.bfloat16)
model = torch.compile(mod); opt = torch.optim.AdamW(mod.parameters(), lr=1e-4, fused=True)
idx = torch.randint(0, c['V'], (c['B'], c['T']), device='cuda'); tgt = torch.randint(0, c['V'], (c['B'], c['T']), device='cuda')
def step():
    loss = model(idx, tgt); loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
for _ in range(12): step()
torch.cuda.synchronize()
S = 5
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(S): step()
    torch.cuda.synchronize()
tot, cnt = collections.Counter(), collections.Counter()
for e in prof.events():
    if e.device_type == torch.autograd.DeviceType.CUDA:
        tot[e.name] += e.device_time / 1e3 / S; cnt[e.name] += 1 / S
rows = sorted(tot.items(), key=lambda kv: -kv[1])
print('kernels a step: %.2f ms in %d launches' % (sum(tot.values()), round(sum(cnt.values()))))
out = open(sys.argv[2], 'w') if len(sys.argv) > 2 else None
for n, t in rows:
    print('%9.3f ms %5d  %s' % (t, round(cnt[n]), n[:150]))
    if out: out.write(json.dumps({'name': n, 'ms': t, 'launches': cnt[n]}) + '\n')
