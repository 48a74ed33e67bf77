// cmd_info.c (cli) — `moe info`: the parameter, FLOP and memory figures of a preset, config or
// checkpoint. Must not hold: the figures themselves (train/info.c).
#include <stdio.h>
#include "cli/commands.h"
#include "core/common.h"
#include "io/hf.h"
#include "train/info.h"
#include "train/pretrained.h"

int cmd_info(State *s) {
    ModelConfig c = s->model;
    if (opt_set(s, "world") && s->cli.world < 1) DIE("--world must be >= 1 (got %d)", s->cli.world);
    opt_check_bf16_storage(s);
    if (s->cli.ckpt[0]) {
        char ck[2048];
        pretrained_resolve(s->cli.ckpt, ck, sizeof ck);
        pretrained_config(ck, &c);
        printf("%s: %s\n", hf_is_model_dir(ck) ? "Hugging Face model" : "checkpoint", ck);
    }
    info_print(&c, &s->train, s->cli.world);
    return 0;
}
