// cost_fp8.h — the FP8 table's device bytes for the cost model (cost_fp8.c; cost.c's cuda figure is the
// caller): the operands' scratch of one rank (ms NULL: one process) on B sequences of T tokens, and the
// weight codes kept of the held weights of lt (NULL: the whole model's); dense: --fp8-dense's projections
// too.
#pragma once
#include <stddef.h>
#include "core/config.h"
#include "model/params.h"
#include "parallel/mesh.h"

double cost_fp8_scratch(const ModelConfig *c, const MeshShape *ms, size_t B, size_t T, int dense);
double cost_fp8_kept(const ModelConfig *c, const ParamTable *lt, int dense);
