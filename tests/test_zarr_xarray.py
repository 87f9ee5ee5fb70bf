"""The Zarr store opens usefully with the ecosystem's tools: the xarray example of docs/format.md runs exactly as
written, the root names its groups, arrays carry CF `units` and `long_name`, and `split` selects with `.where`."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import xarray as xr

from dpot_data.ingest import IngestOptions, ingest_files
from dpot_data.synth.cfdbench import write_cfdbench
from dpot_data.synth.fno import synth_fno
from dpot_data.units import UNKNOWN, array_units

ROOT = Path(__file__).resolve().parents[1]


def _docs_example() -> str:
    text = (ROOT / "docs" / "format.md").read_text(encoding="utf-8")
    found = re.search(r"<!-- xarray example -->\n```python\n(.*?)```\n<!-- end xarray example -->", text, re.S)
    assert found, "docs/format.md lost its xarray example"
    return found.group(1)


def test_the_docs_xarray_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    raw = synth_fno(tmp_path / "raw", n=4, frames=12, viscosity=1e-3, resolution=8)[0]  # NavierStokes_V1e-3_...
    ingest_files("fno", [raw], tmp_path / "shards", IngestOptions(split=(0.5,), resolution=0, stats=False))
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(_docs_example(), "docs/format.md", "exec"), scope)  # noqa: S102 - our own documentation
    assert xr.open_zarr("shards/data.zarr").attrs["datasets"] == ["fno-ns-v1e-3"]
    test = scope["test"]
    assert test.sizes["sample"] == 2 and set(test.split.values) == {"test"}
    assert list(test.data_vars) == ["fields", "mask"]  # labels are coordinates, not masked into NaN
    assert test.channel_valid.dims == ("channel",) and test.channel_valid.values.tolist() == [True, False, False, False]
    ds = scope["ds"]
    assert ds.fields.attrs["units"] == UNKNOWN and ds.fields.attrs["channel_units"] == ["unknown", "1", "1", "1"]
    assert ds.mask.attrs["units"] == "1" and ds.x.attrs["units"] == UNKNOWN
    assert all("long_name" in ds[name].attrs for name in ds.variables)
    assert list(scope["tree"].children) == ["fno-ns-v1e-3"]
    dask_ds = xr.open_zarr("shards/data.zarr", group="fno-ns-v1e-3")  # the documented dask variant
    assert dask_ds.where((dask_ds.split == "test").compute(), drop=True).sizes["sample"] == 2


def test_cfdbench_velocities_are_metres_per_second(tmp_path: Path) -> None:
    write_cfdbench(tmp_path / "raw", problems=("cavity",), cases=2, frames=(21, 25), res=8)
    manifest = ingest_files("cfdbench", [tmp_path / "raw"], tmp_path / "out",
                            IngestOptions(formats=("zarr",), resolution=0, stats=False))
    ds = xr.open_dataset(os.fspath(tmp_path / "out" / "data.zarr"), engine="zarr",
                         group=manifest["datasets"][0]["name"])
    assert ds.fields.attrs["channel_units"] == ["m/s", "m/s", "1", "1"]  # u, v, the geometry channel, padding
    assert ds.fields.attrs["units"] == "see channel_units"
    assert ds.x.attrs["units"] == ds.y.attrs["units"] == "1" and ds.velocity.attrs["units"] == "m/s"
    assert "units" not in ds.problem.attrs  # text labels carry no units


def test_units_are_stated_never_guessed() -> None:
    units = array_units("pdebench", ["Vx", "Vy", "density", "pressure"], [True] * 4, ["y", "x"], ["seed"])
    assert units["fields"] == UNKNOWN and units["channel_units"] == [UNKNOWN] * 4 and units["seed"] == "1"
    padded = array_units("pdebench", ["h", "pad1"], [True, False], ["y", "x"])
    assert padded["channel_units"] == [UNKNOWN, "1"] and padded["fields"] == UNKNOWN
