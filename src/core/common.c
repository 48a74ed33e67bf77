// common.c — error exit, checked allocation and IO (files, JSON files, paths, directory fsync, the stdout
// tee of the run log), clocks and formatting helpers.
#define _POSIX_C_SOURCE 200809L
#include "core/common.h"
#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int write_all(int fd, const char *p, ssize_t n);
static void (*die_hook)(void);
static void (*die_cleanup)(void);
static int die_rank = -1;
void moe_set_die_hook(void (*hook)(void), int rank) {
    die_hook = hook;
    die_rank = rank;
}
void moe_set_die_cleanup(void (*cleanup)(void)) { die_cleanup = cleanup; }

void moe_die(const char *file, int line, const char *fmt, ...) {
    fflush(stdout);
    // the whole line in one write: stderr is unbuffered, and under MPI another rank's or mpirun's own
    // output must not land between the prefix and the message
    char msg[4096];
    int n = die_rank >= 0 ? snprintf(msg, sizeof msg, "moe: error: [rank %d] ", die_rank)
                          : snprintf(msg, sizeof msg, "moe: error: ");
    va_list ap;
    va_start(ap, fmt);
    n += vsnprintf(msg + n, sizeof msg - n, fmt, ap);
    va_end(ap);
    if (n < (int)sizeof msg && getenv("MOE_DEBUG"))
        n += snprintf(msg + n, sizeof msg - n, " [%s:%d]", file, line);
    if (n > (int)sizeof msg - 2) n = (int)sizeof msg - 2; // (a longer message is cut, its line kept)
    msg[n++] = '\n';
    msg[n] = 0;
    fflush(stderr);
    write_all(STDERR_FILENO, msg, n);
    if (die_cleanup) die_cleanup();
    if (die_hook) die_hook();
    // every stream flushed, then out without exit's handlers: an error ends the process at once,
    // and LeakSanitizer (whose check runs at exit) does not count what the abandoned work held
    fflush(NULL);
    stdout_tee_end();
    _exit(1);
}

static int tee_orig = -1, tee_file = -1, tee_read = -1, tee_on;
static atomic_int tee_err; // errno of the log file's first failed open or write (then no more writes)
static char tee_path[4096];
static pthread_t tee_thread;

// 0, or the errno of the write that failed
static int write_all(int fd, const char *p, ssize_t n) {
    while (n > 0) {
        ssize_t w = write(fd, p, (size_t)n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return w < 0 ? errno : ENOSPC;
        p += w;
        n -= w;
    }
    return 0;
}

static void *tee_main(void *arg) {
    (void)arg;
    char buf[1 << 16];
    for (;;) {
        ssize_t n = read(tee_read, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        write_all(tee_orig, buf, n); // the terminal (or whatever stdout was) keeps its output regardless
        if (atomic_load(&tee_err)) continue;
        // the file is opened at the first output, so a run that dies before printing leaves none behind
        if (tee_file < 0) tee_file = open(tee_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        int e = tee_file < 0 ? errno : write_all(tee_file, buf, n);
        if (e) atomic_store(&tee_err, e);
    }
    return NULL;
}

void stdout_tee_check(void) {
    int e = atomic_load(&tee_err);
    if (e) die_io("write the log", tee_path, e);
}

void stdout_tee(const char *path) {
    CHECK(!tee_on, "stdout_tee: a tee is already running");
    fflush(stdout);
    char dir[4096];
    path_parent(dir, sizeof dir, path);
    if (strlen(path) >= sizeof tee_path) DIE("log path too long: '%s'", path);
    if (access(file_exists(path) ? path : dir, W_OK) != 0)
        DIE("cannot write the log '%s' (%s)", path, strerror(errno));
    snprintf(tee_path, sizeof tee_path, "%s", path);
    atomic_store(&tee_err, 0);
    int p[2];
    if (pipe(p) != 0) DIE("cannot create a pipe for the log (%s)", strerror(errno));
    tee_orig = dup(STDOUT_FILENO);
    if (tee_orig < 0 || dup2(p[1], STDOUT_FILENO) < 0)
        DIE("cannot redirect stdout for the log (%s)", strerror(errno));
    close(p[1]);
    tee_read = p[0];
    tee_on = 1;
    if (pthread_create(&tee_thread, NULL, tee_main, NULL) != 0) DIE("cannot start the log thread");
    static int registered;
    if (!registered++) atexit(stdout_tee_end);
}

void stdout_tee_end(void) {
    if (!tee_on) return;
    fflush(stdout);
    dup2(tee_orig, STDOUT_FILENO); // closes the pipe's last write end: the thread reads to its end
    pthread_join(tee_thread, NULL);
    close(tee_read);
    if (tee_file >= 0) close(tee_file);
    close(tee_orig);
    tee_file = tee_read = tee_orig = -1;
    tee_on = 0;
}

static volatile sig_atomic_t preempt_sig, preempt_armed;
static void on_preempt(int sig) {
    signal(sig, SIG_DFL); // a second one ends the process
    if (preempt_armed) preempt_sig = sig;
    else raise(sig); // (blocked until this handler returns, then the default action: the process ends)
}
void preempt_arm(int on) { preempt_armed = on; }
void signals_init(int preemptible) {
    signal(SIGXFSZ, SIG_IGN);
    if (!preemptible) return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_preempt;
    sa.sa_flags = SA_RESTART; // IO in progress continues; the loop checks the flag between steps
    sigemptyset(&sa.sa_mask);
    const int sigs[4] = {SIGTERM, SIGINT, SIGUSR1, SIGUSR2};
    for (int i = 0; i < 4; i++) {
        struct sigaction old;
        // a signal ignored when we started stays ignored (a shell's background job ignores SIGINT)
        if (sigaction(sigs[i], NULL, &old) != 0 ||
            (old.sa_handler != SIG_IGN && sigaction(sigs[i], &sa, NULL) != 0))
            DIE("cannot install the preemption signals' handlers (%s)", strerror(errno));
    }
}
int preempt_signal(void) { return preempt_sig; }

// Every xmalloc / xcalloc / xrealloc (xstrdup through xmalloc) so far, and every backend buffer: tests
// check that a training step after the first allocates nothing (relaxed: only counts; the tee and
// watchdog threads may add).
static atomic_uint_fast64_t n_allocs, n_backend;
uint64_t alloc_count(void) { return (uint64_t)atomic_load_explicit(&n_allocs, memory_order_relaxed); }
uint64_t alloc_count_backend(void) {
    return (uint64_t)atomic_load_explicit(&n_backend, memory_order_relaxed);
}
void alloc_note_backend(void) { atomic_fetch_add_explicit(&n_backend, 1, memory_order_relaxed); }
#define COUNT_ALLOC() atomic_fetch_add_explicit(&n_allocs, 1, memory_order_relaxed)

void *xmalloc(size_t n) {
    COUNT_ALLOC();
    void *p = malloc(n ? n : 1);
    if (!p) DIE("out of memory allocating %zu bytes", n);
    return p;
}
void *xcalloc(size_t n, size_t size) {
    COUNT_ALLOC();
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) DIE("out of memory allocating %zu x %zu bytes", n, size);
    return p;
}
void *xrealloc(void *p, size_t n) {
    COUNT_ALLOC();
    void *q = realloc(p, n ? n : 1);
    if (!q) DIE("out of memory reallocating %zu bytes", n);
    return q;
}
char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

static char io_note[2048];
void io_note_set(const char *note) { snprintf(io_note, sizeof io_note, "%s", note ? note : ""); }
void die_io(const char *verb, const char *path, int err) {
    DIE("cannot %s '%s' (%s)%s%s", verb, path, strerror(err), io_note[0] ? "; " : "", io_note);
}

void fault_point(const char *name) {
    const char *f = getenv("MOE_FAULT");
    size_t n = strlen(name);
    if (!f || strncmp(f, name, n) != 0) return;
    fflush(NULL);
    if (f[n] == 0) kill(getpid(), SIGKILL);
    if (strcmp(f + n, ":wait") == 0) sleep(30);
}

FILE *xfopen(const char *path, const char *mode) {
    FILE *f = fopen(path, mode);
    if (!f && mode[0] == 'r' && !strchr(mode, '+')) DIE("cannot open '%s' (%s)", path, strerror(errno));
    if (!f) die_io("open", path, errno);
    return f;
}
void xfwrite(const void *p, size_t size, size_t n, FILE *f, const char *path) {
    if (n && fwrite(p, size, n, f) != n) die_io("write", path, errno);
}
void xfputs(const char *s, FILE *f, const char *path) { xfwrite(s, 1, strlen(s), f, path); }
void xfflush(FILE *f, const char *path) {
    if (fflush(f) != 0) die_io("write", path, errno);
}
void xfappend(const char *s, FILE *f, const char *path) { xfappend_bytes(s, strlen(s), f, path); }
void xfappend_bytes(const void *p, size_t n, FILE *f, const char *path) {
    xfflush(f, path);
    off_t before = lseek(fileno(f), 0, SEEK_END);
    if ((n && fwrite(p, 1, n, f) != n) || fflush(f) != 0) {
        int e = errno;
        if (before >= 0 && ftruncate(fileno(f), before) != 0) e = errno;
        die_io("write", path, e);
    }
}
void xrename(const char *from, const char *to) {
    if (rename(from, to) == 0) return;
    char what[4200];
    snprintf(what, sizeof what, "rename '%s' to", from);
    die_io(what, to, errno);
}
void xfread(void *p, size_t size, size_t n, FILE *f, const char *path) {
    if (n && fread(p, size, n, f) != n)
        DIE("cannot read '%s' (%s)", path, feof(f) ? "file is truncated" : strerror(errno));
}
void xpread(int fd, void *buf, size_t n, uint64_t off, const char *path) {
    char *b = buf;
    while (n) {
        ssize_t r = pread(fd, b, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) DIE("cannot read '%s' (%s)", path, strerror(errno));
        if (r == 0) DIE("cannot read '%s' (file is truncated)", path);
        b += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
}
void xfclose(FILE *f, const char *path) {
    xfflush(f, path);
    if (fsync(fileno(f)) != 0 && errno != EINVAL && errno != EROFS) die_io("fsync", path, errno);
    if (fclose(f) != 0) die_io("close", path, errno);
}

char *read_file(const char *path, size_t *len) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer; anything but a regular file is refused
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        int e = fstat(fd, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? EISDIR : ENODEV;
        close(fd);
        errno = e;
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap + 1);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            buf = xrealloc(buf, cap + 1);
        }
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (got == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        errno = EIO;
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

typedef struct {
    const char *key;
    int at;
} KeyAt;
static int key_at_cmp(const void *x, const void *y) {
    const KeyAt *a = x, *b = y;
    int c = strcmp(a->key, b->key);
    return c ? c : (a->at > b->at) - (a->at < b->at);
}

// The first key that appears twice in one object of j (anywhere in the tree), or NULL: the children in
// order, each first checked for a later namesake, then searched inside. A large object's keys are
// sorted once (a tokenizer.json's vocabulary has 10^5 keys: comparing every pair took a minute).
static const char *json_dup_key(const cJSON *j) {
    int n = 0;
    for (const cJSON *a = j ? j->child : NULL; a; a = a->next) n++;
    char *twice = NULL; // twice[i]: child i's key appears again after it
    if (cJSON_IsObject(j) && n > 32) {
        KeyAt *k = xmalloc((size_t)n * sizeof *k);
        int m = 0;
        for (const cJSON *a = j->child; a; a = a->next, m++) k[m] = (KeyAt){a->string ? a->string : "", m};
        qsort(k, (size_t)n, sizeof *k, key_at_cmp);
        twice = xcalloc((size_t)n, 1);
        for (int i = 0; i + 1 < n; i++)
            if (!strcmp(k[i].key, k[i + 1].key) && (i == 0 || strcmp(k[i - 1].key, k[i].key)))
                twice[k[i].at] = 1;
        free(k);
    }
    int i = 0;
    for (const cJSON *a = j ? j->child : NULL; a; a = a->next, i++) {
        if (twice && twice[i] && a->string) {
            free(twice);
            return a->string;
        }
        if (!twice && cJSON_IsObject(j) && a->string)
            for (const cJSON *b = a->next; b; b = b->next)
                if (b->string && strcmp(a->string, b->string) == 0) return a->string;
        const char *d = json_dup_key(a);
        if (d) {
            free(twice);
            return d;
        }
    }
    free(twice);
    return NULL;
}

cJSON *json_read_file(const char *who, const char *dir, const char *name, long *err_at) {
    char p[4096];
    if (dir) join_path(p, sizeof p, dir, name);
    const char *path = dir ? p : name;
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) DIE("%s: '%s' is not a regular file", who, path);
    size_t len;
    char *txt = read_file(path, &len);
    if (!txt && dir) DIE("%s: cannot read %s (%s)", who, name, strerror(errno));
    if (!txt) DIE("%s: cannot read '%s' (%s)", who, name, strerror(errno));
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(txt, len, &end, 0);
    if (j) { // one JSON value and nothing after it but blanks
        while (end < txt + len && (*end == ' ' || *end == '\t' || *end == '\n' || *end == '\r')) end++;
        if (end < txt + len) {
            cJSON_Delete(j);
            j = NULL;
        }
    } else {
        end = cJSON_GetErrorPtr();
    }
    if (!j && err_at) *err_at = end ? (long)(end - txt) : 0;
    const char *dup = json_dup_key(j);
    if (dup) {
        char key[80];
        snprintf(key, sizeof key, "%s", dup);
        cJSON_Delete(j);
        free(txt);
        DIE("%s: %s%s%s has the key \"%s\" twice", who, dir ? "" : "'", name, dir ? "" : "'", key);
    }
    free(txt);
    return j;
}

void json_write_file(const char *path, const cJSON *j) {
    char *s = cJSON_Print(j);
    if (!s) DIE("out of memory formatting '%s'", path);
    FILE *f = xfopen(path, "wb");
    xfwrite(s, 1, strlen(s), f, path);
    xfwrite("\n", 1, 1, f, path);
    xfclose(f, path);
    cJSON_free(s);
}

void join_path(char *buf, size_t n, const char *dir, const char *name) {
    int k = snprintf(buf, n, "%s/%s", dir, name);
    if (k < 0 || (size_t)k >= n) DIE("path too long: '%s/%s'", dir, name);
}

void path_parent(char *buf, size_t n, const char *path) {
    const char *s = strrchr(path, '/');
    if (!s) {
        snprintf(buf, n, ".");
        return;
    }
    if (s == path) {
        snprintf(buf, n, "/");
        return;
    }
    size_t k = (size_t)(s - path);
    if (k >= n) DIE("path too long: '%s'", path);
    memcpy(buf, path, k);
    buf[k] = 0;
}

void fsync_dir(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) DIE("cannot open directory '%s' (%s)", path, strerror(errno));
    if (fsync(fd) != 0 && errno != EINVAL && errno != EROFS) die_io("fsync the directory", path, errno);
    close(fd);
}

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}
void proc_memory(double *resident, double *peak) {
    *resident = *peak = 0;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return;
    char line[256];
    long kb;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) *resident = 1024.0 * kb;
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) *peak = 1024.0 * kb;
    }
    fclose(f);
}
int file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}
int dir_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

void mkdir_p(const char *path) {
    char tmp[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof tmp) DIE("bad directory path '%s'", path);
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) die_io("create directory", tmp, errno);
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST) die_io("create directory", tmp, errno);
    if (!dir_exists(tmp)) DIE("'%s' exists and is not a directory", tmp);
}

uint64_t hash_bytes(const void *p, size_t n, uint64_t h) {
    const unsigned char *b = p;
    h ^= 0x9E3779B97F4A7C15ull + n;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) { // 8 bytes at a time: multiply, xor-shift (splitmix64's mixer)
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = (h ^ w) * 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    for (; i < n; i++) {
        h = (h ^ b[i]) * 0x94D049BB133111EBull;
        h ^= h >> 29;
    }
    h ^= h >> 33;
    return h * 0xFF51AFD7ED558CCDull;
}

void fmt_bytes(char *buf, size_t n, double b) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) {
        b /= 1024;
        i++;
    }
    snprintf(buf, n, i ? "%.2f %s" : "%.0f %s", b, u[i]);
}
void fmt_count(char *buf, size_t n, double c) {
    const char *u[] = {"", "K", "M", "B", "T"};
    int i = 0;
    while (c >= 1000 && i < 4) {
        c /= 1000;
        i++;
    }
    snprintf(buf, n, i ? "%.2f%s" : "%.0f%s", c, u[i]);
}

#include <ftw.h>
static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    int rc = remove(p);
    if (rc == 0) fault_point("remove");
    return rc;
}
int rm_rf(const char *path) {
    if (!file_exists(path) && !dir_exists(path)) return 0;
    return nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}
