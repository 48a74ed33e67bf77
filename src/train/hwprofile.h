// hwprofile.h — a GPU's numbers as the planner (plan.h) reads them: memory, the achieved GEMM, attention,
// HBM and link rates. Built-in profiles h200 (from docs/PERFORMANCE.md's measurements) and h100 (NVIDIA's
// published specs scaled as our H200 measurement relates to the H200's), or a JSON file with every field
// (docs/PLAN.md documents each; launch_us, sync_us and fp8_grouped_tflops may be left out: 0, the last
// needed to plan --precision fp8), read and written here.
// Must not hold: the planner's arithmetic (plan.c), printing tables.
#pragma once

typedef struct {
    char name[64];
    double mem_bytes; // memory one GPU offers the run
    double context_bytes; // what the CUDA context and the allocator's reserve take of it
    double peak_tflops; // the published bf16 dense peak (MFU's denominator)
    double dense_tflops; // achieved by the dense bf16 GEMMs (projections, LM head) in a training step
    double grouped_tflops; // achieved by the experts' grouped GEMMs (forward + backward)
    double attention_tflops; // achieved by attention (forward + backward, the causal half's FLOPs)
    double hbm_gbps; // achieved memory bandwidth of a streaming kernel (AdamW), GB/s
    double nvlink_gbps; // per GPU and direction inside a node, as collectives achieve it, GB/s
    double internode_gbps; // per GPU and direction between nodes, GB/s
    double pcie_gbps; // host <-> device per direction, GB/s (read; not used by the first model)
    // optional (>= 0; absent or 0: not counted):
    double launch_us; // the host's time to issue one backend op (a CUDA launch), microseconds
    double sync_us; // one host synchronisation's round trip (the GPU idles), microseconds
    double fp8_grouped_tflops; // the experts' grouped ops under --precision fp8 (quantisation included)
} HwProfile;

// The experts' grouped-GEMM rate at expert shape (d, f) relative to the reference model's (d 2048, f 5632,
// the shape the profiles' grouped_tflops are measured at): the rate docs/PERFORMANCE.md's MoE layer table
// measured (H200, moe_bench_layer) at the nearest of its shapes (the least |ln(d/d_i)| + |ln(f/f_i)|) over
// the reference's. *which (may be NULL): that shape's name.
double hwprofile_grouped_shape(int d, int f, const char **which);
// The built-in profile of that name (h200, h100), or NULL.
const HwProfile *hwprofile_builtin(const char *name);
// The built-ins' names, "h200, h100".
const char *hwprofile_names(void);
// The built-in profile of a GPU by its CUDA device name (ops.h backend_cuda_device_name): the one whose name
// is a word of it, case aside ("NVIDIA H200" -> h200, "NVIDIA H100 80GB HBM3" -> h100), or NULL: any other
// GPU, and the PCIe and NVL variants, whose clocks and peaks are lower than the SXM parts the built-ins
// describe ("NVIDIA H100 PCIe", "NVIDIA H200 NVL"; "NVIDIA GH200 480GB" has no word h200 either).
const HwProfile *hwprofile_for_gpu(const char *device_name);
// name: a built-in's, else a JSON file's path; dies "--gpu ...: ..." naming a missing, unknown or
// non-positive field, or an unreadable file. A string "note" (what the numbers are, where they came from:
// moe plan --calibrate writes one) is read past.
void hwprofile_load(HwProfile *p, const char *name);
// Writes p as a JSON profile hwprofile_load reads back to the same numbers (every field, "name" and the
// note when not NULL) to path (through a temporary file renamed over it: a failed write leaves no half
// profile), or to stdout where path is NULL or empty.
void hwprofile_write(const HwProfile *p, const char *note, const char *path);
