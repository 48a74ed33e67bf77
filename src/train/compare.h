// compare.h — `moe compare`: several runs' metrics side by side: a table of each run's final training and
// validation loss, best validation loss, tokens and tokens/s on stdout, and optionally one PNG overlaying
// their training-loss and validation curves. Must not hold: argument parsing (cli/cmd_compare.c), reading
// metrics.jsonl (metrics.c), running gnuplot (gnuplot.c).
#pragma once

// runs: n run directories (each with run.json and metrics.jsonl); png: the PNG to write, or NULL for the
// table alone. Every run and the PNG's directory are checked before anything is printed or written; bad
// input dies with one message naming it. Returns 0.
int compare_runs(const char *const *runs, int n, const char *png);
