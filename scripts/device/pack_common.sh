# pack_common.sh — sourced by pack_libs.sh and mesh_pack.sh (run here, from the repository root): the
# programs a device call may need from build/, and the shared libraries build/moe links that the device
# image lacks (not libc, CUDA or NCCL, which the machine has).
DEVICE_PROGRAMS="moe ckpt_diff moe_bench_comm moe_bench_layer moe_bench_fp8 moe_bench_attention test_cuda_ops test_cuda_model
  test_cuda_attn_drop test_cuda_attn_mla test_cuda_fp8_quant test_cuda_fp8_gemm test_cuda_fp8_ops test_cuda_fp8_fused
  test_nccl test_slots test_decode test_alloc"
# copy_programs DIR / copy_libs DIR: those of DEVICE_PROGRAMS that are built / those libraries, into DIR
copy_programs() { local b; for b in $DEVICE_PROGRAMS; do [ -x "build/$b" ] && cp "build/$b" "$1/"; done; return 0; }
copy_libs() {
  local l
  for l in $(ldd build/moe | awk '/=>/{print $3}' | grep -vE 'libc\.so|libm\.so|libdl|libpthread|librt|cuda|libcudart|libcublas|libnccl|libstdc|libgcc_s'); do
    cp -L "$l" "$1/"
  done
}
