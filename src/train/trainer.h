// trainer.h — `moe train`: the training loop (micro-batches, clipping, AdamW, schedule),
// progress lines, metrics.jsonl, periodic eval and checkpoints, resume, end-of-run report.
#pragma once
#include "core/config.h"
#include "parallel/comm.h"
#include "train/options.h"

// model_explicit: the user set model options (a preset, config file or model flag); on --resume
// they must then match the checkpoint's config. Returns the process exit code.
// record: the run record (JSON text) rank 0 writes to OUT/run.json once the directory is ready (NULL:
// none). world: the process group (size 1 for one process); the mesh comes from o->tp/ep/etp/pp.
int train_run(const ModelConfig *c, const TrainOptions *o, int model_explicit, const char *record,
              Comm *world);

// Every check train_run makes before it writes to o->out (options, mesh, device, environment, data, the
// directory's run unless o->force), with the model set up once and freed: for a caller that writes to
// o->out before train_run (--init-from), so that a refusal leaves the old run as it was. Collective.
void train_check(const ModelConfig *c, const TrainOptions *o, Comm *world);
