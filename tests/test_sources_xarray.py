"""The generic `xarray` source on files written by other tools: NetCDF by xarray (CF attributes), a Zarr store by
xarray, HDF5 by h5py, .npy arrays. Native-grid values equal the source after the float32 cast, 128² values equal
the reference's bilinear resize of the same array, NaN cells are masked (never silent zeros), bad input is one line
naming the file, with nothing written."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr
import zarr
from typer.testing import CliRunner

from dpot_data.cli import app
from dpot_data.errors import InputError
from dpot_data.ingest import IngestOptions, ingest
from dpot_data.sources import xarray as xsrc
from dpot_data.synth.gridded import write_netcdf
from dpot_data.transform import resample_bilinear


def _read(paths, **options):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = xsrc.read(paths, **options)
    chosen = [str(w.message) for w in caught if issubclass(w.category, xsrc.Chosen)]
    assert len(chosen) == 1
    return result, chosen[0]


def _ingest(result, out: Path, resolution: int | None = None) -> tuple[dict, zarr.Group]:
    opts = IngestOptions(resolution=resolution, formats=("zarr",), split=(1.0,), stats=False)
    entry = ingest(result, out, opts).manifest["datasets"][0]
    return entry, zarr.open_group(str(out / "data.zarr" / entry["name"]), mode="r")


@pytest.fixture(scope="module")
def netcdf(tmp_path_factory) -> Path:
    return write_netcdf(tmp_path_factory.mktemp("nc"), members=2, frames=4, ny=12, nx=16)


def _source(path: Path) -> np.ndarray:
    """(member, time, channel, lat, lon) float32 as xarray reads the file itself."""
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        return np.stack([ds["u"].values, ds["v"].values], axis=2).astype(np.float32)


def test_netcdf_native_grid_equals_source_and_nan_cells_are_masked(netcdf, tmp_path):
    result, chosen = _read([netcdf])
    assert "variables u, v" in chosen and "lat -> y, lon -> x" in chosen and "member" in chosen and "land" in chosen
    entry, group = _ingest(result, tmp_path / "out")
    src = _source(netcdf)
    nan = np.isnan(src).any(axis=(1, 2))
    assert nan.any() and entry["channels"][:2] == ["u", "v"] and entry["grid"]["shape"] == [12, 16]
    fields, mask = group["fields"][:], group["mask"][:]
    np.testing.assert_array_equal(mask, (~nan).astype(np.uint8))
    keep = np.broadcast_to(~nan[:, None, None], src.shape)
    np.testing.assert_array_equal(fields[:, :, :2][keep], src[keep])  # exact, after the float32 cast
    assert (fields[:, :, :2][~keep] == 0).all()  # stored as 0, but masked
    assert not np.isnan(fields).any()


def test_netcdf_units_long_names_and_periodicity_reach_the_store(netcdf, tmp_path):
    result, _ = _read([netcdf])
    entry, group = _ingest(result, tmp_path / "out")
    params = json.loads(group.attrs["parameters"])
    assert params["variables"]["u"] == {"units": "m s-1", "long_name": "eastward velocity",
                                        "standard_name": "eastward_sea_water_velocity"}
    assert params["dims"]["x"]["periodic"] is True and params["dims"]["y"]["periodic"] is False
    assert params["periodic_dims"] == ["x"] and entry["boundary"] == "non-periodic"  # latitude does not wrap
    assert params["dims"]["time"]["units"] == "hours since 2000-01-01"
    assert entry["parameters"] == params


def test_netcdf_at_128_is_the_reference_bilinear_away_from_land_and_sea_values_near_it(netcdf, tmp_path):
    result, _ = _read([netcdf])
    entry, group = _ingest(result, tmp_path / "out", resolution=128)
    src = _source(netcdf)
    assert entry["resample"]["fields"] == "bilinear" and group["fields"].shape == (2, 4, 4, 128, 128)
    fields, mask = group["fields"][:, :, :2], group["mask"][:]
    land = np.isnan(src[0, 0, 0]).astype(np.float32)
    coast = resample_bilinear(land[None], (128, 128))[0] > 0  # target cells with a land cell among their sources
    plain = resample_bilinear(np.nan_to_num(src, nan=0.0), (128, 128))
    np.testing.assert_allclose(fields[..., ~coast], plain[..., ~coast], rtol=1e-6)
    sea = np.broadcast_to(mask[:, None, None] == 1, fields.shape)  # near the coast: sea values only (format.md)
    lo, hi = np.nanmin(src, axis=(-2, -1), keepdims=True), np.nanmax(src, axis=(-2, -1), keepdims=True)
    assert np.all(np.where(sea, fields >= lo, True)) and np.all(np.where(sea, fields <= hi, True))
    assert np.all(fields[~sea] == 0)


def test_zarr_store_written_by_xarray(tmp_path):
    rng = np.random.default_rng(1)
    data = rng.standard_normal((3, 5, 10, 12))  # float64: cast to float32 as read
    ds = xr.Dataset({"h": (("run", "t", "y", "x"), data)}, coords={"t": np.arange(5) * 0.1})
    ds.to_zarr(tmp_path / "sim.zarr", mode="w")
    result, chosen = _read([tmp_path / "sim.zarr"])
    assert "time dim 't' (name)" in chosen and "sample dim 'run'" in chosen
    entry, group = _ingest(result, tmp_path / "out")
    np.testing.assert_array_equal(group["fields"][:, :, 0], data.astype(np.float32))
    assert group["mask"][:].all() and entry["dt"] == pytest.approx(0.1) and entry["name"] == "sim"


def test_hdf5_written_by_h5py_with_axes(tmp_path):
    rng = np.random.default_rng(2)
    u = rng.standard_normal((2, 4, 8, 6)).astype(np.float32)
    with h5py.File(tmp_path / "run.h5", "w") as f:
        f["u"] = u
        f["v"] = 2 * u
    result, chosen = _read([tmp_path / "run.h5"], axes="NTYX", variables="v,u")
    entry, group = _ingest(result, tmp_path / "out")
    assert entry["channels"][:2] == ["v", "u"] and entry["grid"]["shape"] == [8, 6]
    np.testing.assert_array_equal(group["fields"][:, :, 0], 2 * u)
    np.testing.assert_array_equal(group["fields"][:, :, 1], u)


def test_npy_folder_with_axes(tmp_path):
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal((2, 3, 5, 7, 2)) for _ in range(2))  # N T Y X C
    (tmp_path / "arrays").mkdir()
    np.save(tmp_path / "arrays" / "a.npy", a)
    np.save(tmp_path / "arrays" / "b.npy", b)
    result, _ = _read([tmp_path / "arrays"], axes="NTYXC", variables="p,q")
    assert list(result.data["sample"].values) == ["a.npy#0", "a.npy#1", "b.npy#0", "b.npy#1"]
    entry, group = _ingest(result, tmp_path / "out")
    assert entry["channels"][:2] == ["p", "q"]
    expected = np.concatenate([a, b]).transpose(0, 1, 4, 2, 3).astype(np.float32)
    np.testing.assert_array_equal(group["fields"][:, :, :2], expected)


def _bad_files(tmp: Path) -> dict[str, tuple[Path, dict, str]]:
    grid = {"y": np.arange(4.0), "x": np.arange(5.0)}
    xr.Dataset({"u": (("y", "x"), np.ones((4, 5)))}, coords=grid).to_netcdf(tmp / "no_time.nc", engine="h5netcdf")
    xr.Dataset({"u": (("time", "y", "x"), np.ones((3, 4, 5))), "w": (("time", "depth", "y", "x"), np.ones((3, 2, 4, 5)))},
               coords=grid).to_netcdf(tmp / "other_dims.nc", engine="h5netcdf")
    xr.Dataset({"s": (("time", "y", "x"), np.full((3, 4, 5), "a"))}).to_netcdf(tmp / "strings.nc", engine="h5netcdf")
    return {"no time": (tmp / "no_time.nc", {}, "expected a time dimension"),
            "other dims": (tmp / "other_dims.nc", {"variables": "u,w"}, "variable 'w' has dimensions"),
            "other dims guessed": (tmp / "other_dims.nc", {}, "variable 'w' has dimensions"),
            "non-numeric": (tmp / "strings.nc", {}, "expected numbers")}


def test_bad_input_is_one_line_naming_the_file(tmp_path):
    for case, (path, options, expected) in _bad_files(tmp_path).items():
        with pytest.raises(InputError) as err:
            xsrc.read([path], **options)
        assert err.value.path == str(path) and expected in err.value.message, case
        assert "\n" not in str(err.value)


def test_cli_bad_input_exits_2_and_writes_nothing(tmp_path):
    files = _bad_files(tmp_path)
    path = files["other dims"][0]
    result = CliRunner().invoke(app, ["ingest", "xarray", str(path), "--vars", "u,w", "--out", str(tmp_path / "o"),
                                      "--no-progress"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(path) in lines[0] and "variable 'w'" in lines[0]
    assert not (tmp_path / "o").exists()


def test_cli_ingests_netcdf_with_explicit_dims(netcdf, tmp_path):
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["ingest", "xarray", str(netcdf), "--vars", "u", "--time-dim", "time",
                                      "--space-dims", "lat,lon", "--sample-dim", "member", "--resolution", "0",
                                      "--out", str(out), "--no-progress", "--split", "0.5"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    entry = manifest["datasets"][0]
    assert entry["source"] == "xarray" and entry["channels"] == ["u", "pad1", "pad2", "pad3"]
    assert entry["trajectories"] == 2 and "time dim 'time' (option)" in entry["provenance"]["chosen"]


def test_inf_is_refused_naming_the_trajectory(tmp_path):
    data = np.zeros((2, 3, 4, 5))
    data[1, 2, 0, 0] = np.inf
    xr.Dataset({"u": (("sample", "time", "y", "x"), data)}).to_netcdf(tmp_path / "inf.nc", engine="h5netcdf")
    result, _ = _read([tmp_path / "inf.nc"])
    with pytest.raises(InputError, match=r"u: trajectory 1 holds \+-Inf \(first: frame 2\)"):
        result.data["fields"].values


def test_zarr_store_and_netcdf_at_fsspec_urls(netcdf, tmp_path):
    import uuid

    import fsspec

    from dpot_data.ingest import run_ingest

    tag = uuid.uuid4().hex[:8]
    data = np.arange(2 * 3 * 4 * 5, dtype=np.float32).reshape(2, 3, 4, 5)
    xr.Dataset({"u": (("sample", "time", "y", "x"), data)}).to_zarr(f"memory://zin-{tag}/s.zarr", mode="w")
    fsspec.filesystem("memory").pipe(f"/zin-{tag}/ocean.nc", netcdf.read_bytes())
    opts = IngestOptions(resolution=None, formats=("zarr",), split=(1.0,), stats=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        zarr_entry = run_ingest("xarray", [f"memory://zin-{tag}/s.zarr"], tmp_path / "z", opts,
                                workdir=tmp_path / "w1").manifest["datasets"][0]
        nc_entry = run_ingest("xarray", [f"memory://zin-{tag}/ocean.nc"], tmp_path / "n", opts,
                              workdir=tmp_path / "w2").manifest["datasets"][0]
    group = zarr.open_group(str(tmp_path / "z" / "data.zarr" / zarr_entry["name"]), mode="r")
    np.testing.assert_array_equal(group["fields"][:, :, 0], data)
    assert nc_entry["trajectories"] == 2 and nc_entry["channels"][:2] == ["u", "v"]


def test_single_npy_trajectory_named_by_vars_and_h5_components(tmp_path):
    rng = np.random.default_rng(4)
    one = rng.standard_normal((3, 4, 5))  # T Y X: one trajectory
    np.save(tmp_path / "one.npy", one)
    result, _ = _read([tmp_path / "one.npy"], axes="TYX", variables="u")
    assert list(result.data["channel"].values) == ["u"] and list(result.data["sample"].values) == ["one.npy#0"]
    np.testing.assert_array_equal(result.data["fields"].values[0, :, 0], one.astype(np.float32))
    with h5py.File(tmp_path / "c.h5", "w") as f:
        f["q"] = rng.standard_normal((2, 3, 4, 5, 2))
    result, _ = _read([tmp_path / "c.h5"], axes="NTYXC")
    assert list(result.data["channel"].values) == ["q_0", "q_1"]


def test_files_split_by_time_concatenate_along_time(tmp_path):
    rng = np.random.default_rng(5)
    data = rng.standard_normal((2, 6, 4, 5))
    paths = []
    for k in range(3):
        part = xr.Dataset({"u": (("member", "time", "y", "x"), data[:, 2 * k:2 * k + 2])},
                          coords={"time": np.arange(2 * k, 2 * k + 2) * 0.5})
        paths.append(tmp_path / f"part{k}.nc")
        part.to_netcdf(paths[-1], engine="h5netcdf")
    out = tmp_path / "o"
    result = CliRunner().invoke(app, ["ingest", "xarray", *map(str, paths), "--concat", "time", "--resolution", "0",
                                      "--split", "1", "--format", "zarr", "--out", str(out), "--no-progress"])
    assert result.exit_code == 0, result.output
    entry = json.loads((out / "manifest.json").read_text())["datasets"][0]
    assert entry["frames"] == 6 and entry["trajectories"] == 2 and entry["dt"] == 0.5
    group = zarr.open_group(str(out / "data.zarr" / entry["name"]), mode="r")
    np.testing.assert_array_equal(group["fields"][:, :, 0], data.astype(np.float32))
    with pytest.raises(InputError, match="expected times increasing across the inputs"):
        xsrc.read([paths[1], paths[0], paths[2]], concat="time")


def test_cf_bounds_variables_are_coordinates_not_channels(tmp_path):
    ds = xr.Dataset({"tas": (("time", "lat", "lon"), np.ones((3, 4, 5)), {"units": "K"}),
                     "time_bnds": (("time", "bnds"), np.zeros((3, 2)))},
                    coords={"time": ("time", np.arange(3.0), {"units": "days since 2000-01-01", "bounds": "time_bnds"}),
                            "lat": np.arange(4.0), "lon": np.arange(5.0)})
    ds.to_netcdf(tmp_path / "tas.nc", engine="h5netcdf")
    result, chosen = _read([tmp_path / "tas.nc"])
    assert list(result.data["channel"].values) == ["tas"] and "one trajectory per file" in chosen
    assert result.data.attrs["parameters"]["dims"]["time"]["units"] == "days since 2000-01-01"


def test_window_cuts_one_long_run_into_samples(tmp_path):
    rng = np.random.default_rng(6)
    run = rng.standard_normal((11, 4, 5))  # one trajectory of 11 frames, no sample dimension
    xr.Dataset({"u": (("time", "y", "x"), run)}, coords={"time": 10.0 + np.arange(11)}).to_netcdf(
        tmp_path / "long.nc", engine="h5netcdf")
    result, _ = _read([tmp_path / "long.nc"], window="3", block=2)  # blocks of 2 windows: reads span windows
    ds = result.data
    assert list(ds["sample"].values) == ["long.nc#0/w0", "long.nc#0/w1", "long.nc#0/w2"]
    assert ds["time"].values.tolist() == [0.0, 1.0, 2.0] and ds.attrs["provenance"]["window"] == 3
    np.testing.assert_array_equal(ds["fields"].values[:, :, 0], run[:9].reshape(3, 3, 4, 5).astype(np.float32))
    with pytest.raises(InputError, match="--window: expected 1 to 11 frames"):
        xsrc.read([tmp_path / "long.nc"], window=12)


def test_interrupted_ingest_of_a_netcdf_file_resumes_to_the_same_bytes(tmp_path):
    path = write_netcdf(tmp_path / "raw", members=4, frames=3, ny=8, nx=8)
    opts = IngestOptions(resolution=16, workers=1, shard_size=1, split=(1.0,), command="test")

    def read(hook=None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = xsrc.read([path], block=1)
        if hook is not None:
            def fn(block, block_info=None):
                if block_info:
                    hook(block_info[0]["chunk-location"][0])
                return block
            result.data["fields"] = (result.data["fields"].dims, result.data["fields"].data.map_blocks(fn))
        return result

    def explode(chunk):
        if chunk == 2:
            raise KeyboardInterrupt("interrupted mid-ingest")  # resumable; an error of the data is not

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = ingest(read(), tmp_path / "ref", opts).manifest["datasets"][0]
        with pytest.raises(KeyboardInterrupt, match="interrupted mid-ingest"):
            ingest(read(explode), tmp_path / "out", opts)
        computed: list[int] = []
        outcome = ingest(read(computed.append), tmp_path / "out", opts)
    assert "resumed an interrupted ingest" in outcome.notes[0] and 0 not in computed
    got = outcome.manifest["datasets"][0]
    assert [s["sha256"] for s in got["shards"]] == [s["sha256"] for s in reference["shards"]]
    assert got["zarr"] == reference["zarr"] and got["stats"] == reference["stats"]
