// resume.h (train) — a --resume's checks against the run record that need the loaded data, and the
// record's part that only the trainer knows. Must not hold: the record's options (cli/run_record.h).
#pragma once
#include <stdint.h>
#include "data/data.h"
#include "train/options.h"

// --resume: the training data and --val-data must be what the run record (o->out's run.json) says the
// run trained on (token count and hash), unless --data-changed or the user named another path (the embedded
// corpus is not checked: --seed makes it, and the checkpoint's seed is checked); dies
// naming the file and both fingerprints otherwise. A record without them (an older moe) passes.
void resume_check_data(const Dataset *ds, const TrainOptions *o);
// The run record's text (malloc'd) with the data's fingerprints added ("data": "train", "val").
char *resume_record_data(const char *record, const Dataset *ds, const TrainOptions *o);
// --keep-best on resume: out/best's step (its state.json) and that step's val_loss in metrics_path at or
// before step (the checkpoint resumed from; rank 0 may be truncating the file: it is replaced by a rename,
// and either version holds those lines), into *best_step; HUGE_VAL and -1 where there is none (a best saved
// after the checkpoint resumed from counts as none: the next evaluation replaces it).
double resume_best(const char *out, const char *metrics_path, int64_t step, int64_t *best_step);
