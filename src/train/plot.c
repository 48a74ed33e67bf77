// plot.c — render a run's metrics.jsonl to loss.png and expert_load.png with gnuplot.
// Data files and scripts go to a mkdtemp directory under /tmp; gnuplot runs there (fork/exec,
// output captured to a log); each finished PNG is copied to OUT_DIR/<name>.png.tmp and renamed,
// so a failed plot never leaves a damaged file behind. Every failure is one warning line + -1.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "train/plot.h"
#include "core/common.h"
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define HEAT_MAX_COLS 400 // heat-map columns; more steps are averaged into this many bins
#define ROW_LABEL_MAX 48 // label every row up to this many rows, else only layer starts

typedef struct {
    long step, seq;
    double loss, aux, z;
    long load;
} TrainRec; // load: row in loads[], -1 = none
typedef struct {
    long step, seq;
    double val;
} ValRec;

typedef struct {
    TrainRec *tr;
    size_t ntr, captr;
    ValRec *va;
    size_t nva, capva;
    float *loads;
    size_t nloads, caploads; // nloads records of L*E shares each
    int L, E; // expert_load shape (0 = none seen yet)
} Metrics;

static void warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void warn(const char *fmt, ...) {
    fflush(stdout);
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "moe: warning: ");
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
}

// ---- growable string ----
typedef struct {
    char *p;
    size_t n, cap;
} Str;
static void sb_printf(Str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(Str *s, const char *fmt, ...) {
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
static void sb_quoted(Str *s, const char *text) {
    sb_printf(s, "'");
    for (const char *c = text; *c; c++) {
        if (*c == '\'') sb_printf(s, "''");
        else if ((unsigned char)*c >= 0x20) sb_printf(s, "%c", *c);
    }
    sb_printf(s, "'");
}

// ---- metrics parsing ----
static double num_or_nan(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble)) return NAN;
    return v->valuedouble;
}

// Checks expert_load's shape; on the first valid one fixes L x E. Returns the L*E shares appended
// to m->loads (index), or -1 if absent or malformed or of another shape.
static long parse_load(Metrics *m, const cJSON *obj) {
    const cJSON *el = cJSON_GetObjectItemCaseSensitive(obj, "expert_load");
    if (!cJSON_IsArray(el)) return -1;
    int L = cJSON_GetArraySize(el);
    if (L <= 0) return -1;
    int E = cJSON_GetArraySize(cJSON_GetArrayItem(el, 0));
    if (E <= 0) return -1;
    if (m->L && (L != m->L || E != m->E)) return -1;
    size_t rows = (size_t)L * E;
    double *cnt = xmalloc(rows * sizeof *cnt);
    int l = 0, ok = 1;
    for (const cJSON *layer = el->child; layer && ok; layer = layer->next, l++) {
        if (!cJSON_IsArray(layer) || cJSON_GetArraySize(layer) != E) {
            ok = 0;
            break;
        }
        int e = 0;
        for (const cJSON *c = layer->child; c; c = c->next, e++) {
            if (!cJSON_IsNumber(c) || !isfinite(c->valuedouble) || c->valuedouble < 0) {
                ok = 0;
                break;
            }
            cnt[(size_t)l * E + e] = c->valuedouble;
        }
    }
    if (!ok) {
        free(cnt);
        return -1;
    }
    m->L = L;
    m->E = E;
    if (m->nloads == m->caploads) {
        m->caploads = m->caploads ? 2 * m->caploads : 64;
        m->loads = xrealloc(m->loads, m->caploads * rows * sizeof *m->loads);
    }
    float *dst = m->loads + m->nloads * rows;
    for (l = 0; l < L; l++) {
        double sum = 0;
        for (int e = 0; e < E; e++) sum += cnt[(size_t)l * E + e];
        for (int e = 0; e < E; e++)
            dst[(size_t)l * E + e] = sum > 0 ? (float)(cnt[(size_t)l * E + e] / sum) : NAN;
    }
    free(cnt);
    return (long)m->nloads++;
}

static void parse_line(Metrics *m, const char *line, size_t len, long seq) {
    cJSON *obj = cJSON_ParseWithLength(line, len);
    if (!obj) return;
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(obj, "step");
    if (cJSON_IsObject(obj) && cJSON_IsNumber(st) && fabs(st->valuedouble) < 1e15) {
        long step = (long)st->valuedouble;
        double loss = num_or_nan(obj, "loss"), val = num_or_nan(obj, "val_loss");
        int is_train = cJSON_GetObjectItemCaseSensitive(obj, "loss") != NULL;
        if (is_train) {
            if (m->ntr == m->captr) {
                m->captr = m->captr ? 2 * m->captr : 256;
                m->tr = xrealloc(m->tr, m->captr * sizeof *m->tr);
            }
            TrainRec *r = &m->tr[m->ntr++];
            r->step = step;
            r->seq = seq;
            r->loss = loss;
            r->aux = num_or_nan(obj, "aux_loss");
            r->z = num_or_nan(obj, "z_loss");
            r->load = parse_load(m, obj);
        }
        if (!isnan(val)) {
            if (m->nva == m->capva) {
                m->capva = m->capva ? 2 * m->capva : 64;
                m->va = xrealloc(m->va, m->capva * sizeof *m->va);
            }
            m->va[m->nva++] = (ValRec){step, seq, val};
        }
    }
    cJSON_Delete(obj);
}

// Returns 0, or -1 after a warning if the file cannot be read.
static int read_metrics(const char *path, Metrics *m) {
    FILE *f = fopen(path, "r");
    if (!f) {
        warn("cannot read %s (%s); skipping plots", path, strerror(errno));
        return -1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    long seq = 0;
    errno = 0;
    while ((n = getline(&line, &cap, f)) >= 0) parse_line(m, line, (size_t)n, seq++);
    int err = ferror(f) ? errno : 0;
    free(line);
    fclose(f);
    if (err) {
        warn("cannot read %s (%s); skipping plots", path, strerror(err));
        return -1;
    }
    return 0;
}

static int cmp_train(const void *a, const void *b) {
    const TrainRec *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}
static int cmp_val(const void *a, const void *b) {
    const ValRec *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return (x->seq > y->seq) - (x->seq < y->seq);
}
// Sort by step; a step logged twice (a resumed run re-doing steps) keeps its latest line.
static void sort_dedup(Metrics *m) {
    if (m->ntr) qsort(m->tr, m->ntr, sizeof *m->tr, cmp_train);
    size_t k = 0;
    for (size_t i = 0; i < m->ntr; i++) {
        if (k && m->tr[k - 1].step == m->tr[i].step) m->tr[k - 1] = m->tr[i];
        else m->tr[k++] = m->tr[i];
    }
    m->ntr = k;
    if (m->nva) qsort(m->va, m->nva, sizeof *m->va, cmp_val);
    k = 0;
    for (size_t i = 0; i < m->nva; i++) {
        if (k && m->va[k - 1].step == m->va[i].step) m->va[k - 1] = m->va[i];
        else m->va[k++] = m->va[i];
    }
    m->nva = k;
}

// ---- files and processes ----
static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = xmalloc(a + b + 2);
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

// Write a whole buffer to dir/name. Returns 0, or -1 after a warning.
static int write_text(const char *dir, const char *name, const char *text, size_t n) {
    char *path = path_join(dir, name);
    FILE *f = fopen(path, "w");
    int rc = -1;
    if (!f) warn("cannot create %s (%s); skipping plots", path, strerror(errno));
    else {
        int ok = fwrite(text, 1, n, f) == n;
        int e = errno;
        if (fclose(f) != 0 && ok) {
            ok = 0;
            e = errno;
        }
        if (!ok) warn("cannot write %s (%s); skipping plots", path, strerror(e));
        else rc = 0;
    }
    free(path);
    return rc;
}

// Find gnuplot on PATH; returns a malloc'd path or NULL.
static char *find_gnuplot(void) {
    const char *env = getenv("PATH");
    char *paths = xstrdup(env && *env ? env : "/usr/local/bin:/usr/bin:/bin");
    char *found = NULL, *save = NULL;
    for (char *d = strtok_r(paths, ":", &save); d && !found; d = strtok_r(NULL, ":", &save)) {
        char *p = path_join(*d ? d : ".", "gnuplot");
        struct stat st;
        if (stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0) found = p;
        else free(p);
    }
    free(paths);
    return found;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char *p = path_join(dir, e->d_name);
            if (unlink(p) != 0) warn("cannot remove %s (%s)", p, strerror(errno));
            free(p);
        }
        closedir(d);
    }
    if (rmdir(dir) != 0) warn("cannot remove %s (%s)", dir, strerror(errno));
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
    char *log = path_join(tmpdir, "gnuplot.log");
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        warn("cannot create %s (%s); skipping plots", log, strerror(errno));
        free(log);
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        warn("cannot start gnuplot (%s); skipping plots", strerror(errno));
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
        warn("waiting for gnuplot failed (%s); skipping %s", strerror(errno), what);
        rc = -1;
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        char msg[512];
        last_log_line(log, msg, sizeof msg);
        if (WIFSIGNALED(status))
            warn("gnuplot was killed by signal %d drawing %s; skipping it", WTERMSIG(status), what);
        else warn("gnuplot failed drawing %s (exit %d: %s); skipping it", what, WEXITSTATUS(status), msg);
        rc = -1;
    }
    free(log);
    return rc;
}

// Copy tmpdir/name (checked to be a PNG) to out_dir/name.tmp, then rename it to out_dir/name.
static int install_png(const char *tmpdir, const char *out_dir, const char *name) {
    char *src = path_join(tmpdir, name), *dst = path_join(out_dir, name);
    size_t dl = strlen(dst);
    char *tmp = xmalloc(dl + 5);
    memcpy(tmp, dst, dl);
    memcpy(tmp + dl, ".tmp", 5);
    int rc = -1;
    size_t len = 0;
    char *data = read_file(src, &len);
    if (!data) warn("gnuplot wrote no %s (%s); skipping it", name, strerror(errno));
    else if (len < 24 || memcmp(data, "\x89PNG\r\n\x1a\n", 8) != 0)
        warn("gnuplot wrote a damaged %s; skipping it", name);
    else {
        FILE *f = fopen(tmp, "wb");
        if (!f) warn("cannot create %s (%s); skipping it", tmp, strerror(errno));
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
            if (!ok) warn("cannot write %s (%s); skipping it", tmp, strerror(e));
            else if (rename(tmp, dst) != 0)
                warn("cannot rename %s to %s (%s); skipping it", tmp, dst, strerror(errno));
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
static int draw(const char *gnuplot, const char *tmpdir, const char *out_dir, const char *name,
                const Str *script) {
    char sname[128];
    snprintf(sname, sizeof sname, "%s.gp", name);
    if (write_text(tmpdir, sname, script->p, script->n) != 0) return -1;
    if (run_gnuplot(gnuplot, tmpdir, sname, name) != 0) return -1;
    return install_png(tmpdir, out_dir, name);
}

static void sb_terminal(Str *s, int w, int h, const char *out) {
    sb_printf(s,
              "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {\n"
              "  set terminal pngcairo size %d,%d noenhanced font 'sans,10' linewidth 1\n"
              "} else {\n  set terminal png size %d,%d noenhanced\n}\n",
              w, h, w, h);
    sb_printf(s, "set output '%s'\nset datafile missing '?'\nset encoding utf8\n", out);
}

static void fmt_num(char *buf, size_t n, double v) {
    if (isfinite(v)) snprintf(buf, n, "%.9g", v);
    else snprintf(buf, n, "?");
}

// ---- loss.png ----
static int plot_loss(const Metrics *m, const char *gnuplot, const char *tmpdir, const char *out_dir,
                     const char *run) {
    size_t n_loss = 0, n_aux = 0, n_z = 0;
    for (size_t i = 0; i < m->ntr; i++) {
        n_loss += isfinite(m->tr[i].loss);
        n_aux += isfinite(m->tr[i].aux);
        n_z += isfinite(m->tr[i].z);
    }
    if (n_loss == 0 && m->nva == 0) {
        warn("no loss values in %s/metrics.jsonl; skipping plots", out_dir);
        return -1;
    }

    // train.dat: step loss aux z, then bias-corrected EMAs of loss aux z. Long runs show the raw
    // curves faintly under their EMA.
    Str d = {0};
    int ema_loss = n_loss >= 20, ema_router = m->ntr >= 200;
    double span = fmin(100.0, fmax(3.0, (double)m->ntr / 30.0)), beta = 1.0 - 1.0 / span;
    double ema[3] = {0, 0, 0}, corr[3] = {1, 1, 1};
    for (size_t i = 0; i < m->ntr; i++) {
        const TrainRec *r = &m->tr[i];
        double v[3] = {r->loss, r->aux, r->z};
        char col[6][32];
        for (int k = 0; k < 3; k++) {
            fmt_num(col[k], sizeof col[k], v[k]);
            if (isfinite(v[k])) {
                ema[k] = beta * ema[k] + (1 - beta) * v[k];
                corr[k] *= beta;
            }
            fmt_num(col[3 + k], sizeof col[3 + k], isfinite(v[k]) ? ema[k] / (1 - corr[k]) : NAN);
        }
        sb_printf(&d, "%ld %s %s %s %s %s %s\n", r->step, col[0], col[1], col[2], col[3], col[4], col[5]);
    }
    if (write_text(tmpdir, "train.dat", d.p ? d.p : "", d.n) != 0) {
        free(d.p);
        return -1;
    }
    d.n = 0;
    for (size_t i = 0; i < m->nva; i++) sb_printf(&d, "%ld %.9g\n", m->va[i].step, m->va[i].val);
    if (write_text(tmpdir, "val.dat", d.p ? d.p : "", d.n) != 0) {
        free(d.p);
        return -1;
    }
    free(d.p);

    long smin = m->ntr ? m->tr[0].step : m->va[0].step, smax = smin;
    if (m->ntr) {
        smin = m->tr[0].step;
        smax = m->tr[m->ntr - 1].step;
    }
    if (m->nva) {
        if (m->va[0].step < smin) smin = m->va[0].step;
        if (m->va[m->nva - 1].step > smax) smax = m->va[m->nva - 1].step;
    }
    double x0 = (double)smin, x1 = (double)smax;
    if (x1 <= x0) {
        x0 -= 1;
        x1 += 1;
    }

    int two_panels = n_aux > 0 || n_z > 0;
    Str s = {0};
    sb_terminal(&s, 1000, two_panels ? 750 : 600, "loss.png");
    sb_printf(&s,
              "set xrange [%.17g:%.17g]\nset grid lc rgb '#dddddd' lw 1\nset border lc rgb '#444444'\n"
              "set key top right box opaque samplen 2 spacing 1.1\nset format x '%%.0f'\n"
              "set lmargin at screen 0.08\nset rmargin at screen %s\n",
              x0, x1, n_z > 0 && n_aux > 0 ? "0.91" : "0.96");
    if (x1 - x0 <= 10) sb_printf(&s, "set xtics 1\n");
    sb_printf(&s, "set multiplot\n");
    sb_printf(&s, "set title ");
    sb_quoted(&s, run);
    sb_printf(&s, " . ': loss'\n");
    if (two_panels)
        sb_printf(&s,
                  "set tmargin at screen 0.93\nset bmargin at screen 0.45\nset format x ''\nunset xlabel\n");
    else sb_printf(&s, "set tmargin at screen 0.91\nset bmargin at screen 0.11\nset xlabel 'step'\n");
    sb_printf(&s, "set ylabel 'cross-entropy loss'\n");
    sb_printf(&s, "plot ");
    const char *sep = "";
    if (n_loss) {
        sb_printf(&s, "'train.dat' using 1:2 with %s lc rgb '%s' lw 1 title 'train loss'",
                  n_loss < 3 ? "linespoints pt 7" : "lines", ema_loss ? "#9ecae1" : "#08519c");
        sep = ", \\\n     ";
        if (ema_loss) {
            sb_printf(&s, "%s'train.dat' using 1:5 with lines lc rgb '#08519c' lw 2 title 'train loss (EMA)'",
                      sep);
        }
    }
    if (m->nva)
        sb_printf(&s,
                  "%s'val.dat' using 1:2 with linespoints lc rgb '#e6550d' lw 2 pt 7 ps 0.9 title 'val loss'",
                  sep);
    sb_printf(&s, "\n");
    if (two_panels) {
        sb_printf(&s,
                  "set title 'router losses'\nset tmargin at screen 0.37\nset bmargin at screen 0.08\n"
                  "set format x '%%.0f'\nset xlabel 'step'\n");
        if (n_aux && n_z)
            sb_printf(&s,
                      "set ylabel 'aux (load-balance) loss' tc rgb '#238b45'\nset y2label 'z loss' tc rgb "
                      "'#6a51a3'\n"
                      "set ytics nomirror\nset y2tics\n");
        else sb_printf(&s, "set ylabel '%s'\n", n_aux ? "aux (load-balance) loss" : "z loss");
        const char *axes[2] = {"x1y1", n_aux ? "x1y2" : "x1y1"};
        const char *names[2] = {"aux loss", "z loss"}, *dark[2] = {"#238b45", "#6a51a3"},
                   *light[2] = {"#a1d99b", "#cbc9e2"};
        size_t have[2] = {n_aux, n_z};
        const char *side[2] = {n_aux && n_z ? ", left axis" : "", n_aux && n_z ? ", right axis" : ""};
        sb_printf(&s, "plot ");
        sep = "";
        for (int k = 0; k < 2; k++) {
            if (!have[k]) continue;
            if (ema_router) {
                sb_printf(&s, "%s'train.dat' using 1:%d axes %s with lines lc rgb '%s' lw 1 notitle", sep,
                          3 + k, axes[k], light[k]);
                sep = ", \\\n     ";
                sb_printf(&s,
                          "%s'train.dat' using 1:%d axes %s with lines lc rgb '%s' lw 2 title '%s (EMA%s)'",
                          sep, 6 + k, axes[k], dark[k], names[k], side[k]);
            } else {
                sb_printf(&s, "%s'train.dat' using 1:%d axes %s with %s lc rgb '%s' lw 1.5 title '%s%s%s%s'",
                          sep, 3 + k, axes[k], have[k] < 3 ? "linespoints pt 7" : "lines", dark[k], names[k],
                          *side[k] ? " (" : "", *side[k] ? side[k] + 2 : "", *side[k] ? ")" : "");
            }
            sep = ", \\\n     ";
        }
        sb_printf(&s, "\n");
    }
    sb_printf(&s, "unset multiplot\nset output\n");
    int rc = draw(gnuplot, tmpdir, out_dir, "loss.png", &s);
    free(s.p);
    return rc;
}

// ---- expert_load.png ----
static int plot_load(const Metrics *m, const char *gnuplot, const char *tmpdir, const char *out_dir,
                     const char *run) {
    size_t rows = (size_t)m->L * m->E, nrec = 0;
    for (size_t i = 0; i < m->ntr; i++) nrec += m->tr[i].load >= 0;
    if (nrec == 0 || rows == 0) return 0; // no expert_load logged (e.g. a dense run): nothing to draw

    // Bin the records onto ncols evenly spaced steps; a bin averages its records' shares and an
    // empty bin repeats the previous one.
    size_t ncols = nrec < HEAT_MAX_COLS ? nrec : HEAT_MAX_COLS;
    long smin = 0, smax = 0;
    int first = 1;
    for (size_t i = 0; i < m->ntr; i++) {
        if (m->tr[i].load < 0) continue;
        if (first) {
            smin = m->tr[i].step;
            first = 0;
        }
        smax = m->tr[i].step;
    }
    if (smax == smin) ncols = 1;
    double *acc = xcalloc(ncols * rows, sizeof *acc);
    int *cnt = xcalloc(ncols * rows, sizeof *cnt), *ccnt = xcalloc(ncols, sizeof *ccnt);
    for (size_t i = 0; i < m->ntr; i++) {
        if (m->tr[i].load < 0) continue;
        size_t c = ncols > 1
            ? (size_t)lround((double)(m->tr[i].step - smin) / (double)(smax - smin) * (double)(ncols - 1))
            : 0;
        if (c >= ncols) c = ncols - 1;
        const float *sh = m->loads + (size_t)m->tr[i].load * rows;
        ccnt[c]++;
        for (size_t r = 0; r < rows; r++)
            if (!isnan(sh[r])) {
                acc[c * rows + r] += sh[r];
                cnt[c * rows + r]++;
            }
    }
    double vmax = 0;
    int any_nan = 0;
    for (size_t c = 0; c < ncols; c++)
        for (size_t r = 0; r < rows; r++) {
            double *v = &acc[c * rows + r];
            if (ccnt[c] == 0 && c > 0) *v = acc[(c - 1) * rows + r];
            else *v = cnt[c * rows + r] ? *v / cnt[c * rows + r] : NAN;
            if (isfinite(*v) && *v > vmax) vmax = *v;
            if (!isfinite(*v)) any_nan = 1;
        }
    free(cnt);
    free(ccnt);

    double dx = ncols > 1 ? (double)(smax - smin) / (double)(ncols - 1) : 1.0;
    // `with image` needs a grid of at least 2 x 2: a lone column or row is drawn twice, half as wide.
    int dup_c = ncols == 1, dup_r = rows == 1;
    Str d = {0};
    for (size_t c = 0; c < ncols; c++)
        for (int dc = 0; dc <= dup_c; dc++) {
            double x = dup_c ? (double)smin + (dc ? 0.25 : -0.25) * dx : (double)smin + (double)c * dx;
            for (size_t r = 0; r < rows; r++)
                for (int dr = 0; dr <= dup_r; dr++) {
                    double y = dup_r ? (dr ? 0.25 : -0.25) : (double)r;
                    double v = acc[c * rows + r];
                    if (isfinite(v)) sb_printf(&d, "%.17g %g %.6g\n", x, y, v);
                    else sb_printf(&d, "%.17g %g NaN\n", x, y);
                }
            sb_printf(&d, "\n");
        }
    free(acc);
    int rc = write_text(tmpdir, "load.dat", d.p, d.n);
    free(d.p);
    if (rc != 0) return -1;

    // Colour: white = uniform share 1/E, blue = under-used, red = over-used; the scale stops at
    // 4/E (or the largest share, if smaller) so that near-uniform loads still show contrast.
    double uni = 1.0 / m->E, cbmax = fmax(2.0 * uni, fmin(vmax, 4.0 * uni));
    if (cbmax > 1) cbmax = 1;
    int saturated = vmax > cbmax * 1.0001;
    int label_rows = rows <= ROW_LABEL_MAX;
    int h = label_rows ? 160 + (int)rows * 16 : 160 + (int)rows * 3;
    if (h < 600) h = 600;
    if (h > 1600) h = 1600;
    Str s = {0};
    sb_terminal(&s, 1000, h, "expert_load.png");
    char title[1024];
    if (ncols < nrec)
        snprintf(title, sizeof title, "%s: expert load (%zu logged steps averaged into %zu columns)", run,
                 nrec, ncols);
    else snprintf(title, sizeof title, "%s: expert load", run);
    sb_printf(&s, "set title ");
    sb_quoted(&s, title);
    sb_printf(&s, "\n");
    sb_printf(&s,
              "set xlabel 'step'\nset ylabel 'layer / expert'\nset format x '%%.0f'\nset tics out\nset xtics "
              "nomirror\nset ytics scale 0\n");
    sb_printf(&s, "set xrange [%.17g:%.17g]\nset yrange [%g:%g]\n", (double)smin - dx / 2,
              (double)smax + dx / 2, (double)rows - 0.5, -0.5);
    if (smax - smin <= 10) sb_printf(&s, "set xtics 1\n");
    // cells without data (a layer that routed no tokens) are left undrawn over a grey background
    if (any_nan)
        sb_printf(&s,
                  "set object 1 rectangle from graph 0,0 to graph 1,1 behind fc rgb '#9a9a9a' fillstyle "
                  "solid noborder\n");
    sb_printf(&s, "set ytics (");
    if (label_rows) {
        for (size_t r = 0; r < rows; r++)
            sb_printf(&s, "%s'L%zu E%zu' %zu", r ? ", " : "", r / (size_t)m->E, r % (size_t)m->E, r);
    } else {
        size_t every = 1;
        while ((size_t)m->L / every > ROW_LABEL_MAX) every++;
        const char *sp = "";
        for (size_t l = 0; l < (size_t)m->L; l += every) {
            sb_printf(&s, "%s'L%zu E0' %zu", sp, l, l * (size_t)m->E);
            sp = ", ";
        }
    }
    sb_printf(&s, ")\n");
    if (!label_rows || rows > 24) sb_printf(&s, "set ytics font ',8'\n");
    for (int l = 1; l < m->L && m->E > 1; l++)
        sb_printf(
            &s,
            "set arrow from graph 0, first %g to graph 1, first %g nohead front lc rgb '#000000' lw 1.5\n",
            (double)l * m->E - 0.5, (double)l * m->E - 0.5);
    if (cbmax > uni * 1.0001)
        sb_printf(&s, "set palette defined (0 '#2166ac', %.9g '#f7f7f7', %.9g '#b2182b')\n", uni, cbmax);
    else sb_printf(&s, "set palette defined (0 '#2166ac', 1 '#f7f7f7')\n");
    char cbl[256];
    snprintf(cbl, sizeof cbl, "share of the layer's tokens (white = uniform 1/%d = %.3g%s%s)", m->E, uni,
             saturated ? "; top colour = 4/E or more" : "", any_nan ? "; grey = no data" : "");
    sb_printf(&s, "set cbrange [0:%.9g]\nset cbtics out nomirror\nset cblabel ", cbmax);
    sb_quoted(&s, cbl);
    sb_printf(&s, "\n");
    sb_printf(&s, "plot 'load.dat' using 1:2:3 with image notitle\nset output\n");
    rc = draw(gnuplot, tmpdir, out_dir, "expert_load.png", &s);
    free(s.p);
    return rc;
}

int plot_run(const char *out_dir) {
    char *gnuplot = find_gnuplot();
    if (!gnuplot) {
        fflush(stdout);
        fprintf(stderr, "moe: warning: gnuplot not found (apt-get install gnuplot-nox); skipping plots\n");
        return -1;
    }
    Metrics m = {0};
    char *mpath = path_join(out_dir, "metrics.jsonl");
    int rc = read_metrics(mpath, &m);
    free(mpath);
    if (rc == 0) {
        sort_dedup(&m);
        // run name for titles: last component of out_dir
        char *name = xstrdup(out_dir);
        size_t nl = strlen(name);
        while (nl > 1 && name[nl - 1] == '/') name[--nl] = 0;
        const char *run = strrchr(name, '/') && name[1] ? strrchr(name, '/') + 1 : name;
        char tmpl[] = "/tmp/moe-plot-XXXXXX";
        if (m.ntr == 0 && m.nva == 0) {
            warn("no metrics in %s/metrics.jsonl; skipping plots", out_dir);
            rc = -1;
        } else if (!mkdtemp(tmpl)) {
            warn("cannot create a temporary directory under /tmp (%s); skipping plots", strerror(errno));
            rc = -1;
        } else {
            int a = plot_loss(&m, gnuplot, tmpl, out_dir, run);
            int b = plot_load(&m, gnuplot, tmpl, out_dir, run);
            rc = a == 0 && b == 0 ? 0 : -1;
            remove_tree(tmpl);
        }
        free(name);
    }
    free(m.tr);
    free(m.va);
    free(m.loads);
    free(gnuplot);
    return rc;
}
