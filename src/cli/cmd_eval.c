// cmd_eval.c (cli) — `moe sample` and `moe eval`: a checkpoint of ours or a Hugging Face model run
// forward, with the defaults they take from the training run's record (run.json beside the
// checkpoint). Must not hold: training, the run record's writing (run_record.c).
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>
#include <sys/stat.h>
#include <cjson/cJSON.h>
#include "cli/commands.h"
#include "core/common.h"
#include "data/data.h"
#include "model/model.h"
#include "io/checkpoint.h"
#include "io/hf.h"
#include "text/corpus.h"
#include "text/prep.h"
#include "text/tokenizer.h"
#include "train/dump.h"
#include "train/eval.h"
#include "train/sample.h"
#include "train/pretrained.h"
#include "train/pipe.h"

// The run's record beside a checkpoint of ours (its run directory's run.json): the options `moe eval`
// takes from it unless given: T, the batch (the run's micro-batch), the data and its split, the
// evaluation batches. from: where the values came from, for the output. Returns 1 when a record was read.
static int eval_defaults(State *s, const char *ck, int hf, char *from, size_t n) {
    char run[2100];
    path_parent(run, sizeof run, ck);
    cJSON *rec = hf ? NULL : run_record_read(run);
    if (!rec) {
        snprintf(from, n, "%s; pass --seq-len, --batch and --data to match the training run",
                 hf ? "a Hugging Face model: the built-in defaults"
                    : "no run.json beside the checkpoint: the built-in defaults");
        return 0;
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
    return 1;
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

// The tokenizer of --ckpt: --tokenizer, else a Hugging Face directory's tokenizer.json, else the copy of
// the run the checkpoint belongs to (RUN/tokenizer/); NULL: none (bytes, as always). path: which. Dies
// when its vocabulary does not fit the model's embedding.
static Tokenizer *ckpt_tokenizer(const State *s, const char *ck, const ModelConfig *c, char *path, size_t n) {
    char run[2100];
    path_parent(run, sizeof run, ck);
    if (s->cli.tokenizer[0]) snprintf(path, n, "%s", s->cli.tokenizer);
    else if (hf_is_model_dir(ck)) join_path(path, n, ck, "tokenizer.json");
    else join_path(path, n, run, RUN_TOKENIZER);
    if (!s->cli.tokenizer[0] && !file_exists(path) && !dir_exists(path)) return NULL;
    Tokenizer *t = tok_load(path);
    if (tok_vocab_size(t) > c->vocab_size)
        DIE("the tokenizer %s has %d ids; the model's embedding (%s) has %d", path, tok_vocab_size(t), ck,
            c->vocab_size);
    return t;
}

// A sampled token printed as it comes (through the streaming decoder: a character split over tokens
// appears once whole).
static void emit_text(void *arg, int32_t id) {
    print_tokens(stdout, arg, &id, 1, 0);
    fflush(stdout);
}

// The prompt's tokens into ctx (capacity for the sample too): bytes, or with a tokenizer its ids (an
// empty prompt: the tokenizer's EOS, the start of a document, else a newline).
static int32_t *prompt_tokens(const State *s, Tokenizer *tok, const char *tpath, int *len, int *cap) {
    const char *p = s->cli.prompt;
    size_t n = strlen(p), got = 0, icap = 0;
    int32_t *ids = NULL;
    if (tok) {
        const char *from;
        got = tok_encode(tok, p, n, s->cli.add_special, &ids, &icap);
        int eos = got ? -1 : prep_find_eos(tok, tpath, &from);
        if (!got && eos >= 0) {
            ids = xrealloc(ids, sizeof *ids);
            ids[got++] = eos;
        }
        if (!got) got = tok_encode(tok, "\n", 1, 0, &ids, &icap);
    }
    *cap = (int)(tok ? got : n) + s->cli.tokens + 1;
    int32_t *ctx = xmalloc(sizeof(int32_t) * *cap);
    *len = 0;
    for (size_t i = 0; i < (tok ? got : n); i++) ctx[(*len)++] = tok ? ids[i] : (unsigned char)p[i];
    if (*len == 0) ctx[(*len)++] = '\n';
    free(ids);
    return ctx;
}

int cmd_sample(State *s) {
    char ck[2048];
    pretrained_resolve(s->cli.ckpt, ck, sizeof ck);
    if (s->cli.tokens < 0 || s->cli.tokens > SAMPLE_MAX_TOKENS)
        DIE("--tokens must be in 0..%d (got %d)", SAMPLE_MAX_TOKENS, s->cli.tokens);
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
    char tpath[2200];
    Tokenizer *tok = ckpt_tokenizer(s, ck, &c, tpath, sizeof tpath);
    if (!tok && s->cli.add_special)
        DIE("--add-special: the model has no tokenizer (pass --tokenizer DIR|tokenizer.json)");
    if (!tok && c.vocab_size < 256)
        DIE("sample: the model's vocabulary (%d) is smaller than bytes; cannot encode the prompt",
            c.vocab_size);
    char from[2300];
    int W = sample_window(s, ck, &c, from, sizeof from);
    pretrained_load(&m, ck, 1, W, &st, s->train.seed, s->train.device);
    int len, cap;
    int32_t *ctx = prompt_tokens(s, tok, tpath, &len, &cap);
    Pipe one; // the model alone: one stage
    pipe_init(&one, &m, NULL, 1);
    TokStream *ts = tok ? tok_stream_new(tok, 0) : NULL;
    SampleOptions so = {s->cli.temperature, s->cli.top_k,  s->cli.top_p,           W,
                        s->cli.kv_cache,    s->train.seed, tok ? emit_text : NULL, ts};
    if (tok) { // the prompt as given, then each token as it is drawn (the stream holds the prompt's ids)
        fputs(s->cli.prompt, stdout);
        for (int i = 0; i < len; i++) tok_stream_step(ts, ctx[i], &(size_t){0});
    }
    SampleStats ss;
    sample_tokens(&one, ctx, &len, cap, s->cli.tokens, &so, &ss);
    if (!tok) print_tokens(stdout, NULL, ctx, len, c.vocab_size);
    printf("\n");
    tok_stream_free(ts);
    tok_free(tok);
    fprintf(stderr, "sampled %d tokens in %.3f s (%.1f tokens/s; %s, window %d: %s; %d prefill%s)\n",
            ss.tokens, ss.seconds, ss.seconds > 0 ? ss.tokens / ss.seconds : 0.0,
            ss.cached ? "KV cache" : "no cache", W, from, ss.prefills, ss.prefills == 1 ? "" : "s");
    if (tok) fprintf(stderr, "tokenizer: %s\n", tpath);
    free(ctx);
    pipe_free(&one);
    model_free(&m);
    return 0;
}

// eval's text data with a tokenizer: the shards of the run's cache (RUN/data/) when it holds this text
// tokenised so, else tokenised into a directory of its own under $TMPDIR (removed once read: tmp).
static char eval_tmp[2][1100];
static void remove_eval_tmp(void) {
    for (int k = 0; k < 2; k++)
        if (eval_tmp[k][0]) rm_rf(eval_tmp[k]);
}
static const char *eval_text(Tokenizer *tok, const char *tpath, const char *ck, int hf, const char *path,
                             int k, char *pattern, size_t n) {
    if (!tok || !path || data_is_shards(path)) return path;
    const char *who = k ? "--val-data" : "--data", *from;
    FilePrint tp = file_print(tok_file(tok), "--tokenizer");
    int eos = corpus_eos(tok, tpath, path, who, &from);
    char run[2100], dir[2200];
    path_parent(run, sizeof run, ck);
    join_path(dir, sizeof dir, run, RUN_DATA);
    static const char *const names[] = {"train", "val"};
    for (int i = 0; i < 2 && !hf; i++)
        if (corpus_shards(tok, tp, eos, from, path, dir, names[i], 0, who, pattern, n, NULL)) return pattern;
    const char *t = getenv("TMPDIR");
    snprintf(eval_tmp[k], sizeof eval_tmp[k], "%s/moe_eval_%d_%d", t && *t ? t : "/tmp", (int)getpid(), k);
    if (dir_exists(eval_tmp[k])) rm_rf(eval_tmp[k]);
    corpus_shards(tok, tp, eos, from, path, eval_tmp[k], "text", 1, who, pattern, n, NULL);
    moe_set_die_cleanup(remove_eval_tmp);
    return pattern;
}

// --dump's path, before anything is read: a new or regular file in a writable directory (a FIFO would block
// the process at the end, a directory or device fail only after the whole evaluation).
static void check_dump_path(const char *p) {
    struct stat sb;
    if (stat(p, &sb) == 0 && !S_ISREG(sb.st_mode))
        DIE("--dump '%s' is not a regular file (%s): the dump is a safetensors file written whole", p,
            S_ISDIR(sb.st_mode)        ? "a directory"
                : S_ISFIFO(sb.st_mode) ? "a FIFO"
                                       : "a device or socket");
    char dir[2048];
    path_parent(dir, sizeof dir, p);
    if (!dir_exists(dir)) DIE("--dump: the directory '%s' does not exist", dir);
    if (access(dir, W_OK) != 0) DIE("--dump: cannot write in '%s' (%s)", dir, strerror(errno));
}

int cmd_eval(State *s) {
    char ck[2048];
    pretrained_resolve(s->cli.ckpt, ck, sizeof ck);
    if (s->cli.dump_grads && !s->cli.dump[0]) DIE("--dump-grads needs --dump FILE");
    if (s->cli.dump[0]) check_dump_path(s->cli.dump);
    int hf = hf_is_model_dir(ck);
    ModelConfig c;
    pretrained_config(ck, &c);
    TrainState st;
    char from[2200];
    int recorded = eval_defaults(s, ck, hf, from, sizeof from);
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
    char tpath[2200], dpat[2300], vpat[2300];
    Tokenizer *tok = ckpt_tokenizer(s, ck, &c, tpath, sizeof tpath);
    const char *data = eval_text(tok, tpath, ck, hf, s->train.data[0] ? s->train.data : NULL, 0, dpat,
                                 sizeof dpat),
               *val = eval_text(tok, tpath, ck, hf, s->train.val_data[0] ? s->train.val_data : NULL, 1, vpat,
                                sizeof vpat);
    Dataset ds;
    data_open_split(&ds, data, val, s->train.val_frac, st.seed, T);
    remove_eval_tmp();
    moe_set_die_cleanup(NULL);
    if (tok && data != s->train.data && data) // (the shards' name: the text and the tokenizer instead)
        snprintf(ds.source, sizeof ds.source, "text:%s via %s", s->train.data, tok_file(tok));
    tok_free(tok);
    if (ds.max_token >= c.vocab_size)
        DIE("the data's vocabulary does not fit the model: token %d, vocab_size %d", ds.max_token,
            c.vocab_size);
    if (!recorded && !s->train.data[0]) // (once nothing can fail; on stderr: stdout stays as it was)
        fprintf(
            stderr,
            "moe: note: no --data: evaluating on the embedded synthetic corpus (byte tokens from --seed), "
            "not on what %s was trained on; pass --data FILE for that\n",
            ck);
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
