// cuda_vm.h — the cuda backend's buffers in virtual memory (cuda_vm.cu): a reserved range of n floats whose
// pages are backed except those wholly inside given element ranges (holes), and ops.h alloc_holes on them.
// cuda_weights.cu builds the bf16 policy's parameter buffer on vm_map; the packed expert gradients take
// cuda_alloc_holes (model_state.h model_share_grads). For the .cu files only (CUDA driver types).
// Must not hold: kernels, the bf16 copy of the weights, or any knowledge of the model.
#pragma once
#include <cuda.h>
#include <stddef.h>

typedef struct {
    size_t off, bytes;
    CUmemGenericAllocationHandle h;
} VmPiece; // a backed piece: bytes [off, off + bytes) of the range

typedef struct {
    CUdeviceptr va; // 0: none
    size_t va_bytes;
    int npc;
    VmPiece *pc;
} VmBuf;

// Dies (naming `what`) unless the holes keep ops.h holes_error's rule and nh <= max.
void vm_holes_check(size_t n, const size_t *hole, int nh, int max, const char *what);
// b: n floats reserved, every page backed (and zeroed) but those wholly inside a hole.
void vm_map(VmBuf *b, size_t n, const size_t *hole, int nh);
// Releases b's pieces and range, after the device has finished with it (synchronises).
void vm_unmap(VmBuf *b);
