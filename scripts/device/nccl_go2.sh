#!/bin/bash
# device: the nccl backend on one GPU (single-rank communicators): every op vs the host ops, the
# watchdog timeout, and moe train through the NCCL path (MOE_FORCE_NCCL=1) vs the plain GPU run
cd "$(dirname "$0")"; D=$PWD; W=/tmp/w; mkdir -p $W $D/x; tar -C $D/x -xJf pkg.tar.xz; X=$D/x; B=$X/bin
export NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=8 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export LD_LIBRARY_PATH=$X/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH}
for n in libnccl.so.2 libcublas.so.13 libcudart.so.13; do
  ldd $B/test_nccl | grep -q "$n => not found" && { c=$(find / -xdev -name "$n*" 2>/dev/null | grep -v "/proc/" | head -1); echo "$n: $c"; export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$(dirname $c); }
done
ls -la $(ldd $B/test_nccl | awk '/libnccl/{print $3}') | head -2; readlink -f $(ldd $B/test_nccl | awk '/libnccl/{print $3}')
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; ldd $B/moe | grep "not found"
export OPAL_PREFIX=$X/root/usr PATH=$X/root/usr/bin:$PATH OMPI_MCA_mca_base_component_path=$X/root/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
export PMIX_MCA_mca_base_component_path=$X/root/usr/lib/x86_64-linux-gnu/pmix2/lib/pmix OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
export OMPI_MCA_mca_base_component_show_load_errors=0 PMIX_MCA_pcompress_base_silence_warning=1
t() { local name=$1; shift; local t0=$(date +%s%N); timeout 120 "$@" > $W/$name.log 2>&1; local rc=$?; echo "== $name rc=$rc $(( ($(date +%s%N) - t0) / 1000000 ))ms"; }


MPI="mpirun -np 1"; grep -q "test_nccl: .* 0 failed" $W/mpi1.log || { MPI=""; echo "mpirun unusable: runs without it"; }
MOE_NCCL_TEST_STALL_S=60 MOE_NCCL_TIMEOUT_S=2 t stall $B/test_nccl stall; cat $W/stall.log | head -3
t nccl1 $B/test_nccl; tail -1 $W/nccl1.log
MOE_NCCL_TEST_STALL_S=60 MOE_NCCL_TIMEOUT_S=2 t stall $B/test_nccl stall; cat $W/stall.log | head -3
MOE_NCCL_TEST_STALL_S=60 MOE_NCCL_TIMEOUT_S=2 t stall_mpi mpirun -np 1 $B/test_nccl stall; grep -v "^ *$" $W/stall_mpi.log | head -5
F="--steps 30 --quiet --sample-tokens 0 --plots 0 --eval-every 0 --save-every 0 --keep 1"
t two_on_one mpirun -np 2 $B/moe train --device cuda --out $W/two $F; grep "error" $W/two_on_one.log | head -3
t ref $B/moe train --device cuda --out $W/ref $F
MOE_FORCE_NCCL=1 t f0 mpirun -np 1 $B/moe train --device cuda --out $W/f0 $F --zero 2 --check-replicas; tail -1 $W/f0.log
$B/ckpt_diff $W/ref $W/f0 0
tar -C $W -czf $OUT/logs.tgz $(cd $W && ls *.log)
