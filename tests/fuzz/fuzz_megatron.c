// fuzz_megatron.c — libFuzzer target: a Megatron-LM indexed dataset (PREFIX.idx + PREFIX.bin) through
// data_open with T = 4. The input: two bytes (little-endian) giving the .idx's length, the .idx, then
// the .bin.
#include "fuzz.h"
#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    size_t k = n >= 2 ? (size_t)(data[0] | data[1] << 8) : 0;
    if (k > n - (n >= 2 ? 2 : n)) k = n >= 2 ? n - 2 : 0;
    const uint8_t *idx = data + (n >= 2 ? 2 : n), *bin = idx + k;
    fuzz_file("x.idx", idx, k);
    char prefix[512];
    snprintf(prefix, sizeof prefix, "%s/x", fuzz_dir());
    fuzz_file("x.bin", bin, (size_t)(data + n - bin));
    static Dataset ds;
    memset(&ds, 0, sizeof ds);
    if (setjmp(fuzz_jb) == 0) {
        data_open(&ds, prefix, 1, 4);
        if (ds.max_token < 0 || (size_t)ds.vocab_size <= (size_t)ds.max_token) abort();
    }
    data_close(&ds);
    return 0;
}
