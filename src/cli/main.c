// main.c (cli) — the `moe` command line: the command word, the options parsed for it (options.c),
// then the command (cmd_*.c). Must not hold: an option or a command's own work.
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <errno.h>
#include "cli/commands.h"
#include "core/common.h"

// OpenMP threads that wait by spinning (libgomp's default when OMP_WAIT_POLICY is unset) make a machine
// that other processes share a cliff: on 2 busy cores 30 training steps took 55 s instead of 4 s, and
// sampling was 50-140x slower. Unless the user chose a wait policy, moe runs with OMP_WAIT_POLICY=passive:
// libgomp reads it when it loads, before main, so the process runs itself again once with it set
// (MOE_OMP_DEFAULT=1 says the choice was moe's; train prints it). If that exec fails, nothing changes.
static void openmp_wait_default(char **argv) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) == 0 && setenv("MOE_OMP_DEFAULT", "1", 1) == 0)
        execv("/proc/self/exe", argv);
    unsetenv("OMP_WAIT_POLICY");
    unsetenv("MOE_OMP_DEFAULT");
}

// A command's report that did not reach stdout (a full disk, a closed pipe's EPIPE with SIGPIPE ignored) is
// an error, not exit 0. (train's stdout goes through its log's tee, which checks its own writes.)
static int output_checked(int rc) {
    errno = 0;
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "moe: error: cannot write to standard output (%s)\n",
                errno ? strerror(errno) : "a write failed");
        return rc ? rc : 1;
    }
    return rc;
}

int main(int argc, char **argv) {
    openmp_wait_default(argv);
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout, 0);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "compare")) // positional runs: its own words
        return output_checked(cmd_compare(argc - 2, argv + 2));
    int sub = !strcmp(argv[1], "tokenizer"); // `moe tokenizer train`: two words
    if (sub && (argc < 3 || strcmp(argv[2], "train"))) {
        fprintf(stderr, "moe: error: tokenizer: expected 'moe tokenizer train' (got '%s')\n",
                argc < 3 ? "moe tokenizer" : argv[2]);
        return 2;
    }
    int cmd = sub                      ? C_TOKTRAIN
        : !strcmp(argv[1], "train")    ? C_TRAIN
        : !strcmp(argv[1], "sample")   ? C_SAMPLE
        : !strcmp(argv[1], "eval")     ? C_EVAL
        : !strcmp(argv[1], "info")     ? C_INFO
        : !strcmp(argv[1], "export")   ? C_EXPORT
        : !strcmp(argv[1], "tokenize") ? C_TOKENIZE
        : !strcmp(argv[1], "prep")     ? C_PREP
        : !strcmp(argv[1], "plan")     ? C_PLAN
                                       : 0;
    if (!cmd) {
        fprintf(stderr,
                "moe: error: unknown command '%s' (train, sample, eval, info, export, tokenize, prep, plan, "
                "compare, tokenizer train)\n",
                argv[1]);
        return 2;
    }
    static State s;
    state_defaults(&s);
    parse(&s, cmd, argc - 2 - sub, argv + 2 + sub);
    signals_init(cmd == C_TRAIN); // train: SIGTERM/SIGINT checkpoint and exit MOE_EXIT_PREEMPTED
    if (cmd == C_EXPORT) return output_checked(cmd_export(&s));
    if (cmd == C_TOKENIZE) return output_checked(cmd_tokenize(&s));
    if (cmd == C_PREP) return output_checked(cmd_prep(&s));
    if (cmd == C_TOKTRAIN) return output_checked(cmd_tokenizer_train(&s));
    if (cmd == C_PLAN) return output_checked(cmd_plan(&s));
    if (cmd != C_TRAIN)
        return output_checked(cmd == C_SAMPLE ? cmd_sample(&s) : cmd == C_EVAL ? cmd_eval(&s) : cmd_info(&s));
    return cmd_train(&s, argc, argv);
}
