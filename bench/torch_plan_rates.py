# torch_plan_rates.py — Megatron's kernels' rates at the published runs' per-GPU shapes (issue 41; Python for
# verification against peers only, nothing of build/moe runs it). `moe plan` predicts a Megatron-Core run from
# a hardware profile whose compute keys (src/train/hwprofile.c, docs/PLAN.md "The hardware profile") are
# rates of OUR kernels; a Megatron run runs cuBLAS (TE's GEMMs), torch's / CUTLASS's grouped GEMMs and cuDNN /
# flash attention. This measures, per published row, what each key stands for, at the shapes one GPU of that
# layout runs, with torch 2.11's ops standing in for TE's:
#   dense_tflops        the attention projections (TE fuses q, k, v into one GEMM; latent attention's five),
#                       the router, a dense layer's MLP, MTP's eh_proj and the LM head: forward + both backward
#                       GEMMs (dgrad, wgrad), bf16 torch.matmul (cuBLAS); FLOP-weighted as calibrate.c weights
#                       ours (each layer's ops times the layers, the head once a head). `dense_fp8_tflops` (the
#                       -fp8 profile's dense_tflops): the same with the projections and MLPs on torch._scaled_mm
#                       e4m3, row-wise scales (TE runs every linear layer in FP8 under --fp8; the router and the
#                       LM head, not TE layers, stay bf16).
#   grouped_tflops      the routed experts' SwiGLU MLP on torch._grouped_mm (fc1 = w1 and w3 fused, 2f wide, as
#                       TEGroupedMLP has it; SwiGLU; fc2), forward + backward (dgrad and wgrad of both), at the
#                       local experts and rows per expert of the layout; DeepSeek-V3's shared expert with them
#                       (the planner charges it at this key), as Megatron runs it: a TP-split MLP on torch.matmul.
#   fp8_grouped_tflops  the same GEMMs on torch._scaled_grouped_mm / torch._scaled_mm, e4m3, row-wise scales
#                       (DeepSeek-V3 ran 128-blockwise, Qwen3 per-tensor current scaling: row-wise stands in for
#                       both). GEMMs and SwiGLU only: TE's quantisation (cast + transpose fused into the ops that
#                       produce the operands) is assumed free, so this is an upper bound on the FP8 rate.
#   attention_tflops    torch SDPA forward + backward, causal, seq 4096, micro-batch 1, the heads one TP rank
#                       holds, at the planner's FLOPs (cost.c attn_scores: the causal half, x 3); every SDPA
#                       backend that takes the shape is timed (cuDNN is what TE runs by default) and the fastest
#                       is the key.
# SwiGLU's elementwise passes are torch.compile'd (one fused kernel each way, as Megatron's bias_swiglu fusion;
# SWIGLU=eager: torch's eager ops, several passes) and timed inside the grouped keys.
# Each measurement: the median of ITERS (default 10) timed calls after 3 warm-up calls, CUDA events around each.
# The other keys are the built-in h100's (memory 80 GB x 139/141, context 0.5 GiB, peak 989, hbm 2,800, links
# 126 / 14 GB/s, pcie 25, launch and sync 0): the profile is an H100's with rates measured on an H200, which has
# the H100's SMs (132), tensor cores and clock limits; its larger, faster HBM does not move a compute-bound GEMM.
#
# The rows' per-GPU shapes (micro-batch 1 x seq 4096; TP2 with sequence parallelism: a rank holds 2048 of the
# sequence's tokens and the TP-parallel GEMMs see all 4096; tokens are dispatched from each rank's 2048; ETP 1;
# routing balanced):
#   deepseek-v3 (1,024 H100, TP2 PP8 VPP4 EP64, DP64): d 7168, 128 heads, MLA (q lora 1536, kv latent 512 + 64
#     rope, qk 192, v 128), 256 experts of f 2048 top-8, 1 shared expert of 2048, 3 dense layers of f 18432, 61
#     layers + 1 MTP module, vocab 129280. Experts: 256 / EP64 = 4 a rank; the EP group's 64 ranks dispatch
#     64 x 2048 tokens x 8 rows = 1,048,576 rows over 256 experts: 4,096 rows an expert, 16,384 a rank.
#     Dense: q_down 2048 x 7168 -> 1536 and kv_down 2048 x 7168 -> 576 (duplicated over TP, on the rank's
#     sequence shard), q_up 4096 x 1536 -> 64 x 192, kv_up 4096 x 512 -> 64 x 256, o 4096 x 8192 -> 7168,
#     router 2048 x 7168 -> 256 (58 MoE layers + MTP), the dense MLP fc1 4096 x 7168 -> 2 x 9216, fc2 9216 -> 7168
#     (3 layers), eh_proj 4096 x 14336 -> 3584, the head 4096 x 7168 -> 64640 (twice: the model's and MTP's).
#     Shared expert: fc1 4096 x 7168 -> 2 x 1024, fc2 1024 -> 7168. Attention: 64 heads, qk 192, v 128.
#   qwen3-235b-a22b (256 H100, TP2 PP8 VPP4 EP32, DP16): d 4096, 64 q heads, 4 kv heads of 128, 128 experts of
#     f 1536 top-8, 94 layers, vocab 151936. Experts: 128 / EP32 = 4 a rank; 32 x 2048 x 8 rows over 128
#     experts: 4,096 an expert. Dense: qkv 4096 x 4096 -> (32 + 2 x 2) x 128, o 4096 x 4096 -> 4096, router
#     2048 x 4096 -> 128, the head 4096 x 4096 -> 75968. Attention: 32 q heads, 2 kv heads, hd 128.
#   mixtral-8x22b (128 H100, TP2 PP8 EP8, DP8): d 6144, 48 q heads, 8 kv heads of 128, 8 experts of f 16384
#     top-2, 56 layers, vocab 32768. Experts: 8 / EP8 = 1 a rank; an EP group's 8 ranks send 8 x 2048 x 2 rows
#     over 8 experts: 4,096 an expert. Dense: qkv 4096 x 6144 -> (24 + 2 x 4) x 128, o 4096 x 3072 -> 6144,
#     router 2048 x 6144 -> 8, the head 4096 x 6144 -> 16384. Attention: 24 q heads, 4 kv heads, hd 128.
#
#   python3 bench/torch_plan_rates.py [--out DIR] [--rows deepseek-v3,qwen3-235b-a22b,mixtral-8x22b]
# Prints a table and one JSON profile per row (and a -fp8 variant: dense_tflops from the FP8 projections), and
# writes them as DIR/megatron-ROW.json, DIR/megatron-ROW-fp8.json. env ITERS, SWIGLU (compile|eager).
import argparse, json, math, os, sys, warnings
import torch
import torch.nn.functional as F

E4 = torch.float8_e4m3fn
BF = torch.bfloat16
DEV = 'cuda'
warnings.filterwarnings('ignore', category=UserWarning)  # (SDPA's notes on the backends it skips)
ITERS = int(os.environ.get('ITERS', 10))
GIB = 1073741824.0
H100 = dict(memory_bytes=78.9 * GIB, context_bytes=0.5 * GIB, peak_tflops=989, hbm_gbps=2800, nvlink_gbps=126,
            internode_gbps=14, pcie_gbps=25, launch_us=0, sync_us=0)

# dense ops: (name, rows, K, O, times a step runs it (layers), fp8 under --fp8)
ROWS = {
    'deepseek-v3': dict(
        dense=[('q_down', 2048, 7168, 1536, 62, 1), ('kv_down', 2048, 7168, 576, 62, 1),
               ('q_up', 4096, 1536, 64 * 192, 62, 1), ('kv_up', 4096, 512, 64 * 256, 62, 1),
               ('o', 4096, 64 * 128, 7168, 62, 1), ('router', 2048, 7168, 256, 59, 0),
               ('dense_fc1', 4096, 7168, 2 * 9216, 3, 1), ('dense_fc2', 4096, 9216, 7168, 3, 1),
               ('eh_proj', 4096, 2 * 7168, 3584, 1, 1), ('head', 4096, 7168, 64640, 2, 0)],
        experts=dict(G=4, rows=4096, d=7168, f=2048, layers=59), shared=dict(rows=4096, d=7168, f=1024),
        attn=dict(H=64, KV=64, qk=192, v=128, T=4096)),
    'qwen3-235b-a22b': dict(
        dense=[('qkv', 4096, 4096, (32 + 4) * 128, 94, 1), ('o', 4096, 4096, 4096, 94, 1),
               ('router', 2048, 4096, 128, 94, 0), ('head', 4096, 4096, 75968, 1, 0)],
        experts=dict(G=4, rows=4096, d=4096, f=1536, layers=94), shared=None,
        attn=dict(H=32, KV=2, qk=128, v=128, T=4096)),
    'mixtral-8x22b': dict(
        dense=[('qkv', 4096, 6144, (24 + 8) * 128, 56, 1), ('o', 4096, 3072, 6144, 56, 1),
               ('router', 2048, 6144, 8, 56, 0), ('head', 4096, 6144, 16384, 1, 0)],
        experts=dict(G=1, rows=4096, d=6144, f=16384, layers=56), shared=None,
        attn=dict(H=24, KV=4, qk=128, v=128, T=4096)),
}


def timed(fn):
    """Median milliseconds of one fn() call: ITERS timed calls after 3 warm-ups, CUDA events around each."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(ITERS):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        ts.append(e0.elapsed_time(e1))
    ts.sort()
    return ts[len(ts) // 2]


def rnd(*shape):
    return torch.randn(*shape, device=DEV, dtype=BF)


def q8(t):
    """e4m3 codes of t (values within range: randn), and ones for the row-wise scales."""
    return t.to(E4)


# ---- dense: y = x W^T, dx = dy W, dW = dy^T x ----
def dense_fn(N, K, O, fp8):
    if not fp8:
        x, w, dy = rnd(N, K), rnd(O, K), rnd(N, O)

        def run():
            F.linear(x, w)
            torch.matmul(dy, w)
            torch.matmul(dy.t(), x)
        return run
    # _scaled_mm(A (M,K) row-major, B (K,N) column-major, scale_a (M,1), scale_b (1,N)): each operand as TE
    # keeps it (the weight and its transpose, the inputs and their transposes, cast before the GEMMs)
    xq, wq, wtq = q8(rnd(N, K)), q8(rnd(O, K)), q8(rnd(K, O))
    dyq, dytq, xtq = q8(rnd(N, O)), q8(rnd(O, N)), q8(rnd(K, N))
    one = lambda n: torch.ones(n, 1, device=DEV)
    sN, sO, sK = one(N), one(O), one(K)

    def run():
        torch._scaled_mm(xq, wq.t(), scale_a=sN, scale_b=sO.t(), out_dtype=BF)  # (N,K) x (K,O)
        torch._scaled_mm(dyq, wtq.t(), scale_a=sN, scale_b=sK.t(), out_dtype=BF)  # (N,O) x (O,K)
        torch._scaled_mm(dytq, xtq.t(), scale_a=sO, scale_b=sK.t(), out_dtype=BF)  # (O,N) x (N,K)
    return run


def dense_rate(row, fp8):
    flops = secs = 0.0
    parts = []
    for name, N, K, O, n, f8 in ROWS[row]['dense']:
        ms = timed(dense_fn(N, K, O, fp8 and f8))
        fl = 6.0 * N * K * O
        parts.append(f"{name} {fl / ms / 1e9:.0f}")
        flops += n * fl
        secs += n * ms / 1e3
        torch.cuda.empty_cache()
    return flops / secs / 1e12, parts


# ---- SwiGLU (h = [h1 | h3] -> silu(h1) h3) and its backward ----
def swiglu_fwd(h):
    h1, h3 = h.chunk(2, dim=-1)
    return F.silu(h1) * h3


def swiglu_bwd(h, da):
    h1, h3 = h.chunk(2, dim=-1)
    s = torch.sigmoid(h1.float())
    d1 = da.float() * h3.float() * s * (1 + h1.float() * (1 - s))
    d3 = da.float() * h1.float() * s
    return torch.cat([d1.to(BF), d3.to(BF)], dim=-1)


SWIGLU = os.environ.get('SWIGLU', 'compile')
if SWIGLU == 'compile':
    try:
        swiglu_fwd_c = torch.compile(swiglu_fwd, dynamic=True)
        swiglu_bwd_c = torch.compile(swiglu_bwd, dynamic=True)
        swiglu_bwd_c(rnd(256, 512), rnd(256, 256))
        swiglu_fwd_c(rnd(256, 512))
        swiglu_fwd, swiglu_bwd = swiglu_fwd_c, swiglu_bwd_c
    except Exception as ex:  # no compiler here: eager, and say so
        print(f"torch.compile failed ({str(ex)[:120]}): SwiGLU in eager ops", flush=True)
        SWIGLU = 'eager'


def mlp_grouped_fn(G, R, d, f, fp8):
    """The routed experts' MLP forward + backward: G experts, R rows each (offsets balanced)."""
    M = G * R
    offs = torch.arange(1, G + 1, device=DEV, dtype=torch.int32) * R
    x, dy, h = rnd(M, d), rnd(M, d), rnd(M, 2 * f)
    if not fp8:
        w13, w2 = rnd(G, d, 2 * f), rnd(G, f, d)

        def run():
            hh = torch._grouped_mm(x, w13, offs=offs)  # fc1 (M,d) x (G,d,2f)
            a = swiglu_fwd(hh)
            torch._grouped_mm(a, w2, offs=offs)  # fc2
            da = torch._grouped_mm(dy, w2.transpose(-2, -1), offs=offs)  # fc2 dgrad
            torch._grouped_mm(a.t(), dy, offs=offs)  # fc2 wgrad (G,f,d)
            dh = swiglu_bwd(h, da)
            torch._grouped_mm(dh, w13.transpose(-2, -1), offs=offs)  # fc1 dgrad
            torch._grouped_mm(x.t(), dh, offs=offs)  # fc1 wgrad (G,d,2f)
        return run
    # _scaled_grouped_mm: 2D x 3D with the 3D operand column-major (G,K,N) = (G,N,K).transpose, scales (M,)
    # and (G,N); 2D x 2D over the rows (wgrad): (K,M) row-major x (M,N) column-major, scales (K G,), (N G,)
    ones = lambda n: torch.ones(n, device=DEV)
    xq, dyq, aq, dhq = q8(x), q8(dy), q8(rnd(M, f)), q8(rnd(M, 2 * f))
    xtq, dytq, atq, dhtq = q8(rnd(d, M)), q8(rnd(d, M)), q8(rnd(f, M)), q8(rnd(2 * f, M))
    w13q, w13tq = q8(rnd(G, 2 * f, d)).transpose(-2, -1), q8(rnd(G, d, 2 * f)).transpose(-2, -1)
    w2q, w2tq = q8(rnd(G, d, f)).transpose(-2, -1), q8(rnd(G, f, d)).transpose(-2, -1)
    sM, s_2f, s_d, s_f = ones(M), ones(G * 2 * f).view(G, 2 * f), ones(G * d).view(G, d), ones(G * f).view(G, f)
    s_fG, s_dG, s_2fG = ones(f * G), ones(d * G), ones(2 * f * G)

    def run():
        hh = torch._scaled_grouped_mm(xq, w13q, sM, s_2f, offs=offs, out_dtype=BF)  # fc1
        swiglu_fwd(hh)
        torch._scaled_grouped_mm(aq, w2q, sM, s_d, offs=offs, out_dtype=BF)  # fc2
        da = torch._scaled_grouped_mm(dyq, w2tq, sM, s_f, offs=offs, out_dtype=BF)  # fc2 dgrad
        torch._scaled_grouped_mm(atq, dytq.t(), s_fG, s_dG, offs=offs, out_dtype=BF)  # fc2 wgrad (G,f,d)
        swiglu_bwd(h, da)
        torch._scaled_grouped_mm(dhq, w13tq, sM, s_d, offs=offs, out_dtype=BF)  # fc1 dgrad
        torch._scaled_grouped_mm(xtq, dhtq.t(), s_dG, s_2fG, offs=offs, out_dtype=BF)  # fc1 wgrad (G,d,2f)
    return run


def mlp_dense_fn(N, d, f, fp8):
    """A TP-split SwiGLU MLP (DeepSeek-V3's shared expert) forward + backward on (scaled) matmuls."""
    x, dy, h = rnd(N, d), rnd(N, d), rnd(N, 2 * f)
    if not fp8:
        w13, w2 = rnd(2 * f, d), rnd(d, f)

        def run():
            a = swiglu_fwd(F.linear(x, w13))
            F.linear(a, w2)
            da = torch.matmul(dy, w2)
            torch.matmul(dy.t(), a)
            dh = swiglu_bwd(h, da)
            torch.matmul(dh, w13)
            torch.matmul(dh.t(), x)
        return run
    fc1, fc2 = dense_fn(N, d, 2 * f, True), dense_fn(N, f, d, True)

    def run():
        swiglu_fwd(h)
        swiglu_bwd(h, h[:, :f])
        fc1()
        fc2()
    return run


def grouped_rate(row, fp8):
    e, s = ROWS[row]['experts'], ROWS[row]['shared']
    ms = timed(mlp_grouped_fn(e['G'], e['rows'], e['d'], e['f'], fp8))
    flops = 18.0 * e['G'] * e['rows'] * e['d'] * e['f']
    parts = [f"routed {flops / ms / 1e9:.0f}"]
    torch.cuda.empty_cache()
    if s:
        ms2 = timed(mlp_dense_fn(s['rows'], s['d'], s['f'], fp8))
        f2 = 18.0 * s['rows'] * s['d'] * s['f']
        parts.append(f"shared {f2 / ms2 / 1e9:.0f}")
        flops, ms = flops + f2, ms + ms2
        torch.cuda.empty_cache()
    return flops / ms / 1e9, parts


def attention_rate(row):
    from torch.nn.attention import sdpa_kernel, SDPBackend
    a = ROWS[row]['attn']
    H, KV, qk, v, T = a['H'], a['KV'], a['qk'], a['v'], a['T']
    q = torch.randn(1, H, T, qk, device=DEV, dtype=BF, requires_grad=True)
    k = torch.randn(1, KV, T, qk, device=DEV, dtype=BF, requires_grad=True)
    vv = torch.randn(1, KV, T, v, device=DEV, dtype=BF, requires_grad=True)
    g = torch.randn(1, H, T, v, device=DEV, dtype=BF)
    flops = 3.0 * T * 2 * H * (qk + v) * T / 2  # cost.c attn_scores x 3 (forward + backward), a TP rank's heads
    ke, ve = k.detach().repeat_interleave(H // KV, 1), vv.detach().repeat_interleave(H // KV, 1)
    ke.requires_grad_(), ve.requires_grad_()
    res = {}
    ways = [('cudnn', SDPBackend.CUDNN_ATTENTION, k, vv), ('flash', SDPBackend.FLASH_ATTENTION, k, vv),
            ('efficient', SDPBackend.EFFICIENT_ATTENTION, k, vv)]
    if KV != H:  # (cuDNN through torch may want the kv heads repeated: TE passes GQA to cuDNN as it is)
        ways.append(('cudnn kv repeated', SDPBackend.CUDNN_ATTENTION, ke, ve))
    for name, be, kk, vx in ways:
        def run():
            with sdpa_kernel(be):
                o = F.scaled_dot_product_attention(q, kk, vx, is_causal=True, enable_gqa=kk.shape[1] != H)
            o.backward(g)
            q.grad = kk.grad = vx.grad = None
        try:
            res[name] = flops / timed(run) / 1e9
        except Exception as ex:  # a backend that does not take this shape
            res[name] = None
            print(f"  {row} attention {name}: not run ({str(ex).splitlines()[0][:100]})", flush=True)
        torch.cuda.empty_cache()
    ok = [(r, n) for n, r in res.items() if r]
    if not ok:
        sys.exit(f"{row}: no SDPA backend takes the attention shape")
    best = max(ok)
    return best[0], best[1], res


def safe(fn, *a):
    """fn(*a), or (None, [the error]) where torch does not take the form (the table says so; no profile key)."""
    try:
        return fn(*a)
    except Exception as ex:
        torch.cuda.empty_cache()
        return None, [f"failed: {str(ex).splitlines()[0][:160]}"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--out', default='')
    ap.add_argument('--rows', default=','.join(ROWS))
    o = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, SwiGLU {SWIGLU}, median of {ITERS}",
          flush=True)
    table = []
    for row in o.rows.split(','):
        d16, p16 = safe(dense_rate, row, False)
        d8, p8 = safe(dense_rate, row, True)
        g16, pg16 = safe(grouped_rate, row, False)
        g8, pg8 = safe(grouped_rate, row, True)
        at, atn, atall = attention_rate(row)
        f = lambda x: f"{x:.1f}" if x else "-"
        print(f"{row}: dense bf16 {f(d16)} ({', '.join(p16)})\n  dense fp8 {f(d8)} ({', '.join(p8)})\n"
              f"  grouped bf16 {f(g16)} ({', '.join(pg16)}); fp8 {f(g8)} ({', '.join(pg8)})\n"
              f"  attention {at:.1f} ({atn}; " + ', '.join(f"{n} {f(r)}" for n, r in atall.items()) + ")",
              flush=True)
        if not d16 or not g16:
            sys.exit(f"{row}: a bf16 rate failed: no profile")
        table.append((row, d16, d8, g16, g8, at, atn))
        for fp8 in (0, 1) if d8 else (0,):
            prof = dict(name=f"megatron-{row}" + ('-fp8' if fp8 else ''))
            prof['note'] = (
                f"Megatron's kernels' rates at {row}'s published per-GPU shapes (bench/torch_plan_rates.py, "
                f"torch {torch.__version__} on one {torch.cuda.get_device_name()}: the H100's SMs, tensor cores "
                f"and clock limits); dense_tflops "
                + ("with the projections and MLPs on torch._scaled_mm e4m3 (TE under --fp8)" if fp8 else
                   "bf16 torch.matmul (cuBLAS)")
                + "; grouped on torch._grouped_mm, fp8_grouped on torch._scaled_grouped_mm e4m3 row-wise (its "
                "quantisation assumed free: TE fuses it); attention torch SDPA (" + atn + "); memory, "
                "context, peak, hbm, links, pcie, launch and sync the built-in h100's")
            prof.update(H100)
            prof.update(dense_tflops=round(d8 if fp8 else d16, 1), grouped_tflops=round(g16, 1),
                        attention_tflops=round(at, 1))
            if g8:
                prof['fp8_grouped_tflops'] = round(g8, 1)
            js = json.dumps(prof, indent=1)
            print(js, flush=True)
            if o.out:
                with open(os.path.join(o.out, prof['name'] + '.json'), 'w') as fh:
                    fh.write(js + '\n')
    print("\n| row | dense bf16 | dense fp8 | grouped bf16 | grouped fp8 | attention (backend) |")
    print("|---|---|---|---|---|---|")
    for row, d16, d8, g16, g8, at, atn in table:
        f = lambda x: f"{x:.1f}" if x else "-"
        print(f"| {row} | {f(d16)} | {f(d8)} | {f(g16)} | {f(g8)} | {at:.1f} ({atn}) |")


if __name__ == '__main__':
    main()
