// options.c — training option defaults, validation, and the learning-rate schedule.
#include "train/options.h"
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include "data/data.h"
#include "train/sample.h"

void train_options_default(TrainOptions *o) {
    memset(o, 0, sizeof *o);
    o->steps = 1000;
    o->batch = 16;
    o->grad_accum = 1;
    o->seq_len = 64;
    o->lr = 3e-3f;
    o->min_lr_frac = 0.1f;
    o->warmup = 20;
    o->weight_decay = 0.1f;
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->adam_eps = 1e-8f;
    o->grad_clip = 1.0f;
    o->seed = 1;
    o->eval_every = 100;
    o->eval_batches = 8;
    o->val_frac = 0.1f;
    o->save_every = 0;
    o->keep = 2;
    o->sample_tokens = 200;
    o->plots = 1;
    o->tensorboard = 1;
    o->tp = o->ep = o->etp = o->pp = o->vpp = o->loss_chunks = 1;
    o->pp_schedule = SCHED_1F1B;
    o->zero = 0;
    o->overlap = 1;
    o->bucket_mb = 25.0f;
    o->a2a_overlap = 1;
    o->ampipe = 1;
    o->bf16_grads = 1;
    o->fp8_weight_cache = 1;
    o->fp8_amax_jump = 8;
    o->a2a_retune = 0.25f;
    o->a2a_hier = -1;
    o->expert_mode = 0;
    snprintf(o->out, sizeof o->out, "runs/default");
}

// The FP8 options' checks (train_options_validate's): the message in msg, or NULL.
static const char *fp8_options_bad(const TrainOptions *o, char *msg, size_t n) {
#define BAD(...) \
    do { \
        snprintf(msg, n, __VA_ARGS__); \
        return msg; \
    } while (0)
    if (o->fp8_dense != 0 && o->fp8_dense != 1) BAD("--fp8-dense must be 0 or 1 (got %d)", o->fp8_dense);
    if (o->fp8_amax_jump < 0 || o->fp8_amax_jump > FP8_SCALE_EXP_MAX - FP8_SCALE_EXP_MIN)
        BAD("--fp8-amax-jump must be in [0, %d] (powers of two; the scales' range; 0: no check), got %d",
            FP8_SCALE_EXP_MAX - FP8_SCALE_EXP_MIN, o->fp8_amax_jump);
    if (o->fp8_dispatch != 0 && o->fp8_dispatch != 1)
        BAD("--fp8-dispatch must be 0 or 1 (got %d)", o->fp8_dispatch);
    if (o->fp8_dispatch && !prec_fp8(o->precision))
        BAD("--fp8-dispatch sends the experts' input rows as --precision fp8's or fp8-bf16's FP8 operands; "
            "this "
            "run's precision is %s",
            prec_name(o->precision));
    if (o->fp8_weight_cache != 0 && o->fp8_weight_cache != 1)
        BAD("--fp8-weight-cache must be 0 or 1 (got %d)", o->fp8_weight_cache);
    if (!o->fp8_weight_cache && !prec_fp8(o->precision))
        BAD("--fp8-weight-cache 0 quantises --precision fp8's or fp8-bf16's expert weights at every use; "
            "this run's "
            "precision is %s",
            prec_name(o->precision));
    if (o->fp8_save != 0 && o->fp8_save != 1) BAD("--fp8-save must be 0 or 1 (got %d)", o->fp8_save);
    if (o->fp8_save && !prec_fp8(o->precision))
        BAD("--fp8-save keeps the experts' SwiGLU inputs as --precision fp8's or fp8-bf16's FP8 tiles; this "
            "run's precision is %s",
            prec_name(o->precision));
    if (o->fp8_save && (o->recompute & RECOMPUTE_MOE))
        BAD("--fp8-save and --recompute %s both take the experts' SwiGLU rows out of the layers (FP8 copies "
            "or none): pick one",
            o->recompute == RECOMPUTE_FULL ? "full" : "moe");
    if (o->fp8_dense && !prec_fp8(o->precision))
        BAD("--fp8-dense puts the attention projections into --precision fp8's or fp8-bf16's FP8 GEMMs; this "
            "run's precision is %s",
            prec_name(o->precision));
    if (o->fp8_dense && o->tp > 1)
        BAD("--fp8-dense with --tp %d: the heads' slices would cut the projections' 128x128 weight blocks "
            "and "
            "1x128 input tiles (other scales than one process's); --fp8-dense takes --tp 1 for now",
            o->tp);
    if (prec_fp8(o->precision) && o->etp > 1)
        BAD("--precision %s with --etp %d: an expert's slices would cut its 128x128 weight blocks (other "
            "scales than one process's); fp8 takes --etp 1 for now",
            prec_name(o->precision), o->etp);
#undef BAD
    return NULL;
}

const char *train_options_validate(const TrainOptions *o, const ModelConfig *c) {
    static char msg[256];
#define BAD(...) \
    do { \
        snprintf(msg, sizeof msg, __VA_ARGS__); \
        return msg; \
    } while (0)
    if (o->steps < 1) BAD("--steps must be >= 1 (got %d)", o->steps);
    if (o->batch < 1) BAD("--batch must be >= 1 (got %d)", o->batch);
    if (o->grad_accum < 1) BAD("--grad-accum must be >= 1 (got %d)", o->grad_accum);
    if (o->batch % o->grad_accum)
        BAD("--batch %d is not divisible by --grad-accum %d", o->batch, o->grad_accum);
    if (o->seq_len < 1) BAD("--seq-len must be >= 1 (got %d)", o->seq_len);
    if (o->seq_len > c->max_seq_len)
        BAD("--seq-len %d exceeds the model's max_seq_len %d", o->seq_len, c->max_seq_len);
    if (c->mtp_depth && o->seq_len <= c->mtp_depth)
        BAD("--seq-len %d leaves --mtp %d no position to predict (it needs --seq-len > %d)", o->seq_len,
            c->mtp_depth, c->mtp_depth);
    // floats: finite and in range (the negated comparisons also refuse NaN)
    if (!(o->lr > 0 && o->lr <= 10)) BAD("--lr must be in (0, 10] (got %g)", o->lr);
    if (!(o->min_lr_frac >= 0 && o->min_lr_frac <= 1))
        BAD("--min-lr-frac must be in [0, 1] (got %g)", o->min_lr_frac);
    if (o->warmup < 0) BAD("--warmup must be >= 0 (got %d)", o->warmup);
    if (o->recompute_layers < 0 || o->recompute_layers > c->n_layers)
        BAD("--recompute-layers must be in [0, %d] (the model's layers; 0: every layer), got %d", c->n_layers,
            o->recompute_layers);
    if (o->recompute_layers && !o->recompute)
        BAD("--recompute-layers %d without --recompute attn|moe|full (nothing to recompute)",
            o->recompute_layers);
    if (o->loss_chunks < 1 || (int64_t)o->loss_chunks > (int64_t)o->batch / o->grad_accum * o->seq_len)
        BAD("--loss-chunks must be in [1, %lld] (a micro-batch's rows: --batch / --grad-accum x --seq-len), "
            "got %d",
            (long long)o->batch / o->grad_accum * o->seq_len, o->loss_chunks);
    if (o->vocab_parallel != 0 && o->vocab_parallel != 1)
        BAD("--vocab-parallel must be 0 or 1 (got %d)", o->vocab_parallel);
    if (o->vocab_parallel && o->tp > c->vocab_size)
        BAD("--vocab-parallel with --tp %d: a vocabulary of %d rows leaves a TP rank none", o->tp,
            c->vocab_size);
    if (!(o->weight_decay >= 0 && isfinite(o->weight_decay)))
        BAD("--weight-decay must be >= 0 and finite (got %g)", o->weight_decay);
    if (!(o->beta1 >= 0 && o->beta1 < 1)) BAD("--beta1 must be in [0, 1) (got %g)", o->beta1);
    if (!(o->beta2 >= 0 && o->beta2 < 1)) BAD("--beta2 must be in [0, 1) (got %g)", o->beta2);
    if (!(o->adam_eps > 0 && o->adam_eps <= 1)) BAD("--adam-eps must be in (0, 1] (got %g)", o->adam_eps);
    if (!(o->grad_clip >= 0 && isfinite(o->grad_clip)))
        BAD("--grad-clip must be >= 0 and finite (got %g)", o->grad_clip);
    if (o->eval_every < 0) BAD("--eval-every must be >= 0 (got %d)", o->eval_every);
    if (o->eval_batches < 0) BAD("--eval-batches must be all or >= 1 (got %d)", o->eval_batches);
    if (!(o->val_frac > 0 && o->val_frac <= 0.5)) BAD("--val-frac must be in (0, 0.5] (got %g)", o->val_frac);
    if (!data_val_frac_holds(o->val_frac))
        BAD("--val-frac %g holds out no token (it is read to 6 decimals): the smallest that works is %g",
            o->val_frac, DATA_VAL_FRAC_MIN);
    if (o->val_data[0] && !o->data[0])
        BAD("--val-data needs --data (the embedded corpus holds out its own windows)");
    struct stat sd, sv;
    if (o->val_data[0] &&
        (!strcmp(o->val_data, o->data) ||
         (stat(o->data, &sd) == 0 && stat(o->val_data, &sv) == 0 && sd.st_dev == sv.st_dev &&
          sd.st_ino == sv.st_ino)))
        BAD("--val-data is the same file as --data: the validation loss would be measured on training "
            "tokens (drop --val-data to hold out --val-frac of --data)");
    if (o->save_every < -1) BAD("--save-every must be >= -1 (got %d)", o->save_every);
    if (o->keep < 0) BAD("--keep must be >= 0 (got %d)", o->keep);
    if (!(o->dropout >= 0 && o->dropout < 1)) BAD("--dropout must be in [0, 1) (got %g)", o->dropout);
    if (o->tensorboard != 0 && o->tensorboard != 1)
        BAD("--tensorboard must be 0 or 1 (got %d)", o->tensorboard);
    if (!(o->mfu_peak >= 0 && isfinite(o->mfu_peak)))
        BAD("--mfu-peak must be a TFLOP/s figure >= 0 (0: the GPU's built-in profile), got %g", o->mfu_peak);
    if (!(o->embed_dropout >= 0 && o->embed_dropout < 1))
        BAD("--embed-dropout must be in [0, 1) (got %g)", o->embed_dropout);
    if (o->sample_tokens < 0 || o->sample_tokens > SAMPLE_MAX_TOKENS)
        BAD("--sample-tokens must be in 0..%d (SAMPLE_MAX_TOKENS; got %d)", SAMPLE_MAX_TOKENS,
            o->sample_tokens);
    if (!o->out[0]) BAD("--out must not be empty");
    if (o->zero < 0 || o->zero > 2) BAD("--zero must be 0, 1 or 2 (got %d)", o->zero);
    if (o->overlap < 0 || o->overlap > 1) BAD("--overlap must be 0 or 1 (got %d)", o->overlap);
    if (!(o->bucket_mb > 0 && o->bucket_mb <= 1048576))
        BAD("--bucket-mb must be in (0, 1048576] (got %g)", o->bucket_mb);
    if (o->a2a_overlap != 0 && o->a2a_overlap != 1 && o->a2a_overlap != 2 && o->a2a_overlap != 4 &&
        o->a2a_overlap != 8)
        BAD("--a2a-overlap must be auto, 1, 2, 4 or 8 (got %d)", o->a2a_overlap);
    if (o->bf16_grads != 0 && o->bf16_grads != 1) BAD("--bf16-grads must be 0 or 1 (got %d)", o->bf16_grads);
    if (o->ampipe != 0 && o->ampipe != 1 && o->ampipe != 2 && o->ampipe != 4 && o->ampipe != 8)
        BAD("--ampipe must be auto, 1, 2, 4 or 8 (got %d)", o->ampipe);
    if (o->upcycle < 0 || o->upcycle == 1 || o->upcycle > 1 << 16)
        BAD("--upcycle must be 0 (off) or the experts per layer, at least 2 (got %d)", o->upcycle);
    if (o->a2a_hier < -1) BAD("--a2a-hier must be auto, off or a rank count >= 1 (got %d)", o->a2a_hier);
    if (!(o->a2a_retune > 0 && o->a2a_retune <= 10))
        BAD("--a2a-retune must be in (0, 10] (got %g)", o->a2a_retune);
    if (o->vpp < 1) BAD("--vpp must be >= 1 (got %d)", o->vpp);
    if (o->vpp > 1 && o->pp_schedule != SCHED_INTERLEAVED)
        BAD("--vpp %d needs --pp-schedule interleaved (1f1b runs one chunk per rank)", o->vpp);
    if (o->pp_schedule == SCHED_INTERLEAVED && o->vpp < 2)
        BAD("--pp-schedule interleaved needs --vpp >= 2 model chunks per rank (got %d)", o->vpp);
    if (o->resume && o->force) BAD("--resume and --force contradict each other; pick one");
    const char *f8 = fp8_options_bad(o, msg, sizeof msg);
    if (f8) return f8;
#undef BAD
    return NULL;
}

float lr_at(const TrainOptions *o, int step) {
    if (step < o->warmup) return o->lr * (step + 1) / (float)o->warmup;
    int span = o->steps - o->warmup;
    float frac = span > 0 ? (float)(step - o->warmup) / span : 1.0f;
    if (frac > 1) frac = 1;
    float cosv = 0.5f * (1.0f + cosf(3.14159265358979f * frac));
    return o->lr * (o->min_lr_frac + (1.0f - o->min_lr_frac) * cosv);
}
