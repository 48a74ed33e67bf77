# verify_upcycle.py MOE_BIN [--device cpu] — upcycling against transformers (verification only, never at
# run time): a random dense LlamaForCausalLM saved by transformers, `moe train --init-from DIR --upcycle 4
# --top-k 2` (one step at lr 1e-30: the weights stay step 0's), exported, loaded back as transformers'
# MixtralForCausalLM: its logits on random tokens equal the dense Llama's (float32; the renormalised
# top-2 of identical experts is the MLP to rounding). Also the exported tensor names: no missing or
# unexpected keys.
import os, subprocess, sys, tempfile
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MixtralForCausalLM

moe = sys.argv[1]
dev = sys.argv[sys.argv.index("--device") + 1] if "--device" in sys.argv else "cpu"
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                  tie_word_embeddings=False, attention_bias=False, mlp_bias=False)
dense = LlamaForCausalLM(cfg).float().eval()
with tempfile.TemporaryDirectory() as w:
    ld, run, mx = os.path.join(w, "llama"), os.path.join(w, "run"), os.path.join(w, "mix")
    dense.save_pretrained(ld, safe_serialization=True)
    subprocess.run([moe, "train", "--init-from", ld, "--upcycle", "4", "--top-k", "2", "--out", run, "--steps", "1",
                    "--lr", "1e-30", "--warmup", "0", "--batch", "4", "--seq-len", "32", "--device", dev, "--quiet",
                    "--sample-tokens", "0", "--plots", "0", "--eval-every", "0", "--eval-batches", "1"], check=True)
    subprocess.run([moe, "export", "--ckpt", run, "--out", mx], check=True, stdout=subprocess.DEVNULL)
    moe_model, info = MixtralForCausalLM.from_pretrained(mx, dtype=torch.float32, output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    print("loading info:", bad or "no missing or unexpected keys")
    x = torch.randint(0, 256, (3, 48))
    with torch.no_grad():
        a = dense(x).logits
        b = moe_model.eval()(x).logits
    err = ((a - b).abs().max() / a.abs().max()).item()
    print(f"logits: upcycled Mixtral (4 experts, top-2) vs the dense Llama: max |diff| / max |logit| = {err:.3e}")
    ok = err <= 1e-5 and not bad
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)
