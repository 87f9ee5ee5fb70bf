"""An unreachable --scheduler is one line and exit code 2 after a short, configurable wait; nothing is written."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_data.ingest.scheduler import SchedulerOptions
from dpot_data.synth.fno import write_mat_v5


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_scheduler_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    raw = tmp_path / "NavierStokes_V1e-3_N4_T3.mat"
    rng = np.random.default_rng(0)
    write_mat_v5(raw, rng.standard_normal((4, 8, 8)).astype(np.float32),
                 rng.standard_normal((4, 8, 8, 3)).astype(np.float32), np.arange(1, 4, dtype=np.float32)[None])
    monkeypatch.setenv("DPOT_SCHEDULER_TIMEOUT", "1.5")
    assert SchedulerOptions(address="tcp://x:1").connect_timeout == 1.5
    address = f"tcp://127.0.0.1:{_closed_port()}"
    start = time.monotonic()
    result = CliRunner().invoke(app, ["ingest", "fno", str(raw), "--out", str(tmp_path / "out"), "--scheduler",
                                      address, "--no-progress"])
    assert time.monotonic() - start < 30
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"cannot reach the dask scheduler at {address} within 1.5 s" in lines[0], lines
    assert "Traceback" not in result.output
    assert not (tmp_path / "out" / "manifest.json").exists()
