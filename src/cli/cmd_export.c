// cmd_export.c (cli) — `moe export`: a checkpoint of ours written as a Hugging Face model directory
// of its family. Must not hold: the conversion itself (io/hf.c).
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include "cli/commands.h"
#include "core/common.h"
#include "io/checkpoint.h"
#include "io/hf.h"
#include "train/pretrained.h"

// The run's tokenizer (RUN/tokenizer/, beside the checkpoint) into the model directory, as transformers
// finds it there; 0 when the run has none.
static int export_tokenizer(const char *ck, const char *out) {
    char run[2100], dir[2200];
    path_parent(run, sizeof run, ck);
    join_path(dir, sizeof dir, run, RUN_TOKENIZER);
    if (!dir_exists(dir)) return 0;
    static const char *const files[] = {"tokenizer.json", "tokenizer_config.json"};
    for (int k = 0; k < 2; k++) {
        char from[2300], to[2300];
        join_path(from, sizeof from, dir, files[k]);
        join_path(to, sizeof to, out, files[k]);
        size_t n;
        char *b = read_file(from, &n);
        if (!b) DIE("export: cannot read '%s' (%s)", from, strerror(errno));
        FILE *f = xfopen(to, "wb");
        xfwrite(b, 1, n, f, to);
        xfclose(f, to);
        free(b);
    }
    return 1;
}

int cmd_export(State *s) {
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
    if (export_tokenizer(ck, s->train.out))
        printf("  tokenizer.json     (the run's tokenizer, with tokenizer_config.json naming its EOS)\n");
    printf("load with: transformers.AutoModelForCausalLM.from_pretrained(\"%s\", dtype=torch.float32)\n",
           s->train.out);
    return 0;
}
