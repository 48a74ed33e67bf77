// json_keys.c — typed reads and writes of one JSON key, shared by the config readers and writers
// (config_json.c, config_deepseek.c): messages that name the key, floats written to read back exactly.
// Must not hold: any config's keys.
#include "io/json_keys.h"
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// The double closest to the shortest decimal that reads back as exactly x (as a float). cJSON
// prints it with %.15g, which reproduces those few digits, so "1e-05" stays "1e-05" in the file.
static double short_double(float x) {
    if (!isfinite(x)) return (double)x;
    char buf[64];
    for (int p = 1; p <= 9; p++) {
        snprintf(buf, sizeof buf, "%.*g", p, (double)x);
        double d = strtod(buf, NULL);
        if ((float)d == x) return d;
    }
    return (double)x; // unreachable: 9 significant digits always round-trip a float
}

// Floats always carry a '.' or an exponent ("0.0", not "0"): transformers' strict config classes
// refuse an integer where a float field is declared (e.g. router_jitter_noise: 0).
void json_add_f(cJSON *o, const char *key, float x) {
    double d = short_double(x);
    if (!isfinite(d)) {
        cJSON_AddItemToObject(o, key, cJSON_CreateNumber(d));
        return;
    }
    char buf[64];
    if (d == floor(d) && fabs(d) < 1e15) {
        snprintf(buf, sizeof buf, "%.1f", d); // 10000.0, 0.0
    } else {
        for (int p = 1; p <= 17; p++) { // the shortest text that reads back to d
            snprintf(buf, sizeof buf, "%.*g", p, d);
            if (strtod(buf, NULL) == d) break;
        }
        if (!strpbrk(buf, ".eE")) strncat(buf, ".0", sizeof buf - strlen(buf) - 1);
    }
    cJSON_AddItemToObject(o, key, cJSON_CreateRaw(buf));
}
void json_add_i(cJSON *o, const char *key, int x) {
    cJSON_AddItemToObject(o, key, cJSON_CreateNumber((double)x));
}


int json_fail(JsonErr *e, const char *fmt, ...) {
    if (e->err && e->n) {
        int k = snprintf(e->err, e->n, "%s", e->prefix);
        if (k < 0) k = 0;
        if ((size_t)k < e->n) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(e->err + k, e->n - (size_t)k, fmt, ap);
            va_end(ap);
        }
    }
    return -1;
}

// Item for key, or NULL when absent or JSON null.
const cJSON *json_item(const cJSON *o, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    return (it && !cJSON_IsNull(it)) ? it : NULL;
}

// required: missing -> error; else *out keeps its default.
int json_get_int(JsonErr *e, const cJSON *o, const char *key, int required, int *out) {
    const cJSON *it = json_item(o, key);
    if (!it) return required ? json_fail(e, "missing required key \"%s\"", key) : 0;
    if (!cJSON_IsNumber(it)) return json_fail(e, "key \"%s\" must be an integer", key);
    double d = it->valuedouble;
    if (!(d == floor(d)) || d < INT_MIN || d > INT_MAX)
        return json_fail(e, "key \"%s\" must be an integer (got %.17g)", key, d);
    *out = (int)d;
    return 0;
}

int json_get_float(JsonErr *e, const cJSON *o, const char *key, int required, float *out) {
    const cJSON *it = json_item(o, key);
    if (!it) return required ? json_fail(e, "missing required key \"%s\"", key) : 0;
    if (!cJSON_IsNumber(it)) return json_fail(e, "key \"%s\" must be a number", key);
    double d = it->valuedouble;
    if (!isfinite(d) || !isfinite((float)d))
        return json_fail(e, "key \"%s\" is out of range (got %.17g)", key, d);
    *out = (float)d;
    return 0;
}

int json_get_bool(JsonErr *e, const cJSON *o, const char *key, int required, int *out) {
    const cJSON *it = json_item(o, key);
    if (!it) return required ? json_fail(e, "missing required key \"%s\"", key) : 0;
    if (cJSON_IsBool(it)) {
        *out = cJSON_IsTrue(it) ? 1 : 0;
        return 0;
    }
    if (cJSON_IsNumber(it) && (it->valuedouble == 0 || it->valuedouble == 1)) {
        *out = (int)it->valuedouble;
        return 0;
    }
    return json_fail(e, "key \"%s\" must be true or false", key);
}
