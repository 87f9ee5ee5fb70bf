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
import torch
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
    text = (heat / CARD_NAME).read_text(encoding="utf-8")  # Markdown: a card escapes brackets (dpot_format.text.md)
    assert r"(temperature \[K\])" in text  # the summary line names the data channels with their units
    assert "| temperature | K | data |" in text
    assert r"- Grid: 12x16 (y \[m\], x \[m\])" in text and "- dt: 0.5 s" in text
    assert r"at t = 0 s, one panel per channel: temperature \[K\];" in text  # the preview's caption


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


# --- the evaluation: eval.json, the table and the pictures name the units --------------------------------------

T_IN = 2


class _Damped(torch.nn.Module):
    """A deterministic stand-in model: 0.9 x the last frame plus 0.1 x the first."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.9 * x[..., -1:, :] + 0.1 * x[..., :1, :]


@pytest.fixture(scope="module")
def scored(heat: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    """The heat test split evaluated with the stand-in model, its rollouts written to a predictions store."""
    from dpot_train.core.config import DataConfig
    from dpot_train.evaluation.predictions import PredictionWriter
    from dpot_train.evaluation.evaluate import evaluate_model

    writer = PredictionWriter(tmp_path_factory.mktemp("scored") / "pred.zarr")
    result = evaluate_model(_Damped(), DataConfig(manifests=[str(heat)], t_in=T_IN, t_out=1, normalize="none"),
                            sink=writer)
    return result, writer.close()


def _group(store: Path) -> xr.Dataset:
    return xr.open_zarr(str(store), group="heat")


def test_eval_json_gives_the_rmse_in_the_channels_unit(scored: tuple[dict, Path], capsys: pytest.CaptureFixture
                                                       ) -> None:
    from dpot_train.evaluation.evaluate import print_table

    result, store = scored
    r = result["datasets"]["heat"]
    assert r["units"] == {"temperature": "K"}
    g = _group(store)
    pred, true = (g[k].sel(channel="temperature").values.astype(np.float64) for k in ("prediction", "truth"))
    fluid = g["mask"].values[:, None]  # (trajectory, 1, y, x)
    sq = np.where(fluid, (pred - true) ** 2, 0.0)
    n = fluid.sum(axis=(2, 3))  # fluid cells per trajectory
    per_step = np.sqrt(sq.sum(axis=(2, 3)) / n)  # (trajectory, step)
    whole = np.sqrt(sq.sum(axis=(1, 2, 3)) / (n[:, 0] * pred.shape[1]))
    channel = r["model"]["channels"]["temperature"]
    np.testing.assert_allclose(channel["rmse_per_step"], per_step.mean(axis=0), rtol=1e-6)
    assert channel["rmse"] == pytest.approx(whole.mean(), rel=1e-6) and 0.1 < channel["rmse"] < 10  # kelvin
    print_table(result)
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "temperature [K]" in ln]
    assert len(lines) == 1 and f"{channel['rmse']:.4g}" in lines[0]  # the RMSE table: the channel, unit and value
    assert f"{r['persistence']['channels']['temperature']['rmse']:.4g}" in lines[0]


def test_the_predictions_store_carries_times_coordinates_and_units(scored: tuple[dict, Path]) -> None:
    g = _group(scored[1])
    np.testing.assert_allclose(g["time"].values, np.arange(T_IN, FRAMES) * DT)
    assert g["time"].attrs["units"] == "s" and g["x"].attrs["units"] == g["y"].attrs["units"] == "m"
    np.testing.assert_allclose(g["x"].values, np.arange(NX) * SPACING)
    assert g["prediction"].attrs["units"] == "K" and g["truth"].attrs["channel_units"] == ["K", "1", "1", "1"]


def test_evaluation_fields_picture_names_units_times_and_fluid_ranges(scored: tuple[dict, Path]) -> None:
    from dpot_train.evaluation.plots import fields_figure

    g = _group(scored[1])
    mask = g["mask"].values[0]
    fig = fields_figure(g)
    try:
        panels = _image_axes(fig)
        assert len(panels) == 9  # truth, prediction, error at steps 1, 2 and 4
        assert [ax.get_title() for ax in panels[:3]] == ["truth, t = 1 s (step 1)", "truth, t = 1.5 s (step 2)",
                                                         "truth, t = 2.5 s (step 4)"]
        assert _colour_bar_labels(fig) == ["temperature [K]", "temperature [K]", "temperature error [K]"]
        drawn = np.stack([_check_panel(ax, mask) for ax in panels]).reshape(3, 3, NY, NX)
        fluid_values = drawn[:2, :, mask == 1]
        values = (float(fluid_values.min()), float(fluid_values.max()))
        assert 289 < values[0] < values[1] < 297  # kelvin: the stored 0 of the obstacle is not in the range
        assert all(ax.images[0].get_clim() == pytest.approx(values) for ax in panels[:6])
        top = float(np.abs(drawn[2][:, mask == 1]).max())
        assert all(ax.images[0].get_clim() == pytest.approx((-top, top)) for ax in panels[6:])
    finally:
        plt.close(fig)


def test_evaluation_spectrum_picture_has_units_dataset_and_several_steps(scored: tuple[dict, Path]) -> None:
    from dpot_train.evaluation.plots import spectra_figure

    fig = spectra_figure(_group(scored[1]))
    try:
        assert "heat" in fig.get_suptitle()
        assert [ax.get_ylabel() for ax in fig.axes] == ["mean |FFT|² / cells [K²]"] * 2
        gids = {line.get_gid() for ax in fig.axes for line in ax.get_lines()}
        assert gids == {f"temperature/{kind}/{s}" for kind in ("truth", "prediction", "error") for s in (1, 2, 4)}
    finally:
        plt.close(fig)


def test_the_rollout_gif_keeps_one_colour_scale_per_channel_over_the_whole_rollout(scored: tuple[dict, Path],
                                                                                   tmp_path: Path) -> None:
    from PIL import Image

    from dpot_train.evaluation.plots import write_video

    g = _group(scored[1])
    video = write_video(g, tmp_path / "rollout.gif")
    steps = FRAMES - T_IN
    assert Image.open(tmp_path / "rollout.gif").n_frames == steps
    assert video.colour_bars == ["temperature [K]", "temperature [K]", "temperature error [K]"]
    fluid = g["mask"].values[0].astype(bool)
    pred, true = (g[k].isel(trajectory=0).sel(channel="temperature").values for k in ("prediction", "truth"))
    both = np.stack([pred, true])[:, :, fluid]
    whole = (float(both.min()), float(both.max()))  # every step's truth and prediction, fluid cells only
    top = float(np.abs(pred - true)[:, fluid].max())
    for key, want in (("temperature/truth", whole), ("temperature/prediction", whole),
                      ("temperature/error", (-top, top))):
        assert len(video.limits[key]) == steps and set(video.limits[key]) == {video.limits[key][0]}
        assert video.limits[key][0] == pytest.approx(want, rel=1e-6)


def test_evaluate_says_where_it_wrote_pictures_and_predictions(heat: Path, tmp_path: Path) -> None:
    from dpot_train.cli import app as train_app
    from dpot_train.model import build_model

    torch.manual_seed(0)
    ckpt = tmp_path / "tiny.pth"
    torch.save({"model": build_model("tiny", img_size=16, in_timesteps=T_IN).state_dict()}, ckpt)
    plots, store = tmp_path / "plots", tmp_path / "pred.zarr"
    result = CliRunner().invoke(train_app, ["evaluate", str(ckpt), "--manifest", str(heat), "--recipe", "dpot",
                                            "--res", "16", "--out", str(tmp_path / "eval.json"), "--plot",
                                            str(plots), "--predictions", str(store)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert f"wrote {store}: prediction, truth and mask per dataset (xarray.open_zarr(PATH, group=DATASET))" in lines
    assert f"wrote 3 pictures to {plots}: heat_fields.png, heat_error.png, heat_spectrum.png" in lines
    assert json.loads((tmp_path / "eval.json").read_text())["datasets"]["heat"]["units"] == {"temperature": "K"}
