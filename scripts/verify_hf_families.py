#!/usr/bin/env python3
"""verify_hf_families.py — prove moe.c's OLMoE, Qwen2-MoE and Qwen3-MoE against Hugging Face transformers
(issue 17), as scripts/verify_hf.py does for Mixtral. Holds: the checks and their tolerances; must not hold:
anything CI needs (CI does not install torch or transformers; tests/test_families.sh checks the families'
files and shapes without them).

    python3 scripts/verify_hf_families.py build/moe [--moe-device cpu|cuda-fp32|cuda] [--tol T]
                                          [--families olmoe,qwen2_moe,qwen2_moe_dense,qwen3_moe_dense,qwen3_moe]
                                          [--keep]
                                          [--train-launch "mpirun -np 2" --train-args "--tp 2"]

Needs torch, transformers (5.x: the fused in-memory expert layout is handled; 4.x's per-expert modules too)
and safetensors. For each family:
  1. transformers builds a small random model (2 layers, 4 experts top-2, GQA 4/2; Qwen3-MoE with head_dim
     != hidden / heads; qwen2_moe_dense: 6 layers, 4 of them dense MLPs by decoder_sparse_step 2 and
     mlp_only_layers; qwen3_moe_dense: layers 0 and 2 of 4 by mlp_only_layers; for both the HF aux loss over
     the MoE layers is checked too), every weight moved off its init (norm weights off 1, biases off 0) and saves it;
     `moe eval --ckpt HF_DIR --dump --dump-grads` on a fixed batch: logits, loss and router probabilities
     against transformers' (relative L2), and every tensor's gradient of the mean cross-entropy.
  2. `moe train --init-from HF_DIR` trains a few steps, `moe export` writes the family's directory,
     transformers loads it (its class, no missing/unexpected/mismatched keys, float32) and reproduces moe.c's
     validation loss over the same windows. With --train-launch/--train-args that training runs on a mesh
     (e.g. OLMoE's full-width QK-norm split over TP ranks); the export and the evaluation stay one process.
Every moe command that runs a backend is given --device explicitly. Prints a PASS/FAIL table; exit 0 only if
every check passes.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    from verify_hf import Table, corpus_tokens, load_dump, rel, run, val_windows, write_shard
    import verify_hf
except ImportError as e:  # pragma: no cover
    print(f"verify_hf_families: needs torch, transformers and safetensors ({e})", file=sys.stderr)
    sys.exit(2)

B, T = verify_hf.B, verify_hf.T
EVAL_BATCHES = 2
COMMON = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              num_experts=4, num_experts_per_tok=2, max_position_embeddings=256, rope_theta=10000.0,
              rms_norm_eps=1e-5, router_aux_loss_coef=0.02, initializer_range=0.05, tie_word_embeddings=False)
FAMILIES = {
    # OLMoE: QK-norm over the whole q / k rows, no renormalisation
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", dict(intermediate_size=96, norm_topk_prob=False)),
    # Qwen2-MoE: q/k/v biases, a sigmoid-gated shared expert
    "qwen2_moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                  dict(intermediate_size=80, moe_intermediate_size=48, shared_expert_intermediate_size=80,
                       norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False,
                       qkv_bias=True)),
    # Qwen2-MoE with dense MLP layers (issue 40): decoder_sparse_step 2 makes layers 0, 2, 4 dense,
    # mlp_only_layers layer 5; the MoE layers are 1 and 3; the dense MLPs' width is intermediate_size
    "qwen2_moe_dense": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM",
                        dict(num_hidden_layers=6, intermediate_size=72, moe_intermediate_size=48,
                             shared_expert_intermediate_size=80, norm_topk_prob=False, decoder_sparse_step=2,
                             mlp_only_layers=[5], use_sliding_window=False, qkv_bias=True)),
    # Qwen3-MoE with dense layers: mlp_only_layers [0, 2] of 4 (decoder_sparse_step 1)
    "qwen3_moe_dense": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                        dict(num_hidden_layers=4, intermediate_size=72, moe_intermediate_size=48, head_dim=24,
                             norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[0, 2],
                             use_sliding_window=False, attention_bias=False)),
    # Qwen3-MoE: per-head QK-norm, head_dim 24 != 64 / 4, renormalised top-k
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM",
                  dict(intermediate_size=80, moe_intermediate_size=48, head_dim=24, norm_topk_prob=True,
                       decoder_sparse_step=1, mlp_only_layers=[], use_sliding_window=False, attention_bias=False)),
    # DeepSeek-V3 (issue 40): multi-head latent attention with q_lora_rank (q_a, its norm, q_b), the latent and
    # its norm, the shared rope key in DeepSeek's interleaved layout, value heads (12) narrower than the
    # query/key heads (16 + 8), YaRN (factor 4 over 64 original positions: the correction range over the 4
    # pairs; attention factor mscale / mscale_all_dim != 1, the softmax scale times mscale_all_dim's squared);
    # sigmoid routing over 8 experts in 4 groups of which 2 are chosen, scaled by 2.5, renormalised, with the
    # score-correction bias (moved off 0); a shared expert; the first layer dense (first_k_dense_replace 1)
    "deepseek_v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                    dict(num_hidden_layers=3, num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=24,
                         n_routed_experts=8, n_shared_experts=1, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                         qk_nope_head_dim=16, v_head_dim=12, n_group=4, topk_group=2, routed_scaling_factor=2.5,
                         first_k_dense_replace=1, norm_topk_prob=True, rope_interleave=True,
                         rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                              original_max_position_embeddings=64, beta_fast=32.0, beta_slow=1.0,
                                              mscale=1.0, mscale_all_dim=0.8))),
    # DeepSeek-V3 without q_lora_rank (q_proj), rotate_half RoPE (rope_interleave false), no groups, unscaled
    # weights without renormalisation, 2 shared experts, no dense layer, value heads as wide as the query/key
    "deepseek_v3_qproj": ("DeepseekV3Config", "DeepseekV3ForCausalLM",
                          dict(num_hidden_layers=2, num_key_value_heads=4, intermediate_size=96,
                               moe_intermediate_size=24, n_routed_experts=4, n_shared_experts=2, kv_lora_rank=16,
                               q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=1,
                               topk_group=1, routed_scaling_factor=1.0, first_k_dense_replace=0,
                               norm_topk_prob=False, rope_interleave=False)),
}


def make_config(cls_name, kw):
    cls = getattr(transformers, cls_name)
    if cls_name == "DeepseekV3Config":   # its expert count is n_routed_experts; YaRN's theta in rope_parameters
        kw = {k: v for k, v in kw.items() if k != "num_experts" and not (k == "rope_theta" and "rope_parameters" in kw)}
    try:
        return cls(**kw)
    except TypeError:   # a key this transformers version does not take (e.g. qkv_bias before 5.x)
        kw = {k: v for k, v in kw.items() if k not in ("qkv_bias",)}
        return cls(**kw)


def hf_grad(params, name):
    """The HF gradient of our tensor `name` (the family's per-expert names), in transformers' in-memory
    layout: per-expert modules (4.x) or fused experts.gate_up_proj (E, 2f, d) / down_proj (E, d, f) (5.x)."""
    if name in params:
        return params[name].grad
    p = name.split(".")   # model.layers.L.mlp.experts.E.{gate,up,down}_proj.weight
    if len(p) == 8 and p[3] == "mlp" and p[4] == "experts":
        base, e, w = f"model.layers.{p[2]}.mlp.experts.", int(p[5]), p[6]
        if w in ("gate_proj", "up_proj") and base + "gate_up_proj" in params:
            g = params[base + "gate_up_proj"].grad[e]
            if g is None:
                return None
            if g.shape[0] == COMMON["hidden_size"]:   # (d, 2f): transposed storage
                g = g.t()
            f = g.shape[0] // 2
            return g[:f] if w == "gate_proj" else g[f:]
        if w == "down_proj" and base + "down_proj" in params:
            g = params[base + "down_proj"].grad[e]
            if g is not None and g.shape[0] != COMMON["hidden_size"]:
                g = g.t()
            return g
    raise KeyError(f"no HF parameter for {name}")


def router_probs(x):
    """Router outputs as probabilities: transformers 5's Qwen routers record the softmax already."""
    x = x.float()
    if (x >= 0).all() and torch.allclose(x.sum(-1), torch.ones(x.shape[:-1]), atol=1e-4):
        return x
    return torch.softmax(x, dim=-1)


def check_family(tab, fam, moe, work, dev, tol, hf_device, steps, toks, launch=(), train_args=()):
    cfg_name, cls_name, extra = FAMILIES[fam]
    cfg = make_config(cfg_name, dict(COMMON, **extra))
    torch.manual_seed(1)
    model = getattr(transformers, cls_name)(cfg).to(torch.float32)
    with torch.no_grad():   # every weight off its init: norm weights off 1, biases off 0
        for n, p in model.named_parameters():
            p.add_(torch.randn_like(p) * (0.2 if p.dim() == 1 else 0.02))
        for n, b in model.named_buffers():   # DeepSeek-V3's score-correction bias (a buffer): off 0
            if n.endswith("e_score_correction_bias"):
                b.copy_(torch.randn_like(b) * 0.05)
    hf1 = os.path.join(work, f"{fam}_random")
    model.save_pretrained(hf1)
    d1 = os.path.join(work, f"{fam}_dump.safetensors")
    data16, data32 = os.path.join(work, "text16.bin"), os.path.join(work, "text32.bin")
    run([moe, "eval", "--ckpt", hf1, "--data", data16, "--batch", str(B), "--seq-len", str(T), "--eval-batches", "1",
         "--dump", d1, "--dump-grads", "--aux-coef", "0", "--z-coef", "0"] + dev, os.path.join(work, f"{fam}_eval.log"))
    dump, meta = load_dump(d1)
    m1, _ = verify_hf.hf_load(hf1, hf_device)
    x_win = val_windows(toks, B).to(hf_device)
    tab.add(f"{fam} 1 batch tokens = moe.c's", 0.0 if torch.equal(dump["tokens"].long(), x_win[:, :T].cpu()) else 1.0, 0.0)
    m1.zero_grad(set_to_none=True)
    # the mean cross-entropy of the T targets, from the logits (with output_router_logits transformers would
    # add its aux loss to .loss)
    o = m1(input_ids=x_win, output_router_logits=True)
    V = o.logits.shape[-1]
    loss = torch.nn.functional.cross_entropy(o.logits[:, :T].float().reshape(-1, V), x_win[:, 1:].reshape(-1))
    loss.backward()
    o.loss = loss
    lg = o.logits[:, :T].detach().float().cpu()
    tab.add(f"{fam} 1 random model: logits, rel L2", rel(dump["logits"], lg), tol,
            note=f"max |diff| {(dump['logits'] - lg).abs().max().item():.2e}")
    tab.add(f"{fam} 1 random model: loss, rel", abs(float(meta["loss"]) - o.loss.item()) / o.loss.item(), tol,
            note=f"moe {float(meta['loss']):.7f} hf {o.loss.item():.7f}")
    L = cfg.num_hidden_layers
    # the MoE layers (transformers' rule for Qwen: not in mlp_only_layers, (l + 1) % decoder_sparse_step == 0);
    # transformers lists router logits for those only (or None for the dense ones)
    step, only = getattr(cfg, "decoder_sparse_step", 1) or 1, set(getattr(cfg, "mlp_only_layers", []) or [])
    fk = getattr(cfg, "first_k_dense_replace", 0) or 0   # DeepSeek-V3: the first layers dense
    moe_layers = [l for l in range(L) if l not in only and (l + 1) % step == 0 and l >= fk]
    touched = set()   # (layer, expert) whose tokens differ from transformers' by a top-k choice
    if o.router_logits is not None:
        worst, flips, rows = 0.0, 0, 0
        k = cfg.num_experts_per_tok
        rls = [r for r in o.router_logits if r is not None]
        tab.add(f"{fam} 1 random model: router outputs for the {len(moe_layers)} MoE layers", abs(len(rls) - len(moe_layers)), 0)
        for i, l in enumerate(moe_layers):
            ours = torch.softmax(dump[f"router_logits.{l}"].float(), dim=-1)
            theirs = router_probs(rls[i].detach().cpu())
            theirs = theirs.reshape(B, T + 1, -1)[:, :T].reshape(ours.shape) if theirs.numel() != ours.numel() else theirs.reshape(ours.shape)
            worst = max(worst, rel(ours, theirs))
            # the top-k choice is discrete: where two probabilities are closer than the precision of the
            # run (bf16 operands: ~1e-2 of a logit), the two sides may pick different experts for a token
            a = ours.topk(k, dim=-1).indices.sort(-1).values
            b = theirs.topk(k, dim=-1).indices.sort(-1).values
            for r in (a != b).any(-1).nonzero().flatten().tolist():
                flips += 1
                touched.update((l, e) for e in set(a[r].tolist()) ^ set(b[r].tolist()))
            rows += a.shape[0]
        tab.add(f"{fam} 1 random model: router probabilities, rel L2 (max layer)", worst, tol)
        # float32 runs must make every choice alike; bf16 ones may flip a few near-ties (at most 2%)
        allowed = 0.0 if tol < 1e-3 else 0.02
        tab.add(f"{fam} 1 random model: top-k choices unlike transformers', fraction of {rows}", flips / rows, allowed,
                note=f"{flips} tokens; experts touched (layer, expert): {sorted(touched)}" if flips else "")
    if len(moe_layers) < L and not fam.startswith("deepseek"):   # HF's aux loss over the MoE layers' router
        # outputs (dense ones have none; transformers' DeepseekV3 computes no aux loss)
        with torch.no_grad():
            o_aux = m1(input_ids=x_win[:, :T], output_router_logits=True)
        tab.add(f"{fam} 1 random model: aux (HF form, MoE layers), rel",
                abs(float(meta["aux_loss_hf"]) - o_aux.aux_loss.item()) / o_aux.aux_loss.item(), tol,
                note=f"moe {float(meta['aux_loss_hf']):.7f} hf {o_aux.aux_loss.item():.7f}")
    # gradients of transformers' loss over the T+1 window = the mean cross-entropy of our T targets
    params = dict(m1.named_parameters())
    lines = []
    for k, g in dump.items():
        if not k.startswith("grad."):
            continue
        name = k[5:]
        if name.endswith("e_score_correction_bias"):   # a buffer in transformers: no gradient on either side
            tab.add(f"{fam} 1 routing bias {name} has no gradient", g.abs().max().item(), 0)
            continue
        gh = hf_grad(params, name)
        gh = torch.zeros_like(g) if gh is None else gh.detach().cpu()
        if tuple(gh.shape) != tuple(g.shape):
            tab.add(f"{fam} 1 grad shape {name}", math.inf, tol, ok=False)
            continue
        lines.append((name, rel(g, gh), gh.norm().item()))
    # a flipped choice moves a whole token between two experts: their weights' gradients and the layer's
    # router gradient then differ by that token's share (a discrete jump, not a rounding error), so those
    # tensors are listed but not held to the band; every other tensor is
    def flipped(name):
        p = name.split(".")
        return len(p) > 4 and p[3] == "mlp" and p[2].isdigit() and (
            (p[4] == "gate" and any(l == int(p[2]) for l, _ in touched)) or
            (p[4] == "experts" and len(p) > 5 and p[5].isdigit() and (int(p[2]), int(p[5])) in touched))
    print(f"\n{fam}: per-tensor gradient ||g_moe - g_hf|| / ||g_hf|| ({len(lines)} tensors)")
    for name, r, n in lines:
        print(f"  {name:<60} {r:9.2e}  (||g_hf|| {n:.3e}){'  [a top-k choice flipped]' if flipped(name) else ''}")
    held = [x for x in lines if not flipped(x[0])]
    name, r, _ = max(held, key=lambda x: x[1])
    nf = len(lines) - len(held)
    tab.add(f"{fam} 1 random model: grad, max over {len(held)} tensors" + (f" ({nf} apart: flipped choices)" if nf else ""),
            r, tol, note=name)

    # ---- 2. train from it, export, transformers reproduces the validation loss
    run_dir = os.path.join(work, f"{fam}_run")
    run(list(launch) + [moe, "train", "--init-from", hf1, "--data", data32, "--out", run_dir, "--steps", str(steps),
         "--batch", str(B), "--seq-len", str(T), "--lr", "3e-3", "--warmup", "2", "--eval-every", "0", "--eval-batches",
         str(EVAL_BATCHES), "--plots", "0", "--sample-tokens", "0", "--quiet", "--force"] + dev + list(train_args),
        os.path.join(work, f"{fam}_train.log"))
    hf2 = os.path.join(work, f"{fam}_exported")
    run([moe, "export", "--ckpt", run_dir, "--out", hf2], os.path.join(work, f"{fam}_export.log"))
    d2 = os.path.join(work, f"{fam}_dump2.safetensors")
    run([moe, "eval", "--ckpt", run_dir, "--data", data32, "--batch", str(B), "--seq-len", str(T), "--eval-batches",
         str(EVAL_BATCHES), "--dump", d2, "--aux-coef", "0", "--z-coef", "0"] + dev, os.path.join(work, f"{fam}_eval2.log"))
    _, meta2 = load_dump(d2)
    m2, info = verify_hf.hf_load(hf2, hf_device)
    bad = {k: info.get(k, []) for k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    nbad = sum(len(v) for v in bad.values())
    tab.add(f"{fam} 2 export loads: missing/unexpected/mismatched keys", nbad, 0, ok=nbad == 0,
            note=f"{type(m2).__name__}" + (f" {bad}" if nbad else ""))
    tab.add(f"{fam} 2 export is {cls_name}, float32", 0, 0,
            ok=type(m2).__name__ == cls_name and next(m2.parameters()).dtype == torch.float32)
    xv = val_windows(toks, B * EVAL_BATCHES).to(hf_device)
    with torch.no_grad():
        hf_val = sum(m2(input_ids=xv[b * B:(b + 1) * B], labels=xv[b * B:(b + 1) * B]).loss.item()
                     for b in range(EVAL_BATCHES)) / EVAL_BATCHES
    moe_val = float(meta2["val_loss"])
    tab.add(f"{fam} 2 trained+exported: val loss, rel", abs(moe_val - hf_val) / hf_val, tol,
            note=f"moe {moe_val:.7f} hf {hf_val:.7f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("moe", help="path of the moe binary (build/moe)")
    ap.add_argument("--workdir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--moe-device", default="cpu", help="moe --device (cpu, cuda-fp32, cuda)")
    ap.add_argument("--hf-device", default="cpu")
    ap.add_argument("--tol", type=float, default=None, help="default 1e-4 (float32); e.g. 3e-2 for --moe-device cuda")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--train-launch", default="", help='part 2\'s training under a launcher, e.g. "mpirun -np 2"')
    ap.add_argument("--train-args", default="", help='more flags for part 2\'s training, e.g. "--tp 2"')
    a = ap.parse_args()
    moe = os.path.abspath(a.moe)
    tol = a.tol if a.tol is not None else 1e-4
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    work = a.workdir or tempfile.mkdtemp(prefix="verify_hf_families_")
    os.makedirs(work, exist_ok=True)
    print(f"verify_hf_families: moe {moe} (--device {a.moe_device}), torch {torch.__version__}, transformers "
          f"{transformers.__version__}, work dir {work}")
    toks = corpus_tokens(1 << 18)
    write_shard(os.path.join(work, "text16.bin"), toks, uint32=False)
    write_shard(os.path.join(work, "text32.bin"), toks, uint32=True)
    tab = Table()
    for fam in a.families.split(","):
        try:
            check_family(tab, fam, moe, work, ["--device", a.moe_device], tol, a.hf_device, a.steps, toks,
                         a.train_launch.split(), a.train_args.split())
        except SystemExit:   # a moe command failed (verify_hf.run printed its log)
            tab.add(f"{fam}: moe commands ran", math.inf, tol, ok=False)
        except Exception as e:   # one family's failure must not hide the others' results
            tab.add(f"{fam}: ran", math.inf, tol, ok=False, note=f"{type(e).__name__}: {e}"[:200])
    ok = tab.print()
    if not a.keep and not a.workdir:
        shutil.rmtree(work, ignore_errors=True)
    print("verify_hf_families:", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
