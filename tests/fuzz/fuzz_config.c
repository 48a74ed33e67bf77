// fuzz_config.c — libFuzzer target: a model config.json (ours, with "moe_c", or a Hugging Face
// MixtralConfig) through the strict JSON file reader, config_from_json and config_validate; a config
// that validates is written back and must read back to the same config.
#include "fuzz.h"
#include <cjson/cJSON.h>
#include "io/config_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n) {
    const char *p = fuzz_file("config.json", data, n);
    static cJSON *volatile j;
    j = NULL;
    if (setjmp(fuzz_jb) == 0) {
        j = json_read_file("fuzz", NULL, p, NULL);
        ModelConfig c, back;
        char err[256];
        if (j && config_from_json(j, &c, err, sizeof err) == 0 && !config_validate(&c)) {
            cJSON *w = config_to_json(&c); // as text (its floats are raw number text), then read back
            char *txt = cJSON_PrintUnformatted(w);
            cJSON *r = cJSON_Parse(txt);
            if (config_from_json(r, &back, err, sizeof err) != 0 || memcmp(&c, &back, sizeof c) != 0) abort();
            cJSON_Delete(r);
            cJSON_free(txt);
            cJSON_Delete(w);
        }
    }
    cJSON_Delete(j);
    return 0;
}
