// compare.c — `moe compare` (see compare.h): each run checked (a directory with run.json and a
// metrics.jsonl holding training or validation lines) and summed up (final and best losses, tokens from
// run.json's --batch x --seq-len per logged step, tokens/s over the logged step times), the table printed,
// then the runs' training-loss EMAs and validation curves drawn as two panels of one PNG.
// Must not hold: argument parsing (cli/cmd_compare.c), reading metrics.jsonl (metrics.c), running gnuplot or
// installing the PNG (gnuplot.c).
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "train/compare.h"
#include "core/common.h"
#include "train/gnuplot.h"
#include "train/metrics.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define COMPARE_MAX_RUNS 64

typedef struct {
    const char *dir; // as given
    const char *label; // in the table and the key: the directory's last name, or dir where those repeat
    Metrics m;
    double tokens_step; // run.json's batch x seq-len; 0: not recorded
    long last_step;
    double final_loss, final_val, best_val; // NAN: none
    long best_step;
    double tokens, tokens_s; // tokens_s NAN: no step times
} CmpRun;

// run.json's options.<key> as a positive number, or 0 when absent or not one.
static double option_num(const cJSON *run, const char *key) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(run, "options");
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!cJSON_IsString(v)) return 0;
    char *end;
    double x = strtod(v->valuestring, &end);
    return end != v->valuestring && *end == 0 && isfinite(x) && x > 0 ? x : 0;
}

// Checks that dir is a run with metrics and reads them; dies naming what is wrong.
static void load_run(CmpRun *r) {
    struct stat st;
    char path[4200];
    if (stat(r->dir, &st) != 0) DIE("compare: '%s' does not exist (%s)", r->dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        DIE("compare: '%s' is not a directory (give run directories: moe train --out)", r->dir);
    join_path(path, sizeof path, r->dir, "run.json");
    if (!file_exists(path)) DIE("compare: '%s' is not a run directory (no run.json in it)", r->dir);
    long at = 0;
    cJSON *run = json_read_file("compare", NULL, path, &at);
    if (!run) DIE("compare: '%s' is not JSON (at byte %ld)", path, at);
    r->tokens_step = option_num(run, "batch") * option_num(run, "seq-len");
    cJSON_Delete(run);
    join_path(path, sizeof path, r->dir, "metrics.jsonl");
    if (!file_exists(path))
        DIE("compare: run '%s' has no metrics (no metrics.jsonl: it trained no step)", r->dir);
    if (metrics_read(path, &r->m) != 0) DIE("compare: cannot read '%s' (%s)", path, strerror(errno));
    if (r->m.ntr == 0 && r->m.nva == 0)
        DIE("compare: run '%s' has no metrics (its metrics.jsonl holds no training or validation line)",
            r->dir);
}

// The table's figures of one run.
static void summarise(CmpRun *r) {
    const Metrics *m = &r->m;
    r->final_loss = r->final_val = r->best_val = r->tokens_s = NAN;
    r->last_step = m->ntr ? m->tr[m->ntr - 1].step : 0;
    r->best_step = 0;
    double timed = 0, secs = 0;
    for (size_t i = 0; i < m->ntr; i++) {
        if (isfinite(m->tr[i].loss)) r->final_loss = m->tr[i].loss;
        if (isfinite(m->tr[i].step_time) && m->tr[i].step_time > 0) {
            timed++;
            secs += m->tr[i].step_time;
        }
    }
    for (size_t i = 0; i < m->nva; i++) {
        r->final_val = m->va[i].val;
        if (!(m->va[i].val >= r->best_val)) { // (the first, or a lower one; the earliest of equals)
            r->best_val = m->va[i].val;
            r->best_step = m->va[i].step;
        }
    }
    r->tokens = (double)m->ntr * r->tokens_step;
    if (secs > 0 && r->tokens_step > 0) r->tokens_s = timed * r->tokens_step / secs;
}

// Labels: each directory's last name where those are distinct, else the directories as given.
static void set_labels(CmpRun *r, int n, char **names) {
    int distinct = 1;
    for (int i = 0; i < n; i++) {
        char *s = xstrdup(r[i].dir);
        size_t len = strlen(s);
        while (len > 1 && s[len - 1] == '/') s[--len] = 0;
        char *slash = strrchr(s, '/');
        names[i] = slash && slash[1] ? xstrdup(slash + 1) : xstrdup(s);
        free(s);
        for (int j = 0; j < i; j++) distinct &= strcmp(names[i], names[j]) != 0;
    }
    for (int i = 0; i < n; i++) r[i].label = distinct ? names[i] : r[i].dir;
}

static void put_num(char *buf, size_t n, const char *fmt, double v) {
    if (isfinite(v)) snprintf(buf, n, fmt, v);
    else snprintf(buf, n, "-");
}

static void print_table(const CmpRun *r, int n) {
    int w = 3;
    for (int i = 0; i < n; i++)
        if ((int)strlen(r[i].label) > w) w = (int)strlen(r[i].label);
    printf("%-*s  %8s  %12s  %10s  %10s  %10s  %8s  %10s\n", w, "run", "steps", "tokens", "final loss",
           "final val", "best val", "at step", "tokens/s");
    for (int i = 0; i < n; i++) {
        char tok[32], fl[32], fv[32], bv[32], bs[32], tps[32];
        put_num(tok, sizeof tok, "%.0f", r[i].tokens_step > 0 ? r[i].tokens : NAN);
        put_num(fl, sizeof fl, "%.4f", r[i].final_loss);
        put_num(fv, sizeof fv, "%.4f", r[i].final_val);
        put_num(bv, sizeof bv, "%.4f", r[i].best_val);
        put_num(bs, sizeof bs, "%.0f", isfinite(r[i].best_val) ? (double)r[i].best_step : NAN);
        put_num(tps, sizeof tps, "%.0f", r[i].tokens_s);
        printf("%-*s  %8ld  %12s  %10s  %10s  %10s  %8s  %10s\n", w, r[i].label, r[i].last_step, tok, fl, fv,
               bv, bs, tps);
    }
    fflush(stdout);
}

// rI.train (x, loss EMA or loss) and rI.val (x, val loss) in tmpdir. Returns 0, or -1 after a warning.
static int write_curves(const CmpRun *r, int i, int by_tokens, const char *tmpdir) {
    const Metrics *m = &r->m;
    double scale = by_tokens ? r->tokens_step : 1;
    double span = fmin(100.0, fmax(3.0, (double)m->ntr / 30.0)), beta = m->ntr >= 20 ? 1.0 - 1.0 / span : 0;
    double ema = 0, corr = 1;
    Str d = {0};
    for (size_t k = 0; k < m->ntr; k++) {
        if (!isfinite(m->tr[k].loss)) continue;
        ema = beta * ema + (1 - beta) * m->tr[k].loss;
        corr *= beta;
        sb_printf(&d, "%.17g %.9g\n", (double)m->tr[k].step * scale, ema / (1 - corr));
    }
    char name[32];
    snprintf(name, sizeof name, "r%d.train", i);
    int rc = gp_write(tmpdir, name, d.p ? d.p : "", d.n);
    d.n = 0;
    for (size_t k = 0; k < m->nva && rc == 0; k++)
        if (isfinite(m->va[k].val))
            sb_printf(&d, "%.17g %.9g\n", (double)m->va[k].step * scale, m->va[k].val);
    snprintf(name, sizeof name, "r%d.val", i);
    if (rc == 0) rc = gp_write(tmpdir, name, d.p ? d.p : "", d.n);
    free(d.p);
    return rc;
}

static const char *const palette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                      "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
#define N_COLOURS (int)(sizeof palette / sizeof palette[0])

// One panel's plot command: the runs with points of that kind (has[i]); the key in the first panel.
static void panel(Str *s, const CmpRun *r, int n, const int *has, const char *kind, int key) {
    if (!key) sb_printf(s, "unset key\n");
    sb_printf(s, "plot ");
    const char *sep = "";
    for (int i = 0; i < n; i++) {
        if (!has[i]) continue;
        sb_printf(s, "%s'r%d.%s' using 1:2 with %s lc rgb '%s' dt %d lw 2", sep, i, kind,
                  !strcmp(kind, "val") ? "linespoints pt 7 ps 0.6" : "lines", palette[i % N_COLOURS],
                  1 + i / N_COLOURS);
        if (key) {
            sb_printf(s, " title ");
            sb_quoted(s, r[i].label);
        } else sb_printf(s, " notitle");
        sep = ", \\\n     ";
    }
    sb_printf(s, "\n");
}

// The steps (or tokens) that the runs' records span, for both panels (widened to 2 when they are one).
static void x_span(const CmpRun *r, int n, int by_tokens, double *x0, double *x1) {
    *x0 = INFINITY;
    *x1 = -INFINITY;
    for (int i = 0; i < n; i++) {
        double scale = by_tokens ? r[i].tokens_step : 1;
        const Metrics *m = &r[i].m;
        if (m->ntr) {
            *x0 = fmin(*x0, (double)m->tr[0].step * scale);
            *x1 = fmax(*x1, (double)m->tr[m->ntr - 1].step * scale);
        }
        if (m->nva) {
            *x0 = fmin(*x0, (double)m->va[0].step * scale);
            *x1 = fmax(*x1, (double)m->va[m->nva - 1].step * scale);
        }
    }
    if (!(*x1 > *x0)) {
        *x0 -= 1;
        *x1 += 1;
    }
}

// The PNG: training loss (EMA when a run logged 20 steps or more) above, validation loss below; x in steps,
// or in tokens where the runs' tokens per step differ.
static int draw(const CmpRun *r, int n, const char *gnuplot, const char *tmpdir, const char *png) {
    int by_tokens = 0, *has_tr = xcalloc((size_t)n, sizeof(int)), *has_va = xcalloc((size_t)n, sizeof(int));
    int any_tr = 0, any_va = 0, ema = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].tokens_step != r[0].tokens_step && r[i].tokens_step > 0 && r[0].tokens_step > 0)
            by_tokens = 1;
        ema |= r[i].m.ntr >= 20;
        for (size_t k = 0; k < r[i].m.ntr; k++) has_tr[i] |= isfinite(r[i].m.tr[k].loss);
        for (size_t k = 0; k < r[i].m.nva; k++) has_va[i] |= isfinite(r[i].m.va[k].val);
        any_tr |= has_tr[i];
        any_va |= has_va[i];
    }
    for (int i = 0; i < n; i++) by_tokens &= r[i].tokens_step > 0;
    double x0, x1;
    x_span(r, n, by_tokens, &x0, &x1);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) rc = write_curves(&r[i], i, by_tokens, tmpdir);
    char dir[4200];
    path_parent(dir, sizeof dir, png);
    const char *name = strrchr(png, '/') ? strrchr(png, '/') + 1 : png;
    if (rc == 0 && (any_tr || any_va)) {
        int two = any_tr && any_va;
        Str s = {0};
        sb_terminal(&s, 1100, two ? 850 : 550, name);
        sb_printf(&s,
                  "set grid lc rgb '#dddddd' lw 1\nset border lc rgb '#444444'\nset format x '%%.4g'\n"
                  "set key top right box opaque samplen 3 spacing 1.1\nset ylabel 'cross-entropy loss'\n"
                  "set xlabel '%s'\nset xrange [%.17g:%.17g]\n",
                  by_tokens ? "tokens" : "step", x0, x1);
        if (two) sb_printf(&s, "set multiplot layout 2,1\n");
        if (any_tr) {
            sb_printf(&s, "set title 'training loss%s'\n", ema ? " (EMA)" : "");
            panel(&s, r, n, has_tr, "train", 1);
        }
        if (any_va) {
            sb_printf(&s, "set title 'validation loss'\n");
            panel(&s, r, n, has_va, "val", !any_tr);
        }
        if (two) sb_printf(&s, "unset multiplot\n");
        sb_printf(&s, "set output\n");
        rc = gp_draw(gnuplot, tmpdir, dir, name, &s);
        free(s.p);
    }
    free(has_tr);
    free(has_va);
    return rc;
}

// The PNG's path: a .png file name (no quote: gnuplot's script names it) in a writable directory.
static void check_png(const char *png) {
    size_t len = strlen(png);
    if (len < 5 || strcmp(png + len - 4, ".png") != 0 || png[len - 5] == '/')
        DIE("compare: --out must name a .png file (got '%s')", png);
    for (const char *c = png; *c; c++)
        if (*c == '\'' || (unsigned char)*c < 0x20)
            DIE("compare: --out: the path may not hold a quote or control character");
    char dir[4200];
    path_parent(dir, sizeof dir, png);
    if (!dir_exists(dir)) DIE("compare: --out: the directory '%s' does not exist", dir);
    if (access(dir, W_OK) != 0) DIE("compare: --out: cannot write in '%s' (%s)", dir, strerror(errno));
    if (dir_exists(png)) DIE("compare: --out '%s' is a directory", png);
}

int compare_runs(const char *const *runs, int n, const char *png) {
    if (n < 1)
        DIE("compare: give the run directories to compare (moe compare RUN_A RUN_B ... [--out FILE.png])");
    if (n > COMPARE_MAX_RUNS) DIE("compare: at most %d runs at once (got %d)", COMPARE_MAX_RUNS, n);
    char *gnuplot = NULL;
    if (png) {
        check_png(png);
        if (!(gnuplot = gp_find()))
            DIE("compare: gnuplot not found (apt-get install gnuplot-nox); it draws --out");
    }
    CmpRun *r = xcalloc((size_t)n, sizeof *r);
    char **names = xcalloc((size_t)n, sizeof *names);
    for (int i = 0; i < n; i++) {
        r[i].dir = runs[i];
        load_run(&r[i]);
        summarise(&r[i]);
    }
    set_labels(r, n, names);
    print_table(r, n);
    if (png) {
        char tmpl[] = "/tmp/moe-compare-XXXXXX";
        if (!mkdtemp(tmpl))
            DIE("compare: cannot create a temporary directory under /tmp (%s)", strerror(errno));
        int rc = draw(r, n, gnuplot, tmpl, png);
        gp_remove_dir(tmpl);
        if (rc != 0) DIE("compare: '%s' was not written (the warning above says why)", png);
        printf("plot: %s\n", png);
    }
    for (int i = 0; i < n; i++) {
        metrics_free(&r[i].m);
        free(names[i]);
    }
    free(names);
    free(r);
    free(gnuplot);
    return 0;
}
