"""The paper's FNO and UNet baselines: the reference's saved weights load as they are and give its outputs, the presets
have the paper's sizes, and the model-family seam serves `load_pretrained`, `model info`, export and fine-tuning."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from dpot_train.core.checkpoint import CheckpointError, checkpoint_payload, export_released, load_pretrained
from dpot_train.cli import app
from dpot_train.model import FNO2D, FNO3D, UNet, families
from dpot_train.core.model_setup import data_overrides, fresh_model

TOL = 1e-6  # tighter than the 1e-5 acceptance bound
GOLDEN = Path(__file__).resolve().parent / "golden"  # tests/golden/make_golden_baselines.py


@pytest.fixture(scope="module")
def baselines_dir(reference_dir: Path) -> Path:
    folder = reference_dir / "baselines"
    if not folder.is_dir():
        pytest.skip(f"the reference's FNO/UNet golden files not found at {folder}; the golden-reference tests need it")
    return folder


@pytest.fixture(scope="module")
def shards_3d(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """3D shards at their native 12^3 grid (6 trajectories of 6 frames: 4 train, 2 test) and a run config with 3
    input frames."""
    from dpot_data.ingest import IngestOptions, ingest_files
    from dpot_data.synth.pdebench import write_cfd

    base = tmp_path_factory.mktemp("baselines3d")
    raw = write_cfd(base / "raw", dims=3, m=1.0, eta=1e-8, kind="Rand", n=6, frames=6, res=12, seed=0)
    ingest_files("pdebench", [raw], base / "s3d", IngestOptions(resolution=None, split=(0.6, 0.0), seed=0))
    (base / "t_in.yaml").write_text("data:\n  t_in: 3\n  t_out: 1\n", encoding="utf-8")
    return {"shards": base / "s3d", "config": base / "t_in.yaml"}


def _io(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in ("x", "pred", "cls")}


def _max_diffs(model: torch.nn.Module, io: dict[str, np.ndarray]) -> tuple[float, float]:
    with torch.no_grad():
        pred, logits = model(torch.from_numpy(io["x"]), return_logits=True)
    assert pred.shape == io["pred"].shape and logits.shape == io["cls"].shape and io["pred"].std() > 0.01
    return float(np.abs(pred.numpy() - io["pred"]).max()), float(np.abs(logits.numpy() - io["cls"]).max())


@pytest.mark.parametrize("name, cls", [("fno2d", FNO2D), ("unet2d", UNet)])
def test_reference_checkpoint_reproduces_reference_outputs(baselines_dir: Path, name: str, cls: type) -> None:
    from dpot_train import load_pretrained as top_level

    meta = json.loads((baselines_dir / f"{name}.json").read_text())
    model = top_level(baselines_dir / f"{name}.pth")
    assert isinstance(model, cls) and not model.training  # eval mode: UNet's BatchNorm uses its running statistics
    assert [k for k in model.state_dict()] == [e["key"] for e in meta["state_dict"]]
    assert model.num_parameters() == meta["total_parameters"]
    kwargs = meta["constructor_kwargs"]
    for key in ("width", "in_timesteps", "out_timesteps", "n_cls", "n_layers", "modes1", "modes2", "n_channels"):
        if key in kwargs:
            assert getattr(model.config, key) == kwargs[key], key
    d_pred, d_cls = _max_diffs(model, _io(baselines_dir / f"{name}_io.npz"))
    assert d_pred <= TOL and d_cls <= TOL, (d_pred, d_cls)


@pytest.mark.parametrize("name, cls", [("fno", FNO2D), ("unet", UNet), ("fno3d", FNO3D)])
def test_in_repo_golden_reproduces_its_outputs(name: str, cls: type) -> None:
    model = load_pretrained(GOLDEN / f"{name}_small.pth")
    assert isinstance(model, cls) and not model.training
    if cls is FNO2D:  # inferred from the weights: GroupNorm and instance normalisation on, the grid from args.res
        assert (model.config.use_ln, model.config.normalize, model.config.img_size) == (True, True, 16)
    elif cls is FNO3D:  # complex spectral weights: the 3D network, its modes from their shape
        assert (model.config.modes1, model.config.modes3, model.config.use_ln, model.config.img_size) == (3, 2, True, 8)
    else:
        assert (model.config.width, model.config.in_shape) == (2, (20, 20))
    d_pred, d_cls = _max_diffs(model, _io(GOLDEN / f"{name}_small_io.npz"))
    assert d_pred <= TOL and d_cls <= TOL, (d_pred, d_cls)


def test_presets_have_the_papers_sizes() -> None:
    counts = {name: families.parameter_count(families.preset_config(name)) for name in ("fno", "fno-m", "unet")}
    assert 0.45e6 < counts["fno"] < 0.55e6, counts  # "FNO 0.5M"
    assert 6.5e6 < counts["fno-m"] < 7.5e6, counts  # "FNO-m 7M"
    assert 24.5e6 < counts["unet"] < 25.5e6, counts  # "UNet 25M"
    assert families.preset_config("FNO-M") == families.preset_config("fno-m")
    # benchmarks/paper_table.py's CPU UNet: the width of the reference's saved unet2d.pth (test_reference_model_info)
    assert families.parameter_count(families.preset_config("unet-small")) == 489388
    with pytest.raises(KeyError, match="unknown model preset 'fno-xl'; available: tiny, Ti.*fno, fno-m.*"
                                       "unet, unet-tiny, unet-small"):
        families.preset_config("fno-xl")


def test_model_info_names_family_size_and_count(tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["model", "info", "unet", "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert (info["model"], info["family"], info["size"]) == ("UNet2D", "unet", "unet")
    assert info["parameters"] == families.parameter_count(families.preset_config("unet"))
    result = runner.invoke(app, ["model", "info", str(GOLDEN / "fno_small.pth")])
    assert result.exit_code == 0, result.output
    assert "FNO2D from checkpoint" in result.output and "family: fno, size: custom" in result.output
    assert "parameters: 8,902" in result.output
    model = fresh_model("fno-tiny", {}, data_overrides(4, (32, 32), 10, 1))
    torch.save(checkpoint_payload(model, step=1), tmp_path / "step.pt")
    result = runner.invoke(app, ["model", "info", str(tmp_path / "step.pt")])
    assert "family: fno, size: fno-tiny" in result.output and "config from checkpoint" in result.output


def test_reference_model_info(baselines_dir: Path) -> None:
    result = CliRunner().invoke(app, ["model", "info", str(baselines_dir / "unet2d.pth"), "--json"])
    info = json.loads(result.output)
    assert (info["model"], info["family"], info["parameters"]) == ("UNet2D", "unet", 489388)


@pytest.mark.parametrize("preset", ["fno-tiny", "unet-tiny"])
def test_export_round_trips_through_the_released_format(preset: str, tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = fresh_model(preset, {}, data_overrides(4, (24, 24), 10, 1)).eval()
    ours = tmp_path / "step-00000001.pt"
    torch.save(checkpoint_payload(model, step=1), ours)
    export_released(ours, tmp_path / "w.pth")
    saved = torch.load(tmp_path / "w.pth", weights_only=True)
    assert list(saved) == ["model", "recipe"]  # the weights, and the recipe they are scored with
    again = load_pretrained(tmp_path / "w.pth")
    assert type(again) is type(model)
    x = torch.randn(2, 24, 24, 10, 4)  # the grid is not in the released weights; the network runs on any grid
    with torch.no_grad():
        assert torch.equal(again(x), model(x))


def test_export_refuses_what_the_released_format_cannot_say(tmp_path: Path) -> None:
    model = fresh_model("fno-tiny", {}, data_overrides(4, (32, 32), 10, 2))  # two output frames: not in the weights
    torch.save(checkpoint_payload(model, step=1), tmp_path / "s.pt")
    with pytest.raises(CheckpointError, match="cannot record in_timesteps, n_channels, out_timesteps of this model"):
        export_released(tmp_path / "s.pt", tmp_path / "w.pth")
    assert not (tmp_path / "w.pth").exists()


def test_config_dicts_name_their_family() -> None:
    config = families.configure("unet-tiny", data_overrides(3, (16, 16, 16), 4, 2), {"width": 3})
    assert (config.n_dim, config.in_shape, config.in_channels, config.out_timesteps, config.width) == \
        (3, (16, 16, 16), 3, 2, 3)
    stored = json.loads(json.dumps(config.to_dict()))
    assert stored["family"] == "unet" and families.config_from_dict(stored) == config
    dpot = families.preset_config("tiny")
    assert "family" not in dpot.to_dict() and families.config_from_dict(dpot.to_dict()) == dpot  # as before
    with pytest.raises(ValueError, match="unknown model family 'gnot'; known: dpot, fno, unet"):
        families.config_from_dict({"family": "gnot"})
    with pytest.raises(TypeError, match="depth"):
        families.resolve("fno-tiny", depth=3)  # DPOT's field names do not apply


def test_unet_and_fno_run_in_3d(tmp_path: Path) -> None:
    fixed = data_overrides(4, (12, 12, 12), 3, 1)
    x = torch.randn(1, 12, 12, 12, 3, 4)
    for preset, cls in (("unet-tiny", UNet), ("fno-tiny", FNO3D)):
        torch.manual_seed(0)
        model = families.build(families.configure(preset, fixed, {})).eval()
        assert isinstance(model, cls) and families.model_label(model.config).endswith("3D")
        with torch.no_grad():
            pred, logits = model(x, return_logits=True)
        assert pred.shape == (1, 12, 12, 12, 1, 4) and logits.shape == (1, 12) and not logits.any()
        # the released format (FNO3d's spectral weights are complex) says the 3D network back
        torch.save({"model": model.state_dict()}, tmp_path / f"{preset}.pth")
        again = load_pretrained(tmp_path / f"{preset}.pth")
        assert type(again) is cls
        with torch.no_grad():
            assert torch.equal(again(x), pred)
    # FNO3d's scale_feats (built with normalize, never used by its forward) is frozen: DDP refuses unused weights
    normalized = families.build(families.configure("fno-tiny", fixed, {"normalize": True}))
    assert [n for n, p in normalized.named_parameters() if not p.requires_grad] == ["scale_feats.weight",
                                                                                   "scale_feats.bias"]


def test_a_preset_that_does_not_fit_the_data_is_one_line() -> None:
    from dpot_train.core.model_setup import fresh_config

    with pytest.raises(ValueError) as info:  # 8 z modes on a 12-point axis (7 rFFT frequencies)
        fresh_config("fno", {}, data_overrides(5, (12, 12, 12), 3, 1))
    assert str(info.value).startswith("--model fno on this data (") and "\n" not in str(info.value)
    assert str(info.value).endswith("invalid FNOConfig: modes3 8 exceeds the 7 frequencies of a 12-point axis")
    assert fresh_config("fno", {"modes3": 7}, data_overrides(5, (12, 12, 12), 3, 1)).n_dim == 3


def test_init_from_a_baseline_loads_whole_and_dpot_components_are_refused(tmp_path: Path) -> None:
    from dpot_train.train.finetune import finetune_model

    fixed = data_overrides(4, (32, 32), 10, 1)
    source = fresh_model("unet-tiny", {}, fixed)
    path = tmp_path / "u.pth"
    torch.save({"model": source.state_dict(), "args": argparse.Namespace(res=64)}, path)
    model, line = finetune_model(str(path), fixed, "all")
    assert line == f"--init {path}: loaded all (UNet2D)"
    assert model.config.in_shape == (32, 32)  # fitted to the data grid, not the saved args.res
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), source.state_dict().values()))
    with pytest.raises(CheckpointError) as info:
        finetune_model(str(path), fixed, "blocks")
    assert str(info.value) == "--load blocks: names DPOT components; UNet checkpoints load whole (--load all)"


def test_wrong_input_is_one_clear_line() -> None:
    model = families.build(families.preset_config("fno-tiny"))
    with pytest.raises(ValueError, match=r"FNO2D expects input \(B, X, Y, T, C\) with T=10, C=4"):
        model(torch.randn(1, 32, 32, 9, 4))


@dataclasses.dataclass(frozen=True)
class _ToyConfig:
    """A third family's config, for the test that the seam is the only place a family is named."""

    width: int = 3
    img_size: int = 8
    in_channels: int = 4
    in_timesteps: int = 10
    out_timesteps: int = 1
    out_channels: int = 4
    spatial_dims: int = 2

    def to_dict(self) -> dict:
        return {"family": "toy", **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict) -> "_ToyConfig":
        return cls(**{k: v for k, v in data.items() if k != "family"})

    def replace(self, **changes: object) -> "_ToyConfig":
        return dataclasses.replace(self, **changes)


class _Toy(torch.nn.Module):
    def __init__(self, config: _ToyConfig) -> None:
        super().__init__()
        self.config = config
        self.toy_mix = torch.nn.Linear(config.in_timesteps * config.in_channels, config.out_channels)

    def forward(self, x: torch.Tensor, return_logits: bool = False) -> object:
        y = self.toy_mix(x.flatten(-2)).unsqueeze(-2)
        return (y, torch.zeros(x.shape[0], 1)) if return_logits else y


def test_a_third_family_needs_only_its_registry_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpot_train.model import weights

    def infer(state: dict, hints: dict) -> _ToyConfig:
        out, flat = state["toy_mix.weight"].shape
        return _ToyConfig(in_channels=out, out_channels=out, in_timesteps=flat // out)

    toy = families.Family("toy", "Toy", _ToyConfig, {"toy-s": _ToyConfig()}, "toy_mix.weight", _Toy, infer,
                          lambda c, fixed, over: c.replace(**{**fixed, **over}), free_fields=("img_size", "width"))
    monkeypatch.setitem(families.FAMILIES, "toy", toy)
    monkeypatch.setattr(weights, "NETWORKS", [*weights.NETWORKS, _Toy])
    model = fresh_model("toy-s", {}, data_overrides(4, (16, 16), 10, 1))
    assert isinstance(model, _Toy) and model.config.img_size == 16
    torch.save(checkpoint_payload(model, step=1), tmp_path / "s.pt")  # our layout: config names the family
    assert isinstance(load_pretrained(tmp_path / "s.pt"), _Toy)
    export_released(tmp_path / "s.pt", tmp_path / "w.pth")  # the released layout: recognised by its keys
    again = load_pretrained(tmp_path / "w.pth")
    assert isinstance(again, _Toy) and torch.equal(again.toy_mix.weight, model.toy_mix.weight)
    info = CliRunner().invoke(app, ["model", "info", str(tmp_path / "s.pt"), "--json"])
    assert json.loads(info.output)["model"] == "Toy2D" and json.loads(info.output)["size"] == "toy-s"


@pytest.mark.parametrize("preset, label", [("fno-tiny", "FNO2D"), ("unet-tiny", "UNet2D")])
def test_evaluate_scores_a_baseline_and_names_it(fno_train_shards: Path, tmp_path: Path, preset: str,
                                                 label: str) -> None:
    from dpot_train.evaluation.evaluate import evaluate_checkpoint

    torch.manual_seed(0)
    model = fresh_model(preset, {}, data_overrides(4, (32, 32), 10, 1))
    torch.save(checkpoint_payload(model, step=1), tmp_path / "s.pt")
    export_released(tmp_path / "s.pt", tmp_path / "w.pth")
    ours = evaluate_checkpoint(str(tmp_path / "s.pt"), [str(fno_train_shards)], rollout_steps=1)
    assert ours["network"] == {"model": label, "family": preset.split("-")[0], "size": preset,
                               "parameters": model.num_parameters()}
    released = evaluate_checkpoint(str(tmp_path / "w.pth"), [str(fno_train_shards)], rollout_steps=1,
                                   allow_convention_mismatch=True)
    assert released["network"]["model"] == label  # the grid (not in the weights) fitted to the data's
    assert 0 < ours["datasets"]["fno-ns-v1e-3"]["model"]["rollout_l2re"] < float("inf")


def test_evaluate_runs_a_released_3d_baseline_on_the_data_grid(shards_3d: dict[str, Path], tmp_path: Path) -> None:
    """The grid is not in a baseline's weights (the inferred 128 is a default): 3D released weights are evaluated on
    the data's grid, as with --res 0, not resized to the default."""
    from dpot_train.evaluation.evaluate import evaluate_checkpoint

    torch.manual_seed(0)
    model = fresh_model("fno-tiny", {}, data_overrides(5, (12, 12, 12), 3, 1))
    torch.save({"model": model.state_dict()}, tmp_path / "w.pth")
    args = (str(tmp_path / "w.pth"), [str(shards_3d["shards"])])
    default = evaluate_checkpoint(*args, rollout_steps=1)
    assert default["network"]["model"] == "FNO3D"
    assert default["datasets"] == evaluate_checkpoint(*args, rollout_steps=1, res=0)["datasets"]
