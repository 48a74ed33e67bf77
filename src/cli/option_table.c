// option_table.c (cli) — the table of every `moe` option (its flag and JSON key, type, where its value
// lives, the commands that take it, its --help text) and the word sets of the options whose values
// are words. Must not hold: parsing or printing (options.c), a command's checks (cmd_*.c).
#include <stddef.h>
#include "cli/options.h"
#include "model/model.h" // RECOMPUTE_*

#define MO(f) W_MODEL, offsetof(ModelConfig, f), sizeof(((ModelConfig *)0)->f)
#define TO(f) W_TRAIN, offsetof(TrainOptions, f), sizeof(((TrainOptions *)0)->f)
#define CO(f) W_CLI, offsetof(CliOptions, f), sizeof(((CliOptions *)0)->f)
const Opt opts[] = {
    {"preset", O_STR, CO(preset), C_TRAIN | C_INFO | C_PLAN, "named model size: {presets} (default: tiny)"},
    {"config", O_STR, CO(config), C_TRAIN | C_INFO | C_PLAN,
     "JSON file of options (keys as flags, '-' or '_'); flags override it"},
    {"ckpt", O_STR, CO(ckpt), C_SAMPLE | C_EVAL | C_INFO | C_EXPORT,
     "checkpoint directory, a run directory (its newest checkpoint), or a Hugging Face model directory "
     "(required for sample, eval, export; info: default none)"},
    {"init-from", O_STR, CO(init_from), C_TRAIN,
     "start from a Hugging Face model directory: Mixtral, OLMoE, Qwen2-MoE, Qwen3-MoE or DeepSeek-V3 (its "
     "config.json is the model config; default: none)"},
    {"dump", O_STR, CO(dump), C_EVAL,
     "write the first batch's tokens, logits, losses, router logits to this .safetensors (default: none)"},
    {"dump-grads", O_FLAG, CO(dump_grads), C_EVAL,
     "with --dump: also every tensor's gradient after one backward"},
    {"prompt", O_STR, CO(prompt), C_SAMPLE,
     "text to continue, encoded with the checkpoint's tokenizer (--tokenizer), else as bytes (default: "
     "empty: "
     "the tokenizer's EOS, or a newline)"},
    {"tokens", O_INT, CO(tokens), C_SAMPLE, "tokens to generate"},
    {"max-new-tokens", O_INT, CO(tokens), C_SAMPLE, "the same as --tokens"},
    {"temperature", O_FLOAT, CO(temperature), C_SAMPLE, "sampling temperature (0 = greedy)"},
    {"top-k", O_INT, CO(top_k), C_SAMPLE, "draw from the k most likely tokens only (0 = all)"},
    {"top-p", O_FLOAT, CO(top_p), C_SAMPLE,
     "then from the smallest set of most likely tokens holding this probability, in (0, 1] (1 = all)"},
    {"window", O_INT, CO(window), C_SAMPLE,
     "context positions; past them the context slides to its last half (default: the run's --seq-len from "
     "its "
     "run.json; else min(max_seq_len, 256))"},
    {"kv-cache", O_INT, CO(kv_cache), C_SAMPLE,
     "1: decode with a KV cache; 0: run the whole context again for each token"},
    {"device", O_STR, TO(device), C_TRAIN | C_SAMPLE | C_EVAL,
     "cpu | cuda (bf16 GEMMs) | cuda-fp32 | auto (default: cuda when a GPU is present)"},
    // model
    {"vocab-size", O_INT, MO(vocab_size), C_TRAIN | C_INFO | C_PLAN, "vocabulary size"},
    {"d-model", O_INT, MO(d_model), C_TRAIN | C_INFO | C_PLAN, "model width d"},
    {"n-layers", O_INT, MO(n_layers), C_TRAIN | C_INFO | C_PLAN, "transformer layers"},
    {"n-heads", O_INT, MO(n_heads), C_TRAIN | C_INFO | C_PLAN, "attention heads"},
    {"n-kv-heads", O_INT, MO(n_kv_heads), C_TRAIN | C_INFO | C_PLAN,
     "key/value heads (grouped-query attention)"},
    {"head-dim", O_INT, MO(head_dim), C_TRAIN | C_INFO | C_PLAN, "per-head dimension (default d / heads)"},
    {"d-ff", O_INT, MO(d_ff), C_TRAIN | C_INFO | C_PLAN, "expert hidden size f"},
    {"n-experts", O_INT, MO(n_experts), C_TRAIN | C_INFO | C_PLAN, "experts per MoE layer E"},
    {"top-k", O_INT, MO(top_k), C_TRAIN | C_INFO | C_PLAN, "experts per token k"},
    {"max-seq-len", O_INT, MO(max_seq_len), C_TRAIN | C_INFO | C_PLAN, "longest sequence the model supports"},
    {"rope-theta", O_FLOAT, MO(rope_theta), C_TRAIN | C_INFO | C_PLAN, "RoPE base"},
    {"norm-eps", O_FLOAT, MO(norm_eps), C_TRAIN | C_INFO | C_PLAN, "RMSNorm epsilon"},
    {"init-std", O_FLOAT, MO(init_std), C_TRAIN | C_INFO | C_PLAN,
     "init standard deviation of linear weights"},
    {"renormalize", O_INT, MO(renormalize), C_TRAIN | C_INFO | C_PLAN,
     "1: renormalise top-k weights (Mixtral); 0: raw (OLMoE)"},
    {"attn-dropout", O_FLOAT, MO(attention_dropout), C_TRAIN | C_INFO | C_PLAN,
     "dropout on the attention probabilities in training, in [0, 1) (HF attention_dropout)"},
    {"jitter", O_FLOAT, MO(jitter), C_TRAIN | C_INFO | C_PLAN,
     "router input jitter j: x *= U(1-j, 1+j) in training"},
    {"aux-coef", O_FLOAT, MO(aux_coef), C_TRAIN | C_INFO | C_PLAN | C_EVAL,
     "load-balancing loss coefficient (eval: of --dump-grads)"},
    {"z-coef", O_FLOAT, MO(z_coef), C_TRAIN | C_INFO | C_PLAN | C_EVAL,
     "router z-loss coefficient (eval: of --dump-grads)"},
    {"aux-form", O_AUXFORM, MO(aux_form), C_TRAIN | C_INFO | C_PLAN,
     "layer: per-layer aux loss, averaged; hf: HF Mixtral's one loss over all layers"},
    {"dispatch", O_DISPATCH, MO(dispatch), C_TRAIN | C_INFO | C_PLAN, "dropless | capacity"},
    {"capacity-factor", O_FLOAT, MO(capacity_factor), C_TRAIN | C_INFO | C_PLAN,
     "capacity = ceil(cf * tokens * k / E)"},
    {"family", O_FAMILY, MO(family), C_TRAIN | C_INFO | C_PLAN,
     "the transformers architecture (tensor names, config.json, export): Mixtral, OLMoE, Qwen2-MoE, "
     "Qwen3-MoE, DeepSeek-V3"},
    {"qk-norm", O_QKNORM, MO(qk_norm), C_TRAIN | C_INFO | C_PLAN,
     "RMSNorm on q and k before RoPE: full (OLMoE: over all heads) or head (Qwen3-MoE: per head)"},
    {"qkv-bias", O_INT, MO(qkv_bias), C_TRAIN | C_INFO | C_PLAN,
     "1: q, k, v projections with biases (Qwen2-MoE)"},
    {"n-shared-experts", O_INT, MO(n_shared_experts), C_TRAIN | C_INFO | C_PLAN,
     "shared experts every token passes through (Qwen2-MoE: 1)"},
    {"shared-d-ff", O_INT, MO(shared_d_ff), C_TRAIN | C_INFO | C_PLAN, "each shared expert's hidden size"},
    {"shared-gate", O_INT, MO(shared_gate), C_TRAIN | C_INFO | C_PLAN,
     "1: the shared experts' output scaled by a sigmoid gate per token (Qwen2-MoE)"},
    {"dense-layers", O_LAYERS, MO(dense_layers), C_TRAIN | C_INFO | C_PLAN,
     "layers whose FFN is one dense SwiGLU MLP instead of experts, e.g. 0 or 0-2,7 (DeepSeek's "
     "first_k_dense_replace, Qwen's mlp_only_layers); none: every layer an MoE layer"},
    {"dense-d-ff", O_INT, MO(dense_d_ff), C_TRAIN | C_INFO | C_PLAN,
     "the dense layers' MLP hidden size (HF intermediate_size); 0 without dense layers"},
    {"route-sigmoid", O_INT, MO(route_sigmoid), C_TRAIN | C_INFO | C_PLAN,
     "1: router scores sigmoid(logits) (DeepSeek-V3; needs --z-coef 0), the aux loss over each token's "
     "scores "
     "normalised; 0: softmax"},
    {"n-group", O_INT, MO(n_group), C_TRAIN | C_INFO | C_PLAN,
     "group-limited routing (DeepSeek-V3): the experts in this many groups (0 or 1: none)"},
    {"topk-group", O_INT, MO(topk_group), C_TRAIN | C_INFO | C_PLAN,
     "... of which a token's experts come from the groups with the highest sum of their two best scores"},
    {"route-scale", O_FLOAT, MO(route_scale), C_TRAIN | C_INFO | C_PLAN,
     "routed_scaling_factor: the routed experts' weights times this (0: 1)"},
    {"q-lora-rank", O_INT, MO(q_lora_rank), C_TRAIN | C_INFO | C_PLAN,
     "latent attention: the queries' low rank (q_a_proj, its norm, q_b_proj); 0: q_proj"},
    {"kv-lora-rank", O_INT, MO(kv_lora_rank), C_TRAIN | C_INFO | C_PLAN,
     "> 0: multi-head latent attention (DeepSeek-V2/V3) with keys and values through a latent of this rank "
     "(needs --n-kv-heads = --n-heads, --head-dim = --qk-rope-head-dim); 0: GQA"},
    {"qk-nope-head-dim", O_INT, MO(qk_nope_head_dim), C_TRAIN | C_INFO | C_PLAN,
     "latent attention: each head's query/key width without RoPE"},
    {"rope-interleave", O_INT, MO(rope_interleave), C_TRAIN | C_INFO | C_PLAN,
     "latent attention: 1: RoPE rotates the pairs (2j, 2j+1) of the rope parts (DeepSeek's layout); 0: "
     "rotate_half's"},
    {"qk-rope-head-dim", O_INT, MO(qk_rope_head_dim), C_TRAIN | C_INFO | C_PLAN,
     "latent attention: the RoPE part of each query head and of the key shared by the heads"},
    {"v-head-dim", O_INT, MO(v_head_dim), C_TRAIN | C_INFO | C_PLAN,
     "latent attention: each head's value width"},
    {"rope-factor", O_FLOAT, MO(rope_factor), C_TRAIN | C_INFO | C_PLAN,
     "YaRN RoPE scaling factor (latent attention; 0: none)"},
    {"rope-orig-max", O_INT, MO(rope_orig_max), C_TRAIN | C_INFO | C_PLAN,
     "YaRN: the original max_position_embeddings"},
    {"yarn-beta-fast", O_FLOAT, MO(yarn_beta_fast), C_TRAIN | C_INFO | C_PLAN, "YaRN beta_fast (0: 32)"},
    {"yarn-beta-slow", O_FLOAT, MO(yarn_beta_slow), C_TRAIN | C_INFO | C_PLAN, "YaRN beta_slow (0: 1)"},
    {"yarn-mscale", O_FLOAT, MO(yarn_mscale), C_TRAIN | C_INFO | C_PLAN, "YaRN mscale (0: none)"},
    {"yarn-mscale-all-dim", O_FLOAT, MO(yarn_mscale_all_dim), C_TRAIN | C_INFO | C_PLAN,
     "YaRN mscale_all_dim: the softmax scale times its mscale squared (0: none)"},
    {"balance", O_BALANCE, MO(balance), C_TRAIN | C_INFO | C_PLAN,
     "aux: the load-balancing loss; aux-free: also DeepSeek-V3's per-expert routing bias (top-k choice "
     "only)"},
    {"bias-rate", O_FLOAT, MO(bias_rate), C_TRAIN | C_INFO | C_PLAN,
     "aux-free: the bias update per step, rate * sign(mean load - load)"},
    {"aux-scope", O_AUXSCOPE, MO(aux_scope), C_TRAIN | C_INFO | C_PLAN,
     "the tokens the aux loss's statistics are over: each micro-batch, each sequence, or the step's global "
     "batch"},
    {"mtp", O_INT, MO(mtp_depth), C_TRAIN | C_INFO | C_PLAN,
     "multi-token prediction modules (DeepSeek-V3's MTP, HF num_nextn_predict_layers): module k predicts "
     "the token k+1 ahead through one more block and the shared LM head (0: none)"},
    {"mtp-weight", O_FLOAT, MO(mtp_weight), C_TRAIN | C_INFO | C_PLAN,
     "with --mtp D: the MTP loss's weight lambda in loss + lambda / D * sum of the modules' losses (default "
     "0.3 with modules)"},
    // training
    {"steps", O_INT, TO(steps), C_TRAIN, "optimizer steps"},
    {"batch", O_INT, TO(batch), C_TRAIN | C_INFO | C_PLAN, "global batch in sequences per step"},
    {"global-batch", O_INT, TO(batch), C_INFO | C_PLAN, "the same as --batch (Megatron's name)"},
    {"batch", O_INT, TO(batch), C_EVAL,
     "sequences per evaluation batch (default: the run's micro-batch, --batch / --grad-accum, from its "
     "run.json; else 16)"},
    {"grad-accum", O_INT, TO(grad_accum), C_TRAIN | C_INFO, "micro-batches per step (info: of the pipeline)"},
    {"grad-accum", O_INT, TO(grad_accum), C_PLAN,
     "micro-batches per step of an --explain layout without microN"},
    {"seq-len", O_INT, TO(seq_len), C_TRAIN | C_INFO | C_PLAN, "tokens per sequence T"},
    {"seq-len", O_INT, TO(seq_len), C_EVAL,
     "tokens per sequence T (default: the run's, from its run.json; else 64)"},
    {"lr", O_FLOAT, TO(lr), C_TRAIN, "peak learning rate"},
    {"min-lr-frac", O_FLOAT, TO(min_lr_frac), C_TRAIN, "final lr as a fraction of --lr (cosine)"},
    {"warmup", O_INT, TO(warmup), C_TRAIN, "linear warmup steps"},
    {"weight-decay", O_FLOAT, TO(weight_decay), C_TRAIN, "AdamW decoupled weight decay (not on norms)"},
    {"beta1", O_FLOAT, TO(beta1), C_TRAIN, "AdamW beta1"},
    {"beta2", O_FLOAT, TO(beta2), C_TRAIN, "AdamW beta2"},
    {"adam-eps", O_FLOAT, TO(adam_eps), C_TRAIN, "AdamW epsilon"},
    {"grad-clip", O_FLOAT, TO(grad_clip), C_TRAIN, "global gradient-norm clip (0 = off)"},
    {"seed", O_U64, TO(seed), C_TRAIN,
     "seed for init, data order, jitter, the end-of-run sample (and the embedded corpus)"},
    {"seed", O_U64, TO(seed), C_SAMPLE, "seed of the sampler's random draws"},
    {"seed", O_U64, TO(seed), C_EVAL,
     "the embedded corpus's seed for a Hugging Face model (a checkpoint of ours uses the seed it was trained "
     "with)"},
    {"eval-every", O_INT, TO(eval_every), C_TRAIN, "steps between validation evaluations"},
    {"eval-batches", O_ALLINT, TO(eval_batches), C_TRAIN,
     "validation micro-batches per evaluation, or all (a request beyond the set is clipped to it, and says "
     "so)"},
    {"eval-batches", O_ALLINT, TO(eval_batches), C_EVAL,
     "validation batches, or all; clipped to the set (default: the run's, from run.json beside the "
     "checkpoint; else 8)"},
    {"save-every", O_INT, TO(save_every), C_TRAIN,
     "steps between checkpoints (0 = at the end only, -1 = never)"},
    {"keep", O_INT, TO(keep), C_TRAIN, "checkpoints kept (0 = all)"},
    {"keep-best", O_FLAG, TO(keep_best), C_TRAIN,
     "also keep the checkpoint of the lowest validation loss in OUT/best (never pruned; replaced "
     "atomically)"},
    {"dropout", O_FLOAT, TO(dropout), C_TRAIN,
     "dropout probability in training, in [0, 1): on the attention output and the MoE output before each "
     "residual add"},
    {"embed-dropout", O_FLOAT, TO(embed_dropout), C_TRAIN,
     "dropout probability on the token embeddings in training, in [0, 1) (nanoGPT drops there too; --dropout "
     "leaves them)"},
    {"sample-tokens", O_INT, TO(sample_tokens), C_TRAIN, "tokens sampled at the end of training"},
    {"plots", O_INT, TO(plots), C_TRAIN, "1: write loss.png and expert_load.png"},
    {"tensorboard", O_INT, TO(tensorboard), C_TRAIN,
     "1: write TensorBoard scalar event files (events.out.tfevents.*) in the run directory"},
    {"mfu-peak", O_FLOAT, TO(mfu_peak), C_TRAIN,
     "one device's peak TFLOP/s for the MFU of the progress lines and TensorBoard (model FLOPs / (ranks x "
     "peak); 0: the GPU's built-in profile's bf16 dense peak (H100, H200); the cpu has none)"},
    {"quiet", O_FLAG, TO(quiet), C_TRAIN, "no per-step progress lines"},
    {"check-replicas", O_FLAG, TO(check_replicas), C_TRAIN,
     "at the end, check router/dense replicas are bitwise equal on every rank"},
    {"out", O_STR, TO(out), C_TRAIN, "run directory (checkpoints, metrics.jsonl, run.json, plots)"},
    {"out", O_STR, TO(out), C_EXPORT, "the Hugging Face model directory to write (required; no default)"},
    {"data", O_STR, TO(data), C_TRAIN,
     "text file (bytes) or llm.c .bin shards (glob) (default: the embedded corpus; --resume: the run's)"},
    {"data", O_STR, TO(data), C_EVAL,
     "text file or llm.c .bin shards (glob) (default: the run's, from its run.json; else the embedded "
     "corpus)"},
    {"val-frac", O_FLOAT, TO(val_frac), C_TRAIN,
     "the last fraction of --data held out for validation, in (0, 0.5] (the embedded corpus: every 10th "
     "window)"},
    {"val-frac", O_FLOAT, TO(val_frac), C_EVAL,
     "the held-out fraction of --data (default: the run's; else 0.1)"},
    {"val-data", O_STR, TO(val_data), C_TRAIN,
     "a separate validation file (text or shards); then all of --data trains (default: none: --data's tail)"},
    {"val-data", O_STR, TO(val_data), C_EVAL, "a separate validation file (default: the run's; else none)"},
    {"resume", O_FLAG, TO(resume), C_TRAIN, "continue from the newest complete checkpoint in --out"},
    {"data-changed", O_FLAG, TO(data_changed), C_TRAIN,
     "--resume: continue although --data or --val-data differs from what the run trained on (run.json "
     "records their token counts and hashes)"},
    // parallel layout
    {"tp", O_INT, TO(tp), C_TRAIN | C_INFO, "tensor parallel size (attention heads split)"},
    {"ep", O_INT, TO(ep), C_TRAIN | C_INFO, "expert parallel size (carved out of the data-parallel ranks)"},
    {"etp", O_INT, TO(etp), C_TRAIN | C_INFO, "expert tensor parallel size (each expert's f split)"},
    {"loss-chunks", O_INT, TO(loss_chunks), C_TRAIN | C_INFO | C_PLAN,
     "the LM head and its cross-entropy over N chunks of a micro-batch's rows, each chunk's gradient taken "
     "in "
     "the forward (a fused linear cross-entropy: the logits of one chunk at a time instead of every row's, "
     "the head's input gradient kept); 1: the whole logits kept until the backward"},
    {"vocab-parallel", O_INT, TO(vocab_parallel), C_TRAIN | C_INFO | C_PLAN,
     "1: under --tp the embedding and the LM head are split over the TP ranks by vocabulary rows (Megatron's "
     "vocab-parallel layers: each rank 1/TP of both tables, their gradients and moments, and of the logits; "
     "the loss combined over the ranks); 0: both whole on every TP rank"},
    {"pp", O_INT, TO(pp), C_TRAIN | C_INFO, "pipeline stages (the layers split between them)"},
    {"pp-schedule", O_SCHEDULE, TO(pp_schedule), C_TRAIN | C_INFO,
     "the pipeline schedule (micro-batches = --grad-accum, at least --pp)"},
    {"vpp", O_INT, TO(vpp), C_TRAIN | C_INFO, "model chunks per pipeline rank (interleaved schedule)"},
    {"pp-layers", O_STR, TO(pp_layers), C_TRAIN | C_INFO | C_PLAN,
     "layers per pipeline stage, e.g. 5,5,6 (one count per virtual stage; default: an even split; moe plan: "
     "the --explain layout's)"},
    {"a2a-overlap", O_AUTO_INT, TO(a2a_overlap), C_TRAIN,
     "the MoE all-to-all pipelined with the experts over this many chunks (1: off; auto: measured per "
     "layer)"},
    {"upcycle", O_INT, TO(upcycle), C_TRAIN,
     "with --init-from a dense LlamaForCausalLM/MistralForCausalLM: each MLP copied into this many experts "
     "(top-k: --top-k, else 2; routers initialised as new): at step 0 the model computes the dense one "
     "(default: 0, off)"},
    {"recompute", O_RECOMPUTE, TO(recompute), C_TRAIN | C_INFO,
     "activations not kept but computed again in backward: attn (attention output), moe (the experts' SwiGLU "
     "rows, the largest), full (both); the same gradients bit for bit, less memory, more compute"},
    {"recompute-layers", O_INT, TO(recompute_layers), C_TRAIN | C_INFO,
     "--recompute in the first this many layers only, the others keep their activations (Megatron-LM's "
     "block method: memory for a little compute; 0: every layer)"},
    {"ampipe", O_AUTO_INT, TO(ampipe), C_TRAIN | C_INFO,
     "AMPipe: each block from attention on in this many chunks of the micro-batch, so a chunk's attention "
     "runs while another's all-to-all is in flight (1: off; auto: measured per layer with --a2a-overlap)"},
    {"a2a-hier", O_HIER, TO(a2a_hier), C_TRAIN | C_INFO,
     "the EP all-to-all in two levels over nodes of G EP ranks (auto: when the EP group spans hosts)"},
    {"expert-mode", O_EXPERTMODE, TO(expert_mode), C_TRAIN,
     "with --etp > 1: each rank computes its f slice for the group's tokens (sharded), or whole experts "
     "(slices "
     "gathered per layer) for its own tokens (gathered); auto: measured per layer"},
    {"gpu-comm", O_GPUCOMM, TO(gpu_comm), C_TRAIN,
     "how GPU ranks exchange device buffers: nccl (every rank its own GPU), staged (through pinned host "
     "memory and MPI: ranks sharing a GPU, or no NCCL), ipc (every rank on one node: the MoE all-to-all "
     "device to device through CUDA IPC, the rest staged), mpi (device pointers to a CUDA-aware MPI; "
     "refused where the MPI library says it is not), auto (nccl where every rank has its own GPU, else ipc "
     "where every rank is on one node, else staged). Pipeline stages' messages are staged under nccl and "
     "ipc too. On --device "
     "cpu staged, ipc and mpi run the same code over host memory (tests)"},
    {"a2a-retune", O_FLOAT, TO(a2a_retune), C_TRAIN,
     "auto modes: re-measure a layer when its load (busiest expert / mean) moves by this fraction"},
    {"precision", O_PRECISION, TO(precision), C_TRAIN | C_INFO | C_PLAN,
     "mixed: float32 weights and AdamW moments (bf16 GEMM operands on --device cuda); bf16: AdamW moments "
     "stored in bf16 (half their memory), every weight rounded to a bf16 value after each update (on cuda "
     "the GEMMs' weights and the embedding kept in bf16 alone, in one process) and the experts' gradients in "
     "bf16 "
     "(--bf16-grads); fp8: mixed's storage, the experts' GEMMs (forward, input and weight gradients) with "
     "e4m3 operands in DeepSeek-V3's fine-grained scales (1x128 tiles, 128x128 weight blocks) and float32 "
     "sums; fp8-bf16: bf16's storage (moments, rounded weights, the experts' gradients in bf16) with fp8's "
     "expert GEMMs; checkpoints stay float32"},
    {"bf16-rounding", O_ROUNDING, TO(bf16_rounding), C_TRAIN,
     "--precision bf16 (and fp8-bf16): how each updated weight is rounded to bf16: stochastic (unbiased, "
     "seeded by --seed: reproducible), nearest (round to nearest even), or none (the weights stay float32: "
     "only the moments are bf16)"},
    {"bf16-grads", O_INT, TO(bf16_grads), C_TRAIN | C_INFO,
     "--precision bf16 and fp8-bf16: 1: the routed experts' weight gradients are bf16 values (rounded to "
     "nearest even once summed, as the PyTorch peers keep them; in one process with --grad-accum 1 stored in "
     "bf16: half their "
     "bytes written and read); 0: float32"},
    {"fp8-dense", O_INT, TO(fp8_dense), C_TRAIN | C_INFO,
     "--precision fp8 and fp8-bf16: 1: the attention projections (q, k, v, o; latent attention's) in the "
     "same "
     "FP8 recipe as the experts (their input 1x128 tiles, weight 128x128 blocks); the LM head, router, norms "
     "and the attention itself stay as they are"},
    {"fp8-dispatch", O_INT, TO(fp8_dispatch), C_TRAIN | C_INFO | C_PLAN,
     "--precision fp8 and fp8-bf16: 1: the rows sent to the routed experts are rounded to their FP8 values "
     "(1x128 tiles) where they are gathered, and the expert-parallel all-to-all moves them as e4m3 codes and "
     "scale exponents (d + d/128 bytes a row; the hidden format's 2d or 4d): the experts' forward is "
     "unchanged, their weight gradients take the rounded rows (DeepSeek-V3's FP8 dispatch)"},
    {"fp8-weight-cache", O_INT, TO(fp8_weight_cache), C_TRAIN | C_INFO | C_PLAN,
     "--precision fp8 and fp8-bf16 on cuda: 1: each routed expert weight's FP8 codes are kept between the "
     "ops "
     "that read them (quantised once per update: about a byte a weight); 0: quantised at every use, none "
     "kept (less memory, slower; the same bits)"},
    {"fp8-save", O_INT, TO(fp8_save), C_TRAIN | C_INFO | C_PLAN,
     "--precision fp8 and fp8-bf16: 1: the routed experts' SwiGLU inputs are kept for the backward as FP8 "
     "1x128 tiles (fu + fu/128 bytes a row each, where the hidden format keeps h1, h3 and act) and act is "
     "computed again from them (DeepSeek-V3's FP8 activation storage): the forward is unchanged, the "
     "backward takes the FP8 values. Not with --recompute moe"},
    {"fp8-amax-jump", O_INT, TO(fp8_amax_jump), C_TRAIN,
     "--precision fp8 and fp8-bf16: warn when a layer's FP8 operand (x, w1, dy, ...) has an amax this many "
     "powers of two above the largest of every earlier step of the run (a divergence coming; the warning "
     "names the layer and tensor, metrics.jsonl counts them as fp8_amax_jumps; 0: no check)"},
    {"grad-memory", O_GRADMEM, TO(grad_memory), C_TRAIN | C_INFO | C_PLAN,
     "shared: with --grad-accum 1 and no --pp, each layer's expert gradients are written into the memory of "
     "the "
     "next layer's activations (the last layer's: the logits), which its backward has read for the last time "
     "by then: the same bits, about a layer's expert gradients less memory per layer; separate: their own"},
    {"zero", O_INT, TO(zero), C_TRAIN | C_INFO,
     "ZeRO stage: 1 shards AdamW moments, 2 also reduced gradients (over DP / EDP)"},
    {"overlap", O_INT, TO(overlap), C_TRAIN, "1: reduce gradient buckets while backward runs"},
    {"bucket-mb", O_FLOAT, TO(bucket_mb), C_TRAIN, "gradient bucket size cap in MB"},
    {"world", O_INT, CO(world), C_INFO,
     "number of processes to show the mesh and per-rank memory for (default: none: the whole model; with "
     "--tp/--ep/--etp/--pp alone the smallest world that holds them)"},
    {"gpus", O_INT, CO(gpus), C_PLAN, "the GPUs to plan for (required; no default)"},
    {"gpu", O_STR, CO(gpu), C_PLAN,
     "the GPU's profile: a built-in (h200, h100) or a JSON profile file (docs/PLAN.md lists its fields)"},
    {"nodes-of", O_INT, CO(nodes_of), C_PLAN,
     "GPUs per node: a group within one node talks over NVLink, one across nodes over the network"},
    {"top", O_INT, CO(top), C_PLAN, "layouts shown, fastest first"},
    {"explain", O_STR, CO(explain), C_PLAN,
     "one layout's accounting line by line instead of the table, e.g. \"tp2 ep4 pp2 vpp2 zero1 micro8 "
     "recompute-moe\" (words left out: 1, zero 0, recompute none, micro --grad-accum; default: none)"},
    {"imbalance", O_FLOAT, CO(imbalance), C_PLAN,
     "routing headroom: the buffers sized by the rows a rank's experts receive, times this (>= 1)"},
    {"comm-exposed", O_FLOAT, CO(comm_exposed), C_PLAN,
     "the fraction of the communication not hidden behind compute, in [0, 1]"},
    {"hide-a2a", O_STR, CO(hide_a2a), C_PLAN,
     "the EP all-to-all hidden behind compute, per micro-batch: none; experts (our --a2a-overlap: behind the "
     "experts' GEMMs); 1f1b (Megatron-Core's 1F1B overlap: behind the paired micro-batch's compute, in the "
     "schedule's steady phase)"},
    {"hide-tp", O_STR, CO(hide_tp), C_PLAN,
     "the TP collectives hidden behind compute: none; gemm (min(TP, the TP-split layers' GEMMs): TE's "
     "--tp-comm-overlap)"},
    {"hide-pp", O_STR, CO(hide_pp), C_PLAN,
     "the pipeline's sends hidden behind compute: none; next (each behind the action after it, at least a "
     "forward of its chunk: Megatron's --overlap-p2p-comm, interleaved schedules only)"},
    {"hide-dp", O_STR, CO(hide_dp), C_PLAN,
     "the DP gradients hidden behind compute: none; grads (the reduction behind the last micro-batch's "
     "backward: our --overlap 1, Megatron's --overlap-grad-reduce); grads+params (and ZeRO's weight "
     "all-gather behind the first forward: --overlap-param-gather)"},
    {"a2a-links", O_STR, CO(a2a_links), C_PLAN,
     "an EP all-to-all across nodes: flat (every row over the inter-node link), split (the own node's rows "
     "over NVLink beside the rest), deepep (DeepEP: a token's rows for one remote node cross the network "
     "once)"},
    {"combine", O_STR, CO(combine), C_PLAN,
     "the rows the all-to-all sends back (combine, dx): f32 (our exchange) or bf16 (Megatron-Core's)"},
    {"grouped-rate", O_STR, CO(grouped_rate), C_PLAN,
     "the experts' GEMM rate: profile (the profile's at every shape) or shape (scaled to the nearest expert "
     "shape measured in docs/PERFORMANCE.md)"},
    {"memory-model", O_STR, CO(memory_model), C_PLAN,
     "ours (the cuda backend's accounting) or megatron (weights, gradients and optimizer state as "
     "Megatron-Core's distributed optimizer keeps them: 6 + 12 / DP bytes a parameter)"},
    {"internode-gbps", O_FLOAT, CO(internode_gbps), C_PLAN,
     "the inter-node link's rate per GPU and direction, GB/s, in place of the profile's (0: the profile's)"},
    {"overlap-sms", O_INT, CO(overlap_sms), C_PLAN,
     "the SMs of the GPU's 132 an overlapped communication's kernels hold while they run (--hide-*): each "
     "hidden second costs the compute N/132 of a second (default 20: DeepEP's normal kernels)"},
    {"calibrate", O_FLAG, CO(calibrate), C_PLAN,
     "measure this machine at the model's shapes and write a profile (--out; --gpu: the base profile of the "
     "links not measured; with --gpus, plan on it)"},
    {"device", O_STR, TO(device), C_PLAN,
     "--calibrate: the backend to measure: cpu | cuda | cuda-fp32 | auto"},
    {"out", O_STR, TO(out), C_PLAN,
     "--calibrate: the profile file to write (default: print it); --explain: the step's timeline PNG to "
     "draw"},
    {"force", O_FLAG, TO(force), C_TRAIN, "start over in --out, deleting the run there"},
    {"force", O_FLAG, TO(force), C_EXPORT, "replace the directory --out if it exists"},
    // tokenize
    {"tokenizer", O_STR, CO(tokenizer), C_TOKENIZE | C_PREP,
     "a Hugging Face tokenizer.json, or a directory holding one (required, except by prep for Megatron "
     "datasets alone; no default)"},
    {"tokenizer", O_STR, CO(tokenizer), C_SAMPLE | C_EVAL,
     "encode the prompt / text --data and decode with this tokenizer.json (or its directory) (default: the "
     "run's copy beside the checkpoint, RUN/tokenizer/, or a Hugging Face --ckpt's tokenizer.json; else "
     "bytes)"},
    {"tokenizer", O_STR, TO(tokenizer), C_TRAIN,
     "tokenise text --data / --val-data with this tokenizer.json (or its directory) into shards cached in "
     "OUT/data/, and keep a copy in OUT/tokenizer/ for sample and eval (default: --init-from's "
     "tokenizer.json "
     "if it has one, a --resume's copy; else none: text is bytes)"},
    {"in", O_STR, CO(in), C_TOKENIZE,
     "the input: text to encode, or --decode: token ids separated by white space (default: standard input)"},
    {"decode", O_FLAG, CO(decode), C_TOKENIZE, "decode ids to text instead of encoding text"},
    {"skip-special", O_FLAG, CO(skip_special), C_TOKENIZE, "--decode: leave out the special added tokens"},
    {"add-special", O_FLAG, CO(add_special), C_TOKENIZE | C_PREP | C_SAMPLE,
     "encode with the post-processor's special tokens (e.g. a BOS; tokenizers' add_special_tokens=True)"},
    {"stream", O_FLAG, CO(stream), C_TOKENIZE,
     "--decode: through the streaming decoder, one id at a time (each piece written as it completes)"},
    // prep
    {"in", O_PATHS, CO(inputs), C_PREP,
     "input files: plain text (a document each, or --lines), JSON lines (.jsonl/.json/.ndjson), any of them "
     "gzip'd (.gz); a Megatron dataset (PREFIX or PREFIX.idx, its ids copied) (required; no default)"},
    {"out", O_STR, TO(out), C_PREP,
     "the directory to create for the shards, train_NNNNNN.bin and val_NNNNNN.bin (required; no default; it "
     "must "
     "not exist)"},
    {"field", O_STR, CO(field), C_PREP | C_TOKTRAIN, "the text field of each JSON line"},
    {"lines", O_FLAG, CO(lines), C_PREP | C_TOKTRAIN, "plain text: each non-empty line is a document"},
    {"val-docs", O_INT, CO(val_docs), C_PREP, "the first N documents are held out (val_*.bin)"},
    {"shard-tokens", O_INT, CO(shard_tokens), C_PREP, "tokens per shard file at most"},
    {"eos", O_STR, CO(eos), C_PREP,
     "the end-of-document token's text (default: tokenizer_config.json's eos_token, "
     "special_tokens_map.json's, "
     "or config.json's eos_token_id, beside the tokenizer)"},
    // tokenizer train
    {"vocab", O_INT, CO(vocab), C_TOKTRAIN,
     "the vocabulary size: the special tokens, the 256 bytes and one token per merge (required; no default)"},
    {"data", O_PATHS, CO(inputs), C_TOKTRAIN,
     "the text to learn from: plain text, JSON lines (.jsonl/.json/.ndjson), any of them gzip'd "
     "(required; no default)"},
    {"out", O_STR, TO(out), C_TOKTRAIN,
     "a tokenizer.json to write (a name ending in .json), or a directory for tokenizer.json and "
     "tokenizer_config.json (required; no default)"},
    {"special", O_STR, CO(special), C_TOKTRAIN,
     "the special tokens, comma-separated, ids 0..; the first is the EOS"},
};
_Static_assert(sizeof opts / sizeof opts[0] == N_OPTS, "N_OPTS (cli/options.h) is the length of opts");

static const WordSet word_sets[] = {
    {O_DISPATCH, "dropless|capacity", 0, 2, {"dropless", "capacity"}, {DISPATCH_DROPLESS, DISPATCH_CAPACITY}},
    {O_AUXFORM, "layer|hf", 0, 2, {"layer", "hf"}, {AUX_LAYER, AUX_HF}},
    {O_SCHEDULE, "1f1b|interleaved", 0, 2, {"1f1b", "interleaved"}, {SCHED_1F1B, SCHED_INTERLEAVED}},
    {O_EXPERTMODE, "sharded|gathered|auto", 0, 3, {"sharded", "gathered", "auto"}, {0, 1, -1}},
    {O_AUTO_INT, "auto|1|2|4|8", 1, 1, {"auto"}, {0}},
    {O_ALLINT, "N|all", 1, 1, {"all"}, {0}},
    {O_HIER, "auto|off|G", 1, 2, {"auto", "off"}, {-1, 0}},
    {O_FAMILY,
     "mixtral|olmoe|qwen2_moe|qwen3_moe|deepseek_v3",
     0,
     5,
     {"mixtral", "olmoe", "qwen2_moe", "qwen3_moe", "deepseek_v3"},
     {FAM_MIXTRAL, FAM_OLMOE, FAM_QWEN2_MOE, FAM_QWEN3_MOE, FAM_DEEPSEEK_V3}},
    {O_QKNORM, "none|full|head", 0, 3, {"none", "full", "head"}, {QK_NORM_NONE, QK_NORM_FULL, QK_NORM_HEAD}},
    {O_BALANCE, "aux|aux-free", 0, 2, {"aux", "aux-free"}, {BALANCE_AUX, BALANCE_AUX_FREE}},
    {O_RECOMPUTE,
     "none|attn|moe|full",
     0,
     4,
     {"none", "attn", "moe", "full"},
     {RECOMPUTE_NONE, RECOMPUTE_ATTN, RECOMPUTE_MOE, RECOMPUTE_FULL}},
    {O_AUXSCOPE,
     "micro-batch|sequence|global",
     0,
     3,
     {"micro-batch", "sequence", "global"},
     {AUX_SCOPE_MICRO, AUX_SCOPE_SEQ, AUX_SCOPE_GLOBAL}},
    {O_PRECISION,
     "mixed|bf16|fp8|fp8-bf16",
     0,
     4,
     {"mixed", "bf16", "fp8", "fp8-bf16"},
     {PREC_MIXED, PREC_BF16, PREC_FP8, PREC_FP8_BF16}},
    {O_GRADMEM, "shared|separate", 0, 2, {"shared", "separate"}, {GRADMEM_SHARED, GRADMEM_SEPARATE}},
    {O_GPUCOMM,
     "auto|nccl|staged|ipc|mpi",
     0,
     5,
     {"auto", "nccl", "staged", "ipc", "mpi"},
     {GPUCOMM_AUTO, GPUCOMM_NCCL, GPUCOMM_STAGED, GPUCOMM_IPC, GPUCOMM_MPI}},
    {O_ROUNDING,
     "stochastic|nearest|none",
     0,
     3,
     {"stochastic", "nearest", "none"},
     {ROUND_STOCHASTIC, ROUND_NEAREST, ROUND_NONE}},
};
const WordSet *word_set(OptType t) {
    for (size_t k = 0; k < sizeof word_sets / sizeof word_sets[0]; k++)
        if (word_sets[k].type == t) return &word_sets[k];
    return NULL;
}
