"""`inspect --plot`: first/middle/last frames of a few trajectories, one row per valid channel, mask outlined."""

from __future__ import annotations

import io
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from dpot_data.plot import PlotOptions, build_figure, frame_indices, pick_trajectories, plot_output
from tests.toy_output import write_toy_output


def test_index_choices() -> None:
    assert pick_trajectories(5, 2) == [0, 4]
    assert pick_trajectories(5, 3) == [0, 2, 4]
    assert pick_trajectories(2, 5) == [0, 1]
    assert pick_trajectories(0, 2) == []
    assert frame_indices(6) == [0, 2, 5]
    assert frame_indices(1) == [0]


def test_figure_has_named_channels_colour_bars_and_mask_outline(tmp_path: Path) -> None:
    fields, mask = write_toy_output(str(tmp_path))
    fig = build_figure(str(tmp_path), PlotOptions(trajectories=2))
    try:
        image_axes = [ax for ax in fig.axes if ax.images]
        assert len(image_axes) == 2 * 3 * 3  # 2 trajectories x 3 valid channels x 3 frames (pad3 left out)
        titles = [ax.get_title() for ax in image_axes]
        assert titles[:3] == ["toy #0, frame 0", "toy #0, frame 2", "toy #0, frame 5"]  # no times: frame indices
        assert titles[9:12] == ["toy #4, frame 0", "toy #4, frame 2", "toy #4, frame 5"]
        assert {(ax.get_xlabel(), ax.get_ylabel()) for ax in image_axes} == {("x [cell]", "y [cell]")}  # no coords
        colour_bars = [ax.get_ylabel() for ax in fig.axes if not ax.images]
        assert colour_bars == ["u [unknown]", "v [unknown]", "p [unknown]"] * 2  # the toy source states no units
        assert all(ax.collections for ax in image_axes)  # contour of the solid disc on every panel
        # the last frame of trajectory 4, channel v, is what is shown; solid cells are blank (NaN)
        shown = np.ma.filled(image_axes[3 * 3 + 3 + 2].images[0].get_array().astype(float), np.nan)
        np.testing.assert_allclose(np.where(mask[4] == 1, shown, 0), np.where(mask[4] == 1, fields[4, 5, 1], 0))
        assert np.isnan(shown[mask[4] == 0]).all()
    finally:
        plt.close(fig)


def test_png_is_written_and_not_blank(tmp_path: Path) -> None:
    write_toy_output(str(tmp_path / "out"))
    png = tmp_path / "grid.png"
    plot_output(str(tmp_path / "out"), str(png), PlotOptions(trajectories=1))
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    img = plt.imread(io.BytesIO(data))
    assert img.shape[0] > 300 and img.shape[1] > 600
    assert len(np.unique(img[..., :3].reshape(-1, 3), axis=0)) > 50  # colour maps, not an empty canvas


def test_unknown_dataset_is_an_error(tmp_path: Path) -> None:
    write_toy_output(str(tmp_path))
    with pytest.raises(ValueError, match="no dataset to plot"):
        build_figure(str(tmp_path), PlotOptions(datasets=["nope"]))


def test_cli_inspect_plot_writes_the_png(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from dpot_data.cli import app
    from dpot_data.ingest import IngestOptions, run_ingest
    from tests.toy_output import write_fno_raw

    raw = write_fno_raw(tmp_path / "raw", n=6, res=32, frames=4)
    run_ingest("fno", [raw], tmp_path / "out", IngestOptions(resolution=32, workers=2, command="test"))
    png = tmp_path / "frames.png"
    result = CliRunner().invoke(app, ["inspect", str(tmp_path / "out"), "--plot", str(png), "--plot-trajectories", "3"])
    assert result.exit_code == 0, result.output
    img = plt.imread(str(png))
    assert img.shape[0] > 3 * 150  # three rows: one valid channel (vorticity) per trajectory
    assert len(np.unique(img[..., :3].reshape(-1, 3), axis=0)) > 50


def test_plot_of_a_shards_only_output_reads_the_first_samples(tmp_path: Path) -> None:
    import json

    write_toy_output(str(tmp_path))
    doc = json.loads((tmp_path / "manifest.json").read_text())
    doc["datasets"][0]["zarr"] = None
    (tmp_path / "manifest.json").write_text(json.dumps(doc))
    fig = build_figure(str(tmp_path), PlotOptions(trajectories=2))
    try:
        titles = [ax.get_title() for ax in fig.axes if ax.images][::3]  # the first frame of each row
        assert titles == ["toy #0, frame 0"] * 3 + ["toy #1, frame 0"] * 3
    finally:
        plt.close(fig)
