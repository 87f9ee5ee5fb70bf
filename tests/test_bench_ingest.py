"""The ingest benchmark (benchmarks/ingest.py) runs end to end on a tiny file and reports every figure; its baseline
writes what the reference preprocessing writes; its profile groups functions into stages. No timing is asserted."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import ingest as bench_ingest  # noqa: E402

PASS_FIGURES = ("wall_s", "cpu_s", "peak_rss_bytes", "output_bytes", "input_mb_s", "cpu_ns_per_byte")
LOCAL_PASSES = ("read", "baseline", "default", "zarr", "wds", "raise")


def test_trajectory_count_fills_the_requested_size() -> None:
    per = 4 * 21 * 128 * 128 * 4
    n = bench_ingest.trajectories_for(1, 128)
    assert n == 181 and n * per <= 1e9 < (n + 1) * per
    assert bench_ingest.trajectories_for(0.01, 32) == 29
    assert bench_ingest.trajectories_for(1e-6, 128) == 1


def test_repeated_passes_report_the_run_of_median_wall_time() -> None:
    runs = [{"wall_s": 5.0, "cpu_s": 1}, {"wall_s": 3.0, "cpu_s": 2}, {"wall_s": 4.0, "cpu_s": 3}]
    assert bench_ingest.median_run(runs) == {"wall_s": 4.0, "cpu_s": 3, "wall_s_runs": [5.0, 3.0, 4.0]}
    assert bench_ingest.median_run(runs[:2])["wall_s"] == 3.0  # an even count: the lower middle run
    assert bench_ingest.median_run(runs[:1]) == runs[0]


def test_input_is_the_synth_file(tmp_path: Path) -> None:
    from dpot_data.synth.pdebench import write_cfd

    path = bench_ingest.write_input(tmp_path / "a", n=3, res=16, seed=2)
    same = write_cfd(tmp_path / "b", n=3, res=16, seed=2)  # `dpot-data synth pdebench-cfd --n 3 --res 16 --seed 2`
    assert path.name == same.name == "2D_CFD_Rand_M1.0_Eta0.1_Zeta0.1_periodic_16_Train.hdf5"
    assert path.read_bytes() == same.read_bytes()
    with h5py.File(path, "r") as f:
        assert {k: f[k].shape for k in bench_ingest.CFD_DATASETS} == {k: (3, 21, 16, 16) for k in
                                                                      bench_ingest.CFD_DATASETS}
        assert f["density"].dtype == np.float32 and f["t-coordinate"].shape == (22,)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """One run of the script as a child, every local pass and the profile, outputs kept."""
    tmp = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ingest.py"), "--size-gb", "0.01", "--res", "32",
                           "--no-cluster", "--profile", "--durable-mib", "64", "--keep", "--tmp", str(tmp)],
                          capture_output=True, text=True, env=env, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    return {"lines": lines, "result": json.loads(lines[-1])}


def test_json_line_has_every_figure(run: dict) -> None:
    result = run["result"]
    n = bench_ingest.trajectories_for(0.01, 32)
    assert result["input"]["trajectories"] == n and result["input"]["bytes"] > n * 4 * 21 * 32 * 32 * 4
    assert set(result["passes"]) == set(LOCAL_PASSES)
    for name, figures in result["passes"].items():
        for key in PASS_FIGURES:
            assert figures[key] is not None and figures[key] >= 0, (name, key, figures)
        assert figures["wall_s"] > 0 and figures["peak_rss_bytes"] > 10e6
    assert result["passes"]["read"]["bytes_read"] == n * 4 * 21 * 32 * 32 * 4
    assert result["durable_write"]["bytes"] == 64 << 20 and result["durable_write"]["mb_s"] > 0
    assert result["io_floor_s"] >= result["passes"]["read"]["wall_s"]
    goals = result["goals"]
    assert set(goals) == {"default / baseline speed", "wds / baseline speed", "default / I/O floor efficiency",
                          "default CPU ns per input byte", "peak RSS of default (GB)", "peak RSS of zarr (GB)",
                          "peak RSS of wds (GB)", "peak RSS of cluster (GB)", "cluster / local threads wall",
                          "raise / baseline speed", "peak RSS of raise (GB)"}
    for name, goal in goals.items():
        measured = "cluster" not in name
        assert (goal["value"] is not None) == measured and (goal["met"] in (True, False)) == measured, name
    assert result["projection"]["file_bytes"] == 10_000 * 21 * 128 * 128 * 4 * 4
    assert result["projection"]["baseline_ram_bytes"] == 2 * result["projection"]["file_bytes"]
    profile = result["profile"]
    assert set(profile["stages_ns_per_byte"]) == set(bench_ingest.STAGES)
    assert profile["profiled_cpu_s"] > 0 and profile["threads_profiled"] > 1
    assert set(profile["wall_inside_s"]) == {"fsync/syncfs", "NaN/Inf scan at open"}
    # the synthetic file is clean: under the default --nonfinite skip it is read with no scan first (scan_deferred)
    assert profile["wall_inside_s"]["NaN/Inf scan at open"] == 0
    assert profile["stages_ns_per_byte"]["Zarr encode+write (zarr/numcodecs)"] > 0
    machine = result["machine"]
    assert machine["cores"] >= 1 and machine["ram_bytes"] > 0 and machine["disk_free_bytes"] > 0
    assert machine["cpu"] and machine["python"] and machine["packages"]["h5py"] and machine["packages"]["zarr"]


def test_report_prints_the_table_and_goal_verdicts(run: dict) -> None:
    lines = run["lines"]
    assert any(line.split()[:2] == ["pass", "wall"] for line in lines)
    goal_lines = [line for line in lines if line.startswith("goal ")]
    assert len(goal_lines) == 11
    assert all(line.endswith((": met", ": missed", ": not measured")) for line in goal_lines)
    assert any(line.startswith("projection: ") for line in lines)
    assert any(line.startswith("profile ") for line in lines)


def test_baseline_writes_one_file_per_trajectory_split_90_10(run: dict) -> None:
    result = run["result"]
    work = Path(result["work"])
    n = result["input"]["trajectories"]
    n_train = int(0.9 * n)
    out = work / "out-baseline"
    train, test = sorted((out / "train").iterdir()), sorted((out / "test").iterdir())
    assert [p.name for p in train] == sorted(f"data_{i}.hdf5" for i in range(n_train))
    assert [p.name for p in test] == sorted(f"data_{i}.hdf5" for i in range(n - n_train))
    assert result["passes"]["baseline"]["shape"] == [n, 32, 32, 21, 4]
    raw = next((work / "raw").iterdir())
    with h5py.File(raw, "r") as f:
        fields = [f[name] for name in ("Vx", "Vy", "density", "pressure")]
        for split, i, k in (("train", 0, 0), ("train", n_train - 1, n_train - 1), ("test", 0, n_train),
                            ("test", n - n_train - 1, n - 1)):
            with h5py.File(out / split / f"data_{i}.hdf5", "r") as g:
                data = g["data"]
                assert data.shape == (32, 32, 21, 4) and data.dtype == np.float32 and data.compression is None
                expected = np.stack([fld[k] for fld in fields], axis=-1).transpose(1, 2, 0, 3)  # (X, Y, T, C)
                np.testing.assert_array_equal(data[()], expected)


def test_ingest_passes_wrote_a_manifest(run: dict) -> None:
    result = run["result"]
    work = Path(result["work"])
    n = result["input"]["trajectories"]
    expect = {"default": (True, True), "zarr": (True, False), "wds": (False, True)}
    for name, (zarr, shards) in expect.items():
        manifest = json.loads((work / f"out-{name}" / "manifest.json").read_text())
        assert manifest["datasets"][0]["trajectories"] == n
        summary = result["passes"][name]["manifest"]
        assert summary["trajectories"] == n and summary["zarr"] is zarr and (summary["shards"] > 0) is shards
        assert summary["splits"]["train"] == int(0.9 * n) and summary["stats"]
        assert "--format" not in result["commands"]["default"] and f"out-{name}" in result["commands"][name]
    assert (work / "out-default" / "data.zarr").is_dir() and (work / "out-default" / "shards").is_dir()


def test_against_runs_another_checkouts_default_ingest_beside_this_one(tmp_path: Path) -> None:
    """`--against DIR` runs the default ingest of another checkout right after this one's, on the same input, and
    reports the two side by side; the other checkout's code is what runs in that pass."""
    other = tmp_path / "other"
    for package in ("dpot_data", "dpot_format"):
        shutil.copytree(ROOT / package, other / package, ignore=shutil.ignore_patterns("__pycache__"))
    init = other / "dpot_data" / "__init__.py"
    init.write_text(init.read_text() + "\nimport sys as _sys\nprint('the other checkout', file=_sys.stderr)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ingest.py"), "--size-gb", "0.002", "--res",
                           "32", "--passes", "read,default,durable", "--durable-mib", "8", "--against", str(other),
                           "--keep", "--tmp", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result["passes"]) == {"read", "default", "against"}
    order = [line.split()[0] for line in proc.stdout.splitlines() if line.startswith("[") and " MB/s, CPU " in line]
    assert order == ["[read]", "[default]", "[against]"]
    work = Path(result["work"])
    assert "the other checkout" in (work / "against.log").read_text()
    assert "the other checkout" not in (work / "default.log").read_text()
    shards = [[s["sha256"] for s in json.loads((work / f"out-{name}" / "manifest.json").read_text())
               ["datasets"][0]["shards"]] for name in ("default", "against")]
    assert shards[0] and shards[0] == shards[1]
    against = result["against"]
    assert against["tree"] == str(other.resolve()) and against["wall_ratio"] > 0 and against["cpu_ratio"] > 0
    assert set(against["floor_efficiency"]) == {"default", "against"}
    assert any(line.startswith("default against ") for line in proc.stdout.splitlines())


def test_against_must_name_a_checkout(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        bench_ingest.parse_args(["--against", str(tmp_path)])


def test_profile_stages_follow_the_callers() -> None:
    """A shared function (numpy's) takes the stages of its callers, in proportion to the time each spent in it."""
    stack = ("/site-packages/numpy/_core/shape_base.py", 1, "stack")
    transform = ("/repo/dpot_data/ingest.py", 1, "_process_block")
    stats = ("/repo/dpot_data/stats.py", 1, "block_stats")
    update = ("~", 0, "<method 'update' of '_hashlib.HASH' objects>")
    root = ("/python/threading.py", 1, "run")
    raw = {
        root: (1, 1, 0.5, 10.0, {}),
        transform: (1, 1, 1.0, 4.0, {root: (1, 1, 1.0, 4.0)}),
        stats: (1, 1, 1.0, 2.0, {root: (1, 1, 1.0, 2.0)}),
        stack: (2, 2, 4.0, 4.0, {transform: (1, 1, 3.0, 3.0), stats: (1, 1, 1.0, 1.0)}),
        update: (1, 1, 2.0, 2.0, {stack: (1, 1, 2.0, 2.0)}),
    }
    seconds = bench_ingest.stage_seconds(raw, bench_ingest.stage_shares(raw))
    assert seconds[bench_ingest.TRANSFORM] == pytest.approx(1.0 + 3.0)
    assert seconds[bench_ingest.STATS] == pytest.approx(1.0 + 1.0)
    assert seconds[bench_ingest.SHA] == pytest.approx(2.0)  # owns its stage whoever calls it
    assert seconds[bench_ingest.OTHER] == pytest.approx(0.5)
    assert sum(seconds.values()) == pytest.approx(sum(v[2] for v in raw.values()))


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
