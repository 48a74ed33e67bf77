// common.h — error handling, checked allocation and IO, small helpers shared by every layer.
// Must not hold: anything model-, data- or backend-specific.
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

// Print "moe: error: <msg>" (file:line with MOE_DEBUG set), flush every stream and _exit(1).
void moe_die(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
#define DIE(...) moe_die(__FILE__, __LINE__, __VA_ARGS__)
#define CHECK(cond, ...) \
    do { \
        if (!(cond)) DIE(__VA_ARGS__); \
    } while (0)

// Called by DIE after printing (e.g. MPI_Abort so every rank ends); rank >= 0 tags messages.
void moe_set_die_hook(void (*hook)(void), int rank);
// Called by DIE before the hook: removing what a half-done step wrote (a directory being filled); one at
// a time, NULL clears it. Apart from the hook, which the process's owner (MPI) sets.
void moe_set_die_cleanup(void (*cleanup)(void));

// Signals: SIGXFSZ ignored (a file-size limit makes writes fail with EFBIG, reported by the checked
// IO calls, instead of killing the process); with preemptible, SIGTERM, SIGINT, SIGUSR1 and SIGUSR2
// (mpirun forwards the last two to the ranks and returns their status; on SIGTERM it exits 1 and kills
// them a second later) are handled: while armed (preempt_arm(1): the training loop, which checks
// between steps) the first is only recorded (preempt_signal() then returns it; a second one ends the
// process as usual); while disarmed (start-up, the final report) one ends the process at once, as
// without a handler, rather than waiting for a check that will not come.
void signals_init(int preemptible);
void preempt_arm(int on);
int preempt_signal(void); // 0, or the signal that asked this process to stop
#define MOE_EXIT_PREEMPTED 75 // exit status after a preemption's checkpoint (EX_TEMPFAIL: --resume)

void *xmalloc(size_t n); // dies naming the byte count on failure
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
// How many of the calls above this process made so far (xstrdup counts once), and how many buffers the
// compute backends allocated (each Backend.alloc calls alloc_note_backend; the cpu's are xcalloc's too):
// a training step after its first must add to neither (tests/test_alloc.c).
uint64_t alloc_count(void);
uint64_t alloc_count_backend(void);
void alloc_note_backend(void);

// Checked stdio: die naming the path and errno text (a failed write or rename: and the IO note below).
FILE *xfopen(const char *path, const char *mode);
void xfwrite(const void *p, size_t size, size_t n, FILE *f, const char *path);
void xfputs(const char *s, FILE *f, const char *path);
void xfflush(FILE *f, const char *path);
// s appended to f (a file opened for appending) and flushed, whole or not at all: a failed write cuts the
// file back to its length before, then dies (a line-per-record file such as metrics.jsonl keeps no torn
// last line).
void xfappend(const char *s, FILE *f, const char *path);
void xfappend_bytes(const void *p, size_t n, FILE *f, const char *path); // the same, for n bytes of any kind
void xfread(void *p, size_t size, size_t n, FILE *f, const char *path);
void xfclose(FILE *f, const char *path); // fflush + fsync + fclose for files opened for writing
void xrename(const char *from, const char *to);

// A failed write ends the process with "moe: error: cannot <verb> '<path>' (<errno text>)", followed by
// "; <note>" while an IO note is set (a run sets where its last complete checkpoint is, so a full disk
// says what was kept). io_note_set(NULL) clears it.
void die_io(const char *verb, const char *path, int err) __attribute__((noreturn));
void io_note_set(const char *note);

// Fault injection for the tests: with MOE_FAULT=<name> in the environment, fault_point(name) kills this
// process (SIGKILL, as kill -9 would) at that point; with MOE_FAULT=<name>:wait it waits there 30 s instead
// (for a test to signal the process at a known point). Points: "remove" (rm_rf, after the first entry of
// a tree is removed), "swap" (replacing a checkpoint without RENAME_EXCHANGE, between its two renames),
// "startup" (a training run's start-up done, before the first step).
void fault_point(const char *name);

// n bytes at offset off of the open file fd into buf (pread, retried on EINTR); dies naming path when the
// file ends early or a read fails. Readers that must leave nothing behind on a refused input (a DIE that
// returns, as in the fuzz targets) use a descriptor and this rather than stdio.
void xpread(int fd, void *buf, size_t n, uint64_t off, const char *path);

// Read a whole file into a malloc'd buffer (NUL-terminated); *len gets the byte count.
// Returns NULL (errno set) if it cannot be opened/read.
char *read_file(const char *path, size_t *len);

// JSON files (cJSON). json_read_file reads dir/name (dir NULL: name is the path) and parses it;
// returns NULL if the text is not JSON (*err_at, if given: the byte offset where parsing failed) and
// dies "<who>: cannot read <name> (<errno text>)" if the file cannot be read (with dir NULL, the
// path is quoted: "<who>: cannot read '<path>' (...)"). json_write_file writes j indented, with a
// final newline, fsynced. Free the result with cJSON_Delete.
struct cJSON;
struct cJSON *json_read_file(const char *who, const char *dir, const char *name, long *err_at);
void json_write_file(const char *path, const struct cJSON *j);

// Paths: "dir/name" into buf (dies "path too long: 'dir/name'" if it does not fit); the directory
// holding path ("." for a bare name, "/" for a top-level one; dies if it does not fit).
void join_path(char *buf, size_t n, const char *dir, const char *name);
void path_parent(char *buf, size_t n, const char *path);
// fsync a directory (after creating, renaming or removing entries in it); dies naming it.
void fsync_dir(const char *path);

double now_seconds(void); // monotonic clock
double cpu_seconds(void); // this process's CPU time (every thread)
// This process's resident set now and its peak so far (/proc/self/status VmRSS, VmHWM), bytes; 0 and 0
// where the system does not say (not Linux).
void proc_memory(double *resident, double *peak);
int file_exists(const char *path);
int dir_exists(const char *path);
void mkdir_p(const char *path); // dies on failure

// A 64-bit hash of n bytes, continuing from h (start with 0): for identity checks, not security.
uint64_t hash_bytes(const void *p, size_t n, uint64_t h);

// Format helpers
void fmt_bytes(char *buf, size_t n, double bytes); // "1.23 GiB"
void fmt_count(char *buf, size_t n, double count); // "1.23M"

// A copy of everything this process writes to stdout, appended to the file at path (created 0644 at the
// first output, so nothing is written when nothing is printed): stdout becomes a pipe that a thread
// copies to the original stdout and to the file. stdout_tee_end (also run at exit and by DIE) flushes,
// restores stdout and closes the file. Dies naming the file when it (or its directory) is not writable.
// One tee at a time. A write to the file that fails is not retried: stdout_tee_check (on the calling
// thread; also after stdout_tee_end) then dies naming the file and the error, so a full disk or a
// read-only run directory is not silent.
void stdout_tee(const char *path);
void stdout_tee_end(void);
void stdout_tee_check(void);

// Remove a directory tree (no symlinks followed). Returns 0 on success.
int rm_rf(const char *path);
