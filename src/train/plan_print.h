// plan_print.h — `moe plan`'s output (plan.h computes it): the ranked table with a launch command a row,
// one layout explained line by line.
// Must not hold: the planner's arithmetic (plan.c), option parsing (cli/).
#pragma once
#include "train/plan.h"

// The top rows of r (fastest first) under a head naming the profile and the refusals; model_args: the
// model's flags for the launch commands (" --preset mixtral-8x7b ...", each with its leading space).
void plan_print_table(const PlanResult *r, const PlanSpec *sp, const TrainOptions *o, int top,
                      const char *model_args);
// One layout's memory, each part of its step (with stages: each stage's busy seconds, pipe's), and its
// command.
void plan_print_explain(const PlanRow *row, const PlanPipe *pipe, const PlanSpec *sp, const TrainOptions *o,
                        const char *model_args);
