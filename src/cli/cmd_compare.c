// cmd_compare.c (cli) — `moe compare RUN_A RUN_B ... [--out FILE.png]`: its own words (run directories, one
// --out, --help) parsed, then train/compare.c. It takes none of the option table's options.
// Must not hold: reading runs or drawing (train/compare.c).
#include <stdio.h>
#include <string.h>
#include "cli/commands.h"
#include "core/common.h"
#include "train/compare.h"

static void compare_usage(FILE *f) {
    fprintf(f,
            "usage: moe compare RUN_A [RUN_B ...] [--out FILE.png]\n\n"
            "A table of each run's final training and validation loss, best validation loss (and its step),\n"
            "tokens and tokens/s, from its metrics.jsonl and run.json.\n\n"
            "options:\n"
            "  --out FILE.png         also draw the runs' training loss and validation curves in one PNG\n"
            "  --help                 this text\n");
}

int cmd_compare(int argc, char **argv) {
    const char **runs = xcalloc((size_t)argc + 1, sizeof *runs);
    const char *png = NULL;
    int n = 0;
    for (int a = 0; a < argc; a++) {
        const char *w = argv[a];
        if (!strcmp(w, "--help") || !strcmp(w, "-h")) {
            compare_usage(stdout);
            free(runs);
            return 0;
        }
        if (!strcmp(w, "--out") || !strncmp(w, "--out=", 6)) {
            if (png) DIE("compare: --out given twice");
            if (w[5] == '=') png = w + 6;
            else if (a + 1 < argc) png = argv[++a];
            else DIE("compare: option '--out' needs a value");
            if (!*png) DIE("compare: --out needs a file name");
        } else if (!strncmp(w, "--", 2)) DIE("compare: unknown option '%s' (see moe compare --help)", w);
        else runs[n++] = w;
    }
    int rc = compare_runs(runs, n, png);
    free(runs);
    return rc;
}
