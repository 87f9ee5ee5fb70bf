"""`--nonfinite skip` (the default) with no scan when the files are opened: a clean file is read once (the block
reads check every value), a file holding NaN/Inf trajectories ends in the output a scan first would have given, and
`--nonfinite raise` still refuses in one line with nothing published, however many blocks were written before."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import h5py
import numpy as np
import pytest
from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_data.ingest import IngestOptions, ingest_files
from dpot_data.ingest.journal import JOURNAL_NAME, STAGING_PREFIX, Journal
from dpot_data.ingest.pipeline import run_ingest
from dpot_data.sources import _blocks
from dpot_data.synth import pdebench as synth_bench

FIELDS = ("Vx", "Vy", "density", "pressure")
OPTS = dict(resolution=None, stats=True, block=3)


def _bytes_read() -> int:
    """Bytes this process has read through read(2)/pread(2) so far, page-cache hits included (Linux)."""
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar:")).split()[1])


def _with_nan(path: Path, trajectory: int, field: str = "pressure") -> Path:
    """The file with one value of `field` in `trajectory` (its last frame) set to NaN."""
    with h5py.File(path, "r+") as f:
        f[field][trajectory, -1, 0, 0] = np.nan
    return path


def _digests(manifest: dict) -> tuple:
    """What the output holds, manifest fields that name the run (command, time) left out."""
    ds = manifest["datasets"][0]
    return (ds["skipped"], ds["splits"], [s["sha256"] for s in ds["shards"]], ds["zarr"]["arrays"], ds["stats"])


def _leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name.startswith(STAGING_PREFIX)) if out.is_dir() else []


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_a_clean_file_is_read_once_under_the_default_skip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default ingest reads each field byte once (no scan at open; the block reads check the values), plus
    the whole file once to hash it."""
    path = synth_bench.write_cfd(tmp_path / "raw", n=8, frames=5, res=64)
    with h5py.File(path) as f:
        fields = sum(f[k].nbytes for k in FIELDS)
    opts = IngestOptions(resolution=None, formats=("zarr",), stats=False, block=3)
    ingest_files("pdebench", [path], tmp_path / "warm", opts)  # modules imported on first use
    scans: list[int] = []
    real_scan = _blocks.scan
    monkeypatch.setattr(_blocks, "scan", lambda *a, **k: scans.append(1) or real_scan(*a, **k))
    before = _bytes_read()
    ingest_files("pdebench", [path], tmp_path / "out", opts)
    extra = _bytes_read() - before - fields - path.stat().st_size
    assert scans == []
    assert 0 <= extra < 0.1 * fields, (extra, fields)


@pytest.mark.parametrize("trajectory", [0, 7])  # in the first block; in the last, after two blocks were written
def test_a_nan_trajectory_is_left_out_as_after_a_scan_first(tmp_path: Path, trajectory: int) -> None:
    path = _with_nan(synth_bench.write_cfd(tmp_path / "raw", n=8, frames=5, res=16), trajectory)
    default = ingest_files("pdebench", [path], tmp_path / "default", IngestOptions(**OPTS))
    scanned = ingest_files("pdebench", [path], tmp_path / "scanned", IngestOptions(**OPTS), check_finite=True)
    assert [s["what"] for s in default["datasets"][0]["skipped"]] == [f"{path.name}#{trajectory}"]
    assert _digests(default) == _digests(scanned)
    assert _leftovers(tmp_path / "default") == []


def _fno_with_nan(folder: Path) -> Path:
    import scipy.io

    from dpot_data.synth.fno import synth_fno, write_mat_v5

    v5, _v73 = synth_fno(folder / "synth", n=6, frames=4, viscosity=1e-3, seed=1, resolution=16)
    m = scipy.io.loadmat(v5)
    u = m["u"].copy()
    u[5, 3, 7, 2] = np.inf  # trajectory 5 of 6: the last block of 2
    path = folder / "NavierStokes_V1e-3_N6_T4.mat"
    write_mat_v5(path, m["a"], u, m["t"])
    return path


def _pdearena_with_nan(folder: Path) -> Path:
    from dpot_data.synth.pdearena import write_ns

    path = write_ns(folder, split="train", n=6, frames=5, res=16)
    with h5py.File(path, "a") as f:
        f["train/vx"][4, 2, 3, 4] = np.nan
    return path


@pytest.mark.parametrize("source,make,bad", [("fno", _fno_with_nan, 5), ("pdearena", _pdearena_with_nan, 4)])
def test_the_other_readers_without_a_scan_end_as_after_one(tmp_path: Path, source: str, make, bad: int) -> None:
    path = make(tmp_path / "raw")
    opts = dict(resolution=None, stats=True, block=2)
    default = ingest_files(source, [path], tmp_path / "default", IngestOptions(**opts))
    scanned = ingest_files(source, [path], tmp_path / "scanned", IngestOptions(**opts), check_finite=True)
    assert [s["what"] for s in default["datasets"][0]["skipped"]] == [f"{path.name}#{bad}"]
    assert _digests(default) == _digests(scanned)
    assert _leftovers(tmp_path / "default") == []


def test_raise_refuses_a_nan_in_the_last_block_in_one_line_with_nothing_published(tmp_path: Path) -> None:
    path = _with_nan(synth_bench.write_cfd(tmp_path / "raw", n=8, frames=5, res=16), 7, field="Vy")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["ingest", "pdebench", str(path), "--out", str(out), "--resolution", "0",
                                      "--block", "3", "--nonfinite", "raise", "--no-progress"])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "Vy: trajectory 7 holds NaN or Inf" in lines[0], lines
    assert not (out / "manifest.json").exists() and _leftovers(out) == []


def test_the_plan_that_stands_is_the_one_whose_warnings_are_told(tmp_path: Path) -> None:
    """The read without a scan plans 8 trajectories; the one after the scan, 7: only its warnings reach the user."""
    path = _with_nan(synth_bench.write_cfd(tmp_path / "raw", n=8, frames=5, res=16), 7)
    result = CliRunner().invoke(app, ["ingest", "pdebench", str(path), "--out", str(tmp_path / "out"), "--block", "3",
                                      "--no-progress"])  # 16x16 -> 128x128: the plan warns of the output's size
    assert result.exit_code == 0, result.output
    grows = [line for line in result.output.splitlines() if "multiplies the data" in line]
    assert len(grows) == 1, grows
    clean = synth_bench.write_cfd(tmp_path / "clean", n=8, frames=5, res=16)
    result = CliRunner().invoke(app, ["ingest", "pdebench", str(clean), "--out", str(tmp_path / "out2"), "--block",
                                      "3", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert len([line for line in result.output.splitlines() if "multiplies the data" in line]) == 1


def test_a_staged_part_is_resumed_from_a_scan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A staging folder left by an interrupted run may have been planned from a scan (a NaN trajectory left out):
    the run that takes it up scans first, so that its plan, and the journal's fingerprint, are that run's."""
    path = _with_nan(synth_bench.write_cfd(tmp_path / "raw", n=8, frames=5, res=16), 4)
    out = tmp_path / "out"
    scans: list[int] = []
    real_scan, real_record = _blocks.scan, Journal.record
    monkeypatch.setattr(_blocks, "scan", lambda *a, **k: scans.append(1) or real_scan(*a, **k))

    def killed_once_scanned(self: Journal, *a: object, **k: object) -> None:  # a kill after the scanned run's block
        real_record(self, *a, **k)
        if scans:
            raise KeyboardInterrupt

    monkeypatch.setattr(Journal, "record", killed_once_scanned)
    with pytest.raises(KeyboardInterrupt):
        run_ingest("pdebench", [path], out, IngestOptions(**OPTS))
    monkeypatch.setattr(Journal, "record", real_record)
    assert scans == [1] and len(_leftovers(out)) == 1
    staged_job = json.loads((out / _leftovers(out)[0] / JOURNAL_NAME).read_text().splitlines()[0])["job"]
    opened: list[str] = []
    real_open = Journal.open.__func__
    monkeypatch.setattr(Journal, "open", classmethod(lambda cls, o, n, job, *a, **k: opened.append(job)
                                                     or real_open(cls, o, n, job, *a, **k)))
    outcome = run_ingest("pdebench", [path], out, IngestOptions(**OPTS))
    assert scans == [1, 1] and opened == [staged_job]  # straight to the scan, the staged part's job
    fresh = ingest_files("pdebench", [path], tmp_path / "fresh", IngestOptions(**OPTS))
    assert _digests(outcome.manifest) == _digests(fresh)
    assert _leftovers(out) == []


def test_a_block_error_comes_back_from_a_worker_as_itself() -> None:
    """A dask.distributed worker sends a task's exception back pickled: the TrajectoryError that starts the scan
    (and any InputError) must come back as itself, path and message included. In a fresh interpreter: modules some
    test plugins load (tblib, through distributed) make every exception picklable in this one."""
    code = textwrap.dedent("""
        import pickle
        from dpot_data.errors import InputError, TrajectoryError
        for error in (InputError("in.h5", "expected x"), TrajectoryError("in.h5", "Vx: trajectory 3 holds NaN")):
            back = pickle.loads(pickle.dumps(error))
            assert type(back) is type(error), type(back)
            assert (back.path, back.message, str(back)) == (error.path, error.message, str(error)), back
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr


def test_a_nan_trajectory_on_a_cluster_is_left_out_as_after_a_scan_first(cluster, tmp_path: Path) -> None:
    path = _with_nan(synth_bench.write_cfd(tmp_path / "raw", n=8, frames=5, res=16), 7)
    remote = ingest_files("pdebench", [path], tmp_path / "remote",
                          IngestOptions(**OPTS, scheduler=cluster.scheduler_address))
    local = ingest_files("pdebench", [path], tmp_path / "local", IngestOptions(**OPTS), check_finite=True)
    assert [s["what"] for s in remote["datasets"][0]["skipped"]] == [f"{path.name}#7"]
    assert _digests(remote) == _digests(local)
