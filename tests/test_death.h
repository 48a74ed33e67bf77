// test_death.h — shared by the C tests of bad input: run a function that must DIE in a forked
// child with its stderr captured (non-zero exit, key phrases in the message, optionally exactly one
// "moe: error:" line), and snapshot a directory byte for byte to show a failure changed no file.
#pragma once
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "core/common.h"
#include "test_util.h"

// fn(arg) in a child: it must exit non-zero with p1 (and p2 unless NULL) in its stderr; with
// one_line, the message must be exactly one "moe: error: ..." line.
static inline void expect_death_msg(const char *what, void (*fn)(void *), void *arg, const char *p1,
                                    const char *p2, int one_line) {
    int pfd[2];
    CHECK(pipe(pfd) == 0, "pipe: %s", strerror(errno));
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        close(pfd[0]);
        if (dup2(pfd[1], 2) < 0) _exit(99);
        close(pfd[1]);
        fn(arg);
        _exit(0);
    }
    close(pfd[1]);
    char buf[4096];
    size_t n = 0;
    for (;;) {
        ssize_t r = read(pfd[0], buf + n, sizeof buf - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        n += (size_t)r;
        if (n == sizeof buf - 1) break;
    }
    buf[n] = 0;
    close(pfd[0]);
    int status = 0;
    CHECK(waitpid(pid, &status, 0) == pid, "waitpid: %s", strerror(errno));
    EXPECT(WIFEXITED(status) && WEXITSTATUS(status) != 0, "%s: child should exit non-zero (status %d)", what,
           status);
    EXPECT(strstr(buf, p1) != NULL, "%s: message should contain \"%s\"; got: %s", what, p1, buf);
    if (p2) EXPECT(strstr(buf, p2) != NULL, "%s: message should contain \"%s\"; got: %s", what, p2, buf);
    if (one_line)
        EXPECT(strncmp(buf, "moe: error: ", 12) == 0 && n > 0 && strchr(buf, '\n') == buf + n - 1,
               "%s: one 'moe: error:' line; got: %s", what, buf);
    printf("  death ok: %-34s %s", what, buf[0] ? buf : "(no message)\n");
}

// Every file of a directory (up to 16), byte for byte.
typedef struct {
    int n;
    char name[16][96];
    char *data[16];
    size_t len[16];
} Snap;

static inline void snap_take(const char *dir, Snap *s) {
    memset(s, 0, sizeof *s);
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[4096];
    while (d && (de = readdir(d)) && s->n < 16) {
        if (de->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        snprintf(s->name[s->n], sizeof s->name[s->n], "%s", de->d_name);
        s->data[s->n] = read_file(p, &s->len[s->n]);
        s->n++;
    }
    if (d) closedir(d);
}
static inline void snap_free(Snap *s) {
    for (int i = 0; i < s->n; i++) free(s->data[i]);
    memset(s, 0, sizeof *s);
}
// Is dir now byte for byte what a holds? (a is kept; free it with snap_free.)
static inline int snap_same(const char *dir, const Snap *a) {
    Snap b;
    snap_take(dir, &b);
    int ok = a->n == b.n;
    for (int i = 0; ok && i < a->n; i++) {
        int j = 0;
        while (j < b.n && strcmp(a->name[i], b.name[j]) != 0) j++;
        ok = j < b.n && a->len[i] == b.len[j] && memcmp(a->data[i], b.data[j], a->len[i]) == 0;
    }
    snap_free(&b);
    return ok;
}
