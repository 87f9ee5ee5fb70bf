"""The ingest benchmark runs end to end on a tiny file: it cleans up after itself and ends with its JSON line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import ingest as bench_ingest  # noqa: E402


def test_trajectory_count_reaches_the_requested_size() -> None:
    n = bench_ingest.trajectories_for(4, 128)
    assert n == 781 and n * 4 * 21 * 128 * 128 * 4 >= 4 * 2**30 > (n - 1) * 4 * 21 * 128 * 128 * 4


def test_generated_file_has_the_pdebench_cfd_layout(tmp_path: Path) -> None:
    path = bench_ingest.write_input(tmp_path, n=5, res=16, seed=0, block=2)
    assert path.name == "2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_16_Train.hdf5"
    with h5py.File(path, "r") as f:
        assert {k: f[k].shape for k in ("Vx", "Vy", "density", "pressure")} == {k: (5, 21, 16, 16) for k in
                                                                             ("Vx", "Vy", "density", "pressure")}
        assert f["t-coordinate"].shape == (22,) and f["x-coordinate"].shape == (16,)
        assert f["density"].dtype == np.float32 and float(f["density"][()].min()) > 0
        assert float(np.abs(np.diff(f["Vx"][0, 0], axis=0)).max()) < 1.0  # smooth fields


def test_benchmark_runs_and_ends_with_json(tmp_path: Path, capsys) -> None:
    code = bench_ingest.main(["--size-gb", "0.004", "--res", "32", "--tmp", str(tmp_path),
                              "--ingest-args", "--workers {workers} --no-progress --resolution 32"])
    assert code == 0
    lines = capsys.readouterr().out.strip().splitlines()
    result = json.loads(lines[-1])
    assert result["trajectories"] == bench_ingest.trajectories_for(0.004, 32)
    assert result["read_mb_s"] > 0 and result["ingest_mb_s"] > 0 and result["peak_rss_bytes"] > 50e6
    assert abs(result["ratio"] - result["ingest_mb_s"] / result["read_mb_s"]) < 0.01  # both rounded to 0.1 MB/s
    assert any(line.startswith("ratio ingest/read = ") for line in lines)
    assert list(tmp_path.iterdir()) == []  # the temp folder with input and output is gone


def test_ingest_memory_does_not_grow_with_the_file(tmp_path: Path) -> None:
    """Out-of-core: with blocks of 4 trajectories, ingesting 6x more trajectories allocates no more at its peak
    (numpy allocations traced by tracemalloc), and the peak stays below the file size."""
    import tracemalloc

    from dpot_data.ingest import IngestOptions, run_ingest

    opts = IngestOptions(resolution=None, workers=2, block=4, shard_size=1 << 20, command="test")
    peaks = {}
    for n in (16, 96):
        raw = bench_ingest.write_input(tmp_path / f"raw{n}", n=n, res=32, seed=0)
        if n == 16:
            run_ingest("pdebench", [raw], tmp_path / "warm", opts)  # imports and caches outside the measurement
        tracemalloc.start()
        try:
            run_ingest("pdebench", [raw], tmp_path / f"out{n}", opts)
            peaks[n] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        size = raw.stat().st_size
    assert peaks[96] < 1.25 * peaks[16], peaks
    assert peaks[96] < 0.75 * size, (peaks, size)
