#!/bin/bash
# gpu_mesh.sh — the GPU equivalence matrix (issue 37): every parallel layout on GPU ranks against one GPU
# process, run on the lent machine in one call. Prepare here: `bash scripts/device/mesh_pack.sh .gpum`
# (build/ built with CUDA first), then `bash scripts/device/gpu_mesh.sh` with carry [".gpum"].
# On one GPU the ranks share it (--gpu-comm staged, the default here); on a multi-GPU kind run it with
# GPU_COMM=nccl (ranks beyond the GPUs would share one: keep NP <= GPUs there, MAXNP=N skips the rest).
# A tiny model (4 layers, d 128, head dim 32, 8 experts top-2, lr 1e-3), 5 steps of 4 micro-batches, each case at --device
# cuda-fp32 and at --device cuda (bf16 GEMM operands). What each case must show:
#   exact: pipeline stages alone (pp2, pp4, uneven, interleaved; --grad-clip 0 as tests/test_pipeline.sh):
#          metrics (loss, aux, z, load) and the final checkpoint byte-identical to one process, both devices
#          (the same kernels on the same inputs in the same order);
#   close: every other layout (summation orders change): per-step loss within 1e-5 relative and the final
#          weights within 1e-3 of each tensor's largest magnitude at cuda-fp32 (tests/test_mesh.sh's bands:
#          AdamW divides by sqrt(v), so round-off in a near-zero gradient element moves its update by up to
#          lr; the cpu mesh itself lands at 0.5-1.3e-4 with this model: `LOCAL=build-cpu DEVS=cpu`);
#          --precision bf16 within 1e-2 (a stochastic rounding flipped by a last bit moves a weight one bf16
#          step: tests/test_precision.sh's band); at cuda, whose GEMMs round their operands to bf16 (2^-9
#          relative: a last-bit difference upstream flips a rounding, and AdamW turns that noise in
#          near-zero gradient elements into whole lr-sized steps), the loss within 1e-4 per step (first
#          seen at most 2.4e-5; a wrong row exchanged moves step 1's loss far more), the weights reported
#          (first seen 2e-2..1.5e-1 of a tensor's scale after 5 steps: judged at cuda-fp32 instead);
#   the DeepSeek-V3-shaped model (issue 40): the deepseek-v3-tiny preset at the model's shape above (latent
#          attention, a dense first layer, sigmoid group-limited routing with the aux-free bias, an ungated shared
#          expert of d_ff, the sequence aux) with one MTP module: tp2, ep2 (close) and pp2 (exact: the dense layer
#          on stage 0, the MTP module on stage 1; bitwise on the cpu: tests/test_family_mesh.sh); at cuda its
#          routing is less well conditioned than the base model's (tests/test_cuda_model.c's note): a row over
#          the 1e-4 loss band there is to be read against the expert loads of the two runs' metrics.jsonl;
#   fp8:   --precision fp8 (the experts' GEMMs by the FP8 recipe) at ep2 and tp2 on both devices: the loss
#          within 1e-4 per step, the weights reported. tests/test_fp8_train.sh's reasoning, re-measured on
#          this model: the forward does not depend on the layout (1x128 tiles along each row's K, blocks of
#          whole experts; step 1's loss 1.5e-9..2.4e-7 from one process on the cpu), but the weight gradients'
#          1x128 tiles run along the rows, which EP (an expert's rows by rank) and TP (the token slices) group
#          otherwise: their scales and so their codes differ at the e4m3 step, and AdamW turns that in small
#          elements into lr-sized steps (the cpu's weights 1.3e-1 of a tensor's scale apart after 5 steps, the
#          loss 5.6e-6..2.4e-5 at ep2 and tp2 over the default seed and seeds 2-4, against ~4e-9 unquantised:
#          `LOCAL=build-cpu DEVS=cpu`); the GPU table equals the cpu's bit for bit, so cuda-fp32 lands there,
#          and cuda adds its bf16 operands' 2.4e-5 (above). The band is 4x the cpu's largest: a wrong exchange
#          of more than a few of a step's 1024 token rows shows, one row may not (tests/test_fp8_train.sh
#          holds the exchange under fp8 to the mesh bands, on its model);
#   loss chunks: --loss-chunks 3 (each chunk's head backward in the forward; the reference with it too): pp2
#          exact, tp2 on the DeepSeek-V3-shaped model with its MTP module close; --vocab-parallel 1 (the
#          embedding and LM head split over TP) at tp2 and pp2 tp2 (with chunks) close;
#   resume: a checkpoint saved at step 3 on one layout resumed on another continues as the uninterrupted
#          run of the first (close); preemption: SIGTERM to one rank of pp2 leaves a checkpoint that pp1 and
#          ep2 resume, every rank exits 75; kill -9 of one rank ends every rank within 60 s (MOE_COMM_TIMEOUT_S
#          30) and the newest checkpoint resumes;
#   sanitize: compute-sanitizer memcheck and racecheck over the GPU tests (sanitize_gpu.sh, SAN_BUDGET 240 s here;
#          SANITIZE=0 leaves it out): no report in our kernels; third-party ones (cuBLAS) listed by name.
# Prints one line per case (layout, device, max loss difference, max weight difference, result) and a
# summary; the whole table is also in $OUT/gpu_mesh.txt.
cd "$(dirname "$0")/../.."
R=$PWD
X=/tmp/gm
W=/tmp/gmw
rm -rf $W
mkdir -p $X $W
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OMP_NUM_THREADS=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
DEVS=${DEVS:-cuda-fp32 cuda}
if [ -n "${LOCAL:-}" ]; then # a dry run of the script itself here: LOCAL=build-cpu DEVS=cpu (the cpu backend)
  B=$R/$LOCAL
else
  . scripts/device/libs.sh && mesh_unpack $R/${GPUM:-.gpum} $X
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
fi
export MOE_COMM_TIMEOUT_S=60 MOE_NCCL_TIMEOUT_S=60
COMM=${GPU_COMM:-staged}
MAXNP=${MAXNP:-8}
JOBS=${JOBS:-4}
T=${OUT:-$W}/gpu_mesh.txt
: > $T
MPI="timeout 240 mpirun --oversubscribe -x LD_LIBRARY_PATH -x OMP_NUM_THREADS -x NCCL_NVLS_ENABLE -x MOE_COMM_TIMEOUT_S -x MOE_NCCL_TIMEOUT_S"
BASE="--steps 5 --quiet --sample-tokens 0 --plots 0 --batch 16 --seq-len 64 --eval-batches 1 --eval-every 0
      --n-layers 4 --n-heads 4 --n-kv-heads 2 --d-model 128 --d-ff 128 --n-experts 8 --top-k 2 --lr 1e-3
      --warmup 2 --grad-accum 4"
date -u
echo "transport: --gpu-comm $COMM; at most $MAXNP ranks; $JOBS cases at a time"

# row LABEL DEVICE LOSSDIFF WEIGHTDIFF RESULT
row() { printf "%-46s %-9s %-10s %-10s %s\n" "$@" | tee -a $T; }

one() { # one DIR DEVICE FLAGS...: the one-process reference
  local d=$1 dev=$2
  shift 2
  [ -f $d/metrics.jsonl ] || $B/moe train --out $d --device $dev $BASE "$@" > $d.log 2>&1 < /dev/null
}
# losses METRICS [KEY]: the per-step loss (or KEY: mtp_loss) of a run, one a line
losses() { python3 -c "import json,sys; [print(json.loads(l).get(sys.argv[2], 0)) for l in open(sys.argv[1]) if '\"loss\"' in l]" "$1" "${2:-loss}"; }
maxrel() { paste "$1" "$2" | awk 'BEGIN { m = 0; n = 0 } NF == 2 { n++; d = ($1 - $2) / ($1 == 0 ? 1 : $1); if (d < 0) d = -d; if (d > m) m = d } NF != 2 { m = 1e9 } END { if (n == 0) m = 1e9; printf "%.2e\n", m }'; }
# mdiff REF RUN: where the two runs' metrics part (a failing row's diagnosis): per key, the largest relative
# difference and the first step over 1e-6 (expert_load: the first step and layer whose token counts differ)
mdiff() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" << 'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
out = []
for k in ('loss', 'mtp_loss', 'aux_loss', 'grad_norm'):
    m, first = 0.0, None
    for x, y in zip(a, b):
        if k not in x or k not in y: continue
        d = abs(x[k] - y[k]) / (abs(x[k]) or 1)
        if d > 1e-6 and first is None: first = x['step']
        m = max(m, d)
    if any(k in x for x in a): out.append('%s %.1e%s' % (k, m, ' from step %d' % first if first else ''))
for x, y in zip(a, b):
    la, lb = x.get('expert_load'), y.get('expert_load')
    if la != lb:
        l = next(i for i, (u, v) in enumerate(zip(la or [], lb or [])) if u != v) if la and lb else -1
        out.append('expert_load differs from step %d (layer %d)' % (x['step'], l)); break
else: out.append('expert_load equal')
print('; '.join(out))
PY
}
# flipcut REF RUN LT: at cuda (bf16 operands), where the two runs route a token differently (a near tie of
# router scores flipped by a last-bit difference upstream), the loss after that step is no longer comparable.
# Prints "OK STEP MOVES MAXBEFORE": the first step whose expert loads differ, the most token slots moved there in
# one layer (|load a - load b| / 2; a flipped token moves on through the layers above: seen 1, 3, 3), the
# largest relative loss difference up to it. The row passes as a flip only where MOVES <= 4 (a wrong exchange
# upstream of a layer moves its routing wholesale) and every step before it is within LT; the flip step's own
# loss is judged too (within LT plus 1e-3 of the loss per moved slot: one token of this 1024-token batch).
flipcut() {
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" "$3" << 'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p) if '"loss"' in l] for p in sys.argv[1:3])
lt = float(sys.argv[3]); m = 0.0
for x, y in zip(a, b):
    la, lb = x.get('expert_load') or [], y.get('expert_load') or []
    if la != lb:
        mv = max(sum(abs(u - v) for u, v in zip(p, q)) // 2 for p, q in zip(la, lb))
        d = abs(x['loss'] - y['loss']) / abs(x['loss'])
        ok = mv <= 4 and m <= lt and (x['step'] > 1 or d <= lt + 1e-3 * mv)
        print('%s %d %d %.1e' % ('yes' if ok else 'no', x['step'], mv, max(m, d) if x['step'] == 1 else m)); break
    m = max(m, abs(x['loss'] - y['loss']) / abs(x['loss']))
else: print('no 0 0 %.1e' % m)
PY
}
strip() { sed -E 's/"pp_idle_s":\[[^]]*\],?//; s/"(tokens_per_s|tflops|step_time_s|grad_wait_s|bubble_frac|grad_norm|a2a_tuned)":[^,}]*,?//g' "$1" | grep '"loss"'; }
key() { echo "$*" | xargs | tr -c 'a-zA-Z0-9\n' '_'; }
latest() { ls -d "$1"/step_* 2> /dev/null | grep -v '\.tmp$' | tail -n 1; }

# judge LABEL DEV KIND REF RUN: compares RUN with REF (exact | close) and prints the row
judge() {
  local label=$1 dev=$2 kind=$3 ref=$4 run=$5 lt wt
  if [ ! -f $run/metrics.jsonl ] || [ -z "$(latest $run)" ]; then
    row "$label" $dev - - "FAIL (no run: $(grep -m1 -E 'error|rror' $run.log | cut -c1-90))"
    return
  fi
  losses $ref/metrics.jsonl > $run.la
  losses $run/metrics.jsonl > $run.lb
  local l=$(maxrel $run.la $run.lb)
  if grep -q '"mtp_loss"' $ref/metrics.jsonl; then # the MTP module's loss is judged as the loss
    losses $ref/metrics.jsonl mtp_loss > $run.la
    losses $run/metrics.jsonl mtp_loss > $run.lb
    l=$(printf '%s\n%s\n' $l $(maxrel $run.la $run.lb) | sort -g | tail -1)
  fi
  local cd=$($B/ckpt_diff $(latest $ref) $(latest $run) 2> /dev/null)
  local w=$(echo "$cd" | grep -oE '[0-9.]+e[-+][0-9]+' | head -1) wn=$(echo "$cd" | grep -oE '\([^)]*\)' | head -1)
  [ -z "$w" ] && w=9e9
  if [ $kind = exact ]; then
    local ok=1
    cmp -s <(strip $ref/metrics.jsonl) <(strip $run/metrics.jsonl) || ok=0
    cmp -s $(latest $ref)/model.safetensors $(latest $run)/model.safetensors || ok=0
    cmp -s $(latest $ref)/optimizer.safetensors $(latest $run)/optimizer.safetensors || ok=0
    [ $ok = 1 ] && row "$label" $dev $l $w "PASS (bitwise)" || row "$label" $dev $l $w "FAIL (not bitwise)"
    return
  fi
  lt=1e-5 wt=1e-3
  [[ "$label" == *bf16* ]] && wt=1e-2
  [ $dev = cuda ] && lt=1e-4 wt=inf # (the weights: reported, not judged)
  [[ "$label" == *fp8* ]] && lt=1e-4 wt=inf # (the weight gradients' tiles: above)
  if awk -v l=$l -v w=$w -v lt=$lt -v wt=$wt 'BEGIN { exit !(l <= lt && (wt == "inf" || w <= wt)) }'; then
    row "$label" $dev $l $w "PASS (<= $lt, $wt)"
  elif [ $dev = cuda ] && set -- $(flipcut $ref $run $lt) && [ "$1" = yes ]; then
    row "$label" $dev $l $w "PASS (routing flip at step $2: $3 slots; loss before it $4)"
  else
    row "$label" $dev $l $w "FAIL (> $lt or $wt; worst weights $wn)"
    echo "    metrics: $(mdiff $ref $run)" | tee -a $T
  fi
}

# layout NP "FLAGS" "REF FLAGS" KIND LABEL DEV: one mesh run against its reference
layout() {
  local np=$1 flags=$2 rflags=$3 kind=$4 label=$5 dev=$6
  [ $np -gt $MAXNP ] && { row "$label" $dev - - "skipped (np $np > $MAXNP)"; return; }
  local tag=$(key "$label $dev")
  local ref=$W/ref_${dev}_$(key "$rflags")
  local run=$W/$tag
  $MPI -np $np $B/moe train --out $run --device $dev --gpu-comm $COMM $BASE $rflags $flags > $run.log 2>&1 < /dev/null
  judge "$label" $dev $kind $ref $run
}

# the DeepSeek-V3-shaped model on BASE's shape: the latent attention's KV heads are the heads, the shared
# expert the experts' width; AdamW's eps 1e-5: the MTP module's expert gradients are small (sqrt(v) 1e-7 to 4e-5
# after 5 steps, 40x below the main layers'), where m / (sqrt(v) + 1e-8) turns the round-off of another
# summation order (ep2's rows of an expert at other offsets of the GPU's K-tiles) into lr-sized steps: ep2 at
# cuda-fp32 with the default eps 9.9e-3 of a tensor's scale, with 1e-5 1.1e-6 (the cpu mesh 1.5e-5); the
# loss and the MTP loss (every row that has one) judged per step (its MTP loss 4.1e-7 apart there)
DSF="--preset deepseek-v3-tiny --mtp 1 --n-kv-heads 4 --shared-d-ff 128 --adam-eps 1e-5"
CASES=(
  "2|--pp 2||exact|pp2"
  "4|--pp 4||exact|pp4"
  "2|--pp 2 --pp-layers 1,3||exact|pp2 uneven (1,3)"
  "2|--pp 2 --pp-schedule interleaved --vpp 2||exact|pp2 vpp2 interleaved"
  "2|--pp 2|--dispatch capacity --capacity-factor 1.0|exact|pp2 capacity"
  "2|||close|dp2"
  "2|--tp 2||close|tp2"
  "2|--ep 2||close|ep2"
  "2|--ep 2|--dispatch capacity --capacity-factor 1.0|close|ep2 capacity"
  "4|--ep 2 --etp 2||close|ep2 etp2"
  "4|--tp 2 --ep 2||close|tp2 ep2"
  "2|--ep 2 --zero 1||close|dp2 ep2 zero1"
  "2|--ep 2 --zero 2 --bucket-mb 0.05||close|dp2 ep2 zero2"
  "4|--pp 2 --ep 2||close|pp2 ep2"
  "8|--pp 2 --tp 2 --ep 2 --zero 2||close|pp2 tp2 ep2 zero2"
  "2|--ep 2 --a2a-overlap 2||close|ep2 a2a-overlap 2"
  "2|--ep 2 --a2a-overlap auto||close|ep2 a2a-overlap auto"
  "2|--ep 2 --ampipe 2||close|ep2 ampipe 2"
  "4|--ep 2 --etp 2 --expert-mode gathered||close|ep2 etp2 expert-mode gathered"
  "4|--ep 4 --a2a-hier 2||close|ep4 a2a-hier 2"
  "4|--tp 2 --ep 2|--precision bf16|close|tp2 ep2 precision bf16"
  "2|--pp 2|--precision bf16|close|pp2 precision bf16"
  "2|--tp 2|$DSF|close|deepseek-v3-tiny+MTP tp2"
  "2|--ep 2|$DSF|close|deepseek-v3-tiny+MTP ep2"
  "2|--pp 2|$DSF|exact|deepseek-v3-tiny+MTP pp2 (MTP on stage 1)"
  "2|--ep 2|--precision fp8|close|ep2 precision fp8"
  "2|--tp 2|--precision fp8|close|tp2 precision fp8"
  "2|--pp 2|--loss-chunks 3|exact|pp2 loss-chunks 3"
  "2|--tp 2|$DSF --loss-chunks 3|close|deepseek-v3-tiny+MTP tp2 loss-chunks 3"
  "2|--tp 2 --vocab-parallel 1||close|tp2 vocab-parallel"
  "4|--pp 2 --tp 2 --vocab-parallel 1|--loss-chunks 3|close|pp2 tp2 vocab-parallel loss-chunks 3"
)
# MATCH=REGEX: only the layout cases whose label matches (no resharding, preemption, bad input or sanitizer)
if [ -n "${MATCH:-}" ]; then
  KEEP=(); for c in "${CASES[@]}"; do [[ "${c##*|}" =~ $MATCH ]] && KEEP+=("$c"); done
  CASES=("${KEEP[@]}"); SANITIZE=0
fi
# the references first (one process each, in parallel: one per reference flags the cases use; an exact case's
# with --grad-clip 0), then the cases, JOBS at a time (ONLY=bad: only the bad-input cases at the end)
[ "${ONLY:-}" = bad ] && DEVS=
rflags_of() { # rflags_of CASE: the case's reference flags
  local np flags rflags kind label
  IFS='|' read -r np flags rflags kind label <<< "$1"
  [ $kind = exact ] && rflags="$rflags --grad-clip 0"
  echo $rflags
}
for c in "${CASES[@]}"; do rflags_of "$c"; done | sort -u | {
  while read -r rf; do
    for dev in $DEVS; do one $W/ref_${dev}_$(key "$rf") $dev $rf & done
  done
  wait
}
echo "references: $(ls -d $W/ref_*/ | wc -l) one-process runs"
printf "%-46s %-9s %-10s %-10s %s\n" layout device loss_diff weight_diff result | tee -a $T
for dev in $DEVS; do
  for c in "${CASES[@]}"; do
    IFS='|' read -r np flags rflags kind label <<< "$c"
    rflags=$(rflags_of "$c")
    while [ $(jobs -r | wc -l) -ge $JOBS ]; do sleep 0.2; done
    layout $np "$flags" "$rflags" $kind "$label" $dev &
  done
done
wait

[ -n "${MATCH:-}" ] && DEVS= # (the sections below)
# ---- resharding: saved at step 3 on one layout, resumed on another, against the first's whole run
reshard() { # reshard FROM_NP "FROM" TO_NP "TO" LABEL DEV
  local fnp=$1 from=$2 tnp=$3 to=$4 label=$5 dev=$6 a=$W/rs_a_$RANDOM b=$W/rs_b_$RANDOM
  $MPI -np $fnp $B/moe train --out $a --device $dev --gpu-comm $COMM $BASE --steps 6 --save-every 3 --keep 0 $from > $a.log 2>&1 < /dev/null
  mkdir -p $b
  cp -r $a/step_00000003 $a/metrics.jsonl $b/ 2> /dev/null
  cp $a/run.json $b/ 2> /dev/null
  $MPI -np $tnp $B/moe train --out $b --device $dev --gpu-comm $COMM $BASE --steps 6 --save-every 3 --keep 0 $to --resume > $b.log 2>&1 < /dev/null
  judge "$label" $dev close $a $b
}
for dev in $DEVS; do
  reshard 4 "--pp 2 --ep 2" 1 "" "resume pp2 ep2 -> pp1" $dev &
  reshard 4 "--pp 2 --ep 2" 2 "--tp 2" "resume pp2 ep2 -> tp2" $dev &
  reshard 1 "" 4 "--pp 2 --ep 2" "resume pp1 -> pp2 ep2" $dev &
  reshard 2 "--tp 2" 4 "--pp 2 --ep 2" "resume tp2 -> pp2 ep2" $dev &
  wait
done

# ---- SIGTERM to one rank of pp2: every rank saves and exits 75; pp1 and ep2 resume that checkpoint
for dev in ${DEVS%% *}; do
  d=$W/term
  $MPI -np 2 $B/moe train --out $d --device $dev --gpu-comm $COMM $BASE --pp 2 --steps 400 > $d.log 2>&1 < /dev/null &
  mp=$!
  for i in $(seq 600); do [ "$(grep -c '"loss"' $d/metrics.jsonl 2> /dev/null)" -ge 3 ] 2> /dev/null && break; sleep 0.1; done
  victim=$(pgrep -f "^$B/moe train --out $d " | tail -1)
  kill -TERM $victim
  wait $mp
  rc=$?
  ck=$(latest $d)
  ok=1
  [ $rc = 75 ] || ok=0
  [ -n "$ck" ] || ok=0
  st=$(basename "$ck" | sed 's/step_0*//')
  for L in "1|" "2|--ep 2"; do
    IFS='|' read -r np fl <<< "$L"
    cp -r $d $d.r$np
    $MPI -np $np $B/moe train --out $d.r$np --device $dev --gpu-comm $COMM $BASE $fl --steps $((st + 1)) --resume > $d.r$np.log 2>&1 < /dev/null || ok=0
  done
  [ $ok = 1 ] && row "SIGTERM to one rank of pp2 at step $st" $dev - - "PASS (exit $rc; pp1 and ep2 resumed)" ||
    row "SIGTERM to one rank of pp2" $dev - - "FAIL (exit $rc, checkpoint '$ck'; $(grep -m1 rror $d.r*.log))"
done

# ---- kill -9 of one rank of pp2 (saving every step): every rank gone within 60 s; the newest checkpoint resumes
for dev in ${DEVS%% *}; do
  d=$W/kill
  MOE_COMM_TIMEOUT_S=30 $MPI -np 2 $B/moe train --out $d --device $dev --gpu-comm $COMM $BASE --pp 2 --steps 400 --save-every 1 --keep 2 > $d.log 2>&1 < /dev/null &
  mp=$!
  for i in $(seq 600); do [ "$(grep -c '"loss"' $d/metrics.jsonl 2> /dev/null)" -ge 4 ] 2> /dev/null && break; sleep 0.1; done
  victim=$(pgrep -f "^$B/moe train --out $d " | tail -1)
  t0=$SECONDS
  kill -9 $victim
  for i in $(seq 600); do pgrep -f "^$B/moe train --out $d " > /dev/null || break; sleep 0.1; done
  gone=$((SECONDS - t0))
  left=$(pgrep -f "^$B/moe train --out $d " | wc -l)
  wait $mp
  ck=$(latest $d)
  st=$(basename "$ck" | sed 's/step_0*//')
  $B/moe train --out $d --device $dev $BASE --steps $((st + 1)) --resume > $d.r.log 2>&1 < /dev/null
  rrc=$?
  if [ $left = 0 ] && [ $gone -le 60 ] && [ $rrc = 0 ]; then
    row "kill -9 of one rank of pp2" $dev - - "PASS (all ranks gone in ${gone} s; step $st resumed)"
  else row "kill -9 of one rank of pp2" $dev - - "FAIL ($left ranks left after ${gone} s; resume rc $rrc)"; fi
  pkill -9 -f "^$B/moe train --out $d " 2> /dev/null
done

# ---- bad input: one message naming the problem, a non-zero exit, nothing written
refused() { # refused LABEL NP PATTERN FLAGS...
  local label=$1 np=$2 pat=$3 d=$W/bad_$RANDOM
  shift 3
  $MPI -np $np $B/moe train --out $d --steps 2 --quiet --sample-tokens 0 --plots 0 --eval-batches 1 --eval-every 0 \
    --batch 16 --seq-len 64 "$@" > $d.log 2>&1 < /dev/null
  local rc=$?
  if [ $rc != 0 ] && grep -q -E "$pat" $d.log && [ ! -e $d ]; then
    row "$label" - - - "PASS (exit $rc: $(grep -m1 -oE 'error: .*' $d.log | cut -c8-90))"
  else row "$label" - - - "FAIL (exit $rc; $(grep -m1 -E 'rror' $d.log | cut -c1-80); dir $([ -e $d ] && echo written || echo absent))"; fi
}
if [ -z "${LOCAL:-}" ] && [ "$COMM" = staged ] && [ -z "${MATCH:-}" ]; then
  refused "--gpu-comm nccl, 2 ranks on one GPU" 2 "share 1 GPU.*--gpu-comm staged" --device cuda --gpu-comm nccl --ep 2 --n-experts 8
  refused "--gpu-comm mpi, MPI not CUDA-aware" 2 "MPIX_Query_cuda_support" --device cuda --gpu-comm mpi --ep 2 --n-experts 8
  refused "8 ranks of a model too big to share" 8 "8 ranks share GPU 0.*need" --device cuda --preset mixtral-8x7b --n-layers 8 --seq-len 512 --grad-accum 1 --ep 8
fi

# ---- compute-sanitizer over the GPU tests (sanitize_gpu.sh; SANITIZE=0 leaves it out, SAN_BUDGET bounds it)
if [ -z "${LOCAL:-}" ] && [ "${SANITIZE:-1}" = 1 ]; then
  SAN_BIN=$B SAN_BUDGET=${SAN_BUDGET:-240} bash scripts/device/sanitize_gpu.sh > $W/sanitize.log 2>&1
  src=$?
  grep -E '^(==|sanitize|[a-z_-]+\.log:)' $W/sanitize.log | sed 's/^/  /' | tee -a $T
  if [ $src = 0 ]; then row "compute-sanitizer (our kernels)" - - - "PASS"
  else row "compute-sanitizer (our kernels)" - - - "FAIL (reports in our kernels, or a run cut short)"; fi
fi

echo "summary: $(grep -c PASS $T) passed, $(grep -c FAIL $T) failed, $(grep -c skipped $T) skipped"
echo "summary: $(grep -c PASS $T) passed, $(grep -c FAIL $T) failed, $(grep -c skipped $T) skipped" >> $T
[ -n "${OUT:-}" ] && (cd $W && tar czf $OUT/gpu_mesh_logs.tgz *.log)
date -u
