// test_strict.c — issue 18's file-level findings as unit tests: state.json's step must be in the
// range a run can have (4); the safetensors reader follows the format strictly (6: header length,
// bytes after the header JSON, trailing data, overlapping / gapped / non-zero-based offsets,
// duplicate names, a non-object or non-string __metadata__; each dies with one message naming the
// file, and a well-formed file still opens); the world communicator is freed at exit (10: measured
// with mallinfo2, so it fails in a plain build too, not only under LeakSanitizer); and what the fuzz
// targets found: a shard's largest id overflowed the vocabulary rounding.
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <malloc.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include "core/common.h"
#include "io/safetensors.h"
#include "data/data.h"
#include "model/params.h"
#include "parallel/comm.h"
#include "io/checkpoint.h"
#include "test_util.h"
#include "test_death.h"
#include "test_cfg.h"

static char root[256];

// ---- 4: state.json step range
static char ck_dir[512];
static void load_state(void *arg) {
    TrainState st;
    ckpt_load_state((const char *)arg, &st);
}
static void state_case(const char *name, int64_t step, const char *phrase) {
    ModelConfig c = test_small_cfg();
    ParamTable t;
    params_build(&t, &c);
    float *w = xcalloc(t.total, sizeof(float));
    TrainState st = {.step = step, .seq_pos = 0, .seed = 1, .total_steps = 10, .tokens_seen = 0};
    snprintf(ck_dir, sizeof ck_dir, "%s/%s", root, name);
    ckpt_save(ck_dir, &c, &t, w, NULL, NULL, &st); // checksums match: only the range check can refuse it
    free(w);
    params_free(&t);
    if (phrase) {
        expect_death_msg(name, load_state, ck_dir, "state.json", phrase, 1);
    } else {
        TrainState got;
        ckpt_load_state(ck_dir, &got);
        EXPECT(got.step == step, "%s: step %lld read back as %lld", name, (long long)step,
               (long long)got.step);
    }
}

// ---- 6: safetensors files made byte by byte
static char st_path[512];
// header text (padded with pad spaces), then data_len bytes of data
static void write_st(const char *name, const char *hdr, long hdr_len_delta, size_t pad, size_t data_len) {
    snprintf(st_path, sizeof st_path, "%s/%s.safetensors", root, name);
    size_t n = strlen(hdr) + pad;
    uint64_t N = (uint64_t)((long)n + hdr_len_delta);
    FILE *f = xfopen(st_path, "wb");
    unsigned char le[8];
    for (int b = 0; b < 8; b++) le[b] = (unsigned char)(N >> (8 * b));
    xfwrite(le, 1, 8, f, st_path);
    xfwrite(hdr, 1, strlen(hdr), f, st_path);
    for (size_t i = 0; i < pad; i++) xfwrite(" ", 1, 1, f, st_path);
    for (size_t i = 0; i < data_len; i++) xfwrite("\x01", 1, 1, f, st_path);
    xfclose(f, st_path);
}
static void open_st(void *arg) {
    StFile *f = safetensors_open(st_path);
    float x[4];
    int64_t sh[1] = {2};
    safetensors_read(f, "a", 1, sh, x);
    safetensors_close(f);
}
static void st_bad(const char *name, const char *hdr, long delta, size_t pad, size_t data_len,
                   const char *phrase) {
    write_st(name, hdr, delta, pad, data_len);
    expect_death_msg(name, open_st, NULL, "is corrupt", phrase, 1);
}

#define A_B \
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[1]," \
    "\"data_offsets\":[8,12]}"

int main(void) {
    snprintf(root, sizeof root, "/tmp/test_strict_%d", (int)getpid());
    mkdir_p(root);

    printf("-- state.json: step in 0..2147483647\n");
    state_case("step_ok", 7, NULL);
    state_case("step_max", 2147483647, NULL);
    state_case("step_2p31", 2147483648LL, "\"step\" is out of range");
    state_case("step_neg", -5, "\"step\" is out of range");
    state_case("step_2p32p1", 4294967297LL, "\"step\" is out of range");

    printf("-- safetensors: strict format\n");
    write_st("good", "{" A_B "}", 0, 3, 12);
    StFile *f = safetensors_open(st_path);
    EXPECT(safetensors_count(f) == 2, "good file: %d tensors", safetensors_count(f));
    safetensors_close(f);
    write_st("good_meta", "{\"__metadata__\":{\"format\":\"pt\"}," A_B "}", 0, 0, 12);
    f = safetensors_open(st_path);
    EXPECT(safetensors_count(f) == 2, "good file with metadata: %d tensors", safetensors_count(f));
    safetensors_close(f);
    write_st("good_empty_tensor",
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}",
             0, 0, 8);
    f = safetensors_open(st_path);
    EXPECT(safetensors_count(f) == 2, "good file with an empty tensor: %d tensors", safetensors_count(f));
    safetensors_close(f);

    st_bad("hdr_len_minus_1", "{" A_B "}", -1, 3, 12, "data section");
    st_bad("trailing_bytes", "{" A_B "}", 0, 3, 13, "data section");
    st_bad("after_json", "{" A_B "}xy", 0, 0, 12, "after its JSON");
    st_bad("overlap",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
           0, 0, 8, "overlap");
    st_bad("gap",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}",
           0, 0, 16, "gap");
    st_bad("not_from_0", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, 0, 12,
           "gap");
    st_bad("dup_name",
           "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
           "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
           0, 0, 16, "twice");
    st_bad("meta_not_object", "{\"__metadata__\":[1]," A_B "}", 0, 0, 12, "__metadata__");
    st_bad("meta_not_string", "{\"__metadata__\":{\"format\":1}," A_B "}", 0, 0, 12, "__metadata__");
    st_bad("unknown_dtype", "{\"a\":{\"dtype\":\"Q7\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, 0, 8,
           "dtype");

    printf("-- a uint32 shard holding the largest id the loader keeps\n");
    { // its vocabulary (rounded up to 64) is computed without overflowing (found by fuzz_shard)
        char sp[512];
        snprintf(sp, sizeof sp, "%s/maxid.bin", root);
        int32_t hdr[256] = {20240801, 7, 41};
        uint32_t tok[41];
        for (int i = 0; i < 41; i++) tok[i] = (uint32_t)i;
        tok[0] = 2147483583u;
        FILE *fp = xfopen(sp, "wb");
        xfwrite(hdr, 4, 256, fp, sp);
        xfwrite(tok, 4, 41, fp, sp);
        xfclose(fp, sp);
        Dataset ds;
        data_open(&ds, sp, 1, 4);
        EXPECT(ds.vocab_size == 2147483584, "vocab of max id 2147483583: %d", ds.vocab_size);
        data_close(&ds);
    }

    printf("-- the world communicator is freed at exit\n");
    struct mallinfo2 before = mallinfo2();
    comm_world_init(NULL, NULL);
    comm_world_finalize();
    struct mallinfo2 after = mallinfo2();
    EXPECT(after.uordblks == before.uordblks, "comm_world_init + finalize left %zd bytes allocated",
           (ssize_t)(after.uordblks - before.uordblks));

    rm_rf(root);
    return test_done("test_strict");
}
