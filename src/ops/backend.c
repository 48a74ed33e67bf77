// backend.c — choosing a Backend by name (--device). Must not hold: ops or compositions of ops (the
// plain forms of the fused ops are ops/plain.h, which the backends include without this file).
#include <string.h>
#include "core/common.h"
#include "ops/ops.h"

const Backend *backend_by_name(const char *name) {
    if (!name || !name[0] || !strcmp(name, "auto")) return backend_cuda_available() ? backend_cuda() : backend_cpu();
    if (!strcmp(name, "cpu")) return backend_cpu();
    if (!strcmp(name, "cuda") || !strcmp(name, "cuda-fp32")) {
        if (!backend_cuda_available())
            DIE("--device %s: no usable CUDA GPU here (or this moe was built without CUDA); use --device cpu", name);
        return name[4] ? backend_cuda_fp32() : backend_cuda();
    }
    DIE("--device %s: unknown device (cpu, cuda = bf16 tensor-core GEMMs, cuda-fp32, auto)", name);
}
