// run_record.h (cli) — the run record (run.json in the run directory) that `moe train` writes and a
// --resume reads back. Must not hold: the file's reading and writing (io/checkpoint.h).
#pragma once
#include <cjson/cJSON.h>
#include "cli/options.h"

// --resume: the run record of --out gives every remembered option the user did not set; each one set
// to another value than the record's is an override, printed (rank 0) and returned in *overrides
// for the record. A model option that contradicts the checkpoint's config is refused by name.
// Returns the previous record (NULL: none, a run of an older moe).
cJSON *resume_apply(State *s, int rank0, cJSON **overrides);
// --resume on several processes with no mesh option given: the run record's mesh options (--tp, --ep,
// --etp, --pp, --vpp, --pp-schedule, --pp-layers, --zero) must be the defaults, or it dies giving the
// flags that continue on the run's mesh. A mesh named (any of them) may reshard the run; one process
// has one layout.
void resume_check_mesh(State *s, const cJSON *prev, int world_size);
// The run record's text (malloc'd): the resolved options, the command line that started the run, and
// each resume's command line and overrides (overrides is consumed).
char *record_build(State *s, const cJSON *prev, cJSON *overrides, int argc, char **argv);
