// cmd_prep.c (cli) — `moe prep` and `moe tokenizer train`: the options checked and handed to text/prep.c,
// which writes the shards, and text/bpe_train.c, which learns a tokenizer.
// Must not hold: reading inputs, writing shards or training (text/).
#include "cli/commands.h"
#include "core/common.h"
#include "text/bpe_train.h"
#include "text/prep.h"

int cmd_prep(State *s) {
    const CliOptions *c = &s->cli;
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

int cmd_tokenizer_train(State *s) {
    const CliOptions *c = &s->cli;
    if (!c->vocab) DIE("tokenizer train: --vocab N is required (the vocabulary size)");
    if (!*c->inputs) DIE("tokenizer train: --data FILE [FILE ...] is required");
    if (!opt_set(s, "out")) DIE("tokenizer train: --out tokenizer.json|DIR is required");
    PrepOptions in = {.inputs = c->inputs, .field = c->field, .lines = c->lines};
    bpe_train_run(&in, c->vocab, c->special, s->train.out);
    return 0;
}
