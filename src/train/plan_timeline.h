// plan_timeline.h — one layout's step as a timeline (`moe plan --explain LAYOUT --out FILE.png`): a lane
// per pipeline stage (every rank of a stage runs alike), each action of the schedule simulator
// (schedule.h schedule_simulate: backward = 2 x forward) at its simulated place, scaled so that a stage's
// actions add up to the planner's busy time (compute and host overhead, exposed communication) and the
// span is the planner's step; each action split in the planner's shares: compute, exchange (TP, EP, ETP and
// PP messages), reduction (the DP gradients); the gaps are the bubble. Prints each lane's busy and idle
// fractions: their mean idle is the simulator's bubble (plan.h PlanRow.bubble).
// Must not hold: the planner's arithmetic (plan.c), gnuplot's process (gnuplot.c).
#pragma once
#include "train/plan.h"

// Prints the lanes' fractions and draws the PNG at path (its directory must exist). Returns 0, or -1
// after a warning (gnuplot missing or failing: the figures are printed all the same).
int plan_timeline(const PlanRow *w, const char *path);
