#!/usr/bin/env bash
# The built-in demo: synthesize small FNO Navier-Stokes raw files, ingest them, train the tiny DPOT with 2 CPU
# processes (gloo DDP through torchrun), then evaluate it against the persistence baseline.
set -euo pipefail
OUT=${1:-demo-out}
BIN=${BIN:-.venv/bin}
STEPS=${DEMO_STEPS:-1200}
rm -rf "$OUT"
"$BIN/dpot-data" synth fno --out "$OUT/raw" --n 32 --frames 20 --seed 0
# the v5 and v7.3 files hold the same trajectories: ingest one of them.
# 32x32 (Fourier-downsampled from 64x64) keeps the training part to a few minutes on 2 CPU cores.
"$BIN/dpot-data" ingest fno "$OUT"/raw/NavierStokes_*.mat --out "$OUT/shards" --resolution 32 --split 0.8 \
    --convention canonical
"$BIN/dpot-data" inspect "$OUT/shards"
"$BIN/dpot-train" launch --manifest "$OUT/shards" --model tiny --steps "$STEPS" --batch-size 8 --nproc-per-node 2 \
    --ckpt-every 300 --log-every 100 --no-eval --out "$OUT/run"
"$BIN/dpot-train" evaluate "$OUT/run/checkpoints/step-$(printf %08d "$STEPS").pt" --manifest "$OUT/shards" \
    --out "$OUT/eval.json"   # beside the run, not into its own files (docs/format.md, "Where dpot writes")
echo "results in $OUT/run/: checkpoints/ (step-$(printf %08d "$STEPS").pt the last), metrics.jsonl, tb/;" \
    "$OUT/eval.json: L2RE per dataset, model vs persistence"
echo "  training curves: tensorboard --logdir $OUT/run/tb"
