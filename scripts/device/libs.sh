# libs.sh — sourced by the device recipes (scripts/device/*.sh, bench/device_run.sh):
# `device_libs DIR PROGRAM` puts DIR/lib (the libraries pack_libs.sh copied) and CUDA's on
# LD_LIBRARY_PATH, then finds on the device any CUDA/NCCL library PROGRAM still lacks.
device_libs() {
  local d=$1 prog=$2 n c
  export LD_LIBRARY_PATH=$d/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
  for n in libcublas.so.13 libcublasLt.so.13 libcudart.so.13 libnccl.so.2; do
    ldd "$prog" | grep -q "$n => not found" || continue
    c=$(find / -xdev -name "$n*" 2>/dev/null | grep -v '^/proc/' | head -1)
    [ -n "$c" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname "$c")
  done
  return 0
}
