// fuzz_shard.c — libFuzzer target: an llm.c token shard (256 int32 header: magic, version, token
// count; uint16 or uint32 tokens) through data_open, with T = 4.
#include "fuzz.h"
#include "data/data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const char *p = fuzz_file("x.bin", data, n);
    static Dataset ds;
    memset(&ds, 0, sizeof ds);
    if (setjmp(fuzz_jb) == 0) {
        data_open(&ds, p, 1, 4);
        if (ds.max_token < 0 || (size_t)ds.vocab_size <= (size_t)ds.max_token) abort();
    }
    data_close(&ds);
    return 0;
}
