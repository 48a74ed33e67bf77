// main.c — the `moe` command line: subcommands train | sample | eval | info, one option table
// shared by flags (--d-model 128) and JSON config files ({"d_model": 128}). Argument parsing and
// dispatch only: the work is done in train/, model/ and data/.
#include <ctype.h>
#include <limits.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "core/common.h"
#include "core/config.h"
#include "data/data.h"
#include "model/model.h"
#include "parallel/agree.h"
#include "parallel/comm.h"
#include "io/checkpoint.h"
#include "train/dump.h"
#include "train/eval.h"
#include "train/sample.h"
#include "io/hf.h"
#include "train/info.h"
#include "train/options.h"
#include "train/pretrained.h"
#include "train/trainer.h"

enum { C_TRAIN = 1, C_SAMPLE = 2, C_EVAL = 4, C_INFO = 8, C_EXPORT = 16, C_ALL = 31 };
typedef enum {
    O_INT,
    O_FLOAT,
    O_U64,
    O_STR,
    O_FLAG,
    O_DISPATCH,
    O_AUXFORM,
    O_SCHEDULE,
    O_AUTO_INT,
    O_HIER,
    O_EXPERTMODE,
    O_ALLINT,
    O_FAMILY,
    O_QKNORM,
    O_BALANCE,
    O_AUXSCOPE,
    O_RECOMPUTE,
    O_PRECISION,
    O_ROUNDING,
    O_GRADMEM
} OptType;
typedef enum { W_MODEL, W_TRAIN, W_CLI } Where;

typedef struct {
    char preset[64], config[1024], ckpt[1024], prompt[4096], device[16];
    int tokens;
    char init_from[1024]; // train: a Hugging Face model directory to start from
    char dump[1024]; // eval: safetensors file for the first batch's numbers
    int dump_grads;
    int world; // moe info: the world size to lay the mesh out for
    float temperature;
    int top_k, window, kv_cache; // sample
    float top_p;
} CliOptions;

typedef struct {
    const char *name; // flag spelling without "--"; JSON key is the same with '_' for '-'
    OptType type;
    Where where;
    size_t off, size;
    int cmds;
    const char *help; // per command where the commands differ (a name may have one entry per command);
                      // --help appends "(default: X)" from the defaults unless the text says "default"
} Opt;

#define MO(f) W_MODEL, offsetof(ModelConfig, f), sizeof(((ModelConfig *)0)->f)
#define TO(f) W_TRAIN, offsetof(TrainOptions, f), sizeof(((TrainOptions *)0)->f)
#define CO(f) W_CLI, offsetof(CliOptions, f), sizeof(((CliOptions *)0)->f)
static const Opt opts[] = {
    {"preset", O_STR, CO(preset), C_TRAIN | C_INFO,
     "named model size: tiny, small, mixtral-8x7b, mixtral-8x22b, olmoe-1b-7b, peers-ref (default: tiny)"},
    {"config", O_STR, CO(config), C_TRAIN | C_INFO,
     "JSON file of options (keys as flags, '-' or '_'); flags override it"},
    {"ckpt", O_STR, CO(ckpt), C_SAMPLE | C_EVAL | C_INFO | C_EXPORT,
     "checkpoint directory, a run directory (its newest checkpoint), or a Hugging Face model directory "
     "(required for sample, eval, export; info: default none)"},
    {"init-from", O_STR, CO(init_from), C_TRAIN,
     "start from a Hugging Face model directory: Mixtral, OLMoE, Qwen2-MoE or Qwen3-MoE (its config.json is "
     "the model "
     "config; default: none)"},
    {"dump", O_STR, CO(dump), C_EVAL,
     "write the first batch's tokens, logits, losses, router logits to this .safetensors (default: none)"},
    {"dump-grads", O_FLAG, CO(dump_grads), C_EVAL,
     "with --dump: also every tensor's gradient after one backward"},
    {"prompt", O_STR, CO(prompt), C_SAMPLE, "text to continue (byte vocabulary; default: empty, a newline)"},
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
    {"vocab-size", O_INT, MO(vocab_size), C_TRAIN | C_INFO, "vocabulary size"},
    {"d-model", O_INT, MO(d_model), C_TRAIN | C_INFO, "model width d"},
    {"n-layers", O_INT, MO(n_layers), C_TRAIN | C_INFO, "transformer layers"},
    {"n-heads", O_INT, MO(n_heads), C_TRAIN | C_INFO, "attention heads"},
    {"n-kv-heads", O_INT, MO(n_kv_heads), C_TRAIN | C_INFO, "key/value heads (grouped-query attention)"},
    {"head-dim", O_INT, MO(head_dim), C_TRAIN | C_INFO, "per-head dimension (default d / heads)"},
    {"d-ff", O_INT, MO(d_ff), C_TRAIN | C_INFO, "expert hidden size f"},
    {"n-experts", O_INT, MO(n_experts), C_TRAIN | C_INFO, "experts per MoE layer E"},
    {"top-k", O_INT, MO(top_k), C_TRAIN | C_INFO, "experts per token k"},
    {"max-seq-len", O_INT, MO(max_seq_len), C_TRAIN | C_INFO, "longest sequence the model supports"},
    {"rope-theta", O_FLOAT, MO(rope_theta), C_TRAIN | C_INFO, "RoPE base"},
    {"norm-eps", O_FLOAT, MO(norm_eps), C_TRAIN | C_INFO, "RMSNorm epsilon"},
    {"init-std", O_FLOAT, MO(init_std), C_TRAIN | C_INFO, "init standard deviation of linear weights"},
    {"renormalize", O_INT, MO(renormalize), C_TRAIN | C_INFO,
     "1: renormalise top-k weights (Mixtral); 0: raw (OLMoE)"},
    {"attn-dropout", O_FLOAT, MO(attention_dropout), C_TRAIN | C_INFO,
     "dropout on the attention probabilities in training, in [0, 1) (HF attention_dropout; on cuda through "
     "the float32 attention kernels)"},
    {"jitter", O_FLOAT, MO(jitter), C_TRAIN | C_INFO, "router input jitter j: x *= U(1-j, 1+j) in training"},
    {"aux-coef", O_FLOAT, MO(aux_coef), C_TRAIN | C_INFO | C_EVAL,
     "load-balancing loss coefficient (eval: of --dump-grads)"},
    {"z-coef", O_FLOAT, MO(z_coef), C_TRAIN | C_INFO | C_EVAL,
     "router z-loss coefficient (eval: of --dump-grads)"},
    {"aux-form", O_AUXFORM, MO(aux_form), C_TRAIN | C_INFO,
     "layer: per-layer aux loss, averaged; hf: HF Mixtral's one loss over all layers"},
    {"dispatch", O_DISPATCH, MO(dispatch), C_TRAIN | C_INFO, "dropless | capacity"},
    {"capacity-factor", O_FLOAT, MO(capacity_factor), C_TRAIN | C_INFO,
     "capacity = ceil(cf * tokens * k / E)"},
    {"family", O_FAMILY, MO(family), C_TRAIN | C_INFO,
     "the transformers architecture (tensor names, config.json, export): Mixtral, OLMoE, Qwen2-MoE, "
     "Qwen3-MoE"},
    {"qk-norm", O_QKNORM, MO(qk_norm), C_TRAIN | C_INFO,
     "RMSNorm on q and k before RoPE: full (OLMoE: over all heads) or head (Qwen3-MoE: per head)"},
    {"qkv-bias", O_INT, MO(qkv_bias), C_TRAIN | C_INFO, "1: q, k, v projections with biases (Qwen2-MoE)"},
    {"n-shared-experts", O_INT, MO(n_shared_experts), C_TRAIN | C_INFO,
     "shared experts every token passes through (Qwen2-MoE: 1)"},
    {"shared-d-ff", O_INT, MO(shared_d_ff), C_TRAIN | C_INFO, "each shared expert's hidden size"},
    {"shared-gate", O_INT, MO(shared_gate), C_TRAIN | C_INFO,
     "1: the shared experts' output scaled by a sigmoid gate per token (Qwen2-MoE)"},
    {"balance", O_BALANCE, MO(balance), C_TRAIN | C_INFO,
     "aux: the load-balancing loss; aux-free: also DeepSeek-V3's per-expert routing bias (top-k choice "
     "only)"},
    {"bias-rate", O_FLOAT, MO(bias_rate), C_TRAIN | C_INFO,
     "aux-free: the bias update per step, rate * sign(mean load - load)"},
    {"aux-scope", O_AUXSCOPE, MO(aux_scope), C_TRAIN | C_INFO,
     "the tokens the aux loss's statistics are over: each micro-batch, each sequence, or the step's global "
     "batch"},
    // training
    {"steps", O_INT, TO(steps), C_TRAIN, "optimizer steps"},
    {"batch", O_INT, TO(batch), C_TRAIN | C_INFO, "global batch in sequences per step"},
    {"batch", O_INT, TO(batch), C_EVAL,
     "sequences per evaluation batch (default: the run's micro-batch, --batch / --grad-accum, from its "
     "run.json; else 16)"},
    {"grad-accum", O_INT, TO(grad_accum), C_TRAIN | C_INFO, "micro-batches per step (info: of the pipeline)"},
    {"seq-len", O_INT, TO(seq_len), C_TRAIN | C_INFO, "tokens per sequence T"},
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
    {"sample-tokens", O_INT, TO(sample_tokens), C_TRAIN, "tokens sampled at the end of training"},
    {"plots", O_INT, TO(plots), C_TRAIN, "1: write loss.png and expert_load.png"},
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
    // parallel layout
    {"tp", O_INT, TO(tp), C_TRAIN | C_INFO, "tensor parallel size (attention heads split)"},
    {"ep", O_INT, TO(ep), C_TRAIN | C_INFO, "expert parallel size (carved out of the data-parallel ranks)"},
    {"etp", O_INT, TO(etp), C_TRAIN | C_INFO, "expert tensor parallel size (each expert's f split)"},
    {"pp", O_INT, TO(pp), C_TRAIN | C_INFO, "pipeline stages (the layers split between them; cpu backend)"},
    {"pp-schedule", O_SCHEDULE, TO(pp_schedule), C_TRAIN | C_INFO,
     "the pipeline schedule (micro-batches = --grad-accum, at least --pp)"},
    {"vpp", O_INT, TO(vpp), C_TRAIN | C_INFO, "model chunks per pipeline rank (interleaved schedule)"},
    {"pp-layers", O_STR, TO(pp_layers), C_TRAIN | C_INFO,
     "layers per pipeline stage, e.g. 5,5,6 (one count per virtual stage; default: an even split)"},
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
    {"ampipe", O_AUTO_INT, TO(ampipe), C_TRAIN | C_INFO,
     "AMPipe: each block from attention on in this many chunks of the micro-batch, so a chunk's attention "
     "runs while another's all-to-all is in flight (1: off; auto: measured per layer with --a2a-overlap)"},
    {"a2a-hier", O_HIER, TO(a2a_hier), C_TRAIN | C_INFO,
     "the EP all-to-all in two levels over nodes of G EP ranks (auto: when the EP group spans hosts)"},
    {"expert-mode", O_EXPERTMODE, TO(expert_mode), C_TRAIN,
     "with --etp > 1: each rank computes its f slice for the group's tokens (sharded), or whole experts "
     "(slices "
     "gathered per layer) for its own tokens (gathered); auto: measured per layer"},
    {"a2a-retune", O_FLOAT, TO(a2a_retune), C_TRAIN,
     "auto modes: re-measure a layer when its load (busiest expert / mean) moves by this fraction"},
    {"precision", O_PRECISION, TO(precision), C_TRAIN | C_INFO,
     "mixed: float32 weights and AdamW moments (bf16 GEMM operands on --device cuda); bf16: AdamW moments "
     "stored in bf16 (half their memory), every weight rounded to a bf16 value after each update (on cuda "
     "the GEMMs' weights kept in bf16 alone, in one process) and the experts' gradients in bf16 "
     "(--bf16-grads); checkpoints stay float32"},
    {"bf16-rounding", O_ROUNDING, TO(bf16_rounding), C_TRAIN,
     "--precision bf16: how each updated weight is rounded to bf16: stochastic (unbiased, seeded by --seed: "
     "reproducible), nearest (round to nearest even), or none (the weights stay float32: only the moments "
     "are "
     "bf16)"},
    {"bf16-grads", O_INT, TO(bf16_grads), C_TRAIN,
     "--precision bf16: 1: the routed experts' weight gradients are bf16 values (rounded to nearest even "
     "once "
     "summed, as the PyTorch peers keep them; in one process with --grad-accum 1 stored in bf16: half their "
     "bytes written and read); 0: float32"},
    {"grad-memory", O_GRADMEM, TO(grad_memory), C_TRAIN | C_INFO,
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
    {"force", O_FLAG, TO(force), C_TRAIN, "start over in --out, deleting the run there"},
    {"force", O_FLAG, TO(force), C_EXPORT, "replace the directory --out if it exists"},
};
#define N_OPTS ((int)(sizeof opts / sizeof opts[0]))

typedef struct {
    ModelConfig model;
    TrainOptions train;
    CliOptions cli;
    int model_explicit;
    int set[N_OPTS];
} State;

static const char *cmd_name(int cmd) {
    return cmd == C_TRAIN ? "train"
        : cmd == C_SAMPLE ? "sample"
        : cmd == C_EVAL   ? "eval"
        : cmd == C_EXPORT ? "export"
                          : "info";
}

static void *opt_ptr(State *s, const Opt *o) {
    char *base = o->where == W_MODEL ? (char *)&s->model
        : o->where == W_TRAIN        ? (char *)&s->train
                                     : (char *)&s->cli;
    return base + o->off;
}

// Options naming a file or directory: an empty value is a mistake, never "the default".
static int is_path_opt(const char *name) {
    static const char *const paths[] = {"data", "val-data", "out", "ckpt", "config", "init-from", "dump"};
    for (size_t k = 0; k < sizeof paths / sizeof *paths; k++)
        if (!strcmp(name, paths[k])) return 1;
    return 0;
}

// Parse value text into the option; `from` names the source for messages.
// The options whose values are words (and, for some, also a positive integer): each word's value
// (the enums are int-sized), and what --help shows.
typedef struct {
    OptType type;
    const char *usage;
    int int_ok;
    int n;
    const char *w[4];
    int v[4];
} WordSet;
static const WordSet word_sets[] = {
    {O_DISPATCH, "dropless|capacity", 0, 2, {"dropless", "capacity"}, {DISPATCH_DROPLESS, DISPATCH_CAPACITY}},
    {O_AUXFORM, "layer|hf", 0, 2, {"layer", "hf"}, {AUX_LAYER, AUX_HF}},
    {O_SCHEDULE, "1f1b|interleaved", 0, 2, {"1f1b", "interleaved"}, {SCHED_1F1B, SCHED_INTERLEAVED}},
    {O_EXPERTMODE, "sharded|gathered|auto", 0, 3, {"sharded", "gathered", "auto"}, {0, 1, -1}},
    {O_AUTO_INT, "auto|1|2|4|8", 1, 1, {"auto"}, {0}},
    {O_ALLINT, "N|all", 1, 1, {"all"}, {0}},
    {O_HIER, "auto|off|G", 1, 2, {"auto", "off"}, {-1, 0}},
    {O_FAMILY,
     "mixtral|olmoe|qwen2_moe|qwen3_moe",
     0,
     4,
     {"mixtral", "olmoe", "qwen2_moe", "qwen3_moe"},
     {FAM_MIXTRAL, FAM_OLMOE, FAM_QWEN2_MOE, FAM_QWEN3_MOE}},
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
    {O_PRECISION, "mixed|bf16", 0, 2, {"mixed", "bf16"}, {PREC_MIXED, PREC_BF16}},
    {O_GRADMEM, "shared|separate", 0, 2, {"shared", "separate"}, {GRADMEM_SHARED, GRADMEM_SEPARATE}},
    {O_ROUNDING,
     "stochastic|nearest|none",
     0,
     3,
     {"stochastic", "nearest", "none"},
     {ROUND_STOCHASTIC, ROUND_NEAREST, ROUND_NONE}},
};
static const WordSet *word_set(OptType t) {
    for (size_t k = 0; k < sizeof word_sets / sizeof word_sets[0]; k++)
        if (word_sets[k].type == t) return &word_sets[k];
    return NULL;
}

static void set_opt(State *s, int i, const char *val, const char *from) {
    const Opt *o = &opts[i];
    void *p = opt_ptr(s, o);
    char *end;
    errno = 0;
    // numbers: no leading blanks (strtol/strtof would skip them), finite, in range
    int numeric = o->type == O_INT || o->type == O_FLOAT || o->type == O_U64;
    if (numeric && isspace((unsigned char)*val))
        DIE("%s --%s: '%s' is not a%s number", from, o->name, val, o->type == O_FLOAT ? "" : "n integer");
    switch (o->type) {
        case O_INT: {
            long v = strtol(val, &end, 10);
            if (!*val || *end || errno || v < -2147483647L || v > 2147483647L)
                DIE("%s --%s: '%s' is not an integer", from, o->name, val);
            *(int *)p = (int)v;
            break;
        }
        case O_FLOAT: {
            float v = strtof(val, &end);
            if (!*val || *end || errno) DIE("%s --%s: '%s' is not a number", from, o->name, val);
            if (!isfinite(v)) DIE("%s --%s: '%s' is not a finite number", from, o->name, val);
            *(float *)p = v;
            break;
        }
        case O_U64: {
            if (!*val || *val == '-' || *val == '+')
                DIE("%s --%s: '%s' is not a non-negative integer", from, o->name, val);
            unsigned long long v = strtoull(val, &end, 10);
            if (*end || errno) DIE("%s --%s: '%s' is not a non-negative integer", from, o->name, val);
            *(uint64_t *)p = v;
            break;
        }
        case O_STR:
            if (!*val && is_path_opt(o->name))
                DIE("%s --%s: the path is empty%s", from, o->name,
                    !strcmp(o->name, "data") ? " (leave --data out for the "
                                               "embedded corpus)"
                                             : "");
            if (strlen(val) >= o->size)
                DIE("%s --%s: value is too long (max %zu bytes)", from, o->name, o->size - 1);
            strcpy((char *)p, val);
            break;
        case O_FLAG:
            if (!strcmp(val, "1") || !strcmp(val, "true")) *(int *)p = 1;
            else if (!strcmp(val, "0") || !strcmp(val, "false")) *(int *)p = 0;
            else DIE("%s --%s: '%s' is not true/false", from, o->name, val);
            break;
        default: { // a word of the option's set (or, where the set allows, a positive integer)
            const WordSet *ws = word_set(o->type);
            for (int k = 0; k < ws->n; k++)
                if (!strcmp(val, ws->w[k])) {
                    *(int *)p = ws->v[k];
                    goto parsed;
                }
            long v = strtol(val, &end, 10);
            if (ws->int_ok && *val && !*end && !errno && v >= 1 && v <= 2147483647L) {
                *(int *)p = (int)v;
                break;
            }
            char list[128] = "";
            for (int k = 0; k < ws->n; k++)
                snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", k ? ", " : "", ws->w[k]);
            if (ws->int_ok) DIE("%s --%s: '%s' is not %s or a positive integer", from, o->name, val, list);
            DIE("%s --%s: '%s' is not one of %s", from, o->name, val, list);
        }
    }
parsed:
    s->set[i] = 1;
    if (o->where == W_MODEL) s->model_explicit = 1;
}

// The entry of name for cmd; -2: the name exists but not for cmd; -1: no such option.
// A value from the run record (who names it): as set_opt, except that an empty path there means none.
static void set_recorded(State *s, int i, const char *val, const char *who) {
    if (opts[i].type == O_STR && !*val) {
        *(char *)opt_ptr(s, &opts[i]) = 0;
        s->set[i] = 1;
        return;
    }
    set_opt(s, i, val, who);
}

static int find_opt(const char *name, int cmd) {
    int found = -1;
    for (int i = 0; i < N_OPTS; i++) {
        const char *a = opts[i].name, *b = name;
        while (*a && (*a == *b || (*a == '-' && *b == '_'))) {
            a++;
            b++;
        }
        if (!*a && !*b) {
            if (opts[i].cmds & cmd) return i;
            found = -2;
        }
    }
    return found;
}

static void apply_preset(State *s, const char *name) {
    if (config_preset(&s->model, name) != 0)
        DIE("unknown preset '%s' (known: %s)", name, config_preset_names());
    s->model_explicit = 1;
}

static void apply_config_file(State *s, const char *path, int cmd) {
    long at = 0;
    cJSON *j = json_read_file("--config", NULL, path, &at);
    if (!cJSON_IsObject(j)) DIE("--config %s: not a JSON object (error near byte %ld)", path, j ? 0L : at);
    char from[1100];
    snprintf(from, sizeof from, "config %s:", path);
    cJSON *pr = cJSON_GetObjectItem(j, "preset");
    if (pr && !s->cli.preset[0]) {
        if (!cJSON_IsString(pr)) DIE("%s \"preset\" must be a string", from);
        apply_preset(s, pr->valuestring);
    }
    for (cJSON *it = j->child; it; it = it->next) {
        if (!strcmp(it->string, "preset") || !strcmp(it->string, "config")) continue;
        int i = find_opt(it->string, cmd);
        if (i == -1) DIE("%s unknown key \"%s\"", from, it->string);
        if (i == -2) continue; // an option of another subcommand: allowed in a shared file
        char buf[64];
        const char *val;
        OptType ty = opts[i].type;
        double d = it->valuedouble;
        if (cJSON_IsString(it)) val = it->valuestring;
        else if (cJSON_IsBool(it) && ty == O_FLAG) val = cJSON_IsTrue(it) ? "1" : "0";
        else if (cJSON_IsNumber(it) && ty == O_FLOAT) {
            if (!isfinite(d)) DIE("%s \"%s\" is not a finite number", from, it->string);
            snprintf(buf, sizeof buf, "%.9g", d);
            val = buf;
        } else if (cJSON_IsNumber(it) && (ty == O_INT || ty == O_U64 || ty == O_FLAG)) {
            // integers: exact in a double (|d| <= 2^53) before any conversion; set_opt checks the range
            if (!(d == floor(d) && fabs(d) <= 9007199254740992.0))
                DIE("%s \"%s\" must be an integer (got %g)", from, it->string, d);
            snprintf(buf, sizeof buf, "%.0f", d);
            val = buf;
        } else if (cJSON_IsNumber(it) || cJSON_IsBool(it)) {
            DIE("%s \"%s\" must be %s", from, it->string,
                ty == O_FLOAT                    ? "a number"
                    : ty == O_INT || ty == O_U64 ? "an integer"
                    : ty == O_FLAG               ? "true or false"
                                                 : "a string");
        } else DIE("%s \"%s\" has a value of the wrong type", from, it->string);
        set_opt(s, i, val, from);
    }
    cJSON_Delete(j);
}

// The option's value as text that set_opt reads back exactly (the run record, --help's defaults,
// the override messages).
static void opt_text(char *buf, size_t n, const Opt *o, const void *p) {
    const WordSet *ws = word_set(o->type);
    int v = ws || o->type == O_INT || o->type == O_FLAG ? *(const int *)p : 0;
    for (int k = 0; ws && k < ws->n; k++)
        if (v == ws->v[k]) {
            snprintf(buf, n, "%s", ws->w[k]);
            return;
        }
    switch (o->type) {
        case O_FLOAT: snprintf(buf, n, "%.9g", *(const float *)p); break;
        case O_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)p); break;
        case O_STR: snprintf(buf, n, "%s", (const char *)p); break;
        case O_FLAG: snprintf(buf, n, "%s", v ? "true" : "false"); break;
        default: snprintf(buf, n, "%d", v); break;
    }
}

// Every option at its default: the tiny preset, train_options_default, the CLI's own.
static void state_defaults(State *s) {
    memset(s, 0, sizeof *s);
    config_preset(&s->model, "tiny");
    train_options_default(&s->train);
    s->cli.tokens = 200;
    s->cli.temperature = 0.8f;
    s->cli.top_p = 1.0f;
    s->cli.kv_cache = 1;
}

static void usage(FILE *f, int cmd) {
    if (!cmd) {
        fprintf(f,
                "moe — train Mixture-of-Experts transformers in C\n\n"
                "usage: moe <command> [options]    (moe <command> --help for its options)\n\n"
                "commands:\n"
                "  train    train a model (default: the tiny preset on the embedded corpus)\n"
                "  sample   generate text from a checkpoint\n"
                "  eval     validation loss of a checkpoint (per kind of line on the embedded corpus)\n"
                "  info     parameter, FLOP and memory figures of a preset, config or checkpoint\n"
                "  export   write a checkpoint as a Hugging Face model directory (of the family it was "
                "trained as)\n");
        return;
    }
    static State d; // the defaults, shown per option
    state_defaults(&d);
    d.model.head_dim = 0; // (follows d-model / n-heads: said in its help)
    fprintf(f, "usage: moe %s [options]\n\noptions (model options default to the tiny preset's values):\n",
            cmd_name(cmd));
    for (int i = 0; i < N_OPTS; i++) {
        const Opt *o = &opts[i];
        if (!(o->cmds & cmd)) continue;
        const WordSet *ws = word_set(o->type);
        const char *arg = o->type == O_FLAG ? ""
            : o->type == O_STR              ? "S"
            : o->type == O_FLOAT            ? "X"
            : ws                            ? ws->usage
                                            : "N";
        char left[64], def[1100];
        snprintf(left, sizeof left, "--%s%s%s", o->name, *arg ? " " : "", arg);
        opt_text(def, sizeof def, o, opt_ptr(&d, o));
        if (strstr(o->help, "default")) fprintf(f, "  %-22s %s\n", left, o->help);
        else
            fprintf(f, "  %-22s %s (default: %s)\n", left, o->help,
                    o->type == O_FLAG ? "off"
                        : def[0]      ? def
                                      : "none");
    }
    fprintf(f, "  %-22s %s\n", "--help", "this text");
}

static void parse(State *s, int cmd, int argc, char **argv) {
    // pass 1: --help, --preset and --config come first whatever their position
    for (int a = 0; a < argc; a++) {
        if (!strcmp(argv[a], "--help") || !strcmp(argv[a], "-h")) {
            usage(stdout, cmd);
            exit(0);
        }
    }
    const char *preset = NULL, *config = NULL;
    for (int a = 0; a < argc; a++) {
        const char *eq = strchr(argv[a], '=');
        if (!strncmp(argv[a], "--preset", 8) && (argv[a][8] == 0 || argv[a][8] == '='))
            preset = eq ? eq + 1 : (a + 1 < argc ? argv[a + 1] : NULL);
        if (!strncmp(argv[a], "--config", 8) && (argv[a][8] == 0 || argv[a][8] == '='))
            config = eq ? eq + 1 : (a + 1 < argc ? argv[a + 1] : NULL);
    }
    if (preset) {
        snprintf(s->cli.preset, sizeof s->cli.preset, "%s", preset);
        apply_preset(s, preset);
    }
    if (config && (cmd & (C_TRAIN | C_INFO))) apply_config_file(s, config, cmd);
    // pass 2: every flag in order
    for (int a = 0; a < argc; a++) {
        const char *arg = argv[a];
        if (strncmp(arg, "--", 2) != 0)
            DIE("%s: unexpected argument '%s' (options start with --)", cmd_name(cmd), arg);
        char name[128];
        const char *eq = strchr(arg, '=');
        size_t nl = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        if (nl >= sizeof name) DIE("%s: unknown option '%s'", cmd_name(cmd), arg);
        memcpy(name, arg + 2, nl);
        name[nl] = 0;
        int i = find_opt(name, cmd);
        if (i == -1) DIE("%s: unknown option '--%s' (see moe %s --help)", cmd_name(cmd), name, cmd_name(cmd));
        if (i == -2)
            DIE("%s: option '--%s' does not apply to this command (see moe %s --help)", cmd_name(cmd), name,
                cmd_name(cmd));
        const char *val;
        if (opts[i].type == O_FLAG && !eq) val = "1";
        else if (eq) val = eq + 1;
        else if (a + 1 < argc) val = argv[++a];
        else DIE("%s: option '--%s' needs a value", cmd_name(cmd), name);
        if (!strcmp(name, "preset") || !strcmp(name, "config")) {
            s->set[i] = 1;
            continue;
        }
        set_opt(s, i, val, cmd_name(cmd));
    }
    // head_dim follows d_model / n_heads unless given (a preset's own head_dim, e.g. qwen3-moe-30b-a3b's
    // 128 with d / H = 64, stays unless d_model or n_heads is changed)
    int hd = find_opt("head-dim", C_TRAIN), dm = find_opt("d-model", C_TRAIN),
        nh = find_opt("n-heads", C_TRAIN);
    if (!s->set[hd] && (s->set[dm] || s->set[nh]) && s->model.n_heads > 0)
        s->model.head_dim = s->model.d_model / s->model.n_heads;
}

static int opt_set(const State *s, const char *name) { // (any command's entry of that name)
    for (int i = 0; i < N_OPTS; i++)
        if (!strcmp(opts[i].name, name) && s->set[i]) return 1;
    return 0;
}

// The run's record beside a checkpoint of ours (its run directory's run.json): the options `moe eval`
// takes from it unless given: T, the batch (the run's micro-batch), the data and its split, the
// evaluation batches. from: where the values came from, for the output.
static void eval_defaults(State *s, const char *ck, int hf, char *from, size_t n) {
    char run[2100];
    path_parent(run, sizeof run, ck);
    cJSON *rec = hf ? NULL : run_record_read(run);
    if (!rec) {
        snprintf(from, n, "%s; pass --seq-len, --batch and --data to match the training run",
                 hf ? "a Hugging Face model: the built-in defaults"
                    : "no run.json beside the checkpoint: the built-in defaults");
        return;
    }
    cJSON *o = cJSON_GetObjectItem(rec, "options");
    static const char *const names[] = {"seq-len", "data", "val-data", "val-frac", "eval-batches"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        int i = find_opt(names[k], C_EVAL);
        cJSON *v = cJSON_GetObjectItem(o, names[k]);
        if (s->set[i] || !cJSON_IsString(v)) continue;
        char who[2300];
        snprintf(who, sizeof who, "%s/%s:", run, RUN_RECORD);
        set_recorded(s, i, v->valuestring, who);
        s->set[i] = 0; // (still "not given": the record is not the user)
    }
    if (!opt_set(s, "batch")) { // the run's micro-batch: what its evaluations ran
        cJSON *b = cJSON_GetObjectItem(o, "batch"), *g = cJSON_GetObjectItem(o, "grad-accum");
        int B = cJSON_IsString(b) ? atoi(b->valuestring) : 0,
            G = cJSON_IsString(g) ? atoi(g->valuestring) : 1;
        if (B > 0 && G > 0 && B % G == 0) s->train.batch = B / G;
    }
    snprintf(from, n, "the options not given are the run's: %s/%s", run, RUN_RECORD);
    cJSON_Delete(rec);
}

// The sampling window: --window, else the training length the run recorded (run.json beside the
// checkpoint), else min(max_seq_len, 256); from: where it came from, for the output.
static int sample_window(const State *s, const char *ck, const ModelConfig *c, char *from, size_t n) {
    int W = s->cli.window;
    snprintf(from, n, "--window");
    if (!W) {
        char run[2100];
        path_parent(run, sizeof run, ck);
        cJSON *rec = hf_is_model_dir(ck) ? NULL : run_record_read(run);
        cJSON *t = rec ? cJSON_GetObjectItem(cJSON_GetObjectItem(rec, "options"), "seq-len") : NULL;
        if (cJSON_IsString(t)) W = atoi(t->valuestring);
        if (W > 0) snprintf(from, n, "the run's --seq-len, %s/%s", run, RUN_RECORD);
        cJSON_Delete(rec);
    }
    if (W <= 0) {
        W = c->max_seq_len < 256 ? c->max_seq_len : 256;
        snprintf(from, n, "no training length recorded: min(max_seq_len, 256)");
    }
    if (W < 1 || W > c->max_seq_len)
        DIE("--window must be in 1..%d (the model's max_seq_len; got %d)", c->max_seq_len, W);
    return W;
}

static int cmd_sample(State *s) {
    char ck[2048];
    pretrained_resolve(s->cli.ckpt, ck, sizeof ck);
    if (s->cli.tokens < 0 || s->cli.tokens > (1 << 20))
        DIE("--tokens must be in 0..1048576 (got %d)", s->cli.tokens);
    if (!(s->cli.temperature >= 0)) DIE("--temperature must be >= 0 (got %g)", s->cli.temperature);
    if (s->cli.top_k < 0) DIE("--top-k must be >= 0 (got %d)", s->cli.top_k);
    if (!(s->cli.top_p > 0 && s->cli.top_p <= 1)) DIE("--top-p must be in (0, 1] (got %g)", s->cli.top_p);
    if (s->cli.window < 0) DIE("--window must be >= 1 (got %d)", s->cli.window);
    if (s->cli.kv_cache != 0 && s->cli.kv_cache != 1)
        DIE("--kv-cache must be 0 or 1 (got %d)", s->cli.kv_cache);
    Model m;
    TrainState st;
    ModelConfig c;
    pretrained_config(ck, &c);
    if (c.vocab_size < 256)
        DIE("sample: the model's vocabulary (%d) is smaller than bytes; cannot encode the prompt",
            c.vocab_size);
    char from[2300];
    int W = sample_window(s, ck, &c, from, sizeof from);
    pretrained_load(&m, ck, 1, W, &st, s->train.seed, s->train.device);
    int plen = (int)strlen(s->cli.prompt), cap = plen + s->cli.tokens + 1;
    int32_t *ctx = xmalloc(sizeof(int32_t) * cap);
    int len = 0;
    for (int i = 0; i < plen; i++) ctx[len++] = (unsigned char)s->cli.prompt[i];
    if (len == 0) ctx[len++] = '\n';
    Pipe one; // the model alone: one stage
    pipe_init(&one, &m, NULL, 1);
    SampleOptions so = {s->cli.temperature, s->cli.top_k, s->cli.top_p, W, s->cli.kv_cache, s->train.seed};
    SampleStats ss;
    sample_tokens(&one, ctx, &len, cap, s->cli.tokens, &so, &ss);
    print_tokens(stdout, ctx, len, c.vocab_size);
    printf("\n");
    fprintf(stderr, "sampled %d tokens in %.3f s (%.1f tokens/s; %s, window %d: %s; %d prefill%s)\n",
            ss.tokens, ss.seconds, ss.seconds > 0 ? ss.tokens / ss.seconds : 0.0,
            ss.cached ? "KV cache" : "no cache", W, from, ss.prefills, ss.prefills == 1 ? "" : "s");
    free(ctx);
    pipe_free(&one);
    model_free(&m);
    return 0;
}

static int cmd_eval(State *s) {
    char ck[2048];
    pretrained_resolve(s->cli.ckpt, ck, sizeof ck);
    if (s->cli.dump_grads && !s->cli.dump[0]) DIE("--dump-grads needs --dump FILE");
    int hf = hf_is_model_dir(ck);
    ModelConfig c;
    pretrained_config(ck, &c);
    TrainState st;
    char from[2200];
    eval_defaults(s, ck, hf, from, sizeof from);
    int T = s->train.seq_len, B = s->train.batch;
    if (T < 1 || T > c.max_seq_len) DIE("--seq-len must be in 1..%d (got %d)", c.max_seq_len, T);
    if (B < 1) DIE("--batch must be >= 1 (got %d)", B);
    if ((int64_t)B * T > config_max_tokens(&c))
        DIE("--batch %d x --seq-len %d = %lld tokens per micro-batch; this model takes at most %lld", B, T,
            (long long)B * T, (long long)config_max_tokens(&c));
    if (s->train.eval_batches < 0) DIE("--eval-batches must be all or >= 1 (got %d)", s->train.eval_batches);
    if (s->train.val_data[0] && !s->train.data[0])
        DIE("--val-data needs --data (the embedded corpus holds out its own windows)");
    Model m;
    pretrained_load(&m, ck, B, T, &st, s->train.seed, s->train.device);
    Dataset ds;
    data_open_split(&ds, s->train.data[0] ? s->train.data : NULL,
                    s->train.val_data[0] ? s->train.val_data : NULL, s->train.val_frac, st.seed, T);
    if (ds.max_token >= c.vocab_size)
        DIE("the data's vocabulary does not fit the model: token %d, vocab_size %d", ds.max_token,
            c.vocab_size);
    if (hf) printf("Hugging Face model %s, data %s\n", ck, ds.source);
    else printf("checkpoint %s (step %lld), data %s\n", ck, (long long)st.step, ds.source);
    char desc[600], note[300];
    data_split_desc(&ds, desc, sizeof desc);
    EvalResult r;
    Pipe one; // the model alone: one stage
    pipe_init(&one, &m, NULL, 1);
    evaluate(&one, &ds, B, s->train.eval_batches, 1, &r, NULL);
    pipe_free(&one);
    printf("T %d, batch %d, %d of the %d batches of the validation set (%zu windows); %s\n(%s)\n", T, B,
           r.batches, r.available, ds.n_val, desc, from);
    eval_clip_note(note, sizeof note, &r, s->train.eval_batches, B);
    if (note[0]) printf("note: %s\n", note);
    eval_print(&r, &ds, &c);
    if (s->cli.dump[0]) {
        float aux_coef = opt_set(s, "aux-coef") ? s->model.aux_coef : c.aux_coef;
        float z_coef = opt_set(s, "z-coef") ? s->model.z_coef : c.z_coef;
        cJSON *meta = cJSON_CreateObject();
        char b[64];
        snprintf(b, sizeof b, "%.17g", r.loss);
        cJSON_AddStringToObject(meta, "val_loss", b);
        snprintf(b, sizeof b, "%lld", (long long)r.tokens);
        cJSON_AddStringToObject(meta, "val_tokens", b);
        snprintf(b, sizeof b, "%d", r.batches);
        cJSON_AddStringToObject(meta, "eval_batches", b);
        cJSON_AddStringToObject(meta, "model", ck);
        cJSON_AddStringToObject(meta, "data", ds.source);
        char *mj = cJSON_PrintUnformatted(meta);
        cJSON_Delete(meta);
        eval_dump(&m, &ds, B, s->cli.dump, s->cli.dump_grads, aux_coef, z_coef, mj);
        cJSON_free(mj);
        printf("dump: %s (first batch of %d x %d%s)\n", s->cli.dump, B, T,
               s->cli.dump_grads ? ", with gradients" : "");
    }
    eval_result_free(&r);
    data_close(&ds);
    model_free(&m);
    return 0;
}

static int cmd_export(State *s) {
    char ck[2048];
    pretrained_resolve(s->cli.ckpt, ck, sizeof ck);
    if (hf_is_model_dir(ck)) DIE("--ckpt %s is already a Hugging Face model directory", ck);
    if (!opt_set(s, "out")) DIE("export: --out DIR is required (the Hugging Face model directory to write)");
    int cloned = hf_export(ck, s->train.out, s->train.force);
    printf("exported %s -> %s\n", ck, s->train.out);
    ModelConfig c;
    pretrained_config(ck, &c);
    printf("  model.safetensors  (%s; %s names and shapes, F32)\n", cloned ? "copy-on-write clone" : "copy",
           config_family_arch(c.family));
    printf("  config.json        (%s's config keys; ours under \"moe_c\")\n", config_family_arch(c.family));
    printf("load with: transformers.AutoModelForCausalLM.from_pretrained(\"%s\", dtype=torch.float32)\n",
           s->train.out);
    return 0;
}

// --init-from HF_DIR: the model config comes from HF_DIR/config.json. Model options given as flags or
// in --config must agree with it, except the training-only router options, which may be changed.
static const char *const INIT_OVERRIDABLE[] = {"aux-coef", "z-coef",          "aux-form",    "jitter",
                                               "dispatch", "capacity-factor", "max-seq-len", "init-std",
                                               "balance",  "bias-rate",       "aux-scope"};

static void fmt_opt(char *buf, size_t n, const Opt *o, const void *p) {
    switch (o->type) {
        case O_FLOAT: snprintf(buf, n, "%g", *(const float *)p); break;
        case O_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)p); break;
        case O_STR: snprintf(buf, n, "'%s'", (const char *)p); break;
        case O_DISPATCH:
            snprintf(buf, n, "%s", *(const DispatchMode *)p == DISPATCH_CAPACITY ? "capacity" : "dropless");
            break;
        default: snprintf(buf, n, "%d", *(const int *)p); break;
    }
}

// The first model option given (flag or config file) whose value differs from c's, or -1; the names
// in allow are not compared but copied into c. a, b (64 bytes): the given and c's values.
static int model_conflict(const State *s, ModelConfig *c, const char *const *allow, size_t n_allow, char *a,
                          char *b) {
    for (int i = 0; i < N_OPTS; i++) {
        const Opt *o = &opts[i];
        if (o->where != W_MODEL || !s->set[i]) continue;
        int over = 0;
        for (size_t k = 0; k < n_allow; k++) over |= !strcmp(o->name, allow[k]);
        const void *mine = (const char *)&s->model + o->off;
        void *theirs = (char *)c + o->off;
        if (over) {
            memcpy(theirs, mine, o->size);
            continue;
        }
        if (memcmp(mine, theirs, o->size) != 0) {
            fmt_opt(a, 64, o, mine);
            fmt_opt(b, 64, o, theirs);
            return i;
        }
    }
    return -1;
}

static void init_from_config(State *s, ModelConfig *c) {
    const char *dir = s->cli.init_from;
    if (s->cli.preset[0]) DIE("--init-from and --preset: the model config comes from %s/config.json", dir);
    if (s->train.resume)
        DIE("--init-from and --resume: --init-from starts a run (saving the imported weights as its step 0); "
            "to continue that run pass --resume alone");
    if (!hf_is_model_dir(dir))
        DIE("--init-from: '%s' is not a Hugging Face model directory (config.json plus model.safetensors or "
            "model.safetensors.index.json; our own checkpoints continue with --resume)",
            dir);
    if (s->train.upcycle) { // E from --upcycle, k from --top-k (given or Mixtral's 2)
        hf_load_config_upcycle(dir, s->train.upcycle, opt_set(s, "top-k") ? s->model.top_k : 2, c);
        s->model.top_k = c->top_k;
        s->model.n_experts = c->n_experts;
    } else {
        hf_load_config(dir, c);
    }
    char a[64], b[64];
    int i = model_conflict(s, c, INIT_OVERRIDABLE, sizeof INIT_OVERRIDABLE / sizeof *INIT_OVERRIDABLE, a, b);
    if (i >= 0)
        DIE("--init-from %s: --%s %s contradicts its config.json (%s); drop the flag (only %s may be "
            "changed)",
            dir, opts[i].name, a, b,
            "--aux-coef, --z-coef, --aux-form, --jitter, --dispatch, --capacity-factor, --max-seq-len, "
            "--init-std, --balance, "
            "--bias-rate, --aux-scope");
    const char *bad = config_validate(c);
    if (bad) DIE("--init-from %s: invalid model config: %s", dir, bad);
}

// --init-from: the run in --out starts from the imported weights (saved as its step 0); every rank
// then continues it as a resume from step 0.
static void init_from_prepare(State *s, const Comm *world) {
    ModelConfig c;
    init_from_config(s, &c);
    pretrained_start_run(s->cli.init_from, &c, &s->train, world);
    s->model = c;
    s->train.resume = 1;
    s->train.force = 0;
    s->model_explicit = 0;
}

static int cmd_info(State *s) {
    ModelConfig c = s->model;
    if (opt_set(s, "world") && s->cli.world < 1) DIE("--world must be >= 1 (got %d)", s->cli.world);
    if (s->cli.ckpt[0]) {
        char ck[2048];
        pretrained_resolve(s->cli.ckpt, ck, sizeof ck);
        pretrained_config(ck, &c);
        printf("%s: %s\n", hf_is_model_dir(ck) ? "Hugging Face model" : "checkpoint", ck);
    }
    info_print(&c, &s->train, s->cli.world);
    return 0;
}

// Every rank of an MPI job must train the same thing: each hashes its resolved training options
// (model, training, mesh, paths) and the environment switches that change results, and the ranks
// compare before anything is read or written (parallel/agree.h; the data's contents are compared
// once loaded, in the trainer).
static void agree_options(State *s, const Comm *world) {
    static const char *const envs[] = {"MOE_BF16_SHADOW", "MOE_GROUPED_GEMM", "MOE_FORCE_NCCL"};
    enum { NENV = sizeof envs / sizeof *envs };
    AgreeItem items[N_OPTS + NENV];
    char names[N_OPTS + NENV][40];
    int n = 0;
    for (int i = 0; i < N_OPTS; i++) {
        const Opt *o = &opts[i];
        if (!(o->cmds & C_TRAIN) || !strcmp(o->name, "preset") || !strcmp(o->name, "config")) continue;
        const void *p = opt_ptr(s, o); // (preset and config files are in the values they set)
        snprintf(names[n], sizeof names[n], "--%s", o->name);
        items[n].name = names[n];
        items[n].hash = hash_bytes(p, o->type == O_STR ? strlen(p) : o->size, 0);
        fmt_opt(items[n].shown, sizeof items[n].shown, o, p);
        n++;
    }
    for (int i = 0; i < NENV; i++) {
        const char *v = getenv(envs[i]);
        items[n].name = envs[i];
        items[n].hash = v ? hash_bytes(v, strlen(v), 1) : 0;
        snprintf(items[n].shown, sizeof items[n].shown, "%s", v ? v : "(unset)");
        n++;
    }
    comm_agree(world, "options", items, n);
}

// What a --resume takes from the run record when not given: the data and its split, the batch, the
// schedule, evaluation and saving. Not remembered: the mesh, the device and this invocation's paths
// (a run may resume on another layout), and the model (the checkpoint's config.json holds it).
static const char *const REMEMBERED[] = {
    "data",      "val-data",      "val-frac",   "seq-len",      "batch",         "grad-accum", "steps",
    "lr",        "min-lr-frac",   "warmup",     "weight-decay", "beta1",         "beta2",      "adam-eps",
    "grad-clip", "seed",          "eval-every", "eval-batches", "save-every",    "keep",       "keep-best",
    "dropout",   "sample-tokens", "plots",      "precision",    "bf16-rounding", "bf16-grads"};

static int remembered(const char *name) {
    for (size_t k = 0; k < sizeof REMEMBERED / sizeof *REMEMBERED; k++)
        if (!strcmp(name, REMEMBERED[k])) return 1;
    return 0;
}

// The command line as a shell would take it back (arguments quoted where needed); malloc'd.
static char *command_line(int argc, char **argv) {
    size_t n = 1;
    for (int a = 0; a < argc; a++) n += 4 * strlen(argv[a]) + 3;
    char *buf = xmalloc(n), *p = buf;
    for (int a = 0; a < argc; a++) {
        const char *w = argv[a];
        int plain = *w != 0;
        for (const char *q = w; *q; q++)
            plain &= isalnum((unsigned char)*q) || strchr("_./=:,+-@%", *q) != NULL;
        if (a) *p++ = ' ';
        if (plain) {
            strcpy(p, w);
            p += strlen(w);
            continue;
        }
        *p++ = '\'';
        for (const char *q = w; *q; q++) {
            if (*q == '\'') {
                memcpy(p, "'\\''", 4);
                p += 4;
            } else *p++ = *q;
        }
        *p++ = '\'';
    }
    *p = 0;
    return buf;
}

// A path option's value as recorded: absolute where it names an existing file (so `moe eval` and
// --resume find it from any directory), as given otherwise (a shard pattern).
static void record_path(char *buf, size_t n, const char *v) {
    char *abs = v[0] ? realpath(v, NULL) : NULL;
    snprintf(buf, n, "%s", abs ? abs : v);
    free(abs);
}

// --resume: the run record of --out gives every remembered option the user did not set; each one set
// to another value than the record's is an override, printed (rank 0) and returned in *overrides
// for the record. A model option that contradicts the checkpoint's config is refused by name.
// Returns the previous record (NULL: none, a run of an older moe).
static cJSON *resume_apply(State *s, int rank0, cJSON **overrides) {
    *overrides = cJSON_CreateObject();
    char latest[2048];
    if (ckpt_find_latest(s->train.out, latest, sizeof latest) == 0) {
        ModelConfig saved;
        ckpt_load_config(latest, &saved);
        char a[64], b[64];
        int i = model_conflict(s, &saved, NULL, 0, a, b);
        if (i >= 0)
            DIE("--resume: the model options given differ from the checkpoint's config (%s/config.json): "
                "--%s %s, the "
                "checkpoint's %s; drop --%s to continue that model",
                latest, opts[i].name, a, b, opts[i].name);
    }
    cJSON *prev = run_record_read(s->train.out);
    if (!prev) {
        if (rank0)
            printf("--resume: %s has no %s (a run of an older moe): the options are as given\n", s->train.out,
                   RUN_RECORD);
        return NULL;
    }
    cJSON *rec = cJSON_GetObjectItem(prev, "options");
    char applied[4096] = "";
    for (int i = 0; i < N_OPTS; i++) {
        const Opt *o = &opts[i];
        cJSON *v = cJSON_GetObjectItem(rec, o->name);
        if (!(o->cmds & C_TRAIN) || !remembered(o->name) || !cJSON_IsString(v)) continue;
        char now[1100], was[1100];
        opt_text(now, sizeof now, o, opt_ptr(s, o));
        if (is_path_opt(o->name)) record_path(now, sizeof now, now);
        snprintf(was, sizeof was, "%s", v->valuestring);
        if (!strcmp(now, was)) continue;
        if (s->set[i]) { // an override (floats shown short, recorded exactly)
            char a[64], b[64];
            if (o->type == O_FLOAT) {
                snprintf(a, sizeof a, "%g", strtof(now, NULL));
                snprintf(b, sizeof b, "%g", strtof(was, NULL));
            }
            if (rank0)
                printf("--resume: --%s %s overrides the run's %s (%s/%s)\n", o->name,
                       o->type == O_FLOAT ? a
                           : now[0]       ? now
                                          : "''",
                       o->type == O_FLOAT ? b
                           : was[0]       ? was
                                          : "''",
                       s->train.out, RUN_RECORD);
            cJSON *ov = cJSON_AddObjectToObject(*overrides, o->name);
            cJSON_AddStringToObject(ov, "recorded", was);
            cJSON_AddStringToObject(ov, "now", now);
            continue;
        }
        char who[1200];
        snprintf(who, sizeof who, "%s/%s:", s->train.out, RUN_RECORD);
        set_recorded(s, i, was, who);
        size_t l = strlen(applied);
        snprintf(applied + l, sizeof applied - l, " --%s %s", o->name, was[0] ? was : "''");
    }
    if (rank0 && applied[0])
        printf("--resume: the run's options (%s/%s):%s\n", s->train.out, RUN_RECORD, applied);
    return prev;
}

// The run record: the resolved options (as text set_opt reads back), the command line that started
// the run, and each resume's command line and overrides. On a resume the model options are the
// previous record's (the checkpoint's config holds the model; the flags may not change it).
static char *record_build(State *s, const cJSON *prev, cJSON *overrides, int argc, char **argv) {
    char *cl = command_line(argc, argv);
    cJSON *j = cJSON_CreateObject(), *o = cJSON_CreateObject();
    const cJSON *po = prev ? cJSON_GetObjectItem(prev, "options") : NULL;
    const cJSON *pcl = prev ? cJSON_GetObjectItem(prev, "command_line") : NULL;
    cJSON_AddStringToObject(j, "command_line", cJSON_IsString(pcl) ? pcl->valuestring : cl);
    for (int i = 0; i < N_OPTS; i++) {
        const Opt *op = &opts[i];
        if (!(op->cmds & C_TRAIN) || !strcmp(op->name, "preset") || !strcmp(op->name, "config") ||
            !strcmp(op->name, "resume") || !strcmp(op->name, "force") || !strcmp(op->name, "init-from"))
            continue;
        const cJSON *pv = po ? cJSON_GetObjectItem(po, op->name) : NULL;
        char v[1100];
        opt_text(v, sizeof v, op, opt_ptr(s, op));
        if (is_path_opt(op->name)) record_path(v, sizeof v, v);
        cJSON_AddStringToObject(o, op->name,
                                op->where == W_MODEL && cJSON_IsString(pv) ? pv->valuestring : v);
    }
    cJSON_AddItemToObject(j, "options", o);
    const cJSON *pr = prev ? cJSON_GetObjectItem(prev, "resumes") : NULL;
    cJSON *rs = cJSON_IsArray(pr) ? cJSON_Duplicate(pr, 1) : cJSON_CreateArray();
    if (s->train.resume && prev) {
        cJSON *one = cJSON_CreateObject();
        cJSON_AddStringToObject(one, "command_line", cl);
        cJSON_AddItemToObject(one, "overrides", overrides);
        cJSON_AddItemToArray(rs, one);
    } else {
        cJSON_Delete(overrides);
    }
    cJSON_AddItemToObject(j, "resumes", rs);
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    free(cl);
    return text;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout, 0);
        return argc < 2 ? 2 : 0;
    }
    int cmd = !strcmp(argv[1], "train") ? C_TRAIN
        : !strcmp(argv[1], "sample")    ? C_SAMPLE
        : !strcmp(argv[1], "eval")      ? C_EVAL
        : !strcmp(argv[1], "info")      ? C_INFO
        : !strcmp(argv[1], "export")    ? C_EXPORT
                                        : 0;
    if (!cmd) {
        fprintf(stderr, "moe: error: unknown command '%s' (train, sample, eval, info, export)\n", argv[1]);
        return 2;
    }
    static State s;
    state_defaults(&s);
    parse(&s, cmd, argc - 2, argv + 2);
    signals_init(cmd == C_TRAIN); // train: SIGTERM/SIGINT checkpoint and exit MOE_EXIT_PREEMPTED
    if (cmd == C_EXPORT) return cmd_export(&s);
    if (cmd != C_TRAIN) return cmd == C_SAMPLE ? cmd_sample(&s) : cmd == C_EVAL ? cmd_eval(&s) : cmd_info(&s);
    if (s.train.upcycle && !s.cli.init_from[0])
        DIE("--upcycle %d: it turns a dense model's MLPs into experts; pass the dense model with --init-from "
            "DIR",
            s.train.upcycle);
    int targc = argc;
    char **targv = argv; // (the command line as given, for the record: MPI may rewrite argv)
    Comm *world = comm_world_init(&argc, &argv);
    cJSON *overrides = NULL,
          *prev = s.train.resume ? resume_apply(&s, comm_rank(world) == 0, &overrides) : NULL;
    if (!overrides) overrides = cJSON_CreateObject();
    if (opt_set(&s, "bf16-rounding") &&
        s.train.precision != PREC_BF16) // (after --resume took the run's precision)
        DIE("--bf16-rounding rounds the weights of --precision bf16; this run's precision is mixed");
    if (opt_set(&s, "bf16-grads") && s.train.precision != PREC_BF16)
        DIE("--bf16-grads sets the gradients of --precision bf16; this run's precision is mixed");
    agree_options(&s, world);
    if (s.cli.init_from[0]) init_from_prepare(&s, world);
    char *record = record_build(&s, prev, overrides, targc, targv);
    cJSON_Delete(prev);
    int rc = train_run(&s.model, &s.train, s.model_explicit, record, world);
    free(record);
    comm_world_finalize();
    return rc;
}
