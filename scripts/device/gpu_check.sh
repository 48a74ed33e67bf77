#!/bin/bash
# (device recipe, run as `bash scripts/device/gpu_check.sh` with carry [".gpu"]: .gpu holds bin/ lib/ src/verify_hf.py,
#  built by scripts/device/pack_libs.sh .gpu)
# device-side: GPU tests, CPU-vs-GPU training, cross-device resume, default run, HF check, sanitizer
cd "$(dirname "$0")/../.."
G=$PWD/.gpu; B=$G/bin
. scripts/device/libs.sh && device_libs $G $B/moe
export OMP_NUM_THREADS=8
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ldd $B/moe | grep "not found"
W=/tmp/w; mkdir -p $W
t() { local name=$1; shift; local t0=$SECONDS; "$@" > $W/$name.log 2>&1; echo "== $name rc=$? $((SECONDS-t0))s"; }
export NCCL_NVLS_ENABLE=0
t ops $B/test_cuda_ops; tail -1 $W/ops.log; grep -m5 FAIL $W/ops.log
t model $B/test_cuda_model; tail -1 $W/model.log; grep -m5 FAIL $W/model.log
t nccl $B/test_nccl; tail -1 $W/nccl.log
F="--steps 20 --quiet --sample-tokens 0 --plots 0 --eval-every 10 --save-every 10 --keep 0"
t cpu20 $B/moe train --device cpu --out $W/cpu $F
t f32 $B/moe train --device cuda-fp32 --out $W/f32 $F
t bf16 $B/moe train --device cuda --out $W/bf16 $F
python3 - <<'P'
import json
def L(p): return [json.loads(l) for l in open(p+'/metrics.jsonl') if '"loss"' in l]
a=L('/tmp/w/cpu')
for n in ('f32','bf16'):
    b=L('/tmp/w/'+n); print(n,'vs cpu, max loss rel over 20 steps: %.1e'%max(abs(x['loss']-y['loss'])/x['loss'] for x,y in zip(a,b)), ' final', a[-1]['loss'], b[-1]['loss'])
P
for pair in "bf16:cpu" "cpu:bf16"; do from=${pair%%:*}; to=${pair#*:}; d=$W/x_$from$to; mkdir -p $d
  cp -r $W/$from/step_00000010 $d/; grep -E '"step":([1-9]|10)[,}]' $W/$from/metrics.jsonl > $d/metrics.jsonl
  t resume_$from$to $B/moe train --device $( [ $to = bf16 ] && echo cuda || echo cpu ) --out $d $F --resume
  python3 -c "
import json
def L(p): return [json.loads(l) for l in open(p+'/metrics.jsonl') if '\"loss\"' in l]
a,b=L('$W/$to'),L('$d')
print('resume $from->$to: steps', len(b), 'max loss rel vs uninterrupted $to run', '%.1e'%max(abs(x['loss']-y['loss'])/x['loss'] for x,y in zip(a,b)))"
done
t hf32 env PYTHONUNBUFFERED=1 python3 $G/src/verify_hf.py $B/moe --moe-device cuda-fp32; tail -2 $W/hf32.log
t hfbf env PYTHONUNBUFFERED=1 python3 $G/src/verify_hf.py $B/moe --moe-device cuda --tol 3e-2; tail -19 $W/hfbf.log
t memcheck compute-sanitizer --tool memcheck $B/test_cuda_model; grep -E "ERROR SUMMARY" $W/memcheck.log
