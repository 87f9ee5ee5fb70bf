"""Per-channel normalisation from the manifest's train statistics (dpot_train/core/normalize.py): the same statistics in
the training stream, the evaluation and `preview`, recorded with the checkpoints; dpot-reference data untouched; the
evaluation recipe the same for a checkpoint and its export; the fine-tune's recipe said before training."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpot_data.ingest import IngestOptions, ingest_files
from dpot_data.synth.fno import solve_fno, write_mat_v5
from dpot_train.core.checkpoint import export_released, read_checkpoint
from dpot_train.cli import app
from dpot_train.core.config import DataConfig, TrainConfig, load_config
from dpot_train.data.datasets import read_manifest
from dpot_train.data.prepare import prepare_stream
from dpot_train.data.readers import WebDatasetReader
from dpot_train.data.stream import EpochPlans, make_sample
from dpot_train.evaluation.evaluate import evaluate_checkpoint, evaluate_model
from dpot_train.train.finetune import recipe_line
from dpot_train.core.normalize import manifest_stats, normalize, denormalize, resolve
from dpot_train.preview import model_input
from dpot_train.train.run_plan import load_plan
from dpot_train.train.trainer import train
from tests import train_runs

STEPS = 40  # enough for the raw losses of the two unit systems to part ways
RELEASED = Path(__file__).resolve().parent / "golden" / "dpot_small.pth"  # released format, 32x32, 4 channels


@pytest.fixture(scope="module")
def units(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same FNO solutions ingested twice under the canonical convention: as an anomaly (vorticity around 0)
    and shifted by 300, like a temperature in kelvin (values around 300 with variations of about 0.5)."""
    base = tmp_path_factory.mktemp("units")
    a, u, t = solve_fno(8, 12, 1e-3, 1, 32)
    out = {}
    for name, offset in (("anomaly", 0.0), ("kelvin", 300.0)):
        raw = base / name / "NavierStokes_V1e-3_N8_T12.mat"
        raw.parent.mkdir()
        write_mat_v5(raw, a + offset, u + offset, t)
        out[name] = base / f"{name}-shards"
        ingest_files("fno", [raw], out[name], IngestOptions(resolution=32, split=(0.75,), convention="canonical"))
    return out


def _train(shards: Path, out: Path, normalize: str, eval_at_end: bool = False, **kw: object) -> list[float]:
    """A tiny single-process run in this process; its loss per step."""
    cfg = TrainConfig(out=str(out), model="tiny", steps=STEPS, batch_size=4, device="cpu", progress=False,
                      ckpt_every=STEPS, log_every=1, eval_at_end=eval_at_end, rollout_steps=2,
                      data=DataConfig(manifests=[str(shards)], normalize=normalize), **kw)  # type: ignore[arg-type]
    train(cfg)
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def kelvin_run(units: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run on the kelvin data with the default normalisation, evaluated at its end."""
    out = tmp_path_factory.mktemp("kelvin") / "run"
    _train(units["kelvin"], out, "auto", eval_at_end=True)
    return out


def _tail(losses: list[float]) -> float:
    return float(np.mean(losses[-5:]))


def test_kelvin_data_trains_like_its_anomaly(units: dict[str, Path], kelvin_run: Path, tmp_path: Path) -> None:
    kelvin = [json.loads(line)["loss"] for line in (kelvin_run / "metrics.jsonl").read_text().splitlines()]
    anomaly = _train(units["anomaly"], tmp_path / "anomaly", "auto")
    raw_kelvin = _train(units["kelvin"], tmp_path / "raw-kelvin", "none")
    raw_anomaly = _train(units["anomaly"], tmp_path / "raw-anomaly", "none")
    normalised, raw = _tail(kelvin) / _tail(anomaly), _tail(raw_kelvin) / _tail(raw_anomaly)
    side_by_side = f"normalised: kelvin/anomaly = {normalised:.3f}; as stored: {raw:.3f}"
    assert 0.9 < normalised < 1.1, side_by_side  # the unit system no longer matters
    # without normalisation the two runs part ways (the kelvin loss is relative to ~300, its noise scaled by it)
    assert abs(np.log(raw)) > 2 * abs(np.log(normalised)), side_by_side
    assert _tail(kelvin) < 0.9 * kelvin[0], side_by_side  # and it does learn


def test_train_eval_and_preview_apply_the_same_statistics(units: dict[str, Path], kelvin_run: Path) -> None:
    ds = read_manifest(str(units["kelvin"]))[0]
    fields = ds.entry["stats"]["fields"]["vorticity"]
    mean, std = fields["mean"], fields["std"]
    assert 299 < mean < 301 and 0.1 < std < 1
    expected = {"mean": [mean, 0.0, 0.0, 0.0], "std": [std, 1.0, 1.0, 1.0]}  # padded channels left as they are
    assert manifest_stats(ds) == expected

    # training: the stream's windows, against the stored values normalised by hand
    spec, reader = prepare_stream(DataConfig(manifests=[str(units["kelvin"])]), seed=0)
    plans, raw_reader = EpochPlans(spec), WebDatasetReader()
    for position in range(3):
        k, ref, _ = plans.lookup(position)
        sample = make_sample(spec, reader, k, ref, position)
        stored, _ = raw_reader.read(ref, sample["t0"], 11)  # (T, C, Y, X)
        by_hand = stored.copy()
        by_hand[:, 0] = (stored[:, 0] - np.float32(mean)) / np.float32(std)
        window = np.concatenate([sample["x"], sample["y"]], axis=2)  # (H, W, T, C)
        np.testing.assert_allclose(window, np.transpose(by_hand, (3, 2, 0, 1)), rtol=0, atol=1e-5)
        assert np.array_equal(window[..., 1:], np.transpose(stored[:, 1:], (3, 2, 0, 1)))  # padding: the fill 1.0
        assert abs(float(window[..., 0].mean())) < 2 and 0.2 < float(window[..., 0].std()) < 5
        # preview: exactly the same values
        expected_window = model_input(units["kelvin"], split="train", index=spec.refs[0].index(ref),
                                      start=sample["t0"], frames=11)
        np.testing.assert_array_equal(window, expected_window)

    # the run recorded the manifest's statistics with its checkpoint, and its evaluation used them
    ckpt = torch.load(kelvin_run / "checkpoints" / f"step-{STEPS:08d}.pt", weights_only=True)
    assert ckpt["train_config"]["data"]["norm_stats"] == {ds.name: expected}
    ev = json.loads((kelvin_run / "eval.json").read_text())
    assert ev["normalization"] == {"normalize": "auto", "stats": {ds.name: expected}}

    # evaluation: the model is handed the normalised window; its prediction is scored in physical units
    seen: list[torch.Tensor] = []

    class Last(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(x.clone())
            return x[..., -1:, :]

    result = evaluate_model(Last(), DataConfig(manifests=[str(units["kelvin"])]), rollout_steps=2)
    test_ref = WebDatasetReader().refs(ds, "test")[0]
    stored, _ = raw_reader.read(test_ref, 0, 10)
    first = (stored[:, 0] - np.float32(mean)) / np.float32(std)  # (T, Y, X): "xy" layout -> (X, Y, T)
    np.testing.assert_allclose(seen[0][0, ..., 0].numpy(), np.transpose(first, (2, 1, 0)), rtol=0, atol=1e-5)
    scores = result["datasets"][ds.name]
    for key in ("one_step_l2re", "rollout_l2re"):  # the last frame, denormalised: persistence itself
        assert scores["model"][key] == pytest.approx(scores["persistence"][key], rel=1e-4)
    assert scores["model"]["l2re_per_step"] == pytest.approx(scores["persistence"]["l2re_per_step"], rel=1e-4)


def test_reference_convention_data_is_unchanged_bit_for_bit(fno_train_shards: Path) -> None:
    ds = read_manifest(str(fno_train_shards))[0]
    assert ds.convention["name"] == "dpot-reference" and resolve("auto", [ds]) == {ds.name: None}
    auto, reader = prepare_stream(DataConfig(manifests=[str(fno_train_shards)]), seed=0)
    none, _ = prepare_stream(DataConfig(manifests=[str(fno_train_shards)], normalize="none"), seed=0)
    plans, raw_reader = EpochPlans(auto), WebDatasetReader()
    for position in range(3):
        k, ref, _ = plans.lookup(position)
        a, b = make_sample(auto, reader, k, ref, position), make_sample(none, reader, k, ref, position)
        stored, _ = raw_reader.read(ref, a["t0"], 11)
        assert np.array_equal(a["frames"], np.swapaxes(stored, -1, -2)) and np.array_equal(a["frames"], b["frames"])
    assert np.array_equal(model_input(fno_train_shards, index=1),
                          model_input(fno_train_shards, index=1, normalize="none"))
    evaluated = evaluate_checkpoint(str(RELEASED), [str(fno_train_shards)], rollout_steps=2, device="cpu")
    assert evaluated["normalization"] == {"normalize": "none", "stats": {ds.name: None}}
    as_auto = evaluate_checkpoint(str(RELEASED), [str(fno_train_shards)], rollout_steps=2, device="cpu",
                                  normalize="auto")
    assert as_auto["datasets"] == evaluated["datasets"]


def test_checkpoint_and_its_export_score_the_same(units: dict[str, Path], kelvin_run: Path, tmp_path: Path,
                                                  fno_train_shards: Path) -> None:
    ckpt = kelvin_run / "checkpoints" / f"step-{STEPS:08d}.pt"
    export, tensors = tmp_path / "weights.pth", tmp_path / "weights.safetensors"
    export_released(ckpt, export)
    export_released(ckpt, tensors)  # the same entries as a safetensors file (metadata beside the tensors)
    name = read_manifest(str(units["kelvin"]))[0].name
    recorded = torch.load(ckpt, weights_only=True)["train_config"]["data"]["norm_stats"]
    assert torch.load(export, weights_only=True)["normalization"] == {"normalize": "auto", "stats": recorded}
    assert torch.load(export, weights_only=True)["recipe"] == "dpot"  # the run's recipe, beside the weights
    assert read_checkpoint(tensors)["normalization"] == {"normalize": "auto", "stats": recorded}
    assert read_checkpoint(tensors)["recipe"] == "dpot"
    for shards in (units["kelvin"], fno_train_shards):
        a = evaluate_checkpoint(str(ckpt), [str(shards)], rollout_steps=2, device="cpu")
        for weights in (export, tensors):
            b = evaluate_checkpoint(str(weights), [str(shards)], rollout_steps=2, device="cpu",
                                    allow_convention_mismatch=True)  # released format on canonical data: said so
            assert a["recipe"] == b["recipe"] == "dpot"  # as trained, whichever file holds the weights
            assert a["datasets"] == b["datasets"] and a["normalization"] == b["normalization"]
    # the run's statistics, not those of a manifest ingested again with other values under the same name
    again = evaluate_checkpoint(str(export), [str(units["anomaly"])], rollout_steps=2, device="cpu",
                                allow_convention_mismatch=True)
    assert again["normalization"]["stats"] == {name: recorded[name]}
    # eval.json names the recipe and the normalisation; an explicit --recipe is obeyed
    out = tmp_path / "eval.json"
    r = CliRunner().invoke(app, ["evaluate", str(export), "--manifest", str(units["kelvin"]), "--rollout-steps", "2",
                                 "--device", "cpu", "--out", str(out), "--recipe", "reference",
                                 "--allow-convention-mismatch"])
    assert r.exit_code == 0, r.output
    written = json.loads(out.read_text())
    assert written["recipe"] == "reference" and written["normalization"]["stats"] == recorded
    assert f"normalised: {name}" in r.output
    bad = CliRunner().invoke(app, ["evaluate", str(export), "--manifest", str(units["kelvin"]), "--out", str(out),
                                   "--normalize", "zscore"])
    assert bad.exit_code == 2 and "--normalize: expected one of auto, none, manifest" in bad.output


def test_a_finetune_under_the_reference_recipe_says_so_before_training(fno_train_shards: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert recipe_line(None, "reference") is None and recipe_line(str(RELEASED), "dpot") is None
    cfg = TrainConfig(out=str(tmp_path / "ft"), init=str(RELEASED), recipe="reference", steps=1, batch_size=2,
                      device="cpu", progress=False, eval_at_end=False,
                      data=DataConfig(manifests=[str(fno_train_shards)]))
    train(cfg)
    lines = capsys.readouterr().out.splitlines()
    said = [i for i, line in enumerate(lines) if "the reference recipe" in line]
    first_step = next(i for i, line in enumerate(lines) if line.startswith("step "))
    assert len(said) == 1 and said[0] < first_step, lines
    assert "--recipe dpot" in lines[said[0]] and str(RELEASED) in lines[said[0]]


def test_statistics_are_checked_and_constant_channels_are_only_centred(fno_train_shards: Path, units: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    ds = read_manifest(str(fno_train_shards))[0]
    flat = dict(ds.entry["stats"]["fields"]["vorticity"], std=0.0)
    ds.entry = {**ds.entry, "stats": {**ds.entry["stats"], "fields": {"vorticity": flat}}}
    stats = manifest_stats(ds)
    assert stats["std"] == [1.0] * 4 and stats["mean"][0] == flat["mean"]
    x = torch.full((1, 2, 2, 1, 4), 1.0)
    torch.testing.assert_close(denormalize(normalize(x, stats), stats), x)
    assert torch.equal(normalize(x, stats)[..., 1:], x[..., 1:])
    ds.entry = {**ds.entry, "stats": None}
    with pytest.raises(ValueError, match=r"no train statistics .*--normalize none"):
        resolve("manifest", [ds])
    assert resolve("none", [ds]) == {ds.name: None}
    with pytest.raises(ValueError, match=r"data.norm_stats.fno-ns-v1e-3: expected \{mean: \[4 numbers\]"):
        resolve("auto", [ds], {ds.name: {"mean": [0.0], "std": [1.0]}})
    r = train_runs.run(train_runs.launch_args(fno_train_shards, tmp_path / "run", "--normalize", "zscore",
                                              "--dry-run", nproc=1))
    assert r.returncode == 2 and "data.normalize must be auto, none or manifest" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # a dataset to normalise without statistics: one line before torchrun, naming the manifest and the way out
    bare = tmp_path / "no-stats"
    shutil.copytree(units["kelvin"], bare)
    doc = json.loads((bare / "manifest.json").read_text())
    doc["datasets"][0]["stats"] = None
    (bare / "manifest.json").write_text(json.dumps(doc))
    r = train_runs.run(train_runs.launch_args(bare, tmp_path / "run2", "--dry-run", nproc=1))
    assert r.returncode == 2 and r.stderr.count("error:") == 1, r.stderr
    assert f"{bare / 'manifest.json'}: dataset 'fno-ns-v1e-3' has no train statistics" in r.stderr
    assert "--normalize none" in r.stderr
    assert train_runs.run(train_runs.launch_args(bare, tmp_path / "run3", "--dry-run", "--normalize", "none",
                                                 nproc=1)).returncode == 0


def test_a_resume_normalises_with_the_statistics_its_checkpoint_recorded(units: dict[str, Path],
                                                                         tmp_path: Path) -> None:
    out = tmp_path / "run"
    cfg = TrainConfig(out=str(out), model="tiny", steps=6, batch_size=4, device="cpu", progress=False,
                      ckpt_every=2, eval_at_end=False, data=DataConfig(manifests=[str(units["kelvin"])]))
    train(cfg)
    final = out / "checkpoints" / "step-00000006.pt"
    first = torch.load(final, weights_only=True)
    final.unlink()
    # the same shards, their manifest re-written with other statistics, and a config asking for none: the resumed
    # run keeps what its checkpoint recorded, and repeats its last two steps exactly
    moved = tmp_path / "kelvin-again"
    shutil.copytree(units["kelvin"], moved)
    doc = json.loads((moved / "manifest.json").read_text())
    doc["datasets"][0]["stats"]["fields"]["vorticity"]["mean"] += 1.0
    (moved / "manifest.json").write_text(json.dumps(doc))
    assert manifest_stats(read_manifest(str(moved))[0]) != manifest_stats(read_manifest(str(units["kelvin"]))[0])
    train(dataclasses.replace(cfg, data=DataConfig(manifests=[str(moved)], normalize="none")), resume=True)
    second = torch.load(final, weights_only=True)
    assert second["train_config"]["data"]["norm_stats"] == first["train_config"]["data"]["norm_stats"]
    assert second["train_config"]["data"]["normalize"] == "auto"
    for k, v in first["model"].items():
        assert torch.equal(second["model"][k], v), k


@pytest.mark.slow
def test_launch_records_the_statistics_in_config_yaml_and_a_resume_keeps_them(units: dict[str, Path],
                                                                              tmp_path: Path) -> None:
    out = tmp_path / "run"
    r = train_runs.run(train_runs.launch_args(units["kelvin"], out, "--no-eval", steps=4, nproc=1))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "normalise: fno-ns-v1e-3 per channel from its manifest's train statistics (" in r.stderr
    saved = load_config(out / "config.yaml")
    assert saved.data.normalize == "auto"
    assert saved.data.norm_stats == {"fno-ns-v1e-3": manifest_stats(read_manifest(str(units["kelvin"]))[0])}
    assert load_plan(out, saved.to_dict()) is not None  # config.yaml unchanged by the run: its plan still fits
    final = out / "checkpoints" / "step-00000004.pt"
    first = torch.load(final, weights_only=True)
    assert first["train_config"]["data"]["norm_stats"] == saved.data.norm_stats
    final.unlink()
    r = train_runs.run(train_runs.launch_args(units["kelvin"], out, "--no-eval", "--resume", steps=4, nproc=1))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "normalise: fno-ns-v1e-3 per channel from the recorded statistics (data.norm_stats) (" in r.stderr
    second = torch.load(final, weights_only=True)
    assert all(torch.equal(second["model"][k], v) for k, v in first["model"].items())
    r = train_runs.run(train_runs.launch_args(units["kelvin"], out, "--no-eval", "--resume", "--normalize", "none",
                                              steps=4, nproc=1))
    assert r.returncode == 2 and "data.normalize" in r.stderr, r.stderr[-2000:]
