// json_keys.h — typed reads and writes of one JSON key for the config readers and writers (config_json.c,
// config_deepseek.c).
// Must not hold: any config's keys, file IO.
#pragma once
#include <stddef.h>
#include <cjson/cJSON.h>

// Where a reader's message goes: err (n bytes), each message after prefix (e.g. "moe_c: ").
typedef struct {
    char *err;
    size_t n;
    const char *prefix;
} JsonErr;
// The message (printf-style) into e after its prefix; returns -1.
int json_fail(JsonErr *e, const char *fmt, ...);
// Item for key, or NULL when absent or JSON null.
const cJSON *json_item(const cJSON *o, const char *key);
// A key's value into *out: required and missing -> a message; absent -> *out keeps its default; a wrong
// type or value (not an integer, not finite, not a bool or 0/1) -> a message naming the key. 0 or -1.
int json_get_int(JsonErr *e, const cJSON *o, const char *key, int required, int *out);
int json_get_float(JsonErr *e, const cJSON *o, const char *key, int required, float *out);
int json_get_bool(JsonErr *e, const cJSON *o, const char *key, int required, int *out);
// A float as the shortest decimal that reads back to it, always with a '.' or an exponent (transformers'
// strict config classes refuse an int for a float field); an int.
void json_add_f(cJSON *o, const char *key, float x);
void json_add_i(cJSON *o, const char *key, int x);
