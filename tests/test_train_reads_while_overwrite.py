"""`dpot-data ingest --overwrite` into an output a training reads refuses in one line and changes nothing, instead of
deleting the shards the training reads (which then died 40 steps later with a traceback)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpot_data.cli import app as data_app
from dpot_format.readers import READERS_LOCK, ReadersBusy, exclusive, hold_shared
from tests import train_runs


def _overwrite_args(raw: Path, out: Path) -> list[str]:
    return ["ingest", "fno", str(raw), "--out", str(out), "--resolution", "32", "--split", "0.75,0.125",
            "--overwrite", "--no-progress"]


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()
            and p.name != READERS_LOCK and not p.relative_to(out).parts[0].startswith(".staging")}


@pytest.fixture()
def output(fno_train_shards: Path, tmp_path: Path) -> tuple[Path, Path]:
    """The raw FNO file and a private copy of the session's training output made from it."""
    out = tmp_path / "shards"
    shutil.copytree(fno_train_shards, out)
    raw = sorted((fno_train_shards.parent / "raw").glob("NavierStokes_*.mat"))[0]
    return raw, out


def test_the_readers_lock_is_shared_between_readers_and_exclusive_for_a_publish(tmp_path: Path) -> None:
    a, b = hold_shared(tmp_path), hold_shared(tmp_path)
    assert a is not None and b is not None
    with pytest.raises(ReadersBusy, match="a training is reading this output"):
        with exclusive(tmp_path):
            pass
    os.close(a)
    os.close(b)
    with exclusive(tmp_path):
        with pytest.raises(ReadersBusy, match="an ingest is publishing into this output"):
            hold_shared(tmp_path, wait_s=0.2)
    assert not (tmp_path / READERS_LOCK).exists()  # a publish leaves no lock file behind
    fd = hold_shared(tmp_path)
    assert fd is not None
    os.close(fd)


def test_overwrite_while_a_reader_holds_the_output_is_refused_and_changes_nothing(output: tuple[Path, Path]) -> None:
    raw, out = output
    before = _files(out)
    fd = hold_shared(out)
    assert fd is not None
    try:
        result = CliRunner().invoke(data_app, _overwrite_args(raw, out))
    finally:
        os.close(fd)
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip() and not ln.startswith("warning:")]
    assert len(lines) == 1 and "a training is reading this output" in lines[0], result.output
    assert "--overwrite would delete the files it reads" in lines[0] and "Traceback" not in result.output
    assert _files(out) == before
    result = CliRunner().invoke(data_app, _overwrite_args(raw, out))  # the training has ended: it goes through
    assert result.exit_code == 0, result.output
    assert json.loads((out / "manifest.json").read_text())["datasets"][0]["name"] == "fno-ns-v1e-3"


@pytest.mark.slow
def test_a_running_training_keeps_its_output_through_an_overwrite(output: tuple[Path, Path], tmp_path: Path) -> None:
    raw, out = output
    run = tmp_path / "run"
    args = train_runs.launch_args(out, run, "--no-eval", "--ckpt-every", "1000", steps=100000, nproc=1)
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=train_runs.env(),
                            cwd=train_runs.ROOT)
    try:
        deadline = time.monotonic() + 120
        while not (run / "metrics.jsonl").exists():  # the workers are training
            assert proc.poll() is None, "the training ended early"
            assert time.monotonic() < deadline, "the training did not start"
            time.sleep(0.2)
        before = _files(out)
        result = subprocess.run([sys.executable, "-m", "dpot_data", *_overwrite_args(raw, out)],
                                capture_output=True, text=True, timeout=240, env=train_runs.env(), cwd=train_runs.ROOT)
        assert result.returncode == 2 and "a training is reading this output" in result.stderr, result.stderr
        assert _files(out) == before
        assert proc.poll() is None  # still training
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


@pytest.mark.parametrize("command", ["evaluate", "preview"])
def test_an_overwrite_while_evaluate_or_preview_reads_is_refused(output: tuple[Path, Path], tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    import numpy as np

    from dpot_train.evaluation import evaluate
    from dpot_train import preview
    from dpot_train.cli import app as train_app

    raw, out = output
    before = _files(out)
    during: list[object] = []

    def overwrite_now() -> None:  # an ingest --overwrite started while the command reads the output
        during.append(CliRunner().invoke(data_app, _overwrite_args(raw, out)))

    def fake_evaluate(*args: object, **kwargs: object) -> dict[str, object]:
        overwrite_now()
        return {"split": "test", "recipe": "dpot", "datasets": {}, "normalization": {"normalize": "none", "stats": {}}}

    def fake_preview(*args: object, **kwargs: object) -> tuple[np.ndarray, np.ndarray, None]:
        overwrite_now()
        return np.zeros((2, 2, 1, 1), np.float32), np.ones((2, 2), bool), None

    monkeypatch.setattr(evaluate, "evaluate_checkpoint", fake_evaluate)
    monkeypatch.setattr(preview, "window", fake_preview)
    args = (["evaluate", "model.pth", "--manifest", str(out), "--out", str(tmp_path / "eval.json")]
            if command == "evaluate" else ["preview", "--manifest", str(out), "--out", str(tmp_path / "x.npy")])
    result = CliRunner().invoke(train_app, args)
    assert result.exit_code == 0, result.output
    refused = during[0]
    assert refused.exit_code == 2, refused.output  # type: ignore[attr-defined]
    assert "is reading this output" in refused.output  # type: ignore[attr-defined]
    assert _files(out) == before
    result = CliRunner().invoke(data_app, _overwrite_args(raw, out))  # the read has ended: it goes through
    assert result.exit_code == 0, result.output
