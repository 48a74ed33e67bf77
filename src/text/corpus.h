// corpus.h (text) — a text file (plain text, JSON lines, either gzip'd) tokenised once into llm.c shards
// kept in a cache directory and reused while the text, the tokenizer and the EOS are the same: `moe
// train --data corpus.txt` with a tokenizer, `moe eval --data`. Must not hold: the tokenizer
// (tokenizer.h), reading inputs and writing shards (prep.c), the loader (data/data.h), a run's records.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include "text/tokenizer.h"

// What identifies a file's contents: its size and a hash of its bytes (a .gz file's compressed bytes).
typedef struct {
    uint64_t bytes, hash;
} FilePrint;
// Dies "<who>: cannot read '<path>' (...)" when the file cannot be read.
FilePrint file_print(const char *path, const char *who);

// The EOS appended after each document of text: the one named beside the tokenizer at tok_path (prep's
// rule), or -1 when none is named and text is plain text (one document: nothing to separate). JSON lines
// (many documents) without one: dies naming who and the files that could name it. *from: the file that
// named it (static text).
int corpus_eos(const Tokenizer *t, const char *tok_path, const char *text, const char *who,
               const char **from);

// The shards of the text file `text` tokenised with t (tok: its tokenizer.json's print; eos < 0: none;
// eos_from: where it was named, for the summary line) in dir/name/, their glob into pattern: reused when
// dir/name/source.json records the same text (path, bytes, hash), tokenizer and EOS. Otherwise, with
// build, made again (written in dir/name.part and renamed; a refused input leaves neither, nor the
// directories this call made). Returns 1 when dir/name holds them (found or made), 0 when not (without
// build). Messages begin with who ("--data", ...). print (may be NULL): the text's print.
int corpus_shards(const Tokenizer *t, FilePrint tok, int eos, const char *eos_from, const char *text,
                  const char *dir, const char *name, int build, const char *who, char *pattern, size_t n,
                  FilePrint *print);
