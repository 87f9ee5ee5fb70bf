"""Memory of `dpot-data ingest xarray` stays bounded: ingesting an HDF5 input of 420 MB peaks at about what ingesting
a 105 MB one of the same layout peaks at (the file is streamed in blocks of trajectories, never loaded whole): the
growth stays below a quarter of the larger file. Peak RSS of each ingest subprocess (getrusage). Measured on a 2-core
machine: 105 MB -> 435 MB peak, 420 MB -> ~440 MB, 840 MB -> 450 MB (benchmarks/RESULTS.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

GRID = 256
FRAMES = 10


def _write(path: Path, samples: int) -> int:
    """An h5py file u (sample, time, y, x) float32, one chunk per trajectory, written one trajectory at a time."""
    rng = np.random.default_rng(0)
    with h5py.File(path, "w") as f:
        d = f.create_dataset("u", shape=(samples, FRAMES, GRID, GRID), dtype=np.float32,
                             chunks=(1, FRAMES, GRID, GRID))
        for i in range(samples):
            d[i] = rng.standard_normal((FRAMES, GRID, GRID), dtype=np.float32)
    return path.stat().st_size


def _peak_rss(path: Path, out: Path) -> int:
    """Peak resident bytes of one ingest subprocess (native grid, Zarr only, 4 trajectories per block)."""
    code = ("import resource, sys\n"
            "from dpot_data.cli import app\n"
            "try:\n    app(sys.argv[1:])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
    done = subprocess.run([sys.executable, "-c", code, "ingest", "xarray", str(path), "--axes", "NTYX", "--out",
                           str(out), "--resolution", "0", "--format", "zarr", "--block", "4", "--workers", "2",
                           "--no-progress", "--no-stats"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return int(done.stdout.split()[-1]) * 1024  # ru_maxrss is in KiB on Linux


@pytest.mark.slow
def test_peak_memory_does_not_grow_with_the_file(tmp_path):
    small = _write(tmp_path / "small.h5", 40)  # 105 MB: enough blocks that thread pools and caches are warm
    big = _write(tmp_path / "big.h5", 160)  # 420 MB
    base = _peak_rss(tmp_path / "small.h5", tmp_path / "o-small")
    peak = _peak_rss(tmp_path / "big.h5", tmp_path / "o-big")
    assert big > 3 * small
    assert peak - base < big / 4, (base, peak, big)
    print(f"input {big / 1e6:.0f} MB: peak RSS {peak / 1e6:.0f} MB (small input: {base / 1e6:.0f} MB)")
