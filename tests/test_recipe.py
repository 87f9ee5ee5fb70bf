"""The training/evaluation recipe: `reference` by default for released weights, and released weights refused on
shards of another convention than dpot-reference unless the user says so."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from dpot_data.ingest import IngestOptions, ingest_files
from dpot_data.synth.fno import synth_fno
from dpot_train.data.windows import inject_noise
from dpot_train.evaluation.evaluate import evaluate_checkpoint
from tests import train_runs

RELEASED = Path(__file__).resolve().parent / "golden" / "dpot_small.pth"  # released format, 32x32, 4 channels


@pytest.fixture(scope="module")
def canonical_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("canonical")
    files = synth_fno(base / "raw", n=8, frames=12, viscosity=1e-3, seed=1, resolution=32)
    out = base / "shards"
    ingest_files("fno", [files[0]], out, IngestOptions(resolution=32, split=(0.75,), convention="canonical"))
    return out


def test_released_weights_are_evaluated_with_the_reference_recipe(fno_train_shards: Path) -> None:
    result = evaluate_checkpoint(str(RELEASED), [str(fno_train_shards)], rollout_steps=2, device="cpu")
    assert result["recipe"] == "reference"
    scores = result["datasets"]["fno-ns-v1e-3"]
    assert set(scores["model"]) == {"rollout_l2re", "step_l2re"} and scores["rollout_steps"] == 2
    dpot = evaluate_checkpoint(str(RELEASED), [str(fno_train_shards)], rollout_steps=2, device="cpu", recipe="dpot")
    assert dpot["recipe"] == "dpot" and set(dpot["datasets"]["fno-ns-v1e-3"]["model"]) == {
        "one_step_l2re", "rollout_l2re", "l2re_per_step", "frame_l2re_per_step", "one_step_nrmse", "channels",
        "blowup_fraction_per_step"}  # dpot-eval/3


@pytest.mark.slow
def test_released_weights_on_another_convention_are_refused(canonical_shards: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"follows the 'canonical' convention.*--allow-convention-mismatch"):
        evaluate_checkpoint(str(RELEASED), [str(canonical_shards)], device="cpu")
    ok = evaluate_checkpoint(str(RELEASED), [str(canonical_shards)], rollout_steps=1, device="cpu",
                             allow_convention_mismatch=True)
    assert ok["recipe"] == "reference"  # released weights that record no recipe: the paper's metric
    r = train_runs.run(train_runs.launch_args(canonical_shards, tmp_path / "ft", "--init", str(RELEASED),
                                              "--dry-run", nproc=1))
    assert r.returncode == 2 and "follows the 'canonical' convention" in r.stderr, r.stderr[-2000:]
    r = train_runs.run(train_runs.launch_args(canonical_shards, tmp_path / "ft", "--init", str(RELEASED),
                                              "--allow-convention-mismatch", "--dry-run", nproc=1))
    assert r.returncode == 0, r.stderr[-2000:]
    assert yaml.safe_load(r.stdout)["recipe"] == "reference"  # the run config --dry-run prints


def test_recipe_defaults_to_dpot_from_scratch(fno_train_shards: Path, tmp_path: Path) -> None:
    r = train_runs.run(train_runs.launch_args(fno_train_shards, tmp_path / "run", "--dry-run", nproc=1))
    assert r.returncode == 0, r.stderr[-2000:]
    assert yaml.safe_load(r.stdout)["recipe"] == "dpot"  # the run config --dry-run prints
    assert not (tmp_path / "run").exists()  # and writes nothing


def test_reference_noise_touches_padded_channels_and_ours_does_not() -> None:
    x = torch.ones(2, 8, 8, 3, 4)
    cv = torch.tensor([[True, False, False, False]] * 2)
    mask = torch.ones(2, 8, 8, dtype=torch.bool)
    positions = torch.tensor([0, 1])
    ours = inject_noise(x, 0.1, positions, 0, mask, cv)
    reference = inject_noise(x, 0.1, positions, 0)
    assert torch.equal(ours[..., 1:], x[..., 1:]) and not torch.equal(ours[..., 0], x[..., 0])
    assert not torch.equal(reference[..., 1:], x[..., 1:])
    torch.testing.assert_close(reference[..., 0], ours[..., 0])  # the same draws on the data channel
