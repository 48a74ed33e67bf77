# mixtral1_to_llama.py SRC DST — test helper (python3, standard library only): a Mixtral directory with
# one expert per layer and top-1 routing (which computes exactly a dense SwiGLU MLP: softmax over one
# expert is 1) rewritten as the dense LlamaForCausalLM directory with the same weights: experts.0.w1/w3/w2
# -> mlp.gate_proj/up_proj/down_proj, the router dropped, config.json's MoE keys removed. The bytes of
# every kept tensor are copied unchanged (safetensors: 8-byte header length, JSON header, data).
import json, os, struct, sys

src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
cfg = json.load(open(os.path.join(src, "config.json")))
assert cfg.get("num_local_experts") == 1 and cfg.get("num_experts_per_tok") == 1, "needs a 1-expert top-1 model"
for k in ("num_local_experts", "num_experts_per_tok", "router_aux_loss_coef", "output_router_logits",
          "router_jitter_noise", "moe_c", "sliding_window"):
    cfg.pop(k, None)
cfg["architectures"] = ["LlamaForCausalLM"]
cfg["model_type"] = "llama"
cfg["attention_bias"] = False
cfg["mlp_bias"] = False
json.dump(cfg, open(os.path.join(dst, "config.json"), "w"), indent=2)

with open(os.path.join(src, "model.safetensors"), "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    head = json.loads(f.read(n))
    data = f.read()
rename = {"block_sparse_moe.experts.0.w1": "mlp.gate_proj", "block_sparse_moe.experts.0.w3": "mlp.up_proj",
          "block_sparse_moe.experts.0.w2": "mlp.down_proj"}
out, blobs, off = {}, [], 0
for name, t in head.items():
    if name == "__metadata__":
        out[name] = t
        continue
    if ".block_sparse_moe.gate." in name:
        continue
    new = name
    for a, b in rename.items():
        new = new.replace(a, b)
    assert "block_sparse_moe" not in new, name
    b0, b1 = t["data_offsets"]
    blobs.append(data[b0:b1])
    out[new] = {"dtype": t["dtype"], "shape": t["shape"], "data_offsets": [off, off + (b1 - b0)]}
    off += b1 - b0
h = json.dumps(out).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(os.path.join(dst, "model.safetensors"), "wb") as f:
    f.write(struct.pack("<Q", len(h)))
    f.write(h)
    for b in blobs:
        f.write(b)
