// plot.h — PNG plots of a run from its metrics.jsonl: loss.png (train/val loss, aux and z loss)
// and expert_load.png (heat map: rows = layer x expert, columns = step, colour = share of tokens).
// Uses gnuplot (Debian gnuplot-nox) as an external tool. Must not hold: training logic.
#pragma once

// Returns 0 on success; on failure (e.g. gnuplot missing) prints one warning line and returns -1.
int plot_run(const char *out_dir);
