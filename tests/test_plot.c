// test_plot.c — plot_run on synthetic metrics.jsonl files: both PNGs appear with a valid signature
// and sane IHDR size, no .tmp files are left, and a directory without metrics gets -1 and no files.
#include "core/common.h"
#include "train/plot.h"
#include "test_util.h"
#include <dirent.h>
#include <math.h>
#include <string.h>
#include <unistd.h>

static char *join(const char *dir, const char *name) {
    size_t n = strlen(dir) + strlen(name) + 2;
    char *p = xmalloc(n);
    snprintf(p, n, "%s/%s", dir, name);
    return p;
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

static int has_tmp_file(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 4 && !strcmp(e->d_name + n - 4, ".tmp")) found = 1;
    }
    closedir(d);
    return found;
}

static void rm_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char *p = join(dir, e->d_name);
        unlink(p);
        free(p);
    }
    closedir(d);
    rmdir(dir);
}

static uint32_t be32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

// Checks dir/name is a PNG of at least min_w x min_h pixels.
static void check_png(const char *dir, const char *name, uint32_t min_w, uint32_t min_h) {
    char *path = join(dir, name);
    size_t len = 0;
    char *data = read_file(path, &len);
    EXPECT(data != NULL, "%s not created", path);
    if (data) {
        const unsigned char *u = (const unsigned char *)data;
        EXPECT(len > 33, "%s is only %zu bytes", path, len);
        EXPECT(len > 33 && memcmp(u, "\x89PNG\r\n\x1a\n", 8) == 0, "%s has no PNG signature", path);
        EXPECT(len > 33 && memcmp(u + 12, "IHDR", 4) == 0, "%s: first chunk is not IHDR", path);
        if (len > 33) {
            uint32_t w = be32(u + 16), h = be32(u + 20);
            EXPECT(w >= min_w && w <= 4000, "%s width %u", path, w);
            EXPECT(h >= min_h && h <= 4000, "%s height %u", path, h);
        }
    }
    free(data);
    free(path);
}

// Synthetic run: loss decays, aux/z wiggle, expert 0 of each layer starts hot and evens out.
// Steps from first to last (inclusive) every `every` of a `total`-step run; eval lines every `val_every`.
static void write_metrics(FILE *f, int first, int last, int total, int every, int val_every, int L, int E,
                          double phase) {
    for (int s = first; s <= last; s += every) {
        double t = (double)s / total;
        fprintf(f,
                "{\"step\":%d,\"loss\":%.5f,\"aux_loss\":%.5f,\"z_loss\":%.6f,\"lr\":%.6g,\"grad_norm\":%.4f,"
                "\"tokens_per_s\":%.1f,\"phase\":\"train\",\"expert_load\":[",
                s, 2.0 + 6.0 * exp(-4.0 * t) + 0.15 * sin(0.7 * s + phase),
                1.0 + 0.3 * exp(-3.0 * t) + 0.02 * sin(0.3 * s), 0.05 * exp(-2.0 * t) + 0.002 * cos(0.5 * s),
                3e-4 * (1 - t), 1.0 + 0.2 * sin(0.1 * s), 12345.0 + s);
        for (int l = 0; l < L; l++) {
            fprintf(f, "%s[", l ? "," : "");
            for (int e = 0; e < E; e++) {
                double w = 100.0 + (e == (l % E) ? 400.0 * exp(-3.0 * t) : 0.0) + 30.0 * sin(0.2 * s + e + l);
                fprintf(f, "%s%d", e ? "," : "", (int)w);
            }
            fprintf(f, "]");
        }
        fprintf(f, "]}\n");
        if (val_every && s % val_every == 0 && s > 0)
            fprintf(f, "{\"step\":%d,\"val_loss\":%.5f,\"split\":\"val\"}\n", s, 2.1 + 6.0 * exp(-4.0 * t));
    }
}

int main(void) {
    if (system("command -v gnuplot >/dev/null 2>&1") != 0)
        TEST_SKIP("gnuplot not installed (apt-get install gnuplot-nox)");
    const char *keep = getenv("TEST_PLOT_KEEP");

    // 1. 50 steps, 2 layers x 4 experts, val lines, a garbage line, an empty line, a non-object line.
    char dir1[] = "/tmp/test_plot_XXXXXX";
    CHECK(mkdtemp(dir1), "mkdtemp failed");
    char *mpath = join(dir1, "metrics.jsonl");
    FILE *f = xfopen(mpath, "w");
    fprintf(f, "{\"event\":\"start\",\"note\":\"no step here\"}\n");
    write_metrics(f, 1, 25, 50, 1, 10, 2, 4, 0.0);
    fprintf(f, "this is not json {{{\n\n[1,2,3]\n{\"step\": 26, \"loss\": \n");
    write_metrics(f, 26, 50, 50, 1, 10, 2, 4, 0.0);
    xfclose(f, mpath);
    free(mpath);
    EXPECT(plot_run(dir1) == 0, "plot_run on %s failed", dir1);
    check_png(dir1, "loss.png", 400, 300);
    check_png(dir1, "expert_load.png", 400, 300);
    EXPECT(!has_tmp_file(dir1), ".tmp file left in %s", dir1);
    EXPECT(count_entries(dir1) == 3, "%s has %d entries, expected metrics.jsonl + 2 PNGs", dir1,
           count_entries(dir1));
    // Running again overwrites in place.
    EXPECT(plot_run(dir1) == 0, "second plot_run on %s failed", dir1);
    EXPECT(count_entries(dir1) == 3, "%s has %d entries after rerun", dir1, count_entries(dir1));

    // 2. 1000 logged steps (downsampled heat map), 4 layers x 8 experts, a resume that re-logs steps.
    char dir2[] = "/tmp/test_plot_XXXXXX";
    CHECK(mkdtemp(dir2), "mkdtemp failed");
    mpath = join(dir2, "metrics.jsonl");
    f = xfopen(mpath, "w");
    write_metrics(f, 0, 6000, 10000, 5, 500, 4, 8, 0.0);
    write_metrics(f, 5000, 9995, 10000, 5, 500, 4, 8, 1.0); // resumed from step 5000
    xfclose(f, mpath);
    free(mpath);
    EXPECT(plot_run(dir2) == 0, "plot_run on %s failed", dir2);
    check_png(dir2, "loss.png", 400, 300);
    check_png(dir2, "expert_load.png", 400, 300);
    EXPECT(!has_tmp_file(dir2), ".tmp file left in %s", dir2);

    // 3. No metrics.jsonl: -1 and nothing created.
    char dir3[] = "/tmp/test_plot_XXXXXX";
    CHECK(mkdtemp(dir3), "mkdtemp failed");
    EXPECT(plot_run(dir3) == -1, "plot_run without metrics.jsonl should fail");
    EXPECT(count_entries(dir3) == 0, "%s has %d entries after a failed plot_run", dir3, count_entries(dir3));

    // 4. Only garbage lines: -1 and no PNGs.
    mpath = join(dir3, "metrics.jsonl");
    f = xfopen(mpath, "w");
    fprintf(f, "garbage\n{\"step\":\"x\"}\n{}\n");
    xfclose(f, mpath);
    free(mpath);
    EXPECT(plot_run(dir3) == -1, "plot_run on garbage metrics should fail");
    EXPECT(count_entries(dir3) == 1, "%s has %d entries after a failed plot_run", dir3, count_entries(dir3));

    // 5. Nonexistent directory.
    EXPECT(plot_run("/tmp/test_plot_does_not_exist_dir") == -1, "plot_run on a missing dir should fail");

    if (keep) printf("kept: %s %s\n", dir1, dir2);
    else {
        rm_dir(dir1);
        rm_dir(dir2);
    }
    rm_dir(dir3);
    return test_done("test_plot");
}
