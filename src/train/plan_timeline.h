// plan_timeline.h — one layout's step as a timeline (`moe plan --explain LAYOUT --out FILE.png`): a lane
// per pipeline stage (every rank of a stage runs alike), each action of the schedule at its place in the
// planner's own simulation (plan.h plan_pipe_simulate: each virtual stage its own forward and backward
// seconds), so the span is the planner's step; each action split in its stage's shares: compute and host
// overhead, exchange (TP, EP, ETP and PP messages), reduction (the DP gradients); the gaps are the bubble.
// Prints each lane's busy and idle fractions: their mean idle is the simulator's bubble (plan.h
// PlanRow.bubble).
// Must not hold: the planner's arithmetic (plan.c), gnuplot's process (gnuplot.c).
#pragma once
#include "train/plan.h"

// Prints the lanes' fractions and draws the PNG at path (its directory must exist) of row's layout, whose
// pipeline plan_layout gave as pipe. Returns 0, or -1 after a warning (gnuplot missing or failing: the
// figures are printed all the same).
int plan_timeline(const PlanRow *row, const PlanPipe *pipe, const char *path);
