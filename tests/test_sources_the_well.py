"""The Well reader on Well-layout files written with h5py: component channels, constant fields broadcast over
time, the folder split, boundary conditions, 2D and 3D, exact native values, the reference bilinear at 128², and a
file missing a group refused in one line with nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import h5py
import numpy as np
import pytest
import zarr
from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_data.errors import InputError
from dpot_data.ingest import IngestOptions, ingest
from dpot_data.sources import the_well
from dpot_data.synth.gridded import write_the_well
from dpot_data.transform import resample_bilinear

CHANNELS_2D = ["density", "obstacle", "velocity_x", "velocity_y", "D_xx", "D_xy", "D_yx", "D_yy"]


@pytest.fixture(scope="module")
def well2d(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("well2d")
    write_the_well(root, n=2, frames=4, res=12, dims=2)
    return root


def _raw(path: Path, i: int) -> np.ndarray:
    """(T, 8, y, x) of trajectory i built straight from the file, in the documented channel order."""
    with h5py.File(path, "r") as f:
        rho, obstacle = f["t0_fields/density"][i], f["t0_fields/obstacle"][i]
        vel, tensor = f["t1_fields/velocity"][i], f["t2_fields/D"][i]
    chans = [rho, np.broadcast_to(obstacle, rho.shape), vel[..., 0], vel[..., 1],
             tensor[..., 0, 0], tensor[..., 0, 1], tensor[..., 1, 0], tensor[..., 1, 1]]
    return np.stack([c.transpose(0, 2, 1) for c in chans], axis=1)


def _ingest(result, out: Path, resolution: int | None, **options) -> tuple[dict, zarr.Group]:
    opts = IngestOptions(resolution=resolution, channels=8, formats=("zarr",), stats=False, **options)
    entry = ingest(result, out, opts).manifest["datasets"][0]
    return entry, zarr.open_group(str(out / "data.zarr" / entry["name"]), mode="r")


def test_channels_split_and_boundary(well2d):
    result = the_well.read([well2d / "data"])
    ds = result.data
    assert list(ds["channel"].values) == CHANNELS_2D
    assert ds.attrs["boundary"] == "periodic" and ds.attrs["dataset"] == "the-well-synthetic_waves"
    ids = list(ds["sample"].values)
    assert ids[:2] == ["test/waves_alpha_0.5.hdf5#0", "test/waves_alpha_0.5.hdf5#1"] and len(ids) == 12
    assert result.split.tolist() == ["test"] * 4 + ["train"] * 4 + ["valid"] * 4
    params = ds.attrs["parameters"]
    assert params["constant_in_time_channels"] == ["obstacle"]
    assert {bc["bc_type"] for bc in params["boundary_conditions"].values()} == {"PERIODIC"}
    assert result.sample_params["alpha"].tolist() == [0.5, 0.5, 1.0, 1.0] * 3  # differs per file


def test_native_values_equal_the_file_and_the_split_is_kept(well2d, tmp_path):
    entry, group = _ingest(the_well.read([well2d / "data"]), tmp_path / "out", None)
    assert entry["splits"]["counts"] == {"train": 4, "valid": 4, "test": 4}
    assert entry["grid"]["shape"] == [12, 12] and entry["channels"] == CHANNELS_2D
    ids = entry["splits"]["ids"]["train"]
    assert ids[0] == "train/waves_alpha_0.5.hdf5#0"
    rows = [str(v) for v in group["sample"][:]]
    assert [str(v) for v in group["split"][:]] == [r.split("/")[0] for r in rows]
    stored = group["fields"][rows.index("train/waves_alpha_0.5.hdf5#1")]
    np.testing.assert_array_equal(stored, _raw(well2d / "data/train/waves_alpha_0.5.hdf5", 1))


def test_at_128_equals_the_reference_bilinear(well2d, tmp_path):
    path = well2d / "data/valid/waves_alpha_1.hdf5"
    entry, group = _ingest(the_well.read([path]), tmp_path / "out", 128, split=(1.0,))
    assert entry["resample"]["fields"] == "bilinear"  # the default convention, periodic or not
    raw = np.stack([_raw(path, i) for i in range(2)])
    np.testing.assert_array_equal(group["fields"][:], resample_bilinear(raw, (128, 128)))


def test_periodic_data_resamples_spectrally_only_under_canonical(well2d, tmp_path):
    path = well2d / "data/valid/waves_alpha_1.hdf5"
    entry, _ = _ingest(the_well.read([path]), tmp_path / "out", 24, split=(1.0,), convention="canonical")
    assert entry["resample"]["fields"] == "fourier"


def test_wall_boundaries_are_non_periodic(tmp_path):
    paths = write_the_well(tmp_path, n=1, frames=2, res=8, periodic=False, alphas=(0.5,))
    ds = the_well.read(paths[:1]).data
    assert ds.attrs["boundary"] == "non-periodic"
    assert {bc["bc_type"] for bc in ds.attrs["parameters"]["boundary_conditions"].values()} == {"WALL"}


def test_3d_components_and_axis_order(tmp_path):
    paths = write_the_well(tmp_path, n=2, frames=3, res=5, dims=3, alphas=(0.5,))
    result = the_well.read([paths[0]])
    ds = result.data
    assert ds["fields"].dims == ("sample", "time", "channel", "z", "y", "x")
    names = list(ds["channel"].values)
    assert names[2:5] == ["velocity_x", "velocity_y", "velocity_z"] and len(names) == 2 + 3 + 9
    fields = ds["fields"].values
    with h5py.File(paths[0], "r") as f:
        vel, tensor = f["t1_fields/velocity"][1], f["t2_fields/D"][0]
    np.testing.assert_array_equal(fields[1, :, 4], vel[..., 2].transpose(0, 3, 2, 1))
    np.testing.assert_array_equal(fields[0, :, 5 + 5], tensor[..., 1, 2].transpose(0, 3, 2, 1))  # D_yz


def _copy_without(src: Path, dst: Path, group: str) -> Path:
    with h5py.File(src, "r") as f, h5py.File(dst, "w") as g:
        for key, value in f.attrs.items():
            g.attrs[key] = value
        for key in f:
            if key != group:
                f.copy(f[key], g, key)
    return dst


def test_a_file_missing_a_group_is_one_line_and_nothing_is_written(well2d, tmp_path):
    bad = _copy_without(well2d / "data/train/waves_alpha_1.hdf5", tmp_path / "bad.hdf5", "boundary_conditions")
    with pytest.raises(InputError) as err:
        the_well.read([bad])
    assert err.value.path == str(bad) and err.value.message.startswith("group 'boundary_conditions' missing")
    result = CliRunner().invoke(app, ["ingest", "the-well", str(bad), "--out", str(tmp_path / "o"), "--no-progress"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(bad) in lines[0] and "boundary_conditions" in lines[0]
    assert not (tmp_path / "o").exists()


def test_a_field_whose_shape_disagrees_with_its_attributes_is_refused(well2d, tmp_path):
    bad = _copy_without(well2d / "data/train/waves_alpha_1.hdf5", tmp_path / "bad.hdf5", "none")
    with h5py.File(bad, "a") as f:
        f["t0_fields/obstacle"].attrs["time_varying"] = True
    with pytest.raises(InputError, match=r"t0_fields/obstacle: expected numbers of shape \(2, 4, 12, 12\)"):
        the_well.read([bad])


def test_cli_ingests_a_well_folder(well2d, tmp_path):
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["ingest", "the-well", str(well2d / "data"), "--out", str(out),
                                      "--channels", "8", "--resolution", "0", "--no-progress"])
    assert result.exit_code == 0, result.output
    entry = json.loads((out / "manifest.json").read_text())["datasets"][0]
    assert entry["source"] == "the_well" and entry["splits"]["counts"] == {"train": 4, "valid": 4, "test": 4}
