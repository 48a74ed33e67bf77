// commands.h (cli) — the `moe` commands, each run on the options parsed for it; each returns the
// process's exit status (or dies with a message). Must not hold: option parsing (options.h).
#pragma once
#include "cli/options.h"

// train: argc/argv are main's whole command line (MPI may rewrite them; the run record keeps them).
int cmd_train(State *s, int argc, char **argv);
int cmd_sample(State *s);
int cmd_eval(State *s);
int cmd_info(State *s);
int cmd_export(State *s);
int cmd_tokenize(State *s);
int cmd_prep(State *s);
int cmd_tokenizer_train(State *s);
int cmd_plan(State *s);
// compare: its own words (run directories, --out), after the command word.
int cmd_compare(int argc, char **argv);
