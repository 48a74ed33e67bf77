// bpe_train.h (text) — `moe tokenizer train`: a byte-level BPE tokenizer learnt from text (GPT-2's
// pre-tokenisation regex, the ByteLevel pre-tokenizer and decoder), written as a Hugging Face
// tokenizer.json. Must not hold: reading inputs (prep.c), encoding (tok_encode.c, tok_bpe.c).
#pragma once
#include "text/prep.h"

// The tokenizer learnt from the documents of in (prep's reading: plain text, JSON lines, .gz) with
// vocab ids: the special tokens (specials, comma-separated, ids 0..; the first is the EOS), the 256
// bytes, then one token per merge. Each merge joins the pair of adjacent tokens that occurs most often
// in the pre-tokenised words (weighted by their counts); ties go to the pair of lowest (left id, right
// id). out: a .json file, or a directory that gets tokenizer.json and tokenizer_config.json (naming the
// EOS), written whole (a temporary name, renamed). Prints one summary line.
void bpe_train_run(const PrepOptions *in, int vocab, const char *specials, const char *out);
