"""A run stops in one line on every rank: a non-finite loss stops all ranks together before anything is saved, a
rank that fails reports it once while the others stay quiet, and evaluation never scores data with nothing to
score as a perfect 0."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dpot_train.core.config import DataConfig
from dpot_train.evaluation.evaluate import evaluate_model, print_table
from tests import toy_output, train_runs

TOY_ARRAYS = toy_output.toy_arrays


def _toy(root: Path, monkeypatch: pytest.MonkeyPatch, masked: bool = False, nan: bool = False) -> Path:
    """The toy output (10 trajectories of 13 frames at 16x16): every cell solid (`masked`) or the first valid
    channel NaN (`nan`) in every trajectory."""
    def damaged(n: int, frames: int, res: int) -> tuple[np.ndarray, np.ndarray]:
        fields, mask = TOY_ARRAYS(n, frames, res)
        if nan:
            fields[:, :, 0] = np.nan
        return fields, np.zeros_like(mask) if masked else mask

    monkeypatch.setattr(toy_output, "toy_arrays", damaged)
    toy_output.write_toy_output(str(root), n=10, frames=13, res=16, index=True)
    return root


@pytest.mark.parametrize("damage", ["masked", "nan"])
def test_a_non_finite_loss_stops_every_rank_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       damage: str) -> None:
    shards = _toy(tmp_path / "toy", monkeypatch, masked=damage == "masked", nan=damage == "nan")
    out = tmp_path / "run"
    r = train_runs.run(train_runs.launch_args(shards, out, "--normalize", "none", steps=4, nproc=2),  # no stats
                       timeout=240)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    lines = train_runs.error_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    why = "no fluid cell in a valid channel" if damage == "masked" else "loss nan"
    assert lines[0].startswith("error: step 1: the training loss or its gradient is not finite in dataset 'toy' "
                               "trajectory toy:"), lines
    assert f"({why})" in lines[0] and "stopped before saving that model" in lines[0]
    assert "Traceback" not in r.stderr + r.stdout
    assert not (out / "checkpoints").exists() and not (out / "eval.json").exists()
    for line in (out / "metrics.jsonl").read_text().splitlines() if (out / "metrics.jsonl").exists() else []:
        assert math.isfinite(json.loads(line)["loss"])


def test_a_rank_that_fails_is_the_only_one_that_speaks(fno_train_shards: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").write_bytes(b"")  # rank 0 cannot write its first checkpoint; rank 1 waits for it
    r = train_runs.run(train_runs.launch_args(fno_train_shards, out, "--no-eval", steps=4, nproc=2))
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    lines = train_runs.error_lines(r.stderr)
    assert len(lines) == 1 and "step-00000002.pt: the checkpoint could not be written" in lines[0], r.stderr
    assert "Traceback" not in r.stderr and "gloo" not in r.stderr


class _Last(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., -1:, :]


def test_evaluation_of_data_with_no_valid_cell_reports_null(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    shards = _toy(tmp_path / "toy", monkeypatch, masked=True)
    result = evaluate_model(_Last(), DataConfig(manifests=[str(shards)], normalize="none"), rollout_steps=2)
    r = result["datasets"]["toy"]
    for who in ("model", "persistence"):  # nothing scored: null, never 0 and never NaN
        assert r[who]["one_step_l2re"] is None and r[who]["rollout_l2re"] is None
        assert r[who]["l2re_per_step"] == [None, None] and r[who]["one_step_nrmse"] is None
    json.dumps(result, allow_nan=False)  # eval.json stays valid JSON
    assert r["unscored"] == "2 of 2 trajectories have no fluid cell in a valid channel: nothing to score, left out"
    print_table(result)
    assert "n/a" in capsys.readouterr().out
    intact = _toy(tmp_path / "intact", monkeypatch)
    r = evaluate_model(_Last(), DataConfig(manifests=[str(intact)], normalize="none"), rollout_steps=2)["datasets"]["toy"]
    assert "unscored" not in r and 0 < r["persistence"]["rollout_l2re"] < math.inf
