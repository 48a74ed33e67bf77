// gnuplot.h — drawing PNGs with gnuplot, for plot.c: a growable script string, text files in a temporary
// directory, the gnuplot process (fork/exec inside that directory, its output captured to a log) and each
// finished PNG copied to OUT_DIR/<name>.tmp and renamed, so a failed plot never leaves a damaged file
// behind. Every failure is one warning line (gp_warn) and -1.
// Must not hold: what a plot shows or reading metrics (plot.c).
#pragma once
#include <stddef.h>

// A growable string (zero-initialised: empty; free p).
typedef struct {
    char *p;
    size_t n, cap;
} Str;
void sb_printf(Str *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
// Appends text as a gnuplot single-quoted string (a quote inside is written twice).
void sb_quoted(Str *s, const char *text);
// The PNG terminal (pngcairo where gnuplot has it) of w x h pixels writing to out.
void sb_terminal(Str *s, int w, int h, const char *out);

// "moe: warning: ..." on stderr (stdout flushed first).
void gp_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// dir/name, malloc'd.
char *gp_path(const char *dir, const char *name);
// Writes n bytes of text to dir/name. Returns 0, or -1 after a warning.
int gp_write(const char *dir, const char *name, const char *text, size_t n);
// gnuplot's path on PATH (malloc'd), or NULL.
char *gp_find(void);
// Removes dir and the files in it (warning about any it cannot).
void gp_remove_dir(const char *dir);
// Draws one plot: writes script (which sets `output '<name>'`) to tmpdir, runs gnuplot there and installs
// the PNG as out_dir/name. Returns 0, or -1 after a warning.
int gp_draw(const char *gnuplot, const char *tmpdir, const char *out_dir, const char *name,
            const Str *script);
