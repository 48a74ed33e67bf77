#!/bin/bash
# (device recipe, run as `bash scripts/device/refactor_check.sh` with carry [".gpu"]: .gpu holds bin/ lib/ from
#  scripts/device/pack_libs.sh .gpu and base/moe, the binary of the commit before the refactor)
# device-side: the GPU suites, the zero-allocation test on cuda and cuda-fp32 (test_alloc), the refactored
# binary against the base one, byte for byte, on the cuda and cuda-fp32 backends (scripts/same_bits.sh,
# one-process runs: one GPU), and the reference model (PEERS.md, 6 steps per precision policy) with both
# binaries: every printed loss the same, tokens/s and peak GPU memory side by side (that alone: STEP_ONLY=1;
# all but that: NO_STEP=1).
cd "$(dirname "$0")/../.."
G=$PWD/.gpu; B=$G/bin
. scripts/device/libs.sh && device_libs $G $B/moe
export OMP_NUM_THREADS=8 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
W=/tmp/w; mkdir -p $W
t() { local name=$1; shift; local t0=$SECONDS; "$@" > $W/$name.log 2>&1; echo "== $name rc=$? $((SECONDS-t0))s"; }
if [ -z "${STEP_ONLY:-}" ]; then
t ops $B/test_cuda_ops; tail -1 $W/ops.log; grep -m8 FAIL $W/ops.log
t model $B/test_cuda_model; tail -1 $W/model.log; grep -m8 FAIL $W/model.log
t nccl $B/test_nccl; tail -1 $W/nccl.log
[ -x $B/test_slots ] && { t slots $B/test_slots; tail -2 $W/slots.log; grep -m5 FAIL $W/slots.log; }
for dev in cuda cuda-fp32; do
  t same_$dev env SAME_BITS_FLAGS="--device $dev" bash scripts/same_bits.sh $G/base/moe $B/moe one resume; cat $W/same_$dev.log
done
t force_nccl env MOE_FORCE_NCCL=1 SAME_BITS_FLAGS="--device cuda --zero 1" bash scripts/same_bits.sh $G/base/moe $B/moe one; tail -3 $W/force_nccl.log
t force_nccl_z2 env MOE_FORCE_NCCL=1 SAME_BITS_FLAGS="--device cuda --zero 2 --bucket-mb 0.01" bash scripts/same_bits.sh $G/base/moe $B/moe one; tail -2 $W/force_nccl_z2.log
for dev in cuda cuda-fp32; do
  [ -x $B/test_alloc ] && { t alloc_$dev env MOE_TEST_BACKEND=$dev $B/test_alloc; tail -2 $W/alloc_$dev.log; grep -m5 FAIL $W/alloc_$dev.log; }
done
fi
[ -n "${NO_STEP:-}" ] && exit 0
# the reference model: both binaries, each policy; losses of every step compared, tokens/s and peak memory
[ -f $G/rand32k.bin ] || python3 scripts/device/random_shard.py $G/rand32k.bin
P="--preset peers-ref --device cuda --batch 4 --seq-len 2048 --lr 1e-4 --warmup 1 --save-every -1 --eval-every 0
   --eval-batches 1 --sample-tokens 0 --plots 0 --force --data $G/rand32k.bin --steps 6"
peak() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | sort -n | tail -1; }
for pol in mixed bf16; do
  for v in base new; do
    bin=$B/moe; [ $v = base ] && bin=$G/base/moe
    ( while true; do peak; sleep 0.5; done ) > $W/mem_${pol}_$v.txt 2>/dev/null & mp=$!
    t step_${pol}_$v stdbuf -oL $bin train $P --precision $pol --out $W/run_${pol}_$v
    kill $mp 2>/dev/null; wait $mp 2>/dev/null
    echo "step $pol $v: $(grep -E '^step +[0-9]+/' $W/step_${pol}_$v.log | grep -o '[0-9]* tok/s' | tr '\n' ' ')| peak $(sort -n $W/mem_${pol}_$v.txt | tail -1) MiB"
  done
  L() { grep -E '^step +[0-9]+/' $W/step_${pol}_$1.log | cut -d'|' -f2-4; }
  if [ -n "$(L new)" ] && cmp -s <(L new) <(L base); then echo "step $pol: losses of all $(L new | wc -l) steps the same as the base binary's"
  else echo "step $pol: losses DIFFER from the base binary's"; paste <(L base) <(L new); fi
done
