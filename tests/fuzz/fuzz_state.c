// fuzz_state.c — libFuzzer target: a checkpoint's state.json through ckpt_load_state (step and
// total_steps in 0..INT_MAX, seq_pos and seed unsigned 64-bit, as numbers or decimal strings).
#include "fuzz.h"
#include "io/checkpoint.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    fuzz_file("state.json", data, n);
    TrainState st;
    if (setjmp(fuzz_jb) == 0) {
        ckpt_load_state(fuzz_dir(), &st);
        if (st.step < 0 || st.step > 2147483647 || st.total_steps < 0 || st.total_steps > 2147483647) abort();
    }
    return 0;
}
