"""A researcher's own data on a 48x64 grid stays 48x64: the default ingest keeps the native grid (the paper's 2D
sources keep their 128), `--resolution` and `--res` take H,W (D,H,W for 3D) as well as N, launch trains on the grid as
stored (the checkpoint records it as a shape) and evaluate scores it, and pictures keep the native proportions."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from typer.testing import CliRunner

from dpot_data.cli import app as data_app
from dpot_data.synth.gridded import write_user_netcdf
from dpot_train.cli import app as train_app
from dpot_train.cli_train import res_option
from dpot_train.data.windows import run_grid

from train_runs import run


def _ingest(*args: str) -> object:
    return CliRunner().invoke(data_app, ["ingest", *args, "--no-progress"])


def _entry(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())["datasets"][0]


@pytest.fixture(scope="module")
def own_nc(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`write_user_netcdf`'s file: temperature on y 48 x x 64, 4 trajectories of 12 frames, a NaN obstacle."""
    return write_user_netcdf(tmp_path_factory.mktemp("raw"), samples=4, frames=12)


@pytest.fixture(scope="module")
def own_shards(own_nc: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file ingested with the default options (and a split that leaves test trajectories)."""
    out = tmp_path_factory.mktemp("own") / "shards"
    done = _ingest("xarray", str(own_nc), "--out", str(out), "--split", "0.5")
    assert done.exit_code == 0, done.output
    return out


def test_the_default_ingest_keeps_own_data_native_and_the_papers_sources_at_128(own_shards: Path,
                                                                                 tmp_path: Path) -> None:
    entry = _entry(own_shards)
    assert entry["grid"]["shape"] == entry["grid"]["native_shape"] == [48, 64]
    assert entry["resample"]["fields"] == "none"
    from dpot_data.synth.fno import synth_fno

    raw = synth_fno(tmp_path / "raw", n=2, frames=3, viscosity=1e-3, seed=0, resolution=16)[0]
    done = _ingest("fno", str(raw), "--out", str(tmp_path / "fno"), "--format", "wds", "--no-stats")
    assert done.exit_code == 0, done.output
    assert _entry(tmp_path / "fno")["grid"]["shape"] == [128, 128]  # as the released checkpoints saw it


def test_resolution_takes_h_w_and_says_when_a_grid_stretches(own_nc: Path, tmp_path: Path) -> None:
    done = _ingest("xarray", str(own_nc), "--out", str(tmp_path / "a"), "--resolution", "24,32", "--format", "wds")
    assert done.exit_code == 0, done.output
    assert _entry(tmp_path / "a")["grid"]["shape"] == [24, 32]
    done = _ingest("xarray", str(own_nc), "--out", str(tmp_path / "b"), "--resolution", "32", "--format", "wds")
    assert done.exit_code == 0, done.output
    assert ("warning: heat: resampling 48x64 -> 32x32 stretches the grid's aspect (y, x); --resolution 24,32 keeps "
            "it, --resolution 0 keeps the native grid") in done.output
    for bad, said in (("24,x", "error: --resolution: expected a grid size >= 0 (0: the native grid) or one size per "
                               "axis, H,W (D,H,W for 3D), each a whole number of at least 1, got '24,x'"),
                      ("8,16,32", "error: --resolution: expected 2 sizes (y,x) for this 2D data, or one for every "
                                  "axis; got 8,16,32")):
        done = _ingest("xarray", str(own_nc), "--out", str(tmp_path / "bad"), "--resolution", bad)
        assert done.exit_code == 2
        assert [line for line in done.output.splitlines() if line.startswith("error:")] == [said]
        assert not (tmp_path / "bad").exists()


def test_res_takes_h_w_in_the_manifests_axis_order() -> None:
    assert res_option("32,48") == [32, 48] and res_option("48") == 48 and res_option("16,24,32") == [16, 24, 32]
    assert res_option("0") == 0 and res_option(None) is None
    with pytest.raises(ValueError, match=r"^--res 32,x: expected one grid side N \(0: the grid as it is\) or one "
                                         r"side per axis, H,W \(D,H,W for 3D\), each a whole number from 1 to 4096$"):
        res_option("32,x")
    # the sides follow the stored axes, (y, x) or (z, y, x); the model reads them in its own order
    assert run_grid((48, 64), "yx", [32, 48]) == (32, 48)  # own 2D data: the model's H, W are y, x
    assert run_grid((48, 64), "xy", [32, 48]) == (48, 32)  # the model's H is x
    assert run_grid((16, 24, 32), "xy", [8, 12, 16]) == (16, 12, 8)  # 3D: the model's (X, Y, Z)
    with pytest.raises(ValueError, match=r"--res 8,12,16: expected 2 sides \(y, x\) for 2D data"):
        run_grid((48, 64), "yx", [8, 12, 16], ["y", "x"])


def test_launch_takes_the_native_grid_and_refuses_one_off_the_patch_size(own_shards: Path, tmp_path: Path) -> None:
    base = ["launch", "--manifest", str(own_shards), "--out", str(tmp_path / "run"), "--model", "tiny", "--steps",
            "2", "--batch-size", "2", "--device", "cpu", "--dry-run", "--no-verify-checksums"]
    done = CliRunner().invoke(train_app, base)
    assert done.exit_code == 0, done.output  # 48x64 as it is: no --res needed
    done = CliRunner().invoke(train_app, [*base, "--res", "32,48"])
    assert done.exit_code == 0, done.output
    assert yaml.safe_load(done.stdout)["data"]["res"] == [32, 48]
    for res, said in (("50,64", "error: --model tiny: dataset 'heat' gives the model a 50x64 grid (y, x; from --res), "
                                "not a multiple of the patch size 8 on every axis; the nearest valid grid is 48x64: "
                                "train with --res 48,64, or ingest with --resolution 48,64"),
                      ("32,x", "error: --res 32,x: expected one grid side N (0: the grid as it is) or one side per "
                               "axis, H,W (D,H,W for 3D), each a whole number from 1 to 4096")):
        done = CliRunner().invoke(train_app, [*base, "--res", res])
        assert done.exit_code == 2
        assert [line for line in done.output.splitlines() if line.startswith("error:")] == [said]
    assert not (tmp_path / "run").exists()


def test_preview_and_open_dataset_take_h_w(own_shards: Path, tmp_path: Path) -> None:
    from dpot_train import open_dataset

    out = tmp_path / "x.npy"
    done = CliRunner().invoke(train_app, ["preview", "--manifest", str(own_shards), "--out", str(out), "--res",
                                          "32,48", "--frames", "3"])
    assert done.exit_code == 0, done.output
    assert np.load(out).shape == (32, 48, 3, 4)
    native = CliRunner().invoke(train_app, ["preview", "--manifest", str(own_shards), "--out", str(out)])
    assert native.exit_code == 0 and np.load(out).shape == (48, 64, 12, 4)
    item = next(iter(open_dataset(str(own_shards), t_in=2, res="24,32", verify_checksums=False)))
    assert item["x"].shape == (24, 32, 2, 4) and item["mask"].shape == (24, 32)


def _drawn_ratio(ax: object) -> float:
    """The height over the width of a picture as drawn: its data box (extent) scaled by imshow's aspect ("equal",
    coordinates in one unit, reads back as 1.0)."""
    (left, right), (bottom, top) = ax.get_xlim(), ax.get_ylim()
    return float(ax.get_aspect()) * abs(top - bottom) / abs(right - left)


def test_pictures_keep_the_native_proportions(own_nc: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                              ) -> None:
    import matplotlib.axes
    import xarray as xr

    from dpot_data.plot import build_figure
    from dpot_train.evaluation.plots import plot_fields

    # 48x64 -> 64x64: with the Zarr store's coordinates (metres, regridded), and shards alone (cell indices)
    for name, formats in (("sq", "zarr,wds"), ("sq-wds", "wds")):
        done = _ingest("xarray", str(own_nc), "--out", str(tmp_path / name), "--resolution", "64", "--format", formats)
        assert done.exit_code == 0, done.output
        fig = build_figure(str(tmp_path / name))
        assert _drawn_ratio(fig.axes[0]) == pytest.approx(0.75)  # the native 3:4, not the stored square
    zeros = np.zeros((1, 2, 1, 64, 64), np.float32)
    group = xr.Dataset({"prediction": (("trajectory", "step", "channel", "y", "x"), zeros),
                        "truth": (("trajectory", "step", "channel", "y", "x"), zeros + 1),
                        "mask": (("trajectory", "y", "x"), np.ones((1, 64, 64), bool))},
                       coords={"trajectory": ["heat:0"], "step": [1, 2], "channel": ["temperature"]},
                       attrs={"dataset": "heat", "channel_valid": [True], "native_shape": [48, 64]})
    seen = []
    real = matplotlib.axes.Axes.imshow

    def imshow(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202 - matplotlib's own signature
        image = real(self, *args, **kwargs)
        seen.append(_drawn_ratio(self))
        return image

    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", imshow)
    plot_fields(group, tmp_path / "fields.png")
    assert len(seen) == 6 and all(a == pytest.approx(0.75) for a in seen)  # truth, prediction, error at 2 steps


@pytest.mark.slow
def test_launch_trains_on_48x64_and_evaluate_scores_it(own_shards: Path, tmp_path: Path) -> None:
    import sys

    out = tmp_path / "run"
    done = run([sys.executable, "-m", "dpot_train", "launch", "--manifest", str(own_shards), "--out", str(out),
                "--model", "tiny", "--steps", "2", "--batch-size", "2", "--ckpt-every", "2", "--device", "cpu",
                "--no-progress", "--no-eval"])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ckpt = out / "checkpoints" / "step-00000002.pt"
    content = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert content["config"]["img_size"] == [48, 64]  # the grid, recorded as a shape
    assert tuple(content["model"]["pos_embed"].shape) == (1, 64, 6, 8)
    assert content["train_config"]["data"]["res"] == 0  # no resize
    scored = run([sys.executable, "-m", "dpot_train", "evaluate", str(ckpt), "--manifest", str(own_shards),
                  "--out", str(tmp_path / "eval.json")])
    assert scored.returncode == 0, scored.stdout[-3000:] + scored.stderr[-3000:]
    result = json.loads((tmp_path / "eval.json").read_text())["datasets"]["heat"]
    assert result["trajectories"] == 2 and np.isfinite(result["model"]["rollout_l2re"])


def test_res_h_w_takes_the_mask_aware_rule_on_own_data(own_shards: Path) -> None:
    """--res 24,40 on the 48x64 file with its NaN obstacle: preview and open_dataset resize by the mask-aware rule
    (docs/format.md, "Resampling with solid cells"), so every fluid value stays within the stored fluid range (a
    plain bilinear resize would pull the 0-valued solid cells into their neighbours)."""
    from dpot_train import open_dataset
    from dpot_train.preview import window

    stored, stored_mask, _ = window(own_shards, frames=3, normalize="none")
    fluid = stored[stored_mask.astype(bool)][..., 0]
    x, mask, _ = window(own_shards, frames=3, res="24,40", normalize="none")
    assert x.shape == (24, 40, 3, 4) and mask.shape == (24, 40) and not mask.all()
    shown = x[mask][..., 0]
    assert fluid.min() - 1e-3 <= shown.min() and shown.max() <= fluid.max() + 1e-3
    item = next(iter(open_dataset(str(own_shards), split="test", t_in=2, shuffle=False, res=(24, 40),
                                  normalize="none", verify_checksums=False)))
    values = item["x"][item["mask"].bool()][..., 0]
    assert item["x"].shape == (24, 40, 2, 4) and fluid.min() - 1e-3 <= float(values.min())


@pytest.mark.parametrize("res, line", [
    ("24,x", "res: expected a grid side from 1 to 4096 (0: the stored grid) or one side per axis, \"H,W\" or (H, W) "
             "(D,H,W for 3D), each from 1 to 4096, got '24,x'"),
    ((24, 0), "res: expected a grid side from 1 to 4096 (0: the stored grid) or one side per axis, \"H,W\" or "
              "(H, W) (D,H,W for 3D), each from 1 to 4096, got (24, 0)"),
    (100000, "res: expected a grid side from 1 to 4096 (0: the stored grid), got 100000"),
])
def test_open_dataset_refuses_a_bad_res_in_one_line(own_shards: Path, res: object, line: str) -> None:
    from dpot_train import open_dataset

    with pytest.raises(ValueError) as err:
        open_dataset(str(own_shards), res=res)
    assert str(err.value) == line


def test_grid_notes_name_a_rectangular_trained_grid_as_res_takes_it() -> None:
    """evaluate's note for data on another grid than a 48x64 model's: the trained grid as 48x64, and the --res that
    gives it back in the manifest's order (48,64; a grid of one side would read as its side)."""
    from types import SimpleNamespace

    from dpot_train.evaluation.evaluate import grid_notes
    from dpot_train.model.config import DPOTConfig

    cfg = DPOTConfig(img_size=(48, 64), patch_size=8, embed_dim=32, depth=1, n_blocks=1, modes=4)
    ds = SimpleNamespace(name="heat", shape=(32, 48), model_layout="yx", dims=["y", "x"])
    assert grid_notes(cfg, [ds], 0) == ["the model was trained on a 48x64 grid; dataset 'heat' is scored on its "
                                        "32x48 grid, the positional embedding resampled; --res 48,64 resizes it to "
                                        "the trained grid"]
    assert grid_notes(cfg, [ds], [48, 64]) == []
    assert grid_notes(cfg, [ds], [24, 32]) == ["the model was trained on a 48x64 grid; dataset 'heat' is resized "
                                               "from 32x48 to 24x32 (--res 24,32)"]
