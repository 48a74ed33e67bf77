# fp8_peer.py — the torch side of scripts/device/fp8_check.sh's throughput table (Python for the peers only):
# torch._scaled_grouped_mm and torch._scaled_mm (e4m3, row-wise scales, bf16 out) and torch._grouped_mm (bf16)
# on bench/fp8_gemm_bench.c's shapes, timed the same way (CUDA events, mean of 10 calls after 3 warm-ups).
#   python3 scripts/device/fp8_peer.py
import torch

E4 = torch.float8_e4m3fn
DEV = 'cuda'


def timed(fn, iters=10, warm=3):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(iters):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) / iters


def report(shape, form, fn, flops):
    try:
        ms = timed(fn)
        print(f"{shape:<14} {form:<34} {ms:9.3f} ms {flops / (ms * 1e9):7.1f} TFLOP/s", flush=True)
    except Exception as ex:  # a form this torch does not take: say so and go on
        print(f"{shape:<14} {form:<34} failed: {str(ex)[:160]}", flush=True)


def rows(shape, G, m, K, N):
    M = G * m
    offs = torch.arange(1, G + 1, device=DEV, dtype=torch.int32) * m
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(G, N, K, device=DEV, dtype=torch.bfloat16)
    xq, wq = x.to(E4), w.to(E4).transpose(-2, -1)  # wq (G, K, N) column-major, as the peer layer passes it
    xs, ws = torch.ones(M, device=DEV), torch.ones(G, N, device=DEV)
    f = 2.0 * M * N * K
    report(shape, "torch._scaled_grouped_mm (fp8)",
           lambda: torch._scaled_grouped_mm(xq, wq, xs, ws, offs=offs, out_dtype=torch.bfloat16), f)
    report(shape, "torch._scaled_mm (fp8, one weight)",
           lambda: torch._scaled_mm(xq, wq[0], scale_a=xs[:, None], scale_b=ws[0][None, :],
                                    out_dtype=torch.bfloat16), f)
    wt = w.transpose(-2, -1)
    report(shape, "torch._grouped_mm (bf16)", lambda: torch._grouped_mm(x, wt, offs=offs), f)
    del x, w, xq, wq, wt
    torch.cuda.empty_cache()


def dw(shape, G, m, N, K):
    M = G * m
    offs = torch.arange(1, G + 1, device=DEV, dtype=torch.int32) * m
    x = torch.randn(M, K, device=DEV, dtype=torch.bfloat16)
    dy = torch.randn(M, N, device=DEV, dtype=torch.bfloat16)
    xq = x.t().contiguous().to(E4)  # (K, M) row-major
    dq = dy.t().contiguous().to(E4)  # (N, M) row-major: dq.t() is (M, N) column-major
    xs, ds = torch.ones(K * G, device=DEV), torch.ones(N * G, device=DEV)
    f = 2.0 * M * N * K
    report(shape, "torch._scaled_grouped_mm dW (fp8)",
           lambda: torch._scaled_grouped_mm(xq, dq.t(), xs, ds, offs=offs, out_dtype=torch.bfloat16), f)
    report(shape, "torch._grouped_mm dW (bf16)", lambda: torch._grouped_mm(x.t(), dy, offs=offs), f)
    del x, dy, xq, dq
    torch.cuda.empty_cache()


print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
rows("mixtral-up", 8, 4096, 4096, 14336)
rows("mixtral-down", 8, 4096, 14336, 4096)
rows("ref-up", 8, 2048, 2048, 5632)
rows("ref-down", 8, 2048, 5632, 2048)
dw("mixtral-dW1", 8, 4096, 14336, 4096)
dw("ref-dW1", 8, 2048, 5632, 2048)
