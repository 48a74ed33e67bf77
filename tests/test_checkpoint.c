// test_checkpoint.c — config.json round trip, checkpoint save/load bit-exactness, the safetensors
// header (parsed independently), atomic replacement, ckpt_find_latest, and fork-based death tests
// for corrupt / truncated / incomplete / mismatched checkpoints (files untouched by failed loads).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <cjson/cJSON.h>
#include <dirent.h>
#include <float.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>
#include "core/common.h"
#include "core/rng.h"
#include "core/config.h"
#include "io/config_json.h"
#include "model/params.h"
#include "io/safetensors.h"
#include "io/checkpoint.h"
#include "test_util.h"
#include "test_death.h"
#include "test_cfg.h"

// Paths here live under a short mkdtemp root; truncation cannot happen.
#pragma GCC diagnostic ignored "-Wformat-truncation"

static char root[256];

static int cfg_equal(const ModelConfig *a, const ModelConfig *b) {
#define F(x) \
    do { \
        if (memcmp(&a->x, &b->x, sizeof a->x) != 0) { \
            fprintf(stderr, "  field " #x " differs\n"); \
            return 0; \
        } \
    } while (0)
    F(vocab_size);
    F(d_model);
    F(n_layers);
    F(n_heads);
    F(n_kv_heads);
    F(head_dim);
    F(d_ff);
    F(n_experts);
    F(top_k);
    F(max_seq_len);
    F(rope_theta);
    F(norm_eps);
    F(init_std);
    F(renormalize);
    F(jitter);
    F(aux_coef);
    F(z_coef);
    F(dispatch);
    F(capacity_factor);
#undef F
    return 1;
}

static void fill_random(float *x, size_t n, uint64_t seed) {
    Rng r;
    rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) x[i] = rng_normal(&r) * 0.1f;
    // values that must survive bit-exactly
    uint32_t nan_bits = 0x7fc12345u;
    x[0] = -0.0f;
    x[1] = 1e-40f;
    x[2] = FLT_MAX;
    x[4] = -INFINITY;
    memcpy(&x[3], &nan_bits, 4);
}

static void path2(char *buf, size_t n, const char *a, const char *b) { snprintf(buf, n, "%s/%s", a, b); }


// ---- death tests ----

typedef struct {
    const char *dir;
    const ParamTable *t;
    float *p, *m, *v;
    TrainState *st;
    int config_only;
    const char *st_path; // read_with_reader instead
    const char *suffix;
} LoadArgs;

// The tensors of t, named "<name><suffix>", from a safetensors file with the one-tensor reader;
// returns how many tensors the file holds besides them.
static int read_with_reader(const char *path, const ParamTable *t, float *flat, const char *suffix) {
    StFile *f = safetensors_open(path);
    char nm[256];
    for (int i = 0; i < t->n; i++) {
        snprintf(nm, sizeof nm, "%s%s", t->p[i].name, suffix ? suffix : "");
        safetensors_read(f, nm, t->p[i].ndim, t->p[i].shape, flat + t->p[i].offset);
    }
    int extra = safetensors_count(f) - t->n;
    safetensors_close(f);
    return extra;
}

static void do_load(void *arg) {
    LoadArgs *a = arg;
    if (a->st_path) {
        read_with_reader(a->st_path, a->t, a->p, a->suffix);
        return;
    }
    if (a->config_only) {
        ModelConfig c;
        ckpt_load_config(a->dir, &c);
        return;
    }
    ckpt_load(a->dir, a->t, a->p, a->m, a->v, a->st);
}

// Run fn in a child with stderr captured; expect a non-zero exit and `phrase` in the message.
static void expect_death(const char *what, void (*fn)(void *), void *arg, const char *phrase) {
    expect_death_msg(what, fn, arg, phrase, NULL, 0);
}

// Recompute checksums.json of dir (to reach the safetensors reader behind a valid checksum).
static void refresh_checksums(const char *dir) {
    char p[512];
    path2(p, sizeof p, dir, "checksums.json");
    cJSON *j = cJSON_CreateObject(), *files = cJSON_CreateObject();
    const char *names[] = {"config.json", "state.json", "model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 4; i++) {
        char q[512];
        path2(q, sizeof q, dir, names[i]);
        size_t len;
        char *d = read_file(q, &len);
        if (!d) continue;
        char hex[16];
        snprintf(hex, sizeof hex, "%08lx", crc32(0L, (const Bytef *)d, (uInt)len));
        cJSON_AddStringToObject(files, names[i], hex);
        free(d);
    }
    cJSON_AddItemToObject(j, "files", files);
    char *s = cJSON_Print(j);
    FILE *f = fopen(p, "wb");
    fputs(s, f);
    fclose(f);
    free(s);
    cJSON_Delete(j);
}

static void flip_byte(const char *path, long off) {
    FILE *f = fopen(path, "r+b");
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x5a, f);
    fclose(f);
}

static long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

// ---------------------------------------------------------------------------------------------

static void test_config_json(void) {
    ModelConfig c = test_small_cfg();
    c.rope_theta = 12345.678f;
    c.norm_eps = 1e-6f;
    c.init_std = 0.0173f;
    c.jitter = 0.01f;
    c.aux_coef = 0.0123f;
    c.z_coef = 1e-3f;
    c.dispatch = DISPATCH_CAPACITY;
    c.capacity_factor = 1.37f;
    c.renormalize = 0;
    c.max_seq_len = 4096;
    cJSON *j = config_to_json(&c);
    char *txt = cJSON_Print(j);
    cJSON_Delete(j);
    cJSON *k = cJSON_Parse(txt);
    EXPECT(k != NULL, "config JSON parses");
    ModelConfig d;
    char err[256] = "";
    EXPECT(config_from_json(k, &d, err, sizeof err) == 0, "config_from_json: %s", err);
    EXPECT(cfg_equal(&c, &d), "config round trip (capacity, renormalize 0)");
    const cJSON *m = cJSON_GetObjectItem(k, "moe_c");
    EXPECT(cJSON_IsFalse(cJSON_GetObjectItem(m, "mixtral_compatible")),
           "capacity mode is not mixtral compatible");
    EXPECT(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(m, "dispatch")), "capacity") == 0,
           "dispatch string");
    EXPECT(strcmp(cJSON_GetStringValue(cJSON_GetArrayItem(cJSON_GetObjectItem(k, "architectures"), 0)),
                  "MixtralForCausalLM") == 0,
           "architectures");
    EXPECT(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(k, "model_type")), "mixtral") == 0, "model_type");
    EXPECT(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(k, "torch_dtype")), "float32") == 0,
           "torch_dtype");
    EXPECT(cJSON_IsFalse(cJSON_GetObjectItem(k, "tie_word_embeddings")), "tie_word_embeddings false");
    EXPECT(cJSON_IsNull(cJSON_GetObjectItem(k, "sliding_window")), "sliding_window null");
    EXPECT(cJSON_GetObjectItem(k, "hidden_size")->valuedouble == 16, "hidden_size");
    EXPECT(cJSON_GetObjectItem(k, "num_local_experts")->valuedouble == 4, "num_local_experts");
    EXPECT(strstr(txt, "\"rms_norm_eps\":\t1e-06") != NULL, "floats printed short: %s", txt);
    free(txt);

    // dropless + renormalize: compatible; round trip again with other values
    c = test_small_cfg();
    c.norm_eps = 1.0000001e-5f;
    c.rope_theta = 1e6f;
    c.jitter = 0.3333333f;
    j = config_to_json(&c);
    txt = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    cJSON_Delete(k);
    k = cJSON_Parse(txt);
    free(txt);
    EXPECT(cJSON_IsTrue(cJSON_GetObjectItem(cJSON_GetObjectItem(k, "moe_c"), "mixtral_compatible")),
           "dropless+renorm is compatible");
    EXPECT(config_from_json(k, &d, err, sizeof err) == 0 && cfg_equal(&c, &d), "config round trip 2: %s",
           err);

    // missing / bad keys
    cJSON *k2 = cJSON_Duplicate(k, 1);
    cJSON_DeleteItemFromObject(k2, "hidden_size");
    ModelConfig keep = d;
    EXPECT(config_from_json(k2, &d, err, sizeof err) == -1 && strstr(err, "hidden_size"),
           "missing hidden_size: '%s'", err);
    EXPECT(cfg_equal(&keep, &d), "config untouched on error");
    cJSON_Delete(k2);
    k2 = cJSON_Duplicate(k, 1);
    cJSON_ReplaceItemInObject(k2, "num_local_experts", cJSON_CreateString("8"));
    EXPECT(config_from_json(k2, &d, err, sizeof err) == -1 && strstr(err, "num_local_experts"),
           "string experts: '%s'", err);
    cJSON_Delete(k2);
    k2 = cJSON_Duplicate(k, 1);
    cJSON_ReplaceItemInObject(k2, "num_hidden_layers", cJSON_CreateNumber(2.5));
    EXPECT(config_from_json(k2, &d, err, sizeof err) == -1 && strstr(err, "num_hidden_layers"),
           "fractional layers: '%s'", err);
    cJSON_Delete(k2);
    k2 = cJSON_Duplicate(k, 1);
    cJSON_ReplaceItemInObject(cJSON_GetObjectItem(k2, "moe_c"), "dispatch", cJSON_CreateString("sometimes"));
    EXPECT(config_from_json(k2, &d, err, sizeof err) == -1 && strstr(err, "dispatch"), "bad dispatch: '%s'",
           err);
    cJSON_Delete(k2);
    k2 = cJSON_Duplicate(k, 1);
    cJSON_DeleteItemFromObject(cJSON_GetObjectItem(k2, "moe_c"), "z_coef");
    EXPECT(config_from_json(k2, &d, err, sizeof err) == -1 && strstr(err, "z_coef"),
           "missing moe_c.z_coef: '%s'", err);
    cJSON_Delete(k2);
    k2 = cJSON_Duplicate(k, 1);
    cJSON_ReplaceItemInObject(k2, "tie_word_embeddings", cJSON_CreateTrue());
    EXPECT(config_from_json(k2, &d, err, sizeof err) == -1 && strstr(err, "tie_word_embeddings"),
           "tied: '%s'", err);
    cJSON_Delete(k2);
    cJSON_Delete(k);

    // a plain HF Mixtral config.json (no head_dim, no moe_c)
    const char *hf =
        "{\"architectures\":[\"MixtralForCausalLM\"],\"model_type\":\"mixtral\",\"vocab_size\":32000,"
        "\"hidden_size\":4096,\"intermediate_size\":14336,\"num_hidden_layers\":32,\"num_attention_heads\":"
        "32,"
        "\"num_key_value_heads\":8,\"num_local_experts\":8,\"num_experts_per_tok\":2,"
        "\"max_position_embeddings\":32768,\"rope_theta\":1e6,\"rms_norm_eps\":1e-05,"
        "\"router_aux_loss_coef\":0.02,\"sliding_window\":null,\"tie_word_embeddings\":false,"
        "\"torch_dtype\":\"bfloat16\",\"hidden_act\":\"silu\"}";
    k = cJSON_Parse(hf);
    EXPECT(config_from_json(k, &d, err, sizeof err) == 0, "HF config: %s", err);
    EXPECT(d.head_dim == 128 && d.renormalize == 1 && d.dispatch == DISPATCH_DROPLESS &&
               d.aux_coef == 0.02f && d.n_kv_heads == 8 && d.max_seq_len == 32768 && d.rope_theta == 1e6f,
           "HF config defaults");
    cJSON_Delete(k);
}

// Every preset's config, with and without MTP modules, reads back from its config.json byte for byte: what
// --resume needs (trainer.c compares a checkpoint's config with the options given by memcmp, and continues
// with the checkpoint's). The DeepSeek-V3 family's aux coefficient (1e-4 in its presets) once read back as
// the absent aux_loss_alpha's 0: a resumed run trained without the aux loss, and one given its options was
// refused.
static void test_preset_configs(void) {
    char names[512];
    snprintf(names, sizeof names, "%s", config_preset_names());
    int n = 0;
    for (char *save = NULL, *nm = strtok_r(names, ", ", &save); nm; nm = strtok_r(NULL, ", ", &save))
        for (int mtp = 0; mtp <= 1; mtp++) {
            ModelConfig c, d;
            memset(&c, 0, sizeof c);
            EXPECT(config_preset(&c, nm) == 0, "preset %s", nm);
            c.mtp_depth = mtp;
            c.mtp_weight = mtp ? MOE_MTP_WEIGHT : 0;
            cJSON *j = config_to_json(&c);
            char *txt = cJSON_Print(j);
            cJSON_Delete(j);
            cJSON *k = cJSON_Parse(txt);
            char err[256] = "";
            memset(&d, 0xa5, sizeof d);
            int ok = config_from_json(k, &d, err, sizeof err) == 0;
            EXPECT(ok && cfg_equal(&c, &d) && memcmp(&c, &d, sizeof c) == 0,
                   "preset %s (mtp %d): its config.json reads back as it was %s", nm, mtp, err);
            cJSON_Delete(k);
            free(txt);
            n++;
        }
    EXPECT(n >= 20, "the presets' configs round trip (%d checked)", n);
}

static void test_roundtrip_and_format(void) {
    ModelConfig c = test_small_cfg();
    c.jitter = 0.05f;
    ParamTable t;
    params_build(&t, &c);
    size_t N = t.total;
    float *p = xmalloc(N * 4), *m = xmalloc(N * 4), *v = xmalloc(N * 4);
    fill_random(p, N, 1);
    fill_random(m, N, 2);
    fill_random(v, N, 3);
    TrainState st = {.step = 10,
                     .seq_pos = (1ull << 60) + 7,
                     .seed = 0xFEDCBA9876543210ull,
                     .total_steps = 1000,
                     .tokens_seen = 0.1 + 123456789.0};
    char dir[512];
    ckpt_path(dir, sizeof dir, root, 10);
    EXPECT(strstr(dir, "/step_00000010") != NULL, "ckpt_path: %s", dir);
    ckpt_save(dir, &c, &t, p, m, v, &st);
    EXPECT(ckpt_is_complete(dir), "saved checkpoint is complete");

    ModelConfig c2;
    ckpt_load_config(dir, &c2);
    EXPECT(cfg_equal(&c, &c2), "config from checkpoint");
    float *p2 = xcalloc(N, 4), *m2 = xcalloc(N, 4), *v2 = xcalloc(N, 4);
    TrainState st2;
    memset(&st2, 0, sizeof st2);
    ckpt_load(dir, &t, p2, m2, v2, &st2);
    EXPECT(memcmp(p, p2, N * 4) == 0, "params bit-exact");
    EXPECT(memcmp(m, m2, N * 4) == 0, "exp_avg bit-exact");
    EXPECT(memcmp(v, v2, N * 4) == 0, "exp_avg_sq bit-exact");
    EXPECT(st2.step == st.step && st2.seq_pos == st.seq_pos && st2.seed == st.seed &&
               st2.total_steps == st.total_steps &&
               memcmp(&st2.tokens_seen, &st.tokens_seen, sizeof(double)) == 0,
           "state round trip: step %lld seq %llu seed %llx tokens %.17g", (long long)st2.step,
           (unsigned long long)st2.seq_pos, (unsigned long long)st2.seed, st2.tokens_seen);
    memset(p2, 0, N * 4);
    ckpt_load(dir, &t, p2, NULL, NULL, NULL);
    EXPECT(memcmp(p, p2, N * 4) == 0, "params-only load");

    // state.json keeps the seed as an exact decimal string
    char f[512];
    path2(f, sizeof f, dir, "state.json");
    char *txt = read_file(f, NULL);
    cJSON *sj = cJSON_Parse(txt);
    EXPECT(cJSON_IsString(cJSON_GetObjectItem(sj, "seed")) &&
               strcmp(cJSON_GetObjectItem(sj, "seed")->valuestring, "18364758544493064720") == 0,
           "seed string: %s", txt);
    cJSON_Delete(sj);
    free(txt);

    // checksums.json lists every file
    path2(f, sizeof f, dir, "checksums.json");
    txt = read_file(f, NULL);
    cJSON *cj = cJSON_Parse(txt);
    const cJSON *files = cJSON_GetObjectItem(cj, "files");
    const char *names[] = {"config.json", "state.json", "model.safetensors", "optimizer.safetensors"};
    for (int i = 0; i < 4; i++) {
        const cJSON *h = cJSON_GetObjectItem(files, names[i]);
        EXPECT(cJSON_IsString(h) && strlen(h->valuestring) == 8, "checksum for %s", names[i]);
    }
    cJSON_Delete(cj);
    free(txt);

    // model.safetensors, parsed independently
    for (int which = 0; which < 2; which++) {
        path2(f, sizeof f, dir, which ? "optimizer.safetensors" : "model.safetensors");
        size_t len;
        unsigned char *raw = (unsigned char *)read_file(f, &len);
        EXPECT(raw && len >= 8, "read %s", f);
        uint64_t hl = 0;
        for (int b = 0; b < 8; b++) hl |= (uint64_t)raw[b] << (8 * b);
        EXPECT((8 + hl) % 8 == 0, "data 8-byte aligned (header %llu)", (unsigned long long)hl);
        uint64_t nten = which ? 2 * (uint64_t)t.n : (uint64_t)t.n;
        EXPECT(len == 8 + hl + nten / t.n * N * 4, "file size %zu = 8 + %llu + data", len,
               (unsigned long long)hl);
        EXPECT(raw[8] == '{', "header starts with {");
        cJSON *h = cJSON_ParseWithLength((const char *)raw + 8, hl);
        EXPECT(cJSON_IsObject(h), "header is JSON");
        EXPECT(cJSON_GetArraySize(h) == (int)nten + 1, "header has %llu tensors + metadata (got %d)",
               (unsigned long long)nten, cJSON_GetArraySize(h));
        const cJSON *meta = cJSON_GetObjectItem(h, "__metadata__");
        EXPECT(meta && strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(meta, "format")), "pt") == 0,
               "metadata format pt");
        uint64_t expect_off = 0;
        int bad = 0;
        for (int pass = 0; pass < (which ? 2 : 1); pass++)
            for (int i = 0; i < t.n; i++) {
                char nm[160];
                snprintf(nm, sizeof nm, "%s%s", t.p[i].name,
                         which ? (pass ? ".exp_avg_sq" : ".exp_avg") : "");
                const cJSON *e = cJSON_GetObjectItem(h, nm);
                if (!e) {
                    bad++;
                    fprintf(stderr, "  missing %s\n", nm);
                    continue;
                }
                const cJSON *sh = cJSON_GetObjectItem(e, "shape"),
                            *of = cJSON_GetObjectItem(e, "data_offsets");
                int ok = strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(e, "dtype")), "F32") == 0 &&
                    cJSON_GetArraySize(sh) == t.p[i].ndim;
                for (int d = 0; ok && d < t.p[i].ndim; d++)
                    ok = cJSON_GetArrayItem(sh, d)->valuedouble == (double)t.p[i].shape[d];
                ok = ok && cJSON_GetArrayItem(of, 0)->valuedouble == (double)expect_off &&
                    cJSON_GetArrayItem(of, 1)->valuedouble == (double)(expect_off + 4 * t.p[i].numel);
                if (!ok) {
                    bad++;
                    fprintf(stderr, "  bad entry %s\n", nm);
                }
                expect_off += 4 * t.p[i].numel;
            }
        EXPECT(bad == 0, "%d bad header entries in %s", bad, f);
        if (!which) {
            const char *hfn[] = {"model.embed_tokens.weight",
                                 "model.layers.0.input_layernorm.weight",
                                 "model.layers.1.self_attn.q_proj.weight",
                                 "model.layers.1.self_attn.k_proj.weight",
                                 "model.layers.1.post_attention_layernorm.weight",
                                 "model.layers.1.block_sparse_moe.gate.weight",
                                 "model.layers.1.block_sparse_moe.experts.3.w2.weight",
                                 "model.norm.weight",
                                 "lm_head.weight"};
            const int64_t shp[][2] = {{32, 16}, {16, 0},  {16, 16}, {8, 16}, {16, 0},
                                      {4, 16},  {16, 24}, {16, 0},  {32, 16}};
            for (int i = 0; i < 9; i++) {
                const cJSON *sh = cJSON_GetObjectItem(cJSON_GetObjectItem(h, hfn[i]), "shape");
                int nd = shp[i][1] ? 2 : 1;
                EXPECT(sh && cJSON_GetArraySize(sh) == nd &&
                           cJSON_GetArrayItem(sh, 0)->valuedouble == shp[i][0] &&
                           (nd == 1 || cJSON_GetArrayItem(sh, 1)->valuedouble == shp[i][1]),
                       "HF tensor %s shape", hfn[i]);
            }
            EXPECT(memcmp(raw + 8 + hl, p, N * 4) == 0, "data section is the flat buffer in table order");
        } else {
            EXPECT(memcmp(raw + 8 + hl, m, N * 4) == 0 && memcmp(raw + 8 + hl + N * 4, v, N * 4) == 0,
                   "optimizer data section is m then v");
        }
        cJSON_Delete(h);
        free(raw);
    }
    free(p);
    free(m);
    free(v);
    free(p2);
    free(m2);
    free(v2);
    params_free(&t);
}

static int dir_has(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    struct dirent *de;
    int found = 0;
    while (d && (de = readdir(d))) {
        size_t n = strlen(de->d_name), k = strlen(suffix);
        if (n >= k && strcmp(de->d_name + n - k, suffix) == 0) found = 1;
    }
    if (d) closedir(d);
    return found;
}

static void test_overwrite_and_latest(void) {
    ModelConfig c = test_small_cfg();
    ParamTable t;
    params_build(&t, &c);
    size_t N = t.total;
    float *p = xmalloc(N * 4), *q = xmalloc(N * 4);
    char out[512], dir[512], latest[512];
    path2(out, sizeof out, root, "run");
    EXPECT(ckpt_find_latest(out, latest, sizeof latest) == -1, "no out dir -> -1");
    mkdir_p(out);
    EXPECT(ckpt_find_latest(out, latest, sizeof latest) == -1, "empty out dir -> -1");

    TrainState st = {.step = 5};
    fill_random(p, N, 11);
    ckpt_path(dir, sizeof dir, out, 5);
    ckpt_save(dir, &c, &t, p, NULL, NULL, &st);
    // stale .tmp of a later save, and an incomplete later dir: both ignored
    char junk[512];
    snprintf(junk, sizeof junk, "%s/step_00000020.tmp", out);
    mkdir_p(junk);
    snprintf(junk, sizeof junk, "%s/step_00000030", out);
    mkdir_p(junk);
    snprintf(junk, sizeof junk, "%s/step_00000040.old", out);
    mkdir_p(junk);
    ckpt_path(dir, sizeof dir, out, 10);
    st.step = 10;
    ckpt_save(dir, &c, &t, p, NULL, NULL, &st);
    EXPECT(ckpt_find_latest(out, latest, sizeof latest) == 0 && strcmp(latest, dir) == 0, "latest = %s",
           latest);
    EXPECT(!ckpt_is_complete(junk), "incomplete dir not complete");

    // save over the existing step_10 (with a stale step_10.tmp lying around): replaced, no .tmp/.old left
    char stale[512];
    snprintf(stale, sizeof stale, "%s.tmp", dir);
    mkdir_p(stale);
    snprintf(junk, sizeof junk, "%s/garbage", stale);
    FILE *g = fopen(junk, "w");
    fputs("x", g);
    fclose(g);
    fill_random(q, N, 12);
    st.step = 11;
    ckpt_save(dir, &c, &t, q, NULL, NULL, &st);
    float *r = xcalloc(N, 4);
    TrainState st2;
    ckpt_load(dir, &t, r, NULL, NULL, &st2);
    EXPECT(memcmp(r, q, N * 4) == 0 && st2.step == 11, "overwritten checkpoint holds the new params");
    snprintf(junk, sizeof junk, "%s.tmp", dir);
    EXPECT(!file_exists(junk) && !dir_exists(junk), "no step_10.tmp left");
    snprintf(junk, sizeof junk, "%s.old", dir);
    EXPECT(!dir_exists(junk), "no step_10.old left");
    EXPECT(!dir_has(out, "0010.tmp") && !dir_has(out, "0010.old"), "out dir has no step_10 .tmp/.old");
    // the rename fallback (dir -> dir.old, tmp -> dir, remove dir.old), as on filesystems without
    // RENAME_EXCHANGE
    setenv("MOE_CKPT_NO_EXCHANGE", "1", 1);
    snprintf(junk, sizeof junk, "%s.old", dir);
    mkdir_p(junk); // stale .old from an interrupted save
    ckpt_save(dir, &c, &t, p, NULL, NULL, &st);
    unsetenv("MOE_CKPT_NO_EXCHANGE");
    ckpt_load(dir, &t, r, NULL, NULL, NULL);
    EXPECT(memcmp(r, p, N * 4) == 0 && !dir_has(out, "0010.tmp") && !dir_has(out, "0010.old"),
           "save via rename fallback");
    fill_random(p, N, 13);
    // trailing slash is the same checkpoint
    char slash[600];
    snprintf(slash, sizeof slash, "%s/", dir);
    ckpt_save(slash, &c, &t, p, NULL, NULL, &st);
    ckpt_load(dir, &t, r, NULL, NULL, NULL);
    EXPECT(memcmp(r, p, N * 4) == 0 && !dir_has(out, "0010.tmp") && !dir_has(out, "0010.old"),
           "save with trailing slash");

    free(p);
    free(q);
    free(r);
    params_free(&t);
}

static void save_fresh(const char *name, char *dir, size_t n, const ModelConfig *c, const ParamTable *t,
                       const float *p, const float *m, const float *v) {
    snprintf(dir, n, "%s/%s", root, name);
    TrainState st = {.step = 3, .seed = 42};
    ckpt_save(dir, c, t, p, m, v, &st);
}

static void test_failures(void) {
    ModelConfig c = test_small_cfg();
    ParamTable t;
    params_build(&t, &c);
    size_t N = t.total;
    float *p = xmalloc(N * 4), *m = xmalloc(N * 4), *v = xmalloc(N * 4);
    fill_random(p, N, 21);
    fill_random(m, N, 22);
    fill_random(v, N, 23);
    TrainState st;
    char dir[512], f[600];
    Snap s;
    LoadArgs a = {.t = &t, .p = p, .m = m, .v = v, .st = &st};

    // flipped byte in model.safetensors
    save_fresh("flip", dir, sizeof dir, &c, &t, p, m, v);
    path2(f, sizeof f, dir, "model.safetensors");
    flip_byte(f, file_size(f) / 2);
    snap_take(dir, &s);
    a.dir = dir;
    a.config_only = 1;
    expect_death("flip: load_config", do_load, &a, "model.safetensors is corrupt");
    a.config_only = 0;
    expect_death("flip: load", do_load, &a, "crc32 mismatch");
    EXPECT(snap_same(dir, &s), "flip: files unchanged by failed loads");
    snap_free(&s);

    // flipped byte in the optimizer file
    save_fresh("flipopt", dir, sizeof dir, &c, &t, p, m, v);
    path2(f, sizeof f, dir, "optimizer.safetensors");
    flip_byte(f, file_size(f) - 3);
    snap_take(dir, &s);
    a.dir = dir;
    expect_death("flip optimizer: load", do_load, &a, "optimizer.safetensors is corrupt");
    EXPECT(snap_same(dir, &s), "flip optimizer: files unchanged");
    snap_free(&s);

    // truncated model.safetensors
    save_fresh("trunc", dir, sizeof dir, &c, &t, p, m, v);
    path2(f, sizeof f, dir, "model.safetensors");
    EXPECT(truncate(f, file_size(f) - 100) == 0, "truncate");
    snap_take(dir, &s);
    a.dir = dir;
    expect_death("truncated: load", do_load, &a, "corrupt");
    EXPECT(snap_same(dir, &s), "truncated: files unchanged");
    snap_free(&s);

    // checksums.json missing
    save_fresh("nock", dir, sizeof dir, &c, &t, p, m, v);
    path2(f, sizeof f, dir, "checksums.json");
    unlink(f);
    EXPECT(!ckpt_is_complete(dir), "no checksums -> not complete");
    snap_take(dir, &s);
    a.dir = dir;
    a.config_only = 1;
    expect_death("no checksums: load_config", do_load, &a, "not a complete checkpoint");
    a.config_only = 0;
    expect_death("no checksums: load", do_load, &a, "not a complete checkpoint");
    EXPECT(snap_same(dir, &s), "no checksums: files unchanged");
    snap_free(&s);
    char latest[512];
    EXPECT(ckpt_find_latest(root, latest, sizeof latest) == 0 && strstr(latest, "/step_00000010"),
           "find_latest ignores non step_ names: %s", latest);

    // a file deleted but listed
    save_fresh("nostate", dir, sizeof dir, &c, &t, p, m, v);
    path2(f, sizeof f, dir, "state.json");
    unlink(f);
    a.dir = dir;
    expect_death("missing state.json", do_load, &a, "state.json is missing");

    // nonexistent dir
    a.dir = "/nonexistent/step_00000001";
    expect_death("no such checkpoint", do_load, &a, "does not exist");

    // config with a different d_ff: shape mismatch names the tensor and both shapes
    save_fresh("shape", dir, sizeof dir, &c, &t, p, m, v);
    snap_take(dir, &s);
    ModelConfig c2 = c;
    c2.d_ff = 32;
    ParamTable t2;
    params_build(&t2, &c2);
    float *p2 = xcalloc(t2.total, 4), *m2 = xcalloc(t2.total, 4), *v2 = xcalloc(t2.total, 4);
    LoadArgs b = {.dir = dir, .t = &t2, .p = p2, .m = m2, .v = v2, .st = NULL};
    expect_death("d_ff mismatch", do_load, &b,
                 "tensor model.layers.0.block_sparse_moe.experts.0.w1.weight has shape [24,16], config "
                 "expects [32,16]");
    EXPECT(snap_same(dir, &s), "shape: files unchanged");
    params_free(&t2);
    free(p2);
    free(m2);
    free(v2);
    // fewer layers: extra tensor; more layers: missing tensor
    c2 = c;
    c2.n_layers = 1;
    params_build(&t2, &c2);
    p2 = xcalloc(t2.total, 4);
    b.t = &t2;
    b.p = p2;
    b.m = b.v = NULL;
    expect_death("n_layers 2 -> 1", do_load, &b, "which the model config does not have");
    params_free(&t2);
    free(p2);
    c2 = c;
    c2.n_experts = 5;
    params_build(&t2, &c2);
    p2 = xcalloc(t2.total, 4);
    b.t = &t2;
    b.p = p2;
    expect_death("n_experts 4 -> 5", do_load, &b, "shape"); // router gate (4,16) vs (5,16) comes first
    params_free(&t2);
    free(p2);
    c2 = c;
    c2.n_layers = 3;
    params_build(&t2, &c2);
    p2 = xcalloc(t2.total, 4);
    b.t = &t2;
    b.p = p2;
    expect_death("n_layers 2 -> 3", do_load, &b, "missing tensor model.layers.2.input_layernorm.weight");
    params_free(&t2);
    free(p2);
    EXPECT(snap_same(dir, &s), "layer mismatch: files unchanged");
    snap_free(&s);

    // optimizer requested from a checkpoint saved without one
    save_fresh("noopt", dir, sizeof dir, &c, &t, p, NULL, NULL);
    a.dir = dir;
    expect_death("no optimizer file", do_load, &a, "no optimizer state");

    // broken safetensors header behind a valid checksum reaches the reader's checks
    save_fresh("hdr", dir, sizeof dir, &c, &t, p, m, v);
    path2(f, sizeof f, dir, "model.safetensors");
    flip_byte(f, 5); // header length now huge
    refresh_checksums(dir);
    snap_take(dir, &s);
    a.dir = dir;
    expect_death("header length", do_load, &a, "header length");
    EXPECT(snap_same(dir, &s), "header: files unchanged");
    snap_free(&s);

    free(p);
    free(m);
    free(v);
    params_free(&t);
}

// ---- safetensors reader on handcrafted files ----

static void write_st(const char *path, const char *header, const void *data, size_t dlen) {
    FILE *f = fopen(path, "wb");
    uint64_t n = strlen(header);
    unsigned char le[8];
    for (int b = 0; b < 8; b++) le[b] = (unsigned char)(n >> (8 * b));
    fwrite(le, 1, 8, f);
    fwrite(header, 1, n, f);
    if (dlen) fwrite(data, 1, dlen, f);
    fclose(f);
}

static void test_reader(void) {
    ParamSpec ps[2];
    memset(ps, 0, sizeof ps);
    snprintf(ps[0].name, sizeof ps[0].name, "a");
    ps[0].ndim = 2;
    ps[0].shape[0] = 2;
    ps[0].shape[1] = 3;
    ps[0].numel = 6;
    ps[0].offset = 0;
    snprintf(ps[1].name, sizeof ps[1].name, "b");
    ps[1].ndim = 1;
    ps[1].shape[0] = 4;
    ps[1].numel = 4;
    ps[1].offset = 6;
    ParamTable t = {.p = ps, .n = 2, .total = 10, .ltotal = 10};
    float out[10];
    char f[512];
    path2(f, sizeof f, root, "hand.safetensors");

    // a: F16, b: BF16, plus an extra I32 tensor that is not read
    uint16_t data[10 + 2] = {
        0x3C00, 0xC000, 0x0001, 0x7BFF, 0x8000, 0x3555, // 1, -2, 2^-24, 65504, -0, 0.333...
        0x3F80, 0xC040, 0x4049, 0x0000, 0x0007, 0x0000}; // 1, -3, 3.140625, 0; extra int32 7
    write_st(f,
             "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_"
             "offsets\":[0,12]},"
             "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[12,20]},"
             "\"c\":{\"dtype\":\"I32\",\"shape\":[1],\"data_offsets\":[20,24]}}",
             data, sizeof data);
    int extra = read_with_reader(f, &t, out, NULL);
    EXPECT(extra == 1, "one extra tensor (got %d)", extra);
    const float want[10] = {
        1.0f, -2.0f, 5.9604644775390625e-08f, 65504.0f, -0.0f, 0.333251953125f, 1.0f, -3.0f, 3.140625f, 0.0f};
    EXPECT(memcmp(out, want, sizeof want) == 0, "F16/BF16 conversion: %g %g %g %g %g %g | %g %g %g %g",
           out[0], out[1], out[2], out[3], out[4], out[5], out[6], out[7], out[8], out[9]);

    LoadArgs a = {.t = &t, .p = out, .st_path = f};
    // a suffix that does not exist
    a.suffix = ".exp_avg";
    expect_death("reader: missing", do_load, &a, "missing tensor a.exp_avg");
    a.suffix = NULL;
    // wrong dtype
    write_st(f,
             "{\"a\":{\"dtype\":\"I32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[24,40]}}",
             want, 40);
    expect_death("reader: dtype", do_load, &a, "tensor a has dtype I32");
    // wrong shape
    write_st(f,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[3,2],\"data_offsets\":[0,24]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[24,40]}}",
             want, 40);
    expect_death("reader: shape", do_load, &a, "tensor a has shape [3,2], config expects [2,3]");
    // offsets beyond the file
    write_st(f,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[24,40]}}",
             want, 36);
    expect_death("reader: offsets", do_load, &a, "data_offsets");
    // byte count disagrees with dtype x shape
    write_st(f,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[20,36]}}",
             want, 36);
    expect_death("reader: size", do_load, &a, "bytes of data");
    // header is not JSON
    write_st(f, "{\"a\":{\"dtype\":\"F32\",", want, 40);
    expect_death("reader: json", do_load, &a, "not a JSON object");
    // header length larger than the file
    write_st(f, "{}", NULL, 0);
    flip_byte(f, 3);
    expect_death("reader: header length", do_load, &a, "header length");
    // tiny file
    FILE *g = fopen(f, "wb");
    fputs("abc", g);
    fclose(g);
    expect_death("reader: short file", do_load, &a, "not a safetensors file");
    // F32 happy path with the writer
    StTensor ts[2] = {{"a", 2, {2, 3}, want}, {"b", 1, {4}, want + 6}};
    safetensors_write(f, ts, 2, "{\"note\":\"hi\"}");
    memset(out, 0, sizeof out);
    EXPECT(read_with_reader(f, &t, out, "") == 0 && memcmp(out, want, sizeof want) == 0, "writer -> reader");
    StFile *sf = safetensors_open(f);
    EXPECT(safetensors_count(sf) == 2 && !strcmp(safetensors_name(sf, 0), "a") &&
               !strcmp(safetensors_name(sf, 1), "b") && safetensors_name(sf, 2) == NULL,
           "tensor names in header order");
    safetensors_close(sf);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/moe_test_ckpt_XXXXXX");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 2;
    }
    test_config_json();
    test_preset_configs();
    test_roundtrip_and_format();
    test_overwrite_and_latest();
    test_failures();
    test_reader();
    if (!t_failures) rm_rf(root);
    else printf("files kept in %s\n", root);
    return test_done("test_checkpoint");
}
