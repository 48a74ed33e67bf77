// plan_timeline.c — one layout's step drawn as lanes of the schedule simulator's actions (see
// plan_timeline.h): the lanes' busy and idle fractions printed, a gnuplot PNG of them.
// Must not hold: the planner's model (plan.c), the simulator (schedule.c), gnuplot's process (gnuplot.c).
#include "train/plan_timeline.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/common.h"
#include "train/gnuplot.h"
#include "train/schedule.h"

enum { C_COMPUTE = 0x3182bd, C_EXCHANGE = 0xe6550d, C_REDUCE = 0x31a354, C_IDLE = 0xdddddd };

// The data file: per lane its span in grey, then each action's compute, exchange and reduction shares (its
// stage's: pipe->part; xlo xhi lane colour; milliseconds).
static void timeline_data(Str *d, const PlanPipe *pipe, const SchedEvent *ev, int n, double span) {
    for (int s = 0; s < pipe->pp; s++) sb_printf(d, "0 %.9g %d %d\n", 1e3 * span, s, C_IDLE);
    for (int i = 0; i < n; i++) {
        const double *part = pipe->part[ev[i].stage];
        double busy = part[0] + part[1] + part[2];
        double t0 = 1e3 * ev[i].t0, len = 1e3 * (ev[i].t1 - ev[i].t0);
        double a = t0 + part[0] / busy * len, b = a + part[1] / busy * len, e = t0 + len;
        sb_printf(d, "%.9g %.9g %d %d\n", t0, a, ev[i].stage, C_COMPUTE);
        if (b > a) sb_printf(d, "%.9g %.9g %d %d\n", a, b, ev[i].stage, C_EXCHANGE);
        if (e > b) sb_printf(d, "%.9g %.9g %d %d\n", b, e, ev[i].stage, C_REDUCE);
    }
}

// The gnuplot script drawing name from tl.dat.
static void timeline_script(Str *s, const PlanRow *w, double span, const char *name) {
    int p = w->l.pp;
    sb_terminal(s, 1100, 170 + 55 * p, name);
    const PlanLayout *l = &w->l;
    sb_printf(s,
              "set title 'tp%d ep%d etp%d pp%d vpp%d dp%d micro%d: step %.2f ms, bubble %.1f%% (simulated on "
              "each stage''s own times)'\n",
              l->tp, l->ep, l->etp, l->pp, l->vpp, l->dp, l->micro, 1e3 * w->step, 100 * w->bubble);
    sb_printf(s, "set xlabel 'ms'\nset xrange [0:%.9g]\nset yrange [%g:-0.6]\nset ytics (", 1e3 * span,
              p - 0.4);
    for (int i = 0; i < p; i++) sb_printf(s, "%s'stage %d' %d", i ? ", " : "", i, i);
    sb_printf(s, ")\nset key outside bottom center horizontal\nset border lc rgb '#444444'\n");
    sb_printf(s,
              "plot 'tl.dat' using (($1+$2)/2):3:(($2-$1)/2):(0.3):4 with boxxyerror fs solid 1.0 noborder "
              "lc rgb variable notitle, \\\n");
    static const struct {
        int c;
        const char *t;
    } keys[4] = {{C_COMPUTE, "compute"},
                 {C_EXCHANGE, "exchange (tp, ep, etp, pp)"},
                 {C_REDUCE, "reduction (dp gradients)"},
                 {C_IDLE, "bubble (idle)"}};
    for (int k = 0; k < 4; k++)
        sb_printf(s, "  NaN with boxes fs solid 1.0 lc rgb '#%06x' title '%s'%s", keys[k].c, keys[k].t,
                  k < 3 ? ", \\\n" : "\nset output\n");
}

// Draws the PNG (the data and script in a temporary directory, gp_draw installing it at path).
static int timeline_png(const PlanRow *w, const PlanPipe *pipe, const SchedEvent *ev, int n, double span,
                        const char *path) {
    char *gnuplot = gp_find();
    if (!gnuplot) {
        gp_warn("gnuplot not found (apt-get install gnuplot-nox); no timeline drawn");
        return -1;
    }
    char dir[1100], tmpl[] = "/tmp/moe-plot-XXXXXX";
    path_parent(dir, sizeof dir, path);
    const char *name = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    int rc = -1;
    if (!mkdtemp(tmpl))
        gp_warn("cannot create a temporary directory under /tmp (%s); no timeline", strerror(errno));
    else {
        Str d = {0}, s = {0};
        timeline_data(&d, pipe, ev, n, span);
        timeline_script(&s, w, span, name);
        if (gp_write(tmpl, "tl.dat", d.p, d.n) == 0) rc = gp_draw(gnuplot, tmpl, dir, name, &s);
        free(d.p);
        free(s.p);
        gp_remove_dir(tmpl);
    }
    free(gnuplot);
    return rc;
}

int plan_timeline(const PlanRow *w, const PlanPipe *pipe, const char *path) {
    int p = pipe->pp, n = 2 * p * pipe->vpp * pipe->micro;
    double span;
    SchedEvent *ev = xmalloc(sizeof *ev * (size_t)n);
    double bubble = plan_pipe_simulate(pipe, ev, &span);
    double *busy = xcalloc((size_t)p, sizeof *busy), idle = 0;
    for (int i = 0; i < n; i++) busy[ev[i].stage] += ev[i].t1 - ev[i].t0;
    printf("timeline: %s: %d lane%s over %.4g ms (the step; each rank of a stage runs its stage's lane)\n",
           path, p, p > 1 ? "s" : "", 1e3 * span);
    for (int s = 0; s < p; s++) {
        double f = span > 0 ? busy[s] / span : 1;
        idle += 1 - f;
        printf("  stage %d: busy %.2f%%, idle %.2f%%\n", s, 100 * f, 100 * (1 - f));
    }
    printf("  mean idle %.2f%% = the simulated bubble %.2f%%\n", 100 * idle / p, 100 * bubble);
    int rc = timeline_png(w, pipe, ev, n, span, path);
    free(busy);
    free(ev);
    return rc;
}
