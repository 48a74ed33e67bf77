# torch_moe_ep_peer.py — the expert-parallel MoE-layer peer for issue 16's run 2: the layer as a PyTorch
# user writes it with torch.distributed (all_to_all_single) and torch._grouped_mm, one expert group of
# E / world experts per rank, dropless top-k routing renormalised (as ../shared/bench/torch_moe_peer.py's
# moe_case, the one-GPU peer), forward + backward timed. Not a test; Python only for the peer.
#
#   torchrun --nproc_per_node N bench/torch_moe_ep_peer.py [--cases olmoe,mixtral] [--tokens-per-rank T]
#                  [--iters 10] [--warmup 3] [--check]
#
# Each rank holds T tokens (default: the case's T / N, so the global batch is the one-GPU case's) and the
# bf16 weights of its experts. Forward: router (float32) -> top-k -> tokens sorted by expert, sent to the
# rank owning it (counts first, then rows: all_to_all_single, variable splits) -> SwiGLU through
# torch._grouped_mm over the local experts -> rows sent back -> weighted sum into y. Backward through
# autograd (the all-to-alls' backward is the reverse exchange). Times: CUDA events around a whole
# forward + backward, median of --iters after --warmup, the slowest rank's; printed by rank 0 as one JSON
# line per case. NCCL_NVLS_ENABLE=0 belongs in the environment of every multi-GPU run.
# --check (on the cpu, gloo, float32, whatever the machine has): the layer's output and the gradients of
# x, the router and every expert weight against one process running all experts on all ranks' tokens,
# relative L2 under 1e-5 or exit 1 (measured 2026-12-01 at 1, 2 and 4 ranks, cases tiny and small: output,
# dx and expert gradients bitwise, the router's 8e-7; a regrouping that skips the sort by expert fails at 1.2).
import argparse, json, os, time
import torch
import torch.distributed as dist
import torch.nn.functional as F

SHAPES = {'mixtral': (16384, 4096, 14336, 8, 2), 'olmoe': (16384, 2048, 1024, 64, 8),
          'small': (8192, 1024, 2816, 8, 2), 'ref': (8192, 2048, 5632, 8, 2), 'tiny': (64, 32, 48, 8, 2)}


class A2A(torch.autograd.Function):
    """all_to_all_single with variable splits; the backward sends the gradients back the same way."""
    @staticmethod
    def forward(ctx, x, send, recv):
        ctx.send, ctx.recv = send, recv
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send)
        return out

    @staticmethod
    def backward(ctx, g):
        out = g.new_empty((sum(ctx.send),) + tuple(g.shape[1:]))
        dist.all_to_all_single(out, g.contiguous(), ctx.send, ctx.recv)
        return out, None, None


def experts(xs, counts, w1, w3, w2):
    """SwiGLU over groups of rows (counts per local expert), grouped_mm where the device takes it."""
    if xs.is_cuda:
        offs = counts.cumsum(0).to(torch.int32)
        h = F.silu(torch._grouped_mm(xs, w1, offs=offs)) * torch._grouped_mm(xs, w3, offs=offs)
        return torch._grouped_mm(h, w2, offs=offs)
    outs, s = [], 0   # cpu (--check): the same sums per expert
    for e, c in enumerate(counts.tolist()):
        xe = xs[s:s + c]; s += c
        outs.append((F.silu(xe @ w1[e]) * (xe @ w3[e])) @ w2[e])
    return torch.cat(outs) if outs else xs.new_zeros((0, w2.shape[-1]))


def route(x, wr, k):
    probs = (x.float() @ wr).softmax(-1)
    topv, topi = probs.topk(k, dim=-1)
    return topv / topv.sum(-1, keepdim=True), topi


def ep_layer(x, wr, w1, w3, w2, k, E, world):
    """One rank's forward: its tokens x (T, d) through the experts of all ranks; w1, w3, w2 its own."""
    El = E // world
    topv, topi = route(x, wr, k)
    flat = topi.reshape(-1)
    order = flat.argsort(stable=True)                  # by expert, so by owner rank, then by token
    tok = order // k
    cnt = torch.bincount(flat, minlength=E)            # rows per expert from me
    send_e = cnt.to(x.device)
    recv_e = torch.empty_like(send_e)
    dist.all_to_all_single(recv_e, send_e)             # rank r gets, per sender, El counts of its experts
    send = cnt.view(world, El).sum(1).tolist()
    recv_by = recv_e.view(world, El)                   # [sender][local expert]
    recv = recv_by.sum(1).tolist()
    xr = A2A.apply(x[tok], send, recv)                 # rows in (sender, expert) order
    # regroup by local expert (senders in order within an expert): a stable sort of the rows' experts
    e_of_row = torch.arange(El, device=x.device).repeat(world).repeat_interleave(recv_by.reshape(-1))
    idx = e_of_row.argsort(stable=True)
    if xr.shape[0]:
        ye = experts(xr[idx], recv_by.sum(0), w1, w3, w2)
        ys = torch.zeros((xr.shape[0], ye.shape[1]), device=x.device, dtype=ye.dtype).index_copy(0, idx, ye)
    else:
        ys = xr[:, :w2.shape[-1]] * 0   # nothing came: an empty block that keeps the graph
    yb = A2A.apply(ys, recv, send)                     # back in my order
    y = torch.zeros(x.shape[0], yb.shape[1], device=x.device, dtype=yb.dtype)
    return y.index_add(0, tok, yb * topv.reshape(-1)[order].unsqueeze(1).to(yb.dtype))


def one_layer(x, wr, w1, w3, w2, k):
    topv, topi = route(x, wr, k)
    flat = topi.reshape(-1)
    order = flat.argsort(stable=True)
    tok = order // k
    ys = experts(x[tok], torch.bincount(flat, minlength=w1.shape[0]), w1, w3, w2)
    y = torch.zeros(x.shape[0], ys.shape[1], device=x.device, dtype=ys.dtype)
    return y.index_add(0, tok, ys * topv.reshape(-1)[order].unsqueeze(1).to(ys.dtype))


def weights(d, f, E, dev, dt):
    g = torch.Generator().manual_seed(0)   # the same full weights on every rank; each keeps its slice
    wr = torch.randn(d, E, generator=g) * 0.02
    w1, w3 = (torch.randn(E, d, f, generator=g) * 0.02 for _ in range(2))
    w2 = torch.randn(E, f, d, generator=g) * 0.02
    return wr.to(dev), w1.to(dev, dt), w3.to(dev, dt), w2.to(dev, dt)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--cases', default='olmoe,mixtral')
    ap.add_argument('--tokens-per-rank', type=int, default=0)
    ap.add_argument('--iters', type=int, default=10)
    ap.add_argument('--warmup', type=int, default=3)
    ap.add_argument('--check', action='store_true')
    a = ap.parse_args()
    cuda = torch.cuda.is_available() and not a.check
    dist.init_process_group('nccl' if cuda else 'gloo')
    rank, world = dist.get_rank(), dist.get_world_size()
    dev = torch.device('cuda', int(os.environ.get('LOCAL_RANK', 0))) if cuda else torch.device('cpu')
    if cuda: torch.cuda.set_device(dev)
    dt = torch.bfloat16 if cuda else torch.float32
    for name in a.cases.split(','):
        T, d, f, E, k = SHAPES[name]
        if E % world: raise SystemExit(f'{name}: {E} experts do not split over {world} ranks')
        Tl, El = a.tokens_per_rank or max(1, T // world), E // world
        wr, w1, w3, w2 = weights(d, f, E, dev, dt)
        mine = slice(rank * El, (rank + 1) * El)
        p = [t.clone().requires_grad_() for t in (wr, w1[mine], w3[mine], w2[mine])]
        x = (torch.randn(Tl, d, generator=torch.Generator().manual_seed(100 + rank)) * 1.0).to(dev, dt).requires_grad_()
        if a.check:
            y = ep_layer(x, *p, k, E, world)
            y.float().square().sum().backward()
            xs = [torch.empty_like(x) for _ in range(world)]; dist.all_gather(xs, x.detach())
            ys = [torch.empty_like(y) for _ in range(world)]; dist.all_gather(ys, y.detach())
            gx = [torch.empty_like(x) for _ in range(world)]; dist.all_gather(gx, x.grad)
            gr = p[0].grad.clone(); dist.all_reduce(gr)   # the router is replicated: its gradient sums over ranks
            gw = [[torch.empty_like(t.grad) for _ in range(world)] for t in p[1:]]
            for i, t in enumerate(p[1:]): dist.all_gather(gw[i], t.grad)
            if rank == 0:
                X = torch.cat(xs).clone().requires_grad_()
                q = [t.clone().requires_grad_() for t in (wr, w1, w3, w2)]
                Y = one_layer(X, *q, k)
                Y.float().square().sum().backward()
                rel = lambda u, v: float((u - v.detach()).norm() / v.detach().norm().clamp_min(1e-30))
                res = {'y': rel(torch.cat(ys), Y), 'dx': rel(torch.cat(gx), X.grad), 'drouter': rel(gr, q[0].grad)}
                for i, n in enumerate(('dw1', 'dw3', 'dw2')): res[n] = rel(torch.cat(gw[i]), q[i + 1].grad)
                ok = all(v < 1e-5 for v in res.values())
                print(json.dumps({'case': name, 'check': 'ok' if ok else 'FAIL', 'world': world, 'rel_l2': res}), flush=True)
                if not ok: raise SystemExit(1)
            continue
        def fwd_bwd():
            for t in p + [x]: t.grad = None
            ep_layer(x, *p, k, E, world).float().square().mean().backward()
        ts = []
        for i in range(a.warmup + a.iters):
            dist.barrier()
            if cuda:
                b, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                b.record(); fwd_bwd(); e.record(); torch.cuda.synchronize(); ms = b.elapsed_time(e)
            else:
                t0 = time.perf_counter(); fwd_bwd(); ms = 1e3 * (time.perf_counter() - t0)
            if i >= a.warmup: ts.append(ms)
        med = torch.tensor(sorted(ts)[len(ts) // 2], device=dev)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        if rank == 0:
            flops = 3 * 2 * Tl * world * k * 3 * d * f   # the expert GEMMs, fwd + 2x bwd, the whole mesh
            print(json.dumps({'case': name, 'impl': 'torch all_to_all_single + grouped_mm', 'world': world, 'tokens_per_rank': Tl,
                              'd': d, 'f': f, 'E': E, 'k': k, 'ms_fwd_bwd': round(float(med), 2),
                              'expert_tflops_per_gpu': round(flops / float(med) / 1e9 / world, 1),
                              'torch': torch.__version__}), flush=True)
    dist.destroy_process_group()


if __name__ == '__main__':
    main()
