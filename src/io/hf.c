// hf.c — Hugging Face model directories: read (config.json + model.safetensors or a sharded
// model.safetensors.index.json, per-expert or fused expert layout) and export our checkpoints.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "io/hf.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/common.h"
#include "io/safetensors.h"
#include "io/config_json.h"
#include "io/checkpoint.h"

#define HF_PATH 4096
#define SINGLE "model.safetensors"
#define INDEX "model.safetensors.index.json"

static int has(const char *dir, const char *name) {
    char p[HF_PATH];
    join_path(p, sizeof p, dir, name);
    return file_exists(p);
}

int hf_is_model_dir(const char *dir) {
    return dir_exists(dir) && has(dir, "config.json") && (has(dir, SINGLE) || has(dir, INDEX)) &&
        !has(dir, "state.json") && !has(dir, "checksums.json");
}

static cJSON *read_json(const char *dir, const char *name) {
    char who[HF_PATH + 16];
    snprintf(who, sizeof who, "HF model %s", dir);
    cJSON *j = json_read_file(who, dir, name, NULL);
    if (!cJSON_IsObject(j)) DIE("HF model %s: %s is not a JSON object", dir, name);
    return j;
}

// The model config of config.json's object j (consumed); what: how messages name it.
static void config_of(const char *dir, cJSON *j, const char *what, ModelConfig *c) {
    char err[256];
    ModelConfig cfg;
    if (config_from_json(j, &cfg, err, sizeof err) != 0) DIE("HF model %s: %s: %s", dir, what, err);
    cJSON_Delete(j);
    const char *bad = config_validate(&cfg);
    if (bad) DIE("HF model %s: %s: this model cannot be represented: %s", dir, what, bad);
    *c = cfg;
}

static void mtp_drop_absent(const char *dir, ModelConfig *c);

void hf_load_config(const char *dir, ModelConfig *c) {
    if (!dir_exists(dir)) DIE("HF model %s: not a directory", dir);
    config_of(dir, read_json(dir, "config.json"), "config.json", c);
    mtp_drop_absent(dir, c);
}

void hf_load_config_upcycle(const char *dir, int E, int k, ModelConfig *c) {
    if (!dir_exists(dir)) DIE("HF model %s: not a directory", dir);
    if (E < 2 || k < 1 || k > E)
        DIE("--upcycle %d with --top-k %d: need 2 <= experts and 1 <= top-k <= experts", E, k);
    cJSON *j = read_json(dir, "config.json");
    const cJSON *ar = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const char *an =
        cJSON_IsArray(ar) && cJSON_GetArraySize(ar) == 1 && cJSON_IsString(cJSON_GetArrayItem(ar, 0))
        ? cJSON_GetArrayItem(ar, 0)->valuestring
        : "(none)";
    if (strcmp(an, "LlamaForCausalLM") != 0 && strcmp(an, "MistralForCausalLM") != 0)
        DIE("HF model %s: --upcycle reads a dense LlamaForCausalLM or MistralForCausalLM; its architecture "
            "is %s",
            dir, an);
    // what the dense model has and Mixtral has not: refused when on, dropped when off
    static const char *const flags[] = {"attention_bias", "mlp_bias"};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(j, flags[i]);
        if (f && !cJSON_IsFalse(f))
            DIE("HF model %s: --upcycle: %s is on (Mixtral's projections have no bias)", dir, flags[i]);
        cJSON_DeleteItemFromObjectCaseSensitive(j, flags[i]);
    }
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(j, "pretraining_tp");
    if (tp && !(cJSON_IsNumber(tp) && tp->valuedouble == 1))
        DIE("HF model %s: --upcycle: pretraining_tp is not 1", dir);
    cJSON_DeleteItemFromObjectCaseSensitive(j, "pretraining_tp");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "architectures");
    cJSON_DeleteItemFromObjectCaseSensitive(j, "model_type");
    cJSON *arch = cJSON_AddArrayToObject(j, "architectures");
    cJSON_AddItemToArray(arch, cJSON_CreateString("MixtralForCausalLM"));
    cJSON_AddStringToObject(j, "model_type", "mixtral");
    cJSON_AddNumberToObject(j, "num_local_experts", E);
    cJSON_AddNumberToObject(j, "num_experts_per_tok", k);
    config_of(dir, j, "config.json (upcycled)", c);
}

// ---------------------------------------------------------------------------------------------
// the tensors of a model directory: name -> file

typedef struct {
    const char *name;
    int file;
    int used;
} SrcTensor;
typedef struct {
    const char *dir, *listing; // listing: the file that names the tensors (for messages)
    int nf;
    StFile **f;
    int n;
    SrcTensor *t;
    cJSON *index; // owns the names in the sharded case
    int *order; // t's indices sorted by name (src_find: a binary search; DeepSeek-V3 has ~10^5 tensors)
} Src;

static const SrcTensor *g_sort_t; // (qsort's comparator has no context argument)
static int by_name(const void *a, const void *b) {
    return strcmp(g_sort_t[*(const int *)a].name, g_sort_t[*(const int *)b].name);
}

static int src_find(const Src *s, const char *name) {
    int lo = 0, hi = s->n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2, c = strcmp(s->t[s->order[mid]].name, name);
        if (c == 0) return s->order[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

// Sorts the names once (unique: the safetensors reader refuses a name twice in a file, read_json a key twice
// in the index).
static void src_index(Src *s) {
    s->order = xcalloc((size_t)s->n + 1, sizeof *s->order);
    for (int i = 0; i < s->n; i++) s->order[i] = i;
    g_sort_t = s->t;
    qsort(s->order, (size_t)s->n, sizeof *s->order, by_name);
}

static void src_open(Src *s, const char *dir) {
    memset(s, 0, sizeof *s);
    s->dir = dir;
    char p[HF_PATH];
    if (has(dir, SINGLE)) { // transformers' own order: the single file first
        join_path(p, sizeof p, dir, SINGLE);
        s->listing = SINGLE;
        s->nf = 1;
        s->f = xcalloc(1, sizeof *s->f);
        s->f[0] = safetensors_open(p);
        s->n = safetensors_count(s->f[0]);
        s->t = xcalloc((size_t)s->n + 1, sizeof *s->t);
        for (int i = 0; i < s->n; i++) s->t[i].name = safetensors_name(s->f[0], i);
        src_index(s);
        return;
    }
    if (!has(dir, INDEX)) {
        if (has(dir, "pytorch_model.bin") || has(dir, "pytorch_model.bin.index.json"))
            DIE("HF model %s has only pytorch_model.bin weights; save it with safetensors "
                "(model.save_pretrained(dir, safe_serialization=True))",
                dir);
        DIE("HF model %s has neither %s nor %s", dir, SINGLE, INDEX);
    }
    s->listing = INDEX;
    s->index = read_json(dir, INDEX);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(s->index, "weight_map");
    if (!cJSON_IsObject(wm)) DIE("HF model %s: %s has no \"weight_map\" object", dir, INDEX);
    int cap = cJSON_GetArraySize(wm);
    s->t = xcalloc((size_t)cap + 1, sizeof *s->t);
    s->f = xcalloc((size_t)cap + 1, sizeof *s->f);
    const char **fname = xcalloc((size_t)cap + 1, sizeof *fname);
    for (const cJSON *it = wm->child; it; it = it->next) {
        if (!it->string || !cJSON_IsString(it) || !it->valuestring[0])
            DIE("HF model %s: %s: the weight_map entry for %s is not a file name", dir, INDEX,
                it->string ? it->string : "(unnamed)");
        const char *fn = it->valuestring;
        if (strchr(fn, '/') || strcmp(fn, ".") == 0 || strcmp(fn, "..") == 0)
            DIE("HF model %s: %s: tensor %s is in '%s'; shards must be files in the model directory", dir,
                INDEX, it->string, fn);
        int k = 0;
        while (k < s->nf && strcmp(fname[k], fn) != 0) k++;
        if (k == s->nf) {
            join_path(p, sizeof p, dir, fn);
            if (!file_exists(p))
                DIE("HF model %s: %s maps tensor %s to %s, which does not exist", dir, INDEX, it->string, fn);
            fname[k] = fn;
            s->f[k] = safetensors_open(p);
            s->nf++;
        }
        s->t[s->n].name = it->string;
        s->t[s->n].file = k;
        s->n++;
    }
    free(fname);
    src_index(s);
}

static void src_close(Src *s) {
    for (int i = 0; i < s->nf; i++) safetensors_close(s->f[i]);
    free(s->f);
    free(s->t);
    free(s->order);
    cJSON_Delete(s->index);
    memset(s, 0, sizeof *s);
}

// config.json gives MTP modules (num_nextn_predict_layers) but the files hold none of them (transformers'
// save_pretrained of a DeepSeek-V3 drops them): the main model alone, said on stderr. Some but not all of
// them: refused later by hf_load_params, naming the first missing tensor.
static void mtp_drop_absent(const char *dir, ModelConfig *c) {
    if (c->mtp_depth <= 0) return;
    Src s;
    src_open(&s, dir);
    int any = 0;
    for (int k = 0; k < c->mtp_depth && !any; k++) {
        char nm[96];
        snprintf(nm, sizeof nm, "model.layers.%d.eh_proj.weight", c->n_layers + k);
        any = src_find(&s, nm) >= 0;
    }
    src_close(&s);
    if (any) return;
    fprintf(stderr,
            "moe: note: HF model %s: config.json gives %d MTP module(s) (num_nextn_predict_layers) but its "
            "files hold none (transformers' save_pretrained drops them): the main model alone\n",
            dir, c->mtp_depth);
    c->mtp_depth = 0;
    c->mtp_weight = 0;
}

static void src_read(const Src *s, int i, int ndim, const int64_t *shape, float *dst) {
    safetensors_read(s->f[s->t[i].file], s->t[i].name, ndim, shape, dst);
}

// ---------------------------------------------------------------------------------------------
// reading the parameter table

// How a table tensor is found: directly (src >= 0), or in a fused (E, 2f, d) gate_up_proj / (E, d, f)
// down_proj tensor of its layer (fused >= 0).
typedef struct {
    int src, fused;
} Where;

static void fused_name(char *buf, size_t n, int layer, int down) {
    snprintf(buf, n, "model.layers.%d.mlp.experts.%s", layer, down ? "down_proj" : "gate_up_proj");
}

// The released DeepSeek-V3 checkpoints store each MTP module's embed_tokens and shared_head.head (our
// model shares the main model's, params.h): marks them used (pass 1: s, params NULL) or checks each against
// the main model's tensor (params: read already), refusing one that differs.
static void mtp_shared(Src *s, const char *dir, const ParamTable *t, const float *params) {
    static const char *const kind[2] = {"embed_tokens", "shared_head.head"};
    for (int i = 0; i < t->n; i++) {
        if (t->p[i].role != PR_MTP_EH) continue;
        for (int j = 0; j < 2; j++) {
            char nm[128];
            snprintf(nm, sizeof nm, "model.layers.%d.%s.weight", t->p[i].layer, kind[j]);
            int k = src_find(s, nm), m = params_index(t, j ? PR_LM_HEAD : PR_EMBED, -1, -1);
            if (k < 0) continue;
            if (!params) {
                s->t[k].used = 1;
                continue;
            }
            const ParamSpec *p = &t->p[m];
            float *x = xmalloc(p->numel * sizeof(float));
            src_read(s, k, p->ndim, p->shape, x);
            if (memcmp(x, params + p->offset, p->numel * sizeof(float)))
                DIE("HF model %s: %s differs from %s; the MTP module shares the main model's (a separate one "
                    "is "
                    "not supported)",
                    dir, nm, p->name);
            free(x);
        }
    }
}

void hf_load_params(const char *dir, const ParamTable *t, float *params, int upcycle) {
    Src s;
    src_open(&s, dir);
    Where *w = xcalloc((size_t)t->n, sizeof *w);
    char nm[256];
    // pass 1: resolve every name (nothing read yet), so a missing or extra tensor fails fast
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        w[i].src = src_find(&s, p->name);
        w[i].fused = -1;
        if (w[i].src < 0 && p->role == PR_ROUTER) {
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.gate.weight", p->layer);
            w[i].src = src_find(&s, nm);
        }
        if (w[i].src < 0 && upcycle && (p->role == PR_W1 || p->role == PR_W3 || p->role == PR_W2)) {
            // every expert a copy of the dense MLP: w1 = gate_proj, w3 = up_proj, w2 = down_proj
            snprintf(nm, sizeof nm, "model.layers.%d.mlp.%s.weight", p->layer,
                     p->role == PR_W1       ? "gate_proj"
                         : p->role == PR_W3 ? "up_proj"
                                            : "down_proj");
            w[i].src = src_find(&s, nm);
        }
        if (w[i].src < 0 && upcycle && p->role == PR_ROUTER) continue; // the caller's initialisation stays
        if (w[i].src < 0 && (p->role == PR_W1 || p->role == PR_W3 || p->role == PR_W2)) {
            fused_name(nm, sizeof nm, p->layer, p->role == PR_W2);
            w[i].fused = src_find(&s, nm);
        }
        if (w[i].src < 0 && w[i].fused < 0 && p->role == PR_ROUTE_BIAS)
            continue; // aux-free's bias: starts at 0
        if (w[i].src < 0 && w[i].fused < 0)
            DIE("HF model %s: tensor %s is missing (not in %s)", dir, p->name, s.listing);
        s.t[w[i].src >= 0 ? w[i].src : w[i].fused].used = 1;
    }
    mtp_shared(&s, dir, t, NULL);
    for (int i = 0; i < s.n; i++) {
        const char *x = s.t[i].name;
        size_t lx = strlen(x), li = strlen("rotary_emb.inv_freq");
        if (s.t[i].used || (lx >= li && strcmp(x + lx - li, "rotary_emb.inv_freq") == 0)) continue;
        DIE("HF model %s: %s has tensor %s, which the config does not have (different num_hidden_layers or "
            "num_local_experts, or an unsupported architecture?)",
            dir, s.listing, x);
    }
    // pass 2: read
    float *fz = NULL; // the fused tensor of the current (layer, kind)
    int fz_src = -1;
    for (int i = 0; i < t->n; i++) {
        const ParamSpec *p = &t->p[i];
        float *dst = params + p->offset;
        if (w[i].src >= 0) {
            src_read(&s, w[i].src, p->ndim, p->shape, dst);
            continue;
        }
        if (w[i].fused < 0) { // the routing bias starts at 0; an upcycled router keeps the caller's values
            if (p->role == PR_ROUTE_BIAS) memset(dst, 0, p->numel * sizeof(float));
            continue;
        }
        int down = p->role == PR_W2;
        int64_t E = 0, f = down ? p->shape[1] : p->shape[0], d = down ? p->shape[0] : p->shape[1];
        for (int j = 0; j < t->n; j++) E += t->p[j].layer == p->layer && t->p[j].role == p->role;
        if (fz_src != w[i].fused) {
            int64_t sh[3] = {E, down ? d : 2 * f, down ? f : d};
            fz = xrealloc(fz, (size_t)(sh[0] * sh[1] * sh[2]) * sizeof(float));
            src_read(&s, w[i].fused, 3, sh, fz);
            fz_src = w[i].fused;
        }
        size_t per = (size_t)(f * d); // one expert's block of one projection
        const float *from = down ? fz + (size_t)p->expert * per
                                 : fz + (size_t)p->expert * 2 * per + (p->role == PR_W3 ? per : 0);
        memcpy(dst, from, per * sizeof(float));
    }
    mtp_shared(&s, dir, t, params);
    free(fz);
    free(w);
    src_close(&s);
}

// ---------------------------------------------------------------------------------------------
// export

// Returns 1 if the copy is a copy-on-write clone (FICLONE), 0 if the bytes were copied.
static int copy_file(const char *from, const char *to) {
    FILE *in = fopen(from, "rb");
    if (!in) DIE("cannot open '%s' (%s)", from, strerror(errno));
    FILE *out = xfopen(to, "wb");
    if (ioctl(fileno(out), FICLONE, fileno(in)) == 0) {
        fclose(in);
        xfclose(out, to);
        return 1;
    }
    enum { CH = 1 << 20 };
    char *buf = xmalloc(CH);
    size_t got;
    while ((got = fread(buf, 1, CH, in)) > 0) xfwrite(buf, 1, got, out, to);
    if (ferror(in)) DIE("cannot read '%s' (%s)", from, strerror(errno));
    fclose(in);
    free(buf);
    xfclose(out, to);
    return 0;
}

static int dir_is_empty(const char *p) {
    DIR *d = opendir(p);
    if (!d) return 0;
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n == 0;
}

int hf_export(const char *ckpt, const char *out_in, int force) {
    ModelConfig c;
    ckpt_load_config(ckpt, &c); // verifies every file's checksum
    // what transformers' class of the family computes: dropless, its top-k weighting (Mixtral always
    // renormalises; the others follow norm_topk_prob, written from ours), no routing bias, its softmax router
    // over all experts, unscaled weights, a shared expert only as Qwen2-MoE's (gated), dense layers only
    // where the family has mlp_only_layers
    int mix = c.family == FAM_MIXTRAL, qwen = c.family == FAM_QWEN2_MOE || c.family == FAM_QWEN3_MOE;
    const char *why[10];
    int nw = 0;
    if (c.dispatch == DISPATCH_CAPACITY) why[nw++] = "capacity dispatch drops tokens";
    if (mix && !c.renormalize) why[nw++] = "top-k weights are not renormalised";
    // (DeepseekV3: all of these but capacity are the family's own: config_validate holds them to it)
    int ds = c.family == FAM_DEEPSEEK_V3;
    if (c.balance == BALANCE_AUX_FREE && !ds)
        why[nw++] = "aux-free balancing adds a per-expert bias to the routing scores";
    if (c.route_sigmoid && !ds) why[nw++] = "the router scores are sigmoids";
    if (c.n_group > 1 && !ds) why[nw++] = "the routing is group-limited";
    if (c.route_scale != 0 && c.route_scale != 1 && !ds) why[nw++] = "the routed weights are scaled";
    if (c.n_shared_experts && c.family != FAM_QWEN2_MOE && !ds) why[nw++] = "it has shared experts";
    if (config_moe_layers(&c) < c.n_layers && !qwen && !ds) why[nw++] = "it has dense layers";
    if (config_mla(&c) && !ds) why[nw++] = "it has latent attention";
    if (nw) {
        char list[512] = "";
        for (int i = 0; i < nw; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", why[i]);
        DIE("checkpoint %s is not a %s model (%s): transformers' %s would compute something else; only "
            "dropless dispatch%s without a routing bias can be exported",
            ckpt, mix ? "Mixtral" : config_family_name(c.family), list, config_family_arch(c.family),
            mix ? " with renormalised top-k weights" : "");
    }
    // every tensor present with the config's shape and nothing else (the HF loader would say less)
    ParamTable t;
    params_build(&t, &c);
    float *p = xmalloc(t.total * sizeof(float));
    ckpt_load(ckpt, &t, p, NULL, NULL, NULL);
    free(p);
    params_free(&t);

    char out[HF_PATH - 16], tmp[HF_PATH], q[HF_PATH], src[HF_PATH];
    size_t n = strlen(out_in);
    while (n > 1 && out_in[n - 1] == '/') n--;
    if (n == 0 || n >= sizeof out) DIE("--out: bad path '%s'", out_in);
    memcpy(out, out_in, n);
    out[n] = 0;
    struct stat st;
    if (lstat(out, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) DIE("--out: '%s' exists and is not a directory", out);
        char a[HF_PATH], b[HF_PATH];
        if (realpath(out, a) && realpath(ckpt, b) && strcmp(a, b) == 0)
            DIE("--out: '%s' is the checkpoint itself", out);
        if (!dir_is_empty(out)) {
            if (!force) DIE("--out: '%s' already exists; pass --force to replace it", out);
            if (!hf_is_model_dir(out))
                DIE("--out: '%s' exists and is not a Hugging Face model directory; not replacing it", out);
        }
    }
    // out's parent directories made as `mkdir -p` would (export --out hf/x where hf/ is missing)
    char par[HF_PATH];
    path_parent(par, sizeof par, out);
    if (!dir_exists(par)) mkdir_p(par);
    // a fresh temporary directory beside out (nothing that exists is removed or reused)
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", out);
    if (!mkdtemp(tmp)) DIE("cannot create a temporary directory '%s' (%s)", tmp, strerror(errno));
    if (chmod(tmp, 0755) != 0) DIE("cannot chmod '%s' (%s)", tmp, strerror(errno));

    // a copy, never a hard link: rewriting the exported file must not change the checkpoint (a
    // copy-on-write clone where the filesystem has them, else the bytes)
    join_path(src, sizeof src, ckpt, SINGLE);
    join_path(q, sizeof q, tmp, SINGLE);
    int cloned = copy_file(src, q);
    cJSON *j = config_to_json(&c);
    join_path(q, sizeof q, tmp, "config.json");
    json_write_file(q, j);
    cJSON_Delete(j);
    fsync_dir(tmp);

    if (lstat(out, &st) == 0 && rm_rf(out) != 0) DIE("cannot remove '%s' (%s)", out, strerror(errno));
    xrename(tmp, out);
    fsync_dir(par);
    return cloned;
}
