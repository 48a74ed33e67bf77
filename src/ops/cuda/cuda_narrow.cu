// cuda_narrow.cu — the weight gradient of a narrow float32 product on the cuda backends (cuda_gemm.cu's
// matmul_bwd for O <= MOE_GEMM_FP32_MAX_O: the router's, O = E), in place of cuBLAS's, which runs it with a
// few dozen blocks.
// Must not hold: any other GEMM (cuda_gemm.cu) or any knowledge of the model.
#include "ops/cuda/cuda_common.h"

// The weight gradient of a narrow product (O <= MOE_GEMM_FP32_MAX_O: the router's, O = E), dw (O,K) [+]=
// dout^T (O,N) inp (N,K): cuBLAS runs it with a few dozen blocks (84 us for N 8192, K 2048, O 8, where
// reading inp takes ~17: docs/PERFORMANCE.md). Here block (x, y) takes rows [y DWN_ROWS, ..) and 128
// columns, one thread per column and all O outputs: part[y][o][k] = the fmaf chain over its rows in row
// order; dw_narrow_sum_k then sums the chunks' partials in chunk order (part[0] + part[1] + ...) and adds
// that to dw (beta 1) or writes it. Deterministic (a fixed order); cuBLAS's sums to float32 rounding.
#define DWN_ROWS 128
#define DWN_COLS 128
template <int OB>
__global__ void __launch_bounds__(DWN_COLS)
    dw_narrow_part_k(float *part, const float *dout, const float *inp, int N, int K, int O) {
    __shared__ float sd[DWN_ROWS * OB]; // the chunk's dout rows, OB columns (zeros past O)
    int k = blockIdx.x * DWN_COLS + threadIdx.x, n0 = blockIdx.y * DWN_ROWS, nr = min(DWN_ROWS, N - n0);
    for (int i = threadIdx.x; i < nr * OB; i += DWN_COLS) {
        int r = i / OB, o = i % OB;
        sd[i] = o < O ? dout[(size_t)(n0 + r) * O + o] : 0.0f;
    }
    __syncthreads();
    if (k >= K) return;
    float acc[OB];
#pragma unroll
    for (int o = 0; o < OB; o++) acc[o] = 0.0f;
    const float *x = inp + (size_t)n0 * K + k;
#pragma unroll 4
    for (int n = 0; n < nr; n++) {
        float v = x[(size_t)n * K];
#pragma unroll
        for (int o = 0; o < OB; o++) acc[o] = fmaf(sd[n * OB + o], v, acc[o]);
    }
    float *p = part + (size_t)blockIdx.y * O * K + k;
#pragma unroll
    for (int o = 0; o < OB; o++)
        if (o < O) p[(size_t)o * K] = acc[o];
}
__global__ void dw_narrow_sum_k(float *dw, const float *part, int nch, size_t OK, int beta) {
    GRID_STRIDE(i, OK) {
        float s = part[i];
        for (int c = 1; c < nch; c++) s += part[(size_t)c * OK + i];
        dw[i] = beta ? dw[i] + s : s;
    }
}
extern "C" void cuda_dw_narrow(float *dw, const float *dout, const float *inp, int N, int K, int O,
                               int beta) {
    int nch = (N + DWN_ROWS - 1) / DWN_ROWS;
    size_t OK = (size_t)O * K;
    float *part = (float *)cuda_workspace(sizeof(float) * OK * nch);
    dim3 grid((K + DWN_COLS - 1) / DWN_COLS, nch);
    if (O <= 8) dw_narrow_part_k<8><<<grid, DWN_COLS>>>(part, dout, inp, N, K, O);
    else if (O <= 16) dw_narrow_part_k<16><<<grid, DWN_COLS>>>(part, dout, inp, N, K, O);
    else if (O <= 32) dw_narrow_part_k<32><<<grid, DWN_COLS>>>(part, dout, inp, N, K, O);
    else dw_narrow_part_k<64><<<grid, DWN_COLS>>>(part, dout, inp, N, K, O);
    KCHECK("dw_narrow_part");
    dw_narrow_sum_k<<<ew_grid(OK, 256), 256>>>(dw, part, nch, OK, beta);
    KCHECK("dw_narrow_sum");
}
