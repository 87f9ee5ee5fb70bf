"""Helpers for the training tests: run `dpot-train launch` as a user would, and share one uninterrupted run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# One small 2-process run shared by the audit (test_train_ddp) and the resume test (test_train_resume).
STEPS = 24
BATCH = 4
NPROC = 2


# what `launch` says on stderr besides errors: the echoed torchrun command and torchrun's banner, what the run
# normalises, and what the record of verified shards saved (its note depends on which tests ran before)
_SAID = ("normalise: ", "note: sha256 of", "Setting OMP_NUM_THREADS", "*")


def error_lines(text: str) -> list[str]:
    """A launch's stderr without what it says besides errors (_SAID)."""
    return [ln for ln in text.splitlines() if ln.strip() and " -m dpot_train.run.torchrun " not in ln
            and not ln.startswith(_SAID)]


def launch_args(shards: Path, out: Path, *extra: str, steps: int = STEPS, nproc: int = NPROC) -> list[str]:
    """`python -m dpot_train launch ...` for the small test runs (32x32 tiny model, checkpoint every 2 steps)."""
    return [sys.executable, "-m", "dpot_train", "launch", "--manifest", str(shards), "--out", str(out),
            "--steps", str(steps), "--batch-size", str(BATCH), "--nproc-per-node", str(nproc), "--ckpt-every", "2",
            "--log-every", "5", "--no-progress", "--device", "cpu", *extra]


def env() -> dict[str, str]:
    """Same thread count in every run, so that runs are comparable bit for bit."""
    e = dict(os.environ)
    e["OMP_NUM_THREADS"] = "1"
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    return e


def run(args: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run to completion, capturing output."""
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env(), cwd=ROOT)


_CACHE: dict[str, Path] = {}


def uninterrupted_run(shards: Path, base: Path) -> Path:
    """A 2-process run of STEPS steps with --audit (made once per session)."""
    key = str(shards)
    if key not in _CACHE:
        out = base / "uninterrupted"
        r = run(launch_args(shards, out, "--audit"))
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        _CACHE[key] = out
    return _CACHE[key]


def kill_at_checkpoint(args: list[str], out: Path, step: int, timeout: float = 180) -> list[int]:
    """Start a launch (`args`, its RUN_DIR `out`) and SIGKILL it, with no cleanup as a preempted job, once its
    checkpoint of `step` exists; the pids its workers had. Fails if the run ends first or no checkpoint appears."""
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), cwd=ROOT)
    target = out / "checkpoints" / f"step-{step:08d}.pt"
    deadline = time.monotonic() + timeout
    workers: list[int] = []
    while not target.exists():
        assert proc.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint appeared"
        workers = child_pids(proc.pid) or workers
        time.sleep(0.01)
    workers = child_pids(proc.pid) or workers
    os.kill(proc.pid, signal.SIGKILL)  # launch runs torchrun in its own process: the whole launcher, no cleanup
    proc.wait()
    return workers


def child_pids(pid: int) -> list[int]:
    """Direct children of a process (Linux /proc)."""
    out: list[int] = []
    task_dir = Path(f"/proc/{pid}/task")
    for task in task_dir.iterdir() if task_dir.exists() else []:
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def states_equal(a: object, b: object) -> bool:
    """Bitwise equality of two checkpoint states (tensors with their dtypes, nested dicts, lists and plain values)."""
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(states_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(states_equal(x, y) for x, y in zip(a, b))
    return a == b
