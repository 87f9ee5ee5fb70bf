#!/usr/bin/env bash
# The built-in demo: synthesize small FNO Navier-Stokes raw files, ingest them, inspect the result.
set -euo pipefail
OUT=${1:-demo-out}
BIN=${BIN:-.venv/bin}
rm -rf "$OUT"
"$BIN/dpot-data" synth fno --out "$OUT/raw" --n 24 --frames 20 --seed 0
# the v5 and v7.3 files hold the same trajectories: ingest one of them
"$BIN/dpot-data" ingest fno "$OUT"/raw/NavierStokes_*.mat --out "$OUT/shards"
"$BIN/dpot-data" inspect "$OUT/shards"
