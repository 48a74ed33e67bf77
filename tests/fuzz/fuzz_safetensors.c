// fuzz_safetensors.c — libFuzzer target: the safetensors reader (header length, JSON header, dtypes,
// shapes, data_offsets layout, __metadata__) on arbitrary files; every tensor it accepts is read.
#include "fuzz.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const char *p = fuzz_file("x.safetensors", data, n);
    static StFile *volatile f;
    static float *volatile buf;
    f = NULL;
    buf = NULL;
    if (setjmp(fuzz_jb) == 0) {
        f = safetensors_open(p);
        buf = xmalloc(n + 16);
        for (int i = 0; i < safetensors_count(f); i++) {
            // a one-dimensional read of each tensor: dies on the shape unless it is one-dimensional,
            // otherwise converts the bytes (the file is n bytes, so buf holds any tensor of it)
            int64_t sh[1] = {1};
            if (setjmp(fuzz_jb) == 0) safetensors_read(f, safetensors_name(f, i), 1, sh, buf);
        }
    }
    free(buf);
    safetensors_close(f);
    return 0;
}
