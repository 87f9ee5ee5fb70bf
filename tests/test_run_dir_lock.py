"""RUN_DIR is held by one launch at a time: a second launch or a --resume beside a live run is refused in one line
naming the folder and the holder, and the lock lasts through torchrun, which launch runs in its own process."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from dpot_format.lock import is_held
from dpot_train.run.launch import RUN_LOCK
from tests import train_runs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _in_torchrun(port: int) -> bool:
    """torchrun is waiting in its rendezvous: its store listens on the endpoint's port. launch runs torchrun in its
    own process once RUN_DIR's files are written (config.yaml, plan.json, launch.json), holding the lock through it."""
    with socket.socket() as s:
        s.settimeout(1.0)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _wait_held(lock: Path, first: subprocess.Popen[str], port: int, timeout: float = 120) -> None:
    """Until the first launch holds the lock and is waiting in torchrun's rendezvous for a node that never comes."""
    deadline = time.monotonic() + timeout
    while not (is_held(lock) and _in_torchrun(port)):
        assert first.poll() is None, first.communicate()
        assert time.monotonic() < deadline, "the first launch never took the RUN_DIR lock"
        time.sleep(0.2)


def test_two_launches_into_one_out_the_second_refused(fno_train_shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    # the first launch is node 0 of 2: torchrun waits for the second node, holding RUN_DIR meanwhile
    port = _free_port()
    first = subprocess.Popen(train_runs.launch_args(fno_train_shards, out, "--nnodes", "2", "--rdzv-endpoint",
                                                    f"127.0.0.1:{port}", "--rdzv-timeout", "300", nproc=1),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=train_runs.env(),
                             cwd=train_runs.ROOT, start_new_session=True)
    try:
        _wait_held(out / RUN_LOCK, first, port)
        before = sorted(p.name for p in out.iterdir())
        for extra in ((), ("--resume",), ("--dry-run",)):
            r = train_runs.run(train_runs.launch_args(fno_train_shards, out, *extra, nproc=1))
            assert r.returncode == 2, r.stderr[-3000:]
            lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
            assert len(lines) == 1, r.stderr
            assert lines[0].startswith(f"error: {out}: another launch is running in this run folder (pid "
                                       f"{first.pid} on host {socket.gethostname()}"), lines
            assert "dpot_train.run.torchrun" not in r.stderr
        assert sorted(p.name for p in out.iterdir()) == before  # nothing rewritten beside the live run
        assert first.poll() is None
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
    assert not is_held(out / RUN_LOCK)  # released with its holder: the next launch takes it
    r = train_runs.run(train_runs.launch_args(fno_train_shards, out, "--dry-run", nproc=1))
    assert r.returncode == 0, r.stderr[-3000:]
