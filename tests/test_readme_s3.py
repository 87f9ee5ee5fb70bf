"""The README's "Try object storage locally" block, run verbatim in a fresh folder on a free port: a local S3 server,
an ingest into a bucket, a training run from it; the server is stopped however the block ends."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_readme_path import README, bash_blocks

SECTION = "Try object storage locally"


def _block() -> str:
    blocks = bash_blocks(README.read_text(encoding="utf-8"), SECTION)
    assert len(blocks) == 1, f"README.md, {SECTION!r}: expected one bash block, found {len(blocks)}"
    return blocks[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group is still running (zombies waiting for their reaper do not count)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":  # fields: state, ppid, pgrp, ...
            return True
    return False


def _run(script: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """Run `script` with `set -euo pipefail` in its own process group on a free PORT, `.venv` as in a checkout;
    afterwards wait (bounded) for the group to be empty, then kill whatever is left of it."""
    (cwd / ".venv").symlink_to(Path(sys.executable).parent.parent)
    env = {**os.environ, "PORT": str(_free_port()), "MPLBACKEND": "Agg", "COLUMNS": "160"}
    for key in ("FSSPEC_S3_ENDPOINT_URL", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "DPOT_CACHE_DIR"):
        env.pop(key, None)
    proc = subprocess.Popen(["bash", "-c", "set -euo pipefail\n" + script], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
        deadline = time.monotonic() + 30  # the block's kill is asynchronous: the server may take a moment to exit
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = _group_alive(proc.pid)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    assert not left, "the local S3 server outlived the README block"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


def test_the_block_starts_a_server_fills_a_bucket_and_trains_from_it() -> None:
    block = _block()
    for step in ("moto_server", "trap ", "FSSPEC_S3_ENDPOINT_URL=", "AWS_ACCESS_KEY_ID=", "mkdir('dpot-demo')",
                 "--out s3://dpot-demo/shards", "launch --manifest s3://dpot-demo/shards", "kill $S3_SERVER"):
        assert step in block, f"the README block lost its {step!r} step"
    headings = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith("## ")]
    assert headings[headings.index(f"## {SECTION}") + 1] == "## Evaluate and compare"


def test_the_server_is_stopped_when_the_block_fails(tmp_path: Path) -> None:
    lines = _block().splitlines()
    upto = next(i for i, line in enumerate(lines) if "mkdir('dpot-demo')" in line)  # the server is up and used
    r = _run("\n".join(lines[:upto + 1]) + "\nfalse  # a step of the block fails\n", tmp_path, timeout=120)
    assert r.returncode == 1, r.stdout[-3000:]


@pytest.mark.slow
def test_readme_s3_block_runs_verbatim(tmp_path: Path) -> None:
    r = _run(_block(), tmp_path, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:]
    assert "Traceback" not in r.stdout, r.stdout[-4000:]
    assert "wrote s3://dpot-demo/shards/manifest.json" in r.stdout  # the ingest went to the bucket
    assert "OK: " in r.stdout and "match the manifest" in r.stdout  # and verify read every shard back from it
    run = tmp_path / "run-s3"
    assert (run / "checkpoints" / "step-00000010.pt").is_file() and (run / "eval.json").is_file()
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps and max(steps) == 10
    cached = list((run / "shard-cache" / "data").glob("*.tar"))
    assert cached, "the run read no shard from the bucket"  # entries named by the manifest's sha256 of each shard
    assert "s3://dpot-demo/shards" in (run / "config.yaml").read_text()
