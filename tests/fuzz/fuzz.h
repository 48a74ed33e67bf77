// fuzz.h — shared by the libFuzzer targets in tests/fuzz/: DIE (a refused input, the expected
// outcome for most of them) returns to the target instead of exiting, and the input becomes a
// file, since the readers under test take paths. Must not hold: a target's own checks.
#pragma once
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>
#include "core/common.h"

static jmp_buf fuzz_jb;
static void fuzz_die_hook(void) { longjmp(fuzz_jb, 1); }

// A private scratch directory (in /dev/shm when there is one), made once and removed at exit (libFuzzer
// exits through exit() at -max_total_time / -runs; scripts/fuzz.sh removes it after a crash).
static char fuzz_dir_path[256];
static void fuzz_dir_remove(void) { rm_rf(fuzz_dir_path); }
static const char *fuzz_dir(void) {
    if (!fuzz_dir_path[0]) {
        snprintf(fuzz_dir_path, sizeof fuzz_dir_path, "%s/moe_fuzz_%d",
                 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp", (int)getpid());
        mkdir(fuzz_dir_path, 0700);
        atexit(fuzz_dir_remove);
        moe_set_die_hook(fuzz_die_hook, -1);
    }
    return fuzz_dir_path;
}

// Descriptors a refused input left open (DIE's exit would have closed them): every one from the
// lowest free descriptor at the first input up (libFuzzer opens its own before that).
static void fuzz_close_fds(void) {
    static int base = -1;
    if (base < 0) {
        base = open("/dev/null", O_RDONLY);
        if (base < 0) abort();
        close(base);
        return;
    }
    for (int fd = base; fd < base + 256; fd++) close(fd);
}

// dir/name with exactly the n bytes of data; returns the path (static).
static const char *fuzz_file(const char *name, const uint8_t *data, size_t n) {
    static char p[512];
    fuzz_close_fds();
    snprintf(p, sizeof p, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(p, "wb");
    if (!f || (n && fwrite(data, 1, n, f) != n) || fclose(f) != 0) abort();
    return p;
}
