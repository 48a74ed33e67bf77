// cuda_fp8_trace.h — the GPU time of each kernel the FP8 tables launch (cuda_fp8_ops.cu, cuda_fp8_wcache.cu),
// for the benches (moe_bench_layer --fp8-trace): while armed, every launch between cuda_fp8_trace_begin and
// cuda_fp8_trace_end is timed by a cudaEvent pair on the default stream (the end synchronised, so launches
// run one at a time and each time holds its launch latency, a few microseconds), and summed under its name
// with the bytes it reads and writes and the FLOPs it does, so that each line reads as GB/s or TFLOP/s
// against the device's peaks. Unarmed (the default) a launch costs one branch. Must not hold: the kernels
// themselves.
#pragma once
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

// Arm (1) or disarm (0) the timing; arming empties the sums.
void cuda_fp8_trace_arm(int on);
// The sums since arming, one line a name in the order first seen: calls, ms, bytes (GB), GB/s and % of
// peak_gbs, TFLOP/s and % of peak_tflops (FLOPs 0: a quantiser, '-'), then their total and its GEMMs' part.
void cuda_fp8_trace_print(FILE *f, double peak_gbs, double peak_tflops);

#ifdef __cplusplus
}

// (the tables' side) 1 while armed; the start of one launch; its end, named, with what it moved and did
int cuda_fp8_trace_on(void);
void cuda_fp8_trace_begin(void);
void cuda_fp8_trace_end(const char *name, double bytes, double flops);
#endif
