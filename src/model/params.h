// params.h — the parameter table: the single list of the model's tensors (HF Mixtral names),
// their shapes, offsets into one flat buffer, and how each is split and reduced in a mesh.
// Everything that walks tensors (optimizer, checkpoint, grad buckets, ZeRO, export) uses this.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "core/config.h"
#include "parallel/stages.h"

typedef enum {
    PR_EMBED,
    PR_ATTN_NORM,
    PR_WQ,
    PR_WK,
    PR_WV,
    PR_WO,
    PR_FFN_NORM,
    PR_ROUTER,
    PR_W1,
    PR_W3,
    PR_W2,
    PR_FINAL_NORM,
    PR_LM_HEAD,
    // family options (config.h): q/k/v biases, QK-norm weights, the shared expert (w1 = gate_proj,
    // w3 = up_proj, w2 = down_proj) and its sigmoid gate
    PR_BQ,
    PR_BK,
    PR_BV,
    PR_QNORM,
    PR_KNORM,
    PR_SH_W1,
    PR_SH_W3,
    PR_SH_W2,
    PR_SH_GATE,
    // balance aux-free: the per-expert routing bias (E), DeepSeek-V3's gate.e_score_correction_bias; no
    // gradient (AdamW leaves it as it is), moved by the step's load (train/step.c), kept in checkpoints
    PR_ROUTE_BIAS,
    // a dense layer's FFN (config.h dense_layers): mlp.gate_proj (w1), up_proj (w3), down_proj (w2)
    PR_D_W1,
    PR_D_W3,
    PR_D_W2,
    // multi-head latent attention (config.h kv_lora_rank): q_a_proj, q_a_layernorm, q_b_proj (or q_proj where
    // q_lora_rank is 0: PR_QB too), kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj; its o_proj is PR_WO
    PR_QA,
    PR_QA_NORM,
    PR_QB,
    PR_KVA,
    PR_KVA_NORM,
    PR_KVB,
    // an MTP module (config.h mtp_depth; its layer index n_layers + k - 1): enorm, hnorm (d), eh_proj (d, 2d:
    // columns [0, d) take the normed embedding, [d, 2d) the normed hidden state), shared_head.norm (d); its
    // block has a main layer's roles; the embedding and the LM head are the main model's
    PR_MTP_ENORM,
    PR_MTP_HNORM,
    PR_MTP_EH,
    PR_MTP_NORM
} ParamRole;

// Gradient reduction group: dense tensors over DP (their TP shards stay distinct); the router over
// the whole stage (TP ranks route different token slices); experts over EDP (their replicas).
typedef enum { RED_DP = 0, RED_EDP = 1, RED_STAGE = 2 } ReduceGroup;
typedef enum { SPLIT_REPL = 0, SPLIT_COL, SPLIT_ROW, SPLIT_VOCAB } TpSplit; // how TP splits a dense tensor

typedef struct {
    char name[96]; // HF name, e.g. model.layers.3.block_sparse_moe.experts.5.w1.weight
    int ndim;
    int64_t shape[2]; // full logical shape (row-major; Linear weights are (out, in))
    size_t numel; // full logical element count
    size_t offset; // element offset of the full tensor in a full flat buffer
    // this rank's slice (equal to the full tensor in one process)
    int64_t lshape[2]; // local shape; lnumel 0 when this rank does not hold the tensor
    size_t lnumel;
    size_t loffset; // element offset into this rank's flat buffer
    int split_dim; // -1: whole tensor; 0: a block of rows; 1: a block of columns
    int64_t split_start; // first row/column of the block
    ParamRole role;
    int layer; // -1 for embed / final norm / lm_head
    int expert; // -1 unless an expert tensor
    ReduceGroup reduce;
    TpSplit tp_split; // for expert tensors: ETP splits along f (w1/w3 rows, w2 cols)
    int decay; // 1: weight decay applies (matrices); 0: norms
} ParamSpec;

typedef struct {
    ParamSpec *p;
    int n;
    size_t total; // elements of the full model (a full flat buffer)
    size_t ltotal; // elements of this rank's flat buffer
    // of them, by reduce group (ReduceGroup) and by expert (1) or not (0): the cost model's sums, set by
    // params_build, params_build_local and params_localize (a table made otherwise has zeros here)
    size_t lby[3][2];
} ParamTable;

// The slicing of a mesh, as the table needs it (from parallel/mesh.h's MeshShape/MeshCoord), and
// the pipeline stage: a rank holds the layers of its virtual stages (pp_split NULL: every layer),
// the embedding on stage 0, the final norm and the LM head on the last stage. vocab 1 (--vocab-parallel,
// model/vocab.h): the embedding's and the LM head's rows split over TP, rank r's [V r / tp, V (r+1) / tp).
typedef struct {
    int tp, tp_rank, ep, ep_rank, etp, etp_rank;
    const StageSplit *pp_split;
    int pp_rank;
    int vocab;
} ParamSlicing;
// The first of part r's elements when n are split in parts pieces (uneven where parts does not divide n: the
// vocabulary's rows under ParamSlicing.vocab; every other split divides evenly).
static inline int64_t params_part_start(int64_t n, int r, int parts) { return n * r / parts; }
// The length of each of the first pieces when n are cut in parts chunks of equal length (the last may be
// shorter): --loss-chunks' rows of the logits at once (model_state.h model_set_loss_chunks).
static inline size_t params_chunk_len(size_t n, int parts) { return (n + (size_t)parts - 1) / (size_t)parts; }

// Order: embed; per layer: attn_norm, q, [q bias], k, [k bias], v, [v bias], o, [q_norm, k_norm] (latent
// attention: [q_a, q_a_norm, q_b | q], kv_a, kv_a_norm, kv_b, o),
// ffn_norm, router, [routing bias], [shared w1, w3, w2, gate], w1[0..E), w3[0..E), w2[0..E) (a dense
// layer: ffn_norm, then mlp.gate_proj, up_proj, down_proj in place of the router and experts); final norm;
// lm_head; then each MTP module (config.h mtp_depth): enorm, hnorm, eh_proj, its block's tensors as a main
// layer's, shared_head.norm (HF names model.layers.{n_layers + k - 1}.*, the released DeepSeek-V3
// checkpoints'; held by the last pipeline stage). So each layer's expert w1 block is one contiguous (E, f, d)
// array. Names are the family's (config.h ModelFamily): Mixtral's block_sparse_moe.experts.E.w1/w3/w2, or
// mlp.gate and mlp.experts.E.gate_proj/up_proj/down_proj (OLMoE, Qwen2-MoE, Qwen3-MoE). Reduction: QK-norm
// weights of the per-head form, the shared expert and a dense layer's MLP (which, like the router, see each
// TP rank's token slice) are reduced over the stage; full-width QK-norm weights (one process in TP) and the
// biases (split over TP with their projections' rows) over DP.
void params_build(ParamTable *t, const ModelConfig *c);
// Latent attention's q_b (or q) and kv_b rows and o columns split over TP by heads; q_a, kv_a and their norms
// replicated and reduced over the stage (each TP rank's gradient is its heads' part).
// The same table with local slices: q/k/v rows and o columns split over TP (whole heads), each EP
// rank holds experts [ep_rank*E/EP, +E/EP), each ETP rank rows of w1/w3 and columns of w2 (along
// f). Embeddings, norms and the router are replicated. With pipeline stages, tensors of another
// stage are not held (lnumel 0). sl == NULL: one process.
void params_build_local(ParamTable *t, const ModelConfig *c, const ParamSlicing *sl);
// The same from full, a table params_build made for c, copied into t where t->p is NULL (t zeroed), else
// t being such a copy already, sliced again in place (the planner slices one model's table for thousands
// of meshes: naming its tensors, then copying them, took most of its time). params_free frees t.
void params_localize(ParamTable *t, const ParamTable *full, const ModelConfig *c, const ParamSlicing *sl);
// The slice of tensor s as contiguous runs: fn(full_index, local_index, count, ctx) per run
// (full_index into a full flat buffer, local_index into this rank's).
void params_slice_runs(const ParamSpec *s, void (*fn)(size_t, size_t, size_t, void *), void *ctx);
// Copy this rank's slices of a full flat buffer into its local buffer.
void params_full_to_local(const ParamTable *t, const float *full, float *local);
void params_free(ParamTable *t);
int params_find(const ParamTable *t, const char *name); // index or -1
// Index of a role in a layer (expert = -1 for non-expert roles).
int params_index(const ParamTable *t, ParamRole role, int layer, int expert);
// A routed expert's w1, w3 or w2 (the grouped GEMMs' weights; not the shared expert's or a dense MLP's).
static inline int params_routed(const ParamSpec *s) {
    return s->expert >= 0 && (s->role == PR_W1 || s->role == PR_W3 || s->role == PR_W2);
}
// The weights that only the bf16 GEMMs read, as element ranges [h[2i], h[2i+1]) of the local buffer,
// ascending and disjoint (adjacent tensors merged): the holes of the bf16 policy's parameter buffer (ops.h
// alloc_bf16_params). They are each layer's routed-expert block (this rank's experts e0 .. e0+El-1: w1, w3,
// w2, one block in table order), where w1, w3 and w2 each start at a multiple of 8 elements (the grouped
// GEMMs' alignment), and the dense projections q, k, v, o and the LM head that start at a multiple of 8
// (the bf16 copy's alignment for cuBLAS) and whose local rows (the product's output width O) exceed
// min_rows (ops.h MOE_GEMM_FP32_MAX_O: narrower products run in float32); and the embedding table where it
// starts at a multiple of 8 (embedding_fwd reads a table in a hole from the copy).
// h holds params_bf16_ranges_max entries; returns how many ranges.
int params_bf16_ranges(const ParamTable *t, int n_layers, int e0, int El, int64_t min_rows, size_t *h);
static inline size_t params_bf16_ranges_max(int n_layers) { return 2 * (5 * (size_t)n_layers + 2); }

// Deterministic init from seed into this rank's local buffer: norms = 1, linears ~ N(0, init_std),
// o_proj/w2 scaled by 1/sqrt(2L). A slice gets exactly the values of the full tensor.
void params_init(const ParamTable *t, const ModelConfig *c, float *local, uint64_t seed);
