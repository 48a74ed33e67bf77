#!/usr/bin/env bash
# pack_libs.sh DIR — for runs on the lent GPU machine: copy build/moe's shared libraries that its
# image lacks (OpenBLAS, cJSON, gomp, gfortran, quadmath, Open MPI and its libs, zlib; not libc,
# CUDA or NCCL, which the machine has) and the test binaries into DIR/lib and DIR/bin, and builds the
# CUPTI step tracer (gputrace.c) into DIR/lib with the toolkit's libcupti beside it (full_step.sh's
# `trace` part). DIR should be an ignored folder (add it to .git/info/exclude) named in the device call's
# `carry`.
set -euo pipefail
cd "$(dirname "$0")/../.."
D=${1:?usage: scripts/device/pack_libs.sh DIR}
mkdir -p "$D/lib" "$D/bin"
for l in $(ldd build/moe | awk '/=>/{print $3}' | grep -vE 'libc\.so|libm\.so|libdl|libpthread|librt|cuda|libcudart|libcublas|libnccl|libstdc|libgcc_s'); do
  cp -L "$l" "$D/lib/"
done
for b in moe test_cuda_ops test_cuda_model test_cuda_fp8_quant test_cuda_fp8_gemm test_cuda_fp8_ops test_nccl test_slots test_decode \
  test_alloc ckpt_diff moe_bench_layer moe_bench_fp8; do
  [ -x "build/$b" ] && cp "build/$b" "$D/bin/"
done
CUDA=${CUDA_HOME:-/usr/local/cuda}
if [ -f "$CUDA/include/cupti.h" ]; then
  CUPTI=$(dirname "$(find "$CUDA/" -name 'libcupti.so*' -print -quit 2>/dev/null)")
  gcc -O2 -Wall -shared -fPIC -I"$CUDA/include" scripts/device/gputrace.c -o "$D/lib/libgputrace.so" -L"$CUPTI" -lcupti
  for c in "$CUPTI"/libcupti.so.*; do cp -L "$c" "$D/lib/"; break; done
fi
du -sh "$D"
