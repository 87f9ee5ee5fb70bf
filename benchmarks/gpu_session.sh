#!/usr/bin/env bash
# The GPU measurements of benchmarks/RESULTS.md, in two stages that each fit one 10-minute command on a CUDA machine.
#
#   bash benchmarks/gpu_session.sh model   # numerical checks (golden fp32, bf16, compile); latency Ti..L (eager,
#                                          # CUDA graph); train b=20 fp32/bf16
#   bash benchmarks/gpu_session.sh compile # latency under torch.compile(reduce-overhead) per preset; compiled train
#   bash benchmarks/gpu_session.sh data    # loader and full-step throughput with 0/4/8 workers; `dpot-train launch`
#                                          # for 300 steps (per-step vs deferred host sync); kill-and-resume on the GPU
#   bash benchmarks/gpu_session.sh loop    # the part of `data` that fits one short lease: bf16 step vs model step
#                                          # with 0/4/8 workers, one deferred-sync launch, kill-and-resume (default)
#
# Env: WORKER_KIND (thread or process, for train_step), LOOP_MODES (the kill-and-resume modes of `loop`), PY (python with torch+CUDA; default python3), REF (folder with dpot_tiny.pth, dpot_tiny_io.npz; default
# ../shared/reference), OUT (folder for logs; default gpu-out), WORK (scratch; default /tmp/dpot-gpu).
# Wheels under .whl/ (packages the machine lacks) are installed to /tmp/site first when present.
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE=${1:?model, compile or data}
PY=${PY:-python3}
REF=${REF:-../shared/reference}
OUT=${OUT:-gpu-out}
WORK=${WORK:-/tmp/dpot-gpu}
MODEL=${MODEL:-Ti} BATCH=${BATCH:-20} STEPS=${STEPS:-300} DEVICE=${DEVICE:-cuda} N=${N:-96} RES=${RES:-128}
HALF=$(printf %08d $((STEPS / 2))) LAST=$(printf %08d "$STEPS")
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
if [ -z "${NO_WHEELS:-}" ] && compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv | tee "$OUT/nvidia-smi.csv"
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT/NAME.log, keep going on failure
    local name=$1 limit=$2; shift 2
    echo "=== $name: $*"
    local t0=$SECONDS
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    echo "=== $name: exit $? after $((SECONDS - t0)) s"
    grep -v '^{' "$OUT/$name.log" | tail -n 25
}

if [ "$STAGE" = model ]; then
    step gpu_checks 200 $PY benchmarks/gpu_checks.py --reference "$REF"
    step model_eager 120 $PY benchmarks/model_step.py --device cuda
    step model_graph 60 $PY benchmarks/model_step.py --device cuda --no-train --cuda-graph --iters 200
    exit 0
fi
if [ "$STAGE" = compile ]; then  # one preset per command, so that each leaves its JSON line
    for preset in Ti S M L; do
        step "model_compile_ro_$preset" 140 $PY benchmarks/model_step.py --device cuda --presets "$preset" --no-train \
            --compile --compile-mode reduce-overhead --iters 200
    done
    step model_compile_train 200 $PY benchmarks/model_step.py --device cuda --presets Ti,S --compile
    exit 0
fi

[ "$STAGE" = data ] || [ "$STAGE" = loop ] || { echo "unknown stage $STAGE (model, compile, data or loop)"; exit 2; }
DTYPES=${DTYPES:-fp32,bf16} MODES=${MODES:-default deterministic}
[ "$STAGE" = loop ] && DTYPES=bf16 MODES=${LOOP_MODES:-default}
# Data: 96 PDEBench compressible-NS trajectories of 21 frames at 128^2 (the pre-training resolution), ingested by us.
DATA=$WORK/shards
if [ ! -f "$DATA/manifest.json" ]; then
    $PY -m dpot_data synth pdebench-cfd --out "$WORK/raw" --n "$N" --res "$RES" --frames 21 > "$OUT/synth.log" 2>&1 || exit 1
    $PY -m dpot_data ingest pdebench "$WORK"/raw/*.hdf5 --out "$DATA" --workers 8 --no-progress > "$OUT/ingest.log" 2>&1 \
        || { tail "$OUT/ingest.log"; exit 1; }
fi
step train_step 240 $PY benchmarks/train_step.py --device "$DEVICE" --presets "$MODEL" --dtypes "$DTYPES" \
    --compile off --workers 0,4,8 --worker-kind "${WORKER_KIND:-thread}" --steps 40 --warmup 10 --trajectories 32 --batch "$BATCH"
launch() {  # launch NAME EXTRA...: $MODEL, batch $BATCH, bf16 on CUDA, 8 thread workers, no eval
    local name=$1; shift
    rm -rf "${WORK:?}/$name"
    step "$name" 150 $PY -m dpot_train launch --manifest "$DATA" --model "$MODEL" --batch-size "$BATCH" --num-workers 8 \
        --no-progress --no-eval --no-verify-checksums --device "$DEVICE" --out "$WORK/$name" "$@"
    $PY - "$WORK/$name/metrics.jsonl" "$BATCH" <<'EOF' | tee -a "$OUT/$name.log"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
batch, prev, samples, seconds = int(sys.argv[2]), 0, 0, 0.0
for r in rows:  # each logged rate covers the steps since the previous log line; the first 50 steps hold start-up
    if "samples_per_s" in r:
        n = (r["step"] - prev) * batch
        if prev >= 50:
            samples, seconds = samples + n, seconds + n / r["samples_per_s"]
        prev = r["step"]
print(f"steps {len(rows)}, samples/s over steps 51..{prev}: {samples / max(seconds, 1e-9):.1f}")
EOF
}
[ "$STAGE" = data ] && launch launch_sync_each_step --steps "$STEPS" --log-every 1 --ckpt-every 100000
launch launch_deferred_sync --steps "$STEPS" --log-every 50 --ckpt-every 100000
# kill-and-resume: the same 300 steps uninterrupted, and killed after the step-150 checkpoint then resumed
for mode in $MODES; do
    flag=(); [ $mode = deterministic ] && flag=(--deterministic)
    launch "full_$mode" --steps "$STEPS" --log-every 50 --ckpt-every $((STEPS / 2)) "${flag[@]}"
    rm -rf "$WORK/killed_$mode"
    $PY -m dpot_train launch --manifest "$DATA" --model "$MODEL" --batch-size "$BATCH" --num-workers 8 --no-progress \
        --no-eval --no-verify-checksums --device "$DEVICE" --out "$WORK/killed_$mode" --steps "$STEPS" --log-every 50 \
        --ckpt-every $((STEPS / 2)) "${flag[@]}" > "$OUT/killed_$mode.log" 2>&1 &
    pid=$!
    until [ -f "$WORK/killed_$mode/checkpoints/step-$HALF.pt" ] || ! kill -0 $pid 2>/dev/null; do sleep 0.2; done
    pkill -9 -f "killed_$mode" ; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
    echo "killed at: $(tail -n 1 "$WORK/killed_$mode/metrics.jsonl" | cut -c1-60)" | tee -a "$OUT/killed_$mode.log"
    step "resumed_$mode" 150 $PY -m dpot_train launch --out "$WORK/killed_$mode" --resume --no-progress --no-eval \
        --no-verify-checksums
    $PY - "$WORK/full_$mode" "$WORK/killed_$mode" "$LAST" <<'EOF' | tee "$OUT/compare_$mode.log"
import sys, torch
a, b = (torch.load(f"{d}/checkpoints/step-{sys.argv[3]}.pt", map_location="cpu", weights_only=True) for d in sys.argv[1:3])
diffs = [float((a["model"][k].float() - b["model"][k].float()).abs().max()) for k in a["model"]]
equal = all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
print(f"{sys.argv[1].rsplit('_', 1)[-1]}: resumed weights bitwise equal: {equal}; max abs diff {max(diffs):.3e}")
EOF
done
[ "$STAGE" = data ] && step train_step_compiled 150 $PY benchmarks/train_step.py --device "$DEVICE" --presets "$MODEL" --dtypes bf16 \
    --compile on --workers 8 --steps 40 --warmup 10 --trajectories 32 --batch "$BATCH"
exit 0
