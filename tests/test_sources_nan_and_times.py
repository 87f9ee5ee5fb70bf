"""What the Well and xarray readers make of NaN, times and coordinates, against files in the Well's own layout
(2D and 3D with NaN obstacle cells, per-trajectory times, boundary masks, the Well's dummy file), py-pde's HDF5
layout and NetCDF written by xarray: one NaN rule (geometry NaN masked, NaN that comes and goes dropped or
refused, never a fully masked trajectory), each trajectory's own times, the Well's boundary as its reader reads it,
dt null when unknown, and wrong time or space coordinates refused in one line naming the file and the variable."""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr
from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_data.errors import InputError
from dpot_data.sources import the_well
from dpot_data.sources import xarray as xsrc
from dpot_data.synth.gridded import (obstacle_cells, write_netcdf, write_pde_storage, write_the_well,
                                     write_well_dummy)
from dpot_format.validate import validate_output


def _cli(args: list[str]):
    return CliRunner().invoke(app, ["ingest", *args, "--no-progress"])


def _one_error_line(result, *words: str) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]


def _xread(paths, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", xsrc.Chosen)
        return xsrc.read(paths, **options)


# ------------------------------------------------------------------------------------------------ the Well: NaN

@pytest.mark.parametrize("dims", [2, 3])
def test_well_obstacle_nan_is_geometry_masked_and_stored_as_zero(tmp_path, dims):
    res = 8 if dims == 2 else 6
    paths = write_the_well(tmp_path, n=2, frames=3, res=res, dims=dims, obstacle_nan=True, alphas=(0.5,))
    result = the_well.read([paths[0]])
    assert result.skipped == [] and result.data.sizes["sample"] == 2
    cells = obstacle_cells((res,) * dims).transpose()  # the Well's (x, y[, z]) -> our (y, x) / (z, y, x)
    mask = result.data["mask"].values
    assert (mask == np.where(cells, 0, 1)[None]).all()
    fields = result.data["fields"].values
    assert not np.isnan(fields).any() and (fields[:, :, :, cells] == 0).all()
    with h5py.File(paths[0], "r") as f:
        density = f["t0_fields/density"][1]
    np.testing.assert_array_equal(fields[1, :, 0], np.nan_to_num(density.transpose(0, *range(dims, 0, -1))))
    out = tmp_path / "out"
    done = _cli(["the-well", str(paths[0]), "--out", str(out), "--resolution", "0", "--channels", "16"])
    assert done.exit_code == 0, done.output  # every trajectory has NaN obstacle cells: all kept
    assert [p for p in validate_output(out) if p.fatal] == []
    entry = json.loads((out / "manifest.json").read_text())["datasets"][0]
    assert entry["trajectories"] == 2 and entry["skipped"] == []


def _set_nan(path: Path, key: str, index: tuple) -> None:
    with h5py.File(path, "a") as f:
        data = f[key][()]
        data[index] = np.nan
        f[key][...] = data


def test_well_nan_that_comes_and_goes_drops_the_trajectory_with_one_warning_line(tmp_path):
    path = write_the_well(tmp_path, n=3, frames=4, res=8, obstacle_nan=True, alphas=(0.5,))[0]
    _set_nan(path, "t0_fields/density", (1, 2, 0, 0))  # one missing value in frame 2 of trajectory 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = the_well.read([path])
    lines = [str(w.message) for w in caught if "left out" in str(w.message)]
    assert len(lines) == 1 and str(path) in lines[0] and "train/waves_alpha_0.5.hdf5#1" in lines[0]
    assert "missing data" in lines[0] and "frame 2" in lines[0]
    assert [s for s in result.data["sample"].values] == ["train/waves_alpha_0.5.hdf5#0",
                                                         "train/waves_alpha_0.5.hdf5#2"]
    assert [w for w, _ in result.skipped] == ["train/waves_alpha_0.5.hdf5#1"]
    with pytest.raises(InputError, match=r"trajectory train/waves_alpha_0\.5\.hdf5#1: NaN in 1 of 4 frames"):
        the_well.read([path], check_finite="raise").data["fields"].values


def test_well_trajectory_with_every_cell_nan_is_never_stored(tmp_path):
    path = write_the_well(tmp_path, n=2, frames=3, res=8, alphas=(0.5,))[0]
    _set_nan(path, "t0_fields/density", (0,))  # trajectory 0: NaN everywhere, every frame
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = the_well.read([path])
    assert [w for w, _ in result.skipped] == ["train/waves_alpha_0.5.hdf5#0"]
    assert "no cell left unmasked" in result.skipped[0][1]
    for mode in ("raise", False):
        with pytest.raises(InputError, match="no cell left unmasked"):
            the_well.read([path], check_finite=mode).data["fields"].values


# ------------------------------------------------------------------------------------------------ the Well: times

def test_well_per_trajectory_times_are_each_trajectorys_own(tmp_path):
    paths = write_the_well(tmp_path, n=3, frames=4, res=6, alphas=(0.5,), times_per_trajectory=True)
    result = the_well.read([paths[0]])
    np.testing.assert_allclose(result.data["time"].values, [0, 0.25, 0.5, 0.75])
    np.testing.assert_array_equal(result.sample_params["time_start"], [0, 1, 2])
    assert result.data.attrs["dt"] == 0.25
    out = tmp_path / "out"
    done = _cli(["the-well", str(paths[0]), "--out", str(out), "--resolution", "0", "--channels", "8"])
    assert done.exit_code == 0, done.output
    entry = json.loads((out / "manifest.json").read_text())["datasets"][0]
    assert "time_start" in entry["sample_params"] and entry["dt"] == 0.25


def test_well_trajectories_stepping_differently_are_refused(tmp_path):
    path = write_the_well(tmp_path, n=2, frames=4, res=6, alphas=(0.5,), times_per_trajectory=True)[0]
    with h5py.File(path, "a") as f:
        f["dimensions/time"][1] = np.array([0, 0.5, 1.0, 1.5], dtype=np.float32)
    with pytest.raises(InputError, match=r"dimensions/time \(trajectory 1\): frame times .*expected the time steps"):
        the_well.read([path])


# ------------------------------------------------------------------------------------------------ the Well: boundary

def test_well_boundary_follows_the_masks_as_the_wells_reader_reads_them(tmp_path):
    dummy = the_well.read([write_well_dummy(tmp_path / "dummy.hdf5")]).data
    # bc_type PERIODIC, masks all False: the Well's WellDataset reads every side as OPEN
    assert dummy.attrs["boundary"] == "non-periodic"
    assert dummy.attrs["parameters"]["boundary_sides"] == {"x": ["OPEN", "OPEN"], "y": ["OPEN", "OPEN"]}
    periodic = the_well.read([write_the_well(tmp_path / "p", n=1, frames=2, res=6, alphas=(0.5,))[0]]).data
    assert periodic.attrs["boundary"] == "periodic"
    path = write_the_well(tmp_path / "h", n=1, frames=2, res=6, alphas=(0.5,))[0]
    with h5py.File(path, "a") as f:  # the y condition set on its first side only: the last side stays OPEN
        f["boundary_conditions/y_periodic/mask"][...] = np.eye(1, 6, 0, dtype=bool)[0]
    half = the_well.read([path]).data
    assert half.attrs["boundary"] == "non-periodic"
    assert half.attrs["parameters"]["boundary_sides"]["y"] == ["PERIODIC", "OPEN"]


# ------------------------------------------------------------------------------------------------ the Well: bad input

def _edit(path: Path, key: str, value) -> None:
    with h5py.File(path, "a") as f:
        f[key][...] = value


@pytest.mark.parametrize("times, match", [
    ([0.0, 0.5, 0.25, 0.75], r"dimensions/time: frame 2 has the time 0\.25 after 0\.5"),
    ([1.0, 1.0, 1.0, 1.0], r"dimensions/time: every frame has the time 1 \(a constant time coordinate\)"),
    ([0.0, np.nan, 0.5, 0.75], r"dimensions/time: time of frame 1 is nan"),
    ([0.0, 0.25, np.inf, 0.75], r"dimensions/time: time of frame 2 is inf"),
])
def test_well_bad_time_coordinates_are_refused(tmp_path, times, match):
    path = write_the_well(tmp_path, n=1, frames=4, res=6, alphas=(0.5,))[0]
    _edit(path, "dimensions/time", np.array(times, dtype=np.float32))
    with pytest.raises(InputError, match=match) as err:
        the_well.read([path])
    assert err.value.path == str(path)


def test_well_nan_space_coordinate_is_refused(tmp_path):
    path = write_the_well(tmp_path, n=1, frames=2, res=6, alphas=(0.5,))[0]
    with h5py.File(path, "a") as f:
        f["dimensions/y"][3] = np.nan
    with pytest.raises(InputError, match=r"dimensions/y: value 3 is nan; expected finite coordinates"):
        the_well.read([path])


@pytest.mark.parametrize("key, value, match", [
    ("dimensions/time", np.arange(3, dtype=np.float32) * 0.5, r"dimensions/time \(trajectory 0\): frame times"),
    ("dimensions/x", np.arange(6, dtype=np.float32) / 3, r"dimensions/x: coordinates from 0 to 1\.66667"),
    ("boundary_conditions/x_periodic/mask", np.zeros(6, dtype=bool), r"expected boundary conditions"),
])
def test_well_files_of_one_call_must_agree(tmp_path, key, value, match):
    a, b = write_the_well(tmp_path, n=1, frames=3, res=6, alphas=(0.5, 1.0))[:2]
    _edit(b, key, value)
    with pytest.raises(InputError, match=match) as err:
        the_well.read([a, b])
    assert err.value.path == str(b)


# ------------------------------------------------------------------------------------------------ xarray: NaN

@pytest.fixture()
def ocean(tmp_path) -> Path:
    return write_netcdf(tmp_path / "nc", members=2, frames=4, ny=8, nx=12)


def _rewrite(src: Path, dst: Path, edit) -> Path:
    with xr.open_dataset(src, engine="h5netcdf", decode_times=False) as ds:
        ds = ds.load()
    edit(ds)
    ds.to_netcdf(dst, engine="h5netcdf")
    return dst


def test_xarray_nan_in_one_frame_is_refused_not_masked_for_the_whole_trajectory(ocean, tmp_path):
    land = _xread([ocean])  # NaN in every frame (land): geometry, masked
    with xr.open_dataset(ocean, engine="h5netcdf") as ds:
        nan = np.isnan(ds["u"].values[0, 0])
    assert nan.any() and (land.data["mask"].values == np.where(nan, 0, 1)[None]).all()

    def one_nan(ds):
        ds["u"][1, 2, 0, 0] = np.nan

    bad = _rewrite(ocean, tmp_path / "gap.nc", one_nan)
    with pytest.raises(InputError, match=r"trajectory gap\.nc#1: NaN in 1 of 4 frames \(first: frame 2\).*missing"):
        _xread([bad]).data["fields"].values
    out = tmp_path / "out"
    line = _one_error_line(_cli(["xarray", str(bad), "--out", str(out)]), str(bad), "gap.nc#1", "missing data")
    assert "frame 2" in line
    assert not out.exists()  # a refusal leaves nothing: no manifest, no data, no staging folder


def test_xarray_trajectory_with_every_cell_nan_is_refused(ocean, tmp_path):
    def all_nan(ds):
        ds["u"][0] = np.nan
        ds["v"][0] = np.nan

    bad = _rewrite(ocean, tmp_path / "empty.nc", all_nan)
    out = tmp_path / "out"
    _one_error_line(_cli(["xarray", str(bad), "--out", str(out)]), "empty.nc#0", "no cell left unmasked")
    assert not out.exists()  # a refusal leaves nothing


# ------------------------------------------------------------------------------------------------ xarray: times

def test_pde_storage_hdf5_takes_its_times_dataset_and_dt(tmp_path):
    path = write_pde_storage(tmp_path / "run.h5", frames=5, dt=0.05)
    data = _xread([path], axes="TYX").data
    np.testing.assert_allclose(data["time"].values, 0.05 * np.arange(1, 6))
    assert data.attrs["dt"] == pytest.approx(0.05)
    assert data.attrs["parameters"]["dims"]["time"]["from"] == "times"
    named = _xread([path], axes="TYX", time_var="times").data
    assert named.attrs["dt"] == pytest.approx(0.05)
    with pytest.raises(InputError, match=r"--time-var clock: expected a 1-D numeric variable of 5 frame times"):
        _xread([path], axes="TYX", time_var="clock")


def test_hdf5_without_any_times_records_dt_null(tmp_path):
    path = tmp_path / "bare.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.random.default_rng(0).random((4, 6, 5)))
    data = _xread([path], axes="TYX").data
    assert data.attrs["dt"] is None and data["time"].values.tolist() == [0, 1, 2, 3]
    out = tmp_path / "out"
    done = _cli(["xarray", str(path), "--axes", "TYX", "--out", str(out), "--resolution", "0", "--split", "1"])
    assert done.exit_code == 0, done.output
    assert json.loads((out / "manifest.json").read_text())["datasets"][0]["dt"] is None


def test_cli_time_var_gives_the_times(tmp_path):
    path = write_pde_storage(tmp_path / "run.h5", frames=4, dt=0.5)
    with h5py.File(path, "a") as f:
        f["clock"] = f["times"][()] * 2
        del f["times"]
    out = tmp_path / "out"
    done = _cli(["xarray", str(path), "--axes", "TYX", "--time-var", "clock", "--out", str(out), "--resolution",
                 "0", "--split", "1"])
    assert done.exit_code == 0, done.output
    assert json.loads((out / "manifest.json").read_text())["datasets"][0]["dt"] == 1.0


# ------------------------------------------------------------------------------------------------ xarray: bad input

def _time(values):
    def edit(ds):
        ds["time"] = ("time", np.array(values, dtype=np.float64), ds["time"].attrs)
    return edit


def _lat_nan(ds):
    lat = ds["lat"].values.copy()
    lat[2] = np.nan
    ds["lat"] = ("lat", lat, ds["lat"].attrs)


@pytest.mark.parametrize("edit, match", [
    (_time([0, 2, 1, 3]), r"time: frame 2 has the time 1 after 2"),
    (_time([5, 5, 5, 5]), r"time: every frame has the time 5 \(a constant time coordinate\)"),
    (_time([0, np.nan, 2, 3]), r"time: time of frame 1 is nan"),
    (_time([0, 1, np.inf, 3]), r"time: time of frame 2 is inf"),
    (_lat_nan, r"lat: value 2 is nan; expected finite coordinates"),
], ids=["non-monotonic", "constant", "nan", "inf", "nan-lat"])
def test_xarray_bad_coordinates_within_a_file_are_refused(ocean, tmp_path, edit, match):
    bad = _rewrite(ocean, tmp_path / "bad.nc", edit)
    with pytest.raises(InputError, match=match) as err:
        _xread([bad])
    assert err.value.path == str(bad)
    _one_error_line(_cli(["xarray", str(bad), "--out", str(tmp_path / "o")]), str(bad))
    assert not (tmp_path / "o").exists()


def _units(ds):
    ds["u"].attrs["units"] = "km h-1"


def _lat_shift(ds):
    ds["lat"] = ("lat", ds["lat"].values + 1.0, ds["lat"].attrs)


def _not_periodic(ds):
    ds["lon"] = ("lon", ds["lon"].values / 2, ds["lon"].attrs)


@pytest.mark.parametrize("edit, match", [
    (_time([0, 2, 4, 6]), r"time: frame times \[0, 2, 4, \.\.\.\] \(4 frames\) \(step 2\.0\); expected the time steps"),
    (_units, r"u: units 'km h-1'; expected 'm s-1'"),
    (_lat_shift, r"lat: coordinates from -59 to 61; expected -60 to 60"),
    (_not_periodic, r"lon: periodic False; expected True"),
], ids=["time-step", "units", "domain", "boundary"])
def test_xarray_files_of_one_call_must_agree(ocean, tmp_path, edit, match):
    other = _rewrite(ocean, tmp_path / "other.nc", edit)
    with pytest.raises(InputError, match=match) as err:
        _xread([ocean, other])
    assert err.value.path == str(other)


def test_xarray_files_starting_later_keep_their_own_start(ocean, tmp_path):
    later = _rewrite(ocean, tmp_path / "later.nc", _time([10, 11, 12, 13]))
    first = shutil.copy(ocean, tmp_path / "first.nc")
    result = _xread([first, later])
    np.testing.assert_array_equal(result.data["time"].values, [0, 1, 2, 3])
    np.testing.assert_array_equal(result.sample_params["time_start"], [0, 0, 10, 10])
    assert result.data.attrs["dt"] == 1.0
