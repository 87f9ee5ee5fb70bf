"""Kill-safe ingest: SIGKILL after the first shard, re-run, and the output equals an uninterrupted run's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dpot_data.ingest.journal import JOURNAL_NAME, read_lines
from dpot_data.synth.fno import write_mat_v5
from dpot_format.validate import validate_output

N, RES, FRAMES = 80, 64, 10
DPOT = [sys.executable, "-m", "dpot_data"]


def _raw(folder: Path) -> Path:
    """A small FNO v5 file of smooth travelling waves (fast to write; the reader only cares about the layout)."""
    folder.mkdir(parents=True, exist_ok=True)
    g = np.arange(RES) / RES
    xx, yy = np.meshgrid(g, g, indexing="ij")
    rng = np.random.default_rng(7)
    phase = rng.uniform(0, 2 * np.pi, size=(N, 2))
    t = np.arange(1, FRAMES + 1, dtype=np.float32)
    frames = np.stack([np.sin(2 * np.pi * (xx + 0.05 * k) + phase[:, :1, None]) *
                       np.cos(2 * np.pi * yy + phase[:, 1:, None]) for k in range(FRAMES + 1)], axis=-1)
    path = folder / f"NavierStokes_V1e-3_N{N}_T{FRAMES}.mat"
    write_mat_v5(path, frames[..., 0].astype(np.float32), frames[..., 1:].astype(np.float32), t[None, :])
    return path


def _ingest_args(raw: Path, out: Path) -> list[str]:
    return [*DPOT, "ingest", "fno", str(raw), "--out", str(out), "--resolution", "0", "--split", "0.7,0.15",
            "--shard-size", "200KiB", "--workers", "2", "--no-progress"]


def _ingest(raw: Path, out: Path, overwrite: bool = False) -> tuple[int, str]:
    """The same command as `_ingest_args`, run in this process (no interpreter start-up): exit code, output."""
    from typer.testing import CliRunner

    from dpot_data.cli import app

    args = _ingest_args(raw, out)[len(DPOT):] + (["--overwrite"] if overwrite else [])
    result = CliRunner().invoke(app, args)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def _shards(out: Path) -> dict[str, str]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {s["path"]: s["sha256"] for d in manifest["datasets"] for s in d["shards"]}


def _manifest(out: Path, drop: tuple[str, ...] = ("created",)) -> dict:
    manifest = json.loads((out / "manifest.json").read_text())
    for key in drop:
        manifest.pop(key)
    return manifest


def _journalled_shards(journal: Path) -> dict[str, str]:
    return {s["path"]: s["sha256"] for line in read_lines(journal) for s in line.get("shards", [])}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The raw file and an uninterrupted ingest of it."""
    base = tmp_path_factory.mktemp("resume")
    raw = _raw(base / "raw")
    out = base / "reference"
    code, output = _ingest(raw, out)
    assert code == 0, output
    return raw, out


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGINT], ids=["sigkill", "ctrl-c"])
def test_stopped_after_first_shard_then_rerun_gives_identical_output(reference, tmp_path: Path, stop: int) -> None:
    """A kill, or Ctrl-C (which says in one line how to go on), after the first shards: the same command again
    resumes from the shards completed, and the output is the uninterrupted one."""
    raw, ref = reference
    out = tmp_path / "out"
    # Ctrl-C as at a terminal: SIGINT handled by default in the ingest, even where this process ignores it (a
    # parallel test worker may; an ignored signal stays ignored across exec)
    proc = subprocess.Popen(_ingest_args(raw, out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    journal = out / ".staging-fno-ns-v1e-3" / JOURNAL_NAME
    deadline = time.monotonic() + 90
    # wait until shards are complete (renamed and journalled) and three of the ten blocks of 8 trajectories are
    # done, so that every split has moved past its first open shard and a resume has something to keep
    while not (_journalled_shards(journal) and sum("block" in line for line in read_lines(journal)) >= 3):
        assert proc.poll() is None, f"ingest ended before its first shard: {proc.stderr.read().decode()}"
        assert time.monotonic() < deadline, "no shard appeared within 90 s"
        time.sleep(0.005)
    os.kill(proc.pid, stop)
    err = proc.communicate(timeout=60)[1].decode()
    if stop == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 130, err
        said = [ln for ln in err.splitlines() if not ln.startswith("warning:")]
        assert said == [f"interrupted: nothing was published in {out}; run the same command again to resume from "
                        "the shards already completed"], err
    # nothing under a final name yet: no manifest, no published shards; the staged ones are journalled
    assert not (out / "manifest.json").exists()
    assert not (out / "shards").exists()
    kept = _journalled_shards(journal)
    assert 1 <= len(kept) < len(_shards(ref))
    staged = out / ".staging-fno-ns-v1e-3"
    mtimes = {p: (staged / p).stat().st_mtime_ns for p in kept}

    code, output = _ingest(raw, out)
    assert code == 0, output
    assert "resumed an interrupted ingest" in output, output
    assert _shards(out) == _shards(ref)
    for path, digest in kept.items():  # shards complete before the kill were kept, not written again
        assert _shards(out)[path] == digest
        assert (out / path).stat().st_mtime_ns == mtimes[path]
    # the command line recorded names the other output folder; everything else is the same
    assert _manifest(out, ("created", "command")) == _manifest(ref, ("created", "command"))
    assert not any(p.name.startswith(".staging-") for p in out.iterdir())
    assert validate_output(str(out)) == []  # every shard and Zarr array on disk matches the manifest


def test_complete_output_is_left_alone_and_overwrite_is_deterministic(reference, tmp_path: Path) -> None:
    raw, ref = reference
    out = tmp_path / "out"
    assert _ingest(raw, out)[0] == 0
    before = (out / "manifest.json").read_bytes()
    code, output = _ingest(raw, out)
    assert code == 0
    assert f"{out}: already holds a complete manifest; left alone (use --overwrite to replace it)" in output
    assert (out / "manifest.json").read_bytes() == before
    assert _ingest(raw, out, overwrite=True)[0] == 0
    # the same inputs and options give byte-identical shards and the same manifest, except its creation time and
    # the folders the replacement moved into (the old ones stay valid until the new manifest is in place)
    moved = {p.replace("shards.1/", "shards/", 1): h for p, h in _shards(out).items()}
    assert moved == _shards(ref) and all(p.startswith("shards.1/") for p in _shards(out))
    first = json.loads(before)
    first.pop("created")
    second = _manifest(out)
    assert second["datasets"][0]["zarr"]["path"] == "data.1.zarr"
    for entry in second["datasets"]:
        entry["zarr"]["path"] = "data.zarr"
        entry["shards"] = [{**s, "path": s["path"].replace("shards.1/", "shards/", 1)} for s in entry["shards"]]
        entry["shard_index"]["path"] = entry["shard_index"]["path"].replace("shards.1/", "shards/", 1)  # moved too
    assert second == first
    assert sorted(p.name for p in out.iterdir()) == ["data.1.zarr", "manifest.json", "shards.1"]
    assert validate_output(str(out)) == []


# ------------------------------------------------------------------------------------------ the journal on its own

def _shard(split: str, k: int, samples: int) -> dict:
    return {"path": f"shards/d/{split}-{k:06d}.tar", "split": split, "sha256": "0" * 64, "bytes": 10,
            "samples": samples}


def test_resume_point_is_the_block_of_the_first_row_missing_from_completed_shards() -> None:
    from dpot_data.ingest.journal import ResumePoint, resume_point

    #       rows: 0 1 2 3 4 5 6 7 ; blocks of two rows: (0,1) (2,3) (4,5) (6,7)
    splits = ["train", "test", "train", "train", "train", "test", "train", "train"]
    rows = [2, 4, 6, 8]
    lines = [
        {"job": "x"},
        {"block": 0, "rows": 2, "shards": [], "stats": None},
        {"block": 1, "rows": 4, "shards": [_shard("train", 0, 2)], "stats": {"after": 1}},
        {"block": 2, "rows": 6, "shards": [_shard("train", 1, 2)], "stats": {"after": 2}},
    ]
    point = resume_point(lines, splits, rows)
    # test row 1 is in no completed shard: resume at block 0, a fresh start that keeps nothing
    assert point == ResumePoint()
    splits[1] = "train"  # now rows 0..4 (five train rows) hold train shards of 2+2 rows; row 4 is the first missing
    lines[3]["shards"] = [_shard("train", 1, 2)]
    point = resume_point(lines, splits, rows)
    assert (point.block, point.row, point.stats) == (2, 4, {"after": 1})
    assert [s["path"] for s in point.shards["train"]] == ["shards/d/train-000000.tar", "shards/d/train-000001.tar"]
    assert point.kept_samples("train") == 4 and point.kept_samples("test") == 0


def test_journal_lines_cut_by_a_kill_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_bytes(b'{"job": "a"}\n{"block": 0, "rows": 1}\n{"block": 1, "ro')
    assert read_lines(path) == [{"job": "a"}, {"block": 0, "rows": 1}]


def test_stats_survive_the_journal_exactly() -> None:
    from dpot_data.ingest.journal import stats_from_json, stats_to_json
    from dpot_data.stats import block_stats

    rng = np.random.default_rng(0)
    s = block_stats(rng.normal(size=(3, 4, 2, 5, 5)).astype(np.float32) * 1e3, np.ones((3, 5, 5), np.uint8), [1, 1])
    back = stats_from_json(json.loads(json.dumps(stats_to_json(s))))
    for a, b in ((s.values, back.values), (s.diffs, back.diffs)):
        for field_name in ("count", "mean", "m2", "min", "max"):
            np.testing.assert_array_equal(getattr(a, field_name), getattr(b, field_name))
    assert back.trajectories == 3


def test_a_second_ingest_into_the_same_folder_is_refused_while_one_runs(tmp_path: Path) -> None:
    from dpot_data.ingest.journal import Journal, JournalBusy

    first = Journal.open(tmp_path, "d", "job", ["train"], [1])
    try:
        with pytest.raises(JournalBusy, match="another ingest of this dataset is running"):
            Journal.open(tmp_path, "d", "job", ["train"], [1])
    finally:
        first.close()
    Journal.open(tmp_path, "d", "job", ["train"], [1]).close()


def test_a_different_job_starts_afresh(tmp_path: Path) -> None:
    from dpot_data.ingest.journal import Journal

    j = Journal.open(tmp_path, "d", "job-a", ["train", "train"], [1, 2])
    (j.staging / "shards").mkdir()
    j.record(0, 1, None, {})
    j.close()
    k = Journal.open(tmp_path, "d", "job-b", ["train", "train"], [1, 2])
    assert not k.resumed and not (k.staging / "shards").exists()
    assert read_lines(k.staging / JOURNAL_NAME) == [{"dataset": "d", "format": 1, "job": "job-b"}]
    k.close()


def test_zarr_only_ingest_resumes_after_the_last_journalled_block() -> None:
    from dpot_data.ingest.journal import resume_point

    lines = [{"job": "x"}, {"block": 0, "rows": 2, "shards": [], "stats": {"n": 0}},
             {"block": 1, "rows": 4, "shards": [], "stats": {"n": 1}}]
    splits = ["train", "test", "train", "train", "train", "test"]
    assert resume_point(lines, splits, [2, 4, 6]).block == 0  # with shards: test row 1 is in no completed shard
    point = resume_point(lines, splits, [2, 4, 6], shards_written=False)
    assert (point.block, point.row, point.stats) == (2, 4, {"n": 1})


def test_staging_of_a_running_ingest_of_another_dataset_is_not_removed(tmp_path: Path) -> None:
    from dpot_data.ingest.journal import Journal

    other = Journal.open(tmp_path, "other", "job", ["train"], [1])
    stale = tmp_path / ".staging-stale"  # a killed ingest's: its journal, no live lock
    stale.mkdir()
    (stale / JOURNAL_NAME).write_bytes(b'{"job":"old"}\n')
    (stale / "junk").write_bytes(b"x")
    users = tmp_path / ".staging-notes"  # the user's own folder of that name: no journal, no lock
    users.mkdir()
    (users / "a.txt").write_bytes(b"keep")
    try:
        mine = Journal.open(tmp_path, "mine", "job", ["train"], [1])
        mine.close()
        assert other.staging.is_dir() and (other.staging / JOURNAL_NAME).is_file()
        assert not stale.exists()
        assert (users / "a.txt").read_bytes() == b"keep"
    finally:
        other.close()


class _Interrupt(BaseException):
    """A crash as the ingest meets it: an interruption (as Ctrl-C, not an Exception), which keeps the staged part."""


@pytest.mark.parametrize("crash_points", [(1,), (2, 1, 3, 1, 2)])
def test_repeated_interruptions_at_block_boundaries_still_give_identical_output(reference, tmp_path, monkeypatch,
                                                                               crash_points):
    """Crashes in a row, each after a given number of finished blocks (after one block the resume point falls back
    to a fresh start, which must then keep nothing), then a complete run: the same shards, arrays and manifest as
    without crashes, and the files on disk match the manifest."""
    import dpot_data.ingest.journal as jn
    from dpot_data.ingest import IngestOptions, run_ingest

    raw, _ = reference
    opts = IngestOptions(resolution=None, split=(0.7, 0.15), shard_size=200 << 10, workers=2, command="test")
    clean = run_ingest("fno", [raw], tmp_path / "clean", opts).manifest
    out = tmp_path / "out"
    original = jn.Journal.record
    crashes = 0
    for crash_after in crash_points:
        calls = {"n": 0}

        def record(self, *args, _limit=crash_after, _calls=calls, **kwargs):
            original(self, *args, **kwargs)
            _calls["n"] += 1
            if _calls["n"] >= _limit:
                raise _Interrupt(f"crash after {_limit} blocks")

        monkeypatch.setattr(jn.Journal, "record", record)
        try:
            run_ingest("fno", [raw], out, opts)
        except _Interrupt:
            crashes += 1
            assert not (out / "manifest.json").exists()
            continue
        break
    monkeypatch.setattr(jn.Journal, "record", original)
    assert crashes >= min(len(crash_points), 3)
    if not (out / "manifest.json").exists():
        assert run_ingest("fno", [raw], out, opts).written
    done = json.loads((out / "manifest.json").read_text())
    for m in (done, clean):
        m.pop("created")
    assert json.dumps(done, sort_keys=True) == json.dumps(clean, sort_keys=True)
    assert validate_output(str(out)) == []  # and the files on disk are what the manifest says


def test_zarr_only_ingest_resumes_through_the_pipeline(reference, tmp_path, monkeypatch) -> None:
    import dpot_data.ingest.journal as jn
    from dpot_data.ingest import IngestOptions, run_ingest

    raw, _ = reference
    opts = IngestOptions(resolution=None, formats=("zarr",), workers=2, command="test")
    clean = run_ingest("fno", [raw], tmp_path / "clean", opts).manifest
    original = jn.Journal.record
    calls = {"n": 0}

    def record(self, *args, **kwargs):
        original(self, *args, **kwargs)
        calls["n"] += 1
        if calls["n"] == 4:
            raise _Interrupt("crash after 4 blocks")

    monkeypatch.setattr(jn.Journal, "record", record)
    with pytest.raises(_Interrupt):
        run_ingest("fno", [raw], tmp_path / "out", opts)
    monkeypatch.setattr(jn.Journal, "record", original)
    outcome = run_ingest("fno", [raw], tmp_path / "out", opts)
    assert any("resumed an interrupted ingest at trajectory 32 (block 4)" in n for n in outcome.notes), outcome.notes
    done = outcome.manifest
    for m in (done, clean):
        m.pop("created")
    assert done == clean and validate_output(str(tmp_path / "out")) == []
