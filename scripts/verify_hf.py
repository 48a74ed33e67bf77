#!/usr/bin/env python3
"""verify_hf.py — prove moe.c's Mixtral against Hugging Face transformers (issue 6).

    python3 scripts/verify_hf.py build/moe [--keep] [--workdir DIR]

Needs torch, transformers (>= 4.46; the fused-expert layout of 5.x is handled) and safetensors.
Everything runs in float32 on the CPU unless --moe-device / --hf-device say otherwise; all files go
to a fresh temporary directory (removed at the end unless --keep).

  1. transformers creates a small random MixtralForCausalLM (2 layers, 4 experts top-2, GQA 4/2 heads,
     vocab 256) and saves it; `moe eval --ckpt HF_DIR --dump` on a fixed token batch: logits and loss
     must match transformers' (relative L2 difference).
  2. `moe train --init-from HF_DIR` trains 50 steps on a uint32 llm.c shard written here, `moe export`
     writes an HF directory, transformers loads it (no missing/unexpected keys, float32) and
     reproduces moe.c's validation loss over the same windows; its aux loss (output_router_logits=True)
     matches the HF-form aux value moe.c computes from its router outputs (aux_loss_hf).
  3. Gradients after one backward of the mean cross-entropy on the same batch (aux and z
     coefficients 0 on our side, output_router_logits=False on theirs): per tensor
     ||g_moe - g_hf|| / ||g_hf||, for the random model of 1 and the trained model of 2; then with
     the aux term (coefficient 0.02) in the form the trained model uses: moe.c's per-layer form
     (written in torch on transformers' router logits), or transformers' own aux_loss once moe.c
     trains with --aux-form hf (used automatically when `moe train --help` lists it).

Prints a PASS/FAIL table with the measured numbers; exit status 0 only if every check passes.
"""
import argparse
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

try:
    import torch
    import transformers
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM
except ImportError as e:  # pragma: no cover
    print(f"verify_hf: needs torch, transformers and safetensors ({e})", file=sys.stderr)
    sys.exit(2)

# ---- the model and the run ----
ARCH = dict(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=256,
            rope_theta=10000.0, rms_norm_eps=1e-5, router_aux_loss_coef=0.02, router_jitter_noise=0.0,
            initializer_range=0.05, tie_word_embeddings=False, sliding_window=None)
B, T = 8, 64          # batch and sequence length of every moe eval / train here
EVAL_BATCHES = 4
STEPS = 50
VERBOSE = False       # --verbose: a table row per kind of tensor in the gradient checks


def rel(a, b):
    """||a - b|| / ||b|| (float64); 0 when both are 0."""
    a = a.double().flatten()
    b = b.double().flatten()
    nb = b.norm().item()
    nd = (a - b).norm().item()
    if nb == 0:
        return 0.0 if nd == 0 else math.inf
    return nd / nb


def run(cmd, log):
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT)
    if r.returncode != 0:
        print(f"FAILED (exit {r.returncode}): {' '.join(cmd)}\n--- {log} ---")
        print(open(log).read()[-4000:])
        sys.exit(1)
    return open(log).read()


def corpus_tokens(n_bytes, seed=0):
    """Deterministic learnable byte text: arithmetic, reversal and copy lines."""
    r = random.Random(seed)
    out = bytearray()
    while len(out) < n_bytes:
        k = r.randrange(3)
        if k == 0:
            a, b = r.randrange(100), r.randrange(100)
            line = f"{a}+{b}={a + b}\n"
        elif k == 1:
            w = "".join(r.choice("abcdefghij") for _ in range(r.randrange(2, 7)))
            line = f"rev:{w}={w[::-1]}\n"
        else:
            w = "".join(r.choice("klmnopqrst") for _ in range(r.randrange(2, 7)))
            line = f"copy:{w}={w}\n"
        out += line.encode()
    return list(out[:n_bytes])


def write_shard(path, tokens, uint32):
    """llm.c shard: 256 int32 header (magic, version, count), then uint16 or uint32 tokens."""
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = (20240801, 7, len(tokens)) if uint32 else (20240520, 1, len(tokens))
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *hdr))
        f.write(struct.pack(f"<{len(tokens)}{'I' if uint32 else 'H'}", *tokens))


def val_windows(tokens, n_seq):
    """moe.c's split of a token shard (src/data/data.h, "tail"): the last ceil(0.1 n) tokens are held out and
    validation windows of T+1 tokens tile them at stride T from their first token."""
    first = len(tokens) - math.ceil(len(tokens) * 0.1)
    return torch.tensor([tokens[first + i * T: first + i * T + T + 1] for i in range(n_seq)])


def load_dump(path):
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def hf_load(path, device):
    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager",
                                                       output_loading_info=True)
    return model.to(device).eval(), info


def hf_grad(params, name, f):
    """The HF gradient of our tensor `name` (per-expert Mixtral names), whichever layout transformers
    uses in memory: per-expert modules (4.x) or fused experts.gate_up_proj / down_proj (5.x)."""
    if name in params:
        return params[name].grad
    alt = name.replace(".block_sparse_moe.", ".mlp.")
    if alt in params:
        return params[alt].grad
    # model.layers.L.block_sparse_moe.experts.E.wK.weight
    parts = name.split(".")
    layer, expert, w = parts[2], int(parts[5]), parts[6]
    for blk in ("mlp", "block_sparse_moe"):
        base = f"model.layers.{layer}.{blk}.experts."
        if w in ("w1", "w3") and base + "gate_up_proj" in params:
            g = params[base + "gate_up_proj"].grad
            return g[expert, :f] if w == "w1" else g[expert, f:]
        if w == "w2" and base + "down_proj" in params:
            return params[base + "down_proj"].grad[expert]
    raise KeyError(f"no HF parameter for {name}")


class Table:
    def __init__(self):
        self.rows = []

    def add(self, name, value, tol, ok=None, note=""):
        if ok is None:
            ok = value <= tol
        self.rows.append((name, value, tol, ok, note))
        return ok

    def print(self):
        w = max(len(r[0]) for r in self.rows)
        print(f"\n{'check':<{w}}  {'measured':>10}  {'tolerance':>9}  result")
        print("-" * (w + 36))
        for name, v, tol, ok, note in self.rows:
            vs = f"{v:10.2e}" if isinstance(v, float) else f"{v!s:>10}"
            ts = f"{tol:9.0e}" if isinstance(tol, float) else f"{tol!s:>9}"
            print(f"{name:<{w}}  {vs}  {ts}  {'PASS' if ok else 'FAIL'}{'  ' + note if note else ''}")
        n_fail = sum(not r[3] for r in self.rows)
        print("-" * (w + 36))
        print(f"{len(self.rows) - n_fail} passed, {n_fail} failed")
        return n_fail == 0


def aux_per_layer(router_logits, k):
    """moe.c's default aux form in torch: the mean over layers of E * sum_e (n_e / N) * mean_t p_te,
    n_e the top-k assignments to e (a count: no gradient), p the softmax of the router logits."""
    terms = []
    for lg in router_logits:
        p = torch.softmax(lg.float(), dim=-1)
        n = torch.zeros(p.shape[-1], dtype=p.dtype).scatter_add_(
            0, torch.topk(p, k, dim=-1).indices.reshape(-1), torch.ones(p.shape[0] * k, dtype=p.dtype))
        terms.append(p.shape[-1] * torch.sum(n.detach() / p.shape[0] * p.mean(dim=0)))
    return torch.stack(terms).mean()


def grad_checks(tab, label, dump, model, x_win, f, tol, aux_coef=0.0, aux_form="hf"):
    """Per-tensor gradient comparison; adds the worst tensor per kind to the table. Loss: transformers'
    own (labels = the T+1 window: pure cross-entropy over our T targets), or with aux_coef the mean
    cross-entropy over the T inputs + aux_coef * aux (output_router_logits=True) of those T tokens:
    transformers' aux_loss (aux_form "hf"), or moe.c's per-layer form computed here (aux_form "layer")."""
    model.zero_grad(set_to_none=True)
    if aux_coef:
        x, y = x_win[:, :-1], x_win[:, 1:]
        out = model(input_ids=x, output_router_logits=True)
        loss = torch.nn.functional.cross_entropy(out.logits.float().reshape(-1, out.logits.shape[-1]), y.reshape(-1))
        aux = out.aux_loss if aux_form == "hf" else aux_per_layer(out.router_logits, ARCH["num_experts_per_tok"])
        (loss + aux_coef * aux).backward()
    else:
        out = model(input_ids=x_win, labels=x_win, output_router_logits=False)
        out.loss.backward()
    params = dict(model.named_parameters())
    worst = {}
    lines = []
    for k, g in dump.items():
        if not k.startswith("grad."):
            continue
        name = k[5:]
        gh = hf_grad(params, name, f)
        if gh is None:
            gh = torch.zeros_like(g)
        if tuple(gh.shape) != tuple(g.shape):
            tab.add(f"{label}: grad shape {name}", float("inf"), tol, ok=False)
            continue
        r = rel(g, gh.detach().cpu())
        lines.append((name, r, gh.norm().item()))
        kind = ".".join(p for p in name.split(".") if not p.isdigit())
        if kind not in worst or r > worst[kind][1]:
            worst[kind] = (name, r)
    print(f"\n{label}: per-tensor gradient relative difference ||g_moe - g_hf|| / ||g_hf|| ({len(lines)} tensors)")
    for name, r, n in lines:
        print(f"  {name:<58} {r:9.2e}  (||g_hf|| {n:.3e})")
    if VERBOSE:
        for kind, (name, r) in sorted(worst.items()):
            tab.add(f"3 {label}: grad {kind} (worst)", r, tol)
    name, r, _ = max(lines, key=lambda x: x[1])
    tab.add(f"3 {label}: grad, max over {len(lines)} tensors", r, tol, note=name)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("moe", help="path of the moe binary (build/moe)")
    ap.add_argument("--workdir", help="directory for the files (default: a new temporary directory)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--moe-device", default="cpu",
                    help="moe --device for every train/eval (default cpu; cuda, cuda-fp32: see --tol)")
    ap.add_argument("--hf-device", default="cpu", help="torch device for transformers (default cpu)")
    ap.add_argument("--tol", type=float, default=None,
                    help="relative tolerance of every check (default 1e-4 fp32; e.g. 3e-2 for a bf16 backend)")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--verbose", action="store_true", help="a table row per kind of tensor in step 3")
    a = ap.parse_args()
    global VERBOSE
    VERBOSE = a.verbose
    moe = os.path.abspath(a.moe)
    if not os.access(moe, os.X_OK):
        sys.exit(f"verify_hf: '{a.moe}' is not an executable")
    tol = a.tol if a.tol is not None else 1e-4
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    work = a.workdir or tempfile.mkdtemp(prefix="verify_hf_")
    os.makedirs(work, exist_ok=True)
    print(f"verify_hf: moe {moe} (--device {a.moe_device}), torch {torch.__version__}, transformers "
          f"{transformers.__version__}, work dir {work}")
    # every moe command that runs a backend (train, eval) names it: left out, moe picks cuda where a GPU
    # is present, and a "cpu" check would silently run the CUDA backend (export runs none)
    dev = ["--device", a.moe_device]
    tab = Table()
    f = ARCH["intermediate_size"]

    # data: the same text as a uint16 and a uint32 shard
    toks = corpus_tokens(1 << 18)
    write_shard(os.path.join(work, "text16.bin"), toks, uint32=False)
    write_shard(os.path.join(work, "text32.bin"), toks, uint32=True)

    # ---- 1. a random transformers model, evaluated by moe.c ----
    hf1 = os.path.join(work, "hf_random")
    cfg = MixtralConfig(**ARCH)
    MixtralForCausalLM(cfg).to(torch.float32).save_pretrained(hf1)
    d1 = os.path.join(work, "dump_random.safetensors")
    run([moe, "eval", "--ckpt", hf1, "--data", os.path.join(work, "text16.bin"), "--batch", str(B), "--seq-len",
         str(T), "--eval-batches", "1", "--dump", d1, "--dump-grads", "--aux-coef", "0", "--z-coef", "0"] + dev,
        os.path.join(work, "eval_random.log"))
    dump, meta = load_dump(d1)
    m1, info = hf_load(hf1, a.hf_device)
    x_win = val_windows(toks, B).to(a.hf_device)          # (B, T+1): inputs and targets
    tab.add("1 batch tokens = moe.c's first validation batch", 0.0 if
            torch.equal(dump["tokens"].long(), x_win[:, :T].cpu()) and
            torch.equal(dump["targets"].long(), x_win[:, 1:].cpu()) else 1.0, 0.0)
    with torch.no_grad():
        o = m1(input_ids=x_win, labels=x_win)
        o_aux = m1(input_ids=x_win[:, :T], output_router_logits=True)
    lg = o.logits[:, :T].float().cpu()
    tab.add("1 random model: logits, rel L2", rel(dump["logits"], lg), tol,
            note=f"max |diff| {(dump['logits'] - lg).abs().max().item():.2e}")
    tab.add("1 random model: loss, rel", abs(float(meta["loss"]) - o.loss.item()) / o.loss.item(), tol,
            note=f"moe {float(meta['loss']):.7f} hf {o.loss.item():.7f}")
    tab.add("1 random model: aux (HF form), rel", abs(float(meta["aux_loss_hf"]) - o_aux.aux_loss.item()) /
            o_aux.aux_loss.item(), tol, note=f"moe {float(meta['aux_loss_hf']):.7f} hf {o_aux.aux_loss.item():.7f}")
    rl = [dump[f"router_logits.{l}"] for l in range(ARCH["num_hidden_layers"])]
    tab.add("1 random model: router logits, rel L2 (max layer)",
            max(rel(rl[l], o_aux.router_logits[l].float().cpu().reshape(rl[l].shape)) for l in range(len(rl))), tol)

    # ---- 2. moe.c trains from that model, exports; transformers reproduces it ----
    run_dir = os.path.join(work, "run")
    # once moe.c has the HF aux form (a model option), train with it: then its logged aux_loss is
    # transformers' value itself and step 3 also checks the gradient of the aux term
    has_aux_form = "--aux-form" in subprocess.run([moe, "train", "--help"], capture_output=True, text=True).stdout
    run([moe, "train"] + (["--aux-form", "hf"] if has_aux_form else []) +
        ["--init-from", hf1, "--data", os.path.join(work, "text32.bin"), "--out", run_dir, "--steps", str(a.steps), "--batch", str(B), "--seq-len", str(T), "--lr", "3e-3", "--warmup", "5",
         "--eval-every", "0", "--eval-batches", str(EVAL_BATCHES), "--plots", "0", "--sample-tokens", "0",
         "--quiet", "--force"] + dev, os.path.join(work, "train.log"))
    metrics = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"loss"' in l]
    first, last = metrics[0], metrics[-1]
    tab.add(f"2 moe.c training: loss step 1 -> {len(metrics)} goes down", last["loss"] / first["loss"], 0.9,
            note=f"{first['loss']:.4f} -> {last['loss']:.4f}")
    hf2 = os.path.join(work, "hf_trained")
    run([moe, "export", "--ckpt", run_dir, "--out", hf2], os.path.join(work, "export.log"))
    d2 = os.path.join(work, "dump_trained.safetensors")
    run([moe, "eval", "--ckpt", run_dir, "--data", os.path.join(work, "text32.bin"), "--batch", str(B), "--seq-len",
         str(T), "--eval-batches", str(EVAL_BATCHES), "--dump", d2, "--dump-grads", "--aux-coef", "0",
         "--z-coef", "0"] + dev, os.path.join(work, "eval_trained.log"))
    dump2, meta2 = load_dump(d2)
    m2, info = hf_load(hf2, a.hf_device)
    bad_keys = sum(len(info.get(k, [])) for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    tab.add("2 export loads: missing/unexpected/mismatched keys", bad_keys, 0, ok=bad_keys == 0,
            note=f"{type(m2).__name__}, {next(m2.parameters()).dtype}")
    tab.add("2 export loads as float32", 0 if next(m2.parameters()).dtype == torch.float32 else 1, 0,
            ok=next(m2.parameters()).dtype == torch.float32)
    xv = val_windows(toks, B * EVAL_BATCHES).to(a.hf_device)
    with torch.no_grad():
        tot = 0.0
        for b in range(EVAL_BATCHES):
            w = xv[b * B:(b + 1) * B]
            tot += m2(input_ids=w, labels=w).loss.item()
        hf_val = tot / EVAL_BATCHES
        o2 = m2(input_ids=x_win, labels=x_win)
        o2_aux = m2(input_ids=x_win[:, :T], output_router_logits=True)
    moe_val = float(meta2["val_loss"])
    tab.add(f"2 trained: val loss ({EVAL_BATCHES}x{B}x{T} tokens), rel", abs(moe_val - hf_val) / hf_val, tol,
            note=f"moe {moe_val:.7f} hf {hf_val:.7f}")
    lg2 = o2.logits[:, :T].float().cpu()
    tab.add("2 trained: logits of the first batch, rel L2", rel(dump2["logits"], lg2), tol,
            note=f"max |diff| {(dump2['logits'] - lg2).abs().max().item():.2e}")
    hf_aux = o2_aux.aux_loss.item()
    tab.add("2 trained: aux loss, HF form vs output_router_logits, rel", abs(float(meta2["aux_loss_hf"]) - hf_aux) /
            hf_aux, tol, note=f"moe {float(meta2['aux_loss_hf']):.7f} hf {hf_aux:.7f} "
                              f"(moe per-layer form {float(meta2['aux_loss']):.7f})")
    moe_cfg = json.load(open(os.path.join(hf2, "config.json"))).get("moe_c", {})
    if moe_cfg.get("aux_form") == "hf":   # the logged aux is then HF's form itself
        tab.add("2 trained: logged aux_loss (aux_form hf) vs HF, rel", abs(float(meta2["aux_loss"]) - hf_aux) / hf_aux,
                tol)

    # ---- 3. gradients ----
    grad_checks(tab, "random model", dump, m1, x_win, f, tol)
    grad_checks(tab, "trained model", dump2, m2, x_win, f, tol)
    # with the aux term: cross-entropy + coef * aux over the same B x T tokens, aux in the form the
    # trained model uses (transformers' pooled form once moe.c has --aux-form hf; until then moe.c's
    # per-layer form, written in torch on top of transformers' router logits)
    form = "hf" if moe_cfg.get("aux_form") == "hf" else "layer"
    coef = ARCH["router_aux_loss_coef"]
    d3 = os.path.join(work, "dump_trained_aux.safetensors")
    run([moe, "eval", "--ckpt", run_dir, "--data", os.path.join(work, "text32.bin"), "--batch", str(B),
         "--seq-len", str(T), "--eval-batches", "1", "--dump", d3, "--dump-grads", "--aux-coef", str(coef),
         "--z-coef", "0"] + dev, os.path.join(work, "eval_trained_aux.log"))
    dump3, _ = load_dump(d3)
    grad_checks(tab, f"trained model, CE + {coef} aux ({form} form)", dump3, m2, x_win, f, tol, aux_coef=coef,
                aux_form=form)

    ok = tab.print()
    if not a.keep and not a.workdir:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"files kept in {work}")
    print("verify_hf:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
