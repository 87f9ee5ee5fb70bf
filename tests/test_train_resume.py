"""SIGKILL the launcher mid-run, `--resume`: the final weights and optimiser state equal an uninterrupted run's, bit
for bit on CPU (2 gloo processes); the orphaned workers stop by themselves."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from dpot_train.core.checkpoint import list_checkpoints
from tests import train_runs


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        alive = [p for p in pids if Path(f"/proc/{p}").exists() and
                 Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0] != "Z"]
        if not alive:
            return []
        time.sleep(0.05)
    return alive


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to follow the worker processes")
def test_sigkill_then_resume_is_bitwise_identical(fno_train_shards: Path,
                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    reference = train_runs.uninterrupted_run(fno_train_shards, tmp_path_factory.mktemp("runs"))
    out = tmp_path_factory.mktemp("killed") / "run"
    workers = train_runs.kill_at_checkpoint(train_runs.launch_args(fno_train_shards, out), out, 6)
    assert len(workers) == 2
    assert _wait_gone(workers, 15) == [], "workers kept running after their launcher was killed"
    steps_done = [s for s, _ in list_checkpoints(out / "checkpoints")]
    assert steps_done and max(steps_done) < train_runs.STEPS, steps_done  # really interrupted mid-run
    gone = subprocess.Popen(["true"])
    gone.wait()  # a kill in the middle of a checkpoint write leaves its temporary file, named by the dead pid
    (out / "checkpoints" / f".step-{max(steps_done) + 2:08d}.pt.tmp-{gone.pid}").write_bytes(b"cut short")

    other_gpu_count = out.parent / "one-process"
    shutil.copytree(out, other_gpu_count)  # the same interrupted state, resumed below on another process count
    r = train_runs.run(train_runs.launch_args(fno_train_shards, out, "--resume"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints'}" in r.stdout + r.stderr
    assert [p.name for p in (out / "checkpoints").iterdir() if ".tmp-" in p.name] == []  # swept by the resume

    final = f"step-{train_runs.STEPS:08d}.pt"
    a = torch.load(reference / "checkpoints" / final, weights_only=True)
    b = torch.load(out / "checkpoints" / final, weights_only=True)
    assert a["model"].keys() == b["model"].keys()
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    assert train_runs.states_equal(a["optimizer"], b["optimizer"])
    assert a["scheduler"] == b["scheduler"]
    assert a["loader"] == b["loader"] == {"position": train_runs.STEPS * train_runs.BATCH, "epoch": 8,
                                          "epoch_length": 12, "global_batch": train_runs.BATCH}
    assert train_runs.states_equal(a["rng"], b["rng"])
    # the loss log of the resumed run holds every step once, with the uninterrupted run's values
    la = [json.loads(x) for x in (reference / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lb] == list(range(1, train_runs.STEPS + 1))
    assert [x["loss"] for x in la] == [x["loss"] for x in lb]

    # a change of process count (2 -> 1, same global batch) continues the same data stream: same positions,
    # and the same weights up to floating-point summation order
    r = train_runs.run(train_runs.launch_args(fno_train_shards, other_gpu_count, "--resume", nproc=1))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    c = torch.load(other_gpu_count / "checkpoints" / final, weights_only=True)
    assert c["loader"] == a["loader"]
    diff = max((a["model"][k] - c["model"][k]).abs().max().item() for k in a["model"])
    assert diff < 1e-4, diff
    lc = [json.loads(x) for x in (other_gpu_count / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lc] == list(range(1, train_runs.STEPS + 1))
    assert max(abs(x["loss"] - y["loss"]) for x, y in zip(la, lc)) < 1e-4


@pytest.mark.slow
def test_resume_refuses_changed_settings_and_fresh_start_refuses_existing_run(
        fno_train_shards: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    reference = train_runs.uninterrupted_run(fno_train_shards, tmp_path_factory.mktemp("runs"))
    r = train_runs.run(train_runs.launch_args(fno_train_shards, reference))
    assert r.returncode == 2 and "already holds checkpoints; pass --resume" in r.stderr
    r = train_runs.run(train_runs.launch_args(fno_train_shards, reference, "--resume", "--lr", "0.01"))
    assert r.returncode == 2 and "optim.lr differ from" in r.stderr
