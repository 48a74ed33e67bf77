// cuda_vm.cu — buffers in virtual memory for the cuda backend (contracts in cuda_vm.h): the driver's virtual
// memory calls (through the runtime's entry points: the binary does not link libcuda, so that it starts
// where no driver is installed), a reserved range with the whole pages inside its holes left unbacked, and
// ops.h alloc_holes: such buffers handed out and, through cuda_holes_free, taken back.
// Must not hold: kernels, the bf16 copy of the weights (cuda_weights.cu), or any knowledge of the model.
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include "ops/cuda/cuda_common.h"
#include "ops/cuda/cuda_vm.h"

typedef CUresult (*PfnGran)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
typedef CUresult (*PfnReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
typedef CUresult (*PfnCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                              unsigned long long);
typedef CUresult (*PfnMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
typedef CUresult (*PfnAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
typedef CUresult (*PfnUnmap)(CUdeviceptr, size_t);
typedef CUresult (*PfnRelease)(CUmemGenericAllocationHandle);
typedef CUresult (*PfnFree)(CUdeviceptr, size_t);
static struct {
    PfnGran gran;
    PfnReserve reserve;
    PfnCreate create;
    PfnMap map;
    PfnAccess access;
    PfnUnmap unmap;
    PfnRelease release;
    PfnFree free;
} g_vm;

#define VM_NONE_HINT \
    "this GPU or driver has no virtual memory management: MOE_BF16_SHADOW=0 keeps --precision bf16's " \
    "weights in float32 memory, and MOE_GRAD_HOLES=0 its packed expert gradients' blocks whole"

static void *vm_fn(const char *name) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q));
    CHECK(q == cudaDriverEntryPointSuccess && fn, "the CUDA driver has no %s: update the driver; %s", name,
          VM_NONE_HINT);
    return fn;
}

#define VM_CHECK(call) \
    do { \
        CUresult _r = (call); \
        if (_r != CUDA_SUCCESS) \
            DIE("%s:%d: %s failed: CUresult %d; hint: %s", __FILE__, __LINE__, #call, (int)_r, \
                _r == CUDA_ERROR_OUT_OF_MEMORY       ? cuda_hint(cudaErrorMemoryAllocation) \
                    : _r == CUDA_ERROR_NOT_SUPPORTED ? VM_NONE_HINT \
                                                     : cuda_hint(cudaErrorUnknown)); \
    } while (0)

static void vm_init(void) {
    if (g_vm.gran) return;
    g_vm.gran = (PfnGran)vm_fn("cuMemGetAllocationGranularity");
    g_vm.reserve = (PfnReserve)vm_fn("cuMemAddressReserve");
    g_vm.create = (PfnCreate)vm_fn("cuMemCreate");
    g_vm.map = (PfnMap)vm_fn("cuMemMap");
    g_vm.access = (PfnAccess)vm_fn("cuMemSetAccess");
    g_vm.unmap = (PfnUnmap)vm_fn("cuMemUnmap");
    g_vm.release = (PfnRelease)vm_fn("cuMemRelease");
    g_vm.free = (PfnFree)vm_fn("cuMemAddressFree");
}

void vm_holes_check(size_t n, const size_t *hole, int nh, int max, const char *what) {
    const char *he = holes_error(n, hole, nh);
    CHECK(!he && nh <= max, "%s: %s (%d holes in %zu elements, at most %d)", what, he ? he : "too many holes",
          nh, n, max);
}

void vm_map(VmBuf *b, size_t n, const size_t *hole, int nh) {
    vm_init();
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t pg = 0;
    VM_CHECK(g_vm.gran(&pg, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    size_t bytes = n * sizeof(float), total = (bytes + pg - 1) / pg * pg;
    if (!total) total = pg;
    memset(b, 0, sizeof *b);
    VM_CHECK(g_vm.reserve(&b->va, total, pg, 0, 0));
    b->va_bytes = total;
    // page k is backed unless it lies wholly inside a hole's bytes; consecutive backed pages make a piece
    size_t npg = total / pg;
    b->pc = (VmPiece *)xcalloc(npg, sizeof *b->pc);
    for (size_t k = 0, j = 0; k < npg; k++) {
        size_t s = k * pg, e = s + pg;
        while (j < (size_t)nh && hole[2 * j + 1] * sizeof(float) <= s) j++;
        if (j < (size_t)nh && hole[2 * j] * sizeof(float) <= s && hole[2 * j + 1] * sizeof(float) >= e)
            continue;
        if (b->npc && b->pc[b->npc - 1].off + b->pc[b->npc - 1].bytes == s) b->pc[b->npc - 1].bytes += pg;
        else b->pc[b->npc++] = VmPiece{s, pg, 0};
    }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    for (int i = 0; i < b->npc; i++) {
        VmPiece *q = &b->pc[i];
        VM_CHECK(g_vm.create(&q->h, q->bytes, &prop, 0));
        VM_CHECK(g_vm.map(b->va + q->off, q->bytes, 0, q->h, 0));
        VM_CHECK(g_vm.access(b->va + q->off, q->bytes, &acc, 1));
        CUDA_CHECK(cudaMemset((void *)(b->va + q->off), 0, q->bytes));
    }
}

void vm_unmap(VmBuf *b) {
    if (!b->va) return;
    CUDA_CHECK(cudaDeviceSynchronize()); // no kernel still uses it
    for (int i = 0; i < b->npc; i++) {
        VM_CHECK(g_vm.unmap(b->va + b->pc[i].off, b->pc[i].bytes));
        VM_CHECK(g_vm.release(b->pc[i].h));
    }
    VM_CHECK(g_vm.free(b->va, b->va_bytes));
    free(b->pc);
    memset(b, 0, sizeof *b);
}

// ---------------------------------------------------------------- ops.h alloc_holes
// The buffers handed out, in a list that cuda_free asks first (cuda_holes_free).
typedef struct HoleBuf {
    VmBuf vm;
    struct HoleBuf *next;
} HoleBuf;
static HoleBuf *g_holes;

extern "C" float *cuda_alloc_holes(size_t n, const size_t *hole, int nh) {
    vm_holes_check(n, hole, nh, INT_MAX, "alloc_holes");
    alloc_note_backend();
    HoleBuf *h = (HoleBuf *)xcalloc(1, sizeof *h);
    vm_map(&h->vm, n, hole, nh);
    h->next = g_holes;
    g_holes = h;
    return (float *)h->vm.va;
}

extern "C" int cuda_holes_free(const void *p) {
    for (HoleBuf **h = &g_holes; p && *h; h = &(*h)->next)
        if ((const void *)(*h)->vm.va == p) {
            HoleBuf *f = *h;
            vm_unmap(&f->vm);
            *h = f->next;
            free(f);
            return 1;
        }
    return 0;
}
