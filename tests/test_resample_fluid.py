"""Mask-aware resampling (docs/format.md, "Resampling with solid cells"): solid cells never leak into fluid values,
at ingest's resize and at `dpot-train --res`, 2D and 3D. A researcher's NetCDF with a NaN obstacle keeps its fluid
values in their range and its statistics; a channel constant on the fluid (The Well with NaN obstacle cells) stays
exactly constant and is named constant by `evaluate`; a target cell without a fluid source is solid; data without
a solid cell is resampled bit for bit as before."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
import xarray as xr
import zarr
from typer.testing import CliRunner

from dpot_data.cli import app as data_app
from dpot_data.synth.gridded import write_the_well, write_user_netcdf
from dpot_data.transform import resample_fields, resample_mask, resample_trajectories
from dpot_train.data.windows import resize_frames, resize_mask, resize_window


def _ingest(args: list[str]) -> None:
    r = CliRunner().invoke(data_app, ["ingest", *args, "--no-progress"])
    assert r.exit_code == 0, r.output


def _stored(out: Path) -> tuple[dict, np.ndarray, np.ndarray]:
    """The manifest's first dataset entry, its Zarr fields and mask."""
    entry = json.loads((out / "manifest.json").read_text())["datasets"][0]
    group = zarr.open_group(str(out / "data.zarr"), mode="r")[entry["name"]]
    return entry, np.asarray(group["fields"][:]), np.asarray(group["mask"][:])


# ------------------------------------------------------------------------------------------------ own NetCDF

@pytest.fixture(scope="module")
def heat(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The researcher's file (temperature 293 +- 3 K, a 6x6 NaN obstacle) on 24x32, ingested resized to 128x128
    (bilinear by default; own data keeps its native grid unless --resolution is given); (file, output)."""
    base = tmp_path_factory.mktemp("heat")
    path = write_user_netcdf(base / "raw", samples=4, frames=4, ny=24, nx=32)
    out = base / "out"
    _ingest(["xarray", str(path), "--out", str(out), "--resolution", "128"])
    return path, out


def test_ingest_keeps_every_fluid_value_in_the_sources_fluid_range(heat: tuple[Path, Path]) -> None:
    path, out = heat
    source = xr.open_dataset(path)["temperature"].values  # NaN on the obstacle
    entry, fields, mask = _stored(out)
    assert entry["grid"]["shape"] == [128, 128] and entry["resample"]["fields"] == "bilinear"
    temperature = fields[:, :, entry["channels"].index("temperature")]
    fluid = np.broadcast_to(mask[:, None] == 1, temperature.shape)
    assert (mask == 0).any() and (mask == 1).any()
    assert np.nanmin(source) <= temperature[fluid].min() and temperature[fluid].max() <= np.nanmax(source)
    assert np.all(temperature[~fluid] == 0)  # solid cells stored as 0, as before


def test_ingest_statistics_are_the_fluids(heat: tuple[Path, Path]) -> None:
    path, out = heat
    entry, _, _ = _stored(out)
    rows = [int(i.rsplit("#", 1)[1]) for i in entry["splits"]["ids"]["train"]]
    source = xr.open_dataset(path)["temperature"].values[rows]
    stats = entry["stats"]["fields"]["temperature"]
    assert stats["std"] == pytest.approx(np.nanstd(source), rel=0.1)  # smeared 0 K cells made it several times this
    assert np.nanmin(source) <= stats["min"] and stats["max"] <= np.nanmax(source)


# ------------------------------------------------------------------------------------------------ the Well

def _well_constant(base: Path, dims: int, res: int) -> Path:
    """A Well file with NaN obstacle cells whose `density` is 2.0 on every fluid cell."""
    path = write_the_well(base, n=3, frames=3, res=res, dims=dims, periodic=False, obstacle_nan=True,
                          alphas=(0.5,))[0]
    with h5py.File(path, "a") as f:
        d = f["t0_fields/density"]
        d[...] = np.where(np.isnan(d[()]), np.nan, 2.0).astype(np.float32)
    return path


@pytest.fixture(scope="module", params=[2, 3], ids=["2d", "3d"])
def well(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path, Path]:
    """(dims, output resized at ingest, output on the native grid) of the constant-density Well file."""
    dims = request.param
    base = tmp_path_factory.mktemp(f"well{dims}d")
    path = _well_constant(base / "raw", dims, 12 if dims == 2 else 6)
    resized, native = base / "resized", base / "native"
    common = ["the-well", str(path), "--split", "0.67", "--channels", "16"]
    _ingest([*common, "--out", str(resized), "--resolution", "20" if dims == 2 else "8"])
    _ingest([*common, "--out", str(native), "--resolution", "0"])
    return dims, resized, native


def test_a_channel_constant_on_the_fluid_stays_constant_after_ingest_resize(well: tuple[int, Path, Path]) -> None:
    dims, out, _ = well
    entry, fields, mask = _stored(out)
    assert len(entry["grid"]["shape"]) == dims and entry["grid"]["shape"] != entry["grid"]["native_shape"]
    density = fields[:, :, entry["channels"].index("density")]
    fluid = np.broadcast_to(mask[:, None] == 1, density.shape)
    assert (~fluid).any()
    assert np.all(density[fluid] == 2.0) and np.all(density[~fluid] == 0.0)
    assert entry["stats"]["fields"]["density"]["std"] == 0.0


def test_a_channel_constant_on_the_fluid_stays_constant_after_res(well: tuple[int, Path, Path]) -> None:
    from dpot_train.preview import window

    dims, _, out = well
    entry, _, _ = _stored(out)
    channel = entry["channels"].index("density")
    x, mask, _ = window(out, split="train", index=0, res=8, normalize="none")
    assert x.shape[:dims] == (8,) * dims and mask.shape == (8,) * dims and (~mask).any()
    assert np.all(x[..., channel][mask] == 2.0) and np.all(x[..., channel][~mask] == 0.0)


def test_evaluate_at_res_names_the_constant_channel(well: tuple[int, Path, Path], tmp_path: Path) -> None:
    import dpot_train.evaluation.evaluate as ev
    from dpot_train.model import build_model

    dims, _, out = well
    torch.manual_seed(0)
    model = build_model("tiny", spatial_dims=dims, img_size=8, in_channels=16, out_channels=16, in_timesteps=2)
    ckpt = tmp_path / "tiny.pth"
    torch.save({"model": model.state_dict()}, ckpt)
    result = ev.evaluate_checkpoint(str(ckpt), [str(out)], device="cpu", recipe="dpot", res=8)
    found = next(iter(result["datasets"].values()))
    assert "density" in found["constant_channels"]


# ------------------------------------------------------------------------------------------------ the rule itself

def _rows_solid(n: int, rows: list[int], b: int = 1) -> torch.Tensor:
    mask = torch.ones(b, n, n, dtype=torch.bool)
    mask[:, rows] = False
    return mask


def test_a_target_cell_without_a_fluid_source_is_solid_at_res() -> None:
    # 16 -> 4, bilinear without antialias: target row 1 is made of source rows 5 and 6 only
    mask = _rows_solid(16, [5, 6])
    frames = torch.full((1, 16, 16, 2, 1), 290.0)
    frames[0, 5:7] = 0.0  # solid cells as stored
    out, new_mask = resize_window(frames, mask, 4)
    assert not new_mask[0, 1].any() and new_mask[0, [0, 2, 3]].all()
    assert torch.all(out[0][new_mask[0]] == 290.0) and torch.all(out[0][~new_mask[0]] == 0.0)


def test_a_target_cell_without_a_fluid_source_is_solid_at_ingest() -> None:
    # rows 5-6 solid: half of target row 1 by area (area-threshold says fluid), but none of its bilinear sources
    fields = np.full((1, 2, 1, 16, 16), 290.0, dtype=np.float32)
    mask = np.ones((1, 16, 16), dtype=np.uint8)
    mask[:, 5:7] = 0
    fields[..., 5:7, :] = 0.0
    out, new_mask = resample_trajectories(fields, mask, (4, 4), "bilinear", "area-threshold")
    assert resample_mask(mask, (4, 4), "area-threshold")[0, 1].all()  # what the mask method alone says
    assert not new_mask[0, 1].any() and new_mask[0, [0, 2, 3]].all()
    assert np.all(out[0, :, 0][:, new_mask[0] == 1] == 290.0)


@pytest.mark.parametrize("space", [(12, 10), (6, 5, 4)])
@pytest.mark.parametrize("method", ["bilinear", "bilinear-antialias", "bicubic", "fourier"])
def test_fluid_values_stay_in_the_fluid_range_for_every_method(space: tuple[int, ...], method: str) -> None:
    rng = np.random.default_rng(1)
    fields = (290 + 3 * rng.standard_normal((2, 3, 2, *space))).astype(np.float32)
    mask = (rng.random((2, *space)) > 0.25).astype(np.uint8)
    for b in range(2):
        fields[b][:, :, mask[b] == 0] = 0.0  # solid cells as stored
    for target in ((7,) * len(space), (17,) * len(space)):
        out, new_mask = resample_trajectories(fields, mask, target, method, "nearest")
        for b in range(2):
            src = fields[b][:, :, mask[b] == 1]  # (T, C, fluid cells)
            got = out[b][:, :, new_mask[b] == 1]
            assert (got >= src.min(axis=-1, keepdims=True)).all() and (got <= src.max(axis=-1, keepdims=True)).all()
            assert np.all(out[b][:, :, new_mask[b] == 0] == 0.0)


@pytest.mark.parametrize("space", [(12, 10), (6, 5, 4)])
def test_data_without_solid_cells_is_resampled_as_before(space: tuple[int, ...]) -> None:
    rng = np.random.default_rng(2)
    fields = rng.standard_normal((3, 2, 2, *space)).astype(np.float32)
    ones = np.ones((3, *space), dtype=np.uint8)
    target = (8,) * len(space)
    for method in ("bilinear", "bilinear-antialias", "bicubic", "fourier"):
        for mask_method in ("nearest", "area-threshold"):
            out, new_mask = resample_trajectories(fields, ones, target, method, mask_method)
            assert np.array_equal(out, resample_fields(fields, target, method))
            assert np.array_equal(new_mask, resample_mask(ones, target, mask_method))
    swapped, _ = resample_trajectories(fields, ones, target, "bilinear", "nearest", swap=True)
    want = np.swapaxes(resample_fields(np.swapaxes(fields, -1, -2), target[::-1], "bilinear"), -1, -2)
    assert np.array_equal(swapped, want)
    # one trajectory of a block with a solid cell: the others keep the plain resize, bit for bit
    mixed = ones.copy()
    mixed[1, (0,) * len(space)] = 0
    out, _ = resample_trajectories(fields, mixed, target, "bilinear", "nearest")
    plain = resample_fields(fields, target, "bilinear")
    assert np.array_equal(out[[0, 2]], plain[[0, 2]]) and not np.array_equal(out[1], plain[1])
    # and at --res (model layout (B, *S, T, C))
    frames = torch.from_numpy(np.moveaxis(fields.reshape(3, 4, *space), 1, -1).reshape(3, *space, 2, 2).copy())
    tmask = torch.from_numpy(mixed.astype(bool))
    got, got_mask = resize_window(frames, tmask, 8)
    assert torch.equal(got[[0, 2]], resize_frames(frames, 8)[[0, 2]])
    assert torch.equal(got_mask[[0, 2]], resize_mask(tmask, 8)[[0, 2]])
    assert torch.equal(resize_window(frames, torch.ones_like(tmask), 8)[0], resize_frames(frames, 8))
