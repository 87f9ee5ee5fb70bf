"""3D end to end, as a user runs it: synth PDEBench 3D -> ingest at the native grid -> `launch --init <released 2D
checkpoint> --load blocks,time_agg --res 16` on 2 processes -> SIGKILL -> `--resume` equals an uninterrupted run bit
for bit -> `evaluate` writes the 3D rollout L2RE."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from dpot_train.core.checkpoint import list_checkpoints
from tests import train_runs

STEPS, BATCH, T_IN = 12, 4, 3


@pytest.fixture(scope="module")
def setup_3d(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """3D shards at their native 12^3 grid (6 trajectories of 6 frames: 4 train, 2 test), a released-format 2D
    tiny checkpoint ({"model": state_dict}, T_IN input frames) and a run config with t_in = T_IN."""
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.pdebench import write_cfd
    from dpot_train.model import build_model

    base = tmp_path_factory.mktemp("e2e3d")  # what `dpot-data synth pdebench-cfd3d` and `ingest --resolution 0` do
    raw = write_cfd(base / "raw", dims=3, m=1.0, eta=1e-8, kind="Rand", n=6, frames=6, res=12, seed=0)
    ingest_files("pdebench", [raw], base / "s3d", IngestOptions(resolution=None, split=(0.6, 0.0), seed=0))
    torch.manual_seed(7)
    ckpt = base / "released_2d.pth"
    torch.save({"model": build_model("tiny", img_size=32, in_timesteps=T_IN).state_dict()}, ckpt)
    config = base / "t_in.yaml"
    config.write_text(f"data:\n  t_in: {T_IN}\n  t_out: 1\n", encoding="utf-8")
    return {"shards": base / "s3d", "ckpt": ckpt, "config": config, "base": base}


def _args(s: dict[str, Path], out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dpot_train", "launch", "--config", str(s["config"]), "--manifest", str(s["shards"]),
            "--init", str(s["ckpt"]), "--load", "blocks,time_agg", "--res", "16", "--out", str(out),
            "--steps", str(STEPS), "--batch-size", str(BATCH), "--nproc-per-node", "2", "--ckpt-every", "2",
            "--log-every", "4", "--no-progress", "--device", "cpu", "--no-eval", *extra]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc to follow the worker processes")
def test_3d_finetune_from_2d_killed_and_resumed_is_bitwise_identical_then_evaluates(setup_3d) -> None:
    s = setup_3d
    reference = s["base"] / "uninterrupted"
    r = train_runs.run(_args(s, reference))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    init_line = next(ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("--init "))
    assert "(2D -> 3D transfer): loaded blocks, time_agg; fresh: patch_embed (not requested), pos (not " \
           "requested)" in init_line

    out = s["base"] / "killed"
    train_runs.kill_at_checkpoint(_args(s, out), out, 4)
    done = [step for step, _ in list_checkpoints(out / "checkpoints")]
    assert done and max(done) < STEPS, done
    r = train_runs.run([sys.executable, "-m", "dpot_train", "launch", "--out", str(out), "--resume", "--no-progress"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "resumed from" in r.stdout + r.stderr

    final = f"step-{STEPS:08d}.pt"
    a = torch.load(reference / "checkpoints" / final, weights_only=True)
    b = torch.load(out / "checkpoints" / final, weights_only=True)
    assert a["config"]["spatial_dims"] == 3 and a["config"]["img_size"] == 16 and a["config"]["in_channels"] == 5
    assert a["model"]["blocks.0.mlp.0.weight"].ndim == 5
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    for k, v in a["optimizer"]["state"].items():
        for name, t in v.items():
            assert torch.equal(t, b["optimizer"]["state"][k][name]), (k, name)
    assert a["scheduler"] == b["scheduler"] and a["loader"] == b["loader"]
    la = [json.loads(x)["loss"] for x in (reference / "metrics.jsonl").read_text().splitlines()]
    lb = [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(la) == STEPS and la == lb

    eval_json = s["base"] / "eval.json"
    r = train_runs.run([sys.executable, "-m", "dpot_train", "evaluate", str(out / "checkpoints" / final),
                        "--manifest", str(s["shards"]), "--out", str(eval_json), "--device", "cpu"])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    result = json.loads(eval_json.read_text())
    assert result["recipe"] == "reference"  # fine-tuned from released weights: the reference's evaluation
    (name, scores), = result["datasets"].items()
    assert name.startswith("pdebench-cfd3d") and scores["trajectories"] == 2 and scores["rollout_steps"] == 6 - T_IN
    assert 0 < scores["model"]["rollout_l2re"] < 10 and 0 < scores["persistence"]["rollout_l2re"] < 10
