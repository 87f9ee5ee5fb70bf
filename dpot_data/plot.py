"""`inspect --plot`: a PNG grid of frames (first, middle, last) of a few trajectories per dataset, one row per valid
channel with a colour bar naming it and its unit, frames titled with their time, axes in the file's coordinates, the
geometry mask outlined; the picture to look at before spending GPU time (dpot_format.display)."""

from __future__ import annotations

import io
import itertools
from dataclasses import dataclass
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dpot_data.output import DatasetView, datasets  # noqa: E402
from dpot_format.display import Plane, colour_scale, data_axes, draw_field, fluid_range  # noqa: E402


@dataclass(frozen=True)
class PlotOptions:
    """How many trajectories per dataset, which datasets (None: all), figure resolution."""

    trajectories: int = 2
    datasets: Sequence[str] | None = None
    dpi: int = 100


def pick_trajectories(n: int, k: int) -> list[int]:
    """k trajectory indices spread evenly over 0..n-1 (first and last included), no repeats."""
    if n <= 0 or k <= 0:
        return []
    if k >= n:
        return list(range(n))
    return sorted({int(round(v)) for v in np.linspace(0, n - 1, k)})


def frame_indices(frames: int) -> list[int]:
    """First, middle and last frame (fewer when the trajectory is shorter)."""
    return sorted({0, (frames - 1) // 2, frames - 1})


@dataclass(frozen=True)
class _Row:
    """One plotted row: the trajectory's name, the channel with its unit, its picked frames (t, y, x), the mask, a
    title per frame (its time) and the axes the frames are drawn on."""

    name: str
    channel: str
    frames: np.ndarray
    mask: np.ndarray
    titles: list[str]
    plane: Plane


def _rows(view: DatasetView, opts: PlotOptions) -> list[_Row]:
    """The plotted rows of one dataset: per trajectory, one per valid channel."""
    entry = view.entry
    n = int(entry.get("trajectories", 0))
    channels = list(entry["channels"])
    group = view.zarr_group()
    axes = data_axes(entry, group)
    dims = list(entry["grid"]["dims"])
    rows = []
    if group is not None:  # one chunk read per trajectory, spread over the dataset
        samples = (view.trajectory(i, group=group) for i in pick_trajectories(n, opts.trajectories))
    else:  # shards only: the first trajectories of the first shards, without streaming the whole dataset
        samples = itertools.islice(view.iter_shards(), max(opts.trajectories, 0))
    for sample in samples:
        index = int(sample.meta["index"])
        fields = sample.fields
        where = ""
        if fields.ndim == 5:  # 3D: show the middle z slice
            where = f" (z {fields.shape[2] // 2})"
            fields = fields[:, :, fields.shape[2] // 2]
            mask = sample.mask[sample.mask.shape[0] // 2]
        else:
            mask = sample.mask
        picks = frame_indices(fields.shape[0])
        plane = axes.plane(dims)
        for c in np.flatnonzero(view.channel_valid):
            rows.append(_Row(f"{view.name} #{index}{where}", axes.channel_label(channels, int(c)), fields[picks, c],
                             mask, [axes.title(k) for k in picks], plane))
    return rows


def build_figure(root: str, opts: PlotOptions = PlotOptions()) -> "plt.Figure":
    """The matplotlib figure of the frame grid of the output folder (or URL) `root` (caller closes it): one row per
    trajectory and valid channel, one colour scale per row over its frames' fluid cells."""
    views = [v for v in datasets(root) if opts.datasets is None or v.name in set(opts.datasets)]
    if not views:
        raise ValueError(f"{root}: no dataset to plot (asked for {list(opts.datasets or [])})")
    rows = [row for view in views for row in _rows(view, opts)]
    if not rows:
        raise ValueError(f"{root}: the datasets hold no trajectories to plot")
    n_cols = max(len(r.titles) for r in rows)
    fig, axes = plt.subplots(
        len(rows), n_cols, figsize=(2.8 * n_cols + 1.2, 2.6 * len(rows)), squeeze=False, constrained_layout=True
    )
    for r, row in enumerate(rows):
        fluid = row.mask.astype(bool)
        vmin, vmax, cmap = colour_scale(*fluid_range(row.frames, fluid[None]))
        image = None
        for col in range(n_cols):
            ax = axes[r, col]
            if col >= len(row.titles):
                ax.axis("off")
                continue
            image = draw_field(ax, row.frames[col], fluid, row.plane, vmin, vmax, cmap)
            ax.set_title(f"{row.name}, {row.titles[col]}", fontsize=8)
        if image is not None:
            bar = fig.colorbar(image, ax=list(axes[r, : len(row.titles)]), shrink=0.9, pad=0.02)
            bar.set_label(row.channel, fontsize=8)
    fig.suptitle(f"{root}: first, middle and last frame; solid cells grey, outlined in black", fontsize=9)
    return fig


def render(root: str, opts: PlotOptions = PlotOptions()) -> bytes:
    """The PNG bytes of the frame grid of the output folder (or URL) `root`."""
    fig = build_figure(root, opts)
    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=opts.dpi)
        return buf.getvalue()
    finally:
        plt.close(fig)


def plot_output(root: str, png: str, opts: PlotOptions = PlotOptions()) -> str:
    """Write the frame grid of the output `root` to `png` (path or URL); returns where it was written. A local `png`
    passes the one output rule first (dpot_format.output.check_file: no link, device, FIFO or folder, nothing inside
    an ingest output) and is written atomically."""
    from dpot_format import io as fio
    from dpot_format.output import check_file

    if fio.is_local(str(png)):
        check_file(fio.local_path(str(png)), "--plot", "frames.png")
    data = render(root, opts)
    if fio.is_local(str(png)):
        fio.atomic_write(fio.local_path(str(png)), data)
        return str(png)
    import fsspec

    with fsspec.open(str(png), "wb") as f:
        f.write(data)
    return str(png)
