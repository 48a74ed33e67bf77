// hwprofile.c — the built-in hardware profiles and the JSON profile reader and writer (see hwprofile.h). Each
// built-in number names its source; docs/PLAN.md says the same with the derivations.
// Must not hold: the planner (plan.c).
#include "train/hwprofile.h"
#include <ctype.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <cjson/cJSON.h>
#include "core/common.h"

#define GIB 1073741824.0
static const HwProfile builtins[] = {
    // h200 (docs/PERFORMANCE.md, the reference model peers-ref, batch 4 x 2048, 8192 tokens a step):
    //  memory: the device machine's H200 (about 139 GiB usable); context: the measured peak 85,359 MiB
    //    less moe info's cuda figure 82.95 GiB ("The full training step": 0.41 GiB, rounded up);
    //  peak: NVIDIA's H200 SXM bf16 dense 989 TFLOP/s (the MFU row's denominator);
    //  dense: 13.13 TFLOP a step (3 x (16 x q,k,v,o + router) + LM head at 8192 tokens) in 11.56 + 17.69 ms
    //    ("Where a step's time goes", mixed): 448.9 TFLOP/s;
    //  grouped: 54.43 TFLOP a step (3 x 16 x k=2 experts' 2 x 3 d f) in 36.43 + 62.17 ms: 552.0 TFLOP/s;
    //  attention: 3.299 TFLOP a step (3 x 16 x 2 x 2 H hd T/2) in 5.17 + 10.32 ms: 213.0 TFLOP/s;
    //  hbm: AdamW (mixed) 30 bytes x 4.762B elements in 35.61 ms: 4,012 GB/s;
    //  nvlink: dp2 x ep2 on two H200s ("Several ranks": 57,637 tokens/s at 8 x 2048, 284.3 ms a step)
    //    less one GPU's step of that week (33.0k tokens/s at 4 x 2048, the --a2a-overlap row, 248.2 ms):
    //    36.1 ms for the 4.24 GiB cost_mesh counts per rank (moe info --world 2 --ep 2 --batch 8): 126 GB/s
    //    effective (NVLink 4's spec: 450 GB/s a direction; 0.28 of it);
    //  internode: not measured: 400 Gb/s InfiniBand NDR per GPU (50 GB/s) x the same 0.28: 14 GB/s;
    //  pcie: the staged transport's copy ceiling ("Ranks sharing one GPU": 25.0 GB/s).
    //  launch, sync: not calibrated (0): the two one-GPU measurements of issue 41 do not determine them
    //    (docs/PLAN.md "Launches and host synchronisations");
    //  fp8 grouped: the same 54.43 TFLOP in the fp8 step's grouped expert ops, 54.86 + 83.37 ms ("FP8", where
    //    the time goes, MOE_PROFILE=1, a24f940; quantisation passes included): 393.8 TFLOP/s.
    {"h200", 139 * GIB, 0.5 * GIB, 989, 448.9, 552.0, 213.0, 4012, 126, 14, 25, 0, 0, 393.8},
    // h100 (SXM): NVIDIA's published specs scaled as the H200's measurement relates to the H200's spec:
    //  memory 80 GB x (139 / 141): 78.9 GiB; the same die, clocks and 989 TFLOP/s peak: the GEMM and
    //  attention rates as the H200's; hbm 3.35 TB/s x (4,012 / 4,800): 2,800 GB/s; NVLink 4 and NDR as on
    //  the H200 (the same links); PCIe Gen5 as the H200's; launch and sync not calibrated, as the H200's;
    //  fp8 grouped as the H200's (the same tensor cores).
    {"h100", 78.9 * GIB, 0.5 * GIB, 989, 448.9, 552.0, 213.0, 2800, 126, 14, 25, 0, 0, 393.8},
};
#define N_BUILTIN (sizeof builtins / sizeof builtins[0])

// docs/PERFORMANCE.md "The MoE layer, forward + backward, against torch._grouped_mm" (86f8994, 2026-12-01):
// the routed experts' TFLOP/s of moe_bench_layer on the H200 per case (T, E, k as the table lists them).
static const struct {
    const char *name;
    int d, f;
    double tflops;
} shapes[] = {
    {"mixtral (d 4096, f 14336, 8 experts top-2)", 4096, 14336, 566},
    {"olmoe (d 2048, f 1024, 64 experts top-8)", 2048, 1024, 424},
    {"small (d 1024, f 2816, 8 experts top-2)", 1024, 2816, 438},
    {"ref (d 2048, f 5632, 8 experts top-2)", 2048, 5632, 556},
    {"qwen2 (d 2048, f 1408, 60 experts top-4)", 2048, 1408, 402},
    {"e256 (d 2048, f 512, 256 experts top-8)", 2048, 512, 297},
};
#define REF_SHAPE 3

double hwprofile_grouped_shape(int d, int f, const char **which) {
    size_t best = 0;
    double bd = INFINITY;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double dist = fabs(log((double)d / shapes[i].d)) + fabs(log((double)f / shapes[i].f));
        if (dist < bd) bd = dist, best = i;
    }
    if (which) *which = shapes[best].name;
    return shapes[best].tflops / shapes[REF_SHAPE].tflops;
}

const HwProfile *hwprofile_builtin(const char *name) {
    for (size_t i = 0; i < N_BUILTIN; i++)
        if (!strcmp(builtins[i].name, name)) return &builtins[i];
    return NULL;
}

const char *hwprofile_names(void) { return "h200, h100"; }

const HwProfile *hwprofile_for_gpu(const char *device_name) {
    const HwProfile *found = NULL;
    char w[64];
    for (const char *s = device_name; s && *s;) { // the words: runs of letters and digits
        size_t n = 0;
        while (*s && !isalnum((unsigned char)*s)) s++;
        while (isalnum((unsigned char)*s)) {
            if (n + 1 < sizeof w) w[n++] = (char)tolower((unsigned char)*s);
            s++;
        }
        w[n] = 0;
        if (!strcmp(w, "pcie") || !strcmp(w, "nvl")) return NULL;
        for (size_t i = 0; i < N_BUILTIN && n; i++)
            if (!strcmp(w, builtins[i].name)) found = &builtins[i];
    }
    return found;
}

// The JSON keys and where each number goes (required and > 0, but the optional ones: >= 0, absent 0).
static const struct {
    const char *key;
    size_t off;
    int optional;
} fields[] = {
    {"memory_bytes", offsetof(HwProfile, mem_bytes), 0},
    {"context_bytes", offsetof(HwProfile, context_bytes), 0},
    {"peak_tflops", offsetof(HwProfile, peak_tflops), 0},
    {"dense_tflops", offsetof(HwProfile, dense_tflops), 0},
    {"grouped_tflops", offsetof(HwProfile, grouped_tflops), 0},
    {"attention_tflops", offsetof(HwProfile, attention_tflops), 0},
    {"hbm_gbps", offsetof(HwProfile, hbm_gbps), 0},
    {"nvlink_gbps", offsetof(HwProfile, nvlink_gbps), 0},
    {"internode_gbps", offsetof(HwProfile, internode_gbps), 0},
    {"pcie_gbps", offsetof(HwProfile, pcie_gbps), 0},
    {"launch_us", offsetof(HwProfile, launch_us), 1},
    {"sync_us", offsetof(HwProfile, sync_us), 1},
    {"fp8_grouped_tflops", offsetof(HwProfile, fp8_grouped_tflops), 1},
};
#define N_FIELDS (sizeof fields / sizeof fields[0])

void hwprofile_load(HwProfile *p, const char *name) {
    const HwProfile *b = hwprofile_builtin(name);
    if (b) {
        *p = *b;
        return;
    }
    if (!strchr(name, '/') && !strstr(name, ".json"))
        DIE("--gpu %s: no such profile (built in: %s; or a .json profile file)", name, hwprofile_names());
    long at = 0;
    cJSON *j = json_read_file("--gpu", NULL, name, &at);
    if (!cJSON_IsObject(j)) DIE("--gpu %s: not a JSON object (error near byte %ld)", name, j ? 0L : at);
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    for (cJSON *it = j->child; it; it = it->next) {
        if (!strcmp(it->string, "name")) {
            if (!cJSON_IsString(it)) DIE("--gpu %s: \"name\" must be a string", name);
            snprintf(p->name, sizeof p->name, "%s", it->valuestring);
            continue;
        }
        if (!strcmp(it->string, "note")) {
            if (!cJSON_IsString(it)) DIE("--gpu %s: \"note\" must be a string", name);
            continue;
        }
        size_t k = 0;
        while (k < N_FIELDS && strcmp(fields[k].key, it->string)) k++;
        if (k == N_FIELDS) DIE("--gpu %s: unknown key \"%s\"", name, it->string);
        double v = it->valuedouble;
        if (fields[k].optional && (!cJSON_IsNumber(it) || !isfinite(v) || !(v >= 0)))
            DIE("--gpu %s: \"%s\" must be a number >= 0", name, it->string);
        if (!cJSON_IsNumber(it) || !isfinite(v) || !(v > 0 || fields[k].optional))
            DIE("--gpu %s: \"%s\" must be a positive number", name, it->string);
        *(double *)((char *)p + fields[k].off) = it->valuedouble;
    }
    cJSON_Delete(j);
    for (size_t k = 0; k < N_FIELDS; k++)
        if (!fields[k].optional && !(*(double *)((char *)p + fields[k].off) > 0))
            DIE("--gpu %s: \"%s\" is missing", name, fields[k].key);
    if (p->context_bytes >= p->mem_bytes)
        DIE("--gpu %s: \"context_bytes\" %g is not below \"memory_bytes\" %g", name, p->context_bytes,
            p->mem_bytes);
}

void hwprofile_write(const HwProfile *p, const char *note, const char *path) {
    cJSON *j = cJSON_CreateObject();
    CHECK(j && cJSON_AddStringToObject(j, "name", p->name), "out of memory writing a profile");
    if (note) CHECK(cJSON_AddStringToObject(j, "note", note), "out of memory writing a profile");
    // (each number as 17 significant digits, which read back to the same double: cJSON's own printing
    // keeps 15 where those read back within an epsilon, not exactly)
    for (size_t k = 0; k < N_FIELDS; k++) {
        char num[40];
        snprintf(num, sizeof num, "%.17g", *(const double *)((const char *)p + fields[k].off));
        CHECK(cJSON_AddRawToObject(j, fields[k].key, num), "out of memory writing a profile");
    }
    if (!path || !path[0]) {
        char *s = cJSON_Print(j);
        CHECK(s, "out of memory writing a profile");
        printf("%s\n", s);
        cJSON_free(s);
    } else {
        char tmp[1100];
        CHECK(snprintf(tmp, sizeof tmp, "%s.tmp", path) < (int)sizeof tmp, "path too long: '%s'", path);
        json_write_file(tmp, j);
        xrename(tmp, path);
    }
    cJSON_Delete(j);
}
