// fuzz_checksums.c — libFuzzer target: a checkpoint's checksums.json through ckpt_verify, in a
// directory that holds small config.json, state.json and model.safetensors files to check against.
#include "fuzz.h"
#include "io/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    static int ready;
    if (!ready) {
        fuzz_file("config.json", (const uint8_t *)"{}\n", 3);
        fuzz_file("state.json", (const uint8_t *)"{\"step\": 1}\n", 12);
        fuzz_file("model.safetensors", (const uint8_t *)"0123456789abcdef", 16);
        ready = 1;
    }
    fuzz_file("checksums.json", data, n);
    if (setjmp(fuzz_jb) == 0) ckpt_verify(fuzz_dir());
    return 0;
}
