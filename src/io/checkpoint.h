// checkpoint.h — checkpoint directories: model.safetensors (HF Mixtral names and shapes),
// optimizer.safetensors (AdamW moments, "<name>.exp_avg" / "<name>.exp_avg_sq"), config.json
// (HF MixtralConfig keys + ours), state.json (step, data position, seed), checksums.json (crc32 of
// every other file). Written into "<dir>.tmp", each file fsynced, then renamed into place.
// Must not hold: training logic, or the safetensors format itself (io/safetensors.c).
#pragma once
#include <stdint.h>
#include "core/config.h"
#include "io/safetensors.h"
#include "model/params.h"

typedef struct {
    int64_t step; // optimizer steps completed
    uint64_t seq_pos; // global training sequence counter (data position)
    uint64_t seed;
    int64_t total_steps; // the run's --steps when saved (informational)
    double tokens_seen;
    int precision; // the run's --precision (options.h PREC_*): state.json's "precision", written
                   // only for bf16 and fp8 (absent: mixed, as every older checkpoint)
} TrainState;

// Save a checkpoint into dir (created atomically via dir.tmp + rename; an existing dir of the
// same name is replaced only after the new one is complete). m, v may be NULL (no optimizer file).
void ckpt_save(const char *dir, const ModelConfig *c, const ParamTable *t, const float *params,
               const float *m, const float *v, const TrainState *st);

// The same in steps, for ranks writing their own slices: ckpt_begin creates dir.tmp with the
// tensor files sized but empty (model_start / opt_start: byte offset of each file's data; tensors
// follow in table order, F32; the optimizer file holds every .exp_avg, then every .exp_avg_sq);
// the ranks pwrite into them; ckpt_commit writes config.json, state.json and checksums.json and
// renames dir.tmp into place. with_opt: write optimizer.safetensors.
void ckpt_begin(const char *dir, const ParamTable *t, int with_opt, uint64_t *model_start,
                uint64_t *opt_start);
// Where the ranks write between ckpt_begin and ckpt_commit: file `name` ("model.safetensors",
// "optimizer.safetensors") of the save of dir in progress.
void ckpt_begin_path(char *buf, size_t n, const char *dir, const char *name);
void ckpt_commit(const char *dir, const ModelConfig *c, const TrainState *st);

// Read config.json of a checkpoint (verifying checksums of all files first). Dies with a clear
// message naming the file on any problem.
void ckpt_load_config(const char *dir, ModelConfig *c);
// Load tensors into flat buffers laid out by t (built from the same config). m, v may be NULL
// (skip optimizer). st may be NULL. Dies naming the tensor on a missing tensor or shape mismatch.
void ckpt_load(const char *dir, const ParamTable *t, float *params, float *m, float *v, TrainState *st);

// Every tensor of f (the file at path of checkpoint dir) must be one of t's, named as in
// model.safetensors (optimizer 0) or optimizer.safetensors (1: "<name>.exp_avg" / ".exp_avg_sq");
// dies naming the first that is not (ckpt_load and the sliced load both check this).
void ckpt_check_tensors(const char *dir, const StFile *f, const char *path, const ParamTable *t,
                        int optimizer);

// state.json alone (no checksum pass: ckpt_verify first).
void ckpt_load_state(const char *dir, TrainState *st);
// Is dir a complete checkpoint (has checksums.json)?
int ckpt_is_complete(const char *dir);
// Newest complete checkpoint "step_NNNNNNNN" under out_dir into buf; returns 0 if found, -1 if none.
int ckpt_find_latest(const char *out_dir, char *buf, size_t n);
// Path of the checkpoint for a step: out_dir/step_%08d
void ckpt_path(char *buf, size_t n, const char *out_dir, int64_t step);

// Run directories: a run's --out holds step_* checkpoints (complete or not), metrics.jsonl and the
// plots. Does out hold a run? 1 and what names the first thing found ("step_00000004",
// "metrics.jsonl"), else 0.
int ckpt_run_present(const char *out, char *what, size_t n);
// Deletes the run in out (every step_* entry, best/, tokenizer/, metrics.jsonl, train.log, the plots; not the
// data/ cache, which is checked before each use); dies naming what
// it could not remove. Callers validate everything that can fail first.
void ckpt_run_clear(const char *out);
// The run record OUT/run.json (written by `moe train`, rank 0): the resolved options, the command
// line and the resumes with their overrides. run_record_write replaces it atomically (tmp, fsync,
// rename); run_record_read gives it parsed (cJSON object with an "options" object), NULL when dir
// holds none, and dies naming the file when it is not one.
#define RUN_RECORD "run.json"
#define RUN_LOG "train.log" // a copy of `moe train`'s stdout (rank 0), appended on resume
#define RUN_BEST "best" // --keep-best: the checkpoint of the lowest validation loss
#define RUN_TOKENIZER "tokenizer" // the run's tokenizer: tokenizer.json, tokenizer_config.json (its EOS)
#define RUN_DATA "data" // text data tokenised for the run: llm.c shards in data/train, data/val (a cache)
struct cJSON;
void run_record_write(const char *out, const char *text);
struct cJSON *run_record_read(const char *dir);
// Keeps the newest `keep` complete checkpoints of out (0: all); warns about any it cannot remove. Each is
// renamed to "<name>.del" before it is removed: a step_N name never holds a half-removed checkpoint.
void ckpt_prune(const char *out, int keep);
// What a killed save or prune left in out, for the start of a run (each prints one line saying what it
// did): ckpt_run_recover finishes a replacement stopped between its renames (X.old without X: X.tmp,
// complete, becomes X, else X.old back to X) and changes nothing else; ckpt_run_tidy then removes every
// step_N.tmp / best.tmp (a save's partial directory), X.old beside an X, X.del (an interrupted prune), and
// run.json.tmp / metrics.jsonl.tmp (a replacement's partial file).
void ckpt_run_recover(const char *out);
void ckpt_run_tidy(const char *out);

// Check checksums.json of a checkpoint against every file it lists (ckpt_load_config and ckpt_load
// do this first). Dies with "... is not a complete checkpoint" when checksums.json is missing and
// "...: <file> is corrupt (crc32 mismatch)" (or size mismatch) when a file differs.
void ckpt_verify(const char *dir);
