"""Your own data trains normalised by default: `data.normalize auto` decides by the manifest's source (the paper's
sources under dpot-reference stay as stored, everything else is normalised with its manifest's train statistics,
whatever convention it records); `launch` and `open_dataset` say so in one line, `denormalize` gives the physical
units back, and the evaluation scores in physical units."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader
from typer.testing import CliRunner

from dpot_data.cli import app as data_app
from dpot_data.synth.gridded import write_user_netcdf
from dpot_train import open_dataset
from dpot_train.api import NormalizationNote
from dpot_train.cli import app as train_app
from dpot_train.core.config import DataConfig
from dpot_train.evaluation.evaluate import evaluate_model

PAPER = "fno-ns-v1e-3: none (the paper's data under dpot-reference, as the released checkpoints saw it)"


@pytest.fixture(scope="module")
def heat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The researcher's kelvin field (293 +- 3 K, a NaN obstacle) on the 32x32 grid of `fno_train_shards`, ingested
    with `dpot-data ingest xarray` as the README says: 4 train and 2 test trajectories of 12 frames."""
    base = tmp_path_factory.mktemp("heat")
    raw = write_user_netcdf(base / "raw", samples=6, frames=12, ny=32, nx=32, obstacle=4)
    result = CliRunner().invoke(data_app, ["ingest", "xarray", str(raw), "--out", str(base / "heat"), "--split",
                                           "0.67", "--resolution", "0", "--no-progress"])
    assert result.exit_code == 0, result.output
    return base / "heat"


def _temperature(manifest: Path) -> dict:
    return json.loads((manifest / "manifest.json").read_text())["datasets"][0]["stats"]["fields"]["temperature"]


def _fluid_values(items: list[dict]) -> torch.Tensor:
    """The valid channel's values on fluid cells of every item's x."""
    return torch.cat([it["x"][it["mask"]][..., 0].flatten() for it in items])


def _quiet(*args: object, **kwargs: object):  # noqa: ANN202 - open_dataset without its note
    with pytest.warns(NormalizationNote):
        return open_dataset(*args, **kwargs)


def test_own_data_is_normalised_by_default_whatever_convention_it_records(heat: Path, fno_train_shards: Path,
                                                                          tmp_path: Path) -> None:
    entry = json.loads((heat / "manifest.json").read_text())["datasets"][0]
    assert entry["source"] == "xarray" and entry["convention"]["name"] == "own-data"
    for folder in (heat, _as_recorded_before(heat, tmp_path / "old")):  # "dpot-reference", as ingest wrote it
        values = _fluid_values(list(_quiet(folder, split="train", t_in=4, t_out=1, shuffle=False)))
        assert abs(float(values.mean())) < 0.05 and abs(float(values.std()) - 1) < 0.05  # was 293 K and 3 K
    paper = list(_quiet(fno_train_shards, split="train", t_in=10, t_out=1, shuffle=False))
    stored = list(_quiet(fno_train_shards, split="train", t_in=10, t_out=1, shuffle=False, normalize="none"))
    assert all(torch.equal(a["x"], b["x"]) and torch.equal(a["y"], b["y"]) for a, b in zip(paper, stored))


def _as_recorded_before(heat: Path, out: Path) -> Path:
    """A copy of the output whose manifest records dpot-reference for the own data, as ingest did before own-data."""
    shutil.copytree(heat, out)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["datasets"][0]["convention"]["name"] = "dpot-reference"
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


def test_launch_says_in_one_line_what_it_normalises(heat: Path, fno_train_shards: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(train_app, ["launch", "--manifest", str(heat), "--manifest", str(fno_train_shards),
                                            "--model", "tiny", "--steps", "2", "--batch-size", "2", "--out",
                                            str(tmp_path / "run"), "--dry-run"])
    assert result.exit_code == 0, result.output
    t = _temperature(heat)
    line = (f"normalise: heat per channel from its manifest's train statistics (temperature mean {t['mean']:.5g} K "
            f"std {t['std']:.3g} K); {PAPER}")
    assert [ln for ln in result.stderr.splitlines() if ln.startswith("normalise:")] == [line]


def test_open_dataset_normalises_and_denormalize_gives_the_stored_values_back(heat: Path) -> None:
    t = _temperature(heat)
    with pytest.warns(NormalizationNote, match=r"^normalise: heat per channel from its manifest's train statistics "
                                               rf"\(temperature mean {t['mean']:.5g} K std {t['std']:.3g} K\)$"):
        data = open_dataset(heat, split="train", t_in=4, t_out=2, shuffle=False)
    stored = _quiet(heat, split="train", t_in=4, t_out=2, shuffle=False, normalize="none")
    assert data.norm_stats["heat"]["mean"][0] == pytest.approx(t["mean"]) and stored.norm_stats == {"heat": None}
    tolerance = 4 * torch.finfo(torch.float32).eps * 300  # float32 rounding of values around 293 K
    for a, b in zip(data, stored):
        for key in ("x", "y"):
            assert float((data.denormalize(a[key], a["dataset"]) - b[key]).abs().max()) <= tolerance
            assert float((data.denormalize(a[key], "heat") - b[key]).abs().max()) <= tolerance
    batch = next(iter(DataLoader(data, batch_size=3)))
    raw = next(iter(DataLoader(stored, batch_size=3)))
    assert float((data.denormalize(batch["y"], batch["dataset"]) - raw["y"]).abs().max()) <= tolerance


class _Persistence(torch.nn.Module):
    """A model that repeats the last input frame: in physical units its scores are the persistence baseline's."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., -1:, :]


def test_evaluation_normalises_own_data_and_scores_in_physical_units(heat: Path) -> None:
    data = DataConfig(manifests=[str(heat)], t_in=4, t_out=1)
    result = evaluate_model(_Persistence(), data, rollout_steps=3)
    assert result["normalization"]["stats"]["heat"]["mean"][0] == pytest.approx(_temperature(heat)["mean"])
    scores = result["datasets"]["heat"]
    for key in ("one_step_l2re", "rollout_l2re"):  # the model's normalised output denormalised before scoring
        assert scores["model"][key] == pytest.approx(scores["persistence"][key], rel=1e-4)
        assert 0 < scores["model"][key] < 0.05  # relative to a field of about 293 K: kelvin, not normalised units
    vrmse = [scores[who]["channels"]["temperature"]["vrmse_per_step"] for who in ("model", "persistence")]
    assert np.allclose(vrmse[0], vrmse[1], rtol=1e-3)


def test_a_runs_record_keeps_what_it_trained_on(heat: Path, tmp_path: Path) -> None:
    """A fresh decision normalises own data recorded as dpot-reference (by source); a run's recorded statistics
    that do not name it (a run from before, which trained on it as stored) keep it as stored on --resume and in
    evaluate, while an own-data entry they do not name is normalised."""
    from dpot_train.data.datasets import read_manifest
    from dpot_train.core.normalize import describe, manifest_stats, resolve

    old = read_manifest(str(_as_recorded_before(heat, tmp_path / "old")))[0]
    new = read_manifest(str(heat))[0]
    assert resolve("auto", [old]) == {"heat": manifest_stats(old)}
    assert resolve("auto", [old], {}) == {"heat": None}
    assert resolve("auto", [new], {}) == {"heat": manifest_stats(new)}
    assert describe("auto", [old], {"heat": None}, {}) == \
        "normalise: heat: none (as stored, as its run's recorded statistics say)"
