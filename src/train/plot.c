// plot.c — a run's metrics.jsonl (read by train/metrics.h) drawn as loss.png (train and val loss with EMAs,
// the router losses in a second panel) and expert_load.png (the share of each layer's tokens per expert over
// the steps, binned), through train/gnuplot.h.
// Must not hold: reading metrics (metrics.c), running gnuplot or installing the files (gnuplot.c), training
// logic.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "train/plot.h"
#include "core/common.h"
#include "train/gnuplot.h"
#include "train/metrics.h"
#include <errno.h>
#include <math.h>
#include <string.h>

#define HEAT_MAX_COLS 400 // heat-map columns; more steps are averaged into this many bins
#define ROW_LABEL_MAX 48 // label every row up to this many rows, else only layer starts

static void fmt_num(char *buf, size_t n, double v) {
    if (isfinite(v)) snprintf(buf, n, "%.9g", v);
    else snprintf(buf, n, "?");
}

// ---- loss.png ----
// train.dat: step loss aux z, then bias-corrected EMAs of loss aux z; val.dat: step val_loss. Returns 0, or
// -1 after a warning.
static int write_loss_data(const Metrics *m, const char *tmpdir) {
    Str d = {0};
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
    if (gp_write(tmpdir, "train.dat", d.p ? d.p : "", d.n) != 0) {
        free(d.p);
        return -1;
    }
    d.n = 0;
    for (size_t i = 0; i < m->nva; i++) sb_printf(&d, "%ld %.9g\n", m->va[i].step, m->va[i].val);
    int rc = gp_write(tmpdir, "val.dat", d.p ? d.p : "", d.n);
    free(d.p);
    return rc;
}

// The steps the train and val records span (widened to 2 when they are one).
static void loss_steps(const Metrics *m, double *x0, double *x1) {
    long smin = m->ntr ? m->tr[0].step : m->va[0].step, smax = smin;
    if (m->ntr) {
        smin = m->tr[0].step;
        smax = m->tr[m->ntr - 1].step;
    }
    if (m->nva) {
        if (m->va[0].step < smin) smin = m->va[0].step;
        if (m->va[m->nva - 1].step > smax) smax = m->va[m->nva - 1].step;
    }
    *x0 = (double)smin;
    *x1 = (double)smax;
    if (*x1 <= *x0) {
        *x0 -= 1;
        *x1 += 1;
    }
}

// The lower panel: aux and z loss (two y axes when both are there), EMAs over the raw curves in long runs.
static void router_panel(Str *s, size_t n_aux, size_t n_z, int ema_router) {
    sb_printf(s,
              "set title 'router losses'\nset tmargin at screen 0.37\nset bmargin at screen 0.08\n"
              "set format x '%%.0f'\nset xlabel 'step'\n");
    if (n_aux && n_z)
        sb_printf(s,
                  "set ylabel 'aux (load-balance) loss' tc rgb '#238b45'\nset y2label 'z loss' tc rgb "
                  "'#6a51a3'\n"
                  "set ytics nomirror\nset y2tics\n");
    else sb_printf(s, "set ylabel '%s'\n", n_aux ? "aux (load-balance) loss" : "z loss");
    const char *axes[2] = {"x1y1", n_aux ? "x1y2" : "x1y1"};
    const char *names[2] = {"aux loss", "z loss"}, *dark[2] = {"#238b45", "#6a51a3"},
               *light[2] = {"#a1d99b", "#cbc9e2"};
    size_t have[2] = {n_aux, n_z};
    const char *side[2] = {n_aux && n_z ? ", left axis" : "", n_aux && n_z ? ", right axis" : ""};
    sb_printf(s, "plot ");
    const char *sep = "";
    for (int k = 0; k < 2; k++) {
        if (!have[k]) continue;
        if (ema_router) {
            sb_printf(s, "%s'train.dat' using 1:%d axes %s with lines lc rgb '%s' lw 1 notitle", sep, 3 + k,
                      axes[k], light[k]);
            sep = ", \\\n     ";
            sb_printf(s, "%s'train.dat' using 1:%d axes %s with lines lc rgb '%s' lw 2 title '%s (EMA%s)'",
                      sep, 6 + k, axes[k], dark[k], names[k], side[k]);
        } else {
            sb_printf(s, "%s'train.dat' using 1:%d axes %s with %s lc rgb '%s' lw 1.5 title '%s%s%s%s'", sep,
                      3 + k, axes[k], have[k] < 3 ? "linespoints pt 7" : "lines", dark[k], names[k],
                      *side[k] ? " (" : "", *side[k] ? side[k] + 2 : "", *side[k] ? ")" : "");
        }
        sep = ", \\\n     ";
    }
    sb_printf(s, "\n");
}

static int plot_loss(const Metrics *m, const char *gnuplot, const char *tmpdir, const char *out_dir,
                     const char *run) {
    size_t n_loss = 0, n_aux = 0, n_z = 0;
    for (size_t i = 0; i < m->ntr; i++) {
        n_loss += isfinite(m->tr[i].loss);
        n_aux += isfinite(m->tr[i].aux);
        n_z += isfinite(m->tr[i].z);
    }
    if (n_loss == 0 && m->nva == 0) {
        gp_warn("no loss values in %s/metrics.jsonl; skipping plots", out_dir);
        return -1;
    }
    // long runs show the raw curves faintly under their EMA
    int ema_loss = n_loss >= 20, ema_router = m->ntr >= 200;
    if (write_loss_data(m, tmpdir) != 0) return -1;
    double x0, x1;
    loss_steps(m, &x0, &x1);
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
    if (two_panels) router_panel(&s, n_aux, n_z, ema_router);
    sb_printf(&s, "unset multiplot\nset output\n");
    int rc = gp_draw(gnuplot, tmpdir, out_dir, "loss.png", &s);
    free(s.p);
    return rc;
}

// ---- expert_load.png ----
// The heat map: rows = layer x expert, columns = steps (binned), values = share of the layer's tokens.
typedef struct {
    size_t rows, nrec, ncols; // rows; records with a load; columns
    long smin, smax; // the first and last step with a load
    double dx; // steps per column
    double *acc; // (ncols, rows) the mean share (NaN: no data)
    double vmax; // the largest share
    int any_nan;
} Heat;

// Bins the records onto ncols evenly spaced steps; a bin averages its records' shares and an empty bin
// repeats the previous one.
static void bin_loads(const Metrics *m, Heat *h) {
    size_t rows = h->rows, ncols = h->nrec < HEAT_MAX_COLS ? h->nrec : HEAT_MAX_COLS;
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
    h->vmax = 0;
    h->any_nan = 0;
    for (size_t c = 0; c < ncols; c++)
        for (size_t r = 0; r < rows; r++) {
            double *v = &acc[c * rows + r];
            if (ccnt[c] == 0 && c > 0) *v = acc[(c - 1) * rows + r];
            else *v = cnt[c * rows + r] ? *v / cnt[c * rows + r] : NAN;
            if (isfinite(*v) && *v > h->vmax) h->vmax = *v;
            if (!isfinite(*v)) h->any_nan = 1;
        }
    free(cnt);
    free(ccnt);
    h->ncols = ncols;
    h->smin = smin;
    h->smax = smax;
    h->dx = ncols > 1 ? (double)(smax - smin) / (double)(ncols - 1) : 1.0;
    h->acc = acc;
}

// load.dat: x y share per cell. Returns 0, or -1 after a warning.
static int write_load_data(const Heat *h, const char *tmpdir) {
    // `with image` needs a grid of at least 2 x 2: a lone column or row is drawn twice, half as wide.
    size_t rows = h->rows;
    int dup_c = h->ncols == 1, dup_r = rows == 1;
    Str d = {0};
    for (size_t c = 0; c < h->ncols; c++)
        for (int dc = 0; dc <= dup_c; dc++) {
            double x =
                dup_c ? (double)h->smin + (dc ? 0.25 : -0.25) * h->dx : (double)h->smin + (double)c * h->dx;
            for (size_t r = 0; r < rows; r++)
                for (int dr = 0; dr <= dup_r; dr++) {
                    double y = dup_r ? (dr ? 0.25 : -0.25) : (double)r;
                    double v = h->acc[c * rows + r];
                    if (isfinite(v)) sb_printf(&d, "%.17g %g %.6g\n", x, y, v);
                    else sb_printf(&d, "%.17g %g NaN\n", x, y);
                }
            sb_printf(&d, "\n");
        }
    int rc = gp_write(tmpdir, "load.dat", d.p, d.n);
    free(d.p);
    return rc;
}

// The y axis: a label per row (layer, expert) when there are few, else at layer starts; a line between
// layers.
static void load_rows(Str *s, const Metrics *m, size_t rows, int label_rows) {
    sb_printf(s, "set ytics (");
    if (label_rows) {
        for (size_t r = 0; r < rows; r++)
            sb_printf(s, "%s'L%zu E%zu' %zu", r ? ", " : "", r / (size_t)m->E, r % (size_t)m->E, r);
    } else {
        size_t every = 1;
        while ((size_t)m->L / every > ROW_LABEL_MAX) every++;
        const char *sp = "";
        for (size_t l = 0; l < (size_t)m->L; l += every) {
            sb_printf(s, "%s'L%zu E0' %zu", sp, l, l * (size_t)m->E);
            sp = ", ";
        }
    }
    sb_printf(s, ")\n");
    if (!label_rows || rows > 24) sb_printf(s, "set ytics font ',8'\n");
    for (int l = 1; l < m->L && m->E > 1; l++)
        sb_printf(
            s, "set arrow from graph 0, first %g to graph 1, first %g nohead front lc rgb '#000000' lw 1.5\n",
            (double)l * m->E - 0.5, (double)l * m->E - 0.5);
}

static int plot_load(const Metrics *m, const char *gnuplot, const char *tmpdir, const char *out_dir,
                     const char *run) {
    Heat h = {0};
    h.rows = (size_t)m->L * m->E;
    for (size_t i = 0; i < m->ntr; i++) h.nrec += m->tr[i].load >= 0;
    if (h.nrec == 0 || h.rows == 0) return 0; // no expert_load logged (e.g. a dense run): nothing to draw
    bin_loads(m, &h);
    int rc = write_load_data(&h, tmpdir);
    free(h.acc);
    if (rc != 0) return -1;

    // Colour: white = uniform share 1/E, blue = under-used, red = over-used; the scale stops at
    // 4/E (or the largest share, if smaller) so that near-uniform loads still show contrast.
    size_t rows = h.rows;
    double uni = 1.0 / m->E, cbmax = fmax(2.0 * uni, fmin(h.vmax, 4.0 * uni));
    if (cbmax > 1) cbmax = 1;
    int saturated = h.vmax > cbmax * 1.0001;
    int label_rows = rows <= ROW_LABEL_MAX;
    int ht = label_rows ? 160 + (int)rows * 16 : 160 + (int)rows * 3;
    if (ht < 600) ht = 600;
    if (ht > 1600) ht = 1600;
    Str s = {0};
    sb_terminal(&s, 1000, ht, "expert_load.png");
    char title[1024];
    if (h.ncols < h.nrec)
        snprintf(title, sizeof title, "%s: expert load (%zu logged steps averaged into %zu columns)", run,
                 h.nrec, h.ncols);
    else snprintf(title, sizeof title, "%s: expert load", run);
    sb_printf(&s, "set title ");
    sb_quoted(&s, title);
    sb_printf(&s, "\n");
    sb_printf(&s,
              "set xlabel 'step'\nset ylabel 'layer / expert'\nset format x '%%.0f'\nset tics out\nset xtics "
              "nomirror\nset ytics scale 0\n");
    sb_printf(&s, "set xrange [%.17g:%.17g]\nset yrange [%g:%g]\n", (double)h.smin - h.dx / 2,
              (double)h.smax + h.dx / 2, (double)rows - 0.5, -0.5);
    if (h.smax - h.smin <= 10) sb_printf(&s, "set xtics 1\n");
    // cells without data (a layer that routed no tokens) are left undrawn over a grey background
    if (h.any_nan)
        sb_printf(&s,
                  "set object 1 rectangle from graph 0,0 to graph 1,1 behind fc rgb '#9a9a9a' fillstyle "
                  "solid noborder\n");
    load_rows(&s, m, rows, label_rows);
    if (cbmax > uni * 1.0001)
        sb_printf(&s, "set palette defined (0 '#2166ac', %.9g '#f7f7f7', %.9g '#b2182b')\n", uni, cbmax);
    else sb_printf(&s, "set palette defined (0 '#2166ac', 1 '#f7f7f7')\n");
    char cbl[256];
    snprintf(cbl, sizeof cbl, "share of the layer's tokens (white = uniform 1/%d = %.3g%s%s)", m->E, uni,
             saturated ? "; top colour = 4/E or more" : "", h.any_nan ? "; grey = no data" : "");
    sb_printf(&s, "set cbrange [0:%.9g]\nset cbtics out nomirror\nset cblabel ", cbmax);
    sb_quoted(&s, cbl);
    sb_printf(&s, "\n");
    sb_printf(&s, "plot 'load.dat' using 1:2:3 with image notitle\nset output\n");
    rc = gp_draw(gnuplot, tmpdir, out_dir, "expert_load.png", &s);
    free(s.p);
    return rc;
}

int plot_run(const char *out_dir) {
    char *gnuplot = gp_find();
    if (!gnuplot) {
        fflush(stdout);
        fprintf(stderr, "moe: warning: gnuplot not found (apt-get install gnuplot-nox); skipping plots\n");
        return -1;
    }
    Metrics m = {0};
    char *mpath = gp_path(out_dir, "metrics.jsonl");
    int rc = metrics_read(mpath, &m);
    if (rc != 0) gp_warn("cannot read %s (%s); skipping plots", mpath, strerror(errno));
    free(mpath);
    if (rc == 0) {
        // run name for titles: last component of out_dir
        char *name = xstrdup(out_dir);
        size_t nl = strlen(name);
        while (nl > 1 && name[nl - 1] == '/') name[--nl] = 0;
        const char *run = strrchr(name, '/') && name[1] ? strrchr(name, '/') + 1 : name;
        char tmpl[] = "/tmp/moe-plot-XXXXXX";
        if (m.ntr == 0 && m.nva == 0) {
            gp_warn("no metrics in %s/metrics.jsonl; skipping plots", out_dir);
            rc = -1;
        } else if (!mkdtemp(tmpl)) {
            gp_warn("cannot create a temporary directory under /tmp (%s); skipping plots", strerror(errno));
            rc = -1;
        } else {
            int a = plot_loss(&m, gnuplot, tmpl, out_dir, run);
            int b = plot_load(&m, gnuplot, tmpl, out_dir, run);
            rc = a == 0 && b == 0 ? 0 : -1;
            gp_remove_dir(tmpl);
        }
        free(name);
    }
    metrics_free(&m);
    free(gnuplot);
    return rc;
}
