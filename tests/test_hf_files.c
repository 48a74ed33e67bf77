// test_hf_files.c — Hugging Face model directories without torch: single-file, sharded
// (model.safetensors.index.json), BF16 and transformers' fused expert layout load bit-exactly; bad
// input (truncated header or data, wrong dtype, missing / extra tensor, shape mismatch, bad index,
// configs our model cannot represent) dies with one message naming the file and tensor or key and
// leaves every file untouched; llm.c uint32 shards (magic 20240801, version 7) next to uint16 ones.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cjson/cJSON.h>
#include <dirent.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include "core/common.h"
#include "core/rng.h"
#include "data/data.h"
#include "core/config.h"
#include "io/config_json.h"
#include "model/params.h"
#include "io/checkpoint.h"
#include "io/hf.h"
#include "test_util.h"
#include "test_death.h"
#include "test_cfg.h"

#pragma GCC diagnostic ignored "-Wformat-truncation"

static char root[256];

static ModelConfig small_cfg(void) {
    ModelConfig c = test_small_cfg();
    c.aux_coef = 0.02f;
    c.z_coef = 0.0f;
    return c;
}

// values exactly representable in bf16 (low 16 bits zero), so a BF16 file reads back bit-exactly
static void fill(float *x, size_t n, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) {
        float v = rng_normal(&r) * 0.1f;
        uint32_t b;
        memcpy(&b, &v, 4);
        b &= 0xffff0000u;
        memcpy(&x[i], &b, 4);
    }
}

static void path2(char *buf, size_t n, const char *a, const char *b) { snprintf(buf, n, "%s/%s", a, b); }

static void mkdir_in(char *buf, size_t n, const char *name) {
    path2(buf, n, root, name);
    mkdir_p(buf);
}

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    fputs(s, f);
    fclose(f);
}

// A plain transformers-5 style config.json (no "moe_c"; rope_parameters), with one key replaced
// or added by `patch` ("key": value text) when given.
static void write_config(const char *dir, const ModelConfig *c, const char *patch) {
    char txt[4096], p[512];
    snprintf(
        txt, sizeof txt,
        "{\"architectures\":[\"MixtralForCausalLM\"],\"model_type\":\"mixtral\",\"dtype\":\"bfloat16\","
        "\"vocab_size\":%d,\"hidden_size\":%d,\"intermediate_size\":%d,\"num_hidden_layers\":%d,"
        "\"num_attention_heads\":%d,\"num_key_value_heads\":%d,\"head_dim\":null,\"num_local_experts\":%d,"
        "\"num_experts_per_tok\":%d,\"max_position_embeddings\":%d,\"rms_norm_eps\":1e-05,"
        "\"rope_parameters\":{\"rope_theta\":10000.0,\"rope_type\":\"default\"},\"router_aux_loss_coef\":0."
        "02,"
        "\"router_jitter_noise\":0.0,\"sliding_window\":null,\"tie_word_embeddings\":false,"
        "\"attention_dropout\":0.0,\"hidden_act\":\"silu\"%s%s}",
        c->vocab_size, c->d_model, c->d_ff, c->n_layers, c->n_heads, c->n_kv_heads, c->n_experts, c->top_k,
        c->max_seq_len, "", "");
    cJSON *j = cJSON_Parse(txt);
    if (patch) { // replace (or add) the patched keys
        char pt[1024];
        snprintf(pt, sizeof pt, "{%s}", patch);
        cJSON *q = cJSON_Parse(pt);
        if (!q) {
            fprintf(stderr, "bad patch %s\n", patch);
            exit(2);
        }
        for (cJSON *it = q->child; it; it = it->next) {
            cJSON_DeleteItemFromObjectCaseSensitive(j, it->string);
            cJSON_AddItemToObject(j, it->string, cJSON_Duplicate(it, 1));
        }
        cJSON_Delete(q);
    }
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    path2(p, sizeof p, dir, "config.json");
    write_text(p, out);
    free(out);
}

// ---- a raw safetensors writer: any dtype, any tensor set (the library writes F32 only) ----

typedef struct {
    char name[128];
    const char *dtype;
    int ndim;
    int64_t shape[4];
    const float *data;
} Raw;

static void put_bf16(FILE *f, float v) {
    uint32_t b;
    memcpy(&b, &v, 4);
    uint16_t h = (uint16_t)(b >> 16);
    fwrite(&h, 2, 1, f);
}

static void raw_write(const char *path, const Raw *ts, int n) {
    cJSON *h = cJSON_CreateObject();
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        cJSON *shape = cJSON_CreateArray();
        for (int d = 0; d < ts[i].ndim; d++) {
            numel *= (uint64_t)ts[i].shape[d];
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)ts[i].shape[d]));
        }
        int sz = !strcmp(ts[i].dtype, "BF16") ? 2 : !strcmp(ts[i].dtype, "I64") ? 8 : 4;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "dtype", ts[i].dtype);
        cJSON_AddItemToObject(e, "shape", shape);
        cJSON *o = cJSON_CreateArray();
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + numel * sz)));
        cJSON_AddItemToObject(e, "data_offsets", o);
        cJSON_AddItemToObject(h, ts[i].name, e);
        off += numel * sz;
    }
    char *js = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    uint64_t N = strlen(js);
    FILE *f = fopen(path, "wb");
    fwrite(&N, 8, 1, f);
    fwrite(js, 1, N, f);
    free(js);
    for (int i = 0; i < n; i++) {
        uint64_t numel = 1;
        for (int d = 0; d < ts[i].ndim; d++) numel *= (uint64_t)ts[i].shape[d];
        for (uint64_t j = 0; j < numel; j++) {
            if (!strcmp(ts[i].dtype, "BF16")) put_bf16(f, ts[i].data[j]);
            else if (!strcmp(ts[i].dtype, "I64")) {
                int64_t v = (int64_t)ts[i].data[j];
                fwrite(&v, 8, 1, f);
            } else fwrite(&ts[i].data[j], 4, 1, f);
        }
    }
    fclose(f);
}

// The table's tensors as Raw entries (dtype for all), data from flat.
static Raw *table_raw(const ParamTable *t, const float *flat, const char *dtype) {
    Raw *r = xcalloc((size_t)t->n + 8, sizeof *r);
    for (int i = 0; i < t->n; i++) {
        snprintf(r[i].name, sizeof r[i].name, "%s", t->p[i].name);
        r[i].dtype = dtype;
        r[i].ndim = t->p[i].ndim;
        for (int d = 0; d < t->p[i].ndim; d++) r[i].shape[d] = t->p[i].shape[d];
        r[i].data = flat + t->p[i].offset;
    }
    return r;
}

// ---- death tests (fork; stderr captured) and byte snapshots of a directory ----

typedef struct {
    const char *dir;
    const ParamTable *t;
    float *p;
    const char *shard;
    int T;
} Args;

static void do_params(void *a) {
    Args *x = a;
    hf_load_params(x->dir, x->t, x->p, 0);
}
static void do_config(void *a) {
    Args *x = a;
    ModelConfig c;
    hf_load_config(x->dir, &c);
}
static void do_data(void *a) {
    Args *x = a;
    Dataset ds;
    data_open(&ds, x->shard, 1, x->T);
}

static void expect_death(const char *what, void (*fn)(void *), void *arg, const char *p1, const char *p2) {
    expect_death_msg(what, fn, arg, p1, p2, 1);
}

// Dies as expected, and the directory is byte-for-byte what it was.
static void params_death(const char *what, const char *dir, const ParamTable *t, const char *p1,
                         const char *p2) {
    Snap s;
    snap_take(dir, &s);
    float *p = xcalloc(t->total, sizeof(float));
    Args a = {dir, t, p, NULL, 0};
    expect_death(what, do_params, &a, p1, p2);
    EXPECT(snap_same(dir, &s), "%s: files unchanged", what);
    snap_free(&s);
    free(p);
}

// ---------------------------------------------------------------------------------------------

static void test_single_and_sharded(const ParamTable *t, const ModelConfig *c, const float *w) {
    char d[512], p[512];
    float *got = xcalloc(t->total, sizeof(float));
    // single F32 file written by the library's writer, config as transformers 5 writes it
    mkdir_in(d, sizeof d, "single");
    write_config(d, c, NULL);
    Raw *r = table_raw(t, w, "F32");
    path2(p, sizeof p, d, "model.safetensors");
    raw_write(p, r, t->n);
    EXPECT(hf_is_model_dir(d), "single: is an HF model dir");
    ModelConfig lc;
    hf_load_config(d, &lc);
    EXPECT(lc.vocab_size == c->vocab_size && lc.d_model == c->d_model && lc.head_dim == 4 &&
               lc.rope_theta == 10000.0f && lc.aux_coef == 0.02f && lc.renormalize == 1 && lc.z_coef == 0 &&
               lc.dispatch == DISPATCH_DROPLESS,
           "single: config (rope_parameters, head_dim null -> d/H, Mixtral semantics)");
    hf_load_params(d, t, got, 0);
    EXPECT(memcmp(got, w, t->total * sizeof(float)) == 0, "single: every tensor bit-exact");

    // sharded: three BF16 shards and an index (transformers' names), in a different tensor order
    mkdir_in(d, sizeof d, "sharded");
    write_config(d, c, NULL);
    Raw *b = table_raw(t, w, "BF16");
    cJSON *idx = cJSON_CreateObject(), *meta = cJSON_CreateObject(), *wm = cJSON_CreateObject();
    cJSON_AddNumberToObject(meta, "total_size", (double)t->total * 2);
    cJSON_AddItemToObject(idx, "metadata", meta);
    int per = (t->n + 2) / 3;
    for (int s = 0; s < 3; s++) {
        char fn[64];
        snprintf(fn, sizeof fn, "model-%05d-of-00003.safetensors", s + 1);
        int lo = s * per, hi = lo + per < t->n ? lo + per : t->n;
        Raw *part = xcalloc((size_t)(hi - lo) + 1, sizeof *part);
        for (int i = lo; i < hi; i++) {
            part[hi - 1 - i] = b[i]; // reversed within the shard
            cJSON_AddStringToObject(wm, b[i].name, fn);
        }
        path2(p, sizeof p, d, fn);
        raw_write(p, part, hi - lo);
        free(part);
    }
    cJSON_AddItemToObject(idx, "weight_map", wm);
    char *js = cJSON_Print(idx);
    cJSON_Delete(idx);
    path2(p, sizeof p, d, "model.safetensors.index.json");
    write_text(p, js);
    free(js);
    EXPECT(hf_is_model_dir(d), "sharded: is an HF model dir (index only)");
    memset(got, 0, t->total * sizeof(float));
    hf_load_params(d, t, got, 0);
    EXPECT(memcmp(got, w, t->total * sizeof(float)) == 0, "sharded BF16: every tensor bit-exact");

    // sharded faults (the index is the listing)
    char fn1[] = "model-00001-of-00003.safetensors";
    size_t idx_len;
    char *idx_ok = read_file(p, &idx_len);
    cJSON *j = cJSON_Parse(idx_ok);
    cJSON *m = cJSON_GetObjectItem(j, "weight_map");
    cJSON_ReplaceItemInObject(m, "lm_head.weight", cJSON_CreateString("model-00009-of-00009.safetensors"));
    js = cJSON_Print(j);
    write_text(p, js);
    free(js);
    params_death("index names a missing shard", d, t, "model-00009-of-00009.safetensors", "lm_head.weight");
    cJSON_ReplaceItemInObject(m, "lm_head.weight", cJSON_CreateString(fn1)); // not in shard 1
    js = cJSON_Print(j);
    write_text(p, js);
    free(js);
    params_death("index maps to the wrong shard", d, t, "missing tensor lm_head.weight", fn1);
    cJSON_ReplaceItemInObject(m, "lm_head.weight", cJSON_CreateString("../escape.safetensors"));
    js = cJSON_Print(j);
    write_text(p, js);
    free(js);
    params_death("index points outside the dir", d, t, "../escape.safetensors", "lm_head.weight");
    cJSON_ReplaceItemInObject(m, "lm_head.weight", cJSON_CreateString(fn1));
    cJSON_AddStringToObject(m, "model.norm.weight", fn1); // a JSON object with a key twice
    js = cJSON_Print(j);
    write_text(p, js);
    free(js);
    params_death("index lists a tensor twice", d, t, "has the key \"model.norm.weight\" twice",
                 "model.safetensors.index.json");
    cJSON *dup = m->child; // the second one: the object's last item
    while (dup->next) dup = dup->next;
    cJSON_Delete(cJSON_DetachItemViaPointer(m, dup));
    cJSON_DeleteItemFromObject(m, "lm_head.weight");
    js = cJSON_Print(j);
    write_text(p, js);
    free(js);
    params_death("index lacks a tensor", d, t, "tensor lm_head.weight is missing",
                 "model.safetensors.index.json");
    cJSON_Delete(j);
    write_text(p, idx_ok);
    memset(got, 0, t->total * sizeof(float));
    hf_load_params(d, t, got, 0);
    EXPECT(memcmp(got, w, t->total * sizeof(float)) == 0, "sharded: loads again once the index is restored");
    free(idx_ok);

    free(r);
    free(b);
    free(got);
}

// transformers' in-memory layout: mlp.gate, mlp.experts.gate_up_proj (E,2f,d) = [w1; w3], down_proj (E,d,f)
static void test_fused(const ParamTable *t, const ModelConfig *c, const float *w) {
    char d[512], p[512];
    mkdir_in(d, sizeof d, "fused");
    write_config(d, c, NULL);
    int E = c->n_experts, f = c->d_ff, dm = c->d_model, L = c->n_layers;
    Raw *r = xcalloc((size_t)t->n + 8, sizeof *r);
    int n = 0;
    float *gu = xmalloc(sizeof(float) * (size_t)L * E * 2 * f * dm),
          *dn = xmalloc(sizeof(float) * (size_t)L * E * dm * f);
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *s = &t->p[i];
        const float *src = w + s->offset;
        size_t blk = (size_t)f * dm;
        if (s->role == PR_W1 || s->role == PR_W3) {
            memcpy(gu + ((size_t)s->layer * E + s->expert) * 2 * blk + (s->role == PR_W3 ? blk : 0), src,
                   blk * 4);
            continue;
        }
        if (s->role == PR_W2) {
            memcpy(dn + ((size_t)s->layer * E + s->expert) * blk, src, blk * 4);
            continue;
        }
        Raw *x = &r[n++];
        if (s->role == PR_ROUTER)
            snprintf(x->name, sizeof x->name, "model.layers.%d.mlp.gate.weight", s->layer);
        else snprintf(x->name, sizeof x->name, "%s", s->name);
        x->dtype = "F32";
        x->ndim = s->ndim;
        x->shape[0] = s->shape[0];
        x->shape[1] = s->shape[1];
        x->data = src;
    }
    for (int l = 0; l < L; l++) {
        Raw *x = &r[n++];
        snprintf(x->name, sizeof x->name, "model.layers.%d.mlp.experts.gate_up_proj", l);
        x->dtype = "F32";
        x->ndim = 3;
        x->shape[0] = E;
        x->shape[1] = 2 * f;
        x->shape[2] = dm;
        x->data = gu + (size_t)l * E * 2 * f * dm;
        x = &r[n++];
        snprintf(x->name, sizeof x->name, "model.layers.%d.mlp.experts.down_proj", l);
        x->dtype = "F32";
        x->ndim = 3;
        x->shape[0] = E;
        x->shape[1] = dm;
        x->shape[2] = f;
        x->data = dn + (size_t)l * E * dm * f;
    }
    static const float inv[2] = {1, 0.5f}; // old checkpoints carry this buffer; it is ignored
    Raw *x = &r[n++];
    snprintf(x->name, sizeof x->name, "model.layers.0.self_attn.rotary_emb.inv_freq");
    x->dtype = "F32";
    x->ndim = 1;
    x->shape[0] = 2;
    x->data = inv;
    path2(p, sizeof p, d, "model.safetensors");
    raw_write(p, r, n);
    float *got = xcalloc(t->total, sizeof(float));
    hf_load_params(d, t, got, 0);
    EXPECT(memcmp(got, w, t->total * sizeof(float)) == 0, "fused expert layout: every tensor bit-exact");
    free(got);
    free(gu);
    free(dn);
    free(r);
}

static void test_bad_files(const ParamTable *t, const ModelConfig *c, const float *w) {
    char d[512], p[512];
    Raw *r = table_raw(t, w, "F32");
    int iv = params_find(t, "model.layers.1.self_attn.v_proj.weight");
    // truncated header: the length field claims more than the file holds
    mkdir_in(d, sizeof d, "trunc_header");
    write_config(d, c, NULL);
    path2(p, sizeof p, d, "model.safetensors");
    raw_write(p, r, t->n);
    if (truncate(p, 40) != 0) perror("truncate");
    params_death("truncated header", d, t, "model.safetensors' is corrupt: header length", NULL);
    // truncated data: the last tensor's bytes are cut off
    mkdir_in(d, sizeof d, "trunc_data");
    write_config(d, c, NULL);
    path2(p, sizeof p, d, "model.safetensors");
    raw_write(p, r, t->n);
    struct stat st;
    stat(p, &st);
    if (truncate(p, st.st_size - 4) != 0) perror("truncate");
    params_death("truncated data", d, t, "has data_offsets outside the data section", "lm_head.weight");
    // wrong dtype
    mkdir_in(d, sizeof d, "dtype");
    write_config(d, c, NULL);
    r[iv].dtype = "I64";
    path2(p, sizeof p, d, "model.safetensors");
    raw_write(p, r, t->n);
    r[iv].dtype = "F32";
    params_death("wrong dtype (I64)", d, t, "tensor model.layers.1.self_attn.v_proj.weight has dtype I64",
                 "F32, BF16 and F16");
    // missing tensor
    mkdir_in(d, sizeof d, "missing");
    write_config(d, c, NULL);
    Raw keep = r[iv];
    r[iv] = r[t->n - 1];
    path2(p, sizeof p, d, "model.safetensors");
    raw_write(p, r, t->n - 1);
    r[iv] = keep;
    params_death("missing tensor", d, t, "tensor model.layers.1.self_attn.v_proj.weight is missing",
                 "model.safetensors");
    // shape mismatch: v_proj (8,16) stored as (16,8)
    mkdir_in(d, sizeof d, "shape");
    write_config(d, c, NULL);
    r[iv].shape[0] = t->p[iv].shape[1];
    r[iv].shape[1] = t->p[iv].shape[0];
    path2(p, sizeof p, d, "model.safetensors");
    raw_write(p, r, t->n);
    r[iv].shape[0] = t->p[iv].shape[0];
    r[iv].shape[1] = t->p[iv].shape[1];
    params_death("shape mismatch", d, t,
                 "tensor model.layers.1.self_attn.v_proj.weight has shape [16,8], config expects [8,16]",
                 NULL);
    // a tensor the config does not have (a third layer)
    mkdir_in(d, sizeof d, "extra");
    write_config(d, c, NULL);
    r[t->n] = r[iv];
    snprintf(r[t->n].name, sizeof r[t->n].name, "model.layers.2.self_attn.v_proj.weight");
    path2(p, sizeof p, d, "model.safetensors");
    raw_write(p, r, t->n + 1);
    params_death("extra tensor", d, t,
                 "has tensor model.layers.2.self_attn.v_proj.weight, which the config does not have", NULL);
    // no weights at all, or only pytorch_model.bin
    mkdir_in(d, sizeof d, "noweights");
    write_config(d, c, NULL);
    EXPECT(!hf_is_model_dir(d), "config.json alone is not an HF model dir");
    params_death("no weights", d, t, "has neither model.safetensors nor model.safetensors.index.json", NULL);
    path2(p, sizeof p, d, "pytorch_model.bin");
    write_text(p, "not really");
    params_death("pytorch_model.bin only", d, t, "has only pytorch_model.bin weights", NULL);
    free(r);
}

static void config_death(const char *what, const ModelConfig *c, const char *patch, const char *phrase) {
    char d[512];
    mkdir_in(d, sizeof d, "cfg");
    write_config(d, c, patch);
    Args a = {d, NULL, NULL, NULL, 0};
    expect_death(what, do_config, &a, phrase, "config.json");
}

static void test_configs(const ModelConfig *c) {
    config_death("sliding window", c, "\"sliding_window\":16", "sliding-window attention is not supported");
    config_death("tied embeddings", c, "\"tie_word_embeddings\":true", "tied embeddings are not supported");
    config_death("rope scaling (5.x)", c,
                 "\"rope_parameters\":{\"rope_theta\":1e4,\"rope_type\":\"yarn\",\"factor\":4.0}",
                 "rope_type \"yarn\" is not supported");
    config_death("rope scaling (4.x)", c, "\"rope_scaling\":{\"type\":\"linear\",\"factor\":2.0}",
                 "RoPE scaling is not supported");
    config_death("activation", c, "\"hidden_act\":\"gelu\"", "\"hidden_act\" must be \"silu\"");
    config_death("model type", c, "\"model_type\":\"llama\"", "expected \"mixtral\"");
    config_death("attention dropout out of range", c, "\"attention_dropout\":1.5",
                 "\"attention_dropout\" is 1.5; it must be in [0, 1)");
    config_death("quantized", c, "\"quantization_config\":{\"quant_method\":\"gptq\"}",
                 "quantized models are not supported");
    config_death("no rope theta", c, "\"rope_parameters\":{\"rope_type\":\"default\"}", "rope_theta");
    config_death("bad head split", c, "\"num_key_value_heads\":3",
                 "n_heads=4 is not divisible by n_kv_heads=3");
    // rope_parameters win over a legacy rope_theta; the legacy key alone works too
    char d[512];
    ModelConfig lc;
    mkdir_in(d, sizeof d, "cfg");
    write_config(d, c, "\"rope_theta\":500.0");
    hf_load_config(d, &lc);
    EXPECT(lc.rope_theta == 10000.0f, "rope_parameters.rope_theta wins over rope_theta (%g)", lc.rope_theta);
    // HF's attention_dropout is the model's attention-probability dropout (moe train --attn-dropout)
    mkdir_in(d, sizeof d, "cfg");
    write_config(d, c, "\"attention_dropout\":0.125");
    hf_load_config(d, &lc);
    EXPECT(lc.attention_dropout == 0.125f, "attention_dropout 0.125 read as %g", lc.attention_dropout);
    // our own config.json (what moe export writes) reads back exactly, floats as floats
    ModelConfig o = *c;
    o.z_coef = 0.001f;
    o.jitter = 0.0f;
    o.rope_theta = 5000.0f;
    o.attention_dropout = 0.25f;
    cJSON *j = config_to_json(&o);
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    EXPECT(strstr(txt, "\"router_jitter_noise\":\t0.0") && strstr(txt, "\"rope_theta\":\t5000.0"),
           "floats are written with a decimal point (transformers' strict config): %s", txt);
    cJSON *k = cJSON_Parse(txt);
    ModelConfig back;
    char err[256];
    EXPECT(config_from_json(k, &back, err, sizeof err) == 0 && memcmp(&back, &o, sizeof o) == 0,
           "own config round trip %s", err);
    cJSON_Delete(k);
    free(txt);
}

// ---- llm.c shards: uint32 (20240801 v7) and uint16 (20240520 v1) ----

static void write_shard(const char *path, int magic, int version, int count, const uint32_t *tok, int n,
                        int bytes) {
    int32_t hdr[256] = {0};
    hdr[0] = magic;
    hdr[1] = version;
    hdr[2] = count;
    FILE *f = fopen(path, "wb");
    fwrite(hdr, 4, 256, f);
    for (int i = 0; i < n; i++) {
        if (bytes == 4) fwrite(&tok[i], 4, 1, f);
        else {
            uint16_t h = (uint16_t)tok[i];
            fwrite(&h, 2, 1, f);
        }
    }
    fclose(f);
}

static void test_shards(void) {
    char d[512], p[512], pat[600];
    mkdir_in(d, sizeof d, "shards");
    enum { N = 2000 };
    uint32_t *tok = xmalloc(N * sizeof *tok);
    for (int i = 0; i < N; i++) tok[i] = (uint32_t)((i * 7919u) % 70001u); // beyond uint16
    tok[N / 2] = 70000;
    path2(p, sizeof p, d, "a_32.bin");
    write_shard(p, 20240801, 7, N, tok, N, 4);
    Dataset ds;
    data_open(&ds, p, 1, 16);
    int same = ds.n_tokens == N;
    for (int i = 0; same && i < N; i++) same = ds.tokens[i] == (int32_t)tok[i];
    EXPECT(same, "uint32 shard: every token as written (ids beyond 65535)");
    EXPECT(ds.max_token == 70000 && ds.vocab_size == 70016, "uint32 shard: max token %d, vocab %d",
           ds.max_token, ds.vocab_size);
    data_close(&ds);
    // a uint16 shard next to it: one stream, files in sorted order
    uint32_t small[N];
    for (int i = 0; i < N; i++) small[i] = (uint32_t)(i % 300);
    path2(p, sizeof p, d, "b_16.bin");
    write_shard(p, 20240520, 1, N, small, N, 2);
    snprintf(pat, sizeof pat, "%s/*.bin", d);
    data_open(&ds, pat, 1, 16);
    same = ds.n_tokens == 2 * N;
    for (int i = 0; same && i < N; i++)
        same = ds.tokens[i] == (int32_t)tok[i] && ds.tokens[N + i] == (int32_t)small[i];
    EXPECT(same, "uint32 + uint16 shards concatenate in sorted order");
    data_close(&ds);
    Args a = {NULL, NULL, NULL, p, 16};
    path2(p, sizeof p, d, "bad_version.bin");
    write_shard(p, 20240801, 1, N, tok, N, 4);
    expect_death("uint32 shard, wrong version", do_data, &a, "unsupported version 1", "20240801");
    path2(p, sizeof p, d, "bad_width.bin");
    write_shard(p, 20240801, 7, N, tok, N, 2); // uint16 payload under the uint32 magic
    expect_death("uint32 shard, uint16 payload", do_data, &a, "is truncated: header says 2000 tokens", NULL);
    path2(p, sizeof p, d, "too_long.bin");
    write_shard(p, 20240520, 1, N / 2, small, N, 2);
    expect_death("uint16 shard, extra bytes", do_data, &a, "size mismatch", "2 bytes x 1000 tokens");
    path2(p, sizeof p, d, "huge_id.bin");
    tok[5] = 0xfffffff0u;
    write_shard(p, 20240801, 7, N, tok, N, 4);
    expect_death("uint32 shard, id beyond int32", do_data, &a, "token 4294967280 at position 5 is too large",
                 NULL);
    free(tok);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/test_hf_XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    ModelConfig c = small_cfg();
    ParamTable t;
    params_build(&t, &c);
    float *w = xmalloc(t.total * sizeof(float));
    fill(w, t.total, 42);
    test_single_and_sharded(&t, &c, w);
    test_fused(&t, &c, w);
    test_bad_files(&t, &c, w);
    test_configs(&c);
    test_shards();
    free(w);
    params_free(&t);
    rm_rf(root);
    return test_done("test_hf_files");
}
