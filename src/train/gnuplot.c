// gnuplot.c — gnuplot as an external tool (see gnuplot.h): scripts and data in a mkdtemp directory under
// /tmp, gnuplot run there by fork/exec with its output captured to a log, each finished PNG checked, copied
// next to the run under a .tmp name and renamed.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "train/gnuplot.h"
#include "core/common.h"
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

void gp_warn(const char *fmt, ...) {
    fflush(stdout);
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "moe: warning: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}

void sb_printf(Str *s, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = s->cap - s->n;
        int k = vsnprintf(s->p ? s->p + s->n : NULL, room, fmt, ap);
        va_end(ap);
        if (k < 0) DIE("formatting plot script failed");
        if ((size_t)k < room) {
            s->n += (size_t)k;
            return;
        }
        s->cap = (s->cap + (size_t)k + 1) * 2;
        s->p = xrealloc(s->p, s->cap);
    }
}
// Append s as a gnuplot single-quoted string (a quote inside is written twice).
void sb_quoted(Str *s, const char *text) {
    sb_printf(s, "'");
    for (const char *c = text; *c; c++) {
        if (*c == '\'') sb_printf(s, "''");
        else if ((unsigned char)*c >= 0x20) sb_printf(s, "%c", *c);
    }
    sb_printf(s, "'");
}

// ---- files and processes ----
char *gp_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = xmalloc(a + b + 2);
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

// Write a whole buffer to dir/name. Returns 0, or -1 after a warning.
int gp_write(const char *dir, const char *name, const char *text, size_t n) {
    char *path = gp_path(dir, name);
    FILE *f = fopen(path, "w");
    int rc = -1;
    if (!f) gp_warn("cannot create %s (%s); skipping plots", path, strerror(errno));
    else {
        int ok = fwrite(text, 1, n, f) == n;
        int e = errno;
        if (fclose(f) != 0 && ok) {
            ok = 0;
            e = errno;
        }
        if (!ok) gp_warn("cannot write %s (%s); skipping plots", path, strerror(e));
        else rc = 0;
    }
    free(path);
    return rc;
}

// Find gnuplot on PATH; returns a malloc'd path or NULL.
char *gp_find(void) {
    const char *env = getenv("PATH");
    char *paths = xstrdup(env && *env ? env : "/usr/local/bin:/usr/bin:/bin");
    char *found = NULL, *save = NULL;
    for (char *d = strtok_r(paths, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char *p = gp_path(*d ? d : ".", "gnuplot");
        struct stat st;
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0) found = p;
        else free(p);
    }
    free(paths);
    return found;
}

void gp_remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *p = gp_path(dir, e->d_name);
            if (unlink(p) != 0) gp_warn("cannot remove %s (%s)", p, strerror(errno));
            free(p);
        }
        closedir(d);
    }
    if (rmdir(dir) != 0) gp_warn("cannot remove %s (%s)", dir, strerror(errno));
}

// Last non-empty line of the gnuplot log (its error message), into buf.
static void last_log_line(const char *log, char *buf, size_t n) {
    snprintf(buf, n, "no message");
    size_t len = 0;
    char *text = read_file(log, &len);
    if (!text) return;
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ')) text[--len] = 0;
    if (len) {
        char *start = strrchr(text, '\n');
        snprintf(buf, n, "%s", start ? start + 1 : text);
    }
    free(text);
}

// Run `gnuplot script` inside tmpdir with stdout+stderr captured to tmpdir/gnuplot.log.
static int run_gnuplot(const char *gnuplot, const char *tmpdir, const char *script, const char *what) {
    char *log = gp_path(tmpdir, "gnuplot.log");
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        gp_warn("cannot create %s (%s); skipping plots", log, strerror(errno));
        free(log);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        gp_warn("cannot start gnuplot (%s); skipping plots", strerror(errno));
        close(fd);
        free(log);
        return -1;
    }
    if (pid == 0) {
        int nul = open("/dev/null", O_RDONLY);
        if (chdir(tmpdir) != 0 || nul < 0 || dup2(nul, 0) < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0)
            _exit(126);
        char *const argv[] = {"gnuplot", (char *)script, NULL};
        execv(gnuplot, argv);
        _exit(127);
    }
    close(fd);
    int status = 0;
    pid_t w;
    while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {}
    int rc = 0;
    if (w < 0) {
        gp_warn("waiting for gnuplot failed (%s); skipping %s", strerror(errno), what);
        rc = -1;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char msg[512];
        last_log_line(log, msg, sizeof msg);
        if (WIFSIGNALED(status))
            gp_warn("gnuplot was killed by signal %d drawing %s; skipping it", WTERMSIG(status), what);
        else gp_warn("gnuplot failed drawing %s (exit %d: %s); skipping it", what, WEXITSTATUS(status), msg);
        rc = -1;
    }
    free(log);
    return rc;
}

// Copy tmpdir/name (checked to be a PNG) to out_dir/name.tmp, then rename it to out_dir/name.
static int install_png(const char *tmpdir, const char *out_dir, const char *name) {
    char *src = gp_path(tmpdir, name), *dst = gp_path(out_dir, name);
    size_t dl = strlen(dst);
    char *tmp = xmalloc(dl + 5);
    memcpy(tmp, dst, dl);
    memcpy(tmp + dl, ".tmp", 5);
    int rc = -1;
    size_t len = 0;
    char *data = read_file(src, &len);
    if (!data) gp_warn("gnuplot wrote no %s (%s); skipping it", name, strerror(errno));
    else if (len < 24 || memcmp(data, "\x89PNG\r\n\x1a\n", 8) != 0)
        gp_warn("gnuplot wrote a damaged %s; skipping it", name);
    else {
        FILE *f = fopen(tmp, "wb");
        if (!f) gp_warn("cannot create %s (%s); skipping it", tmp, strerror(errno));
        else {
            int ok = fwrite(data, 1, len, f) == len && fflush(f) == 0;
            int e = errno;
            if (ok && fsync(fileno(f)) != 0 && errno != EINVAL && errno != EROFS) {
                ok = 0;
                e = errno;
            }
            if (fclose(f) != 0 && ok) {
                ok = 0;
                e = errno;
            }
            if (!ok) gp_warn("cannot write %s (%s); skipping it", tmp, strerror(e));
            else if (rename(tmp, dst) != 0)
                gp_warn("cannot rename %s to %s (%s); skipping it", tmp, dst, strerror(errno));
            else rc = 0;
            if (rc != 0) unlink(tmp);
        }
    }
    free(data);
    free(src);
    free(dst);
    free(tmp);
    return rc;
}

// Draw one plot: write script (which sets `output '<name>'`), run gnuplot, install the PNG.
int gp_draw(const char *gnuplot, const char *tmpdir, const char *out_dir, const char *name,
            const Str *script) {
    char sname[128];
    snprintf(sname, sizeof sname, "%s.gp", name);
    if (gp_write(tmpdir, sname, script->p, script->n) != 0) return -1;
    if (run_gnuplot(gnuplot, tmpdir, sname, name) != 0) return -1;
    return install_png(tmpdir, out_dir, name);
}

void sb_terminal(Str *s, int w, int h, const char *out) {
    sb_printf(s,
              "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
              "  set terminal pngcairo size %d,%d noenhanced font 'sans,10' linewidth 1\n"
              "} else {\n  set terminal png size %d,%d noenhanced\n}\n",
              w, h, w, h);
    sb_printf(s, "set output '%s'\nset datafile missing '?'\nset encoding utf8\n", out);
}
