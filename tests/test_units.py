"""A researcher's own file keeps its units end to end: the CF NetCDF of `write_user_netcdf` (temperature in K, x and
y in m, time in s, a NaN obstacle) ingested with `ingest xarray`; its units reach the Zarr attributes (read with
zarr and with xarray), the dataset card, and every picture of `inspect --plot` and the card's preview: colour bars
named with the unit, axes in metres, titles with the time, colour ranges over fluid cells only. A boundary the file
cannot state is given with `--boundary` and recorded."""

from __future__ import annotations

import json
import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest
import xarray as xr
import zarr
from typer.testing import CliRunner

from dpot_data.card import CARD_NAME, preview_figure
from dpot_data.cli import app
from dpot_data.output import DatasetView
from dpot_data.plot import PlotOptions, build_figure
from dpot_data.synth.gridded import write_pde_storage, write_user_netcdf
from dpot_format.display import SOLID_COLOUR, fluid_range, time_title

NY, NX, FRAMES, DT, SPACING = 12, 16, 6, 0.5, 0.01


@pytest.fixture(scope="module")
def heat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scenario file, small, ingested on its native grid (nothing resampled) with its card."""
    from dpot_data.ingest import IngestOptions, run_ingest

    base = tmp_path_factory.mktemp("units")
    nc = write_user_netcdf(base / "raw", samples=4, frames=FRAMES, ny=NY, nx=NX, obstacle=4)
    run_ingest("xarray", [nc], base / "heat", IngestOptions(progress=False, resolution=0, split=(0.5,), card=True))
    return base / "heat"


def _entry(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())["datasets"][0]


def test_the_zarr_attributes_carry_the_files_units(heat: Path) -> None:
    group = zarr.open_group(str(heat / "data.zarr"), mode="r")["heat"]
    assert group["fields"].attrs["units"] == "K" and group["fields"].attrs["channel_units"] == ["K", "1", "1", "1"]
    assert (group["x"].attrs["units"], group["y"].attrs["units"], group["time"].attrs["units"]) == ("m", "m", "s")
    ds = xr.open_dataset(os.fspath(heat / "data.zarr"), engine="zarr", group="heat")  # as docs/format.md opens it
    assert ds.fields.attrs["units"] == "K" and ds.time.attrs["units"] == "s"
    assert ds.x.attrs["units"] == ds.y.attrs["units"] == "m"
    np.testing.assert_allclose(ds.time.values, np.arange(FRAMES) * DT)


def test_the_card_names_the_units(heat: Path) -> None:
    text = (heat / CARD_NAME).read_text(encoding="utf-8")
    assert "(temperature [K])" in text  # the summary line names the data channels with their units
    assert "| temperature | K | data |" in text
    assert "- Grid: 12x16 (y [m], x [m])" in text and "- dt: 0.5 s" in text
    assert "at t = 0 s, one panel per channel: temperature [K];" in text  # the preview's caption


def _image_axes(fig: plt.Figure) -> list:
    return [ax for ax in fig.axes if ax.images]


def _colour_bar_labels(fig: plt.Figure) -> list[str]:
    return [ax.get_ylabel() for ax in fig.axes if not ax.images]


def _check_panel(ax, mask: np.ndarray) -> np.ndarray:  # noqa: ANN001 - matplotlib Axes
    """The panel is drawn in metres, solid cells masked out in the solid colour; returns the values drawn."""
    image = ax.images[0]
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("x [m]", "y [m]")
    np.testing.assert_allclose(image.get_extent(), [-SPACING / 2, (NX - 0.5) * SPACING, -SPACING / 2,
                                                    (NY - 0.5) * SPACING])
    drawn = image.get_array()
    assert np.array_equal(np.ma.getmaskarray(drawn), mask == 0)  # solid cells are not values
    assert np.allclose(image.get_cmap().get_bad()[:3], plt.matplotlib.colors.to_rgb(SOLID_COLOUR))
    return np.ma.getdata(drawn)


def test_inspect_plot_names_units_times_and_takes_the_colour_range_over_fluid_cells(heat: Path) -> None:
    mask = np.asarray(zarr.open_group(str(heat / "data.zarr"), mode="r")["heat"]["mask"][0])
    assert 0 < (mask == 0).sum() < mask.size  # the obstacle
    fig = build_figure(str(heat), PlotOptions(trajectories=1))
    try:
        panels = _image_axes(fig)
        assert [ax.get_title() for ax in panels] == ["heat #0, t = 0 s", "heat #0, t = 1 s", "heat #0, t = 2.5 s"]
        assert _colour_bar_labels(fig) == ["temperature [K]"]
        drawn = np.stack([_check_panel(ax, mask) for ax in panels])
        lo, hi = float(drawn[:, mask == 1].min()), float(drawn[:, mask == 1].max())
        assert 289 < lo < hi < 297  # about 293 +- 3 K: the stored 0 of the obstacle is not in the range
        assert all(ax.images[0].get_clim() == pytest.approx((lo, hi)) for ax in panels)
    finally:
        plt.close(fig)


def test_the_card_preview_names_units_and_time(heat: Path) -> None:
    view = DatasetView(str(heat), _entry(heat))
    mask = np.asarray(view.zarr_group()["mask"][0])
    fig, preview = preview_figure(view)
    try:
        (panel,) = _image_axes(fig)
        assert panel.get_title() == "t = 0 s" and preview.time == "t = 0 s"
        assert _colour_bar_labels(fig) == ["temperature [K]"]
        drawn = _check_panel(panel, mask)
        assert panel.images[0].get_clim() == pytest.approx(fluid_range(drawn, mask == 1))
    finally:
        plt.close(fig)


def test_time_titles_name_the_time_and_its_unit_or_the_frame() -> None:
    times = np.array([0.0, 1.5, 3600.0])
    assert [time_title(k, times, "s") for k in range(3)] == ["t = 0 s", "t = 1.5 s", "t = 3600 s"]
    assert time_title(1, times, "seconds since 2000-01-01") == "t = 1.5 s"  # CF time units
    assert time_title(1, times, "unknown") == "t = 1.5" and time_title(2, None, None) == "frame 2"


def test_boundary_given_at_ingest_is_recorded_and_chooses_the_resampling(tmp_path: Path) -> None:
    """py-pde's FileStorage states no periodicity: `--boundary periodic` does, as a stated boundary would
    (canonical convention: Fourier resampling of periodic data); per axis, one non-periodic axis keeps it bilinear."""
    h5 = write_pde_storage(tmp_path / "pde.h5", frames=4, ny=8, nx=8)
    common = ["ingest", "xarray", str(h5), "--axes", "TYX", "--convention", "canonical", "--resolution", "16",
              "--split", "1.0", "--no-progress"]
    found = {}
    for name, given in (("plain", []), ("periodic", ["--boundary", "periodic"]),
                        ("per-axis", ["--boundary", "x=periodic,y=non-periodic"])):
        result = CliRunner().invoke(app, [*common, "--out", str(tmp_path / name), *given])
        assert result.exit_code == 0, result.output
        found[name] = _entry(tmp_path / name)
    assert (found["plain"]["boundary"], found["plain"]["resample"]["fields"]) == ("non-periodic", "bilinear-antialias")
    assert "boundary_given" not in found["plain"]["parameters"]
    periodic = found["periodic"]
    assert (periodic["boundary"], periodic["resample"]["fields"]) == ("periodic", "fourier")
    assert periodic["parameters"]["boundary_given"] == {"y": "periodic", "x": "periodic"}
    assert periodic["parameters"]["periodic_dims"] == ["y", "x"]
    mixed = found["per-axis"]
    assert (mixed["boundary"], mixed["resample"]["fields"]) == ("non-periodic", "bilinear-antialias")
    assert mixed["parameters"]["periodic_dims"] == ["x"]


def test_a_bad_boundary_is_one_line_and_writes_nothing(tmp_path: Path) -> None:
    h5 = write_pde_storage(tmp_path / "pde.h5", frames=4, ny=8, nx=8)
    result = CliRunner().invoke(app, ["ingest", "xarray", str(h5), "--axes", "TYX", "--out", str(tmp_path / "o"),
                                      "--boundary", "z=periodic", "--no-progress"])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == (
        "error: --boundary: expected periodic, non-periodic or per axis AXIS=periodic|non-periodic with AXIS one of "
        "y, x (each at most once), got 'z=periodic'")
    assert not (tmp_path / "o").exists()
