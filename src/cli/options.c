// options.c (cli) — reading and printing the option table: a value's text into its field (flags,
// --config files, the run record), --preset, the defaults, --help, and the comparison of the model
// options given with a model's config. Must not hold: the table itself (option_table.c), a command's
// own checks (cmd_*.c), the run record's contents (run_record.c).
#include "cli/options.h"
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "core/common.h"

const char *cmd_name(int cmd) {
    return cmd == C_TRAIN   ? "train"
        : cmd == C_SAMPLE   ? "sample"
        : cmd == C_EVAL     ? "eval"
        : cmd == C_EXPORT   ? "export"
        : cmd == C_TOKENIZE ? "tokenize"
        : cmd == C_PREP     ? "prep"
        : cmd == C_PLAN     ? "plan"
        : cmd == C_TOKTRAIN ? "tokenizer train"
                            : "info";
}

void *opt_ptr(State *s, const Opt *o) {
    char *base = o->where == W_MODEL ? (char *)&s->model
        : o->where == W_TRAIN        ? (char *)&s->train
                                     : (char *)&s->cli;
    return base + o->off;
}

// Options naming a file or directory: an empty value is a mistake, never "the default".
int is_path_opt(const char *name) {
    static const char *const paths[] = {"data",      "val-data", "out",       "ckpt", "config",
                                        "init-from", "dump",     "tokenizer", "in"};
    for (size_t k = 0; k < sizeof paths / sizeof *paths; k++)
        if (!strcmp(name, paths[k])) return 1;
    return 0;
}

// A layer list ("0,1,5", "0-2,7"; "" or "none": empty) into the bits of config.h's dense_layers.
static void parse_layers(uint64_t *bits, const char *val, const char *from, const char *name) {
    memset(bits, 0, MOE_MAX_DENSE_LAYERS / 8);
    if (!*val || !strcmp(val, "none")) return;
    const char *q = val;
    for (;;) {
        char *end;
        errno = 0;
        long a = isdigit((unsigned char)*q) ? strtol(q, &end, 10) : -1, b = a;
        if (a >= 0 && *end == '-' && isdigit((unsigned char)end[1])) b = strtol(end + 1, &end, 10);
        if (a < 0 || errno || b < a || b >= MOE_MAX_DENSE_LAYERS || (*end && *end != ','))
            DIE("%s --%s: '%s' is not a list of layers (e.g. 0,1,5 or 0-2; each below %d)", from, name, val,
                MOE_MAX_DENSE_LAYERS);
        for (long l = a; l <= b; l++) bits[l / 64] |= (uint64_t)1 << (l % 64);
        if (!*end) return;
        q = end + 1;
    }
}
// ... and back: the layers as that text, ranges of three or more as a-b ("none": empty).
static void layers_text(char *buf, size_t n, const uint64_t *bits) {
    size_t k = 0;
    buf[0] = 0;
    for (int l = 0; l < MOE_MAX_DENSE_LAYERS && k + 1 < n; l++) {
        if (!((bits[l / 64] >> (l % 64)) & 1)) continue;
        int e = l;
        while (e + 1 < MOE_MAX_DENSE_LAYERS && ((bits[(e + 1) / 64] >> ((e + 1) % 64)) & 1)) e++;
        int w = e - l >= 2 ? snprintf(buf + k, n - k, "%s%d-%d", k ? "," : "", l, e)
                           : snprintf(buf + k, n - k, "%s%d", k ? "," : "", l);
        if (w > 0) k += (size_t)w;
        if (e - l == 1 && k + 1 < n) k += (size_t)snprintf(buf + k, n - k, ",%d", e);
        l = e;
    }
    if (!k) snprintf(buf, n, "none");
}

// Parse value text into the option; `from` names the source for messages.
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
        case O_PATHS: { // appended: each word after the flag is one more path
            size_t have = strlen((char *)p);
            if (!*val) DIE("%s --%s: the path is empty", from, o->name);
            if (strchr(val, '\n'))
                DIE("%s --%s: a path with a newline in it is not supported", from, o->name);
            if (have + 1 + strlen(val) >= o->size)
                DIE("%s --%s: the paths are too long together (max %zu bytes)", from, o->name, o->size - 1);
            if (have) strcat((char *)p, "\n");
            strcat((char *)p, val);
            break;
        }
        case O_LAYERS: parse_layers((uint64_t *)p, val, from, o->name); break;
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

// A value from the run record (who names it): as set_opt, except that an empty path there means none.
void set_recorded(State *s, int i, const char *val, const char *who) {
    if (opts[i].type == O_STR && !*val) {
        *(char *)opt_ptr(s, &opts[i]) = 0;
        s->set[i] = 1;
        return;
    }
    set_opt(s, i, val, who);
}

// The entry of name for cmd; -2: the name exists but not for cmd; -1: no such option.
int find_opt(const char *name, int cmd) {
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
        char lbuf[MOE_MAX_DENSE_LAYERS * 4 + 8];
        if (cJSON_IsString(it)) val = it->valuestring;
        else if (cJSON_IsArray(it) && ty == O_LAYERS) { // [0, 1, 5]: the list's text
            size_t k = 0;
            lbuf[0] = 0;
            for (const cJSON *e = it->child; e; e = e->next) {
                if (!cJSON_IsNumber(e) || e->valuedouble != floor(e->valuedouble) || e->valuedouble < 0 ||
                    e->valuedouble >= MOE_MAX_DENSE_LAYERS)
                    DIE("%s \"%s\" must list layer numbers in 0..%d", from, it->string,
                        MOE_MAX_DENSE_LAYERS - 1);
                if (k + 8 < sizeof lbuf)
                    k += (size_t)snprintf(lbuf + k, sizeof lbuf - k, "%s%d", k ? "," : "",
                                          (int)e->valuedouble);
            }
            val = lbuf;
        } else if (cJSON_IsBool(it) && ty == O_FLAG) val = cJSON_IsTrue(it) ? "1" : "0";
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
void opt_text(char *buf, size_t n, const Opt *o, const void *p) {
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
        case O_STR:
        case O_PATHS: snprintf(buf, n, "%s", (const char *)p); break;
        case O_LAYERS: layers_text(buf, n, (const uint64_t *)p); break;
        case O_FLAG: snprintf(buf, n, "%s", v ? "true" : "false"); break;
        default: snprintf(buf, n, "%d", v); break;
    }
}

// Every option at its default: the tiny preset, train_options_default, the CLI's own.
void state_defaults(State *s) {
    memset(s, 0, sizeof *s);
    config_preset(&s->model, "tiny");
    train_options_default(&s->train);
    s->cli.tokens = 200;
    s->cli.temperature = 0.8f;
    s->cli.top_p = 1.0f;
    s->cli.kv_cache = 1;
    snprintf(s->cli.field, sizeof s->cli.field, "text");
    s->cli.shard_tokens = 100000000; // llm.c's shard size
    snprintf(s->cli.special, sizeof s->cli.special, "<|endoftext|>");
    strcpy(s->cli.gpu, "h200");
    s->cli.nodes_of = 8;
    s->cli.top = 10;
    s->cli.overlap_sms = 20; // (DeepEP's Buffer.num_sms: docs/PLAN.md's options table)
    s->cli.imbalance = 1.25f;
    s->cli.comm_exposed = 1.0f;
    strcpy(s->cli.hide_a2a, "none");
    strcpy(s->cli.a2a_links, "flat");
    strcpy(s->cli.combine, "f32");
    strcpy(s->cli.grouped_rate, "profile");
    strcpy(s->cli.memory_model, "ours");
    strcpy(s->cli.hide_tp, "none");
    strcpy(s->cli.hide_pp, "none");
    strcpy(s->cli.hide_dp, "none");
}

// An option's --help text: "{presets}" in it stands for the names of the preset table (core/config.c).
static const char *help_text(char *buf, size_t n, const char *help) {
    const char *at = strstr(help, "{presets}");
    if (!at) return help;
    snprintf(buf, n, "%.*s%s%s", (int)(at - help), help, config_preset_names(), at + strlen("{presets}"));
    return buf;
}

void usage(FILE *f, int cmd) {
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
                "trained as)\n"
                "  tokenize token ids of a text with a Hugging Face tokenizer.json, or text of ids\n"
                "  prep     text, JSON lines (.gz/.zst), Megatron datasets -> llm.c token shards\n"
                "  plan     rank the layouts of a model on N GPUs by predicted step time (docs/PLAN.md)\n"
                "  compare  runs side by side: final and best losses, tokens, tokens/s; --out: their curves\n"
                "  tokenizer train   learn a byte-level BPE tokenizer.json from text (docs/DATA.md)\n");
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
            : o->type == O_PATHS            ? "S [S ...]"
            : o->type == O_LAYERS           ? "LIST"
            : o->type == O_FLOAT            ? "X"
            : ws                            ? ws->usage
                                            : "N";
        char left[64], def[1100], text[1024];
        snprintf(left, sizeof left, "--%s%s%s", o->name, *arg ? " " : "", arg);
        opt_text(def, sizeof def, o, opt_ptr(&d, o));
        const char *help = help_text(text, sizeof text, o->help);
        if (strstr(help, "default")) fprintf(f, "  %-22s %s\n", left, help);
        else
            fprintf(f, "  %-22s %s (default: %s)\n", left, help,
                    o->type == O_FLAG ? "off"
                        : def[0]      ? def
                                      : "none");
    }
    fprintf(f, "  %-22s %s\n", "--help", "this text");
}

void parse(State *s, int cmd, int argc, char **argv) {
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
    if (config && (cmd & (C_TRAIN | C_INFO | C_PLAN))) apply_config_file(s, config, cmd);
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
        while (opts[i].type == O_PATHS && !eq && a + 1 < argc && strncmp(argv[a + 1], "--", 2) != 0)
            set_opt(s, i, argv[++a], cmd_name(cmd));
    }
    // head_dim follows d_model / n_heads unless given (a preset's own head_dim, e.g. qwen3-moe-30b-a3b's
    // 128 with d / H = 64, stays unless d_model or n_heads is changed)
    int hd = find_opt("head-dim", C_TRAIN), dm = find_opt("d-model", C_TRAIN),
        nh = find_opt("n-heads", C_TRAIN);
    if (!s->set[hd] && (s->set[dm] || s->set[nh]) && s->model.n_heads > 0)
        s->model.head_dim = s->model.d_model / s->model.n_heads;
    // latent attention: head_dim is RoPE's width, qk_rope_head_dim (transformers' DeepseekV3Config), and the
    // key/value heads are the heads, unless given
    if (config_mla(&s->model) && !s->set[hd]) s->model.head_dim = s->model.qk_rope_head_dim;
    int kv = find_opt("n-kv-heads", C_TRAIN);
    if (config_mla(&s->model) && !s->set[kv]) s->model.n_kv_heads = s->model.n_heads;
    // the deepseek_v3 family's YaRN: beta_fast and beta_slow 0 are 32 and 1 (transformers' defaults), which
    // its config.json writes and so reads back: the same values here, or a resume given these options is
    // refused
    if (s->model.family == FAM_DEEPSEEK_V3 && s->model.rope_factor != 0) {
        if (s->model.yarn_beta_fast == 0) s->model.yarn_beta_fast = 32;
        if (s->model.yarn_beta_slow == 0) s->model.yarn_beta_slow = 1;
    }
    // MTP modules take config.h's loss weight unless one is given
    if (!s->set[find_opt("mtp-weight", C_TRAIN)] && s->model.mtp_depth > 0)
        s->model.mtp_weight = MOE_MTP_WEIGHT;
}

int opt_set(const State *s, const char *name) { // (any command's entry of that name)
    for (int i = 0; i < N_OPTS; i++)
        if (!strcmp(opts[i].name, name) && s->set[i]) return 1;
    return 0;
}

void opt_check_bf16_storage(const State *s) {
    if (opt_set(s, "bf16-rounding") && !prec_bf16_storage(s->train.precision))
        DIE("--bf16-rounding rounds the weights of --precision bf16 and fp8-bf16; this run's precision is %s",
            prec_name(s->train.precision));
    if (opt_set(s, "bf16-grads") && !prec_bf16_storage(s->train.precision))
        DIE("--bf16-grads sets the expert gradients of --precision bf16 and fp8-bf16; this run's precision "
            "is %s",
            prec_name(s->train.precision));
}

void fmt_opt(char *buf, size_t n, const Opt *o, const void *p) {
    if (word_set(o->type)) { // an enum's value by its word (auto, all, ... where an integer may be given)
        opt_text(buf, n, o, p);
        return;
    }
    switch (o->type) {
        case O_FLOAT: snprintf(buf, n, "%g", *(const float *)p); break;
        case O_U64: snprintf(buf, n, "%llu", (unsigned long long)*(const uint64_t *)p); break;
        case O_STR:
        case O_PATHS: snprintf(buf, n, "'%s'", (const char *)p); break;
        case O_LAYERS: layers_text(buf, n, (const uint64_t *)p); break;
        default: snprintf(buf, n, "%d", *(const int *)p); break;
    }
}

// The first model option given (flag or config file) whose value differs from c's, or -1; the names
// in allow are not compared but copied into c. a, b (64 bytes): the given and c's values.
int model_conflict(const State *s, ModelConfig *c, const char *const *allow, size_t n_allow, char *a,
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
