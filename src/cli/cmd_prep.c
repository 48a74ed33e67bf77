// cmd_prep.c (cli) — `moe prep`: the options checked and handed to text/prep.c, which writes the shards.
// Must not hold: reading inputs or writing shards (text/prep.c).
#include "cli/commands.h"
#include "core/common.h"
#include "text/prep.h"

int cmd_prep(State *s) {
    const CliOptions *c = &s->cli;
    if (!*c->tokenizer) DIE("prep: --tokenizer DIR|tokenizer.json is required");
    if (!*c->inputs) DIE("prep: --in FILE [FILE ...] is required");
    if (!opt_set(s, "out")) DIE("prep: --out DIR is required (the directory to create for the shards)");
    PrepOptions o = {.tokenizer = c->tokenizer,
                     .inputs = c->inputs,
                     .out = s->train.out,
                     .field = c->field,
                     .eos = c->eos,
                     .lines = c->lines,
                     .add_special = c->add_special,
                     .val_docs = c->val_docs,
                     .shard_tokens = c->shard_tokens};
    prep_run(&o);
    return 0;
}
