// textdata.h (train) — a run's tokenizer and its text data: which tokenizer a run uses (--tokenizer,
// --init-from's, or on a --resume the run's own copy in RUN/tokenizer/), text --data / --val-data
// tokenised with it into llm.c shards cached in RUN/data/ (reused while the text and the tokenizer are
// the same), what a resume checks of both, and what the run record keeps of them. Without a tokenizer
// nothing changes: text is read as bytes. Must not hold: the loader (data/), tokenisation (text/), the
// run record's options (cli/).
#pragma once
#include "core/config.h"
#include "data/data.h"
#include "parallel/comm.h"
#include "text/corpus.h"
#include "text/tokenizer.h"
#include "train/options.h"

typedef struct {
    Tokenizer *tok; // NULL: the run has no tokenizer
    char tok_src[1100]; // the tokenizer.json in use, absolute
    FilePrint tok_print; // its bytes
    int eos; // the EOS between documents (-1: none named)
    const char *eos_from;
    const char *data, *val_data; // what data_open_split reads: the options' paths, or the caches' patterns
    char data_buf[2300], val_buf[2300];
    const char *text, *val_text; // the text files tokenised (NULL: that stream is not tokenised text)
    FilePrint text_print, val_print; // their prints
} TextData;

// Picks the run's tokenizer and checks it: its vocabulary must fit c's embedding; a --resume must use the
// tokenizer the run record names (by hash) and, unless --data-changed or another path is named, the same
// text. Then rank 0 tokenises text --data / --val-data into o->out/data/ where the cache does not hold it
// already (every rank waits). Dies with one message naming the problem; a refused input leaves no cache,
// nor does a run refused later (textdata_keep).
void textdata_open(TextData *td, const TrainOptions *o, const ModelConfig *c, Comm *world);
// What textdata_open tokenised is removed again if the process dies before this is called (once every
// check of the run passed).
void textdata_keep(void);
// ds->source (and val_source) named as the text and the tokenizer, not the cache's shards.
void textdata_name(const TextData *td, Dataset *ds);
// With a tokenizer: dies when the data (token shards or a Megatron dataset the user gave) hold an id
// beyond its vocabulary, which no text it encodes could hold (sampling would print U+FFFD).
void textdata_check_ids(const TextData *td, const Dataset *ds);
// The run record's text with the tokenizer's and the text files' prints added (record is freed).
char *textdata_record(char *record, const TextData *td);
// Rank 0, once the run directory is ready: the tokenizer copied to o->out/tokenizer/ (with a
// tokenizer_config.json naming its EOS), where `moe sample`, `moe eval` and a --resume find it.
void textdata_save(const TextData *td, const char *out);
void textdata_close(TextData *td);
