"""`launch --model fno-tiny` / `--model unet-tiny` (2D, and FNO on 3D data) on 2 CPU processes, the launcher
SIGKILLed mid-run and resumed: the final weights (UNet's BatchNorm statistics included), optimiser state and loss log
equal an uninterrupted run's bit for bit, as for DPOT (same stream, loss, noise, DDP and checkpoints); `evaluate`
reads the checkpoint."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest
import torch

from dpot_train.core.checkpoint import list_checkpoints
from tests import train_runs
from tests.test_model_baselines import shards_3d  # noqa: F401  (a fixture)

STEPS = 24
KILL_AT = 2  # the first checkpoint: the kill must land before the last of the STEPS - KILL_AT remaining steps


def _args(data: dict[str, Path], out: Path, preset: str, *extra: str) -> list[str]:
    config = ("--config", str(data["config"])) if "config" in data else ()
    return train_runs.launch_args(data["shards"], out, "--model", preset, "--no-eval", *config, *extra, steps=STEPS)



def _kill_mid_run(args: list[str], out: Path) -> None:
    """Start the launcher, SIGKILL it once the first checkpoint exists, wait until its workers are gone."""
    workers = train_runs.kill_at_checkpoint(args, out, KILL_AT)
    end = time.monotonic() + 30
    while any(Path(f"/proc/{p}").exists() for p in workers) and time.monotonic() < end:
        time.sleep(0.05)
    steps = [s for s, _ in list_checkpoints(out / "checkpoints")]
    assert steps and max(steps) < STEPS, f"the run reached step {max(steps)} before the kill landed: {steps}"


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to follow the worker processes")
@pytest.mark.parametrize("preset, family, dims", [("fno-tiny", "fno", 2), ("unet-tiny", "unet", 2),
                                                  ("fno-tiny", "fno", 3)])
def test_baseline_killed_and_resumed_is_bitwise_identical_then_evaluates(
        request: pytest.FixtureRequest, tmp_path: Path, preset: str, family: str, dims: int) -> None:
    data = {"shards": request.getfixturevalue("fno_train_shards")} if dims == 2 else \
        request.getfixturevalue("shards_3d")  # 3D FNO: complex spectral weights through DDP, AdamW and checkpoints
    reference = tmp_path / "uninterrupted"
    r = train_runs.run(_args(data, reference, preset))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = tmp_path / "killed"
    _kill_mid_run(_args(data, out, preset), out)
    r = train_runs.run(_args({"shards": data["shards"]}, out, preset, "--resume"))  # settings from its config.yaml
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints'}" in r.stdout + r.stderr

    final = f"step-{STEPS:08d}.pt"
    a = torch.load(reference / "checkpoints" / final, weights_only=True)
    b = torch.load(out / "checkpoints" / final, weights_only=True)
    assert a["config"]["family"] == family and a["config"]["n_dim"] == dims
    assert all(train_runs.states_equal(a[k], b[k]) for k in ("model", "optimizer", "rng"))
    assert a["scheduler"] == b["scheduler"] and a["loader"] == b["loader"]
    if family == "unet":  # the BatchNorm statistics moved in training and are part of the resumed state
        assert a["model"]["encoder1.enc1norm1.num_batches_tracked"].item() == STEPS
    la = [json.loads(x) for x in (reference / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["loss"] for x in la] == [x["loss"] for x in lb]

    result = train_runs.run([sys.executable, "-m", "dpot_train", "evaluate", str(out / "checkpoints" / final),
                             "--manifest", str(data["shards"]), "--rollout-steps", "2", "--device", "cpu",
                             "--out", str(tmp_path / "eval.json")])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    evaluated = json.loads((tmp_path / "eval.json").read_text())
    assert {k: evaluated["network"][k] for k in ("family", "size")} == {"family": family, "size": preset}
    (scores,) = evaluated["datasets"].values()
    assert scores["rollout_steps"] == 2 and 0 < scores["model"]["rollout_l2re"] < float("inf")
