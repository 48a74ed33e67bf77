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
t nccl1 $B/test_nccl; tail -3 $W/nccl1.log
t mpi1 mpirun -np 1 $B/test_nccl; grep -v "^--\|^ *$" $W/mpi1.log | tail -4
MPI="mpirun -np 1"; grep -q "test_nccl: .* 0 failed" $W/mpi1.log || { MPI=""; echo "mpirun unusable: runs without it"; }
MOE_NCCL_TEST_STALL_S=60 MOE_NCCL_TIMEOUT_S=2 t stall $B/test_nccl stall; cat $W/stall.log | head -3
[ -n "$MPI" ] && { MOE_NCCL_TEST_STALL_S=60 MOE_NCCL_TIMEOUT_S=2 t stall_mpi $MPI $B/test_nccl stall; grep -v "^ *$" $W/stall_mpi.log | head -4; }
F="--steps 30 --quiet --sample-tokens 0 --plots 0 --eval-every 0 --save-every 0 --keep 1"
t ref $B/moe train --device cuda --out $W/ref $F
MOE_FORCE_NCCL=1 t f0 $MPI $B/moe train --device cuda --out $W/f0 $F --check-replicas; tail -2 $W/f0.log
MOE_FORCE_NCCL=1 t f2 $MPI $B/moe train --device cuda --out $W/f2 $F --zero 2 --bucket-mb 0.01 --check-replicas; tail -1 $W/f2.log
MOE_FORCE_NCCL=1 t f1 $MPI $B/moe train --device cuda --out $W/f1 $F --zero 1 --overlap 0 --dispatch capacity; tail -1 $W/f1.log
t refc $B/moe train --device cuda --out $W/refc $F --dispatch capacity
python3 - <<'P'
import json
def L(p, k='loss'): return [json.loads(l)[k] for l in open('/tmp/w/'+p+'/metrics.jsonl') if '"loss"' in l]
for a, b in [('ref','f0'), ('ref','f2'), ('refc','f1')]:
    x, y = L(a), L(b)
    print('%s vs %s: %d/%d steps, bitwise equal steps %d, max rel loss diff %.2e, grad_norm max rel %.2e' % (a, b, len(x), len(y),
      sum(u == v for u, v in zip(x, y)), max(abs(u-v)/abs(u) for u, v in zip(x, y)), max(abs(u-v)/abs(u) for u, v in zip(L(a,'grad_norm'), L(b,'grad_norm')))))
    print('   tok/s %s %.0f  %s %.0f' % (a, sum(L(a,'tokens_per_s')[5:])/len(x[5:]), b, sum(L(b,'tokens_per_s')[5:])/len(y[5:])))
P
$B/ckpt_diff $W/ref $W/f0 0; $B/ckpt_diff $W/ref $W/f2 1e-5
G="--preset small --batch 16 --seq-len 256 --steps 15 --quiet --sample-tokens 0 --plots 0 --eval-every 0 --save-every 0"
t small $B/moe train --device cuda --out $W/s $G; MOE_FORCE_NCCL=1 t small_nccl $MPI $B/moe train --device cuda --out $W/sn $G --zero 1
python3 -c "
import json
def L(p,k): return [json.loads(l)[k] for l in open('/tmp/w/'+p+'/metrics.jsonl') if '\"loss\"' in l]
print('small: loss equal steps', sum(a==b for a,b in zip(L('s','loss'),L('sn','loss'))), 'of', len(L('s','loss')), ' tok/s', int(sum(L('s','tokens_per_s')[3:])/12), 'vs nccl', int(sum(L('sn','tokens_per_s')[3:])/12))"
[ -n "$MPI" ] && { MOE_NCCL_TIMEOUT_S=20 t two_on_one mpirun -np 2 $B/moe train --device cuda --out $W/two $F; grep "error" $W/two.log | head -3; }
tar -C $W -czf $OUT/logs.tgz $(cd $W && ls *.log)
