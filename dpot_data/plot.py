"""`inspect --plot`: a PNG grid of frames (first, middle, last) of a few trajectories per dataset, one row per valid
channel with its name and colour bar, the geometry mask outlined; the picture to look at before spending GPU time."""

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
from dpot_format.grid import cell_aspect  # noqa: E402


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


def _rows(view: DatasetView, opts: PlotOptions) -> list[tuple[str, np.ndarray, np.ndarray, list[int], float]]:
    """(label, frames of one channel (t, *space), mask, frame indices, imshow aspect: the native grid's, so a
    resampled grid keeps its true proportions) for each plotted row of one dataset."""
    entry = view.entry
    n = int(entry.get("trajectories", 0))
    channels = list(entry["channels"])
    valid = view.channel_valid
    rows = []
    if view.zarr_group() is not None:  # one chunk read per trajectory, spread over the dataset
        samples = (view.trajectory(i) for i in pick_trajectories(n, opts.trajectories))
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
        for c in np.flatnonzero(valid):
            label = f"{view.name} #{index}{where}\n{channels[c]}"
            rows.append((label, fields[picks, c], mask, picks,
                         cell_aspect(mask.shape, view.entry.get("grid", {}).get("native_shape"))))
    return rows


def build_figure(root: str, opts: PlotOptions = PlotOptions()) -> "plt.Figure":
    """The matplotlib figure of the frame grid of the output folder (or URL) `root` (caller closes it)."""
    views = [v for v in datasets(root) if opts.datasets is None or v.name in set(opts.datasets)]
    if not views:
        raise ValueError(f"{root}: no dataset to plot (asked for {list(opts.datasets or [])})")
    rows = [row for view in views for row in _rows(view, opts)]
    if not rows:
        raise ValueError(f"{root}: the datasets hold no trajectories to plot")
    n_cols = max(len(r[3]) for r in rows)
    fig, axes = plt.subplots(
        len(rows), n_cols, figsize=(2.6 * n_cols + 0.9, 2.3 * len(rows)), squeeze=False, constrained_layout=True
    )
    for r, (label, frames, mask, picks, aspect) in enumerate(rows):
        fluid = mask.astype(bool)
        shown = frames[:, fluid] if fluid.any() else frames.reshape(len(frames), -1)
        finite = shown[np.isfinite(shown)]
        vmin, vmax = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
        if vmin == vmax:
            vmin, vmax = vmin - 0.5, vmax + 0.5
        if vmin < 0 < vmax:  # signed field: diverging map centred on zero
            vmax = max(-vmin, vmax)
            vmin, cmap = -vmax, "RdBu_r"
        else:
            cmap = "viridis"
        image = None
        for col in range(n_cols):
            ax = axes[r, col]
            ax.set_xticks([])
            ax.set_yticks([])
            if col >= len(picks):
                ax.axis("off")
                continue
            data = np.where(fluid, frames[col], np.nan)
            image = ax.imshow(data, origin="lower", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest",
                              aspect=aspect)
            if not fluid.all():
                ax.contour(fluid.astype(float), levels=[0.5], colors="k", linewidths=0.8, origin="lower")
            ax.set_title(f"t = frame {picks[col]}", fontsize=8)
            if col == 0:
                ax.set_ylabel(label, fontsize=8)
        if image is not None:
            bar = fig.colorbar(image, ax=list(axes[r, : len(picks)]), shrink=0.9, pad=0.02)
            bar.set_label(label.split("\n")[-1], fontsize=8)
    fig.suptitle(f"{root}: first, middle and last frame; solid cells blank, outlined in black", fontsize=9)
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
    """Write the frame grid of the output `root` to `png` (path or URL); returns where it was written."""
    data = render(root, opts)
    import fsspec

    with fsspec.open(str(png), "wb") as f:
        f.write(data)
    return str(png)
