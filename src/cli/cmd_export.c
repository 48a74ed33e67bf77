// cmd_export.c (cli) — `moe export`: a checkpoint of ours written as a Hugging Face model directory
// of its family. Must not hold: the conversion itself (io/hf.c).
#include <stdio.h>
#include "cli/commands.h"
#include "core/common.h"
#include "io/hf.h"
#include "train/pretrained.h"

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
    printf("load with: transformers.AutoModelForCausalLM.from_pretrained(\"%s\", dtype=torch.float32)\n",
           s->train.out);
    return 0;
}
