// infile.h (text) — an input file of text read in pieces: plain, gzip'd (zlib) or zstd'd (libzstd, where
// the build found it), told apart by the file's first bytes, not its name. Must not hold: what the text
// means (documents, JSON lines: prep.c), tokenisation.
#pragma once
#include <stddef.h>

typedef struct InFile InFile;

// Opens path; who begins the messages ("prep", "--data", ...). Dies "<who>: cannot read '<path>' (...)"
// when it cannot be opened, and names libzstd when a zstd file meets a build without it.
InFile *infile_open(const char *path, const char *who);
// The next line (without its '\n'; NUL-terminated in place, valid until the next call), or NULL at the
// end. Dies naming the file on a read error or a truncated or corrupt compressed stream.
char *infile_line(InFile *f, size_t *len);
// The rest of the file (NUL-terminated, valid until infile_close), *len its bytes; dies as infile_line.
char *infile_all(InFile *f, size_t *len);
// The bytes of the file (compressed, as on disk) read so far.
unsigned long long infile_consumed(const InFile *f);
void infile_close(InFile *f);
// The length of path's compression suffix (".gz", ".zst"), 0 without one: what a name means without it.
size_t infile_suffix(const char *path);
